//! source: where pods come from (static manifest files, the static pod URL and the
//! apiserver) and the mux that merges them. Never starts containers.
//!
//! Each source sends the full set of pods it knows ([`SourceSnapshot`]); the mux keeps
//! one set per source, persists it in the store, and turns differences into
//! [`PodChange`]s for the sync loop, as the kubelet's config mux does.

mod apiserver;
mod file;
mod http;
mod http_fetch;
mod http_pods;
mod manifest;
mod mux;
mod static_pod;
mod validate;

use k8s_openapi::api::core::v1::Pod;
use serde::{Deserialize, Serialize};

pub use apiserver::{
    list_path, normalise, spawn_api_source, watch_path, ApiSourceError, ApiSourceOptions,
    ApiSourceResume, PodList, PodLister, PodTap, PodWatch, LIST_LIMIT,
};
pub use file::{read_manifests, spawn_file_source};
pub use http::spawn_http_source;
pub use mux::{Mux, PODS_TREE};
pub use static_pod::{
    apply_api_defaults, default_pull_policy, make_static_pod, static_pod_uid, Origin,
};
pub use validate::validate_pod;

/// The full set of pods one source wants on this node, as of now.
#[derive(Debug, Clone)]
pub struct SourceSnapshot {
    /// `file`, `http` or `api`.
    pub source: &'static str,
    pub pods: Vec<Pod>,
    /// Where the source's view of the cluster stands (the api source's last LIST or
    /// watch event), kept with the pods so a restarted agent resumes its watch there.
    pub resource_version: Option<String>,
}

/// What the sync loop is told: one pod appeared, changed or went away.
#[derive(Debug, Clone)]
pub enum PodChange {
    Add(Box<Pod>),
    Update(Box<Pod>),
    /// The pod's UID: stop it gracefully and forget it.
    Remove(String),
}

/// A desired pod as the store keeps it (tree `pods`, key = pod UID).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DesiredPod {
    pub source: String,
    pub pod: Pod,
}

#[derive(Debug, thiserror::Error)]
pub enum SourceError {
    /// A manifest that is not a pod we can run; names the file and what is wrong.
    #[error("manifest {file}: {reason}")]
    Manifest { file: String, reason: String },
    /// The static pod URL could not be read, or its answer was refused.
    #[error("static pod URL {url}: {reason}")]
    Url { url: String, reason: String },
    #[error("{context}")]
    Io {
        context: String,
        #[source]
        source: std::io::Error,
    },
    #[error(transparent)]
    Store(#[from] crate::store::StoreError),
}
