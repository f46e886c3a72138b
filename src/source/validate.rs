//! Pod validation: the subset of the apiserver's checks that matters for what holdfast
//! runs. Manifests are untrusted input, so each problem is reported with its field path
//! and the pod is refused, never half-run.

use std::collections::HashSet;

use k8s_openapi::api::core::v1::{Container, LifecycleHandler, Pod, Probe};

use crate::config::{check_dns1123_label, check_dns1123_subdomain};
use crate::quantity;

const RESTART_POLICIES: [&str; 3] = ["Always", "OnFailure", "Never"];
const PROTOCOLS: [&str; 3] = ["TCP", "UDP", "SCTP"];

/// Every problem found, each as `field.path: what is wrong`; empty when the pod is valid.
pub fn validate_pod(pod: &Pod) -> Vec<String> {
    let mut problems = Vec::new();
    let meta = &pod.metadata;
    match meta.name.as_deref() {
        None | Some("") => problems.push("metadata.name: required".to_string()),
        Some(name) => {
            if let Err(e) = check_dns1123_subdomain(name) {
                problems.push(format!("metadata.name: {e}"));
            }
        }
    }
    if let Some(ns) = meta.namespace.as_deref() {
        if let Err(e) = check_dns1123_label(ns) {
            problems.push(format!("metadata.namespace: {e}"));
        }
    }
    let Some(spec) = &pod.spec else {
        problems.push("spec: required".to_string());
        return problems;
    };
    if spec.containers.is_empty() {
        problems.push("spec.containers: at least one container is required".to_string());
    }
    let mut names = HashSet::new();
    let init = spec.init_containers.as_deref().unwrap_or_default();
    for (i, c) in init.iter().enumerate() {
        check_container(
            &format!("spec.initContainers[{i}]"),
            c,
            &mut names,
            &mut problems,
        );
    }
    for (i, c) in spec.containers.iter().enumerate() {
        check_container(
            &format!("spec.containers[{i}]"),
            c,
            &mut names,
            &mut problems,
        );
    }
    if let Some(policy) = spec.restart_policy.as_deref() {
        if !RESTART_POLICIES.contains(&policy) {
            problems.push(format!(
                "spec.restartPolicy: unsupported value {policy:?}: must be one of Always, OnFailure, Never"
            ));
        }
    }
    if let Some(grace) = spec.termination_grace_period_seconds {
        non_negative("spec.terminationGracePeriodSeconds", grace, &mut problems);
    }
    if let Some(deadline) = spec.active_deadline_seconds {
        if !(1..=i64::from(i32::MAX)).contains(&deadline) {
            problems.push(format!(
                "spec.activeDeadlineSeconds: must be between 1 and {}, inclusive, got {deadline}",
                i32::MAX
            ));
        }
    }
    problems
}

/// The apiserver's `ValidateNonnegativeField`. Values too large to mean anything are
/// legal; whatever does arithmetic with them saturates.
fn non_negative(path: &str, value: i64, problems: &mut Vec<String>) {
    if value < 0 {
        problems.push(format!(
            "{path}: must be greater than or equal to 0, got {value}"
        ));
    }
}

fn check_container<'a>(
    path: &str,
    c: &'a Container,
    names: &mut HashSet<&'a str>,
    problems: &mut Vec<String>,
) {
    if c.name.is_empty() {
        problems.push(format!("{path}.name: required"));
    } else if let Err(e) = check_dns1123_label(&c.name) {
        problems.push(format!("{path}.name: {e}"));
    } else if !names.insert(c.name.as_str()) {
        problems.push(format!(
            "{path}.name: duplicate container name {:?}",
            c.name
        ));
    }
    if c.image.as_deref().is_none_or(|i| i.trim().is_empty()) {
        problems.push(format!("{path}.image: required"));
    }
    for (kind, probe) in [
        ("livenessProbe", &c.liveness_probe),
        ("readinessProbe", &c.readiness_probe),
        ("startupProbe", &c.startup_probe),
    ] {
        if let Some(p) = probe {
            check_probe(&format!("{path}.{kind}"), p, problems);
        }
    }
    let hooks = c.lifecycle.as_ref();
    for (kind, hook) in [
        ("postStart", hooks.and_then(|l| l.post_start.as_ref())),
        ("preStop", hooks.and_then(|l| l.pre_stop.as_ref())),
    ] {
        if let Some(h) = hook {
            check_hook(&format!("{path}.lifecycle.{kind}"), h, problems);
        }
    }
    let resources = c.resources.as_ref();
    for (kind, amounts) in [
        ("limits", resources.and_then(|r| r.limits.as_ref())),
        ("requests", resources.and_then(|r| r.requests.as_ref())),
    ] {
        for (name, q) in amounts.into_iter().flatten() {
            let parsed = if name == "cpu" {
                quantity::parse_millicpu(&q.0)
            } else {
                quantity::parse_bytes(&q.0)
            };
            if let Err(e) = parsed {
                problems.push(format!("{path}.resources.{kind}[{name}]: {e}"));
            }
        }
    }
    for (j, port) in c.ports.iter().flatten().enumerate() {
        if !(1..=65535).contains(&port.container_port) {
            problems.push(format!(
                "{path}.ports[{j}].containerPort: must be between 1 and 65535, got {}",
                port.container_port
            ));
        }
        if let Some(proto) = port.protocol.as_deref() {
            if !PROTOCOLS.contains(&proto) {
                problems.push(format!(
                    "{path}.ports[{j}].protocol: unsupported value {proto:?}: must be one of TCP, UDP, SCTP"
                ));
            }
        }
    }
}

/// A probe's numbers, as the apiserver's `validateProbe` checks them.
fn check_probe(path: &str, p: &Probe, problems: &mut Vec<String>) {
    for (field, value) in [
        ("initialDelaySeconds", p.initial_delay_seconds),
        ("timeoutSeconds", p.timeout_seconds),
        ("periodSeconds", p.period_seconds),
        ("successThreshold", p.success_threshold),
        ("failureThreshold", p.failure_threshold),
    ] {
        if let Some(v) = value {
            non_negative(&format!("{path}.{field}"), v.into(), problems);
        }
    }
    if let Some(grace) = p.termination_grace_period_seconds {
        if grace <= 0 {
            problems.push(format!(
                "{path}.terminationGracePeriodSeconds: must be greater than 0, got {grace}"
            ));
        }
    }
}

/// A lifecycle hook's sleep.
fn check_hook(path: &str, h: &LifecycleHandler, problems: &mut Vec<String>) {
    if let Some(sleep) = &h.sleep {
        non_negative(&format!("{path}.sleep.seconds"), sleep.seconds, problems);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(yaml: &str) -> Pod {
        serde_yaml::from_str(yaml).expect("pod yaml")
    }

    const GOOD: &str = "
metadata: {name: web}
spec:
  containers:
  - {name: web, image: busybox:demo, ports: [{containerPort: 80}]}
";

    #[test]
    fn a_good_pod_passes() {
        assert_eq!(validate_pod(&pod(GOOD)), Vec::<String>::new());
    }

    #[test]
    fn each_problem_names_its_field() {
        let p = pod("
metadata: {name: Web_1, namespace: Kube}
spec:
  restartPolicy: Sometimes
  terminationGracePeriodSeconds: -1
  initContainers:
  - {name: setup, image: busybox}
  containers:
  - {name: setup, image: busybox}
  - {name: x, image: ''}
  - {name: Bad, image: busybox, ports: [{containerPort: 0, protocol: HTTP}]}
");
        let problems = validate_pod(&p);
        let expect = [
            "metadata.name: ",
            "metadata.namespace: ",
            "spec.containers[0].name: duplicate container name \"setup\"",
            "spec.containers[1].image: required",
            "spec.containers[2].name: ",
            "spec.containers[2].ports[0].containerPort: ",
            "spec.containers[2].ports[0].protocol: ",
            "spec.restartPolicy: unsupported value \"Sometimes\"",
            "spec.terminationGracePeriodSeconds: ",
        ];
        assert_eq!(problems.len(), expect.len(), "{problems:#?}");
        for (got, want) in problems.iter().zip(expect) {
            assert!(
                got.starts_with(want),
                "{got:?} does not start with {want:?}"
            );
        }
    }

    #[test]
    fn negative_numbers_are_refused_by_field_and_huge_ones_are_legal() {
        let p = pod("
metadata: {name: web}
spec:
  terminationGracePeriodSeconds: 9223372036854775807
  activeDeadlineSeconds: 0
  containers:
  - name: web
    image: busybox
    resources: {limits: {memory: -1Mi, cpu: 20Ei}, requests: {memory: 99999999Ei}}
    lifecycle:
      preStop: {sleep: {seconds: -5}}
      postStart: {sleep: {seconds: 9223372036854775807}}
    livenessProbe:
      exec: {command: [true]}
      initialDelaySeconds: -1
      timeoutSeconds: -1
      periodSeconds: -1
      successThreshold: -1
      failureThreshold: -1
      terminationGracePeriodSeconds: 0
    readinessProbe:
      exec: {command: [true]}
      initialDelaySeconds: 2147483647
      periodSeconds: 2147483647
    startupProbe:
      exec: {command: [true]}
      terminationGracePeriodSeconds: 9223372036854775807
");
        let problems = validate_pod(&p);
        let c = "spec.containers[0]";
        let expect = [
            format!(
                "{c}.livenessProbe.initialDelaySeconds: must be greater than or equal to 0, got -1"
            ),
            format!("{c}.livenessProbe.timeoutSeconds: must be greater than or equal to 0"),
            format!("{c}.livenessProbe.periodSeconds: must be greater than or equal to 0"),
            format!("{c}.livenessProbe.successThreshold: must be greater than or equal to 0"),
            format!("{c}.livenessProbe.failureThreshold: must be greater than or equal to 0"),
            format!(
                "{c}.livenessProbe.terminationGracePeriodSeconds: must be greater than 0, got 0"
            ),
            format!(
                "{c}.lifecycle.preStop.sleep.seconds: must be greater than or equal to 0, got -5"
            ),
            format!("{c}.resources.limits[cpu]: invalid quantity \"20Ei\": too large"),
            format!("{c}.resources.limits[memory]: invalid quantity \"-1Mi\": negative"),
            format!("{c}.resources.requests[memory]: invalid quantity"),
            "spec.activeDeadlineSeconds: must be between 1 and 2147483647, inclusive, got 0".into(),
        ];
        assert_eq!(problems.len(), expect.len(), "{problems:#?}");
        for (got, want) in problems.iter().zip(expect) {
            assert!(
                got.starts_with(&want),
                "{got:?} does not start with {want:?}"
            );
        }
        let ok = pod("
metadata: {name: web}
spec:
  activeDeadlineSeconds: 2147483647
  containers: [{name: web, image: busybox}]
");
        assert_eq!(validate_pod(&ok), Vec::<String>::new());
    }

    #[test]
    fn missing_parts() {
        assert_eq!(
            validate_pod(&pod("metadata: {}\n")),
            vec!["metadata.name: required", "spec: required"]
        );
        assert_eq!(
            validate_pod(&pod("metadata: {name: a}\nspec: {containers: []}\n")),
            vec!["spec.containers: at least one container is required"]
        );
        assert_eq!(
            validate_pod(&pod(
                "metadata: {name: a}\nspec: {containers: [{image: x}]}\n"
            )),
            vec!["spec.containers[0].name: required"]
        );
    }
}
