//! Local storage limits, as the kubelet's eviction manager enforces them on every look,
//! before it looks at node pressure (`localStorageEviction`): a pod is evicted when a
//! disk emptyDir holds more than its `sizeLimit` (`emptyDirLimitEviction`), when all it
//! wrote exceeds the sum of its containers' `limits.ephemeral-storage`
//! (`podEphemeralStorageLimitEviction`), or when one container's writable layer and
//! logs exceed that container's own limit (`containerEphemeralStorageLimitEviction`),
//! checked in that order, with the kubelet's messages. A `medium: Memory` emptyDir is
//! no disk: its tmpfs counts against the pod's memory.
//!
//! Only pods that set such a limit are measured ([`limited`]), each a bounded walk of
//! its own directories (see `node::du`); [`exceeded`] decides, pure.

use std::path::{Path, PathBuf};

use k8s_openapi::api::core::v1::Pod;

use crate::pod::requests::{container_storage_limit, pod_storage_limit, StorageAmount};

/// What a pod holds on the node's disk.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PodUsage {
    /// Each container, by name: its writable layer and its logs.
    pub containers: Vec<(String, u64)>,
    /// Each emptyDir on disk, by volume name.
    pub empty_dirs: Vec<(String, u64)>,
    /// False when a walk stopped at its bound: the numbers are lower bounds.
    pub complete: bool,
}

impl PodUsage {
    /// All of it: the kubelet's pod `ephemeral-storage` usage.
    pub fn total(&self) -> u64 {
        self.containers
            .iter()
            .chain(&self.empty_dirs)
            .map(|(_, u)| *u)
            .fold(0, u64::saturating_add)
    }
}

/// Where a pod's writes are, for [`measure`].
pub struct PodDirs<'a> {
    /// The agent's root dir (`containers/<id>/upper`).
    pub root_dir: &'a Path,
    /// `<root>/pods/<uid>`.
    pub pod_dir: PathBuf,
    /// The pod's log folder (`<container>/` below it).
    pub log_dir: PathBuf,
    /// Each container with an instance on disk: `(name, container id)`.
    pub containers: Vec<(String, String)>,
}

/// Whether `pod` sets a limit this module enforces: no other pod is measured.
pub fn limited(pod: &Pod) -> bool {
    let Some(spec) = &pod.spec else { return false };
    let disk_size_limit = spec.volumes.iter().flatten().any(|v| {
        v.empty_dir
            .as_ref()
            .is_some_and(|e| e.medium.as_deref() != Some("Memory") && e.size_limit.is_some())
    });
    disk_size_limit
        || spec
            .containers
            .iter()
            .chain(spec.init_containers.iter().flatten())
            .any(|c| container_storage_limit(c).is_some())
}

/// Measures what `pod` holds on the disk.
pub fn measure(pod: &Pod, dirs: &PodDirs<'_>) -> PodUsage {
    let mut complete = true;
    let mut du = |path: &Path| {
        let u = crate::node::du::usage(path);
        complete &= u.complete;
        u.bytes
    };
    let mut containers = Vec::new();
    for (name, id) in &dirs.containers {
        // Names from the spec become path components only when they are one.
        if !is_component(name) || !is_component(id) {
            continue;
        }
        let upper = dirs.root_dir.join("containers").join(id).join("upper");
        let used = du(&upper).saturating_add(du(&dirs.log_dir.join(name)));
        containers.push((name.clone(), used));
    }
    let mut empty_dirs = Vec::new();
    let volumes = pod.spec.iter().flat_map(|s| s.volumes.iter().flatten());
    for v in volumes {
        let Some(e) = &v.empty_dir else { continue };
        if e.medium.as_deref() == Some("Memory") {
            continue;
        }
        let Some(dir) = crate::volume::empty_dir_path(&dirs.pod_dir, &v.name) else {
            continue;
        };
        empty_dirs.push((v.name.clone(), du(&dir)));
    }
    PodUsage {
        containers,
        empty_dirs,
        complete,
    }
}

fn is_component(name: &str) -> bool {
    !name.is_empty() && !name.contains('/') && !name.starts_with('.')
}

/// The kubelet's eviction message when `pod`, using `usage`, is over one of its local
/// storage limits.
pub fn exceeded(pod: &Pod, usage: &PodUsage) -> Option<String> {
    empty_dir_over(pod, usage)
        .or_else(|| pod_over(pod, usage))
        .or_else(|| container_over(pod, usage))
}

fn empty_dir_over(pod: &Pod, usage: &PodUsage) -> Option<String> {
    let volumes = pod.spec.iter().flat_map(|s| s.volumes.iter().flatten());
    for v in volumes {
        let Some(size) = v.empty_dir.as_ref().and_then(|e| e.size_limit.as_ref()) else {
            continue;
        };
        let Some(used) = usage
            .empty_dirs
            .iter()
            .find(|(n, _)| *n == v.name)
            .map(|(_, u)| *u)
        else {
            continue;
        };
        let Some(size) = StorageAmount::parse(&size.0).filter(|s| s.bytes > 0) else {
            continue;
        };
        if used > size.bytes {
            return Some(format!(
                "Usage of EmptyDir volume {:?} exceeds the limit {:?}. ",
                v.name,
                size.text()
            ));
        }
    }
    None
}

fn pod_over(pod: &Pod, usage: &PodUsage) -> Option<String> {
    let limit = pod_storage_limit(pod)?;
    (usage.total() > limit.bytes).then(|| {
        format!(
            "Pod ephemeral local storage usage exceeds the total limit of containers {}. ",
            limit.text()
        )
    })
}

fn container_over(pod: &Pod, usage: &PodUsage) -> Option<String> {
    let spec = pod.spec.as_ref()?;
    for (name, used) in &usage.containers {
        let Some(c) = spec.containers.iter().find(|c| c.name == *name) else {
            continue;
        };
        let Some(limit) = container_storage_limit(c).filter(|l| l.bytes > 0) else {
            continue;
        };
        if *used > limit.bytes {
            return Some(format!(
                "Container {name} exceeded its local ephemeral storage limit {:?}. ",
                limit.text()
            ));
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(spec: serde_json::Value) -> Pod {
        serde_json::from_value(serde_json::json!({"metadata": {"name": "p"}, "spec": spec}))
            .expect("pod")
    }

    fn usage(containers: &[(&str, u64)], empty_dirs: &[(&str, u64)]) -> PodUsage {
        let own = |v: &[(&str, u64)]| v.iter().map(|(n, u)| (n.to_string(), *u)).collect();
        PodUsage {
            containers: own(containers),
            empty_dirs: own(empty_dirs),
            complete: true,
        }
    }

    const MI: u64 = 1 << 20;

    #[test]
    fn each_limit_with_the_kubelets_message() {
        let p = pod(serde_json::json!({
            "containers": [
                {"name": "a", "resources": {"limits": {"ephemeral-storage": "5Mi"}}},
                {"name": "b", "resources": {"limits": {"ephemeral-storage": "5Mi"}}},
                {"name": "c"},
            ],
            "volumes": [
                {"name": "scratch", "emptyDir": {"sizeLimit": "5120Ki"}},
                {"name": "ram", "emptyDir": {"medium": "Memory", "sizeLimit": "1Mi"}},
            ],
        }));
        assert!(limited(&p));
        assert_eq!(
            exceeded(
                &p,
                &usage(&[("a", MI), ("c", 3 * MI)], &[("scratch", 4 * MI)])
            ),
            None
        );
        assert_eq!(
            exceeded(&p, &usage(&[("a", MI)], &[("scratch", 6 * MI)])).as_deref(),
            Some("Usage of EmptyDir volume \"scratch\" exceeds the limit \"5Mi\". ")
        );
        // Within each container's limit, over the pod's 10Mi in all.
        assert_eq!(
            exceeded(
                &p,
                &usage(&[("a", 4 * MI), ("b", 4 * MI), ("c", 3 * MI)], &[])
            )
            .as_deref(),
            Some("Pod ephemeral local storage usage exceeds the total limit of containers 10Mi. ")
        );
        assert_eq!(
            exceeded(&p, &usage(&[("a", 1), ("b", 6 * MI)], &[])).as_deref(),
            Some("Container b exceeded its local ephemeral storage limit \"5Mi\". ")
        );
    }

    #[test]
    fn the_pods_limit_as_the_api_sums_it() {
        let p = pod(serde_json::json!({
            "initContainers": [
                {"name": "setup", "resources": {"limits": {"ephemeral-storage": "50M"}}},
                {"name": "side", "restartPolicy": "Always",
                 "resources": {"limits": {"ephemeral-storage": "2M"}}},
            ],
            "containers": [{"name": "main", "resources": {"limits": {"ephemeral-storage": "8M"}}}],
        }));
        assert_eq!(
            pod_storage_limit(&p).map(StorageAmount::text).as_deref(),
            Some("50M")
        );
        let p = pod(serde_json::json!({
            "initContainers": [
                {"name": "side", "restartPolicy": "Always",
                 "resources": {"limits": {"ephemeral-storage": "2M"}}},
                {"name": "setup", "resources": {"limits": {"ephemeral-storage": "9M"}}},
            ],
            "containers": [{"name": "main", "resources": {"limits": {"ephemeral-storage": "8M"}}}],
            "overhead": {"ephemeral-storage": "1M"},
        }));
        assert_eq!(
            pod_storage_limit(&p).map(StorageAmount::text).as_deref(),
            Some("12M")
        );
        let none = pod(serde_json::json!({
            "containers": [{"name": "main", "resources": {"limits": {"memory": "8Mi"}}}],
            "volumes": [{"name": "ram", "emptyDir": {"medium": "Memory", "sizeLimit": "1Mi"}}],
        }));
        assert!(!limited(&none));
        assert_eq!(exceeded(&none, &usage(&[("main", u64::MAX)], &[])), None);
    }

    #[test]
    fn outlandish_numbers_saturate() {
        let p = pod(serde_json::json!({
            "containers": [
                {"name": "a", "resources": {"limits": {"ephemeral-storage": "8Ei"}}},
                {"name": "b", "resources": {"limits": {"ephemeral-storage": "8Ei"}}},
            ],
        }));
        assert_eq!(pod_storage_limit(&p).map(|a| a.bytes), Some(u64::MAX));
        let u = usage(&[("a", 1 << 63), ("b", 1 << 63)], &[]);
        assert_eq!(u.total(), u64::MAX);
        assert_eq!(exceeded(&p, &u), None);
    }
}
