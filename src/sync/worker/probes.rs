//! A pod worker's probes: which are due, running them off the worker (each on a
//! blocking thread, its result coming back as a message), and what a verdict does:
//! readiness and startup feed the status, a liveness or startup failure restarts the
//! container. Probes run only for running containers; startup gates the other two.
//! A pod deleted in the cluster is probed for readiness until its containers stop,
//! while its liveness and startup probes are over and count as passed (the kubelet's
//! prober worker: a pod stopping must not be restarted, nor wait on its start).

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::core::v1::Container;
use tokio::sync::mpsc;
use tokio::time::Instant;

use super::super::probe::action::Action;
use super::super::probe::net::Outcome;
use super::super::probe::state::{Kind, ProbeState, Timing, Verdict};
use super::super::record::InstanceState;
use super::super::status::{is_sidecar, ProbeView};
use super::Worker;
use crate::runtime::ContainerId;
use crate::time;
use crate::uplink::report::EventType;

/// Probe results waiting for the worker: at most three probes per container run at once,
/// and a full queue only holds the probe threads back.
const RESULTS_QUEUE: usize = 16;
/// Stack of a probe's thread: a TLS handshake and an exec's pipes fit well within it.
const PROBE_STACK: usize = 512 * 1024;

/// A probe that ended.
#[derive(Debug)]
pub(in crate::sync) struct ProbeDone {
    container: String,
    id: ContainerId,
    kind: Kind,
    outcome: Outcome,
}

/// One probe of one container instance: its state and what it runs.
struct Probe {
    id: ContainerId,
    state: ProbeState,
    /// Taken from the spec when the instance got its probes; an error is the spec's
    /// fault, and every probe of it fails with it.
    action: Result<Action, String>,
}

pub(super) struct Probes {
    states: BTreeMap<(String, Kind), Probe>,
    tx: mpsc::Sender<ProbeDone>,
    pub(super) rx: mpsc::Receiver<ProbeDone>,
    /// When the next probe is due.
    pub(super) wake: Option<Instant>,
    /// The pod is deleted and stopping: only readiness probes run.
    deleting: bool,
}

impl Default for Probes {
    fn default() -> Self {
        let (tx, rx) = mpsc::channel(RESULTS_QUEUE);
        Probes {
            states: BTreeMap::new(),
            tx,
            rx,
            wake: None,
            deleting: false,
        }
    }
}

impl Probes {
    fn verdict(&self, container: &str, id: &ContainerId, kind: Kind) -> Option<Verdict> {
        self.states
            .get(&(container.to_string(), kind))
            .filter(|p| p.id == *id)
            .map(|p| p.state.verdict())
    }
}

/// The spec's containers that may have probes: sidecars (init containers that restart
/// always) and the app containers.
pub(super) fn probed_containers(pod: &k8s_openapi::api::core::v1::Pod) -> Vec<Container> {
    let Some(spec) = pod.spec.as_ref() else {
        return Vec::new();
    };
    spec.init_containers
        .iter()
        .flatten()
        .filter(|c| is_sidecar(c))
        .chain(spec.containers.iter())
        .cloned()
        .collect()
}

impl Worker {
    /// The address probes and hooks reach the pod at: its own, or the node's for a
    /// host-network pod.
    pub(super) fn probe_host(&self) -> String {
        self.pod_ips()
            .into_iter()
            .next()
            .or_else(|| self.deps.host_ip.clone())
            .unwrap_or_else(|| "127.0.0.1".to_string())
    }

    /// Brings the probes in line with the running containers (a pass over the pod):
    /// a new instance gets fresh probe states, each with its action taken from the
    /// spec once; those of containers that no longer run are forgotten. Then starts
    /// what is due.
    pub(super) fn refresh_probes(&mut self) {
        let now = Instant::now();
        let wall = time::now();
        let mut live: Vec<(String, Kind)> = Vec::new();
        let host = self.probe_host();
        for c in probed_containers(&self.pod) {
            let Some(rec) = self.records.get(&c.name) else {
                continue;
            };
            let Some(cur) = &rec.current else { continue };
            let InstanceState::Running { started_at } = cur.state else {
                continue;
            };
            let id = cur.id.clone();
            // The instance's start on the monotonic clock, for the initial delay.
            let ran = wall.duration_since(started_at).unsigned_abs();
            let started = now.checked_sub(ran).unwrap_or(now);
            for kind in Kind::ALL {
                let Some(spec) = kind.of(&c) else { continue };
                let key = (c.name.clone(), kind);
                live.push(key.clone());
                if matches!(self.probes.states.get(&key), Some(p) if p.id == id) {
                    continue;
                }
                let mut state = ProbeState::new(kind, Timing::of(spec, kind), started);
                if let Some(v) = self.verdict_before_restart(&c.name, &id, kind) {
                    state.assume(v);
                }
                let probe = Probe {
                    id: id.clone(),
                    state,
                    action: Action::of_probe(spec, &c, &host),
                };
                self.probes.states.insert(key, probe);
            }
        }
        self.probes.states.retain(|k, _| live.contains(k));
        self.start_due_probes();
    }

    /// Starts the probes that are due and sets the wake-up for the next one. Cheap: it
    /// runs at every probe's period, and looks only at the probe states.
    pub(super) fn start_due_probes(&mut self) {
        let now = Instant::now();
        self.probes.wake = None;
        let keys: Vec<(String, Kind)> = self.probes.states.keys().cloned().collect();
        for key in keys {
            let (name, kind) = (&key.0, key.1);
            // Startup gates liveness and readiness; once it succeeded it is done.
            let startup_done = self
                .probes
                .states
                .get(&(name.clone(), Kind::Startup))
                .is_none_or(|p| p.state.verdict() == Verdict::Success);
            let gated = match kind {
                _ if self.probes.deleting => kind != Kind::Readiness,
                Kind::Startup => startup_done,
                _ => !startup_done,
            };
            let Some(probe) = self.probes.states.get(&key) else {
                continue;
            };
            // The instance may have ended since the last pass: it is probed no more.
            let running = self
                .records
                .get(name)
                .and_then(|r| r.current.as_ref())
                .is_some_and(|cur| {
                    cur.id == probe.id && matches!(cur.state, InstanceState::Running { .. })
                });
            if gated || !running || probe.state.in_flight() {
                continue;
            }
            if !probe.state.due(now) {
                let at = probe.state.next_at();
                self.probes.wake = Some(self.probes.wake.map_or(at, |w| w.min(at)));
                continue;
            }
            let done = ProbeDone {
                container: name.clone(),
                id: probe.id.clone(),
                kind,
                outcome: Outcome::Success,
            };
            let (action, timeout) = (probe.action.clone(), probe.state.timing.timeout);
            let spawned = self.spawn_probe(done, action, timeout);
            let Some(probe) = self.probes.states.get_mut(&key) else {
                continue;
            };
            probe.state.started();
            if let Err(e) = spawned {
                // No thread (a pid or memory limit): a failed probe, tried again a
                // period later.
                probe.state.record(false, &e, now);
                let at = probe.state.next_at();
                self.probes.wake = Some(self.probes.wake.map_or(at, |w| w.min(at)));
            }
        }
    }

    /// Runs a probe on a thread of its own that ends with it, as the kubelet gives each
    /// probe a goroutine. Not tokio's blocking pool: a steady trickle of probes would
    /// keep alive every thread a burst of pod starts made there (its idle threads are
    /// woken in turn, so none stays idle long enough to end): 200 threads and 25 MiB
    /// more with 50 probed pods.
    fn spawn_probe(
        &self,
        mut done: ProbeDone,
        action: Result<Action, String>,
        timeout: Duration,
    ) -> Result<(), String> {
        let rt = self.deps.runtime.clone();
        let tx = self.probes.tx.clone();
        let kind = done.kind;
        let spawned = std::thread::Builder::new()
            .name("probe".into())
            .stack_size(PROBE_STACK)
            .spawn(move || {
                done.outcome = match action {
                    Ok(a) => a.run(rt.as_ref(), &done.id, timeout),
                    Err(e) => Outcome::Failure(e),
                };
                // The worker is gone when this fails: nothing waits for the result.
                let _ = tx.blocking_send(done);
            });
        spawned.map(|_| ()).map_err(|e| {
            log::warn!("pod {}: start a {} probe: {e}", self.name(), kind.name());
            format!("probe could not start: {e}")
        })
    }

    /// The pod was deleted in the cluster: its liveness and startup probes are over
    /// and count as passed, its readiness probes go on (for an agent that restarted
    /// into the stop, they begin now).
    pub(super) fn probe_deleted(&mut self) {
        self.probes.deleting = true;
        self.refresh_probes();
        for ((_, kind), probe) in self.probes.states.iter_mut() {
            if *kind != Kind::Readiness {
                probe.state.assume(Verdict::Success);
            }
        }
    }

    /// Forgets the probes of these container instances; whether there were any.
    pub(super) fn forget_probes_of(&mut self, ids: &[ContainerId]) -> bool {
        let before = self.probes.states.len();
        self.probes.states.retain(|_, p| !ids.contains(&p.id));
        self.probes.states.len() != before
    }

    /// Whether the pod is being deleted and its readiness probes still run.
    pub(super) fn probing_deleted(&self) -> bool {
        self.probes.deleting
    }

    /// A probe ended: says a failure, and restarts the container whose liveness or
    /// startup probe failed for good. Returns whether the status may have changed.
    pub(super) async fn probed(&mut self, done: ProbeDone) -> bool {
        let Some(verdict) = self.take_result(&done) else {
            return false;
        };
        let kind = done.kind;
        if verdict == Some(Verdict::Failure) && kind != Kind::Readiness {
            let what = kind.name().to_lowercase();
            let reason = format!(
                "Container {} failed {what} probe, will be restarted",
                done.container
            );
            log::info!("pod {}: {reason}", self.name());
            let grace = self.probe_grace(&done.container, kind);
            self.kill_one(&done.container, &done.id, grace, "Killing", reason)
                .await;
            return true;
        }
        verdict.is_some()
    }

    /// A probe of a pod that is being deleted ended: only a readiness probe counts.
    /// Returns whether its verdict changed.
    pub(super) fn probed_deleting(&mut self, done: ProbeDone) -> bool {
        done.kind == Kind::Readiness && self.take_result(&done).is_some_and(|v| v.is_some())
    }

    /// Records a probe's result in the state of its instance and says a failure (or a
    /// warning) as the kubelet's event. None: the result is an earlier instance's, or
    /// of a probe no longer kept; else the verdict when it changed.
    fn take_result(&mut self, done: &ProbeDone) -> Option<Option<Verdict>> {
        let key = (done.container.clone(), done.kind);
        let Probe { id, state, .. } = self.probes.states.get_mut(&key)?;
        if *id != done.id {
            return None; // an earlier instance's probe
        }
        let (success, message) = match &done.outcome {
            Outcome::Success => (true, String::new()),
            Outcome::Warning(m) => (true, m.clone()),
            Outcome::Failure(m) => (false, m.clone()),
        };
        let verdict = state.record(success, &message, Instant::now());
        let kind = done.kind;
        match &done.outcome {
            Outcome::Failure(m) => self.deps.reporter.event(
                &self.pod,
                Some(&done.container),
                EventType::Warning,
                "Unhealthy",
                format!("{} probe failed: {m}", kind.name()),
            ),
            Outcome::Warning(m) => self.deps.reporter.event(
                &self.pod,
                Some(&done.container),
                EventType::Warning,
                "ProbeWarning",
                format!("{} probe warning: {m}", kind.name()),
            ),
            Outcome::Success => {}
        }
        Some(verdict)
    }

    /// The grace period of a kill for a failed probe: the probe's own, else the pod's.
    fn probe_grace(&self, container: &str, kind: Kind) -> i64 {
        let from_probe = probed_containers(&self.pod)
            .iter()
            .find(|c| c.name == container)
            .and_then(|c| kind.of(c).and_then(|p| p.termination_grace_period_seconds));
        from_probe.unwrap_or_else(|| self.grace_period())
    }

    /// Ready and started for every running container, as the probes say.
    pub(super) fn probe_views(&self) -> BTreeMap<String, ProbeView> {
        let mut views = BTreeMap::new();
        for c in probed_containers(&self.pod) {
            let Some(cur) = self.records.get(&c.name).and_then(|r| r.current.as_ref()) else {
                continue;
            };
            let passed = |kind: Kind| {
                kind.of(&c).is_none()
                    || self.probes.verdict(&c.name, &cur.id, kind) == Some(Verdict::Success)
            };
            let started = passed(Kind::Startup);
            views.insert(
                c.name.clone(),
                ProbeView {
                    started,
                    ready: started && passed(Kind::Readiness),
                },
            );
        }
        views
    }

    /// What the status said of this very instance before the agent restarted: a
    /// restarted agent keeps a ready container ready until its probe says otherwise,
    /// rather than flipping every pod to unready and back (a store write and a status
    /// update per pod, for nothing).
    fn verdict_before_restart(&self, name: &str, id: &ContainerId, kind: Kind) -> Option<Verdict> {
        let status = &self.state.as_ref()?.status;
        let all = status
            .container_statuses
            .iter()
            .flatten()
            .chain(status.init_container_statuses.iter().flatten());
        let s = all
            .filter(|s| s.name == name)
            .find(|s| s.container_id.as_deref() == Some(id.uri().as_str()))?;
        match kind {
            Kind::Readiness if s.ready => Some(Verdict::Success),
            Kind::Startup if s.started == Some(true) => Some(Verdict::Success),
            _ => None,
        }
    }
}
