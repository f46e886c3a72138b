//! The host paths static pods may use (`holdfast.staticPodAllowedHostPaths`): prefixes
//! compared component by component on canonical paths, symlinks resolved, so that
//! `/data` allows `/data/app` but neither `/database` nor a link in `/data` to `/etc`.
//! Unset, every path is allowed (the kubelet leaves hostPath to the cluster's
//! admission, which a standalone gateway does not have).

use std::ffi::OsString;
use std::path::{Component, Path, PathBuf};

use k8s_openapi::api::core::v1::Pod;

/// The config key, as messages name it.
pub const KEY: &str = "holdfast.staticPodAllowedHostPaths";

/// `path` with every symlink resolved: the longest part of it that exists,
/// canonicalised, then the rest, which does not exist yet (and so is no link). A `..`
/// is refused (the API refuses it in a hostPath too), and so is a dangling link, which
/// a `DirectoryOrCreate` would follow to wherever it points.
pub fn resolve(path: &Path) -> Result<PathBuf, String> {
    if !path.is_absolute() {
        return Err(format!("{} is not absolute", path.display()));
    }
    if path.components().any(|c| c == Component::ParentDir) {
        return Err(format!("{} contains '..'", path.display()));
    }
    let mut existing = path.to_path_buf();
    let mut missing: Vec<OsString> = Vec::new();
    loop {
        match std::fs::canonicalize(&existing) {
            Ok(mut found) => {
                found.extend(missing.iter().rev());
                return Ok(found);
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                if std::fs::symlink_metadata(&existing).is_ok() {
                    return Err(format!("{} is a symlink to nowhere", existing.display()));
                }
                let Some(name) = existing.file_name().map(OsString::from) else {
                    return Err(format!("resolve {}: {e}", path.display()));
                };
                missing.push(name);
                existing.pop();
            }
            Err(e) => return Err(format!("resolve {}: {e}", path.display())),
        }
    }
}

/// `path` resolved, if it is under one of the `allowed` prefixes (each resolved too);
/// else why not, naming the list.
pub fn check(path: &str, allowed: &[PathBuf]) -> Result<PathBuf, String> {
    let resolved = resolve(Path::new(path))?;
    let under = allowed
        .iter()
        .any(|prefix| resolve(prefix).is_ok_and(|p| resolved.starts_with(&p)));
    if under {
        return Ok(resolved);
    }
    let list = allowed
        .iter()
        .map(|p| p.display().to_string())
        .collect::<Vec<_>>()
        .join(", ");
    let seen = if resolved == Path::new(path) {
        String::new()
    } else {
        format!(" (resolves to {})", resolved.display())
    };
    Err(format!(
        "{path}{seen} is not under {KEY} ({})",
        if list.is_empty() { "empty" } else { &list }
    ))
}

/// Why `pod` may not run under the allow list: its first hostPath volume outside it.
pub fn refusal(pod: &Pod, allowed: &[PathBuf]) -> Option<String> {
    let volumes = pod.spec.as_ref()?.volumes.as_ref()?;
    volumes.iter().find_map(|v| {
        let h = v.host_path.as_ref()?;
        check(&h.path, allowed)
            .err()
            .map(|why| format!("hostPath volume {:?}: {why}", v.name))
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::TempDir;

    #[test]
    fn prefixes_match_whole_components() {
        let dir = TempDir::new("hostpath-allow");
        let data = dir.0.join("data");
        std::fs::create_dir_all(data.join("app")).expect("mkdir");
        std::fs::create_dir_all(dir.0.join("database")).expect("mkdir");
        let allowed = [data.clone()];
        let ok = |p: &Path| check(&p.display().to_string(), &allowed);
        assert_eq!(ok(&data).expect("itself"), data.canonicalize().expect("c"));
        assert!(ok(&data.join("app")).is_ok());
        // Not there yet: what DirectoryOrCreate would make.
        assert_eq!(
            ok(&data.join("new/deeper")).expect("below"),
            data.canonicalize().expect("c").join("new/deeper")
        );
        let err = ok(&dir.0.join("database")).expect_err("a longer name");
        assert!(
            err.contains("is not under holdfast.staticPodAllowedHostPaths"),
            "{err}"
        );
        assert!(ok(Path::new("/etc")).is_err());
        assert!(ok(Path::new("/")).is_err());
        assert!(check("/etc", &[]).expect_err("none").contains("(empty)"));
    }

    #[test]
    fn links_and_backsteps_do_not_lead_out() {
        let dir = TempDir::new("hostpath-allow-links");
        let data = dir.0.join("data");
        std::fs::create_dir_all(&data).expect("mkdir");
        std::os::unix::fs::symlink("/etc", data.join("etc")).expect("link");
        std::os::unix::fs::symlink(dir.0.join("nowhere"), data.join("dangling")).expect("link");
        let allowed = [data.clone()];
        let err = check(&data.join("etc").display().to_string(), &allowed).expect_err("out");
        assert!(err.contains("(resolves to /etc)"), "{err}");
        let err =
            check(&data.join("dangling/x").display().to_string(), &allowed).expect_err("dangling");
        assert!(err.contains("a symlink to nowhere"), "{err}");
        let back = format!("{}/../database", data.display());
        assert!(check(&back, &allowed).expect_err("..").contains("'..'"));
        assert!(check("relative/path", &allowed).is_err());
        // The allowed prefix itself through a link: what it points to is allowed.
        let via = dir.0.join("via");
        std::os::unix::fs::symlink(&data, &via).expect("link");
        assert!(check(&data.join("x").display().to_string(), &[via]).is_ok());
    }

    #[test]
    fn a_pod_is_refused_for_its_first_volume_outside() {
        let pod: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "p"},
            "spec": {"containers": [], "volumes": [
                {"name": "tmp", "emptyDir": {}},
                {"name": "cfg", "hostPath": {"path": "/etc"}},
            ]},
        }))
        .expect("pod");
        let why = refusal(&pod, &[PathBuf::from("/var/lib/holdfast-test-none")]).expect("refused");
        assert!(
            why.starts_with("hostPath volume \"cfg\": /etc is not under"),
            "{why}"
        );
        assert_eq!(refusal(&pod, &[PathBuf::from("/etc")]), None);
    }
}
