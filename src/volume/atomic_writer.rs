//! The kubelet's atomic writer: a volume's files are written into a new timestamped
//! directory (`..2026_11_23_03_12_45.123456789`), then the `..data` symlink is swapped
//! to it with one rename, so a container reading the volume sees all of the old files
//! or all of the new, never a mix. The names the user sees are symlinks through
//! `..data` (`key -> ..data/key`). A payload equal to what is there writes nothing
//! (the device stores to flash). Contents may be secret: never logged.

use std::collections::BTreeMap;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Component, Path, PathBuf};

use super::VolumeError;

const DATA: &str = "..data";
const DATA_TMP: &str = "..data_tmp";

/// One file of a payload. No `Debug`: it may hold a Secret's value.
#[derive(Clone, PartialEq)]
pub struct FileProjection {
    pub data: Vec<u8>,
    pub mode: u32,
    /// fsGroup: the file's group, and group read permission added.
    pub gid: Option<u32>,
}

/// Relative path (as `items[].path` gives it) to file.
pub type Payload = BTreeMap<String, FileProjection>;

/// Checks a payload path as the kubelet's `validatePath`: relative, no `..`
/// component, no `..`-prefixed first component, at most 4096 bytes.
pub fn validate_path(p: &str) -> Result<(), String> {
    if p.is_empty() {
        return Err("empty path".into());
    }
    if p.len() > 4096 {
        return Err(format!("path {p:?} is longer than 4096 bytes"));
    }
    let path = Path::new(p);
    if path.is_absolute() {
        return Err(format!("path {p:?} must be relative"));
    }
    if path.components().any(|c| matches!(c, Component::ParentDir)) {
        return Err(format!("path {p:?} must not contain '..'"));
    }
    if p.starts_with("..") {
        return Err(format!("path {p:?} must not start with '..'"));
    }
    Ok(())
}

/// Writes `payload` into `target` atomically; returns whether anything changed.
pub fn write(target: &Path, payload: &Payload, dir_gid: Option<u32>) -> Result<bool, VolumeError> {
    for p in payload.keys() {
        validate_path(p).map_err(|reason| VolumeError::Payload {
            dir: target.to_owned(),
            reason,
        })?;
    }
    let io = |what: &str, path: &Path| {
        let context = format!("{what} {}", path.display());
        move |source| VolumeError::Io { context, source }
    };
    std::fs::create_dir_all(target).map_err(io("create", target))?;
    let data_link = target.join(DATA);
    let old_dir: Option<PathBuf> = std::fs::read_link(&data_link).ok();
    if let Some(old) = &old_dir {
        if same_as(&target.join(old), payload)? {
            return Ok(false);
        }
    }

    let ts_name = timestamped_name();
    let ts_dir = target.join(&ts_name);
    std::fs::create_dir(&ts_dir).map_err(io("create", &ts_dir))?;
    std::fs::set_permissions(&ts_dir, std::fs::Permissions::from_mode(0o755))
        .map_err(io("chmod", &ts_dir))?;
    let written = write_files(&ts_dir, payload, dir_gid);
    if let Err(e) = written {
        let _ = std::fs::remove_dir_all(&ts_dir);
        return Err(e);
    }

    // The swap: a new symlink renamed over the old one.
    let tmp_link = target.join(DATA_TMP);
    let _ = std::fs::remove_file(&tmp_link);
    std::os::unix::fs::symlink(&ts_name, &tmp_link).map_err(io("symlink", &tmp_link))?;
    std::fs::rename(&tmp_link, &data_link).map_err(io("rename", &data_link))?;

    // The user-visible names: one symlink per top-level name of the payload.
    let wanted: Vec<String> = top_level(payload);
    for name in &wanted {
        let link = target.join(name);
        let want = Path::new(DATA).join(name);
        if std::fs::read_link(&link).ok().as_deref() != Some(want.as_path()) {
            let _ = std::fs::remove_file(&link);
            std::os::unix::fs::symlink(&want, &link).map_err(io("symlink", &link))?;
        }
    }
    // Names the new payload no longer has, and the old data.
    for e in std::fs::read_dir(target)
        .map_err(io("list", target))?
        .flatten()
    {
        let name = e.file_name().to_string_lossy().into_owned();
        if name.starts_with("..") || wanted.contains(&name) {
            continue;
        }
        let p = e.path();
        if p.symlink_metadata()
            .map(|m| m.file_type().is_symlink())
            .unwrap_or(false)
        {
            std::fs::remove_file(&p).map_err(io("remove", &p))?;
        }
    }
    if let Some(old) = old_dir {
        let old = target.join(old);
        if old != ts_dir {
            std::fs::remove_dir_all(&old).map_err(io("remove", &old))?;
        }
    }
    Ok(true)
}

fn write_files(dir: &Path, payload: &Payload, dir_gid: Option<u32>) -> Result<(), VolumeError> {
    use std::io::Write;
    for (rel, file) in payload {
        let path = dir.join(rel);
        if let Some(parent) = path.parent() {
            if !parent.exists() {
                std::fs::create_dir_all(parent).map_err(|source| VolumeError::Io {
                    context: format!("create {}", parent.display()),
                    source,
                })?;
            }
        }
        let io = |source| VolumeError::Io {
            context: format!("write {}", path.display()),
            source,
        };
        let mut f = std::fs::File::create(&path).map_err(io)?;
        f.write_all(&file.data).map_err(io)?;
        f.sync_all().map_err(io)?;
        let mut mode = file.mode & 0o7777;
        if let Some(gid) = file.gid {
            nix::unistd::chown(&path, None, Some(nix::unistd::Gid::from_raw(gid)))
                .map_err(|e| io(e.into()))?;
            // The kubelet's SetVolumeOwnership on a read-only volume: group read.
            mode |= 0o440;
        }
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).map_err(io)?;
    }
    if let Some(gid) = dir_gid {
        // Directories: the group, setgid, and group read and search.
        let mut dirs = vec![dir.to_owned()];
        while let Some(d) = dirs.pop() {
            for e in std::fs::read_dir(&d).into_iter().flatten().flatten() {
                if e.file_type().map(|t| t.is_dir()).unwrap_or(false) {
                    dirs.push(e.path());
                }
            }
            let io = |source| VolumeError::Io {
                context: format!("set group of {}", d.display()),
                source,
            };
            nix::unistd::chown(&d, None, Some(nix::unistd::Gid::from_raw(gid)))
                .map_err(|e| io(e.into()))?;
            let mode = std::fs::metadata(&d).map_err(io)?.mode() & 0o7777;
            std::fs::set_permissions(&d, std::fs::Permissions::from_mode(mode | 0o2550))
                .map_err(io)?;
        }
    }
    Ok(())
}

/// Whether `dir` already holds exactly `payload` (contents, modes and group).
fn same_as(dir: &Path, payload: &Payload) -> Result<bool, VolumeError> {
    let mut count = 0usize;
    let mut stack = vec![dir.to_owned()];
    while let Some(d) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&d) else {
            return Ok(false);
        };
        for e in entries.flatten() {
            let ft = match e.file_type() {
                Ok(t) => t,
                Err(_) => return Ok(false),
            };
            if ft.is_dir() {
                stack.push(e.path());
            } else {
                count += 1;
            }
        }
    }
    if count != payload.len() {
        return Ok(false);
    }
    for (rel, file) in payload {
        let p = dir.join(rel);
        let Ok(meta) = std::fs::symlink_metadata(&p) else {
            return Ok(false);
        };
        let mut mode = file.mode & 0o7777;
        if file.gid.is_some() {
            mode |= 0o440;
        }
        if !meta.is_file()
            || meta.mode() & 0o7777 != mode
            || file.gid.is_some_and(|g| g != meta.gid())
            || meta.len() != file.data.len() as u64
        {
            return Ok(false);
        }
        match std::fs::read(&p) {
            Ok(bytes) if bytes == file.data => {}
            _ => return Ok(false),
        }
    }
    Ok(true)
}

fn top_level(payload: &Payload) -> Vec<String> {
    let mut names: Vec<String> = payload
        .keys()
        .filter_map(|p| {
            Path::new(p)
                .components()
                .find(|c| matches!(c, Component::Normal(_)))
                .map(|c| c.as_os_str().to_string_lossy().into_owned())
        })
        .collect();
    names.dedup();
    names
}

/// `..` plus the time as the kubelet formats it (`2006_01_02_15_04_05.`) plus a
/// suffix that makes it unique.
fn timestamped_name() -> String {
    static SEQ: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let now = crate::time::now();
    let stamp = now.strftime("%Y_%m_%d_%H_%M_%S").to_string();
    let seq = SEQ.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    format!(
        "..{stamp}.{:09}{}{seq}",
        now.subsec_nanosecond(),
        std::process::id()
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::TempDir;

    fn file(data: &str, mode: u32) -> FileProjection {
        FileProjection {
            data: data.as_bytes().to_vec(),
            mode,
            gid: None,
        }
    }

    #[test]
    fn data_is_swapped_whole_and_stale_names_go() {
        let dir = TempDir::new("atomic-writer");
        let t = dir.0.join("vol");
        let mut payload = Payload::new();
        payload.insert("greeting".into(), file("hello", 0o644));
        payload.insert("conf/app.ini".into(), file("[a]\n", 0o600));
        assert!(write(&t, &payload, None).expect("write"));
        assert_eq!(
            std::fs::read_to_string(t.join("greeting")).expect("read"),
            "hello"
        );
        assert_eq!(
            std::fs::read_to_string(t.join("conf/app.ini")).expect("read"),
            "[a]\n"
        );
        assert_eq!(
            std::fs::read_link(t.join("greeting")).expect("link"),
            Path::new("..data/greeting")
        );
        let first = std::fs::read_link(t.join(DATA)).expect("..data");
        assert!(first.to_string_lossy().starts_with(".."), "{first:?}");
        let mode = std::fs::metadata(t.join("conf/app.ini"))
            .expect("meta")
            .mode()
            & 0o777;
        assert_eq!(mode, 0o600);

        // The same payload: nothing is written.
        assert!(!write(&t, &payload, None).expect("write"));
        assert_eq!(std::fs::read_link(t.join(DATA)).expect("..data"), first);

        // A changed payload: a new directory, the old one gone, a removed key gone.
        let mut next = Payload::new();
        next.insert("greeting".into(), file("bonjour", 0o644));
        assert!(write(&t, &next, None).expect("write"));
        let second = std::fs::read_link(t.join(DATA)).expect("..data");
        assert_ne!(first, second);
        assert!(!t.join(&first).exists());
        assert!(!t.join("conf").exists());
        assert_eq!(
            std::fs::read_to_string(t.join("greeting")).expect("read"),
            "bonjour"
        );
    }

    #[test]
    fn hostile_paths_are_refused() {
        for p in ["../x", "/etc/passwd", "a/../../b", "..data/x", ""] {
            assert!(validate_path(p).is_err(), "{p}");
        }
        assert!(validate_path("a/b.txt").is_ok());
        let dir = TempDir::new("atomic-writer-bad");
        let mut payload = Payload::new();
        payload.insert("../escape".into(), file("x", 0o644));
        assert!(matches!(
            write(&dir.0.join("v"), &payload, None),
            Err(VolumeError::Payload { .. })
        ));
        assert!(!dir.0.join("escape").exists());
    }

    #[test]
    fn fs_group_owns_files_with_group_read() {
        let dir = TempDir::new("atomic-writer-gid");
        let t = dir.0.join("vol");
        let mut payload = Payload::new();
        payload.insert(
            "secret".into(),
            FileProjection {
                data: b"s3cr3t".to_vec(),
                mode: 0o400,
                gid: Some(4321),
            },
        );
        write(&t, &payload, Some(4321)).expect("write");
        let meta = std::fs::metadata(t.join("secret")).expect("meta");
        assert_eq!(meta.gid(), 4321);
        assert_eq!(meta.mode() & 0o777, 0o440);
        let data_dir = t.join(std::fs::read_link(t.join(DATA)).expect("..data"));
        let dmeta = std::fs::metadata(&data_dir).expect("meta");
        assert_eq!(dmeta.gid(), 4321);
        assert_ne!(dmeta.mode() & 0o2000, 0, "setgid");
        assert!(!write(&t, &payload, Some(4321)).expect("write"));
    }
}
