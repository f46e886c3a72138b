//! TLS to the apiserver: a rustls (ring) client config trusting the kubeconfig's CA only,
//! with the client certificate when there is one, for the shared connector in
//! [`crate::tls`], which verifies the server against `tls-server-name` when the
//! kubeconfig sets it. Handshake failures are put in words that name the kubeconfig:
//! "not trusted by the kubeconfig's CA", "rejected the client certificate".

use std::sync::Arc;

use rustls::{CertificateError, ClientConfig};

pub use crate::tls::{TlsConnector, TlsFailure, TlsTransport};

use super::kubeconfig::{Kubeconfig, KubeconfigError};

/// Builds the rustls config for `kc`: ring, TLS 1.2 and 1.3, the cluster CA as the only
/// root, the client certificate if any. A key that does not belong to the certificate is
/// an error here, before any connection.
pub fn client_config(kc: &Kubeconfig) -> Result<Arc<ClientConfig>, KubeconfigError> {
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
    let config = match &kc.identity {
        Some(identity) => builder
            .with_client_auth_cert(identity.chain.clone(), identity.key.clone_key())
            .map_err(|e| {
                let message = match e {
                    rustls::Error::InconsistentKeys(_) => {
                        format!("the client key does not belong to the client certificate ({e})")
                    }
                    e => format!("unusable client certificate or key: {e}"),
                };
                invalid(format!("users[{}].client-key", kc.user), message)
            })?,
        None => builder.with_no_client_auth(),
    };
    Ok(Arc::new(config))
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
