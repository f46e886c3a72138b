//! A pod's sandbox: what its containers share, set up before any of them starts, in
//! the kubelet's order — the pod's cgroup (`resources`), its volumes (`volume`), its
//! namespaces and network (`network`) — and torn down in reverse once they are gone,
//! also for pods found after an agent restart or a power cut that no source wants any
//! more. Everything lives in `<root>/pods/<uid>/` and under `cgroupRoot`; this file
//! only orders the modules that own them. Blocking: run on a blocking thread.

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use k8s_openapi::api::core::v1::Pod;

use super::Deps;
use crate::network::{Network, NetworkError};
use crate::pod::downward::DownwardInputs;
use crate::resources::admission::Policy;
use crate::resources::{CgroupTree, Qos, ResourcesError};
use crate::runtime::PodSandbox;
use crate::volume::{PodVolumes, Sources, VolumeError};

/// Where pods' own directories are, under the root dir.
pub const PODS_DIR: &str = "pods";

/// Pod-level settings and handles the workers share.
pub struct Sandboxes {
    pub root: PathBuf,
    pub network: Network,
    pub cgroups: CgroupTree,
    /// `podPidsLimit` (None: unlimited).
    pub pids_limit: Option<i64>,
    pub admission: Policy,
    /// `holdfast.staticPodAllowedHostPaths` (None: any path).
    pub static_pod_host_paths: Option<Vec<PathBuf>>,
    /// Set by the eviction manager while the node is under memory pressure.
    pub memory_pressure: Arc<AtomicBool>,
    /// `enforceNodeAllocatable` has `pods`: kubepods' memory is capped at capacity less
    /// the reservations (not the eviction threshold, so that eviction acts first).
    pub enforce_pods: bool,
    /// That cap, when the node's memory is known.
    pub pods_memory: Option<u64>,
    /// The burstable pods' requested millicores as last counted, and the lock under
    /// which the level's shares are written: the writes run on blocking threads in any
    /// order, and each writes the newest count, so the last one never writes a stale one.
    burstable_milli: AtomicU64,
    burstable_write: Mutex<()>,
}

/// A pod's sandbox, ready for its containers.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Ready {
    pub runtime: PodSandbox,
    pub volumes: PodVolumes,
    pub ips: Vec<String>,
    /// Warning events to give: (reason, message).
    pub warnings: Vec<(&'static str, String)>,
    /// The namespaces were made anew by this call (a first start, or a reboot took the
    /// old ones): a new sandbox, in which the kubelet runs init containers again.
    pub fresh: bool,
}

/// Why a sandbox could not be set up, as the kubelet's event says it.
#[derive(Debug, thiserror::Error)]
pub enum SetupError {
    #[error("unable to ensure pod container exists: {0}")]
    Cgroup(#[from] ResourcesError),
    #[error("{}", mount_message(.0))]
    Volume(#[from] VolumeError),
    #[error("Failed to create pod sandbox: {0}")]
    Network(#[from] NetworkError),
}

fn mount_message(e: &VolumeError) -> String {
    match e.volume() {
        Some(v) => format!("MountVolume.SetUp failed for volume {v:?} : {e}"),
        None => format!("MountVolume.SetUp failed: {e}"),
    }
}

impl SetupError {
    /// An object a volume needs has not come from the apiserver yet: the pod waits,
    /// and no event says it is missing.
    pub fn is_waiting(&self) -> bool {
        matches!(self, SetupError::Volume(v) if v.is_waiting())
    }

    /// The event reason the kubelet gives this failure.
    pub fn reason(&self) -> &'static str {
        match self {
            SetupError::Cgroup(_) => "FailedCreatePodContainer",
            SetupError::Volume(_) => "FailedMount",
            SetupError::Network(_) => "FailedCreatePodSandBox",
        }
    }
}

impl Sandboxes {
    /// From the agent's config and the node's allocatable resources; `binary` is
    /// holdfast itself (the namespace holder).
    pub fn new(
        config: &crate::config::Config,
        allocatable: &std::collections::BTreeMap<
            String,
            k8s_openapi::apimachinery::pkg::api::resource::Quantity,
        >,
        binary: PathBuf,
    ) -> Sandboxes {
        let p = &config.pods;
        let network = crate::network::NetworkConfig {
            conf_dir: p.cni_conf_dir.clone(),
            bin_dirs: p.cni_bin_dirs.clone(),
            pod_cidr: p.pod_cidr.clone(),
            dns: crate::network::dns::DnsSettings {
                cluster_dns: p.cluster_dns.clone(),
                cluster_domain: p.cluster_domain.clone(),
            },
            resolv_conf: p.resolv_conf.clone(),
        };
        let cpu = allocatable
            .get("cpu")
            .and_then(|q| crate::quantity::parse_millicpu(&q.0).ok());
        let memory = allocatable
            .get("memory")
            .and_then(|q| crate::quantity::parse_bytes(&q.0).ok());
        let amounts = match (cpu, memory) {
            (Some(cpu_milli), Some(memory)) => {
                Some(crate::pod::requests::Amounts { cpu_milli, memory })
            }
            _ => None,
        };
        // The kubelet's enforced allocatable adds the hard eviction threshold back.
        let threshold = config
            .node_input()
            .ok()
            .and_then(|i| i.eviction_hard.get("memory.available").copied());
        let total = crate::node::facts::read_meminfo(Path::new("/proc/meminfo")).total;
        let pods_memory = match (memory, threshold, total) {
            (Some(m), Some(t), Some(total)) => Some(m.saturating_add(t.amount(total))),
            (Some(m), None, _) => Some(m),
            _ => None,
        };
        Sandboxes {
            root: config.root_dir.clone(),
            network: Network::new(network, &config.root_dir, binary),
            cgroups: CgroupTree::host(&config.cgroup_root),
            pids_limit: p.pod_pids_limit,
            admission: Policy {
                allocatable: amounts,
                max_pods: u64::from(config.max_pods),
                allow_privileged: p.allow_privileged,
                allowed_unsafe_sysctls: p.allowed_unsafe_sysctls.clone(),
            },
            static_pod_host_paths: p.static_pod_allowed_host_paths.clone(),
            memory_pressure: Arc::new(AtomicBool::new(false)),
            enforce_pods: p.enforce_node_allocatable.iter().any(|k| k == "pods"),
            pods_memory,
            burstable_milli: AtomicU64::new(0),
            burstable_write: Mutex::new(()),
        }
    }

    /// The host paths `pod` may use: the allow list for a static pod (the cluster's
    /// admission decides for the others, as with the kubelet), None for any.
    pub fn host_paths_for(&self, pod: &Pod) -> Option<&[PathBuf]> {
        if crate::pod::is_static_pod(pod) {
            self.static_pod_host_paths.as_deref()
        } else {
            None
        }
    }

    pub fn pod_dir(&self, uid: &str) -> PathBuf {
        self.root.join(PODS_DIR).join(uid)
    }

    /// Sets up (or brings up to date) `pod`'s sandbox. `check_network`: run CNI CHECK
    /// on an attachment that is already there, and repair it if it fails.
    pub fn ensure(&self, deps: &Deps, pod: &Pod, check_network: bool) -> Result<Ready, SetupError> {
        let uid = pod.metadata.uid.clone().unwrap_or_default();
        let dir = self.pod_dir(&uid);
        let qos = Qos::of(pod);
        let resources =
            crate::pod::requests::pod_resources(pod).map_err(ResourcesError::Invalid)?;
        // The QoS level first: a fresh tree, or a cgroupRoot removed meanwhile.
        if qos != Qos::Guaranteed {
            self.cgroups.ensure(
                &self.cgroups.qos_path(qos),
                &crate::resources::cgroups::Limits::default(),
            )?;
        }
        let cgroup_parent = self.cgroups.pod_path(&uid, qos);
        let limits = crate::resources::cgroups::pod_limits(qos, &resources, self.pids_limit);
        self.cgroups.ensure(&cgroup_parent, &limits)?;

        // Volumes before the network, as the kubelet orders them: a pod waiting for a
        // ConfigMap holds no address meanwhile.
        let fs_group = pod
            .spec
            .as_ref()
            .and_then(|s| s.security_context.as_ref())
            .and_then(|s| s.fs_group)
            .and_then(|g| u32::try_from(g).ok());
        let sources = Sources {
            objects: &deps.objects,
            downward: DownwardInputs {
                node_name: &deps.node_name,
                host_ip: deps.host_ip.as_deref(),
                pod_ips: &[],
                allocatable: &deps.allocatable,
            },
            fs_group,
            tokens: deps.tokens.as_ref(),
            allowed_host_paths: self.host_paths_for(pod),
        };
        let volumes = crate::volume::setup(pod, &dir, &sources)?;
        let mut warnings: Vec<(&'static str, String)> = Vec::new();
        if check_network {
            if let Err(e) = crate::network::check(&dir) {
                log::warn!("pod {uid}: network check failed ({e}); attaching it again");
                warnings.push((
                    "FailedSandboxCheck",
                    format!("Pod sandbox network check failed, attaching it again: {e}"),
                ));
                self.network.repair(pod, &dir)?;
            }
        }
        let net = self.network.ensure(pod, &dir)?;
        for w in &net.warnings {
            warnings.push(("MissingClusterDNS", w.clone()));
        }
        for w in &volumes.warnings {
            warnings.push(("FailedMount", w.clone()));
        }
        let spec = pod.spec.as_ref();
        let runtime = PodSandbox {
            namespaces: net.namespaces.clone(),
            host_pid: spec.and_then(|s| s.host_pid).unwrap_or(false),
            cgroup_parent,
            hosts: net.hosts.clone(),
            resolv_conf: net.resolv_conf.clone(),
            hostname: net.hostname.clone(),
            shm: Some(if spec.and_then(|s| s.host_ipc).unwrap_or(false) {
                PathBuf::from("/dev/shm")
            } else {
                self.shm(&dir)?
            }),
        };
        Ok(Ready {
            runtime,
            volumes,
            ips: net.ips,
            warnings,
            fresh: net.fresh,
        })
    }

    /// The pod's `/dev/shm`, shared by its containers as their IPC namespace is: a
    /// tmpfs mounted in the pod's dir on the runtime's tmpfs (in its dir on the disk
    /// for a pod an older holdfast set up, while that mount lasts).
    fn shm(&self, dir: &Path) -> Result<PathBuf, SetupError> {
        let mounted = |shm: &Path| -> Result<bool, SetupError> {
            Ok(
                crate::runtime::is_mount_point(shm).map_err(|source| VolumeError::Io {
                    context: "read /proc/self/mountinfo".into(),
                    source,
                })?,
            )
        };
        let legacy = dir.join("shm");
        if mounted(&legacy)? {
            return Ok(legacy);
        }
        let uid = dir.file_name().unwrap_or_default().to_string_lossy();
        let shm = crate::runtime::root_dir::pod_boot_dir(&self.root, &uid).join("shm");
        if !mounted(&shm)? {
            std::fs::create_dir_all(&shm).map_err(|source| VolumeError::Io {
                context: format!("create {}", shm.display()),
                source,
            })?;
            // containerd's default: 64 MiB, world-writable with the sticky bit.
            nix::mount::mount(
                Some("shm"),
                &shm,
                Some("tmpfs"),
                nix::mount::MsFlags::MS_NOSUID
                    | nix::mount::MsFlags::MS_NODEV
                    | nix::mount::MsFlags::MS_NOEXEC,
                Some("mode=1777,size=65536k"),
            )
            .map_err(|e| VolumeError::Io {
                context: format!("mount tmpfs at {}", shm.display()),
                source: e.into(),
            })?;
        }
        Ok(shm)
    }

    /// Tears down what pod `uid` had: its volumes, its network (CNI DEL with the ADD's
    /// configuration, its namespaces released), its cgroup, its directory. Its
    /// containers must be gone. Goes on past a failure, and returns the first.
    pub fn teardown(&self, uid: &str) -> Result<(), SetupError> {
        let dir = self.pod_dir(uid);
        let mut first: Option<SetupError> = None;
        if let Err(e) = crate::volume::teardown(&dir) {
            first.get_or_insert(e.into());
        }
        if let Err(e) = crate::network::teardown(&dir) {
            first.get_or_insert(e.into());
        }
        let boot = crate::runtime::root_dir::pod_boot_dir(&self.root, uid);
        for d in [&dir, &boot] {
            if let Err(e) = unmount_shm(d) {
                first.get_or_insert(e);
            }
        }
        for qos in [Qos::Guaranteed, Qos::Burstable, Qos::BestEffort] {
            if let Err(e) = self.cgroups.remove(&self.cgroups.pod_path(uid, qos)) {
                first.get_or_insert(e.into());
            }
        }
        if first.is_none() {
            for d in [&dir, &boot] {
                if let Err(e) = crate::runtime::remove_unmounted(d) {
                    first.get_or_insert(VolumeError::from(e).into());
                }
            }
        }
        match first {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    /// Tears down every pod directory and pod cgroup that belongs to none of `known`:
    /// pods removed while the agent was down, or whose teardown failed before.
    pub fn remove_orphans(&self, known: &HashSet<String>) {
        let pods = self.root.join(PODS_DIR);
        let mut uids: HashSet<String> = HashSet::new();
        for e in std::fs::read_dir(&pods).into_iter().flatten().flatten() {
            if let Some(name) = e.file_name().to_str() {
                uids.insert(name.to_owned());
            }
        }
        for qos in [Qos::Guaranteed, Qos::Burstable, Qos::BestEffort] {
            for dir in self.cgroups.dirs(&self.cgroups.qos_path(qos)) {
                for e in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
                    let name = e.file_name().to_string_lossy().into_owned();
                    if let Some(uid) = name.strip_prefix("pod") {
                        if e.file_type().is_ok_and(|t| t.is_dir()) {
                            uids.insert(uid.to_owned());
                        }
                    }
                }
            }
        }
        for uid in uids.difference(known) {
            match self.teardown(uid) {
                Ok(()) => log::info!("pod {uid}: removed its sandbox, which belongs to no pod"),
                Err(e) => log::warn!("pod {uid}: remove its sandbox, which belongs to no pod: {e}"),
            }
        }
    }

    /// Sets the QoS levels up: kubepods with the node's allocatable, burstable and
    /// besteffort under it.
    pub fn ensure_qos(&self) -> Result<(), ResourcesError> {
        use crate::resources::cgroups::{shares, Limits, MIN_SHARES};
        let top = Limits {
            cpu_shares: self.admission.allocatable.map(|a| shares(a.cpu_milli)),
            memory: self.pods_memory.filter(|m| self.enforce_pods && *m > 0),
            ..Limits::default()
        };
        self.cgroups.ensure(&self.cgroups.kubepods(), &top)?;
        self.cgroups
            .ensure(&self.cgroups.qos_path(Qos::Burstable), &Limits::default())?;
        self.cgroups.ensure(
            &self.cgroups.qos_path(Qos::BestEffort),
            &Limits {
                cpu_shares: Some(MIN_SHARES),
                ..Limits::default()
            },
        )
    }

    /// Counts the burstable pods' requests anew; [`Self::write_burstable_shares`] then
    /// writes them. Call in the order the counts were made.
    pub fn count_burstable_requests(&self, requested_milli: u64) {
        self.burstable_milli
            .store(requested_milli, Ordering::SeqCst);
    }

    /// The burstable level's cpu shares: the sum of its pods' requests, as last counted.
    /// Blocks on the cgroup write (and on another such write in progress).
    pub fn write_burstable_shares(&self) -> Result<(), ResourcesError> {
        use crate::resources::cgroups::{shares, Limits};
        let _one_at_a_time = self
            .burstable_write
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let requested_milli = self.burstable_milli.load(Ordering::SeqCst);
        self.cgroups.ensure(
            &self.cgroups.qos_path(Qos::Burstable),
            &Limits {
                cpu_shares: Some(shares(requested_milli)),
                ..Limits::default()
            },
        )
    }
}

fn unmount_shm(dir: &Path) -> Result<(), SetupError> {
    let shm = dir.join("shm");
    match nix::mount::umount2(&shm, nix::mount::MntFlags::MNT_DETACH) {
        Ok(()) | Err(nix::errno::Errno::EINVAL) | Err(nix::errno::Errno::ENOENT) => Ok(()),
        Err(e) => Err(VolumeError::Io {
            context: format!("unmount {}", shm.display()),
            source: e.into(),
        }
        .into()),
    }
}

/// `holdfast reset`: tears down every pod sandbox under `root` (CNI DEL from each
/// attachment record, namespaces and volumes unmounted) and the whole pod cgroup
/// hierarchy. Needs no config: the records say what was attached.
pub fn reset(root: &Path, cgroup_root: &str) -> Result<(), String> {
    let mut errors = Vec::new();
    for e in std::fs::read_dir(root.join(PODS_DIR))
        .into_iter()
        .flatten()
        .flatten()
    {
        let dir = e.path();
        if let Err(e) = crate::volume::teardown(&dir) {
            errors.push(e.to_string());
        }
        if let Err(e) = crate::network::teardown(&dir) {
            errors.push(e.to_string());
        }
        if let Err(e) = unmount_shm(&dir) {
            errors.push(e.to_string());
        }
    }
    let tree = CgroupTree::host(cgroup_root);
    if let Err(e) = tree.remove(&tree.kubepods()) {
        errors.push(e.to_string());
    }
    if errors.is_empty() {
        Ok(())
    } else {
        Err(errors.join("; "))
    }
}
