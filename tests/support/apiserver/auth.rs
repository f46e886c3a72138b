//! Who is asking: the double's TLS server configuration, and the authenticator that turns
//! a connection's client certificate or a request's bearer token into a user.
//!
//! Like kube-apiserver, the TLS layer only *requests* a client certificate (with proof
//! of its key) and never refuses one: the x509 authenticator checks it per request, so
//! an expired or foreign certificate is a 401, not a handshake failure. No credentials
//! at all is `system:anonymous`.

use std::collections::HashMap;
use std::sync::Arc;

use rustls::client::danger::HandshakeSignatureValid;
use rustls::pki_types::{CertificateDer, UnixTime};
use rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use rustls::server::WebPkiClientVerifier;
use rustls::{DigitallySignedStruct, DistinguishedName, RootCertStore, ServerConfig};

use super::pki::{Issued, Pki};

/// An authenticated user: name and groups, as the authorizers see them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct User {
    pub name: String,
    pub groups: Vec<String>,
}

impl User {
    pub fn anonymous() -> User {
        User {
            name: "system:anonymous".into(),
            groups: vec!["system:unauthenticated".into()],
        }
    }

    /// `Some(node)` for `system:node:<node>` in group `system:nodes`.
    pub fn node_name(&self) -> Option<&str> {
        if !self.groups.iter().any(|g| g == "system:nodes") {
            return None;
        }
        self.name.strip_prefix("system:node:")
    }

    pub fn is_admin(&self) -> bool {
        self.groups.iter().any(|g| g == "system:masters")
    }

    pub fn is_anonymous(&self) -> bool {
        self.name == "system:anonymous"
    }
}

/// Who a kubeconfig (or a raw test client) speaks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Identity<'a> {
    /// CN=system:node:<name>, O=system:nodes.
    Node(&'a str),
    /// CN=admin, O=system:masters.
    Admin,
    /// Any other user with these groups.
    User {
        name: &'a str,
        groups: &'a [&'a str],
    },
}

impl Identity<'_> {
    /// The certificate subject: (CN, O list).
    pub fn subject(&self) -> (String, Vec<String>) {
        match self {
            Identity::Node(n) => (format!("system:node:{n}"), vec!["system:nodes".into()]),
            Identity::Admin => ("admin".into(), vec!["system:masters".into()]),
            Identity::User { name, groups } => (
                name.to_string(),
                groups.iter().map(|g| g.to_string()).collect(),
            ),
        }
    }

    /// The user the apiserver sees (authenticated users also get system:authenticated).
    pub fn user(&self) -> User {
        let (name, mut groups) = self.subject();
        groups.push("system:authenticated".into());
        User { name, groups }
    }

    /// A file-name-friendly tag.
    pub fn file_tag(&self) -> String {
        let (cn, _) = self.subject();
        cn.chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() || c == '-' {
                    c
                } else {
                    '_'
                }
            })
            .collect()
    }
}

/// Requests a client certificate, never requires one, and accepts whatever is sent once
/// the peer proves it holds the key; the chain itself is judged by `Authenticator`.
#[derive(Debug)]
struct RequestClientCert {
    inner: Arc<dyn ClientCertVerifier>,
}

impl ClientCertVerifier for RequestClientCert {
    fn offer_client_auth(&self) -> bool {
        true
    }

    fn client_auth_mandatory(&self) -> bool {
        false
    }

    fn root_hint_subjects(&self) -> &[DistinguishedName] {
        self.inner.root_hint_subjects()
    }

    fn verify_client_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _now: UnixTime,
    ) -> Result<ClientCertVerified, rustls::Error> {
        Ok(ClientCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.inner.supported_verify_schemes()
    }
}

/// The x509 and token authenticators.
pub struct Authenticator {
    verifier: Arc<dyn ClientCertVerifier>,
    pub tokens: std::sync::Mutex<HashMap<String, User>>,
}

/// The outcome of authentication.
pub enum Authn {
    User(User),
    /// 401: a bad token, or a certificate that does not verify.
    Unauthorized,
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

impl Authenticator {
    pub fn new(pki: &Pki) -> Authenticator {
        let mut roots = RootCertStore::empty();
        roots.add(pki.ca_der.clone()).expect("CA into root store");
        let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider())
            .allow_unauthenticated()
            .build()
            .expect("client verifier");
        Authenticator {
            verifier,
            tokens: std::sync::Mutex::new(HashMap::new()),
        }
    }

    /// The TLS server configuration presenting `server`.
    pub fn server_config(&self, server: &Issued) -> Arc<ServerConfig> {
        let mut config = ServerConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .expect("protocol versions")
            .with_client_cert_verifier(Arc::new(RequestClientCert {
                inner: self.verifier.clone(),
            }))
            .with_single_cert(vec![server.cert_der.clone()], server.key_der())
            .expect("server certificate");
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        Arc::new(config)
    }

    /// The user for a request: a valid client certificate wins, then a bearer token;
    /// an invalid certificate or an unknown token is a 401; nothing is anonymous.
    pub fn authenticate(
        &self,
        pki: &Pki,
        certs: Option<&[CertificateDer<'static>]>,
        authorization: Option<&str>,
    ) -> Authn {
        let mut failed = false;
        if let Some([end, rest @ ..]) = certs {
            let verified = self
                .verifier
                .verify_client_cert(end, rest, UnixTime::now())
                .is_ok();
            match pki.subject_of(end).filter(|_| verified) {
                Some(s) => {
                    let mut groups = s.organizations;
                    groups.push("system:authenticated".into());
                    return Authn::User(User {
                        name: s.common_name,
                        groups,
                    });
                }
                None => failed = true,
            }
        }
        if let Some(h) = authorization {
            let token = h.strip_prefix("Bearer ").unwrap_or("").trim();
            let tokens = self.tokens.lock().unwrap_or_else(|e| e.into_inner());
            return match tokens.get(token) {
                Some(u) => Authn::User(u.clone()),
                None => Authn::Unauthorized,
            };
        }
        if failed {
            Authn::Unauthorized
        } else {
            Authn::User(User::anonymous())
        }
    }
}
