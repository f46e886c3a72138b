//! The exit watcher: a thread that turns `exits/<id>` notification files into container
//! ids on a channel. Files already there when it starts are sent first, so an exit that
//! happened while no agent ran is not lost.

use std::os::fd::AsFd;
use std::path::{Path, PathBuf};

use nix::poll::{PollFd, PollFlags, PollTimeout};
use nix::sys::inotify::{AddWatchFlags, InitFlags, Inotify};
use tokio::sync::mpsc::Sender;

use super::{ContainerId, RuntimeError};

/// How often the thread checks, without events, whether the receiver is gone.
const IDLE_CHECK_MS: u16 = 1000;

pub fn spawn(dir: &Path, tx: Sender<ContainerId>) -> Result<(), RuntimeError> {
    let io = |context: String| {
        move |e: nix::Error| RuntimeError::Io {
            context,
            source: e.into(),
        }
    };
    let inotify = Inotify::init(InitFlags::IN_CLOEXEC | InitFlags::IN_NONBLOCK)
        .map_err(io("create inotify instance".to_owned()))?;
    // Watch before listing, so nothing created in between goes unseen (it may be seen
    // twice, which receivers tolerate).
    inotify
        .add_watch(dir, AddWatchFlags::IN_CREATE | AddWatchFlags::IN_MOVED_TO)
        .map_err(io(format!("watch {}", dir.display())))?;
    let dir = dir.to_owned();
    std::thread::Builder::new()
        .name("runtime-exits".to_owned())
        .spawn(move || watch(&dir, &inotify, &tx))
        .map(|_| ())
        .map_err(|source| RuntimeError::Io {
            context: "spawn exit watcher thread".to_owned(),
            source,
        })
}

fn watch(dir: &Path, inotify: &Inotify, tx: &Sender<ContainerId>) {
    match std::fs::read_dir(dir) {
        Ok(entries) => {
            for e in entries.flatten() {
                if !deliver(dir.join(e.file_name()), tx) {
                    return;
                }
            }
        }
        Err(e) => log::error!("list {}: {e}", dir.display()),
    }
    loop {
        if tx.is_closed() {
            return;
        }
        let mut fds = [PollFd::new(inotify.as_fd(), PollFlags::POLLIN)];
        match nix::poll::poll(&mut fds, PollTimeout::from(IDLE_CHECK_MS)) {
            Ok(0) | Err(nix::errno::Errno::EINTR) => continue,
            Ok(_) => {}
            Err(e) => {
                log::error!("exit watcher: poll: {e}");
                return;
            }
        }
        let events = match inotify.read_events() {
            Ok(events) => events,
            Err(nix::errno::Errno::EAGAIN) => continue,
            Err(e) => {
                log::error!("exit watcher: read events: {e}");
                return;
            }
        };
        for event in events {
            if event.mask.contains(AddWatchFlags::IN_Q_OVERFLOW) {
                // Events were dropped: the directory itself still holds every exit.
                if let Ok(entries) = std::fs::read_dir(dir) {
                    for e in entries.flatten() {
                        if !deliver(dir.join(e.file_name()), tx) {
                            return;
                        }
                    }
                }
                continue;
            }
            if let Some(name) = event.name {
                if !deliver(dir.join(name), tx) {
                    return;
                }
            }
        }
    }
}

/// Sends the id named by `path` and deletes the file; false once nobody listens.
fn deliver(path: PathBuf, tx: &Sender<ContainerId>) -> bool {
    let Some(name) = path.file_name().and_then(|n| n.to_str()) else {
        return true;
    };
    if name.starts_with('.') {
        return true;
    }
    if tx.blocking_send(ContainerId(name.to_owned())).is_err() {
        return false;
    }
    if let Err(e) = std::fs::remove_file(&path) {
        if e.kind() != std::io::ErrorKind::NotFound {
            log::warn!("remove {}: {e}", path.display());
        }
    }
    true
}
