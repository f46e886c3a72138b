//! Starting a container: adopt one already made, else image, environment, mounts,
//! the runtime's create and start, the kubelet's events, and postStart.

use std::time::Duration;

use k8s_openapi::api::core::v1::Container;
use tokio::time::Instant;

use super::super::plan;
use super::super::record::{ContainerRecord, Instance, InstanceState, Terminated, Waiting};
use super::{blocking, Worker};
use crate::runtime::{ContainerId, ContainerState, RuntimeError, StartRequest};
use crate::time;
use crate::uplink::report::EventType;

impl Worker {
    /// Creates and starts `c`'s next instance (or adopts one created just before the
    /// agent last died), with its image, environment and mounts; then its postStart.
    pub(super) async fn start(&mut self, c: &Container, mut rec: ContainerRecord) {
        let image_ref = c.image.clone().unwrap_or_default();
        let id = ContainerId::derive(&self.uid, &c.name, rec.restart_count);

        // A container created just before the agent last died (before its record was
        // saved) is adopted, running or exited, not doubled.
        match self.runtime_state(&id).await {
            Ok(ContainerState::Running { started_at, .. }) => {
                let image_id = self.image_id(&image_ref).await;
                rec.current = Some(Instance {
                    id: id.clone(),
                    image: image_ref,
                    image_id,
                    state: InstanceState::Running { started_at },
                });
                rec.waiting = None;
                self.register(&id).await;
                self.records.insert(c.name.clone(), rec);
                return;
            }
            Ok(ContainerState::Exited(exit)) => {
                let image_id = self.image_id(&image_ref).await;
                rec.current = Some(Instance {
                    id: id.clone(),
                    image: image_ref,
                    image_id,
                    state: InstanceState::Terminated(Terminated::from_exit(&id, &exit)),
                });
                rec.waiting = None;
                plan::count_exit(&mut rec, self.deps.crash_loop_reset);
                self.records.insert(c.name.clone(), rec);
                // Policy decides about a restart on the next pass, as for any exit.
                self.wake = Some(Instant::now());
                return;
            }
            Ok(ContainerState::Created) => {
                // Its shim is still setting it up: look again shortly.
                self.wake = Some(Instant::now() + Duration::from_millis(200));
                self.records.insert(c.name.clone(), rec);
                return;
            }
            Ok(ContainerState::Unknown) | Err(_) => {
                self.remove_container(&id).await;
            }
        }

        let Some(image) = self.ensure_image(c, &mut rec).await else {
            self.records.insert(c.name.clone(), rec);
            return;
        };

        let Some(env) = self.environment(c, &mut rec).await else {
            self.records.insert(c.name.clone(), rec);
            return;
        };
        let Some(mounts) = self.mounts(c, &env, &mut rec).await else {
            self.records.insert(c.name.clone(), rec);
            return;
        };
        let sandbox = self.runtime_sandbox();

        let log_path = self
            .log_dir()
            .join(&c.name)
            .join(format!("{}.log", rec.restart_count));
        let rt = self.deps.runtime.clone();
        let pod = self.pod.clone();
        let container = c.clone();
        let node = self.deps.node_name.clone();
        let restart_count = rec.restart_count;
        let image_id = image.repo_digest.clone();
        let image_id_used = image.image_id.clone();
        let start_id = id.clone();
        let started = blocking(move || {
            let req = StartRequest {
                id: start_id,
                pod: &pod,
                container: &container,
                env: &env,
                restart_count,
                image: &image,
                node_name: &node,
                log_path,
                sandbox: sandbox.as_ref().map(|s| &s.runtime),
                mounts: &mounts,
            };
            rt.start(&req)
        })
        .await;
        match started {
            Ok(s) => {
                log::info!(
                    "pod {}: container {} started (pid {})",
                    self.name(),
                    c.name,
                    s.pid
                );
                rec.current = Some(Instance {
                    id: id.clone(),
                    image: image_ref,
                    image_id,
                    state: InstanceState::Running {
                        started_at: s.started_at,
                    },
                });
                rec.waiting = None;
                self.register(&id).await;
                self.image_used(&image_id_used).await;
                for (reason, message) in [
                    ("Created", format!("Created container: {}", c.name)),
                    ("Started", format!("Started container {}", c.name)),
                ] {
                    self.deps.reporter.event(
                        &self.pod,
                        Some(&c.name),
                        EventType::Normal,
                        reason,
                        message,
                    );
                }
                // postStart runs before the worker goes on, as the kubelet's does.
                self.records.insert(c.name.clone(), rec);
                self.post_start(c, &id).await;
                return;
            }
            Err(RuntimeError::Start { message, .. }) => {
                log::error!("pod {}: container {}: {message}", self.name(), c.name);
                self.failed(c, &message);
                let now = time::now();
                rec.current = Some(Instance {
                    id: id.clone(),
                    image: image_ref,
                    image_id,
                    state: InstanceState::Terminated(Terminated {
                        container_id: Some(id.uri()),
                        exit_code: 128,
                        signal: None,
                        reason: "StartError".into(),
                        message: Some(message),
                        started_at: None,
                        finished_at: now,
                    }),
                });
                rec.waiting = None;
                plan::count_exit(&mut rec, self.deps.crash_loop_reset);
            }
            Err(e) => {
                log::error!("pod {}: container {}: {e}", self.name(), c.name);
                self.failed(c, &e);
                rec.waiting = Some(Waiting {
                    reason: e.reason().into(),
                    message: Some(e.status_message()),
                });
                self.remove_container(&id).await;
                // Nothing ran, so there is no exit for the plan to back off from; the
                // failure counts as one all the same (the shim's exit event that
                // reports it would otherwise set off the next try at once).
                rec.failures = rec.failures.saturating_add(1);
                let delay = self.deps.backoff.delay(rec.failures);
                let at =
                    self.restart_timers
                        .failed(&c.name, rec.restart_count, delay, Instant::now());
                self.wake_at(at);
            }
        }
        self.records.insert(c.name.clone(), rec);
    }

    /// The image id of an image already present, for containers adopted after a restart.
    pub(super) async fn image_id(&self, reference: &str) -> String {
        let images = self.deps.images.clone();
        let r = reference.to_string();
        match blocking(move || images.resolve(&r)).await {
            Ok(Some(image)) => image.repo_digest,
            _ => String::new(),
        }
    }
}
