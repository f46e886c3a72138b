//! The pod side of the uplink, on its own thread: drains the outbox (pod statuses, final
//! deletes, events, mirror pods) whenever the apiserver answers. When a call fails for
//! a reason retrying can cure it marks the [`Link`] down and waits for the node
//! controller's probe to bring it back to `NodeReady` (Lease and node status first)
//! rather than retrying on its own; the first pass after that drains the outbox and
//! moves the link to `Drained`. Nothing here blocks a pod worker.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Pod;
use serde_json::Value;

use super::events::{event_object, SpamFilter};
use super::mirror::{self, Mirror};
use super::pod_status::{self, delete_for_good, pod_path, send_status, Sent};
use super::report::{EventReport, Outbox, PodRef, StatusReport};
use crate::backoff::Backoff;
use crate::kube::client::Client;
use crate::kube::error::ApiError;
use crate::kube::link::{Link, Stage};
use crate::pod::annotations;

/// How long the thread waits for work when there is none.
const IDLE_WAIT: Duration = Duration::from_secs(1);

/// Retry pacing while the apiserver does not answer.
pub const RETRY: Backoff = Backoff {
    initial: Duration::from_millis(800),
    max: Duration::from_secs(30),
};

/// The mirror pods the cluster has for this node, as the pod watch last showed them.
#[derive(Debug, Default)]
pub struct MirrorSet {
    /// False until the pod source's first successful LIST.
    pub synced: bool,
    /// By `namespace/name`.
    pub pods: BTreeMap<String, Mirror>,
    /// Bumped on every change, so the uplink knows to look again.
    pub generation: u64,
}

pub type SharedMirrors = Arc<Mutex<MirrorSet>>;

/// What the api source's pods pass through on their way to the mux, on the source's
/// thread: the cluster's mirror pods are kept in `mirrors` for the mirror check and taken
/// out (they are not the node's to run), and the rest tell the object manager which
/// ConfigMaps and Secrets to follow. Dropping it (the source ended) stops the manager.
pub fn api_pods_tap(
    mirrors: SharedMirrors,
    pod_set: super::objects::PodSetSender,
) -> impl Fn(&mut Vec<Pod>) + Send + Sync + 'static {
    move |pods: &mut Vec<Pod>| {
        update_mirrors(&mirrors, pods);
        pods.retain(|p| !crate::pod::is_mirror(p));
        pod_set.set_pods(pods.iter());
    }
}

/// Replaces the mirror set with the mirror pods among `pods` (all the pods the cluster
/// has bound to this node).
pub fn update_mirrors(mirrors: &SharedMirrors, pods: &[Pod]) {
    let mut set: BTreeMap<String, Mirror> = BTreeMap::new();
    for p in pods {
        if let Some(m) = Mirror::of(p) {
            set.insert(key_of(&PodRef::of(p)), m);
        }
    }
    let mut m = lock(mirrors);
    if !m.synced || m.pods != set {
        m.pods = set;
        m.synced = true;
        m.generation += 1;
    }
}

fn key_of(r: &PodRef) -> String {
    format!("{}/{}", r.namespace, r.name)
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Shared with the node side: the Node's UID once registered (mirror pods need it).
pub type NodeUid = Arc<Mutex<Option<String>>>;

pub struct PodUplink {
    pub client: Client,
    pub outbox: Outbox,
    pub node_name: String,
    pub node_uid: NodeUid,
    pub mirrors: SharedMirrors,
    pub stop: Arc<AtomicBool>,
    pub link: Link,
}

/// What one pass achieved: whether the apiserver could not be reached.
#[derive(PartialEq, Eq)]
enum Pass {
    Up,
    Down,
}

/// What one pass is done with (sent, or refused for good): its store records go.
#[derive(Default)]
struct Done {
    statuses: Vec<String>,
    events: Vec<u64>,
    removed: Vec<String>,
    sent_any: bool,
}

struct State {
    /// Static pods and their last status, by static pod UID: re-sent to a mirror pod
    /// that had to be made again.
    statics: HashMap<String, StatusReport>,
    filter: SpamFilter,
    mirror_generation: u64,
    /// The Node UID the mirror pods were last checked against.
    mirror_node_uid: Option<String>,
    down_logged: bool,
}

impl PodUplink {
    pub fn spawn(self) -> std::io::Result<std::thread::JoinHandle<()>> {
        std::thread::Builder::new()
            .name("uplink-pods".into())
            .spawn(move || self.run())
    }

    fn run(self) {
        let mut st = State {
            statics: HashMap::new(),
            filter: SpamFilter::default(),
            mirror_generation: 0,
            mirror_node_uid: None,
            down_logged: false,
        };
        let stop = || self.stop.load(Ordering::Relaxed);
        while !stop() {
            // Only the node controller probes a dead link; wait for it to come back.
            if !self.link.wait_until(Stage::NodeReady, &stop) {
                return;
            }
            let stage = self.link.stage();
            // Reconnecting: drain what is there now, without waiting for more.
            let wait = if stage == Stage::NodeReady {
                Duration::ZERO
            } else {
                IDLE_WAIT
            };
            let batch = self.outbox.take(wait);
            let pass = self.pass(&mut st, batch);
            if pass == Pass::Down {
                self.link.report_down(crate::time::now());
                if !st.down_logged {
                    log::warn!(
                        "apiserver {} unreachable; pod statuses and events wait in the outbox",
                        self.client.server()
                    );
                    st.down_logged = true;
                }
            } else {
                if st.down_logged {
                    log::info!("apiserver {} reachable again", self.client.server());
                    st.down_logged = false;
                }
                if stage == Stage::NodeReady {
                    // Everything sent, or refused for reasons a retry cannot cure.
                    self.link.drained();
                }
            }
        }
    }

    /// One pass over what waits: statuses, removed static pods' mirrors, events, then
    /// the mirror check. Stops sending at the first failure a retry can cure; what was
    /// not sent goes back to the outbox.
    fn pass(&self, st: &mut State, batch: super::report::Pending) -> Pass {
        let super::report::Pending {
            statuses,
            events,
            removed_static,
            ..
        } = batch;
        let mut done = Done::default();
        let mut down = self.send_statuses(st, statuses, &mut done);
        down = self.delete_mirrors(st, removed_static, down, &mut done);
        down = self.send_events(st, events, down, &mut done);
        self.outbox
            .sent(&done.statuses, &done.events, &done.removed);
        if done.sent_any {
            self.link.synced(crate::time::now());
        }
        if !down {
            down = self.check_mirrors(st);
        }
        if down {
            Pass::Down
        } else {
            Pass::Up
        }
    }

    /// The pods' statuses; true once the link is down.
    fn send_statuses(
        &self,
        st: &mut State,
        statuses: BTreeMap<String, StatusReport>,
        done: &mut Done,
    ) -> bool {
        let mut down = false;
        for (uid, report) in statuses {
            if down {
                self.outbox.retry_status(uid, report);
                continue;
            }
            let result = if crate::pod::is_static_pod(&report.pod) {
                st.statics.insert(uid.clone(), report.clone());
                self.mirror_status(&report)
            } else {
                self.cluster_status(&report)
            };
            match result {
                Ok(()) => {
                    done.sent_any = true;
                    done.statuses.push(uid);
                }
                Err(e) if e.is_transient() => {
                    down = true;
                    self.outbox.retry_status(uid, report);
                }
                Err(e) => {
                    log::warn!("pod {}: status not reported: {e}", name(&report.pod));
                    done.statuses.push(uid);
                }
            }
        }
        down
    }

    /// The mirror pods of static pods that are gone; true once the link is down.
    fn delete_mirrors(
        &self,
        st: &mut State,
        removed_static: Vec<PodRef>,
        mut down: bool,
        done: &mut Done,
    ) -> bool {
        let mut removed_left = Vec::new();
        for r in removed_static {
            st.statics.remove(&r.uid);
            if down {
                removed_left.push(r);
                continue;
            }
            match self.delete_mirror(&r) {
                Ok(()) => done.removed.push(r.uid),
                Err(e) if e.is_transient() => {
                    down = true;
                    removed_left.push(r);
                }
                Err(e) => {
                    log::warn!("mirror pod {}/{}: {e}", r.namespace, r.name);
                    done.removed.push(r.uid);
                }
            }
        }
        if !removed_left.is_empty() {
            self.outbox.retry_removed(removed_left);
        }
        down
    }

    /// The events the spam filter lets through; true once the link is down.
    fn send_events(
        &self,
        st: &mut State,
        events: VecDeque<EventReport>,
        mut down: bool,
        done: &mut Done,
    ) -> bool {
        let mut unsent: Vec<EventReport> = Vec::new();
        for e in events {
            if down {
                unsent.push(e);
                continue;
            }
            if !st.filter.admit(&e, Instant::now()) {
                log::debug!(
                    "event {} for pod {} not sent (spam filter)",
                    e.reason,
                    e.pod.name
                );
                done.events.push(e.id);
                continue;
            }
            let path = format!(
                "/api/v1/namespaces/{}/events",
                crate::kube::escape(&e.pod.namespace)
            );
            match self
                .client
                .post::<_, Value>(&path, &event_object(&e, &self.node_name))
            {
                Ok(_) => done.events.push(e.id),
                Err(err) if err.is_transient() => {
                    down = true;
                    unsent.push(e);
                }
                Err(err) => {
                    // Refused for good (a namespace being deleted, say): said, not retried.
                    log::warn!(
                        "event {} for pod {}/{} refused: {err}",
                        e.reason,
                        e.pod.namespace,
                        e.pod.name
                    );
                    done.events.push(e.id);
                }
            }
        }
        if !unsent.is_empty() {
            self.outbox.retry_events(unsent);
        }
        down
    }

    /// The kubelet checks a static pod's mirror on each sync; here, whenever the
    /// cluster's mirror pods change (one deleted, even with grace 0) or the Node was
    /// made again under a new UID (its mirror pods are to name it). True once the link
    /// is down.
    fn check_mirrors(&self, st: &mut State) -> bool {
        let generation = lock(&self.mirrors).generation;
        let node_uid = lock(&self.node_uid).clone();
        if generation == st.mirror_generation && node_uid == st.mirror_node_uid {
            return false;
        }
        st.mirror_generation = generation;
        st.mirror_node_uid = node_uid;
        // Only the static pods whose mirror pod is missing or stale: the others have
        // their status already.
        let statics: Vec<StatusReport> = {
            let set = lock(&self.mirrors);
            let uid = st.mirror_node_uid.as_deref();
            st.statics
                .values()
                .filter(|r| {
                    let key = key_of(&PodRef::of(&r.pod));
                    let hash = annotations::static_hash(&r.pod);
                    !set.pods.get(&key).is_some_and(|m| m.is_current(&hash, uid))
                })
                .cloned()
                .collect()
        };
        for report in statics {
            if let Err(e) = self.mirror_status(&report) {
                if e.is_transient() {
                    if let Some(uid) = report.pod.metadata.uid.clone() {
                        self.outbox.retry_status(uid, report);
                    }
                    return true;
                }
                log::warn!("mirror pod for {}: {e}", name(&report.pod));
            }
        }
        false
    }

    /// A pod from the cluster: patch its status; a finished one is then deleted for good.
    fn cluster_status(&self, report: &StatusReport) -> Result<(), ApiError> {
        let r = PodRef::of(&report.pod);
        let sent = send_status(
            &self.client,
            &r.namespace,
            &r.name,
            &r.uid,
            &report.status,
            false,
        )?;
        // Gone already, or replaced by a pod with the same name: nothing to delete.
        if sent == Sent::Gone {
            return Ok(());
        }
        if report.finished {
            delete_for_good(&self.client, &r.namespace, &r.name, &r.uid)?;
            log::info!("pod {}/{}: deleted from the cluster", r.namespace, r.name);
        }
        Ok(())
    }

    /// A static pod: make sure its mirror pod exists and is current, then report the
    /// status on the mirror pod.
    fn mirror_status(&self, report: &StatusReport) -> Result<(), ApiError> {
        let r = PodRef::of(&report.pod);
        let key = key_of(&r);
        let want = annotations::static_hash(&report.pod);
        let node_uid = lock(&self.node_uid).clone();
        let node_uid = node_uid.as_deref();
        let (known, synced) = {
            let m = lock(&self.mirrors);
            (m.pods.get(&key).cloned(), m.synced)
        };
        let current = match known {
            Some(m) if m.is_current(&want, node_uid) => Some(m),
            Some(stale) => {
                self.delete_pod(&r, &stale.uid)?;
                None
            }
            None if !synced => self.get_mirror(&r)?,
            None => None,
        };
        let mirror = match current {
            Some(m) if m.is_current(&want, node_uid) => m,
            Some(stale) => {
                self.delete_pod(&r, &stale.uid)?;
                self.create_mirror(&report.pod, &r)?
            }
            None => self.create_mirror(&report.pod, &r)?,
        };
        // Deleted between create and send (Gone): the watch will show it and we make
        // it again.
        send_status(
            &self.client,
            &r.namespace,
            &r.name,
            &mirror.uid,
            &report.status,
            true,
        )
        .map(|_| ())
    }

    fn get_mirror(&self, r: &PodRef) -> Result<Option<Mirror>, ApiError> {
        match self
            .client
            .get::<Pod>(&pod_path(&r.namespace, &r.name, None))
        {
            // A pod of that name that is not a mirror pod is not ours to replace.
            Ok(p) => Ok(Mirror::of(&p)),
            Err(e) if e.is_not_found() => Ok(None),
            Err(e) => Err(e),
        }
    }

    fn create_mirror(&self, static_pod: &Pod, r: &PodRef) -> Result<Mirror, ApiError> {
        let Some(node_uid) = lock(&self.node_uid).clone() else {
            return Err(ApiError::Transport {
                method: "POST",
                path: pod_path(&r.namespace, "", None),
                message: "the Node is not registered yet".into(),
            });
        };
        let pod = mirror::mirror_pod(static_pod, &self.node_name, &node_uid);
        let path = format!(
            "/api/v1/namespaces/{}/pods",
            crate::kube::escape(&r.namespace)
        );
        let created = match self.client.post::<_, Pod>(&path, &pod) {
            Ok(p) => p,
            Err(e) if e.is_already_exists() => match self.get_mirror(r)? {
                Some(m) if m.is_current(&annotations::static_hash(static_pod), Some(&node_uid)) => {
                    // Known from now on: the watch may not show it (a watch resumed
                    // after a restart shows only what changed since).
                    lock(&self.mirrors).pods.insert(key_of(r), m.clone());
                    return Ok(m);
                }
                Some(m) => {
                    self.delete_pod(r, &m.uid)?;
                    self.client.post::<_, Pod>(&path, &pod)?
                }
                None => {
                    log::warn!(
                            "pod {}/{} exists in the cluster and is not a mirror pod; static pod not mirrored",
                            r.namespace,
                            r.name
                        );
                    return Err(e);
                }
            },
            Err(e) => return Err(e),
        };
        let m = Mirror::of(&created).unwrap_or(Mirror {
            uid: created.metadata.uid.clone().unwrap_or_default(),
            hash: annotations::static_hash(static_pod),
            deleting: false,
            owner: node_uid.clone(),
        });
        log::info!("mirror pod {}/{} created", r.namespace, r.name);
        let mut set = lock(&self.mirrors);
        set.pods.insert(key_of(r), m.clone());
        Ok(m)
    }

    fn delete_mirror(&self, r: &PodRef) -> Result<(), ApiError> {
        let known = lock(&self.mirrors).pods.get(&key_of(r)).cloned();
        let uid = match known {
            Some(m) => m.uid,
            None => match self.get_mirror(r)? {
                Some(m) => m.uid,
                None => return Ok(()),
            },
        };
        self.delete_pod(r, &uid)?;
        lock(&self.mirrors).pods.remove(&key_of(r));
        log::info!("mirror pod {}/{} deleted", r.namespace, r.name);
        Ok(())
    }

    fn delete_pod(&self, r: &PodRef, uid: &str) -> Result<(), ApiError> {
        pod_status::delete_for_good(&self.client, &r.namespace, &r.name, uid)
    }
}

fn name(pod: &Pod) -> String {
    let r = PodRef::of(pod);
    format!("{}/{}", r.namespace, r.name)
}
