//! config: flags, the config file and the proxy environment (`HTTPS_PROXY`, ...).
//! Nothing else reads the environment.
//!
//! Precedence, as with the kubelet: a flag beats the config file, which beats the
//! defaults documented on [`Config`]'s fields.

mod board;
mod cluster;
mod duration;
mod file;
mod flags;
mod images;
mod keys;
mod maps;
mod names;
mod node;
mod pod_url;
mod pods;
mod proxy;
mod reader;
mod server;
mod shutdown;
mod taints;
mod tunnel;

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use k8s_openapi::api::core::v1::Taint;

pub use board::{
    known_boards, load_board, parse_board, BoardProfile, BUILTIN_BOARDS, DEFAULT_BOARD_DIR,
};
pub use cluster::{
    check_node_ip, DEFAULT_MAX_PODS, DEFAULT_NODE_LEASE_DURATION_SECONDS,
    DEFAULT_NODE_STATUS_REPORT_FREQUENCY, DEFAULT_NODE_STATUS_UPDATE_FREQUENCY, DEFAULT_PORT,
    DEFAULT_UPLINK_RETRY_MAX,
};
pub use duration::parse_duration;
pub use file::{parse_config, read_config_file, FileConfig};
pub use flags::{parse_flags, RunFlags, FLAGS, USAGE};
pub use images::{FileImages, ImageConfig};
pub use keys::KEYS;
pub use maps::{check_eviction, check_label, check_reserved};
pub use names::{check_dns1123_label, check_dns1123_subdomain};
pub use pod_url::{PodUrlKeys, StaticPodUrl, DEFAULT_HTTP_CHECK_FREQUENCY};
pub use pods::{PodKeys, PodSettings};
pub use proxy::settings as proxy_rules;
pub use server::{AuthorizationMode, OfflinePolicy, ServerConfig, DEFAULT_HEALTHZ_PORT};
pub use shutdown::{PriorityPeriod, ShutdownConfig, SYSTEM_CRITICAL_PRIORITY};
pub use taints::{check_taint, parse_taint};
pub use tunnel::{
    ServiceAccountToken, TunnelConfig, TunnelCredential, TunnelKeys, MIN_TUNNEL_KEEPALIVE,
};

const DEFAULT_ROOT_DIR: &str = "/var/lib/holdfast";
const DEFAULT_STATIC_POD_PATH: &str = "/etc/kubernetes/manifests";
const DEFAULT_CGROUP_ROOT: &str = "/holdfast";
/// Where Linux keeps the kernel's host name; the same value gethostname(2) returns.
const HOSTNAME_FILE: &str = "/proc/sys/kernel/hostname";

/// Everything `holdfast run` needs to know, after the file and the flags are merged.
#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    /// `--root-dir`, default `/var/lib/holdfast`.
    pub root_dir: PathBuf,
    /// `staticPodPath` / `--pod-manifest-path`, default `/etc/kubernetes/manifests`.
    pub static_pod_path: PathBuf,
    /// `--hostname-override`, else the machine's hostname, lowercased.
    pub node_name: String,
    /// `fileCheckFrequency`, default 20 s.
    pub file_check_frequency: Duration,
    /// `staticPodURL`, `staticPodURLHeader` and `httpCheckFrequency`: the static pods
    /// fetched from a URL; `None` (off) unless a URL is set.
    pub static_pod_url: Option<StaticPodUrl>,
    /// `syncFrequency`, default 1 min.
    pub sync_frequency: Duration,
    /// `containerLogMaxSize`, default 10Mi.
    pub container_log_max_size: u64,
    /// `containerLogMaxFiles`, default 5.
    pub container_log_max_files: u32,
    /// `cgroupRoot`: the cgroup under which every container's cgroup is made,
    /// default `/holdfast`; `delegated` until the agent resolves it to
    /// `<its service's cgroup>/pods` (see [`crate::runtime::delegation`]).
    pub cgroup_root: String,
    /// holdfast's own keys (the `holdfast:` section of the file).
    pub crash_loop: BackoffConfig,
    /// `--v`: log verbosity (0 = info, 2+ = debug, 4+ = trace); `RUST_LOG` wins if set.
    pub verbosity: Option<u8>,
    /// `systemReserved` / `--system-reserved`: resource → quantity, checked at load.
    pub system_reserved: BTreeMap<String, String>,
    /// `kubeReserved` / `--kube-reserved`.
    pub kube_reserved: BTreeMap<String, String>,
    /// `evictionHard` / `--eviction-hard`: signal → quantity or percentage; empty by
    /// default.
    pub eviction_hard: BTreeMap<String, String>,
    /// `holdfast.nodeLabels` / `--node-labels`.
    pub node_labels: BTreeMap<String, String>,
    /// `holdfast.board` / `--board`: the board profile that filled in the gaps.
    pub board: Option<String>,
    /// `--kubeconfig` / `holdfast.kubeconfig`: how to reach the apiserver; `None` runs
    /// standalone.
    pub kubeconfig: Option<PathBuf>,
    /// `--bootstrap-kubeconfig` / `holdfast.bootstrapKubeconfig`: asks the cluster for
    /// the node's client certificate (a `kubernetes.io/kube-apiserver-client-kubelet`
    /// CSR) when the kubeconfig is missing or its certificate is unusable.
    pub bootstrap_kubeconfig: Option<PathBuf>,
    /// `holdfast.apiservers`: more apiserver URLs, used after the kubeconfig's server
    /// with its credentials and CA when the one in use fails (see `kube::endpoints`).
    pub apiservers: Vec<String>,
    /// `rotateCertificates`: asks for a new client certificate before the current one
    /// expires. Default true with a bootstrap kubeconfig (as kubeadm sets it), else false
    /// (the kubelet's default).
    pub rotate_certificates: bool,
    /// `--node-ip`: the node's InternalIP; `None` picks the default route's address.
    pub node_ip: Option<IpAddr>,
    /// `--register-with-taints` / `registerWithTaints`: taints the Node is created with.
    pub register_with_taints: Vec<Taint>,
    /// `nodeStatusUpdateFrequency`, default 10 s: how often node status is computed
    /// (and the lease renewed).
    pub node_status_update_frequency: Duration,
    /// `nodeStatusReportFrequency`, default 5 min (or `nodeStatusUpdateFrequency` if
    /// only that is set): how often an unchanged node status is still sent.
    pub node_status_report_frequency: Duration,
    /// `nodeLeaseDurationSeconds`, default 40.
    pub node_lease_duration_seconds: i32,
    /// `port`, default 10250: the kubelet API port the node advertises.
    pub port: u16,
    /// `maxPods`, default 110.
    pub max_pods: u32,
    /// `uplinkRetryMax` / `--uplink-retry-max`, default 5 min: the longest wait between
    /// two probes while the apiserver cannot be reached. Probes go once per
    /// `nodeStatusUpdateFrequency` (at a random phase), so only a shorter value changes
    /// anything.
    pub uplink_retry_max: Duration,
    /// Image GC, pulls, registries and credentials.
    pub images: ImageConfig,
    /// Pods' sandboxes: networking, resources, security, eviction.
    pub pods: PodSettings,
    /// The kubelet API: listen addresses, certificates, authentication.
    pub server: ServerConfig,
    /// `holdfast.tunnel`: the konnectivity agent; `None` (off) unless servers are set.
    pub tunnel: Option<TunnelConfig>,
    /// The graceful node shutdown; off unless a grace period is set.
    pub shutdown: ShutdownConfig,
    /// `holdfast.proxy`, else `HTTPS_PROXY`, `HTTP_PROXY` and `NO_PROXY`: the HTTP
    /// proxy of every connection out (apiserver, registries, konnectivity servers);
    /// none by default.
    pub proxy: crate::proxy::Proxies,
}

/// Restart back-off: `initial` doubling to `max`, forgotten after `reset` of clean running.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BackoffConfig {
    pub initial: Duration,
    pub max: Duration,
    pub reset: Duration,
}

impl Default for BackoffConfig {
    fn default() -> Self {
        BackoffConfig {
            initial: Duration::from_secs(10),
            max: Duration::from_secs(300),
            reset: Duration::from_secs(600),
        }
    }
}

impl Config {
    /// Every setting at its default, for the given node.
    pub fn with_defaults(node_name: String) -> Config {
        Config {
            root_dir: PathBuf::from(DEFAULT_ROOT_DIR),
            static_pod_path: PathBuf::from(DEFAULT_STATIC_POD_PATH),
            node_name,
            file_check_frequency: Duration::from_secs(20),
            static_pod_url: None,
            sync_frequency: Duration::from_secs(60),
            container_log_max_size: 10 * 1024 * 1024,
            container_log_max_files: 5,
            cgroup_root: DEFAULT_CGROUP_ROOT.into(),
            crash_loop: BackoffConfig::default(),
            verbosity: None,
            system_reserved: BTreeMap::new(),
            kube_reserved: BTreeMap::new(),
            eviction_hard: BTreeMap::new(),
            node_labels: BTreeMap::new(),
            board: None,
            kubeconfig: None,
            bootstrap_kubeconfig: None,
            apiservers: Vec::new(),
            rotate_certificates: false,
            node_ip: None,
            register_with_taints: Vec::new(),
            node_status_update_frequency: DEFAULT_NODE_STATUS_UPDATE_FREQUENCY,
            node_status_report_frequency: DEFAULT_NODE_STATUS_REPORT_FREQUENCY,
            node_lease_duration_seconds: DEFAULT_NODE_LEASE_DURATION_SECONDS,
            port: DEFAULT_PORT,
            max_pods: DEFAULT_MAX_PODS,
            uplink_retry_max: DEFAULT_UPLINK_RETRY_MAX,
            images: ImageConfig::merge(
                &FileImages::default(),
                Path::new(DEFAULT_ROOT_DIR),
                images::home_dir().as_deref(),
                std::env::current_dir().ok().as_deref(),
            ),
            pods: PodSettings::default(),
            server: ServerConfig::default(),
            tunnel: None,
            shutdown: ShutdownConfig::default(),
            proxy: crate::proxy::Proxies::default(),
        }
    }
}

/// Parses `holdfast run`'s arguments (those after `run`), reads the config file they
/// name and logs a warning for each ignored key. Warnings logged before the logger is
/// set up are lost: a caller that sets the log level from [`Config::verbosity`] should
/// use [`load_run_args`] and log the warnings itself.
pub fn parse_run_args(args: &[String]) -> Result<Config, ConfigError> {
    let (config, warnings) = load_run_args(args)?;
    for warning in warnings {
        log::warn!("{warning}");
    }
    Ok(config)
}

/// Like [`parse_run_args`], returning the warnings (unknown config keys) to log.
pub fn load_run_args(args: &[String]) -> Result<(Config, Vec<String>), ConfigError> {
    load(&parse_flags(args)?)
}

/// Merges the flags, the config file they name and the defaults, and settles the node
/// name. The root dir is made if missing and resolved (see
/// [`crate::runtime::root_dir::resolve`]). Returns the warnings to log.
pub fn load(flags: &RunFlags) -> Result<(Config, Vec<String>), ConfigError> {
    let (file, mut warnings) = match &flags.config {
        Some(path) => read_config_file(path)?,
        None => (FileConfig::default(), Vec::new()),
    };
    let file = with_board(flags, file, &mut warnings)?;
    let mut config = merge(flags, &file, machine_hostname)?;
    config.root_dir = crate::runtime::root_dir::resolve(&config.root_dir).map_err(|source| {
        ConfigError::RootDir {
            path: config.root_dir.clone(),
            source,
        }
    })?;
    Ok((config, warnings))
}

/// The file's settings with the gaps filled from the board profile the flags or the
/// file pick, if any.
fn with_board(
    flags: &RunFlags,
    file: FileConfig,
    warnings: &mut Vec<String>,
) -> Result<FileConfig, ConfigError> {
    let Some(name) = flags.board.as_ref().or(file.board.as_ref()).cloned() else {
        return Ok(file);
    };
    let dir = flags
        .board_dir
        .clone()
        .or_else(|| file.board_dir.clone())
        .unwrap_or_else(|| PathBuf::from(DEFAULT_BOARD_DIR));
    let (profile, profile_warnings) = load_board(&name, &dir)?;
    warnings.extend(profile_warnings);
    let mut merged = board::fill_from_profile(file, profile.config);
    merged.board = Some(name);
    Ok(merged)
}

fn merge(
    flags: &RunFlags,
    file: &FileConfig,
    hostname: impl FnOnce() -> Result<String, ConfigError>,
) -> Result<Config, ConfigError> {
    let mut config = Config::with_defaults(node_name(flags, file, hostname)?);
    merge_local(&mut config, flags, file)?;
    config.verbosity = flags.verbosity;
    merge_cluster(&mut config, flags, file);
    config.images = ImageConfig::merge(
        &file.images,
        &config.root_dir,
        images::home_dir().as_deref(),
        std::env::current_dir().ok().as_deref(),
    );
    config.pods = file.pods.settings();
    file.server.apply(&mut config.server);
    config.tunnel = file
        .tunnel
        .settings(flags.config.as_deref().unwrap_or(Path::new("")))?;
    config.shutdown = file
        .shutdown
        .settings(flags.config.as_deref().unwrap_or(Path::new("")))?;
    config.proxy = proxy::settings(file.proxy.as_ref())?;
    Ok(config)
}

/// The node's name: `--hostname-override`, the file's, or the machine's hostname,
/// lower-cased and checked as a DNS subdomain.
fn node_name(
    flags: &RunFlags,
    file: &FileConfig,
    hostname: impl FnOnce() -> Result<String, ConfigError>,
) -> Result<String, ConfigError> {
    let (raw_name, origin) = match (&flags.hostname_override, &file.hostname_override) {
        (Some(name), _) => (name.clone(), "--hostname-override"),
        (None, Some(name)) => (name.clone(), "holdfast.hostnameOverride"),
        (None, None) => (hostname()?, "the machine's hostname"),
    };
    let node_name = raw_name.trim().to_lowercase();
    check_dns1123_subdomain(&node_name).map_err(|reason| ConfigError::NodeName {
        name: node_name.clone(),
        origin,
        reason,
    })?;
    Ok(node_name)
}

/// What the node keeps to itself: its directories, sync and log settings, cgroup root
/// and crash-loop back-off.
fn merge_local(
    config: &mut Config,
    flags: &RunFlags,
    file: &FileConfig,
) -> Result<(), ConfigError> {
    let pick_path = |flag: &Option<PathBuf>, from_file: &Option<PathBuf>, default: &mut PathBuf| {
        if let Some(p) = flag.as_ref().or(from_file.as_ref()) {
            *default = p.clone();
        }
    };
    pick_path(&flags.root_dir, &file.root_dir, &mut config.root_dir);
    pick_path(
        &flags.pod_manifest_path,
        &file.static_pod_path,
        &mut config.static_pod_path,
    );
    if let Some(d) = file.file_check_frequency {
        config.file_check_frequency = d;
    }
    config.static_pod_url = file.pod_url.settings();
    if let Some(d) = file.sync_frequency {
        config.sync_frequency = d;
    }
    if let Some(n) = file.container_log_max_size {
        config.container_log_max_size = n;
    }
    if let Some(n) = file.container_log_max_files {
        config.container_log_max_files = n;
    }
    if let Some(root) = &file.cgroup_root {
        config.cgroup_root = root.clone();
    }
    if let Some(d) = file.crash_loop_initial {
        config.crash_loop.initial = d;
    }
    if let Some(d) = file.crash_loop_max {
        config.crash_loop.max = d;
    }
    if let Some(d) = file.crash_loop_reset {
        config.crash_loop.reset = d;
    }
    // Checked again after the merge: one of the two may be a default.
    if config.crash_loop.initial > config.crash_loop.max {
        return Err(ConfigError::Key {
            path: flags.config.clone().unwrap_or_default(),
            key: "holdfast.crashLoopBackOffInitial".into(),
            reason: format!(
                "must not exceed holdfast.crashLoopBackOffMax ({:?} > {:?})",
                config.crash_loop.initial, config.crash_loop.max
            ),
        });
    }
    Ok(())
}

/// How the node joins its cluster: reservations, labels, credentials, taints, status
/// reports, its port and pod count.
fn merge_cluster(config: &mut Config, flags: &RunFlags, file: &FileConfig) {
    let map = |from_file: &BTreeMap<String, String>, from_flags: &BTreeMap<String, String>| {
        let mut m = from_file.clone();
        m.extend(from_flags.iter().map(|(k, v)| (k.clone(), v.clone())));
        m
    };
    config.system_reserved = map(&file.system_reserved, &flags.system_reserved);
    config.kube_reserved = map(&file.kube_reserved, &flags.kube_reserved);
    config.eviction_hard = map(&file.eviction_hard, &flags.eviction_hard);
    config.node_labels = map(&file.node_labels, &flags.node_labels);
    config.board = flags.board.clone().or_else(|| file.board.clone());
    config.kubeconfig = flags.kubeconfig.clone().or_else(|| file.kubeconfig.clone());
    config.bootstrap_kubeconfig = flags
        .bootstrap_kubeconfig
        .clone()
        .or_else(|| file.bootstrap_kubeconfig.clone());
    config.apiservers = file.apiservers.clone().unwrap_or_default();
    config.rotate_certificates = file
        .rotate_certificates
        .unwrap_or(config.bootstrap_kubeconfig.is_some());
    config.node_ip = flags.node_ip;
    if let Some(taints) = flags
        .register_with_taints
        .as_ref()
        .or(file.register_with_taints.as_ref())
    {
        config.register_with_taints = taints.clone();
    }
    if let Some(d) = file.node_status_update_frequency {
        config.node_status_update_frequency = d;
    }
    config.node_status_report_frequency = cluster::report_frequency(file);
    if let Some(n) = file.node_lease_duration_seconds {
        config.node_lease_duration_seconds = n;
    }
    if let Some(n) = flags.port.or(file.port) {
        config.port = n;
    }
    if let Some(n) = file.max_pods {
        config.max_pods = n;
    }
    if let Some(d) = flags.uplink_retry_max.or(file.uplink_retry_max) {
        config.uplink_retry_max = d;
    }
}

fn machine_hostname() -> Result<String, ConfigError> {
    read_hostname(Path::new(HOSTNAME_FILE))
}

fn read_hostname(path: &Path) -> Result<String, ConfigError> {
    let raw = std::fs::read_to_string(path).map_err(|e| ConfigError::Hostname {
        reason: format!("read {}: {e}", path.display()),
    })?;
    let name = raw.trim();
    if name.is_empty() {
        return Err(ConfigError::Hostname {
            reason: "the machine's hostname is empty".into(),
        });
    }
    Ok(name.to_string())
}

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("config file {path}: {reason}")]
    File { path: PathBuf, reason: String },
    #[error("config file {path}: key {key}: {reason}")]
    Key {
        path: PathBuf,
        key: String,
        reason: String,
    },
    #[error("flag {flag}: {reason}")]
    Flag { flag: String, reason: String },
    #[error(
        "node name {name:?} (from {origin}): {reason}; set --hostname-override to a valid name"
    )]
    NodeName {
        name: String,
        origin: &'static str,
        reason: String,
    },
    #[error("cannot learn the node name: {reason}; set --hostname-override")]
    Hostname { reason: String },
    #[error(
        "unknown board {name:?}: known boards are {known} (built in, or <name>.yaml in {dir})"
    )]
    UnknownBoard {
        name: String,
        known: String,
        dir: PathBuf,
    },
    #[error("{0}")]
    Usage(String),
    /// An environment variable holdfast reads holds what it cannot use.
    #[error("{reason}")]
    Environment { reason: String },
    /// The root dir cannot be made, or resolved to the path the kernel names it by.
    #[error("root dir {}", path.display())]
    RootDir {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(a: &[&str]) -> Vec<String> {
        a.iter().map(|s| s.to_string()).collect()
    }

    fn no_hostname() -> Result<String, ConfigError> {
        panic!("the machine's hostname was consulted although a name was given")
    }

    fn temp_file(name: &str, text: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!(
            "holdfast-config-test-{}-{name}",
            std::process::id()
        ));
        std::fs::create_dir_all(&dir).expect("mkdir");
        let path = dir.join("config.yaml");
        std::fs::write(&path, text).expect("write");
        path
    }

    #[test]
    fn defaults() {
        let flags = parse_flags(&args(&["--hostname-override", "gw-1"])).expect("flags");
        let config = merge(&flags, &FileConfig::default(), no_hostname).expect("merge");
        assert_eq!(config, Config::with_defaults("gw-1".into()));
        assert_eq!(config.root_dir, PathBuf::from("/var/lib/holdfast"));
        assert_eq!(
            config.static_pod_path,
            PathBuf::from("/etc/kubernetes/manifests")
        );
        assert_eq!(config.file_check_frequency, Duration::from_secs(20));
        assert_eq!(config.sync_frequency, Duration::from_secs(60));
        assert_eq!(config.container_log_max_size, 10 * 1024 * 1024);
        assert_eq!(config.container_log_max_files, 5);
        assert_eq!(config.cgroup_root, "/holdfast");
        assert_eq!(config.crash_loop, BackoffConfig::default());
        assert_eq!(config.verbosity, None);
        assert_eq!(config.kubeconfig, None);
        assert_eq!(config.node_ip, None);
        assert!(config.register_with_taints.is_empty());
        assert_eq!(config.node_status_update_frequency, Duration::from_secs(10));
        assert_eq!(
            config.node_status_report_frequency,
            Duration::from_secs(300)
        );
        assert_eq!(config.node_lease_duration_seconds, 40);
        assert_eq!(config.port, 10250);
        assert_eq!(config.max_pods, 110);
    }

    #[test]
    fn flags_override_the_file() {
        let path = temp_file(
            "precedence",
            "staticPodPath: /from-file/manifests
syncFrequency: 30s
holdfast:
  rootDir: /from-file/root
  hostnameOverride: File-Name
  crashLoopBackOffInitial: 2s
",
        );
        let p = path.display().to_string();
        let (config, warnings) = load_run_args(&args(&[
            "--config",
            &p,
            "--root-dir=/from-flag/root",
            "--hostname-override",
            "Flag-Name",
            "-v",
            "2",
        ]))
        .expect("load");
        assert!(warnings.is_empty());
        assert_eq!(config.root_dir, PathBuf::from("/from-flag/root"));
        assert_eq!(config.node_name, "flag-name");
        assert_eq!(
            config.static_pod_path,
            PathBuf::from("/from-file/manifests")
        );
        assert_eq!(config.sync_frequency, Duration::from_secs(30));
        assert_eq!(config.crash_loop.initial, Duration::from_secs(2));
        assert_eq!(config.verbosity, Some(2));

        let (config, _) =
            load_run_args(&args(&["--config", &p, "--pod-manifest-path", "/m"])).expect("load");
        assert_eq!(config.static_pod_path, PathBuf::from("/m"));
        assert_eq!(config.root_dir, PathBuf::from("/from-file/root"));
        assert_eq!(config.node_name, "file-name");
        let _ = std::fs::remove_dir_all(path.parent().expect("parent"));
    }

    #[test]
    fn unknown_keys_come_back_as_warnings() {
        let path = temp_file(
            "warnings",
            "evictionSoft: {}
holdfast:
  hostnameOverride: gw
",
        );
        let p = path.display().to_string();
        let (config, warnings) = load_run_args(&args(&["--config", &p])).expect("load");
        assert_eq!(config.node_name, "gw");
        assert_eq!(warnings.len(), 1);
        assert!(warnings[0].contains("evictionSoft"), "{}", warnings[0]);
        assert!(parse_run_args(&args(&["--config", &p])).is_ok());
        let _ = std::fs::remove_dir_all(path.parent().expect("parent"));
    }

    #[test]
    fn missing_config_file_is_an_error() {
        match load_run_args(&args(&["--config", "/nonexistent/holdfast.yaml"])) {
            Err(ConfigError::File { path, reason }) => {
                assert_eq!(path, PathBuf::from("/nonexistent/holdfast.yaml"));
                assert!(reason.starts_with("read:"), "{reason}");
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn node_name_is_lowercased_and_validated() {
        let flags = RunFlags {
            hostname_override: Some("GW-1.Site".into()),
            ..RunFlags::default()
        };
        let config = merge(&flags, &FileConfig::default(), no_hostname).expect("merge");
        assert_eq!(config.node_name, "gw-1.site");

        let flags = RunFlags {
            hostname_override: Some("gw_1".into()),
            ..RunFlags::default()
        };
        match merge(&flags, &FileConfig::default(), no_hostname) {
            Err(e @ ConfigError::NodeName { .. }) => {
                let msg = e.to_string();
                assert!(msg.contains("\"gw_1\""), "{msg}");
                assert!(msg.contains("--hostname-override"), "{msg}");
                assert!(msg.contains("DNS-1123"), "{msg}");
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn machine_hostname_is_the_fallback() {
        let config = merge(&RunFlags::default(), &FileConfig::default(), || {
            Ok("Edge-Gateway\n".to_string())
        })
        .expect("merge");
        assert_eq!(config.node_name, "edge-gateway");
        assert!(matches!(
            read_hostname(Path::new("/nonexistent/hostname")),
            Err(ConfigError::Hostname { .. })
        ));
    }

    #[test]
    fn backoff_bounds_are_checked_after_merge() {
        let file = FileConfig {
            crash_loop_initial: Some(Duration::from_secs(600)),
            ..FileConfig::default()
        };
        let flags = RunFlags {
            hostname_override: Some("gw".into()),
            ..RunFlags::default()
        };
        match merge(&flags, &file, no_hostname) {
            Err(ConfigError::Key { key, .. }) => {
                assert_eq!(key, "holdfast.crashLoopBackOffInitial")
            }
            other => panic!("{other:?}"),
        }
    }
}
