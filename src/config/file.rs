//! The config file: a KubeletConfiguration-shaped YAML subset plus holdfast's own keys
//! under `holdfast:`. Read key by key from a mapping so that every error names its key;
//! unknown keys are warnings, because a kubelet config file carries many keys holdfast
//! has no use for.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use k8s_openapi::api::core::v1::Taint;
use serde_yaml::{Mapping, Value};

use super::images::FileImages;
use super::pods::PodKeys;
use super::reader::{type_name, Reader};
use super::server::ServerFileConfig;
use super::ConfigError;

const API_VERSION: &str = "kubelet.config.k8s.io/v1beta1";
const KIND: &str = "KubeletConfiguration";

/// What the file sets; `None` for keys it leaves out.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct FileConfig {
    pub static_pod_path: Option<PathBuf>,
    pub file_check_frequency: Option<Duration>,
    /// `staticPodURL`, `staticPodURLHeader`, `httpCheckFrequency`.
    pub pod_url: super::pod_url::PodUrlKeys,
    pub sync_frequency: Option<Duration>,
    pub container_log_max_size: Option<u64>,
    pub container_log_max_files: Option<u32>,
    pub cgroup_root: Option<String>,
    pub crash_loop_initial: Option<Duration>,
    pub crash_loop_max: Option<Duration>,
    pub crash_loop_reset: Option<Duration>,
    pub root_dir: Option<PathBuf>,
    pub hostname_override: Option<String>,
    /// `systemReserved`, `kubeReserved`: resource → quantity, each validated.
    pub system_reserved: BTreeMap<String, String>,
    pub kube_reserved: BTreeMap<String, String>,
    /// `evictionHard`: signal → quantity or percentage.
    pub eviction_hard: BTreeMap<String, String>,
    /// `holdfast.nodeLabels`.
    pub node_labels: BTreeMap<String, String>,
    /// `holdfast.board`, `holdfast.boardDir`.
    pub board: Option<String>,
    pub board_dir: Option<PathBuf>,
    /// `holdfast.kubeconfig`.
    pub kubeconfig: Option<PathBuf>,
    /// `holdfast.bootstrapKubeconfig`.
    pub bootstrap_kubeconfig: Option<PathBuf>,
    /// `holdfast.apiservers`: more apiserver URLs after the kubeconfig's server.
    pub apiservers: Option<Vec<String>>,
    /// `rotateCertificates`.
    pub rotate_certificates: Option<bool>,
    /// `registerWithTaints`; `None` when the file leaves it out, so a profile can fill it.
    pub register_with_taints: Option<Vec<Taint>>,
    /// `nodeStatusUpdateFrequency`, `nodeStatusReportFrequency`.
    pub node_status_update_frequency: Option<Duration>,
    pub node_status_report_frequency: Option<Duration>,
    /// `nodeLeaseDurationSeconds`.
    pub node_lease_duration_seconds: Option<i32>,
    /// `port`: the kubelet API port the node advertises.
    pub port: Option<u16>,
    /// `maxPods`.
    pub max_pods: Option<u32>,
    /// `uplinkRetryMax`: the longest wait between two tries to reach the apiserver
    /// (tries go every `nodeStatusUpdateFrequency` unless this is shorter).
    pub uplink_retry_max: Option<Duration>,
    /// Image GC, pulls, registries and credentials.
    pub images: FileImages,
    /// Pods' sandboxes: networking, resources, security, eviction.
    pub pods: PodKeys,
    /// The kubelet API's keys (`address`, `tlsCertFile`, `authentication`, ...).
    pub server: ServerFileConfig,
    /// `holdfast.tunnel.*`: the konnectivity agent.
    pub tunnel: super::tunnel::TunnelKeys,
    /// The graceful node shutdown: `shutdownGracePeriod*`, `holdfast.logindConfigDir`.
    pub shutdown: super::shutdown::ShutdownKeys,
    /// `holdfast.proxy.*`: the node's proxy rules, when the file has the section.
    pub proxy: Option<crate::proxy::Proxies>,
}

/// Reads and parses the config file at `path`; returns what it sets and a warning for
/// every key that is ignored.
pub fn read_config_file(path: &Path) -> Result<(FileConfig, Vec<String>), ConfigError> {
    let text =
        crate::yaml::read_bounded(path, crate::yaml::MAX_BYTES).map_err(|e| ConfigError::File {
            path: path.to_path_buf(),
            reason: format!("read: {e}"),
        })?;
    parse_config(path, &text)
}

/// Parses config file text; `path` names the file in errors and anchors relative paths.
pub fn parse_config(path: &Path, text: &str) -> Result<(FileConfig, Vec<String>), ConfigError> {
    // Nesting and aliases that would cost serde_yaml seconds or gigabytes are refused
    // by a look that costs one pass.
    crate::yaml::prescan(text).map_err(|reason| ConfigError::File {
        path: path.to_path_buf(),
        reason,
    })?;
    let value: Value = serde_yaml::from_str(text).map_err(|e| ConfigError::File {
        path: path.to_path_buf(),
        reason: format!("not valid YAML: {e}"),
    })?;
    let top = match value {
        Value::Null => Mapping::new(),
        Value::Mapping(m) => m,
        _ => {
            return Err(ConfigError::File {
                path: path.to_path_buf(),
                reason: "expected a mapping of keys at the top level".into(),
            })
        }
    };
    parse_mapping(path, &top, "")
}

/// Parses a config mapping; `prefix` is prepended to key names in errors and warnings,
/// for mappings nested in another file (a board profile's `config:`).
pub(super) fn parse_mapping(
    path: &Path,
    top: &Mapping,
    prefix: &str,
) -> Result<(FileConfig, Vec<String>), ConfigError> {
    let reader = Reader { path, prefix };
    // Relative paths in the file are relative to the file, as with the kubelet, so a
    // config file and its manifests can move together.
    let base = path.parent().unwrap_or(Path::new(""));
    let mut out = FileConfig::default();
    let mut warnings = Vec::new();
    for (key, value) in top {
        let key = reader.key_name(key, "")?;
        if !super::keys::known(&key) {
            warnings.push(reader.unknown(&key));
            continue;
        }
        match key.as_str() {
            "apiVersion" => {
                let v = reader.string(&key, value)?;
                if v != API_VERSION {
                    return Err(reader.err(&key, format!("expected {API_VERSION}, got {v:?}")));
                }
            }
            "kind" => {
                let v = reader.string(&key, value)?;
                if v != KIND {
                    return Err(reader.err(&key, format!("expected {KIND}, got {v:?}")));
                }
            }
            "staticPodPath" => {
                out.static_pod_path = Some(base.join(reader.path_value(&key, value)?));
            }
            "fileCheckFrequency" => {
                out.file_check_frequency = Some(reader.positive_duration(&key, value)?);
            }
            "syncFrequency" => out.sync_frequency = Some(reader.positive_duration(&key, value)?),
            "containerLogMaxSize" => {
                out.container_log_max_size = Some(reader.quantity(&key, value)?);
            }
            "containerLogMaxFiles" => {
                out.container_log_max_files = Some(reader.log_max_files(&key, value)?);
            }
            "cgroupRoot" => {
                let v = reader.string(&key, value)?;
                // `delegated`: the cgroup v2 subtree the service manager hands the agent.
                if !v.starts_with('/') && v != crate::runtime::delegation::DELEGATED {
                    return Err(reader.err(
                        &key,
                        format!(
                            "expected an absolute cgroup path like /holdfast, or delegated, \
                             got {v:?}"
                        ),
                    ));
                }
                out.cgroup_root = Some(v);
            }
            "holdfast" => {
                let section = match value {
                    Value::Mapping(m) => m,
                    Value::Null => continue,
                    other => {
                        return Err(reader.err(
                            &key,
                            format!("expected a mapping, got {}", type_name(other)),
                        ))
                    }
                };
                reader.holdfast_section(section, base, &mut out, &mut warnings)?;
            }
            "systemReserved" => out.system_reserved = reader.reserved(&key, value)?,
            "kubeReserved" => out.kube_reserved = reader.reserved(&key, value)?,
            "evictionHard" => out.eviction_hard = reader.eviction(&key, value)?,
            _ => {
                if !reader.cluster_key(&key, value, &mut out)?
                    && !reader.pod_url_key(&key, value, &mut out.pod_url)?
                    && !reader.shutdown_key(&key, value, &mut out.shutdown)?
                    && !reader.image_key(&key, value, &mut out.images)?
                    && !reader.pod_key(&key, value, &mut out.pods)?
                    && !reader.server_key(&key, value, base, &mut out.server)?
                {
                    warnings.push(reader.unknown(&key));
                }
            }
        }
    }
    if let (Some(initial), Some(max)) = (out.crash_loop_initial, out.crash_loop_max) {
        if initial > max {
            return Err(reader.err(
                "holdfast.crashLoopBackOffInitial",
                format!("must not exceed holdfast.crashLoopBackOffMax ({initial:?} > {max:?})"),
            ));
        }
    }
    super::images::check(&reader, &out.images)?;
    Ok((out, warnings))
}

impl Reader<'_> {
    fn holdfast_section(
        &self,
        section: &Mapping,
        base: &Path,
        out: &mut FileConfig,
        warnings: &mut Vec<String>,
    ) -> Result<(), ConfigError> {
        for (key, value) in section {
            let key = self.key_name(key, "holdfast.")?;
            if !super::keys::known(&key) {
                warnings.push(self.unknown(&key));
                continue;
            }
            match key.as_str() {
                "holdfast.crashLoopBackOffInitial" => {
                    out.crash_loop_initial = Some(self.positive_duration(&key, value)?);
                }
                "holdfast.crashLoopBackOffMax" => {
                    out.crash_loop_max = Some(self.positive_duration(&key, value)?);
                }
                "holdfast.crashLoopBackOffReset" => {
                    out.crash_loop_reset = Some(self.positive_duration(&key, value)?);
                }
                "holdfast.rootDir" => out.root_dir = Some(base.join(self.path_value(&key, value)?)),
                "holdfast.hostnameOverride" => {
                    let v = self.string(&key, value)?;
                    if v.trim().is_empty() {
                        return Err(
                            self.err(&key, "expected a node name, got an empty string".into())
                        );
                    }
                    out.hostname_override = Some(v);
                }
                "holdfast.nodeLabels" => out.node_labels = self.labels(&key, value)?,
                "holdfast.board" => {
                    let v = self.string(&key, value)?;
                    if v.trim().is_empty() {
                        return Err(
                            self.err(&key, "expected a board name, got an empty string".into())
                        );
                    }
                    out.board = Some(v);
                }
                "holdfast.boardDir" => {
                    out.board_dir = Some(base.join(self.path_value(&key, value)?));
                }
                "holdfast.kubeconfig" => {
                    out.kubeconfig = Some(base.join(self.path_value(&key, value)?));
                }
                "holdfast.bootstrapKubeconfig" => {
                    out.bootstrap_kubeconfig = Some(base.join(self.path_value(&key, value)?));
                }
                "holdfast.tunnel" => {
                    self.tunnel_section(&key, value, base, &mut out.tunnel, warnings)?;
                }
                "holdfast.proxy" => out.proxy = Some(self.proxy_section(&key, value, warnings)?),
                _ => {
                    if !self.image_holdfast_key(&key, value, base, &mut out.images)?
                        && !self.pod_holdfast_key(&key, value, base, &mut out.pods)?
                        && !self.server_holdfast_key(&key, value, &mut out.server)?
                        && !self.shutdown_key(&key, value, &mut out.shutdown)?
                        && !self.cluster_holdfast_key(&key, value, out)?
                    {
                        warnings.push(self.unknown(&key));
                    }
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<(FileConfig, Vec<String>), ConfigError> {
        parse_config(Path::new("/etc/holdfast/config.yaml"), text)
    }

    fn key_err(text: &str) -> (String, String) {
        match parse(text) {
            Err(ConfigError::Key { key, reason, .. }) => (key, reason),
            other => panic!("expected a key error, got {other:?}"),
        }
    }

    #[test]
    fn every_known_key() {
        let (cfg, warnings) = parse(
            "apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
staticPodPath: manifests
fileCheckFrequency: 5s
syncFrequency: 1m30s
containerLogMaxSize: 20Mi
containerLogMaxFiles: 3
cgroupRoot: /edge
holdfast:
  crashLoopBackOffInitial: 1s
  crashLoopBackOffMax: 1m0s
  crashLoopBackOffReset: 10m
  rootDir: /data/holdfast
  hostnameOverride: gw-7
",
        )
        .expect("parse");
        assert!(warnings.is_empty(), "{warnings:?}");
        assert_eq!(
            cfg,
            FileConfig {
                static_pod_path: Some(PathBuf::from("/etc/holdfast/manifests")),
                file_check_frequency: Some(Duration::from_secs(5)),
                sync_frequency: Some(Duration::from_secs(90)),
                container_log_max_size: Some(20 * 1024 * 1024),
                container_log_max_files: Some(3),
                cgroup_root: Some("/edge".into()),
                crash_loop_initial: Some(Duration::from_secs(1)),
                crash_loop_max: Some(Duration::from_secs(60)),
                crash_loop_reset: Some(Duration::from_secs(600)),
                root_dir: Some(PathBuf::from("/data/holdfast")),
                hostname_override: Some("gw-7".into()),
                ..FileConfig::default()
            }
        );
    }

    #[test]
    fn empty_file_sets_nothing() {
        assert_eq!(parse("").expect("parse"), (FileConfig::default(), vec![]));
        assert_eq!(
            parse("# only a comment\n").expect("parse").0,
            FileConfig::default()
        );
    }

    #[test]
    fn unknown_keys_warn() {
        let (cfg, warnings) =
            parse("evictionSoft: {}\nsyncFrequency: 10s\nholdfast:\n  colour: blue\n")
                .expect("parse");
        assert_eq!(cfg.sync_frequency, Some(Duration::from_secs(10)));
        assert_eq!(warnings.len(), 2, "{warnings:?}");
        assert!(
            warnings[0].contains("unknown key evictionSoft"),
            "{}",
            warnings[0]
        );
        assert!(
            warnings[1].contains("unknown key holdfast.colour"),
            "{}",
            warnings[1]
        );
    }

    #[test]
    fn type_errors_name_the_key() {
        let (key, reason) = key_err("fileCheckFrequency: 20\n");
        assert_eq!(key, "fileCheckFrequency");
        assert!(reason.contains("duration"), "{reason}");

        let (key, reason) = key_err("syncFrequency: soon\n");
        assert_eq!(key, "syncFrequency");
        assert!(reason.contains("\"soon\""), "{reason}");

        let (key, reason) = key_err("containerLogMaxFiles: 1\n");
        assert_eq!(key, "containerLogMaxFiles");
        assert!(reason.contains("at least 2"), "{reason}");

        let (key, _) = key_err("containerLogMaxFiles: three\n");
        assert_eq!(key, "containerLogMaxFiles");

        let (key, reason) = key_err("containerLogMaxSize: 10MB\n");
        assert_eq!(key, "containerLogMaxSize");
        assert!(reason.contains("MB"), "{reason}");

        let (key, reason) = key_err("staticPodPath: [a, b]\n");
        assert_eq!(key, "staticPodPath");
        assert!(reason.contains("expected a string, got list"), "{reason}");

        let (key, reason) = key_err("cgroupRoot: holdfast\n");
        assert_eq!(key, "cgroupRoot");
        assert!(reason.contains("or delegated"), "{reason}");
        let (cfg, _) = parse("cgroupRoot: delegated\n").expect("delegated");
        assert_eq!(cfg.cgroup_root.as_deref(), Some("delegated"));

        let (key, _) = key_err("holdfast:\n  crashLoopBackOffMax: 5\n");
        assert_eq!(key, "holdfast.crashLoopBackOffMax");

        let (key, _) = key_err("holdfast: 3\n");
        assert_eq!(key, "holdfast");

        let (key, reason) = key_err("kind: Pod\n");
        assert_eq!(key, "kind");
        assert!(reason.contains("KubeletConfiguration"), "{reason}");

        let (key, _) = key_err("apiVersion: v1\n");
        assert_eq!(key, "apiVersion");

        let (key, _) =
            key_err("holdfast:\n  crashLoopBackOffInitial: 10m\n  crashLoopBackOffMax: 1m\n");
        assert_eq!(key, "holdfast.crashLoopBackOffInitial");
    }

    #[test]
    fn log_size_as_a_plain_number() {
        let (cfg, _) = parse("containerLogMaxSize: 5000\n").expect("parse");
        assert_eq!(cfg.container_log_max_size, Some(5000));
    }

    #[test]
    fn bad_yaml_and_bad_shape() {
        match parse("syncFrequency: [1m\n") {
            Err(ConfigError::File { reason, .. }) => assert!(reason.contains("line"), "{reason}"),
            other => panic!("{other:?}"),
        }
        assert!(matches!(parse("- a\n- b\n"), Err(ConfigError::File { .. })));
    }

    #[test]
    fn deep_nesting_is_refused_at_once_naming_the_file_the_line_and_the_bound() {
        let text = format!(
            "syncFrequency: 1m\nnodeLabels:\n  a: {}\n",
            "[".repeat(60_000)
        );
        let started = std::time::Instant::now();
        let err = parse(&text).expect_err("60 000 open brackets");
        assert!(started.elapsed() < std::time::Duration::from_millis(200));
        let message = err.to_string();
        for part in [
            "/etc/holdfast/config.yaml",
            "nested deeper than 64 levels",
            "line 3",
        ] {
            assert!(message.contains(part), "{message}");
        }
        // Nesting a config file could really have still reads.
        let (c, _) = parse("syncFrequency: 1m\nholdfast:\n  nodeLabels: {a: b}\n").expect("config");
        assert_eq!(c.sync_frequency, Some(Duration::from_secs(60)));
        assert_eq!(c.node_labels.get("a").map(String::as_str), Some("b"));
    }

    #[test]
    fn a_file_over_the_bound_is_refused_naming_its_size() {
        let dir = std::env::temp_dir().join(format!("holdfast-config-size-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("mkdir");
        let path = dir.join("config.yaml");
        let mut text = String::from("syncFrequency: 1m\n");
        text.push_str(&format!(
            "# {}\n",
            "x".repeat(crate::yaml::MAX_BYTES as usize)
        ));
        std::fs::write(&path, &text).expect("write config");
        let result = read_config_file(&path);
        std::fs::write(&path, "syncFrequency: 1m\n").expect("write config");
        let small = read_config_file(&path);
        std::fs::remove_dir_all(&dir).expect("cleanup");
        let message = result.expect_err("over 1 MiB").to_string();
        let size = format!("{} bytes", text.len());
        for part in [
            path.display().to_string(),
            size,
            "1048576 bytes allowed".into(),
        ] {
            assert!(message.contains(&part), "{message} names {part}");
        }
        assert_eq!(
            small.expect("small config").0.sync_frequency,
            Some(Duration::from_secs(60))
        );
    }
}
