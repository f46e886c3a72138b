//! What a pod's containers share, as the runtime applies it to one container's spec:
//! the pod's namespaces (joined by the path that holds them), its cgroup, its
//! `/etc/hosts`, `/etc/resolv.conf`, `/etc/hostname` and `/dev/shm`, and the
//! container's volume mounts. The agent sets all of these up before any container of
//! the pod starts (`network`, `volume`, `resources`); the runtime only points the spec
//! at them and creates nothing here.

use std::path::PathBuf;

use oci_spec::runtime::{LinuxNamespaceBuilder, LinuxNamespaceType, Mount, MountBuilder, Spec};
use serde::{Deserialize, Serialize};

use super::RuntimeError;

/// A namespace the pod's containers share.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum NamespaceKind {
    Net,
    Ipc,
    Uts,
    Pid,
}

impl NamespaceKind {
    fn oci(self) -> LinuxNamespaceType {
        match self {
            NamespaceKind::Net => LinuxNamespaceType::Network,
            NamespaceKind::Ipc => LinuxNamespaceType::Ipc,
            NamespaceKind::Uts => LinuxNamespaceType::Uts,
            NamespaceKind::Pid => LinuxNamespaceType::Pid,
        }
    }
}

/// Everything pod-level a container joins.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct PodSandbox {
    /// Namespaces held for the pod (bind mounts of `/proc/<pid>/ns/*`). A kind that
    /// is missing is the host's (hostNetwork, hostIPC), except PID: without an entry
    /// each container gets its own PID namespace unless `host_pid`.
    pub namespaces: Vec<(NamespaceKind, PathBuf)>,
    /// `spec.hostPID`: the container shares the host's PID namespace.
    pub host_pid: bool,
    /// The pod's cgroup, relative to each hierarchy's root; the container's is made
    /// under it.
    pub cgroup_parent: String,
    /// The pod's `/etc/hosts`, `/etc/resolv.conf` and `/etc/hostname`.
    pub hosts: PathBuf,
    pub resolv_conf: PathBuf,
    pub hostname: PathBuf,
    /// A tmpfs the pod's containers share as `/dev/shm` (they share IPC too).
    pub shm: Option<PathBuf>,
}

/// A host path bind-mounted into a container: a volume, or part of one (`subPath`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BindMount {
    pub source: PathBuf,
    pub destination: String,
    pub read_only: bool,
    /// `mountPropagation`: HostToContainer is rslave, Bidirectional rshared; None is
    /// rprivate, the kubelet's default.
    pub propagation: Option<String>,
    /// Mounted `nosuid,nodev`: the pod's own volumes (emptyDir, configMap, ...), where a
    /// container may leave a setuid binary or device node; not a hostPath, which may be
    /// the host's own programs.
    #[serde(default)]
    pub nosuid_nodev: bool,
}

/// Points `spec` at the sandbox: namespaces by path, the shared `/dev/shm`, and the
/// container's volume mounts (parents before children, as containerd orders them).
pub fn apply(
    spec: &mut Spec,
    sandbox: &PodSandbox,
    volumes: &[BindMount],
) -> Result<(), RuntimeError> {
    let mut namespaces = vec![ns(LinuxNamespaceType::Mount, None)?];
    let shared_pid = sandbox
        .namespaces
        .iter()
        .find(|(k, _)| *k == NamespaceKind::Pid);
    if !sandbox.host_pid {
        namespaces.push(ns(
            LinuxNamespaceType::Pid,
            shared_pid.map(|(_, p)| p.clone()),
        )?);
    }
    for (kind, path) in &sandbox.namespaces {
        if *kind != NamespaceKind::Pid {
            namespaces.push(ns(kind.oci(), Some(path.clone()))?);
        }
    }
    if let Some(linux) = spec.linux_mut() {
        linux.set_namespaces(Some(namespaces));
    }
    // The UTS namespace is the pod's, named when the sandbox was made (`hostname`,
    // `subdomain`, `hostnameOverride`), or the host's: a container renames neither.
    spec.set_hostname(None);

    let mut mounts: Vec<Mount> = spec.mounts().clone().unwrap_or_default();
    if let Some(shm) = &sandbox.shm {
        mounts.retain(|m| m.destination() != std::path::Path::new("/dev/shm"));
        mounts.push(bind(
            shm,
            "/dev/shm",
            false,
            &None,
            &["nosuid", "nodev", "noexec"],
        )?);
    }
    let mut ordered: Vec<&BindMount> = volumes.iter().collect();
    ordered.sort_by_key(|m| std::path::Path::new(&m.destination).components().count());
    for m in ordered {
        // A volume over one of the pod's files replaces it, as in the kubelet.
        mounts.retain(|existing| existing.destination() != std::path::Path::new(&m.destination));
        mounts.push(bind_mount(m)?);
    }
    spec.set_mounts(Some(mounts));
    Ok(())
}

/// The spec's mount for `m`.
pub(super) fn bind_mount(m: &BindMount) -> Result<Mount, RuntimeError> {
    let extra: &[&str] = if m.nosuid_nodev {
        &["nosuid", "nodev"]
    } else {
        &[]
    };
    bind(
        &m.source,
        &m.destination,
        m.read_only,
        &m.propagation,
        extra,
    )
}

fn ns(
    typ: LinuxNamespaceType,
    path: Option<PathBuf>,
) -> Result<oci_spec::runtime::LinuxNamespace, RuntimeError> {
    let mut b = LinuxNamespaceBuilder::default().typ(typ);
    if let Some(p) = path {
        b = b.path(p);
    }
    b.build()
        .map_err(|e| RuntimeError::Config(format!("build oci spec: {e}")))
}

fn bind(
    source: &std::path::Path,
    destination: &str,
    read_only: bool,
    propagation: &Option<String>,
    extra: &[&str],
) -> Result<Mount, RuntimeError> {
    let mut options = vec!["rbind".to_owned()];
    options.push(if read_only { "ro" } else { "rw" }.to_owned());
    options.push(
        match propagation.as_deref() {
            Some("HostToContainer") => "rslave",
            Some("Bidirectional") => "rshared",
            _ => "rprivate",
        }
        .to_owned(),
    );
    options.extend(extra.iter().map(|s| (*s).to_owned()));
    MountBuilder::default()
        .destination(destination)
        .typ("bind")
        .source(source)
        .options(options)
        .build()
        .map_err(|e| RuntimeError::Config(format!("build oci spec: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;
    use oci_spec::runtime::{LinuxBuilder, SpecBuilder};

    fn base() -> Spec {
        let linux = LinuxBuilder::default()
            .namespaces(vec![
                ns(LinuxNamespaceType::Pid, None).expect("ns"),
                ns(LinuxNamespaceType::Mount, None).expect("ns"),
                ns(LinuxNamespaceType::Ipc, None).expect("ns"),
                ns(LinuxNamespaceType::Uts, None).expect("ns"),
            ])
            .build()
            .expect("linux");
        let shm = MountBuilder::default()
            .destination("/dev/shm")
            .typ("tmpfs")
            .source("shm")
            .build()
            .expect("mount");
        let mut spec = SpecBuilder::default()
            .linux(linux)
            .mounts(vec![shm])
            .build()
            .expect("spec");
        spec.set_hostname(Some("web".into()));
        spec
    }

    fn json(spec: &Spec) -> serde_json::Value {
        serde_json::to_value(spec).expect("json")
    }

    #[test]
    fn a_pod_network_is_joined_by_path() {
        let mut spec = base();
        let sandbox = PodSandbox {
            namespaces: vec![
                (NamespaceKind::Net, "/r/pods/u/ns/net".into()),
                (NamespaceKind::Ipc, "/r/pods/u/ns/ipc".into()),
                (NamespaceKind::Uts, "/r/pods/u/ns/uts".into()),
            ],
            shm: Some("/r/pods/u/shm".into()),
            ..PodSandbox::default()
        };
        let vols = vec![
            BindMount {
                source: "/r/pods/u/volumes/cache/sub".into(),
                destination: "/data/cache/sub".into(),
                read_only: false,
                propagation: None,
                nosuid_nodev: true,
            },
            BindMount {
                source: "/r/pods/u/volumes/config".into(),
                destination: "/data".into(),
                read_only: true,
                propagation: None,
                nosuid_nodev: false,
            },
        ];
        apply(&mut spec, &sandbox, &vols).expect("apply");
        let v = json(&spec);
        let ns = v["linux"]["namespaces"].as_array().expect("namespaces");
        let find = |t: &str| ns.iter().find(|n| n["type"] == t).cloned();
        assert_eq!(find("network").expect("net")["path"], "/r/pods/u/ns/net");
        assert_eq!(find("ipc").expect("ipc")["path"], "/r/pods/u/ns/ipc");
        assert_eq!(find("uts").expect("uts")["path"], "/r/pods/u/ns/uts");
        assert!(find("pid").expect("pid").get("path").is_none());
        assert!(
            v.get("hostname").is_none(),
            "the pod's UTS namespace renamed: {v}"
        );
        let mounts = v["mounts"].as_array().expect("mounts");
        let shm = mounts
            .iter()
            .find(|m| m["destination"] == "/dev/shm")
            .expect("shm");
        assert_eq!(shm["source"], "/r/pods/u/shm");
        assert_eq!(shm["type"], "bind");
        // Parents first, whatever order the pod lists them in.
        let dests: Vec<&str> = mounts
            .iter()
            .filter_map(|m| m["destination"].as_str())
            .filter(|d| d.starts_with("/data"))
            .collect();
        assert_eq!(dests, ["/data", "/data/cache/sub"]);
        let data = mounts
            .iter()
            .find(|m| m["destination"] == "/data")
            .expect("data");
        let opts: Vec<&str> = data["options"]
            .as_array()
            .expect("options")
            .iter()
            .filter_map(|o| o.as_str())
            .collect();
        assert!(opts.contains(&"ro") && opts.contains(&"rbind"), "{opts:?}");
        // A hostPath keeps setuid programs working; the pod's own volumes do not.
        assert!(!opts.contains(&"nosuid"), "{opts:?}");
        let cache = mounts
            .iter()
            .find(|m| m["destination"] == "/data/cache/sub")
            .expect("cache");
        let opts: Vec<&str> = cache["options"]
            .as_array()
            .expect("options")
            .iter()
            .filter_map(|o| o.as_str())
            .collect();
        assert!(
            opts.contains(&"nosuid") && opts.contains(&"nodev"),
            "{opts:?}"
        );
    }

    #[test]
    fn host_network_and_host_pid_use_the_hosts_namespaces() {
        let mut spec = base();
        let sandbox = PodSandbox {
            namespaces: vec![(NamespaceKind::Ipc, "/r/pods/u/ns/ipc".into())],
            host_pid: true,
            ..PodSandbox::default()
        };
        apply(&mut spec, &sandbox, &[]).expect("apply");
        let v = json(&spec);
        let types: Vec<&str> = v["linux"]["namespaces"]
            .as_array()
            .expect("ns")
            .iter()
            .filter_map(|n| n["type"].as_str())
            .collect();
        assert_eq!(types, ["mount", "ipc"]);
        assert!(v.get("hostname").is_none(), "{v}");
    }
}
