//! One manifest file: YAML (several documents allowed) or JSON, each document a Pod.

use std::fs::File;
use std::io::{self, Read};
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
use std::path::Path;

use k8s_openapi::api::core::v1::Pod;
use serde::Deserialize;
use serde_yaml::Value;

use super::static_pod::{make_static_pod, Origin};
use super::validate::validate_pod;
use super::SourceError;
use crate::yaml::prescan;

/// A manifest larger than this is refused rather than read. Real pod manifests are a
/// few KiB; a pod must also fit the apiserver as a mirror pod, whose requests stop at
/// 3 MiB and whose etcd values at 1.5 MiB. 1 MiB keeps every pod that could exist in a
/// cluster while bounding what one file costs the device: at most 1 MiB read, and
/// under a second of decoding on x86_64 even nested to the depth allowed.
pub(super) const MAX_MANIFEST_BYTES: u64 = crate::yaml::MAX_BYTES;

/// No node has use for more pods in one file; a bound keeps the error list short.
pub(super) const MAX_DOCUMENTS: usize = 100;

/// What one file gave.
pub(super) enum FileRead {
    /// The file could not be read or is not YAML at all, as when an editor is halfway
    /// through saving it; the caller keeps what the file gave before.
    Unreadable(SourceError),
    /// The file parsed: its valid pods, and an error for each document refused.
    Read {
        pods: Vec<Pod>,
        errors: Vec<SourceError>,
    },
}

pub(super) fn read_manifest_file(path: &Path, node_name: &str) -> FileRead {
    let file = path.display().to_string();
    let manifest_err = |reason: String| SourceError::Manifest {
        file: file.clone(),
        reason,
    };
    let text = match read_bounded(path) {
        Ok(text) => text,
        Err(refused) => return refused,
    };
    // Before serde_yaml sees it: nesting and aliases that would cost it minutes or
    // gigabytes are refused by a look that costs one pass.
    if let Err(reason) = prescan(&text) {
        return FileRead::Read {
            pods: Vec::new(),
            errors: vec![manifest_err(reason)],
        };
    }

    // First pass: the whole file must be YAML before any of it counts, so a file cut
    // short mid-save does not lose the documents after the cut.
    let mut docs = Vec::new();
    for de in serde_yaml::Deserializer::from_str(&text) {
        if docs.len() == MAX_DOCUMENTS {
            return FileRead::Read {
                pods: Vec::new(),
                errors: vec![manifest_err(format!(
                    "more than {MAX_DOCUMENTS} documents in one file"
                ))],
            };
        }
        match Value::deserialize(de) {
            Ok(v) => docs.push(v),
            Err(e) => {
                let at = if docs.is_empty() {
                    String::new()
                } else {
                    format!("document {}: ", docs.len())
                };
                // serde_yaml repeats a syntax error for ever instead of ending the
                // stream; stop at the first.
                return FileRead::Unreadable(manifest_err(format!("{at}not valid YAML: {e}")));
            }
        }
    }

    let mut pods = Vec::new();
    let mut errors = Vec::new();
    let many = docs.len() > 1;
    // Second pass, in step with the first: each pod is decoded from the text rather
    // than from the Value, so an error carries the line and column as well as the
    // field path. One walk through the file, not one per document.
    let mut again = serde_yaml::Deserializer::from_str(&text);
    for (index, doc) in docs.iter().enumerate() {
        let de = again.next();
        let at = if many {
            format!("document {index}: ")
        } else {
            String::new()
        };
        if doc.is_null() {
            continue;
        }
        if let Err(reason) = check_kind(doc) {
            errors.push(manifest_err(format!("{at}{reason}")));
            continue;
        }
        let decoded = de.map(Pod::deserialize);
        let pod = match decoded {
            Some(Ok(pod)) => pod,
            Some(Err(e)) => {
                errors.push(manifest_err(format!("{at}decode pod: {e}")));
                continue;
            }
            None => {
                errors.push(manifest_err(format!("{at}document vanished on re-read")));
                continue;
            }
        };
        match admit(pod, node_name, Origin::File(path)) {
            Ok(pod) => pods.push(pod),
            Err(reason) => errors.push(manifest_err(format!("{at}{reason}"))),
        }
    }
    FileRead::Read { pods, errors }
}

/// A decoded manifest pod validated and made the static pod this node runs, or why
/// it is refused. Every static pod, from a file or the URL, passes here.
pub(super) fn admit(pod: Pod, node_name: &str, origin: Origin<'_>) -> Result<Pod, String> {
    let problems = validate_pod(&pod);
    if !problems.is_empty() {
        return Err(format!("invalid pod: {}", problems.join("; ")));
    }
    let pod = make_static_pod(pod, node_name, origin);
    // The name grows by the node name; it must still be a valid pod name.
    let name = pod.metadata.name.as_deref().unwrap_or_default();
    if let Err(e) = crate::config::check_dns1123_subdomain(name) {
        return Err(format!(
            "invalid pod: metadata.name: with the node name appended: {e}"
        ));
    }
    Ok(pod)
}

/// The file's text, read without ever blocking and never more than the bound. Err is
/// what the file gives instead: refused (no pods) for what is not a regular file on a
/// real filesystem or is too large, unreadable (pods kept) for a failed read.
fn read_bounded(path: &Path) -> Result<String, FileRead> {
    let file = path.display().to_string();
    let refused = |reason: String| FileRead::Read {
        pods: Vec::new(),
        errors: vec![SourceError::Manifest {
            file: file.clone(),
            reason,
        }],
    };
    let unreadable = |source: io::Error| {
        FileRead::Unreadable(SourceError::Io {
            context: format!("read manifest {file}"),
            source,
        })
    };
    // Looked at before it is opened: opening a device can itself do something (a
    // watchdog starts counting), and a FIFO would wait for a writer.
    let meta = std::fs::metadata(path).map_err(unreadable)?;
    if !meta.is_file() {
        return Err(refused(not_regular(meta.file_type())));
    }
    // Non-blocking, so that what became a FIFO since the look above cannot hold the
    // source; the descriptor is checked again below.
    let mut f = File::options()
        .read(true)
        .custom_flags(nix::libc::O_NONBLOCK | nix::libc::O_NOCTTY)
        .open(path)
        .map_err(unreadable)?;
    let meta = f.metadata().map_err(unreadable)?;
    if !meta.is_file() {
        return Err(refused(not_regular(meta.file_type())));
    }
    // procfs, sysfs and their kin report a size of 0 for files that go on for ever or
    // block (/proc/kmsg), and reading some of them takes what it reads from others.
    let fs = nix::sys::statfs::fstatfs(&f).map_err(|e| unreadable(e.into()))?;
    if let Some(name) = pseudo_filesystem(fs.filesystem_type()) {
        return Err(refused(format!(
            "is on {name}, not a real filesystem; only regular files on disk are read"
        )));
    }
    let too_large = |len: u64| {
        refused(format!(
            "file is {len} bytes or more, larger than the {MAX_MANIFEST_BYTES} bytes allowed"
        ))
    };
    if meta.len() > MAX_MANIFEST_BYTES {
        return Err(too_large(meta.len()));
    }
    // At most one byte past the bound, in case it grew since fstat.
    let mut bytes = Vec::with_capacity(usize::try_from(meta.len()).unwrap_or(0));
    (&mut f)
        .take(MAX_MANIFEST_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(unreadable)?;
    if bytes.len() as u64 > MAX_MANIFEST_BYTES {
        return Err(too_large(bytes.len() as u64));
    }
    // An empty file is what a power cut leaves of a manifest written but not yet
    // flushed (ext4 gives the new name with no blocks): as unreadable as a save cut
    // short, so it keeps the pods it gave before. Removing them takes removing it.
    if bytes.is_empty() {
        return Err(FileRead::Unreadable(SourceError::Manifest {
            file: file.clone(),
            reason: "file is empty (a write cut short by a power cut?)".into(),
        }));
    }
    String::from_utf8(bytes).map_err(|e| unreadable(io::Error::new(io::ErrorKind::InvalidData, e)))
}

fn not_regular(t: std::fs::FileType) -> String {
    let what = if t.is_fifo() {
        "a FIFO"
    } else if t.is_socket() {
        "a socket"
    } else if t.is_char_device() {
        "a character device"
    } else if t.is_block_device() {
        "a block device"
    } else if t.is_dir() {
        "a directory"
    } else {
        "not a regular file"
    };
    format!("is {what}, not a regular file; only regular files are read")
}

/// The kernel's own filesystems, whose files are views of kernel state, not data.
fn pseudo_filesystem(t: nix::sys::statfs::FsType) -> Option<&'static str> {
    use nix::sys::statfs::*;
    [
        (PROC_SUPER_MAGIC, "procfs"),
        (SYSFS_MAGIC, "sysfs"),
        (DEBUGFS_MAGIC, "debugfs"),
        (TRACEFS_MAGIC, "tracefs"),
        (SECURITYFS_MAGIC, "securityfs"),
        (CGROUP_SUPER_MAGIC, "cgroupfs"),
        (CGROUP2_SUPER_MAGIC, "cgroup2fs"),
        (BPF_FS_MAGIC, "bpffs"),
        (DEVPTS_SUPER_MAGIC, "devpts"),
        (SELINUX_MAGIC, "selinuxfs"),
        (SMACK_MAGIC, "smackfs"),
        (NSFS_MAGIC, "nsfs"),
        (RDTGROUP_SUPER_MAGIC, "resctrl"),
    ]
    .into_iter()
    .find(|(magic, _)| *magic == t)
    .map(|(_, name)| name)
}

fn check_kind(doc: &Value) -> Result<(), String> {
    let Value::Mapping(map) = doc else {
        return Err("expected a Pod object (a mapping), got something else".into());
    };
    let field = |key: &str| match map.get(key) {
        Some(Value::String(s)) => Some(s.as_str()),
        _ => None,
    };
    match (field("apiVersion"), field("kind")) {
        (Some("v1"), Some("Pod")) => Ok(()),
        (api, kind) => Err(format!(
            "expected apiVersion v1 and kind Pod, got apiVersion {} and kind {}: only pods can be static manifests",
            api.unwrap_or("<missing>"),
            kind.unwrap_or("<missing>")
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::TempDir;

    /// The reason the reader refused `path` for.
    fn refused(path: &Path) -> String {
        match read_bounded(path) {
            Err(FileRead::Read { pods, errors }) if pods.is_empty() && errors.len() == 1 => {
                errors[0].to_string()
            }
            Err(FileRead::Unreadable(e)) => panic!("unreadable, not refused: {e}"),
            Err(FileRead::Read { errors, .. }) => panic!("{errors:?}"),
            Ok(text) => panic!("read {} bytes", text.len()),
        }
    }

    #[test]
    fn a_fifo_is_refused_without_waiting_for_a_writer() {
        let dir = TempDir::new("fifo");
        let fifo = dir.0.join("pod.yaml");
        nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o600))
            .expect("mkfifo");
        let msg = refused(&fifo);
        assert!(
            msg.contains("pod.yaml") && msg.contains("is a FIFO"),
            "{msg}"
        );
    }

    #[test]
    fn kernel_files_are_refused_before_they_are_read() {
        // Regular files of size 0 whose reads never end or block.
        let dir = TempDir::new("proc");
        let link = dir.0.join("status.yaml");
        std::os::unix::fs::symlink("/proc/self/status", &link).expect("symlink");
        let msg = refused(&link);
        assert!(msg.contains("is on procfs"), "{msg}");
        if Path::new("/sys/kernel").exists() {
            let msg = refused(Path::new("/sys/kernel/uevent_seqnum"));
            assert!(msg.contains("is on sysfs"), "{msg}");
        }
        let msg = refused(Path::new("/dev/null"));
        assert!(msg.contains("is a character device"), "{msg}");
    }

    #[test]
    fn the_size_bound_is_kept() {
        let dir = TempDir::new("size");
        let at = dir.0.join("at.yaml");
        let limit = usize::try_from(MAX_MANIFEST_BYTES).expect("fits");
        std::fs::write(&at, "#".repeat(limit)).expect("write");
        assert_eq!(read_bounded(&at).ok().map(|t| t.len()), Some(limit));
        let past = dir.0.join("past.yaml");
        std::fs::write(&past, "#".repeat(limit + 1)).expect("write");
        let msg = refused(&past);
        assert!(
            msg.contains("larger than the 1048576 bytes allowed"),
            "{msg}"
        );
    }
}
