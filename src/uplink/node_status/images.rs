//! What the Node says of its container runtime, as the kubelet fills it from the CRI:
//! `images` (the image store's images, largest first, each named by its repo digests
//! then its tags), `runtimeHandlers` and `features`, as holdfast supports them.

use k8s_openapi::api::core::v1::{
    ContainerImage, NodeFeatures, NodeRuntimeHandler, NodeRuntimeHandlerFeatures,
};

use crate::image::{repo_digest, ImageRecord};

/// The kubelet's `nodeStatusMaxImages` default.
pub const MAX_IMAGES: usize = 50;
/// The kubelet's `MaxNamesPerImageInNodeStatus`.
const MAX_NAMES: usize = 5;

/// `status.images`: largest first, at most `max`, each with its repo digests and then
/// its tags (up to five names), and its size in bytes.
pub fn images(records: &[ImageRecord], max: usize) -> Vec<ContainerImage> {
    let mut sorted: Vec<&ImageRecord> = records.iter().collect();
    sorted.sort_by_key(|r| std::cmp::Reverse(r.size));
    sorted
        .into_iter()
        .take(max)
        .map(|r| {
            let mut names: Vec<String> = Vec::new();
            for reference in &r.references {
                let digest = repo_digest(reference, &r.manifest_digest);
                if !names.contains(&digest) {
                    names.push(digest);
                }
            }
            names.extend(r.references.iter().filter(|x| !x.contains('@')).cloned());
            names.truncate(MAX_NAMES);
            ContainerImage {
                names: Some(names),
                size_bytes: i64::try_from(r.size).ok(),
            }
        })
        .collect()
}

/// `status.runtimeHandlers`: the one (default, unnamed) handler, with what it does:
/// no recursive read-only mounts, no user namespaces (`hostUsers: false` is refused).
pub fn runtime_handlers() -> Vec<NodeRuntimeHandler> {
    vec![NodeRuntimeHandler {
        name: Some(String::new()),
        features: Some(NodeRuntimeHandlerFeatures {
            recursive_read_only_mounts: Some(false),
            user_namespaces: Some(false),
        }),
    }]
}

/// `status.features`: `supplementalGroupsPolicy: Strict` is not honoured.
pub fn features() -> NodeFeatures {
    NodeFeatures {
        supplemental_groups_policy: Some(false),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(refs: &[&str], digest: &str, size: u64) -> ImageRecord {
        ImageRecord {
            references: refs.iter().map(|s| s.to_string()).collect(),
            manifest_digest: digest.into(),
            config_digest: "sha256:c".into(),
            layers: Vec::new(),
            size,
            imported_at: crate::time::Timestamp::from_second(1_800_000_000).expect("ts"),
            last_used: None,
            pinned: false,
        }
    }

    #[test]
    fn images_are_listed_largest_first_with_digests_then_tags() {
        let records = [
            record(&["docker.io/library/busybox:demo"], "sha256:b", 10),
            record(
                &["registry.local/app:1", "registry.local/app:latest"],
                "sha256:a",
                30,
            ),
        ];
        let list = images(&records, MAX_IMAGES);
        assert_eq!(list[0].size_bytes, Some(30));
        assert_eq!(
            list[0].names.as_deref(),
            Some(
                &[
                    "registry.local/app@sha256:a".to_string(),
                    "registry.local/app:1".to_string(),
                    "registry.local/app:latest".to_string(),
                ][..]
            )
        );
        assert_eq!(
            list[1].names.as_deref(),
            Some(
                &[
                    "docker.io/library/busybox@sha256:b".to_string(),
                    "docker.io/library/busybox:demo".to_string(),
                ][..]
            )
        );
        assert_eq!(images(&records, 1).len(), 1);
    }

    #[test]
    fn the_runtime_says_what_it_does_not_do() {
        let h = &runtime_handlers()[0];
        assert_eq!(h.name.as_deref(), Some(""));
        let f = h.features.as_ref().expect("features");
        assert_eq!(f.recursive_read_only_mounts, Some(false));
        assert_eq!(f.user_namespaces, Some(false));
        assert_eq!(features().supplemental_groups_policy, Some(false));
    }
}
