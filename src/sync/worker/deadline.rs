//! `spec.activeDeadlineSeconds`, as the kubelet's `activeDeadlineHandler` acts on it: a
//! pod still running that long after its `startTime` is ended, its containers stopped
//! with its grace period, its phase Failed with reason `DeadlineExceeded`.
//!
//! The start is the status's `startTime`, which the store keeps: an agent restarted (or
//! a board rebooted) does not give the pod a new allowance. The worker sleeps until the
//! deadline (on the monotonic clock, from what the wall clock says is left) and looks
//! again on every pass, so a spec updated with a shorter deadline, or a wall clock set
//! since, is taken as it is then.

use std::time::Duration;

use super::countdown::deadline_in;
use super::sandbox::Ended;
use super::Worker;
use crate::time::{self, Timestamp};
use crate::uplink::report::EventType;

/// The status reason and event reason of a pod past its deadline (the kubelet's).
pub(super) const REASON: &str = "DeadlineExceeded";
/// The status message and event message of a pod past its deadline (the kubelet's).
pub(super) const MESSAGE: &str = "Pod was active on the node longer than the specified deadline";

/// What a pod's active deadline asks of it now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Deadline {
    /// It has none, or its start cannot be placed on the clock that reads now.
    None,
    /// It may stay active this much longer.
    In(Duration),
    /// Its time is up.
    Exceeded,
}

/// The active deadline of `seconds` for a pod that started at `start`, at wall time
/// `now`. `correct` places a start taken before the clock was set (see
/// [`time::correct`]); a start it cannot place leaves the pod be, as the kubelet leaves
/// a pod without a start time. A clock set back before the start counts no time active.
/// Saturates: `seconds` comes from a manifest or the apiserver.
pub(super) fn deadline(
    seconds: Option<i64>,
    start: Timestamp,
    now: Timestamp,
    correct: &dyn Fn(Timestamp) -> Option<Timestamp>,
) -> Deadline {
    let Some(seconds) = seconds else {
        return Deadline::None;
    };
    // Validation keeps it within 1..=2^31-1; a negative one is not a deadline.
    let Ok(seconds) = u64::try_from(seconds) else {
        return Deadline::None;
    };
    let allowed = Duration::from_secs(seconds);
    let start = if time::is_sane(now) && !time::is_sane(start) {
        match correct(start) {
            Some(real) => real,
            None => return Deadline::None,
        }
    } else {
        start
    };
    let active = Duration::try_from(now.duration_since(start)).unwrap_or(Duration::ZERO);
    match allowed.checked_sub(active) {
        Some(left) if !left.is_zero() => Deadline::In(left),
        _ => Deadline::Exceeded,
    }
}

impl Worker {
    /// Whether the pod is past its active deadline. Before it is, the worker is woken
    /// when it will be.
    pub(super) fn past_active_deadline(&mut self) -> bool {
        let seconds = self
            .pod
            .spec
            .as_ref()
            .and_then(|s| s.active_deadline_seconds);
        match deadline(seconds, self.start_time, time::now(), &time::correct) {
            Deadline::None => false,
            Deadline::In(left) => {
                self.wake_at(deadline_in(left));
                false
            }
            Deadline::Exceeded => true,
        }
    }

    /// Ends a pod past its active deadline: the DeadlineExceeded event, the Failed
    /// status at once (as the kubelet reports it before the kill), then its containers
    /// stopped with the pod's grace period and what it held released. A restart during
    /// the grace period finds the pod Failed and stops what still runs of it.
    pub(super) async fn deadline_exceeded(&mut self) {
        log::info!(
            "pod {}: {MESSAGE} ({}s)",
            self.name(),
            self.pod
                .spec
                .as_ref()
                .and_then(|s| s.active_deadline_seconds)
                .unwrap_or_default()
        );
        self.deps.reporter.event(
            &self.pod,
            None,
            EventType::Normal,
            REASON,
            MESSAGE.to_string(),
        );
        self.ended = Some(Ended {
            reason: REASON.into(),
            message: MESSAGE.into(),
            rejected: false,
            disruption: false,
        });
        self.persist().await;
        self.stop_containers(self.grace_period()).await;
        self.refresh().await;
        self.refresh_probes();
        self.teardown_sandbox().await;
        self.persist().await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(text: &str) -> Timestamp {
        text.parse().expect("time")
    }

    fn never(_: Timestamp) -> Option<Timestamp> {
        None
    }

    #[test]
    fn the_deadline_counts_from_the_start_time() {
        let start = at("2026-11-26T06:00:00Z");
        let d = |secs: Option<i64>, now: &str| deadline(secs, start, at(now), &never);
        assert_eq!(d(None, "2026-11-26T07:00:00Z"), Deadline::None);
        assert_eq!(
            d(Some(3), "2026-11-26T06:00:01.5Z"),
            Deadline::In(Duration::from_millis(1500))
        );
        // The kubelet's `duration >= allowedDuration`: the very second is past it.
        assert_eq!(d(Some(3), "2026-11-26T06:00:03Z"), Deadline::Exceeded);
        assert_eq!(d(Some(3), "2026-11-26T06:00:04Z"), Deadline::Exceeded);
        // A clock set back before the start: no time active, the whole allowance left.
        assert_eq!(
            d(Some(3), "2026-11-26T05:00:00Z"),
            Deadline::In(Duration::from_secs(3))
        );
    }

    #[test]
    fn numbers_from_outside_saturate() {
        let start = at("2026-11-26T06:00:00Z");
        let d = |secs: i64, now: Timestamp| deadline(Some(secs), start, now, &never);
        let max = i64::from(i32::MAX);
        assert_eq!(
            d(max, start),
            Deadline::In(Duration::from_secs(2_147_483_647))
        );
        assert_eq!(
            d(i64::MAX, start),
            Deadline::In(Duration::from_secs(9_223_372_036_854_775_807))
        );
        assert_eq!(d(max, Timestamp::MAX), Deadline::Exceeded);
        assert_eq!(d(-1, Timestamp::MAX), Deadline::None);
        assert_eq!(d(i64::MIN, start), Deadline::None);
        // A start at either end of time (the earliest one placed as it is).
        let as_is = |t: Timestamp| Some(t);
        assert_eq!(
            deadline(Some(max), Timestamp::MIN, Timestamp::MAX, &as_is),
            Deadline::Exceeded
        );
        assert_eq!(
            deadline(Some(max), Timestamp::MIN, Timestamp::MAX, &never),
            Deadline::None
        );
        assert_eq!(
            deadline(Some(max), Timestamp::MAX, Timestamp::MIN, &never),
            Deadline::In(Duration::from_secs(2_147_483_647))
        );
        // The largest allowance as a wake-up the clock can hold.
        let before = tokio::time::Instant::now();
        assert!(deadline_in(Duration::from_secs(2_147_483_647)) > before);
    }

    #[test]
    fn a_start_taken_before_the_clock_was_set_is_placed_or_left_be() {
        // Booted in 1970, the pod started 10 s after boot; NTP set the clock later.
        let start = at("1970-01-01T00:00:10Z");
        let now = at("2026-11-26T06:00:05Z");
        let placed = |_: Timestamp| Some(at("2026-11-26T06:00:00Z"));
        assert_eq!(
            deadline(Some(30), start, now, &placed),
            Deadline::In(Duration::from_secs(25))
        );
        assert_eq!(deadline(Some(3), start, now, &placed), Deadline::Exceeded);
        // From another boot, it cannot be placed: 56 years are not counted against it.
        assert_eq!(deadline(Some(3), start, now, &never), Deadline::None);
        // The clock still unset: both times are from the same wrong clock.
        assert_eq!(
            deadline(Some(30), start, at("1970-01-01T00:00:20Z"), &never),
            Deadline::In(Duration::from_secs(20))
        );
    }
}
