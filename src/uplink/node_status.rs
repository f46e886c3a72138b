//! uplink::node_status: the Node this agent registers, the status it reports, the
//! patch that carries a status change, and the node Lease, all shaped as the kubelet
//! shapes them so the cluster's controllers read holdfast like any kubelet. Pure
//! functions of the node model (`crate::node`: the node as configured, its capacity and
//! allocatable), the device's facts and the clock: the I/O is the caller's.

mod conditions;
#[cfg(test)]
mod fixtures;
mod images;
mod patch;

use std::collections::BTreeMap;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::api::core::v1::{
    DaemonEndpoint, Node, NodeAddress, NodeDaemonEndpoints, NodeSpec, NodeStatus, NodeSystemInfo,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta, OwnerReference};

use crate::config::check_label;
use crate::node::{allocatable, NodeFacts, NodeInput};
use crate::time::Timestamp;

pub use images::{images, MAX_IMAGES};
pub use patch::{needs_report, status_patch};

/// `nodeInfo.kubeletVersion`, the VERSION column of `kubectl get nodes`: the Kubernetes
/// API level holdfast implements (k8s-openapi's `v1_34`), so version-skew rules and
/// tools that parse it as semver see a 1.34 node, with holdfast's own version as semver
/// build metadata, which every comparison ignores; k3s marks its builds the same way.
/// A pre-release suffix (`-holdfast`) would instead sort below v1.34.0 and fail
/// "at least 1.34" checks.
pub const KUBELET_VERSION: &str = concat!("v1.34.0+holdfast-", env!("CARGO_PKG_VERSION"));

/// The libcontainer release in Cargo.lock; a test keeps the two in step.
pub const LIBCONTAINER_VERSION: &str = "0.7.0";

/// `nodeInfo.containerRuntimeVersion`: `<runtime>://<version>` as the kubelet reports a
/// CRI runtime's.
pub const CONTAINER_RUNTIME_VERSION: &str = concat!("libcontainer://", "0.7.0");

/// Where node leases live.
pub const NODE_LEASE_NAMESPACE: &str = "kube-node-lease";

/// Set on registration, as the kubelet does, so the attach/detach controller (not the
/// node) attaches volumes.
const CONTROLLER_MANAGED_ATTACH_DETACH: &str =
    "volumes.kubernetes.io/controller-managed-attach-detach";

/// The Node to create at registration: the node's own labels (architecture, OS,
/// hostname, the board as instance type) under the config's, the configured taints,
/// and a first status. Labels NodeRestriction would refuse are left out with a warning
/// rather than failing the whole registration.
pub fn registration_node(input: &NodeInput, facts: &NodeFacts, now: Timestamp) -> Node {
    let mut labels = BTreeMap::new();
    let mut own = vec![
        ("kubernetes.io/arch", facts.architecture.clone()),
        ("kubernetes.io/hostname", input.node_name.clone()),
        ("kubernetes.io/os", "linux".to_string()),
    ];
    if let Some(board) = &input.board {
        own.push(("node.kubernetes.io/instance-type", board.clone()));
    }
    let config_labels = input.labels.iter().map(|(k, v)| (k.as_str(), v.clone()));
    for (key, value) in own.into_iter().chain(config_labels) {
        match check_label(key, &value) {
            Ok(()) => {
                labels.insert(key.to_string(), value);
            }
            Err(reason) => log::warn!("node label {key}={value} left out: {reason}"),
        }
    }
    Node {
        metadata: ObjectMeta {
            name: Some(input.node_name.clone()),
            labels: Some(labels),
            annotations: Some(BTreeMap::from([(
                CONTROLLER_MANAGED_ATTACH_DETACH.to_string(),
                "true".to_string(),
            )])),
            ..ObjectMeta::default()
        },
        spec: Some(NodeSpec {
            taints: (!input.taints.is_empty()).then(|| input.taints.clone()),
            ..NodeSpec::default()
        }),
        status: Some(node_status(input, facts, None, now)),
    }
}

/// The node's status now. Starts from `previous` (the status last read or sent) so
/// that what others put there — extended resources, volumes attached, conditions of
/// other components — stays, and so condition transition times carry over.
pub fn node_status(
    input: &NodeInput,
    facts: &NodeFacts,
    previous: Option<&NodeStatus>,
    now: Timestamp,
) -> NodeStatus {
    let now = conditions::wire_time(now);
    let (capacity, allocatable) = allocatable::capacity_and_allocatable(input, facts, previous);
    let ours = conditions::current(input, facts, &capacity, &now);
    let before = previous
        .and_then(|p| p.conditions.as_deref())
        .unwrap_or_default();
    let mut addresses = Vec::with_capacity(2);
    if let Some(ip) = input.internal_ip(facts) {
        addresses.push(NodeAddress {
            type_: "InternalIP".into(),
            address: ip.to_string(),
        });
    }
    addresses.push(NodeAddress {
        type_: "Hostname".into(),
        address: input.node_name.clone(),
    });
    NodeStatus {
        capacity: Some(capacity),
        allocatable: Some(allocatable),
        conditions: Some(conditions::merge(before, ours, &now)),
        addresses: Some(addresses),
        daemon_endpoints: Some(NodeDaemonEndpoints {
            kubelet_endpoint: Some(DaemonEndpoint {
                port: i32::from(input.port),
            }),
        }),
        node_info: Some(NodeSystemInfo {
            architecture: facts.architecture.clone(),
            boot_id: facts.boot_id.clone(),
            container_runtime_version: CONTAINER_RUNTIME_VERSION.into(),
            kernel_version: facts.kernel_version.clone(),
            // Deprecated and no longer set by the kubelet; the apiserver stores "".
            kube_proxy_version: String::new(),
            kubelet_version: KUBELET_VERSION.into(),
            machine_id: facts.machine_id.clone(),
            operating_system: "linux".into(),
            os_image: facts.os_image.clone(),
            system_uuid: facts.system_uuid.clone(),
            swap: None,
        }),
        runtime_handlers: Some(images::runtime_handlers()),
        features: Some(images::features()),
        ..previous.cloned().unwrap_or_default()
    }
}

/// The node's Lease as the kubelet writes it: held by the node, renewed `now` (at
/// microsecond precision, the wire's), owned by the Node once its uid is known so it
/// goes when the Node does.
pub fn lease(node_name: &str, node_uid: Option<&str>, duration_secs: i32, now: Timestamp) -> Lease {
    let renew = Timestamp::from_microsecond(now.as_microsecond()).unwrap_or(now);
    Lease {
        metadata: ObjectMeta {
            name: Some(node_name.to_string()),
            namespace: Some(NODE_LEASE_NAMESPACE.to_string()),
            owner_references: node_uid.map(|uid| {
                vec![OwnerReference {
                    api_version: "v1".into(),
                    kind: "Node".into(),
                    name: node_name.to_string(),
                    uid: uid.to_string(),
                    ..OwnerReference::default()
                }]
            }),
            ..ObjectMeta::default()
        },
        spec: Some(LeaseSpec {
            holder_identity: Some(node_name.to_string()),
            lease_duration_seconds: Some(duration_secs),
            renew_time: Some(MicroTime(renew)),
            ..LeaseSpec::default()
        }),
    }
}

#[cfg(test)]
mod tests;
