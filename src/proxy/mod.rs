//! proxy: which HTTP proxy a connection out of the node goes through, and the CONNECT
//! tunnel through it. One set of rules for the apiserver client (`kube`), the registry
//! client (`image::registry`) and the konnectivity dial (`tunnel`), read the way Go
//! programs (the kubelet, client-go) read `HTTPS_PROXY`, `HTTP_PROXY` and `NO_PROXY`.
//!
//! Every destination, `https://` or `http://`, is reached through a CONNECT tunnel: the
//! proxy sees a host and port and carries bytes; TLS runs end to end. The proxy's
//! credentials (`http://user:pass@proxy:3128`) go to the proxy only, in
//! `Proxy-Authorization` on the CONNECT, and never appear in a message: a proxy is
//! shown as `http://***@proxy:3128`.
//!
//! Reads no environment and no file: the config module hands over the rules, and the
//! composition root installs them once ([`install`]), as Go reads its environment once
//! per process. Knows nothing of what the connections carry.

mod dial;
mod handshake;
mod no_proxy;
mod transport;

use std::fmt;
use std::sync::{Arc, OnceLock};

pub use dial::{connect as dial, DialError};
pub use handshake::ProxyError;
pub use no_proxy::NoProxy;
pub use transport::{agent, agent_config, ProxyResolver, TunnelConnector};

/// An HTTP proxy: where it listens and what it is told on each CONNECT.
#[derive(Clone, PartialEq, Eq)]
pub struct ProxyUrl {
    host: String,
    port: u16,
    /// `user:password`, percent-decoded, for `Proxy-Authorization: Basic`.
    credentials: Option<String>,
}

impl ProxyUrl {
    /// Reads a proxy URL as Go's `httpproxy` does: `http://[user[:password]@]host[:port]`,
    /// the scheme optional (`proxy:3128` is `http://proxy:3128`), port 80 by default.
    /// Only `http` proxies: the tunnel's TLS is end to end, the hop to the proxy plain.
    pub fn parse(text: &str) -> Result<ProxyUrl, String> {
        let text = text.trim();
        let (scheme, rest) = match text.split_once("://") {
            Some((scheme, rest)) => (scheme.to_ascii_lowercase(), rest),
            None => ("http".to_string(), text),
        };
        // From here on nothing of the text is quoted back: it may hold a password.
        let shown = redacted_text(text);
        if scheme != "http" {
            return Err(format!(
                "proxy {shown}: scheme {scheme:?} is not supported; use an http:// proxy \
                 (the connection through it is tunnelled with CONNECT, TLS end to end)"
            ));
        }
        let authority = rest.split(['/', '?', '#']).next().unwrap_or_default();
        let (userinfo, hostport) = match authority.rsplit_once('@') {
            Some((u, h)) => (Some(u), h),
            None => (None, authority),
        };
        let (host, port) = split_host_port(hostport)
            .ok_or_else(|| format!("proxy {shown}: expected host[:port] after the scheme"))?;
        let port = match port {
            None => 80,
            Some(p) => match p.parse::<u16>() {
                Ok(p) if p > 0 => p,
                _ => return Err(format!("proxy {shown}: port {p:?} is not 1 to 65535")),
            },
        };
        if host.is_empty()
            || host
                .bytes()
                .any(|b| b.is_ascii_whitespace() || b.is_ascii_control())
        {
            return Err(format!("proxy {shown}: no valid host"));
        }
        let credentials = match userinfo {
            None => None,
            Some(u) => {
                let (user, pass) = u.split_once(':').unwrap_or((u, ""));
                let decode = |s: &str| {
                    percent_decode(s).ok_or_else(|| {
                        format!("proxy {shown}: bad percent-encoding in the credentials")
                    })
                };
                Some(format!("{}:{}", decode(user)?, decode(pass)?))
            }
        };
        Ok(ProxyUrl {
            host: host.to_ascii_lowercase(),
            port,
            credentials,
        })
    }

    /// `host:port` to open the TCP connection to (IPv6 in brackets).
    pub fn authority(&self) -> String {
        authority(&self.host, self.port)
    }

    pub fn host(&self) -> &str {
        &self.host
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    pub(crate) fn credentials(&self) -> Option<&str> {
        self.credentials.as_deref()
    }
}

/// The proxy as it may be shown: `http://***@host:port` when it has credentials.
impl fmt::Display for ProxyUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let auth = if self.credentials.is_some() {
            "***@"
        } else {
            ""
        };
        write!(f, "http://{auth}{}", self.authority())
    }
}

/// As [`Display`](fmt::Display): a password never reaches a log line through `{:?}`.
impl fmt::Debug for ProxyUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ProxyUrl({self})")
    }
}

/// The node's proxy rules: the proxy for `https://` destinations, the one for
/// `http://` destinations, and the destinations reached directly.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Proxies {
    pub https: Option<ProxyUrl>,
    pub http: Option<ProxyUrl>,
    pub no_proxy: NoProxy,
}

impl Proxies {
    /// The rules from environment variables as Go's `httpproxy.FromEnvironment` reads
    /// them: `HTTPS_PROXY`, `HTTP_PROXY`, `NO_PROXY`, the upper-case name first, the
    /// lower-case one when that is unset or empty. `var` looks a variable up.
    pub fn from_env(var: impl Fn(&str) -> Option<String>) -> Result<Proxies, String> {
        let any = |names: [&'static str; 2]| {
            names
                .into_iter()
                .find_map(|n| var(n).filter(|v| !v.is_empty()).map(|v| (n, v)))
        };
        let url = |names| match any(names) {
            None => Ok(None),
            Some((name, v)) => ProxyUrl::parse(&v)
                .map(Some)
                .map_err(|e| format!("environment {name}: {e}")),
        };
        Ok(Proxies {
            https: url(["HTTPS_PROXY", "https_proxy"])?,
            http: url(["HTTP_PROXY", "http_proxy"])?,
            no_proxy: NoProxy::parse(
                &any(["NO_PROXY", "no_proxy"])
                    .map(|(_, v)| v)
                    .unwrap_or_default(),
            ),
        })
    }

    /// The proxy for `scheme://host:port`, or `None` to connect directly.
    pub fn for_target(&self, https: bool, host: &str, port: u16) -> Option<&ProxyUrl> {
        let proxy = if https { &self.https } else { &self.http };
        proxy
            .as_ref()
            .filter(|_| !self.no_proxy.matches(host, port))
    }

    /// Whether any proxy is set.
    pub fn is_empty(&self) -> bool {
        self.https.is_none() && self.http.is_none()
    }
}

static INSTALLED: OnceLock<Proxies> = OnceLock::new();

/// Makes `proxies` the rules of every connection made from now on. Once per process;
/// a second call changes nothing and says so.
pub fn install(proxies: Proxies) -> bool {
    let (https, http) = (shown(proxies.https.as_ref()), shown(proxies.http.as_ref()));
    let empty = proxies.is_empty();
    let set = INSTALLED.set(proxies).is_ok();
    if !set {
        log::warn!("proxy rules already set; the new ones are ignored");
    } else if !empty {
        log::info!("connections out go through proxies: https {https}, http {http}");
    }
    set
}

fn shown(proxy: Option<&ProxyUrl>) -> String {
    proxy.map_or_else(|| "none".to_string(), ToString::to_string)
}

/// The rules installed, or none (every connection direct).
pub fn installed() -> &'static Proxies {
    static NONE: OnceLock<Proxies> = OnceLock::new();
    INSTALLED
        .get()
        .unwrap_or_else(|| NONE.get_or_init(Proxies::default))
}

/// How one client chooses its proxy: by the installed rules, or one proxy for every
/// connection (a kubeconfig cluster's `proxy-url`, which client-go uses for that
/// cluster instead of the environment, `NO_PROXY` included).
#[derive(Debug, Clone, Default, PartialEq)]
pub enum Route {
    #[default]
    Rules,
    Fixed(Arc<ProxyUrl>),
}

impl Route {
    /// The proxy to reach `host:port` through, if any.
    pub fn proxy_for(&self, https: bool, host: &str, port: u16) -> Option<ProxyUrl> {
        match self {
            Route::Fixed(p) => Some((**p).clone()),
            Route::Rules => installed().for_target(https, host, port).cloned(),
        }
    }
}

/// `host:port`, with an IPv6 host in brackets.
pub(crate) fn authority(host: &str, port: u16) -> String {
    if host.contains(':') {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    }
}

/// `host` and `port` of `host[:port]` or `[v6][:port]`; the host without brackets.
pub(crate) fn split_host_port(s: &str) -> Option<(&str, Option<&str>)> {
    if let Some(rest) = s.strip_prefix('[') {
        let (host, after) = rest.split_once(']')?;
        return match after {
            "" => Some((host, None)),
            _ => Some((host, Some(after.strip_prefix(':')?))),
        };
    }
    match s.rsplit_once(':') {
        // More than one colon without brackets: a bare IPv6 address, no port.
        Some((h, _)) if h.contains(':') => Some((s, None)),
        Some((h, p)) => Some((h, Some(p))),
        None => Some((s, None)),
    }
}

/// A proxy URL's text with its credentials replaced, for an error about that text.
fn redacted_text(text: &str) -> String {
    let (scheme, rest) = match text.split_once("://") {
        Some((s, r)) => (format!("{s}://"), r),
        None => (String::new(), text),
    };
    let end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let shown = match rest[..end].rsplit_once('@') {
        Some((_, host)) => format!("{scheme}***@{host}"),
        None => format!("{scheme}{}", &rest[..end]),
    };
    shown
        .chars()
        .filter(|c| !c.is_control())
        .take(200)
        .collect()
}

fn percent_decode(s: &str) -> Option<String> {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = std::str::from_utf8(bytes.get(i + 1..i + 3)?).ok()?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(vars: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let vars: Vec<(String, String)> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        move |name| vars.iter().find(|(k, _)| k == name).map(|(_, v)| v.clone())
    }

    #[test]
    fn proxy_urls_as_go_reads_them() {
        let p = ProxyUrl::parse("http://proxy.site:3128").expect("parse");
        assert_eq!(
            (p.host(), p.port(), p.credentials()),
            ("proxy.site", 3128, None)
        );
        let p = ProxyUrl::parse("proxy.site:8080").expect("no scheme");
        assert_eq!((p.host(), p.port()), ("proxy.site", 8080));
        let p = ProxyUrl::parse("http://proxy.site").expect("no port");
        assert_eq!(p.port(), 80);
        let p = ProxyUrl::parse("http://[fd00::1]:3128/").expect("v6");
        assert_eq!(
            (p.host(), p.authority().as_str()),
            ("fd00::1", "[fd00::1]:3128")
        );
        let p = ProxyUrl::parse("http://us%40er:p%3Ass@proxy:3128").expect("creds");
        assert_eq!(p.credentials(), Some("us@er:p:ss"));
        assert_eq!(p.to_string(), "http://***@proxy:3128");
        assert_eq!(format!("{p:?}"), "ProxyUrl(http://***@proxy:3128)");
    }

    #[test]
    fn bad_proxy_urls_never_show_the_password() {
        for (text, want) in [
            (
                "socks5://user:secret@proxy:1080",
                "scheme \"socks5\" is not supported",
            ),
            (
                "https://user:secret@proxy:443",
                "scheme \"https\" is not supported",
            ),
            ("http://user:secret@proxy:0", "is not 1 to 65535"),
            ("http://user:secret@proxy:99999", "is not 1 to 65535"),
            ("http://user:secret@", "no valid host"),
            ("http://user:secret%zz@proxy", "percent-encoding"),
        ] {
            let e = ProxyUrl::parse(text).expect_err(text);
            assert!(e.contains(want), "{text}: {e}");
            assert!(!e.contains("secret"), "{text}: {e}");
            assert!(e.contains("***@"), "{text}: {e}");
        }
    }

    #[test]
    fn environment_upper_case_first_then_lower() {
        let p = Proxies::from_env(env(&[
            ("HTTPS_PROXY", "http://a:1"),
            ("https_proxy", "http://b:2"),
            ("HTTP_PROXY", ""),
            ("http_proxy", "http://c:3"),
            ("no_proxy", "internal"),
        ]))
        .expect("env");
        assert_eq!(p.https.as_ref().map(ProxyUrl::host), Some("a"));
        assert_eq!(p.http.as_ref().map(ProxyUrl::host), Some("c"));
        assert!(p.no_proxy.matches("internal", 443));
        assert!(Proxies::from_env(env(&[])).expect("none").is_empty());
        let e = Proxies::from_env(env(&[("HTTPS_PROXY", "socks5://u:pw@x:1")])).expect_err("bad");
        assert!(e.starts_with("environment HTTPS_PROXY: "), "{e}");
        assert!(!e.contains("pw"), "{e}");
    }

    #[test]
    fn the_scheme_picks_the_proxy_and_no_proxy_bypasses_it() {
        let p = Proxies {
            https: Some(ProxyUrl::parse("http://s:1").expect("s")),
            http: Some(ProxyUrl::parse("http://h:2").expect("h")),
            no_proxy: NoProxy::parse("registry.local"),
        };
        assert_eq!(
            p.for_target(true, "api", 6443).map(ProxyUrl::host),
            Some("s")
        );
        assert_eq!(
            p.for_target(false, "api", 80).map(ProxyUrl::host),
            Some("h")
        );
        assert_eq!(p.for_target(true, "registry.local", 5000), None);
        // Loopback is not special unless listed.
        assert!(p.for_target(true, "127.0.0.1", 6443).is_some());
        assert!(p.for_target(true, "localhost", 6443).is_some());
        let only_https = Proxies {
            http: None,
            ..p.clone()
        };
        assert_eq!(only_https.for_target(false, "api", 80), None);
    }

    #[test]
    fn host_and_port_split() {
        assert_eq!(split_host_port("a:1"), Some(("a", Some("1"))));
        assert_eq!(split_host_port("a"), Some(("a", None)));
        assert_eq!(split_host_port("[::1]:5"), Some(("::1", Some("5"))));
        assert_eq!(split_host_port("[::1]"), Some(("::1", None)));
        assert_eq!(split_host_port("fd00::1"), Some(("fd00::1", None)));
        assert_eq!(split_host_port("[::1]x"), None);
    }
}
