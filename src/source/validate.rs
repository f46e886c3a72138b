//! Pod validation: the subset of the apiserver's checks that matters for what holdfast
//! runs. Manifests are untrusted input, so each problem is reported with its field path
//! and the pod is refused, never half-run.

use std::collections::HashSet;

use k8s_openapi::api::core::v1::{Container, Pod};

use crate::config::{check_dns1123_label, check_dns1123_subdomain};

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
        if grace < 0 {
            problems.push(format!(
                "spec.terminationGracePeriodSeconds: must be greater than or equal to 0, got {grace}"
            ));
        }
    }
    problems
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
