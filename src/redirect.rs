//! redirect: where an HTTP redirect leads, and the origin (scheme, host and port) that
//! decides whether a hop is still the host credentials were meant for. Shared by every
//! client that follows redirects itself so that credentials stay home (the registry
//! client, the static pod URL source). Pure functions; no IO.

/// `https://h:1/v2/x` → `h:1`.
pub fn host_of(url: &str) -> &str {
    let rest = url.split_once("://").map_or(url, |(_, r)| r);
    rest.split(['/', '?', '#']).next().unwrap_or(rest)
}

/// `HTTPS://Reg.Example/v2/x` → `https://reg.example:443`: the scheme, host and port
/// credentials are bound to, compared without regard to case or a default port.
pub fn origin(url: &str) -> String {
    let (scheme, _) = url.split_once("://").unwrap_or(("", url));
    let scheme = scheme.to_ascii_lowercase();
    let authority = host_of(url);
    // Userinfo is no part of where a request goes.
    let authority = authority.rsplit_once('@').map_or(authority, |(_, h)| h);
    let authority = authority.to_ascii_lowercase();
    let has_port = match authority.rsplit_once(':') {
        // `[::1]` has colons of its own; a port comes after the bracket.
        Some((_, port)) => !port.contains(']') && !port.is_empty(),
        None => false,
    };
    if has_port {
        return format!("{scheme}://{authority}");
    }
    let port = match scheme.as_str() {
        "http" => "80",
        _ => "443",
    };
    format!("{scheme}://{authority}:{port}")
}

/// Where a redirect from `url` to `location` leads; Err (the reason) for a redirect
/// from https down to plain http, which would put what https protects on the wire.
pub fn follow(url: &str, location: &str) -> Result<String, String> {
    let next = join_url(url, location);
    let scheme = |u: &str| u.split_once("://").map(|(s, _)| s.to_ascii_lowercase());
    if scheme(url).as_deref() == Some("https") && scheme(&next).as_deref() != Some("https") {
        return Err(format!("refusing a redirect from https to {next}"));
    }
    Ok(next)
}

/// Resolves a `Location` against the URL it came from.
fn join_url(base: &str, location: &str) -> String {
    if location.contains("://") {
        return location.to_string();
    }
    let (scheme, rest) = base.split_once("://").unwrap_or(("https", base));
    let host = rest.split(['/', '?', '#']).next().unwrap_or(rest);
    if let Some(abs) = location.strip_prefix("//") {
        return format!("{scheme}://{abs}");
    }
    if location.starts_with('/') {
        return format!("{scheme}://{host}{location}");
    }
    let path = rest.split(['?', '#']).next().unwrap_or(rest);
    let dir = path.rsplit_once('/').map_or(path, |(d, _)| d);
    format!("{scheme}://{dir}/{location}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn locations_resolve_against_the_request() {
        let base = "https://reg:5000/v2/x/blobs/sha256:ab";
        assert_eq!(
            join_url(base, "https://s3.example/b?sig=1"),
            "https://s3.example/b?sig=1"
        );
        assert_eq!(join_url(base, "/other/path"), "https://reg:5000/other/path");
        assert_eq!(join_url(base, "//cdn.example/p"), "https://cdn.example/p");
        assert_eq!(join_url(base, "rel"), "https://reg:5000/v2/x/blobs/rel");
        assert_eq!(host_of("https://reg:5000/v2/"), "reg:5000");
        assert_eq!(host_of("https://s3.example?x"), "s3.example");
    }

    #[test]
    fn origins_compare_scheme_host_and_port() {
        assert_eq!(
            origin("https://Reg.Example/v2/x"),
            "https://reg.example:443"
        );
        assert_eq!(
            origin("https://reg.example:443/token?x"),
            origin("HTTPS://REG.example/v2/")
        );
        assert_ne!(origin("https://reg:5000/a"), origin("https://reg:5001/a"));
        assert_ne!(origin("https://reg/a"), origin("http://reg/a"));
        assert_eq!(origin("http://u:p@reg/a"), "http://reg:80");
        assert_eq!(origin("https://[::1]/v2/"), "https://[::1]:443");
        assert_eq!(origin("https://[::1]:5000/v2/"), "https://[::1]:5000");
    }

    #[test]
    fn https_never_leads_down_to_http() {
        assert_eq!(
            follow("https://a/x", "https://b/y").as_deref(),
            Ok("https://b/y")
        );
        assert_eq!(follow("http://a/x", "/y").as_deref(), Ok("http://a/y"));
        assert!(follow("https://a/x", "http://a/y")
            .expect_err("refused")
            .contains("refusing a redirect from https to http://a/y"));
    }
}
