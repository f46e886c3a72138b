//! Mirror pods: how a static pod shows in the cluster. The kubelet's rules: annotation
//! `kubernetes.io/config.mirror` holding the static pod's config hash, a controller
//! ownerReference to the node's own Node (NodeRestriction insists), spec as the static
//! pod's; a mirror pod whose hash is stale, that names a Node UID other than the node's
//! own (the Node was deleted and made again), or that someone deleted, is replaced.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};

use crate::pod::annotations::{static_hash, CONFIG_MIRROR};

/// A mirror pod as the cluster has it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mirror {
    pub uid: String,
    /// Its `kubernetes.io/config.mirror` annotation.
    pub hash: String,
    pub deleting: bool,
    /// The UID its Node ownerReference names; empty if it names none.
    pub owner: String,
}

impl Mirror {
    /// Reads a pod from the API as a mirror pod; `None` if it is not one.
    pub fn of(pod: &Pod) -> Option<Mirror> {
        let hash = pod
            .metadata
            .annotations
            .as_ref()?
            .get(CONFIG_MIRROR)?
            .clone();
        let owner = pod
            .metadata
            .owner_references
            .iter()
            .flatten()
            .find(|o| o.kind == "Node" && o.api_version == "v1")
            .map(|o| o.uid.clone())
            .unwrap_or_default();
        Some(Mirror {
            uid: pod.metadata.uid.clone().unwrap_or_default(),
            hash,
            deleting: pod.metadata.deletion_timestamp.is_some(),
            owner,
        })
    }

    /// Whether this mirror pod stands for the static pod whose hash is `hash` on the
    /// Node whose UID is `node_uid` (the garbage collector deletes one owned by a Node
    /// that is gone).
    pub fn is_current(&self, hash: &str, node_uid: Option<&str>) -> bool {
        !self.deleting && self.hash == hash && node_uid.is_none_or(|u| self.owner == u)
    }
}

/// The mirror pod to create for `static_pod` on node `node_name` (whose Node has
/// `node_uid`).
pub fn mirror_pod(static_pod: &Pod, node_name: &str, node_uid: &str) -> Pod {
    let hash = static_hash(static_pod);
    let mut annotations: BTreeMap<String, String> =
        static_pod.metadata.annotations.clone().unwrap_or_default();
    annotations.insert(CONFIG_MIRROR.into(), hash);
    let mut spec = static_pod.spec.clone().unwrap_or_default();
    spec.node_name = Some(node_name.to_string());
    Pod {
        metadata: ObjectMeta {
            name: static_pod.metadata.name.clone(),
            namespace: static_pod.metadata.namespace.clone(),
            labels: static_pod.metadata.labels.clone(),
            annotations: Some(annotations),
            owner_references: Some(vec![OwnerReference {
                api_version: "v1".into(),
                kind: "Node".into(),
                name: node_name.to_string(),
                uid: node_uid.to_string(),
                controller: Some(true),
                block_owner_deletion: None,
            }]),
            ..ObjectMeta::default()
        },
        spec: Some(spec),
        status: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pod::annotations::{is_mirror, CONFIG_HASH};
    use k8s_openapi::api::core::v1::{Container, PodSpec};

    fn static_pod() -> Pod {
        Pod {
            metadata: ObjectMeta {
                name: Some("web-edge-node-1".into()),
                namespace: Some("default".into()),
                uid: Some("static-uid".into()),
                annotations: Some(BTreeMap::from([
                    (CONFIG_HASH.to_string(), "abc123".to_string()),
                    (
                        "kubernetes.io/config.source".to_string(),
                        "file".to_string(),
                    ),
                ])),
                ..ObjectMeta::default()
            },
            spec: Some(PodSpec {
                containers: vec![Container {
                    name: "web".into(),
                    image: Some("busybox".into()),
                    ..Container::default()
                }],
                ..PodSpec::default()
            }),
            status: None,
        }
    }

    #[test]
    fn mirror_carries_the_hash_and_a_controller_reference() {
        let m = mirror_pod(&static_pod(), "edge-node-1", "node-uid");
        let v = serde_json::to_value(&m).expect("json");
        assert_eq!(v["metadata"]["annotations"][CONFIG_MIRROR], "abc123");
        assert_eq!(
            v["metadata"]["annotations"]["kubernetes.io/config.source"],
            "file"
        );
        assert!(v["metadata"].get("uid").is_none());
        assert_eq!(
            v["metadata"]["ownerReferences"],
            serde_json::json!([{"apiVersion":"v1","kind":"Node","name":"edge-node-1","uid":"node-uid","controller":true}])
        );
        assert_eq!(v["spec"]["nodeName"], "edge-node-1");
        assert!(is_mirror(&m));
        assert!(!is_mirror(&static_pod()));
        let read = Mirror::of(&m).expect("mirror");
        assert_eq!(read.hash, "abc123");
        assert!(!read.deleting);
        assert_eq!(read.owner, "node-uid");
        assert!(read.is_current("abc123", Some("node-uid")));
        assert!(read.is_current("abc123", None));
        assert!(!read.is_current("abc124", Some("node-uid")), "stale hash");
        assert!(
            !read.is_current("abc123", Some("new-node-uid")),
            "the Node was made again"
        );
    }
}
