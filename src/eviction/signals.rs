//! What the eviction manager observes and compares with `evictionHard`, as the
//! kubelet's signals define them:
//!
//! - `memory.available`: the node's memory less the working set of the root cgroup.
//! - `allocatableMemory.available` (with `enforceNodeAllocatable: [pods]`, the
//!   default): the memory the pods' cgroup may use — the lowest limit on it or above
//!   it, so a cgroupRoot the device's integrator capped counts — less the pods'
//!   working set; compared with `memory.available`'s threshold.
//! - `nodefs.available`, `nodefs.inodesFree`: the filesystem of the root dir.
//! - `imagefs.available`, `imagefs.inodesFree`: the filesystem of the image store
//!   (the same one unless `content/` is mounted elsewhere).

use std::collections::BTreeMap;
use std::path::Path;

use crate::node::allocatable::Threshold;

/// A signal's observation: what is available of how much.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Observed {
    pub available: u64,
    pub capacity: u64,
}

/// Which resource a signal is about, as the kubelet's `signalToResource`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Resource {
    Memory,
    EphemeralStorage,
    Inodes,
}

impl Resource {
    /// As the kubelet names it in messages.
    pub fn name(self) -> &'static str {
        match self {
            Resource::Memory => "memory",
            Resource::EphemeralStorage => "ephemeral-storage",
            Resource::Inodes => "inodes",
        }
    }
}

pub fn resource(signal: &str) -> Option<Resource> {
    match signal {
        "memory.available" | "allocatableMemory.available" => Some(Resource::Memory),
        "nodefs.available" | "imagefs.available" => Some(Resource::EphemeralStorage),
        "nodefs.inodesFree" | "imagefs.inodesFree" => Some(Resource::Inodes),
        _ => None,
    }
}

/// A threshold that is met: its signal, the threshold in bytes (or inodes), the
/// observation.
#[derive(Debug, Clone, PartialEq)]
pub struct Met {
    pub signal: String,
    pub resource: Resource,
    pub threshold: u64,
    /// The threshold as configured (`100Mi`), for the message; None for a
    /// percentage, which the message gives as the amount it came to.
    pub quantity: Option<String>,
    pub observed: Observed,
}

/// The thresholds of `eviction_hard` that `observations` meet, in signal order.
/// `allocatableMemory.available` takes the threshold of `memory.available`.
pub fn met(
    eviction_hard: &BTreeMap<String, Threshold>,
    raw: &BTreeMap<String, String>,
    observations: &BTreeMap<&'static str, Observed>,
) -> Vec<Met> {
    let mut out = Vec::new();
    for (signal, observed) in observations {
        let key = if *signal == "allocatableMemory.available" {
            "memory.available"
        } else {
            signal
        };
        let (Some(t), Some(res)) = (eviction_hard.get(key), resource(signal)) else {
            continue;
        };
        let threshold = t.amount(observed.capacity);
        if observed.available < threshold {
            out.push(Met {
                signal: (*signal).to_owned(),
                resource: res,
                threshold,
                quantity: match t {
                    Threshold::Quantity(_) => raw.get(key).cloned(),
                    Threshold::Fraction(_) => None,
                },
                observed: *observed,
            });
        }
    }
    out
}

/// What the node shows now. `pods_cgroup` is `<cgroupRoot>/kubepods` when its memory
/// is enforced as allocatable.
pub fn observe(
    tree: &crate::resources::CgroupTree,
    root_dir: &Path,
    pods_cgroup: Option<&str>,
) -> BTreeMap<&'static str, Observed> {
    let mut out = BTreeMap::new();
    let meminfo = crate::node::facts::read_meminfo(Path::new("/proc/meminfo"));
    if let Some(total) = meminfo.total {
        let working_set = tree
            .working_set("")
            .or_else(|| meminfo.available.map(|a| total.saturating_sub(a)));
        if let Some(ws) = working_set {
            out.insert(
                "memory.available",
                Observed {
                    available: total.saturating_sub(ws),
                    capacity: total,
                },
            );
        }
    }
    if let Some(rel) = pods_cgroup {
        if let (Some(limit), Some(ws)) = (tree.effective_memory_limit(rel), tree.working_set(rel)) {
            out.insert(
                "allocatableMemory.available",
                Observed {
                    available: limit.saturating_sub(ws),
                    capacity: limit,
                },
            );
        }
    }
    if let Some(fs) = crate::node::facts::read_fs_stats(root_dir) {
        out.insert(
            "nodefs.available",
            Observed {
                available: fs.available,
                capacity: fs.capacity,
            },
        );
        out.insert(
            "nodefs.inodesFree",
            Observed {
                available: fs.inodes_free,
                capacity: fs.inodes,
            },
        );
    }
    let content = root_dir.join("content");
    if let Some(fs) =
        crate::node::facts::read_fs_stats(if content.exists() { &content } else { root_dir })
    {
        out.insert(
            "imagefs.available",
            Observed {
                available: fs.available,
                capacity: fs.capacity,
            },
        );
        out.insert(
            "imagefs.inodesFree",
            Observed {
                available: fs.inodes_free,
                capacity: fs.inodes,
            },
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn thresholds_met_and_the_allocatable_signal() {
        let hard = BTreeMap::from([
            (
                "memory.available".to_string(),
                Threshold::Quantity(100 << 20),
            ),
            ("nodefs.available".to_string(), Threshold::Fraction(0.1)),
        ]);
        let raw = BTreeMap::from([
            ("memory.available".to_string(), "100Mi".to_string()),
            ("nodefs.available".to_string(), "10%".to_string()),
        ]);
        let obs = BTreeMap::from([
            (
                "memory.available",
                Observed {
                    available: 8 << 30,
                    capacity: 16 << 30,
                },
            ),
            (
                "allocatableMemory.available",
                Observed {
                    available: 60 << 20,
                    capacity: 200 << 20,
                },
            ),
            (
                "nodefs.available",
                Observed {
                    available: 5,
                    capacity: 100,
                },
            ),
            (
                "imagefs.available",
                Observed {
                    available: 5,
                    capacity: 100,
                },
            ),
        ]);
        let m = met(&hard, &raw, &obs);
        assert_eq!(m.len(), 2, "{m:?}");
        assert_eq!(m[0].signal, "allocatableMemory.available");
        assert_eq!(m[0].resource, Resource::Memory);
        assert_eq!(m[0].threshold, 100 << 20);
        assert_eq!(m[0].quantity.as_deref(), Some("100Mi"));
        assert_eq!(m[1].signal, "nodefs.available");
        assert_eq!(m[1].threshold, 10);
        assert_eq!(m[1].quantity, None);
    }
}
