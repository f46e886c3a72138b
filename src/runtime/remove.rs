//! Removing a tree the agent made (a container's dir, a pod's, its volumes') without
//! ever deleting through a mount: a hostPath bind-mounted by `subPath`, an image layer
//! or a tmpfs below it stays whole. What is mounted below is unmounted first, deepest
//! first; then a walk by file descriptor (`openat` without following symlinks) removes
//! the rest, and stops with an error at any directory on another mount than the tree's
//! (a bind mount of the same filesystem counts: the mount, not the device, is compared).

use std::ffi::{OsStr, OsString};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::path::{Path, PathBuf};

use nix::errno::Errno;
use nix::fcntl::OFlag;
use nix::sys::stat::Mode;
use nix::unistd::UnlinkatFlags;

use super::rootfs;

#[derive(Debug, thiserror::Error)]
pub enum RemoveError {
    #[error("remove {dir}: {reason}")]
    Unmount { dir: PathBuf, reason: String },
    #[error("refuse to remove {dir}: still mounted at {left:?}")]
    Mounted { dir: PathBuf, left: Vec<PathBuf> },
    #[error("refuse to remove {path}: a mount of its own, not part of the tree being removed")]
    Crossing { path: PathBuf },
    /// The cause is in the message: callers log it, or carry it in their own
    /// errors as text.
    #[error("{context}: {error}")]
    Io {
        context: String,
        error: std::io::Error,
    },
}

fn io(context: String) -> impl FnOnce(std::io::Error) -> RemoveError {
    move |error| RemoveError::Io { context, error }
}

fn errno(context: String) -> impl FnOnce(Errno) -> RemoveError {
    move |e| RemoveError::Io {
        context,
        error: e.into(),
    }
}

/// Unmounts everything at or below `dir`, then removes it. Nothing to do when it is
/// not there; a symlink or file at `dir` is unlinked (what a symlink points to stays).
pub fn remove_unmounted(dir: &Path) -> Result<(), RemoveError> {
    let dir = match (dir.parent(), dir.file_name()) {
        (Some(parent), Some(name)) => rootfs::resolved(parent)
            .map_err(io(format!("resolve {}", parent.display())))?
            .join(name),
        _ => rootfs::resolved(dir).map_err(io(format!("resolve {}", dir.display())))?,
    };
    match std::fs::symlink_metadata(&dir) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(io(format!("stat {}", dir.display()))(e)),
        Ok(m) if !m.is_dir() => {
            return std::fs::remove_file(&dir).map_err(io(format!("remove {}", dir.display())))
        }
        Ok(_) => {}
    }
    rootfs::unmount_all_under(&dir).map_err(|reason| RemoveError::Unmount {
        dir: dir.clone(),
        reason,
    })?;
    let left = rootfs::mounts_under(&dir).map_err(io("read /proc/self/mountinfo".into()))?;
    if !left.is_empty() {
        return Err(RemoveError::Mounted { dir, left });
    }
    remove_tree(&dir)
}

/// Removes the resolved path `dir` (a file, or a directory with all below it), none of
/// it on another mount than its parent directory's.
fn remove_tree(dir: &Path) -> Result<(), RemoveError> {
    let (Some(parent), Some(name)) = (dir.parent(), dir.file_name()) else {
        return Err(RemoveError::Crossing {
            path: dir.to_owned(),
        });
    };
    let parent_fd = open_dir(None, parent.as_os_str(), parent)?
        .ok_or_else(|| io(format!("open {}", parent.display()))(Errno::ENOTDIR.into()))?;
    let mount = mount_id(&parent_fd, parent)?;
    let Some(top) = Level::open(&parent_fd, name, dir.to_owned(), mount)? else {
        return unlink(&parent_fd, name, dir, UnlinkatFlags::NoRemoveDir);
    };
    let mut stack = vec![top];
    while let Some(level) = stack.last_mut() {
        match level.left.pop() {
            Some(name) => {
                let path = level.path.join(&name);
                match Level::open(&level.fd, &name, path.clone(), mount)? {
                    Some(child) => stack.push(child),
                    None => unlink(&level.fd, &name, &path, UnlinkatFlags::NoRemoveDir)?,
                }
            }
            None => {
                let done = stack.pop().expect("a level");
                let name = done.path.file_name().unwrap_or_default().to_owned();
                let parent = stack.last().map_or(&parent_fd, |l| &l.fd);
                drop(done.fd);
                unlink(parent, &name, &done.path, UnlinkatFlags::RemoveDir)?;
            }
        }
    }
    Ok(())
}

/// A directory being emptied: its descriptor and the names in it not yet removed.
struct Level {
    fd: OwnedFd,
    path: PathBuf,
    left: Vec<OsString>,
}

impl Level {
    /// Opens `name` in `parent` as a directory on mount `mount`; None when it is no
    /// directory (a file or symlink, to unlink).
    fn open(
        parent: &OwnedFd,
        name: &OsStr,
        path: PathBuf,
        mount: u64,
    ) -> Result<Option<Level>, RemoveError> {
        let Some(fd) = open_dir(Some(parent.as_raw_fd()), name, &path)? else {
            return Ok(None);
        };
        if mount_id(&fd, &path)? != mount {
            return Err(RemoveError::Crossing { path });
        }
        // The entries of the directory this descriptor holds, whatever its path
        // became meanwhile.
        let listed = format!("/proc/self/fd/{}", fd.as_raw_fd());
        let mut left = Vec::new();
        for e in std::fs::read_dir(&listed).map_err(io(format!("list {}", path.display())))? {
            left.push(
                e.map_err(io(format!("list {}", path.display())))?
                    .file_name(),
            );
        }
        Ok(Some(Level { fd, path, left }))
    }
}

/// Opens a directory without following a symlink; None when `name` is no directory.
fn open_dir(at: Option<RawFd>, name: &OsStr, path: &Path) -> Result<Option<OwnedFd>, RemoveError> {
    let flags = OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC;
    match nix::fcntl::openat(at, name, flags, Mode::empty()) {
        Ok(fd) => Ok(Some(owned(fd))),
        Err(Errno::ENOTDIR | Errno::ELOOP) => Ok(None),
        Err(e) => Err(errno(format!("open {}", path.display()))(e)),
    }
}

fn unlink(
    parent: &OwnedFd,
    name: &OsStr,
    path: &Path,
    how: UnlinkatFlags,
) -> Result<(), RemoveError> {
    match nix::unistd::unlinkat(Some(parent.as_raw_fd()), name, how) {
        Ok(()) | Err(Errno::ENOENT) => Ok(()),
        Err(e) => Err(errno(format!("remove {}", path.display()))(e)),
    }
}

/// The id of the mount the open file `fd` is on, as `/proc/self/fdinfo` gives it.
fn mount_id(fd: &OwnedFd, path: &Path) -> Result<u64, RemoveError> {
    let info = format!("/proc/self/fdinfo/{}", fd.as_raw_fd());
    let text = std::fs::read_to_string(&info)
        .map_err(io(format!("read {info} for {}", path.display())))?;
    text.lines()
        .find_map(|l| l.strip_prefix("mnt_id:"))
        .and_then(|v| v.trim().parse().ok())
        .ok_or_else(|| {
            io(format!("read {info} for {}: no mnt_id", path.display()))(
                std::io::ErrorKind::InvalidData.into(),
            )
        })
}

#[allow(unsafe_code)]
fn owned(fd: RawFd) -> OwnedFd {
    // SAFETY: `fd` was just returned by openat and nothing else owns or closes it.
    unsafe { OwnedFd::from_raw_fd(fd) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tree_goes_with_its_symlinks_but_not_what_they_point_to() {
        let tmp = crate::testutil::TempDir::new("remove-tree");
        let outside = tmp.0.join("outside");
        std::fs::create_dir_all(&outside).expect("mkdir");
        std::fs::write(outside.join("keep"), "x").expect("write");
        let tree = tmp.0.join("tree");
        std::fs::create_dir_all(tree.join("a/b/c")).expect("mkdir");
        std::fs::write(tree.join("a/b/c/f"), "x").expect("write");
        std::fs::write(tree.join("top"), "x").expect("write");
        std::os::unix::fs::symlink(&outside, tree.join("a/link")).expect("symlink");
        std::os::unix::fs::symlink(&outside, tmp.0.join("top-link")).expect("symlink");
        remove_unmounted(&tree).expect("remove");
        remove_unmounted(&tmp.0.join("top-link")).expect("remove the symlink");
        assert!(!tree.exists());
        assert!(!tmp.0.join("top-link").exists());
        assert!(outside.join("keep").exists());
        remove_unmounted(&tree).expect("nothing to remove");
    }

    /// `base/host` with a file `keep`, bind-mounted on `base/tree/vol`: (host, vol).
    fn bound_host_dir(base: &Path) -> (std::path::PathBuf, std::path::PathBuf) {
        let host = base.join("host");
        std::fs::create_dir_all(&host).expect("mkdir");
        std::fs::write(host.join("keep"), "x").expect("write");
        let target = base.join("tree/vol");
        std::fs::create_dir_all(&target).expect("mkdir");
        let none: Option<&str> = None;
        nix::mount::mount(
            Some(&host),
            &target,
            none,
            nix::mount::MsFlags::MS_BIND,
            none,
        )
        .expect("bind");
        (host, target)
    }

    #[test]
    fn a_bind_mount_below_is_unmounted_and_what_it_showed_stays() {
        if !nix::unistd::geteuid().is_root() {
            eprintln!("skipped: needs root to mount");
            return;
        }
        let tmp = crate::testutil::TempDir::new("remove-mounted");
        let (host, target) = bound_host_dir(&tmp.0);
        let tree = tmp.0.join("tree");
        // Reached through a symlinked parent, as a symlinked root dir's pods are.
        std::os::unix::fs::symlink(&tmp.0, tmp.0.join("link")).expect("symlink");
        let removed = remove_unmounted(&tmp.0.join("link/tree"));
        let _ = nix::mount::umount2(&target, nix::mount::MntFlags::MNT_DETACH);
        removed.expect("remove");
        assert!(host.join("keep").exists());
        assert!(!tree.exists());
    }

    #[test]
    fn the_walk_stops_at_a_mount_and_removes_nothing_through_it() {
        if !nix::unistd::geteuid().is_root() {
            eprintln!("skipped: needs root to mount");
            return;
        }
        let tmp = crate::testutil::TempDir::new("remove-crossing");
        let base = tmp.0.canonicalize().expect("tmp");
        let (host, target) = bound_host_dir(&base);
        // The same filesystem through a bind mount: the device is the same, the mount not.
        let removed = remove_tree(&base.join("tree"));
        let _ = nix::mount::umount2(&target, nix::mount::MntFlags::MNT_DETACH);
        match removed {
            Err(RemoveError::Crossing { path }) => assert_eq!(path, target),
            other => panic!("expected a refusal at the mount, got {other:?}"),
        }
        assert!(host.join("keep").exists());
    }
}
