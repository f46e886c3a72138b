//! TLS to the apiserver: a rustls (ring) client config trusting the kubeconfig's CA only,
//! with the client certificate when there is one, and a ureq connector that verifies the
//! server against `tls-server-name` when the kubeconfig sets it (ureq's own rustls
//! connector always uses the URL's host). Handshake failures are put in words that name
//! the kubeconfig: "not trusted by the kubeconfig's CA", "rejected the client certificate".

use std::fmt;
use std::io::{self, Read, Write};
use std::sync::Arc;

use rustls::pki_types::ServerName;
use rustls::{AlertDescription, CertificateError, ClientConfig, ClientConnection, StreamOwned};
use ureq::unversioned::transport::{
    Buffers, ConnectionDetails, Connector, Either, LazyBuffers, NextTimeout, Transport,
    TransportAdapter,
};

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
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = ClientConfig::builder_with_provider(provider)
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

/// A ureq connector that wraps the chained TCP transport in rustls with a fixed config,
/// verifying the server as `server_name` when given, else as the URL's host.
pub struct TlsConnector {
    config: Arc<ClientConfig>,
    server_name: Option<ServerName<'static>>,
}

impl TlsConnector {
    pub fn new(config: Arc<ClientConfig>, server_name: Option<ServerName<'static>>) -> Self {
        TlsConnector {
            config,
            server_name,
        }
    }

    fn name_for(&self, details: &ConnectionDetails) -> Result<ServerName<'static>, ureq::Error> {
        if let Some(name) = &self.server_name {
            return Ok(name.clone());
        }
        let host = details.uri.host().unwrap_or_default();
        // An IPv6 literal comes bracketed in a URL, bare in a certificate.
        let host = host.trim_start_matches('[').trim_end_matches(']');
        ServerName::try_from(host.to_string())
            .map_err(|e| failure(format!("{host:?} is not a valid TLS server name: {e}")))
    }
}

impl fmt::Debug for TlsConnector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TlsConnector")
            .field("server_name", &self.server_name)
            .finish()
    }
}

impl<In: Transport> Connector<In> for TlsConnector {
    type Out = Either<In, TlsTransport>;

    fn connect(
        &self,
        details: &ConnectionDetails,
        chained: Option<In>,
    ) -> Result<Option<Self::Out>, ureq::Error> {
        let Some(transport) = chained else {
            return Ok(None);
        };
        if !details.needs_tls() || transport.is_tls() {
            return Ok(Some(Either::A(transport)));
        }
        let name = self.name_for(details)?;
        let shown = name.to_str().into_owned();
        let mut conn = ClientConnection::new(self.config.clone(), name)
            .map_err(|e| failure(format!("tls setup for {shown}: {e}")))?;
        let mut sock = TransportAdapter::new(transport.boxed(), details.current_time.clone());
        sock.set_timeout(details.timeout);
        conn.complete_io(&mut sock)
            .map_err(|e| handshake_error(e, &shown))?;
        let buffers = LazyBuffers::new(
            details.config.input_buffer_size(),
            details.config.output_buffer_size(),
        );
        Ok(Some(Either::B(TlsTransport {
            buffers,
            stream: StreamOwned { conn, sock },
            server: shown,
        })))
    }
}

/// An established TLS connection, as a ureq transport.
pub struct TlsTransport {
    buffers: LazyBuffers,
    stream: StreamOwned<ClientConnection, TransportAdapter>,
    server: String,
}

impl fmt::Debug for TlsTransport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TlsTransport")
            .field("server", &self.server)
            .finish()
    }
}

impl Transport for TlsTransport {
    fn buffers(&mut self) -> &mut dyn Buffers {
        &mut self.buffers
    }

    fn transmit_output(&mut self, amount: usize, timeout: NextTimeout) -> Result<(), ureq::Error> {
        self.stream.get_mut().set_timeout(timeout);
        let output = &self.buffers.output()[..amount];
        self.stream
            .write_all(output)
            .map_err(|e| handshake_error(e, &self.server))
    }

    fn await_input(&mut self, timeout: NextTimeout) -> Result<bool, ureq::Error> {
        self.stream.get_mut().set_timeout(timeout);
        let input = self.buffers.input_append_buf();
        // With TLS 1.3 the server judges the client certificate after the client's
        // handshake is done, so its verdict arrives here, as an alert on the first read.
        let amount = self
            .stream
            .read(input)
            .map_err(|e| handshake_error(e, &self.server))?;
        self.buffers.input_appended(amount);
        Ok(amount > 0)
    }

    fn is_open(&mut self) -> bool {
        self.stream.get_mut().get_mut().is_open()
    }

    fn is_tls(&self) -> bool {
        true
    }
}

/// A TLS failure put in words, carried through ureq as an io error.
#[derive(Debug)]
pub struct TlsFailure(pub String);

impl fmt::Display for TlsFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for TlsFailure {}

fn failure(message: String) -> ureq::Error {
    ureq::Error::Io(io::Error::new(
        io::ErrorKind::InvalidData,
        TlsFailure(message),
    ))
}

/// Says what a rustls error inside `e` means for this agent; other io errors pass as
/// they are (ureq's timeouts travel inside io errors too and must keep their identity).
fn handshake_error(e: io::Error, server: &str) -> ureq::Error {
    let Some(tls) = e.get_ref().and_then(|i| i.downcast_ref::<rustls::Error>()) else {
        return ureq::Error::from(e);
    };
    failure(describe(tls, server))
}

/// rustls's words, with what they mean for a kubeconfig.
pub fn describe(e: &rustls::Error, server: &str) -> String {
    use CertificateError as C;
    match e {
        rustls::Error::InvalidCertificate(C::UnknownIssuer | C::BadSignature) => format!(
            "tls handshake with {server}: the server certificate is not trusted by the \
             kubeconfig's CA (certificate-authority): {e}"
        ),
        rustls::Error::InvalidCertificate(
            C::NotValidForName | C::NotValidForNameContext { .. },
        ) => {
            format!(
                "tls handshake with {server}: the server certificate does not name {server} \
                 (the kubeconfig's tls-server-name can name the host it was issued for): {e}"
            )
        }
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
        ) => {
            format!("tls handshake with {server}: the server rejected the client certificate: {e}")
        }
        e => format!("tls handshake with {server}: {e}"),
    }
}
