//! The API's TLS: its serving certificate and who its clients are.
//!
//! - Serving certificate: `tlsCertFile` + `tlsPrivateKeyFile`, or one made at first
//!   start and kept in `<root>/pki/kubelet.crt` and `kubelet.key` (0600), self-signed
//!   for the node's name, hostname and addresses, as the kubelet does. Made again when
//!   those names change (a new address after a move). With `serverTLSBootstrap` the
//!   cluster's certificate replaces it while the listener runs ([`super::serving`]).
//! - Clients: as the kubelet (Go's `RequestClientCert` with verification at the
//!   authentication layer), the handshake asks for a certificate but accepts any, so
//!   that a request without one, or with one from another CA, gets an HTTP 401 rather
//!   than a TLS alert; the handshake still proves the client holds the certificate's
//!   key, read from the certificate by [`super::x509`] when webpki cannot parse it (a
//!   version 1 certificate). [`ClientAuth::identify`] then checks the chain against
//!   `authentication.x509.clientCAFile` and says why it refused one.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::client::danger::HandshakeSignatureValid;
use rustls::crypto::CryptoProvider;
use rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use rustls::server::WebPkiClientVerifier;
use rustls::{DigitallySignedStruct, DistinguishedName, SignatureScheme};
use rustls_pki_types::{CertificateDer, PrivateKeyDer, UnixTime};

use super::error::ServerError;
use super::http::User;
use crate::config::ServerConfig;

/// The serving config and the client check that goes with it.
pub struct TlsSetup {
    pub config: Arc<rustls::ServerConfig>,
    pub clients: Arc<ClientAuth>,
    /// What the listener serves; replaced by `serverTLSBootstrap` (see [`super::serving`]).
    pub serving: Arc<super::serving::ServingCert>,
}

/// Builds the TLS server config: reads (or makes) the serving certificate and the
/// client CA. Blocking (files).
pub fn server_config(
    root: &Path,
    node_name: &str,
    settings: &ServerConfig,
) -> Result<TlsSetup, ServerError> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let (chain, key) = match (&settings.tls_cert_file, &settings.tls_private_key_file) {
        (Some(cert), Some(key)) => load_pair(cert, key)?,
        (Some(cert), None) => {
            return Err(ServerError::Certificate {
                path: cert.clone(),
                reason: "tlsCertFile is set but tlsPrivateKeyFile is not".into(),
            })
        }
        _ => self_signed(&root.join("pki"), node_name)?,
    };
    let clients = Arc::new(ClientAuth::new(
        settings.client_ca_file.as_deref(),
        provider.clone(),
    )?);
    let certified = rustls::sign::CertifiedKey::from_der(chain, key, &provider).map_err(|e| {
        ServerError::Certificate {
            path: settings
                .tls_cert_file
                .clone()
                .unwrap_or_else(|| root.join("pki/kubelet.crt")),
            reason: e.to_string(),
        }
    })?;
    let serving = Arc::new(super::serving::ServingCert::new(certified));
    let config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| ServerError::Tls(e.to_string()))?
        .with_client_cert_verifier(clients.clone())
        .with_cert_resolver(serving.clone());
    Ok(TlsSetup {
        config: Arc::new(config),
        clients,
        serving,
    })
}

type Pair = (Vec<CertificateDer<'static>>, PrivateKeyDer<'static>);

fn load_pair(cert: &Path, key: &Path) -> Result<Pair, ServerError> {
    let bad = |path: &Path, reason: String| ServerError::Certificate {
        path: path.to_owned(),
        reason,
    };
    let read = |path: &Path| std::fs::read(path).map_err(|e| bad(path, e.to_string()));
    let chain = crate::tls::certificates(&read(cert)?).map_err(|e| bad(cert, e))?;
    let key = crate::tls::private_key(&read(key)?).map_err(|e| bad(key, e))?;
    Ok((chain, key))
}

/// The names a self-signed certificate is made for: the node's name, the machine's
/// hostname, `localhost`, the node's address and loopback.
fn names(node_name: &str) -> Vec<String> {
    let mut names = vec![node_name.to_owned()];
    if let Ok(h) = std::fs::read_to_string("/proc/sys/kernel/hostname") {
        names.push(h.trim().to_lowercase());
    }
    names.push("localhost".into());
    if let Some(ip) = crate::node::host_ip() {
        names.push(ip);
    }
    names.push("127.0.0.1".into());
    names.retain(|n| !n.is_empty());
    names.dedup();
    names
}

fn self_signed(dir: &Path, node_name: &str) -> Result<Pair, ServerError> {
    let cert_path = dir.join("kubelet.crt");
    let key_path = dir.join("kubelet.key");
    let names_path = dir.join("kubelet.names");
    let want = names(node_name).join("\n");
    let have = std::fs::read_to_string(&names_path).unwrap_or_default();
    if have == want && cert_path.exists() && key_path.exists() {
        match load_pair(&cert_path, &key_path) {
            Ok(pair) => return Ok(pair),
            Err(e) => log::warn!("kubelet API: {e}; making a new self-signed certificate"),
        }
    }
    let io = |context: String| move |source| ServerError::Io { context, source };
    std::fs::create_dir_all(dir).map_err(io(format!("create {}", dir.display())))?;
    let bad = |reason: String| ServerError::Certificate {
        path: cert_path.clone(),
        reason,
    };
    let mut params =
        rcgen::CertificateParams::new(Vec::<String>::new()).map_err(|e| bad(e.to_string()))?;
    for n in names(node_name) {
        let san = match n.parse::<std::net::IpAddr>() {
            Ok(ip) => rcgen::SanType::IpAddress(ip),
            Err(_) => rcgen::SanType::DnsName(
                n.clone()
                    .try_into()
                    .map_err(|e: rcgen::Error| bad(format!("name {n:?}: {e}")))?,
            ),
        };
        params.subject_alt_names.push(san);
    }
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, format!("{node_name}@holdfast"));
    let now = crate::time::now();
    params.not_before = rcgen::date_time_ymd(year_of(now).saturating_sub(1), 1, 1);
    // The kubelet's self-signed certificate lasts a year; a gateway may run untouched
    // for longer, and its clients trust it by pinning, not by its dates.
    params.not_after = rcgen::date_time_ymd(year_of(now) + 10, 1, 1);
    let key = rcgen::KeyPair::generate().map_err(|e| bad(e.to_string()))?;
    let cert = params.self_signed(&key).map_err(|e| bad(e.to_string()))?;
    write_private(&key_path, key.serialize_pem().as_bytes())?;
    std::fs::write(&cert_path, cert.pem()).map_err(io(format!("write {}", cert_path.display())))?;
    std::fs::write(&names_path, want).map_err(io(format!("write {}", names_path.display())))?;
    log::info!(
        "kubelet API: made a self-signed serving certificate {}",
        cert_path.display()
    );
    load_pair(&cert_path, &key_path)
}

fn year_of(t: crate::time::Timestamp) -> i32 {
    t.strftime("%Y").to_string().parse().unwrap_or(2026)
}

fn write_private(path: &Path, data: &[u8]) -> Result<(), ServerError> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let tmp = path.with_extension("tmp");
    let _ = std::fs::remove_file(&tmp);
    std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&tmp)
        .and_then(|mut f| f.write_all(data).and_then(|()| f.sync_all()))
        .and_then(|()| std::fs::rename(&tmp, path))
        .map_err(|source| ServerError::Io {
            context: format!("write {}", path.display()),
            source,
        })
}

/// Client authentication against the client CA (see the module doc).
#[derive(Debug)]
pub struct ClientAuth {
    /// None without `clientCAFile`: then no certificate is valid.
    inner: Option<Arc<dyn ClientCertVerifier>>,
    provider: Arc<CryptoProvider>,
    hints: Vec<DistinguishedName>,
}

impl ClientAuth {
    fn new(ca_file: Option<&Path>, provider: Arc<CryptoProvider>) -> Result<Self, ServerError> {
        let Some(path) = ca_file else {
            return Ok(ClientAuth {
                inner: None,
                provider,
                hints: Vec::new(),
            });
        };
        let bad = |reason: String| ServerError::ClientCa {
            path: PathBuf::from(path),
            reason,
        };
        let bytes = std::fs::read(path).map_err(|e| bad(e.to_string()))?;
        let mut roots = rustls::RootCertStore::empty();
        for cert in crate::tls::ca_certificates(&bytes).map_err(bad)? {
            roots.add(cert).map_err(|e| bad(e.to_string()))?;
        }
        let inner = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider.clone())
            .build()
            .map_err(|e| bad(e.to_string()))?;
        let hints = inner.root_hint_subjects().to_vec();
        Ok(ClientAuth {
            inner: Some(inner),
            provider,
            hints,
        })
    }

    /// The user named by the certificates a client presented if they chain to the
    /// client CA (subject CN and O); if not, why not, in words for the client's 401.
    pub fn identify(&self, certs: Option<&[CertificateDer<'_>]>) -> Result<User, String> {
        let Some([leaf, rest @ ..]) = certs else {
            return Err("no client certificate".into());
        };
        let Some(inner) = &self.inner else {
            return Err("no client certificate is accepted: the kubelet API has no \
                        authentication.x509.clientCAFile"
                .into());
        };
        match super::x509::fields(leaf) {
            Some(f) if f.version != 3 => {
                return Err(format!(
                    "the client certificate is X.509 version {}, which has no extensions; \
                     it must be version 3 (with extendedKeyUsage clientAuth)",
                    f.version
                ))
            }
            _ => {}
        }
        inner
            .verify_client_cert(leaf, rest, UnixTime::now())
            .map_err(|e| refusal(&e))?;
        let subject =
            super::x509::subject(leaf).ok_or("the client certificate's subject cannot be read")?;
        User::from_subject(subject)
    }
}

/// Why a client certificate was refused, as the 401 says it.
fn refusal(e: &rustls::Error) -> String {
    use rustls::CertificateError as C;
    let why = match e {
        rustls::Error::InvalidCertificate(C::UnknownIssuer | C::BadSignature) => {
            "the client certificate is not signed by the client CA (clientCAFile)"
        }
        rustls::Error::InvalidCertificate(C::Expired | C::ExpiredContext { .. }) => {
            "the client certificate has expired"
        }
        rustls::Error::InvalidCertificate(C::NotValidYet | C::NotValidYetContext { .. }) => {
            "the client certificate is not valid yet (or this machine's clock is wrong)"
        }
        rustls::Error::InvalidCertificate(C::InvalidPurpose | C::InvalidPurposeContext { .. }) => {
            "the client certificate is not for client authentication (extendedKeyUsage)"
        }
        _ => "the client certificate was refused",
    };
    format!("{why}: {e}")
}

impl ClientCertVerifier for ClientAuth {
    fn offer_client_auth(&self) -> bool {
        true
    }

    fn client_auth_mandatory(&self) -> bool {
        false
    }

    fn root_hint_subjects(&self) -> &[DistinguishedName] {
        &self.hints
    }

    fn verify_client_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _now: UnixTime,
    ) -> Result<ClientCertVerified, rustls::Error> {
        // Judged per request by `identify`, so that the answer is a 401.
        Ok(ClientCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        let algorithms = &self.provider.signature_verification_algorithms;
        match rustls::crypto::verify_tls12_signature(message, cert, dss, algorithms) {
            // webpki could not read the certificate (version 1): the key alone.
            Err(rustls::Error::InvalidCertificate(_)) => {
                super::x509::verify_signature(message, cert, dss, algorithms, false)
            }
            r => r,
        }
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        let algorithms = &self.provider.signature_verification_algorithms;
        match rustls::crypto::verify_tls13_signature(message, cert, dss, algorithms) {
            Err(rustls::Error::InvalidCertificate(_)) => {
                super::x509::verify_signature(message, cert, dss, algorithms, true)
            }
            r => r,
        }
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.provider
            .signature_verification_algorithms
            .supported_schemes()
    }
}
