//! pod::annotations: what the kubelet writes on a pod and reads back from it: where it
//! came from (`kubernetes.io/config.source` and the source names), its config hash and
//! when it was seen, the manifest file of a static pod, and the mirror pod's mark. Pure
//! readers of a pod's metadata; nothing here changes a pod.

use k8s_openapi::api::core::v1::Pod;

/// Which source a pod came from: [`SOURCE_FILE`], [`SOURCE_HTTP`] or [`SOURCE_API`].
pub const CONFIG_SOURCE: &str = "kubernetes.io/config.source";
/// A static pod's hash, which its mirror pod carries as [`CONFIG_MIRROR`].
pub const CONFIG_HASH: &str = "kubernetes.io/config.hash";
/// When a source first saw the pod.
pub const CONFIG_SEEN: &str = "kubernetes.io/config.seen";
/// The manifest file a static pod came from, so that after a restart a file that is
/// momentarily unreadable keeps its pods (see the file source).
pub const MANIFEST_FILE: &str = "holdfast.io/manifest-file";
/// Marks a mirror pod, holding the static pod's config hash.
pub const CONFIG_MIRROR: &str = "kubernetes.io/config.mirror";

/// The file source's name in snapshots, in the store and in [`CONFIG_SOURCE`].
pub const SOURCE_FILE: &str = "file";

/// The static pod URL source's name in snapshots, in the store and in
/// [`CONFIG_SOURCE`], as the kubelet names it.
pub const SOURCE_HTTP: &str = "http";

/// The apiserver source's name in snapshots, in the store and in [`CONFIG_SOURCE`], as
/// the kubelet names it.
pub const SOURCE_API: &str = "api";

/// Whether the pod is a static pod (from a manifest file or the static pod URL, not
/// from the cluster): the kubelet's `IsStaticPod`, by the `kubernetes.io/config.source`
/// annotation.
pub fn is_static_pod(pod: &Pod) -> bool {
    pod.metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(CONFIG_SOURCE))
        .is_some_and(|s| s == SOURCE_FILE || s == SOURCE_HTTP)
}

/// Whether the pod is a mirror pod: the cluster's copy of a static pod.
pub fn is_mirror(pod: &Pod) -> bool {
    pod.metadata
        .annotations
        .as_ref()
        .is_some_and(|a| a.contains_key(CONFIG_MIRROR))
}

/// The static pod's config hash, which its mirror must carry.
pub fn static_hash(pod: &Pod) -> String {
    pod.metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(CONFIG_HASH))
        .cloned()
        .unwrap_or_default()
}
