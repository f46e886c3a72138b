//! The async dial through the proxy, for the konnectivity tunnel: TCP to the proxy and
//! the CONNECT exchange, or TCP straight to the destination when no proxy applies. What
//! comes back is a TCP stream to the destination, ready for TLS.

use std::io;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use super::{handshake, ProxyError, Route};

/// What went wrong on the way to the destination.
#[derive(Debug, thiserror::Error)]
pub enum DialError {
    #[error("connect to {addr}: {source}")]
    Io {
        addr: String,
        #[source]
        source: io::Error,
    },
    #[error(transparent)]
    Proxy(#[from] ProxyError),
}

/// A TCP stream to `host:port` of an `https://` destination, through the proxy
/// `route` picks for it, if any.
pub async fn connect(route: &Route, host: &str, port: u16) -> Result<TcpStream, DialError> {
    let target = super::authority(host, port);
    let Some(proxy) = route.proxy_for(true, host, port) else {
        return TcpStream::connect(&target)
            .await
            .map_err(|source| DialError::Io {
                addr: target,
                source,
            });
    };
    let io_err = |source| DialError::Io {
        addr: format!("proxy {proxy}"),
        source,
    };
    let mut tcp = TcpStream::connect(proxy.authority())
        .await
        .map_err(io_err)?;
    tcp.write_all(&handshake::request(&proxy, &target))
        .await
        .map_err(io_err)?;
    // A byte at a time: the destination speaks only after our TLS hello, but nothing of
    // its must be read into a buffer that would be dropped with this function.
    let mut head = Vec::with_capacity(256);
    loop {
        if handshake::answer(&proxy, &target, &head)?.is_some() {
            return Ok(tcp);
        }
        let mut byte = [0u8; 1];
        if tcp.read(&mut byte).await.map_err(io_err)? == 0 {
            return Err(handshake::closed(&proxy, &target).into());
        }
        head.push(byte[0]);
    }
}
