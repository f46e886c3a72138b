//! network: a pod's network, IPC and UTS namespaces (held without a pause container),
//! its CNI attachment (ADD on start, CHECK on resync, DEL on removal, also after an
//! agent restart or a power cut), its addresses, and its `/etc/hosts`,
//! `/etc/resolv.conf` and `/etc/hostname`. Host-network pods share the node's network
//! and get none of the CNI part.
//!
//! Owns, in a pod's directory (`<root>/pods/<uid>/`): `ns/` (the namespace bind
//! mounts), `network.json` (what was attached, with the network configuration used,
//! so that DEL gets the same one the ADD got, as the CNI spec asks), `hosts`,
//! `resolv.conf` and `hostname`. Must not touch containers, volumes or cgroups.
//!
//! Blocking: plugins are processes; callers run this on a blocking thread.

pub mod cni;
pub mod conf;
pub mod dns;
pub mod netns;
mod sandbox;

use std::path::PathBuf;

pub use sandbox::{check, teardown, Network, PodNetwork};

/// Where pods' networks come from: the `holdfast.cniConfDir`, `holdfast.cniBinDir`,
/// `podCIDR`, `clusterDNS`, `clusterDomain` and `resolvConf` settings.
#[derive(Debug, Clone, PartialEq)]
pub struct NetworkConfig {
    /// Where network configurations are looked for (`/etc/cni/net.d`).
    pub conf_dir: PathBuf,
    /// Where plugins are looked for, in order (`/opt/cni/bin`, then Debian's
    /// `/usr/lib/cni`).
    pub bin_dirs: Vec<PathBuf>,
    /// The default network's subnet, when `conf_dir` has no network.
    pub pod_cidr: String,
    pub dns: dns::DnsSettings,
    /// The host resolver configuration pods with dnsPolicy Default get; None for none.
    pub resolv_conf: Option<PathBuf>,
}

impl Default for NetworkConfig {
    fn default() -> Self {
        NetworkConfig {
            conf_dir: PathBuf::from("/etc/cni/net.d"),
            bin_dirs: vec![PathBuf::from("/opt/cni/bin"), PathBuf::from("/usr/lib/cni")],
            pod_cidr: conf::DEFAULT_POD_CIDR.to_owned(),
            dns: dns::DnsSettings {
                cluster_dns: Vec::new(),
                cluster_domain: String::new(),
            },
            resolv_conf: Some(PathBuf::from("/etc/resolv.conf")),
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum NetworkError {
    #[error("network configuration {path}: {reason}")]
    Config { path: PathBuf, reason: String },
    #[error("CNI plugin {plugin:?} not found in {dirs:?}")]
    PluginMissing { plugin: String, dirs: Vec<PathBuf> },
    #[error("plugin type={plugin:?} failed ({command}): {message}")]
    Plugin {
        plugin: String,
        command: &'static str,
        message: String,
    },
    #[error("pod namespaces in {dir}: {message}")]
    Namespaces { dir: PathBuf, message: String },
    #[error("{context}")]
    Io {
        context: String,
        #[source]
        source: std::io::Error,
    },
}

impl NetworkError {
    /// Worth another try on the next sync: everything but a configuration that will
    /// not change by itself. A missing plugin may be installed meanwhile, so it is.
    pub fn is_retryable(&self) -> bool {
        !matches!(self, NetworkError::Config { .. })
    }
}
