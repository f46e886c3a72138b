//! config: flags and the config file. Nothing else reads the environment.

use std::path::PathBuf;
use std::time::Duration;

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
    /// `syncFrequency`, default 1 min.
    pub sync_frequency: Duration,
    /// `containerLogMaxSize`, default 10Mi.
    pub container_log_max_size: u64,
    /// `containerLogMaxFiles`, default 5.
    pub container_log_max_files: u32,
    /// `cgroupRoot`: the cgroup under which every container's cgroup is made,
    /// default `/holdfast`.
    pub cgroup_root: String,
    /// holdfast's own keys (the `holdfast:` section of the file).
    pub crash_loop: BackoffConfig,
    /// `--v`: log verbosity (0 = info, 2+ = debug, 4+ = trace); `RUST_LOG` wins if set.
    pub verbosity: Option<u8>,
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
    #[error("{0}")]
    Usage(String),
}
