//! The store's copy of the referenced ConfigMaps and Secrets, read by the volume, env and
//! image-pull code and written by the object manager.

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use k8s_openapi::api::core::v1::{ConfigMap, Pod, Secret};

use super::{
    store_key, Object, ObjectKey, ObjectKind, ObjectsError, TREE_CONFIG_MAPS, TREE_SECRETS,
};
use crate::store::{Store, Tree};

/// The Secret type image pulls use.
pub const DOCKER_CONFIG_JSON: &str = "kubernetes.io/dockerconfigjson";
/// Its legacy form (`.dockercfg`), which the kubelet still reads.
pub const DOCKER_CFG: &str = "kubernetes.io/dockercfg";

/// The cached ConfigMaps and Secrets (store trees `configmaps` and `secrets`, keyed
/// `<namespace>/<name>`). Cheap to clone; clones share the trees and are safe to use
/// from any thread.
///
/// Secret values are stored in the database as the apiserver sent them (base64 in JSON,
/// not encrypted): the store directory under the agent's root must be 0700.
#[derive(Clone)]
pub struct ObjectCache {
    config_maps: Tree<ConfigMap>,
    secrets: Tree<Secret>,
    /// What the node's pods reference, `None` until the manager has been told. Held
    /// while writing, so a write for an object just dropped cannot land after its
    /// removal.
    wanted: Arc<Mutex<Option<BTreeSet<ObjectKey>>>>,
    /// An object manager follows the cluster for this cache: an object it has not
    /// answered for yet is not known to be missing.
    followed: Arc<AtomicBool>,
    /// The referenced keys the apiserver has answered for since the agent started
    /// (the object, or that there is none).
    answered: Arc<Mutex<BTreeSet<ObjectKey>>>,
}

impl ObjectCache {
    pub fn open(store: &Store) -> Result<Self, ObjectsError> {
        Ok(ObjectCache {
            config_maps: store.tree(TREE_CONFIG_MAPS)?,
            secrets: store.tree(TREE_SECRETS)?,
            wanted: Arc::new(Mutex::new(None)),
            followed: Arc::new(AtomicBool::new(false)),
            answered: Arc::new(Mutex::new(BTreeSet::new())),
        })
    }

    /// Whether an object missing from the cache is missing from the cluster: the
    /// apiserver said so, or no object manager follows the cluster (nothing will
    /// come). False while the manager has not answered for it yet (a pod in a
    /// namespace made a moment ago references an object not fetched so far).
    pub fn known(&self, kind: ObjectKind, namespace: &str, name: &str) -> bool {
        !self.followed.load(Ordering::Relaxed)
            || self
                .answered
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .contains(&ObjectKey::new(kind, namespace, name))
    }

    /// An object manager follows the cluster for this cache from now on.
    pub fn follow(&self) {
        self.followed.store(true, Ordering::Relaxed);
    }

    /// The cached ConfigMap, if the apiserver has ever sent it (and it still exists as
    /// far as the last answer said).
    pub fn config_map(
        &self,
        namespace: &str,
        name: &str,
    ) -> Result<Option<ConfigMap>, ObjectsError> {
        Ok(self.config_maps.get(&store_key(namespace, name))?)
    }

    /// The cached Secret. Never log what this returns.
    pub fn secret(&self, namespace: &str, name: &str) -> Result<Option<Secret>, ObjectsError> {
        Ok(self.secrets.get(&store_key(namespace, name))?)
    }

    /// The pod's `imagePullSecrets` that are cached and of type
    /// `kubernetes.io/dockerconfigjson` (or the legacy `kubernetes.io/dockercfg`), in the
    /// pod's order. As with the kubelet, a pull
    /// secret that is missing or of another type is skipped with a warning and the pull
    /// goes ahead without it.
    pub fn pull_secrets(&self, pod: &Pod) -> Vec<Secret> {
        let ns = match pod.metadata.namespace.as_deref() {
            None | Some("") => "default",
            Some(ns) => ns,
        };
        let names = pod
            .spec
            .iter()
            .flat_map(|s| s.image_pull_secrets.iter().flatten());
        let mut seen = BTreeSet::new();
        let mut out = Vec::new();
        for r in names {
            if r.name.is_empty() || !seen.insert(r.name.as_str()) {
                continue;
            }
            let key = ObjectKey::new(ObjectKind::Secret, ns, &r.name);
            match self.secret(ns, &r.name) {
                Ok(Some(s))
                    if matches!(s.type_.as_deref(), Some(DOCKER_CONFIG_JSON | DOCKER_CFG)) =>
                {
                    out.push(s)
                }
                Ok(Some(s)) => log::warn!(
                    "pull {key} has type {:?}, not {DOCKER_CONFIG_JSON}; pulling without it",
                    s.type_.as_deref().unwrap_or("")
                ),
                Ok(None) => log::warn!("pull {key} is not cached yet; pulling without it"),
                // The error names the tree and key only.
                Err(e) => log::warn!("pull {key}: {e}; pulling without it"),
            }
        }
        out
    }

    /// Every cached object's key.
    pub fn keys(&self) -> Result<Vec<ObjectKey>, ObjectsError> {
        let mut out = Vec::new();
        for (kind, keys) in [
            (ObjectKind::ConfigMap, self.config_maps.keys()?),
            (ObjectKind::Secret, self.secrets.keys()?),
        ] {
            for k in keys {
                if let Some((ns, name)) = k.split_once('/') {
                    out.push(ObjectKey::new(kind, ns, name));
                }
            }
        }
        Ok(out)
    }

    pub(super) fn config_map_tree(&self) -> &Tree<ConfigMap> {
        &self.config_maps
    }

    pub(super) fn secret_tree(&self) -> &Tree<Secret> {
        &self.secrets
    }

    /// Records what the node's pods reference now and removes every cached object
    /// outside it. Returns the removed keys.
    pub(super) fn retain(
        &self,
        wanted: &BTreeSet<ObjectKey>,
    ) -> Result<Vec<ObjectKey>, ObjectsError> {
        let mut guard = self.wanted.lock().unwrap_or_else(PoisonError::into_inner);
        *guard = Some(wanted.clone());
        self.answered
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .retain(|k| wanted.contains(k));
        let mut removed = Vec::new();
        for key in self.keys()? {
            if wanted.contains(&key) {
                continue;
            }
            let gone = match key.kind {
                ObjectKind::ConfigMap => self.config_maps.remove(&key.store_key())?.is_some(),
                ObjectKind::Secret => self.secrets.remove(&key.store_key())?.is_some(),
            };
            if gone {
                removed.push(key);
            }
        }
        Ok(removed)
    }

    /// Stores `object` (trimmed) under `key`, or removes the key when `object` is `None`
    /// (the object does not exist in the cluster). Writes only when the stored content
    /// changes and only while the key is referenced. Returns whether anything changed.
    pub(super) fn apply<T: Object>(
        &self,
        key: &ObjectKey,
        object: Option<&T>,
    ) -> Result<bool, ObjectsError> {
        let guard = self.wanted.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(wanted) = guard.as_ref() {
            if !wanted.contains(key) {
                return Ok(false);
            }
        }
        self.answered
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(key.clone());
        let tree = T::tree(self);
        let changed = match object {
            Some(o) => tree.put(&key.store_key(), &o.trimmed())?,
            None => tree.remove(&key.store_key())?.is_some(),
        };
        drop(guard);
        Ok(changed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::TempDir;

    fn cache(tmp: &TempDir) -> (Store, ObjectCache) {
        let store = Store::open(&tmp.0.join("db")).expect("store");
        let cache = ObjectCache::open(&store).expect("cache");
        (store, cache)
    }

    fn secret(ns: &str, name: &str, type_: &str) -> Secret {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": name, "namespace": ns, "resourceVersion": "9"},
            "type": type_,
            "data": {".dockerconfigjson": "e30="},
        }))
        .expect("secret")
    }

    fn config_map(ns: &str, name: &str, value: &str, rv: &str) -> ConfigMap {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": name, "namespace": ns, "uid": "u1", "resourceVersion": rv,
                         "managedFields": [{"manager": "kubectl", "operation": "Update"}]},
            "data": {"k": value},
        }))
        .expect("configmap")
    }

    fn keys(pairs: &[(ObjectKind, &str, &str)]) -> BTreeSet<ObjectKey> {
        pairs
            .iter()
            .map(|(k, ns, n)| ObjectKey::new(*k, ns, n))
            .collect()
    }

    #[test]
    fn a_missing_object_is_known_missing_once_the_apiserver_said_so() {
        let tmp = TempDir::new("objects-known");
        let (_store, cache) = cache(&tmp);
        // Nobody follows the cluster: missing is missing.
        assert!(cache.known(ObjectKind::ConfigMap, "new", "kube-root-ca.crt"));
        cache.follow();
        assert!(!cache.known(ObjectKind::ConfigMap, "new", "kube-root-ca.crt"));
        let key = ObjectKey::new(ObjectKind::ConfigMap, "new", "kube-root-ca.crt");
        cache.apply::<ConfigMap>(&key, None).expect("apply");
        assert!(cache.known(ObjectKind::ConfigMap, "new", "kube-root-ca.crt"));
        assert!(!cache.known(ObjectKind::Secret, "new", "kube-root-ca.crt"));
        // No longer referenced: forgotten, and not known again until answered.
        cache.retain(&BTreeSet::new()).expect("retain");
        assert!(!cache.known(ObjectKind::ConfigMap, "new", "kube-root-ca.crt"));
    }

    #[test]
    fn stores_trimmed_and_writes_only_on_change() {
        let tmp = TempDir::new("objects-cache");
        let (_store, cache) = cache(&tmp);
        let key = ObjectKey::new(ObjectKind::ConfigMap, "default", "cm");
        assert!(cache
            .apply(&key, Some(&config_map("default", "cm", "a", "1")))
            .expect("apply"));
        // A relist (new resourceVersion, same data) writes nothing.
        assert!(!cache
            .apply(&key, Some(&config_map("default", "cm", "a", "7")))
            .expect("apply"));
        assert!(cache
            .apply(&key, Some(&config_map("default", "cm", "b", "8")))
            .expect("apply"));
        let got = cache
            .config_map("default", "cm")
            .expect("get")
            .expect("cached");
        assert_eq!(
            got.data.expect("data").get("k").map(String::as_str),
            Some("b")
        );
        assert_eq!(got.metadata.uid.as_deref(), Some("u1"));
        assert_eq!(got.metadata.resource_version, None);
        assert_eq!(got.metadata.managed_fields, None);
        // Removal reports a change once.
        assert!(cache.apply::<ConfigMap>(&key, None).expect("remove"));
        assert!(!cache.apply::<ConfigMap>(&key, None).expect("remove again"));
        assert_eq!(cache.config_map("default", "cm").expect("get"), None);
    }

    #[test]
    fn retain_removes_unreferenced_and_blocks_their_writes() {
        let tmp = TempDir::new("objects-cache");
        let (_store, cache) = cache(&tmp);
        let cm = ObjectKey::new(ObjectKind::ConfigMap, "default", "cm");
        let s = ObjectKey::new(ObjectKind::Secret, "default", "s");
        cache
            .apply(&cm, Some(&config_map("default", "cm", "a", "1")))
            .expect("apply");
        cache
            .apply(&s, Some(&secret("default", "s", "Opaque")))
            .expect("apply");
        let removed = cache
            .retain(&keys(&[(ObjectKind::Secret, "default", "s")]))
            .expect("retain");
        assert_eq!(removed, vec![cm.clone()]);
        assert_eq!(cache.keys().expect("keys"), vec![s.clone()]);
        // A late write for the dropped object is refused.
        assert!(!cache
            .apply(&cm, Some(&config_map("default", "cm", "z", "2")))
            .expect("apply"));
        assert_eq!(cache.config_map("default", "cm").expect("get"), None);
        assert!(cache.secret("default", "s").expect("get").is_some());
    }

    #[test]
    fn cache_survives_reopen() {
        let tmp = TempDir::new("objects-cache");
        {
            let (store, cache) = cache(&tmp);
            let key = ObjectKey::new(ObjectKind::Secret, "ns", "s");
            cache
                .apply(&key, Some(&secret("ns", "s", "Opaque")))
                .expect("apply");
            store.flush().expect("flush");
        }
        let (_store, cache) = cache(&tmp);
        let got = cache.secret("ns", "s").expect("get").expect("cached");
        assert_eq!(got.type_.as_deref(), Some("Opaque"));
    }

    #[test]
    fn pull_secrets_are_dockerconfigjson_only_in_pod_order() {
        let tmp = TempDir::new("objects-cache");
        let (_store, cache) = cache(&tmp);
        for (name, type_) in [
            ("b", DOCKER_CONFIG_JSON),
            ("a", DOCKER_CONFIG_JSON),
            ("legacy", DOCKER_CFG),
            ("opaque", "Opaque"),
        ] {
            let key = ObjectKey::new(ObjectKind::Secret, "apps", name);
            cache
                .apply(&key, Some(&secret("apps", name, type_)))
                .expect("apply");
        }
        // Same name in another namespace: not the pod's.
        let other = ObjectKey::new(ObjectKind::Secret, "other", "c");
        cache
            .apply(&other, Some(&secret("other", "c", DOCKER_CONFIG_JSON)))
            .expect("apply");
        let pod: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "p", "namespace": "apps"},
            "spec": {"containers": [{"name": "c", "image": "x"}],
                     "imagePullSecrets": [{"name": "b"}, {"name": "opaque"}, {"name": "c"},
                                          {"name": "missing"}, {"name": "a"}, {"name": "b"},
                                          {"name": "legacy"}]},
        }))
        .expect("pod");
        let names: Vec<String> = cache
            .pull_secrets(&pod)
            .into_iter()
            .filter_map(|s| s.metadata.name)
            .collect();
        assert_eq!(
            names,
            vec!["b".to_string(), "a".to_string(), "legacy".to_string()]
        );
    }
}
