//! A container's environment before it starts: resolved by `sync::env`, or the
//! container left waiting in CreateContainerConfigError.

use k8s_openapi::api::core::v1::Container;

use super::super::env::{self, EnvInputs};
use super::super::record::{ContainerRecord, Waiting};
use super::super::service_env;
use super::{blocking, Worker};
use crate::pod::downward::DownwardInputs;
use crate::uplink::report::EventType;
use crate::uplink::services::ListState;

impl Worker {
    /// The container's environment, or None with `rec` waiting in
    /// CreateContainerConfigError (a missing ConfigMap, Secret or key, ...), which the
    /// next sync tries again: on resync, or at once when the object arrives.
    pub(super) async fn environment(
        &self,
        c: &Container,
        rec: &mut ContainerRecord,
    ) -> Option<Vec<(String, String)>> {
        let deps = self.deps.clone();
        let pod = self.pod.clone();
        let container = c.clone();
        let pod_ips = self.pod_ips();
        let resolved = blocking(move || {
            let inputs = EnvInputs {
                objects: &deps.objects,
                services: deps.services.as_ref(),
                downward: DownwardInputs {
                    node_name: &deps.node_name,
                    host_ip: deps.host_ip.as_deref(),
                    pod_ips: &pod_ips,
                    allocatable: &deps.allocatable,
                },
            };
            env::resolve(&pod, &container, &inputs)
        })
        .await;
        match resolved {
            Ok(environment) => {
                if let Some(list @ (ListState::Stored | ListState::Stale)) = environment.services {
                    log::info!(
                        "pod {}: container {}: Service variables from {}",
                        self.name(),
                        c.name,
                        service_env::describe(list)
                    );
                }
                for message in environment.invalid_names {
                    self.deps.reporter.event(
                        &self.pod,
                        None,
                        EventType::Warning,
                        env::INVALID_NAMES_REASON,
                        message,
                    );
                }
                Some(environment.vars)
            }
            Err(e) => {
                // The message names objects and keys, never a value.
                let message = e.to_string();
                let waiting = Waiting {
                    reason: "CreateContainerConfigError".into(),
                    message: Some(message.clone()),
                };
                // Said once per distinct failure, not on every retry.
                if rec.waiting.as_ref() != Some(&waiting) {
                    log::warn!("pod {}: container {}: {message}", self.name(), c.name);
                    self.failed(c, &message);
                }
                rec.waiting = Some(waiting);
                None
            }
        }
    }
}
