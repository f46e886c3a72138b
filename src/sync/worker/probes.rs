//! A pod worker's probes: which are due, running them off the worker (each on a
//! blocking thread, its result coming back as a message), and what a verdict does:
//! readiness and startup feed the status, a liveness or startup failure restarts the
//! container. Probes run only for running containers; startup gates the other two.

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

pub(super) struct Probes {
    states: BTreeMap<(String, Kind), (ContainerId, ProbeState)>,
    tx: mpsc::Sender<ProbeDone>,
    pub(super) rx: mpsc::Receiver<ProbeDone>,
    /// When the next probe is due.
    pub(super) wake: Option<Instant>,
}

impl Default for Probes {
    fn default() -> Self {
        let (tx, rx) = mpsc::channel(RESULTS_QUEUE);
        Probes {
            states: BTreeMap::new(),
            tx,
            rx,
            wake: None,
        }
    }
}

impl Probes {
    fn verdict(&self, container: &str, id: &ContainerId, kind: Kind) -> Option<Verdict> {
        self.states
            .get(&(container.to_string(), kind))
            .filter(|(i, _)| i == id)
            .map(|(_, s)| s.verdict())
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

    /// Starts the probes that are due, forgets those of containers that no longer run,
    /// and sets the worker's wake-up for the next one.
    pub(super) fn schedule_probes(&mut self) {
        let now = Instant::now();
        let wall = time::now();
        let mut live: Vec<(String, Kind)> = Vec::new();
        let host = self.probe_host();
        self.probes.wake = None;
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
            let startup_done = c.startup_probe.is_none()
                || self.probes.verdict(&c.name, &id, Kind::Startup) == Some(Verdict::Success);
            for kind in Kind::ALL {
                let Some(spec) = kind.of(&c) else { continue };
                let key = (c.name.clone(), kind);
                live.push(key.clone());
                let fresh = !matches!(self.probes.states.get(&key), Some((i, _)) if *i == id);
                if fresh {
                    let mut state = ProbeState::new(kind, Timing::of(spec, kind), started);
                    if let Some(v) = self.verdict_before_restart(&c.name, &id, kind) {
                        state.assume(v);
                    }
                    self.probes.states.insert(key.clone(), (id.clone(), state));
                }
                // Startup gates liveness and readiness; once it succeeded it is done.
                let gated = match kind {
                    Kind::Startup => startup_done,
                    _ => !startup_done,
                };
                if gated {
                    continue;
                }
                let Some((_, state)) = self.probes.states.get_mut(&key) else {
                    continue;
                };
                if state.due(now) {
                    state.started();
                    let timing = state.timing;
                    let action = Action::of_probe(spec, &c, &host);
                    let done = ProbeDone {
                        container: c.name.clone(),
                        id: id.clone(),
                        kind,
                        outcome: Outcome::Success,
                    };
                    if let Err(e) = self.spawn_probe(done, action, timing.timeout) {
                        // No thread (a pid or memory limit): a failed probe, tried
                        // again a period later.
                        if let Some((_, state)) = self.probes.states.get_mut(&key) {
                            state.record(false, &e, now);
                            let at = state.next_at();
                            self.probes.wake = Some(self.probes.wake.map_or(at, |w| w.min(at)));
                        }
                    }
                } else if !state.in_flight() {
                    let at = state.next_at();
                    self.probes.wake = Some(self.probes.wake.map_or(at, |w| w.min(at)));
                }
            }
        }
        self.probes.states.retain(|k, _| live.contains(k));
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

    /// A probe ended: says a failure, and restarts the container whose liveness or
    /// startup probe failed for good. Returns whether the status may have changed.
    pub(super) async fn probed(&mut self, done: ProbeDone) -> bool {
        let key = (done.container.clone(), done.kind);
        let Some((id, state)) = self.probes.states.get_mut(&key) else {
            return false;
        };
        if *id != done.id {
            return false; // an earlier instance's probe
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
