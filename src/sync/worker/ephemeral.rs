//! Ephemeral containers, as the kubelet runs them: each one the spec gains (through the
//! `pods/ephemeralcontainers` subresource) starts in the running pod's sandbox, even
//! before its initialization is done; one that ever ran is never started again; they
//! stop with the pod. One with `targetContainerName` joins that container's PID
//! namespace, so that it sees (and may trace) the target's processes.

use k8s_openapi::api::core::v1::Container;

use super::super::record::{ContainerRecord, InstanceState, Waiting};
use super::super::sandbox::Ready;
use super::Worker;
use crate::pod::ephemeral;
use crate::runtime::{ContainerState, NamespaceKind, RuntimeError};

impl Worker {
    /// Starts each ephemeral container that has no instance yet (nothing ran, or its
    /// image or config is not there yet: tried again after the back-off, as any start
    /// that failed before anything ran). A container that was made is never restarted,
    /// however it ended.
    pub(super) async fn sync_ephemeral(&mut self) {
        let all: Vec<Container> = ephemeral::ephemeral_containers(&self.pod)
            .iter()
            .map(ephemeral::as_container)
            .collect();
        for c in &all {
            let made = self
                .records
                .get(&c.name)
                .is_some_and(|r| r.current.is_some());
            if made || self.refuse_privileged(c) {
                continue;
            }
            self.sync_container(c, "Never").await;
        }
    }

    /// A privileged ephemeral container on a node that allows no privileged container
    /// waits for good in CreateContainerConfigError: admission, which refuses such a
    /// pod, saw only the containers the pod was created with. True when refused.
    fn refuse_privileged(&mut self, c: &Container) -> bool {
        let privileged = c
            .security_context
            .as_ref()
            .and_then(|sc| sc.privileged)
            .unwrap_or(false);
        if !privileged || self.deps.sandboxes.admission.allow_privileged {
            return false;
        }
        let message = format!(
            "pod with UID \"{}\" specified privileged ephemeral container, but is disallowed",
            self.uid
        );
        let waiting = Waiting {
            reason: "CreateContainerConfigError".into(),
            message: Some(message.clone()),
        };
        let rec = self
            .records
            .entry(c.name.clone())
            .or_insert_with(|| ContainerRecord::new(&c.name));
        if rec.waiting.as_ref() != Some(&waiting) {
            rec.waiting = Some(waiting);
            log::warn!("pod {}: container {}: {message}", self.name(), c.name);
            self.failed(c, &message);
        }
        true
    }

    /// The sandbox container `name` starts in: the pod's, and for an ephemeral
    /// container with a target, with the target's PID namespace (as the kubelet asks
    /// the runtime for `NamespaceMode_TARGET`). A target that does not run is the
    /// kubelet's CreateContainerConfigError, tried again after the back-off.
    pub(super) async fn container_sandbox(
        &self,
        name: &str,
    ) -> Result<Option<Ready>, RuntimeError> {
        let Some(mut ready) = self.runtime_sandbox() else {
            return Ok(None);
        };
        let Some(target) = ephemeral::target(&self.pod, name) else {
            return Ok(Some(ready));
        };
        let not_found =
            || RuntimeError::Config(format!("unable to find target container {target}"));
        let id = self
            .records
            .get(target)
            .and_then(|r| r.current.as_ref())
            .filter(|cur| matches!(cur.state, InstanceState::Running { .. }))
            .map(|cur| cur.id.clone())
            .ok_or_else(not_found)?;
        let pid = match self.runtime_state(&id).await {
            Ok(ContainerState::Running { pid, .. }) if pid > 0 => pid,
            _ => return Err(not_found()),
        };
        if !ready.runtime.host_pid {
            // The target's own namespace: the pod's when its containers share one.
            let namespaces = &mut ready.runtime.namespaces;
            namespaces.retain(|(kind, _)| *kind != NamespaceKind::Pid);
            namespaces.push((NamespaceKind::Pid, format!("/proc/{pid}/ns/pid").into()));
        }
        Ok(Some(ready))
    }
}
