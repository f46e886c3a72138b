//! hostPath: a path of the host, checked against the volume's `type` as the kubelet
//! checks it (and made for the `...OrCreate` types).

use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::path::PathBuf;

use k8s_openapi::api::core::v1::HostPathVolumeSource;

use super::VolumeError;

/// The host path, after its type check.
pub fn setup(src: &HostPathVolumeSource) -> Result<PathBuf, VolumeError> {
    let path = PathBuf::from(&src.path);
    if !path.is_absolute() {
        return Err(VolumeError::Unsupported {
            volume: String::new(),
            reason: format!("hostPath {:?} is not absolute", src.path),
        });
    }
    let typ = src.type_.as_deref().unwrap_or("");
    let meta = std::fs::metadata(&path).ok();
    let fail = |what: &'static str| VolumeError::HostPathType {
        volume: String::new(),
        path: path.clone(),
        what,
    };
    let io = |context: String| move |source| VolumeError::Io { context, source };
    match typ {
        "" => {}
        "DirectoryOrCreate" if meta.is_none() => {
            std::fs::create_dir_all(&path).map_err(io(format!("create {}", path.display())))?;
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755))
                .map_err(io(format!("chmod {}", path.display())))?;
        }
        "DirectoryOrCreate" | "Directory" => {
            if !meta.is_some_and(|m| m.is_dir()) {
                return Err(fail("a directory"));
            }
        }
        "FileOrCreate" if meta.is_none() => {
            // As the kubelet: the file, not its parent directories.
            std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(&path)
                .map_err(io(format!("create {}", path.display())))?;
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644))
                .map_err(io(format!("chmod {}", path.display())))?;
        }
        "FileOrCreate" | "File" => {
            if !meta.is_some_and(|m| m.is_file()) {
                return Err(fail("a file"));
            }
        }
        "Socket" => {
            if !meta.is_some_and(|m| m.file_type().is_socket()) {
                return Err(fail("a socket file"));
            }
        }
        "CharDevice" => {
            if !meta.is_some_and(|m| m.file_type().is_char_device()) {
                return Err(fail("a character device"));
            }
        }
        "BlockDevice" => {
            if !meta.is_some_and(|m| m.file_type().is_block_device()) {
                return Err(fail("a block device"));
            }
        }
        other => {
            return Err(VolumeError::Unsupported {
                volume: String::new(),
                reason: format!("unknown hostPath type {other:?}"),
            })
        }
    }
    Ok(path)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::TempDir;
    use std::path::Path;

    fn src(path: &Path, typ: &str) -> HostPathVolumeSource {
        HostPathVolumeSource {
            path: path.display().to_string(),
            type_: Some(typ.into()),
        }
    }

    #[test]
    fn types_are_checked_and_made() {
        let dir = TempDir::new("hostpath");
        let d = dir.0.join("data");
        assert!(matches!(
            setup(&src(&d, "Directory")),
            Err(VolumeError::HostPathType {
                what: "a directory",
                ..
            })
        ));
        assert_eq!(setup(&src(&d, "DirectoryOrCreate")).expect("made"), d);
        assert!(d.is_dir());
        assert!(setup(&src(&d, "Directory")).is_ok());
        let err = setup(&src(&d, "File")).expect_err("not a file");
        assert_eq!(
            err.to_string(),
            format!("hostPath type check failed: {} is not a file", d.display())
        );
        let f = dir.0.join("state.db");
        setup(&src(&f, "FileOrCreate")).expect("made");
        assert!(f.is_file());
        assert!(matches!(
            setup(&src(&f, "DirectoryOrCreate")),
            Err(VolumeError::HostPathType { .. })
        ));
        assert!(setup(&src(Path::new("/dev/null"), "CharDevice")).is_ok());
        assert!(setup(&src(&f, "Socket")).is_err());
        assert!(setup(&src(&f, "BlockDevice")).is_err());
        assert!(setup(&src(&f, "Weird")).is_err());
        assert!(setup(&src(&dir.0.join("missing"), "")).is_ok());
    }
}
