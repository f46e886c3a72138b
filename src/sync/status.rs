//! Pod and container status exactly as the kubelet reports them: a pure function of the
//! pod spec, the container records and the clock.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::core::v1::{
    Container, ContainerState, ContainerStateRunning, ContainerStateTerminated,
    ContainerStateWaiting, ContainerStatus, HostIP, Pod, PodCondition, PodIP, PodStatus,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

use crate::backoff::Backoff;
use crate::time::Timestamp;

use super::plan::{self, Action};
use super::record::{ContainerRecord, InstanceState, Terminated};

mod ephemeral;
mod init;
use ephemeral::ephemeral_statuses;
use init::initialized;
pub use init::{app_done, init_failed, init_policy, is_sidecar, phase_with_init};

/// What the status needs beyond the pod and its records.
pub struct StatusInputs<'a> {
    pub now: Timestamp,
    pub backoff: &'a Backoff,
    /// When the worker first accepted the pod (`startTime`).
    pub start_time: Option<Timestamp>,
    /// The node's address: `hostIP`, and `podIP` for host-network pods only.
    pub host_ip: Option<&'a str>,
    /// The status reported before, whose condition transition times are kept when a
    /// condition did not change.
    pub previous: Option<&'a PodStatus>,
    /// The pod was deleted in the cluster and its containers have been stopped: with
    /// every container ended, the phase is terminal (the kubelet's `podIsTerminal`).
    pub terminal: bool,
    /// The pod's sandbox (namespaces, network, volumes); None: no sandbox is kept
    /// for it, and a pod with its own network shows no address.
    pub sandbox: Option<&'a SandboxStatus>,
    /// What the probes say of each running container, by name; a container missing
    /// here is ready and started once it runs.
    pub probes: Option<&'a BTreeMap<String, ProbeView>>,
}

/// What the pod's sandbox says for its status.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SandboxStatus {
    /// Set up: PodReadyToStartContainers is True.
    pub ready: bool,
    /// The pod's own addresses, IPv4 first; empty for a host-network pod.
    pub pod_ips: Vec<String>,
}

/// What the probes say of one running container, for its status.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProbeView {
    /// Its startup probe succeeded (or it has none).
    pub started: bool,
    /// Started, and its readiness probe succeeds (or it has none).
    pub ready: bool,
}

/// The pod's `restartPolicy`, `Always` when it sets none (the API's default).
pub fn restart_policy(pod: &Pod) -> &str {
    pod.spec
        .as_ref()
        .and_then(|s| s.restart_policy.as_deref())
        .unwrap_or("Always")
}

pub fn pod_status(
    pod: &Pod,
    records: &BTreeMap<String, ContainerRecord>,
    i: &StatusInputs<'_>,
) -> PodStatus {
    let spec = pod.spec.as_ref();
    // A pod that is over restarts nothing: its containers show how they ended.
    let policy = if i.terminal {
        "Never"
    } else {
        restart_policy(pod)
    };
    let containers: &[Container] = spec.map(|s| s.containers.as_slice()).unwrap_or(&[]);
    let inits: &[Container] = spec
        .and_then(|s| s.init_containers.as_deref())
        .unwrap_or(&[]);
    let (init_statuses, statuses) = container_statuses(pod, records, i, policy);
    let phase = phase_with_init(policy, inits, &init_statuses, &statuses, i.terminal);
    let terminal = phase == "Succeeded" || phase == "Failed";
    let conditions = conditions(pod, i, &init_statuses, &statuses, phase);
    let generation = pod.metadata.generation;
    let ip = i.host_ip.map(str::to_string);
    let (pod_ip, pod_ips) = pod_addresses(pod, i, terminal || i.terminal);
    let qos_containers: Vec<Container> = inits.iter().chain(containers).cloned().collect();
    PodStatus {
        phase: Some(phase.to_string()),
        conditions: Some(conditions),
        init_container_statuses: (!init_statuses.is_empty()).then_some(init_statuses),
        container_statuses: Some(statuses),
        ephemeral_container_statuses: ephemeral_statuses(pod, records, i),
        host_ip: ip.clone(),
        host_ips: ip.clone().map(|ip| vec![HostIP { ip }]),
        pod_ip,
        pod_ips,
        qos_class: Some(crate::resources::qos::qos_class(&qos_containers).to_string()),
        start_time: i.start_time.map(Time),
        observed_generation: generation,
        ..PodStatus::default()
    }
}

/// The statuses of the pod's init containers and of its app containers, under the
/// pod's restart `policy` (sidecars restart until the pod is over).
fn container_statuses(
    pod: &Pod,
    records: &BTreeMap<String, ContainerRecord>,
    i: &StatusInputs<'_>,
    policy: &str,
) -> (Vec<ContainerStatus>, Vec<ContainerStatus>) {
    let spec = pod.spec.as_ref();
    let containers: &[Container] = spec.map(|s| s.containers.as_slice()).unwrap_or(&[]);
    let inits: &[Container] = spec
        .and_then(|s| s.init_containers.as_deref())
        .unwrap_or(&[]);
    let who = who(pod);
    let creating = creating(inits);
    let over =
        i.terminal || app_done(policy, containers, records) || init_failed(policy, inits, records);
    let status_of = |c: &Container, policy: &str| {
        let fresh;
        let rec = match records.get(&c.name) {
            Some(r) => r,
            None => {
                fresh = ContainerRecord::new(&c.name);
                &fresh
            }
        };
        let view = i.probes.and_then(|p| p.get(&c.name)).copied();
        let mut s = container_status(c, rec, policy, &who, i.now, i.backoff, view, creating);
        if !is_sidecar(c) && inits.iter().any(|ic| ic.name == c.name) {
            // A regular init container is ready once it completed.
            let done = s
                .state
                .as_ref()
                .and_then(|st| st.terminated.as_ref())
                .is_some_and(|t| t.exit_code == 0);
            s.ready = done;
            s.started = Some(s.state.as_ref().is_some_and(|st| st.running.is_some()));
        }
        s
    };
    let init_statuses: Vec<ContainerStatus> = inits
        .iter()
        .map(|c| {
            let policy = match (is_sidecar(c), over) {
                (true, true) => "Never",
                (true, false) => "Always",
                (false, _) => init_policy(policy),
            };
            status_of(c, policy)
        })
        .collect();
    let statuses: Vec<ContainerStatus> = containers.iter().map(|c| status_of(c, policy)).collect();
    (init_statuses, statuses)
}

/// `<pod>_<namespace>(<uid>)`, as back-off messages name the pod.
fn who(pod: &Pod) -> String {
    let pod_name = pod.metadata.name.as_deref().unwrap_or("");
    let namespace = pod.metadata.namespace.as_deref().unwrap_or("default");
    let uid = pod.metadata.uid.as_deref().unwrap_or("");
    format!("{pod_name}_{namespace}({uid})")
}

/// The waiting reason of a container that never ran, in a pod with `inits`.
fn creating(inits: &[Container]) -> &'static str {
    if inits.is_empty() {
        "ContainerCreating"
    } else {
        "PodInitializing"
    }
}

/// The pod's conditions for its `phase` and containers' statuses, each marked with the
/// generation of the spec it describes (v1.34+).
fn conditions(
    pod: &Pod,
    i: &StatusInputs<'_>,
    init_statuses: &[ContainerStatus],
    statuses: &[ContainerStatus],
    phase: &str,
) -> Vec<PodCondition> {
    let inits: &[Container] = pod
        .spec
        .as_ref()
        .and_then(|s| s.init_containers.as_deref())
        .unwrap_or(&[]);
    let terminal = phase == "Succeeded" || phase == "Failed";
    let (ready, ready_reason, ready_message) = if terminal {
        ("False", Some("PodCompleted"), None)
    } else {
        readiness(inits, init_statuses, statuses)
    };
    let sandbox = if terminal || i.sandbox.is_some_and(|sb| !sb.ready) {
        "False"
    } else {
        "True"
    };
    let (initialized, init_reason, init_message) =
        initialized(inits, init_statuses, statuses, phase);
    // Ready is ContainersReady while that is not True; then the readiness gates say.
    let (pod_ready, pod_reason, pod_message) = match unready_gates(pod) {
        Some(message) if ready == "True" => ("False", Some(GATES_NOT_READY), Some(message)),
        _ => (ready, ready_reason, ready_message.clone()),
    };
    let mut conditions = vec![
        condition(i, "PodReadyToStartContainers", sandbox, None, None),
        condition(i, "Initialized", initialized, init_reason, init_message),
        condition(i, "Ready", pod_ready, pod_reason, pod_message),
        condition(i, "ContainersReady", ready, ready_reason, ready_message),
        condition(i, "PodScheduled", "True", None, None),
    ];
    for c in &mut conditions {
        c.observed_generation = pod.metadata.generation;
    }
    conditions
}

/// Ready and ContainersReady of a pod that is not over: true once every app container
/// and sidecar is ready (regular init containers do not count), else the unready ones.
fn readiness(
    inits: &[Container],
    init_statuses: &[ContainerStatus],
    statuses: &[ContainerStatus],
) -> (&'static str, Option<&'static str>, Option<String>) {
    let unready: Vec<&str> = inits
        .iter()
        .zip(init_statuses)
        .filter(|(c, _)| is_sidecar(c))
        .map(|(_, s)| s)
        .chain(statuses.iter())
        .filter(|s| !s.ready)
        .map(|s| s.name.as_str())
        .collect();
    if unready.is_empty() {
        ("True", None, None)
    } else {
        (
            "False",
            Some("ContainersNotReady"),
            Some(format!(
                "containers with unready status: [{}]",
                unready.join(" ")
            )),
        )
    }
}

/// The reason of a Ready condition held back by the pod's readiness gates.
const GATES_NOT_READY: &str = "ReadinessGatesNotReady";

/// What holds the pod's readiness gates back, in the kubelet's words, from the
/// conditions others set in its status; None when every gate's condition is True.
fn unready_gates(pod: &Pod) -> Option<String> {
    let gates = pod.spec.as_ref()?.readiness_gates.as_deref()?;
    let conditions = pod
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_deref())
        .unwrap_or_default();
    let unready: Vec<String> = gates
        .iter()
        .filter_map(|g| {
            let t = &g.condition_type;
            match conditions.iter().find(|c| &c.type_ == t) {
                None => Some(format!(
                    "corresponding condition of pod readiness gate \"{t}\" does not exist."
                )),
                Some(c) if c.status != "True" => Some(format!(
                    "the status of pod readiness gate \"{t}\" is not \"True\", but {}",
                    c.status
                )),
                Some(_) => None,
            }
        })
        .collect();
    (!unready.is_empty()).then(|| unready.join(", "))
}

/// `podIP` and `podIPs`: a host-network pod shows the node's address; a pod with its
/// own network its own addresses, and none while it has none yet (its sandbox waits
/// for a volume, say), as the kubelet reports it. The node's address in their place
/// would be merged with the pod's own later and refused by the apiserver (two IPv4
/// addresses). A pod that ended keeps the addresses it had once its sandbox is gone.
fn pod_addresses(
    pod: &Pod,
    i: &StatusInputs<'_>,
    terminal: bool,
) -> (Option<String>, Option<Vec<PodIP>>) {
    let host_network = pod
        .spec
        .as_ref()
        .and_then(|s| s.host_network)
        .unwrap_or(false);
    let mut own: Vec<String> = if host_network {
        i.host_ip.map(str::to_string).into_iter().collect()
    } else {
        i.sandbox.map(|sb| sb.pod_ips.clone()).unwrap_or_default()
    };
    if own.is_empty() && !host_network && terminal {
        own = i
            .previous
            .and_then(|p| p.pod_ips.as_ref())
            .into_iter()
            .flatten()
            .map(|p| p.ip.clone())
            .filter(|ip| Some(ip.as_str()) != i.host_ip)
            .collect();
    }
    if own.is_empty() {
        return (None, None);
    }
    (
        own.first().cloned(),
        Some(own.into_iter().map(|ip| PodIP { ip }).collect()),
    )
}

fn condition(
    i: &StatusInputs<'_>,
    type_: &str,
    status: &str,
    reason: Option<&str>,
    message: Option<String>,
) -> PodCondition {
    let before = i
        .previous
        .and_then(|p| p.conditions.as_ref())
        .and_then(|cs| cs.iter().find(|c| c.type_ == type_));
    let since = match before {
        Some(b) if b.status == status => b.last_transition_time.clone(),
        _ => Some(Time(i.now)),
    };
    PodCondition {
        type_: type_.to_string(),
        status: status.to_string(),
        reason: reason.map(str::to_string),
        message,
        last_transition_time: since,
        ..PodCondition::default()
    }
}

/// The kubelet's `getPhase`, for pods without init containers.
pub fn phase(policy: &str, statuses: &[ContainerStatus], terminal: bool) -> &'static str {
    let (mut running, mut waiting, mut stopped, mut succeeded, mut unknown) = (0, 0, 0, 0, 0);
    for s in statuses {
        match s.state.as_ref() {
            Some(ContainerState {
                running: Some(_), ..
            }) => running += 1,
            Some(ContainerState {
                terminated: Some(t),
                ..
            }) => {
                stopped += 1;
                if t.exit_code == 0 {
                    succeeded += 1;
                }
            }
            Some(ContainerState {
                waiting: Some(_), ..
            }) => {
                let had_run = s
                    .last_state
                    .as_ref()
                    .and_then(|l| l.terminated.as_ref())
                    .is_some();
                if had_run {
                    stopped += 1;
                } else {
                    waiting += 1;
                }
            }
            _ => unknown += 1,
        }
    }
    if waiting > 0 {
        "Pending"
    } else if running > 0 && unknown == 0 {
        "Running"
    } else if running == 0 && stopped > 0 && unknown == 0 {
        if terminal {
            if stopped == succeeded {
                "Succeeded"
            } else {
                "Failed"
            }
        } else if policy == "Always" {
            "Running"
        } else if stopped == succeeded {
            "Succeeded"
        } else if policy == "Never" {
            "Failed"
        } else {
            "Running"
        }
    } else {
        "Pending"
    }
}

fn terminated_state(t: &Terminated) -> ContainerState {
    ContainerState {
        terminated: Some(ContainerStateTerminated {
            exit_code: t.exit_code,
            // The kubelet never fills `signal` (a killed container shows 137 and the
            // reason); the record keeps it for the agent's own use.
            signal: None,
            reason: Some(t.reason.clone()),
            message: t.message.clone(),
            started_at: t.started_at.map(Time),
            finished_at: Some(Time(t.finished_at)),
            container_id: t.container_id.clone(),
        }),
        ..ContainerState::default()
    }
}

fn waiting_state(reason: &str, message: Option<String>) -> ContainerState {
    ContainerState {
        waiting: Some(ContainerStateWaiting {
            reason: Some(reason.to_string()),
            message,
        }),
        ..ContainerState::default()
    }
}

/// One container's status. `who` is `<pod>_<namespace>(<uid>)` for back-off messages;
/// `view` is what its probes say; `creating` is the waiting reason before it ever ran.
#[allow(clippy::too_many_arguments)]
pub fn container_status(
    spec: &Container,
    rec: &ContainerRecord,
    policy: &str,
    who: &str,
    now: Timestamp,
    backoff: &Backoff,
    view: Option<ProbeView>,
    creating: &str,
) -> ContainerStatus {
    let mut s = ContainerStatus {
        name: spec.name.clone(),
        image: spec.image.clone().unwrap_or_default(),
        restart_count: i32::try_from(rec.restart_count).unwrap_or(i32::MAX),
        last_state: Some(rec.last.as_ref().map(terminated_state).unwrap_or_default()),
        started: Some(false),
        ..ContainerStatus::default()
    };
    let Some(cur) = &rec.current else {
        let (reason, message) = match &rec.waiting {
            Some(w) => (w.reason.as_str(), w.message.clone()),
            None => (creating, None),
        };
        s.state = Some(waiting_state(reason, message));
        return s;
    };
    s.image = cur.image.clone();
    s.image_id = cur.image_id.clone();
    s.container_id = Some(cur.id.uri());
    match &cur.state {
        InstanceState::Running { started_at } => {
            // A restart that failed to create its container shows the failure, not
            // the old instance.
            if let Some(w) = &rec.waiting {
                s.state = Some(waiting_state(&w.reason, w.message.clone()));
                return s;
            }
            s.state = Some(ContainerState {
                running: Some(ContainerStateRunning {
                    started_at: Some(Time(*started_at)),
                }),
                ..ContainerState::default()
            });
            let view = view.unwrap_or(ProbeView {
                started: true,
                ready: true,
            });
            s.ready = view.ready;
            s.started = Some(view.started);
        }
        InstanceState::Terminated(t) => match plan::plan(policy, rec, now, backoff) {
            Action::BackOff { delay, .. } => {
                let message = format!(
                    "back-off {} restarting failed container={} pod={}",
                    go_duration(delay),
                    spec.name,
                    who
                );
                s.state = Some(waiting_state("CrashLoopBackOff", Some(message)));
                s.last_state = Some(terminated_state(t));
            }
            _ => {
                if let Some(w) = &rec.waiting {
                    s.state = Some(waiting_state(&w.reason, w.message.clone()));
                    s.last_state = Some(terminated_state(t));
                } else {
                    s.state = Some(terminated_state(t));
                }
            }
        },
    }
    s
}

/// A duration the way Go prints it in kubelet messages (`10s`, `2m40s`, `5m0s`).
pub fn go_duration(d: Duration) -> String {
    let secs = d.as_secs();
    if secs < 60 {
        if d.subsec_millis() == 0 {
            format!("{secs}s")
        } else {
            format!("{}s", d.as_secs_f64())
        }
    } else if secs < 3600 {
        format!("{}m{}s", secs / 60, secs % 60)
    } else {
        format!("{}h{}m{}s", secs / 3600, (secs % 3600) / 60, secs % 60)
    }
}

#[cfg(test)]
#[path = "status_tests.rs"]
mod tests;
