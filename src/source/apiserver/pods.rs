//! The api source's set of pods: what the cluster last said about this node's pods,
//! normalised so that only what the sync loop acts on can change it.

use std::collections::{BTreeMap, HashMap};

use k8s_openapi::api::core::v1::{Pod, PodCondition, PodStatus};

use crate::pod::annotations::{CONFIG_SOURCE, SOURCE_API};
use crate::source::static_pod::set_seen;
use crate::time::Timestamp;

/// The pods this source wants on the node, by UID, and whether the set changed since
/// the last snapshot was taken.
#[derive(Default)]
pub(super) struct PodSet {
    pods: BTreeMap<String, Pod>,
    /// When each pod was first seen, so `config.seen` stays put across events.
    first_seen: HashMap<String, Timestamp>,
    dirty: bool,
    /// Whether a LIST has been taken in: until then nothing is sent, so the pods the
    /// store holds from before a restart stay as they are.
    listed: bool,
}

impl PodSet {
    /// Takes in a complete, consistent LIST: exactly these pods, nothing else.
    pub(super) fn replace(&mut self, items: Vec<Pod>) {
        let mut new = BTreeMap::new();
        for pod in items {
            let Some(uid) = uid(&pod) else {
                log::warn!("api pod source: pod {} has no uid; ignored", name(&pod));
                continue;
            };
            let pod = self.normalise(&uid, pod);
            new.insert(uid, pod);
        }
        self.first_seen.retain(|uid, _| new.contains_key(uid));
        if !self.listed || new != self.pods {
            self.dirty = true;
        }
        self.pods = new;
        self.listed = true;
    }

    /// Takes in the pods the store kept from before a restart (already normalised) as
    /// if listed, so the source can resume watching where they were, and sends them
    /// once so everyone downstream knows the set.
    pub(super) fn seed(&mut self, pods: Vec<Pod>) {
        for pod in pods {
            let Some(uid) = uid(&pod) else { continue };
            if let Some(seen) = pod
                .metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get(crate::pod::annotations::CONFIG_SEEN))
                .and_then(|s| s.parse::<Timestamp>().ok())
            {
                self.first_seen.insert(uid.clone(), seen);
            }
            self.pods.insert(uid, pod);
        }
        self.listed = true;
        self.dirty = true;
    }

    /// How many pods the set holds.
    pub(super) fn len(&self) -> usize {
        self.pods.len()
    }

    /// Whether a LIST has been taken in.
    pub(super) fn is_listed(&self) -> bool {
        self.listed
    }

    /// ADDED or MODIFIED: the pod as it is now. A pod the cluster considers finished
    /// (Succeeded or Failed, phases it never leaves) stays, with that phase, until it
    /// is deleted: its logs are read until then, and it is never started again.
    pub(super) fn upsert(&mut self, pod: Pod) {
        let Some(uid) = uid(&pod) else {
            log::warn!("api pod source: pod {} has no uid; ignored", name(&pod));
            return;
        };
        let pod = self.normalise(&uid, pod);
        if self.pods.get(&uid) != Some(&pod) {
            self.pods.insert(uid, pod);
            self.dirty = true;
        }
    }

    /// DELETED: the pod is gone from the cluster.
    pub(super) fn remove(&mut self, pod: &Pod) {
        if let Some(uid) = uid(pod) {
            self.forget(&uid);
        }
    }

    /// The whole set, when it changed since the last call and a LIST has been taken in.
    pub(super) fn take_snapshot(&mut self) -> Option<Vec<Pod>> {
        if !self.dirty || !self.listed {
            return None;
        }
        self.dirty = false;
        Some(self.pods.values().cloned().collect())
    }

    pub(super) fn is_dirty(&self) -> bool {
        self.dirty && self.listed
    }

    fn forget(&mut self, uid: &str) {
        self.first_seen.remove(uid);
        if self.pods.remove(uid).is_some() {
            self.dirty = true;
        }
    }

    fn normalise(&mut self, uid: &str, pod: Pod) -> Pod {
        let seen = *self
            .first_seen
            .entry(uid.to_string())
            .or_insert_with(crate::time::now);
        let mut pod = normalise(pod);
        set_seen(&mut pod, seen);
        pod
    }
}

/// The pod as the mux keeps it: without what changes on every status update
/// (`status`, `managedFields`, `resourceVersion`), and marked as coming from the
/// apiserver, as the kubelet marks it. UID, generation, deletion, labels, annotations,
/// owners and spec are kept, and of the status a terminal phase (Succeeded or Failed),
/// which never changes again and tells the sync loop the pod is finished, and the
/// conditions its readiness gates name, which others set and its Ready condition
/// waits for (the kubelet reconciles a pod whose gates changed).
pub fn normalise(mut pod: Pod) -> Pod {
    let phase = terminal_phase(&pod).map(str::to_owned);
    let gates = gate_conditions(&pod);
    pod.status = (phase.is_some() || !gates.is_empty()).then(|| PodStatus {
        phase,
        conditions: (!gates.is_empty()).then_some(gates),
        ..PodStatus::default()
    });
    let meta = &mut pod.metadata;
    meta.managed_fields = None;
    meta.resource_version = None;
    meta.annotations
        .get_or_insert_with(BTreeMap::new)
        .insert(CONFIG_SOURCE.into(), SOURCE_API.into());
    pod
}

/// The conditions of the pod's status that its `spec.readinessGates` name.
fn gate_conditions(pod: &Pod) -> Vec<PodCondition> {
    let gates = pod.spec.as_ref().and_then(|s| s.readiness_gates.as_deref());
    let Some(gates) = gates.filter(|g| !g.is_empty()) else {
        return Vec::new();
    };
    pod.status
        .as_ref()
        .and_then(|s| s.conditions.as_deref())
        .unwrap_or_default()
        .iter()
        .filter(|c| gates.iter().any(|g| g.condition_type == c.type_))
        .cloned()
        .collect()
}

/// `Succeeded` or `Failed`, when the cluster records the pod as finished.
fn terminal_phase(pod: &Pod) -> Option<&str> {
    pod.status
        .as_ref()
        .and_then(|s| s.phase.as_deref())
        .filter(|p| *p == "Succeeded" || *p == "Failed")
}

fn uid(pod: &Pod) -> Option<String> {
    pod.metadata.uid.clone().filter(|u| !u.is_empty())
}

fn name(pod: &Pod) -> String {
    format!(
        "{}/{}",
        pod.metadata.namespace.as_deref().unwrap_or("default"),
        pod.metadata.name.as_deref().unwrap_or("<unnamed>")
    )
}
