//! CrashLoopBackOff on the monotonic clock.
//!
//! [`plan`](super::plan::plan) decides from the container's recorded exit time, a wall
//! time: that is all an agent that just started knows of an exit that happened while it
//! was down. Once a worker has started waiting, the wait is a monotonic deadline: a
//! wall clock set forward by years (NTP on a board that booted in 1970) does not cut
//! the back-off short, and one set backward does not stretch it past its delay.
//!
//! A container the runtime failed to create or start never ran and has no exit to plan
//! from: its next try waits here all the same ([`RestartTimers::failed`]), or each
//! failure (whose shim reports it at once) would set off the next try at once.

use std::collections::BTreeMap;
use std::time::Duration;

use tokio::time::Instant;

use super::plan::Action;
use crate::time::{self, Timestamp};

/// One pending restart: for which instance (the restart count), when, and the delay.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Due {
    restart_count: u32,
    at: Instant,
    delay: Duration,
}

/// The deadlines of one pod's containers that wait to be restarted.
#[derive(Debug, Default)]
pub struct RestartTimers {
    due: BTreeMap<String, Due>,
}

impl RestartTimers {
    /// A try to create and start `container`'s instance `restart_count` failed: the
    /// next try of the same instance waits `delay` from `now`. Returns when it is due.
    pub fn failed(
        &mut self,
        container: &str,
        restart_count: u32,
        delay: Duration,
        now: Instant,
    ) -> Instant {
        // A delay from the config file past what the clock can hold waits "for ever".
        let at = crate::time::instant_after(now, delay);
        self.due.insert(
            container.to_string(),
            Due {
                restart_count,
                at,
                delay,
            },
        );
        at
    }

    /// `action` as planned from wall times, held to the monotonic deadline this worker
    /// set when the wait began. Returns the action and, while backing off, when to look
    /// again.
    pub fn apply(
        &mut self,
        container: &str,
        restart_count: u32,
        action: Action,
        wall: Timestamp,
        now: Instant,
    ) -> (Action, Option<Instant>) {
        let held = self
            .due
            .get(container)
            .copied()
            .filter(|d| d.restart_count == restart_count);
        match (action, held) {
            (Action::BackOff { until, delay }, None) => {
                // What the wall clock says is left, never more than the delay itself.
                let left = Duration::try_from(until.duration_since(wall))
                    .unwrap_or(Duration::ZERO)
                    .min(delay);
                let at = crate::time::instant_after(now, left);
                self.due.insert(
                    container.to_string(),
                    Due {
                        restart_count,
                        at,
                        delay,
                    },
                );
                self.hold(container, at, delay, wall, now, Action::Restart)
            }
            (Action::BackOff { .. } | Action::Restart, Some(d)) => {
                self.hold(container, d.at, d.delay, wall, now, Action::Restart)
            }
            // An instance whose create failed is tried again once its delay is over.
            (Action::Start, Some(d)) => {
                self.hold(container, d.at, d.delay, wall, now, Action::Start)
            }
            (action, _) => {
                self.due.remove(container);
                (action, None)
            }
        }
    }

    /// Holds back until `at`, then `due`.
    fn hold(
        &mut self,
        container: &str,
        at: Instant,
        delay: Duration,
        wall: Timestamp,
        now: Instant,
        due: Action,
    ) -> (Action, Option<Instant>) {
        if now >= at {
            self.due.remove(container);
            return (due, None);
        }
        let until = time::add(wall, at - now);
        (Action::BackOff { until, delay }, Some(at))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const DELAY: Duration = Duration::from_secs(20);

    fn ts(secs: i64) -> Timestamp {
        Timestamp::from_second(secs).expect("ts")
    }

    fn backoff(until: i64) -> Action {
        Action::BackOff {
            until: ts(until),
            delay: DELAY,
        }
    }

    #[test]
    fn a_forward_jump_does_not_cut_the_back_off_short() {
        let mut r = RestartTimers::default();
        let t0 = Instant::now();
        // Exited at 1970 + 100 s; 5 s later the worker plans: 15 s left.
        let (a, wake) = r.apply("app", 3, backoff(120), ts(105), t0);
        assert!(matches!(a, Action::BackOff { .. }));
        assert_eq!(wake, Some(t0 + Duration::from_secs(15)));
        // NTP sets the clock to 2026: by wall time the delay is long over.
        let now = t0 + Duration::from_secs(2);
        let (a, wake) = r.apply("app", 3, Action::Restart, ts(1_795_000_000), now);
        assert!(matches!(a, Action::BackOff { .. }), "{a:?}");
        assert_eq!(wake, Some(t0 + Duration::from_secs(15)));
        let (a, wake) = r.apply(
            "app",
            3,
            Action::Restart,
            ts(1_795_000_013),
            t0 + Duration::from_secs(15),
        );
        assert_eq!((a, wake), (Action::Restart, None));
    }

    #[test]
    fn a_backward_jump_does_not_stretch_the_back_off() {
        let mut r = RestartTimers::default();
        let t0 = Instant::now();
        // The exit was recorded at a wall time far ahead of the clock now.
        let (_, wake) = r.apply("app", 1, backoff(1_795_000_020), ts(100), t0);
        assert_eq!(wake, Some(t0 + DELAY));
        let (a, _) = r.apply("app", 1, backoff(1_795_000_020), ts(120), t0 + DELAY);
        assert_eq!(a, Action::Restart);
    }

    #[test]
    fn a_new_instance_gets_a_new_deadline() {
        let mut r = RestartTimers::default();
        let t0 = Instant::now();
        r.apply("app", 1, backoff(110), ts(100), t0);
        let (a, _) = r.apply("app", 1, Action::Keep, ts(100), t0);
        assert_eq!(a, Action::Keep);
        // Restart count 2: the old deadline is not reused.
        let (a, wake) = r.apply("app", 2, Action::Restart, ts(200), t0);
        assert_eq!((a, wake), (Action::Restart, None));
        let (_, wake) = r.apply("app", 2, backoff(205), ts(200), t0);
        assert_eq!(wake, Some(t0 + Duration::from_secs(5)));
        // Another container has its own.
        let (a, _) = r.apply("side", 2, Action::Restart, ts(200), t0);
        assert_eq!(a, Action::Restart);
    }

    #[test]
    fn a_failed_create_holds_the_next_start_until_its_delay_is_over() {
        let mut r = RestartTimers::default();
        let t0 = Instant::now();
        let at = r.failed("app", 0, Duration::from_secs(10), t0);
        assert_eq!(at, t0 + Duration::from_secs(10));
        // The failure's own exit event asks for a pass at once: it waits.
        let (a, wake) = r.apply("app", 0, Action::Start, ts(100), t0);
        assert!(matches!(a, Action::BackOff { .. }), "{a:?}");
        assert_eq!(wake, Some(at));
        let (a, wake) = r.apply(
            "app",
            0,
            Action::Start,
            ts(109),
            at - Duration::from_secs(1),
        );
        assert!(matches!(a, Action::BackOff { .. }), "{a:?}");
        assert_eq!(wake, Some(at));
        // Due: it is tried again, as a start (it never ran, so it is no restart).
        let (a, wake) = r.apply("app", 0, Action::Start, ts(110), at);
        assert_eq!((a, wake), (Action::Start, None));
        let (a, _) = r.apply("app", 0, Action::Start, ts(110), at);
        assert_eq!(a, Action::Start);
        // A failure of another instance does not hold this one.
        r.failed("app", 1, Duration::from_secs(10), t0);
        let (a, _) = r.apply("app", 2, Action::Start, ts(100), t0);
        assert_eq!(a, Action::Start);
    }
}
