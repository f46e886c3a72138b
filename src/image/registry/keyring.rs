//! Registry credentials as the kubelet finds them: docker `config.json` (`auths`, each
//! with a base64 `auth` or `username`/`password`), the legacy `.dockercfg`, and pod
//! `imagePullSecrets` of type `kubernetes.io/dockerconfigjson` or `kubernetes.io/dockercfg`.
//! Matching follows the kubelet's keyring: host (with `*` per label) and port equal, path
//! a prefix of the repository, `/v1/` and `/v2/` ignored, the most specific key first.
//!
//! Nothing here prints a password: `Credential`'s `Debug` is redacted and errors name the
//! file or secret, never a value.

use std::fmt;
use std::path::{Path, PathBuf};

use k8s_openapi::api::core::v1::Secret;
use serde_json::Value;

/// The Secret types that carry registry credentials.
pub const DOCKER_CONFIG_JSON: &str = "kubernetes.io/dockerconfigjson";
pub const DOCKER_CFG: &str = "kubernetes.io/dockercfg";

/// A username and password for one registry, and where it came from.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct Credential {
    pub username: String,
    pub password: String,
    /// `secret apps/regcred` or `file /root/.docker/config.json`, for messages.
    pub source: String,
}

impl fmt::Debug for Credential {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Credential")
            .field("username", &self.username)
            .field("password", &"<redacted>")
            .field("source", &self.source)
            .finish()
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct Entry {
    /// `host[:port]`, possibly with `*` labels.
    host: String,
    /// Path prefix without leading slash (`team/app`), or empty.
    path: String,
    credential: Credential,
}

/// Credentials in lookup order.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Keyring {
    entries: Vec<Entry>,
}

impl Keyring {
    /// Parses a docker `config.json` (`{"auths": {...}}`) or a legacy `.dockercfg` (the
    /// map itself). Entries with no usable credential are skipped.
    pub fn parse(bytes: &[u8], source: &str) -> Result<Keyring, String> {
        let value: Value =
            serde_json::from_slice(bytes).map_err(|e| format!("{source}: not JSON: {e}"))?;
        let auths = match value.get("auths") {
            Some(Value::Object(m)) => m.clone(),
            Some(_) => return Err(format!("{source}: \"auths\" is not an object")),
            None => match value {
                Value::Object(m) if !m.contains_key("credsStore") => m,
                Value::Object(_) => serde_json::Map::new(),
                _ => return Err(format!("{source}: expected a JSON object")),
            },
        };
        let mut entries = Vec::new();
        for (key, v) in auths {
            let Some(credential) = credential_of(&v, source, &key)? else {
                continue;
            };
            let (host, path) = split_key(&key);
            entries.push(Entry {
                host,
                path,
                credential,
            });
        }
        // The kubelet tries the most specific key first.
        entries.sort_by(|a, b| {
            let len = |e: &Entry| e.host.len() + e.path.len();
            len(b).cmp(&len(a))
        });
        Ok(Keyring { entries })
    }

    /// The keyring of the first of `paths` that exists (the kubelet's search order);
    /// empty when none does. A file that cannot be read or parsed is an error naming it.
    pub fn load_first(paths: &[PathBuf]) -> Result<Keyring, String> {
        for path in paths {
            match crate::yaml::read_bytes_bounded(path, crate::yaml::MAX_BYTES) {
                Ok(bytes) => return Keyring::parse(&bytes, &format!("file {}", path.display())),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
                Err(e) => return Err(format!("read {}: {e}", path.display())),
            }
        }
        Ok(Keyring::default())
    }

    /// One file, which must exist.
    pub fn load(path: &Path) -> Result<Keyring, String> {
        let bytes = crate::yaml::read_bytes_bounded(path, crate::yaml::MAX_BYTES)
            .map_err(|e| format!("read {}: {e}", path.display()))?;
        Keyring::parse(&bytes, &format!("file {}", path.display()))
    }

    /// A pull secret's credentials; an error names the secret only.
    pub fn from_secret(secret: &Secret) -> Result<Keyring, String> {
        let name = format!(
            "secret {}/{}",
            secret.metadata.namespace.as_deref().unwrap_or("default"),
            secret.metadata.name.as_deref().unwrap_or("")
        );
        let key = match secret.type_.as_deref() {
            Some(DOCKER_CONFIG_JSON) => ".dockerconfigjson",
            Some(DOCKER_CFG) => ".dockercfg",
            other => {
                return Err(format!(
                    "{name}: type {other:?} carries no registry credentials"
                ))
            }
        };
        let data = secret
            .data
            .as_ref()
            .and_then(|d| d.get(key))
            .ok_or_else(|| format!("{name}: no {key} key"))?;
        Keyring::parse(&data.0, &name)
    }

    /// Appends `other`'s entries after this one's (tried later).
    pub fn extend(&mut self, other: Keyring) {
        self.entries.extend(other.entries);
    }

    pub(crate) fn all(&self) -> impl Iterator<Item = &Credential> {
        self.entries.iter().map(|e| &e.credential)
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The credentials for repository `path` at registry `host`, in the order to try.
    pub fn lookup(&self, host: &str, path: &str) -> Vec<Credential> {
        let mut out: Vec<Credential> = Vec::new();
        for e in &self.entries {
            if host_matches(&e.host, host)
                && path_matches(&e.path, path)
                && !out.contains(&e.credential)
            {
                out.push(e.credential.clone());
            }
        }
        out
    }
}

fn credential_of(v: &Value, source: &str, key: &str) -> Result<Option<Credential>, String> {
    let field = |name: &str| {
        v.get(name)
            .and_then(Value::as_str)
            .filter(|s| !s.is_empty())
    };
    if let Some(auth) = field("auth") {
        let decoded = crate::wire::base64_decode(auth)
            .map_err(|e| format!("{source}: auths[{key:?}].auth: not base64 ({e})"))?;
        let text = String::from_utf8(decoded)
            .map_err(|_| format!("{source}: auths[{key:?}].auth: not UTF-8"))?;
        let (user, pass) = text
            .split_once(':')
            .ok_or_else(|| format!("{source}: auths[{key:?}].auth: not \"user:password\""))?;
        return Ok(Some(Credential {
            username: user.to_string(),
            password: pass.to_string(),
            source: source.to_string(),
        }));
    }
    match (field("username"), field("password")) {
        (Some(u), Some(p)) => Ok(Some(Credential {
            username: u.to_string(),
            password: p.to_string(),
            source: source.to_string(),
        })),
        _ => Ok(None),
    }
}

/// `https://index.docker.io/v1/` → ("docker.io", ""); `reg:5000/team` → ("reg:5000", "team").
fn split_key(key: &str) -> (String, String) {
    let rest = key
        .strip_prefix("https://")
        .or_else(|| key.strip_prefix("http://"))
        .unwrap_or(key);
    let (host, path) = rest.split_once('/').unwrap_or((rest, ""));
    let path = path
        .strip_prefix("v1/")
        .or_else(|| path.strip_prefix("v2/"))
        .unwrap_or(path)
        .trim_matches('/');
    let path = if path == "v1" || path == "v2" {
        ""
    } else {
        path
    };
    (canonical_host(&host.to_ascii_lowercase()), path.to_string())
}

/// Docker Hub goes by several names.
fn canonical_host(host: &str) -> String {
    match host {
        "index.docker.io" | "registry-1.docker.io" | "registry.hub.docker.com" => {
            "docker.io".to_string()
        }
        h => h.to_string(),
    }
}

fn host_matches(pattern: &str, host: &str) -> bool {
    let host = canonical_host(&host.to_ascii_lowercase());
    let split = |h: &str| -> (String, Option<String>) {
        match h.rsplit_once(':') {
            Some((name, port)) if port.bytes().all(|b| b.is_ascii_digit()) => {
                (name.to_string(), Some(port.to_string()))
            }
            _ => (h.to_string(), None),
        }
    };
    let (pn, pp) = split(pattern);
    let (hn, hp) = split(&host);
    if pp != hp {
        return false;
    }
    let pl: Vec<&str> = pn.split('.').collect();
    let hl: Vec<&str> = hn.split('.').collect();
    pl.len() == hl.len() && pl.iter().zip(&hl).all(|(p, h)| glob(p, h))
}

/// `*` matches any run of characters within one label.
fn glob(pattern: &str, s: &str) -> bool {
    match pattern.split_once('*') {
        None => pattern == s,
        Some((head, tail)) => {
            let Some(rest) = s.strip_prefix(head) else {
                return false;
            };
            (0..=rest.len()).any(|i| rest.is_char_boundary(i) && glob(tail, &rest[i..]))
        }
    }
}

fn path_matches(prefix: &str, path: &str) -> bool {
    prefix.is_empty()
        || path == prefix
        || path
            .strip_prefix(prefix)
            .is_some_and(|r| r.starts_with('/'))
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::ByteString;
    use std::collections::BTreeMap;

    #[test]
    fn base64_round_trips() {
        for s in ["", "a", "ab", "abc", "user:pa:ss", "ünïcode"] {
            let enc = crate::wire::base64_encode(s.as_bytes());
            let dec = crate::wire::base64_decode(&enc).expect("decode");
            assert_eq!(dec, s.as_bytes());
        }
        assert_eq!(crate::wire::base64_encode(b"user:pass"), "dXNlcjpwYXNz");
    }

    #[test]
    fn config_json_with_auth_and_username_password() {
        let json = br#"{"auths": {
            "https://index.docker.io/v1/": {"auth": "aHViOnNlY3JldA=="},
            "reg.local:5000": {"username": "u", "password": "p:w"},
            "reg.local:5000/team": {"auth": "dGVhbTp0ZWFtcHc="},
            "*.corp.example": {"auth": "Y29ycDpjb3Jw"},
            "empty.example": {}
        }}"#;
        let k = Keyring::parse(json, "file /x").expect("parse");
        let names = |host: &str, path: &str| -> Vec<String> {
            k.lookup(host, path)
                .into_iter()
                .map(|c| c.username)
                .collect()
        };
        assert_eq!(names("docker.io", "library/busybox"), ["hub"]);
        assert_eq!(names("reg.local:5000", "team/app"), ["team", "u"]);
        assert_eq!(names("reg.local:5000", "teamster/app"), ["u"]);
        assert_eq!(names("reg.local", "x"), Vec::<String>::new());
        assert_eq!(names("a.corp.example", "x"), ["corp"]);
        assert_eq!(names("a.b.corp.example", "x"), Vec::<String>::new());
        assert_eq!(names("empty.example", "x"), Vec::<String>::new());
        let u = &k.lookup("reg.local:5000", "x")[0];
        assert_eq!(u.password, "p:w");
        assert!(!format!("{u:?}").contains("p:w"));
    }

    #[test]
    fn legacy_dockercfg_and_secrets() {
        let cfg = br#"{"reg.local": {"auth": "YTpi", "email": "x@y"}}"#;
        let k = Keyring::parse(cfg, "file /x/.dockercfg").expect("parse");
        assert_eq!(k.lookup("reg.local", "x")[0].username, "a");

        let secret = |type_: &str, key: &str, data: &[u8]| Secret {
            metadata: k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
                name: Some("regcred".into()),
                namespace: Some("apps".into()),
                ..Default::default()
            },
            type_: Some(type_.into()),
            data: Some(BTreeMap::from([(
                key.to_string(),
                ByteString(data.to_vec()),
            )])),
            ..Default::default()
        };
        let s = secret(
            DOCKER_CONFIG_JSON,
            ".dockerconfigjson",
            br#"{"auths":{"reg.local":{"auth":"YTpi"}}}"#,
        );
        let k = Keyring::from_secret(&s).expect("secret");
        let c = &k.lookup("reg.local", "x")[0];
        assert_eq!(
            (c.username.as_str(), c.source.as_str()),
            ("a", "secret apps/regcred")
        );
        let legacy = secret(DOCKER_CFG, ".dockercfg", cfg);
        assert_eq!(
            Keyring::from_secret(&legacy)
                .expect("legacy")
                .lookup("reg.local", "x")
                .len(),
            1
        );
        let bad = secret(
            DOCKER_CONFIG_JSON,
            ".dockerconfigjson",
            b"{\"auths\":{\"r\":{\"auth\":\"!!\"}}}",
        );
        let e = Keyring::from_secret(&bad).expect_err("bad base64");
        assert!(
            e.contains("secret apps/regcred") && e.contains("base64"),
            "{e}"
        );
    }
}
