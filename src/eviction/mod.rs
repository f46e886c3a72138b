//! eviction: node-pressure eviction, as the kubelet's eviction manager does it with
//! `evictionHard`. Every `holdfast.evictionMonitoringPeriod` (10 s) it observes the
//! signals ([`signals`]); under disk pressure it first reclaims ([`reclaim`]: dead
//! containers of ended pods, then unused images through a seam the image store
//! fills); if a threshold is still met it ranks the active pods ([`rank`]) and asks
//! the sync loop to evict one — phase Failed, reason Evicted, the kubelet's message —
//! then waits for it to be gone before it looks again. Before any of that, on every
//! look, a pod over its own local storage limits is evicted ([`local_storage`]). It
//! also tells admission when the node is under memory pressure (BestEffort pods are
//! refused meanwhile).
//!
//! Critical pods are never evicted ([`rank::is_critical`]): static pods, known by the
//! `kubernetes.io/config.source` annotation that the pod sources set themselves (the
//! apiserver source overwrites whatever a cluster pod brought), mirror pods, and pods
//! of system-critical priority.
//!
//! Reads cgroupfs, the store and the filesystem; never stops a container itself (the
//! pod's worker does). Runs on a thread of its own: everything it does blocks.

pub mod local_storage;
pub mod rank;
pub mod reclaim;
pub mod signals;

use std::collections::{BTreeMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::mpsc;

use crate::config::Config;
use crate::node::allocatable::{Threshold, DEFAULT_EVICTION_HARD};
use crate::pod::requests::pod_resources;
use crate::resources::Qos;
use crate::sync::record::InstanceState;
use crate::sync::{Deps, Eviction};
use rank::Candidate;
use reclaim::ImageGc;
use signals::{Met, Resource};

/// How long an evicted pod gets to be gone before the next decision (the kubelet's
/// `podCleanupTimeout`).
const CLEANUP_TIMEOUT: Duration = Duration::from_secs(30);

struct Manager {
    deps: Arc<Deps>,
    period: Duration,
    hard: BTreeMap<String, Threshold>,
    raw: BTreeMap<String, String>,
    images: Box<dyn ImageGc>,
    /// "No pod may be evicted" was said for this pressure episode.
    said_stuck: bool,
    /// Critical pods said to be over their storage limits (said once each).
    said_critical: HashSet<String>,
}

/// Starts the eviction manager; the sync loop evicts what comes out of the returned
/// channel. `images` frees image space under disk pressure.
pub fn start(
    config: &Config,
    deps: Arc<Deps>,
    images: Box<dyn ImageGc>,
) -> mpsc::Receiver<Eviction> {
    let (tx, rx) = mpsc::channel(4);
    let hard = match config.node_input() {
        Ok(input) => input.eviction_hard,
        Err(e) => {
            log::warn!("eviction thresholds: {e}; no pod will be evicted");
            BTreeMap::new()
        }
    };
    let raw: BTreeMap<String, String> = if config.eviction_hard.is_empty() {
        DEFAULT_EVICTION_HARD
            .iter()
            .map(|(s, t)| (s.to_string(), t.to_string()))
            .collect()
    } else {
        config.eviction_hard.clone()
    };
    let manager = Manager {
        deps,
        period: config.pods.eviction_monitoring_period,
        hard,
        raw,
        images,
        said_stuck: false,
        said_critical: HashSet::new(),
    };
    let spawned = std::thread::Builder::new()
        .name("eviction".into())
        .spawn(move || manager.run(tx));
    if let Err(e) = spawned {
        log::error!("start the eviction manager: {e}");
    }
    rx
}

impl Manager {
    fn run(mut self, tx: mpsc::Sender<Eviction>) {
        loop {
            std::thread::sleep(self.period);
            if tx.is_closed() {
                return;
            }
            // As the kubelet: pods over their own limits go before node pressure counts.
            let over = self.local_storage();
            if !over.is_empty() {
                let uids: Vec<String> = over.iter().map(|e| e.uid.clone()).collect();
                for eviction in over {
                    log::warn!(
                        "eviction: pod {} is over its local storage limits: {}",
                        eviction.uid,
                        eviction.message
                    );
                    if tx.blocking_send(eviction).is_err() {
                        return;
                    }
                }
                for uid in &uids {
                    self.wait_gone(uid);
                }
                continue;
            }
            let Some((met, victim)) = self.decide() else {
                continue;
            };
            let message = rank::message(&met, &victim);
            log::warn!(
                "eviction: {} below its threshold ({} < {}); evicting pod {}",
                met.signal,
                met.observed.available,
                met.threshold,
                victim.uid
            );
            let eviction = Eviction {
                uid: victim.uid.clone(),
                message,
                disruption: true,
            };
            if tx.blocking_send(eviction).is_err() {
                return;
            }
            self.wait_gone(&victim.uid);
        }
    }

    /// The pods over their own local storage limits, with the kubelet's messages; a
    /// critical pod over them is said once and left running.
    fn local_storage(&mut self) -> Vec<Eviction> {
        let Ok(states) = self.deps.podstates.entries() else {
            return Vec::new();
        };
        let mut out = Vec::new();
        let mut over_critical = HashSet::new();
        for (uid, state) in states {
            if state.ended() || !local_storage::limited(state.pod()) {
                continue;
            }
            let dirs = local_storage::PodDirs {
                root_dir: &self.deps.root_dir,
                pod_dir: self.deps.sandboxes.pod_dir(&uid),
                log_dir: logs_dir(&self.deps.root_dir, state.pod(), &uid),
                containers: self.container_ids(&uid, false),
            };
            let usage = local_storage::measure(state.pod(), &dirs);
            if !usage.complete {
                log::debug!("eviction: pod {uid}: too many files to count them all");
            }
            let Some(message) = local_storage::exceeded(state.pod(), &usage) else {
                continue;
            };
            if rank::is_critical(state.pod()) {
                if !self.said_critical.contains(&uid) {
                    log::warn!(
                        "eviction: pod {uid} is over its local storage limits, but is \
                         critical (static, mirror or system-critical) and is not evicted: \
                         {message}"
                    );
                }
                over_critical.insert(uid);
                continue;
            }
            out.push(Eviction {
                uid,
                message,
                disruption: false,
            });
        }
        self.said_critical = over_critical;
        out
    }

    /// The pod's containers with an instance, `(name, id)`; only running ones if
    /// `running`.
    fn container_ids(&self, uid: &str, running: bool) -> Vec<(String, String)> {
        self.deps
            .containers
            .scan_prefix(&format!("{uid}/"))
            .unwrap_or_default()
            .into_iter()
            .filter_map(|(_, rec)| {
                let cur = rec.current?;
                (!running || matches!(cur.state, InstanceState::Running { .. }))
                    .then(|| (rec.name.clone(), cur.id.0.clone()))
            })
            .collect()
    }

    fn observe(&self) -> Vec<Met> {
        let s = &self.deps.sandboxes;
        let pods_cgroup = s.enforce_pods.then(|| s.cgroups.kubepods());
        let obs = signals::observe(&s.cgroups, &self.deps.root_dir, pods_cgroup.as_deref());
        signals::met(&self.hard, &self.raw, &obs)
    }

    /// The threshold to act on and the pod to evict, if any.
    fn decide(&mut self) -> Option<(Met, Candidate)> {
        let mut met = self.observe();
        let memory = met.iter().any(|m| m.resource == Resource::Memory);
        self.deps
            .sandboxes
            .memory_pressure
            .store(memory, Ordering::Relaxed);
        if met.is_empty() {
            self.said_stuck = false;
            return None;
        }
        if !memory {
            // Disk: what the node can free by itself goes before any pod.
            let removed = reclaim::dead_containers(
                &self.deps.runtime,
                &self.deps.podstates,
                &self.deps.containers,
            );
            let need = met
                .iter()
                .map(|m| m.threshold.saturating_sub(m.observed.available))
                .max()
                .unwrap_or(0);
            match self.images.gc(need) {
                Ok(freed) if freed > 0 || removed > 0 => {
                    log::info!(
                        "eviction: reclaimed {removed} dead container(s) and {freed} bytes of images"
                    );
                }
                Ok(_) => {}
                Err(e) => log::warn!("eviction: image garbage collection: {e}"),
            }
            met = self.observe();
            if met.is_empty() {
                self.said_stuck = false;
                return None;
            }
        }
        // Memory first, as the kubelet orders its thresholds.
        met.sort_by_key(|m| m.resource != Resource::Memory);
        let first = met.into_iter().next()?;
        let candidates = self.candidates(first.resource);
        let running = candidates.len();
        let ranked = rank::rank(candidates);
        match ranked.into_iter().next() {
            Some(victim) => {
                self.said_stuck = false;
                Some((first, victim))
            }
            None => {
                // Said once per episode: it is looked at again every period.
                if !self.said_stuck {
                    self.said_stuck = true;
                    log::warn!(
                        "eviction: {} is {} bytes, below its threshold of {} bytes, but no \
                         pod may be evicted: {running} pod(s) run, all static or critical \
                         (the kubelet never evicts those)",
                        first.signal,
                        first.observed.available,
                        first.threshold
                    );
                }
                None
            }
        }
    }

    /// The pods that run, with what they use of `resource`.
    fn candidates(&self, resource: Resource) -> Vec<Candidate> {
        let Ok(states) = self.deps.podstates.entries() else {
            return Vec::new();
        };
        let s = &self.deps.sandboxes;
        let mut out = Vec::new();
        for (uid, state) in states {
            if state.ended() {
                continue;
            }
            let pod = state.into_pod();
            let pod_path = s.cgroups.pod_path(&uid, Qos::of(&pod));
            let running = self.container_ids(&uid, true);
            let (usage, request, containers) = match resource {
                Resource::Memory => {
                    let usage = s.cgroups.working_set(&pod_path);
                    let containers = running
                        .iter()
                        .filter_map(|(name, id)| {
                            s.cgroups
                                .working_set(&format!("{pod_path}/{id}"))
                                .map(|u| (name.clone(), u))
                        })
                        .collect();
                    let request = pod_resources(&pod).map(|r| r.requests.memory).unwrap_or(0);
                    (usage, request, containers)
                }
                Resource::EphemeralStorage | Resource::Inodes => {
                    let containers: Vec<(String, u64)> = running
                        .iter()
                        .map(|(name, id)| {
                            let upper =
                                self.deps.root_dir.join("containers").join(id).join("upper");
                            (name.clone(), disk_usage(&upper, resource))
                        })
                        .collect();
                    let volumes = s
                        .pod_dir(&uid)
                        .join("volumes")
                        .join("kubernetes.io~empty-dir");
                    let logs = logs_dir(&self.deps.root_dir, &pod, &uid);
                    let total = containers
                        .iter()
                        .map(|(_, u)| *u)
                        .fold(0, u64::saturating_add)
                        .saturating_add(disk_usage(&volumes, resource))
                        .saturating_add(disk_usage(&logs, resource));
                    let request = ephemeral_request(&pod);
                    (Some(total), request, containers)
                }
            };
            out.push(Candidate {
                uid,
                pod,
                usage,
                request,
                containers,
            });
        }
        out
    }

    /// Waits until the evicted pod's status says so (its worker stopped it), or the
    /// kubelet's cleanup timeout.
    fn wait_gone(&self, uid: &str) {
        let deadline = Instant::now() + CLEANUP_TIMEOUT;
        while Instant::now() < deadline {
            let done = match self.deps.podstates.get(uid) {
                Ok(Some(s)) => s.status().phase.as_deref() == Some("Failed"),
                _ => true,
            };
            if done {
                return;
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }
}

fn logs_dir(root: &Path, pod: &k8s_openapi::api::core::v1::Pod, uid: &str) -> PathBuf {
    crate::runtime::pod_log_dir(
        root,
        pod.metadata.namespace.as_deref().unwrap_or("default"),
        pod.metadata.name.as_deref().unwrap_or(""),
        uid,
    )
}

fn ephemeral_request(pod: &k8s_openapi::api::core::v1::Pod) -> u64 {
    pod.spec
        .iter()
        .flat_map(|s| s.containers.iter())
        .filter_map(|c| {
            c.resources
                .as_ref()?
                .requests
                .as_ref()?
                .get("ephemeral-storage")
                .and_then(|q| crate::quantity::parse_bytes(&q.0).ok())
        })
        // A manifest may ask for two of the largest quantities.
        .fold(0, u64::saturating_add)
}

/// Bytes (or inodes) used under `dir`, on its own filesystem only: a tmpfs or any
/// other mount below it is not disk.
fn disk_usage(dir: &Path, resource: Resource) -> u64 {
    let u = crate::node::du::usage(dir);
    match resource {
        Resource::Inodes => u.inodes,
        _ => u.bytes,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn two_of_the_largest_ephemeral_storage_requests_saturate() {
        let huge = serde_json::json!({"requests": {"ephemeral-storage": "8Ei"}});
        let pod: k8s_openapi::api::core::v1::Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "greedy"},
            "spec": {"containers": [
                {"name": "a", "resources": huge},
                {"name": "b", "resources": huge},
            ]},
        }))
        .expect("pod");
        assert_eq!(ephemeral_request(&pod), u64::MAX);
    }
}
