//! What the running system shows, gathered once. This is the only part of `check` that
//! reads the live system; a fact that cannot be read is `None` (or empty) and the
//! checks say they could not tell.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use super::cgroup::{CgroupLayout, CgroupVersion};
use super::kconfig::KernelConfig;
use super::{CheckError, CheckFlags};
use crate::time::Timestamp;

const DEFAULT_ROOT_DIR: &str = "/var/lib/holdfast";

/// Free space and inodes of the filesystem under the root dir.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Disk {
    /// The directory measured: the root dir, or its nearest existing ancestor before
    /// the first run creates it.
    pub path: PathBuf,
    pub free_bytes: u64,
    pub free_inodes: u64,
    /// 0 on filesystems that have no fixed inode table (btrfs).
    pub total_inodes: u64,
    /// The filesystem lives in memory (tmpfs, ramfs): what is kept there is lost with
    /// the next power cut or reboot.
    pub in_memory: bool,
}

#[derive(Debug, Clone, Default)]
pub struct Facts {
    /// `uname -r`.
    pub kernel_release: Option<String>,
    /// Where the kernel config came from and what it says.
    pub kernel_config: Option<(String, KernelConfig)>,
    /// The kernel config was given with `--kernel-config` and decides kernel features.
    pub config_decides: bool,
    /// Names in `/proc/self/ns`.
    pub namespaces: Option<BTreeSet<String>>,
    /// `/proc/self/mountinfo`, parsed into the cgroup hierarchies.
    pub cgroup: Option<CgroupLayout>,
    /// `cgroup.controllers` of the cgroup v2 mount.
    pub v2_controllers: Option<String>,
    /// Core interface files (`cgroup.freeze`, `cgroup.kill`) seen in a non-root v2 cgroup.
    pub v2_core_files: BTreeSet<String>,
    /// `/proc/filesystems`.
    pub filesystems: Option<String>,
    /// Modules loaded (`/proc/modules`) or built in with a presence in `/sys/module`.
    pub modules_present: BTreeSet<String>,
    /// Modules that can be loaded or are built in, from `modules.dep` and
    /// `modules.builtin` of the running kernel.
    pub modules_available: BTreeSet<String>,
    /// `/proc/self/status`.
    pub proc_status: Option<String>,
    /// `/proc/net/ip_tables_names`: the legacy iptables tables in use (the file exists
    /// once `ip_tables` is loaded).
    pub ip_tables_names: Option<String>,
    /// `/proc/sys/net/bridge` exists: `br_netfilter` is loaded.
    pub bridge_nf_sysctls: bool,
    /// `/proc/sys/user/max_user_namespaces`.
    pub max_user_namespaces: Option<u64>,
    pub disk: Option<Result<Disk, String>>,
    pub now: Option<Timestamp>,
    /// The board named with `--board` and the cgroup version its profile expects.
    pub expected_cgroup: Option<(String, CgroupVersion)>,
}

impl Facts {
    /// Reads the live system. Fails only on what the user named: a `--kernel-config`
    /// that cannot be read or holds no options.
    pub fn gather(
        flags: &CheckFlags,
        expected_cgroup: Option<(String, CgroupVersion)>,
    ) -> Result<Facts, CheckError> {
        let kernel_release = read("/proc/sys/kernel/osrelease").map(|s| s.trim().to_string());
        let (kernel_config, config_decides) = match &flags.kernel_config {
            Some(path) => {
                let k = KernelConfig::read(path)?;
                if k.is_empty() {
                    return Err(CheckError::EmptyKernelConfig { path: path.clone() });
                }
                (Some((path.display().to_string(), k)), true)
            }
            None => (live_kernel_config(kernel_release.as_deref()), false),
        };
        let cgroup = read("/proc/self/mountinfo").map(|m| CgroupLayout::from_mountinfo(&m));
        let v2_mount = cgroup.as_ref().and_then(|c| c.v2_mount.clone());
        let v2_controllers = v2_mount
            .as_ref()
            .and_then(|m| read(Path::new(m).join("cgroup.controllers")));
        let v2_core_files = v2_mount
            .as_deref()
            .map(|m| v2_core_files(Path::new(m)))
            .unwrap_or_default();
        let mut modules_present: BTreeSet<String> = read("/proc/modules")
            .map(|m| {
                m.lines()
                    .filter_map(|l| l.split_whitespace().next())
                    .map(str::to_string)
                    .collect()
            })
            .unwrap_or_default();
        modules_present.extend(dir_names(Path::new("/sys/module")));
        let modules_available = kernel_release
            .as_deref()
            .map(|r| {
                let dir = Path::new("/lib/modules").join(r);
                let mut names = BTreeSet::new();
                for file in ["modules.dep", "modules.builtin"] {
                    if let Some(text) = read(dir.join(file)) {
                        names.extend(module_names(&text));
                    }
                }
                names
            })
            .unwrap_or_default();
        let root_dir = flags
            .root_dir
            .clone()
            .unwrap_or_else(|| PathBuf::from(DEFAULT_ROOT_DIR));
        Ok(Facts {
            kernel_release,
            kernel_config,
            config_decides,
            namespaces: Some(dir_names(Path::new("/proc/self/ns"))).filter(|n| !n.is_empty()),
            cgroup,
            v2_controllers,
            v2_core_files,
            filesystems: read("/proc/filesystems"),
            modules_present,
            modules_available,
            proc_status: read("/proc/self/status"),
            ip_tables_names: read("/proc/net/ip_tables_names"),
            bridge_nf_sysctls: Path::new("/proc/sys/net/bridge/bridge-nf-call-iptables").exists(),
            max_user_namespaces: read("/proc/sys/user/max_user_namespaces")
                .and_then(|s| s.trim().parse().ok()),
            disk: Some(disk(&root_dir)),
            now: Some(crate::time::Timestamp::now()),
            expected_cgroup,
        })
    }

    /// The report's first line: which kernel, and what decides.
    pub fn header(&self) -> String {
        let kernel = self.kernel_release.as_deref().unwrap_or("unknown kernel");
        let source = match (&self.kernel_config, self.config_decides) {
            (Some((path, _)), true) => {
                format!("kernel config {path} decides kernel features; live probes only warn")
            }
            (Some((path, _)), false) => format!("live probes, kernel config from {path}"),
            (None, _) => "live probes, no kernel config found".into(),
        };
        format!("holdfast check: kernel {kernel}; {source}")
    }
}

fn read(path: impl AsRef<Path>) -> Option<String> {
    std::fs::read_to_string(path).ok()
}

fn dir_names(dir: &Path) -> BTreeSet<String> {
    std::fs::read_dir(dir)
        .map(|entries| {
            entries
                .filter_map(Result::ok)
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default()
}

/// `/proc/config.gz` exists only with CONFIG_IKCONFIG_PROC; distributions ship the
/// config in `/boot` instead.
fn live_kernel_config(release: Option<&str>) -> Option<(String, KernelConfig)> {
    let mut candidates = vec![PathBuf::from("/proc/config.gz")];
    if let Some(r) = release {
        candidates.push(PathBuf::from(format!("/boot/config-{r}")));
    }
    candidates.into_iter().find_map(|p| {
        KernelConfig::read(&p)
            .ok()
            .filter(|k| !k.is_empty())
            .map(|k| (p.display().to_string(), k))
    })
}

/// Module names from `modules.dep` / `modules.builtin` lines such as
/// `kernel/fs/overlayfs/overlay.ko.xz: ...`; the kernel spells `-` in file names as `_`
/// in module names.
pub fn module_names(text: &str) -> BTreeSet<String> {
    text.lines()
        .filter_map(|l| l.split(':').next())
        .filter_map(|p| p.trim().rsplit('/').next())
        .filter_map(|f| f.split(".ko").next())
        .filter(|n| !n.is_empty())
        .map(|n| n.replace('-', "_"))
        .collect()
}

/// The root cgroup has no `cgroup.freeze` or `cgroup.kill`: look in our own cgroup, or,
/// when we run in the root one, in any child; when the root has none yet (a device's
/// first boot, before any service or pod), in a child made for the look and removed.
fn v2_core_files(mount: &Path) -> BTreeSet<String> {
    let found = v2_core_files_in(mount);
    if !found.is_empty() {
        return found;
    }
    let probe = mount.join(format!("holdfast-check.{}", std::process::id()));
    if std::fs::create_dir(&probe).is_err() {
        return found;
    }
    let found = ["cgroup.freeze", "cgroup.kill"]
        .into_iter()
        .filter(|f| probe.join(f).exists())
        .map(str::to_string)
        .collect();
    if let Err(e) = std::fs::remove_dir(&probe) {
        log::warn!("remove {}: {e}", probe.display());
    }
    found
}

fn v2_core_files_in(mount: &Path) -> BTreeSet<String> {
    let own = read("/proc/self/cgroup").and_then(|c| {
        c.lines()
            .find_map(|l| l.strip_prefix("0::"))
            .map(|p| p.trim().trim_start_matches('/').to_string())
    });
    let mut dirs = Vec::new();
    if let Some(own) = own.filter(|p| !p.is_empty()) {
        dirs.push(mount.join(own));
    }
    if let Ok(entries) = std::fs::read_dir(mount) {
        dirs.extend(
            entries
                .filter_map(Result::ok)
                .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
                .map(|e| e.path())
                .take(1),
        );
    }
    let mut found = BTreeSet::new();
    for d in dirs {
        for f in ["cgroup.freeze", "cgroup.kill"] {
            if d.join(f).exists() {
                found.insert(f.to_string());
            }
        }
    }
    found
}

fn disk(root_dir: &Path) -> Result<Disk, String> {
    let path = root_dir
        .ancestors()
        .find(|p| p.exists())
        .unwrap_or(Path::new("/"))
        .to_path_buf();
    let st = nix::sys::statvfs::statvfs(&path)
        .map_err(|e| format!("statvfs {}: {e}", path.display()))?;
    #[allow(clippy::unnecessary_cast, clippy::useless_conversion)]
    let (avail, frag, files, ffree) = (
        st.blocks_available() as u64,
        st.fragment_size() as u64,
        st.files() as u64,
        st.files_available() as u64,
    );
    // ramfs's magic (linux/magic.h), which nix does not name.
    const RAMFS_MAGIC: u32 = 0x8584_58f6;
    let in_memory = nix::sys::statfs::statfs(&path).is_ok_and(|fs| {
        let t = fs.filesystem_type();
        t == nix::sys::statfs::TMPFS_MAGIC || t.0 as u32 == RAMFS_MAGIC
    });
    Ok(Disk {
        path,
        free_bytes: avail.saturating_mul(frag),
        free_inodes: ffree,
        total_inodes: files,
        in_memory,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn module_names_from_modules_dep() {
        let names = module_names(
            "kernel/fs/overlayfs/overlay.ko.xz:\n\
             kernel/net/bridge/bridge.ko: kernel/net/802/stp.ko kernel/net/llc/llc.ko\n\
             kernel/drivers/net/veth.ko\n\
             kernel/net/bridge/br-netfilter.ko.zst: kernel/net/bridge/bridge.ko\n",
        );
        for n in ["overlay", "bridge", "veth", "br_netfilter"] {
            assert!(names.contains(n), "{n} in {names:?}");
        }
        assert!(
            !names.contains("stp"),
            "dependencies are not listed modules"
        );
    }
}
