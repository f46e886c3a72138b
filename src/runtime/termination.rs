//! runtime::termination: the file a container may leave a message in as it ends, at its
//! `terminationMessagePath` (`/dev/termination-log` unless the pod says otherwise), as
//! the kubelet gives it: a file of its own per instance, made 0666 so that any user the
//! container runs as may write it, in the container's dir on the disk (0700 below the
//! root: out of reach of the host's other users), bind-mounted at the path. Read back,
//! its last 4 KiB, once the container has exited.

use std::io::{Read, Seek, SeekFrom};
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::Path;

use k8s_openapi::api::core::v1::Container;

use super::sandbox::BindMount;
use super::RuntimeError;

/// The file's name in the container's dir.
pub const FILE: &str = "termination-log";
/// What of it is reported: its last 4 KiB (the kubelet's
/// MaxContainerTerminationMessageLength).
pub const MAX_MESSAGE: u64 = 4096;

/// Makes the file in `disk` and says where it goes, when `c` has a path for it.
pub fn prepare(c: &Container, disk: &Path) -> Result<Option<BindMount>, RuntimeError> {
    let Some(dest) = c
        .termination_message_path
        .as_deref()
        .filter(|p| !p.is_empty())
    else {
        return Ok(None);
    };
    if !dest.starts_with('/') || dest.split('/').any(|part| part == "..") {
        return Err(RuntimeError::Config(format!(
            "terminationMessagePath {dest:?} must be an absolute path without \"..\""
        )));
    }
    let file = disk.join(FILE);
    let io = |e: std::io::Error| RuntimeError::Io {
        context: format!("create {}", file.display()),
        source: e,
    };
    let f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .custom_flags(nix::libc::O_NOFOLLOW)
        .open(&file)
        .map_err(io)?;
    // Whatever the umask: the container's user may be any.
    f.set_permissions(std::fs::Permissions::from_mode(0o666))
        .map_err(io)?;
    Ok(Some(BindMount {
        source: file,
        destination: dest.to_string(),
        read_only: false,
        propagation: None,
        nosuid_nodev: true,
    }))
}

/// Makes the file and adds its mount to `spec`, last (over a volume at the same path).
pub fn mount(
    spec: &mut oci_spec::runtime::Spec,
    c: &Container,
    disk: &Path,
) -> Result<(), RuntimeError> {
    let Some(m) = prepare(c, disk)? else {
        return Ok(());
    };
    let mut mounts = spec.mounts().clone().unwrap_or_default();
    mounts.retain(|existing| existing.destination() != Path::new(&m.destination));
    mounts.push(super::sandbox::bind_mount(&m)?);
    spec.set_mounts(Some(mounts));
    Ok(())
}

/// What the container left in the file in `disk`: its last [`MAX_MESSAGE`] bytes; None
/// when there is no file or nothing in it.
pub fn read(disk: &Path) -> Option<String> {
    let mut f = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(nix::libc::O_NOFOLLOW | nix::libc::O_NONBLOCK)
        .open(disk.join(FILE))
        .ok()?;
    let meta = f.metadata().ok()?;
    if !meta.is_file() {
        return None;
    }
    let from = meta.len().saturating_sub(MAX_MESSAGE);
    f.seek(SeekFrom::Start(from)).ok()?;
    let mut bytes = Vec::new();
    f.take(MAX_MESSAGE).read_to_end(&mut bytes).ok()?;
    (!bytes.is_empty()).then(|| String::from_utf8_lossy(&bytes).into_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn container(path: Option<&str>) -> Container {
        Container {
            name: "c".into(),
            termination_message_path: path.map(str::to_string),
            ..Container::default()
        }
    }

    #[test]
    fn a_file_anyone_may_write_mounted_at_the_path_and_its_tail_read_back() {
        let dir = crate::testutil::TempDir::new("termination");
        let m = prepare(&container(Some("/dev/termination-custom-log")), &dir.0)
            .expect("prepare")
            .expect("a mount");
        assert_eq!(m.destination, "/dev/termination-custom-log");
        assert!(!m.read_only && m.nosuid_nodev);
        let mode = std::fs::metadata(&m.source)
            .expect("file")
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o666);
        assert_eq!(read(&dir.0), None, "empty");
        std::fs::write(&m.source, "DONE").expect("write");
        assert_eq!(read(&dir.0).as_deref(), Some("DONE"));
        let long = format!("{}END", "x".repeat(10_000));
        std::fs::write(&m.source, &long).expect("write");
        let got = read(&dir.0).expect("message");
        assert_eq!(got.len(), 4096);
        assert!(got.ends_with("xEND"));
    }

    #[test]
    fn no_path_no_file_and_a_bad_path_is_refused() {
        let dir = crate::testutil::TempDir::new("termination");
        assert!(prepare(&container(None), &dir.0).expect("none").is_none());
        assert!(prepare(&container(Some("")), &dir.0)
            .expect("none")
            .is_none());
        assert!(!dir.0.join(FILE).exists());
        for bad in ["dev/termination-log", "/dev/../../etc/passwd"] {
            assert!(prepare(&container(Some(bad)), &dir.0).is_err(), "{bad}");
        }
        // A symlink planted where the file goes is not followed.
        let target = dir.0.join("elsewhere");
        std::fs::write(&target, "secret").expect("write");
        std::os::unix::fs::symlink(&target, dir.0.join(FILE)).expect("symlink");
        assert!(prepare(&container(Some("/dev/termination-log")), &dir.0).is_err());
        assert_eq!(read(&dir.0), None);
        assert_eq!(std::fs::read_to_string(&target).expect("read"), "secret");
    }
}
