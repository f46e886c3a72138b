//! sync: the sync loop, pod workers, restart back-off, pod phase and conditions.
//! Never talks HTTP, except `probe`'s calls to the containers' own endpoints.
//!
//! The loop only routes: pod changes from the source mux, container exits from the
//! runtime and the resync timer become messages to one worker per pod UID, and each
//! worker owns its pod (kube-runtime's rule: never reconcile one object twice at once).
//! What the rest of the agent reads of the pods is [`view`]'s, not the workers' record.

mod admit;
pub mod adopt;
mod burst;
pub mod env;
mod in_use;
mod plan;
pub mod probe;
pub mod record;
mod restart_timer;
pub mod sandbox;
mod service_env;
pub mod shutdown;
pub mod status;
pub mod view;
mod worker;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::future::Future;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use tokio::sync::mpsc;
use tokio::task::JoinSet;

use crate::backoff::Backoff;
use crate::image::ImageStore;
use crate::runtime::{ContainerId, ContainerState, Runtime};
use crate::source::PodChange;
use crate::store::{Store, StoreError, Tree};
use crate::uplink::objects::{references, ObjectCache, ObjectKey, ObjectKind, References};

pub use in_use::NodeImages;
pub use record::ContainerRecord;
pub use view::{PodStates, PodView};
pub use worker::{Eviction, PodState};
use worker::{Worker, WorkerMsg};

/// Queue depth of one worker's mailbox: updates coalesce in the worker's own state, so
/// a handful is plenty.
const WORKER_QUEUE: usize = 16;

/// What the workers share: read-only settings and handles that are safe to share.
pub struct Deps {
    pub runtime: Arc<dyn Runtime>,
    pub images: Arc<ImageStore>,
    pub store: Store,
    pub containers: Tree<ContainerRecord>,
    pub podstates: PodStates,
    pub root_dir: PathBuf,
    pub node_name: String,
    pub host_ip: Option<String>,
    /// The cached ConfigMaps and Secrets that container environments read.
    pub objects: ObjectCache,
    /// The cluster's Services, for containers' environments; `None` on a node with no
    /// apiserver.
    pub services: Option<crate::uplink::services::ServiceCache>,
    /// Pods' service-account tokens; `None` on a node with no apiserver.
    pub tokens: Option<crate::uplink::tokens::TokenManager>,
    /// The node's allocatable resources: what `resourceFieldRef` reports as the limit
    /// of a container that sets none.
    pub allocatable: BTreeMap<String, Quantity>,
    pub backoff: Backoff,
    pub crash_loop_reset: Duration,
    pub sync_frequency: Duration,
    /// Where statuses and events go; does nothing on a standalone agent.
    pub reporter: crate::uplink::Reporter,
    /// Image pulls; `None` runs only images already on the node.
    pub puller: Option<crate::image::registry::Puller>,
    /// Pull back-off per pod and image (the kubelet's 10 s doubling to 5 min).
    pub pull_backoff: Backoff,
    /// With the registry out of reach, policy `Always` runs an image that is here.
    pub offline_fallback: bool,
    /// Pods' sandboxes: cgroups, volumes, namespaces and network; and admission.
    pub sandboxes: sandbox::Sandboxes,
    /// Set while the node shuts down: no pod is admitted.
    pub shutting_down: crate::node::shutdown::ShuttingDown,
}

impl Deps {
    /// The store trees the sync loop owns.
    pub fn trees(store: &Store) -> Result<(Tree<ContainerRecord>, PodStates), StoreError> {
        Ok((store.tree("containers")?, PodStates::open(store)?))
    }
}

struct Handle {
    tx: mpsc::Sender<WorkerMsg>,
    /// The worker is stopping its pod: it reads no more updates.
    terminating: bool,
    /// Ends the worker's task where it waits (a stopping agent does not wait for it).
    abort: tokio::task::AbortHandle,
}

/// How long a stopping agent lets its pod workers finish the pass they are in (a start
/// under way, a store write) before it leaves them. What is left is as after a crash of
/// the agent, which the next one takes up: containers run on, and a pod's stop resumes
/// from the deadline in the store.
pub const STOP_WAIT: Duration = Duration::from_secs(3);

pub struct SyncLoop {
    deps: Arc<Deps>,
    workers: HashMap<String, Handle>,
    owners: HashMap<ContainerId, String>,
    tasks: JoinSet<String>,
    /// Pods deleted in the cluster whose containers are stopped and final status is
    /// sent: later updates of the same UID (until the DELETED event) must not start
    /// them again.
    finished: HashSet<String>,
    /// Pods wanted again while their worker was still stopping them (a manifest
    /// removed and put back, often across an agent restart): started once it is done.
    readd: HashMap<String, Pod>,
    registered_tx: mpsc::Sender<(ContainerId, String)>,
    registered_rx: mpsc::Receiver<(ContainerId, String)>,
    /// The ConfigMaps and Secrets each worker's pod references, by pod UID.
    references: HashMap<String, References>,
    /// ConfigMaps and Secrets that changed in the cache.
    objects_changed: Option<mpsc::Receiver<ObjectKey>>,
    /// Told when the cluster's Services have been read: containers waiting for them
    /// can start.
    services_read: Option<mpsc::Receiver<()>>,
    /// Pods admitted and not yet gone: their QoS class and requests, by UID.
    admitted: HashMap<String, (crate::resources::Qos, crate::pod::requests::Amounts)>,
    /// Pods the eviction manager chose.
    evictions: Option<mpsc::Receiver<Eviction>>,
    /// The node's shutdown, when it begins.
    node_shutdowns: Option<mpsc::Receiver<shutdown::NodeShutdown>>,
    /// Told of every completed pass: systemd's readiness and watchdog.
    notify: crate::systemd::Notify,
    /// Pod starts and stops since memory was last given back.
    burst: burst::Burst,
}

impl SyncLoop {
    pub fn new(deps: impl Into<Arc<Deps>>) -> Self {
        let (registered_tx, registered_rx) = mpsc::channel(64);
        SyncLoop {
            deps: deps.into(),
            workers: HashMap::new(),
            owners: HashMap::new(),
            tasks: JoinSet::new(),
            finished: HashSet::new(),
            readd: HashMap::new(),
            registered_tx,
            registered_rx,
            references: HashMap::new(),
            objects_changed: None,
            services_read: None,
            admitted: HashMap::new(),
            evictions: None,
            node_shutdowns: None,
            notify: crate::systemd::Notify::default(),
            burst: burst::Burst::new(burst::BURST_EVENTS, burst::QUIET),
        }
    }

    /// Tells systemd when the loop is ready and, through its watchdog, that it still
    /// completes passes.
    pub fn with_notify(mut self, notify: crate::systemd::Notify) -> Self {
        self.notify = notify;
        self
    }

    /// Evicts the pods the eviction manager names on `evictions`.
    pub fn with_evictions(mut self, evictions: mpsc::Receiver<Eviction>) -> Self {
        self.evictions = Some(evictions);
        self
    }

    /// Stops the active pods by priority when `requests` says the node shuts down.
    pub fn with_node_shutdown(mut self, requests: mpsc::Receiver<shutdown::NodeShutdown>) -> Self {
        self.node_shutdowns = Some(requests);
        self
    }

    /// Resyncs the pods that reference a ConfigMap or Secret when `changed` says it
    /// changed in the cache: a container waiting for it starts at once.
    pub fn with_object_changes(mut self, changed: mpsc::Receiver<ObjectKey>) -> Self {
        self.objects_changed = Some(changed);
        self
    }

    /// Resyncs every pod when `read` says the cluster's Services have been read: a
    /// container waiting for them starts at once.
    pub fn with_services_read(mut self, read: mpsc::Receiver<()>) -> Self {
        self.services_read = Some(read);
        self
    }

    /// Runs until `shutdown` completes. Pods keep running after it returns.
    pub async fn run(
        mut self,
        initial: Vec<PodChange>,
        mut changes: mpsc::Receiver<PodChange>,
        mut exits: mpsc::Receiver<ContainerId>,
        mut resyncs: mpsc::Receiver<()>,
        shutdown: impl Future<Output = ()>,
    ) {
        let mut desired: HashMap<String, Vec<String>> = HashMap::new();
        for change in &initial {
            if let PodChange::Add(p) | PodChange::Update(p) = change {
                if let Some(uid) = &p.metadata.uid {
                    let ephemeral = crate::pod::ephemeral::ephemeral_containers(p);
                    let names = p
                        .spec
                        .iter()
                        .flat_map(|s| s.containers.iter().map(|c| &c.name))
                        .chain(ephemeral.iter().map(|c| &c.name))
                        .cloned()
                        .collect();
                    desired.insert(uid.clone(), names);
                }
            }
        }
        self.stop_orphans(&desired).await;
        for change in initial {
            self.apply(change).await;
        }
        tokio::pin!(shutdown);
        let mut objects_changed = self.objects_changed.take();
        let mut services_read = self.services_read.take();
        let mut evictions = self.evictions.take();
        let mut node_shutdowns = self.node_shutdowns.take();
        let mut tick = tokio::time::interval(self.deps.sync_frequency);
        tick.tick().await;
        // With a watchdog, an idle loop still wakes (and passes) every quarter interval.
        let mut beat = self.notify.beat_interval();
        loop {
            // A pass completed (the first: the initial pods are handed to their workers).
            self.notify.beat(self.workers.len());
            tokio::select! {
                _ = &mut shutdown => break,
                Some(change) = changes.recv() => {
                    self.burst.note();
                    self.apply(change).await
                }
                Some(id) = exits.recv() => {
                    self.burst.note();
                    self.route_exit(id).await
                }
                Some((id, uid)) = self.registered_rx.recv() => {
                    self.burst.note();
                    self.owners.insert(id, uid);
                }
                Some(()) = resyncs.recv() => self.broadcast_resync().await,
                Some(key) = next_change(&mut objects_changed) => self.resync_referencing(&key),
                Some(()) = next_change(&mut services_read) => self.broadcast_resync().await,
                Some(eviction) = next_change(&mut evictions) => {
                    if let Some(h) = self.workers.get(&eviction.uid).filter(|h| !h.terminating) {
                        let _ = h.tx.send(WorkerMsg::Evict(eviction)).await;
                    }
                }
                Some(request) = next_change(&mut node_shutdowns) => self.shut_down(request),
                _ = tick.tick() => self.broadcast_resync().await,
                _ = crate::systemd::tick(&mut beat) => {}
                // A burst of starts and stops is over: its memory goes back at once.
                _ = self.burst.settled() => {
                    self.shrink();
                    tokio::spawn(burst::trim(self.burst.reset(), self.deps.store.clone()));
                }
                Some(done) = self.tasks.join_next(), if !self.tasks.is_empty() => {
                    self.burst.note();
                    if let Ok(uid) = done {
                        self.forget(&uid);
                        if let Some(pod) = self.readd.remove(&uid) {
                            self.spawn(uid, pod, false);
                        }
                    }
                }
            }
        }
        self.stop_workers().await;
    }

    /// Ends every worker without waiting for the pods' stops under way: a grace period
    /// may be a year long, and pods outlive the agent (each container's shim lives on).
    /// A pod's stop deadline is in the store, and the next agent resumes its countdown.
    async fn stop_workers(&mut self) {
        for h in self.workers.values().filter(|h| h.terminating) {
            h.abort.abort();
        }
        // Dropping the senders ends the idle workers; containers are left running.
        self.workers.clear();
        let tasks = &mut self.tasks;
        let all_done = async { while tasks.join_next().await.is_some() {} };
        if tokio::time::timeout(STOP_WAIT, all_done).await.is_err() {
            log::info!(
                "{} pod worker(s) busy stopping containers or running hooks: \
                 left to the next agent",
                self.tasks.len()
            );
            self.tasks.abort_all();
            while self.tasks.join_next().await.is_some() {}
        }
    }

    async fn apply(&mut self, change: PodChange) {
        match change {
            PodChange::Add(pod) | PodChange::Update(pod) => {
                let Some(uid) = pod.metadata.uid.clone() else {
                    log::error!("pod without a UID ignored");
                    return;
                };
                let deleted = pod.metadata.deletion_timestamp.is_some();
                // `insert` is false when the deletion was seen before.
                let seen = deleted && !self.finished.insert(uid.clone());
                if let Some(h) = self.workers.get(&uid) {
                    if h.terminating {
                        // Started (with its references) once the stopping worker is done.
                        self.readd.insert(uid, *pod);
                    } else {
                        self.references.insert(uid.clone(), references(&pod));
                        let _ = h.tx.send(WorkerMsg::Update(pod)).await;
                    }
                } else if seen {
                    // Stopped and reported already; waiting for the API to drop it.
                } else {
                    self.spawn(uid, *pod, false);
                }
            }
            PodChange::Remove(uid) => {
                self.finished.remove(&uid);
                self.readd.remove(&uid);
                if let Some(h) = self.workers.get_mut(&uid) {
                    h.terminating = true;
                    let _ = h.tx.send(WorkerMsg::Terminate).await;
                }
            }
        }
    }

    fn spawn(&mut self, uid: String, pod: Pod, terminate_first: bool) {
        self.references.insert(uid.clone(), references(&pod));
        let (tx, rx) = mpsc::channel(WORKER_QUEUE);
        let rejected = if terminate_first {
            None
        } else {
            self.admit(&uid, &pod)
        };
        let mut worker = Box::new(Worker::new(
            self.deps.clone(),
            pod,
            self.registered_tx.clone(),
        ));
        worker.terminate_first = terminate_first;
        worker.rejected = rejected;
        let done = uid.clone();
        let abort = self.tasks.spawn(async move {
            worker.run(rx).await;
            done
        });
        self.workers.insert(
            uid,
            Handle {
                tx,
                terminating: terminate_first,
                abort,
            },
        );
    }

    /// The loop's tables by pod keep the room the burst's pods took (a hash table never
    /// shrinks by itself), made late and so high in the heap, where it holds pages that
    /// the trim could otherwise return: each goes back to the size of what it holds.
    fn shrink(&mut self) {
        self.workers.shrink_to_fit();
        self.owners.shrink_to_fit();
        self.finished.shrink_to_fit();
        self.readd.shrink_to_fit();
        self.references.shrink_to_fit();
        self.admitted.shrink_to_fit();
    }

    fn forget(&mut self, uid: &str) {
        self.release(uid);
        self.workers.remove(uid);
        self.references.remove(uid);
        self.owners.retain(|_, owner| owner != uid);
    }

    async fn route_exit(&mut self, id: ContainerId) {
        let Some(uid) = self.owners.get(&id) else {
            // The exit can beat the news of the start (a container that exits at
            // once): every worker looks, and the owner finds it.
            log::debug!("exit of container {id} before its owner registered it");
            for h in self.workers.values() {
                let _ = h.tx.try_send(WorkerMsg::Exited(id.clone()));
            }
            return;
        };
        if let Some(h) = self.workers.get(uid) {
            let _ = h.tx.send(WorkerMsg::Exited(id)).await;
        }
    }

    async fn broadcast_resync(&mut self) {
        for h in self.workers.values() {
            // A full mailbox already holds a message that will make the worker sync.
            let _ = h.tx.try_send(WorkerMsg::Resync);
        }
    }

    /// Wakes the workers whose pod references `key`.
    fn resync_referencing(&self, key: &ObjectKey) {
        let wanted = (key.namespace.clone(), key.name.clone());
        for (uid, refs) in &self.references {
            let uses = match key.kind {
                ObjectKind::ConfigMap => refs.config_maps.contains(&wanted),
                ObjectKind::Secret => refs.secrets.contains(&wanted),
            };
            if !uses {
                continue;
            }
            if let Some(h) = self.workers.get(uid) {
                log::debug!("{key} changed: resyncing pod {uid}");
                // A full mailbox already holds a message that will make the worker sync.
                let _ = h.tx.try_send(WorkerMsg::Resync);
            }
        }
    }

    /// Pods the store says run here but no source wants any more (removed while the
    /// agent was down) are stopped; containers that belong to no pod are removed.
    async fn stop_orphans(&mut self, desired: &HashMap<String, Vec<String>>) {
        let states = match self.deps.podstates.tree().entries() {
            Ok(s) => s,
            Err(e) => {
                log::error!("read pod states: {e}");
                return;
            }
        };
        for (uid, state) in &states {
            if !desired.contains_key(uid) {
                log::info!("pod {uid} is no longer wanted; stopping it");
                self.spawn(uid.clone(), state.pod.clone(), true);
            }
        }
        let mut known: HashSet<ContainerId> = HashSet::new();
        match self.deps.containers.entries() {
            Ok(recs) => {
                for (key, rec) in recs {
                    let uid = key.split('/').next().unwrap_or("");
                    if let Some(cur) = &rec.current {
                        known.insert(cur.id.clone());
                    }
                    // A container being created when the agent died has the next id.
                    known.insert(ContainerId::derive(uid, &rec.name, rec.restart_count));
                    known.insert(ContainerId::derive(uid, &rec.name, rec.restart_count + 1));
                }
            }
            Err(e) => {
                log::error!("read container records: {e}; keeping every container");
                return;
            }
        }
        for (uid, names) in desired {
            for name in names {
                known.insert(ContainerId::derive(uid, name, 0));
            }
        }
        let rt = self.deps.runtime.clone();
        let result = tokio::task::spawn_blocking(move || -> Vec<ContainerId> {
            let mut removed = Vec::new();
            let Ok(ids) = rt.list() else { return removed };
            for id in ids {
                if known.contains(&id) {
                    continue;
                }
                if let Ok(ContainerState::Running { .. }) = rt.state(&id) {
                    let _ = rt.kill(&id, nix::sys::signal::Signal::SIGKILL as i32);
                    let deadline = std::time::Instant::now() + Duration::from_secs(10);
                    while std::time::Instant::now() < deadline {
                        match rt.state(&id) {
                            Ok(ContainerState::Running { .. }) | Ok(ContainerState::Created) => {
                                std::thread::sleep(Duration::from_millis(50))
                            }
                            _ => break,
                        }
                    }
                }
                if rt.remove(&id).is_ok() {
                    removed.push(id);
                }
            }
            removed
        })
        .await;
        if let Ok(removed) = result {
            for id in removed {
                log::info!("removed container {id}, which belongs to no pod");
            }
        }
        // Then what pods no source or record knows left: namespaces, CNI leases,
        // volumes, cgroups.
        let known: HashSet<String> = desired
            .keys()
            .cloned()
            .chain(states.iter().map(|(uid, _)| uid.clone()))
            .collect();
        let deps = self.deps.clone();
        let _ = tokio::task::spawn_blocking(move || {
            deps.sandboxes.remove_orphans(&known);
            // And their service-account tokens.
            if let Some(tokens) = &deps.tokens {
                if let Err(e) = tokens.retain(|uid| known.contains(uid)) {
                    log::warn!("drop the service-account tokens of removed pods: {e}");
                }
            }
        })
        .await;
    }
}

/// The next message on `rx`, or never when there is no channel (or it closed).
async fn next_change<T>(rx: &mut Option<mpsc::Receiver<T>>) -> Option<T> {
    match rx {
        Some(r) => match r.recv().await {
            Some(key) => Some(key),
            None => {
                *rx = None;
                std::future::pending().await
            }
        },
        None => std::future::pending().await,
    }
}
