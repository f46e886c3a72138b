//! hostPath: a path of the host, checked against the volume's `type` as the kubelet
//! checks it (and made for the `...OrCreate` types).

use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::path::PathBuf;

use k8s_openapi::api::core::v1::HostPathVolumeSource;

use super::VolumeError;

/// The host path, after its type check. Under an allow list (`allowed`) it must be
/// inside it, checked before anything is made, and is given with its links resolved.
pub fn setup(
    src: &HostPathVolumeSource,
    allowed: Option<&[PathBuf]>,
) -> Result<PathBuf, VolumeError> {
    let mut path = PathBuf::from(&src.path);
    if !path.is_absolute() {
        return Err(VolumeError::Unsupported {
            volume: String::new(),
            reason: format!("hostPath {:?} is not absolute", src.path),
        });
    }
    if let Some(allowed) = allowed {
        path = super::host_path_allow::check(&src.path, allowed).map_err(|reason| {
            VolumeError::HostPathForbidden {
                volume: String::new(),
                reason,
            }
        })?;
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

    fn setup_any(src: &HostPathVolumeSource) -> Result<PathBuf, VolumeError> {
        setup(src, None)
    }

    #[test]
    fn outside_the_allow_list_nothing_is_made() {
        let dir = TempDir::new("hostpath-allowed");
        let allowed = [dir.0.join("data")];
        let outside = dir.0.join("other/made");
        let err = setup(&src(&outside, "DirectoryOrCreate"), Some(&allowed)).expect_err("out");
        assert!(
            matches!(err, VolumeError::HostPathForbidden { .. }),
            "{err}"
        );
        assert!(!outside.exists());
        let inside = allowed[0].join("made");
        assert!(setup(&src(&inside, "DirectoryOrCreate"), Some(&allowed)).is_ok());
        assert!(inside.is_dir());
    }

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
            setup_any(&src(&d, "Directory")),
            Err(VolumeError::HostPathType {
                what: "a directory",
                ..
            })
        ));
        assert_eq!(setup_any(&src(&d, "DirectoryOrCreate")).expect("made"), d);
        assert!(d.is_dir());
        assert!(setup_any(&src(&d, "Directory")).is_ok());
        let err = setup_any(&src(&d, "File")).expect_err("not a file");
        assert_eq!(
            err.to_string(),
            format!("hostPath type check failed: {} is not a file", d.display())
        );
        let f = dir.0.join("state.db");
        setup_any(&src(&f, "FileOrCreate")).expect("made");
        assert!(f.is_file());
        assert!(matches!(
            setup_any(&src(&f, "DirectoryOrCreate")),
            Err(VolumeError::HostPathType { .. })
        ));
        assert!(setup_any(&src(Path::new("/dev/null"), "CharDevice")).is_ok());
        assert!(setup_any(&src(&f, "Socket")).is_err());
        assert!(setup_any(&src(&f, "BlockDevice")).is_err());
        assert!(setup_any(&src(&f, "Weird")).is_err());
        assert!(setup_any(&src(&dir.0.join("missing"), "")).is_ok());
    }
}
