//! Image references normalised the way docker and the kubelet read them, so that
//! `busybox`, `library/busybox:latest` and `docker.io/library/busybox:latest` name one image.

use std::fmt;

use super::ImageError;

const DEFAULT_DOMAIN: &str = "docker.io";
const LEGACY_DEFAULT_DOMAIN: &str = "index.docker.io";
const OFFICIAL_REPO_PREFIX: &str = "library/";
const DEFAULT_TAG: &str = "latest";
const NAME_MAX: usize = 255;
const TAG_MAX: usize = 128;

/// A parsed, normalised image reference.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reference {
    /// Registry host, with port when given (`docker.io`, `registry.local:5000`).
    pub domain: String,
    /// Repository path below the registry (`library/busybox`).
    pub path: String,
    pub tag: Option<String>,
    /// `sha256:<hex>`.
    pub digest: Option<String>,
}

impl Reference {
    /// Parses and normalises `input`: the default registry and `library/` are filled in,
    /// and `:latest` is added when neither a tag nor a digest is given.
    pub fn parse(input: &str) -> Result<Self, ImageError> {
        let bad = |reason: &str| ImageError::BadReference {
            reference: input.to_string(),
            reason: reason.to_string(),
        };
        if input.is_empty() {
            return Err(bad("empty reference"));
        }
        let (rest, digest) = match input.split_once('@') {
            Some((rest, digest)) => {
                check_digest(digest).map_err(|reason| bad(&reason))?;
                (rest, Some(digest.to_string()))
            }
            None => (input, None),
        };
        // A colon after the last slash starts a tag; one before it is a registry port.
        let last_slash = rest.rfind('/').map_or(0, |i| i + 1);
        let (name, tag) = match rest[last_slash..].find(':') {
            Some(i) => {
                let at = last_slash + i;
                (&rest[..at], Some(rest[at + 1..].to_string()))
            }
            None => (rest, None),
        };
        if let Some(tag) = &tag {
            check_tag(tag).map_err(|reason| bad(&reason))?;
        }
        if name.is_empty() {
            return Err(bad("missing repository name"));
        }
        if name.len() > NAME_MAX {
            return Err(bad("repository name is longer than 255 characters"));
        }
        let (domain, path) = split_domain(name);
        check_domain(&domain).map_err(|reason| bad(&reason))?;
        check_path(&path).map_err(|reason| bad(&reason))?;
        let tag = match (&tag, &digest) {
            (None, None) => Some(DEFAULT_TAG.to_string()),
            _ => tag,
        };
        Ok(Reference {
            domain,
            path,
            tag,
            digest,
        })
    }

    /// `domain/path`, without tag or digest.
    pub fn name(&self) -> String {
        format!("{}/{}", self.domain, self.path)
    }
}

impl fmt::Display for Reference {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.domain, self.path)?;
        if let Some(tag) = &self.tag {
            write!(f, ":{tag}")?;
        }
        if let Some(digest) = &self.digest {
            write!(f, "@{digest}")?;
        }
        Ok(())
    }
}

/// Normalises `input` to its full string form.
pub fn normalize(input: &str) -> Result<String, ImageError> {
    Reference::parse(input).map(|r| r.to_string())
}

/// Whether `s` is a bare image id or digest (`sha256:<64 hex>`).
pub fn is_digest(s: &str) -> bool {
    check_digest(s).is_ok()
}

/// Checks a content digest. Only sha256 is stored, so other algorithms are refused here
/// rather than later as a missing blob.
pub fn check_digest(digest: &str) -> Result<(), String> {
    let Some((algo, hex)) = digest.split_once(':') else {
        return Err(format!("digest {digest:?} has no algorithm prefix"));
    };
    if algo != "sha256" {
        return Err(format!("unsupported digest algorithm {algo:?}"));
    }
    if hex.len() != 64
        || !hex
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    {
        return Err(format!(
            "sha256 digest must be 64 lowercase hex characters, got {hex:?}"
        ));
    }
    Ok(())
}

fn check_tag(tag: &str) -> Result<(), String> {
    let ok_first = tag
        .bytes()
        .next()
        .is_some_and(|b| b.is_ascii_alphanumeric() || b == b'_');
    let ok_rest = tag
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-'));
    if !ok_first || !ok_rest || tag.len() > TAG_MAX {
        return Err(format!(
            "tag {tag:?} must be 1-128 of [A-Za-z0-9_.-] and not start with '.' or '-'"
        ));
    }
    Ok(())
}

/// docker's rule: the first component is a registry when it has a dot, a colon, is
/// `localhost`, or has an uppercase letter (repository paths cannot).
fn split_domain(name: &str) -> (String, String) {
    let (domain, path) = match name.split_once('/') {
        Some((first, rest))
            if first.contains(['.', ':'])
                || first == "localhost"
                || first.chars().any(|c| c.is_ascii_uppercase()) =>
        {
            (first.to_string(), rest.to_string())
        }
        _ => (DEFAULT_DOMAIN.to_string(), name.to_string()),
    };
    let domain = if domain == LEGACY_DEFAULT_DOMAIN {
        DEFAULT_DOMAIN.to_string()
    } else {
        domain
    };
    let path = if domain == DEFAULT_DOMAIN && !path.contains('/') {
        format!("{OFFICIAL_REPO_PREFIX}{path}")
    } else {
        path
    };
    (domain, path)
}

fn check_domain(domain: &str) -> Result<(), String> {
    let (host, port) = match domain.rsplit_once(':') {
        Some((host, port)) => (host, Some(port)),
        None => (domain, None),
    };
    if let Some(port) = port {
        if port.is_empty() || !port.bytes().all(|b| b.is_ascii_digit()) {
            return Err(format!("registry port in {domain:?} must be digits"));
        }
    }
    let label_ok = |l: &str| {
        !l.is_empty()
            && l.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
            && !l.starts_with('-')
            && !l.ends_with('-')
    };
    if host.is_empty() || !host.split('.').all(label_ok) {
        return Err(format!("registry host {host:?} is not a valid host name"));
    }
    Ok(())
}

fn check_path(path: &str) -> Result<(), String> {
    for component in path.split('/') {
        if component.chars().any(|c| c.is_ascii_uppercase()) {
            return Err(format!(
                "repository name must be lowercase, got {component:?}"
            ));
        }
        if !path_component_ok(component) {
            return Err(format!(
                "repository path component {component:?} must be lowercase letters and digits separated by '.', '_', '__' or '-'"
            ));
        }
    }
    Ok(())
}

/// `[a-z0-9]+((\.|_|__|-+)[a-z0-9]+)*`
fn path_component_ok(c: &str) -> bool {
    let b = c.as_bytes();
    if b.is_empty() || !is_alnum(b[0]) || !is_alnum(b[b.len() - 1]) {
        return false;
    }
    let mut i = 0;
    while i < b.len() {
        if is_alnum(b[i]) {
            i += 1;
            continue;
        }
        let start = i;
        while i < b.len() && !is_alnum(b[i]) {
            i += 1;
        }
        let sep = &c[start..i];
        if !(sep == "." || sep == "_" || sep == "__" || sep.bytes().all(|x| x == b'-')) {
            return false;
        }
    }
    true
}

fn is_alnum(b: u8) -> bool {
    b.is_ascii_lowercase() || b.is_ascii_digit()
}

#[cfg(test)]
mod tests {
    use super::*;

    const HEX: &str = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";

    fn norm(s: &str) -> String {
        normalize(s).unwrap_or_else(|e| panic!("{s}: {e}"))
    }

    fn reason(s: &str) -> String {
        match normalize(s) {
            Err(ImageError::BadReference { reason, .. }) => reason,
            other => panic!("{s}: expected a bad reference, got {other:?}"),
        }
    }

    #[test]
    fn official_images_get_library_and_latest() {
        assert_eq!(norm("busybox"), "docker.io/library/busybox:latest");
        assert_eq!(norm("busybox:1.36"), "docker.io/library/busybox:1.36");
        assert_eq!(norm("library/busybox"), "docker.io/library/busybox:latest");
        assert_eq!(
            norm("index.docker.io/busybox"),
            "docker.io/library/busybox:latest"
        );
        assert_eq!(
            norm("docker.io/busybox"),
            "docker.io/library/busybox:latest"
        );
    }

    #[test]
    fn user_repos_and_registries() {
        assert_eq!(norm("foo/bar:1"), "docker.io/foo/bar:1");
        assert_eq!(
            norm("registry.local:5000/x/y"),
            "registry.local:5000/x/y:latest"
        );
        assert_eq!(norm("localhost/x"), "localhost/x:latest");
        assert_eq!(norm("localhost:5000/x:v2"), "localhost:5000/x:v2");
        assert_eq!(norm("quay.io/a/b/c:t_1.0-rc"), "quay.io/a/b/c:t_1.0-rc");
        assert_eq!(norm("foo__bar/a-b--c"), "docker.io/foo__bar/a-b--c:latest");
    }

    #[test]
    fn digests_are_kept_with_or_without_tag() {
        let d = format!("sha256:{HEX}");
        assert_eq!(
            norm(&format!("busybox@{d}")),
            format!("docker.io/library/busybox@{d}")
        );
        assert_eq!(
            norm(&format!("busybox:1.36@{d}")),
            format!("docker.io/library/busybox:1.36@{d}")
        );
        assert!(is_digest(&d));
        assert!(!is_digest("busybox"));
    }

    #[test]
    fn bad_references_say_why() {
        assert!(reason("Busybox").contains("lowercase"));
        assert!(reason("foo/Bar").contains("lowercase"));
        assert!(reason("busybox@sha256:abc").contains("64"));
        assert!(reason(&format!("busybox@sha256:{}", HEX.to_uppercase())).contains("64"));
        assert!(reason(&format!("busybox@md5:{HEX}")).contains("algorithm"));
        assert!(reason("busybox@").contains("algorithm"));
        assert!(reason("busybox:-x").contains("tag"));
        assert!(reason("busybox:").contains("tag"));
        assert!(reason("").contains("empty"));
        assert!(reason("a//b").contains("component"));
        assert!(reason("registry:x/y").contains("port"));
        assert!(reason(":tag").contains("missing"));
        assert!(reason(&"a".repeat(300)).contains("255"));
    }
}
