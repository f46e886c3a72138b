//! What the device is, as node status reports it: CPUs, memory, the storage under the
//! agent's root directory, kernel, OS image, identity and process headroom. Each
//! reader takes the file it reads (or a root to read under) so tests can feed it
//! fixtures; a missing or garbled file gives a fallback, never a panic or an error,
//! because a gateway with an odd kernel must still be able to join its cluster.

use std::net::IpAddr;
use std::path::{Path, PathBuf};

/// The facts node status is built from, read once per status computation.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct NodeFacts {
    /// Online CPUs.
    pub cpus: u32,
    /// `MemTotal` in bytes; `None` if /proc/meminfo could not be read.
    pub memory_total: Option<u64>,
    /// `MemAvailable` in bytes: what the memory.available eviction signal is measured
    /// against.
    pub memory_available: Option<u64>,
    /// The filesystem holding the agent's root directory: the node's ephemeral storage
    /// (and its image store).
    pub storage: Option<FsStats>,
    /// `uname -r`.
    pub kernel_version: String,
    /// `PRETTY_NAME` from os-release, else `Linux`.
    pub os_image: String,
    /// /etc/machine-id, empty if there is none.
    pub machine_id: String,
    /// The hardware's UUID; see [`read_system_uuid`] for where it comes from.
    pub system_uuid: String,
    /// Changes at every boot; the cluster reads a new one as a reboot.
    pub boot_id: String,
    /// Go's name for the architecture (`amd64`, `arm64`, `arm`), as Kubernetes uses it.
    pub architecture: String,
    /// The most processes (threads) the kernel allows at once.
    pub pid_max: Option<u64>,
    /// Processes (threads) now, for the pid.available signal.
    pub processes: Option<u64>,
    /// The default route's address, the node's InternalIP unless `--node-ip` says.
    pub host_ip: Option<IpAddr>,
}

/// Space and inodes of one filesystem, in bytes and counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FsStats {
    pub capacity: u64,
    /// Free bytes for unprivileged writes (`f_bavail`), as `df` and the kubelet count.
    pub available: u64,
    /// Free bytes including the blocks kept for root (`f_bfree`).
    pub free: u64,
    pub inodes: u64,
    pub inodes_free: u64,
}

/// `MemTotal` and `MemAvailable`, in bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct MemInfo {
    pub total: Option<u64>,
    pub available: Option<u64>,
}

impl NodeFacts {
    /// The facts of this device; `root_dir` is the agent's state directory.
    pub fn read(root_dir: &Path) -> NodeFacts {
        let mut facts = NodeFacts::read_under(Path::new("/"), root_dir);
        if let Ok(uts) = nix::sys::utsname::uname() {
            facts.kernel_version = uts.release().to_string_lossy().into_owned();
        }
        facts.host_ip = super::host_ip().and_then(|ip| ip.parse().ok());
        facts
    }

    /// The facts found in the files under `host_root` (`/` on the device): no system
    /// calls beyond file reads and statvfs, and no address.
    pub fn read_under(host_root: &Path, root_dir: &Path) -> NodeFacts {
        let at = |p: &str| host_root.join(p);
        let mem = read_meminfo(&at("proc/meminfo"));
        let machine_id = read_machine_id(host_root);
        NodeFacts {
            cpus: read_cpu_count(&at("sys/devices/system/cpu/online")),
            memory_total: mem.total,
            memory_available: mem.available,
            storage: read_fs_stats(root_dir),
            kernel_version: read_trimmed(&at("proc/sys/kernel/osrelease")).unwrap_or_default(),
            os_image: read_os_image(host_root),
            system_uuid: read_system_uuid(host_root),
            machine_id,
            boot_id: read_trimmed(&at("proc/sys/kernel/random/boot_id")).unwrap_or_default(),
            architecture: go_arch(std::env::consts::ARCH).to_string(),
            pid_max: read_pid_max(host_root),
            processes: read_process_count(&at("proc/loadavg")),
            host_ip: None,
        }
    }
}

/// Online CPUs from a sysfs CPU list (`0-3`, `0,2-5`), else what the standard library
/// sees, else one.
pub fn read_cpu_count(online: &Path) -> u32 {
    read_trimmed(online)
        .and_then(|s| parse_cpu_list(&s))
        .or_else(|| {
            std::thread::available_parallelism()
                .ok()
                .and_then(|n| u32::try_from(n.get()).ok())
        })
        .unwrap_or(1)
}

/// Counts the CPUs in a list like `0-3,6,8-9`; `None` if it is malformed or empty.
pub fn parse_cpu_list(list: &str) -> Option<u32> {
    let mut count: u32 = 0;
    for part in list.trim().split(',') {
        let n = match part.split_once('-') {
            Some((a, b)) => {
                let (a, b) = (a.trim().parse::<u32>().ok()?, b.trim().parse::<u32>().ok()?);
                b.checked_sub(a)?.checked_add(1)?
            }
            None => {
                part.trim().parse::<u32>().ok()?;
                1
            }
        };
        count = count.checked_add(n)?;
    }
    (count > 0).then_some(count)
}

/// `MemTotal` and `MemAvailable` from /proc/meminfo (given in KiB there).
pub fn read_meminfo(path: &Path) -> MemInfo {
    let Some(text) = read_text(path) else {
        return MemInfo::default();
    };
    let field = |name: &str| {
        text.lines().find_map(|line| {
            let rest = line.strip_prefix(name)?.strip_prefix(':')?;
            let mut words = rest.split_whitespace();
            let n: u64 = words.next()?.parse().ok()?;
            match words.next() {
                Some("kB") => n.checked_mul(1024),
                None => Some(n),
                Some(_) => None,
            }
        })
    };
    MemInfo {
        total: field("MemTotal"),
        available: field("MemAvailable"),
    }
}

/// statvfs of `dir`, or of its nearest existing ancestor when it is not made yet (the
/// first start, before the root directory exists).
pub fn read_fs_stats(dir: &Path) -> Option<FsStats> {
    let mut at: PathBuf = dir.to_path_buf();
    while !at.exists() {
        at = at.parent()?.to_path_buf();
    }
    statfs(&at).ok()
}

/// statvfs of the filesystem holding `path`, in bytes and inodes, on every target
/// (the counts are 32 bits wide on armv7 and 64 on the 64-bit targets).
pub fn statfs(path: &Path) -> nix::Result<FsStats> {
    let st = nix::sys::statvfs::statvfs(path)?;
    let fragment = widen(st.fragment_size());
    let fragment = if fragment == 0 {
        widen(st.block_size())
    } else {
        fragment
    };
    Ok(FsStats {
        capacity: widen(st.blocks()).saturating_mul(fragment),
        available: widen(st.blocks_available()).saturating_mul(fragment),
        free: widen(st.blocks_free()).saturating_mul(fragment),
        inodes: widen(st.files()),
        inodes_free: widen(st.files_free()),
    })
}

/// statvfs counts are 32 bits wide on some targets and 64 on others.
fn widen<T: Into<u64>>(n: T) -> u64 {
    n.into()
}

/// `PRETTY_NAME` from /etc/os-release, else /usr/lib/os-release, else `Linux`.
pub fn read_os_image(host_root: &Path) -> String {
    ["etc/os-release", "usr/lib/os-release"]
        .iter()
        .find_map(|p| read_text(&host_root.join(p)).and_then(|t| pretty_name(&t)))
        .unwrap_or_else(|| "Linux".to_string())
}

/// The `PRETTY_NAME` value of os-release text, unquoted.
pub fn pretty_name(os_release: &str) -> Option<String> {
    let raw = os_release
        .lines()
        .find_map(|l| l.trim().strip_prefix("PRETTY_NAME="))?
        .trim();
    let unquoted = match raw.chars().next() {
        Some(q @ ('"' | '\'')) if raw.len() >= 2 && raw.ends_with(q) => &raw[1..raw.len() - 1],
        _ => raw,
    };
    // os-release escapes $, ", \ and ` with a backslash inside double quotes.
    let mut out = String::with_capacity(unquoted.len());
    let mut chars = unquoted.chars();
    while let Some(c) = chars.next() {
        match c {
            '\\' => out.extend(chars.next()),
            c => out.push(c),
        }
    }
    let out = out.trim().to_string();
    (!out.is_empty()).then_some(out)
}

/// /etc/machine-id, else the D-Bus copy, else empty.
pub fn read_machine_id(host_root: &Path) -> String {
    ["etc/machine-id", "var/lib/dbus/machine-id"]
        .iter()
        .find_map(|p| read_trimmed(&host_root.join(p)))
        .unwrap_or_default()
}

/// The hardware's UUID, where cadvisor finds it for the kubelet: the firmware's DMI
/// product UUID (x86 and UEFI ARM servers), else a device tree's `system-id` or
/// `vm,uuid`; else the device-tree serial number most ARM boards carry (a Raspberry
/// Pi's SoC serial), which names the board as the kubelet has nothing to. Empty when
/// there is none: the machine ID is `machineID`, not the hardware's.
pub fn read_system_uuid(host_root: &Path) -> String {
    [
        "sys/class/dmi/id/product_uuid",
        "proc/device-tree/system-id",
        "proc/device-tree/vm,uuid",
        "proc/device-tree/serial-number",
    ]
    .iter()
    .find_map(|p| read_trimmed(&host_root.join(p)))
    .unwrap_or_default()
}

/// The kernel's limit on processes: the lower of `pid_max` and `threads-max`, as the
/// kubelet reads it.
pub fn read_pid_max(host_root: &Path) -> Option<u64> {
    let read = |p: &str| read_trimmed(&host_root.join(p)).and_then(|s| s.parse::<u64>().ok());
    match (
        read("proc/sys/kernel/pid_max"),
        read("proc/sys/kernel/threads-max"),
    ) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

/// Tasks on the system: the total of /proc/loadavg's `running/total` field, which the
/// kubelet prefers to sysinfo(2) because it does not wrap at 65536.
pub fn read_process_count(loadavg: &Path) -> Option<u64> {
    let text = read_text(loadavg)?;
    let field = text.split_whitespace().nth(3)?;
    field.split_once('/')?.1.parse().ok()
}

/// Go's `GOARCH` for a Rust `target_arch`, since Kubernetes labels and node info use
/// Go's names.
pub fn go_arch(rust_arch: &str) -> &str {
    match rust_arch {
        "x86_64" => "amd64",
        "x86" => "386",
        "aarch64" => "arm64",
        "arm" => "arm",
        "powerpc64" if cfg!(target_endian = "little") => "ppc64le",
        "powerpc64" => "ppc64",
        "riscv64" => "riscv64",
        "s390x" => "s390x",
        "loongarch64" => "loong64",
        other => other,
    }
}

fn read_text(path: &Path) -> Option<String> {
    let bytes = std::fs::read(path).ok()?;
    Some(String::from_utf8_lossy(&bytes).into_owned())
}

/// The file's text without surrounding whitespace or the NULs device-tree strings end
/// with; `None` if unreadable or empty.
fn read_trimmed(path: &Path) -> Option<String> {
    let text = read_text(path)?;
    let t = text.trim_matches(|c: char| c.is_whitespace() || c == '\0');
    (!t.is_empty()).then(|| t.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::TempDir;

    fn write(root: &Path, rel: &str, text: &str) {
        let p = root.join(rel);
        std::fs::create_dir_all(p.parent().expect("parent")).expect("mkdir");
        std::fs::write(p, text).expect("write");
    }

    #[test]
    fn cpu_lists() {
        assert_eq!(parse_cpu_list("0-3\n"), Some(4));
        assert_eq!(parse_cpu_list("0"), Some(1));
        assert_eq!(parse_cpu_list("0,2-5,8"), Some(6));
        for bad in ["", "3-1", "a-b", "0-", "1,,2"] {
            assert_eq!(parse_cpu_list(bad), None, "{bad:?}");
        }
        let tmp = TempDir::new("facts-cpu");
        write(&tmp.0, "online", "0-7\n");
        assert_eq!(read_cpu_count(&tmp.0.join("online")), 8);
        // Missing or garbled: the standard library's count, which is at least one.
        write(&tmp.0, "garbled", "x\n");
        for p in ["missing", "garbled"] {
            let n = read_cpu_count(&tmp.0.join(p));
            let std_n = std::thread::available_parallelism().map_or(1, |n| n.get());
            assert_eq!(n as usize, std_n, "{p}");
        }
    }

    #[test]
    fn meminfo() {
        let tmp = TempDir::new("facts-mem");
        write(
            &tmp.0,
            "meminfo",
            "MemTotal:        8048572 kB\nMemFree:          123456 kB\nMemAvailable:    6000000 kB\n\
             MemAvailableX:   1 kB\n",
        );
        let m = read_meminfo(&tmp.0.join("meminfo"));
        assert_eq!(m.total, Some(8_048_572 * 1024));
        assert_eq!(m.available, Some(6_000_000 * 1024));
        // A kernel too old for MemAvailable, and no file at all.
        write(&tmp.0, "old", "MemTotal: 1000 kB\nMemFree: 10 kB\n");
        let m = read_meminfo(&tmp.0.join("old"));
        assert_eq!((m.total, m.available), (Some(1_024_000), None));
        assert_eq!(read_meminfo(&tmp.0.join("missing")), MemInfo::default());
        write(&tmp.0, "bad", "MemTotal: lots kB\n");
        assert_eq!(read_meminfo(&tmp.0.join("bad")).total, None);
    }

    #[test]
    fn os_release() {
        assert_eq!(
            pretty_name("NAME=Poky\nPRETTY_NAME=\"Poky (Yocto Project Reference Distro) 5.0\"\n")
                .as_deref(),
            Some("Poky (Yocto Project Reference Distro) 5.0")
        );
        assert_eq!(
            pretty_name("PRETTY_NAME='Debian GNU/Linux 12'").as_deref(),
            Some("Debian GNU/Linux 12")
        );
        assert_eq!(
            pretty_name("PRETTY_NAME=\"say \\\"hi\\\"\"").as_deref(),
            Some("say \"hi\"")
        );
        assert_eq!(pretty_name("PRETTY_NAME=Plain").as_deref(), Some("Plain"));
        assert_eq!(pretty_name("PRETTY_NAME=\"\"\nNAME=x"), None);
        assert_eq!(pretty_name("NAME=x"), None);

        let tmp = TempDir::new("facts-os");
        assert_eq!(read_os_image(&tmp.0), "Linux");
        write(&tmp.0, "usr/lib/os-release", "PRETTY_NAME=\"From usr\"\n");
        assert_eq!(read_os_image(&tmp.0), "From usr");
        write(&tmp.0, "etc/os-release", "PRETTY_NAME=\"From etc\"\n");
        assert_eq!(read_os_image(&tmp.0), "From etc");
    }

    #[test]
    fn identity_fallbacks() {
        let tmp = TempDir::new("facts-id");
        let root = &tmp.0;
        assert_eq!(read_machine_id(root), "");
        assert_eq!(read_system_uuid(root), "");
        write(root, "var/lib/dbus/machine-id", "dbus-id\n");
        assert_eq!(read_machine_id(root), "dbus-id");
        write(root, "etc/machine-id", "3f2b8c1e9a7d4e6f8b0c1d2e3f4a5b6c\n");
        let id = read_machine_id(root);
        assert_eq!(id, "3f2b8c1e9a7d4e6f8b0c1d2e3f4a5b6c");
        // No DMI, no device tree: none (the machine ID is not the hardware's).
        assert_eq!(read_system_uuid(root), "");
        // A board's device-tree serial ends in a NUL.
        write(root, "proc/device-tree/serial-number", "10000000abcdef01\0");
        assert_eq!(read_system_uuid(root), "10000000abcdef01");
        // Firmware's DMI UUID first.
        write(
            root,
            "sys/class/dmi/id/product_uuid",
            "4c4c4544-0042-3510-8053-b7c04f4e3132\n",
        );
        assert_eq!(
            read_system_uuid(root),
            "4c4c4544-0042-3510-8053-b7c04f4e3132"
        );
    }

    #[test]
    fn process_headroom() {
        let tmp = TempDir::new("facts-pid");
        let root = &tmp.0;
        assert_eq!(read_pid_max(root), None);
        write(root, "proc/sys/kernel/pid_max", "4194304\n");
        assert_eq!(read_pid_max(root), Some(4_194_304));
        write(root, "proc/sys/kernel/threads-max", "62546\n");
        assert_eq!(read_pid_max(root), Some(62_546));
        write(root, "proc/loadavg", "0.52 0.58 0.59 3/1187 40521\n");
        assert_eq!(read_process_count(&root.join("proc/loadavg")), Some(1187));
        write(root, "bad", "0.52 0.58\n");
        assert_eq!(read_process_count(&root.join("bad")), None);
    }

    #[test]
    fn go_architecture_names() {
        assert_eq!(go_arch("x86_64"), "amd64");
        assert_eq!(go_arch("aarch64"), "arm64");
        assert_eq!(go_arch("arm"), "arm");
        assert_eq!(go_arch("riscv64"), "riscv64");
        let here = go_arch(std::env::consts::ARCH);
        assert!(["amd64", "arm64", "arm"].contains(&here), "{here}");
    }

    #[test]
    fn storage_of_a_dir_not_made_yet() {
        let tmp = TempDir::new("facts-fs");
        let made = read_fs_stats(&tmp.0).expect("statvfs");
        assert!(made.capacity > 0 && made.available <= made.capacity);
        assert!(made.inodes_free <= made.inodes);
        let later = read_fs_stats(&tmp.0.join("not/yet/made")).expect("ancestor");
        assert_eq!(later.capacity, made.capacity);
    }

    #[test]
    fn a_fixture_root() {
        let tmp = TempDir::new("facts-root");
        let root = &tmp.0;
        write(root, "sys/devices/system/cpu/online", "0-3\n");
        write(
            root,
            "proc/meminfo",
            "MemTotal: 8048572 kB\nMemAvailable: 4000 kB\n",
        );
        write(root, "proc/sys/kernel/osrelease", "6.6.23-yocto-standard\n");
        write(
            root,
            "proc/sys/kernel/random/boot_id",
            "6a0e3b0c-2f4e-4d59-9d8a-1b2c3d4e5f60\n",
        );
        write(root, "etc/machine-id", "m1\n");
        write(root, "proc/loadavg", "0 0 0 1/99 7\n");
        write(root, "proc/sys/kernel/pid_max", "32768\n");
        let f = NodeFacts::read_under(root, root);
        assert_eq!(f.cpus, 4);
        assert_eq!(f.memory_total, Some(8_048_572 * 1024));
        assert_eq!(f.memory_available, Some(4000 * 1024));
        assert_eq!(f.kernel_version, "6.6.23-yocto-standard");
        assert_eq!(f.boot_id, "6a0e3b0c-2f4e-4d59-9d8a-1b2c3d4e5f60");
        assert_eq!(f.os_image, "Linux");
        assert_eq!(f.machine_id, "m1");
        assert_eq!(f.system_uuid, "");
        assert_eq!((f.pid_max, f.processes), (Some(32768), Some(99)));
        assert!(f.storage.is_some());
        assert_eq!(f.host_ip, None);

        // An empty root: every fallback, no panic.
        let empty = TempDir::new("facts-empty");
        let f = NodeFacts::read_under(&empty.0, &empty.0.join("state"));
        assert!(f.cpus >= 1);
        assert_eq!((f.memory_total, f.pid_max, f.processes), (None, None, None));
        assert_eq!(
            (f.kernel_version.as_str(), f.os_image.as_str()),
            ("", "Linux")
        );
    }

    #[test]
    fn this_device() {
        let f = NodeFacts::read(&std::env::temp_dir());
        let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").expect("osrelease");
        assert_eq!(f.kernel_version, release.trim());
        assert!(f.memory_total.is_some_and(|m| m > 0));
        assert!(f.cpus >= 1);
        assert_eq!(f.architecture, go_arch(std::env::consts::ARCH));
    }
}
