//! The seam between the sync loop and the uplink: pod workers hand over statuses and
//! events without waiting; the uplink's threads send them when the link is up.
//!
//! Bounded by the number of pods, never by the length of an outage: one pending status
//! per pod (the newest replaces an unsent one) and a fixed ring of events (the oldest
//! unsent event makes room).

use std::collections::{BTreeMap, VecDeque};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::Duration;

use k8s_openapi::api::core::v1::{Pod, PodStatus};

use crate::time::{self, Timestamp};

/// How many unsent events are kept; older ones are dropped first.
pub const EVENT_RING: usize = 256;

/// A pod as the uplink needs to name it.
#[derive(Debug, Clone, PartialEq, Eq)]
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
#[derive(Debug, Clone)]
pub struct StatusReport {
    /// The pod as the agent runs it (a static pod's spec makes its mirror pod).
    pub pod: Pod,
    pub status: PodStatus,
    /// The pod was deleted in the cluster and has stopped: after this status, delete
    /// the API object for good (grace 0, UID precondition).
    pub finished: bool,
}

/// `Normal` or `Warning`, as the Event API has them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
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
#[derive(Debug, Clone, PartialEq)]
pub struct EventReport {
    pub pod: PodRef,
    /// The container the event is about (`fieldPath: spec.containers{name}`).
    pub container: Option<String>,
    pub type_: EventType,
    pub reason: &'static str,
    pub message: String,
    pub at: Timestamp,
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
    fn is_empty(&self) -> bool {
        self.statuses.is_empty() && self.events.is_empty() && self.removed_static.is_empty()
    }
}

struct Shared {
    pending: Mutex<Pending>,
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

impl Reporter {
    /// A reporter that drops everything: no kubeconfig, nobody to tell.
    pub fn standalone() -> Reporter {
        Reporter { shared: None }
    }

    /// A reporter and the outbox the uplink drains.
    pub fn connected() -> (Reporter, Outbox) {
        let shared = Arc::new(Shared {
            pending: Mutex::new(Pending::default()),
            wake: Condvar::new(),
        });
        (
            Reporter {
                shared: Some(shared.clone()),
            },
            Outbox { shared },
        )
    }

    pub fn is_connected(&self) -> bool {
        self.shared.is_some()
    }

    fn with(&self, f: impl FnOnce(&mut Pending)) {
        let Some(shared) = &self.shared else { return };
        f(&mut lock(&shared.pending));
        shared.wake.notify_all();
    }

    /// The pod's status changed; `finished` after a pod deleted in the cluster stopped.
    pub fn status(&self, pod: &Pod, status: &PodStatus, finished: bool) {
        let Some(uid) = pod.metadata.uid.clone() else {
            return;
        };
        self.with(|p| {
            // A finished pod stays finished: a later status must not undo the delete.
            let finished = finished || p.statuses.get(&uid).is_some_and(|r| r.finished);
            p.statuses.insert(
                uid,
                StatusReport {
                    pod: pod.clone(),
                    status: status.clone(),
                    finished,
                },
            );
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
        let report = EventReport {
            pod: PodRef::of(pod),
            container: container.map(str::to_string),
            type_,
            reason,
            message,
            at: time::now(),
        };
        self.with(|p| {
            if p.events.len() >= EVENT_RING {
                p.events.pop_front();
                p.events_dropped += 1;
            }
            p.events.push_back(report);
        });
    }

    /// The pod is gone from this node: its unsent status no longer matters, and a
    /// static pod's mirror pod is to be deleted.
    pub fn removed(&self, pod: &Pod, is_static: bool) {
        let r = PodRef::of(pod);
        self.with(|p| {
            if !p.statuses.get(&r.uid).is_some_and(|s| s.finished) {
                p.statuses.remove(&r.uid);
            }
            if is_static {
                p.removed_static.push(r);
            }
        });
    }
}

impl Outbox {
    /// Waits up to `timeout` for something to send and takes all of it.
    pub fn take(&self, timeout: Duration) -> Pending {
        let mut pending = lock(&self.shared.pending);
        if pending.is_empty() {
            pending = match self.shared.wake.wait_timeout(pending, timeout) {
                Ok((g, _)) => g,
                Err(poisoned) => poisoned.into_inner().0,
            };
        }
        let dropped = pending.events_dropped;
        let taken = std::mem::take(&mut *pending);
        pending.events_dropped = dropped;
        taken
    }

    /// Puts back a status that could not be sent, unless a newer one arrived meanwhile.
    pub fn retry_status(&self, uid: String, report: StatusReport) {
        let mut pending = lock(&self.shared.pending);
        pending.statuses.entry(uid).or_insert(report);
    }

    /// Puts back events that could not be sent, ahead of newer ones, within the ring.
    pub fn retry_events(&self, events: Vec<EventReport>) {
        let mut pending = lock(&self.shared.pending);
        for e in events.into_iter().rev() {
            if pending.events.len() >= EVENT_RING {
                pending.events_dropped += 1;
                continue;
            }
            pending.events.push_front(e);
        }
    }

    pub fn retry_removed(&self, removed: Vec<PodRef>) {
        lock(&self.shared.pending).removed_static.extend(removed);
    }

    /// How many statuses and events wait.
    pub fn depth(&self) -> (usize, usize) {
        let p = lock(&self.shared.pending);
        (p.statuses.len(), p.events.len())
    }
}

fn lock(m: &Mutex<Pending>) -> MutexGuard<'_, Pending> {
    // A panic elsewhere while holding the lock leaves valid data: keep using it.
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    fn pod(uid: &str) -> Pod {
        Pod {
            metadata: ObjectMeta {
                name: Some(format!("p-{uid}")),
                namespace: Some("ns".into()),
                uid: Some(uid.into()),
                ..ObjectMeta::default()
            },
            ..Pod::default()
        }
    }

    fn status(phase: &str) -> PodStatus {
        PodStatus {
            phase: Some(phase.into()),
            ..PodStatus::default()
        }
    }

    #[test]
    fn newest_status_wins_and_finished_sticks() {
        let (r, out) = Reporter::connected();
        r.status(&pod("a"), &status("Pending"), false);
        r.status(&pod("a"), &status("Running"), false);
        r.status(&pod("b"), &status("Running"), true);
        r.status(&pod("b"), &status("Failed"), false);
        let got = out.take(Duration::ZERO);
        assert_eq!(got.statuses.len(), 2);
        assert_eq!(got.statuses["a"].status.phase.as_deref(), Some("Running"));
        assert_eq!(got.statuses["b"].status.phase.as_deref(), Some("Failed"));
        assert!(got.statuses["b"].finished);
        assert!(out.take(Duration::ZERO).statuses.is_empty());
    }

    #[test]
    fn a_retried_status_does_not_replace_a_newer_one() {
        let (r, out) = Reporter::connected();
        r.status(&pod("a"), &status("Pending"), false);
        let mut got = out.take(Duration::ZERO);
        r.status(&pod("a"), &status("Running"), false);
        let old = got.statuses.remove("a").expect("a");
        out.retry_status("a".into(), old);
        let got = out.take(Duration::ZERO);
        assert_eq!(got.statuses["a"].status.phase.as_deref(), Some("Running"));
    }

    #[test]
    fn events_are_a_bounded_ring() {
        let (r, out) = Reporter::connected();
        for n in 0..EVENT_RING + 10 {
            r.event(
                &pod("a"),
                None,
                EventType::Normal,
                "Started",
                format!("{n}"),
            );
        }
        let got = out.take(Duration::ZERO);
        assert_eq!(got.events.len(), EVENT_RING);
        assert_eq!(got.events_dropped, 10);
        assert_eq!(got.events.front().map(|e| e.message.as_str()), Some("10"));
        out.retry_events(got.events.into_iter().collect());
        r.event(&pod("a"), None, EventType::Normal, "Started", "new".into());
        let got = out.take(Duration::ZERO);
        assert_eq!(got.events.len(), EVENT_RING);
        assert_eq!(got.events_dropped, 11);
        assert_eq!(got.events.back().map(|e| e.message.as_str()), Some("new"));
    }

    #[test]
    fn removed_drops_unsent_status_but_not_a_final_one() {
        let (r, out) = Reporter::connected();
        r.status(&pod("a"), &status("Running"), false);
        r.status(&pod("b"), &status("Failed"), true);
        r.removed(&pod("a"), true);
        r.removed(&pod("b"), false);
        let got = out.take(Duration::ZERO);
        assert!(!got.statuses.contains_key("a"));
        assert!(got.statuses.contains_key("b"));
        assert_eq!(got.removed_static.len(), 1);
        assert_eq!(got.removed_static[0].uid, "a");
    }

    #[test]
    fn standalone_keeps_nothing() {
        let r = Reporter::standalone();
        r.status(&pod("a"), &status("Running"), false);
        r.event(&pod("a"), None, EventType::Warning, "BackOff", "x".into());
        assert!(!r.is_connected());
    }
}
