//! pod::requests: what a pod asks for, as the kubelet adds it up (`PodRequests`,
//! `PodLimits`): regular containers summed, raised to the largest init container, plus
//! `spec.overhead`; a request left unset takes the limit, as the API's defaulting does
//! (a static pod never went through it). Its ephemeral storage limit is summed the same
//! way and kept in the form the API writes it back in. Pure.

use k8s_openapi::api::core::v1::{Container, Pod};

use crate::quantity::{binary_si, decimal_si, parse_bytes, parse_millicpu};

/// CPU in millicores, memory in bytes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Amounts {
    pub cpu_milli: u64,
    pub memory: u64,
}

/// A pod's requests and limits.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PodResources {
    pub requests: Amounts,
    /// None when some container sets no CPU limit (the pod is then unbounded).
    pub cpu_limit_milli: Option<u64>,
    /// None when some container sets no memory limit.
    pub memory_limit: Option<u64>,
}

fn get(c: &Container, which: &str, name: &str) -> Option<String> {
    let r = c.resources.as_ref()?;
    let m = if which == "limits" {
        r.limits.as_ref()
    } else {
        r.requests.as_ref()
    }?;
    m.get(name).map(|q| q.0.clone())
}

/// One container's request of `name`, defaulted to its limit.
fn request(c: &Container, name: &str) -> Result<u64, String> {
    let q = get(c, "requests", name).or_else(|| get(c, "limits", name));
    amount(q.as_deref(), name)
}

fn amount(q: Option<&str>, name: &str) -> Result<u64, String> {
    match q {
        None => Ok(0),
        Some(q) if name == "cpu" => parse_millicpu(q).map_err(|e| format!("cpu {q:?}: {e}")),
        Some(q) => parse_bytes(q).map_err(|e| format!("{name} {q:?}: {e}")),
    }
}

/// Adds up `pod`'s requests and limits. A quantity that does not parse is an error
/// (the API would have refused it).
pub fn pod_resources(pod: &Pod) -> Result<PodResources, String> {
    let Some(spec) = &pod.spec else {
        return Ok(PodResources::default());
    };
    let is_sidecar = |c: &Container| c.restart_policy.as_deref() == Some("Always");
    let mut req = Amounts::default();
    let mut cpu_limit = Some(0u64);
    let mut mem_limit = Some(0u64);
    let sidecars = spec
        .init_containers
        .iter()
        .flatten()
        .filter(|c| is_sidecar(c));
    for c in spec.containers.iter().chain(sidecars) {
        req.cpu_milli = req.cpu_milli.saturating_add(request(c, "cpu")?);
        req.memory = req.memory.saturating_add(request(c, "memory")?);
        cpu_limit = match (cpu_limit, get(c, "limits", "cpu")) {
            (Some(sum), Some(q)) => Some(sum.saturating_add(amount(Some(&q), "cpu")?)),
            _ => None,
        };
        mem_limit = match (mem_limit, get(c, "limits", "memory")) {
            (Some(sum), Some(q)) => Some(sum.saturating_add(amount(Some(&q), "memory")?)),
            _ => None,
        };
    }
    // Init containers run one at a time, beside the sidecars started before them.
    let mut side = Amounts::default();
    for c in spec.init_containers.iter().flatten() {
        let (cpu, mem) = (request(c, "cpu")?, request(c, "memory")?);
        if is_sidecar(c) {
            side.cpu_milli = side.cpu_milli.saturating_add(cpu);
            side.memory = side.memory.saturating_add(mem);
            continue;
        }
        req.cpu_milli = req.cpu_milli.max(cpu.saturating_add(side.cpu_milli));
        req.memory = req.memory.max(mem.saturating_add(side.memory));
    }
    if let Some(overhead) = &spec.overhead {
        if req.cpu_milli > 0 || req.memory > 0 {
            let cpu = amount(overhead.get("cpu").map(|q| q.0.as_str()), "cpu")?;
            let memory = amount(overhead.get("memory").map(|q| q.0.as_str()), "memory")?;
            req.cpu_milli = req.cpu_milli.saturating_add(cpu);
            req.memory = req.memory.saturating_add(memory);
        }
    }
    if spec.containers.is_empty() {
        cpu_limit = None;
        mem_limit = None;
    }
    Ok(PodResources {
        requests: req,
        cpu_limit_milli: cpu_limit,
        memory_limit: mem_limit,
    })
}

const EPHEMERAL_STORAGE: &str = "ephemeral-storage";

/// A quantity in bytes, with the form the API writes it back in (`Quantity.String()`):
/// binary when it was written with a binary suffix.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StorageAmount {
    pub bytes: u64,
    binary: bool,
}

impl StorageAmount {
    pub fn parse(text: &str) -> Option<StorageAmount> {
        let bytes = parse_bytes(text).ok()?;
        let binary = text.trim_end().ends_with('i');
        Some(StorageAmount { bytes, binary })
    }

    pub fn text(self) -> String {
        if self.binary {
            binary_si(self.bytes)
        } else {
            decimal_si(self.bytes, 0)
        }
    }

    /// The sum keeps the form of the first, as the API's `Quantity.Add` does.
    fn add(self, other: StorageAmount) -> StorageAmount {
        StorageAmount {
            bytes: self.bytes.saturating_add(other.bytes),
            binary: self.binary,
        }
    }
}

/// A container's own `limits.ephemeral-storage`.
pub fn container_storage_limit(c: &Container) -> Option<StorageAmount> {
    let q = c
        .resources
        .as_ref()?
        .limits
        .as_ref()?
        .get(EPHEMERAL_STORAGE)?;
    StorageAmount::parse(&q.0)
}

fn sum(a: Option<StorageAmount>, b: Option<StorageAmount>) -> Option<StorageAmount> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.add(b)),
        (a, b) => a.or(b),
    }
}

fn max(a: Option<StorageAmount>, b: Option<StorageAmount>) -> Option<StorageAmount> {
    match (a, b) {
        (Some(a), Some(b)) => Some(if b.bytes > a.bytes { b } else { a }),
        (a, b) => a.or(b),
    }
}

/// The pod's limit of ephemeral storage, as the kubelet's `PodLimits` sums it: its
/// containers' and sidecars' limits, or an init container's (with the sidecars started
/// before it) when that is more, plus the pod's overhead; None when no container sets one.
pub fn pod_storage_limit(pod: &Pod) -> Option<StorageAmount> {
    let spec = pod.spec.as_ref()?;
    let mut total = spec
        .containers
        .iter()
        .map(container_storage_limit)
        .fold(None, sum);
    let (mut sidecars, mut init) = (None, None);
    for c in spec.init_containers.iter().flatten() {
        let own = container_storage_limit(c);
        if c.restart_policy.as_deref() == Some("Always") {
            total = sum(total, own);
            sidecars = sum(sidecars, own);
            init = max(init, sidecars);
        } else {
            init = max(init, sum(own, sidecars));
        }
    }
    let total = max(total, init)?;
    let overhead = spec
        .overhead
        .as_ref()
        .and_then(|o| o.get(EPHEMERAL_STORAGE))
        .and_then(|q| StorageAmount::parse(&q.0));
    Some(sum(Some(total), overhead).unwrap_or(total))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(v: serde_json::Value) -> Pod {
        serde_json::from_value(serde_json::json!({"metadata": {"name": "p"}, "spec": v}))
            .expect("pod")
    }

    #[test]
    fn sums_limits_and_init_containers() {
        let p = pod(serde_json::json!({
            "containers": [
                {"name": "a", "resources": {"requests": {"cpu": "100m", "memory": "64Mi"},
                                            "limits": {"cpu": "200m", "memory": "128Mi"}}},
                {"name": "b", "resources": {"limits": {"cpu": "1", "memory": "32Mi"}}}
            ],
            "initContainers": [
                {"name": "big", "resources": {"requests": {"cpu": "2", "memory": "1Mi"}}}
            ]
        }));
        let r = pod_resources(&p).expect("resources");
        assert_eq!(r.requests.cpu_milli, 2000);
        assert_eq!(r.requests.memory, 96 * 1024 * 1024);
        assert_eq!(r.cpu_limit_milli, Some(1200));
        assert_eq!(r.memory_limit, Some(160 * 1024 * 1024));
    }

    #[test]
    fn one_unbounded_container_unbounds_the_pod() {
        let p = pod(serde_json::json!({"containers": [
            {"name": "a", "resources": {"limits": {"memory": "64Mi"}}},
            {"name": "b"}
        ]}));
        let r = pod_resources(&p).expect("resources");
        assert_eq!(r.memory_limit, None);
        assert_eq!(r.cpu_limit_milli, None);
        assert_eq!(r.requests.memory, 64 * 1024 * 1024);
        assert!(pod_resources(&pod(serde_json::json!({"containers": [
            {"name": "a", "resources": {"limits": {"memory": "lots"}}}
        ]})))
        .is_err());
    }

    #[test]
    fn the_largest_quantities_saturate() {
        let huge = serde_json::json!({"requests": {"cpu": "18P", "memory": "15Ei"}});
        let p = pod(serde_json::json!({
            "containers": [{"name": "a", "resources": huge}],
            "initContainers": [
                {"name": "side", "restartPolicy": "Always", "resources": huge},
                {"name": "init", "resources": huge},
            ],
            "overhead": {"cpu": "18P", "memory": "15Ei"},
        }));
        let r = pod_resources(&p).expect("resources");
        assert_eq!(r.requests.cpu_milli, u64::MAX);
        assert_eq!(r.requests.memory, u64::MAX);
    }
}
