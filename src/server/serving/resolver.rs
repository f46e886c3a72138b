//! The listener's certificate, replaceable while it runs.

use std::sync::{Arc, RwLock};

use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;

/// The listener's serving certificate, which can be replaced while it runs: a new
/// connection gets the one set last, a connection already open keeps the one its
/// handshake used.
#[derive(Debug)]
pub struct ServingCert {
    current: RwLock<Arc<CertifiedKey>>,
}

impl ServingCert {
    pub fn new(first: CertifiedKey) -> Self {
        ServingCert {
            current: RwLock::new(Arc::new(first)),
        }
    }

    pub fn set(&self, next: CertifiedKey) {
        let next = Arc::new(next);
        match self.current.write() {
            Ok(mut c) => *c = next,
            Err(poisoned) => *poisoned.into_inner() = next,
        }
    }

    pub fn current(&self) -> Arc<CertifiedKey> {
        match self.current.read() {
            Ok(c) => c.clone(),
            Err(poisoned) => poisoned.into_inner().clone(),
        }
    }
}

impl ResolvesServerCert for ServingCert {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.current())
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::self_signed;
    use super::*;

    /// Accepts any server certificate: the test looks at which one was served.
    #[derive(Debug)]
    struct AnyServer(Arc<rustls::crypto::CryptoProvider>);

    impl rustls::client::danger::ServerCertVerifier for AnyServer {
        fn verify_server_cert(
            &self,
            _: &rustls_pki_types::CertificateDer<'_>,
            _: &[rustls_pki_types::CertificateDer<'_>],
            _: &rustls_pki_types::ServerName<'_>,
            _: &[u8],
            _: rustls_pki_types::UnixTime,
        ) -> Result<rustls::client::danger::ServerCertVerified, rustls::Error> {
            Ok(rustls::client::danger::ServerCertVerified::assertion())
        }
        fn verify_tls12_signature(
            &self,
            m: &[u8],
            c: &rustls_pki_types::CertificateDer<'_>,
            d: &rustls::DigitallySignedStruct,
        ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
            let algs = &self.0.signature_verification_algorithms;
            rustls::crypto::verify_tls12_signature(m, c, d, algs)
        }
        fn verify_tls13_signature(
            &self,
            m: &[u8],
            c: &rustls_pki_types::CertificateDer<'_>,
            d: &rustls::DigitallySignedStruct,
        ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
            let algs = &self.0.signature_verification_algorithms;
            rustls::crypto::verify_tls13_signature(m, c, d, algs)
        }
        fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
            self.0.signature_verification_algorithms.supported_schemes()
        }
    }

    /// Moves TLS records between the two ends until neither has anything to send.
    fn pump(client: &mut rustls::ClientConnection, server: &mut rustls::ServerConnection) {
        for _ in 0..32 {
            let mut buf = Vec::new();
            let mut moved = false;
            while client.wants_write() {
                client.write_tls(&mut buf).expect("client write");
            }
            if !buf.is_empty() {
                moved = true;
                server.read_tls(&mut buf.as_slice()).expect("server read");
                server.process_new_packets().expect("server process");
            }
            let mut buf = Vec::new();
            while server.wants_write() {
                server.write_tls(&mut buf).expect("server write");
            }
            if !buf.is_empty() {
                moved = true;
                client.read_tls(&mut buf.as_slice()).expect("client read");
                client.process_new_packets().expect("client process");
            }
            if !moved {
                return;
            }
        }
    }

    #[test]
    fn a_swapped_certificate_is_served_to_new_connections_and_open_ones_go_on() {
        use std::io::{Read, Write};
        let (first, first_der) = self_signed(&["one"]);
        let (second, second_der) = self_signed(&["two"]);
        let provider = crate::tls::provider();
        let serving = Arc::new(ServingCert::new(first));
        let server_config = Arc::new(
            rustls::ServerConfig::builder_with_provider(provider.clone())
                .with_safe_default_protocol_versions()
                .expect("versions")
                .with_no_client_auth()
                .with_cert_resolver(serving.clone()),
        );
        let mut client_config = rustls::ClientConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .expect("versions")
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(AnyServer(provider)))
            .with_no_client_auth();
        // A resumed session shows the certificate of the session it resumes.
        client_config.resumption = rustls::client::Resumption::disabled();
        let client_config = Arc::new(client_config);
        let connect = || {
            let name = rustls_pki_types::ServerName::try_from("one").expect("name");
            let mut c = rustls::ClientConnection::new(client_config.clone(), name).expect("c");
            let mut s = rustls::ServerConnection::new(server_config.clone()).expect("s");
            pump(&mut c, &mut s);
            assert!(!c.is_handshaking() && !s.is_handshaking());
            let served = c.peer_certificates().expect("served")[0].as_ref().to_vec();
            (c, s, served)
        };
        let (mut old_c, mut old_s, served) = connect();
        assert_eq!(served, first_der);

        serving.set(second);
        let (_, _, served) = connect();
        assert_eq!(
            served, second_der,
            "a new connection gets the new certificate"
        );

        old_c.writer().write_all(b"still here").expect("write");
        pump(&mut old_c, &mut old_s);
        let mut got = [0u8; 10];
        old_s.reader().read_exact(&mut got).expect("read");
        assert_eq!(&got, b"still here", "the open connection goes on");
        let kept = old_c.peer_certificates().expect("served")[0]
            .as_ref()
            .to_vec();
        assert_eq!(kept, first_der);
    }
}
