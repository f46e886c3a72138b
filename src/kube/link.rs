//! The link to the apiserver as the uplink's threads share it: up or down, since when,
//! how many probes failed in a row, when the next one is due and when anything last
//! got through.
//!
//! While the link is down only the node controller probes the apiserver (renewing the
//! Lease), once per probe period (the Lease renewal interval, 10 s) at a point drawn at
//! random when the link went down; the pod-status thread and the pod source wait here
//! instead of retrying on their own, so a thousand gateways coming back do not each fire
//! three retry loops.
//!
//! Why a fixed period and not an exponential back-off: a healthy node already talks to
//! the apiserver once per renewal interval, so a fleet whose link is down and probes at
//! that rate costs the apiserver no more than the same fleet up, however long the
//! outage lasts; and the node notices the link is back within one period, where a
//! back-off grown to minutes left the node controller's `Unknown` standing long enough
//! to evict pods through the default 300 s `unreachable` toleration. The random phase
//! (full jitter over the first period, drawn anew for each outage) spreads a fleet that
//! lost its link at one moment evenly over the period, so the apiserver sees the same
//! steady trickle when the link returns as when it was up: no storm. Reconnecting goes in
//! stages: the node controller renews the Lease and sends node status (`Down` →
//! `NodeReady`), the pod-status thread drains the outbox (`NodeReady` → `Drained`),
//! and only then does the pod source resync.

use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

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
    /// When the next probe of this outage is due: the phase the period keeps.
    next_probe: Option<Instant>,
    last_sync: Option<Timestamp>,
}

struct Inner {
    state: Mutex<State>,
    changed: Condvar,
    period: Duration,
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
    /// A link that has not been up yet; while down it is probed once every `period`
    /// (`nodeStatusUpdateFrequency`).
    pub fn new(period: Duration) -> Link {
        Link {
            inner: Arc::new(Inner {
                state: Mutex::new(State {
                    stage: Stage::Down,
                    ever_up: false,
                    since: None,
                    since_instant: Instant::now(),
                    failures: 0,
                    next_retry: None,
                    next_probe: None,
                    last_sync: None,
                }),
                changed: Condvar::new(),
                period: period.max(MIN_RETRY),
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

    /// A probe by the node controller, started at `now`, failed for a reason retrying
    /// can cure: the link is down. Returns how long to wait from `now` before the next
    /// probe: the first failure of an outage draws the phase (uniform over one period),
    /// later ones keep it, one probe per period however long the outage lasts.
    pub fn probe_failed(&self, now: Instant, wall: Timestamp, random: u64) -> Duration {
        let period = self.inner.period;
        let mut st = self.lock();
        go_down(&mut st, now, wall);
        st.failures = st.failures.saturating_add(1);
        crate::metrics::UPLINK_RETRIES.inc();
        let next = match st.next_probe {
            Some(planned) => {
                // A probe that took longer than a period (a connect timeout) skips the
                // slots it overran rather than firing to catch up.
                let mut next = planned + period;
                while next <= now {
                    next += period;
                }
                next
            }
            None => {
                let phase = Duration::from_nanos(random % (period.as_nanos() as u64 + 1));
                now + phase.max(MIN_RETRY)
            }
        };
        st.next_probe = Some(next);
        let delay = next.saturating_duration_since(now).max(MIN_RETRY);
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
        st.next_probe = None;
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

    const PERIOD: Duration = Duration::from_secs(10);

    fn at(secs: i64) -> Timestamp {
        Timestamp::from_second(1_700_000_000 + secs).expect("valid time")
    }

    #[test]
    fn stages_go_in_order_and_a_failure_goes_back_to_down() {
        let link = Link::new(PERIOD);
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
    fn probes_go_once_a_period_at_a_phase_drawn_when_the_link_went_down() {
        let link = Link::new(PERIOD);
        let t0 = Instant::now();
        // The first failure draws the phase: uniform over one period.
        let first = link.probe_failed(t0, at(0), 3_000_000_000);
        assert_eq!(first, Duration::from_secs(3));
        // Then exactly one probe per period, however long the outage lasts: never the
        // minutes an exponential back-off grows to, never more often than renewals.
        let mut now = t0 + first;
        for n in 1..100u32 {
            let wait = link.probe_failed(now, at(i64::from(n)), u64::from(n));
            assert_eq!(wait, PERIOD, "probe {n}");
            now += wait;
        }
        let r = link.report();
        assert_eq!(r.failures, 100);
        assert_eq!(r.next_retry, Some(crate::time::add(at(99), PERIOD)));
        assert!(!r.ever_up);
        // A probe that overran its slot (a connect timeout) keeps the phase and does
        // not fire at once to catch up.
        let late = now + Duration::from_secs(14);
        assert_eq!(link.probe_failed(late, at(200), 0), Duration::from_secs(6));
        link.node_ready(late, at(210));
        let r = link.report();
        assert_eq!(r.failures, 0);
        assert_eq!(r.next_retry, None);
        // The next outage draws a new phase; a draw of zero still waits a little.
        link.report_down(at(300));
        assert_eq!(link.probe_failed(late, at(300), 0), MIN_RETRY);
        assert_eq!(
            link.probe_failed(late + MIN_RETRY, at(301), u64::MAX),
            PERIOD,
            "then the period from the planned time"
        );
    }

    #[test]
    fn a_fleet_down_together_probes_spread_over_the_period() {
        // 1000 nodes that lost the link at one moment: their probes fall evenly over the
        // period, about as many per second as renewals when they were up.
        let t0 = Instant::now();
        let mut per_second = [0u32; 11];
        for node in 0..1000u64 {
            let link = Link::new(PERIOD);
            let wait = link.probe_failed(t0, at(0), crate::backoff::random() ^ node);
            per_second[wait.as_secs() as usize] += 1;
        }
        assert!(
            per_second[..10].iter().all(|n| (40..=170).contains(n)),
            "{per_second:?}"
        );
    }

    #[test]
    fn waiters_wake_when_the_stage_is_reached() {
        let link = Link::new(PERIOD);
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
