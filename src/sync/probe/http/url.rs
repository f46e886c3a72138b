//! probe::http::url: where one GET of an httpGet action goes: the first URL built as
//! the kubelet builds it, and each redirect's Location resolved against the last one.

use super::super::net::{join_host_port, unbracket};
use super::{HttpError, HttpGet};

/// Where one GET goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Url {
    /// Lowercase; only `http` and `https` are fetched.
    pub(super) scheme: String,
    /// Without brackets.
    pub(super) host: String,
    pub(super) port: u16,
    /// As it goes in the URL and, by default, the Host header.
    pub(super) authority: String,
    /// Path and query, escaped for the request line.
    pub(super) target: String,
}

impl Url {
    pub(super) fn first(req: &HttpGet) -> Url {
        let host = unbracket(&req.host).to_string();
        Url {
            scheme: if req.https { "https" } else { "http" }.to_string(),
            authority: join_host_port(&host, req.port),
            host,
            port: req.port,
            target: request_target(&req.path),
        }
    }

    /// `location` resolved against this URL (RFC 3986 section 5, as Go's client does).
    pub(super) fn resolve(&self, location: &str) -> Result<Url, HttpError> {
        let bad = |reason: &str| HttpError::Location {
            location: location.to_string(),
            reason: reason.to_string(),
        };
        let loc = location.trim();
        let loc = loc.split('#').next().unwrap_or_default();
        let (scheme, rest) = if has_scheme(loc) {
            let (scheme, rest) = loc.split_once(':').ok_or_else(|| bad("missing scheme"))?;
            (scheme.to_ascii_lowercase(), rest)
        } else {
            (self.scheme.clone(), loc)
        };
        if let Some(rest) = rest.strip_prefix("//") {
            let end = rest.find(['/', '?']).unwrap_or(rest.len());
            let (authority, path) = rest.split_at(end);
            let (host, port, authority) = parse_authority(authority, &scheme).map_err(bad)?;
            let path = if path.starts_with('/') || path.is_empty() {
                remove_dot_segments(path)
            } else {
                format!("/{path}")
            };
            return Ok(Url {
                scheme,
                host,
                port,
                authority,
                target: request_target(&path),
            });
        }
        if scheme != self.scheme {
            return Err(bad("a URL with a scheme needs an authority"));
        }
        let (base_path, base_query) = match self.target.split_once('?') {
            Some((p, q)) => (p, Some(q)),
            None => (self.target.as_str(), None),
        };
        let target = if rest.is_empty() {
            match base_query {
                Some(q) => format!("{base_path}?{q}"),
                None => base_path.to_string(),
            }
        } else if rest.starts_with('?') {
            format!("{base_path}{rest}")
        } else if rest.starts_with('/') {
            remove_dot_segments(rest)
        } else {
            let dir = match base_path.rfind('/') {
                Some(i) => &base_path[..=i],
                None => "/",
            };
            remove_dot_segments(&format!("{dir}{rest}"))
        };
        Ok(Url {
            target: request_target(&target),
            ..self.clone()
        })
    }
}

impl std::fmt::Display for Url {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}://{}{}", self.scheme, self.authority, self.target)
    }
}

/// Whether a URL reference starts with a scheme (`http:`), as against a path.
pub(super) fn has_scheme(reference: &str) -> bool {
    let Some((scheme, _)) = reference.split_once(':') else {
        return false;
    };
    let mut chars = scheme.chars();
    chars.next().is_some_and(|c| c.is_ascii_alphabetic())
        && chars.all(|c| c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.'))
}

/// `(host without brackets, port, authority without user info)` of `[user@]host[:port]`.
fn parse_authority(authority: &str, scheme: &str) -> Result<(String, u16, String), &'static str> {
    let hostport = authority.rsplit_once('@').map_or(authority, |(_, h)| h);
    let (host, port) = if let Some(rest) = hostport.strip_prefix('[') {
        let (host, after) = rest.split_once(']').ok_or("unclosed IPv6 bracket")?;
        match after.strip_prefix(':') {
            Some(port) => (host, Some(port)),
            None if after.is_empty() => (host, None),
            None => return Err("junk after the IPv6 literal"),
        }
    } else {
        match hostport.split_once(':') {
            Some((host, port)) => (host, Some(port)),
            None => (hostport, None),
        }
    };
    if host.is_empty() {
        return Err("no host");
    }
    let port = match port.filter(|p| !p.is_empty()) {
        Some(p) => p.parse::<u16>().map_err(|_| "invalid port")?,
        None if scheme == "https" => 443,
        None => 80,
    };
    Ok((host.to_string(), port, hostport.to_string()))
}

/// RFC 3986 section 5.2.4 on the path part; the query is kept as it is.
fn remove_dot_segments(target: &str) -> String {
    let (path, query) = match target.split_once('?') {
        Some((p, q)) => (p, Some(q)),
        None => (target, None),
    };
    let mut out: Vec<&str> = Vec::new();
    let segments: Vec<&str> = path.split('/').skip(1).collect();
    for (i, segment) in segments.iter().enumerate() {
        let last = i + 1 == segments.len();
        match *segment {
            "." => {
                if last {
                    out.push("");
                }
            }
            ".." => {
                out.pop();
                if last {
                    out.push("");
                }
            }
            s => out.push(s),
        }
    }
    let mut path = String::from("/");
    path.push_str(&out.join("/"));
    match query {
        Some(q) => format!("{path}?{q}"),
        None => path,
    }
}

/// The request line's target for a spec path: a leading `/`, no fragment, and what may
/// not stand in a request line percent-escaped (Go's client escapes the same; `%` is
/// taken as an escape already made).
fn request_target(path: &str) -> String {
    let path = path.split('#').next().unwrap_or_default();
    let mut out = String::with_capacity(path.len() + 1);
    if !path.starts_with('/') {
        out.push('/');
    }
    for &b in path.as_bytes() {
        if b.is_ascii_graphic()
            && !matches!(
                b,
                b'"' | b'<' | b'>' | b'\\' | b'^' | b'`' | b'{' | b'|' | b'}'
            )
        {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_targets_are_escaped_as_go_escapes_them() {
        assert_eq!(request_target(""), "/");
        assert_eq!(request_target("healthz"), "/healthz");
        assert_eq!(request_target("/a b?q=1#frag"), "/a%20b?q=1");
        assert_eq!(request_target("/ok%20already"), "/ok%20already");
        assert_eq!(request_target("/é"), "/%C3%A9");
    }

    #[test]
    fn locations_resolve_against_the_request() {
        let base = Url::first(&HttpGet {
            https: false,
            host: "::1".to_string(),
            port: 8080,
            path: "/a/b?q".to_string(),
            headers: Vec::new(),
        });
        assert_eq!(base.to_string(), "http://[::1]:8080/a/b?q");
        let resolve = |loc: &str| base.resolve(loc).expect("resolves").to_string();
        assert_eq!(resolve("c"), "http://[::1]:8080/a/c");
        assert_eq!(resolve("../c"), "http://[::1]:8080/c");
        assert_eq!(resolve("/x/./y/../z"), "http://[::1]:8080/x/z");
        assert_eq!(resolve("?r"), "http://[::1]:8080/a/b?r");
        assert_eq!(resolve("//other:9/p"), "http://other:9/p");
        assert_eq!(resolve("HTTPS://user@[fe80::1]/"), "https://[fe80::1]/");
        let other = base.resolve("https://host.example/p").expect("resolves");
        assert_eq!((other.host.as_str(), other.port), ("host.example", 443));
        assert!(base.resolve("http://:80/").is_err());
        assert!(base.resolve("http://h:99999/").is_err());
    }
}
