//! The konnectivity tunnel's keys, `holdfast.tunnel.*`: off unless `servers` is set.
//! `servers` (`host:port` of the proxy servers' agent port), `caFile` (the CA their
//! certificates chain to), `serverName` (the name to check instead of the host),
//! `credential` (what the node shows them: its client certificate, or a ServiceAccount
//! token for `audience` of `serviceAccount`), `identifiers` (what it tells them it is,
//! for their `destHost` routing) and `keepaliveTime`.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_yaml::Value;

use super::reader::{short, type_name, Reader};
use super::ConfigError;

/// The least ping interval: konnectivity servers close a stream that pings more often.
pub const MIN_TUNNEL_KEEPALIVE: Duration = Duration::from_secs(30);
const DEFAULT_KEEPALIVE: Duration = Duration::from_secs(40);
/// Identifier keys konnectivity servers know (`host=...&ipv4=...`).
const IDENTIFIER_KEYS: &[&str] = &["host", "ipv4", "ipv6", "cidr", "default-route"];
/// The ServiceAccount and audience of the upstream agent's manifests.
const DEFAULT_SERVICE_ACCOUNT: (&str, &str) = ("kube-system", "konnectivity-agent");
const DEFAULT_AUDIENCE: &str = "system:konnectivity-server";

/// How the node proves who it is to the proxy servers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TunnelCredential {
    /// The client certificate of the kubeconfig (the one the uplink uses), re-read at
    /// every dial.
    ClientCertificate,
    /// A token of a ServiceAccount for the servers' audience, from the TokenRequest API
    /// (the servers' `--agent-namespace`, `--agent-service-account`,
    /// `--authentication-audience`).
    ServiceAccountToken(ServiceAccountToken),
}

/// Which ServiceAccount's token, for which audience.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServiceAccountToken {
    pub namespace: String,
    pub name: String,
    pub audience: String,
}

/// The tunnel's settings, when it is on.
#[derive(Debug, Clone, PartialEq)]
pub struct TunnelConfig {
    pub servers: Vec<String>,
    pub ca_file: PathBuf,
    pub server_name: Option<String>,
    pub credential: TunnelCredential,
    /// `None`: `host=<node name>&ipv4=<InternalIP>` (or `ipv6=`).
    pub identifiers: Option<String>,
    pub keepalive: Duration,
}

/// What the file sets of them.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct TunnelKeys {
    pub servers: Option<Vec<String>>,
    pub ca_file: Option<PathBuf>,
    pub server_name: Option<String>,
    /// `clientCertificate` or `serviceAccountToken`.
    pub credential: Option<String>,
    /// `serviceAccount`: namespace and name.
    pub service_account: Option<(String, String)>,
    pub audience: Option<String>,
    pub identifiers: Option<String>,
    pub keepalive: Option<Duration>,
}

impl TunnelKeys {
    /// The settings, or `None` when no server is set (the tunnel is off).
    pub fn settings(&self, reader_path: &Path) -> Result<Option<TunnelConfig>, ConfigError> {
        let Some(servers) = self.servers.clone().filter(|s| !s.is_empty()) else {
            return Ok(None);
        };
        let ca_file = self.ca_file.clone().ok_or_else(|| ConfigError::Key {
            path: reader_path.to_path_buf(),
            key: "holdfast.tunnel.caFile".into(),
            reason: "required with holdfast.tunnel.servers: the CA of the proxy servers".into(),
        })?;
        let key_err = |key: &str, reason: String| ConfigError::Key {
            path: reader_path.to_path_buf(),
            key: key.into(),
            reason,
        };
        let credential = match self.credential.as_deref() {
            None | Some("clientCertificate") => {
                for (set, key) in [
                    (self.service_account.is_some(), "serviceAccount"),
                    (self.audience.is_some(), "audience"),
                ] {
                    if set {
                        return Err(key_err(
                            &format!("holdfast.tunnel.{key}"),
                            "applies only with credential: serviceAccountToken".into(),
                        ));
                    }
                }
                TunnelCredential::ClientCertificate
            }
            Some(_) => {
                let (namespace, name) = self.service_account.clone().unwrap_or_else(|| {
                    let (ns, name) = DEFAULT_SERVICE_ACCOUNT;
                    (ns.into(), name.into())
                });
                TunnelCredential::ServiceAccountToken(ServiceAccountToken {
                    namespace,
                    name,
                    audience: self
                        .audience
                        .clone()
                        .unwrap_or_else(|| DEFAULT_AUDIENCE.into()),
                })
            }
        };
        Ok(Some(TunnelConfig {
            servers,
            ca_file,
            server_name: self.server_name.clone(),
            credential,
            identifiers: self.identifiers.clone(),
            keepalive: self.keepalive.unwrap_or(DEFAULT_KEEPALIVE),
        }))
    }
}

impl Reader<'_> {
    /// The `holdfast.tunnel` mapping.
    pub(super) fn tunnel_section(
        &self,
        key: &str,
        value: &Value,
        base: &Path,
        out: &mut TunnelKeys,
        warnings: &mut Vec<String>,
    ) -> Result<(), ConfigError> {
        if value.is_null() {
            return Ok(());
        }
        for (k, v) in self.mapping(key, value)? {
            let name = match k {
                Value::String(s) => format!("{key}.{s}"),
                other => {
                    return Err(self.err(
                        key,
                        format!("keys must be strings, got {}", type_name(other)),
                    ))
                }
            };
            if !super::keys::known(&name) {
                warnings.push(format!(
                    "config file {}: unknown key {}{name} ignored",
                    self.path.display(),
                    self.prefix
                ));
                continue;
            }
            self.tunnel_key(&name, v, base, out)?;
        }
        Ok(())
    }

    fn tunnel_key(
        &self,
        key: &str,
        value: &Value,
        base: &Path,
        out: &mut TunnelKeys,
    ) -> Result<(), ConfigError> {
        match key {
            "holdfast.tunnel.servers" => {
                let Value::Sequence(items) = value else {
                    return Err(self.err(
                        key,
                        format!(
                            "expected a list of host:port, got {} {}",
                            type_name(value),
                            short(value)
                        ),
                    ));
                };
                let mut servers = Vec::new();
                for item in items {
                    let s = self.string(key, item)?;
                    check_server(&s).map_err(|reason| self.err(key, reason))?;
                    servers.push(s);
                }
                out.servers = Some(servers);
            }
            "holdfast.tunnel.caFile" => {
                let s = self.string(key, value)?;
                if s.is_empty() {
                    return Err(self.err(key, "expected a path, got an empty string".into()));
                }
                out.ca_file = Some(base.join(s));
            }
            "holdfast.tunnel.serverName" => {
                let s = self.string(key, value)?;
                rustls::pki_types::ServerName::try_from(s.as_str())
                    .map_err(|e| self.err(key, format!("{s:?} is not a server name: {e}")))?;
                out.server_name = Some(s);
            }
            "holdfast.tunnel.credential" => {
                let s = self.string(key, value)?;
                if !matches!(s.as_str(), "clientCertificate" | "serviceAccountToken") {
                    return Err(self.err(
                        key,
                        format!("expected clientCertificate or serviceAccountToken, got {s:?}"),
                    ));
                }
                out.credential = Some(s);
            }
            "holdfast.tunnel.serviceAccount" => {
                let s = self.string(key, value)?;
                let pair = s
                    .split_once('/')
                    .filter(|(ns, name)| {
                        super::names::check_dns1123_label(ns).is_ok()
                            && super::names::check_dns1123_subdomain(name).is_ok()
                    })
                    .ok_or_else(|| {
                        self.err(
                            key,
                            format!("expected <namespace>/<name> of a ServiceAccount, got {s:?}"),
                        )
                    })?;
                out.service_account = Some((pair.0.to_string(), pair.1.to_string()));
            }
            "holdfast.tunnel.audience" => {
                let s = self.string(key, value)?;
                if s.trim().is_empty() || s.len() > 253 {
                    return Err(self.err(
                        key,
                        format!("expected the servers' --authentication-audience, got {s:?}"),
                    ));
                }
                out.audience = Some(s);
            }
            "holdfast.tunnel.identifiers" => {
                let s = self.string(key, value)?;
                check_identifiers(&s).map_err(|reason| self.err(key, reason))?;
                out.identifiers = Some(s);
            }
            "holdfast.tunnel.keepaliveTime" => {
                let d = self.positive_duration(key, value)?;
                if d < MIN_TUNNEL_KEEPALIVE {
                    return Err(self.err(
                        key,
                        format!("must be at least 30s (proxy servers close streams that ping more often), got {d:?}"),
                    ));
                }
                out.keepalive = Some(d);
            }
            _ => {}
        }
        Ok(())
    }
}

/// `host:port` with a port of 1 to 65535.
fn check_server(s: &str) -> Result<(), String> {
    let (host, port) = s
        .rsplit_once(':')
        .ok_or_else(|| format!("expected host:port, got {s:?}"))?;
    if host
        .trim_start_matches('[')
        .trim_end_matches(']')
        .is_empty()
    {
        return Err(format!("expected host:port, got {s:?} (no host)"));
    }
    match port.parse::<u16>() {
        Ok(p) if p > 0 => Ok(()),
        _ => Err(format!("port {port:?} of {s:?} is not 1 to 65535")),
    }
}

/// `key=value&key=value`, with keys the servers know.
fn check_identifiers(s: &str) -> Result<(), String> {
    for pair in s.split('&') {
        let (k, v) = pair
            .split_once('=')
            .ok_or_else(|| format!("expected key=value pairs joined by &, got {pair:?}"))?;
        if !IDENTIFIER_KEYS.contains(&k) {
            return Err(format!(
                "unknown identifier {k:?} (known: {})",
                IDENTIFIER_KEYS.join(", ")
            ));
        }
        if v.is_empty() {
            return Err(format!("identifier {k} has no value"));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::super::parse_config;
    use super::*;

    fn keys(text: &str) -> Result<TunnelKeys, ConfigError> {
        parse_config(Path::new("/etc/holdfast/config.yaml"), text).map(|(c, _)| c.tunnel)
    }

    #[test]
    fn off_unless_servers_are_set() {
        let k = keys("holdfast:\n  nodeLabels: {}\n").expect("parse");
        assert_eq!(k.settings(Path::new("c")).expect("settings"), None);
    }

    #[test]
    fn reads_every_key() {
        let k = keys(
            "holdfast:\n  tunnel:\n    servers: [\"kas.example:8132\", \"[fd00::1]:8132\"]\n    \
             caFile: pki/konnectivity-ca.crt\n    serverName: konnectivity\n    \
             credential: clientCertificate\n    identifiers: host=gw&ipv4=10.0.0.9\n    \
             keepaliveTime: 1m\n",
        )
        .expect("parse");
        let t = k.settings(Path::new("c")).expect("settings").expect("on");
        assert_eq!(t.servers, ["kas.example:8132", "[fd00::1]:8132"]);
        assert_eq!(
            t.ca_file,
            Path::new("/etc/holdfast/pki/konnectivity-ca.crt")
        );
        assert_eq!(t.server_name.as_deref(), Some("konnectivity"));
        assert_eq!(t.identifiers.as_deref(), Some("host=gw&ipv4=10.0.0.9"));
        assert_eq!(t.keepalive, Duration::from_secs(60));
        assert_eq!(t.credential, TunnelCredential::ClientCertificate);
    }

    #[test]
    fn a_service_account_token_for_the_servers_audience() {
        let on = "holdfast:\n  tunnel:\n    servers: [\"kas:8132\"]\n    caFile: ca.crt\n    ";
        let k = keys(&format!("{on}credential: serviceAccountToken\n")).expect("parse");
        let t = k.settings(Path::new("c")).expect("settings").expect("on");
        let want = ServiceAccountToken {
            namespace: "kube-system".into(),
            name: "konnectivity-agent".into(),
            audience: "system:konnectivity-server".into(),
        };
        assert_eq!(t.credential, TunnelCredential::ServiceAccountToken(want));
        let k = keys(&format!(
            "{on}credential: serviceAccountToken\n    serviceAccount: edge/tunnel\n    \
             audience: konnectivity\n"
        ))
        .expect("parse");
        let t = k.settings(Path::new("c")).expect("settings").expect("on");
        let want = ServiceAccountToken {
            namespace: "edge".into(),
            name: "tunnel".into(),
            audience: "konnectivity".into(),
        };
        assert_eq!(t.credential, TunnelCredential::ServiceAccountToken(want));
        // Without the token credential they would be ignored: an error says so.
        let k = keys(&format!("{on}serviceAccount: edge/tunnel\n")).expect("parse");
        let e = k
            .settings(Path::new("c"))
            .expect_err("no token")
            .to_string();
        assert!(e.contains("holdfast.tunnel.serviceAccount"), "{e}");
        assert!(e.contains("serviceAccountToken"), "{e}");
    }

    #[test]
    fn bad_values_get_clear_errors() {
        for (text, want) in [
            ("servers: [kas]", "expected host:port"),
            ("servers: [\"kas:0\"]", "is not 1 to 65535"),
            ("servers: [\"kas:99999\"]", "is not 1 to 65535"),
            ("keepaliveTime: 5s", "at least 30s"),
            (
                "credential: password",
                "expected clientCertificate or serviceAccountToken",
            ),
            ("serviceAccount: agent", "expected <namespace>/<name>"),
            (
                "serviceAccount: Kube_System/agent",
                "expected <namespace>/<name>",
            ),
            ("audience: \"\"", "authentication-audience"),
            ("identifiers: host", "key=value"),
            ("identifiers: color=red", "unknown identifier"),
        ] {
            let e = keys(&format!("holdfast:\n  tunnel:\n    {text}\n"))
                .expect_err(text)
                .to_string();
            assert!(e.contains(want), "{text}: {e}");
        }
        let k = keys("holdfast:\n  tunnel:\n    servers: [\"kas:8132\"]\n").expect("parse");
        let e = k.settings(Path::new("c")).expect_err("no ca").to_string();
        assert!(e.contains("holdfast.tunnel.caFile"), "{e}");
    }
}
