//! A ureq connector over rustls with a client config of the caller's (ureq's own rustls
//! connector takes none): the apiserver's CA only, or a registry's roots, client
//! certificates, and a server name other than the URL's host. Handshake failures are
//! put in words by a function the caller gives, so each says what to fix where.

use std::fmt;
use std::io::{self, Read, Write};
use std::sync::Arc;

use rustls::pki_types::ServerName;
use rustls::{ClientConfig, ClientConnection, StreamOwned};
use ureq::unversioned::transport::{
    Buffers, ConnectionDetails, Connector, Either, LazyBuffers, NextTimeout, Transport,
    TransportAdapter,
};

/// Puts a rustls error met with `server` in words.
pub type Describe = fn(&rustls::Error, &str) -> String;

/// A ureq connector that wraps the chained TCP transport in rustls with a fixed config,
/// verifying the server as `server_name` when given, else as the URL's host.
pub struct TlsConnector {
    config: Arc<ClientConfig>,
    server_name: Option<ServerName<'static>>,
    describe: Describe,
}

impl TlsConnector {
    pub fn new(config: Arc<ClientConfig>, server_name: Option<ServerName<'static>>) -> Self {
        TlsConnector {
            config,
            server_name,
            describe: super::describe,
        }
    }

    /// Handshake failures are put in words by `describe` instead of the plain ones.
    pub fn describing(mut self, describe: Describe) -> Self {
        self.describe = describe;
        self
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
            .map_err(|e| handshake_error(e, &shown, self.describe))?;
        let buffers = LazyBuffers::new(
            details.config.input_buffer_size(),
            details.config.output_buffer_size(),
        );
        Ok(Some(Either::B(TlsTransport {
            buffers,
            stream: StreamOwned { conn, sock },
            server: shown,
            describe: self.describe,
        })))
    }
}

/// An established TLS connection, as a ureq transport.
pub struct TlsTransport {
    buffers: LazyBuffers,
    stream: StreamOwned<ClientConnection, TransportAdapter>,
    server: String,
    describe: Describe,
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
            .map_err(|e| handshake_error(e, &self.server, self.describe))
    }

    fn await_input(&mut self, timeout: NextTimeout) -> Result<bool, ureq::Error> {
        self.stream.get_mut().set_timeout(timeout);
        let input = self.buffers.input_append_buf();
        // With TLS 1.3 the server judges the client certificate after the client's
        // handshake is done, so its verdict arrives here, as an alert on the first read.
        let amount = self
            .stream
            .read(input)
            .map_err(|e| handshake_error(e, &self.server, self.describe))?;
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

/// Says what a rustls error inside `e` means, in `describe`'s words; other io errors
/// pass as they are (ureq's timeouts travel inside io errors too and must keep their
/// identity).
fn handshake_error(e: io::Error, server: &str, describe: Describe) -> ureq::Error {
    let Some(tls) = e.get_ref().and_then(|i| i.downcast_ref::<rustls::Error>()) else {
        return ureq::Error::from(e);
    };
    failure(describe(tls, server))
}
