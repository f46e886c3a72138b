//! The config keys of the kubelet HTTP API, spelled as KubeletConfiguration spells them:
//! where it listens (`address`, `port`, `readOnlyPort`, `healthzBindAddress`,
//! `healthzPort`), its serving certificate (`tlsCertFile`, `tlsPrivateKeyFile`,
//! `serverTLSBootstrap`) and who may call it (`authentication.x509.clientCAFile`,
//! `authentication.anonymous.enabled`, `authorization.mode`).
//!
//! Delegated authentication and authorization: `authentication.webhook.enabled` and
//! `.cacheTTL`, `authorization.webhook.cacheAuthorizedTTL` and `.cacheUnauthorizedTTL`,
//! and holdfast's `holdfast.offlineAuthorization` (who is let in while the apiserver
//! cannot be asked).

use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_yaml::Value;

use super::reader::{short, Reader};
use super::ConfigError;

/// `healthzPort` when the file leaves it out: the kubelet's.
pub const DEFAULT_HEALTHZ_PORT: u16 = 10248;

/// How requests that authenticated are authorized.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum AuthorizationMode {
    /// Every authenticated request is allowed (anonymous ones too, if enabled).
    #[default]
    AlwaysAllow,
    /// Each request is a SubjectAccessReview to the apiserver, its answer cached; while
    /// the apiserver cannot be asked, cached answers hold until they expire, then only
    /// the offline policy's identities are let in.
    Webhook,
}

/// Who is let in while the apiserver cannot be asked (`holdfast.offlineAuthorization`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OfflinePolicy {
    pub users: Vec<String>,
    pub groups: Vec<String>,
}

impl Default for OfflinePolicy {
    /// The apiserver's own client (kubeadm's name for it) and cluster admins.
    fn default() -> Self {
        OfflinePolicy {
            users: vec!["kube-apiserver-kubelet-client".into()],
            groups: vec!["system:masters".into()],
        }
    }
}

/// `authentication.webhook.cacheTTL` when the file leaves it out: the kubelet's.
pub const DEFAULT_TOKEN_CACHE_TTL: Duration = Duration::from_secs(120);
/// `authorization.webhook.cacheAuthorizedTTL` and `cacheUnauthorizedTTL` defaults.
pub const DEFAULT_AUTHORIZED_TTL: Duration = Duration::from_secs(300);
pub const DEFAULT_UNAUTHORIZED_TTL: Duration = Duration::from_secs(30);

/// The kubelet API's settings, after the file is read.
#[derive(Debug, Clone, PartialEq)]
pub struct ServerConfig {
    /// `address`, default 0.0.0.0: where the HTTPS port and the read-only port listen.
    pub address: IpAddr,
    /// `readOnlyPort`: plain HTTP without authentication, default 0 (off).
    pub read_only_port: u16,
    /// `healthzBindAddress`, default 127.0.0.1.
    pub healthz_bind_address: IpAddr,
    /// `healthzPort`, default 10248; 0 turns it off.
    pub healthz_port: u16,
    /// `tlsCertFile` and `tlsPrivateKeyFile`; without them a self-signed certificate
    /// is made at first start and kept under the root dir.
    pub tls_cert_file: Option<PathBuf>,
    pub tls_private_key_file: Option<PathBuf>,
    /// `authentication.x509.clientCAFile`: without it no client certificate is valid.
    pub client_ca_file: Option<PathBuf>,
    /// `authentication.anonymous.enabled`, default false.
    pub anonymous: bool,
    /// `authorization.mode`, default AlwaysAllow.
    pub authorization: AuthorizationMode,
    /// `authentication.webhook.enabled`, default false: bearer tokens are reviewed by
    /// the apiserver (TokenReview).
    pub token_webhook: bool,
    /// `authentication.webhook.cacheTTL`, default 2m.
    pub token_cache_ttl: Duration,
    /// `authorization.webhook.cacheAuthorizedTTL` (5m) and `cacheUnauthorizedTTL` (30s).
    pub authorized_ttl: Duration,
    pub unauthorized_ttl: Duration,
    /// `holdfast.offlineAuthorization`.
    pub offline: OfflinePolicy,
    /// `serverTLSBootstrap`, default false: with a kubeconfig, the serving certificate
    /// is asked of the cluster (a `kubernetes.io/kubelet-serving` CSR) and rotated.
    pub server_tls_bootstrap: bool,
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            address: IpAddr::from([0, 0, 0, 0]),
            read_only_port: 0,
            healthz_bind_address: IpAddr::from([127, 0, 0, 1]),
            healthz_port: DEFAULT_HEALTHZ_PORT,
            tls_cert_file: None,
            tls_private_key_file: None,
            client_ca_file: None,
            anonymous: false,
            authorization: AuthorizationMode::AlwaysAllow,
            token_webhook: false,
            token_cache_ttl: DEFAULT_TOKEN_CACHE_TTL,
            authorized_ttl: DEFAULT_AUTHORIZED_TTL,
            unauthorized_ttl: DEFAULT_UNAUTHORIZED_TTL,
            offline: OfflinePolicy::default(),
            server_tls_bootstrap: false,
        }
    }
}

/// What the file says of these keys; `None` where it says nothing.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ServerFileConfig {
    pub address: Option<IpAddr>,
    pub read_only_port: Option<u16>,
    pub healthz_bind_address: Option<IpAddr>,
    pub healthz_port: Option<u16>,
    pub tls_cert_file: Option<PathBuf>,
    pub tls_private_key_file: Option<PathBuf>,
    pub client_ca_file: Option<PathBuf>,
    pub anonymous: Option<bool>,
    pub authorization: Option<AuthorizationMode>,
    pub token_webhook: Option<bool>,
    pub token_cache_ttl: Option<Duration>,
    pub authorized_ttl: Option<Duration>,
    pub unauthorized_ttl: Option<Duration>,
    pub offline: Option<OfflinePolicy>,
    pub server_tls_bootstrap: Option<bool>,
}

impl ServerFileConfig {
    /// Fills `config` with what the file set.
    pub fn apply(&self, config: &mut ServerConfig) {
        if let Some(a) = self.address {
            config.address = a;
        }
        if let Some(p) = self.read_only_port {
            config.read_only_port = p;
        }
        if let Some(a) = self.healthz_bind_address {
            config.healthz_bind_address = a;
        }
        if let Some(p) = self.healthz_port {
            config.healthz_port = p;
        }
        if self.tls_cert_file.is_some() {
            config.tls_cert_file = self.tls_cert_file.clone();
            config.tls_private_key_file = self.tls_private_key_file.clone();
        }
        if self.client_ca_file.is_some() {
            config.client_ca_file = self.client_ca_file.clone();
        }
        if let Some(a) = self.anonymous {
            config.anonymous = a;
        }
        if let Some(m) = self.authorization {
            config.authorization = m;
        }
        if let Some(b) = self.token_webhook {
            config.token_webhook = b;
        }
        for (from, to) in [
            (self.token_cache_ttl, &mut config.token_cache_ttl),
            (self.authorized_ttl, &mut config.authorized_ttl),
            (self.unauthorized_ttl, &mut config.unauthorized_ttl),
        ] {
            if let Some(d) = from {
                *to = d;
            }
        }
        if let Some(p) = &self.offline {
            config.offline = p.clone();
        }
        if let Some(b) = self.server_tls_bootstrap {
            config.server_tls_bootstrap = b;
        }
    }
}

impl Reader<'_> {
    /// Reads `key` into `out` if it is one of the kubelet API's keys; false if not.
    pub(super) fn server_key(
        &self,
        key: &str,
        value: &Value,
        base: &Path,
        s: &mut ServerFileConfig,
    ) -> Result<bool, ConfigError> {
        match key {
            "address" => s.address = Some(self.ip(key, value)?),
            "healthzBindAddress" => s.healthz_bind_address = Some(self.ip(key, value)?),
            "readOnlyPort" => s.read_only_port = Some(self.port(key, value)?),
            "healthzPort" => s.healthz_port = Some(self.port(key, value)?),
            "tlsCertFile" => s.tls_cert_file = Some(base.join(self.file_path(key, value)?)),
            "tlsPrivateKeyFile" => {
                s.tls_private_key_file = Some(base.join(self.file_path(key, value)?))
            }
            "serverTLSBootstrap" => match value {
                Value::Bool(b) => s.server_tls_bootstrap = Some(*b),
                other => {
                    return Err(
                        self.err(key, format!("expected true or false, got {}", short(other)))
                    )
                }
            },
            "authentication" => self.authentication(key, value, base, s)?,
            "authorization" => self.authorization(key, value, s)?,
            _ => return Ok(false),
        }
        Ok(true)
    }

    /// `authentication`: the client CA, anonymous requests and the token webhook.
    fn authentication(
        &self,
        key: &str,
        value: &Value,
        base: &Path,
        s: &mut ServerFileConfig,
    ) -> Result<(), ConfigError> {
        let m = self.mapping(key, value)?;
        for (k, v) in m {
            let k = self.sub_key(key, k)?;
            match k.as_str() {
                "authentication.x509" => {
                    for (k2, v2) in self.mapping(&k, v)? {
                        let k2 = self.sub_key(&k, k2)?;
                        match k2.as_str() {
                            "authentication.x509.clientCAFile" => {
                                s.client_ca_file = Some(base.join(self.file_path(&k2, v2)?));
                            }
                            _ => return Err(self.err(&k2, "unknown key".into())),
                        }
                    }
                }
                "authentication.anonymous" => {
                    for (k2, v2) in self.mapping(&k, v)? {
                        let k2 = self.sub_key(&k, k2)?;
                        match (k2.as_str(), v2) {
                            ("authentication.anonymous.enabled", Value::Bool(b)) => {
                                s.anonymous = Some(*b)
                            }
                            ("authentication.anonymous.enabled", other) => {
                                return Err(self.err(
                                    &k2,
                                    format!("expected true or false, got {}", short(other)),
                                ))
                            }
                            _ => return Err(self.err(&k2, "unknown key".into())),
                        }
                    }
                }
                "authentication.webhook" => {
                    for (k2, v2) in self.mapping(&k, v)? {
                        let k2 = self.sub_key(&k, k2)?;
                        match (k2.as_str(), v2) {
                            ("authentication.webhook.enabled", Value::Bool(b)) => {
                                s.token_webhook = Some(*b)
                            }
                            ("authentication.webhook.enabled", other) => {
                                return Err(self.err(
                                    &k2,
                                    format!("expected true or false, got {}", short(other)),
                                ))
                            }
                            ("authentication.webhook.cacheTTL", v2) => {
                                s.token_cache_ttl = Some(self.ttl(&k2, v2)?)
                            }
                            _ => return Err(self.err(&k2, "unknown key".into())),
                        }
                    }
                }
                _ => return Err(self.err(&k, "unknown key".into())),
            }
        }
        Ok(())
    }

    /// `authorization`: its mode and the webhook's cache times.
    fn authorization(
        &self,
        key: &str,
        value: &Value,
        s: &mut ServerFileConfig,
    ) -> Result<(), ConfigError> {
        for (k, v) in self.mapping(key, value)? {
            let k = self.sub_key(key, k)?;
            match k.as_str() {
                "authorization.mode" => {
                    s.authorization = Some(match self.string(&k, v)?.as_str() {
                        "AlwaysAllow" => AuthorizationMode::AlwaysAllow,
                        "Webhook" => AuthorizationMode::Webhook,
                        other => {
                            return Err(self.err(
                                &k,
                                format!("expected AlwaysAllow or Webhook, got {other:?}"),
                            ))
                        }
                    })
                }
                "authorization.webhook" => {
                    for (k2, v2) in self.mapping(&k, v)? {
                        let k2 = self.sub_key(&k, k2)?;
                        match k2.as_str() {
                            "authorization.webhook.cacheAuthorizedTTL" => {
                                s.authorized_ttl = Some(self.ttl(&k2, v2)?)
                            }
                            "authorization.webhook.cacheUnauthorizedTTL" => {
                                s.unauthorized_ttl = Some(self.ttl(&k2, v2)?)
                            }
                            _ => return Err(self.err(&k2, "unknown key".into())),
                        }
                    }
                }
                _ => return Err(self.err(&k, "unknown key".into())),
            }
        }
        Ok(())
    }

    /// Reads `holdfast.offlineAuthorization` into `out`; false for any other key of
    /// the `holdfast:` section.
    pub(super) fn server_holdfast_key(
        &self,
        key: &str,
        value: &Value,
        out: &mut ServerFileConfig,
    ) -> Result<bool, ConfigError> {
        if key != "holdfast.offlineAuthorization" {
            return Ok(false);
        }
        let mut policy = OfflinePolicy {
            users: Vec::new(),
            groups: Vec::new(),
        };
        for (k, v) in self.mapping(key, value)? {
            let k = self.sub_key(key, k)?;
            let list = match k.as_str() {
                "holdfast.offlineAuthorization.users" => &mut policy.users,
                "holdfast.offlineAuthorization.groups" => &mut policy.groups,
                _ => return Err(self.err(&k, "unknown key".into())),
            };
            let Value::Sequence(items) = v else {
                return Err(self.err(&k, format!("expected a list of names, got {}", short(v))));
            };
            for item in items {
                let name = self.string(&k, item)?;
                if name.trim().is_empty() {
                    return Err(self.err(&k, "expected a name, got an empty string".into()));
                }
                list.push(name);
            }
        }
        out.offline = Some(policy);
        Ok(true)
    }

    /// A cache lifetime: a Go duration, zero for no caching.
    fn ttl(&self, key: &str, value: &Value) -> Result<Duration, ConfigError> {
        let s = self.string(key, value)?;
        super::duration::parse_duration(&s).map_err(|e| self.err(key, e))
    }

    fn sub_key(&self, parent: &str, key: &Value) -> Result<String, ConfigError> {
        match key {
            Value::String(s) if super::keys::known(&format!("{parent}.{s}")) => {
                Ok(format!("{parent}.{s}"))
            }
            Value::String(s) => Err(self.err(&format!("{parent}.{s}"), "unknown key".into())),
            other => Err(self.err(
                parent,
                format!("keys must be strings, found {}", short(other)),
            )),
        }
    }

    fn ip(&self, key: &str, value: &Value) -> Result<IpAddr, ConfigError> {
        let s = self.string(key, value)?;
        s.parse()
            .map_err(|_| self.err(key, format!("expected an IP address, got {s:?}")))
    }

    fn port(&self, key: &str, value: &Value) -> Result<u16, ConfigError> {
        match value {
            Value::Number(n) => n
                .as_u64()
                .and_then(|n| u16::try_from(n).ok())
                .ok_or_else(|| self.err(key, format!("expected a port from 0 to 65535, got {n}"))),
            other => Err(self.err(
                key,
                format!("expected a port from 0 to 65535, got {}", short(other)),
            )),
        }
    }

    fn file_path(&self, key: &str, value: &Value) -> Result<PathBuf, ConfigError> {
        let s = self.string(key, value)?;
        if s.is_empty() {
            return Err(self.err(key, "expected a path, got an empty string".into()));
        }
        Ok(PathBuf::from(s))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{parse_config, FileConfig};

    fn parse(text: &str) -> Result<FileConfig, ConfigError> {
        parse_config(Path::new("/etc/holdfast/config.yaml"), text).map(|(c, w)| {
            assert!(w.is_empty(), "{w:?}");
            c
        })
    }

    #[test]
    fn every_key() {
        let cfg = parse(
            "address: 127.0.0.1
readOnlyPort: 10255
healthzBindAddress: 0.0.0.0
healthzPort: 0
tlsCertFile: pki/kubelet.crt
tlsPrivateKeyFile: /etc/pki/kubelet.key
serverTLSBootstrap: true
authentication:
  x509: {clientCAFile: /etc/kubernetes/pki/ca.crt}
  anonymous: {enabled: true}
  webhook: {enabled: true, cacheTTL: 10s}
authorization:
  mode: Webhook
  webhook: {cacheAuthorizedTTL: 1m, cacheUnauthorizedTTL: 0s}
holdfast:
  offlineAuthorization: {users: [ops], groups: [site-admins, system:masters]}
",
        )
        .expect("parse");
        let mut s = ServerConfig::default();
        cfg.server.apply(&mut s);
        assert_eq!(
            s,
            ServerConfig {
                address: "127.0.0.1".parse().expect("ip"),
                read_only_port: 10255,
                healthz_bind_address: "0.0.0.0".parse().expect("ip"),
                healthz_port: 0,
                tls_cert_file: Some("/etc/holdfast/pki/kubelet.crt".into()),
                tls_private_key_file: Some("/etc/pki/kubelet.key".into()),
                client_ca_file: Some("/etc/kubernetes/pki/ca.crt".into()),
                anonymous: true,
                authorization: AuthorizationMode::Webhook,
                token_webhook: true,
                token_cache_ttl: Duration::from_secs(10),
                authorized_ttl: Duration::from_secs(60),
                unauthorized_ttl: Duration::ZERO,
                offline: OfflinePolicy {
                    users: vec!["ops".into()],
                    groups: vec!["site-admins".into(), "system:masters".into()],
                },
                server_tls_bootstrap: true,
            }
        );
    }

    #[test]
    fn defaults_and_errors_name_the_key() {
        let s = ServerConfig::default();
        assert_eq!(s.healthz_port, 10248);
        assert_eq!(s.read_only_port, 0);
        assert!(!s.anonymous);
        assert!(!s.server_tls_bootstrap);
        let key = |text: &str| match parse(text) {
            Err(ConfigError::Key { key, .. }) => key,
            other => panic!("{other:?}"),
        };
        assert_eq!(key("address: here\n"), "address");
        assert_eq!(key("readOnlyPort: 70000\n"), "readOnlyPort");
        assert_eq!(key("serverTLSBootstrap: yes\n"), "serverTLSBootstrap");
        assert_eq!(key("authorization: {mode: RBAC}\n"), "authorization.mode");
        assert_eq!(
            key("authentication: {anonymous: {enabled: yes please}}\n"),
            "authentication.anonymous.enabled"
        );
        assert_eq!(
            key("authentication: {x509: {clientCAFile: 3}}\n"),
            "authentication.x509.clientCAFile"
        );
        assert_eq!(
            key("authentication: {webhook: {cacheTTL: soon}}\n"),
            "authentication.webhook.cacheTTL"
        );
        assert_eq!(
            key("authentication: {webhook: {enabled: 1}}\n"),
            "authentication.webhook.enabled"
        );
        assert_eq!(
            key("authorization: {webhook: {cacheAuthorizedTTL: -1s}}\n"),
            "authorization.webhook.cacheAuthorizedTTL"
        );
        assert_eq!(
            key("holdfast: {offlineAuthorization: {users: root}}\n"),
            "holdfast.offlineAuthorization.users"
        );
        assert_eq!(
            key("holdfast: {offlineAuthorization: {people: [a]}}\n"),
            "holdfast.offlineAuthorization.people"
        );
        assert_eq!(s.token_cache_ttl, Duration::from_secs(120));
        assert_eq!(s.authorized_ttl, Duration::from_secs(300));
        assert_eq!(s.unauthorized_ttl, Duration::from_secs(30));
        assert_eq!(s.offline.users, vec!["kube-apiserver-kubelet-client"]);
        assert_eq!(s.offline.groups, vec!["system:masters"]);
        // An empty policy is allowed: then nobody is let in while offline.
        let cfg = parse("holdfast: {offlineAuthorization: {}}\n").expect("parse");
        let mut empty = ServerConfig::default();
        cfg.server.apply(&mut empty);
        assert!(empty.offline.users.is_empty() && empty.offline.groups.is_empty());
    }

    #[test]
    fn port_flag() {
        let args = |a: &[&str]| a.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let f = crate::config::parse_flags(&args(&["--port", "10260"])).expect("flags");
        assert_eq!(f.port, Some(10260));
        assert!(crate::config::parse_flags(&args(&["--port=0"])).is_err());
        assert!(crate::config::parse_flags(&args(&["--port", "http"])).is_err());
    }
}
