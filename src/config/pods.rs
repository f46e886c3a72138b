//! The settings of pods' sandboxes: networking (`clusterDNS`, `clusterDomain`,
//! `resolvConf`, `podCIDR`, `holdfast.cniConfDir`, `holdfast.cniBinDir`), resources
//! (`podPidsLimit`, `enforceNodeAllocatable`), security (`allowedUnsafeSysctls`,
//! `holdfast.allowPrivileged`, `holdfast.staticPodAllowedHostPaths`) and eviction
//! (`holdfast.evictionMonitoringPeriod`).
//! KubeletConfiguration keys keep the kubelet's names and meanings.

use std::net::IpAddr;
use std::path::PathBuf;
use std::time::Duration;

use serde_yaml::Value;

use super::reader::{short, type_name, Reader};
use super::ConfigError;

/// The settings as merged, with the kubelet's defaults.
#[derive(Debug, Clone, PartialEq)]
pub struct PodSettings {
    pub cluster_dns: Vec<String>,
    pub cluster_domain: String,
    /// None when `resolvConf: ""` (no host resolver for pods).
    pub resolv_conf: Option<PathBuf>,
    pub pod_cidr: String,
    pub cni_conf_dir: PathBuf,
    pub cni_bin_dirs: Vec<PathBuf>,
    /// None when unlimited (-1, the default).
    pub pod_pids_limit: Option<i64>,
    pub enforce_node_allocatable: Vec<String>,
    pub allowed_unsafe_sysctls: Vec<String>,
    pub allow_privileged: bool,
    /// The host paths static pods may use; None (the default) for any.
    pub static_pod_allowed_host_paths: Option<Vec<PathBuf>>,
    pub eviction_monitoring_period: Duration,
}

impl Default for PodSettings {
    fn default() -> Self {
        let net = crate::network::NetworkConfig::default();
        PodSettings {
            cluster_dns: Vec::new(),
            cluster_domain: String::new(),
            resolv_conf: net.resolv_conf,
            pod_cidr: net.pod_cidr,
            cni_conf_dir: net.conf_dir,
            cni_bin_dirs: net.bin_dirs,
            pod_pids_limit: None,
            enforce_node_allocatable: vec!["pods".into()],
            allowed_unsafe_sysctls: Vec::new(),
            allow_privileged: false,
            static_pod_allowed_host_paths: None,
            eviction_monitoring_period: Duration::from_secs(10),
        }
    }
}

/// What the file sets of them; `None` for what it leaves out.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct PodKeys {
    pub cluster_dns: Option<Vec<String>>,
    pub cluster_domain: Option<String>,
    pub resolv_conf: Option<String>,
    pub pod_cidr: Option<String>,
    pub cni_conf_dir: Option<PathBuf>,
    pub cni_bin_dirs: Option<Vec<PathBuf>>,
    pub pod_pids_limit: Option<i64>,
    pub enforce_node_allocatable: Option<Vec<String>>,
    pub allowed_unsafe_sysctls: Option<Vec<String>>,
    pub allow_privileged: Option<bool>,
    pub static_pod_allowed_host_paths: Option<Vec<PathBuf>>,
    pub eviction_monitoring_period: Option<Duration>,
}

impl PodKeys {
    /// The file's keys, gaps filled from a board profile's.
    pub fn or(self, profile: PodKeys) -> PodKeys {
        PodKeys {
            cluster_dns: self.cluster_dns.or(profile.cluster_dns),
            cluster_domain: self.cluster_domain.or(profile.cluster_domain),
            resolv_conf: self.resolv_conf.or(profile.resolv_conf),
            pod_cidr: self.pod_cidr.or(profile.pod_cidr),
            cni_conf_dir: self.cni_conf_dir.or(profile.cni_conf_dir),
            cni_bin_dirs: self.cni_bin_dirs.or(profile.cni_bin_dirs),
            pod_pids_limit: self.pod_pids_limit.or(profile.pod_pids_limit),
            enforce_node_allocatable: self
                .enforce_node_allocatable
                .or(profile.enforce_node_allocatable),
            allowed_unsafe_sysctls: self
                .allowed_unsafe_sysctls
                .or(profile.allowed_unsafe_sysctls),
            allow_privileged: self.allow_privileged.or(profile.allow_privileged),
            static_pod_allowed_host_paths: self
                .static_pod_allowed_host_paths
                .or(profile.static_pod_allowed_host_paths),
            eviction_monitoring_period: self
                .eviction_monitoring_period
                .or(profile.eviction_monitoring_period),
        }
    }

    /// The settings: what the file says over the defaults.
    pub fn settings(&self) -> PodSettings {
        let mut s = PodSettings::default();
        if let Some(v) = &self.cluster_dns {
            s.cluster_dns = v.clone();
        }
        if let Some(v) = &self.cluster_domain {
            s.cluster_domain = v.clone();
        }
        if let Some(v) = &self.resolv_conf {
            s.resolv_conf = (!v.is_empty()).then(|| PathBuf::from(v));
        }
        if let Some(v) = &self.pod_cidr {
            s.pod_cidr = v.clone();
        }
        if let Some(v) = &self.cni_conf_dir {
            s.cni_conf_dir = v.clone();
        }
        if let Some(v) = &self.cni_bin_dirs {
            s.cni_bin_dirs = v.clone();
        }
        s.pod_pids_limit = self.pod_pids_limit.filter(|n| *n > 0);
        if let Some(v) = &self.enforce_node_allocatable {
            s.enforce_node_allocatable = v.iter().filter(|k| *k != "none").cloned().collect();
        }
        if let Some(v) = &self.allowed_unsafe_sysctls {
            s.allowed_unsafe_sysctls = v.clone();
        }
        if let Some(v) = self.allow_privileged {
            s.allow_privileged = v;
        }
        s.static_pod_allowed_host_paths
            .clone_from(&self.static_pod_allowed_host_paths);
        if let Some(v) = self.eviction_monitoring_period {
            s.eviction_monitoring_period = v;
        }
        s
    }
}

impl Reader<'_> {
    /// A top-level KubeletConfiguration key of pods' sandboxes; false if not one.
    pub(super) fn pod_key(
        &self,
        key: &str,
        value: &Value,
        out: &mut PodKeys,
    ) -> Result<bool, ConfigError> {
        match key {
            "clusterDNS" => {
                let list = self.strings(key, value)?;
                for ip in &list {
                    ip.parse::<IpAddr>()
                        .map_err(|_| self.err(key, format!("{ip:?} is not an IP address")))?;
                }
                out.cluster_dns = Some(list);
            }
            "clusterDomain" => {
                let d = self.string(key, value)?;
                let d = d.trim_end_matches('.').to_owned();
                if !d.is_empty() {
                    super::check_dns1123_subdomain(&d).map_err(|reason| self.err(key, reason))?;
                }
                out.cluster_domain = Some(d);
            }
            "resolvConf" => out.resolv_conf = Some(self.string(key, value)?),
            "podCIDR" => {
                let c = self.string(key, value)?;
                check_cidr(&c).map_err(|reason| self.err(key, reason))?;
                out.pod_cidr = Some(c);
            }
            "podPidsLimit" => match value {
                Value::Number(n) => match n.as_i64() {
                    Some(n) if n == -1 || n > 0 => out.pod_pids_limit = Some(n),
                    _ => {
                        return Err(
                            self.err(key, format!("expected -1 or a positive integer, got {n}"))
                        )
                    }
                },
                other => {
                    return Err(self.err(
                        key,
                        format!("expected -1 or a positive integer, got {}", short(other)),
                    ))
                }
            },
            "enforceNodeAllocatable" => {
                let list = self.strings(key, value)?;
                for k in &list {
                    if !matches!(
                        k.as_str(),
                        "pods" | "system-reserved" | "kube-reserved" | "none"
                    ) {
                        return Err(self.err(
                            key,
                            format!("unknown value {k:?}: expected pods, system-reserved, kube-reserved or none"),
                        ));
                    }
                }
                out.enforce_node_allocatable = Some(list);
            }
            "allowedUnsafeSysctls" => {
                let list = self.strings(key, value)?;
                for s in &list {
                    let name = s.trim_end_matches('*');
                    if crate::runtime::sysctl::sysctl_namespace(name).is_none() {
                        return Err(self.err(
                            key,
                            format!("the sysctls {s:?} are not known to be namespaced"),
                        ));
                    }
                }
                out.allowed_unsafe_sysctls = Some(list);
            }
            _ => return Ok(false),
        }
        Ok(true)
    }

    /// A `holdfast.` key of pods' sandboxes; false if not one.
    pub(super) fn pod_holdfast_key(
        &self,
        key: &str,
        value: &Value,
        base: &std::path::Path,
        out: &mut PodKeys,
    ) -> Result<bool, ConfigError> {
        match key {
            "holdfast.cniConfDir" => {
                let s = self.string(key, value)?;
                if s.is_empty() {
                    return Err(self.err(key, "expected a path, got an empty string".into()));
                }
                out.cni_conf_dir = Some(base.join(s));
            }
            "holdfast.cniBinDir" => {
                // A list, or one string of paths separated by ':' or ',' (the kubelet's
                // --cni-bin-dir took commas).
                let list = match value {
                    Value::Sequence(_) => self.strings(key, value)?,
                    _ => self
                        .string(key, value)?
                        .split([':', ','])
                        .filter(|s| !s.is_empty())
                        .map(str::to_owned)
                        .collect(),
                };
                if list.is_empty() {
                    return Err(self.err(key, "expected at least one directory".into()));
                }
                out.cni_bin_dirs = Some(list.into_iter().map(|d| base.join(d)).collect());
            }
            "holdfast.allowPrivileged" => match value {
                Value::Bool(b) => out.allow_privileged = Some(*b),
                other => {
                    return Err(self.err(
                        key,
                        format!(
                            "expected true or false, got {} {}",
                            type_name(other),
                            short(other)
                        ),
                    ))
                }
            },
            "holdfast.evictionMonitoringPeriod" => {
                out.eviction_monitoring_period = Some(self.positive_duration(key, value)?);
            }
            "holdfast.staticPodAllowedHostPaths" => {
                let mut list = Vec::new();
                for p in self.strings(key, value)? {
                    let path = PathBuf::from(&p);
                    if !path.is_absolute() {
                        return Err(self.err(key, format!("{p:?} is not an absolute path")));
                    }
                    if path
                        .components()
                        .any(|c| c == std::path::Component::ParentDir)
                    {
                        return Err(self.err(key, format!("{p:?} contains '..'")));
                    }
                    list.push(path);
                }
                out.static_pod_allowed_host_paths = Some(list);
            }
            _ => return Ok(false),
        }
        Ok(true)
    }

    fn strings(&self, key: &str, value: &Value) -> Result<Vec<String>, ConfigError> {
        match value {
            Value::Null => Ok(Vec::new()),
            Value::Sequence(items) => items.iter().map(|v| self.string(key, v)).collect(),
            other => Err(self.err(
                key,
                format!("expected a list, got {} {}", type_name(other), short(other)),
            )),
        }
    }
}

/// `10.88.0.0/16` or `fd00::/64`.
fn check_cidr(c: &str) -> Result<(), String> {
    let (ip, len) = c
        .split_once('/')
        .ok_or_else(|| format!("expected a CIDR like 10.88.0.0/16, got {c:?}"))?;
    let ip: IpAddr = ip
        .parse()
        .map_err(|_| format!("{ip:?} is not an IP address"))?;
    let max = if ip.is_ipv4() { 32 } else { 128 };
    match len.parse::<u8>() {
        Ok(n) if n <= max => Ok(()),
        _ => Err(format!("prefix length {len:?} is not 0 to {max}")),
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::super::parse_config;
    use super::*;

    fn keys(text: &str) -> PodKeys {
        let (cfg, warnings) =
            parse_config(Path::new("/etc/holdfast/config.yaml"), text).expect("parse");
        assert!(warnings.is_empty(), "{warnings:?}");
        cfg.pods
    }

    fn key_err(text: &str) -> (String, String) {
        match parse_config(Path::new("/etc/holdfast/config.yaml"), text) {
            Err(ConfigError::Key { key, reason, .. }) => (key, reason),
            other => panic!("expected a key error, got {other:?}"),
        }
    }

    #[test]
    fn every_key() {
        let k = keys(
            "clusterDNS: [10.96.0.10]\nclusterDomain: cluster.local.\nresolvConf: /run/resolv.conf\n\
             podCIDR: 10.77.0.0/24\npodPidsLimit: 512\nenforceNodeAllocatable: [pods]\n\
             allowedUnsafeSysctls: [\"net.core.*\", kernel.msgmax]\n\
             holdfast:\n  cniConfDir: cni/net.d\n  cniBinDir: /opt/cni/bin:/usr/lib/cni\n  \
             allowPrivileged: true\n  evictionMonitoringPeriod: 2s\n  \
             staticPodAllowedHostPaths: [/data, /var/log/app]\n",
        );
        let s = k.settings();
        assert_eq!(s.cluster_dns, ["10.96.0.10"]);
        assert_eq!(s.cluster_domain, "cluster.local");
        assert_eq!(s.resolv_conf, Some(PathBuf::from("/run/resolv.conf")));
        assert_eq!(s.pod_cidr, "10.77.0.0/24");
        assert_eq!(s.pod_pids_limit, Some(512));
        assert_eq!(s.cni_conf_dir, PathBuf::from("/etc/holdfast/cni/net.d"));
        assert_eq!(
            s.cni_bin_dirs,
            [PathBuf::from("/opt/cni/bin"), PathBuf::from("/usr/lib/cni")]
        );
        assert!(s.allow_privileged);
        assert_eq!(s.eviction_monitoring_period, Duration::from_secs(2));
        assert_eq!(s.allowed_unsafe_sysctls, ["net.core.*", "kernel.msgmax"]);
        assert_eq!(
            s.static_pod_allowed_host_paths,
            Some(vec![PathBuf::from("/data"), PathBuf::from("/var/log/app")])
        );
        // An empty list allows no hostPath at all.
        let none = keys("holdfast:\n  staticPodAllowedHostPaths: []\n").settings();
        assert_eq!(none.static_pod_allowed_host_paths, Some(vec![]));
    }

    #[test]
    fn defaults_are_the_kubelets() {
        let s = keys("").settings();
        assert_eq!(s, PodSettings::default());
        assert_eq!(s.resolv_conf, Some(PathBuf::from("/etc/resolv.conf")));
        assert_eq!(s.enforce_node_allocatable, ["pods"]);
        assert!(!s.allow_privileged);
        assert_eq!(s.pod_pids_limit, None);
        assert_eq!(s.static_pod_allowed_host_paths, None);
        assert_eq!(
            keys("resolvConf: \"\"\npodPidsLimit: -1\n")
                .settings()
                .resolv_conf,
            None
        );
    }

    #[test]
    fn bad_values_name_their_key() {
        assert_eq!(key_err("clusterDNS: [dns.example]\n").0, "clusterDNS");
        assert_eq!(key_err("clusterDNS: 10.0.0.10\n").0, "clusterDNS");
        assert_eq!(key_err("podCIDR: 10.0.0.0/40\n").0, "podCIDR");
        assert_eq!(key_err("podPidsLimit: 0\n").0, "podPidsLimit");
        assert_eq!(
            key_err("enforceNodeAllocatable: [all]\n").0,
            "enforceNodeAllocatable"
        );
        assert_eq!(
            key_err("allowedUnsafeSysctls: [vm.swappiness]\n").0,
            "allowedUnsafeSysctls"
        );
        assert_eq!(
            key_err("holdfast:\n  allowPrivileged: yes please\n").0,
            "holdfast.allowPrivileged"
        );
        assert_eq!(
            key_err("holdfast:\n  cniBinDir: \"\"\n").0,
            "holdfast.cniBinDir"
        );
        for bad in ["data", "/data/../etc", "{a: b}"] {
            let (key, reason) = key_err(&format!(
                "holdfast:\n  staticPodAllowedHostPaths: [\"{bad}\"]\n"
            ));
            assert_eq!(key, "holdfast.staticPodAllowedHostPaths", "{bad}: {reason}");
        }
        assert_eq!(
            key_err("holdfast:\n  staticPodAllowedHostPaths: /data\n").0,
            "holdfast.staticPodAllowedHostPaths"
        );
    }
}
