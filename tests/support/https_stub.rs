//! A small HTTPS server on a 127.0.0.1 port of its own, for what a real registry cannot
//! be made to do: a token service's redirect target that records what reaches it, blob
//! storage a registry redirects to, a front that hangs on one repository's path and
//! passes the rest on to the real registry. TLS from the test's CA; every request head
//! is recorded (method, path, headers) for the test to look at. Each connection gets a
//! thread of its own; a held connection is let go, and every thread ends, once the stub
//! is dropped.

#![allow(dead_code)]

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use rustls::pki_types::ServerName;

use crate::pki::Pki;

/// A request as it reached the stub.
#[derive(Debug, Clone)]
pub struct Head {
    pub method: String,
    /// Path and query, as on the request line.
    pub path: String,
    pub headers: Vec<(String, String)>,
}

impl Head {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

/// What the stub does with a request.
pub enum Answer {
    /// This status and body (`Connection: close`).
    Status(u16, String),
    /// `302 Found` to this URL.
    Redirect(String),
    /// The file's bytes, or 404 when there is none.
    File(PathBuf),
    /// Nothing: the connection is held open, unanswered, until the stub is dropped.
    Hang,
    /// Passed on to the upstream (over TLS, trusting the test's CA), its answer back.
    Forward,
}

type Handler = dyn Fn(&Head) -> Answer + Send + Sync;

pub struct Stub {
    pub addr: SocketAddr,
    heads: Arc<Mutex<Vec<Head>>>,
    stop: Arc<AtomicBool>,
}

struct Shared {
    server: Arc<rustls::ServerConfig>,
    client: Arc<rustls::ClientConfig>,
    upstream: Option<SocketAddr>,
    handler: Box<Handler>,
    heads: Arc<Mutex<Vec<Head>>>,
    stop: Arc<AtomicBool>,
}

impl Stub {
    /// Starts a stub named `name` (its certificate's file name) that answers with
    /// `handler`; `upstream` is where [`Answer::Forward`] goes.
    pub fn start(
        pki: &Pki,
        name: &str,
        upstream: Option<SocketAddr>,
        handler: impl Fn(&Head) -> Answer + Send + Sync + 'static,
    ) -> Stub {
        let tls = pki.server(name, &["127.0.0.1"]);
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let server = rustls::ServerConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .expect("versions")
            .with_no_client_auth()
            .with_single_cert(vec![tls.cert_der.clone()], tls.key_der())
            .expect("stub tls");
        let mut roots = rustls::RootCertStore::empty();
        roots.add(pki.ca_der.clone()).expect("test CA");
        let client = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .expect("versions")
            .with_root_certificates(roots)
            .with_no_client_auth();
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind stub");
        let addr = listener.local_addr().expect("addr");
        let heads = Arc::new(Mutex::new(Vec::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let shared = Arc::new(Shared {
            server: Arc::new(server),
            client: Arc::new(client),
            upstream,
            handler: Box::new(handler),
            heads: heads.clone(),
            stop: stop.clone(),
        });
        std::thread::spawn(move || {
            for conn in listener.incoming() {
                if shared.stop.load(Ordering::SeqCst) {
                    return;
                }
                let Ok(tcp) = conn else { continue };
                let shared = shared.clone();
                std::thread::spawn(move || serve(&shared, tcp));
            }
        });
        Stub { addr, heads, stop }
    }

    /// `https://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("https://{}", self.addr)
    }

    /// Every request head so far, in order.
    pub fn heads(&self) -> Vec<Head> {
        self.heads
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }
}

impl Drop for Stub {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        let _ = TcpStream::connect_timeout(&self.addr, Duration::from_secs(1));
    }
}

fn serve(shared: &Shared, tcp: TcpStream) {
    let _ = tcp.set_read_timeout(Some(Duration::from_secs(10)));
    let _ = tcp.set_write_timeout(Some(Duration::from_secs(10)));
    let Ok(tls) = rustls::ServerConnection::new(shared.server.clone()) else {
        return;
    };
    let mut stream = rustls::StreamOwned::new(tls, tcp);
    let Some(head) = read_head(&mut stream) else {
        return;
    };
    shared
        .heads
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .push(head.clone());
    let reply = match (shared.handler)(&head) {
        Answer::Status(status, body) => response(status, "", body.as_bytes(), &head),
        Answer::Redirect(to) => response(302, &format!("Location: {to}\r\n"), b"", &head),
        Answer::File(path) => match std::fs::read(&path) {
            Ok(bytes) => response(200, "", &bytes, &head),
            Err(_) => response(404, "", b"", &head),
        },
        Answer::Hang => {
            while !shared.stop.load(Ordering::SeqCst) {
                std::thread::sleep(Duration::from_millis(50));
            }
            return;
        }
        Answer::Forward => match shared.upstream.and_then(|u| forward(shared, u, &head)) {
            Some(bytes) => bytes,
            None => response(502, "", b"", &head),
        },
    };
    let _ = stream.write_all(&reply);
    let _ = stream.flush();
    stream.conn.send_close_notify();
    let _ = stream.flush();
}

pub(crate) fn response(status: u16, extra: &str, body: &[u8], head: &Head) -> Vec<u8> {
    let mut out = format!(
        "HTTP/1.1 {status} Stub\r\n{extra}Content-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    )
    .into_bytes();
    if head.method != "HEAD" {
        out.extend_from_slice(body);
    }
    out
}

/// The request (without a body: registries are read with GET and HEAD) sent upstream
/// with `Connection: close`, so that the client's next request comes through the stub
/// on a connection of its own; the whole answer back.
fn forward(shared: &Shared, upstream: SocketAddr, head: &Head) -> Option<Vec<u8>> {
    let tcp = TcpStream::connect_timeout(&upstream, Duration::from_secs(5)).ok()?;
    let _ = tcp.set_read_timeout(Some(Duration::from_secs(30)));
    let name = ServerName::IpAddress(upstream.ip().into());
    let conn = rustls::ClientConnection::new(shared.client.clone(), name).ok()?;
    let mut stream = rustls::StreamOwned::new(conn, tcp);
    let mut request = format!("{} {} HTTP/1.1\r\n", head.method, head.path);
    for (k, v) in &head.headers {
        if !k.eq_ignore_ascii_case("connection") {
            request.push_str(&format!("{k}: {v}\r\n"));
        }
    }
    request.push_str("Connection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).ok()?;
    stream.flush().ok()?;
    let mut answer = Vec::new();
    // A peer that closes without close_notify still gave its whole answer.
    let _ = stream.read_to_end(&mut answer);
    (!answer.is_empty()).then_some(answer)
}

pub(crate) fn read_head(stream: &mut impl Read) -> Option<Head> {
    let mut reader = BufReader::new(stream);
    let mut line = String::new();
    reader.read_line(&mut line).ok()?;
    let mut words = line.split_whitespace();
    let method = words.next()?.to_string();
    let path = words.next()?.to_string();
    let mut headers = Vec::new();
    for _ in 0..100 {
        let mut h = String::new();
        if reader.read_line(&mut h).ok()? == 0 || h == "\r\n" {
            break;
        }
        if let Some((k, v)) = h.split_once(':') {
            headers.push((k.trim().to_string(), v.trim().to_string()));
        }
    }
    Some(Head {
        method,
        path,
        headers,
    })
}
