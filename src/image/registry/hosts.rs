//! Which endpoints serve a registry, modelled on containerd's `hosts.toml`: per registry
//! an ordered list of mirrors (each with its CA, client certificate, and what it may be
//! asked for), then the upstream itself.
//!
//! A plain-HTTP or unverified endpoint is allowed only as a mirror that serves content
//! by digest (`pull`), never tag resolution (`resolve`), and it is never sent
//! credentials: whatever it returns is checked against a digest that came from a
//! verified source, so a site cache on the LAN cannot swap an image.

use std::collections::BTreeMap;
use std::path::PathBuf;

use super::RegistryError;

/// What an endpoint may be asked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Capability {
    /// Manifests and blobs by digest.
    Pull,
    /// Tags turned into digests.
    Resolve,
}

impl Capability {
    pub fn parse(s: &str) -> Option<Capability> {
        match s {
            "pull" => Some(Capability::Pull),
            "resolve" => Some(Capability::Resolve),
            _ => None,
        }
    }
}

/// One mirror endpoint as configured.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct EndpointConfig {
    /// `host[:port]`, or a URL `https://host[:port]` / `http://host[:port]`.
    pub host: String,
    /// Default: pull and resolve.
    pub capabilities: Vec<Capability>,
    /// PEM CA bundle trusted for this endpoint (beside the system's).
    pub ca_file: Option<PathBuf>,
    pub client_cert: Option<PathBuf>,
    pub client_key: Option<PathBuf>,
    /// Speak HTTP without TLS.
    pub plain_http: bool,
    /// Accept any server certificate.
    pub skip_verify: bool,
}

/// One registry: where its upstream is, how to trust it, and its mirrors in order.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct RegistryConfig {
    /// The upstream's URL when it is not `https://<registry>`.
    pub server: Option<String>,
    pub ca_file: Option<PathBuf>,
    pub client_cert: Option<PathBuf>,
    pub client_key: Option<PathBuf>,
    pub mirrors: Vec<EndpointConfig>,
}

/// Every configured registry, by the name images use (`docker.io`, `registry.local:5000`).
#[derive(Debug, Clone, PartialEq, Default)]
pub struct RegistryHosts {
    pub registries: BTreeMap<String, RegistryConfig>,
}

/// An endpoint ready to be asked: its base URL and how to talk to it.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) struct Endpoint {
    /// `https://host:port`, no trailing slash.
    pub base: String,
    /// `host:port`, for credentials lookup and messages.
    pub host: String,
    pub mirror: bool,
    pub pull: bool,
    pub resolve: bool,
    pub ca_file: Option<PathBuf>,
    pub client_cert: Option<PathBuf>,
    pub client_key: Option<PathBuf>,
    pub skip_verify: bool,
}

impl Endpoint {
    /// Credentials go only over verified TLS.
    pub(crate) fn may_carry_credentials(&self) -> bool {
        self.base.starts_with("https://") && !self.skip_verify
    }
}

impl EndpointConfig {
    /// The mirror's rules: a URL that parses, and no tag resolution unless verified.
    pub fn check(&self) -> Result<(), String> {
        let (scheme, host) = split_url(&self.host)?;
        if scheme == Some("http") && !self.plain_http {
            return Err(format!(
                "{}: an http:// endpoint needs plainHTTP: true",
                self.host
            ));
        }
        if scheme == Some("https") && self.plain_http {
            return Err(format!(
                "{}: plainHTTP contradicts the https:// scheme",
                self.host
            ));
        }
        if host.is_empty() {
            return Err(format!("{}: no host", self.host));
        }
        let unverified = self.plain_http || self.skip_verify;
        if unverified && self.capabilities().contains(&Capability::Resolve) {
            return Err(format!(
                "{}: a plainHTTP or skipVerify endpoint may only have capabilities [pull]: \
                 a tag resolved over an unverified connection could name another image",
                self.host
            ));
        }
        if self.client_cert.is_some() != self.client_key.is_some() {
            return Err(format!(
                "{}: clientCert and clientKey go together",
                self.host
            ));
        }
        Ok(())
    }

    fn capabilities(&self) -> Vec<Capability> {
        if self.capabilities.is_empty() {
            vec![Capability::Pull, Capability::Resolve]
        } else {
            self.capabilities.clone()
        }
    }

    fn endpoint(&self) -> Result<Endpoint, RegistryError> {
        self.check()
            .map_err(|reason| RegistryError::Config { reason })?;
        let (scheme, host) =
            split_url(&self.host).map_err(|reason| RegistryError::Config { reason })?;
        let scheme = scheme.unwrap_or(if self.plain_http { "http" } else { "https" });
        let caps = self.capabilities();
        Ok(Endpoint {
            base: format!("{scheme}://{host}"),
            host: host.to_string(),
            mirror: true,
            pull: caps.contains(&Capability::Pull),
            resolve: caps.contains(&Capability::Resolve),
            ca_file: self.ca_file.clone(),
            client_cert: self.client_cert.clone(),
            client_key: self.client_key.clone(),
            skip_verify: self.skip_verify,
        })
    }
}

/// `https://h:1/` → (Some("https"), "h:1"); `h:1` → (None, "h:1"). Paths are refused:
/// the distribution API lives at `/v2/` of the host.
fn split_url(s: &str) -> Result<(Option<&str>, &str), String> {
    let (scheme, rest) = match s.split_once("://") {
        Some((scheme, rest)) => (Some(scheme), rest),
        None => (None, s),
    };
    if let Some(scheme) = scheme {
        if scheme != "http" && scheme != "https" {
            return Err(format!("{s}: scheme must be http or https"));
        }
    }
    let host = rest.trim_end_matches('/');
    if host.contains('/') {
        return Err(format!(
            "{s}: give the host only; the registry API is at /v2/ of it"
        ));
    }
    if host.contains(['@', '?', '#', ' ']) {
        return Err(format!("{s}: not a host[:port]"));
    }
    Ok((scheme, host))
}

impl RegistryHosts {
    /// The endpoints for images of `registry`, mirrors first (in order), the upstream last.
    pub(crate) fn endpoints(&self, registry: &str) -> Result<Vec<Endpoint>, RegistryError> {
        let config = self.registries.get(registry);
        let mut out = Vec::new();
        if let Some(c) = config {
            for m in &c.mirrors {
                out.push(m.endpoint()?);
            }
        }
        let default_server = if registry == "docker.io" {
            "https://registry-1.docker.io".to_string()
        } else {
            format!("https://{registry}")
        };
        let server = config
            .and_then(|c| c.server.clone())
            .unwrap_or(default_server);
        let (scheme, host) =
            split_url(&server).map_err(|reason| RegistryError::Config { reason })?;
        if scheme == Some("http") {
            return Err(RegistryError::Config {
                reason: format!(
                    "{registry}: the upstream must be https (only a pull-only mirror may be plain HTTP)"
                ),
            });
        }
        out.push(Endpoint {
            base: format!("https://{host}"),
            // Credentials for the upstream are those of the registry the image names.
            host: registry.to_string(),
            mirror: false,
            pull: true,
            resolve: true,
            ca_file: config.and_then(|c| c.ca_file.clone()),
            client_cert: config.and_then(|c| c.client_cert.clone()),
            client_key: config.and_then(|c| c.client_key.clone()),
            skip_verify: false,
        });
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mirrors_come_first_and_docker_hub_has_its_api_host() {
        let mut hosts = RegistryHosts::default();
        hosts.registries.insert(
            "docker.io".into(),
            RegistryConfig {
                mirrors: vec![
                    EndpointConfig {
                        host: "cache.site:5000".into(),
                        capabilities: vec![Capability::Pull],
                        plain_http: true,
                        ..EndpointConfig::default()
                    },
                    EndpointConfig {
                        host: "https://mirror.example".into(),
                        ..EndpointConfig::default()
                    },
                ],
                ..RegistryConfig::default()
            },
        );
        let eps = hosts.endpoints("docker.io").expect("endpoints");
        let bases: Vec<&str> = eps.iter().map(|e| e.base.as_str()).collect();
        assert_eq!(
            bases,
            [
                "http://cache.site:5000",
                "https://mirror.example",
                "https://registry-1.docker.io"
            ]
        );
        assert!(!eps[0].resolve && eps[0].pull && !eps[0].may_carry_credentials());
        assert!(eps[1].resolve && eps[1].may_carry_credentials());
        assert_eq!(eps[2].host, "docker.io");
        let other = hosts.endpoints("registry.local:5000").expect("endpoints");
        assert_eq!(other.len(), 1);
        assert_eq!(other[0].base, "https://registry.local:5000");
    }

    #[test]
    fn unverified_endpoints_may_not_resolve_tags() {
        let plain = EndpointConfig {
            host: "cache:5000".into(),
            plain_http: true,
            ..EndpointConfig::default()
        };
        assert!(plain
            .check()
            .expect_err("resolve")
            .contains("capabilities [pull]"));
        let skip = EndpointConfig {
            host: "cache:5000".into(),
            skip_verify: true,
            capabilities: vec![Capability::Pull, Capability::Resolve],
            ..EndpointConfig::default()
        };
        assert!(skip.check().is_err());
        let scheme = EndpointConfig {
            host: "http://cache:5000".into(),
            capabilities: vec![Capability::Pull],
            ..EndpointConfig::default()
        };
        assert!(scheme.check().expect_err("plain").contains("plainHTTP"));
        let path = EndpointConfig {
            host: "https://cache/v2/x".into(),
            ..EndpointConfig::default()
        };
        assert!(path.check().expect_err("path").contains("host only"));
    }
}
