//! The node's four conditions with the kubelet's exact reasons and messages:
//! MemoryPressure, DiskPressure and PIDPressure from the hard eviction thresholds, and
//! Ready. `lastTransitionTime` moves only when a condition's status flips.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::NodeCondition;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

use crate::node::allocatable::{CPU, EPHEMERAL_STORAGE, MEMORY, PODS};
use crate::node::{NodeFacts, NodeInput};
use crate::time::Timestamp;

/// (type, (reason, message) when the condition is True, (reason, message) when False).
type Texts = (
    &'static str,
    (&'static str, &'static str),
    (&'static str, &'static str),
);

const MEMORY_PRESSURE: Texts = (
    "MemoryPressure",
    (
        "KubeletHasInsufficientMemory",
        "kubelet has insufficient memory available",
    ),
    (
        "KubeletHasSufficientMemory",
        "kubelet has sufficient memory available",
    ),
);
const DISK_PRESSURE: Texts = (
    "DiskPressure",
    ("KubeletHasDiskPressure", "kubelet has disk pressure"),
    ("KubeletHasNoDiskPressure", "kubelet has no disk pressure"),
);
const PID_PRESSURE: Texts = (
    "PIDPressure",
    (
        "KubeletHasInsufficientPID",
        "kubelet has insufficient PID available",
    ),
    (
        "KubeletHasSufficientPID",
        "kubelet has sufficient PID available",
    ),
);
pub const READY: &str = "Ready";
const READY_REASON: &str = "KubeletReady";
const READY_MESSAGE: &str = "kubelet is posting ready status";
const NOT_READY_REASON: &str = "KubeletNotReady";

/// The resources the kubelet will not call a node Ready without.
const REQUIRED_CAPACITY: &[&str] = &[CPU, MEMORY, PODS, EPHEMERAL_STORAGE];

/// The conditions this node reports, in the kubelet's order (Ready last), with
/// `lastTransitionTime` still unset.
pub fn current(
    input: &NodeInput,
    facts: &NodeFacts,
    capacity: &BTreeMap<String, Quantity>,
    now: &Time,
) -> [NodeCondition; 4] {
    let below = |available: Option<u64>, capacity: Option<u64>, signals: &[&str]| {
        signals.iter().any(
            |signal| match (input.eviction_hard.get(*signal), available, capacity) {
                (Some(t), Some(avail), Some(cap)) => avail < t.amount(cap),
                _ => false,
            },
        )
    };
    let memory = below(
        facts.memory_available,
        facts.memory_total,
        &["memory.available"],
    );
    // The image store lives under the root directory, so imagefs is nodefs here.
    let fs = facts.storage;
    let disk = below(
        fs.map(|f| f.available),
        fs.map(|f| f.capacity),
        &["nodefs.available", "imagefs.available"],
    ) || below(
        fs.map(|f| f.inodes_free),
        fs.map(|f| f.inodes),
        &["nodefs.inodesFree", "imagefs.inodesFree"],
    );
    let pids_free = facts
        .pid_max
        .zip(facts.processes)
        .map(|(max, now)| max.saturating_sub(now));
    let pid = below(pids_free, facts.pid_max, &["pid.available"]);

    [
        pressure(MEMORY_PRESSURE, memory, now),
        pressure(DISK_PRESSURE, disk, now),
        pressure(PID_PRESSURE, pid, now),
        ready(input, capacity, now),
    ]
}

fn pressure(texts: Texts, under_pressure: bool, now: &Time) -> NodeCondition {
    let (type_, on, off) = texts;
    let (status, (reason, message)) = if under_pressure {
        ("True", on)
    } else {
        ("False", off)
    };
    condition(type_, status, reason, message.to_string(), now)
}

fn ready(input: &NodeInput, capacity: &BTreeMap<String, Quantity>, now: &Time) -> NodeCondition {
    let mut errors: Vec<String> = input.not_ready.clone();
    let missing: Vec<&str> = REQUIRED_CAPACITY
        .iter()
        .copied()
        .filter(|r| !capacity.contains_key(*r))
        .collect();
    if !missing.is_empty() {
        errors.push(format!(
            "missing node capacity for resources: {}",
            missing.join(", ")
        ));
    }
    match aggregate(&errors) {
        None => condition(READY, "True", READY_REASON, READY_MESSAGE.into(), now),
        Some(message) => condition(READY, "False", NOT_READY_REASON, message, now),
    }
}

/// Several errors in one message the way Kubernetes' error aggregate prints them: one
/// as itself, more (repeats dropped) as `[a, b]`.
fn aggregate(errors: &[String]) -> Option<String> {
    let mut seen: Vec<&str> = Vec::new();
    for e in errors {
        if !seen.contains(&e.as_str()) {
            seen.push(e);
        }
    }
    match seen.as_slice() {
        [] => None,
        [one] => Some((*one).to_string()),
        many => Some(format!("[{}]", many.join(", "))),
    }
}

fn condition(
    type_: &str,
    status: &str,
    reason: &str,
    message: String,
    now: &Time,
) -> NodeCondition {
    NodeCondition {
        type_: type_.into(),
        status: status.into(),
        reason: Some(reason.into()),
        message: Some(message),
        last_heartbeat_time: Some(now.clone()),
        last_transition_time: None,
    }
}

/// `previous`'s conditions with ours put in: each replaces the one of its type where it
/// is, or is appended; conditions others set (a network plugin's NetworkUnavailable,
/// node-problem-detector's) stay. A condition keeps its `lastTransitionTime` unless its
/// status flipped.
pub fn merge(
    previous: &[NodeCondition],
    ours: [NodeCondition; 4],
    now: &Time,
) -> Vec<NodeCondition> {
    let mut out = previous.to_vec();
    for mut new in ours {
        match out.iter_mut().find(|c| c.type_ == new.type_) {
            Some(old) => {
                new.last_transition_time = match &old.last_transition_time {
                    Some(t) if old.status == new.status => Some(t.clone()),
                    _ => Some(now.clone()),
                };
                *old = new;
            }
            None => {
                new.last_transition_time = Some(now.clone());
                out.push(new);
            }
        }
    }
    out
}

/// `now` at whole seconds: the precision a Time has on the wire, so a status read back
/// from the apiserver equals the one computed.
pub fn wire_time(now: Timestamp) -> Time {
    Time(Timestamp::from_second(now.as_second()).unwrap_or(now))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::node::allocatable::Threshold;
    use crate::node::facts::FsStats;

    fn at(s: &str) -> Time {
        Time(s.parse().expect("timestamp"))
    }

    fn healthy() -> NodeFacts {
        NodeFacts {
            cpus: 2,
            memory_total: Some(4 << 30),
            memory_available: Some(2 << 30),
            storage: Some(FsStats {
                capacity: 100 << 30,
                available: 50 << 30,
                free: 50 << 30,
                inodes: 1_000_000,
                inodes_free: 900_000,
            }),
            pid_max: Some(32768),
            processes: Some(300),
            ..NodeFacts::default()
        }
    }

    fn full_capacity() -> BTreeMap<String, Quantity> {
        REQUIRED_CAPACITY
            .iter()
            .map(|r| (r.to_string(), Quantity("1".into())))
            .collect()
    }

    fn statuses(c: &[NodeCondition]) -> Vec<(&str, &str, &str)> {
        c.iter()
            .map(|c| {
                (
                    c.type_.as_str(),
                    c.status.as_str(),
                    c.reason.as_deref().unwrap_or(""),
                )
            })
            .collect()
    }

    #[test]
    fn a_healthy_node() {
        let input = NodeInput::for_tests("gw");
        let now = at("2026-11-22T07:30:40Z");
        let c = current(&input, &healthy(), &full_capacity(), &now);
        assert_eq!(
            statuses(&c),
            [
                ("MemoryPressure", "False", "KubeletHasSufficientMemory"),
                ("DiskPressure", "False", "KubeletHasNoDiskPressure"),
                ("PIDPressure", "False", "KubeletHasSufficientPID"),
                ("Ready", "True", "KubeletReady"),
            ]
        );
        assert_eq!(
            c[3].message.as_deref(),
            Some("kubelet is posting ready status")
        );
        assert_eq!(
            c[0].message.as_deref(),
            Some("kubelet has sufficient memory available")
        );
        assert!(c
            .iter()
            .all(|c| c.last_heartbeat_time.as_ref() == Some(&now)));
    }

    #[test]
    fn pressure_from_each_signal() {
        let mut input = NodeInput::for_tests("gw");
        let now = at("2026-11-22T07:30:40Z");
        let cap = full_capacity();

        // Memory: 50Mi available under the default 100Mi.
        let f = NodeFacts {
            memory_available: Some(50 << 20),
            ..healthy()
        };
        let c = current(&input, &f, &cap, &now);
        assert_eq!(
            statuses(&c)[0],
            ("MemoryPressure", "True", "KubeletHasInsufficientMemory")
        );
        assert_eq!(
            c[0].message.as_deref(),
            Some("kubelet has insufficient memory available")
        );
        assert_eq!(
            c[3].status, "True",
            "pressure alone does not make a node NotReady"
        );

        // Disk: 5% free under nodefs.available's 10%, then inodes under 5%.
        let mut f = healthy();
        f.storage = f.storage.map(|s| FsStats {
            available: 5 << 30,
            ..s
        });
        let c = current(&input, &f, &cap, &now);
        assert_eq!(
            statuses(&c)[1],
            ("DiskPressure", "True", "KubeletHasDiskPressure")
        );
        let mut f = healthy();
        f.storage = f.storage.map(|s| FsStats {
            inodes_free: 10,
            ..s
        });
        assert_eq!(current(&input, &f, &cap, &now)[1].status, "True");
        // 12% free: under imagefs.available's 15% (same filesystem).
        let mut f = healthy();
        f.storage = f.storage.map(|s| FsStats {
            available: 12 << 30,
            ..s
        });
        assert_eq!(current(&input, &f, &cap, &now)[1].status, "True");

        // PIDs: no threshold by default, as with the kubelet.
        let f = NodeFacts {
            processes: Some(32760),
            ..healthy()
        };
        assert_eq!(current(&input, &f, &cap, &now)[2].status, "False");
        input
            .eviction_hard
            .insert("pid.available".into(), Threshold::Quantity(1000));
        let c = current(&input, &f, &cap, &now);
        assert_eq!(
            statuses(&c)[2],
            ("PIDPressure", "True", "KubeletHasInsufficientPID")
        );
        assert_eq!(
            c[2].message.as_deref(),
            Some("kubelet has insufficient PID available")
        );

        // Unknown readings are no pressure.
        let f = NodeFacts {
            memory_available: None,
            storage: None,
            processes: None,
            ..healthy()
        };
        let c = current(&input, &f, &cap, &now);
        assert!(c[..3].iter().all(|c| c.status == "False"));
    }

    #[test]
    fn not_ready_messages() {
        let mut input = NodeInput::for_tests("gw");
        let now = at("2026-11-22T07:30:42Z");
        input.not_ready = vec!["container runtime network not ready: NetworkReady=false".into()];
        let c = current(&input, &healthy(), &full_capacity(), &now);
        assert_eq!(statuses(&c)[3], ("Ready", "False", "KubeletNotReady"));
        assert_eq!(
            c[3].message.as_deref(),
            Some("container runtime network not ready: NetworkReady=false")
        );

        let mut cap = full_capacity();
        cap.remove("memory");
        cap.remove("ephemeral-storage");
        input.not_ready.push(input.not_ready[0].clone());
        input.not_ready.push("runtime down".into());
        let c = current(&input, &healthy(), &cap, &now);
        assert_eq!(
            c[3].message.as_deref(),
            Some(
                "[container runtime network not ready: NetworkReady=false, runtime down, \
                 missing node capacity for resources: memory, ephemeral-storage]"
            )
        );
        input.not_ready.clear();
        let c = current(&input, &healthy(), &cap, &now);
        assert_eq!(
            c[3].message.as_deref(),
            Some("missing node capacity for resources: memory, ephemeral-storage")
        );
    }

    #[test]
    fn transitions_keep_or_move_the_time() {
        let input = NodeInput::for_tests("gw");
        let t0 = at("2026-11-22T07:30:40Z");
        let first = merge(&[], current(&input, &healthy(), &full_capacity(), &t0), &t0);
        assert!(first
            .iter()
            .all(|c| c.last_transition_time.as_ref() == Some(&t0)));

        // Nothing flipped: heartbeat moves, transition stays.
        let t1 = at("2026-11-22T07:30:50Z");
        let second = merge(
            &first,
            current(&input, &healthy(), &full_capacity(), &t1),
            &t1,
        );
        for c in &second {
            assert_eq!(c.last_transition_time.as_ref(), Some(&t0), "{}", c.type_);
            assert_eq!(c.last_heartbeat_time.as_ref(), Some(&t1), "{}", c.type_);
        }

        // Memory pressure starts: only that condition's transition moves.
        let t2 = at("2026-11-22T07:31:00Z");
        let low = NodeFacts {
            memory_available: Some(1 << 20),
            ..healthy()
        };
        let third = merge(&second, current(&input, &low, &full_capacity(), &t2), &t2);
        assert_eq!(third[0].last_transition_time.as_ref(), Some(&t2));
        assert!(third[1..]
            .iter()
            .all(|c| c.last_transition_time.as_ref() == Some(&t0)));

        // A message change without a status flip keeps the time.
        let mut down = NodeInput::for_tests("gw");
        down.not_ready = vec!["a".into()];
        let t3 = at("2026-11-22T07:31:10Z");
        let fourth = merge(&third, current(&down, &low, &full_capacity(), &t3), &t3);
        assert_eq!(fourth[3].last_transition_time.as_ref(), Some(&t3));
        down.not_ready = vec!["b".into()];
        let t4 = at("2026-11-22T07:31:20Z");
        let fifth = merge(&fourth, current(&down, &low, &full_capacity(), &t4), &t4);
        assert_eq!(fifth[3].message.as_deref(), Some("b"));
        assert_eq!(fifth[3].last_transition_time.as_ref(), Some(&t3));
    }

    #[test]
    fn foreign_conditions_stay_in_place() {
        let input = NodeInput::for_tests("gw");
        let t0 = at("2026-11-22T07:30:40Z");
        let network = NodeCondition {
            type_: "NetworkUnavailable".into(),
            status: "False".into(),
            reason: Some("RouteCreated".into()),
            ..NodeCondition::default()
        };
        // The node controller marked the node Unknown while it was away.
        let unknown = NodeCondition {
            type_: "Ready".into(),
            status: "Unknown".into(),
            reason: Some("NodeStatusUnknown".into()),
            last_transition_time: Some(at("2026-11-22T07:00:00Z")),
            ..NodeCondition::default()
        };
        let merged = merge(
            &[network.clone(), unknown],
            current(&input, &healthy(), &full_capacity(), &t0),
            &t0,
        );
        let types: Vec<&str> = merged.iter().map(|c| c.type_.as_str()).collect();
        assert_eq!(
            types,
            [
                "NetworkUnavailable",
                "Ready",
                "MemoryPressure",
                "DiskPressure",
                "PIDPressure"
            ]
        );
        assert_eq!(merged[0], network);
        assert_eq!(merged[1].status, "True");
        assert_eq!(merged[1].last_transition_time.as_ref(), Some(&t0));
    }

    #[test]
    fn wire_time_drops_fractions() {
        let t: Timestamp = "2026-11-22T07:30:43.930335Z".parse().expect("ts");
        assert_eq!(wire_time(t), at("2026-11-22T07:30:43Z"));
    }
}
