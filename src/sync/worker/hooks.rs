//! Lifecycle hooks: postStart right after a container starts (the worker waits for
//! it; a failure kills the container, and restart policy decides what follows), and
//! preStop before a container is sent SIGTERM (within the grace period, which it
//! uses up).

use std::time::Duration;

use k8s_openapi::api::core::v1::{Container, LifecycleHandler};
use tokio::time::Instant;

use super::super::probe::action::Action;
use super::super::probe::net::Outcome;
use super::countdown::grace_wait;
use super::{blocking, Worker};
use crate::runtime::ContainerId;
use crate::uplink::report::EventType;

/// Which hook, as the kubelet's messages and events name it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Hook {
    PostStart,
    PreStop,
}

impl Hook {
    fn event_reason(self) -> &'static str {
        match self {
            Hook::PostStart => "FailedPostStartHook",
            Hook::PreStop => "FailedPreStopHook",
        }
    }

    fn of(self, c: &Container) -> Option<&LifecycleHandler> {
        let l = c.lifecycle.as_ref()?;
        match self {
            Hook::PostStart => l.post_start.as_ref(),
            Hook::PreStop => l.pre_stop.as_ref(),
        }
    }
}

impl Worker {
    /// The pod's `terminationGracePeriodSeconds` (30 when unset), as written: waits
    /// take it through [`grace_wait`].
    pub(super) fn grace_period(&self) -> i64 {
        self.pod
            .spec
            .as_ref()
            .and_then(|s| s.termination_grace_period_seconds)
            .unwrap_or(30)
    }

    /// A container of the spec by name, init containers included.
    pub(super) fn container_spec(&self, name: &str) -> Option<Container> {
        let spec = self.pod.spec.as_ref()?;
        spec.init_containers
            .iter()
            .flatten()
            .chain(spec.containers.iter())
            .find(|c| c.name == name)
            .cloned()
    }

    /// Runs `c`'s postStart hook, if it has one, for the instance `id` that just
    /// started; a failure is said and the container killed.
    pub(super) async fn post_start(&mut self, c: &Container, id: &ContainerId) {
        let Some(handler) = Hook::PostStart.of(c).cloned() else {
            return;
        };
        let timeout = grace_wait(self.grace_period()).max(Duration::from_secs(1));
        if let Err(message) = self
            .run_hook(Hook::PostStart, c, &handler, id, timeout)
            .await
        {
            let grace = self.grace_period();
            self.kill_one(&c.name, id, grace, "Killing", message).await;
        }
    }

    /// Runs the preStop hooks of `containers` side by side, each until `deadline`.
    pub(super) async fn pre_stop(
        &mut self,
        containers: &[(String, ContainerId)],
        deadline: Instant,
    ) {
        let mut running = Vec::new();
        for (name, id) in containers {
            let Some(c) = self.container_spec(name) else {
                continue;
            };
            let Some(handler) = Hook::PreStop.of(&c).cloned() else {
                continue;
            };
            let timeout = deadline.saturating_duration_since(Instant::now());
            let action = Action::of_hook(&handler, &c, &self.probe_host());
            let rt = self.deps.runtime.clone();
            let rid = id.clone();
            let task = tokio::task::spawn_blocking(move || match action {
                Ok(a) => {
                    let out = a.run(rt.as_ref(), &rid, timeout);
                    (a.describe(), out)
                }
                Err(e) => (String::new(), Outcome::Failure(e)),
            });
            running.push((c, handler, task));
        }
        for (c, handler, task) in running {
            let Ok((what, outcome)) = self.serving_readiness(task).await else {
                continue;
            };
            if let Outcome::Failure(e) = outcome {
                let message = self.hook_message(&c, &handler, &what, &e);
                self.hook_failed(Hook::PreStop, &c, message);
            }
        }
    }

    /// Runs one hook within `timeout`; the error is the kubelet's message, already said.
    async fn run_hook(
        &mut self,
        hook: Hook,
        c: &Container,
        handler: &LifecycleHandler,
        id: &ContainerId,
        timeout: Duration,
    ) -> Result<(), String> {
        let action = match Action::of_hook(handler, c, &self.probe_host()) {
            Ok(a) => a,
            Err(e) => {
                let message = self.hook_message(c, handler, "", &e);
                self.hook_failed(hook, c, message.clone());
                return Err(message);
            }
        };
        let rt = self.deps.runtime.clone();
        let rid = id.clone();
        let what = action.describe();
        let outcome = blocking(move || action.run(rt.as_ref(), &rid, timeout)).await;
        match outcome {
            Outcome::Success | Outcome::Warning(_) => Ok(()),
            Outcome::Failure(e) => {
                let message = self.hook_message(c, handler, &what, &e);
                self.hook_failed(hook, c, message.clone());
                Err(message)
            }
        }
    }

    fn hook_message(
        &self,
        c: &Container,
        handler: &LifecycleHandler,
        what: &str,
        error: &str,
    ) -> String {
        let pod = format!(
            "{}_{}({})",
            self.pod.metadata.name.as_deref().unwrap_or(""),
            self.pod.metadata.namespace.as_deref().unwrap_or("default"),
            self.uid
        );
        let kind = if handler.exec.is_some() {
            "Exec"
        } else if handler.http_get.is_some() {
            "HTTP"
        } else if handler.sleep.is_some() {
            "Sleep"
        } else {
            "TCP"
        };
        format!(
            "{kind} lifecycle hook ({what}) for Container {:?} in Pod {pod:?} failed - error: {error}",
            c.name
        )
    }

    fn hook_failed(&self, hook: Hook, c: &Container, message: String) {
        log::warn!("pod {}: {message}", self.name());
        self.deps.reporter.event(
            &self.pod,
            Some(&c.name),
            EventType::Warning,
            hook.event_reason(),
            message,
        );
    }
}
