//! TLS to the apiserver: a rustls (ring) client config trusting the kubeconfig's CA only,
//! with the client certificate when there is one, for the shared connector in
//! [`crate::tls`], which verifies the server against `tls-server-name` when the
//! kubeconfig sets it. Handshake failures are put in words that name the kubeconfig:
//! "not trusted by the kubeconfig's CA", "rejected the client certificate".

use std::sync::{Arc, RwLock};

use rustls::client::ResolvesClientCert;
use rustls::sign::CertifiedKey;
use rustls::{CertificateError, ClientConfig, SignatureScheme};

pub use crate::tls::{TlsConnector, TlsFailure, TlsTransport};

use super::kubeconfig::{Kubeconfig, KubeconfigError};

/// The client certificate the handshakes present, replaceable while connections run:
/// a rotated certificate is used from the next handshake on, without a new client.
#[derive(Debug)]
pub struct SwappableCert {
    current: RwLock<Arc<CertifiedKey>>,
}

impl SwappableCert {
    /// A chain and its key, checked to belong together.
    pub fn new(
        chain: Vec<rustls_pki_types::CertificateDer<'static>>,
        key: rustls_pki_types::PrivateKeyDer<'static>,
    ) -> Result<SwappableCert, rustls::Error> {
        Ok(SwappableCert {
            current: RwLock::new(Arc::new(certified(chain, key)?)),
        })
    }

    /// Presents `chain` and `key` from the next handshake on; the old pair is kept
    /// when they do not belong together.
    pub fn swap(
        &self,
        chain: Vec<rustls_pki_types::CertificateDer<'static>>,
        key: rustls_pki_types::PrivateKeyDer<'static>,
    ) -> Result<(), rustls::Error> {
        let next = Arc::new(certified(chain, key)?);
        *self
            .current
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = next;
        Ok(())
    }

    /// The leaf certificate now presented (DER).
    pub fn leaf(&self) -> Option<rustls_pki_types::CertificateDer<'static>> {
        self.current
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .cert
            .first()
            .cloned()
    }
}

impl ResolvesClientCert for SwappableCert {
    fn resolve(&self, _hints: &[&[u8]], _schemes: &[SignatureScheme]) -> Option<Arc<CertifiedKey>> {
        Some(
            self.current
                .read()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .clone(),
        )
    }

    fn has_certs(&self) -> bool {
        true
    }
}

fn certified(
    chain: Vec<rustls_pki_types::CertificateDer<'static>>,
    key: rustls_pki_types::PrivateKeyDer<'static>,
) -> Result<CertifiedKey, rustls::Error> {
    if chain.is_empty() {
        return Err(rustls::Error::NoCertificatesPresented);
    }
    let provider = crate::tls::provider();
    let signing = provider.key_provider.load_private_key(key)?;
    let certified = CertifiedKey::new(chain, signing);
    match certified.keys_match() {
        Ok(()) | Err(rustls::Error::InconsistentKeys(rustls::InconsistentKeys::Unknown)) => {
            Ok(certified)
        }
        Err(e) => Err(e),
    }
}

/// Builds the rustls config for `kc`: ring, TLS 1.2 and 1.3, the cluster CA as the only
/// root, the client certificate if any. A key that does not belong to the certificate is
/// an error here, before any connection.
pub fn client_config(kc: &Kubeconfig) -> Result<Arc<ClientConfig>, KubeconfigError> {
    client_config_with(kc).map(|(config, _)| config)
}

/// [`client_config`], with the handle that swaps its client certificate (if it has one).
pub fn client_config_with(
    kc: &Kubeconfig,
) -> Result<(Arc<ClientConfig>, Option<Arc<SwappableCert>>), KubeconfigError> {
    let invalid = |field: String, message: String| KubeconfigError::Field {
        path: kc.path.clone(),
        field,
        message,
    };
    let builder = ClientConfig::builder_with_provider(crate::tls::provider())
        .with_protocol_versions(rustls::ALL_VERSIONS)
        .map_err(|e| invalid(format!("clusters[{}]", kc.cluster), e.to_string()))?;
    let mut roots = rustls::RootCertStore::empty();
    for cert in &kc.ca {
        roots.add(cert.clone()).map_err(|e| {
            invalid(
                format!("clusters[{}].certificate-authority", kc.cluster),
                format!("not a usable CA certificate: {e}"),
            )
        })?;
    }
    let builder = builder.with_root_certificates(roots);
    let (config, swappable) = match &kc.identity {
        Some(identity) => {
            let cert = SwappableCert::new(identity.chain.clone(), identity.key.clone_key())
                .map_err(|e| {
                    let message = match e {
                        rustls::Error::InconsistentKeys(_) => format!(
                            "the client key does not belong to the client certificate ({e})"
                        ),
                        e => format!("unusable client certificate or key: {e}"),
                    };
                    invalid(format!("users[{}].client-key", kc.user), message)
                })?;
            let cert = Arc::new(cert);
            (builder.with_client_cert_resolver(cert.clone()), Some(cert))
        }
        None => (builder.with_no_client_auth(), None),
    };
    Ok((Arc::new(config), swappable))
}

/// rustls's words, with what they mean for a kubeconfig: where the kubeconfig can put
/// it right, it is named; otherwise the shared wording.
pub fn describe(e: &rustls::Error, server: &str) -> String {
    use CertificateError as C;
    match e {
        rustls::Error::InvalidCertificate(C::UnknownIssuer | C::BadSignature) => format!(
            "tls handshake with {server}: the server certificate is not trusted by the \
             kubeconfig's CA (certificate-authority): {e}"
        ),
        rustls::Error::InvalidCertificate(
            C::NotValidForName | C::NotValidForNameContext { .. },
        ) => format!(
            "tls handshake with {server}: the server certificate does not name {server} \
             (the kubeconfig's tls-server-name can name the host it was issued for): {e}"
        ),
        e => crate::tls::describe(e, server),
    }
}

/// A ureq error in words: TLS failures as [`describe`] puts them, the rest with the
/// server.
pub(super) fn describe_transport(server: &str, e: ureq::Error) -> String {
    match e {
        ureq::Error::Io(io) => {
            if let Some(tls) = io.get_ref().and_then(|i| i.downcast_ref::<TlsFailure>()) {
                return tls.0.clone();
            }
            format!("{server}: {io}")
        }
        ureq::Error::Timeout(t) => format!("{server}: timed out ({t})"),
        ureq::Error::Rustls(tls) => describe(&tls, server),
        // The proxy's own words (`crate::proxy`), naming it without its credentials.
        ureq::Error::ConnectProxyFailed(m) => format!("{server}: {m}"),
        e => format!("{server}: {e}"),
    }
}
