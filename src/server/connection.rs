//! Connections: each listener's accept loop (admission first, see
//! [`super::admission`]), the TLS handshake and the client's certificate, then one
//! hyper HTTP/1.1 connection per client whose requests go to [`super::routes`].

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;

use hyper::body::Incoming;
use hyper::Request;
use hyper_util::rt::TokioIo;
use tokio::net::{TcpListener, TcpStream};

use super::admission::{Admission, Permit};
use super::deps::{ApiDeps, MAX_STREAMS};
use super::error::ServerError;
use super::http::Identity;
use super::routes::{self, Port};
use super::tls::ClientAuth;

/// How many connections one listener holds at once (see [`super::admission`]).
pub const MAX_CONNECTIONS: usize = 256;

/// How many of them may come from one source address (an IPv6 /64).
pub const MAX_CONNECTIONS_PER_SOURCE: usize = 2 * MAX_STREAMS;

/// How long a client may take over its TLS handshake.
pub const HANDSHAKE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// How long a client may take to send a request's headers, the first or the next one
/// on a kept-alive connection (slow senders and idle connections are closed).
pub const HEADER_READ_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(30);

/// The most a connection buffers of what the client sends: a request's headers, or a
/// slice of its body.
const MAX_HEADER_BYTES: usize = 32 * 1024;

/// Accepts connections on `addr` in a task of its own, retrying the bind with back-off
/// while the port is taken.
pub fn spawn_listener(
    addr: SocketAddr,
    port: Port,
    deps: ApiDeps,
    tls: Option<(tokio_rustls::TlsAcceptor, Arc<ClientAuth>)>,
) {
    tokio::spawn(async move {
        let mut delay = std::time::Duration::from_secs(1);
        let listener = loop {
            match TcpListener::bind(addr).await {
                Ok(l) => break l,
                Err(source) => {
                    let e = ServerError::Listen { addr, source };
                    log::error!("kubelet API: {e}; trying again in {delay:?}");
                    tokio::time::sleep(delay).await;
                    delay = (delay * 2).min(std::time::Duration::from_secs(60));
                }
            }
        };
        log::info!("kubelet API ({port:?}) listening on {addr}");
        let deps = Arc::new(deps);
        let admission = Admission::new(MAX_CONNECTIONS, MAX_CONNECTIONS_PER_SOURCE);
        loop {
            let (stream, peer) = match listener.accept().await {
                Ok(s) => s,
                Err(e) => {
                    // EMFILE and the like: pause rather than spin.
                    log::warn!("kubelet API: accept on {addr}: {e}");
                    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
                    continue;
                }
            };
            let permit = match admission.admit(peer.ip()) {
                Ok(p) => p,
                Err(why) => {
                    // Dropped unread: closed before anything is allocated for it.
                    log::debug!("kubelet API ({port:?}): refused {peer}: {why:?} cap reached");
                    drop(stream);
                    continue;
                }
            };
            let _ = stream.set_nodelay(true);
            let deps = deps.clone();
            let tls = tls.clone();
            tokio::spawn(serve_admitted(stream, peer, port, deps, tls, permit));
        }
    });
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
