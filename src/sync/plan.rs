//! What to do next for one container: a pure function of its record, the pod's restart
//! policy and the clock, so the rules are tested without any IO.

use std::time::Duration;

use crate::backoff::Backoff;
use crate::time::Timestamp;

use super::record::{ContainerRecord, InstanceState};

#[derive(Debug, Clone, PartialEq)]
pub enum Action {
    /// No instance yet: create and start the first one.
    Start,
    /// The current instance ended and policy wants it back, back-off served: remove it
    /// and start the next one.
    Restart,
    /// The current instance ended and policy wants it back, but not before `until`.
    BackOff { until: Timestamp, delay: Duration },
    /// Running, or ended for good.
    Keep,
}

/// Whether `restartPolicy` brings a container back after it exited with `exit_code`.
pub fn should_restart(policy: &str, exit_code: i32) -> bool {
    match policy {
        "Never" => false,
        "OnFailure" => exit_code != 0,
        // "Always", and the API default when the field is empty.
        _ => true,
    }
}

/// The back-off a record is in: how long after its last exit the next start may come.
pub fn restart_delay(record: &ContainerRecord, backoff: &Backoff) -> Duration {
    backoff.delay(record.failures)
}

pub fn plan(policy: &str, record: &ContainerRecord, now: Timestamp, backoff: &Backoff) -> Action {
    let Some(current) = &record.current else {
        return Action::Start;
    };
    let InstanceState::Terminated(t) = &current.state else {
        return Action::Keep;
    };
    if !should_restart(policy, t.exit_code) {
        return Action::Keep;
    }
    let delay = restart_delay(record, backoff);
    let until = crate::time::add(t.finished_at, delay);
    if now >= until {
        Action::Restart
    } else {
        Action::BackOff { until, delay }
    }
}

/// Records that the current instance ended: counts the failure for back-off, or forgets
/// earlier failures when it ran cleanly for at least `reset`.
pub fn count_exit(record: &mut ContainerRecord, reset: Duration) {
    let Some(current) = &record.current else {
        return;
    };
    let InstanceState::Terminated(t) = &current.state else {
        return;
    };
    let ran = match t.started_at {
        Some(s) => t.finished_at.duration_since(s),
        None => k8s_openapi::jiff::SignedDuration::ZERO,
    };
    let ran_clean = k8s_openapi::jiff::SignedDuration::try_from(reset)
        .map(|r| ran >= r)
        .unwrap_or(false);
    record.failures = if ran_clean {
        1
    } else {
        record.failures.saturating_add(1)
    };
}

#[cfg(test)]
mod tests {
    use super::super::record::{Instance, Terminated};
    use super::*;
    use crate::runtime::ContainerId;

    fn ts(secs: i64) -> Timestamp {
        Timestamp::from_second(1_700_000_000 + secs).expect("valid")
    }

    fn exited(code: i32, started: i64, finished: i64, failures: u32) -> ContainerRecord {
        let mut r = ContainerRecord::new("c");
        r.failures = failures;
        r.current = Some(Instance {
            id: ContainerId::derive("uid", "c", 0),
            image: "busybox".into(),
            image_id: "sha256:x".into(),
            state: InstanceState::Terminated(Terminated {
                container_id: None,
                exit_code: code,
                signal: None,
                reason: "Error".into(),
                message: None,
                started_at: Some(ts(started)),
                finished_at: ts(finished),
            }),
        });
        r
    }

    const B: Backoff = Backoff {
        initial: Duration::from_secs(10),
        max: Duration::from_secs(300),
    };

    #[test]
    fn policies() {
        assert!(should_restart("Always", 0));
        assert!(should_restart("Always", 1));
        assert!(!should_restart("OnFailure", 0));
        assert!(should_restart("OnFailure", 2));
        assert!(!should_restart("Never", 1));
    }

    #[test]
    fn first_instance_starts() {
        assert_eq!(
            plan("Always", &ContainerRecord::new("c"), ts(0), &B),
            Action::Start
        );
    }

    #[test]
    fn back_off_grows_and_then_restarts() {
        let r = exited(1, 0, 1, 2);
        match plan("Always", &r, ts(5), &B) {
            Action::BackOff { until, delay } => {
                assert_eq!(delay, Duration::from_secs(20));
                assert_eq!(until, ts(21));
            }
            other => panic!("expected back-off, got {other:?}"),
        }
        assert_eq!(plan("Always", &r, ts(21), &B), Action::Restart);
    }

    #[test]
    fn never_and_on_failure_keep_finished_containers() {
        assert_eq!(
            plan("Never", &exited(1, 0, 1, 1), ts(100), &B),
            Action::Keep
        );
        assert_eq!(
            plan("OnFailure", &exited(0, 0, 1, 1), ts(100), &B),
            Action::Keep
        );
        assert_eq!(
            plan("OnFailure", &exited(3, 0, 1, 1), ts(100), &B),
            Action::Restart
        );
    }

    #[test]
    fn clean_run_resets_back_off() {
        let mut r = exited(1, 0, 700, 5);
        count_exit(&mut r, Duration::from_secs(600));
        assert_eq!(r.failures, 1);
        let mut r = exited(1, 0, 5, 5);
        count_exit(&mut r, Duration::from_secs(600));
        assert_eq!(r.failures, 6);
    }
}
