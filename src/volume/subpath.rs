//! `subPath`: part of a volume mounted on its own, made safe as the kubelet makes it
//! (CVE-2017-1002101): a container that shares the volume may plant symlinks in it,
//! so the path is resolved, checked to stay inside the volume, opened component by
//! component without following symlinks, and that open file — not the path, which
//! could be swapped meanwhile — is bind-mounted into a staging path the container
//! then mounts (`<pod>/volume-subpaths/<volume>/<container>/<index>`).

use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::fs::MetadataExt;
use std::path::{Component, Path, PathBuf};

use nix::fcntl::OFlag;
use nix::mount::{MntFlags, MsFlags};
use nix::sys::stat::Mode;

use super::VolumeError;

fn mount_err(msg: String) -> VolumeError {
    VolumeError::Mount(msg)
}

/// Checks `sub` as the API does: relative, no `..`.
pub fn validate(sub: &str) -> Result<(), VolumeError> {
    let p = Path::new(sub);
    if p.is_absolute() {
        return Err(mount_err(format!(
            "subPath {sub:?} must be a relative path"
        )));
    }
    if p.components().any(|c| matches!(c, Component::ParentDir)) {
        return Err(mount_err(format!("subPath {sub:?} must not contain '..'")));
    }
    Ok(())
}

/// Makes the missing directories of `sub` under `volume`, each opened without
/// following a symlink, with the volume root's mode (the kubelet's SafeMakeDir).
fn safe_make_dir(volume: &Path, sub: &str) -> Result<(), VolumeError> {
    let mode = std::fs::metadata(volume)
        .map(|m| m.mode() & 0o7777)
        .map_err(|source| VolumeError::Io {
            context: format!("stat {}", volume.display()),
            source,
        })?;
    let mut cur: OwnedFd = open(volume, OFlag::O_DIRECTORY)?;
    for c in Path::new(sub).components() {
        let Component::Normal(name) = c else { continue };
        let next = nix::fcntl::openat(
            Some(cur.as_raw_fd()),
            name,
            OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC | OFlag::O_PATH,
            Mode::empty(),
        );
        let fd = match next {
            Ok(fd) => fd,
            Err(nix::errno::Errno::ENOENT) => {
                nix::sys::stat::mkdirat(
                    Some(cur.as_raw_fd()),
                    name,
                    Mode::from_bits_truncate(mode),
                )
                .map_err(|e| mount_err(format!("create subPath {sub:?}: {e}")))?;
                let fd = nix::fcntl::openat(
                    Some(cur.as_raw_fd()),
                    name,
                    OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC | OFlag::O_RDONLY,
                    Mode::empty(),
                )
                .map_err(|e| mount_err(format!("open subPath {sub:?}: {e}")))?;
                // mkdirat took the umask off: the mode is the volume root's, whole
                // (0777 for an emptyDir with fsGroup), as the kubelet's Fchmod makes it.
                nix::sys::stat::fchmod(fd, Mode::from_bits_truncate(mode))
                    .map_err(|e| mount_err(format!("chmod subPath {sub:?}: {e}")))?;
                fd
            }
            Err(e) => {
                return Err(mount_err(format!(
                    "subPath {sub:?} cannot be created through a symlink or a file: {e}"
                )))
            }
        };
        cur = owned(fd);
    }
    Ok(())
}

#[allow(unsafe_code)]
fn owned(fd: std::os::fd::RawFd) -> OwnedFd {
    use std::os::fd::FromRawFd;
    // SAFETY: `fd` was just returned by openat and nothing else owns or closes it.
    unsafe { OwnedFd::from_raw_fd(fd) }
}

/// Opens an absolute path that has no symlinks, one component at a time, failing if a
/// symlink appeared in it meanwhile.
fn open(path: &Path, last: OFlag) -> Result<OwnedFd, VolumeError> {
    let parts: Vec<_> = path
        .components()
        .filter_map(|c| match c {
            Component::Normal(n) => Some(n.to_owned()),
            _ => None,
        })
        .collect();
    let fail = |e: nix::errno::Errno| {
        mount_err(format!(
            "open {} without following symlinks: {e}",
            path.display()
        ))
    };
    let flags = |i: usize| {
        let kind = if i + 1 == parts.len() {
            last
        } else {
            OFlag::O_DIRECTORY
        };
        OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC | OFlag::O_PATH | kind
    };
    let Some(first) = parts.first() else {
        return nix::fcntl::open("/", OFlag::O_PATH | OFlag::O_CLOEXEC | last, Mode::empty())
            .map(owned)
            .map_err(fail);
    };
    // The first component by its absolute path, the rest relative to it: the same
    // walk as from an fd of "/", and one that qemu-user with a sysroot (`-L`, which
    // takes "/" for the sysroot's root) runs against the host's tree too.
    let top = Path::new("/").join(first);
    let mut cur = owned(nix::fcntl::open(&top, flags(0), Mode::empty()).map_err(fail)?);
    for (i, name) in parts.iter().enumerate().skip(1) {
        let fd = nix::fcntl::openat(
            Some(cur.as_raw_fd()),
            name.as_os_str(),
            flags(i),
            Mode::empty(),
        )
        .map_err(fail)?;
        cur = owned(fd);
    }
    Ok(cur)
}

/// The staging path to mount for `sub` of the volume at `volume`. `make`: create a
/// missing subPath (emptyDir, hostPath) instead of failing.
pub fn resolve(
    volume: &Path,
    sub: &str,
    make: bool,
    staging: &Path,
) -> Result<PathBuf, VolumeError> {
    validate(sub)?;
    let full = volume.join(sub);
    if make && std::fs::symlink_metadata(&full).is_err() {
        safe_make_dir(volume, sub)?;
    }
    let io = |what: &Path| {
        let context = format!("resolve {}", what.display());
        move |source| VolumeError::Io { context, source }
    };
    let vol_real = std::fs::canonicalize(volume).map_err(io(volume))?;
    let real = std::fs::canonicalize(&full).map_err(|e| {
        mount_err(format!(
            "subPath {sub:?} of volume {}: {e}",
            volume.display()
        ))
    })?;
    if !real.starts_with(&vol_real) {
        return Err(mount_err(format!(
            "subpath {:?} not within volume path {:?}",
            real.display().to_string(),
            vol_real.display().to_string()
        )));
    }
    let fd = open(&real, OFlag::empty())?;
    let is_dir = nix::sys::stat::fstat(fd.as_raw_fd())
        .map(|s| s.st_mode & nix::libc::S_IFMT == nix::libc::S_IFDIR)
        .map_err(|e| mount_err(format!("stat {}: {e}", real.display())))?;

    // The staging point: a directory or an empty file, like what it will show.
    match nix::mount::umount2(staging, MntFlags::MNT_DETACH) {
        Ok(()) | Err(nix::errno::Errno::EINVAL) | Err(nix::errno::Errno::ENOENT) => {}
        Err(e) => return Err(mount_err(format!("unmount {}: {e}", staging.display()))),
    }
    if let Some(parent) = staging.parent() {
        std::fs::create_dir_all(parent).map_err(io(parent))?;
    }
    let _ = std::fs::remove_dir(staging);
    let _ = std::fs::remove_file(staging);
    if is_dir {
        std::fs::create_dir(staging).map_err(io(staging))?;
    } else {
        std::fs::File::create(staging).map_err(io(staging))?;
    }
    let source = PathBuf::from(format!("/proc/self/fd/{}", fd.as_raw_fd()));
    nix::mount::mount(
        Some(&source),
        staging,
        None::<&str>,
        MsFlags::MS_BIND | MsFlags::MS_REC,
        None::<&str>,
    )
    .map_err(|e| {
        mount_err(format!(
            "bind subPath {sub:?} at {}: {e}",
            staging.display()
        ))
    })?;
    Ok(staging.to_owned())
}
