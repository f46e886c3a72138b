//! node::allocatable: capacity and allocatable, as the kubelet computes them: allocatable is capacity less
//! systemReserved, kubeReserved and the hard eviction threshold for memory.available
//! (memory) and nodefs.available (ephemeral storage), never below zero. Quantities are
//! written in the apiserver's canonical form (`8048572Ki`, `3800m`, `56453061334`), so
//! a status read back from the server compares equal to the one sent.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::NodeStatus;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

use super::{NodeFacts, NodeInput};
use crate::quantity::{binary_si, decimal_si, parse_bytes, parse_millicpu};

pub const CPU: &str = "cpu";
pub const MEMORY: &str = "memory";
pub const PODS: &str = "pods";
pub const EPHEMERAL_STORAGE: &str = "ephemeral-storage";

/// The kubelet's `evictionHard` when the config sets none (Linux defaults).
pub const DEFAULT_EVICTION_HARD: &[(&str, &str)] = &[
    ("memory.available", "100Mi"),
    ("nodefs.available", "10%"),
    ("nodefs.inodesFree", "5%"),
    ("imagefs.available", "15%"),
];

/// An amount kept back: CPU in millicores, memory and storage in bytes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Resources {
    pub cpu_millis: u64,
    pub memory: u64,
    pub ephemeral_storage: u64,
}

impl Resources {
    /// From a `systemReserved` / `kubeReserved` map. `pid` is accepted and ignored:
    /// it limits processes, and processes are no capacity the node reports.
    pub fn from_map(map: &BTreeMap<String, String>) -> Result<Resources, (String, String)> {
        let mut out = Resources::default();
        for (name, q) in map {
            let err = |reason: String| (name.clone(), reason);
            match name.as_str() {
                CPU => out.cpu_millis = parse_millicpu(q).map_err(err)?,
                MEMORY => out.memory = parse_bytes(q).map_err(err)?,
                EPHEMERAL_STORAGE => out.ephemeral_storage = parse_bytes(q).map_err(err)?,
                "pid" => {}
                other => return Err(err(format!("unknown resource {other:?}"))),
            }
        }
        Ok(out)
    }
}

/// A hard eviction threshold: an absolute amount, or a fraction of capacity.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Threshold {
    Quantity(u64),
    /// Held as the kubelet holds it (a float32 of percent / 100), so the amounts it
    /// leads to match the kubelet's to the byte.
    Fraction(f32),
}

impl Threshold {
    /// `100Mi` or `10%`; `None` for `0%` and `100%`, which the kubelet reads as "no
    /// threshold".
    pub fn parse(text: &str) -> Result<Option<Threshold>, String> {
        let text = text.trim();
        if let Some(p) = text.strip_suffix('%') {
            if text == "0%" || text == "100%" {
                return Ok(None);
            }
            let percent: f32 = p
                .parse()
                .map_err(|_| format!("expected a percentage like 10%, got {text:?}"))?;
            if !(0.0..=100.0).contains(&percent) {
                return Err(format!("percentage out of range: {text:?}"));
            }
            return Ok(Some(Threshold::Fraction(percent / 100.0)));
        }
        match parse_bytes(text)? {
            0 => Err(format!("must be greater than zero, got {text:?}")),
            n => Ok(Some(Threshold::Quantity(n))),
        }
    }

    /// The threshold in the signal's units, for a resource with `capacity` of them.
    pub fn amount(self, capacity: u64) -> u64 {
        match self {
            Threshold::Quantity(n) => n,
            // As the kubelet: int64(float64(capacity) * float64(percentage)).
            Threshold::Fraction(f) => (capacity as f64 * f64::from(f)) as u64,
        }
    }
}

/// Capacity and allocatable for this node. Entries of `previous` that holdfast does
/// not own (extended resources someone else advertises) are kept, as the kubelet keeps
/// them; a resource whose size could not be read is left out, which keeps the node
/// NotReady.
pub fn capacity_and_allocatable(
    input: &NodeInput,
    facts: &NodeFacts,
    previous: Option<&NodeStatus>,
) -> (BTreeMap<String, Quantity>, BTreeMap<String, Quantity>) {
    let mut capacity = previous
        .and_then(|p| p.capacity.clone())
        .unwrap_or_default();
    let mut allocatable = BTreeMap::new();
    let reserved = input.reserved();
    let eviction =
        |signal: &str, cap: u64| input.eviction_hard.get(signal).map_or(0, |t| t.amount(cap));

    let cpu = u64::from(facts.cpus).saturating_mul(1000);
    let mut own: Vec<(&str, Option<(String, String)>)> = vec![(
        CPU,
        Some((
            decimal_si(cpu, -3),
            decimal_si(cpu.saturating_sub(reserved.cpu_millis), -3),
        )),
    )];
    own.push((
        MEMORY,
        facts.memory_total.map(|m| {
            let keep = reserved
                .memory
                .saturating_add(eviction("memory.available", m));
            (binary_si(m), binary_si(m.saturating_sub(keep)))
        }),
    ));
    let pods = decimal_si(u64::from(input.max_pods), 0);
    own.push((PODS, Some((pods.clone(), pods))));
    own.push((
        EPHEMERAL_STORAGE,
        facts.storage.map(|fs| {
            let keep = reserved
                .ephemeral_storage
                .saturating_add(eviction("nodefs.available", fs.capacity));
            (
                binary_si(fs.capacity),
                binary_si(fs.capacity.saturating_sub(keep)),
            )
        }),
    ));
    for (name, values) in own {
        match values {
            Some((cap, alloc)) => {
                capacity.insert(name.to_string(), Quantity(cap));
                allocatable.insert(name.to_string(), Quantity(alloc));
            }
            None => {
                capacity.remove(name);
            }
        }
    }
    for (name, q) in &capacity {
        allocatable.entry(name.clone()).or_insert_with(|| q.clone());
    }
    (capacity, allocatable)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::node::facts::FsStats;

    #[test]
    fn thresholds() {
        assert_eq!(
            Threshold::parse("100Mi"),
            Ok(Some(Threshold::Quantity(100 << 20)))
        );
        assert_eq!(Threshold::parse("0%"), Ok(None));
        assert_eq!(Threshold::parse("100%"), Ok(None));
        assert!(Threshold::parse("0").is_err());
        assert!(Threshold::parse("101%").is_err());
        assert!(Threshold::parse("x%").is_err());
        // The kubelet's float32 arithmetic: 10% of 61255492Ki is 6272562474, not
        // 6272562380.8 rounded (the apiserver fixture's allocatable proves it).
        let ten = Threshold::parse("10%").ok().flatten().expect("threshold");
        assert_eq!(ten.amount(61_255_492 * 1024), 6_272_562_474);
        assert_eq!(Threshold::Quantity(5).amount(1), 5);
    }

    #[test]
    fn reserved_maps() {
        let map: BTreeMap<String, String> = [("cpu", "250m"), ("memory", "1Gi"), ("pid", "100")]
            .into_iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        let r = Resources::from_map(&map).expect("parse");
        assert_eq!(
            (r.cpu_millis, r.memory, r.ephemeral_storage),
            (250, 1 << 30, 0)
        );
        let bad: BTreeMap<String, String> = [("memory".to_string(), "lots".to_string())].into();
        assert_eq!(
            Resources::from_map(&bad).map_err(|e| e.0),
            Err("memory".into())
        );
    }

    fn facts() -> NodeFacts {
        NodeFacts {
            cpus: 4,
            memory_total: Some(8_048_572 * 1024),
            storage: Some(FsStats {
                capacity: 61_255_492 * 1024,
                available: 1 << 30,
                free: 1 << 30,
                inodes: 1000,
                inodes_free: 500,
            }),
            ..NodeFacts::default()
        }
    }

    fn q(s: &str) -> Quantity {
        Quantity(s.into())
    }

    #[test]
    fn allocatable_arithmetic() {
        let mut input = NodeInput::for_tests("gw");
        input.system_reserved = Resources {
            cpu_millis: 100,
            memory: 100 << 20,
            ephemeral_storage: 0,
        };
        input.kube_reserved = Resources {
            cpu_millis: 100,
            memory: 100 << 20,
            ephemeral_storage: 1 << 30,
        };
        let (cap, alloc) = capacity_and_allocatable(&input, &facts(), None);
        assert_eq!(cap[CPU], q("4"));
        assert_eq!(alloc[CPU], q("3800m"));
        assert_eq!(cap[MEMORY], q("8048572Ki"));
        // 200Mi reserved and the default 100Mi memory.available threshold.
        assert_eq!(alloc[MEMORY], q("7741372Ki"));
        assert_eq!(cap[PODS], q("110"));
        assert_eq!(alloc[PODS], q("110"));
        assert_eq!(cap[EPHEMERAL_STORAGE], q("61255492Ki"));
        // 1Gi reserved and the default nodefs.available of 10%.
        assert_eq!(
            parse_bytes(&alloc[EPHEMERAL_STORAGE].0),
            Ok(56_453_061_334 - (1 << 30))
        );

        // Reservations larger than the machine leave zero, not a wrapped number.
        input.system_reserved.cpu_millis = 9000;
        input.system_reserved.memory = 64 << 30;
        let (_, alloc) = capacity_and_allocatable(&input, &facts(), None);
        assert_eq!(
            (alloc[CPU].clone(), alloc[MEMORY].clone()),
            (q("0"), q("0"))
        );

        // No eviction thresholds at all (all turned off with 0%).
        input.system_reserved = Resources::default();
        input.kube_reserved = Resources::default();
        input.eviction_hard.clear();
        let (cap, alloc) = capacity_and_allocatable(&input, &facts(), None);
        assert_eq!(cap, alloc);
    }

    #[test]
    fn unknown_sizes_and_foreign_resources() {
        let input = NodeInput::for_tests("gw");
        let previous = NodeStatus {
            capacity: Some(BTreeMap::from([
                ("example.com/dongle".to_string(), q("2")),
                (MEMORY.to_string(), q("1Gi")),
            ])),
            ..NodeStatus::default()
        };
        let f = NodeFacts {
            memory_total: None,
            storage: None,
            ..facts()
        };
        let (cap, alloc) = capacity_and_allocatable(&input, &f, Some(&previous));
        assert_eq!(cap["example.com/dongle"], q("2"));
        assert_eq!(alloc["example.com/dongle"], q("2"));
        // A stale size is dropped rather than reported as current.
        assert!(!cap.contains_key(MEMORY) && !alloc.contains_key(MEMORY));
        assert!(!cap.contains_key(EPHEMERAL_STORAGE));
        assert!(cap.contains_key(CPU) && cap.contains_key(PODS));
    }
}
