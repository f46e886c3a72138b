//! emptyDir: a directory on the pod's disk, or a tmpfs (`medium: Memory`) sized as the
//! kubelet sizes it. Also the tmpfs under secret and projected volumes.

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;

use k8s_openapi::api::core::v1::{EmptyDirVolumeSource, Pod};
use nix::mount::MsFlags;

use super::VolumeError;

fn io(context: String) -> impl FnOnce(std::io::Error) -> VolumeError {
    move |source| VolumeError::Io { context, source }
}

/// Sets the volume up in `dir` (kept as it is when there already). `allocatable_memory`
/// is the node's allocatable memory, the most a tmpfs of the pods may hold.
pub fn setup(
    pod: &Pod,
    dir: &Path,
    src: &EmptyDirVolumeSource,
    fs_group: Option<u32>,
    allocatable_memory: Option<u64>,
) -> Result<(), VolumeError> {
    if src.medium.as_deref() == Some("Memory") {
        memory(dir, memory_size(pod, src, allocatable_memory)?)?;
    } else {
        std::fs::create_dir_all(dir).map_err(io(format!("create {}", dir.display())))?;
        // What the pod writes here is reachable from the host below the root dir: a
        // mount of its own, nosuid and nodev, as the tmpfs of `medium: Memory` is.
        crate::runtime::bind_nosuid_nodev(dir, false).map_err(|reason| VolumeError::Payload {
            dir: dir.to_owned(),
            reason,
        })?;
    }
    // The kubelet makes emptyDir world-writable: whoever the containers run as may
    // write it.
    let meta = std::fs::metadata(dir).map_err(io(format!("stat {}", dir.display())))?;
    if meta.mode() & 0o777 != 0o777 {
        std::fs::set_permissions(
            dir,
            std::fs::Permissions::from_mode(meta.mode() & 0o7000 | 0o777),
        )
        .map_err(io(format!("chmod {}", dir.display())))?;
    }
    if let Some(gid) = fs_group {
        own(dir, gid)?;
    }
    Ok(())
}

/// The tmpfs size as the kubelet's `calculateEmptyDirMemorySize` makes it: the node's
/// allocatable memory, lowered to the pod's memory limit (when every container has
/// one, as the pod's cgroup is limited), lowered to `sizeLimit`. A tmpfs of the
/// kernel's default size (half the RAM) only when the node's allocatable is unknown
/// and nothing else bounds it.
fn memory_size(
    pod: &Pod,
    src: &EmptyDirVolumeSource,
    allocatable_memory: Option<u64>,
) -> Result<Option<u64>, VolumeError> {
    let unsupported = |reason: String| VolumeError::Unsupported {
        volume: String::new(),
        reason,
    };
    let pod_limit = crate::pod::requests::pod_resources(pod)
        .map_err(|e| unsupported(format!("pod resources: {e}")))?
        .memory_limit;
    let size_limit = match &src.size_limit {
        Some(q) => Some(
            crate::quantity::parse_bytes(&q.0)
                .map_err(|reason| unsupported(format!("sizeLimit: {reason}")))?,
        ),
        None => None,
    };
    let mut size = allocatable_memory.filter(|a| *a > 0);
    // Each bound counts when it is above zero and no larger than the one before it.
    for bound in [pod_limit, size_limit].into_iter().flatten() {
        if bound > 0 && size.is_none_or(|s| bound <= s) {
            size = Some(bound);
        }
    }
    Ok(size)
}

/// A tmpfs at `dir`, mounted unless it is already.
pub fn memory(dir: &Path, size: Option<u64>) -> Result<(), VolumeError> {
    std::fs::create_dir_all(dir).map_err(io(format!("create {}", dir.display())))?;
    if crate::runtime::is_mount_point(dir).map_err(io("read /proc/self/mountinfo".into()))? {
        return Ok(());
    }
    let options = size.map(|s| format!("size={s}"));
    nix::mount::mount(
        Some("tmpfs"),
        dir,
        Some("tmpfs"),
        MsFlags::MS_NOSUID | MsFlags::MS_NODEV,
        options.as_deref(),
    )
    .map_err(|e| VolumeError::Io {
        context: format!("mount tmpfs at {}", dir.display()),
        source: e.into(),
    })
}

/// fsGroup as the kubelet's SetVolumeOwnership (with OnRootMismatch: nothing to do
/// when the root already has the group): everything gets the group, group read and
/// write, directories also setgid and group search.
fn own(dir: &Path, gid: u32) -> Result<(), VolumeError> {
    let meta = std::fs::metadata(dir).map_err(io(format!("stat {}", dir.display())))?;
    if meta.gid() == gid && meta.mode() & 0o2000 != 0 {
        return Ok(());
    }
    let mut stack = vec![dir.to_owned()];
    while let Some(p) = stack.pop() {
        let meta = match std::fs::symlink_metadata(&p) {
            Ok(m) => m,
            Err(_) => continue,
        };
        let _ = nix::unistd::fchownat(
            None,
            &p,
            None,
            Some(nix::unistd::Gid::from_raw(gid)),
            nix::fcntl::AtFlags::AT_SYMLINK_NOFOLLOW,
        );
        if meta.file_type().is_symlink() {
            continue;
        }
        let mut mode = meta.mode() & 0o7777 | 0o660;
        if meta.is_dir() {
            mode |= 0o2110;
            for e in std::fs::read_dir(&p).into_iter().flatten().flatten() {
                stack.push(e.path());
            }
        }
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(mode))
            .map_err(io(format!("chmod {}", p.display())))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{Container, PodSpec, ResourceRequirements};
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

    fn pod(limits: &[Option<&str>]) -> Pod {
        Pod {
            spec: Some(PodSpec {
                containers: limits
                    .iter()
                    .map(|l| Container {
                        name: "c".into(),
                        resources: l.map(|l| ResourceRequirements {
                            limits: Some([("memory".to_string(), Quantity(l.into()))].into()),
                            ..ResourceRequirements::default()
                        }),
                        ..Container::default()
                    })
                    .collect(),
                ..PodSpec::default()
            }),
            ..Pod::default()
        }
    }

    fn src(size: Option<&str>) -> EmptyDirVolumeSource {
        EmptyDirVolumeSource {
            medium: Some("Memory".into()),
            size_limit: size.map(|s| Quantity(s.into())),
        }
    }

    #[test]
    fn tmpfs_size_is_the_smaller_of_size_limit_the_pods_limit_and_allocatable() {
        let mi = 1024 * 1024;
        let alloc = Some(512 * mi);
        assert_eq!(
            memory_size(&pod(&[None]), &src(Some("8Mi")), alloc).ok(),
            Some(Some(8 * mi))
        );
        assert_eq!(
            memory_size(&pod(&[Some("4Mi"), Some("2Mi")]), &src(Some("8Mi")), alloc).ok(),
            Some(Some(6 * mi))
        );
        assert_eq!(
            memory_size(&pod(&[Some("64Mi")]), &src(None), alloc).ok(),
            Some(Some(64 * mi))
        );
        // A container without a limit: the pod may use all the pods may, no more.
        assert_eq!(
            memory_size(&pod(&[Some("64Mi"), None]), &src(None), alloc).ok(),
            Some(Some(512 * mi))
        );
        assert_eq!(
            memory_size(&pod(&[None]), &src(None), alloc).ok(),
            Some(Some(512 * mi))
        );
        // Bounds above what the node has for pods do not raise it.
        assert_eq!(
            memory_size(&pod(&[Some("1Gi")]), &src(Some("2Gi")), alloc).ok(),
            Some(Some(512 * mi))
        );
        assert_eq!(
            memory_size(&pod(&[None]), &src(Some("0")), alloc).ok(),
            Some(Some(512 * mi))
        );
        assert_eq!(
            memory_size(&pod(&[None]), &src(None), None).ok(),
            Some(None)
        );
        assert!(memory_size(&pod(&[None]), &src(Some("lots")), alloc).is_err());
    }
}
