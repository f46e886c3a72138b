//! config::node: the config read as the node model ([`NodeInput`]): labels checked,
//! `systemReserved` / `kubeReserved` and `evictionHard` parsed, the kubelet's default
//! thresholds where the config sets none; the node's address as its pods see it. The
//! model itself lives in [`crate::node`].

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

    /// The node's address as its pods' `status.hostIP` (and a host-network pod's `podIP`)
    /// show it: the InternalIP the node reports (`--node-ip`, else the node name if it is an
    /// address, else the kubelet API's `address` if it is one address, else the default
    /// route's), so a pod's status and its node's agree.
    pub fn node_address(&self) -> Option<String> {
        let listen = Some(self.server.address).filter(|a| !a.is_unspecified());
        self.node_ip
            .or_else(|| self.node_name.parse().ok())
            .or(listen)
            .map(|ip| ip.to_string())
            .or_else(crate::node::host_ip)
    }
}

#[cfg(test)]
mod tests {
    use std::net::IpAddr;

    use crate::config::Config;
    use crate::node::host_ip;

    #[test]
    fn node_address_is_the_reported_internal_ip() {
        let mut c = Config::with_defaults("gw".into());
        c.node_ip = Some(IpAddr::from([10, 1, 2, 3]));
        c.server.address = IpAddr::from([127, 0, 0, 1]);
        assert_eq!(c.node_address().as_deref(), Some("10.1.2.3"));
        c.node_ip = None;
        assert_eq!(c.node_address().as_deref(), Some("127.0.0.1"));
        c.node_name = "10.0.240.5".into();
        assert_eq!(c.node_address().as_deref(), Some("10.0.240.5"));
        c.node_name = "gw".into();
        c.server.address = IpAddr::from([0, 0, 0, 0]);
        assert_eq!(c.node_address(), host_ip());
    }
}
