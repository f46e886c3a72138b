//! The CONNECT exchange, without IO: the request that asks a proxy for a tunnel to
//! `host:port` (with the proxy's credentials, when it has some), and the reading of its
//! answer. Shared by the blocking transport under ureq and the async dial of the tunnel.

use super::ProxyUrl;

/// The longest answer head a proxy may send to a CONNECT.
pub(super) const MAX_ANSWER: usize = 8 * 1024;

/// A tunnel the proxy did not open. Names the proxy without its credentials.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProxyError {
    /// 407, or 401 as some proxies (tinyproxy) answer a CONNECT they refuse to
    /// authenticate.
    #[error(
        "proxy {proxy} refused the CONNECT to {target}: {status} {reason} ({})",
        if *.sent_credentials { "the proxy URL's user and password were not accepted" }
        else { "the proxy asks for credentials and the proxy URL has none" }
    )]
    AuthRequired {
        proxy: String,
        target: String,
        status: u16,
        reason: String,
        sent_credentials: bool,
    },
    #[error("proxy {proxy} refused the CONNECT to {target}: {status} {reason}")]
    Refused {
        proxy: String,
        target: String,
        status: u16,
        reason: String,
    },
    #[error("proxy {proxy}: {what} (CONNECT to {target})")]
    Broken {
        proxy: String,
        target: String,
        what: String,
    },
}

/// The CONNECT request for `target` (`host:port`).
pub(super) fn request(proxy: &ProxyUrl, target: &str) -> Vec<u8> {
    let mut req = format!(
        "CONNECT {target} HTTP/1.1\r\nHost: {target}\r\nUser-Agent: {}\r\n",
        crate::wire::user_agent()
    );
    if let Some(credentials) = proxy.credentials() {
        req.push_str("Proxy-Authorization: Basic ");
        req.push_str(&crate::wire::base64_encode(credentials.as_bytes()));
        req.push_str("\r\n");
    }
    req.push_str("\r\n");
    req.into_bytes()
}

/// Reads the proxy's answer from the bytes received so far: `Ok(None)` while its head
/// is incomplete, `Ok(Some(n))` once the tunnel is open (`n` bytes of head to drop;
/// what follows is the destination's), or why it is not.
pub(super) fn answer(
    proxy: &ProxyUrl,
    target: &str,
    received: &[u8],
) -> Result<Option<usize>, ProxyError> {
    let Some(end) = received.windows(4).position(|w| w == b"\r\n\r\n") else {
        if received.len() >= MAX_ANSWER {
            return Err(broken(proxy, target, "answer head too long"));
        }
        return Ok(None);
    };
    let head = String::from_utf8_lossy(&received[..end]);
    let status_line = head.lines().next().unwrap_or_default();
    let mut parts = status_line.splitn(3, ' ');
    let version = parts.next().unwrap_or_default();
    let status = parts.next().and_then(|s| s.parse::<u16>().ok());
    let (true, Some(status)) = (version.starts_with("HTTP/1."), status) else {
        return Err(broken(
            proxy,
            target,
            "answered something other than HTTP/1",
        ));
    };
    // Text from outside: printable, and short.
    let reason: String = parts
        .next()
        .unwrap_or_default()
        .chars()
        .filter(|c| !c.is_control())
        .take(100)
        .collect();
    match status {
        200..=299 => Ok(Some(end + 4)),
        401 | 407 => Err(ProxyError::AuthRequired {
            proxy: proxy.to_string(),
            target: target.to_string(),
            status,
            reason,
            sent_credentials: proxy.credentials().is_some(),
        }),
        _ => Err(ProxyError::Refused {
            proxy: proxy.to_string(),
            target: target.to_string(),
            status,
            reason,
        }),
    }
}

/// The proxy closed the connection before its answer was whole.
pub(super) fn closed(proxy: &ProxyUrl, target: &str) -> ProxyError {
    broken(proxy, target, "closed the connection before answering")
}

pub(super) fn broken(proxy: &ProxyUrl, target: &str, what: &str) -> ProxyError {
    ProxyError::Broken {
        proxy: proxy.to_string(),
        target: target.to_string(),
        what: what.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn proxy(url: &str) -> ProxyUrl {
        ProxyUrl::parse(url).expect("proxy")
    }

    #[test]
    fn the_request_carries_the_credentials_to_the_proxy() {
        let req = request(&proxy("http://user:pa%20ss@p:3128"), "api.example:6443");
        let text = String::from_utf8(req).expect("utf8");
        assert!(text.starts_with("CONNECT api.example:6443 HTTP/1.1\r\nHost: api.example:6443\r\n"));
        // base64("user:pa ss")
        assert!(
            text.contains("\r\nProxy-Authorization: Basic dXNlcjpwYSBzcw==\r\n"),
            "{text}"
        );
        assert!(text.ends_with("\r\n\r\n"));
        let text = String::from_utf8(request(&proxy("p:3128"), "[fd00::1]:443")).expect("utf8");
        assert!(text.starts_with("CONNECT [fd00::1]:443 HTTP/1.1\r\n"));
        assert!(!text.contains("Proxy-Authorization"));
    }

    #[test]
    fn answers() {
        let p = proxy("http://user:secret@p:3128");
        let t = "api:6443";
        assert_eq!(answer(&p, t, b"HTTP/1.1 200 Conn"), Ok(None));
        let ok = b"HTTP/1.0 200 Connection established\r\nProxy-agent: x\r\n\r\n\x16\x03";
        assert_eq!(answer(&p, t, ok), Ok(Some(ok.len() - 2)));
        let e =
            answer(&p, t, b"HTTP/1.0 407 Proxy Authentication Required\r\n\r\n").expect_err("407");
        let text = e.to_string();
        assert!(
            text.contains("proxy http://***@p:3128 refused the CONNECT to api:6443: 407"),
            "{text}"
        );
        assert!(text.contains("were not accepted"), "{text}");
        assert!(!text.contains("secret"));
        let e = answer(&proxy("p:3128"), t, b"HTTP/1.1 407 x\r\n\r\n").expect_err("407");
        assert!(e.to_string().contains("the proxy URL has none"), "{e}");
        // tinyproxy's answer to a CONNECT with the wrong credentials.
        let e = answer(&p, t, b"HTTP/1.0 401 Unauthorized\r\n\r\n").expect_err("401");
        assert!(
            e.to_string().ends_with(
                "401 Unauthorized (the proxy URL's user and password \
                                          were not accepted)"
            ),
            "{e}"
        );
        let e = answer(&p, t, b"HTTP/1.1 403 Access vi\x07olation\r\n\r\n").expect_err("403");
        assert_eq!(
            e.to_string(),
            "proxy http://***@p:3128 refused the CONNECT to api:6443: 403 Access violation"
        );
        let e = answer(&p, t, b"SSH-2.0-OpenSSH\r\n\r\n").expect_err("not http");
        assert!(e.to_string().contains("other than HTTP/1"), "{e}");
        let long = vec![b'a'; MAX_ANSWER];
        assert!(answer(&p, t, &long).is_err());
    }
}
