//! Removing every container under a root: `holdfast reset`, and test clean-up.

use std::time::{Duration, Instant};

use super::{ContainerState, LibcontainerRuntime, Runtime, RuntimeError};

/// Kills (SIGKILL) and removes every container under the runtime's root, waiting up to
/// `within` for each to exit. Returns how many containers were removed; the pods'
/// cgroup tree is the caller's to remove next (`resources::cgroups::remove_tree`).
pub fn remove_all(rt: &LibcontainerRuntime, within: Duration) -> Result<usize, RuntimeError> {
    let ids = rt.list()?;
    let sigkill = nix::sys::signal::Signal::SIGKILL as i32;
    for id in &ids {
        if let Ok(ContainerState::Running { .. }) = rt.state(id) {
            if let Err(e) = rt.kill(id, sigkill) {
                log::warn!("kill container {id}: {e}");
            }
        }
    }
    let mut removed = 0;
    for id in &ids {
        let deadline = Instant::now() + within;
        loop {
            match rt.state(id) {
                Ok(ContainerState::Running { .. }) | Ok(ContainerState::Created)
                    if Instant::now() < deadline =>
                {
                    std::thread::sleep(Duration::from_millis(20));
                }
                _ => break,
            }
        }
        rt.remove(id)?;
        removed += 1;
    }
    Ok(removed)
}
