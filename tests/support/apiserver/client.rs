//! A raw HTTP/1.1-over-TLS client for checking the double byte by byte: it sends exactly
//! the request given and returns the status line, headers and body (chunk framing kept
//! apart), on one keep-alive connection.

use std::io::{self, BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::Arc;
use std::time::Duration;

use rustls::pki_types::ServerName;
use rustls::{ClientConfig, ClientConnection, RootCertStore, StreamOwned};

use super::pki::{Issued, Pki};

type Stream = BufReader<StreamOwned<ClientConnection, TcpStream>>;

/// A response as received.
#[derive(Debug, Clone)]
pub struct RawResponse {
    pub code: u16,
    pub reason: String,
    /// Header names as sent.
    pub headers: Vec<(String, String)>,
    /// The body, chunk framing removed.
    pub body: Vec<u8>,
    /// Each chunk's data when the body was chunked.
    pub chunks: Option<Vec<Vec<u8>>>,
}

impl RawResponse {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body).expect("response body is JSON")
    }
}

/// A connection to the double with fixed credentials.
pub struct RawClient {
    addr: SocketAddr,
    config: Arc<ClientConfig>,
    server_name: ServerName<'static>,
    bearer: Option<String>,
    stream: Option<Stream>,
    pub user_agent: String,
}

/// A streamed (watch) response: the head, then chunks as they arrive.
pub struct RawStream {
    pub code: u16,
    pub headers: Vec<(String, String)>,
    stream: Stream,
    chunked: bool,
}

impl RawStream {
    /// The next chunk's data; `Ok(None)` at the terminating chunk.
    pub fn next_chunk(&mut self) -> io::Result<Option<Vec<u8>>> {
        if !self.chunked {
            return Err(io::Error::other("not chunked"));
        }
        read_chunk(&mut self.stream)
    }

    /// Bounds how long `next_chunk` may block.
    pub fn set_timeout(&mut self, t: Duration) {
        let _ = self.stream.get_ref().sock.set_read_timeout(Some(t));
    }
}

fn read_line(r: &mut Stream) -> io::Result<String> {
    let mut l = String::new();
    if r.read_line(&mut l)? == 0 {
        return Err(io::Error::new(
            io::ErrorKind::UnexpectedEof,
            "connection closed",
        ));
    }
    Ok(l.trim_end_matches(['\r', '\n']).to_string())
}

fn read_chunk(r: &mut Stream) -> io::Result<Option<Vec<u8>>> {
    let size = read_line(r)?;
    let n = usize::from_str_radix(size.trim(), 16)
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidData, format!("chunk size {size:?}")))?;
    if n == 0 {
        read_line(r)?;
        return Ok(None);
    }
    let mut data = vec![0; n];
    r.read_exact(&mut data)?;
    read_line(r)?;
    Ok(Some(data))
}

/// Status code, reason phrase, headers.
type Head = (u16, String, Vec<(String, String)>);

fn read_head(r: &mut Stream) -> io::Result<Head> {
    let status = read_line(r)?;
    let mut parts = status.splitn(3, ' ');
    let _version = parts.next();
    let code = parts
        .next()
        .and_then(|c| c.parse().ok())
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidData, status.clone()))?;
    let reason = parts.next().unwrap_or("").to_string();
    let mut headers = Vec::new();
    loop {
        let l = read_line(r)?;
        if l.is_empty() {
            break;
        }
        if let Some((n, v)) = l.split_once(':') {
            headers.push((n.trim().to_string(), v.trim().to_string()));
        }
    }
    Ok((code, reason, headers))
}

fn is_chunked(headers: &[(String, String)]) -> bool {
    headers
        .iter()
        .any(|(n, v)| n.eq_ignore_ascii_case("transfer-encoding") && v == "chunked")
}

impl RawClient {
    /// A client trusting `pki`'s CA, presenting `cert` if given.
    pub fn new(addr: SocketAddr, pki: &Pki, cert: Option<&Issued>) -> RawClient {
        let mut roots = RootCertStore::empty();
        roots.add(pki.ca_der.clone()).expect("CA into roots");
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let builder = ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .expect("protocol versions")
            .with_root_certificates(roots);
        let config = match cert {
            Some(c) => builder
                .with_client_auth_cert(vec![c.cert_der.clone()], c.key_der())
                .expect("client certificate"),
            None => builder.with_no_client_auth(),
        };
        RawClient {
            addr,
            config: Arc::new(config),
            server_name: ServerName::try_from("127.0.0.1").expect("server name"),
            bearer: None,
            stream: None,
            user_agent: "edge-node-agent-fixtures/1.0 (linux/amd64)".into(),
        }
    }

    /// Sends `Authorization: Bearer <token>` on every request.
    pub fn with_bearer(mut self, token: &str) -> RawClient {
        self.bearer = Some(token.to_string());
        self
    }

    /// Verifies the server certificate against this name instead of 127.0.0.1.
    pub fn with_server_name(mut self, name: &str) -> RawClient {
        self.server_name = ServerName::try_from(name.to_string()).expect("server name");
        self
    }

    fn connect(&self) -> io::Result<Stream> {
        let tcp = TcpStream::connect(self.addr)?;
        tcp.set_read_timeout(Some(Duration::from_secs(30)))?;
        let conn = ClientConnection::new(self.config.clone(), self.server_name.clone())
            .map_err(io::Error::other)?;
        let mut s = StreamOwned::new(conn, tcp);
        while s.conn.is_handshaking() {
            s.conn.complete_io(&mut s.sock)?;
        }
        Ok(BufReader::new(s))
    }

    fn send(
        &mut self,
        stream: &mut Stream,
        method: &str,
        target: &str,
        content_type: Option<&str>,
        body: &[u8],
    ) -> io::Result<()> {
        let mut req = format!(
            "{method} {target} HTTP/1.1\r\nHost: {}\r\nUser-Agent: {}\r\nAccept: application/json\r\n",
            self.addr, self.user_agent
        );
        if let Some(t) = &self.bearer {
            req.push_str(&format!("Authorization: Bearer {t}\r\n"));
        }
        if let Some(ct) = content_type {
            req.push_str(&format!("Content-Type: {ct}\r\n"));
        }
        if !body.is_empty() || content_type.is_some() {
            req.push_str(&format!("Content-Length: {}\r\n", body.len()));
        }
        req.push_str("\r\n");
        let w = stream.get_mut();
        w.write_all(req.as_bytes())?;
        w.write_all(body)?;
        w.flush()
    }

    /// One request on the keep-alive connection (on a new one if the server closed it).
    pub fn request(
        &mut self,
        method: &str,
        target: &str,
        content_type: Option<&str>,
        body: &[u8],
    ) -> io::Result<RawResponse> {
        loop {
            let (mut stream, reused) = match self.stream.take() {
                Some(s) => (s, true),
                None => (self.connect()?, false),
            };
            let sent = self.send(&mut stream, method, target, content_type, body);
            let (code, reason, headers) = match sent.and_then(|_| read_head(&mut stream)) {
                Ok(h) => h,
                // A kept-alive connection the server has closed meanwhile: once more on
                // a new one.
                Err(_) if reused => continue,
                Err(e) => return Err(e),
            };
            let (body, chunks) = if is_chunked(&headers) {
                let mut chunks = Vec::new();
                while let Some(c) = read_chunk(&mut stream)? {
                    chunks.push(c);
                }
                (chunks.concat(), Some(chunks))
            } else {
                let n: usize = headers
                    .iter()
                    .find(|(n, _)| n.eq_ignore_ascii_case("content-length"))
                    .and_then(|(_, v)| v.parse().ok())
                    .unwrap_or(0);
                let mut b = vec![0; n];
                stream.read_exact(&mut b)?;
                (b, None)
            };
            self.stream = Some(stream);
            return Ok(RawResponse {
                code,
                reason,
                headers,
                body,
                chunks,
            });
        }
    }

    /// GET on a fresh connection, returning after the head so chunks can be read as the
    /// server sends them.
    pub fn stream(&mut self, target: &str) -> io::Result<RawStream> {
        let mut stream = self.connect()?;
        self.send(&mut stream, "GET", target, None, &[])?;
        let (code, _, headers) = read_head(&mut stream)?;
        let chunked = is_chunked(&headers);
        Ok(RawStream {
            code,
            headers,
            stream,
            chunked,
        })
    }
}
