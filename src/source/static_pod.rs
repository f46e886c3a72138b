//! Static pods as the kubelet makes them (pkg/kubelet/config/common.go applyDefaults),
//! from a file or from the static pod URL: naming, UID, config annotations, and the API defaults the apiserver would have
//! filled in, so `kubectl get pod -o yaml` shows what a user expects.

use std::collections::BTreeMap;
use std::path::Path;

use k8s_openapi::api::core::v1::{Container, Pod, PodSecurityContext, PodStatus, Toleration};
use sha2::{Digest, Sha256};

use crate::pod::annotations::{
    CONFIG_HASH, CONFIG_SEEN, CONFIG_SOURCE, MANIFEST_FILE, SOURCE_FILE, SOURCE_HTTP,
};
use crate::time::Timestamp;

/// Where a static pod's manifest came from: a file in the manifest folder, or the
/// static pod URL. It names the pod's source and goes into its UID.
#[derive(Debug, Clone, Copy)]
pub enum Origin<'a> {
    File(&'a Path),
    Url(&'a str),
}

/// The UID of a static pod whose manifest sets none: a hash of the manifest as decoded
/// and where it came from (for a file, also the node), so that an edited manifest
/// becomes a new pod (the old one is replaced, as with the kubelet) and the same
/// manifest in two files, or at two URLs, never collides.
pub fn static_pod_uid(pod: &Pod, node_name: &str, origin: Origin<'_>) -> String {
    let mut hasher = Sha256::new();
    match origin {
        Origin::File(file) => {
            hasher.update(b"host:");
            hasher.update(node_name.as_bytes());
            hasher.update(b"\0file:");
            hasher.update(file.as_os_str().as_encoded_bytes());
        }
        // The kubelet hashes the URL alone: every node reading it gives the pod the
        // same UID.
        Origin::Url(url) => {
            hasher.update(b"url:");
            hasher.update(url.as_bytes());
        }
    }
    hasher.update(b"\0");
    // Serialising a Pod cannot fail (every map key is a string); an empty body would
    // still give a stable UID from where it came from.
    hasher.update(serde_json::to_vec(pod).unwrap_or_default());
    let digest = hasher.finalize();
    digest.iter().take(16).map(|b| format!("{b:02x}")).collect()
}

/// Turns a validated manifest pod into the pod this node runs, as the kubelet's
/// applyDefaults does for its source. `config.seen` is left to the caller, which knows
/// when the pod was first seen.
pub fn make_static_pod(mut pod: Pod, node_name: &str, origin: Origin<'_>) -> Pod {
    let uid = match pod.metadata.uid.as_deref() {
        Some(uid) if !uid.is_empty() => uid.to_string(),
        _ => static_pod_uid(&pod, node_name, origin),
    };
    let meta = &mut pod.metadata;
    meta.uid = Some(uid.clone());
    if meta.namespace.as_deref().is_none_or(str::is_empty) {
        meta.namespace = Some("default".into());
    }
    let name = meta.name.clone().unwrap_or_default();
    meta.name = Some(format!("{name}-{}", node_name.to_lowercase()));
    let annotations = meta.annotations.get_or_insert_with(BTreeMap::new);
    annotations.insert(CONFIG_HASH.into(), uid);
    match origin {
        Origin::File(file) => {
            annotations.insert(CONFIG_SOURCE.into(), SOURCE_FILE.into());
            annotations.insert(MANIFEST_FILE.into(), file.display().to_string());
        }
        Origin::Url(_) => {
            annotations.insert(CONFIG_SOURCE.into(), SOURCE_HTTP.into());
        }
    }

    apply_api_defaults(&mut pod);
    let spec = pod.spec.get_or_insert_with(Default::default);
    spec.node_name = Some(node_name.to_string());
    // Static pods from files tolerate every NoExecute taint so node problems never
    // evict them: nothing would bring them back. The kubelet gives pods from its URL
    // no such toleration.
    if let Origin::File(_) = origin {
        let tolerations = spec.tolerations.get_or_insert_with(Vec::new);
        let wanted = Toleration {
            operator: Some("Exists".into()),
            effect: Some("NoExecute".into()),
            ..Toleration::default()
        };
        if !tolerations.contains(&wanted) {
            tolerations.push(wanted);
        }
    }
    let status = pod.status.get_or_insert_with(PodStatus::default);
    status.phase = Some("Pending".into());
    pod
}

/// Records when the source first saw the pod, as RFC 3339.
pub fn set_seen(pod: &mut Pod, seen: Timestamp) {
    pod.metadata
        .annotations
        .get_or_insert_with(BTreeMap::new)
        .insert(CONFIG_SEEN.into(), crate::time::rfc3339_nano(seen));
}

/// The defaults the apiserver fills in for fields a manifest leaves out.
pub fn apply_api_defaults(pod: &mut Pod) {
    let spec = pod.spec.get_or_insert_with(Default::default);
    spec.restart_policy.get_or_insert_with(|| "Always".into());
    spec.termination_grace_period_seconds.get_or_insert(30);
    spec.dns_policy.get_or_insert_with(|| "ClusterFirst".into());
    spec.scheduler_name
        .get_or_insert_with(|| "default-scheduler".into());
    spec.security_context
        .get_or_insert_with(PodSecurityContext::default);
    spec.enable_service_links.get_or_insert(true);
    spec.priority.get_or_insert(0);
    for c in spec
        .init_containers
        .iter_mut()
        .flatten()
        .chain(spec.containers.iter_mut())
    {
        container_defaults(c);
    }
}

fn container_defaults(c: &mut Container) {
    c.termination_message_path
        .get_or_insert_with(|| "/dev/termination-log".into());
    c.termination_message_policy
        .get_or_insert_with(|| "File".into());
    if c.image_pull_policy.is_none() {
        let image = c.image.as_deref().unwrap_or_default();
        c.image_pull_policy = Some(default_pull_policy(image).into());
    }
    for port in c.ports.iter_mut().flatten() {
        port.protocol.get_or_insert_with(|| "TCP".into());
    }
}

/// `Always` for a `latest` or missing tag without a digest, as the apiserver defaults
/// it: such a reference names no fixed image.
pub fn default_pull_policy(image: &str) -> &'static str {
    if image.contains('@') {
        return "IfNotPresent";
    }
    // A ':' after the last '/' starts a tag; one before it is a registry port.
    let last = image.rsplit('/').next().unwrap_or(image);
    match last.split_once(':') {
        Some((_, tag)) if tag != "latest" => "IfNotPresent",
        _ => "Always",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn manifest() -> Pod {
        serde_yaml::from_str(
            "apiVersion: v1
kind: Pod
metadata: {name: sleep, labels: {app: sleep}}
spec:
  containers:
  - name: sleep
    image: busybox:demo
    command: [sleep, '3600']
    ports: [{containerPort: 8080}]
",
        )
        .expect("manifest")
    }

    #[test]
    fn pull_policy_defaults() {
        assert_eq!(default_pull_policy("busybox"), "Always");
        assert_eq!(default_pull_policy("busybox:latest"), "Always");
        assert_eq!(default_pull_policy("busybox:1.36"), "IfNotPresent");
        assert_eq!(default_pull_policy("registry:5000/busybox"), "Always");
        assert_eq!(
            default_pull_policy("registry:5000/busybox:1"),
            "IfNotPresent"
        );
        assert_eq!(
            default_pull_policy("busybox@sha256:0123456789abcdef"),
            "IfNotPresent"
        );
    }

    #[test]
    fn uid_is_stable_and_depends_on_content_node_and_file() {
        let f = Path::new("/etc/kubernetes/manifests/sleep.yaml");
        let uid = static_pod_uid(&manifest(), "gw-1", Origin::File(f));
        assert_eq!(uid.len(), 32);
        assert!(uid
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)));
        assert_eq!(uid, static_pod_uid(&manifest(), "gw-1", Origin::File(f)));
        assert_ne!(uid, static_pod_uid(&manifest(), "gw-2", Origin::File(f)));
        assert_ne!(
            uid,
            static_pod_uid(
                &manifest(),
                "gw-1",
                Origin::File(Path::new("/m/other.yaml"))
            )
        );
        let mut edited = manifest();
        edited.spec.as_mut().expect("spec").containers[0].image = Some("busybox:other".into());
        assert_ne!(uid, static_pod_uid(&edited, "gw-1", Origin::File(f)));
    }

    #[test]
    fn static_pod_gets_kubelet_and_api_defaults() {
        let f = Path::new("/m/sleep.yaml");
        let pod = make_static_pod(manifest(), "gw-1", Origin::File(f));
        let meta = &pod.metadata;
        let uid = static_pod_uid(&manifest(), "gw-1", Origin::File(f));
        assert_eq!(meta.name.as_deref(), Some("sleep-gw-1"));
        assert_eq!(meta.namespace.as_deref(), Some("default"));
        assert_eq!(meta.uid.as_deref(), Some(uid.as_str()));
        let ann = meta.annotations.as_ref().expect("annotations");
        assert_eq!(ann.get(CONFIG_SOURCE).map(String::as_str), Some("file"));
        assert_eq!(ann.get(CONFIG_HASH), Some(&uid));
        assert!(!ann.contains_key(CONFIG_SEEN));
        let spec = pod.spec.as_ref().expect("spec");
        assert_eq!(spec.node_name.as_deref(), Some("gw-1"));
        assert_eq!(spec.restart_policy.as_deref(), Some("Always"));
        assert_eq!(spec.termination_grace_period_seconds, Some(30));
        assert_eq!(spec.dns_policy.as_deref(), Some("ClusterFirst"));
        assert_eq!(spec.scheduler_name.as_deref(), Some("default-scheduler"));
        assert_eq!(spec.security_context, Some(PodSecurityContext::default()));
        assert_eq!(spec.enable_service_links, Some(true));
        assert_eq!(spec.priority, Some(0));
        let c = &spec.containers[0];
        assert_eq!(
            c.termination_message_path.as_deref(),
            Some("/dev/termination-log")
        );
        assert_eq!(c.termination_message_policy.as_deref(), Some("File"));
        assert_eq!(c.image_pull_policy.as_deref(), Some("IfNotPresent"));
        assert_eq!(
            c.ports.as_ref().expect("ports")[0].protocol.as_deref(),
            Some("TCP")
        );
        let tolerations = spec.tolerations.as_ref().expect("tolerations");
        assert_eq!(tolerations.len(), 1);
        assert_eq!(tolerations[0].operator.as_deref(), Some("Exists"));
        assert_eq!(tolerations[0].effect.as_deref(), Some("NoExecute"));
        assert_eq!(
            pod.status.as_ref().and_then(|s| s.phase.as_deref()),
            Some("Pending")
        );
    }

    #[test]
    fn manifest_values_win_over_defaults() {
        let mut m = manifest();
        m.metadata.uid = Some("given-uid".into());
        m.metadata.namespace = Some("edge".into());
        let spec = m.spec.as_mut().expect("spec");
        spec.restart_policy = Some("Never".into());
        spec.termination_grace_period_seconds = Some(0);
        spec.tolerations = Some(vec![Toleration {
            operator: Some("Exists".into()),
            effect: Some("NoExecute".into()),
            ..Toleration::default()
        }]);
        let pod = make_static_pod(m, "gw-1", Origin::File(Path::new("/m/sleep.yaml")));
        assert_eq!(pod.metadata.uid.as_deref(), Some("given-uid"));
        assert_eq!(pod.metadata.namespace.as_deref(), Some("edge"));
        let spec = pod.spec.as_ref().expect("spec");
        assert_eq!(spec.restart_policy.as_deref(), Some("Never"));
        assert_eq!(spec.termination_grace_period_seconds, Some(0));
        assert_eq!(spec.tolerations.as_ref().map(Vec::len), Some(1));
    }

    #[test]
    fn a_pod_from_the_url_is_named_and_hashed_as_the_kubelet_does() {
        let url = "http://10.0.0.1/pods.yaml";
        let pod = make_static_pod(manifest(), "GW-1", Origin::Url(url));
        let meta = &pod.metadata;
        assert_eq!(meta.name.as_deref(), Some("sleep-gw-1"));
        assert_eq!(meta.namespace.as_deref(), Some("default"));
        let uid = static_pod_uid(&manifest(), "GW-1", Origin::Url(url));
        assert_eq!(meta.uid.as_deref(), Some(uid.as_str()));
        // The URL, not the node, goes into the UID; another URL gives another.
        assert_eq!(uid, static_pod_uid(&manifest(), "gw-2", Origin::Url(url)));
        assert_ne!(
            uid,
            static_pod_uid(
                &manifest(),
                "GW-1",
                Origin::Url("http://10.0.0.2/pods.yaml")
            )
        );
        assert_ne!(
            uid,
            static_pod_uid(&manifest(), "GW-1", Origin::File(Path::new(url)))
        );
        let ann = meta.annotations.as_ref().expect("annotations");
        assert_eq!(ann.get(CONFIG_SOURCE).map(String::as_str), Some("http"));
        assert_eq!(ann.get(CONFIG_HASH), Some(&uid));
        assert!(!ann.contains_key(MANIFEST_FILE));
        let spec = pod.spec.as_ref().expect("spec");
        assert_eq!(spec.node_name.as_deref(), Some("GW-1"));
        assert_eq!(spec.tolerations, None);
        assert_eq!(spec.restart_policy.as_deref(), Some("Always"));
    }
}
