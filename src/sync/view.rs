//! What the rest of the agent reads of the pods the sync loop runs: [`PodStates`], the
//! queries on the store's pod states (list, find one), and [`PodView`], one pod's spec
//! with the status the loop last computed. Readers (the kubelet API, the control
//! socket, the CLI, eviction, image GC through `NodeImages`) see these and never the
//! workers' stored record, so the record may grow without touching them. Reads only:
//! the pod workers alone write the tree.

use k8s_openapi::api::core::v1::{Pod, PodStatus};
use serde::{Deserialize, Serialize};

use super::worker::PodState;
use crate::store::{Store, StoreError, Tree};
use crate::time::Timestamp;

/// The store tree the pod workers keep their pods' states in (key = pod UID).
const TREE: &str = "podstates";

/// One pod as its readers see it: its spec, the status the sync loop last computed for
/// it, and when the agent first took it up. On the control socket it travels as the
/// stored record does, so an agent and a CLI of another version read each other.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct PodView(PodState);

impl PodView {
    /// A pod with `status`, taken up at `start_time`.
    pub fn new(pod: Pod, status: PodStatus, start_time: Timestamp) -> PodView {
        PodView(PodState {
            pod,
            status,
            start_time,
            stop_deadline: None,
        })
    }

    /// The pod as its source gave it (its spec and metadata).
    pub fn pod(&self) -> &Pod {
        &self.0.pod
    }

    /// The status the sync loop last computed.
    pub fn status(&self) -> &PodStatus {
        &self.0.status
    }

    /// When the agent first took the pod up.
    pub fn start_time(&self) -> Timestamp {
        self.0.start_time
    }

    pub fn namespace(&self) -> &str {
        self.0
            .pod
            .metadata
            .namespace
            .as_deref()
            .unwrap_or("default")
    }

    pub fn name(&self) -> &str {
        self.0.pod.metadata.name.as_deref().unwrap_or("")
    }

    pub fn uid(&self) -> &str {
        self.0.pod.metadata.uid.as_deref().unwrap_or("")
    }

    /// Its phase is Succeeded or Failed: nothing of it runs again.
    pub fn ended(&self) -> bool {
        matches!(self.0.status.phase.as_deref(), Some("Succeeded" | "Failed"))
    }

    /// The pod as the kubelet's `/pods` shows it: its spec with the status computed.
    pub fn with_status(&self) -> Pod {
        let mut pod = self.0.pod.clone();
        pod.status = Some(self.0.status.clone());
        pod
    }

    /// The pod, given up by the view.
    pub fn into_pod(self) -> Pod {
        self.0.pod
    }

    /// Whether it is the pod `namespace/name` (and has `uid`, if one is given).
    fn is(&self, namespace: &str, name: &str, uid: Option<&str>) -> bool {
        self.namespace() == namespace
            && self.0.pod.metadata.name.as_deref() == Some(name)
            && uid.is_none_or(|u| self.0.pod.metadata.uid.as_deref() == Some(u))
    }
}

/// The pods the sync loop runs, as the store holds them. Cheap to clone (a handle).
#[derive(Clone)]
pub struct PodStates {
    tree: Tree<PodState>,
}

impl PodStates {
    /// The pod states in `store`.
    pub fn open(store: &Store) -> Result<PodStates, StoreError> {
        Ok(PodStates {
            tree: store.tree(TREE)?,
        })
    }

    /// The tree itself, for the pod workers that write it.
    pub(super) fn tree(&self) -> &Tree<PodState> {
        &self.tree
    }

    /// The store the states are kept in (its own health: writes held on a full disk).
    pub fn store(&self) -> &Store {
        self.tree.store()
    }

    /// Every pod, with its UID.
    pub fn entries(&self) -> Result<Vec<(String, PodView)>, StoreError> {
        let entries = self.tree.entries()?;
        Ok(entries.into_iter().map(|(k, s)| (k, PodView(s))).collect())
    }

    /// Every pod.
    pub fn list(&self) -> Result<Vec<PodView>, StoreError> {
        let entries = self.tree.entries()?;
        Ok(entries.into_iter().map(|(_, s)| PodView(s)).collect())
    }

    /// The pod with this UID.
    pub fn get(&self, uid: &str) -> Result<Option<PodView>, StoreError> {
        Ok(self.tree.get(uid)?.map(PodView))
    }

    /// The pod `namespace/name` (with `uid`, if one is given).
    pub fn find(
        &self,
        namespace: &str,
        name: &str,
        uid: Option<&str>,
    ) -> Result<Option<PodView>, StoreError> {
        let pods = self.list()?;
        Ok(pods.into_iter().find(|p| p.is(namespace, name, uid)))
    }

    /// How many pods the store holds.
    pub fn count(&self) -> Result<usize, StoreError> {
        Ok(self.tree.keys()?.len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(namespace: &str, name: &str, uid: &str, image: &str) -> Pod {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": name, "namespace": namespace, "uid": uid},
            "spec": {"containers": [{"name": "c", "image": image}]}
        }))
        .expect("pod")
    }

    #[test]
    fn a_view_travels_as_the_stored_record() {
        let view = PodView::new(
            pod("default", "p", "u", "busybox"),
            PodStatus {
                phase: Some("Running".into()),
                ..Default::default()
            },
            crate::time::now(),
        );
        let json = serde_json::to_value(&view).expect("encode");
        let state: PodState = serde_json::from_value(json.clone()).expect("as stored");
        assert_eq!(serde_json::to_value(&state).expect("encode"), json);
        let back: PodView = serde_json::from_value(json).expect("decode");
        assert_eq!(back, view);
        assert!(!back.ended());
    }

    #[test]
    fn pods_are_found_by_name_and_uid() {
        let dir = crate::testutil::TempDir::new("podview");
        let store = Store::open(&dir.0.join("db")).expect("store");
        let states = PodStates::open(&store).expect("tree");
        for (ns, name, uid) in [("default", "a", "u1"), ("kube-system", "a", "u2")] {
            let state = PodState {
                pod: pod(ns, name, uid, "busybox"),
                status: PodStatus::default(),
                start_time: crate::time::now(),
                stop_deadline: None,
            };
            states.tree().put(uid, &state).expect("put");
        }
        assert_eq!(states.count().expect("count"), 2);
        let found = states.find("kube-system", "a", None).expect("find");
        assert_eq!(found.map(|p| p.uid().to_owned()).as_deref(), Some("u2"));
        assert!(states
            .find("default", "a", Some("u2"))
            .expect("find")
            .is_none());
        assert!(states.get("u1").expect("get").is_some());
    }
}
