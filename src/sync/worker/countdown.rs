//! A pod's stop deadline, kept with its state in the store: the moment its containers
//! get SIGKILL, on the boot's own clock. A stopping agent does not wait for its pods'
//! stops to end (a grace period may be a year long; systemd's stop timeout is not), so
//! the next agent reads the deadline back and resumes the countdown where it was,
//! rather than starting it again or forgetting it.

use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio::time::Instant;

use super::Worker;

/// The longest grace period waited out: a year. The API takes any non-negative i64
/// (the largest is 292 billion years, which no clock can add to now: it overflowed
/// the monotonic clock and aborted the agent), and a container that has not stopped
/// within a year of SIGTERM is not going to; the wait ends as soon as it exits anyway.
pub(super) const MAX_GRACE: Duration = Duration::from_secs(365 * 24 * 3600);

/// A grace period in seconds from a spec or the apiserver as a wait: a negative one
/// (which validation refuses in a manifest) is none, one beyond [`MAX_GRACE`] is that.
pub(super) fn grace_wait(seconds: i64) -> Duration {
    u64::try_from(seconds)
        .map(Duration::from_secs)
        .unwrap_or(Duration::ZERO)
        .min(MAX_GRACE)
}

/// `wait` from now, or the farthest the clock can hold should it not hold that.
pub(super) fn deadline_in(wait: Duration) -> Instant {
    crate::time::instant_after(Instant::now(), wait)
}

/// When a pod's stop ends in SIGKILL.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct StopDeadline {
    /// The boot it was set in: after a reboot nothing of the pod runs any more.
    pub boot_id: String,
    /// `CLOCK_BOOTTIME` at the deadline, in milliseconds: a jump of the wall clock (a
    /// board without an RTC set from 1970 by NTP) does not move it.
    pub boot_ms: u64,
}

impl StopDeadline {
    /// `wait` after `now` (a `CLOCK_BOOTTIME` reading) in boot `boot`.
    pub fn after(boot: &str, now: Duration, wait: Duration) -> StopDeadline {
        let at = now.saturating_add(wait);
        StopDeadline {
            boot_id: boot.to_owned(),
            boot_ms: u64::try_from(at.as_millis()).unwrap_or(u64::MAX),
        }
    }

    /// What is left of the wait at `now` in boot `boot`: nothing in another boot,
    /// never more than [`MAX_GRACE`] (the record is read back from disk).
    pub fn left(&self, boot: &str, now: Duration) -> Duration {
        if self.boot_id != boot {
            return Duration::ZERO;
        }
        Duration::from_millis(self.boot_ms)
            .saturating_sub(now)
            .min(MAX_GRACE)
    }
}

/// A stop's deadline as the worker acts on it.
pub(super) struct Countdown {
    pub deadline: Instant,
    /// The wait from now to the deadline.
    pub wait: Duration,
    /// An earlier agent began this stop: its preStop hooks ran then.
    pub resumed: bool,
}

impl Worker {
    /// The deadline of the pod's stop with a grace period of `grace` seconds: the one
    /// in the store if an earlier agent began this stop, else one set now and written
    /// to the store before any signal goes out.
    pub(super) async fn countdown(&mut self, grace: i64) -> Countdown {
        let boot = crate::runtime::boot_id();
        let now = crate::time::boottime();
        if let Some(d) = self.state.as_ref().and_then(|s| s.stop_deadline.as_ref()) {
            let wait = d.left(&boot, now);
            log::info!(
                "pod {}: resuming its stop, {}s of its grace period left",
                self.name(),
                wait.as_secs()
            );
            return Countdown {
                deadline: deadline_in(wait),
                wait,
                resumed: true,
            };
        }
        let wait = grace_wait(grace);
        let countdown = Countdown {
            deadline: deadline_in(wait),
            wait,
            resumed: false,
        };
        // A pod with no state in the store never ran a container: nothing to resume.
        let Some(mut state) = self.state.clone() else {
            return countdown;
        };
        state.stop_deadline = Some(StopDeadline::after(&boot, now, wait));
        // Handed to the kernel at once (an agent killed now loses none of it); the
        // stopping agent's last flush makes it durable.
        if let Err(e) = self.save_state(&state, true).await {
            log::warn!(
                "pod {}: save its stop deadline: {e}; a restarted agent starts the grace period again",
                self.name()
            );
        }
        self.state = Some(state);
        countdown
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grace_periods_from_outside_become_waits_the_clock_can_hold() {
        assert_eq!(grace_wait(30), Duration::from_secs(30));
        assert_eq!(grace_wait(0), Duration::ZERO);
        assert_eq!(grace_wait(-1), Duration::ZERO);
        assert_eq!(grace_wait(i64::MIN), Duration::ZERO);
        assert_eq!(grace_wait(i64::MAX), MAX_GRACE);
        let before = Instant::now();
        let far = deadline_in(grace_wait(i64::MAX));
        assert!(far >= before + MAX_GRACE);
        // A wait no clock holds saturates rather than panics.
        assert!(deadline_in(Duration::MAX) >= before + MAX_GRACE);
    }

    #[test]
    fn the_deadline_counts_on_in_its_boot_and_is_over_after_a_reboot() {
        let d = StopDeadline::after("boot-a", Duration::from_secs(100), Duration::from_secs(120));
        assert_eq!(d.boot_ms, 220_000);
        assert_eq!(
            d.left("boot-a", Duration::from_secs(150)),
            Duration::from_secs(70)
        );
        assert_eq!(d.left("boot-a", Duration::from_secs(500)), Duration::ZERO);
        assert_eq!(d.left("boot-b", Duration::from_secs(150)), Duration::ZERO);
    }

    #[test]
    fn a_deadline_from_disk_is_bounded() {
        let far = StopDeadline {
            boot_id: "b".into(),
            boot_ms: u64::MAX,
        };
        assert_eq!(far.left("b", Duration::ZERO), MAX_GRACE);
        let max = StopDeadline::after("b", Duration::MAX, Duration::MAX);
        assert_eq!(max.boot_ms, u64::MAX);
    }

    #[test]
    fn a_state_stored_before_deadlines_existed_still_decodes() {
        let json = serde_json::json!({
            "pod": {"metadata": {"name": "p"}},
            "status": {},
            "start_time": "2026-11-23T03:12:45Z",
        });
        let state: super::super::PodState = serde_json::from_value(json).expect("decode");
        assert_eq!(state.stop_deadline, None);
        let back = serde_json::to_value(&state).expect("encode");
        assert!(back.get("stop_deadline").is_none(), "{back}");
    }
}
