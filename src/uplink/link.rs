//! The link to the apiserver as the uplink's threads share it: up or down, since when,
//! how many probes failed in a row, when the next one is due and when anything last
//! got through.
//!
//! While the link is down only the node controller probes the apiserver (renewing the
//! Lease), with jittered exponential back-off capped by `uplinkRetryMax`; the pod-status
//! thread and the pod source wait here instead of retrying on their own, so a thousand
//! gateways coming back do not each fire three retry loops. Reconnecting goes in
//! stages: the node controller renews the Lease and sends node status (`Down` →
//! `NodeReady`), the pod-status thread drains the outbox (`NodeReady` → `Drained`),
//! and only then does the pod source resync.

use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use crate::backoff::Backoff;
use crate::time::Timestamp;

/// How far a reconnect has got.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum Stage {
    /// The apiserver does not answer (or has not answered yet).
    Down,
    /// Lease renewed and node status sent: pod statuses may go.
    NodeReady,
    /// The outbox is drained: the pod source may resync.
    Drained,
}

/// The link as `holdfast status` shows it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct LinkReport {
    pub stage: Stage,
    /// Whether the apiserver has answered since the agent started.
    pub ever_up: bool,
    /// Wall time of the last change between down and up.
    pub since: Option<Timestamp>,
    /// Consecutive failed probes.
    pub failures: u32,
    /// Wall time of the next probe while down.
    pub next_retry: Option<Timestamp>,
    /// Wall time of the last successful LIST, watch event or status patch.
    pub last_sync: Option<Timestamp>,
}

struct State {
    stage: Stage,
    ever_up: bool,
    since: Option<Timestamp>,
    since_instant: Instant,
    failures: u32,
    next_retry: Option<Timestamp>,
    last_sync: Option<Timestamp>,
}

struct Inner {
    state: Mutex<State>,
    changed: Condvar,
    backoff: Backoff,
}

/// Shared by the node controller, the pod-status thread and the api pod source.
/// Cheap to clone.
#[derive(Clone)]
pub struct Link {
    inner: Arc<Inner>,
}

/// Full jitter can draw zero; a probe waits at least this long.
pub const MIN_RETRY: Duration = Duration::from_millis(100);

impl Link {
    /// A link that has not been up yet; probes back off from `backoff.initial` up to
    /// `backoff.max` (`uplinkRetryMax`).
    pub fn new(backoff: Backoff) -> Link {
        Link {
            inner: Arc::new(Inner {
                state: Mutex::new(State {
                    stage: Stage::Down,
                    ever_up: false,
                    since: None,
                    since_instant: Instant::now(),
                    failures: 0,
                    next_retry: None,
                    last_sync: None,
                }),
                changed: Condvar::new(),
                backoff,
            }),
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic elsewhere while holding the lock leaves valid data: keep using it.
        self.inner
            .state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    pub fn stage(&self) -> Stage {
        self.lock().stage
    }

    pub fn is_down(&self) -> bool {
        self.stage() == Stage::Down
    }

    /// How long the link has been in its current state (up or down).
    pub fn for_how_long(&self) -> Duration {
        self.lock().since_instant.elapsed()
    }

    /// A probe by the node controller failed for a reason retrying can cure: the link
    /// is down. Returns how long to wait before the next probe (jittered, capped).
    pub fn probe_failed(&self, now: Instant, wall: Timestamp, random: u64) -> Duration {
        let mut st = self.lock();
        go_down(&mut st, now, wall);
        st.failures = st.failures.saturating_add(1);
        crate::metrics::UPLINK_RETRIES.inc();
        let delay = self
            .inner
            .backoff
            .jittered(st.failures, random)
            .max(MIN_RETRY);
        st.next_retry = Some(crate::time::add(wall, delay));
        drop(st);
        self.inner.changed.notify_all();
        delay
    }

    /// Another thread's call failed for a reason retrying can cure: the link is down
    /// until the node controller's probe says otherwise.
    pub fn report_down(&self, wall: Timestamp) {
        let mut st = self.lock();
        if st.stage != Stage::Down {
            go_down(&mut st, Instant::now(), wall);
            drop(st);
            self.inner.changed.notify_all();
        }
    }

    /// The node controller renewed the Lease and sent node status (or the apiserver
    /// answered with a refusal no retry cures): pod statuses may go.
    pub fn node_ready(&self, now: Instant, wall: Timestamp) {
        let mut st = self.lock();
        st.failures = 0;
        st.next_retry = None;
        st.last_sync = Some(wall);
        if st.stage == Stage::Down {
            if st.ever_up {
                log::info!(
                    "uplink: the apiserver answers again after {:?}",
                    now.saturating_duration_since(st.since_instant)
                );
            }
            st.stage = Stage::NodeReady;
            st.ever_up = true;
            st.since = Some(wall);
            st.since_instant = now;
            drop(st);
            self.inner.changed.notify_all();
        }
    }

    /// The pod-status thread sent (or gave up on, for good reasons) all it had: the
    /// pod source may resync.
    pub fn drained(&self) {
        let mut st = self.lock();
        if st.stage == Stage::NodeReady {
            st.stage = Stage::Drained;
            drop(st);
            self.inner.changed.notify_all();
        }
    }

    /// Something got through (a LIST, a watch event, a status patch).
    pub fn synced(&self, wall: Timestamp) {
        let mut st = self.lock();
        if st.last_sync.is_none_or(|t| t < wall) {
            st.last_sync = Some(wall);
        }
    }

    /// Waits until the link has reached at least `stage`, up to `timeout`. True when it
    /// has.
    pub fn wait_for(&self, stage: Stage, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        let mut st = self.lock();
        loop {
            if st.stage >= stage {
                return true;
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return false;
            }
            st = match self.inner.changed.wait_timeout(st, left) {
                Ok((g, _)) => g,
                Err(poisoned) => poisoned.into_inner().0,
            };
        }
    }

    /// Waits, a second at a time, until the link reaches `stage` or `stop` says to give
    /// up. True when it was reached.
    pub fn wait_until(&self, stage: Stage, stop: &dyn Fn() -> bool) -> bool {
        while !stop() {
            if self.wait_for(stage, Duration::from_secs(1)) {
                return true;
            }
        }
        false
    }

    pub fn report(&self) -> LinkReport {
        let st = self.lock();
        LinkReport {
            stage: st.stage,
            ever_up: st.ever_up,
            since: st.since,
            failures: st.failures,
            next_retry: st.next_retry,
            last_sync: st.last_sync,
        }
    }
}

fn go_down(st: &mut State, now: Instant, wall: Timestamp) {
    if st.stage != Stage::Down {
        st.stage = Stage::Down;
        st.since = Some(wall);
        st.since_instant = now;
    } else if st.since.is_none() {
        st.since = Some(wall);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn backoff() -> Backoff {
        Backoff {
            initial: Duration::from_secs(1),
            max: Duration::from_secs(60),
        }
    }

    fn at(secs: i64) -> Timestamp {
        Timestamp::from_second(1_700_000_000 + secs).expect("valid time")
    }

    #[test]
    fn stages_go_in_order_and_a_failure_goes_back_to_down() {
        let link = Link::new(backoff());
        let now = Instant::now();
        assert_eq!(link.stage(), Stage::Down);
        link.drained();
        assert_eq!(
            link.stage(),
            Stage::Down,
            "cannot drain before the node is ready"
        );
        link.node_ready(now, at(0));
        assert_eq!(link.stage(), Stage::NodeReady);
        link.drained();
        assert_eq!(link.stage(), Stage::Drained);
        let r = link.report();
        assert!(r.ever_up);
        assert_eq!(r.since, Some(at(0)));
        assert_eq!(r.last_sync, Some(at(0)));

        link.report_down(at(5));
        assert!(link.is_down());
        assert_eq!(link.report().since, Some(at(5)));
        assert_eq!(link.report().failures, 0, "only probes count");
        link.synced(at(3));
        assert_eq!(link.report().last_sync, Some(at(3)));
        link.synced(at(1));
        assert_eq!(link.report().last_sync, Some(at(3)), "never goes back");
    }

    #[test]
    fn probes_back_off_with_jitter_up_to_the_cap() {
        let link = Link::new(backoff());
        let now = Instant::now();
        let mut delays = Vec::new();
        for n in 0..10 {
            // The largest draw: the delay is the back-off itself.
            delays.push(link.probe_failed(now, at(n), u64::MAX));
        }
        for (n, d) in delays.iter().enumerate() {
            let cap = backoff().delay(n as u32 + 1);
            assert!(*d <= cap && *d <= Duration::from_secs(60), "{delays:?}");
            assert_eq!(
                *d,
                backoff().jittered(n as u32 + 1, u64::MAX).max(MIN_RETRY)
            );
        }
        // A draw of zero still waits a little.
        assert_eq!(link.probe_failed(now, at(11), 0), MIN_RETRY);
        let r = link.report();
        assert_eq!(r.failures, 11);
        assert_eq!(r.next_retry, Some(crate::time::add(at(11), MIN_RETRY)));
        assert!(!r.ever_up);
        link.node_ready(now, at(20));
        let r = link.report();
        assert_eq!(r.failures, 0);
        assert_eq!(r.next_retry, None);
    }

    #[test]
    fn waiters_wake_when_the_stage_is_reached() {
        let link = Link::new(backoff());
        assert!(!link.wait_for(Stage::NodeReady, Duration::from_millis(10)));
        let l2 = link.clone();
        let waiter =
            std::thread::spawn(move || l2.wait_for(Stage::Drained, Duration::from_secs(10)));
        link.node_ready(Instant::now(), at(0));
        link.drained();
        assert!(waiter.join().expect("waiter"));
        let stop = || true;
        link.report_down(at(1));
        assert!(!link.wait_until(Stage::NodeReady, &stop));
    }
}
