//! The few cgroup facts the runtime reads or cleans itself (libcontainer manages the
//! rest): whether the kernel OOM-killed inside a container's cgroup, and removing a
//! container's cgroup directories left behind by a shim that died.

use std::path::{Path, PathBuf};

const CGROUP_ROOT: &str = "/sys/fs/cgroup";

/// Every directory `cgroups_path` names: one per v1 hierarchy, or one under v2.
pub fn dirs(cgroups_path: &str) -> Vec<PathBuf> {
    let rel = cgroups_path.trim_start_matches('/');
    let root = Path::new(CGROUP_ROOT);
    if root.join("cgroup.controllers").exists() {
        return vec![root.join(rel)];
    }
    let mut out = Vec::new();
    if let Ok(entries) = std::fs::read_dir(root) {
        for e in entries.flatten() {
            // cpu,cpuacct style links point at hierarchies already listed.
            if e.file_type().map(|t| t.is_dir()).unwrap_or(false) {
                out.push(e.path().join(rel));
            }
        }
    }
    out.sort();
    out
}

/// Whether the kernel's OOM killer ran inside the cgroup. Must be read before the
/// cgroup is deleted.
pub fn oom_killed(cgroups_path: &str) -> bool {
    let rel = cgroups_path.trim_start_matches('/');
    let v1 = Path::new(CGROUP_ROOT)
        .join("memory")
        .join(rel)
        .join("memory.oom_control");
    if let Ok(text) = std::fs::read_to_string(&v1) {
        return counter(&text, "oom_kill") > 0 || counter(&text, "under_oom") > 0;
    }
    let v2 = Path::new(CGROUP_ROOT).join(rel).join("memory.events");
    if let Ok(text) = std::fs::read_to_string(&v2) {
        return counter(&text, "oom_kill") > 0;
    }
    false
}

fn counter(text: &str, key: &str) -> u64 {
    text.lines()
        .filter_map(|l| l.split_once(' '))
        .find(|(k, _)| *k == key)
        .and_then(|(_, v)| v.trim().parse().ok())
        .unwrap_or(0)
}

/// Removes the cgroup's directories (only if empty of processes: rmdir, never a
/// recursive delete, which cgroupfs refuses anyway).
pub fn remove(cgroups_path: &str) -> Result<(), String> {
    for dir in dirs(cgroups_path) {
        match std::fs::remove_dir(&dir) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(format!("remove cgroup {}: {e}", dir.display())),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counters() {
        let text = "oom_kill_disable 0\nunder_oom 0\noom_kill 2\n";
        assert_eq!(counter(text, "oom_kill"), 2);
        assert_eq!(counter(text, "under_oom"), 0);
        assert_eq!(counter(text, "missing"), 0);
    }
}
