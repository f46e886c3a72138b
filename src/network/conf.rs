//! Which CNI network pods join: the first valid configuration in the configuration
//! directory, in lexical order of file name (`.conflist`, `.conf`, `.json`), as
//! libcni's `ConfFiles` and containerd pick it; a single-plugin `.conf` counts as a
//! list of one. When the directory has none, holdfast's default — bridge with
//! host-local addresses from `podCIDR`, portmap for hostPort — written to
//! `<root-dir>/cni/net.d/` as a user would write it, so it can be read, copied and
//! edited like any other.

use std::path::{Path, PathBuf};

use serde_json::{json, Value};

use super::NetworkError;

/// The bridge holdfast's default network uses.
pub const DEFAULT_BRIDGE: &str = "holdfast0";
/// The default network's name (and its host-local IPAM directory's).
pub const DEFAULT_NETWORK: &str = "holdfast";
/// Where the default network's file goes, under the root dir.
pub const DEFAULT_FILE: &str = "cni/net.d/10-holdfast-bridge.conflist";
/// The default pod CIDR when `podCIDR` is unset (the range podman uses by default).
pub const DEFAULT_POD_CIDR: &str = "10.88.0.0/16";

/// A network configuration list and the file it came from.
#[derive(Debug, Clone, PartialEq)]
pub struct NetworkList {
    pub path: PathBuf,
    /// `{"cniVersion", "name", "plugins": [...]}`.
    pub list: Value,
}

impl NetworkList {
    pub fn name(&self) -> &str {
        self.list["name"].as_str().unwrap_or("")
    }
}

/// The network in `dir`, or None when it holds no valid configuration. Invalid files
/// are skipped with a warning, as libcni skips them.
pub fn load_dir(dir: &Path) -> Result<Option<NetworkList>, NetworkError> {
    let entries = match std::fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(source) => {
            return Err(NetworkError::Io {
                context: format!("list {}", dir.display()),
                source,
            })
        }
    };
    let mut files: Vec<PathBuf> = entries
        .flatten()
        .map(|e| e.path())
        .filter(|p| {
            matches!(
                p.extension().and_then(|e| e.to_str()),
                Some("conf" | "conflist" | "json")
            ) && p.is_file()
        })
        .collect();
    files.sort();
    for path in files {
        match load_file(&path) {
            Ok(list) => return Ok(Some(list)),
            Err(e) => log::warn!("{e}; skipped"),
        }
    }
    Ok(None)
}

/// One file, as a list.
pub fn load_file(path: &Path) -> Result<NetworkList, NetworkError> {
    let err = |reason: String| NetworkError::Config {
        path: path.to_owned(),
        reason,
    };
    let text = std::fs::read(path).map_err(|e| err(format!("read: {e}")))?;
    let v: Value = serde_json::from_slice(&text).map_err(|e| err(format!("not JSON: {e}")))?;
    let list = if path.extension().and_then(|e| e.to_str()) == Some("conflist") {
        v
    } else {
        if v.get("plugins").is_some() {
            return Err(err(
                "a .conf file holds one plugin; use .conflist for a list".into(),
            ));
        }
        json!({
            "cniVersion": v["cniVersion"].clone(),
            "name": v["name"].clone(),
            "plugins": [v.clone()],
        })
    };
    validate(&list).map_err(err)?;
    Ok(NetworkList {
        path: path.to_owned(),
        list,
    })
}

fn validate(list: &Value) -> Result<(), String> {
    let name = list["name"].as_str().unwrap_or("");
    if name.is_empty() {
        return Err("no network name".into());
    }
    if list["cniVersion"].as_str().is_none_or(str::is_empty) {
        return Err("no cniVersion".into());
    }
    let plugins = list["plugins"]
        .as_array()
        .filter(|p| !p.is_empty())
        .ok_or("no plugins")?;
    for p in plugins {
        if p["type"].as_str().is_none_or(str::is_empty) {
            return Err("a plugin has no type".into());
        }
    }
    Ok(())
}

/// holdfast's default network for pod addresses from `pod_cidr`, its host-local
/// leases kept in `ipam_dir`.
pub fn default_list(pod_cidr: &str, ipam_dir: &Path) -> Value {
    json!({
        "cniVersion": "1.0.0",
        "name": DEFAULT_NETWORK,
        "plugins": [
            {
                "type": "bridge",
                "bridge": DEFAULT_BRIDGE,
                "isGateway": true,
                "ipMasq": true,
                "hairpinMode": true,
                "ipam": {
                    "type": "host-local",
                    "ranges": [[{"subnet": pod_cidr}]],
                    "routes": [{"dst": "0.0.0.0/0"}],
                    "dataDir": ipam_dir,
                }
            },
            {
                "type": "portmap",
                "capabilities": {"portMappings": true}
            }
        ]
    })
}

/// The network pods join: the configured directory's, else the default, written
/// under `root` when it is not there yet or says something else.
pub fn select(conf_dir: &Path, root: &Path, pod_cidr: &str) -> Result<NetworkList, NetworkError> {
    if let Some(list) = load_dir(conf_dir)? {
        return Ok(list);
    }
    let path = root.join(DEFAULT_FILE);
    let list = default_list(pod_cidr, &root.join("cni/networks"));
    let text = serde_json::to_vec_pretty(&list).map_err(|e| NetworkError::Config {
        path: path.clone(),
        reason: format!("encode: {e}"),
    })?;
    if std::fs::read(&path).ok().as_deref() != Some(text.as_slice()) {
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).map_err(|source| NetworkError::Io {
                context: format!("create {}", dir.display()),
                source,
            })?;
        }
        std::fs::write(&path, &text).map_err(|source| NetworkError::Io {
            context: format!("write {}", path.display()),
            source,
        })?;
        log::info!(
            "no CNI network in {}: pods use holdfast's default, {}",
            conf_dir.display(),
            path.display()
        );
    }
    Ok(NetworkList { path, list })
}

/// The loopback network containerd sets up in every pod beside its own.
pub fn loopback() -> Value {
    json!({
        "cniVersion": "1.0.0",
        "name": "cni-loopback",
        "plugins": [{"type": "loopback"}]
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_valid_file_wins_and_a_conf_is_a_list_of_one() {
        let dir = crate::testutil::TempDir::new("cni-conf");
        let d = &dir.0;
        std::fs::write(d.join("00-broken.conflist"), b"{not json").expect("write");
        std::fs::write(
            d.join("05-noname.conflist"),
            br#"{"cniVersion":"1.0.0","plugins":[{"type":"bridge"}]}"#,
        )
        .expect("write");
        std::fs::write(
            d.join("10-mynet.conf"),
            br#"{"cniVersion":"0.4.0","name":"mynet","type":"bridge","bridge":"br9"}"#,
        )
        .expect("write");
        std::fs::write(
            d.join("20-other.conflist"),
            br#"{"cniVersion":"1.0.0","name":"other","plugins":[{"type":"ptp"}]}"#,
        )
        .expect("write");
        std::fs::write(d.join("99-ignored.txt"), b"x").expect("write");
        let got = load_dir(d).expect("load").expect("a network");
        assert_eq!(got.name(), "mynet");
        assert_eq!(got.list["cniVersion"], "0.4.0");
        assert_eq!(got.list["plugins"][0]["bridge"], "br9");
        assert!(load_dir(&d.join("missing")).expect("load").is_none());
    }

    #[test]
    fn the_default_is_written_where_a_user_can_read_it() {
        let dir = crate::testutil::TempDir::new("cni-default");
        let root = &dir.0;
        let conf_dir = root.join("etc-cni");
        let got = select(&conf_dir, root, "10.77.0.0/24").expect("select");
        assert_eq!(got.path, root.join(DEFAULT_FILE));
        let again = load_file(&got.path).expect("the file is a valid conflist");
        assert_eq!(again.list, got.list);
        let types: Vec<&str> = got.list["plugins"]
            .as_array()
            .expect("plugins")
            .iter()
            .filter_map(|p| p["type"].as_str())
            .collect();
        assert_eq!(types, ["bridge", "portmap"]);
        assert_eq!(
            got.list["plugins"][0]["ipam"]["ranges"][0][0]["subnet"],
            "10.77.0.0/24"
        );
        // A network of the user's own wins.
        std::fs::create_dir_all(&conf_dir).expect("mkdir");
        std::fs::write(
            conf_dir.join("50-site.conflist"),
            br#"{"cniVersion":"1.0.0","name":"site","plugins":[{"type":"macvlan"}]}"#,
        )
        .expect("write");
        assert_eq!(
            select(&conf_dir, root, "10.77.0.0/24")
                .expect("select")
                .name(),
            "site"
        );
    }
}
