//! config::node: the config read as the node model ([`NodeInput`]): labels checked,
//! `systemReserved` / `kubeReserved` and `evictionHard` parsed, the kubelet's default
//! thresholds where the config sets none. The model itself lives in [`crate::node`].

use std::collections::BTreeMap;

use super::{check_label, Config};
use crate::node::allocatable::{Resources, Threshold, DEFAULT_EVICTION_HARD};
use crate::node::{NodeInput, NodeStatusError};

impl Config {
    /// What node status needs from this config, checked again: a Config built in code
    /// has not been through the loader's checks.
    pub fn node_input(&self) -> Result<NodeInput, NodeStatusError> {
        let config = self;
        for (key, value) in &config.node_labels {
            check_label(key, value).map_err(|reason| NodeStatusError::Label {
                key: key.clone(),
                reason,
            })?;
        }
        let reserved = |field: &'static str, map| {
            Resources::from_map(map).map_err(|(resource, reason)| NodeStatusError::Reserved {
                field,
                resource,
                reason,
            })
        };
        let defaults;
        let eviction = if config.eviction_hard.is_empty() {
            defaults = DEFAULT_EVICTION_HARD
                .iter()
                .map(|(s, t)| (s.to_string(), t.to_string()))
                .collect();
            &defaults
        } else {
            &config.eviction_hard
        };
        let mut eviction_hard = BTreeMap::new();
        for (signal, text) in eviction {
            let threshold = Threshold::parse(text).map_err(|reason| NodeStatusError::Eviction {
                signal: signal.clone(),
                reason,
            })?;
            if let Some(t) = threshold {
                eviction_hard.insert(signal.clone(), t);
            }
        }
        Ok(NodeInput {
            node_name: config.node_name.clone(),
            labels: config.node_labels.clone(),
            taints: config.register_with_taints.clone(),
            system_reserved: reserved("systemReserved", &config.system_reserved)?,
            kube_reserved: reserved("kubeReserved", &config.kube_reserved)?,
            eviction_hard,
            max_pods: config.max_pods,
            port: config.port,
            node_ip: config.node_ip,
            listen_ip: Some(config.server.address).filter(|a| !a.is_unspecified()),
            board: config.board.clone(),
            not_ready: Vec::new(),
        })
    }
}
