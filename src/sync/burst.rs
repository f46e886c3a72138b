//! When a burst of pod starts and stops has ended, so that the memory it took goes back
//! to the kernel: glibc keeps freed pages in its arenas until told to trim, and the
//! code the burst ran once stays mapped until unmapped.
//!
//! The loop notes each pod change and each worker event; once enough of them came and
//! then none for a quiet period, [`Burst::settled`] completes and the loop trims once.

use std::time::Duration;

use tokio::time::Instant;

/// Pod changes and worker events that make a burst worth a trim.
pub const BURST_EVENTS: u32 = 10;

/// Quiet after the last event before the burst counts as over: longer than the gaps
/// between one pod's steps, short enough that the memory goes back soon after.
pub const QUIET: Duration = Duration::from_secs(5);

pub struct Burst {
    events: u32,
    last: Instant,
    threshold: u32,
    quiet: Duration,
}

impl Burst {
    /// A burst already due: start-up (store, image import, adoption, the first pods)
    /// is one, trimmed once it goes quiet.
    pub fn new(threshold: u32, quiet: Duration) -> Self {
        Burst {
            events: threshold,
            last: Instant::now(),
            threshold,
            quiet,
        }
    }

    /// A pod change or worker event.
    pub fn note(&mut self) {
        self.events = self.events.saturating_add(1);
        self.last = Instant::now();
    }

    /// Whether a burst is under way and a trim will follow its end.
    pub fn pending(&self) -> bool {
        self.events >= self.threshold
    }

    /// Completes once a pending burst has been quiet for the quiet period; never while
    /// none is pending. Cancel-safe: the loop calls it again on every pass.
    pub async fn settled(&self) {
        if !self.pending() {
            return std::future::pending().await;
        }
        tokio::time::sleep_until(self.last + self.quiet).await
    }

    /// The trim for this burst is done: events count from zero again. Returns how many
    /// the burst had.
    pub fn reset(&mut self) -> u32 {
        std::mem::take(&mut self.events)
    }
}

/// Gives the free pages of the allocator back on a blocking thread (it walks every
/// arena under its lock) and logs what it released.
pub async fn trim(events: u32) {
    // What sled deferred on this thread, which runs the pods' store writes, and the
    // stack the burst's work reached down to on it.
    crate::store::collect_garbage();
    crate::malloc::release_unused_stack();
    let _ = tokio::task::spawn_blocking(move || {
        crate::store::collect_garbage();
        let code = crate::malloc::release_clean_code();
        log::debug!("code and read-only data unmapped: {} KiB", code / 1024);
        crate::malloc::trim_and_log(&format!("{events} pod event(s)"));
    })
    .await;
}

#[cfg(test)]
mod tests {
    use super::*;

    const QUIET_MS: u64 = 200;

    #[tokio::test]
    async fn a_burst_settles_after_the_quiet_period_and_only_once() {
        let quiet = Duration::from_millis(QUIET_MS);
        let mut b = Burst::new(3, quiet);
        // Start-up is due at once and settles after the quiet period.
        let t0 = Instant::now();
        b.settled().await;
        assert!(t0.elapsed() >= quiet);
        assert_eq!(b.reset(), 3);
        assert!(!b.pending());
        // Fewer events than the threshold: nothing to do.
        b.note();
        b.note();
        let waited = tokio::time::timeout(quiet * 3, b.settled()).await;
        assert!(waited.is_err(), "two events are no burst");
        // The third makes a burst; a later event moves its end.
        b.note();
        tokio::time::sleep(quiet / 2).await;
        b.note();
        let t1 = Instant::now();
        b.settled().await;
        assert!(t1.elapsed() >= quiet - Duration::from_millis(5));
        assert_eq!(b.reset(), 4);
    }
}
