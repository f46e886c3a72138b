//! image: the content-addressed image store, local archive import and layer unpacking.
//! Layers are untrusted input: nothing in one may land outside its own directory.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

/// An image ready to run: its config and its unpacked layers.
#[derive(Debug, Clone)]
pub struct ResolvedImage {
    /// The normalised reference the pod asked for (`docker.io/library/busybox:latest`).
    pub reference: String,
    /// `sha256:<config digest>`, the kubelet's `imageID`.
    pub image_id: String,
    /// The image's config (Entrypoint, Cmd, Env, WorkingDir, User).
    pub config: oci_spec::image::ImageConfiguration,
    /// Unpacked layer directories, lowest (base) layer first.
    pub layers: Vec<PathBuf>,
}

/// One image in the index, as `holdfast image ls` shows it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ImageRecord {
    /// Normalised references (repo:tag or repo@digest) that name this image.
    pub references: Vec<String>,
    /// `sha256:<manifest digest>`.
    pub manifest_digest: String,
    /// `sha256:<config digest>`.
    pub config_digest: String,
    /// Layer blob digests, base first.
    pub layers: Vec<String>,
    /// Bytes of all blobs (compressed layers, config, manifest).
    pub size: u64,
    pub imported_at: crate::time::Timestamp,
}

#[derive(Debug, thiserror::Error)]
pub enum ImageError {
    #[error("invalid image reference {reference:?}: {reason}")]
    BadReference { reference: String, reason: String },
    #[error("image {reference} is not present on this node")]
    NotPresent { reference: String },
    #[error("{context}")]
    Io {
        context: String,
        #[source]
        source: std::io::Error,
    },
    #[error(transparent)]
    Store(#[from] crate::store::StoreError),
}
