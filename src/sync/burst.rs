//! When a burst of pod starts and stops has ended, so that the memory it took goes back
//! to the kernel: glibc keeps freed pages in its arenas until told to trim, and the
//! code the burst ran once stays mapped until unmapped.
//!
//! The loop notes each pod change and each worker event; once enough of them came and
//! then none for a quiet period, [`Burst::settled`] completes and the loop trims once.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::time::Instant;

use crate::store::Store;

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

/// Growth of the agent's anonymous memory since the store was last opened, measured
/// after a burst's trim, that makes opening the store again worth its cost.
///
/// What lives on after a burst is mostly sled's: the tree nodes, page table entries and
/// cache queues its writes made, and the log buffer it fills. They were allocated while
/// the burst's other work came and went, and lie scattered through the heap it grew,
/// each keeping its page resident: after 100 pods, 616 blocks of 100 KiB kept 0.8 MiB.
/// Opened again, sled makes them anew in one short run, and the trim that follows gives
/// the burst's pages back. The cost is written to flash: sled shreds the unused end of
/// its active 512 KiB segment each time it opens (up to 512 KiB, half that on
/// average) and writes a snapshot (under 1 KiB per 100 records). Paying it only for
/// as much memory given back bounds it by what the pods that grew the heap wrote.
pub const REOPEN_GROWTH: u64 = 512 * 1024;

/// The agent's anonymous memory after the store was last opened and trimmed (0: not
/// yet measured, which the trim after start-up does).
static BASELINE: AtomicU64 = AtomicU64::new(0);

/// The growth past which [`trim`] opens the store again: [`REOPEN_GROWTH`], or in debug
/// builds `HOLDFAST_TEST_REOPEN_GROWTH` (bytes), so that the tests can make every trim
/// open it again.
fn reopen_growth() -> u64 {
    if cfg!(debug_assertions) {
        if let Some(v) = std::env::var("HOLDFAST_TEST_REOPEN_GROWTH")
            .ok()
            .and_then(|v| v.parse().ok())
        {
            return v;
        }
    }
    REOPEN_GROWTH
}

/// Whether anonymous memory at `now` has grown past `baseline` by `growth` or more.
/// No baseline yet (start-up, which just opened the store): no, unless `growth` is 0.
fn worth_reopening(now: u64, baseline: u64, growth: u64) -> bool {
    growth == 0 || (baseline != 0 && now.saturating_sub(baseline) >= growth)
}

/// Gives the free pages of the allocator back on a blocking thread (it walks every
/// arena under its lock) and logs what it released. When the burst left the agent
/// [`REOPEN_GROWTH`] of anonymous memory or more above where it stood after the store
/// was last opened, opens the store again first (see there).
pub async fn trim(events: u32, store: Store) {
    // What sled deferred on this thread, which runs the pods' store writes, and the
    // stack the burst's work reached down to on it.
    crate::store::collect_garbage();
    crate::malloc::release_unused_stack();
    let _ = tokio::task::spawn_blocking(move || {
        // What the store's thread would sync later, synced now: after the release of
        // the code below, that sync would map sled's write path back.
        if let Err(e) = store.make_durable() {
            log::error!("store: flush after a burst: {e}");
        }
        crate::store::collect_garbage();
        release_and_trim(events);
        let Some(anon) = crate::malloc::anonymous_bytes() else {
            return;
        };
        let baseline = BASELINE.load(Ordering::Relaxed);
        if !worth_reopening(anon, baseline, reopen_growth()) {
            if baseline == 0 {
                BASELINE.store(anon, Ordering::Relaxed);
            }
            return;
        }
        let t0 = std::time::Instant::now();
        let reopened = store.reopen();
        let took = t0.elapsed();
        // sled's recovery ran code and freed what it read the files with: both go back.
        crate::store::collect_garbage();
        release_and_trim(events);
        let after = crate::malloc::anonymous_bytes().unwrap_or(anon);
        // Whatever did not go back is the new floor: a burst that grew something else
        // for good does not make every later trim open the store again.
        BASELINE.store(after, Ordering::Relaxed);
        match reopened {
            Ok(()) => log::info!(
                "store opened again after a burst of {events} pod event(s), in {} ms: \
                 anonymous memory {} KiB above its level after the last opening; {} -> {} KiB",
                took.as_millis(),
                anon.saturating_sub(baseline) / 1024,
                anon / 1024,
                after / 1024
            ),
            Err(e) => log::error!("store: open again after a burst: {e}"),
        }
    })
    .await;
}

/// The code the burst ran once unmapped, and the allocator's free pages given back.
fn release_and_trim(events: u32) {
    let code = crate::malloc::release_clean_code();
    log::debug!("code and read-only data unmapped: {} KiB", code / 1024);
    crate::malloc::trim_and_log(&format!("{events} pod event(s)"));
}

#[cfg(test)]
mod tests {
    use super::*;

    const QUIET_MS: u64 = 200;

    #[test]
    fn the_store_is_opened_again_only_for_growth_past_the_mark() {
        const G: u64 = REOPEN_GROWTH;
        // Start-up sets the baseline; nothing to compare with yet.
        assert!(!worth_reopening(5 << 20, 0, G));
        assert!(!worth_reopening(1 << 20, 1 << 20, G));
        assert!(!worth_reopening((1 << 20) + G - 1, 1 << 20, G));
        assert!(worth_reopening((1 << 20) + G, 1 << 20, G));
        // Less than the baseline (memory went back by itself): no.
        assert!(!worth_reopening(1 << 19, 1 << 20, G));
        // Tests set the mark to 0: every trim opens it again.
        assert!(worth_reopening(1 << 20, 1 << 20, 0));
        assert!(worth_reopening(1 << 20, 0, 0));
    }

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
