//! The pod config mux: one set of pods per source, merged by UID into adds, updates and
//! removes for the sync loop, and persisted so a restarted agent runs its pods before
//! any source has spoken (the kubelet's PodConfig, with sled as its memory).
//!
//! A source's resourceVersion is stored with its pods, in the same batch, and only
//! when the pod set changed: a bookmark that moves the version alone writes nothing
//! (flash wear); a restarted api source resumes from the stored version and replays
//! what came after it.

use std::collections::{BTreeMap, HashMap};

use k8s_openapi::api::core::v1::Pod;

use super::{DesiredPod, PodChange, SourceError, SourceSnapshot};
use crate::pod::annotations::CONFIG_SEEN;
use crate::store::{Batch, Store, Tree};

/// The store tree holding the desired pods, keyed by pod UID.
pub const PODS_TREE: &str = "pods";
/// The store tree holding each source's resourceVersion, keyed by source name.
const VERSIONS_TREE: &str = "source_versions";

pub struct Mux {
    store: Store,
    pods: Tree<DesiredPod>,
    versions: Tree<String>,
    /// Per source, its pods by UID, as they are in the store.
    sets: HashMap<String, BTreeMap<String, Pod>>,
    /// Per source, the resourceVersion stored with its pods.
    stored_versions: HashMap<String, String>,
    writes: u64,
}

impl Mux {
    /// Loads the desired pods from the store; returns an `Add` for each, so they run
    /// again without waiting for their sources.
    pub fn open(store: &Store) -> Result<(Mux, Vec<PodChange>), SourceError> {
        let pods: Tree<DesiredPod> = store.tree(PODS_TREE)?;
        let versions: Tree<String> = store.tree(VERSIONS_TREE)?;
        let mut stored_versions = HashMap::new();
        for key in versions.keys()? {
            match versions.get(&key) {
                Ok(Some(rv)) => {
                    stored_versions.insert(key, rv);
                }
                Ok(None) => {}
                // Without it the source lists again: nothing is lost.
                Err(e) => log::warn!("{e}; the source will list again"),
            }
        }
        let mut sets: HashMap<String, BTreeMap<String, Pod>> = HashMap::new();
        let mut changes = Vec::new();
        for (uid, desired) in pods.entries()? {
            changes.push(PodChange::Add(Box::new(desired.pod.clone())));
            sets.entry(desired.source)
                .or_default()
                .insert(uid, desired.pod);
        }
        let mux = Mux {
            store: store.clone(),
            pods,
            versions,
            sets,
            stored_versions,
            writes: 0,
        };
        Ok((mux, changes))
    }

    /// Every desired pod, of every source, as an `Add` (what a starting agent runs).
    pub fn desired(&self) -> Vec<PodChange> {
        self.sets
            .values()
            .flat_map(BTreeMap::values)
            .map(|p| PodChange::Add(Box::new(p.clone())))
            .collect()
    }

    /// Replaces one source's set with `snapshot` and returns what changed: removes
    /// first (so a replaced pod frees its name and ports before its successor starts),
    /// then updates, then adds, each by UID. Writes to the store only what changed.
    pub fn apply(&mut self, snapshot: SourceSnapshot) -> Result<Vec<PodChange>, SourceError> {
        let source = snapshot.source;
        let empty = BTreeMap::new();
        let mut new = self.accept(source, snapshot.pods);
        let diff = Diff::of(self.sets.get(source).unwrap_or(&empty), &new);
        if diff.is_empty() {
            return Ok(Vec::new());
        }
        let version = snapshot.resource_version.filter(|rv| !rv.is_empty());
        self.persist(source, &new, &diff, version)?;
        let old = self.sets.get(source).unwrap_or(&empty);
        keep_stored_copies(old, &mut new);
        let changes = diff.changes(&new);
        self.sets.insert(source.to_string(), new);
        Ok(changes)
    }

    /// The snapshot's pods by UID, less those with no UID, one another source's pod
    /// has, or one an earlier pod of the snapshot took (each said in the log).
    fn accept(&self, source: &str, pods: Vec<Pod>) -> BTreeMap<String, Pod> {
        let mut new: BTreeMap<String, Pod> = BTreeMap::new();
        for pod in pods {
            let name = pod_name(&pod);
            let Some(uid) = pod.metadata.uid.clone().filter(|u| !u.is_empty()) else {
                log::error!("source {source}: pod {name} has no uid; ignored");
                continue;
            };
            if let Some(owner) = self.owner_other_than(source, &uid) {
                log::error!(
                    "source {source}: pod {name} has uid {uid}, which belongs to a pod from source {owner}; ignored"
                );
                continue;
            }
            if new.contains_key(&uid) {
                log::error!("source {source}: pod {name} repeats uid {uid}; ignored");
                continue;
            }
            new.insert(uid, pod);
        }
        new
    }

    /// Writes what changed of the source's pods, and the version they are at, to the
    /// store.
    fn persist(
        &mut self,
        source: &str,
        new: &BTreeMap<String, Pod>,
        diff: &Diff,
        version: Option<String>,
    ) -> Result<(), SourceError> {
        // Pods and the version they are at go in as one: after a power cut the stored
        // version never claims changes the stored pods lack.
        let mut batch = Batch::new();
        for uid in &diff.removes {
            batch.remove(&self.pods, uid);
        }
        for uid in diff.updates.iter().chain(&diff.adds) {
            let Some(pod) = new.get(uid) else { continue };
            let record = DesiredPod {
                source: source.to_string(),
                pod: pod.clone(),
            };
            batch.put(&self.pods, uid, &record)?;
        }
        match &version {
            Some(rv) => batch.put(&self.versions, source, rv)?,
            // A source that cannot say where it is must not resume from an old place.
            None if self.stored_versions.contains_key(source) => {
                batch.remove(&self.versions, source)
            }
            None => {}
        }
        self.writes += self.store.apply(batch)? as u64;
        match version {
            Some(rv) => {
                self.stored_versions.insert(source.to_string(), rv);
            }
            None => {
                self.stored_versions.remove(source);
            }
        }
        // Flushed before any pod of it is started: an admitted pod is what cannot be
        // worked out again after a power cut (an offline device restarts its pods from
        // here), and the version must never be ahead of the pods it stands for. Static
        // pods can: their manifests are on the disk, and read again at every start. The
        // store's next tick writes them (a flush per manifest change would cost the
        // flash a journal commit for nothing).
        if source != crate::pod::annotations::SOURCE_FILE {
            self.store.flush()?;
        }
        Ok(())
    }

    /// Every desired pod, in UID order within each source.
    pub fn pods(&self) -> impl Iterator<Item = &Pod> {
        self.sets.values().flat_map(|set| set.values())
    }

    /// The pods one source gave, as the store holds them.
    pub fn source_pods(&self, source: &str) -> Vec<Pod> {
        self.sets
            .get(source)
            .map(|set| set.values().cloned().collect())
            .unwrap_or_default()
    }

    /// The resourceVersion stored with the source's pods, if any.
    pub fn resource_version(&self, source: &str) -> Option<String> {
        self.stored_versions.get(source).cloned()
    }

    /// The desired pod with this UID, from any source.
    pub fn get(&self, uid: &str) -> Option<&Pod> {
        self.sets.values().find_map(|set| set.get(uid))
    }

    /// Records written or removed since [`Mux::open`]: flash wear, for metrics.
    pub fn writes(&self) -> u64 {
        self.writes
    }

    fn owner_other_than(&self, source: &str, uid: &str) -> Option<&str> {
        self.sets
            .iter()
            .find(|(name, set)| name.as_str() != source && set.contains_key(uid))
            .map(|(name, _)| name.as_str())
    }
}

/// Whether the sync loop must hear about the change, as the kubelet's
/// podsDifferSemantically decides: spec, labels, annotations (but for when the pod was
/// seen) and deletion; and what its source keeps of the status (a terminal phase, the
/// conditions of readiness gates), which the kubelet reconciles.
fn differs(a: &Pod, b: &Pod) -> bool {
    let (ma, mb) = (&a.metadata, &b.metadata);
    let annotations = |pod: &Pod| {
        let mut ann = pod.metadata.annotations.clone().unwrap_or_default();
        ann.remove(CONFIG_SEEN);
        ann
    };
    a.spec != b.spec
        || ma.labels.clone().unwrap_or_default() != mb.labels.clone().unwrap_or_default()
        || annotations(a) != annotations(b)
        || ma.deletion_timestamp != mb.deletion_timestamp
        || ma.deletion_grace_period_seconds != mb.deletion_grace_period_seconds
        || a.status != b.status
}

/// What a source's new pod set changes of its old one, by UID.
struct Diff {
    removes: Vec<String>,
    updates: Vec<String>,
    adds: Vec<String>,
}

impl Diff {
    fn of(old: &BTreeMap<String, Pod>, new: &BTreeMap<String, Pod>) -> Diff {
        let removes = old.keys().filter(|uid| !new.contains_key(*uid)).cloned();
        let mut diff = Diff {
            removes: removes.collect(),
            updates: Vec::new(),
            adds: Vec::new(),
        };
        for (uid, pod) in new {
            match old.get(uid) {
                None => diff.adds.push(uid.clone()),
                Some(before) if differs(before, pod) => diff.updates.push(uid.clone()),
                Some(_) => {}
            }
        }
        diff
    }

    fn is_empty(&self) -> bool {
        self.removes.is_empty() && self.updates.is_empty() && self.adds.is_empty()
    }

    /// The sync loop's changes: removes, then updates, then adds.
    fn changes(self, new: &BTreeMap<String, Pod>) -> Vec<PodChange> {
        let mut changes: Vec<PodChange> = self.removes.into_iter().map(PodChange::Remove).collect();
        for uid in &self.updates {
            if let Some(pod) = new.get(uid) {
                changes.push(PodChange::Update(Box::new(pod.clone())));
            }
        }
        for uid in &self.adds {
            if let Some(pod) = new.get(uid) {
                changes.push(PodChange::Add(Box::new(pod.clone())));
            }
        }
        changes
    }
}

/// Pods equal but for `config.seen` keep the stored copy, so memory and store agree
/// and the first-seen time survives.
fn keep_stored_copies(old: &BTreeMap<String, Pod>, new: &mut BTreeMap<String, Pod>) {
    for (uid, pod) in new.iter_mut() {
        if let Some(before) = old.get(uid) {
            if !differs(before, pod) {
                *pod = before.clone();
            }
        }
    }
}

fn pod_name(pod: &Pod) -> String {
    format!(
        "{}/{}",
        pod.metadata.namespace.as_deref().unwrap_or("default"),
        pod.metadata.name.as_deref().unwrap_or("<unnamed>")
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    use k8s_openapi::api::core::v1::{Container, PodSpec};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    use crate::testutil::TempDir;

    fn pod(uid: &str, image: &str, seen: &str) -> Pod {
        Pod {
            metadata: ObjectMeta {
                name: Some(format!("p-{uid}")),
                namespace: Some("default".into()),
                uid: Some(uid.into()),
                annotations: Some([(CONFIG_SEEN.to_string(), seen.to_string())].into()),
                ..ObjectMeta::default()
            },
            spec: Some(PodSpec {
                containers: vec![Container {
                    name: "c".into(),
                    image: Some(image.into()),
                    ..Container::default()
                }],
                ..PodSpec::default()
            }),
            status: None,
        }
    }

    fn snap(source: &'static str, pods: Vec<Pod>) -> SourceSnapshot {
        SourceSnapshot {
            source,
            pods,
            resource_version: None,
        }
    }

    fn snap_at(pods: Vec<Pod>, rv: &str) -> SourceSnapshot {
        SourceSnapshot {
            source: "api",
            pods,
            resource_version: Some(rv.into()),
        }
    }

    #[test]
    fn the_resource_version_is_stored_with_the_pods_and_only_when_they_change() {
        let dir = TempDir::new("versions");
        {
            let store = Store::open(&dir.0).expect("store");
            let (mut mux, _) = Mux::open(&store).expect("open");
            mux.apply(snap_at(vec![pod("a", "nginx:1", "t0")], "10"))
                .expect("apply");
            assert_eq!(mux.writes(), 2, "the pod and its version");
            assert_eq!(mux.resource_version("api").as_deref(), Some("10"));
            // Only the version moved (bookmarks, status updates): nothing written.
            let changes = mux
                .apply(snap_at(vec![pod("a", "nginx:1", "t5")], "42"))
                .expect("apply");
            assert!(changes.is_empty());
            assert_eq!(mux.writes(), 2);
            assert_eq!(mux.resource_version("api").as_deref(), Some("10"));
            mux.apply(snap_at(
                vec![pod("a", "nginx:1", "t0"), pod("b", "nginx:1", "t0")],
                "50",
            ))
            .expect("apply");
            assert_eq!(mux.writes(), 4);
        }
        let store = Store::open(&dir.0).expect("reopen");
        let (mux, changes) = Mux::open(&store).expect("open");
        assert_eq!(summary(&changes), ["add a", "add b"]);
        assert_eq!(mux.resource_version("api").as_deref(), Some("50"));
        assert_eq!(mux.resource_version("file"), None);
        assert_eq!(mux.source_pods("api").len(), 2);
    }

    fn summary(changes: &[PodChange]) -> Vec<String> {
        changes
            .iter()
            .map(|c| match c {
                PodChange::Add(p) => format!("add {}", p.metadata.uid.as_deref().unwrap_or("")),
                PodChange::Update(p) => {
                    format!("update {}", p.metadata.uid.as_deref().unwrap_or(""))
                }
                PodChange::Remove(uid) => format!("remove {uid}"),
            })
            .collect()
    }

    #[test]
    fn add_update_remove() {
        let dir = TempDir::new("diff");
        let store = Store::open(&dir.0).expect("store");
        let (mut mux, initial) = Mux::open(&store).expect("open");
        assert!(initial.is_empty());

        let changes = mux
            .apply(snap(
                "file",
                vec![pod("a", "busybox:1", "t0"), pod("b", "busybox:1", "t0")],
            ))
            .expect("apply");
        assert_eq!(summary(&changes), ["add a", "add b"]);

        let changes = mux
            .apply(snap(
                "file",
                vec![pod("a", "busybox:2", "t1"), pod("c", "busybox:1", "t1")],
            ))
            .expect("apply");
        assert_eq!(summary(&changes), ["remove b", "update a", "add c"]);

        let tree: Tree<DesiredPod> = store.tree(PODS_TREE).expect("tree");
        assert_eq!(tree.keys().expect("keys"), ["a", "c"]);
        let stored = tree.get("a").expect("get").expect("a stored");
        assert_eq!(stored.source, "file");
        assert_eq!(stored.pod, pod("a", "busybox:2", "t1"));
        assert_eq!(mux.get("a"), Some(&pod("a", "busybox:2", "t1")));
        assert_eq!(mux.pods().count(), 2);
    }

    #[test]
    fn nothing_changed_writes_nothing() {
        let dir = TempDir::new("quiet");
        let store = Store::open(&dir.0).expect("store");
        let (mut mux, _) = Mux::open(&store).expect("open");
        mux.apply(snap("file", vec![pod("a", "busybox:1", "t0")]))
            .expect("apply");
        let writes = mux.writes();
        assert_eq!(writes, 1);

        // Seen again later: only config.seen differs.
        let changes = mux
            .apply(snap("file", vec![pod("a", "busybox:1", "t9")]))
            .expect("apply");
        assert!(changes.is_empty());
        assert_eq!(mux.writes(), writes);
        let tree: Tree<DesiredPod> = store.tree(PODS_TREE).expect("tree");
        let stored = tree.get("a").expect("get").expect("stored");
        assert_eq!(
            stored.pod,
            pod("a", "busybox:1", "t0"),
            "first-seen time kept"
        );
        assert!(!tree
            .put(
                "a",
                &DesiredPod {
                    source: "file".into(),
                    pod: pod("a", "busybox:1", "t0")
                }
            )
            .expect("put"));
    }

    #[test]
    fn a_status_its_source_keeps_is_a_change() {
        use k8s_openapi::api::core::v1::{PodCondition, PodStatus};
        let dir = TempDir::new("gates");
        let store = Store::open(&dir.0).expect("store");
        let (mut mux, _) = Mux::open(&store).expect("open");
        mux.apply(snap("api", vec![pod("a", "busybox:1", "t0")]))
            .expect("apply");
        // A readiness gate's condition set by a controller: the worker recomputes Ready.
        let mut gated = pod("a", "busybox:1", "t0");
        gated.status = Some(PodStatus {
            conditions: Some(vec![PodCondition {
                type_: "example.com/gate".into(),
                status: "True".into(),
                ..PodCondition::default()
            }]),
            ..PodStatus::default()
        });
        let changes = mux.apply(snap("api", vec![gated.clone()])).expect("apply");
        assert_eq!(summary(&changes), ["update a"]);
        assert_eq!(mux.get("a"), Some(&gated));
    }

    #[test]
    fn reopen_returns_the_same_pods() {
        let dir = TempDir::new("reopen");
        {
            let store = Store::open(&dir.0).expect("store");
            let (mut mux, _) = Mux::open(&store).expect("open");
            mux.apply(snap(
                "file",
                vec![pod("a", "busybox:1", "t0"), pod("b", "busybox:1", "t0")],
            ))
            .expect("apply");
            mux.apply(snap("api", vec![pod("z", "nginx:1", "t0")]))
                .expect("apply");
        }
        let store = Store::open(&dir.0).expect("reopen");
        let (mut mux, changes) = Mux::open(&store).expect("open");
        assert_eq!(summary(&changes), ["add a", "add b", "add z"]);
        assert_eq!(mux.get("z"), Some(&pod("z", "nginx:1", "t0")));

        // The source, once it speaks, changes nothing it already said.
        let changes = mux
            .apply(snap(
                "file",
                vec![pod("a", "busybox:1", "t5"), pod("b", "busybox:1", "t5")],
            ))
            .expect("apply");
        assert!(changes.is_empty());
        assert_eq!(mux.writes(), 0);

        // A manifest removed while the agent was down goes once the source speaks.
        let changes = mux
            .apply(snap("file", vec![pod("a", "busybox:1", "t5")]))
            .expect("apply");
        assert_eq!(summary(&changes), ["remove b"]);
    }

    #[test]
    fn sources_do_not_disturb_each_other() {
        let dir = TempDir::new("sources");
        let store = Store::open(&dir.0).expect("store");
        let (mut mux, _) = Mux::open(&store).expect("open");
        mux.apply(snap("file", vec![pod("a", "busybox:1", "t0")]))
            .expect("apply");
        let changes = mux
            .apply(snap("api", vec![pod("x", "nginx:1", "t0")]))
            .expect("apply");
        assert_eq!(summary(&changes), ["add x"]);

        let changes = mux.apply(snap("api", vec![])).expect("apply");
        assert_eq!(summary(&changes), ["remove x"]);
        assert!(mux.get("a").is_some());

        // A uid already owned by another source is refused, not stolen.
        let changes = mux
            .apply(snap("api", vec![pod("a", "evil:1", "t0")]))
            .expect("apply");
        assert!(changes.is_empty());
        assert_eq!(mux.get("a"), Some(&pod("a", "busybox:1", "t0")));

        let tree: Tree<DesiredPod> = store.tree(PODS_TREE).expect("tree");
        assert_eq!(tree.keys().expect("keys"), ["a"]);
    }

    #[test]
    fn pods_without_uid_or_with_a_repeated_uid_are_skipped() {
        let dir = TempDir::new("uids");
        let store = Store::open(&dir.0).expect("store");
        let (mut mux, _) = Mux::open(&store).expect("open");
        let mut no_uid = pod("a", "busybox:1", "t0");
        no_uid.metadata.uid = None;
        let changes = mux
            .apply(snap(
                "file",
                vec![
                    no_uid,
                    pod("b", "busybox:1", "t0"),
                    pod("b", "busybox:2", "t0"),
                ],
            ))
            .expect("apply");
        assert_eq!(summary(&changes), ["add b"]);
        assert_eq!(mux.get("b"), Some(&pod("b", "busybox:1", "t0")));
    }
}
