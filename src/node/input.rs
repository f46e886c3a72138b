//! node::input: the node as the config describes it, parsed once (name, labels, taints,
//! reservations, hard eviction thresholds, pods, ports and addresses): what node
//! registration, node status, allocatable and eviction all read. A plain value; the
//! config builds it (`Config::node_input`); nothing here reads a file.

use std::collections::BTreeMap;
use std::net::IpAddr;

use k8s_openapi::api::core::v1::Taint;

use super::allocatable::{Resources, Threshold};
use super::NodeFacts;

/// What node registration and status need from the config, parsed once.
#[derive(Debug, Clone, PartialEq)]
pub struct NodeInput {
    pub node_name: String,
    /// The config's node labels; the ones the node sets itself come on top.
    pub labels: BTreeMap<String, String>,
    pub taints: Vec<Taint>,
    pub system_reserved: Resources,
    pub kube_reserved: Resources,
    /// Hard eviction thresholds by signal (the kubelet's defaults if the config sets
    /// none); they set the pressure conditions and reserve memory and storage.
    pub eviction_hard: BTreeMap<String, Threshold>,
    pub max_pods: u32,
    /// The kubelet API port advertised in `daemonEndpoints`.
    pub port: u16,
    pub node_ip: Option<IpAddr>,
    /// The kubelet API's `address` when it is one address rather than all of them:
    /// the only address the apiserver can reach the node's API at.
    pub listen_ip: Option<IpAddr>,
    /// The board profile's name, the node's instance type.
    pub board: Option<String>,
    /// Why the node cannot run pods right now (runtime or network down); empty when it
    /// can. Set by the caller each time; any entry makes the node NotReady.
    pub not_ready: Vec<String>,
}

impl NodeInput {
    /// System and kube reservations together.
    pub fn reserved(&self) -> Resources {
        let (s, k) = (self.system_reserved, self.kube_reserved);
        Resources {
            cpu_millis: s.cpu_millis.saturating_add(k.cpu_millis),
            memory: s.memory.saturating_add(k.memory),
            ephemeral_storage: s.ephemeral_storage.saturating_add(k.ephemeral_storage),
        }
    }

    /// The node's InternalIP: `--node-ip`, else the node name if it is an address, else
    /// the kubelet API's own `address` if it listens on one only (the default route's
    /// address would send the apiserver's `kubectl logs` and `exec` where nothing
    /// listens), else the default route's address, in the kubelet's order (less its
    /// DNS lookup).
    pub fn internal_ip(&self, facts: &NodeFacts) -> Option<IpAddr> {
        self.node_ip
            .or_else(|| self.node_name.parse().ok())
            .or(self.listen_ip)
            .or(facts.host_ip)
    }

    /// The input of a config with defaults everywhere, for tests.
    #[cfg(test)]
    pub(crate) fn for_tests(node_name: &str) -> NodeInput {
        crate::config::Config::with_defaults(node_name.to_string())
            .node_input()
            .expect("defaults are valid")
    }
}

/// Why the config cannot describe a Node the cluster would accept.
#[derive(Debug, thiserror::Error)]
pub enum NodeStatusError {
    #[error("node label {key:?}: {reason}")]
    Label { key: String, reason: String },
    #[error("{field}.{resource}: {reason}")]
    Reserved {
        field: &'static str,
        resource: String,
        reason: String,
    },
    #[error("eviction threshold {signal}: {reason}")]
    Eviction { signal: String, reason: String },
}
