//! A pod's QoS class (Guaranteed, Burstable, BestEffort) from its containers' requests
//! and limits, as the kubelet decides it: the pod's status reports it, its cgroups and
//! admission follow it. Pure functions of the spec; touches nothing.

use k8s_openapi::api::core::v1::{Container, Pod};

/// Guaranteed, Burstable or BestEffort.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Qos {
    Guaranteed,
    Burstable,
    BestEffort,
}

impl Qos {
    pub fn of(pod: &Pod) -> Qos {
        let containers: Vec<_> = pod
            .spec
            .iter()
            .flat_map(|s| {
                s.containers
                    .iter()
                    .chain(s.init_containers.iter().flatten())
            })
            .cloned()
            .collect();
        match qos_class(&containers) {
            "Guaranteed" => Qos::Guaranteed,
            "Burstable" => Qos::Burstable,
            _ => Qos::BestEffort,
        }
    }
}

/// Guaranteed, Burstable or BestEffort, from requests and limits (cpu and memory).
pub fn qos_class(containers: &[Container]) -> &'static str {
    let mut any = false;
    let mut guaranteed = true;
    for c in containers {
        let r = c.resources.as_ref();
        let requests = r.and_then(|r| r.requests.as_ref());
        let limits = r.and_then(|r| r.limits.as_ref());
        for res in ["cpu", "memory"] {
            let req = requests
                .and_then(|m| m.get(res))
                .or_else(|| limits.and_then(|m| m.get(res)));
            let lim = limits.and_then(|m| m.get(res));
            if req.is_some() || lim.is_some() {
                any = true;
            }
            match (req, lim) {
                (Some(a), Some(b)) if a.0 == b.0 => {}
                _ => guaranteed = false,
            }
        }
    }
    if !any {
        "BestEffort"
    } else if guaranteed {
        "Guaranteed"
    } else {
        "Burstable"
    }
}
