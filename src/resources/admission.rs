//! Pod admission, as the kubelet's admit handlers decide it before a pod may run:
//! a pod for another OS (its `os.name` or its `kubernetes.io/os` node selector) never; under memory pressure no BestEffort pod (the eviction handler); only sysctls of
//! the safe set or `allowedUnsafeSysctls`, never a network one with hostNetwork; the
//! pod must fit in the node's allocatable beside the pods already admitted (pods
//! count, then cpu, then memory: OutOfpods, OutOfcpu, OutOfmemory, with the kubelet's
//! message); no privileged container unless `allowPrivileged`. A rejected pod ends
//! Failed, its status message `Pod was rejected: <message>`.
//!
//! Static pods are critical to the kubelet: it admits them by preempting other pods
//! when they do not fit. holdfast does not preempt; it admits a static pod that does
//! not fit (with a warning) rather than refuse the site's own workload. Pure.

use k8s_openapi::api::core::v1::Pod;

use super::qos::Qos;
use crate::pod::requests::{pod_resources, Amounts};
use crate::runtime::sysctl::{normalize_sysctl, sysctl_namespace};

/// The kubelet's safe sysctls (`SafeSysctlAllowlist`, 1.34).
pub const SAFE_SYSCTLS: &[&str] = &[
    "kernel.shm_rmid_forced",
    "net.ipv4.ip_local_port_range",
    "net.ipv4.tcp_syncookies",
    "net.ipv4.ping_group_range",
    "net.ipv4.ip_unprivileged_port_start",
    "net.ipv4.ip_local_reserved_ports",
    "net.ipv4.tcp_keepalive_time",
    "net.ipv4.tcp_fin_timeout",
    "net.ipv4.tcp_keepalive_intvl",
    "net.ipv4.tcp_keepalive_probes",
    "net.ipv4.tcp_rmem",
    "net.ipv4.tcp_wmem",
];

/// What admission measures pods against.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Policy {
    /// The node's allocatable cpu and memory; None when it could not be read (then
    /// nothing is refused for resources).
    pub allocatable: Option<Amounts>,
    /// `maxPods`.
    pub max_pods: u64,
    /// `holdfast.allowPrivileged`.
    pub allow_privileged: bool,
    /// `allowedUnsafeSysctls`: names, or prefixes ending in `*`.
    pub allowed_unsafe_sysctls: Vec<String>,
}

/// Why a pod may not run: the status reason and the message after `Pod was
/// rejected: `.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rejection {
    pub reason: String,
    pub message: String,
}

fn sysctl_allowed(name: &str, policy: &Policy) -> bool {
    SAFE_SYSCTLS.contains(&name)
        || policy
            .allowed_unsafe_sysctls
            .iter()
            .any(|p| match p.strip_suffix('*') {
                Some(prefix) => name.starts_with(prefix),
                None => p == name,
            })
}

/// The OS the pod is for, by its field and by its node selector, as the kubelet's
/// predicate admit handler checks them before anything else of its own.
fn os_matches(pod: &Pod) -> Result<(), Rejection> {
    let spec = pod.spec.as_ref();
    let reject = |reason: &str, message: &str| Rejection {
        reason: reason.to_owned(),
        message: message.to_owned(),
    };
    if spec
        .and_then(|s| s.os.as_ref())
        .is_some_and(|os| os.name != std::env::consts::OS)
    {
        return Err(reject(
            "PodOSNotSupported",
            "Failed to admit pod as the OS field doesn't match node OS",
        ));
    }
    let selected_os = spec
        .and_then(|s| s.node_selector.as_ref())
        .and_then(|m| m.get("kubernetes.io/os"));
    if selected_os.is_some_and(|os| os != std::env::consts::OS) {
        return Err(reject(
            "PodOSSelectorNodeLabelDoesNotMatch",
            "Failed to admit pod as the `kubernetes.io/os` label doesn't match node label",
        ));
    }
    Ok(())
}

/// Decides about `pod`, given the requests of the pods admitted before it that are
/// still active (not Succeeded or Failed) and whether the node is under memory
/// pressure.
pub fn admit(
    pod: &Pod,
    active: &[Amounts],
    policy: &Policy,
    memory_pressure: bool,
) -> Result<(), Rejection> {
    let spec = pod.spec.as_ref();
    let critical = crate::pod::is_static_pod(pod);
    let reject = |reason: &str, message: String| Rejection {
        reason: reason.to_owned(),
        message,
    };

    os_matches(pod)?;

    if memory_pressure && !critical && Qos::of(pod) == Qos::BestEffort {
        return Err(reject(
            "Evicted",
            "The node had condition: [MemoryPressure]. ".to_owned(),
        ));
    }

    let host_net = spec.and_then(|s| s.host_network).unwrap_or(false);
    let host_ipc = spec.and_then(|s| s.host_ipc).unwrap_or(false);
    let sysctls = spec
        .and_then(|s| s.security_context.as_ref())
        .and_then(|sc| sc.sysctls.as_ref());
    for s in sysctls.into_iter().flatten() {
        let name = normalize_sysctl(&s.name);
        if !sysctl_allowed(&name, policy) {
            return Err(reject(
                "SysctlForbidden",
                format!("forbidden sysctl: \"{name}\" not allowlisted"),
            ));
        }
        match sysctl_namespace(&name) {
            Some("net") if host_net => {
                return Err(reject(
                    "SysctlForbidden",
                    format!("forbidden sysctl: \"{name}\" not allowed with host net enabled"),
                ))
            }
            Some("ipc") if host_ipc => {
                return Err(reject(
                    "SysctlForbidden",
                    format!("forbidden sysctl: \"{name}\" not allowed with host ipc enabled"),
                ))
            }
            _ => {}
        }
    }

    let requested = pod_resources(pod).map(|r| r.requests).map_err(|e| {
        reject(
            "UnexpectedAdmissionError",
            format!("invalid resources: {e}"),
        )
    })?;
    if !critical {
        fits(requested, active, policy).map_err(|(resource, requested, used, capacity)| {
            reject(
                &format!("OutOf{resource}"),
                format!(
                    "Node didn't have enough resource: {resource}, requested: {requested}, used: {used}, capacity: {capacity}"
                ),
            )
        })?;
    } else if fits(requested, active, policy).is_err() {
        log::warn!(
            "static pod {} does not fit in the node's allocatable; admitted anyway (no preemption)",
            pod.metadata.name.as_deref().unwrap_or("")
        );
    }

    if !policy.allow_privileged && crate::runtime::security::wants_privileged(pod) {
        let init = spec
            .map(|s| {
                !s.containers.iter().any(|c| {
                    c.security_context
                        .as_ref()
                        .and_then(|sc| sc.privileged)
                        .unwrap_or(false)
                })
            })
            .unwrap_or(false);
        return Err(reject(
            "Forbidden",
            format!(
                "pod with UID \"{}\" specified privileged {}container, but is disallowed",
                pod.metadata.uid.as_deref().unwrap_or(""),
                if init { "init " } else { "" }
            ),
        ));
    }
    Ok(())
}

/// The scheduler's `fitsRequest` as the kubelet runs it: (resource, requested, used,
/// capacity) of the first resource that does not fit.
fn fits(
    requested: Amounts,
    active: &[Amounts],
    policy: &Policy,
) -> Result<(), (&'static str, u64, u64, u64)> {
    let used_pods = active.len() as u64;
    if used_pods + 1 > policy.max_pods {
        return Err(("pods", 1, used_pods, policy.max_pods));
    }
    let Some(alloc) = policy.allocatable else {
        return Ok(());
    };
    if requested.cpu_milli == 0 && requested.memory == 0 {
        return Ok(());
    }
    let used_cpu: u64 = active.iter().map(|a| a.cpu_milli).sum();
    let used_mem: u64 = active.iter().map(|a| a.memory).sum();
    if requested.cpu_milli > 0 && requested.cpu_milli > alloc.cpu_milli.saturating_sub(used_cpu) {
        return Err(("cpu", requested.cpu_milli, used_cpu, alloc.cpu_milli));
    }
    if requested.memory > 0 && requested.memory > alloc.memory.saturating_sub(used_mem) {
        return Err(("memory", requested.memory, used_mem, alloc.memory));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pod(spec: serde_json::Value) -> Pod {
        serde_json::from_value(
            json!({"metadata": {"name": "p", "namespace": "default", "uid": "u-9"}, "spec": spec}),
        )
        .expect("pod")
    }

    fn with_requests(cpu: &str, mem: &str) -> Pod {
        pod(
            json!({"containers": [{"name": "a", "resources": {"requests": {"cpu": cpu, "memory": mem}}}]}),
        )
    }

    fn policy() -> Policy {
        Policy {
            allocatable: Some(Amounts {
                cpu_milli: 2000,
                memory: 1 << 30,
            }),
            max_pods: 3,
            allow_privileged: false,
            allowed_unsafe_sysctls: vec!["net.core.*".into()],
        }
    }

    fn rejected(p: &Pod, active: &[Amounts]) -> Rejection {
        admit(p, active, &policy(), false).expect_err("rejected")
    }

    #[test]
    fn a_pod_for_another_os_is_refused() {
        let r = rejected(
            &pod(json!({"os": {"name": "windows"}, "containers": [{"name": "a"}]})),
            &[],
        );
        assert_eq!(r.reason, "PodOSNotSupported");
        assert_eq!(
            r.message,
            "Failed to admit pod as the OS field doesn't match node OS"
        );
        let r = rejected(
            &pod(
                json!({"nodeSelector": {"kubernetes.io/os": "windows"}, "containers": [{"name": "a"}]}),
            ),
            &[],
        );
        assert_eq!(r.reason, "PodOSSelectorNodeLabelDoesNotMatch");
        for fine in [
            json!({"os": {"name": "linux"}, "containers": [{"name": "a"}]}),
            json!({"nodeSelector": {"kubernetes.io/os": "linux"}, "containers": [{"name": "a"}]}),
        ] {
            assert_eq!(admit(&pod(fine), &[], &policy(), false), Ok(()));
        }
    }

    #[test]
    fn out_of_cpu_memory_and_pods_with_the_kubelets_words() {
        let used = [Amounts {
            cpu_milli: 1800,
            memory: 1 << 29,
        }];
        let r = rejected(&with_requests("500m", "1Mi"), &used);
        assert_eq!(r.reason, "OutOfcpu");
        assert_eq!(
            r.message,
            "Node didn't have enough resource: cpu, requested: 500, used: 1800, capacity: 2000"
        );
        let r = rejected(&with_requests("100m", "600Mi"), &used);
        assert_eq!(r.reason, "OutOfmemory");
        assert_eq!(
            r.message,
            format!(
                "Node didn't have enough resource: memory, requested: {}, used: {}, capacity: {}",
                600u64 << 20,
                1u64 << 29,
                1u64 << 30
            )
        );
        assert!(admit(&with_requests("200m", "1Mi"), &used, &policy(), false).is_ok());
        let three = [Amounts::default(); 3];
        let r = rejected(&pod(json!({"containers": [{"name": "a"}]})), &three);
        assert_eq!(r.reason, "OutOfpods");
        assert_eq!(
            r.message,
            "Node didn't have enough resource: pods, requested: 1, used: 3, capacity: 3"
        );
        // A BestEffort pod only counts as a pod.
        let two = [used[0], used[0]];
        assert!(admit(
            &pod(json!({"containers": [{"name": "a"}]})),
            &two,
            &policy(),
            false
        )
        .is_ok());
    }

    #[test]
    fn static_pods_are_admitted_even_when_they_do_not_fit() {
        let mut p = with_requests("4", "1Mi");
        p.metadata.annotations =
            Some([("kubernetes.io/config.source".into(), "file".into())].into());
        assert!(admit(&p, &[], &policy(), false).is_ok());
        assert!(admit(&p, &[], &policy(), true).is_ok());
    }

    #[test]
    fn sysctls() {
        let with = |name: &str, host_net: bool| {
            pod(
                json!({"hostNetwork": host_net, "securityContext": {"sysctls": [{"name": name, "value": "1"}]},
                       "containers": [{"name": "a"}]}),
            )
        };
        assert!(admit(
            &with("net.ipv4.tcp_syncookies", false),
            &[],
            &policy(),
            false
        )
        .is_ok());
        assert!(admit(
            &with("kernel/shm_rmid_forced", false),
            &[],
            &policy(),
            false
        )
        .is_ok());
        assert!(admit(&with("net.core.somaxconn", false), &[], &policy(), false).is_ok());
        let r = rejected(&with("kernel.msgmax", false), &[]);
        assert_eq!(r.reason, "SysctlForbidden");
        assert_eq!(
            r.message,
            "forbidden sysctl: \"kernel.msgmax\" not allowlisted"
        );
        let r = rejected(&with("net.ipv4.tcp_syncookies", true), &[]);
        assert_eq!(
            r.message,
            "forbidden sysctl: \"net.ipv4.tcp_syncookies\" not allowed with host net enabled"
        );
    }

    #[test]
    fn privileged_needs_the_config() {
        let p =
            pod(json!({"containers": [{"name": "a", "securityContext": {"privileged": true}}]}));
        let r = rejected(&p, &[]);
        assert_eq!(r.reason, "Forbidden");
        assert_eq!(
            r.message,
            "pod with UID \"u-9\" specified privileged container, but is disallowed"
        );
        let allowed = Policy {
            allow_privileged: true,
            ..policy()
        };
        assert!(admit(&p, &[], &allowed, false).is_ok());
        let init = pod(json!({"containers": [{"name": "a"}],
                              "initContainers": [{"name": "i", "securityContext": {"privileged": true}}]}));
        assert!(rejected(&init, &[])
            .message
            .contains("privileged init container"));
    }

    #[test]
    fn best_effort_pods_wait_out_memory_pressure() {
        let be = pod(json!({"containers": [{"name": "a"}]}));
        let r = admit(&be, &[], &policy(), true).expect_err("rejected");
        assert_eq!(r.reason, "Evicted");
        assert_eq!(r.message, "The node had condition: [MemoryPressure]. ");
        assert!(admit(&with_requests("100m", "1Mi"), &[], &policy(), true).is_ok());
    }
}
