//! Reading a cgroup's CPU and memory figures, cgroup v1 and v2, as cAdvisor does for
//! the kubelet's summary. Reads only; parsing is pure over the files' text so it is
//! tested on fixtures of both versions.

use std::path::{Path, PathBuf};

/// The figures of one cgroup (or of the node).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Usage {
    /// Cumulative CPU time, nanoseconds.
    pub cpu_ns: Option<u64>,
    pub memory: Option<Memory>,
}

#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Memory {
    pub usage: u64,
    /// usage minus inactive file pages (what the kubelet evicts on).
    pub working_set: u64,
    pub rss: u64,
    pub page_faults: u64,
    pub major_page_faults: u64,
    /// The limit, if one is set (v1 reports "no limit" as a huge number).
    pub limit: Option<u64>,
}

/// Where the cgroup file system is, and which version it is.
#[derive(Debug, Clone)]
pub struct Hierarchy {
    root: PathBuf,
    v2: bool,
}

impl Hierarchy {
    pub fn host() -> Hierarchy {
        Hierarchy::at(Path::new("/sys/fs/cgroup"))
    }

    pub fn at(root: &Path) -> Hierarchy {
        Hierarchy {
            root: root.to_owned(),
            v2: root.join("cgroup.controllers").exists(),
        }
    }

    /// The figures of the cgroup at `path` (relative to each hierarchy's root, such
    /// as `/holdfast/<id>`); None when it does not exist (the container is gone).
    pub fn read(&self, path: &str) -> Option<Usage> {
        let rel = path.trim_start_matches('/');
        if self.v2 {
            let dir = self.root.join(rel);
            if !dir.is_dir() {
                return None;
            }
            Some(Usage {
                cpu_ns: read(&dir.join("cpu.stat")).and_then(|t| v2_cpu(&t)),
                memory: read(&dir.join("memory.current")).map(|current| {
                    v2_memory(
                        &current,
                        &read(&dir.join("memory.stat")).unwrap_or_default(),
                        &read(&dir.join("memory.max")).unwrap_or_default(),
                    )
                }),
            })
        } else {
            let cpu_dir = self.v1_dir("cpuacct", rel);
            let mem_dir = self.v1_dir("memory", rel);
            if !cpu_dir.is_dir() && !mem_dir.is_dir() {
                return None;
            }
            Some(Usage {
                cpu_ns: read(&cpu_dir.join("cpuacct.usage")).and_then(|t| t.trim().parse().ok()),
                memory: read(&mem_dir.join("memory.usage_in_bytes")).map(|usage| {
                    v1_memory(
                        &usage,
                        &read(&mem_dir.join("memory.stat")).unwrap_or_default(),
                        &read(&mem_dir.join("memory.limit_in_bytes")).unwrap_or_default(),
                    )
                }),
            })
        }
    }

    fn v1_dir(&self, controller: &str, rel: &str) -> PathBuf {
        // cpuacct is often co-mounted as cpu,cpuacct with a cpuacct link to it.
        let base = self.root.join(controller);
        if rel.is_empty() {
            base
        } else {
            base.join(rel)
        }
    }

    /// The node as a whole: the root cgroup, or `/proc` where v2's root has no file.
    pub fn node(&self, proc_dir: &Path) -> Usage {
        let mut u = if self.v2 {
            Usage {
                cpu_ns: read(&self.root.join("cpu.stat")).and_then(|t| v2_cpu(&t)),
                memory: None,
            }
        } else {
            self.read("/").unwrap_or_default()
        };
        if u.cpu_ns.is_none() {
            u.cpu_ns = read(&proc_dir.join("stat")).and_then(|t| proc_stat_cpu(&t));
        }
        let meminfo = read(&proc_dir.join("meminfo")).unwrap_or_default();
        let vmstat = read(&proc_dir.join("vmstat")).unwrap_or_default();
        let node_mem = proc_memory(&meminfo, &vmstat);
        u.memory = match (u.memory, node_mem) {
            // The root cgroup's figures, bounded by the machine's memory.
            (Some(mut m), Some(n)) => {
                m.limit = n.limit;
                Some(m)
            }
            (m, n) => m.or(n),
        };
        u
    }
}

fn read(path: &Path) -> Option<String> {
    std::fs::read_to_string(path).ok()
}

/// `key value` lines (memory.stat, cpu.stat, vmstat).
fn field(text: &str, key: &str) -> Option<u64> {
    text.lines()
        .filter_map(|l| l.split_once(' '))
        .find(|(k, _)| *k == key)
        .and_then(|(_, v)| v.trim().parse().ok())
}

fn v2_cpu(cpu_stat: &str) -> Option<u64> {
    field(cpu_stat, "usage_usec").map(|us| us.saturating_mul(1000))
}

fn working_set(usage: u64, inactive_file: u64) -> u64 {
    usage.saturating_sub(inactive_file)
}

fn v2_memory(current: &str, stat: &str, max: &str) -> Memory {
    let usage = current.trim().parse().unwrap_or(0);
    Memory {
        usage,
        working_set: working_set(usage, field(stat, "inactive_file").unwrap_or(0)),
        rss: field(stat, "anon").unwrap_or(0),
        page_faults: field(stat, "pgfault").unwrap_or(0),
        major_page_faults: field(stat, "pgmajfault").unwrap_or(0),
        limit: max.trim().parse().ok(),
    }
}

/// v1 reports an unset limit as the largest page-aligned i64.
const V1_NO_LIMIT: u64 = 1 << 60;

fn v1_memory(usage: &str, stat: &str, limit: &str) -> Memory {
    let usage = usage.trim().parse().unwrap_or(0);
    // `total_*` include the cgroup's children; a container's cgroup has none, the
    // root has them all.
    let get = |k: &str| field(stat, &format!("total_{k}")).or_else(|| field(stat, k));
    Memory {
        usage,
        working_set: working_set(usage, get("inactive_file").unwrap_or(0)),
        rss: get("rss").unwrap_or(0),
        page_faults: get("pgfault").unwrap_or(0),
        major_page_faults: get("pgmajfault").unwrap_or(0),
        limit: limit.trim().parse().ok().filter(|l| *l < V1_NO_LIMIT),
    }
}

/// The node's memory from `/proc/meminfo` (kB) and `/proc/vmstat`.
fn proc_memory(meminfo: &str, vmstat: &str) -> Option<Memory> {
    let kb = |k: &str| {
        meminfo
            .lines()
            .find_map(|l| l.strip_prefix(k)?.strip_prefix(':'))
            .and_then(|v| v.split_whitespace().next()?.parse::<u64>().ok())
            .map(|v| v * 1024)
    };
    let total = kb("MemTotal")?;
    let usage = total.saturating_sub(kb("MemFree").unwrap_or(0));
    Some(Memory {
        usage,
        working_set: working_set(usage, kb("Inactive(file)").unwrap_or(0)),
        rss: kb("AnonPages").unwrap_or(0),
        page_faults: field(vmstat, "pgfault").unwrap_or(0),
        major_page_faults: field(vmstat, "pgmajfault").unwrap_or(0),
        limit: Some(total),
    })
}

/// CPU time of the whole machine from `/proc/stat` (USER_HZ ticks, 100 a second on
/// every Linux ABI holdfast targets), without idle and iowait.
fn proc_stat_cpu(stat: &str) -> Option<u64> {
    let line = stat.lines().find(|l| l.starts_with("cpu "))?;
    let v: Vec<u64> = line
        .split_whitespace()
        .skip(1)
        .filter_map(|x| x.parse().ok())
        .collect();
    let busy: u64 = v
        .iter()
        .enumerate()
        .filter(|(i, _)| *i != 3 && *i != 4)
        .map(|(_, x)| *x)
        .take(8)
        .sum();
    Some(busy.saturating_mul(10_000_000))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fixture(files: &[(&str, &str)]) -> PathBuf {
        let d = std::env::temp_dir().join(format!(
            "holdfast-cgfix-{}-{}",
            std::process::id(),
            files.len() + files.first().map(|f| f.0.len()).unwrap_or(0)
        ));
        let _ = std::fs::remove_dir_all(&d);
        for (path, text) in files {
            let p = d.join(path);
            std::fs::create_dir_all(p.parent().expect("parent")).expect("mkdir");
            std::fs::write(p, text).expect("write");
        }
        d
    }

    #[test]
    fn cgroup_v2() {
        let d = fixture(&[
            ("cgroup.controllers", "cpu memory pids\n"),
            ("cpu.stat", "usage_usec 900000\nuser_usec 1\n"),
            ("hf/abc/cpu.stat", "usage_usec 1500000\nuser_usec 1000000\nsystem_usec 500000\n"),
            ("hf/abc/memory.current", "10485760\n"),
            (
                "hf/abc/memory.stat",
                "anon 6291456\nfile 4194304\ninactive_file 2097152\nactive_file 2097152\npgfault 1234\npgmajfault 5\n",
            ),
            ("hf/abc/memory.max", "max\n"),
            ("hf/lim/cpu.stat", "usage_usec 0\n"),
            ("hf/lim/memory.current", "100\n"),
            ("hf/lim/memory.max", "67108864\n"),
        ]);
        let h = Hierarchy::at(&d);
        let u = h.read("/hf/abc").expect("read");
        assert_eq!(u.cpu_ns, Some(1_500_000_000));
        let m = u.memory.expect("memory");
        assert_eq!(
            m,
            Memory {
                usage: 10485760,
                working_set: 8388608,
                rss: 6291456,
                page_faults: 1234,
                major_page_faults: 5,
                limit: None,
            }
        );
        assert_eq!(
            h.read("/hf/lim")
                .and_then(|u| u.memory)
                .and_then(|m| m.limit),
            Some(67108864)
        );
        assert_eq!(h.read("/hf/gone"), None);
        let _ = std::fs::remove_dir_all(&d);
    }

    #[test]
    fn cgroup_v1() {
        let d = fixture(&[
            ("cpuacct/hf/abc/cpuacct.usage", "2500000000\n"),
            ("memory/hf/abc/memory.usage_in_bytes", "8388608\n"),
            (
                "memory/hf/abc/memory.stat",
                "cache 1048576\nrss 4194304\ninactive_file 524288\npgfault 77\npgmajfault 1\ntotal_cache 1048576\ntotal_rss 4194304\ntotal_inactive_file 524288\ntotal_pgfault 77\ntotal_pgmajfault 1\n",
            ),
            ("memory/hf/abc/memory.limit_in_bytes", "9223372036854771712\n"),
        ]);
        let u = Hierarchy::at(&d).read("/hf/abc").expect("read");
        assert_eq!(u.cpu_ns, Some(2_500_000_000));
        let m = u.memory.expect("memory");
        assert_eq!(m.working_set, 8388608 - 524288);
        assert_eq!(m.rss, 4194304);
        assert_eq!((m.page_faults, m.major_page_faults), (77, 1));
        assert_eq!(m.limit, None);
        let _ = std::fs::remove_dir_all(&d);
    }

    #[test]
    fn node_from_proc() {
        let meminfo = "MemTotal:        2048000 kB\nMemFree:          512000 kB\nMemAvailable:    1024000 kB\nInactive(file):   256000 kB\nAnonPages:        300000 kB\n";
        let m = proc_memory(meminfo, "pgfault 10\npgmajfault 2\n").expect("mem");
        assert_eq!(m.limit, Some(2048000 * 1024));
        assert_eq!(m.usage, (2048000 - 512000) * 1024);
        assert_eq!(m.working_set, (2048000 - 512000 - 256000) * 1024);
        assert_eq!(
            proc_stat_cpu("cpu  100 0 50 1000 20 0 5 0 0 0\ncpu0 1 1 1 1\n"),
            Some(155 * 10_000_000)
        );
    }
}
