//! The image's `User` (`uid`, `uid:gid`, `name`, `name:group`) as numeric ids, names
//! looked up in the image's own `/etc/passwd` and `/etc/group`. Layers are untrusted:
//! only a regular file reached without symlinks is read, so nothing outside a layer is.

use std::path::{Path, PathBuf};

use super::RuntimeError;

/// Resolves `user` against `layers` (lowest first, as images list them).
pub fn resolve(user: &str, layers: &[PathBuf]) -> Result<(u32, u32), RuntimeError> {
    let user = user.trim();
    if user.is_empty() {
        return Ok((0, 0));
    }
    let (user_part, group_part) = match user.split_once(':') {
        Some((u, g)) => (u, Some(g)),
        None => (user, None),
    };
    let (uid, primary_gid) = match user_part.parse::<u32>() {
        Ok(uid) => {
            // A numeric user still takes its primary group from passwd when listed there.
            let db = read_db(layers, "passwd")?.unwrap_or_default();
            let gid = find_entry(&db, |f| {
                f.get(2).and_then(|s| s.parse::<u32>().ok()) == Some(uid)
            })
            .and_then(|f| f.get(3).and_then(|s| s.parse().ok()))
            .unwrap_or(0);
            (uid, gid)
        }
        Err(_) => {
            let db = read_db(layers, "passwd")?.ok_or_else(|| no_db(user, "passwd"))?;
            let fields = find_entry(&db, |f| f.first() == Some(&user_part)).ok_or_else(|| {
                RuntimeError::Config(format!("image user {user:?}: no such user in /etc/passwd"))
            })?;
            let id = |i: usize| fields.get(i).and_then(|s| s.parse::<u32>().ok());
            match (id(2), id(3)) {
                (Some(uid), Some(gid)) => (uid, gid),
                _ => {
                    return Err(RuntimeError::Config(format!(
                        "image user {user:?}: malformed /etc/passwd entry"
                    )));
                }
            }
        }
    };
    let gid = match group_part {
        None | Some("") => primary_gid,
        Some(g) => match g.parse::<u32>() {
            Ok(gid) => gid,
            Err(_) => {
                let db = read_db(layers, "group")?.ok_or_else(|| no_db(user, "group"))?;
                find_entry(&db, |f| f.first() == Some(&g))
                    .and_then(|f| f.get(2).and_then(|s| s.parse().ok()))
                    .ok_or_else(|| {
                        RuntimeError::Config(format!(
                            "image user {user:?}: no such group in /etc/group"
                        ))
                    })?
            }
        },
    };
    Ok((uid, gid))
}

/// The groups the image's `/etc/group` lists user `uid` in, by its name in the image's
/// `/etc/passwd` (containerd adds them to the process's groups).
pub fn image_groups(uid: u32, layers: &[PathBuf]) -> Result<Vec<u32>, RuntimeError> {
    let Some(passwd) = read_db(layers, "passwd")? else {
        return Ok(Vec::new());
    };
    let Some(name) = find_entry(&passwd, |f| {
        f.get(2).and_then(|s| s.parse::<u32>().ok()) == Some(uid)
    })
    .and_then(|f| f.first().map(|n| (*n).to_owned())) else {
        return Ok(Vec::new());
    };
    let Some(group) = read_db(layers, "group")? else {
        return Ok(Vec::new());
    };
    Ok(group
        .lines()
        .filter(|l| !l.starts_with('#'))
        .map(|l| l.split(':').collect::<Vec<_>>())
        .filter(|f| {
            f.get(3)
                .is_some_and(|members| members.split(',').any(|m| m.trim() == name))
        })
        .filter_map(|f| f.get(2).and_then(|g| g.parse().ok()))
        .collect())
}

fn no_db(user: &str, db: &str) -> RuntimeError {
    RuntimeError::Config(format!("image user {user:?}: the image has no /etc/{db}"))
}

fn find_entry(db: &str, pred: impl Fn(&[&str]) -> bool) -> Option<Vec<&str>> {
    db.lines()
        .filter(|l| !l.starts_with('#'))
        .map(|l| l.split(':').collect::<Vec<_>>())
        .find(|f| pred(f))
}

/// `/etc/<name>` from the topmost layer that has it.
fn read_db(layers: &[PathBuf], name: &str) -> Result<Option<String>, RuntimeError> {
    for layer in layers.iter().rev() {
        let etc = layer.join("etc");
        let file = etc.join(name);
        if !is_plain(&etc, true) || !is_plain(&file, false) {
            continue;
        }
        // Enough for any real passwd file; a huge one is hostile.
        const MAX: u64 = 1 << 20;
        let len = std::fs::symlink_metadata(&file)
            .map(|m| m.len())
            .unwrap_or(0);
        if len > MAX {
            return Err(RuntimeError::Config(format!(
                "{} is too large",
                file.display()
            )));
        }
        return std::fs::read_to_string(&file)
            .map(Some)
            .map_err(|source| RuntimeError::Io {
                context: format!("read {}", file.display()),
                source,
            });
    }
    Ok(None)
}

fn is_plain(path: &Path, dir: bool) -> bool {
    match std::fs::symlink_metadata(path) {
        Ok(m) if dir => m.file_type().is_dir(),
        Ok(m) => m.file_type().is_file(),
        Err(_) => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn layer(root: &Path, name: &str, passwd: Option<&str>, group: Option<&str>) -> PathBuf {
        let dir = root.join(name);
        std::fs::create_dir_all(dir.join("etc")).expect("mkdir");
        if let Some(p) = passwd {
            std::fs::write(dir.join("etc/passwd"), p).expect("passwd");
        }
        if let Some(g) = group {
            std::fs::write(dir.join("etc/group"), g).expect("group");
        }
        dir
    }

    #[test]
    fn numeric_and_named_users() {
        let root = std::env::temp_dir().join(format!("holdfast-user-test-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        let base = layer(
            &root,
            "base",
            Some("root:x:0:0::/root:/bin/sh\nold:x:5:5::/:/bin/sh\n"),
            Some("root:x:0:\n"),
        );
        let top = layer(
            &root,
            "top",
            Some("root:x:0:0::/root:/bin/sh\napp:x:1000:1001::/app:/bin/sh\n"),
            None,
        );
        let empty = root.join("empty");
        std::fs::create_dir_all(&empty).expect("mkdir");
        let layers = vec![base, top, empty];

        assert_eq!(resolve("", &layers).ok(), Some((0, 0)));
        assert_eq!(resolve("1000", &layers).ok(), Some((1000, 1001)));
        assert_eq!(resolve("42", &layers).ok(), Some((42, 0)));
        assert_eq!(resolve("42:7", &layers).ok(), Some((42, 7)));
        assert_eq!(resolve("app", &layers).ok(), Some((1000, 1001)));
        // The top layer's passwd hides the base layer's.
        assert!(matches!(
            resolve("old", &layers),
            Err(RuntimeError::Config(_))
        ));
        assert_eq!(resolve("app:root", &layers).ok(), Some((1000, 0)));
        assert!(matches!(
            resolve("app:nogroup", &layers),
            Err(RuntimeError::Config(_))
        ));

        // A symlinked /etc/passwd is never followed.
        let evil = root.join("evil");
        std::fs::create_dir_all(evil.join("etc")).expect("mkdir");
        std::os::unix::fs::symlink("/etc/passwd", evil.join("etc/passwd")).expect("symlink");
        assert!(matches!(
            resolve("root", &[evil]),
            Err(RuntimeError::Config(_))
        ));
        let _ = std::fs::remove_dir_all(&root);
    }

    #[test]
    fn groups_the_image_lists_the_user_in() {
        let root =
            std::env::temp_dir().join(format!("holdfast-groups-test-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        let l = layer(
            &root,
            "l",
            Some("root:x:0:0::/root:/bin/sh\napp:x:1000:1000::/app:/bin/sh\n"),
            Some("root:x:0:\nwheel:x:10:root,app\naudio:x:29:app\nvideo:x:44:\n"),
        );
        assert_eq!(
            image_groups(1000, std::slice::from_ref(&l)).ok(),
            Some(vec![10, 29])
        );
        assert_eq!(
            image_groups(0, std::slice::from_ref(&l)).ok(),
            Some(vec![10])
        );
        assert_eq!(image_groups(4242, &[l]).ok(), Some(vec![]));
        let _ = std::fs::remove_dir_all(&root);
    }
}
