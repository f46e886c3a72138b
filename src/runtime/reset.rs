//! Removing every container under a root: `holdfast reset`, and test clean-up.

use std::time::{Duration, Instant};

use super::{delegation, ContainerState, LibcontainerRuntime, Runtime, RuntimeError};

/// Kills (SIGKILL) and removes every container under the runtime's root, waiting up to
/// `within` for each to exit, then removes the cgroup root and everything under it. Returns how many
/// containers were removed.
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
    // The pod hierarchy under it (kubepods/...) goes too, deepest first.
    let tree = crate::resources::CgroupTree::host(rt.cgroup_root());
    tree.remove(&removable(&tree, rt.cgroup_root()))
        .map_err(|e| RuntimeError::Create {
            id: String::new(),
            message: e.to_string(),
        })?;
    Ok(removed)
}

/// What may go of the cgroup root: all of it, but only the pods' part of a delegated
/// base (its `supervisor` holds the agent and the shims, and the base is the service
/// manager's) and only `kubepods` of the hierarchy's own root.
fn removable(tree: &crate::resources::CgroupTree, root: &str) -> String {
    let root = root.trim_end_matches('/');
    if root.is_empty() {
        return tree.kubepods();
    }
    let supervisor = format!("{root}/{}", delegation::SUPERVISOR);
    let is_base =
        delegation::base() == Some(root) || tree.dirs(&supervisor).iter().any(|d| d.is_dir());
    if is_base {
        format!("{root}/{}", delegation::PODS)
    } else {
        root.to_owned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resources::CgroupTree;
    use crate::testutil::TempDir;

    #[test]
    fn a_delegated_base_keeps_its_supervisor_and_itself() {
        let tmp = TempDir::new("reset-base");
        std::fs::write(tmp.0.join("cgroup.controllers"), "cpu memory pids\n").expect("write");
        let base = "/system.slice/holdfast.service";
        std::fs::create_dir_all(tmp.0.join("system.slice/holdfast.service/supervisor"))
            .expect("mkdir");
        let tree = CgroupTree::at(&tmp.0, base);
        assert_eq!(removable(&tree, base), format!("{base}/pods"));
        assert_eq!(
            removable(&tree, &format!("{base}/pods")),
            format!("{base}/pods")
        );
        let tree = CgroupTree::at(&tmp.0, "/holdfast");
        assert_eq!(removable(&tree, "/holdfast"), "/holdfast");
        // Never every cgroup of the host.
        let tree = CgroupTree::at(&tmp.0, "/");
        assert_eq!(removable(&tree, "/"), "/kubepods");
    }
}
