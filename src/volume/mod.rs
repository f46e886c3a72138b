//! volume: a pod's volumes, set up in its directory before its containers start and
//! torn down (unmounted, removed) when the pod goes: emptyDir (on disk, or tmpfs with
//! `medium: Memory`), hostPath with its `type` checks, configMap, secret, downwardAPI
//! and projected (written by the kubelet's atomic writer, so updates land whole), and
//! each container's mounts of them (`subPath`, `subPathExpr`, `readOnly`,
//! `mountPropagation`). fsGroup owns what the pod writes.
//!
//! Owns `<root>/pods/<uid>/volumes/<plugin>/<name>/`, with the kubelet's plugin names
//! (`kubernetes.io~empty-dir`, `kubernetes.io~secret`, ...). Secret and projected
//! volumes are tmpfs, as the kubelet makes them: their contents never reach the flash.
//! Must not touch containers, namespaces or cgroups, and never deletes through a
//! hostPath. Never logs a volume's contents.
//!
//! Blocking (file IO, mounts); callers run this on a blocking thread.

mod atomic_writer;
mod empty_dir;
mod host_path;
pub mod host_path_allow;
mod projection;
mod subpath;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use k8s_openapi::api::core::v1::{Container, Pod};

use crate::runtime::BindMount;
pub use projection::Sources;

const VOLUMES: &str = "volumes";
const SUBPATHS: &str = "volume-subpaths";

#[derive(Debug, thiserror::Error)]
pub enum VolumeError {
    #[error("{kind} {name:?} not found")]
    NotFound {
        volume: String,
        kind: &'static str,
        name: String,
    },
    /// Not fetched from the apiserver yet: the pod waits for it, and no event says
    /// it is missing.
    #[error("failed to sync {kind} cache: {kind} {name:?} not fetched from the apiserver yet")]
    NotSynced {
        volume: String,
        kind: &'static str,
        name: String,
    },
    /// As the kubelet: `configmap references non-existent config key: k`.
    #[error("{} references non-existent {} key: {key}", kind, if *kind == "secret" { "secret" } else { "config" })]
    MissingKey {
        volume: String,
        kind: &'static str,
        name: String,
        key: String,
    },
    #[error("couldn't get {kind} {name:?} for volume {volume:?}, static pods cannot reference API objects")]
    StaticPod {
        volume: String,
        kind: &'static str,
        name: String,
    },
    #[error("volume {volume:?}: read the object cache: {reason}")]
    Cache { volume: String, reason: String },
    #[error("volume {volume:?}: {reason}")]
    DownwardApi { volume: String, reason: String },
    /// A serviceAccountToken that could not be had: `failed to fetch token: ...`.
    #[error("{reason}")]
    Token { volume: String, reason: String },
    #[error("hostPath type check failed: {path} is not {what}")]
    HostPathType {
        volume: String,
        path: PathBuf,
        what: &'static str,
    },
    #[error("volume {volume:?}: {reason}")]
    Unsupported { volume: String, reason: String },
    /// A static pod's hostPath outside `holdfast.staticPodAllowedHostPaths`.
    #[error("{reason}")]
    HostPathForbidden { volume: String, reason: String },
    #[error("volume {dir}: {reason}")]
    Payload { dir: PathBuf, reason: String },
    /// A volumeMount the pod's volumes cannot give (CreateContainerConfigError).
    #[error("{0}")]
    Mount(String),
    #[error("{context}")]
    Io {
        context: String,
        #[source]
        source: std::io::Error,
    },
    /// A volume's or a staged subPath's dir that could not go without reaching
    /// through a mount.
    #[error(transparent)]
    Remove(#[from] crate::runtime::RemoveError),
}

impl VolumeError {
    /// A config error of one container's mounts, as opposed to a volume that failed
    /// to set up for the whole pod (FailedMount).
    pub fn is_container_config(&self) -> bool {
        matches!(self, VolumeError::Mount(_))
    }

    /// An object the volume needs is on its way from the apiserver: wait, say nothing.
    pub fn is_waiting(&self) -> bool {
        matches!(self, VolumeError::NotSynced { .. })
    }

    /// The volume a set-up failure is about, for the FailedMount event.
    pub fn volume(&self) -> Option<&str> {
        match self {
            VolumeError::NotFound { volume, .. }
            | VolumeError::NotSynced { volume, .. }
            | VolumeError::MissingKey { volume, .. }
            | VolumeError::StaticPod { volume, .. }
            | VolumeError::Cache { volume, .. }
            | VolumeError::DownwardApi { volume, .. }
            | VolumeError::Token { volume, .. }
            | VolumeError::HostPathType { volume, .. }
            | VolumeError::HostPathForbidden { volume, .. }
            | VolumeError::Unsupported { volume, .. } => Some(volume),
            _ => None,
        }
    }

    /// The same error, naming volume `name` where it named none.
    fn in_volume(mut self, name: &str) -> Self {
        if let VolumeError::HostPathType { volume, .. }
        | VolumeError::HostPathForbidden { volume, .. }
        | VolumeError::Unsupported { volume, .. } = &mut self
        {
            if volume.is_empty() {
                *volume = name.to_owned();
            }
        }
        self
    }
}

/// One volume as containers mount it.
#[derive(Debug, Clone, PartialEq)]
pub struct Mounted {
    pub path: PathBuf,
    /// configMap, secret, downwardAPI and projected volumes are always read-only.
    pub read_only: bool,
    /// subPaths of emptyDir and hostPath volumes are made when missing.
    pub make_sub_paths: bool,
    /// Every volume but a hostPath holds what the pod wrote or was given, never the
    /// host's own programs: containers mount it `nosuid,nodev`.
    pub pod_owned: bool,
}

/// The pod's volumes by name, and what could not be provided (said as events).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct PodVolumes {
    pub volumes: BTreeMap<String, Mounted>,
    pub warnings: Vec<String>,
}

/// Where the pod's volumes live under its directory.
pub fn volumes_dir(pod_dir: &Path) -> PathBuf {
    pod_dir.join(VOLUMES)
}

/// The directory of the pod's emptyDir volume `name`, None for a name that is not one
/// directory entry.
pub fn empty_dir_path(pod_dir: &Path, name: &str) -> Option<PathBuf> {
    valid_name(name).then(|| {
        volumes_dir(pod_dir)
            .join("kubernetes.io~empty-dir")
            .join(name)
    })
}

fn valid_name(name: &str) -> bool {
    !(name.is_empty() || name.contains('/') || name.starts_with('.'))
}

/// Sets up (or brings up to date) every volume of `pod` under `pod_dir`: the first
/// time, after an agent restart (what is there is kept), and on every resync, when a
/// changed ConfigMap, Secret or label lands in its volumes.
pub fn setup(pod: &Pod, pod_dir: &Path, sources: &Sources<'_>) -> Result<PodVolumes, VolumeError> {
    let base = volumes_dir(pod_dir);
    let mut out = PodVolumes::default();
    let Some(spec) = &pod.spec else {
        return Ok(out);
    };
    for v in spec.volumes.iter().flatten() {
        let name = v.name.as_str();
        if !valid_name(name) {
            return Err(VolumeError::Unsupported {
                volume: name.to_owned(),
                reason: "invalid volume name".into(),
            });
        }
        let dir = |plugin: &str| base.join(format!("kubernetes.io~{plugin}")).join(name);
        let mounted =
            setup_one(pod, v, &dir, sources, &mut out.warnings).map_err(|e| e.in_volume(name))?;
        out.volumes.insert(name.to_owned(), mounted);
    }
    Ok(out)
}

/// One volume, in the directory `dir(plugin)` gives it.
fn setup_one(
    pod: &Pod,
    v: &k8s_openapi::api::core::v1::Volume,
    dir: &dyn Fn(&str) -> PathBuf,
    sources: &Sources<'_>,
    warnings: &mut Vec<String>,
) -> Result<Mounted, VolumeError> {
    let name = v.name.as_str();
    let mounted = if let Some(e) = &v.empty_dir {
        let d = dir("empty-dir");
        let allocatable = match sources.downward.allocatable.get("memory") {
            Some(q) => Some(crate::quantity::parse_bytes(&q.0).map_err(|reason| {
                VolumeError::Unsupported {
                    volume: name.to_owned(),
                    reason: format!("node allocatable memory: {reason}"),
                }
            })?),
            None => None,
        };
        empty_dir::setup(pod, &d, e, sources.fs_group, allocatable)?;
        Mounted {
            path: d,
            read_only: false,
            make_sub_paths: true,
            pod_owned: true,
        }
    } else if let Some(h) = &v.host_path {
        let p = host_path::setup(h, sources.allowed_host_paths)?;
        Mounted {
            path: p,
            read_only: false,
            make_sub_paths: true,
            pod_owned: false,
        }
    } else if let Some(cm) = &v.config_map {
        let d = dir("configmap");
        let payload = projection::config_map_payload(pod, name, cm, sources)?;
        atomic_writer::write(&d, &payload, sources.fs_group)?;
        Mounted {
            path: d,
            read_only: true,
            make_sub_paths: false,
            pod_owned: true,
        }
    } else if let Some(s) = &v.secret {
        let d = dir("secret");
        empty_dir::memory(&d, None)?;
        let payload = projection::secret_payload(pod, name, s, sources)?;
        atomic_writer::write(&d, &payload, sources.fs_group)?;
        Mounted {
            path: d,
            read_only: true,
            make_sub_paths: false,
            pod_owned: true,
        }
    } else if let Some(d_api) = &v.downward_api {
        let d = dir("downward-api");
        let mut payload = atomic_writer::Payload::new();
        projection::downward_api_payload(
            pod,
            name,
            d_api.items.as_deref().unwrap_or(&[]),
            d_api.default_mode,
            sources,
            &mut payload,
        )?;
        atomic_writer::write(&d, &payload, sources.fs_group)?;
        Mounted {
            path: d,
            read_only: true,
            make_sub_paths: false,
            pod_owned: true,
        }
    } else if let Some(p) = &v.projected {
        let d = dir("projected");
        empty_dir::memory(&d, None)?;
        let payload = projection::projected_payload(pod, name, p, sources, warnings)?;
        atomic_writer::write(&d, &payload, sources.fs_group)?;
        Mounted {
            path: d,
            read_only: true,
            make_sub_paths: false,
            pod_owned: true,
        }
    } else {
        return Err(VolumeError::Unsupported {
                volume: name.to_owned(),
                reason: "only emptyDir, hostPath, configMap, secret, downwardAPI and projected volumes are supported".into(),
            });
    };
    Ok(mounted)
}

/// `container`'s mounts of the pod's volumes; `env` expands `subPathExpr`. subPaths
/// are staged under `pod_dir`.
pub fn container_mounts(
    pod_dir: &Path,
    container: &Container,
    volumes: &PodVolumes,
    env: &[(String, String)],
) -> Result<Vec<BindMount>, VolumeError> {
    let mut out = Vec::new();
    for (index, vm) in container.volume_mounts.iter().flatten().enumerate() {
        let Some(v) = volumes.volumes.get(&vm.name) else {
            return Err(VolumeError::Mount(format!(
                "cannot find volume {:?} to mount into container {:?}",
                vm.name, container.name
            )));
        };
        if !vm.mount_path.starts_with('/') {
            return Err(VolumeError::Mount(format!(
                "mount path {:?} of container {:?} is not absolute",
                vm.mount_path, container.name
            )));
        }
        let sub = match (&vm.sub_path, &vm.sub_path_expr) {
            (Some(p), _) if !p.is_empty() => Some(p.clone()),
            (_, Some(e)) if !e.is_empty() => Some(sub_path_expr(container, vm, e, env)?),
            _ => None,
        };
        let source = match sub {
            None => v.path.clone(),
            Some(s) => {
                let staging = pod_dir
                    .join(SUBPATHS)
                    .join(&vm.name)
                    .join(&container.name)
                    .join(index.to_string());
                subpath::resolve(&v.path, &s, v.make_sub_paths, &staging)?
            }
        };
        out.push(BindMount {
            source,
            destination: vm.mount_path.clone(),
            read_only: v.read_only || vm.read_only == Some(true),
            propagation: vm.mount_propagation.clone(),
            nosuid_nodev: v.pod_owned,
        });
    }
    Ok(out)
}

/// The most a path may take with its NUL: Linux's `PATH_MAX`. A longer `subPathExpr`
/// could name nothing the kernel would open.
const PATH_MAX: usize = 4096;

/// `subPathExpr` of `vm` expanded from the container's environment, measured first:
/// each variable may be 128 KiB, so a few bytes of manifest could ask for megabytes.
fn sub_path_expr(
    container: &Container,
    vm: &k8s_openapi::api::core::v1::VolumeMount,
    expr: &str,
    env: &[(String, String)],
) -> Result<String, VolumeError> {
    let vars: std::collections::HashMap<String, String> = env.iter().cloned().collect();
    let bytes = crate::runtime::expanded_len(expr, &vars).saturating_add(1);
    if bytes > PATH_MAX {
        return Err(VolumeError::Mount(format!(
            "subPathExpr of the mount of volume {:?} at {:?} in container {:?} would take \
             {bytes} bytes ($(VAR) references expanded, with its NUL), more than the \
             {PATH_MAX} bytes a path may take (PATH_MAX): shorten it or the variables it \
             refers to",
            vm.name, vm.mount_path, container.name
        )));
    }
    Ok(crate::runtime::expand(expr, &vars))
}

/// Unmounts and removes every volume of the pod under `pod_dir`, and its staged
/// subPaths. What a hostPath or a subPath shows is a mount below them: unmounted
/// first, and never removed through (see [`crate::runtime::remove_unmounted`]).
pub fn teardown(pod_dir: &Path) -> Result<(), VolumeError> {
    for base in [pod_dir.join(SUBPATHS), volumes_dir(pod_dir)] {
        crate::runtime::remove_unmounted(&base)?;
    }
    Ok(())
}

#[cfg(test)]
#[path = "tests.rs"]
mod tests;
