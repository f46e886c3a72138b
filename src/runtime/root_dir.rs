//! The root dir's own mode. Everything containers write lives below it (their upper
//! dirs, volumes, logs), so it is 0700: no user of the host but root reaches any of it.

use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::path::Path;

/// The root dir's mode, and that of the folders below it that the agent makes.
pub const MODE: u32 = 0o700;

/// Makes `dir` (and its missing parents, as `mkdir -p`) with mode 0700.
pub fn create_private(dir: &Path) -> std::io::Result<()> {
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(MODE)
        .create(dir)
}

/// `root` made (0700, with its missing parents) if missing, and resolved: absolute,
/// every symlink followed. The kernel's mount table names resolved paths only, so the
/// agent holds its root dir so (a symlink to a data partition, `--root-dir ./state`),
/// and every path below it compares with the mounts it made there.
pub fn resolve(root: &Path) -> std::io::Result<std::path::PathBuf> {
    create_private(root)?;
    std::fs::canonicalize(root)
}

/// Creates the root dir 0700, or takes away what group and others may do with an
/// existing one (a root left 0755 by an older holdfast, or made by hand). Returns the
/// mode it had when it was changed, so that the caller can say so.
pub fn secure(root: &Path) -> std::io::Result<Option<u32>> {
    create_private(root)?;
    let mode = std::fs::metadata(root)?.permissions().mode() & 0o7777;
    if mode & 0o077 == 0 {
        return Ok(None);
    }
    std::fs::set_permissions(root, std::fs::Permissions::from_mode(mode & 0o7700))?;
    Ok(Some(mode))
}

/// The folder of the root dir on which the runtime mounts a tmpfs for what lasts one
/// boot (see [`boot_tmpfs`]).
pub const BOOT: &str = "boot";

/// What of pod `uid` lasts one boot: its `hosts`, `resolv.conf`, `hostname`, `shm` and
/// the bind mounts that hold its namespaces.
pub fn pod_boot_dir(root: &Path, uid: &str) -> std::path::PathBuf {
    root.join(BOOT).join("pods").join(uid)
}

/// The tmpfs's size: a cap on what the boot-scoped records of every container may
/// take (a few KiB each), not memory taken up front.
const BOOT_TMPFS_SIZE: &str = "size=64m";

/// Makes `dir` 0700 and, unless it is a tmpfs already, mounts one on it (`nosuid`,
/// `nodev`, `noexec`): what lives there lasts one boot, and the flash never sees it.
/// Where no tmpfs can be mounted (no privilege), the dir stays on the disk: returns
/// why, for a warning.
pub fn boot_tmpfs(dir: &Path) -> std::io::Result<Option<String>> {
    create_private(dir)?;
    let fs = nix::sys::statfs::statfs(dir).map_err(std::io::Error::from)?;
    if fs.filesystem_type() == nix::sys::statfs::TMPFS_MAGIC {
        return Ok(None);
    }
    use nix::mount::MsFlags;
    let flags = MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC;
    let data = format!("mode=0700,{BOOT_TMPFS_SIZE}");
    match nix::mount::mount(
        Some("tmpfs"),
        dir,
        Some("tmpfs"),
        flags,
        Some(data.as_str()),
    ) {
        Ok(()) => Ok(None),
        Err(e @ (nix::errno::Errno::EPERM | nix::errno::Errno::EACCES)) => {
            Ok(Some(format!("mount a tmpfs on {}: {e}", dir.display())))
        }
        Err(e) => Err(e.into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_wide_root_is_narrowed_and_a_new_one_is_private() {
        let tmp = crate::testutil::TempDir::new("root-dir");
        let root = tmp.0.join("a/root");
        assert_eq!(secure(&root).expect("create"), None);
        let mode = |p: &Path| std::fs::metadata(p).expect("stat").permissions().mode() & 0o7777;
        assert_eq!(mode(&root), 0o700);
        std::fs::set_permissions(&root, std::fs::Permissions::from_mode(0o755)).expect("chmod");
        assert_eq!(secure(&root).expect("secure"), Some(0o755));
        assert_eq!(mode(&root), 0o700);
    }

    #[test]
    fn a_root_through_a_symlink_resolves_to_its_target() {
        let tmp = crate::testutil::TempDir::new("root-dir-resolve");
        let data = tmp.0.canonicalize().expect("tmp").join("data");
        std::fs::create_dir_all(&data).expect("mkdir");
        std::os::unix::fs::symlink(&data, tmp.0.join("link")).expect("symlink");
        let root = resolve(&tmp.0.join("link/holdfast")).expect("resolve");
        assert_eq!(root, data.join("holdfast"));
        let mode = std::fs::metadata(&root).expect("stat").permissions().mode() & 0o7777;
        assert_eq!(mode, 0o700);
    }
}
