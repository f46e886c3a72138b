//! Stopping a pod: SIGTERM, the grace period, SIGKILL; for a pod deleted in the cluster
//! also its final status; then forgetting it.

use std::time::Duration;

use tokio::time::Instant;

use super::super::record::{ContainerRecord, InstanceState};
use super::super::status;
use super::countdown::{deadline_in, grace_wait, Countdown};
use super::{blocking, Worker};
use crate::runtime::{ContainerId, ContainerState};
use crate::uplink::report::EventType;

/// How a stop signals the containers before SIGKILL.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Signals {
    /// No grace period: SIGKILL at once.
    Kill,
    /// preStop hooks, then SIGTERM.
    Graceful,
    /// A stop an earlier agent began, which ran the hooks: SIGTERM only.
    Resumed,
}

impl Signals {
    fn of(wait: Duration, resumed: bool) -> Signals {
        match (wait.is_zero(), resumed) {
            (true, _) => Signals::Kill,
            (false, false) => Signals::Graceful,
            (false, true) => Signals::Resumed,
        }
    }
}

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
        let countdown = self.countdown(grace).await;
        self.stop_by(countdown).await;
        let is_static = crate::pod::is_static_pod(&self.pod);
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
        self.probe_deleted();
        let countdown = self.countdown(grace).await;
        self.stop_by(countdown).await;
        self.refresh().await;
        let status = self.ended_status(self.status_now(true, false));
        self.deps.reporter.status(&self.pod, &status, true);
        self.forget().await;
    }

    /// Stops every running container within `grace` seconds: preStop hooks, SIGTERM,
    /// SIGKILL when the time is up.
    pub(super) async fn stop_containers(&mut self, grace: i64) {
        let wait = grace_wait(grace);
        self.stop_by(Countdown {
            deadline: deadline_in(wait),
            wait,
            resumed: false,
        })
        .await;
    }

    /// Stops every running container by the countdown's deadline: preStop hooks (not
    /// again for a stop resumed), SIGTERM, SIGKILL when the time is up. App containers
    /// (and a running regular init container) go first, then the sidecars in the
    /// reverse of their order, each with what is left of the grace period, as the
    /// kubelet stops them.
    async fn stop_by(&mut self, countdown: Countdown) {
        log::info!(
            "pod {}: stopping (grace period {}s)",
            self.name(),
            countdown.wait.as_secs()
        );
        let running = self.running();
        let sidecars = self.sidecar_names();
        let (side, first): (Vec<_>, Vec<_>) =
            running.into_iter().partition(|(n, _)| sidecars.contains(n));
        for (name, _) in first.iter().chain(&side) {
            self.deps.reporter.event(
                &self.pod,
                Some(name),
                EventType::Normal,
                "Killing",
                format!("Stopping container {name}"),
            );
        }
        let deadline = countdown.deadline;
        let how = Signals::of(countdown.wait, countdown.resumed);
        self.stop_group(&first, deadline, how).await;
        let mut side = side;
        side.sort_by_key(|(n, _)| std::cmp::Reverse(sidecars.iter().position(|s| s == n)));
        for one in side {
            self.stop_group(std::slice::from_ref(&one), deadline, how)
                .await;
        }
    }

    /// The pod's sidecars, in the spec's order.
    fn sidecar_names(&self) -> Vec<String> {
        self.pod
            .spec
            .as_ref()
            .and_then(|s| s.init_containers.as_ref())
            .map(|cs| {
                cs.iter()
                    .filter(|c| status::is_sidecar(c))
                    .map(|c| c.name.clone())
                    .collect()
            })
            .unwrap_or_default()
    }

    /// The running containers, by name.
    pub(super) fn running(&self) -> Vec<(String, ContainerId)> {
        self.records
            .values()
            .filter_map(|r| r.current.as_ref().map(|c| (r.name.clone(), c)))
            .filter(|(_, c)| matches!(c.state, InstanceState::Running { .. }))
            .map(|(n, c)| (n, c.id.clone()))
            .collect()
    }

    /// preStop, SIGTERM and the wait up to `deadline` (at least 2 s after the hooks, as
    /// the kubelet gives), then SIGKILL for what still runs.
    async fn stop_group(
        &mut self,
        group: &[(String, ContainerId)],
        deadline: Instant,
        how: Signals,
    ) {
        if group.is_empty() {
            return;
        }
        let ids: Vec<ContainerId> = group.iter().map(|(_, id)| id.clone()).collect();
        let sigterm = nix::sys::signal::Signal::SIGTERM as i32;
        let sigkill = nix::sys::signal::Signal::SIGKILL as i32;
        if how != Signals::Kill {
            if how == Signals::Graceful {
                self.pre_stop(group, deadline).await;
            }
            // Again for a resumed stop: the agent that began it may have died before
            // the signal went out.
            self.signal_all(&ids, sigterm).await;
            let left = deadline
                .saturating_duration_since(Instant::now())
                .max(Duration::from_secs(2));
            self.wait_exited(&ids, left).await;
        }
        let left = self.still_running(&ids).await;
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

    /// Stops one container (a failed probe or hook) within `grace` seconds; `message`
    /// is said as a `reason` event and kept for its terminated state. Restart policy
    /// decides on the next pass what follows.
    pub(super) async fn kill_one(
        &mut self,
        name: &str,
        id: &ContainerId,
        grace: i64,
        reason: &'static str,
        message: String,
    ) {
        self.deps.reporter.event(
            &self.pod,
            Some(name),
            EventType::Normal,
            reason,
            message.clone(),
        );
        self.kill_reasons.insert(name.to_string(), message);
        let wait = grace_wait(grace);
        let one = [(name.to_string(), id.clone())];
        self.stop_group(&one, deadline_in(wait), Signals::of(wait, false))
            .await;
        self.refresh().await;
    }

    /// The pod's work is done: its running sidecars are stopped, last first.
    pub(super) async fn stop_sidecars(&mut self) {
        let sidecars = self.sidecar_names();
        let running = self.running();
        let wait = grace_wait(self.grace_period());
        let deadline = deadline_in(wait);
        for name in sidecars.iter().rev() {
            if let Some(one) = running.iter().find(|(n, _)| n == name) {
                log::info!("pod {}: work done, stopping sidecar {name}", self.name());
                self.stop_group(
                    std::slice::from_ref(one),
                    deadline,
                    Signals::of(wait, false),
                )
                .await;
            }
        }
        self.refresh().await;
    }

    /// The pod's work is done: its running ephemeral containers stop, as the kubelet
    /// kills what is left of a pod whose containers are through.
    pub(super) async fn stop_ephemeral(&mut self) {
        let names: Vec<String> = crate::pod::ephemeral::ephemeral_containers(&self.pod)
            .iter()
            .map(|c| c.name.clone())
            .collect();
        let running: Vec<(String, ContainerId)> = self
            .running()
            .into_iter()
            .filter(|(n, _)| names.contains(n))
            .collect();
        if running.is_empty() {
            return;
        }
        log::info!(
            "pod {}: work done, stopping its ephemeral containers",
            self.name()
        );
        let wait = grace_wait(self.grace_period());
        self.stop_group(&running, deadline_in(wait), Signals::of(wait, false))
            .await;
        self.refresh().await;
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
        batch.remove(self.deps.podstates.tree(), &self.uid);
        let store = self.deps.store.clone();
        // Not flushed: the store's next tick writes it. A power cut before then brings
        // back records of a pod no source wants any more (its removal from the source
        // is the fact that counts, flushed for cluster pods, and a static pod's
        // manifest is gone), which the agent forgets again as after a cut in the middle
        // of any stop; a flush here cost the flash a journal commit per pod.
        let done = blocking(move || store.apply(batch)).await;
        if let Err(e) = done {
            log::error!("pod {}: forget records and status: {e}", self.name());
        }
        let dir = self.log_dir();
        if let Err(e) = crate::runtime::remove_unmounted(&dir) {
            log::warn!("pod {}: remove logs: {e}", self.name());
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

    async fn wait_exited(&mut self, ids: &[ContainerId], within: Duration) {
        let deadline = deadline_in(within);
        loop {
            let left = self.still_running(ids).await;
            let gone: Vec<ContainerId> = ids
                .iter()
                .filter(|id| !left.contains(id))
                .cloned()
                .collect();
            self.unprobe_stopped(&gone).await;
            if left.is_empty() || Instant::now() >= deadline {
                return;
            }
            let tick = tokio::time::sleep(Duration::from_millis(100));
            self.serving_readiness(tick).await;
        }
    }
}
