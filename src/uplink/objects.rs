//! The ConfigMaps and Secrets the node's pods reference: which ones they are
//! ([`references`]), a copy of each in the store for offline use ([`ObjectCache`]), and
//! the manager that keeps that copy current from the apiserver
//! ([`spawn_object_manager`]). It never starts containers, mounts volumes or builds
//! environments: the volume, env and image-pull code read the cache.
//!
//! # How objects are followed
//! The Node authorizer lets a node read a ConfigMap or Secret only by name, and only
//! once a pod bound to it references the object (fixtures 21 and 38), so there is one
//! request stream per object. As the kubelet's watch-based manager does, each object is
//! LISTed by name (`fieldSelector=metadata.name=<name>`, fixture 44) and then WATCHed
//! from the list's resourceVersion with bookmarks on (fixture 45), resuming from the
//! last resourceVersion seen when a watch ends or drops, and relisting on 410 Gone.
//!
//! A ureq watch read blocks, so each watch needs a thread. Watch threads are capped
//! ([`ObjectManagerOptions::max_watches`]); objects beyond the cap are re-listed by the
//! manager thread every [`ObjectManagerOptions::poll_interval`] instead, as the
//! kubelet's TTL cache does, and move to a watch thread when one frees up. A gateway
//! runs a handful of pods that reference a handful of objects, so in practice every
//! object is watched; the cap keeps a hostile or unusual pod set from costing a thread
//! per reference. Round-robin short watches on a single thread were rejected: each
//! object would wait for every other object's watch timeout, and every round would cost
//! the apiserver a new watch per object, which is worse manners than a periodic LIST.
//! An object marked `immutable` cannot change, so once it is stored nobody follows it
//! any more (the kubelet does the same).
//!
//! # Secrets
//! Secret values are kept in the store's database, which lives under the agent's root
//! directory; that directory and the store's must be 0700. Nothing here formats a
//! Secret or a watch event: the generic code that handles objects does not require
//! `Debug` of them, and log lines name objects (`secret default/app-secret`) and never
//! carry their data.

mod cache;
mod fetch;
mod manager;
mod refs;
mod watcher;

#[cfg(test)]
mod rig;
#[cfg(test)]
mod testing;

use std::fmt;

use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::store::{StoreError, Tree};

pub use cache::{ObjectCache, DOCKER_CONFIG_JSON};
pub use fetch::{Listed, ObjectFetcher};
pub use manager::{
    pod_set, spawn_object_manager, spawn_object_manager_with, ObjectManagerOptions, PodSetReceiver,
    PodSetSender,
};
pub use refs::{references, references_all, References};

/// Store tree holding the cached ConfigMaps, keyed `<namespace>/<name>`.
pub const TREE_CONFIG_MAPS: &str = "configmaps";
/// Store tree holding the cached Secrets, keyed `<namespace>/<name>`. Secret values are
/// in the database: the store directory must be 0700.
pub const TREE_SECRETS: &str = "secrets";

#[derive(Debug, thiserror::Error)]
pub enum ObjectsError {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("start the {what} thread")]
    Spawn {
        what: &'static str,
        #[source]
        source: std::io::Error,
    },
}

/// Which kind of object a key names.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum ObjectKind {
    ConfigMap,
    Secret,
}

impl ObjectKind {
    /// The resource's URL segment (`configmaps`, `secrets`).
    pub fn resource(self) -> &'static str {
        match self {
            ObjectKind::ConfigMap => "configmaps",
            ObjectKind::Secret => "secrets",
        }
    }
}

/// One ConfigMap or Secret, by namespace and name. Its `Display` is what log lines use:
/// `configmap default/app-config`.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ObjectKey {
    pub kind: ObjectKind,
    pub namespace: String,
    pub name: String,
}

impl ObjectKey {
    pub fn new(kind: ObjectKind, namespace: &str, name: &str) -> Self {
        ObjectKey {
            kind,
            namespace: namespace.to_string(),
            name: name.to_string(),
        }
    }

    /// The key in the store tree: `<namespace>/<name>`.
    pub fn store_key(&self) -> String {
        store_key(&self.namespace, &self.name)
    }
}

impl fmt::Display for ObjectKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let kind = match self.kind {
            ObjectKind::ConfigMap => "configmap",
            ObjectKind::Secret => "secret",
        };
        write!(f, "{kind} {}/{}", self.namespace, self.name)
    }
}

fn store_key(namespace: &str, name: &str) -> String {
    format!("{namespace}/{name}")
}

/// A ConfigMap or a Secret: what the cache, the fetcher and the watch loop handle.
/// Deliberately without a `Debug` bound, so code generic over it cannot print one.
pub trait Object:
    k8s_openapi::ListableResource
    + k8s_openapi::Metadata<Ty = ObjectMeta>
    + Serialize
    + DeserializeOwned
    + PartialEq
    + Send
    + 'static
{
    const OBJECT_KIND: ObjectKind;

    /// What the store keeps: identity (name, namespace, uid) and data, without the
    /// resourceVersion, managedFields and other metadata that change without the
    /// content changing, so that a relist or a label edit writes nothing to flash.
    fn trimmed(&self) -> Self;

    /// Whether the object is `immutable: true` (its data can no longer change).
    fn is_immutable(&self) -> bool;

    /// The cache tree holding this kind.
    #[doc(hidden)]
    fn tree(cache: &ObjectCache) -> &Tree<Self>;
}

fn trimmed_meta(meta: &ObjectMeta) -> ObjectMeta {
    ObjectMeta {
        name: meta.name.clone(),
        namespace: meta.namespace.clone(),
        uid: meta.uid.clone(),
        ..ObjectMeta::default()
    }
}

impl Object for ConfigMap {
    const OBJECT_KIND: ObjectKind = ObjectKind::ConfigMap;

    fn trimmed(&self) -> Self {
        ConfigMap {
            metadata: trimmed_meta(&self.metadata),
            data: self.data.clone(),
            binary_data: self.binary_data.clone(),
            immutable: self.immutable,
        }
    }

    fn is_immutable(&self) -> bool {
        self.immutable == Some(true)
    }

    fn tree(cache: &ObjectCache) -> &Tree<Self> {
        cache.config_map_tree()
    }
}

impl Object for Secret {
    const OBJECT_KIND: ObjectKind = ObjectKind::Secret;

    fn trimmed(&self) -> Self {
        Secret {
            metadata: trimmed_meta(&self.metadata),
            data: self.data.clone(),
            immutable: self.immutable,
            // Write-only in the API; never returned, never kept.
            string_data: None,
            type_: self.type_.clone(),
        }
    }

    fn is_immutable(&self) -> bool {
        self.immutable == Some(true)
    }

    fn tree(cache: &ObjectCache) -> &Tree<Self> {
        cache.secret_tree()
    }
}
