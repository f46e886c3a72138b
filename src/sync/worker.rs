//! A pod worker: owns one pod's state, serialises everything done to it, and is the only
//! place that starts, restarts and stops its containers.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;

use k8s_openapi::api::core::v1::{Pod, PodStatus};
use serde::{Deserialize, Serialize};
use tokio::sync::mpsc;
use tokio::time::Instant;

use crate::runtime::{ContainerId, ContainerState, RuntimeError};
use crate::time::{self, Timestamp};

use super::plan::{self, Action};
use super::record::{ContainerRecord, InstanceState, Terminated};
use super::status;
use super::Deps;
use crate::uplink::report::EventType;

mod countdown;
mod deadline;
mod environment;
mod ephemeral;
mod hooks;
mod image;
mod init;
mod persist;
mod power_off;
mod probes;
mod sandbox;
mod start;
mod stop;
mod stopping;
mod termination;

pub use countdown::StopDeadline;
pub use power_off::ShutdownStop;
pub use sandbox::Ended;

use super::restart_timer::RestartTimers;

/// Messages a worker takes, in order.
#[derive(Debug)]
pub enum WorkerMsg {
    /// The pod's spec changed (same UID).
    Update(Box<Pod>),
    /// One of the pod's containers exited.
    Exited(ContainerId),
    /// Look again (periodic resync, or an image arrived).
    Resync,
    /// The pod is no longer wanted: stop it gracefully, then forget it.
    Terminate,
    /// The eviction manager chose this pod: kill it now and end it as it says.
    Evict(Eviction),
    /// The node shuts down: stop the pod within the grace period and end it.
    ShutDown(ShutdownStop),
}

/// A pod the eviction manager chose, and what its status is to say.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Eviction {
    pub uid: String,
    pub message: String,
    /// Whether the status carries the DisruptionTarget condition: the kubelet sets it
    /// when node pressure evicts a pod, not when a pod outgrew its own storage limits.
    pub disruption: bool,
}

/// What the store keeps of a pod the agent runs (tree `podstates`, key = UID): the spec
/// it acts on and the status it last computed. The workers' own record: readers outside
/// the sync loop see it through [`super::view`]. Its encoding is the store's schema.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PodState {
    pub pod: Pod,
    pub status: PodStatus,
    pub start_time: Timestamp,
    /// Set once the pod's stop began: when its containers get SIGKILL.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stop_deadline: Option<StopDeadline>,
}

pub(super) struct Worker {
    deps: Arc<Deps>,
    pod: Pod,
    uid: String,
    records: BTreeMap<String, ContainerRecord>,
    /// The records as the store last took them: only those that differ are written.
    saved: BTreeMap<String, ContainerRecord>,
    state: Option<PodState>,
    start_time: Timestamp,
    wake: Option<Instant>,
    /// The restart count for which a BackOff event went out, per container.
    backoff_told: BTreeMap<String, u32>,
    /// Back-off deadlines on the monotonic clock.
    restart_timers: RestartTimers,
    registered: mpsc::Sender<(ContainerId, String)>,
    /// Set for a pod that is only to be stopped (it was removed while the agent was down).
    pub(super) terminate_first: bool,
    /// Whether this agent process has reported the pod's status at least once: a static
    /// pod's first report makes the uplink check its mirror pod.
    reported: bool,
    /// Image pulls and their back-off, by image as the pod names it.
    pulls: BTreeMap<String, image::ImagePulls>,
    /// Woken when a pull this worker waits for ends.
    pull_notify: Arc<tokio::sync::Notify>,
    /// Set for a pod admission refused: `(reason, message)`.
    pub(super) rejected: Option<(String, String)>,
    /// The pod's sandbox, once set up.
    sandbox: Option<super::sandbox::Ready>,
    /// The last sandbox failure said, so a retry does not say it again.
    sandbox_error: Option<String>,
    /// Sandbox warnings said already.
    said: Vec<String>,
    /// When the network was last checked (CNI CHECK).
    last_check: Option<Instant>,
    /// Set when the agent ended the pod (rejected, evicted, or past its active
    /// deadline): nothing of it runs.
    ended: Option<Ended>,
    /// The containers' probes and the results coming back from them.
    probes: probes::Probes,
    /// Why the agent killed a container (a failed probe or hook), for the message of
    /// its terminated state, by container name.
    kill_reasons: BTreeMap<String, String>,
    /// A running container was found gone with no exit record (a reboot or a power
    /// cut): the pod's sandbox is new, and its init containers run again.
    lost: bool,
    /// The pod ran its course: its phase is Succeeded or Failed, by its own containers
    /// or as the cluster records it. Nothing of it runs again (see [`finish`]).
    ///
    /// [`finish`]: Worker::finish
    finished: bool,
    /// Its sandbox was torn down since this worker started.
    freed: bool,
}

impl Worker {
    pub(super) fn new(
        deps: Arc<Deps>,
        pod: Pod,
        registered: mpsc::Sender<(ContainerId, String)>,
    ) -> Self {
        let uid = pod.metadata.uid.clone().unwrap_or_default();
        let mut records = BTreeMap::new();
        match deps.containers.scan_prefix(&format!("{uid}/")) {
            Ok(found) => {
                for (_, rec) in found {
                    records.insert(rec.name.clone(), rec);
                }
            }
            Err(e) => log::error!("pod {uid}: read container records: {e}"),
        }
        let state = match deps.podstates.tree().get(&uid) {
            Ok(s) => s,
            Err(e) => {
                log::error!("pod {uid}: read pod state: {e}");
                None
            }
        };
        let start_time = state
            .as_ref()
            .map(|s| s.start_time)
            .unwrap_or_else(time::now);
        let ended = state.as_ref().and_then(|s| Ended::from_status(&s.status));
        let finished = state.as_ref().is_some_and(|s| is_terminal(&s.status));
        Worker {
            deps,
            pod,
            uid,
            saved: records.clone(),
            records,
            state,
            start_time,
            wake: None,
            backoff_told: BTreeMap::new(),
            restart_timers: RestartTimers::default(),
            registered,
            terminate_first: false,
            reported: false,
            pulls: BTreeMap::new(),
            pull_notify: Arc::new(tokio::sync::Notify::new()),
            rejected: None,
            sandbox: None,
            sandbox_error: None,
            said: Vec::new(),
            last_check: None,
            ended,
            probes: probes::Probes::default(),
            kill_reasons: BTreeMap::new(),
            lost: false,
            finished,
            freed: false,
        }
    }

    /// Runs the pod until it is stopped and forgotten, or the agent stops.
    ///
    /// The task of a pod that runs keeps this future for as long as the pod lives, and
    /// a future holds every local of every call it awaits, its arguments twice: the
    /// worker comes in a box, and each pass (a sync, a stop, a probe's verdict) in a
    /// box of its own made for the pass, so that a waiting worker keeps only itself and
    /// its wait (26.9 KiB per pod before, by `size_of_val` of the future).
    pub(super) async fn run(mut self: Box<Self>, mut rx: mpsc::Receiver<WorkerMsg>) {
        if self.terminate_first {
            self.refresh().await;
            Box::pin(self.terminate()).await;
            return;
        }
        if self.pod.metadata.deletion_timestamp.is_some() {
            Box::pin(self.terminate_deleted()).await;
            return;
        }
        if let Some((reason, message)) = self.rejected.take() {
            self.reject(reason, message);
        }
        Box::pin(self.admit_host_paths()).await;
        Box::pin(self.sync()).await;
        let pulled = self.pull_notify.clone();
        loop {
            let wake = self.wake;
            let msg = tokio::select! {
                msg = rx.recv() => msg,
                _ = sleep_until(wake) => Some(WorkerMsg::Resync),
                _ = pulled.notified() => Some(WorkerMsg::Resync),
                // Probes come and go without a full pass over the pod: a pass is
                // only for a verdict that changes its status or its containers.
                _ = sleep_until(self.probes.wake) => {
                    self.start_due_probes();
                    continue;
                }
                Some(done) = self.probes.rx.recv() => {
                    if !Box::pin(self.probed(done)).await {
                        self.start_due_probes();
                        continue;
                    }
                    Some(WorkerMsg::Resync)
                }
            };
            match msg {
                // The agent is stopping: containers outlive it, so leave them be.
                None => return,
                Some(WorkerMsg::Terminate) => {
                    Box::pin(self.terminate()).await;
                    return;
                }
                Some(WorkerMsg::Update(pod)) => {
                    self.pod = *pod;
                    if self.pod.metadata.deletion_timestamp.is_some() {
                        Box::pin(self.terminate_deleted()).await;
                        return;
                    }
                }
                Some(WorkerMsg::Exited(id)) => {
                    log::debug!("pod {}: container {id} exited", self.name())
                }
                Some(WorkerMsg::Resync) => {}
                Some(WorkerMsg::Evict(eviction)) => {
                    Box::pin(self.evict(eviction)).await;
                    continue;
                }
                Some(WorkerMsg::ShutDown(stop)) => {
                    Box::pin(self.shut_down(stop.grace)).await;
                    let _ = stop.done.send(());
                    continue;
                }
            }
            Box::pin(self.sync()).await;
        }
    }

    fn name(&self) -> String {
        format!(
            "{}/{}",
            self.pod.metadata.namespace.as_deref().unwrap_or("default"),
            self.pod.metadata.name.as_deref().unwrap_or("")
        )
    }

    /// Brings the pod's containers toward its spec, then records and reports the result.
    async fn sync(&mut self) {
        let began = std::time::Instant::now();
        self.sync_once().await;
        crate::metrics::SYNC_DURATION.observe(began.elapsed());
    }

    async fn sync_once(&mut self) {
        self.wake = None;
        self.refresh().await;
        if self.lost {
            // A reboot took the containers: say so now, not once the sandbox is back
            // (after a power cut `holdfast pods` showed them Running and ready, from the
            // store, for the half minute that takes on a slow board).
            self.persist().await;
        }
        if !self.finished && self.pod.status.as_ref().is_some_and(is_terminal) {
            // The cluster records the pod as finished: what still runs of it stops.
            log::info!("pod {} is finished in the cluster", self.name());
            self.stop_containers(self.grace_period()).await;
            self.refresh().await;
            self.finished = true;
        }
        if self.finished {
            if !self.running().is_empty() {
                // The agent stopped while it was ending the pod (past its deadline,
                // within the grace period): what still runs of it stops now.
                self.stop_containers(self.grace_period()).await;
                self.refresh().await;
            }
            self.persist().await;
            self.finish().await;
            return;
        }
        if self.ended.is_none() && self.past_active_deadline() {
            self.deadline_exceeded().await;
            return;
        }
        // A pod the agent ended runs nothing more; one without a sandbox cannot start
        // containers yet (the failure is said, and tried again).
        if self.ended.is_some() || !self.ensure_sandbox().await {
            self.persist().await;
            return;
        }
        // A new sandbox for a pod that ran before (a reboot, or a power cut before any
        // app container ran, which leaves no running container to find lost): its
        // completed init containers run again.
        if self.sandbox.as_ref().is_some_and(|s| s.fresh) {
            self.lost = true;
        }
        let spec = self.pod.spec.clone().unwrap_or_default();
        let policy = status::restart_policy(&self.pod).to_string();
        let inits = spec.init_containers.clone().unwrap_or_default();
        if std::mem::take(&mut self.lost) {
            self.init_again(&inits).await;
        }
        let done = status::app_done(&policy, &spec.containers, &self.records)
            || status::init_failed(&policy, &inits, &self.records);
        // Started even before initialization is done, as the kubelet starts them.
        if !done {
            self.sync_ephemeral().await;
        }
        if self.sync_init(&inits, &policy, done).await {
            for c in &spec.containers {
                self.sync_container(c, &policy).await;
            }
        }
        if done {
            self.stop_ephemeral().await;
            self.stop_sidecars().await;
        }
        self.refresh_probes();
        self.persist().await;
        if self.state.as_ref().is_some_and(|s| is_terminal(&s.status)) {
            self.finished = true;
            self.finish().await;
        }
    }

    /// A finished pod, as the kubelet's syncTerminatedPod leaves it: what it held goes
    /// (its volumes, network, `/dev/shm` and cgroups), while its container records, its
    /// final status and its containers' logs stay until the pod is removed (deleted in
    /// the cluster, or its manifest removed), so that `kubectl logs` of a finished Job
    /// still answers.
    async fn finish(&mut self) {
        if self.freed {
            return;
        }
        self.refresh_probes();
        self.teardown_sandbox().await;
        self.freed = true;
        log::info!(
            "pod {} finished; its logs and status stay until it is removed",
            self.name()
        );
    }

    /// Brings one container toward its spec under restart policy `policy`.
    pub(super) async fn sync_container(
        &mut self,
        c: &k8s_openapi::api::core::v1::Container,
        policy: &str,
    ) {
        let rec = self
            .records
            .entry(c.name.clone())
            .or_insert_with(|| ContainerRecord::new(&c.name))
            .clone();
        let wall = time::now();
        let planned = plan::plan(policy, &rec, wall, &self.deps.backoff);
        let (action, wake) =
            self.restart_timers
                .apply(&c.name, rec.restart_count, planned, wall, Instant::now());
        match action {
            Action::Keep => {}
            Action::Start => self.start(c, rec).await,
            Action::Restart => {
                let mut rec = rec;
                if let Some(cur) = rec.current.take() {
                    self.remove_container(&cur.id).await;
                    if let InstanceState::Terminated(t) = cur.state {
                        rec.last = Some(t);
                    }
                }
                rec.restart_count = rec.restart_count.saturating_add(1);
                self.start(c, rec).await;
            }
            Action::BackOff { .. } => {
                if self.backoff_told.get(&c.name) != Some(&rec.restart_count) {
                    self.backoff_told.insert(c.name.clone(), rec.restart_count);
                    let pod_name = self.pod.metadata.name.clone().unwrap_or_default();
                    self.deps.reporter.event(
                        &self.pod,
                        Some(&c.name),
                        EventType::Warning,
                        "BackOff",
                        format!(
                            "Back-off restarting failed container {} in pod {pod_name}",
                            c.name
                        ),
                    );
                }
                if let Some(at) = wake {
                    self.wake_at(at)
                }
            }
        }
    }

    /// The kubelet's `Failed` event for container `c`: `Error: <message>`.
    fn failed(&self, c: &k8s_openapi::api::core::v1::Container, message: &dyn std::fmt::Display) {
        self.deps.reporter.event(
            &self.pod,
            Some(&c.name),
            EventType::Warning,
            "Failed",
            format!("Error: {message}"),
        );
    }

    fn wake_at(&mut self, at: Instant) {
        self.wake = Some(match self.wake {
            Some(w) if w < at => w,
            _ => at,
        });
    }

    /// Reads the runtime's view of every running instance.
    async fn refresh(&mut self) {
        let reset = self.deps.crash_loop_reset;
        let names: Vec<String> = self.records.keys().cloned().collect();
        for name in names {
            let Some(rec) = self.records.get(&name) else {
                continue;
            };
            let Some(cur) = &rec.current else { continue };
            let InstanceState::Running { started_at } = cur.state else {
                continue;
            };
            let id = cur.id.clone();
            let state = self.runtime_state(&id).await;
            let restart = rec.restart_count;
            let ended = match state {
                Ok(ContainerState::Exited(exit)) => {
                    let mut t = Terminated::from_exit(&id, &exit);
                    if let Some(reason) = self.kill_reasons.get(&name) {
                        t.message = t.message.or_else(|| Some(reason.clone()));
                    }
                    Box::pin(self.add_termination_message(&name, restart, &exit, &mut t)).await;
                    Some(t)
                }
                // No trace of it at all is lost too: a power cut right after its start
                // can leave the store's record of it running while its dir, not synced
                // yet, never reached the disk (or the start's cleanup took what did).
                Ok(ContainerState::Unknown) | Err(RuntimeError::NotFound { .. }) => {
                    self.lost = true;
                    Some(Terminated::lost(&id, Some(started_at), time::now()))
                }
                Ok(_) => None,
                Err(e) => {
                    log::warn!("pod {}: container {name}: {e}", self.name());
                    None
                }
            };
            let pod_name = self.name();
            let reason = self.kill_reasons.remove(&name);
            if let (Some(mut t), Some(rec)) = (ended, self.records.get_mut(&name)) {
                if t.message.is_none() {
                    t.message = reason;
                }
                log::info!(
                    "pod {pod_name}: container {name} exited with code {} ({})",
                    t.exit_code,
                    t.reason
                );
                if let Some(cur) = rec.current.as_mut() {
                    cur.state = InstanceState::Terminated(t);
                }
                plan::count_exit(rec, reset);
            }
        }
    }

    async fn runtime_state(&self, id: &ContainerId) -> Result<ContainerState, RuntimeError> {
        let rt = self.deps.runtime.clone();
        let id = id.clone();
        blocking(move || rt.state(&id)).await
    }

    async fn register(&self, id: &ContainerId) {
        let _ = self.registered.send((id.clone(), self.uid.clone())).await;
    }

    async fn remove_container(&self, id: &ContainerId) {
        let rt = self.deps.runtime.clone();
        let rid = id.clone();
        if let Err(e) = blocking(move || rt.remove(&rid)).await {
            log::warn!("pod {}: remove container {id}: {e}", self.name());
        }
    }

    fn log_dir(&self) -> PathBuf {
        crate::runtime::pod_log_dir(
            &self.deps.root_dir,
            self.pod.metadata.namespace.as_deref().unwrap_or("default"),
            self.pod.metadata.name.as_deref().unwrap_or(""),
            &self.uid,
        )
    }

    /// Whether every container of the pod runs again after it ends, whatever happens
    /// (`restartPolicy: Always`, the default).
    fn restarts_always(&self) -> bool {
        status::restart_policy(&self.pod) == "Always"
    }
}

/// Succeeded or Failed: phases a pod never leaves.
fn is_terminal(status: &PodStatus) -> bool {
    matches!(status.phase.as_deref(), Some("Succeeded" | "Failed"))
}

/// The status as the store and the apiserver keep it: their times have whole seconds.
/// Compared at finer precision, a status read back from the store after a restart would
/// always look changed, and cost a store write and a PATCH that tell nothing new.
fn whole_seconds(
    status: k8s_openapi::api::core::v1::PodStatus,
) -> k8s_openapi::api::core::v1::PodStatus {
    serde_json::to_value(&status)
        .and_then(serde_json::from_value)
        .unwrap_or(status)
}

async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// Runs blocking runtime, image or store work off the async threads.
async fn blocking<R: Send + 'static>(f: impl FnOnce() -> R + Send + 'static) -> R {
    match tokio::task::spawn_blocking(f).await {
        Ok(r) => r,
        Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
        // Cancelled: the runtime is shutting down and this task with it.
        Err(_) => std::future::pending().await,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{
        ContainerState, ContainerStateRunning, ContainerStatus, PodStatus,
    };
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

    #[test]
    fn a_status_read_back_from_the_store_is_not_a_change() {
        let t: Timestamp = "2026-11-23T03:12:45.123456789Z".parse().expect("time");
        let computed = PodStatus {
            phase: Some("Running".into()),
            start_time: Some(Time(t)),
            container_statuses: Some(vec![ContainerStatus {
                name: "main".into(),
                state: Some(ContainerState {
                    running: Some(ContainerStateRunning {
                        started_at: Some(Time(t)),
                    }),
                    ..ContainerState::default()
                }),
                ..ContainerStatus::default()
            }]),
            ..PodStatus::default()
        };
        let kept = whole_seconds(computed.clone());
        let stored = serde_json::to_vec(&computed).expect("encode");
        let read_back: PodStatus = serde_json::from_slice(&stored).expect("decode");
        assert_ne!(computed, read_back, "the store keeps whole seconds");
        assert_eq!(kept, read_back);
        assert_eq!(
            kept.start_time,
            Some(Time("2026-11-23T03:12:45Z".parse().expect("time")))
        );
        assert_eq!(whole_seconds(kept.clone()), kept);
    }

    /// The size of what `f` returns, without calling it.
    fn returned_size<A, B, R>(_: impl FnOnce(A, B) -> R) -> usize {
        std::mem::size_of::<R>()
    }

    #[test]
    fn a_waiting_worker_keeps_only_its_box_and_its_wait() {
        // What the task of each running pod holds besides the worker itself: the
        // passes it awaits are in boxes of their own, made while they run.
        let run = returned_size(Worker::run);
        assert!(
            run <= 1024,
            "a worker's task holds {run} bytes besides its worker"
        );
        // The worker's own fields: the pod, its stored state and the tables by
        // container, a few KiB in one block.
        let worker = std::mem::size_of::<Worker>();
        assert!(
            run < worker / 4,
            "{run} bytes of future for a {worker}-byte worker"
        );
    }
}
