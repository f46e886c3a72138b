//! Which pod goes first, and what it is told, as the kubelet's eviction manager
//! decides (`rankMemoryPressure`, `rankDiskPressureFunc`, `evictionMessage`): pods whose
//! usage exceeds their requests first, then lower priority, then the larger usage
//! over requests. A BestEffort pod requests nothing, so any use exceeds it: it goes
//! before a Burstable pod within its requests. Critical pods (static pods, and
//! system-critical priority) are never evicted. Pure.

use std::cmp::Ordering;

use k8s_openapi::api::core::v1::Pod;

use super::signals::{Met, Resource};
use crate::quantity::binary_si;

/// `scheduling.SystemCriticalPriority`.
const SYSTEM_CRITICAL: i32 = 2_000_000_000;

/// One pod that may be evicted, with what it uses.
#[derive(Debug, Clone)]
pub struct Candidate {
    pub uid: String,
    pub pod: Pod,
    /// The pod's usage of the resource under pressure (bytes), if it could be read.
    pub usage: Option<u64>,
    /// Its request of that resource (bytes).
    pub request: u64,
    /// Each container's usage, by name, for the message.
    pub containers: Vec<(String, u64)>,
}

/// The kubelet's `IsCriticalPod`.
pub fn is_critical(pod: &Pod) -> bool {
    if crate::pod::is_static_pod(pod) {
        return true;
    }
    let mirror = pod
        .metadata
        .annotations
        .as_ref()
        .is_some_and(|a| a.contains_key("kubernetes.io/config.mirror"));
    mirror
        || pod
            .spec
            .as_ref()
            .and_then(|s| s.priority)
            .is_some_and(|p| p >= SYSTEM_CRITICAL)
}

fn priority(c: &Candidate) -> i32 {
    c.pod.spec.as_ref().and_then(|s| s.priority).unwrap_or(0)
}

fn exceeds(c: &Candidate) -> bool {
    c.usage.is_some_and(|u| u > c.request)
}

fn over(c: &Candidate) -> i128 {
    i128::from(c.usage.unwrap_or(0)) - i128::from(c.request)
}

/// The order in which `candidates` are evicted; critical pods are left out.
pub fn rank(mut candidates: Vec<Candidate>) -> Vec<Candidate> {
    candidates.retain(|c| !is_critical(&c.pod));
    candidates.sort_by(|a, b| {
        // A pod without stats goes first, as with the kubelet.
        let no_stats = b.usage.is_none().cmp(&a.usage.is_none());
        no_stats
            .then_with(|| exceeds(b).cmp(&exceeds(a)))
            .then_with(|| priority(a).cmp(&priority(b)))
            .then_with(|| over(b).cmp(&over(a)))
            .then(Ordering::Equal)
    });
    candidates
}

/// The kubelet's eviction message for `victim` under threshold `met`; `requests`
/// gives each container's request of the resource as written in its spec.
pub fn message(met: &Met, victim: &Candidate) -> String {
    let resource = met.resource.name();
    let mut out = format!("The node was low on resource: {resource}. ");
    let quantity = match met.resource {
        Resource::Inodes => met.threshold.to_string(),
        _ => met
            .quantity
            .clone()
            .unwrap_or_else(|| binary_si(met.threshold)),
    };
    let available = match met.resource {
        Resource::Inodes => met.observed.available.to_string(),
        _ => binary_si(met.observed.available),
    };
    out.push_str(&format!(
        "Threshold quantity: {quantity}, available: {available}. "
    ));
    let spec_containers = victim.pod.spec.iter().flat_map(|s| s.containers.iter());
    for c in spec_containers {
        let Some((_, used)) = victim.containers.iter().find(|(n, _)| *n == c.name) else {
            continue;
        };
        let request_text = c
            .resources
            .as_ref()
            .and_then(|r| r.requests.as_ref())
            .and_then(|r| r.get(resource))
            .map(|q| q.0.clone())
            .unwrap_or_else(|| "0".to_owned());
        let request = crate::quantity::parse_bytes(&request_text).unwrap_or(0);
        if *used > request {
            out.push_str(&format!(
                "Container {} was using {}, request is {request_text}, has larger consumption of {resource}. ",
                c.name,
                binary_si(*used)
            ));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::eviction::signals::Observed;

    fn cand(name: &str, request: u64, usage: Option<u64>, priority: Option<i32>) -> Candidate {
        let pod: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": name, "uid": name},
            "spec": {"priority": priority, "containers": [{"name": "main",
                "resources": if request > 0 { serde_json::json!({"requests": {"memory": format!("{}Mi", request >> 20)}}) } else { serde_json::json!({}) }}]}
        }))
        .expect("pod");
        Candidate {
            uid: name.into(),
            pod,
            usage,
            request,
            containers: usage
                .map(|u| vec![("main".to_string(), u)])
                .unwrap_or_default(),
        }
    }

    fn names(c: &[Candidate]) -> Vec<&str> {
        c.iter().map(|c| c.uid.as_str()).collect()
    }

    #[test]
    fn best_effort_then_burstable_over_requests_by_usage() {
        let mi = 1 << 20;
        let ranked = rank(vec![
            cand("burstable-within", 64 * mi, Some(40 * mi), None),
            cand("besteffort-small", 0, Some(10 * mi), None),
            cand("burstable-over", 16 * mi, Some(60 * mi), None),
            cand("besteffort-big", 0, Some(30 * mi), None),
        ]);
        assert_eq!(
            names(&ranked),
            [
                "burstable-over",
                "besteffort-big",
                "besteffort-small",
                "burstable-within"
            ]
        );
        // Priority comes before usage among those over their requests.
        let ranked = rank(vec![
            cand("low", 0, Some(mi), Some(-5)),
            cand("high", 0, Some(100 * mi), Some(1000)),
        ]);
        assert_eq!(names(&ranked), ["low", "high"]);
        let mut critical = cand("static", 0, Some(500 * mi), None);
        critical.pod.metadata.annotations =
            Some([("kubernetes.io/config.source".into(), "file".into())].into());
        let ranked = rank(vec![
            critical,
            cand("sys", 0, Some(mi), Some(SYSTEM_CRITICAL)),
        ]);
        assert!(ranked.is_empty());
    }

    #[test]
    fn the_kubelets_message() {
        let met = Met {
            signal: "memory.available".into(),
            resource: Resource::Memory,
            threshold: 100 << 20,
            quantity: Some("100Mi".into()),
            observed: Observed {
                available: 93_256 * 1024,
                capacity: 200 << 20,
            },
        };
        let victim = cand("hog", 0, Some(40_872 * 1024), None);
        assert_eq!(
            message(&met, &victim),
            "The node was low on resource: memory. Threshold quantity: 100Mi, available: 93256Ki. \
             Container main was using 40872Ki, request is 0, has larger consumption of memory. "
        );
        let within = cand("ok", 64 << 20, Some(10 << 20), None);
        assert_eq!(
            message(&met, &within),
            "The node was low on resource: memory. Threshold quantity: 100Mi, available: 93256Ki. "
        );
    }
}
