//! probe::http: the httpGet action. One GET over HTTP/1.1 per hop, HTTPS without
//! certificate verification (the kubelet's prober sets InsecureSkipVerify), redirects
//! to the same host followed, and the status judged as the kubelet judges it. Reads at
//! most 10 KiB of a body and 64 KiB of response headers.

mod url;

use std::io::{self, BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use rustls::pki_types::ServerName;
use rustls::{ClientConfig, ClientConnection, StreamOwned};

use super::net::{deadline, dial, is_timeout, set_deadline, words, DialError, Outcome};
use url::{has_scheme, Url};

/// The kubelet's `kube-probe/<major>.<minor>`, of the release whose prober this follows.
const USER_AGENT: &str = "kube-probe/1.34";
/// The kubelet reads no more of a body than this (`maxRespBodyLength`).
const MAX_BODY: usize = 10 * 1024;
/// Status line and headers of one response, together.
const MAX_HEAD: usize = 64 * 1024;
/// One chunk-size line of a chunked body.
const MAX_CHUNK_LINE: usize = 4 * 1024;
/// Go's client sends at most ten requests for one GET: the first and nine redirects.
const MAX_REQUESTS: usize = 10;
/// Interim (1xx) responses skipped before the real one, as Go's client allows.
const MAX_INTERIM: usize = 5;

/// An httpGet action, resolved: the caller has put the pod IP in for an empty host and
/// a number in for a named port.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HttpGet {
    pub https: bool,
    pub host: String,
    pub port: u16,
    /// Path and query as the pod spec gives them; `/` when empty.
    pub path: String,
    /// The spec's httpHeaders, in order; a `Host` entry replaces the Host header.
    pub headers: Vec<(String, String)>,
}

/// Why one GET gave no response to judge, in the words of Go's client.
#[derive(Debug, thiserror::Error)]
enum HttpError {
    #[error(transparent)]
    Dial(#[from] DialError),
    #[error("tls setup: {0}")]
    TlsSetup(String),
    #[error("net/http: TLS handshake timeout")]
    TlsTimeout,
    #[error("tls: {0}")]
    Tls(String),
    #[error("net/http: invalid header field name {0:?}")]
    HeaderName(String),
    #[error("net/http: invalid header field value for {0:?}")]
    HeaderValue(String),
    #[error("context deadline exceeded (Client.Timeout exceeded while awaiting headers)")]
    HeadTimeout,
    #[error("net/http: server response headers exceeded {MAX_HEAD} bytes; aborted")]
    HeadTooLarge,
    #[error("malformed HTTP response {0:?}")]
    Malformed(String),
    #[error("too many 1xx informational responses")]
    TooManyInterim,
    #[error("stopped after {MAX_REQUESTS} redirects")]
    TooManyRedirects,
    #[error("unsupported protocol scheme {0:?}")]
    Scheme(String),
    #[error("failed to parse Location header {location:?}: {reason}")]
    Location { location: String, reason: String },
    #[error(
        "context deadline exceeded (Client.Timeout or context cancellation while reading body)"
    )]
    BodyTimeout,
    #[error("{0}")]
    Io(String),
}

/// The httpGet action: statuses 200 to 399 pass; a redirect to another host passes with
/// a warning; anything else, or no response, fails.
pub fn http_get(req: &HttpGet, timeout: Duration) -> Outcome {
    let deadline = deadline(timeout);
    let first = Url::first(req);
    let custom_host = req
        .headers
        .iter()
        .find(|(name, _)| name.eq_ignore_ascii_case("host"))
        .map(|(_, value)| value.as_str())
        .filter(|value| !value.is_empty());
    let mut url = first.clone();
    let mut host = custom_host.unwrap_or(&first.authority).to_string();
    let mut sent = 0;
    loop {
        sent += 1;
        let (head, mut reader) = match exchange(&url, &host, &req.headers, deadline) {
            Ok(r) => r,
            Err(e) => return Outcome::Failure(format!("Get {:?}: {e}", url.to_string())),
        };
        let location = head
            .location
            .as_deref()
            .filter(|_| is_redirect(head.status));
        if let Some(location) = location {
            let next = match url.resolve(location) {
                Ok(next) => next,
                Err(e) => return Outcome::Failure(format!("Get {:?}: {e}", url.to_string())),
            };
            // Go's client with the kubelet's redirect check: another host ends the chain
            // at this response; the same host is followed whatever the port or scheme.
            if next.host.eq_ignore_ascii_case(&first.host) {
                if sent >= MAX_REQUESTS {
                    return Outcome::Failure(format!(
                        "Get {:?}: {}",
                        next.to_string(),
                        HttpError::TooManyRedirects
                    ));
                }
                // Go keeps a Host the caller set only through a redirect that names no
                // scheme (its issue 22233).
                host = match custom_host {
                    Some(custom) if !has_scheme(location) => custom.to_string(),
                    _ => next.authority.clone(),
                };
                url = next;
                continue;
            }
        }
        let body = match read_body(&mut reader, &head) {
            Ok(body) => body,
            // The kubelet's prober reports a failed body read as the error alone.
            Err(e) => return Outcome::Failure(e.to_string()),
        };
        return judge(head.status, &body);
    }
}

/// The kubelet's verdict on the last response.
fn judge(status: u16, body: &[u8]) -> Outcome {
    match status {
        200..=299 => Outcome::Success,
        300..=399 => Outcome::Warning(format!(
            "Probe terminated redirects, Response body: {}",
            String::from_utf8_lossy(body)
        )),
        _ => Outcome::Failure(format!("HTTP probe failed with statuscode: {status}")),
    }
}

fn is_redirect(status: u16) -> bool {
    matches!(status, 301 | 302 | 303 | 307 | 308)
}

/// Go's canonical form of a header name (`x-custom` is sent as `X-Custom`), as the
/// kubelet's `http.Header.Add` makes it.
fn canonical_name(name: &str) -> String {
    let mut upper = true;
    name.chars()
        .map(|c| {
            let out = if upper {
                c.to_ascii_uppercase()
            } else {
                c.to_ascii_lowercase()
            };
            upper = c == '-';
            out
        })
        .collect()
}

/// An HTTP token (RFC 9110): what a header name may be.
fn is_token(name: &str) -> bool {
    !name.is_empty()
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b))
}

/// No control characters but tab: a value that cannot end its header line early.
fn is_field_value(value: &str) -> bool {
    value
        .bytes()
        .all(|b| b == b'\t' || (b >= 0x20 && b != 0x7f))
}

/// The request for `url`: Host, User-Agent and Accept as the kubelet sets them (each
/// replaced by the spec's own), `Connection: close` (the kubelet keeps no connection
/// alive), then the spec's headers.
fn request(url: &Url, host: &str, headers: &[(String, String)]) -> Result<Vec<u8>, HttpError> {
    if !is_field_value(host) {
        return Err(HttpError::HeaderValue("Host".to_string()));
    }
    let mut out = format!("GET {} HTTP/1.1\r\nHost: {host}\r\n", url.target);
    let named = |wanted: &str| {
        headers
            .iter()
            .find(|(name, _)| name.eq_ignore_ascii_case(wanted))
            .map(|(_, value)| value.as_str())
    };
    // Go writes the first User-Agent only, and none when it is empty.
    let agent = named("user-agent").unwrap_or(USER_AGENT);
    if !agent.is_empty() {
        out.push_str(&format!("User-Agent: {agent}\r\n"));
    }
    // An Accept the spec sets empty removes it (the kubelet's newProbeRequest).
    let accept = named("accept");
    if accept.is_none() {
        out.push_str("Accept: */*\r\n");
    }
    out.push_str("Connection: close\r\n");
    for (name, value) in headers {
        if !is_token(name) {
            return Err(HttpError::HeaderName(name.clone()));
        }
        let name = canonical_name(name);
        if !is_field_value(value) {
            return Err(HttpError::HeaderValue(name));
        }
        match name.as_str() {
            // Written above, or framing that this client owns.
            "Host" | "User-Agent" | "Connection" | "Content-Length" | "Transfer-Encoding"
            | "Trailer" => continue,
            "Accept" if accept == Some("") => continue,
            _ => out.push_str(&format!("{name}: {value}\r\n")),
        }
    }
    out.push_str("\r\n");
    Ok(out.into_bytes())
}

/// The status and what the body needs of a response's headers.
#[derive(Debug)]
struct Head {
    status: u16,
    location: Option<String>,
    framing: Framing,
}

#[derive(Debug, PartialEq, Eq)]
enum Framing {
    None,
    Chunked,
    Length(u64),
    UntilClose,
}

/// Sends one GET and reads the response up to its body.
fn exchange(
    url: &Url,
    host: &str,
    headers: &[(String, String)],
    deadline: Instant,
) -> Result<(Head, BufReader<Conn>), HttpError> {
    let tls = match url.scheme.as_str() {
        "http" => false,
        "https" => true,
        other => return Err(HttpError::Scheme(other.to_string())),
    };
    let request = request(url, host, headers)?;
    let tcp = dial(&url.host, url.port, deadline)?;
    // One small write and then a read: Nagle would only add a delay.
    let _ = tcp.set_nodelay(true);
    let stream = if tls {
        Stream::Tls(Box::new(handshake(tcp, &url.host, deadline)?))
    } else {
        Stream::Plain(tcp)
    };
    let mut conn = Conn { stream, deadline };
    conn.write_all(&request)
        .and_then(|()| conn.flush())
        .map_err(head_error)?;
    let mut reader = BufReader::new(conn);
    let mut used = 0;
    for _ in 0..=MAX_INTERIM {
        let head = read_head(&mut reader, &mut used)?;
        // Interim responses (100 Continue, 103 Early Hints) precede the real one.
        if !(100..200).contains(&head.status) || head.status == 101 {
            return Ok((head, reader));
        }
    }
    Err(HttpError::TooManyInterim)
}

/// A TLS session with `host`, its certificate unchecked. SNI names a DNS host and none
/// for an IP literal (rustls sends none for an IP address).
fn handshake(
    mut tcp: TcpStream,
    host: &str,
    deadline: Instant,
) -> Result<StreamOwned<ClientConnection, TcpStream>, HttpError> {
    let name = ServerName::try_from(host.to_string())
        .map_err(|e| HttpError::Tls(format!("{host:?} is not a valid server name: {e}")))?;
    let mut conn = ClientConnection::new(tls_config()?, name)
        .map_err(|e| HttpError::TlsSetup(e.to_string()))?;
    while conn.is_handshaking() {
        set_deadline(&tcp, deadline).map_err(|_| HttpError::TlsTimeout)?;
        conn.complete_io(&mut tcp).map_err(|e| {
            if is_timeout(&e) {
                HttpError::TlsTimeout
            } else if e.kind() == io::ErrorKind::UnexpectedEof {
                HttpError::Tls("handshake: EOF".to_string())
            } else {
                HttpError::Tls(words(&e))
            }
        })?;
    }
    Ok(StreamOwned::new(conn, tcp))
}

/// One client config for every HTTPS probe: ring, TLS 1.2 and 1.3, any certificate.
fn tls_config() -> Result<Arc<ClientConfig>, HttpError> {
    static CONFIG: OnceLock<Result<Arc<ClientConfig>, String>> = OnceLock::new();
    CONFIG
        .get_or_init(|| {
            let provider = crate::tls::provider();
            let config = ClientConfig::builder_with_provider(provider.clone())
                .with_safe_default_protocol_versions()
                .map_err(|e| e.to_string())?
                .dangerous()
                .with_custom_certificate_verifier(Arc::new(crate::tls::AnyServerCertificate(
                    provider,
                )))
                .with_no_client_auth();
            Ok(Arc::new(config))
        })
        .clone()
        .map_err(HttpError::TlsSetup)
}

enum Stream {
    Plain(TcpStream),
    Tls(Box<StreamOwned<ClientConnection, TcpStream>>),
}

/// A connection whose every read and write ends by the probe's deadline.
struct Conn {
    stream: Stream,
    deadline: Instant,
}

impl Conn {
    fn tcp(&self) -> &TcpStream {
        match &self.stream {
            Stream::Plain(s) => s,
            Stream::Tls(s) => &s.sock,
        }
    }
}

impl Read for Conn {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        set_deadline(self.tcp(), self.deadline)?;
        match &mut self.stream {
            Stream::Plain(s) => s.read(buf),
            // Many servers close without close_notify; the framing tells a short body.
            Stream::Tls(s) => match s.read(buf) {
                Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => Ok(0),
                r => r,
            },
        }
    }
}

impl Write for Conn {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        set_deadline(self.tcp(), self.deadline)?;
        match &mut self.stream {
            Stream::Plain(s) => s.write(buf),
            Stream::Tls(s) => s.write(buf),
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        set_deadline(self.tcp(), self.deadline)?;
        match &mut self.stream {
            Stream::Plain(s) => s.flush(),
            Stream::Tls(s) => s.flush(),
        }
    }
}

fn head_error(e: io::Error) -> HttpError {
    if is_timeout(&e) {
        HttpError::HeadTimeout
    } else if e.kind() == io::ErrorKind::UnexpectedEof {
        HttpError::Io("EOF".to_string())
    } else {
        HttpError::Io(words(&e))
    }
}

/// One line, without its CR LF; `None` at the end of the stream. `Ok(Err(()))` when the
/// line is longer than `max`.
fn read_line(r: &mut impl BufRead, max: usize) -> io::Result<Option<Result<Vec<u8>, ()>>> {
    let mut line = Vec::new();
    let n = r.by_ref().take(max as u64).read_until(b'\n', &mut line)?;
    if n == 0 {
        return Ok(None);
    }
    if line.last() != Some(&b'\n') {
        if n >= max {
            return Ok(Some(Err(())));
        }
        return Err(io::Error::from(io::ErrorKind::UnexpectedEof));
    }
    line.pop();
    if line.last() == Some(&b'\r') {
        line.pop();
    }
    Ok(Some(Ok(line)))
}

/// The status line and headers of one response; `used` counts head bytes across interim
/// responses.
fn read_head(r: &mut BufReader<Conn>, used: &mut usize) -> Result<Head, HttpError> {
    let mut next_line = |used: &mut usize| -> Result<Vec<u8>, HttpError> {
        let left = MAX_HEAD.saturating_sub(*used);
        if left == 0 {
            return Err(HttpError::HeadTooLarge);
        }
        match read_line(r, left).map_err(head_error)? {
            None => Err(HttpError::Io(
                if *used == 0 { "EOF" } else { "unexpected EOF" }.to_string(),
            )),
            Some(Err(())) => Err(HttpError::HeadTooLarge),
            Some(Ok(line)) => {
                *used += line.len() + 2;
                Ok(line)
            }
        }
    };
    let status_line = next_line(used)?;
    let status_text = String::from_utf8_lossy(&status_line).into_owned();
    let status = parse_status(&status_text).ok_or(HttpError::Malformed(status_text))?;
    let mut location = None;
    let mut length = None;
    let mut chunked = false;
    loop {
        let line = next_line(used)?;
        if line.is_empty() {
            break;
        }
        let line = String::from_utf8_lossy(&line);
        // Lines without a colon (and obsolete folding) carry nothing this needs.
        let Some((name, value)) = line.split_once(':') else {
            continue;
        };
        let value = value.trim();
        match name.trim().to_ascii_lowercase().as_str() {
            "location" if location.is_none() => location = Some(value.to_string()),
            "content-length" if length.is_none() => {
                length =
                    Some(value.parse::<u64>().map_err(|_| {
                        HttpError::Malformed(format!("bad Content-Length {value:?}"))
                    })?);
            }
            "transfer-encoding" => {
                chunked = value
                    .rsplit(',')
                    .next()
                    .is_some_and(|coding| coding.trim().eq_ignore_ascii_case("chunked"));
            }
            _ => {}
        }
    }
    let framing = if matches!(status, 100..=199 | 204 | 304) {
        Framing::None
    } else if chunked {
        Framing::Chunked
    } else if let Some(n) = length {
        Framing::Length(n)
    } else {
        Framing::UntilClose
    };
    Ok(Head {
        status,
        location: location.filter(|l| !l.is_empty()),
        framing,
    })
}

/// `HTTP/1.1 200 OK` → 200.
fn parse_status(line: &str) -> Option<u16> {
    let mut parts = line.splitn(3, ' ');
    let version = parts.next()?;
    let code = parts.next()?;
    if !version.starts_with("HTTP/") || code.len() != 3 || !code.bytes().all(|b| b.is_ascii_digit())
    {
        return None;
    }
    code.parse().ok()
}

/// Up to `MAX_BODY` bytes of the body; what follows is never read.
fn read_body(r: &mut BufReader<Conn>, head: &Head) -> Result<Vec<u8>, HttpError> {
    let mut body = Vec::new();
    let result = match head.framing {
        Framing::None => Ok(()),
        Framing::Length(n) => {
            let want = n.min(MAX_BODY as u64);
            r.by_ref()
                .take(want)
                .read_to_end(&mut body)
                .and_then(|got| {
                    if (got as u64) < want {
                        Err(io::Error::from(io::ErrorKind::UnexpectedEof))
                    } else {
                        Ok(())
                    }
                })
        }
        Framing::UntilClose => r
            .by_ref()
            .take(MAX_BODY as u64)
            .read_to_end(&mut body)
            .map(|_| ()),
        Framing::Chunked => read_chunked(r, &mut body),
    };
    result.map_err(|e| {
        if is_timeout(&e) {
            HttpError::BodyTimeout
        } else if e.kind() == io::ErrorKind::UnexpectedEof {
            HttpError::Io("unexpected EOF".to_string())
        } else {
            HttpError::Io(words(&e))
        }
    })?;
    Ok(body)
}

/// A chunked body into `body`, stopping at `MAX_BODY`.
fn read_chunked(r: &mut impl BufRead, body: &mut Vec<u8>) -> io::Result<()> {
    let malformed = || io::Error::new(io::ErrorKind::InvalidData, "malformed chunked encoding");
    loop {
        let line = match read_line(r, MAX_CHUNK_LINE)? {
            None => return Err(io::Error::from(io::ErrorKind::UnexpectedEof)),
            Some(Err(())) => return Err(malformed()),
            Some(Ok(line)) => line,
        };
        // Chunk extensions (`;name=value`) mean nothing here.
        let size = line.split(|&b| b == b';').next().unwrap_or_default();
        let size = std::str::from_utf8(size).map_err(|_| malformed())?.trim();
        if size.is_empty() || !size.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(malformed());
        }
        let size = u64::from_str_radix(size, 16).map_err(|_| malformed())?;
        if size == 0 {
            return Ok(());
        }
        let want = size.min((MAX_BODY - body.len()) as u64);
        let got = r.by_ref().take(want).read_to_end(body)?;
        if (got as u64) < want {
            return Err(io::Error::from(io::ErrorKind::UnexpectedEof));
        }
        if body.len() >= MAX_BODY {
            return Ok(());
        }
        match read_line(r, MAX_CHUNK_LINE)? {
            Some(Ok(end)) if end.is_empty() => {}
            None => return Err(io::Error::from(io::ErrorKind::UnexpectedEof)),
            _ => return Err(malformed()),
        }
    }
}

#[cfg(test)]
#[path = "http_tests.rs"]
mod tests;
