//! Ephemeral containers (`spec.ephemeralContainers`, added to a running pod through the
//! `pods/ephemeralcontainers` subresource): each runs as the container it describes,
//! as the kubelet converts `EphemeralContainerCommon` to a `Container`.

use k8s_openapi::api::core::v1::{Container, EphemeralContainer, Pod};

/// The container `ec` runs as: every field but `targetContainerName`, which says whose
/// PID namespace it joins and is read from the spec where that matters.
pub fn as_container(ec: &EphemeralContainer) -> Container {
    let ec = ec.clone();
    Container {
        args: ec.args,
        command: ec.command,
        env: ec.env,
        env_from: ec.env_from,
        image: ec.image,
        image_pull_policy: ec.image_pull_policy,
        lifecycle: ec.lifecycle,
        liveness_probe: ec.liveness_probe,
        name: ec.name,
        ports: ec.ports,
        readiness_probe: ec.readiness_probe,
        resize_policy: ec.resize_policy,
        resources: ec.resources,
        restart_policy: ec.restart_policy,
        restart_policy_rules: ec.restart_policy_rules,
        security_context: ec.security_context,
        startup_probe: ec.startup_probe,
        stdin: ec.stdin,
        stdin_once: ec.stdin_once,
        termination_message_path: ec.termination_message_path,
        termination_message_policy: ec.termination_message_policy,
        tty: ec.tty,
        volume_devices: ec.volume_devices,
        volume_mounts: ec.volume_mounts,
        working_dir: ec.working_dir,
    }
}

/// The pod's ephemeral containers, in the spec's order.
pub fn ephemeral_containers(pod: &Pod) -> &[EphemeralContainer] {
    pod.spec
        .as_ref()
        .and_then(|s| s.ephemeral_containers.as_deref())
        .unwrap_or(&[])
}

/// The ephemeral container `name` of the pod, if it has one.
pub fn find<'a>(pod: &'a Pod, name: &str) -> Option<&'a EphemeralContainer> {
    ephemeral_containers(pod).iter().find(|c| c.name == name)
}

/// The container whose PID namespace the ephemeral container `name` joins, if it names
/// one (`targetContainerName`).
pub fn target<'a>(pod: &'a Pod, name: &str) -> Option<&'a str> {
    find(pod, name)?
        .target_container_name
        .as_deref()
        .filter(|t| !t.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod() -> Pod {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": "p"},
            "spec": {
                "containers": [{"name": "main", "image": "i"}],
                "ephemeralContainers": [
                    {"name": "debug", "image": "busybox", "command": ["sh"],
                     "stdin": true, "tty": true, "targetContainerName": "main",
                     "env": [{"name": "A", "value": "1"}],
                     "volumeMounts": [{"name": "v", "mountPath": "/v"}],
                     "terminationMessagePolicy": "File"},
                    {"name": "plain", "image": "busybox", "targetContainerName": ""}
                ]
            }
        }))
        .expect("pod")
    }

    #[test]
    fn an_ephemeral_container_runs_as_the_container_it_describes() {
        let p = pod();
        let debug = find(&p, "debug").expect("debug");
        let c = as_container(debug);
        assert_eq!(c.name, "debug");
        assert_eq!(c.image.as_deref(), Some("busybox"));
        assert_eq!(c.command, Some(vec!["sh".to_string()]));
        assert_eq!((c.stdin, c.tty), (Some(true), Some(true)));
        assert_eq!(c.env.as_ref().map(Vec::len), Some(1));
        assert_eq!(c.volume_mounts.as_ref().map(Vec::len), Some(1));
        assert_eq!(c.termination_message_policy.as_deref(), Some("File"));
        // Everything but the target is the same, field by field, as JSON says it.
        let mut ec = serde_json::to_value(debug).expect("json");
        ec.as_object_mut()
            .expect("object")
            .remove("targetContainerName");
        assert_eq!(serde_json::to_value(&c).expect("json"), ec);
    }

    #[test]
    fn the_target_is_named_by_the_spec() {
        let p = pod();
        assert_eq!(target(&p, "debug"), Some("main"));
        assert_eq!(target(&p, "plain"), None, "an empty name is no target");
        assert_eq!(
            target(&p, "main"),
            None,
            "an app container is no ephemeral one"
        );
        assert!(find(&p, "nosuch").is_none());
        assert_eq!(ephemeral_containers(&p).len(), 2);
        assert!(ephemeral_containers(&Pod::default()).is_empty());
    }
}
