//! The container as its shim holds it while it runs, and the shim's part of its end:
//! telling the agent of the exit (`exits/<id>`), waiting for the agent to take it, and
//! deleting what libcontainer and the rootfs left. Shared by `shim` (which creates the
//! container) and `supervise` (which waits for it); imports neither.

use std::os::fd::OwnedFd;
use std::os::unix::net::UnixListener;

use libcontainer::container::Container;
use nix::unistd::Pid;

use super::records::ShimConfig;
use super::rootfs;
use crate::error::chain;
use crate::time;

/// Where the container's output comes from.
pub enum ContainerOutput {
    /// stdout and stderr pipes.
    Pipes { stdout: OwnedFd, stderr: OwnedFd },
    /// The master of its terminal (`tty: true`): one stream, input and output.
    Tty(OwnedFd),
}

/// The container as the shim holds it while it runs.
pub struct Running {
    pub config: ShimConfig,
    pub init: Pid,
    pub started_at: time::Timestamp,
    pub output: ContainerOutput,
    /// The write end of its stdin pipe (`stdin: true` without a terminal).
    pub stdin: Option<OwnedFd>,
    /// `attach.sock`, None if it could not be made (attach is then refused).
    pub attach: Option<UnixListener>,
}

/// How long a shim waits for the agent to take its container's exit (see
/// [`super::records`]) before it syncs the exit record itself.
pub const EXIT_TAKEN_WAIT: std::time::Duration = std::time::Duration::from_secs(3);

/// Whether the agent took the exit within [`EXIT_TAKEN_WAIT`]: it removes `exits/<id>`
/// once its store holds the exit durably (or it removes the container).
pub fn exit_taken(config: &ShimConfig) -> bool {
    let path = config.exits_dir.join(&config.id);
    let deadline = std::time::Instant::now() + EXIT_TAKEN_WAIT;
    loop {
        match path.try_exists() {
            Ok(false) => return true,
            Ok(true) if std::time::Instant::now() < deadline => {
                std::thread::sleep(std::time::Duration::from_millis(20));
            }
            _ => return false,
        }
    }
}

/// Creates `exits/<id>`, which wakes the agent's exit watcher.
pub fn notify_exit(config: &ShimConfig) {
    let path = config.exits_dir.join(&config.id);
    if let Err(e) = std::fs::File::create(&path) {
        log::error!("shim {}: create {}: {e}", config.id, path.display());
    }
}

/// Deletes the container from libcontainer (its cgroup and state) and unmounts the
/// rootfs. Best effort: what fails here, the agent's remove retries.
pub fn cleanup(config: &ShimConfig) {
    let state = config.state_root.join(&config.id);
    if state.exists() {
        match Container::load(state) {
            Ok(mut c) => {
                if let Err(e) = c.delete(true) {
                    log::error!("shim {}: libcontainer delete: {}", config.id, chain(&e));
                }
            }
            Err(e) => log::error!("shim {}: libcontainer load: {}", config.id, chain(&e)),
        }
    }
    if let Err(e) = rootfs::unmount_all_under(&config.bundle) {
        log::error!("shim {}: {e}", config.id);
    }
}
