//! One probe of one container instance, as the kubelet's prober worker keeps it: the
//! timing from the spec, the run of equal results that the thresholds count, and the
//! verdict the status reads. Pure: time comes in as arguments, so the rules are tested
//! without containers. Every field has a fixed size (the message is a `heapless`
//! string), so a pod's probe state is bounded whatever its probes print.

use std::time::Duration;

use k8s_openapi::api::core::v1::Probe;
use tokio::time::Instant;

/// Bytes of a probe's failure message kept for events (the kubelet keeps 10 KiB of
/// output; an event message is cut at 1 KiB by the apiserver anyway).
pub const MESSAGE_BYTES: usize = 512;

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Kind {
    Startup,
    Liveness,
    Readiness,
}

impl Kind {
    /// As the kubelet's events name it: `Liveness probe failed: ...`.
    pub fn name(self) -> &'static str {
        match self {
            Kind::Startup => "Startup",
            Kind::Liveness => "Liveness",
            Kind::Readiness => "Readiness",
        }
    }

    /// The probe of this kind in a container's spec.
    pub fn of(self, c: &k8s_openapi::api::core::v1::Container) -> Option<&Probe> {
        match self {
            Kind::Startup => c.startup_probe.as_ref(),
            Kind::Liveness => c.liveness_probe.as_ref(),
            Kind::Readiness => c.readiness_probe.as_ref(),
        }
    }

    pub const ALL: [Kind; 3] = [Kind::Startup, Kind::Liveness, Kind::Readiness];
}

/// A probe's timing with the API's defaults filled in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timing {
    pub initial_delay: Duration,
    pub period: Duration,
    pub timeout: Duration,
    pub success_threshold: u32,
    pub failure_threshold: u32,
}

impl Timing {
    /// The API's defaults (period 10 s, timeout 1 s, success 1, failure 3); values
    /// below the API's minimums are raised to them (validation refuses them in a
    /// cluster; a static manifest is not validated by an apiserver). Liveness and
    /// startup probes have a success threshold of 1, as validation demands.
    pub fn of(p: &Probe, kind: Kind) -> Timing {
        let secs = |v: Option<i32>, default: u64, min: u64| -> Duration {
            Duration::from_secs(
                v.and_then(|v| u64::try_from(v).ok())
                    .unwrap_or(default)
                    .max(min),
            )
        };
        let count = |v: Option<i32>, default: u32| -> u32 {
            v.and_then(|v| u32::try_from(v).ok())
                .filter(|&v| v >= 1)
                .unwrap_or(default)
        };
        let success_threshold = match kind {
            Kind::Readiness => count(p.success_threshold, 1),
            Kind::Liveness | Kind::Startup => 1,
        };
        Timing {
            initial_delay: secs(p.initial_delay_seconds, 0, 0),
            period: secs(p.period_seconds, 10, 1),
            timeout: secs(p.timeout_seconds, 1, 1),
            success_threshold,
            failure_threshold: count(p.failure_threshold, 3),
        }
    }
}

/// What the probe says of the container now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Not decided yet (a startup probe before its first success).
    Unknown,
    Success,
    Failure,
}

/// One probe of one container instance.
#[derive(Debug, Clone)]
pub struct ProbeState {
    pub kind: Kind,
    pub timing: Timing,
    verdict: Verdict,
    /// The last raw result and how many times in a row it came.
    run: Option<(bool, u32)>,
    /// When the probe is due next.
    next_at: Instant,
    /// A probe of this state is running: no second one starts.
    in_flight: bool,
    /// Why the last probe failed, cut to [`MESSAGE_BYTES`].
    message: heapless::String<MESSAGE_BYTES>,
}

impl ProbeState {
    /// A probe for an instance that started at `started`: first due after the initial
    /// delay. Liveness starts as a success (a container lives until proven otherwise),
    /// readiness as a failure (not ready until proven), startup as unknown.
    pub fn new(kind: Kind, timing: Timing, started: Instant) -> Self {
        let verdict = match kind {
            Kind::Liveness => Verdict::Success,
            Kind::Readiness => Verdict::Failure,
            Kind::Startup => Verdict::Unknown,
        };
        ProbeState {
            kind,
            timing,
            verdict,
            run: None,
            next_at: later(started, timing.initial_delay),
            in_flight: false,
            message: heapless::String::new(),
        }
    }

    pub fn verdict(&self) -> Verdict {
        self.verdict
    }

    pub fn next_at(&self) -> Instant {
        self.next_at
    }

    pub fn in_flight(&self) -> bool {
        self.in_flight
    }

    /// The last failure's message.
    pub fn message(&self) -> &str {
        &self.message
    }

    /// Takes `verdict` as already reached (what the status said of this instance before
    /// the agent restarted).
    pub fn assume(&mut self, verdict: Verdict) {
        self.verdict = verdict;
    }

    /// Whether a probe should start now.
    pub fn due(&self, now: Instant) -> bool {
        !self.in_flight && now >= self.next_at
    }

    /// A probe started.
    pub fn started(&mut self) {
        self.in_flight = true;
    }

    /// A probe ended at `now` with `success` (and a message when it failed). Schedules
    /// the next one a period later and returns the new verdict when it changed: a run
    /// of equal results changes it only once it reaches the threshold for that result.
    pub fn record(&mut self, success: bool, message: &str, now: Instant) -> Option<Verdict> {
        self.in_flight = false;
        self.next_at = later(now, self.timing.period);
        if !success {
            self.message.clear();
            push_cut(&mut self.message, message);
        }
        let run = match self.run {
            Some((last, n)) if last == success => n.saturating_add(1),
            _ => 1,
        };
        self.run = Some((success, run));
        let threshold = if success {
            self.timing.success_threshold
        } else {
            self.timing.failure_threshold
        };
        let wanted = if success {
            Verdict::Success
        } else {
            Verdict::Failure
        };
        if run < threshold || self.verdict == wanted {
            return None;
        }
        self.verdict = wanted;
        // A liveness or startup failure restarts the container: the next instance
        // counts afresh (the kubelet resets its result run there too).
        if !success && self.kind != Kind::Readiness {
            self.run = None;
        }
        Some(wanted)
    }
}

/// `t + d`. The spec's durations are i32 seconds (68 years at most), which the
/// monotonic clock holds; should it not, a year on stands in rather than a panic.
fn later(t: Instant, d: Duration) -> Instant {
    crate::time::instant_after(t, d)
}

/// Appends as much of `s` as fits, cut at a character boundary.
fn push_cut<const N: usize>(out: &mut heapless::String<N>, s: &str) {
    let room = N.saturating_sub(out.len());
    let mut end = s.len().min(room);
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    let _ = out.push_str(&s[..end]);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn probe(period: i32, success: i32, failure: i32, delay: i32) -> Probe {
        Probe {
            period_seconds: Some(period),
            success_threshold: Some(success),
            failure_threshold: Some(failure),
            initial_delay_seconds: Some(delay),
            ..Probe::default()
        }
    }

    #[test]
    fn defaults_and_minimums() {
        let t = Timing::of(&Probe::default(), Kind::Readiness);
        assert_eq!(t.period, Duration::from_secs(10));
        assert_eq!(t.timeout, Duration::from_secs(1));
        assert_eq!((t.success_threshold, t.failure_threshold), (1, 3));
        assert_eq!(t.initial_delay, Duration::ZERO);
        let t = Timing::of(&probe(0, 5, 0, -1), Kind::Liveness);
        assert_eq!(t.period, Duration::from_secs(1));
        assert_eq!(t.success_threshold, 1, "liveness succeeds on one success");
        assert_eq!(t.failure_threshold, 3);
        assert_eq!(t.initial_delay, Duration::ZERO);
        assert_eq!(
            Timing::of(&probe(1, 5, 1, 0), Kind::Readiness).success_threshold,
            5
        );
    }

    #[test]
    fn the_largest_timings_schedule_without_overflow() {
        let p = Probe {
            initial_delay_seconds: Some(i32::MAX),
            period_seconds: Some(i32::MAX),
            timeout_seconds: Some(i32::MAX),
            success_threshold: Some(i32::MAX),
            failure_threshold: Some(i32::MAX),
            ..Probe::default()
        };
        let t = Timing::of(&p, Kind::Readiness);
        let max = Duration::from_secs(i32::MAX.unsigned_abs().into());
        assert_eq!((t.initial_delay, t.period, t.timeout), (max, max, max));
        assert_eq!(t.failure_threshold, i32::MAX.unsigned_abs());
        let t0 = Instant::now();
        let mut s = ProbeState::new(Kind::Readiness, t, t0);
        assert!(!s.due(t0 + Duration::from_secs(3600)));
        assert_eq!(s.record(false, "x", t0), None, "one failure of 2^31 - 1");
        assert_eq!(s.next_at(), t0 + max);
        // A period past the clock's reach waits a year rather than panics.
        assert!(later(t0, Duration::MAX) > t0);
    }

    #[test]
    fn first_probe_waits_for_the_initial_delay() {
        let t0 = Instant::now();
        let s = ProbeState::new(
            Kind::Readiness,
            Timing::of(&probe(2, 1, 1, 5), Kind::Readiness),
            t0,
        );
        assert!(!s.due(t0 + Duration::from_secs(4)));
        assert!(s.due(t0 + Duration::from_secs(5)));
    }

    #[test]
    fn initial_verdicts() {
        let t0 = Instant::now();
        let t = Timing::of(&Probe::default(), Kind::Readiness);
        assert_eq!(
            ProbeState::new(Kind::Liveness, t, t0).verdict(),
            Verdict::Success
        );
        assert_eq!(
            ProbeState::new(Kind::Readiness, t, t0).verdict(),
            Verdict::Failure
        );
        assert_eq!(
            ProbeState::new(Kind::Startup, t, t0).verdict(),
            Verdict::Unknown
        );
    }

    #[test]
    fn thresholds_count_runs_of_equal_results() {
        let t0 = Instant::now();
        let mut s = ProbeState::new(
            Kind::Readiness,
            Timing::of(&probe(1, 2, 3, 0), Kind::Readiness),
            t0,
        );
        let at = |n: u64| t0 + Duration::from_secs(n);
        assert_eq!(s.record(true, "", at(0)), None, "one success of two");
        assert_eq!(s.record(true, "", at(1)), Some(Verdict::Success));
        assert_eq!(s.record(true, "", at(2)), None, "no change, nothing to say");
        assert_eq!(s.record(false, "503", at(3)), None);
        assert_eq!(s.record(true, "", at(4)), None, "a success breaks the run");
        assert_eq!(s.record(false, "a", at(5)), None);
        assert_eq!(s.record(false, "b", at(6)), None);
        assert_eq!(s.record(false, "c", at(7)), Some(Verdict::Failure));
        assert_eq!(s.message(), "c");
        assert_eq!(s.next_at(), at(8));
    }

    #[test]
    fn a_liveness_failure_starts_counting_again() {
        let t0 = Instant::now();
        let mut s = ProbeState::new(
            Kind::Liveness,
            Timing::of(&probe(1, 1, 2, 0), Kind::Liveness),
            t0,
        );
        assert_eq!(s.record(false, "x", t0), None);
        assert_eq!(s.record(false, "x", t0), Some(Verdict::Failure));
        assert_eq!(s.record(true, "", t0), Some(Verdict::Success));
    }

    #[test]
    fn one_probe_at_a_time() {
        let t0 = Instant::now();
        let mut s = ProbeState::new(
            Kind::Startup,
            Timing::of(&probe(1, 1, 1, 0), Kind::Startup),
            t0,
        );
        assert!(s.due(t0));
        s.started();
        assert!(!s.due(t0 + Duration::from_secs(60)), "still running");
        assert_eq!(s.record(true, "", t0), Some(Verdict::Success));
        assert!(s.due(t0 + Duration::from_secs(1)));
    }

    #[test]
    fn long_messages_are_cut_at_a_character() {
        let t0 = Instant::now();
        let mut s = ProbeState::new(
            Kind::Readiness,
            Timing::of(&probe(1, 1, 1, 0), Kind::Readiness),
            t0,
        );
        let long = "é".repeat(MESSAGE_BYTES);
        s.record(false, &long, t0);
        assert!(s.message().len() <= MESSAGE_BYTES);
        assert!(s.message().len() >= MESSAGE_BYTES - 1);
        assert!(s.message().chars().all(|c| c == 'é'));
    }
}
