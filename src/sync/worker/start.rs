//! Starting a container: adopt one already made, else image, environment, mounts,
//! the runtime's create and start, the kubelet's events, and postStart.

use std::time::Duration;

use k8s_openapi::api::core::v1::Container;
use tokio::time::Instant;

use super::super::plan;
use super::super::record::{ContainerRecord, Instance, InstanceState, Terminated, Waiting};
use super::{blocking, Worker};
use crate::runtime::{
    BindMount, ContainerId, ContainerState, ResolvedImage, RuntimeError, StartRequest, Started,
};
use crate::time;
use crate::uplink::report::EventType;

/// What a container is started from, once each is there: its image, its resolved
/// environment (secret values: never log it) and its mounts.
struct Prepared {
    image: ResolvedImage,
    env: Vec<(String, String)>,
    mounts: Vec<BindMount>,
}

impl Worker {
    /// Creates and starts `c`'s next instance (or adopts one created just before the
    /// agent last died), with its image, environment and mounts; then its postStart.
    pub(super) async fn start(&mut self, c: &Container, mut rec: ContainerRecord) {
        let image_ref = c.image.clone().unwrap_or_default();
        let id = ContainerId::derive(&self.uid, &c.name, rec.restart_count);
        if self.adopt(&id, &image_ref, &mut rec).await {
            self.records.insert(c.name.clone(), rec);
            return;
        }
        let Some(prepared) = self.prepare(c, &mut rec).await else {
            self.records.insert(c.name.clone(), rec);
            return;
        };
        let image_id = prepared.image.repo_digest.clone();
        let image_id_used = prepared.image.image_id.clone();
        let instance = |state| Instance {
            id: id.clone(),
            image: image_ref,
            image_id,
            state,
        };
        match self
            .create_and_start(c, &id, rec.restart_count, prepared)
            .await
        {
            Ok(s) => {
                log::info!(
                    "pod {}: container {} started (pid {})",
                    self.name(),
                    c.name,
                    s.pid
                );
                rec.current = Some(instance(InstanceState::Running {
                    started_at: s.started_at,
                }));
                self.started(c, &id, rec, &image_id_used).await;
                return;
            }
            Err(RuntimeError::Start { message, .. }) => {
                let ended = self.start_error(c, &id, message);
                rec.current = Some(instance(ended));
                rec.waiting = None;
                plan::count_exit(&mut rec, self.deps.crash_loop_reset);
            }
            Err(e) => self.start_failed(c, &id, &mut rec, &e).await,
        }
        self.records.insert(c.name.clone(), rec);
    }

    /// A container created just before the agent last died (before its record was
    /// saved) is adopted, running or exited, not doubled: true when `rec` now says what
    /// it is and nothing is to be started. One in no known state is removed.
    async fn adopt(
        &mut self,
        id: &ContainerId,
        image_ref: &str,
        rec: &mut ContainerRecord,
    ) -> bool {
        match self.runtime_state(id).await {
            Ok(ContainerState::Running { started_at, .. }) => {
                let image_id = self.image_id(image_ref).await;
                rec.current = Some(Instance {
                    id: id.clone(),
                    image: image_ref.to_owned(),
                    image_id,
                    state: InstanceState::Running { started_at },
                });
                rec.waiting = None;
                self.register(id).await;
                true
            }
            Ok(ContainerState::Exited(exit)) => {
                let image_id = self.image_id(image_ref).await;
                let mut ended = Terminated::from_exit(id, &exit);
                Box::pin(self.add_termination_message(
                    &rec.name,
                    rec.restart_count,
                    &exit,
                    &mut ended,
                ))
                .await;
                rec.current = Some(Instance {
                    id: id.clone(),
                    image: image_ref.to_owned(),
                    image_id,
                    state: InstanceState::Terminated(ended),
                });
                rec.waiting = None;
                plan::count_exit(rec, self.deps.crash_loop_reset);
                // Policy decides about a restart on the next pass, as for any exit.
                self.wake = Some(Instant::now());
                true
            }
            Ok(ContainerState::Created) => {
                // Its shim is still setting it up: look again shortly.
                self.wake = Some(Instant::now() + Duration::from_millis(200));
                true
            }
            Ok(ContainerState::Unknown) | Err(_) => {
                self.remove_container(id).await;
                false
            }
        }
    }

    /// The image, environment and mounts to start `c` with; None with `rec` waiting
    /// for whichever is not there yet.
    async fn prepare(&mut self, c: &Container, rec: &mut ContainerRecord) -> Option<Prepared> {
        let image = self.ensure_image(c, rec).await?;
        let env = self.environment(c, rec).await?;
        let mounts = self.mounts(c, &env, rec).await?;
        Some(Prepared { image, env, mounts })
    }

    /// The runtime's create and start of instance `id` of `c`, off the async threads.
    async fn create_and_start(
        &self,
        c: &Container,
        id: &ContainerId,
        restart_count: u32,
        prepared: Prepared,
    ) -> Result<Started, RuntimeError> {
        let sandbox = self.container_sandbox(&c.name).await?;
        let log_path = self
            .log_dir()
            .join(&c.name)
            .join(format!("{restart_count}.log"));
        let rt = self.deps.runtime.clone();
        let pod = self.pod.clone();
        let container = c.clone();
        let node = self.deps.node_name.clone();
        let start_id = id.clone();
        blocking(move || {
            let req = StartRequest {
                id: start_id,
                pod: &pod,
                container: &container,
                env: &prepared.env,
                restart_count,
                image: &prepared.image,
                node_name: &node,
                log_path,
                sandbox: sandbox.as_ref().map(|s| &s.runtime),
                mounts: &prepared.mounts,
            };
            rt.start(&req)
        })
        .await
    }

    /// `c` runs (its instance in `rec`): the sync loop learns whose exits are whose,
    /// the image its last use, the cluster the kubelet's events; then postStart runs
    /// before the worker goes on, as the kubelet's does.
    async fn started(
        &mut self,
        c: &Container,
        id: &ContainerId,
        mut rec: ContainerRecord,
        image_id_used: &str,
    ) {
        rec.waiting = None;
        self.register(id).await;
        self.image_used(image_id_used).await;
        for (reason, message) in [
            ("Created", format!("Created container: {}", c.name)),
            ("Started", format!("Started container {}", c.name)),
        ] {
            self.deps
                .reporter
                .event(&self.pod, Some(&c.name), EventType::Normal, reason, message);
        }
        self.records.insert(c.name.clone(), rec);
        self.post_start(c, id).await;
    }

    /// The runtime made the container but its process did not start (a bad command,
    /// a missing binary): the instance ended at once, with the kubelet's StartError.
    fn start_error(&self, c: &Container, id: &ContainerId, message: String) -> InstanceState {
        log::error!("pod {}: container {}: {message}", self.name(), c.name);
        self.failed(c, &message);
        InstanceState::Terminated(Terminated {
            container_id: Some(id.uri()),
            exit_code: 128,
            signal: None,
            reason: "StartError".into(),
            message: Some(message),
            started_at: None,
            finished_at: time::now(),
        })
    }

    /// Nothing ran: `rec` waits with the error's reason, and the next try comes after
    /// the back-off.
    async fn start_failed(
        &mut self,
        c: &Container,
        id: &ContainerId,
        rec: &mut ContainerRecord,
        e: &RuntimeError,
    ) {
        log::error!("pod {}: container {}: {e}", self.name(), c.name);
        self.failed(c, e);
        rec.waiting = Some(Waiting {
            reason: e.reason().into(),
            message: Some(e.status_message()),
        });
        self.remove_container(id).await;
        // Nothing ran, so there is no exit for the plan to back off from; the failure
        // counts as one all the same (the shim's exit event that reports it would
        // otherwise set off the next try at once).
        rec.failures = rec.failures.saturating_add(1);
        let delay = self.deps.backoff.delay(rec.failures);
        let at = self
            .restart_timers
            .failed(&c.name, rec.restart_count, delay, Instant::now());
        self.wake_at(at);
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
