//! The seam between the sync loop and the uplink: pod workers hand over statuses and
//! events without waiting; the uplink's threads send them when the link is up.
//!
//! Bounded by the number of pods, never by the length of an outage: one pending status
//! per pod (the newest replaces an unsent one) and a fixed ring of events (the oldest
//! unsent event makes room).
//!
//! What waits survives an agent restart: while the [`Link`] is down, or after a send
//! failed, each pending status, event and removed static pod is also written to the
//! store (trees `outbox_statuses`, `outbox_events`, `outbox_removed`), and deleted
//! once sent. With the link up and the apiserver answering nothing is written, so a
//! healthy agent does not wear its flash with statuses that are gone in milliseconds.
//! The times a status carries are the container records' own: nothing is restamped.

use std::borrow::Cow;
use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::Duration;

use k8s_openapi::api::core::v1::{Pod, PodStatus};
use serde::{Deserialize, Serialize};

use crate::kube::link::Link;
use crate::store::{Batch, Store, StoreError, Tree};
use crate::time::{self, Timestamp};

/// How many unsent events are kept; older ones are dropped first.
pub const EVENT_RING: usize = 256;

/// The store trees the outbox persists to.
pub const STATUS_TREE: &str = "outbox_statuses";
pub const EVENT_TREE: &str = "outbox_events";
pub const REMOVED_TREE: &str = "outbox_removed";

/// A pod as the uplink needs to name it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PodRef {
    pub namespace: String,
    pub name: String,
    pub uid: String,
}

impl PodRef {
    pub fn of(pod: &Pod) -> PodRef {
        PodRef {
            namespace: pod
                .metadata
                .namespace
                .clone()
                .unwrap_or_else(|| "default".into()),
            name: pod.metadata.name.clone().unwrap_or_default(),
            uid: pod.metadata.uid.clone().unwrap_or_default(),
        }
    }
}

/// The newest status of one pod, not yet sent.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct StatusReport {
    /// The pod as the agent runs it (a static pod's spec makes its mirror pod).
    pub pod: Pod,
    pub status: PodStatus,
    /// The pod was deleted in the cluster and has stopped: after this status, delete
    /// the API object for good (grace 0, UID precondition).
    pub finished: bool,
}

/// `Normal` or `Warning`, as the Event API has them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum EventType {
    Normal,
    Warning,
}

impl EventType {
    pub fn as_str(self) -> &'static str {
        match self {
            EventType::Normal => "Normal",
            EventType::Warning => "Warning",
        }
    }
}

/// One event about a pod or one of its containers.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EventReport {
    pub pod: PodRef,
    /// The container the event is about (`fieldPath: spec.containers{name}`).
    pub container: Option<String>,
    pub type_: EventType,
    pub reason: Cow<'static, str>,
    pub message: String,
    pub at: Timestamp,
    /// Its place in the ring, which is also its key in the store.
    #[serde(default)]
    pub id: u64,
}

/// What waits to be sent.
#[derive(Debug, Default)]
pub struct Pending {
    /// By pod UID.
    pub statuses: BTreeMap<String, StatusReport>,
    pub events: VecDeque<EventReport>,
    /// Events dropped from the ring since the agent started.
    pub events_dropped: u64,
    /// Static pods that are gone: their mirror pods are to be deleted.
    pub removed_static: Vec<PodRef>,
}

impl Pending {
    pub fn is_empty(&self) -> bool {
        self.statuses.is_empty() && self.events.is_empty() && self.removed_static.is_empty()
    }
}

/// What waits, as `holdfast status` shows it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Depth {
    pub statuses: usize,
    pub events: usize,
    pub events_dropped: u64,
    pub removed_static: usize,
}

/// The store side: which records are written, so they can be kept current and deleted
/// once sent.
struct Persist {
    store: Store,
    statuses: Tree<StatusReport>,
    events: Tree<EventReport>,
    removed: Tree<PodRef>,
    link: Link,
    stored_statuses: BTreeSet<String>,
    stored_events: BTreeSet<u64>,
    stored_removed: BTreeSet<String>,
}

impl Persist {
    fn apply(&self, batch: Batch, what: &str) {
        if batch.is_empty() {
            return;
        }
        if let Err(e) = self.store.apply(batch) {
            // The report still waits in memory; only a restart before it is sent loses it.
            log::error!("outbox: persist {what}: {e}");
        }
    }
}

struct Queue {
    pending: Pending,
    /// The pods whose statuses were taken to be sent and not yet said sent or put back.
    in_flight: BTreeSet<String>,
    next_id: u64,
    persist: Option<Persist>,
}

struct Shared {
    queue: Mutex<Queue>,
    wake: Condvar,
}

/// The sync side's handle. Cheap to clone; a standalone agent's reporter does nothing.
#[derive(Clone, Default)]
pub struct Reporter {
    shared: Option<Arc<Shared>>,
}

/// The uplink side's handle on the same queue.
#[derive(Clone)]
pub struct Outbox {
    shared: Arc<Shared>,
}

fn event_key(id: u64) -> String {
    // Zero-padded, so the store's key order is the ring's order.
    format!("{id:020}")
}

impl Reporter {
    /// A reporter that drops everything: no kubeconfig, nobody to tell.
    pub fn standalone() -> Reporter {
        Reporter { shared: None }
    }

    /// A reporter and the outbox the uplink drains, kept in memory only.
    pub fn connected() -> (Reporter, Outbox) {
        Reporter::with_queue(Queue {
            pending: Pending::default(),
            in_flight: BTreeSet::new(),
            next_id: 0,
            persist: None,
        })
    }

    /// A reporter and its outbox, loaded with what the store kept from before a
    /// restart, and persisting to it while `link` is down. A record that cannot be
    /// read is logged and left in the store.
    pub fn persistent(store: &Store, link: Link) -> Result<(Reporter, Outbox), StoreError> {
        let statuses: Tree<StatusReport> = store.tree(STATUS_TREE)?;
        let events: Tree<EventReport> = store.tree(EVENT_TREE)?;
        let removed: Tree<PodRef> = store.tree(REMOVED_TREE)?;
        let mut pending = Pending::default();
        let mut persist = Persist {
            store: store.clone(),
            statuses: statuses.clone(),
            events: events.clone(),
            removed: removed.clone(),
            link,
            stored_statuses: BTreeSet::new(),
            stored_events: BTreeSet::new(),
            stored_removed: BTreeSet::new(),
        };
        for key in statuses.keys()? {
            match statuses.get(&key) {
                Ok(Some(r)) => {
                    persist.stored_statuses.insert(key.clone());
                    pending.statuses.insert(key, r);
                }
                Ok(None) => {}
                Err(e) => log::error!("outbox: {e}; left in the store"),
            }
        }
        let mut next_id = 0;
        for key in events.keys()? {
            match events.get(&key) {
                Ok(Some(mut e)) => {
                    // The key is the truth about the id (older records may lack it).
                    if let Ok(id) = key.parse::<u64>() {
                        e.id = id;
                    }
                    next_id = next_id.max(e.id + 1);
                    persist.stored_events.insert(e.id);
                    pending.events.push_back(e);
                }
                Ok(None) => {}
                Err(e) => log::error!("outbox: {e}; left in the store"),
            }
        }
        for key in removed.keys()? {
            match removed.get(&key) {
                Ok(Some(r)) => {
                    persist.stored_removed.insert(key);
                    pending.removed_static.push(r);
                }
                Ok(None) => {}
                Err(e) => log::error!("outbox: {e}; left in the store"),
            }
        }
        let loaded = Depth::of(&pending);
        if loaded.statuses + loaded.events + loaded.removed_static > 0 {
            log::info!(
                "outbox: {} pod status(es), {} event(s) and {} removed static pod(s) kept from before the restart",
                loaded.statuses,
                loaded.events,
                loaded.removed_static
            );
        }
        Ok(Reporter::with_queue(Queue {
            pending,
            in_flight: BTreeSet::new(),
            next_id,
            persist: Some(persist),
        }))
    }

    fn with_queue(queue: Queue) -> (Reporter, Outbox) {
        let shared = Arc::new(Shared {
            queue: Mutex::new(queue),
            wake: Condvar::new(),
        });
        (
            Reporter {
                shared: Some(shared.clone()),
            },
            Outbox { shared },
        )
    }

    /// How many of these pods' statuses are still to reach the apiserver (waiting, or
    /// taken and neither sent nor put back yet).
    pub fn statuses_unsent(&self, uids: &[String]) -> usize {
        let Some(shared) = &self.shared else { return 0 };
        let q = lock(&shared.queue);
        uids.iter()
            .filter(|u| q.pending.statuses.contains_key(*u) || q.in_flight.contains(*u))
            .count()
    }

    pub fn is_connected(&self) -> bool {
        self.shared.is_some()
    }

    fn with(&self, f: impl FnOnce(&mut Queue)) {
        let Some(shared) = &self.shared else { return };
        f(&mut lock(&shared.queue));
        shared.wake.notify_all();
    }

    /// The pod's status changed; `finished` after a pod deleted in the cluster stopped.
    pub fn status(&self, pod: &Pod, status: &PodStatus, finished: bool) {
        let Some(uid) = pod.metadata.uid.clone() else {
            return;
        };
        self.with(|q| {
            let p = &mut q.pending;
            // A finished pod stays finished: a later status must not undo the delete.
            let finished = finished || p.statuses.get(&uid).is_some_and(|r| r.finished);
            let report = StatusReport {
                pod: pod.clone(),
                status: status.clone(),
                finished,
            };
            if let Some(ps) = q.persist.as_mut() {
                if ps.link.is_down() || ps.stored_statuses.contains(&uid) {
                    persist_status(ps, &uid, &report);
                }
            }
            q.pending.statuses.insert(uid, report);
        });
    }

    /// Records an event for the pod (and container, if any).
    pub fn event(
        &self,
        pod: &Pod,
        container: Option<&str>,
        type_: EventType,
        reason: &'static str,
        message: String,
    ) {
        let mut report = EventReport {
            pod: PodRef::of(pod),
            container: container.map(str::to_string),
            type_,
            reason: Cow::Borrowed(reason),
            message,
            at: time::now(),
            id: 0,
        };
        self.with(|q| {
            report.id = q.next_id;
            q.next_id += 1;
            let mut batch = Batch::new();
            if q.pending.events.len() >= EVENT_RING {
                if let Some(old) = q.pending.events.pop_front() {
                    q.pending.events_dropped += 1;
                    if let Some(ps) = q.persist.as_mut() {
                        if ps.stored_events.remove(&old.id) {
                            batch.remove(&ps.events, &event_key(old.id));
                        }
                    }
                }
            }
            if let Some(ps) = q.persist.as_mut() {
                if ps.link.is_down() {
                    match batch.put(&ps.events, &event_key(report.id), &report) {
                        Ok(()) => {
                            ps.stored_events.insert(report.id);
                        }
                        Err(e) => log::error!("outbox: {e}"),
                    }
                }
                ps.apply(batch, "an event");
            }
            q.pending.events.push_back(report);
        });
    }

    /// The pod is gone from this node: its unsent status no longer matters, and a
    /// static pod's mirror pod is to be deleted.
    pub fn removed(&self, pod: &Pod, is_static: bool) {
        let r = PodRef::of(pod);
        self.with(|q| {
            let mut batch = Batch::new();
            if !q.pending.statuses.get(&r.uid).is_some_and(|s| s.finished) {
                q.pending.statuses.remove(&r.uid);
                if let Some(ps) = q.persist.as_mut() {
                    if ps.stored_statuses.remove(&r.uid) {
                        batch.remove(&ps.statuses, &r.uid);
                    }
                }
            }
            if is_static {
                if let Some(ps) = q.persist.as_mut() {
                    if ps.link.is_down() {
                        persist_removed(ps, &mut batch, &r);
                    }
                }
                q.pending.removed_static.push(r);
            }
            if let Some(ps) = q.persist.as_ref() {
                ps.apply(batch, "a removed pod");
            }
        });
    }
}

fn persist_status(ps: &mut Persist, uid: &str, report: &StatusReport) {
    let mut batch = Batch::new();
    match batch.put(&ps.statuses, uid, report) {
        Ok(()) => {
            ps.stored_statuses.insert(uid.to_string());
            ps.apply(batch, "a pod status");
        }
        Err(e) => log::error!("outbox: {e}"),
    }
}

fn persist_removed(ps: &mut Persist, batch: &mut Batch, r: &PodRef) {
    match batch.put(&ps.removed, &r.uid, r) {
        Ok(()) => {
            ps.stored_removed.insert(r.uid.clone());
        }
        Err(e) => log::error!("outbox: {e}"),
    }
}

impl Depth {
    fn of(p: &Pending) -> Depth {
        Depth {
            statuses: p.statuses.len(),
            events: p.events.len(),
            events_dropped: p.events_dropped,
            removed_static: p.removed_static.len(),
        }
    }
}

impl Outbox {
    /// Waits up to `timeout` for something to send and takes all of it. What is taken
    /// stays in the store until [`Outbox::sent`] says it went (or a retry puts it back).
    pub fn take(&self, timeout: Duration) -> Pending {
        let mut q = lock(&self.shared.queue);
        if q.pending.is_empty() && !timeout.is_zero() {
            q = match self.shared.wake.wait_timeout(q, timeout) {
                Ok((g, _)) => g,
                Err(poisoned) => poisoned.into_inner().0,
            };
        }
        let dropped = q.pending.events_dropped;
        let taken = std::mem::take(&mut q.pending);
        q.in_flight.extend(taken.statuses.keys().cloned());
        q.pending.events_dropped = dropped;
        taken
    }

    /// Puts back a status that could not be sent, unless a newer one arrived meanwhile;
    /// either way the pod's pending status is now in the store.
    pub fn retry_status(&self, uid: String, report: StatusReport) {
        let mut q = lock(&self.shared.queue);
        let q = &mut *q;
        q.in_flight.remove(&uid);
        let current = q.pending.statuses.entry(uid.clone()).or_insert(report);
        if let Some(ps) = q.persist.as_mut() {
            if !ps.stored_statuses.contains(&uid) {
                persist_status(ps, &uid, current);
            }
        }
    }

    /// Puts back events that could not be sent, ahead of newer ones, within the ring.
    pub fn retry_events(&self, events: Vec<EventReport>) {
        let mut q = lock(&self.shared.queue);
        let q = &mut *q;
        let mut batch = Batch::new();
        for e in events.into_iter().rev() {
            if q.pending.events.len() >= EVENT_RING {
                q.pending.events_dropped += 1;
                if let Some(ps) = q.persist.as_mut() {
                    if ps.stored_events.remove(&e.id) {
                        batch.remove(&ps.events, &event_key(e.id));
                    }
                }
                continue;
            }
            if let Some(ps) = q.persist.as_mut() {
                if !ps.stored_events.contains(&e.id) {
                    match batch.put(&ps.events, &event_key(e.id), &e) {
                        Ok(()) => {
                            ps.stored_events.insert(e.id);
                        }
                        Err(err) => log::error!("outbox: {err}"),
                    }
                }
            }
            q.pending.events.push_front(e);
        }
        if let Some(ps) = q.persist.as_ref() {
            ps.apply(batch, "events");
        }
    }

    pub fn retry_removed(&self, removed: Vec<PodRef>) {
        let mut q = lock(&self.shared.queue);
        let q = &mut *q;
        let mut batch = Batch::new();
        if let Some(ps) = q.persist.as_mut() {
            for r in &removed {
                if !ps.stored_removed.contains(&r.uid) {
                    persist_removed(ps, &mut batch, r);
                }
            }
            ps.apply(batch, "removed pods");
        }
        q.pending.removed_static.extend(removed);
    }

    /// These went out (or were refused for good): their records leave the store,
    /// unless a newer status for the same pod waits (its record is the current one).
    pub fn sent(&self, statuses: &[String], events: &[u64], removed: &[String]) {
        let mut q = lock(&self.shared.queue);
        let q = &mut *q;
        for uid in statuses {
            q.in_flight.remove(uid);
        }
        let Some(ps) = q.persist.as_mut() else { return };
        let mut batch = Batch::new();
        for uid in statuses {
            if !q.pending.statuses.contains_key(uid) && ps.stored_statuses.remove(uid) {
                batch.remove(&ps.statuses, uid);
            }
        }
        for id in events {
            if ps.stored_events.remove(id) {
                batch.remove(&ps.events, &event_key(*id));
            }
        }
        for uid in removed {
            let again = q.pending.removed_static.iter().any(|r| &r.uid == uid);
            if !again && ps.stored_removed.remove(uid) {
                batch.remove(&ps.removed, uid);
            }
        }
        ps.apply(batch, "sent reports");
    }

    /// How many statuses and events wait.
    pub fn depth(&self) -> (usize, usize) {
        let q = lock(&self.shared.queue);
        (q.pending.statuses.len(), q.pending.events.len())
    }

    /// What waits, in full.
    pub fn depth_report(&self) -> Depth {
        Depth::of(&lock(&self.shared.queue).pending)
    }
}

fn lock(m: &Mutex<Queue>) -> MutexGuard<'_, Queue> {
    // A panic elsewhere while holding the lock leaves valid data: keep using it.
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

#[cfg(test)]
#[path = "report_tests.rs"]
mod tests;
