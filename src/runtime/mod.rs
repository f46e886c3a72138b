//! runtime: containers on youki's libcontainer. Knows nothing of the apiserver.
//!
//! The agent never calls libcontainer itself: it forks, and the agent is a
//! multi-threaded tokio process. Each container gets a shim — the holdfast binary
//! re-executed as `holdfast shim` — which is single-threaded when it creates the
//! container, stays its parent (so it alone can reap it and learn its exit code),
//! writes its CRI log and, when it exits, an exit record. The shim is detached from the
//! agent, so containers and their logs outlive an agent restart or upgrade.
//!
//! Under `<root-dir>`, on the disk, what a power cut must not take:
//! - `containers/<id>/`: `upper/`, `work/` (what the container writes) and `exit.json`.
//!
//! and on a tmpfs the runtime mounts at `<root-dir>/boot`, what lasts one boot (so the
//! flash sees none of a container's start and stop but its upper dir and exit record):
//! - `boot/containers/<id>/`: `shim.json` (what to run), `bundle/` (OCI bundle, rootfs
//!   is an overlay mount), `shim.log`, `started.json`, `failed.json`, and while it runs
//!   `attach.sock` (see [`attach`]).
//! - `boot/exits/<id>`: an empty file the shim creates after `exit.json`, to wake the
//!   agent.
//! - `boot/run/`: libcontainer's state root.
//!
//! Containers an older holdfast started keep all of it in `containers/<id>/`, their
//! libcontainer state in `run/` and their exit files in `exits/`: they are read there.
//!
//! How a container runs:
//! - `start` builds the OCI spec ([`spec`], a pure function of the pod and image),
//!   writes `shim.json` and `bundle/config.json`, and runs `holdfast shim start <dir>`,
//!   which calls `setsid`, forks the shim and exits at once: the agent reaps it, so no
//!   zombie, and the real shim is orphaned, so the agent's death (even SIGKILL) does
//!   not reach it. `start` then waits on the shim's readiness pipe, which says when
//!   `started.json` or `failed.json` is in place, or that the shim died first.
//! - The shim (see [`shim`]) mounts the rootfs — an overlay of the image layers, the
//!   upper and work directories in the container directory — creates the container
//!   with libcontainer (not `as_sibling`, so the init is the shim's child), copies the
//!   container's stdout and stderr (or its terminal, with `tty`) into the CRI log
//!   (rotating it) and to attached clients, reaps the init, reads
//!   the cgroup's OOM counter, writes `exit.json`, creates `exits/<id>`, then has
//!   libcontainer delete the container (its cgroup and state) and unmounts the rootfs.
//! - The agent signals the init directly (`kill`), after checking by its start time in
//!   `/proc/<pid>/stat` that the pid still names it. `state` reads the records and
//!   `/proc`; the boot id in each record tells a pid of this boot from a stale one.
//! - `remove` cleans up what a dead shim left (libcontainer state, through
//!   `holdfast shim delete`, never in the agent; cgroup directories; mounts) and the
//!   container directory. The CRI log is not the runtime's to delete.
//! - `watch_exits` turns `exits/<id>` files into ids on a channel (inotify).
//!
//! A container's init is PID 1 of its own PID namespace, so the kernel drops signals
//! for which it installed no handler (SIGTERM to a bare `sleep`); SIGKILL always works
//! and takes the whole namespace with it.

use std::path::PathBuf;

pub mod adoption;
pub mod attach;
mod cgroup;
mod command;
pub mod delegation;
mod effective;
pub mod exec;
mod exec_seccomp;
mod exec_shim;
mod exits;
mod libcontainer_runtime;
pub mod log_read;
mod logs;
mod records;
mod remove;
mod reset;
pub mod root_dir;
mod rootfs;
mod running;
pub mod sandbox;
pub mod seccomp;
pub mod security;
mod shim;
pub mod spec;
mod supervise;
pub mod sysctl;
pub mod termination;
mod unix_socket;
mod user;

pub use command::{expand, expanded_len, MAX_ARG_STRLEN};
pub use libcontainer_runtime::{LibcontainerRuntime, DEFAULT_LOG_MAX_FILES, DEFAULT_LOG_MAX_SIZE};
pub use logs::{pod_log_dir, rotated_files as rotated_log_files};
pub use records::boot_id;
pub use remove::{remove_unmounted, RemoveError};
pub use reset::remove_all;
pub use rootfs::{bind_nosuid_nodev, is_mount_point, mounts_under, resolved, unmount_all_under};
pub use sandbox::{BindMount, NamespaceKind, PodSandbox};
pub use shim::shim_main;

use k8s_openapi::api::core::v1::{Container, Pod};
use serde::{Deserialize, Serialize};

use crate::time::Timestamp;

/// A container's identity: derived from the pod UID, container name and restart count,
/// so a restarted agent recognises its own containers.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct ContainerId(pub String);

impl ContainerId {
    /// sha256 of `<pod uid>/<container name>/<restart count>`, in hex.
    pub fn derive(pod_uid: &str, container: &str, restart_count: u32) -> Self {
        use sha2::{Digest, Sha256};
        let mut h = Sha256::new();
        h.update(pod_uid.as_bytes());
        h.update(b"/");
        h.update(container.as_bytes());
        h.update(b"/");
        h.update(restart_count.to_string().as_bytes());
        let digest = h.finalize();
        let mut s = String::with_capacity(64);
        for b in digest {
            s.push_str(&format!("{b:02x}"));
        }
        ContainerId(s)
    }

    /// The `containerID` Kubernetes shows: `libcontainer://<id>`.
    pub fn uri(&self) -> String {
        format!("libcontainer://{}", self.0)
    }
}

impl std::fmt::Display for ContainerId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// What the runtime knows of one container.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum ContainerState {
    /// Being created by its shim; not yet running.
    Created,
    Running {
        pid: i32,
        started_at: Timestamp,
    },
    Exited(ExitInfo),
    /// No shim, no process, no exit record: lost (for example to a reboot).
    Unknown,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ExitInfo {
    /// 128 + signal for a container killed by a signal, as the kubelet reports it.
    pub exit_code: i32,
    pub signal: Option<i32>,
    pub oom_killed: bool,
    pub started_at: Option<Timestamp>,
    pub finished_at: Timestamp,
    /// Set when the process never ran (for example its command was not found).
    pub start_error: Option<String>,
    /// What the container left at its `terminationMessagePath` (see `termination`):
    /// read from its file when the state is asked for, not kept in the exit record.
    #[serde(default, skip_serializing)]
    pub termination_message: Option<String>,
}

/// An image ready to run, as the image store hands it to the runtime: its config and
/// its unpacked layers.
#[derive(Debug, Clone)]
pub struct ResolvedImage {
    /// The normalised reference the pod asked for (`docker.io/library/busybox:latest`).
    pub reference: String,
    /// `sha256:<config digest>`, the image's id in the store.
    pub image_id: String,
    /// `<repository>@sha256:<manifest digest>`: the repo digest containerd gives the
    /// kubelet as a container's `imageID`.
    pub repo_digest: String,
    /// The image's config (Entrypoint, Cmd, Env, WorkingDir, User).
    pub config: oci_spec::image::ImageConfiguration,
    /// Unpacked layer directories, lowest (base) layer first.
    pub layers: Vec<PathBuf>,
}

/// Everything needed to create and start one container.
pub struct StartRequest<'a> {
    pub id: ContainerId,
    pub pod: &'a Pod,
    pub container: &'a Container,
    /// The container's own environment, resolved from `env` and `envFrom` (see
    /// `sync::env`). Holds secret values: never log it.
    pub env: &'a [(String, String)],
    pub restart_count: u32,
    pub image: &'a ResolvedImage,
    /// The node's name (hostname of host-network pods).
    pub node_name: &'a str,
    /// The CRI log file, `<root>/logs/pods/<ns>_<pod>_<uid>/<container>/<restart>.log`.
    pub log_path: PathBuf,
    /// What the pod's containers share (namespaces, cgroup, DNS files, `/dev/shm`);
    /// None runs the container on its own, in the host's network.
    pub sandbox: Option<&'a PodSandbox>,
    /// The container's volume mounts, resolved to host paths.
    pub mounts: &'a [BindMount],
}

/// What a successful start reports.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Started {
    pub pid: i32,
    pub started_at: Timestamp,
}

#[derive(Debug, thiserror::Error)]
pub enum RuntimeError {
    /// The pod's spec cannot become a valid container config (CreateContainerConfigError).
    #[error("container config: {0}")]
    Config(String),
    /// libcontainer, the shim or the rootfs failed (CreateContainerError).
    #[error("create container {id}: {message}")]
    Create { id: String, message: String },
    /// The container was created but its process could not start (StartError, exit 128).
    #[error("start container {id}: {message}")]
    Start { id: String, message: String },
    #[error("container {id} not found")]
    NotFound { id: String },
    /// Still being created: there is no process to signal yet.
    #[error("container {id} is not running yet")]
    NotRunning { id: String },
    /// `remove` of a container that runs.
    #[error("container {id} is still running")]
    StillRunning { id: String },
    #[error("{context}")]
    Io {
        context: String,
        #[source]
        source: std::io::Error,
    },
}

impl RuntimeError {
    /// The same error, naming container `id` where it named none.
    pub fn with_id(self, id: &ContainerId) -> Self {
        match self {
            RuntimeError::Create { id: i, message } if i.is_empty() => RuntimeError::Create {
                id: id.0.clone(),
                message,
            },
            RuntimeError::Start { id: i, message } if i.is_empty() => RuntimeError::Start {
                id: id.0.clone(),
                message,
            },
            other => other,
        }
    }

    /// What a pod's status says: the message alone, without what the log line adds
    /// for context (the kubelet shows a config error's own words).
    pub fn status_message(&self) -> String {
        match self {
            RuntimeError::Config(m) => m.clone(),
            other => other.to_string(),
        }
    }

    /// The waiting reason the kubelet shows for this failure.
    pub fn reason(&self) -> &'static str {
        match self {
            RuntimeError::Config(_) => "CreateContainerConfigError",
            RuntimeError::Start { .. } => "StartError",
            _ => "CreateContainerError",
        }
    }
}

/// The container runtime as the sync loop sees it. Every method blocks; callers run
/// them on a blocking thread.
pub trait Runtime: Send + Sync + 'static {
    /// Creates and starts the container; returns once its process runs.
    fn start(&self, req: &StartRequest<'_>) -> Result<Started, RuntimeError>;
    /// Sends `signal` to the container's init (and so, in its PID namespace, to all).
    fn kill(&self, id: &ContainerId, signal: i32) -> Result<(), RuntimeError>;
    /// The container's current state, read from its shim's records and `/proc`.
    fn state(&self, id: &ContainerId) -> Result<ContainerState, RuntimeError>;
    /// Removes an exited container: its cgroup, rootfs mount and directory.
    fn remove(&self, id: &ContainerId) -> Result<(), RuntimeError>;
    /// Every container under the runtime's root, known to the caller or not.
    fn list(&self) -> Result<Vec<ContainerId>, RuntimeError>;
    /// Starts watching for container exits; each exit sends the container's id, soon
    /// after its exit record is written. Events may repeat; receivers read `state`.
    fn watch_exits(&self, tx: tokio::sync::mpsc::Sender<ContainerId>) -> Result<(), RuntimeError>;
    /// The caller's store holds the exit of `id` durably: its shim need not make its
    /// own record of it durable (see [`records`]).
    fn exit_recorded(&self, _id: &ContainerId) {}
    /// Whom the container belongs to, as its spec's annotations say (for adoption by
    /// an agent that lost its store). None when they do not say.
    fn owner(&self, _id: &ContainerId) -> Result<Option<adoption::Owner>, RuntimeError> {
        Ok(None)
    }
    /// Runs `command` in the running container `id` without input, waiting up to
    /// `timeout` and keeping at most `max_output` bytes of each stream: exec probes and
    /// lifecycle hooks.
    fn exec_sync(
        &self,
        id: &ContainerId,
        command: &[String],
        timeout: std::time::Duration,
        max_output: usize,
    ) -> Result<exec::ExecOutput, RuntimeError>;
}
