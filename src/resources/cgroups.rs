//! The kubelet's pod cgroup hierarchy under `cgroupRoot`, on cgroup v1 and v2:
//!
//! ```text
//! <cgroupRoot>/kubepods                      cpu: allocatable, memory: allocatable
//! <cgroupRoot>/kubepods/pod<uid>             Guaranteed pods
//! <cgroupRoot>/kubepods/burstable            cpu: the burstable pods' requests
//! <cgroupRoot>/kubepods/burstable/pod<uid>
//! <cgroupRoot>/kubepods/besteffort           cpu: the minimum
//! <cgroupRoot>/kubepods/besteffort/pod<uid>
//! ```
//!
//! A pod's cgroup gets cpu shares (v1) or weight (v2) from its requests, a CFS quota
//! when every container has a CPU limit, a memory limit when every container has one,
//! and `podPidsLimit`; its containers' cgroups (made by libcontainer) go under it.
//! Only cgroupfs files are written; a v1 value goes to its controller's hierarchy.

use std::path::{Path, PathBuf};

use super::qos::Qos;
use super::ResourcesError;
use crate::pod::requests::PodResources;
use crate::runtime::delegation::{self, CONTROLLERS};

/// The kubelet's constants (`pkg/kubelet/cm`).
pub const MIN_SHARES: u64 = 2;
pub const MAX_SHARES: u64 = 262_144;
pub const SHARES_PER_CPU: u64 = 1024;
pub const CPU_PERIOD: u64 = 100_000;
pub const MIN_QUOTA: u64 = 1000;

/// `MilliCPUToShares`.
pub fn shares(milli: u64) -> u64 {
    if milli == 0 {
        return MIN_SHARES;
    }
    // Saturating: a manifest's CPU quantity may be up to u64::MAX millicores.
    (milli.saturating_mul(SHARES_PER_CPU) / 1000).clamp(MIN_SHARES, MAX_SHARES)
}

/// `MilliCPUToQuota` for the kubelet's period.
pub fn quota(milli: u64) -> u64 {
    (milli.saturating_mul(CPU_PERIOD) / 1000).max(MIN_QUOTA)
}

/// cgroup v2 weight from v1 shares, as the kubelet (Kubernetes 1.35 on), runc 1.3.2 on,
/// crun 1.23 on and libcontainer (which sets the containers' own) convert it: the
/// quadratic map that keeps 2 -> 1, 1024 (one CPU) -> 100 and 262144 -> 10000. The
/// linear map before it (1 + (shares - 2) * 9999 / 262142) gave one CPU a weight of 39,
/// below the 100 of every system service, and pods would disagree with their containers.
pub fn weight(shares: u64) -> u64 {
    if shares == 0 {
        return 0;
    }
    if shares <= MIN_SHARES {
        return 1;
    }
    if shares >= MAX_SHARES {
        return 10_000;
    }
    #[allow(clippy::cast_precision_loss)] // shares < 2^18: exact in an f64
    let l = (shares as f64).log2();
    let w = 10f64.powf((l * l + 125.0 * l) / 612.0 - 7.0 / 34.0).ceil();
    #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)] // 1..=10000
    let w = w as u64;
    w.clamp(1, 10_000)
}

/// What one cgroup is given.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Limits {
    pub cpu_shares: Option<u64>,
    pub cpu_quota: Option<u64>,
    pub memory: Option<u64>,
    pub pids: Option<i64>,
}

/// A pod's cgroup values (`ResourceConfigForPod`).
pub fn pod_limits(qos: Qos, r: &PodResources, pids: Option<i64>) -> Limits {
    match qos {
        Qos::BestEffort => Limits {
            cpu_shares: Some(MIN_SHARES),
            pids,
            ..Limits::default()
        },
        _ => Limits {
            cpu_shares: Some(shares(r.requests.cpu_milli)),
            cpu_quota: r.cpu_limit_milli.map(quota),
            memory: r.memory_limit,
            pids,
        },
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Version {
    V1,
    V2,
}

/// The hierarchy under one cgroup root.
#[derive(Debug, Clone)]
pub struct CgroupTree {
    /// Where cgroupfs is mounted: `/sys/fs/cgroup` (a fake tree in tests).
    fs: PathBuf,
    /// `cgroupRoot`, as `/holdfast`.
    root: String,
    version: Version,
    /// The delegated subtree `root` lies in (`cgroupRoot: delegated`): no
    /// `cgroup.subtree_control` above it is written, those are the service manager's.
    delegated: Option<String>,
}

impl CgroupTree {
    /// The tree under `cgroup_root` in the host's cgroupfs.
    pub fn host(cgroup_root: &str) -> CgroupTree {
        let tree = CgroupTree::at(Path::new("/sys/fs/cgroup"), cgroup_root);
        match delegation::base() {
            Some(base) => tree.delegated_at(base),
            None => tree,
        }
    }

    /// The same tree, inside the subtree delegated at `base` when its root lies in it.
    pub fn delegated_at(mut self, base: &str) -> CgroupTree {
        let base = format!("/{}", base.trim_matches('/'));
        if self
            .root
            .starts_with(&format!("{}/", base.trim_end_matches('/')))
        {
            self.delegated = Some(base);
        }
        self
    }

    /// The tree under `cgroup_root` in the cgroupfs mounted at `fs`: v2 when `fs` has
    /// `cgroup.controllers`, else v1 with one hierarchy per controller.
    pub fn at(fs: &Path, cgroup_root: &str) -> CgroupTree {
        let version = if fs.join("cgroup.controllers").exists() {
            Version::V2
        } else {
            Version::V1
        };
        CgroupTree {
            fs: fs.to_owned(),
            root: format!("/{}", cgroup_root.trim_matches('/')),
            version,
            delegated: None,
        }
    }

    pub fn version(&self) -> Version {
        self.version
    }

    /// `<root>/kubepods`.
    pub fn kubepods(&self) -> String {
        format!("{}/kubepods", self.root.trim_end_matches('/'))
    }

    /// The QoS class's cgroup.
    pub fn qos_path(&self, qos: Qos) -> String {
        match qos {
            Qos::Guaranteed => self.kubepods(),
            Qos::Burstable => format!("{}/burstable", self.kubepods()),
            Qos::BestEffort => format!("{}/besteffort", self.kubepods()),
        }
    }

    /// The pod's cgroup, relative to each hierarchy's root (what an OCI spec's
    /// `cgroupsPath` takes).
    pub fn pod_path(&self, uid: &str, qos: Qos) -> String {
        format!("{}/pod{uid}", self.qos_path(qos))
    }

    /// The directory of `rel` for `controller` (v1), or the one directory (v2).
    fn dir(&self, controller: &str, rel: &str) -> PathBuf {
        let rel = rel.trim_start_matches('/');
        match self.version {
            Version::V2 => self.fs.join(rel),
            Version::V1 => self.fs.join(controller).join(rel),
        }
    }

    /// Every directory `rel` has (one per v1 hierarchy present, or one).
    pub fn dirs(&self, rel: &str) -> Vec<PathBuf> {
        match self.version {
            Version::V2 => vec![self.dir("", rel)],
            Version::V1 => {
                let mut out = Vec::new();
                for e in std::fs::read_dir(&self.fs).into_iter().flatten().flatten() {
                    let p = e.path();
                    // cpu,cpuacct style links point at hierarchies already listed.
                    if e.file_type().is_ok_and(|t| t.is_dir()) {
                        out.push(p.join(rel.trim_start_matches('/')));
                    }
                }
                out.sort();
                out
            }
        }
    }

    /// Makes `rel` (and its parents) and writes `limits` to it.
    pub fn ensure(&self, rel: &str, limits: &Limits) -> Result<(), ResourcesError> {
        match self.version {
            Version::V1 => {
                for c in CONTROLLERS {
                    let dir = self.dir(c, rel);
                    if !self.fs.join(c).exists() {
                        continue;
                    }
                    create(&dir)?;
                }
                let cpu = self.dir("cpu", rel);
                if let Some(s) = limits.cpu_shares {
                    write_if_exists_dir(&cpu, "cpu.shares", &s.to_string())?;
                }
                if cpu.exists() {
                    // Setting the period first: a quota below 1 ms of it is refused.
                    write(&cpu, "cpu.cfs_period_us", &CPU_PERIOD.to_string())?;
                    let q = limits.cpu_quota.map(|q| q as i64).unwrap_or(-1);
                    write(&cpu, "cpu.cfs_quota_us", &q.to_string())?;
                }
                let mem = self.dir("memory", rel);
                if mem.exists() {
                    // v1 shows "no limit" as a huge page-rounded number, never as -1.
                    let unlimited =
                        read_u64(&mem.join("memory.limit_in_bytes")).is_some_and(|v| v >= 1 << 62);
                    match limits.memory {
                        Some(m) => write(&mem, "memory.limit_in_bytes", &m.to_string())?,
                        None if unlimited => {}
                        None => write(&mem, "memory.limit_in_bytes", "-1")?,
                    }
                }
                let pids = self.dir("pids", rel);
                if pids.exists() {
                    let p = match limits.pids {
                        Some(n) if n > 0 => n.to_string(),
                        _ => "max".to_owned(),
                    };
                    write(&pids, "pids.max", &p)?;
                }
            }
            Version::V2 => {
                self.enable_controllers(rel)?;
                let dir = self.dir("", rel);
                create(&dir)?;
                if let Some(s) = limits.cpu_shares {
                    write(&dir, "cpu.weight", &weight(s).to_string())?;
                }
                let max = match limits.cpu_quota {
                    Some(q) => format!("{q} {CPU_PERIOD}"),
                    None => format!("max {CPU_PERIOD}"),
                };
                write(&dir, "cpu.max", &max)?;
                let m = limits
                    .memory
                    .map(|m| m.to_string())
                    .unwrap_or_else(|| "max".to_owned());
                write(&dir, "memory.max", &m)?;
                let p = match limits.pids {
                    Some(n) if n > 0 => n.to_string(),
                    _ => "max".to_owned(),
                };
                write(&dir, "pids.max", &p)?;
            }
        }
        Ok(())
    }

    /// v2: a controller works in a cgroup only when every ancestor delegates it
    /// (`cgroup.subtree_control`).
    fn enable_controllers(&self, rel: &str) -> Result<(), ResourcesError> {
        let mut dir = self.fs.clone();
        let parts: Vec<&str> = rel
            .trim_matches('/')
            .split('/')
            .filter(|p| !p.is_empty())
            .collect();
        // Levels above a delegated base are the service manager's: only walked through.
        let skip = self.delegated.as_ref().map_or(0, |b| {
            b.trim_matches('/')
                .split('/')
                .filter(|p| !p.is_empty())
                .count()
        });
        for (level, part) in parts.into_iter().enumerate() {
            if level < skip {
                dir = dir.join(part);
                continue;
            }
            let available =
                std::fs::read_to_string(dir.join("cgroup.controllers")).unwrap_or_default();
            let wanted: Vec<String> = CONTROLLERS
                .iter()
                .filter(|c| available.split_whitespace().any(|a| a == **c))
                .map(|c| format!("+{c}"))
                .collect();
            let current =
                std::fs::read_to_string(dir.join("cgroup.subtree_control")).unwrap_or_default();
            let missing: Vec<&String> = wanted
                .iter()
                .filter(|w| !current.split_whitespace().any(|c| c == &w[1..]))
                .collect();
            if !missing.is_empty() {
                let line = missing
                    .iter()
                    .map(|s| s.as_str())
                    .collect::<Vec<_>>()
                    .join(" ");
                write(&dir, "cgroup.subtree_control", &line)?;
            }
            dir = dir.join(part);
            create(&dir)?;
        }
        Ok(())
    }

    /// Removes `rel` and everything under it, deepest first, in every hierarchy (rmdir
    /// only: cgroupfs refuses a cgroup that still has processes, and so does this).
    pub fn remove(&self, rel: &str) -> Result<(), ResourcesError> {
        for top in self.dirs(rel) {
            let mut all = Vec::new();
            let mut stack = vec![top.clone()];
            while let Some(d) = stack.pop() {
                if !d.is_dir() {
                    continue;
                }
                for e in std::fs::read_dir(&d).into_iter().flatten().flatten() {
                    if e.file_type().is_ok_and(|t| t.is_dir()) {
                        stack.push(e.path());
                    }
                }
                all.push(d);
            }
            all.sort_by_key(|p| std::cmp::Reverse(p.components().count()));
            for d in all {
                match std::fs::remove_dir(&d) {
                    Ok(()) => {}
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                    Err(source) => {
                        return Err(ResourcesError::Cgroup {
                            context: format!("remove {}", d.display()),
                            source,
                        })
                    }
                }
            }
        }
        Ok(())
    }

    /// Memory in use that the kernel cannot simply drop (usage less inactive file
    /// pages): the kubelet's working set, which eviction compares.
    pub fn working_set(&self, rel: &str) -> Option<u64> {
        let dir = self.dir("memory", rel);
        let (usage, stat, key) = match self.version {
            Version::V1 => (
                read_u64(&dir.join("memory.usage_in_bytes"))?,
                std::fs::read_to_string(dir.join("memory.stat")).ok()?,
                "total_inactive_file",
            ),
            Version::V2 => (
                read_u64(&dir.join("memory.current"))?,
                std::fs::read_to_string(dir.join("memory.stat")).ok()?,
                "inactive_file",
            ),
        };
        let inactive = stat
            .lines()
            .filter_map(|l| l.split_once(' '))
            .find(|(k, _)| *k == key)
            .and_then(|(_, v)| v.trim().parse::<u64>().ok())
            .unwrap_or(0);
        Some(usage.saturating_sub(inactive))
    }

    /// The memory limit in force at `rel`: the lowest of its own and its ancestors'
    /// (None when nothing up to the hierarchy's root limits it).
    pub fn effective_memory_limit(&self, rel: &str) -> Option<u64> {
        let mut lowest: Option<u64> = None;
        let mut path = rel.trim_matches('/').to_owned();
        loop {
            let dir = self.dir("memory", &path);
            let file = match self.version {
                Version::V1 => "memory.limit_in_bytes",
                Version::V2 => "memory.max",
            };
            // v1 says "no limit" with a huge page-rounded number.
            if let Some(v) = read_u64(&dir.join(file)).filter(|v| *v < (1 << 62)) {
                lowest = Some(lowest.map_or(v, |l| l.min(v)));
            }
            match path.rfind('/') {
                Some(i) => path.truncate(i),
                None if !path.is_empty() => path.clear(),
                None => break,
            }
        }
        lowest
    }

    /// The files written at `rel` for `controller`, for tests and `holdfast` checks.
    pub fn read(&self, controller: &str, rel: &str, file: &str) -> Option<String> {
        std::fs::read_to_string(self.dir(controller, rel).join(file))
            .ok()
            .map(|s| s.trim().to_owned())
    }
}

fn read_u64(p: &Path) -> Option<u64> {
    std::fs::read_to_string(p).ok()?.trim().parse().ok()
}

fn create(dir: &Path) -> Result<(), ResourcesError> {
    std::fs::create_dir_all(dir).map_err(|source| ResourcesError::Cgroup {
        context: format!("create {}", dir.display()),
        source,
    })
}

fn write_if_exists_dir(dir: &Path, file: &str, value: &str) -> Result<(), ResourcesError> {
    if dir.exists() {
        write(dir, file, value)?;
    }
    Ok(())
}

/// Writes a cgroup file unless it already says `value` (a v1 memory limit rewritten
/// below the usage would fail for nothing).
fn write(dir: &Path, file: &str, value: &str) -> Result<(), ResourcesError> {
    let path = dir.join(file);
    if std::fs::read_to_string(&path).is_ok_and(|cur| cur.trim() == value) {
        return Ok(());
    }
    std::fs::write(&path, value).map_err(|source| ResourcesError::Cgroup {
        context: format!("write {value:?} to {}", path.display()),
        source,
    })
}

/// Removes the pods' cgroup tree under `cgroup_root` as `holdfast reset` does, deepest
/// first, once their containers are gone: all of it, or only the pods' part of a
/// delegated base.
pub fn remove_tree(cgroup_root: &str) -> Result<(), ResourcesError> {
    let tree = CgroupTree::host(cgroup_root);
    tree.remove(&removable(&tree, cgroup_root))
}

/// What may go of the cgroup root: all of it, but only the pods' part of a delegated
/// base (its `supervisor` holds the agent and the shims, and the base is the service
/// manager's) and only `kubepods` of the hierarchy's own root.
fn removable(tree: &CgroupTree, root: &str) -> String {
    let root = root.trim_end_matches('/');
    if root.is_empty() {
        return tree.kubepods();
    }
    let supervisor = format!("{root}/{}", delegation::SUPERVISOR);
    let is_base =
        delegation::base() == Some(root) || tree.dirs(&supervisor).iter().any(|d| d.is_dir());
    if is_base {
        format!("{root}/{}", delegation::PODS)
    } else {
        root.to_owned()
    }
}

#[cfg(test)]
#[path = "cgroups_tests.rs"]
mod tests;
