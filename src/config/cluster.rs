//! The config keys about membership in a cluster: how often node status is computed
//! and reported, the lease, the port and pod count the node advertises, and the taints
//! it registers with. Spelled as KubeletConfiguration spells them.

use std::net::IpAddr;
use std::time::Duration;

use serde_yaml::Value;

use super::file::FileConfig;
use super::reader::{short, Reader};
use super::ConfigError;

/// `nodeStatusUpdateFrequency` when the file leaves it out.
pub const DEFAULT_NODE_STATUS_UPDATE_FREQUENCY: Duration = Duration::from_secs(10);
/// `nodeStatusReportFrequency` when neither it nor `nodeStatusUpdateFrequency` is set.
pub const DEFAULT_NODE_STATUS_REPORT_FREQUENCY: Duration = Duration::from_secs(300);
/// `nodeLeaseDurationSeconds` when the file leaves it out.
pub const DEFAULT_NODE_LEASE_DURATION_SECONDS: i32 = 40;
/// `port` when the file leaves it out: the kubelet's.
pub const DEFAULT_PORT: u16 = 10250;
/// `uplinkRetryMax` when neither the file nor `--uplink-retry-max` sets it.
pub const DEFAULT_UPLINK_RETRY_MAX: Duration = Duration::from_secs(300);
/// `maxPods` when the file leaves it out.
pub const DEFAULT_MAX_PODS: u32 = 110;

impl Reader<'_> {
    /// Reads `key` into `out` if it is one of this module's keys; false if it is not.
    pub(super) fn cluster_key(
        &self,
        key: &str,
        value: &Value,
        out: &mut FileConfig,
    ) -> Result<bool, ConfigError> {
        match key {
            "nodeStatusUpdateFrequency" => {
                out.node_status_update_frequency = Some(self.positive_duration(key, value)?);
            }
            "nodeStatusReportFrequency" => {
                out.node_status_report_frequency = Some(self.positive_duration(key, value)?);
            }
            "nodeLeaseDurationSeconds" => {
                let n = self.integer(key, value, 1, i64::from(i32::MAX))?;
                out.node_lease_duration_seconds = i32::try_from(n).ok();
            }
            "port" => {
                let n = self.integer(key, value, 1, i64::from(u16::MAX))?;
                out.port = u16::try_from(n).ok();
            }
            "maxPods" => {
                let n = self.integer(key, value, 1, i64::from(u32::MAX))?;
                out.max_pods = u32::try_from(n).ok();
            }
            "uplinkRetryMax" => {
                out.uplink_retry_max = Some(self.positive_duration(key, value)?);
            }
            "registerWithTaints" => out.register_with_taints = Some(self.taints(key, value)?),
            "rotateCertificates" => match value {
                Value::Bool(b) => out.rotate_certificates = Some(*b),
                other => {
                    return Err(
                        self.err(key, format!("expected true or false, got {}", short(other)))
                    )
                }
            },
            _ => return Ok(false),
        }
        Ok(true)
    }

    /// Reads `key` into `out` if it is one of this module's `holdfast.` keys; false if
    /// it is not.
    pub(super) fn cluster_holdfast_key(
        &self,
        key: &str,
        value: &Value,
        out: &mut FileConfig,
    ) -> Result<bool, ConfigError> {
        if key != "holdfast.apiservers" {
            return Ok(false);
        }
        let Value::Sequence(items) = value else {
            return Err(self.err(
                key,
                format!("expected a list of https:// URLs, got {}", short(value)),
            ));
        };
        let mut urls = Vec::new();
        for item in items {
            let url = self.string(key, item)?;
            check_apiserver_url(&url).map_err(|reason| self.err(key, reason))?;
            urls.push(url);
        }
        out.apiservers = Some(urls);
        Ok(true)
    }

    fn integer(&self, key: &str, value: &Value, min: i64, max: i64) -> Result<i64, ConfigError> {
        match value {
            Value::Number(n) => match n.as_i64() {
                Some(n) if (min..=max).contains(&n) => Ok(n),
                _ => Err(self.err(
                    key,
                    format!("expected an integer from {min} to {max}, got {n}"),
                )),
            },
            other => Err(self.err(
                key,
                format!(
                    "expected an integer from {min} to {max}, got {}",
                    short(other)
                ),
            )),
        }
    }
}

/// `--node-ip`: an address the node can be reached at, as the kubelet accepts it.
/// Whether an interface holds it is not checked here (that needs the device).
pub fn check_node_ip(ip: IpAddr) -> Result<(), String> {
    let link_local = match ip {
        IpAddr::V4(v4) => v4.is_link_local(),
        IpAddr::V6(v6) => v6.is_unicast_link_local(),
    };
    let reason = if ip.is_unspecified() {
        "an all-zeros address"
    } else if ip.is_loopback() {
        "a loopback address"
    } else if ip.is_multicast() {
        "a multicast address"
    } else if link_local {
        "a link-local address"
    } else {
        return Ok(());
    };
    Err(format!(
        "{ip} is {reason}; the node IP must be reachable from the cluster"
    ))
}

/// An apiserver endpoint of `holdfast.apiservers`: `https://host[:port][/path]`. The
/// node's credentials go to it, so never plain http, and nothing in the URL (a user, a
/// query) that would change where or what they are sent with.
pub fn check_apiserver_url(url: &str) -> Result<(), String> {
    let Some(rest) = url.strip_prefix("https://") else {
        return Err(format!(
            "{url:?} is not an https:// URL (the node's credentials go to it)"
        ));
    };
    if let Some(c) = url.chars().find(|c| c.is_whitespace() || c.is_control()) {
        return Err(format!("{url:?} holds {c:?}"));
    }
    let authority = rest.split('/').next().unwrap_or_default();
    for (c, what) in [('@', "a user"), ('?', "a query"), ('#', "a fragment")] {
        if url.contains(c) {
            return Err(format!("{url:?} has {what}"));
        }
    }
    let (host, port) = match authority.strip_prefix('[') {
        Some(v6) => match v6.split_once(']') {
            Some((host, "")) => (host, None),
            Some((host, tail)) => match tail.strip_prefix(':') {
                Some(port) => (host, Some(port)),
                None => return Err(format!("{url:?}: {tail:?} after the host")),
            },
            None => return Err(format!("{url:?}: unclosed [ in the host")),
        },
        None => match authority.rsplit_once(':') {
            Some((host, port)) => (host, Some(port)),
            None => (authority, None),
        },
    };
    if host.is_empty() {
        return Err(format!("{url:?} has no host"));
    }
    if let Some(port) = port {
        if !matches!(port.parse::<u16>(), Ok(p) if p > 0) {
            return Err(format!("port {port:?} of {url:?} is not 1 to 65535"));
        }
    }
    Ok(())
}

/// `nodeStatusReportFrequency` after the merge: as the kubelet does for backward
/// compatibility, an explicit `nodeStatusUpdateFrequency` is also the default report
/// frequency.
pub(super) fn report_frequency(file: &FileConfig) -> Duration {
    file.node_status_report_frequency
        .or(file.node_status_update_frequency)
        .unwrap_or(DEFAULT_NODE_STATUS_REPORT_FREQUENCY)
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use std::path::PathBuf;

    use super::super::{load_run_args, parse_config};
    use super::*;
    use crate::testutil::TempDir;

    fn args(a: &[&str]) -> Vec<String> {
        a.iter().map(|s| s.to_string()).collect()
    }

    fn parse(text: &str) -> Result<FileConfig, ConfigError> {
        parse_config(Path::new("/etc/holdfast/config.yaml"), text).map(|(c, w)| {
            assert!(w.is_empty(), "{w:?}");
            c
        })
    }

    #[test]
    fn cluster_keys_parse() {
        let cfg = parse(
            "nodeStatusUpdateFrequency: 20s
nodeStatusReportFrequency: 10m
nodeLeaseDurationSeconds: 60
port: 10260
maxPods: 32
holdfast:
  kubeconfig: kubelet.conf
",
        )
        .expect("parse");
        assert_eq!(
            cfg.node_status_update_frequency,
            Some(Duration::from_secs(20))
        );
        assert_eq!(
            cfg.node_status_report_frequency,
            Some(Duration::from_secs(600))
        );
        assert_eq!(cfg.node_lease_duration_seconds, Some(60));
        assert_eq!(cfg.port, Some(10260));
        assert_eq!(cfg.max_pods, Some(32));
        assert_eq!(
            cfg.kubeconfig.as_deref(),
            Some(Path::new("/etc/holdfast/kubelet.conf"))
        );
    }

    #[test]
    fn apiservers_are_https_urls_with_nothing_that_redirects_the_credentials() {
        let cfg = parse(
            "holdfast:\n  apiservers: [\"https://10.0.0.2:6443\", \"https://[fd00::3]:6443/\", \
             \"https://cp.example/k8s/clusters/c-1\"]\n",
        )
        .expect("parse");
        assert_eq!(
            cfg.apiservers.as_deref(),
            Some(
                &[
                    "https://10.0.0.2:6443".to_string(),
                    "https://[fd00::3]:6443/".to_string(),
                    "https://cp.example/k8s/clusters/c-1".to_string(),
                ][..]
            )
        );
        for (list, want) in [
            ("[\"http://10.0.0.2:6443\"]", "not an https:// URL"),
            ("[\"10.0.0.2:6443\"]", "not an https:// URL"),
            ("[\"https://:6443\"]", "no host"),
            ("[\"https://10.0.0.2:0\"]", "not 1 to 65535"),
            ("[\"https://10.0.0.2:99999\"]", "not 1 to 65535"),
            ("[\"https://u:p@10.0.0.2:6443\"]", "a user"),
            ("[\"https://10.0.0.2:6443/?x=1\"]", "a query"),
            ("[\"https://[fd00::3]x\"]", "after the host"),
            ("[\"https://10.0.0.2 :6443\"]", "holds ' '"),
            ("https://10.0.0.2:6443", "expected a list"),
        ] {
            match parse(&format!("holdfast:\n  apiservers: {list}\n")) {
                Err(ConfigError::Key { key, reason, .. }) => {
                    assert_eq!(key, "holdfast.apiservers", "{list}");
                    assert!(reason.contains(want), "{list}: {reason}");
                }
                other => panic!("{list}: {other:?}"),
            }
        }
    }

    #[test]
    fn out_of_range_values_name_the_key() {
        for (text, want) in [
            ("port: 0\n", "port"),
            ("port: 70000\n", "port"),
            ("port: \"10250\"\n", "port"),
            ("maxPods: -1\n", "maxPods"),
            ("maxPods: 0\n", "maxPods"),
            ("maxPods: 1.5\n", "maxPods"),
            ("nodeLeaseDurationSeconds: 0\n", "nodeLeaseDurationSeconds"),
            (
                "nodeLeaseDurationSeconds: 3000000000\n",
                "nodeLeaseDurationSeconds",
            ),
            (
                "nodeStatusUpdateFrequency: 0s\n",
                "nodeStatusUpdateFrequency",
            ),
            (
                "nodeStatusReportFrequency: often\n",
                "nodeStatusReportFrequency",
            ),
            ("holdfast: {kubeconfig: \"\"}\n", "holdfast.kubeconfig"),
        ] {
            match parse(text) {
                Err(ConfigError::Key { key, .. }) => assert_eq!(key, want, "{text}"),
                other => panic!("{text}: {other:?}"),
            }
        }
    }

    #[test]
    fn report_frequency_follows_an_explicit_update_frequency() {
        let mut file = FileConfig::default();
        assert_eq!(report_frequency(&file), Duration::from_secs(300));
        file.node_status_update_frequency = Some(Duration::from_secs(4));
        assert_eq!(report_frequency(&file), Duration::from_secs(4));
        file.node_status_report_frequency = Some(Duration::from_secs(60));
        assert_eq!(report_frequency(&file), Duration::from_secs(60));
    }

    #[test]
    fn node_ip_rules() {
        for ok in ["192.168.50.10", "10.0.0.1", "2001:db8::1", "fd00::5"] {
            let ip: IpAddr = ok.parse().expect("ip");
            assert!(check_node_ip(ip).is_ok(), "{ok}");
        }
        for (bad, why) in [
            ("0.0.0.0", "all-zeros"),
            ("::", "all-zeros"),
            ("127.0.0.1", "loopback"),
            ("::1", "loopback"),
            ("224.0.0.1", "multicast"),
            ("ff02::1", "multicast"),
            ("169.254.1.1", "link-local"),
            ("fe80::1", "link-local"),
        ] {
            let ip: IpAddr = bad.parse().expect("ip");
            let msg = check_node_ip(ip).err().unwrap_or_default();
            assert!(msg.contains(why), "{bad}: {msg}");
        }
    }

    #[test]
    fn uplink_retry_max_from_the_file_or_the_flag() {
        let tmp = TempDir::new("uplink-retry");
        let path = tmp.0.join("config.yaml");
        std::fs::write(
            &path,
            "uplinkRetryMax: 90s\nholdfast: {hostnameOverride: gw}\n",
        )
        .expect("write");
        let p = path.display().to_string();
        let (config, _) = load_run_args(&args(&["--hostname-override=gw"])).expect("load");
        assert_eq!(config.uplink_retry_max, Duration::from_secs(300));
        let (config, warnings) = load_run_args(&args(&["--config", &p])).expect("load");
        assert!(warnings.is_empty(), "{warnings:?}");
        assert_eq!(config.uplink_retry_max, Duration::from_secs(90));
        let (config, _) =
            load_run_args(&args(&["--config", &p, "--uplink-retry-max=2m"])).expect("load");
        assert_eq!(config.uplink_retry_max, Duration::from_secs(120));
        for bad in ["--uplink-retry-max=0s", "--uplink-retry-max=soon"] {
            match load_run_args(&args(&["--hostname-override=gw", bad])) {
                Err(ConfigError::Flag { flag, .. }) => assert_eq!(flag, "--uplink-retry-max"),
                other => panic!("{bad}: {other:?}"),
            }
        }
        match parse("uplinkRetryMax: 0s\n") {
            Err(ConfigError::Key { key, .. }) => assert_eq!(key, "uplinkRetryMax"),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn bootstrap_kubeconfig_and_rotation() {
        let tmp = TempDir::new("cluster-bootstrap");
        let path = tmp.0.join("config.yaml");
        std::fs::write(&path, "holdfast:\n  bootstrapKubeconfig: bootstrap.conf\n").expect("write");
        let p = path.display().to_string();
        let (config, warnings) =
            load_run_args(&args(&["--hostname-override=gw", "--config", &p])).expect("load");
        assert!(warnings.is_empty(), "{warnings:?}");
        assert_eq!(
            config.bootstrap_kubeconfig,
            Some(tmp.0.join("bootstrap.conf"))
        );
        assert!(
            config.rotate_certificates,
            "on by default when bootstrapping"
        );

        let (config, _) = load_run_args(&args(&[
            "--hostname-override=gw",
            "--config",
            &p,
            "--bootstrap-kubeconfig=/b.conf",
        ]))
        .expect("load");
        assert_eq!(config.bootstrap_kubeconfig, Some(PathBuf::from("/b.conf")));

        std::fs::write(
            &path,
            "rotateCertificates: false\nholdfast: {bootstrapKubeconfig: b}\n",
        )
        .expect("write");
        let (config, _) =
            load_run_args(&args(&["--hostname-override=gw", "--config", &p])).expect("load");
        assert!(!config.rotate_certificates);

        let (config, _) = load_run_args(&args(&["--hostname-override=gw"])).expect("load");
        assert!(
            !config.rotate_certificates,
            "off without a bootstrap, as the kubelet"
        );
        assert_eq!(config.bootstrap_kubeconfig, None);

        match parse("rotateCertificates: yes please\n") {
            Err(ConfigError::Key { key, .. }) => assert_eq!(key, "rotateCertificates"),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn cluster_settings_merge() {
        let tmp = TempDir::new("cluster-merge");
        let path = tmp.0.join("config.yaml");
        std::fs::write(
            &path,
            "nodeStatusUpdateFrequency: 20s
nodeLeaseDurationSeconds: 60
port: 10260
maxPods: 16
registerWithTaints: [{key: example.com/edge, effect: NoSchedule}]
holdfast:
  hostnameOverride: gw
  kubeconfig: kubelet.conf
",
        )
        .expect("write");
        let p = path.display().to_string();
        let dir = tmp.0.clone();
        let (config, warnings) = load_run_args(&args(&["--config", &p])).expect("load");
        assert!(warnings.is_empty(), "{warnings:?}");
        assert_eq!(config.kubeconfig, Some(dir.join("kubelet.conf")));
        assert_eq!(config.node_status_update_frequency, Duration::from_secs(20));
        // An explicit update frequency is also the report frequency, as with the kubelet.
        assert_eq!(config.node_status_report_frequency, Duration::from_secs(20));
        assert_eq!(config.node_lease_duration_seconds, 60);
        assert_eq!(config.port, 10260);
        assert_eq!(config.max_pods, 16);
        assert_eq!(config.register_with_taints.len(), 1);
        assert_eq!(config.register_with_taints[0].key, "example.com/edge");

        let (config, _) = load_run_args(&args(&[
            "--config",
            &p,
            "--kubeconfig",
            "/k.conf",
            "--node-ip=10.1.2.3",
            "--register-with-taints=a=b:NoExecute,c:PreferNoSchedule",
        ]))
        .expect("load");
        assert_eq!(config.kubeconfig, Some(PathBuf::from("/k.conf")));
        assert_eq!(config.node_ip, Some(IpAddr::from([10, 1, 2, 3])));
        let keys: Vec<&str> = config
            .register_with_taints
            .iter()
            .map(|t| t.key.as_str())
            .collect();
        assert_eq!(keys, ["a", "c"]);
    }
}
