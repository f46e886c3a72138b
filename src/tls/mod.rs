//! tls: the one TLS client stack in the binary, rustls with ring under ureq, shared by
//! the apiserver client (`kube`), the registry client (`image::registry`) and the static
//! pod URL source: the connector that lets each bring its own rustls config, the
//! system's CA bundle, PEM reading, the words for handshake and transport failures, and the DER reader ([`der`]) the serving side shares. Holds no policy about whom to trust; the callers decide that.

mod connector;
pub mod der;

use std::sync::{Arc, Mutex, PoisonError, Weak};

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::{self, PemObject};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::{AlertDescription, CertificateError, DigitallySignedStruct, SignatureScheme};

pub use connector::{Describe, TlsConnector, TlsFailure, TlsTransport};

/// ring: no C build of aws-lc for the ARM targets.
pub fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// The system's CA bundle (`/etc/ssl/certs` on Debian and Yocto), read when a client's
/// first connection needs it and shared by the agents made meanwhile. Only a weak
/// reference stays: the certificates (about 150, a few hundred KiB) are freed once the
/// agents have their parsed roots, rather than held for the agent's lifetime.
fn native_roots() -> Arc<Vec<CertificateDer<'static>>> {
    static ROOTS: Mutex<Weak<Vec<CertificateDer<'static>>>> = Mutex::new(Weak::new());
    let mut held = ROOTS.lock().unwrap_or_else(PoisonError::into_inner);
    if let Some(roots) = held.upgrade() {
        return roots;
    }
    let found = rustls_native_certs::load_native_certs();
    for e in &found.errors {
        log::warn!("system CA certificates: {e}");
    }
    let roots = Arc::new(found.certs);
    *held = Arc::downgrade(&roots);
    roots
}

/// The system's trust anchors as a root store, for a client that trusts what the host
/// trusts. A system certificate rustls cannot use is skipped: it is no reason to fail
/// every connection.
pub fn system_roots() -> rustls::RootCertStore {
    let mut roots = rustls::RootCertStore::empty();
    for cert in native_roots().iter() {
        let _ = roots.add(cert.clone());
    }
    roots
}

/// A ureq error in words: TLS failures as the shared connector or rustls put them,
/// naming `host`.
pub fn describe_ureq(e: ureq::Error, host: &str) -> String {
    match e {
        ureq::Error::Io(io) => match io.get_ref().and_then(|i| i.downcast_ref::<TlsFailure>()) {
            Some(tls) => tls.0.clone(),
            None => io.to_string(),
        },
        ureq::Error::Timeout(t) => format!("timed out ({t})"),
        ureq::Error::Rustls(tls) => describe(&tls, host),
        // The proxy's own words (`crate::proxy`), naming it without its credentials.
        ureq::Error::ConnectProxyFailed(m) => m,
        e => e.to_string(),
    }
}

/// Every PEM certificate in `bytes`; at least one.
pub fn certificates(bytes: &[u8]) -> Result<Vec<CertificateDer<'static>>, String> {
    let certs = CertificateDer::pem_slice_iter(bytes)
        .collect::<Result<Vec<_>, pem::Error>>()
        .map_err(|e| format!("bad PEM: {e}"))?;
    if certs.is_empty() {
        return Err("no certificate found (expected PEM \"BEGIN CERTIFICATE\")".to_string());
    }
    Ok(certs)
}

/// Every PEM certificate in `bytes`, each one usable as a trust anchor.
pub fn ca_certificates(bytes: &[u8]) -> Result<Vec<CertificateDer<'static>>, String> {
    let certs = certificates(bytes)?;
    for (i, cert) in certs.iter().enumerate() {
        rustls::RootCertStore::empty()
            .add(cert.clone())
            .map_err(|e| format!("certificate {} is not a usable CA certificate: {e}", i + 1))?;
    }
    Ok(certs)
}

/// The first PEM private key in `bytes` (PKCS#8, PKCS#1 or SEC1).
pub fn private_key(bytes: &[u8]) -> Result<PrivateKeyDer<'static>, String> {
    PrivateKeyDer::from_pem_slice(bytes).map_err(|e| match e {
        pem::Error::NoItemsFound => "no private key found (expected PEM \"BEGIN PRIVATE KEY\", \
                                     \"BEGIN RSA PRIVATE KEY\" or \"BEGIN EC PRIVATE KEY\")"
            .to_string(),
        e => format!("bad PEM: {e}"),
    })
}

/// `der` as one PEM block under `label`, in 64-column lines.
pub fn pem_encode(label: &str, der: &[u8]) -> String {
    let body = crate::wire::base64_encode(der);
    let mut out = format!("-----BEGIN {label}-----\n");
    for line in body.as_bytes().chunks(64) {
        out.push_str(&String::from_utf8_lossy(line));
        out.push('\n');
    }
    out.push_str(&format!("-----END {label}-----\n"));
    out
}

/// rustls's words, with what they usually mean.
pub fn describe(e: &rustls::Error, server: &str) -> String {
    use CertificateError as C;
    match e {
        rustls::Error::InvalidCertificate(C::UnknownIssuer | C::BadSignature) => format!(
            "tls handshake with {server}: the server certificate is not signed by a trusted CA: {e}"
        ),
        rustls::Error::InvalidCertificate(
            C::NotValidForName | C::NotValidForNameContext { .. },
        ) => format!("tls handshake with {server}: the server certificate does not name {server}: {e}"),
        rustls::Error::InvalidCertificate(
            C::Expired | C::ExpiredContext { .. } | C::NotValidYet | C::NotValidYetContext { .. },
        ) => format!(
            "tls handshake with {server}: the server certificate is outside its validity \
             period (or this machine's clock is wrong): {e}"
        ),
        rustls::Error::AlertReceived(
            AlertDescription::BadCertificate
            | AlertDescription::CertificateRequired
            | AlertDescription::UnknownCA
            | AlertDescription::CertificateExpired
            | AlertDescription::CertificateUnknown
            | AlertDescription::CertificateRevoked
            | AlertDescription::UnsupportedCertificate
            | AlertDescription::AccessDenied,
        ) => format!(
            "tls handshake with {server}: the server rejected the client certificate (or its absence): {e}"
        ),
        e => format!("tls handshake with {server}: {e}"),
    }
}

/// Accepts any server certificate, still checking that the server holds its key. Only
/// for endpoints the operator marked `skipVerify` (a site cache with a certificate
/// nobody issued), whose content is checked by digest and who get no credentials, and
/// for HTTPS probes, which the kubelet never verifies either (InsecureSkipVerify).
#[derive(Debug)]
pub struct AnyServerCertificate(pub Arc<CryptoProvider>);

impl ServerCertVerifier for AnyServerCertificate {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pem_errors_say_what_was_expected() {
        let e = certificates(b"not pem").expect_err("no cert");
        assert!(e.contains("BEGIN CERTIFICATE"), "{e}");
        let e = private_key(b"").expect_err("no key");
        assert!(e.contains("BEGIN PRIVATE KEY"), "{e}");
    }
}
