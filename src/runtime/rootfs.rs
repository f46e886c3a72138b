//! A container's root filesystem: an overlay of the image's layers (read-only, shared
//! by every container of the image) under a per-container upper directory, so no
//! container ever writes to an image.
//!
//! What containers write is reachable from the host under the root dir; the mounts it
//! lives on are `nosuid,nodev` (see [`bind_nosuid_nodev`]), so a setuid binary or a
//! device node a container leaves there gives a host user nothing. The overlay itself
//! is `nodev` (a container's `/dev` is a tmpfs the runtime fills) but not `nosuid`:
//! setuid programs of an image (`su`, `ping`) work inside the container as they do
//! under containerd.

use std::ffi::{OsStr, OsString};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::path::{Path, PathBuf};

use nix::mount::{MntFlags, MsFlags};

/// The kernel takes mount options in one page.
const MAX_OPTIONS: usize = 4000;

/// Mounts the overlay of `layers` (lowest first) at `target`.
pub fn mount(layers: &[PathBuf], upper: &Path, work: &Path, target: &Path) -> Result<(), String> {
    if layers.is_empty() {
        return Err("image has no layers".to_owned());
    }
    for dir in [upper, work, target] {
        std::fs::create_dir_all(dir).map_err(|e| format!("create {}: {e}", dir.display()))?;
    }
    let mut all: Vec<&Path> = layers.iter().rev().map(PathBuf::as_path).collect();
    all.extend([upper, work]);
    for p in &all {
        let s = p.to_string_lossy();
        // ':' separates lower dirs and ',' options; the kernel has no escape for either.
        if s.contains([':', ',']) || !p.is_absolute() {
            return Err(format!("path {s:?} cannot be an overlay directory"));
        }
    }
    let lower: Vec<String> = layers
        .iter()
        .rev()
        .map(|p| p.to_string_lossy().into_owned())
        .collect();
    let options = format!(
        "lowerdir={},upperdir={},workdir={}",
        lower.join(":"),
        upper.to_string_lossy(),
        work.to_string_lossy()
    );
    if options.len() + ",volatile".len() > MAX_OPTIONS {
        return Err(format!(
            "overlay options for {} layers exceed one page",
            layers.len()
        ));
    }
    // `volatile` (Linux 5.10): no sync of the overlay reaches the disk, and above all
    // its unmount does not sync the whole filesystem under the upper dir, which cost a
    // journal commit per container stop. Nothing is lost by it: what a container
    // writes to its root filesystem never outlives it, and a container whose machine
    // lost power is made anew, on a new upper dir. An older kernel mounts it without.
    let mount = |options: &str| {
        nix::mount::mount(
            Some("overlay"),
            target,
            Some("overlay"),
            MsFlags::MS_NODEV,
            Some(options),
        )
    };
    let volatile = format!("{options},volatile");
    match mount(&volatile) {
        Err(nix::errno::Errno::EINVAL) => mount(&options),
        r => r,
    }
    .map_err(|e| format!("mount overlay at {}: {e}", target.display()))
}

/// Makes `dir` a mount of its own with `nosuid,nodev`: a recursive bind of itself (so
/// mounts already below it stay visible), then a remount with the flags. With
/// `private`, mounts made below it later do not propagate to other mount namespaces.
/// Nothing is done when `dir` is a mount point already (an agent restarted over it).
pub fn bind_nosuid_nodev(dir: &Path, private: bool) -> Result<(), String> {
    if is_mount_point(dir).map_err(|e| format!("read mountinfo: {e}"))? {
        return Ok(());
    }
    let none: Option<&str> = None;
    nix::mount::mount(
        Some(dir),
        dir,
        none,
        MsFlags::MS_BIND | MsFlags::MS_REC,
        none,
    )
    .map_err(|e| format!("bind {} on itself: {e}", dir.display()))?;
    let flags = MsFlags::MS_BIND | MsFlags::MS_REMOUNT | MsFlags::MS_NOSUID | MsFlags::MS_NODEV;
    let mut done = nix::mount::mount(none, dir, none, flags, none)
        .map_err(|e| format!("remount {} nosuid,nodev: {e}", dir.display()));
    if private && done.is_ok() {
        done = nix::mount::mount(none, dir, none, MsFlags::MS_PRIVATE, none)
            .map_err(|e| format!("make {} private: {e}", dir.display()));
    }
    if done.is_err() {
        let _ = nix::mount::umount2(dir, MntFlags::MNT_DETACH);
    }
    done
}

/// Detaches every mount at or below `dir`, deepest first.
pub fn unmount_all_under(dir: &Path) -> Result<(), String> {
    let mut points = mounts_under(dir).map_err(|e| format!("read mountinfo: {e}"))?;
    points.sort_by_key(|p| std::cmp::Reverse(p.components().count()));
    for p in points {
        match nix::mount::umount2(&p, MntFlags::MNT_DETACH) {
            Ok(()) | Err(nix::errno::Errno::EINVAL) | Err(nix::errno::Errno::ENOENT) => {}
            Err(e) => return Err(format!("unmount {}: {e}", p.display())),
        }
    }
    Ok(())
}

/// Mount points at or below `dir` in this process's mount namespace, as the kernel
/// names them: absolute, symlinks resolved (see [`resolved`]).
///
/// Read a line at a time through a small buffer: with a hundred pods the table runs to
/// hundreds of KiB, and pod starts and stops read it several times each, at once on
/// several threads. Only the mount points that match become allocations.
pub fn mounts_under(dir: &Path) -> std::io::Result<Vec<PathBuf>> {
    let dir = resolved(dir)?;
    let file = std::fs::File::open("/proc/self/mountinfo")?;
    mounts_under_in(
        std::io::BufReader::with_capacity(4096, file),
        dir.as_os_str().as_bytes(),
    )
}

/// Whether `dir` itself is a mount point.
pub fn is_mount_point(dir: &Path) -> std::io::Result<bool> {
    let dir = resolved(dir)?;
    Ok(mounts_under(&dir)?.contains(&dir))
}

/// `path` as mountinfo names it: absolute, every symlink resolved. The kernel lists
/// resolved paths, so a root dir reached through a symlink (`/var/lib/holdfast ->
/// /data/holdfast`) or given relative matches none of its own mounts unless resolved
/// first. What of it does not exist yet is kept as given (it can hold no mount).
pub fn resolved(path: &Path) -> std::io::Result<PathBuf> {
    let abs = if path.is_absolute() {
        path.to_path_buf()
    } else {
        std::env::current_dir()?.join(path)
    };
    let mut missing = Vec::new();
    let mut cur = abs.as_path();
    loop {
        match std::fs::canonicalize(cur) {
            Ok(mut found) => {
                found.extend(missing.iter().rev());
                return Ok(found);
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                match (cur.parent(), cur.file_name()) {
                    (Some(parent), Some(name)) => {
                        missing.push(name.to_owned());
                        cur = parent;
                    }
                    // `..` after a missing component: nothing to resolve it against.
                    _ => return Err(e),
                }
            }
            Err(e) => return Err(e),
        }
    }
}

fn mounts_under_in(mut table: impl std::io::BufRead, dir: &[u8]) -> std::io::Result<Vec<PathBuf>> {
    let (mut line, mut point) = (Vec::new(), Vec::new());
    let mut found = Vec::new();
    loop {
        line.clear();
        if table.read_until(b'\n', &mut line)? == 0 {
            return Ok(found);
        }
        let Some(field) = line.split(|b| *b == b' ').nth(4) else {
            continue;
        };
        point.clear();
        unescape_into(field.strip_suffix(b"\n").unwrap_or(field), &mut point);
        if Path::new(OsStr::from_bytes(&point)).starts_with(Path::new(OsStr::from_bytes(dir))) {
            found.push(PathBuf::from(OsString::from_vec(point.clone())));
        }
    }
}

/// mountinfo writes space, tab, newline and backslash as `\ooo`.
fn unescape_into(bytes: &[u8], out: &mut Vec<u8>) {
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'\\'
            && i + 3 < bytes.len()
            && bytes[i + 1..i + 4]
                .iter()
                .all(|b| (b'0'..=b'7').contains(b))
        {
            let v = u32::from(bytes[i + 1] - b'0') * 64
                + u32::from(bytes[i + 2] - b'0') * 8
                + u32::from(bytes[i + 3] - b'0');
            // Three octal digits reach 511; the kernel writes bytes only.
            out.push(u8::try_from(v).unwrap_or(u8::MAX));
            i += 4;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mountinfo_escapes() {
        let unescape = |s: &str| {
            let mut out = Vec::new();
            unescape_into(s.as_bytes(), &mut out);
            String::from_utf8(out).expect("utf-8")
        };
        assert_eq!(unescape(r"/a\040b"), "/a b");
        assert_eq!(unescape(r"/plain"), "/plain");
        assert_eq!(unescape(r"/x\134"), "/x\\");
        assert_eq!(unescape(r"/end\04"), r"/end\04");
    }

    #[test]
    fn mount_points_under_a_dir_from_the_table() {
        let table = "\
22 1 8:1 / / rw,relatime shared:1 - ext4 /dev/sda1 rw
30 22 0:5 / /var/lib/hf/pods/a\\040b rw shared:2 - tmpfs tmpfs rw
31 22 0:6 / /var/lib/hf/pods/a\\040b/vol rw shared:3 - tmpfs tmpfs rw
32 22 0:7 / /var/lib/hf/podsX rw shared:4 - tmpfs tmpfs rw
33 22 0:8 / /var/lib/hf/pods rw shared:5 - tmpfs tmpfs rw
short line
34 22 0:9 / /var/lib/hf/pods/last rw - tmpfs tmpfs rw";
        let found = mounts_under_in(table.as_bytes(), b"/var/lib/hf/pods").expect("read");
        let found: Vec<_> = found.iter().map(|p| p.to_str().expect("utf-8")).collect();
        assert_eq!(
            found,
            [
                "/var/lib/hf/pods/a b",
                "/var/lib/hf/pods/a b/vol",
                "/var/lib/hf/pods",
                "/var/lib/hf/pods/last"
            ]
        );
    }

    #[test]
    fn paths_are_resolved_as_mountinfo_names_them() {
        let tmp = crate::testutil::TempDir::new("rootfs-resolved");
        let real = tmp.0.canonicalize().expect("tmp").join("data");
        std::fs::create_dir_all(real.join("pods")).expect("mkdir");
        std::os::unix::fs::symlink(&real, tmp.0.join("link")).expect("symlink");
        assert_eq!(
            resolved(&tmp.0.join("link/pods/missing/deeper")).expect("resolve"),
            real.join("pods/missing/deeper")
        );
        assert_eq!(resolved(&tmp.0.join("link/.")).expect("resolve"), real);
    }

    #[test]
    fn bad_overlay_paths_are_refused() {
        let t = Path::new("/nonexistent-holdfast/t");
        let err = mount(&[], t, t, t).expect_err("no layers");
        assert!(err.contains("no layers"));
    }
}
