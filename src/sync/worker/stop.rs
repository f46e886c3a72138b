//! Stopping a pod: SIGTERM, the grace period, SIGKILL; for a pod deleted in the cluster
//! also its final status; then forgetting it.

use std::time::Duration;

use tokio::time::Instant;

use super::super::record::{ContainerRecord, InstanceState};
use super::super::status::{self, StatusInputs};
use super::{blocking, Worker};
use crate::runtime::{ContainerId, ContainerState};
use crate::time;
use crate::uplink::report::EventType;

impl Worker {
    /// The pod is no longer wanted by its source: stops it with the spec's grace period
    /// and forgets it.
    pub(super) async fn terminate(&mut self) {
        let grace = self
            .pod
            .spec
            .as_ref()
            .and_then(|s| s.termination_grace_period_seconds)
            .unwrap_or(30);
        self.stop_containers(grace).await;
        let is_static = crate::source::is_static_pod(&self.pod);
        self.deps.reporter.removed(&self.pod, is_static);
        self.forget().await;
    }

    /// The pod was deleted in the cluster (it has a deletionTimestamp): stops it with
    /// the grace period of the DELETE, reports its final status (after which the uplink
    /// deletes the API object for good) and forgets it.
    pub(super) async fn terminate_deleted(&mut self) {
        let grace = self
            .pod
            .metadata
            .deletion_grace_period_seconds
            .or_else(|| {
                self.pod
                    .spec
                    .as_ref()
                    .and_then(|s| s.termination_grace_period_seconds)
            })
            .unwrap_or(30);
        self.refresh().await;
        self.stop_containers(grace).await;
        self.refresh().await;
        let sandbox = self.sandbox_status();
        let inputs = StatusInputs {
            now: time::now(),
            backoff: &self.deps.backoff,
            start_time: Some(self.start_time),
            host_ip: self.deps.host_ip.as_deref(),
            previous: self.state.as_ref().map(|s| &s.status),
            terminal: true,
            sandbox: Some(&sandbox),
        };
        let status = self.ended_status(status::pod_status(&self.pod, &self.records, &inputs));
        self.deps.reporter.status(&self.pod, &status, true);
        self.forget().await;
    }

    /// SIGTERM to every running container, up to `grace` seconds, then SIGKILL.
    pub(super) async fn stop_containers(&mut self, grace: i64) {
        let grace = grace.max(0) as u64;
        log::info!("pod {}: stopping (grace period {grace}s)", self.name());
        let running: Vec<(String, ContainerId)> = self
            .records
            .values()
            .filter_map(|r| r.current.as_ref().map(|c| (r.name.clone(), c)))
            .filter(|(_, c)| matches!(c.state, InstanceState::Running { .. }))
            .map(|(n, c)| (n, c.id.clone()))
            .collect();
        for (name, _) in &running {
            self.deps.reporter.event(
                &self.pod,
                Some(name),
                EventType::Normal,
                "Killing",
                format!("Stopping container {name}"),
            );
        }
        let running: Vec<ContainerId> = running.into_iter().map(|(_, id)| id).collect();
        let sigterm = nix::sys::signal::Signal::SIGTERM as i32;
        let sigkill = nix::sys::signal::Signal::SIGKILL as i32;
        if grace > 0 {
            self.signal_all(&running, sigterm).await;
            self.wait_exited(&running, Duration::from_secs(grace)).await;
        }
        let left = self.still_running(&running).await;
        if !left.is_empty() {
            log::info!(
                "pod {}: grace period over, killing {} container(s)",
                self.name(),
                left.len()
            );
            self.signal_all(&left, sigkill).await;
            self.wait_exited(&left, Duration::from_secs(10)).await;
        }
    }

    /// Removes the containers, the pod's logs and everything the store knew of it.
    async fn forget(&mut self) {
        let all: Vec<ContainerId> = self
            .records
            .values()
            .filter_map(|r| r.current.as_ref())
            .map(|c| c.id.clone())
            .collect();
        for id in &all {
            self.remove_container(id).await;
        }
        self.teardown_sandbox().await;
        // Records and state go together: a cut never leaves records of a pod whose
        // state is gone (or the other way round).
        let mut batch = crate::store::Batch::new();
        for name in self.records.keys() {
            batch.remove(
                &self.deps.containers,
                &ContainerRecord::key(&self.uid, name),
            );
        }
        batch.remove(&self.deps.podstates, &self.uid);
        let store = self.deps.store.clone();
        let done = blocking(move || store.apply(batch).and_then(|_| store.flush())).await;
        if let Err(e) = done {
            log::error!("pod {}: forget records and status: {e}", self.name());
        }
        let dir = self.log_dir();
        if let Err(e) = std::fs::remove_dir_all(&dir) {
            if e.kind() != std::io::ErrorKind::NotFound {
                log::warn!("pod {}: remove logs {}: {e}", self.name(), dir.display());
            }
        }
        log::info!("pod {}: stopped and removed", self.name());
    }

    /// Kills every running container now (an eviction) and records how they ended.
    pub(super) async fn stop_for_good(&mut self) {
        self.refresh().await;
        self.stop_containers(0).await;
        self.refresh().await;
    }

    async fn signal_all(&self, ids: &[ContainerId], signal: i32) {
        for id in ids {
            let rt = self.deps.runtime.clone();
            let rid = id.clone();
            if let Err(e) = blocking(move || rt.kill(&rid, signal)).await {
                log::warn!("pod {}: signal {signal} to {id}: {e}", self.name());
            }
        }
    }

    async fn still_running(&self, ids: &[ContainerId]) -> Vec<ContainerId> {
        let mut left = Vec::new();
        for id in ids {
            match self.runtime_state(id).await {
                Ok(ContainerState::Running { .. }) | Ok(ContainerState::Created) => {
                    left.push(id.clone())
                }
                _ => {}
            }
        }
        left
    }

    async fn wait_exited(&self, ids: &[ContainerId], within: Duration) {
        let deadline = Instant::now() + within;
        loop {
            if self.still_running(ids).await.is_empty() || Instant::now() >= deadline {
                return;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}
