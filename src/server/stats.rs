//! `/stats/summary`: the node's and each pod's and container's CPU, memory, file
//! system and network figures, in the kubelet's stats/v1alpha1 shape (these are the
//! kubelet's own types, not API objects, so they are defined here). Gathered on a
//! blocking thread from cgroups ([`super::cgroups`]), `statvfs`, the container and log
//! directories, and `/proc/<pid>/net/dev` for pods with a network namespace of their
//! own.

use std::path::Path;
use std::time::{Duration, Instant};

use hyper::StatusCode;
use serde::Serialize;

use super::cgroups::{Hierarchy, Usage};
use super::deps::ApiDeps;
use super::http::{error, json, Query, Resp};
use super::lookup;
use crate::runtime::{ContainerState, Runtime};
use crate::sync::PodView;
use crate::time::Timestamp;

#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Summary {
    pub node: NodeStats,
    pub pods: Vec<PodStats>,
}

#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeStats {
    pub node_name: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub start_time: Option<Timestamp>,
    pub cpu: Option<CpuStats>,
    pub memory: Option<MemoryStats>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub network: Option<NetworkStats>,
    pub fs: Option<FsStats>,
    pub runtime: RuntimeStats,
}

#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct RuntimeStats {
    pub image_fs: Option<FsStats>,
    pub container_fs: Option<FsStats>,
}

#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PodRef {
    pub name: String,
    pub namespace: String,
    pub uid: String,
}

#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PodStats {
    pub pod_ref: PodRef,
    pub start_time: Option<Timestamp>,
    pub containers: Vec<ContainerStats>,
    pub cpu: Option<CpuStats>,
    pub memory: Option<MemoryStats>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub network: Option<NetworkStats>,
    #[serde(rename = "ephemeral-storage")]
    pub ephemeral_storage: Option<FsStats>,
}

#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ContainerStats {
    pub name: String,
    pub start_time: Option<Timestamp>,
    pub cpu: Option<CpuStats>,
    pub memory: Option<MemoryStats>,
    pub rootfs: Option<FsStats>,
    pub logs: Option<FsStats>,
}

#[derive(Debug, Clone, Copy, Serialize, Default)]
#[serde(rename_all = "camelCase")]
pub struct CpuStats {
    pub time: Option<Timestamp>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub usage_nano_cores: Option<u64>,
    pub usage_core_nano_seconds: Option<u64>,
}

#[derive(Debug, Clone, Copy, Serialize, Default)]
#[serde(rename_all = "camelCase")]
pub struct MemoryStats {
    pub time: Option<Timestamp>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub available_bytes: Option<u64>,
    pub usage_bytes: u64,
    pub working_set_bytes: u64,
    pub rss_bytes: u64,
    pub page_faults: u64,
    pub major_page_faults: u64,
}

#[derive(Debug, Clone, Copy, Serialize, Default)]
#[serde(rename_all = "camelCase")]
pub struct FsStats {
    pub time: Option<Timestamp>,
    pub available_bytes: Option<u64>,
    pub capacity_bytes: Option<u64>,
    pub used_bytes: Option<u64>,
    pub inodes_free: Option<u64>,
    pub inodes: Option<u64>,
    pub inodes_used: Option<u64>,
}

#[derive(Debug, Clone, Serialize, Default)]
#[serde(rename_all = "camelCase")]
pub struct InterfaceStats {
    pub name: String,
    pub rx_bytes: u64,
    pub rx_errors: u64,
    pub tx_bytes: u64,
    pub tx_errors: u64,
}

#[derive(Debug, Clone, Serialize, Default)]
#[serde(rename_all = "camelCase")]
pub struct NetworkStats {
    pub time: Option<Timestamp>,
    #[serde(flatten)]
    pub default: InterfaceStats,
    pub interfaces: Vec<InterfaceStats>,
}

pub async fn summary(deps: &std::sync::Arc<ApiDeps>, q: &Query) -> Resp {
    let only_cpu_and_memory = match q.flag("only_cpu_and_memory") {
        Ok(b) => b,
        Err(e) => return error(StatusCode::BAD_REQUEST, &e),
    };
    match gather(deps).await {
        Ok(mut s) => {
            if only_cpu_and_memory {
                s.node.fs = None;
                s.node.network = None;
                for p in &mut s.pods {
                    p.network = None;
                    p.ephemeral_storage = None;
                    for c in &mut p.containers {
                        c.rootfs = None;
                        c.logs = None;
                    }
                }
            }
            json(&s)
        }
        Err(r) => r,
    }
}

/// Reads everything, off the async threads. The first time a cgroup is seen there is
/// no earlier CPU reading to take a rate from, so it reads again after a short pause.
pub async fn gather(deps: &std::sync::Arc<ApiDeps>) -> Result<Summary, Resp> {
    let states = lookup::all(deps).await?;
    let d = deps.clone();
    let first = tokio::task::spawn_blocking(move || collect(&d, &states))
        .await
        .map_err(|e| error(StatusCode::INTERNAL_SERVER_ERROR, &e.to_string()))?;
    if !first.1 {
        return Ok(first.0);
    }
    tokio::time::sleep(Duration::from_millis(100)).await;
    let states = lookup::all(deps).await?;
    let d = deps.clone();
    tokio::task::spawn_blocking(move || collect(&d, &states).0)
        .await
        .map_err(|e| error(StatusCode::INTERNAL_SERVER_ERROR, &e.to_string()))
}

/// The summary, and whether a CPU rate was missing for want of an earlier reading.
fn collect(deps: &ApiDeps, states: &[PodView]) -> (Summary, bool) {
    let mut scrape = Scrape {
        deps,
        h: Hierarchy::host(),
        now: crate::time::now(),
        mono: Instant::now(),
        missing_rate: false,
    };
    let node = scrape.node();
    let pods = states.iter().map(|s| scrape.pod(s)).collect();
    (Summary { node, pods }, scrape.missing_rate)
}

/// One reading of everything, at one time.
struct Scrape<'a> {
    deps: &'a ApiDeps,
    h: Hierarchy,
    now: Timestamp,
    mono: Instant,
    /// Whether a CPU rate was missing for want of an earlier reading.
    missing_rate: bool,
}

impl Scrape<'_> {
    /// CPU time, and its rate since the sampler's last reading of `key`.
    fn cpu(&mut self, key: &str, u: &Usage) -> Option<CpuStats> {
        let ns = u.cpu_ns?;
        let sampler = &self.deps.sampler;
        self.missing_rate |= !sampler.knows(key);
        let rate = sampler.rate(key, self.mono, ns);
        Some(CpuStats {
            time: Some(self.now),
            usage_nano_cores: rate,
            usage_core_nano_seconds: Some(ns),
        })
    }

    fn node(&mut self) -> NodeStats {
        let (deps, now) = (self.deps, self.now);
        let node_usage = self.h.node(Path::new("/proc"));
        let root_fs = fs_stats(&deps.root_dir, now, None);
        NodeStats {
            node_name: deps.node_name.clone(),
            start_time: boot_time(),
            cpu: self.cpu("/", &node_usage),
            memory: node_usage.memory.map(|m| memory(m, now)),
            network: net_dev(Path::new("/proc/net/dev"), now),
            fs: root_fs,
            runtime: RuntimeStats {
                image_fs: fs_stats(&deps.root_dir.join("content"), now, None),
                container_fs: fs_stats(&deps.root_dir.join("containers"), now, None),
            },
        }
    }

    /// A pod: its running containers, and their sums.
    fn pod(&mut self, s: &PodView) -> PodStats {
        let (deps, now) = (self.deps, self.now);
        let (containers, pid) = self.containers(s);
        let m = &s.pod().metadata;
        let sum_cpu = sum(&containers, |c| {
            c.cpu.and_then(|c| c.usage_core_nano_seconds)
        });
        let sum_rate = sum(&containers, |c| c.cpu.and_then(|c| c.usage_nano_cores));
        let used = containers
            .iter()
            .map(|c| {
                c.rootfs.and_then(|f| f.used_bytes).unwrap_or(0)
                    + c.logs.and_then(|f| f.used_bytes).unwrap_or(0)
            })
            .sum();
        PodStats {
            pod_ref: PodRef {
                name: m.name.clone().unwrap_or_default(),
                namespace: m.namespace.clone().unwrap_or_else(|| "default".into()),
                uid: m.uid.clone().unwrap_or_default(),
            },
            start_time: Some(s.start_time()),
            cpu: sum_cpu.map(|ns| CpuStats {
                time: Some(now),
                usage_nano_cores: sum_rate,
                usage_core_nano_seconds: Some(ns),
            }),
            memory: pod_memory(&containers, now),
            network: pid.and_then(|p| pod_network(p, now)),
            ephemeral_storage: fs_stats(&deps.root_dir, now, Some(used)),
            containers,
        }
    }

    /// The pod's running containers whose cgroup can be read, and the pid of the first
    /// (its network namespace is the pod's).
    fn containers(&mut self, s: &PodView) -> (Vec<ContainerStats>, Option<i32>) {
        let (deps, now) = (self.deps, self.now);
        let mut containers = Vec::new();
        let mut pid = None;
        for cs in s.status().container_statuses.iter().flatten() {
            let Some(running) = cs.state.as_ref().and_then(|st| st.running.as_ref()) else {
                continue;
            };
            let Some(id) = lookup::instance_id(cs, false) else {
                continue;
            };
            let path = deps.runtime.cgroups_path(&id);
            let Some(u) = self.h.read(&path) else {
                continue;
            };
            if pid.is_none() {
                if let Ok(ContainerState::Running { pid: p, .. }) = deps.runtime.state(&id) {
                    pid = Some(p);
                }
            }
            let dir = deps.runtime.container_dir(&id);
            let logs = lookup::log_dir(deps, s).join(&cs.name);
            containers.push(ContainerStats {
                name: cs.name.clone(),
                start_time: running.started_at.as_ref().map(|t| t.0),
                cpu: self.cpu(&id.0, &u),
                memory: u.memory.map(|m| memory(m, now)),
                rootfs: fs_stats(&dir, now, Some(du(&dir.join("upper")))),
                logs: fs_stats(&deps.root_dir, now, Some(du(&logs))),
            });
        }
        (containers, pid)
    }
}

/// A pod's memory: the sums of its containers' (none without containers).
fn pod_memory(containers: &[ContainerStats], now: Timestamp) -> Option<MemoryStats> {
    (!containers.is_empty()).then(|| {
        let f = |g: fn(&MemoryStats) -> u64| {
            containers
                .iter()
                .filter_map(|c| c.memory.as_ref().map(g))
                .sum::<u64>()
        };
        MemoryStats {
            time: Some(now),
            available_bytes: None,
            usage_bytes: f(|m| m.usage_bytes),
            working_set_bytes: f(|m| m.working_set_bytes),
            rss_bytes: f(|m| m.rss_bytes),
            page_faults: f(|m| m.page_faults),
            major_page_faults: f(|m| m.major_page_faults),
        }
    })
}

fn sum(cs: &[ContainerStats], f: impl Fn(&ContainerStats) -> Option<u64>) -> Option<u64> {
    let v: Vec<u64> = cs.iter().filter_map(f).collect();
    (!v.is_empty() && v.len() == cs.len()).then(|| v.iter().sum())
}

fn memory(m: super::cgroups::Memory, now: Timestamp) -> MemoryStats {
    MemoryStats {
        time: Some(now),
        available_bytes: m.limit.map(|l| l.saturating_sub(m.working_set)),
        usage_bytes: m.usage,
        working_set_bytes: m.working_set,
        rss_bytes: m.rss,
        page_faults: m.page_faults,
        major_page_faults: m.major_page_faults,
    }
}

/// The file system holding `path`; `used` replaces its used bytes (a directory's own
/// usage rather than the whole file system's).
fn fs_stats(path: &Path, now: Timestamp, used: Option<u64>) -> Option<FsStats> {
    let st = crate::node::facts::statfs(path).ok()?;
    let (cap, avail, free) = (st.capacity, st.available, st.free);
    let (inodes, ifree) = (st.inodes, st.inodes_free);
    Some(FsStats {
        time: Some(now),
        available_bytes: Some(avail),
        capacity_bytes: Some(cap),
        used_bytes: Some(used.unwrap_or(cap.saturating_sub(free))),
        inodes_free: Some(ifree),
        inodes: Some(inodes),
        inodes_used: Some(inodes.saturating_sub(ifree)),
    })
}

/// Bytes used under `dir` (allocated blocks, as `du` counts), not following links or
/// crossing into mounts; bounded (see `node::du`).
pub fn du(dir: &Path) -> u64 {
    crate::node::du::usage(dir).bytes
}

fn boot_time() -> Option<Timestamp> {
    let stat = std::fs::read_to_string("/proc/stat").ok()?;
    let secs: i64 = stat
        .lines()
        .find_map(|l| l.strip_prefix("btime "))?
        .trim()
        .parse()
        .ok()?;
    Timestamp::from_second(secs).ok()
}

/// Interfaces from a `/proc/.../net/dev` file, loopback left out; the first one (eth0
/// if there is one) is also the default the kubelet reports at the top level.
fn net_dev(path: &Path, now: Timestamp) -> Option<NetworkStats> {
    let text = std::fs::read_to_string(path).ok()?;
    let mut ifaces = parse_net_dev(&text);
    ifaces.retain(|i| i.name != "lo");
    if ifaces.is_empty() {
        return None;
    }
    let default = ifaces
        .iter()
        .find(|i| i.name == "eth0")
        .unwrap_or(&ifaces[0])
        .clone();
    Some(NetworkStats {
        time: Some(now),
        default,
        interfaces: ifaces,
    })
}

fn parse_net_dev(text: &str) -> Vec<InterfaceStats> {
    text.lines()
        .skip(2)
        .filter_map(|l| {
            let (name, rest) = l.split_once(':')?;
            let v: Vec<u64> = rest
                .split_whitespace()
                .filter_map(|x| x.parse().ok())
                .collect();
            (v.len() >= 11).then(|| InterfaceStats {
                name: name.trim().to_owned(),
                rx_bytes: v[0],
                rx_errors: v[2],
                tx_bytes: v[8],
                tx_errors: v[10],
            })
        })
        .collect()
}

/// A pod's network, if its containers have a network namespace of their own (host
/// network pods share the node's, which the node's figures already show).
fn pod_network(pid: i32, now: Timestamp) -> Option<NetworkStats> {
    let own = std::fs::read_link(format!("/proc/{pid}/ns/net")).ok()?;
    let host = std::fs::read_link("/proc/self/ns/net").ok()?;
    if own == host {
        return None;
    }
    net_dev(Path::new(&format!("/proc/{pid}/net/dev")), now)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn net_dev_lines() {
        let text = "Inter-|   Receive                                                |  Transmit\n face |bytes    packets errs drop fifo frame compressed multicast|bytes    packets errs drop fifo colls carrier compressed\n    lo: 100 1 0 0 0 0 0 0 100 1 0 0 0 0 0 0\n  eth0: 5000 10 2 0 0 0 0 0 7000 12 3 0 0 0 0 0\n";
        let v = parse_net_dev(text);
        assert_eq!(v.len(), 2);
        assert_eq!(v[1].name, "eth0");
        assert_eq!(
            (v[1].rx_bytes, v[1].rx_errors, v[1].tx_bytes, v[1].tx_errors),
            (5000, 2, 7000, 3)
        );
    }
}
