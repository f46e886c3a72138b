//! image: the content-addressed image store, registry pulls, local archive import, layer
//! unpacking and image GC. Layers, manifests and registries are untrusted input: nothing
//! in a layer may land outside its own directory, and no blob is used before its digest
//! is checked.

mod archive;
mod content;
mod digest;
pub mod gc;
mod import;
pub mod pins;
mod platform;
pub mod reference;
pub mod registry;
pub mod service;
mod space;
mod store;
mod unpack;

use serde::{Deserialize, Serialize};

pub use platform::Platform;
pub use reference::Reference;
pub use store::ImageStore;

/// `<repository>@<manifest digest>` for an image named `reference`, as containerd
/// makes a repo digest; the bare digest when the reference cannot be read.
pub fn repo_digest(reference: &str, manifest_digest: &str) -> String {
    match Reference::parse(reference) {
        Ok(r) => format!("{}@{manifest_digest}", r.name()),
        Err(_) => manifest_digest.to_string(),
    }
}

/// The digest an `imageID` names: the part after `@` of a repo digest, or all of it.
pub fn id_digest(image_id: &str) -> &str {
    image_id.rsplit('@').next().unwrap_or(image_id)
}

/// Unpacks one layer blob into the new directory `dest`, as an image pull does, for the
/// fuzz tests in `tests/fuzz.rs`; not an API.
#[doc(hidden)]
pub fn unpack_layer_blob(blob: &std::path::Path, dest: &std::path::Path) -> Result<(), ImageError> {
    unpack::unpack_layer(blob, dest, "fuzz", None)
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
    /// When a container last started from it (for GC, least recently used first).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_used: Option<crate::time::Timestamp>,
    /// Kept by GC and `image prune` whatever its age and the disk (imported with
    /// `--pin`, or named by `holdfast.pinnedImages`); only `image rm` removes it.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub pinned: bool,
}

#[derive(Debug, thiserror::Error)]
pub enum ImageError {
    #[error("invalid image reference {reference:?}: {reason}")]
    BadReference { reference: String, reason: String },
    #[error("image {reference} is not present on this node")]
    NotPresent { reference: String },
    #[error("image {reference} ({image_id}) is used by a container")]
    InUse { reference: String, image_id: String },
    #[error("invalid digest {digest:?}: {reason}")]
    BadDigest { digest: String, reason: String },
    #[error("{what}: digest mismatch: expected {expected}, got {actual}")]
    DigestMismatch {
        what: String,
        expected: String,
        actual: String,
    },
    #[error("{what}: size mismatch: expected {expected} bytes, got {actual}")]
    SizeMismatch {
        what: String,
        expected: u64,
        actual: u64,
    },
    #[error("{what} is larger than {limit} bytes")]
    TooLarge { what: String, limit: u64 },
    #[error("archive {archive}: {reason}")]
    BadArchive { archive: String, reason: String },
    #[error("archive {archive}: missing {name}")]
    MissingBlob { archive: String, name: String },
    #[error("parse {what}: {source}")]
    Json {
        what: String,
        #[source]
        source: serde_json::Error,
    },
    #[error("{what}: no manifest for platform {wanted} (available: {available})")]
    NoMatchingPlatform {
        what: String,
        wanted: String,
        available: String,
    },
    #[error("layer {layer}: unsupported layer compression {kind}")]
    UnsupportedCompression { layer: String, kind: &'static str },
    #[error("layer {layer}: unsafe entry {entry:?}: {reason}")]
    UnsafeLayerEntry {
        layer: String,
        entry: String,
        reason: String,
    },
    #[error("layer {layer}: entry {entry:?}: {op}: {source}")]
    LayerEntry {
        layer: String,
        entry: String,
        op: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{context}: {source}")]
    Io {
        context: String,
        #[source]
        source: std::io::Error,
    },
    /// The filesystem is full (ENOSPC), or would be left without its reserve.
    #[error("{what}: the disk is full ({detail}); free space there and try again")]
    DiskFull {
        what: String,
        detail: String,
        #[source]
        source: Option<std::io::Error>,
    },
    #[error(transparent)]
    Store(#[from] crate::store::StoreError),
}

impl ImageError {
    /// The image is simply not on this node (the kubelet's `ErrImageNeverPull` case
    /// when pulling is not possible), as opposed to present but unusable.
    pub fn is_not_present(&self) -> bool {
        matches!(self, ImageError::NotPresent { .. })
    }

    /// The kubelet's waiting reason for a container whose image failed this way.
    pub fn kubelet_reason(&self) -> &'static str {
        match self {
            ImageError::BadReference { .. } => "InvalidImageName",
            ImageError::NotPresent { .. } => "ErrImageNeverPull",
            _ => "CreateContainerError",
        }
    }
}

pub(crate) fn io_err(context: String) -> impl FnOnce(std::io::Error) -> ImageError {
    move |source| space::io_error(context, source)
}

fn json_err(what: impl Into<String>) -> impl FnOnce(serde_json::Error) -> ImageError {
    let what = what.into();
    move |source| ImageError::Json { what, source }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn image_ids_are_containerds_repo_digests() {
        assert_eq!(
            repo_digest("busybox:demo", "sha256:abc"),
            "docker.io/library/busybox@sha256:abc"
        );
        assert_eq!(
            repo_digest(
                &format!("registry.local:5000/team/app@sha256:{}", "0".repeat(64)),
                "sha256:abc"
            ),
            "registry.local:5000/team/app@sha256:abc"
        );
        assert_eq!(
            id_digest("docker.io/library/busybox@sha256:abc"),
            "sha256:abc"
        );
        assert_eq!(id_digest("sha256:abc"), "sha256:abc");
    }
}
