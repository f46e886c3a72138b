//! Pods as a cluster's user would create them for the tests: bound to a node, one
//! busybox container.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Container, Pod, PodSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

/// A pod in `default` bound to `node`, labelled `app=<name>`, on the host network,
/// running `command` in one container `main` of the test image, with `grace` seconds
/// to stop.
pub fn bound_pod(node: &str, name: &str, command: &[&str], grace: i64) -> Pod {
    Pod {
        metadata: ObjectMeta {
            name: Some(name.into()),
            namespace: Some("default".into()),
            labels: Some(BTreeMap::from([("app".to_string(), name.to_string())])),
            ..ObjectMeta::default()
        },
        spec: Some(PodSpec {
            node_name: Some(node.into()),
            host_network: Some(true),
            termination_grace_period_seconds: Some(grace),
            containers: vec![Container {
                name: "main".into(),
                image: Some("busybox:demo".into()),
                command: Some(command.iter().map(|s| s.to_string()).collect()),
                ..Container::default()
            }],
            ..PodSpec::default()
        }),
        status: None,
    }
}
