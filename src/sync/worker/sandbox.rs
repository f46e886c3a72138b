//! The worker's side of a pod's sandbox (see `sync::sandbox`): set up before its
//! containers start, kept up to date on resync (CNI CHECK, changed ConfigMaps and
//! Secrets), torn down once its containers are gone; and a pod that ends without its
//! containers having the last word — rejected at admission, evicted, or past its
//! active deadline (see `deadline`).

use std::time::Duration;

use k8s_openapi::api::core::v1::{Container, PodCondition, PodStatus};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use tokio::time::Instant;

use super::super::record::{ContainerRecord, Waiting};
use super::super::sandbox::Ready;
use super::super::status::SandboxStatus;
use super::{blocking, Worker};
use crate::runtime::BindMount;
use crate::uplink::report::EventType;

/// How soon a sandbox that failed to set up is tried again (a changed ConfigMap or
/// Secret wakes the worker at once).
const RETRY: Duration = Duration::from_secs(10);
/// How soon a sandbox waiting for a ConfigMap or Secret from the apiserver looks again.
const WAIT_OBJECTS: Duration = Duration::from_secs(1);

/// How a pod ended that the agent ended: its status reason and message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ended {
    pub reason: String,
    pub message: String,
    /// Rejected at admission: nothing of it ever ran.
    pub rejected: bool,
    /// A disruption, which the kubelet marks with the DisruptionTarget condition: an
    /// eviction under node pressure is; one for the pod's own storage limits, or a pod
    /// past its active deadline (`generateAPIPodStatus` sets only phase, reason and
    /// message), is not.
    pub disruption: bool,
}

impl Ended {
    pub fn disrupts(&self) -> bool {
        !self.rejected && self.disruption
    }

    /// What a stored status says, if the agent ended the pod (only it sets a pod-level
    /// reason on a Failed pod).
    pub fn from_status(status: &PodStatus) -> Option<Ended> {
        if status.phase.as_deref() != Some("Failed") {
            return None;
        }
        let reason = status.reason.clone()?;
        let disruption = status
            .conditions
            .iter()
            .flatten()
            .any(|c| c.type_ == "DisruptionTarget" && c.status == "True");
        Some(Ended {
            reason,
            message: status.message.clone().unwrap_or_default(),
            rejected: status.container_statuses.as_ref().is_none_or(Vec::is_empty),
            disruption,
        })
    }
}

/// Event reasons are static: the ones the agent ends pods with.
fn static_reason(reason: &str) -> &'static str {
    match reason {
        "OutOfcpu" => "OutOfcpu",
        "OutOfmemory" => "OutOfmemory",
        "OutOfpods" => "OutOfpods",
        "SysctlForbidden" => "SysctlForbidden",
        "Forbidden" => "Forbidden",
        "HostPathForbidden" => "HostPathForbidden",
        "Evicted" => "Evicted",
        "NodeShutdown" => "NodeShutdown",
        _ => "UnexpectedAdmissionError",
    }
}

impl Worker {
    /// Sets the sandbox up (or brings it up to date). False when the pod has none to
    /// start containers in; the failure is said once and tried again soon.
    pub(super) async fn ensure_sandbox(&mut self) -> bool {
        let deps = self.deps.clone();
        let pod = self.pod.clone();
        let check = self.sandbox.is_some()
            && self
                .last_check
                .is_none_or(|t| t.elapsed() >= self.deps.sync_frequency);
        let result = blocking(move || deps.sandboxes.ensure(&deps, &pod, check)).await;
        if check {
            self.last_check = Some(Instant::now());
        }
        match result {
            Ok(ready) => {
                for (reason, message) in &ready.warnings {
                    if !self.said.contains(message) {
                        self.said.push(message.clone());
                        self.deps.reporter.event(
                            &self.pod,
                            None,
                            EventType::Warning,
                            reason,
                            message.clone(),
                        );
                    }
                }
                self.sandbox_error = None;
                self.sandbox = Some(ready);
                true
            }
            Err(e) if e.is_waiting() => {
                let message = e.to_string();
                if self.sandbox_error.as_ref() != Some(&message) {
                    log::info!("pod {}: waits: {message}", self.name());
                    self.sandbox_error = Some(message);
                }
                self.wake_at(Instant::now() + WAIT_OBJECTS);
                self.sandbox.is_some()
            }
            Err(e) => {
                let message = e.to_string();
                if self.sandbox_error.as_ref() != Some(&message) {
                    log::warn!("pod {}: {message}", self.name());
                    self.deps.reporter.event(
                        &self.pod,
                        None,
                        EventType::Warning,
                        e.reason(),
                        message.clone(),
                    );
                    self.sandbox_error = Some(message);
                }
                self.wake_at(Instant::now() + RETRY);
                // Containers already running keep what they have (a ConfigMap deleted
                // under a running pod leaves its files as they were).
                self.sandbox.is_some()
            }
        }
    }

    /// What the status says of the sandbox.
    pub(super) fn sandbox_status(&self) -> SandboxStatus {
        SandboxStatus {
            ready: self.sandbox.is_some(),
            pod_ips: self
                .sandbox
                .as_ref()
                .map(|s| s.ips.clone())
                .unwrap_or_default(),
        }
    }

    /// The pod's own addresses, for `status.podIP` in the environment.
    pub(super) fn pod_ips(&self) -> Vec<String> {
        self.sandbox
            .as_ref()
            .map(|s| s.ips.clone())
            .unwrap_or_default()
    }

    /// `c`'s volume mounts, or None with `rec` waiting in CreateContainerConfigError (a
    /// volumeMount its pod's volumes cannot give, a subPath that leaves its volume),
    /// said once per distinct failure.
    pub(super) async fn mounts(
        &self,
        c: &Container,
        env: &[(String, String)],
        rec: &mut ContainerRecord,
    ) -> Option<Vec<BindMount>> {
        let Some(ready) = self.sandbox.clone() else {
            return Some(Vec::new());
        };
        let dir = self.deps.sandboxes.pod_dir(&self.uid);
        let container = c.clone();
        let env = env.to_vec();
        let resolved = blocking(move || {
            crate::volume::container_mounts(&dir, &container, &ready.volumes, &env)
        })
        .await;
        let message = match resolved {
            Ok(m) => return Some(m),
            Err(e) => e.to_string(),
        };
        let waiting = Waiting {
            reason: "CreateContainerConfigError".into(),
            message: Some(message.clone()),
        };
        if rec.waiting.as_ref() != Some(&waiting) {
            log::warn!("pod {}: container {}: {message}", self.name(), c.name);
            self.failed(c, &message);
        }
        rec.waiting = Some(waiting);
        None
    }

    /// The sandbox for the runtime, if one is set up.
    pub(super) fn runtime_sandbox(&self) -> Option<Ready> {
        self.sandbox.clone()
    }

    /// Tears the sandbox down; the pod's containers are gone.
    pub(super) async fn teardown_sandbox(&mut self) {
        let deps = self.deps.clone();
        let uid = self.uid.clone();
        if let Err(e) = blocking(move || {
            // The kubelet's DeleteServiceAccountToken: the pod's tokens go with it.
            if let Some(tokens) = &deps.tokens {
                if let Err(e) = tokens.forget(&uid) {
                    log::warn!("pod {uid}: drop its service-account tokens: {e}");
                }
            }
            deps.sandboxes.teardown(&uid)
        })
        .await
        {
            // The next agent start (or `holdfast reset`) tries again.
            log::warn!("pod {}: tear down its sandbox: {e}", self.name());
        }
        self.sandbox = None;
    }

    /// Ends the pod as the kubelet's eviction manager does: its containers killed at
    /// once, phase Failed, reason Evicted, the manager's message, the Evicted event.
    pub(super) async fn evict(&mut self, eviction: super::Eviction) {
        if self.ended.is_some() {
            return;
        }
        let message = eviction.message;
        log::warn!("pod {}: evicted: {message}", self.name());
        self.deps.reporter.event(
            &self.pod,
            None,
            EventType::Warning,
            "Evicted",
            message.clone(),
        );
        self.ended = Some(Ended {
            reason: "Evicted".into(),
            message,
            rejected: false,
            disruption: eviction.disruption,
        });
        self.stop_for_good().await;
        // As the kubelet does for a terminated pod: what it held goes (its volumes, a
        // memory-backed one above all, and its network); its records stay.
        self.teardown_sandbox().await;
        self.persist().await;
    }

    /// Refuses a static pod new to the agent whose hostPath volumes are not all under
    /// `holdfast.staticPodAllowedHostPaths`, before anything of it is made. The check
    /// resolves links, so it runs off the async threads.
    pub(super) async fn admit_host_paths(&mut self) {
        if self.state.is_some() || self.ended.is_some() {
            return;
        }
        let Some(allowed) = self.deps.sandboxes.host_paths_for(&self.pod) else {
            return;
        };
        let (pod, allowed) = (self.pod.clone(), allowed.to_vec());
        let refused =
            blocking(move || crate::volume::host_path_allow::refusal(&pod, &allowed)).await;
        if let Some(why) = refused {
            self.reject("HostPathForbidden".into(), why);
        }
    }

    /// Said once when the worker starts a pod that admission refused.
    pub(super) fn reject(&mut self, reason: String, message: String) {
        log::warn!("pod {}: rejected: {reason}: {message}", self.name());
        self.deps.reporter.event(
            &self.pod,
            None,
            EventType::Warning,
            static_reason(&reason),
            message.clone(),
        );
        self.ended = Some(Ended {
            reason,
            message: format!("Pod was rejected: {message}"),
            rejected: true,
            disruption: false,
        });
    }

    /// The status of a pod the agent ended: a rejected pod shows only why (as the
    /// kubelet's `rejectPod` sets it); an evicted one (or one past its active deadline)
    /// its containers as they ended, and an evicted one the DisruptionTarget condition.
    pub(super) fn ended_status(&self, computed: PodStatus) -> PodStatus {
        let Some(end) = &self.ended else {
            return computed;
        };
        if end.rejected {
            return PodStatus {
                phase: Some("Failed".into()),
                reason: Some(end.reason.clone()),
                message: Some(end.message.clone()),
                qos_class: computed.qos_class,
                ..PodStatus::default()
            };
        }
        let mut s = computed;
        s.phase = Some("Failed".into());
        s.reason = Some(end.reason.clone());
        s.message = Some(end.message.clone());
        if !end.disrupts() {
            return s;
        }
        let before = self
            .state
            .as_ref()
            .and_then(|st| st.status.conditions.as_ref())
            .and_then(|cs| cs.iter().find(|c| c.type_ == "DisruptionTarget"))
            .and_then(|c| c.last_transition_time.clone());
        let mut conditions = s.conditions.take().unwrap_or_default();
        conditions.retain(|c| c.type_ != "DisruptionTarget");
        conditions.insert(
            0,
            PodCondition {
                type_: "DisruptionTarget".into(),
                status: "True".into(),
                reason: Some("TerminationByKubelet".into()),
                message: Some(end.message.clone()),
                last_transition_time: Some(before.unwrap_or(Time(crate::time::now()))),
                ..PodCondition::default()
            },
        );
        s.conditions = Some(conditions);
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_ended_pod_is_read_back_from_its_status() {
        let rejected = PodStatus {
            phase: Some("Failed".into()),
            reason: Some("OutOfcpu".into()),
            message: Some("Pod was rejected: Node didn't have enough resource: cpu".into()),
            ..PodStatus::default()
        };
        let e = Ended::from_status(&rejected).expect("ended");
        assert!(e.rejected);
        assert_eq!(e.reason, "OutOfcpu");
        let evicted = PodStatus {
            phase: Some("Failed".into()),
            reason: Some("Evicted".into()),
            container_statuses: Some(vec![Default::default()]),
            ..PodStatus::default()
        };
        // Over its own storage limits: no DisruptionTarget condition.
        assert!(!Ended::from_status(&evicted).expect("ended").rejected);
        assert!(!Ended::from_status(&evicted).expect("ended").disrupts());
        let evicted = PodStatus {
            conditions: Some(vec![PodCondition {
                type_: "DisruptionTarget".into(),
                status: "True".into(),
                ..PodCondition::default()
            }]),
            ..evicted
        };
        assert!(Ended::from_status(&evicted).expect("ended").disrupts());
        let past_deadline = PodStatus {
            reason: Some("DeadlineExceeded".into()),
            conditions: None,
            ..evicted
        };
        let ended = Ended::from_status(&past_deadline).expect("ended");
        assert!(!ended.rejected);
        assert!(
            !ended.disrupts(),
            "the kubelet sets no DisruptionTarget for it"
        );
        assert!(!e.disrupts());
        let failed = PodStatus {
            phase: Some("Failed".into()),
            ..PodStatus::default()
        };
        assert!(Ended::from_status(&failed).is_none());
        assert_eq!(static_reason("OutOfmemory"), "OutOfmemory");
        assert_eq!(static_reason("whatever"), "UnexpectedAdmissionError");
    }
}
