//! The init-container rules of a pod's status, as the kubelet's: which init containers
//! are sidecars, when the pod's work is done or has failed in initialization, the
//! Initialized condition, and getPhase with init containers.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Container, ContainerStatus};

use super::super::plan;
use super::super::record::{ContainerRecord, InstanceState};
use super::phase;

/// An init container with `restartPolicy: Always`: a sidecar that starts before the
/// app containers and runs beside them.
pub fn is_sidecar(c: &Container) -> bool {
    c.restart_policy.as_deref() == Some("Always")
}

/// The restart policy of a regular init container: it reruns until it succeeds
/// unless the pod never restarts anything.
pub fn init_policy(pod_policy: &str) -> &'static str {
    if pod_policy == "Never" {
        "Never"
    } else {
        "OnFailure"
    }
}

/// Every app container has ended and policy brings none back: the pod's work is
/// done, and its sidecars are stopped and not restarted.
pub fn app_done(
    policy: &str,
    containers: &[Container],
    records: &BTreeMap<String, ContainerRecord>,
) -> bool {
    !containers.is_empty()
        && containers.iter().all(|c| {
            let ended = records
                .get(&c.name)
                .and_then(|r| r.current.as_ref())
                .and_then(|cur| match &cur.state {
                    InstanceState::Terminated(t) => Some(t.exit_code),
                    InstanceState::Running { .. } => None,
                });
            ended.is_some_and(|code| !plan::should_restart(policy, code))
        })
}

/// A regular init container failed and the pod's policy runs it no more: the pod
/// has failed.
pub fn init_failed(
    policy: &str,
    inits: &[Container],
    records: &BTreeMap<String, ContainerRecord>,
) -> bool {
    policy == "Never"
        && inits.iter().filter(|c| !is_sidecar(c)).any(|c| {
            records
                .get(&c.name)
                .and_then(|r| r.current.as_ref())
                .is_some_and(
                    |cur| matches!(&cur.state, InstanceState::Terminated(t) if t.exit_code != 0),
                )
        })
}

/// The kubelet's `GeneratePodInitializedCondition`: (status, reason, message).
pub(super) fn initialized(
    inits: &[Container],
    init_statuses: &[ContainerStatus],
    statuses: &[ContainerStatus],
    phase: &str,
) -> (&'static str, Option<&'static str>, Option<String>) {
    if inits.is_empty() {
        return ("True", None, None);
    }
    if phase == "Succeeded" {
        return ("True", Some("PodCompleted"), None);
    }
    // An app container that ever started means the pod was initialized (its sidecars
    // may be restarting now).
    let any_started = statuses.iter().any(|s| {
        s.state
            .as_ref()
            .is_some_and(|st| st.running.is_some() || st.terminated.is_some())
    });
    if any_started {
        return ("True", None, None);
    }
    let incomplete: Vec<&str> = inits
        .iter()
        .zip(init_statuses)
        .filter(|(c, s)| {
            if is_sidecar(c) {
                s.started != Some(true)
            } else {
                s.state
                    .as_ref()
                    .and_then(|st| st.terminated.as_ref())
                    .is_none_or(|t| t.exit_code != 0)
            }
        })
        .map(|(c, _)| c.name.as_str())
        .collect();
    if incomplete.is_empty() {
        ("True", None, None)
    } else {
        (
            "False",
            Some("ContainersNotInitialized"),
            Some(format!(
                "containers with incomplete status: [{}]",
                incomplete.join(" ")
            )),
        )
    }
}

/// The kubelet's `getPhase` with init containers: a pod whose regular init
/// containers have not all succeeded (or whose sidecars have not started) is Pending,
/// one whose init container failed under `restartPolicy: Never` is Failed.
pub fn phase_with_init(
    policy: &str,
    inits: &[Container],
    init_statuses: &[ContainerStatus],
    statuses: &[ContainerStatus],
    terminal: bool,
) -> &'static str {
    let (mut pending_sidecars, mut pending_regular, mut failed_init) = (0, 0, 0);
    for (c, s) in inits.iter().zip(init_statuses) {
        let state = s.state.as_ref();
        let had_run = s.last_state.as_ref().and_then(|l| l.terminated.as_ref());
        if is_sidecar(c) {
            let pending = match state {
                Some(st) if st.running.is_some() => s.started != Some(true),
                Some(st) if st.terminated.is_some() => false,
                Some(st) if st.waiting.is_some() => had_run.is_none(),
                _ => true,
            };
            if pending {
                pending_sidecars += 1;
            }
            continue;
        }
        match state {
            Some(st) if st.running.is_some() => pending_regular += 1,
            Some(st) if st.terminated.is_some() => {
                if st.terminated.as_ref().is_some_and(|t| t.exit_code != 0) {
                    failed_init += 1;
                }
            }
            Some(st) if st.waiting.is_some() => match had_run {
                Some(t) if t.exit_code != 0 => failed_init += 1,
                Some(_) => {}
                None => pending_regular += 1,
            },
            _ => pending_regular += 1,
        }
    }
    if failed_init > 0 && policy == "Never" {
        return "Failed";
    }
    let app = phase(policy, statuses, terminal);
    let stopped = statuses.iter().any(|s| {
        s.state.as_ref().is_some_and(|st| st.terminated.is_some())
            || s.last_state
                .as_ref()
                .and_then(|l| l.terminated.as_ref())
                .is_some()
    });
    if pending_regular > 0 || (pending_sidecars > 0 && !stopped) {
        if terminal {
            return app;
        }
        return "Pending";
    }
    app
}
