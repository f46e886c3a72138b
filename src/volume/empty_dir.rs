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

/// Sets the volume up in `dir` (kept as it is when there already).
pub fn setup(
    pod: &Pod,
    dir: &Path,
    src: &EmptyDirVolumeSource,
    fs_group: Option<u32>,
) -> Result<(), VolumeError> {
    if src.medium.as_deref() == Some("Memory") {
        memory(dir, memory_size(pod, src)?)?;
    } else {
        std::fs::create_dir_all(dir).map_err(io(format!("create {}", dir.display())))?;
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

/// The tmpfs size: sizeLimit, else the pod's memory limit when every container has
/// one, else the kernel's default (half the RAM) — never more than the pod may use.
fn memory_size(pod: &Pod, src: &EmptyDirVolumeSource) -> Result<Option<u64>, VolumeError> {
    let parse = |q: &str| {
        crate::quantity::parse_bytes(q).map_err(|reason| VolumeError::Unsupported {
            volume: String::new(),
            reason: format!("sizeLimit: {reason}"),
        })
    };
    let mut pod_limit: Option<u64> = Some(0);
    for c in pod.spec.iter().flat_map(|s| s.containers.iter()) {
        let l = c
            .resources
            .as_ref()
            .and_then(|r| r.limits.as_ref())
            .and_then(|l| l.get("memory"));
        pod_limit = match (pod_limit, l) {
            (Some(sum), Some(q)) => Some(sum.saturating_add(parse(&q.0)?)),
            _ => None,
        };
    }
    let pod_limit = pod_limit.filter(|l| *l > 0);
    let size_limit = match &src.size_limit {
        Some(q) => Some(parse(&q.0)?).filter(|s| *s > 0),
        None => None,
    };
    Ok(match (size_limit, pod_limit) {
        (Some(s), Some(p)) => Some(s.min(p)),
        (s, p) => s.or(p),
    })
}

/// A tmpfs at `dir`, mounted unless it is already.
pub fn memory(dir: &Path, size: Option<u64>) -> Result<(), VolumeError> {
    std::fs::create_dir_all(dir).map_err(io(format!("create {}", dir.display())))?;
    let mounted = crate::runtime::mounts_under(dir)
        .map_err(io("read /proc/self/mountinfo".into()))?
        .iter()
        .any(|m| m == dir);
    if mounted {
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
    fn tmpfs_size_is_the_smaller_of_size_limit_and_the_pods_limit() {
        let mi = 1024 * 1024;
        assert_eq!(
            memory_size(&pod(&[None]), &src(Some("8Mi"))).ok(),
            Some(Some(8 * mi))
        );
        assert_eq!(
            memory_size(&pod(&[Some("4Mi"), Some("2Mi")]), &src(Some("8Mi"))).ok(),
            Some(Some(6 * mi))
        );
        assert_eq!(
            memory_size(&pod(&[Some("64Mi")]), &src(None)).ok(),
            Some(Some(64 * mi))
        );
        // A container without a limit: the pod may use anything.
        assert_eq!(
            memory_size(&pod(&[Some("64Mi"), None]), &src(None)).ok(),
            Some(None)
        );
        assert!(memory_size(&pod(&[None]), &src(Some("lots"))).is_err());
    }
}
