//! HTTP plumbing: one hyper HTTP/1.1 connection per client (TLS or plain), the
//! response body (whole, or streamed from a bounded channel), and the kubelet's error
//! responses.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body::Frame;
use hyper::body::Incoming;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;
use tokio::sync::mpsc;

use super::admission::Permit;
use super::deps::ApiDeps;
use super::tls::ClientAuth;
use super::{routes, Port, HANDSHAKE_TIMEOUT, HEADER_READ_TIMEOUT};

/// The most a connection buffers of what the client sends: a request's headers, or a
/// slice of its body.
const MAX_HEADER_BYTES: usize = 32 * 1024;

/// Who is calling, as authentication found it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Identity {
    /// A certificate that chains to the client CA, and the user it names.
    Client(Arc<super::auth::User>),
    /// No valid certificate (or a plain-HTTP port); on the TLS port, why not.
    Anonymous(Option<Arc<str>>),
}

/// A response body: whole, or chunks from a producer (a log reader) through a bounded
/// channel, so that a client that reads slowly holds the producer back instead of
/// growing a buffer.
pub enum Body {
    Full(Option<Bytes>),
    Stream(mpsc::Receiver<Bytes>),
}

impl http_body::Body for Body {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        match self.get_mut() {
            Body::Full(b) => Poll::Ready(b.take().map(|b| Ok(Frame::data(b)))),
            Body::Stream(rx) => rx.poll_recv(cx).map(|o| o.map(|b| Ok(Frame::data(b)))),
        }
    }

    fn is_end_stream(&self) -> bool {
        matches!(self, Body::Full(None))
    }

    fn size_hint(&self) -> http_body::SizeHint {
        match self {
            Body::Full(Some(b)) => http_body::SizeHint::with_exact(b.len() as u64),
            Body::Full(None) => http_body::SizeHint::with_exact(0),
            Body::Stream(_) => http_body::SizeHint::default(),
        }
    }
}

pub type Resp = Response<Body>;

/// A whole response.
pub fn respond(status: StatusCode, content_type: &str, body: impl Into<Bytes>) -> Resp {
    let mut r = Response::new(Body::Full(Some(body.into())));
    *r.status_mut() = status;
    if let Ok(v) = hyper::header::HeaderValue::from_str(content_type) {
        r.headers_mut().insert(hyper::header::CONTENT_TYPE, v);
    }
    r
}

pub fn json(value: &impl serde::Serialize) -> Resp {
    match serde_json::to_vec(value) {
        Ok(b) => respond(StatusCode::OK, "application/json", b),
        Err(e) => error(StatusCode::INTERNAL_SERVER_ERROR, &format!("encode: {e}")),
    }
}

/// An error as the kubelet writes it (go-restful's `WriteError`): the message as
/// plain text.
pub fn error(status: StatusCode, message: &str) -> Resp {
    respond(status, "text/plain; charset=utf-8", format!("{message}\n"))
}

/// Serves one client connection until it closes.
pub async fn serve_connection(
    stream: TcpStream,
    peer: SocketAddr,
    port: Port,
    deps: Arc<ApiDeps>,
    tls: Option<(tokio_rustls::TlsAcceptor, Arc<ClientAuth>)>,
) {
    serve_stream(stream, peer, port, deps, tls, None).await;
}

/// Serves one admitted connection until it closes or, not having proved a client
/// certificate, gives its place up to a newer one.
pub async fn serve_admitted(
    stream: TcpStream,
    peer: SocketAddr,
    port: Port,
    deps: Arc<ApiDeps>,
    tls: Option<(tokio_rustls::TlsAcceptor, Arc<ClientAuth>)>,
    permit: Permit,
) {
    tokio::select! {
        () = serve_stream(stream, peer, port, deps, tls, Some(&permit)) => {}
        () = permit.evicted() => {
            log::debug!("kubelet API: closed {peer} to make room for a newer connection");
        }
    }
}

async fn serve_stream(
    stream: TcpStream,
    peer: SocketAddr,
    port: Port,
    deps: Arc<ApiDeps>,
    tls: Option<(tokio_rustls::TlsAcceptor, Arc<ClientAuth>)>,
    permit: Option<&Permit>,
) {
    match tls {
        Some((acceptor, clients)) => {
            // A client that never finishes its handshake must not hold a task forever.
            let accepted = tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(stream)).await;
            let tls_stream = match accepted {
                Ok(Ok(s)) => s,
                Ok(Err(e)) => {
                    log::debug!("kubelet API: TLS handshake with {peer}: {e}");
                    return;
                }
                Err(_) => {
                    log::debug!("kubelet API: TLS handshake with {peer} timed out");
                    return;
                }
            };
            let identity = match clients.identify(tls_stream.get_ref().1.peer_certificates()) {
                Ok(user) => {
                    if let Some(p) = permit {
                        p.proven();
                    }
                    crate::metrics::KUBELET_API_CONNECTIONS_BY_USER.inc(&user.name);
                    Identity::Client(Arc::new(user))
                }
                Err(why) => Identity::Anonymous(Some(why.into())),
            };
            serve(TokioIo::new(tls_stream), peer, port, deps, identity).await;
        }
        None => {
            serve(
                TokioIo::new(stream),
                peer,
                port,
                deps,
                Identity::Anonymous(None),
            )
            .await
        }
    }
}

async fn serve<I>(io: I, peer: SocketAddr, port: Port, deps: Arc<ApiDeps>, identity: Identity)
where
    I: hyper::rt::Read + hyper::rt::Write + Unpin + Send + 'static,
{
    let service = hyper::service::service_fn(move |req: Request<Incoming>| {
        let deps = deps.clone();
        let identity = identity.clone();
        async move {
            crate::metrics::KUBELET_API_REQUESTS.inc();
            Ok::<_, Infallible>(routes::handle(req, port, identity, deps).await)
        }
    });
    let conn = hyper::server::conn::http1::Builder::new()
        .timer(hyper_util::rt::TokioTimer::new())
        .header_read_timeout(HEADER_READ_TIMEOUT)
        // A request's headers (the kubelet's clients send a few hundred bytes), so that
        // a connection trickling a huge header holds little while it is read.
        .max_buf_size(MAX_HEADER_BYTES)
        .serve_connection(io, service)
        .with_upgrades();
    if let Err(e) = conn.await {
        log::debug!("kubelet API: connection from {peer}: {e}");
    }
}
