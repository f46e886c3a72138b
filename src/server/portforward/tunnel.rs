//! One forwarded connection, whichever protocol carries it: the TCP connection to the
//! pod's port (in its network namespace, see [`super::netns`]), the bytes both ways,
//! and where its output and errors go ([`Downlink`]). The protocol sessions
//! ([`super::spdy`], [`super::websocket`]) call [`forward`] for each connection.

use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::mpsc;

use super::netns;
use crate::runtime::{ContainerId, ContainerState, Runtime};
use crate::server::deps::ApiDeps;
use crate::server::websocket::channel_frame;

/// Connections forwarded at once in one session (SPDY), or ports asked for in one
/// WebSocket request; more are refused on their error stream (or with 400).
pub const MAX_CONNECTIONS: usize = 16;
/// Chunks of client data queued for one connection while the pod reads slowly.
pub const INPUT_QUEUE: usize = 4;
/// Reads from the pod, and so data frames to the client, are at most this size.
const CHUNK: usize = 32 * 1024;
/// How long a connection to the pod may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// Once the pod has closed its side, how long what the client still sends may take to
/// reach it (containerd waits as long).
const LINGER: Duration = Duration::from_secs(1);

/// Where the pod's ports are.
#[derive(Debug, Clone)]
pub struct Target {
    /// `<name>_<namespace>`, as the kubelet names the pod in its errors.
    pub pod: String,
    pub uid: String,
    pub host_network: bool,
    /// The pod's containers, current instances: any running one's init is in the
    /// pod's network namespace.
    pub containers: Vec<ContainerId>,
}

pub fn parse_port(p: &str) -> Result<u16, String> {
    let n: u16 = p
        .parse()
        .map_err(|_| format!("unable to parse {p:?} as a port"))?;
    if n == 0 {
        return Err(format!("port {p:?} must be > 0"));
    }
    Ok(n)
}

/// Connects to `port` in the target's network namespace.
async fn connect(deps: &ApiDeps, target: &Target, port: u16) -> Result<TcpStream, String> {
    if target.host_network {
        return connect_here(port).await;
    }
    let rt = deps.runtime.clone();
    let ids = target.containers.clone();
    let pid = tokio::task::spawn_blocking(move || {
        ids.iter().find_map(|id| match rt.state(id) {
            Ok(ContainerState::Running { pid, .. }) => Some(pid),
            _ => None,
        })
    })
    .await
    .map_err(|e| e.to_string())?
    .ok_or("the pod has no running container")?;
    let std_stream = netns::connect(pid, port, CONNECT_TIMEOUT).await?;
    std_stream
        .set_nonblocking(true)
        .map_err(|e| format!("socket: {e}"))?;
    TcpStream::from_std(std_stream).map_err(|e| format!("socket: {e}"))
}

/// `localhost:<port>` in the agent's own network namespace (the host's).
async fn connect_here(port: u16) -> Result<TcpStream, String> {
    let mut last = String::new();
    for addr in [
        std::net::SocketAddr::from(([127, 0, 0, 1], port)),
        std::net::SocketAddr::from((std::net::Ipv6Addr::LOCALHOST, port)),
    ] {
        match tokio::time::timeout(CONNECT_TIMEOUT, TcpStream::connect(addr)).await {
            Ok(Ok(s)) => return Ok(s),
            Ok(Err(e)) => last = format!("dial tcp {addr}: connect: {e}"),
            Err(_) => last = format!("dial tcp {addr}: i/o timeout"),
        }
    }
    Err(last)
}

/// What the SPDY session's writer sends.
#[derive(Debug)]
pub enum Out {
    /// SYN_REPLY to a stream (its header block takes the writer's compressor).
    Reply(u32),
    /// A DATA frame: stream, payload, FIN.
    Data(u32, Vec<u8>, bool),
    /// Any other whole frame.
    Raw(Vec<u8>),
}

/// Where a forwarded connection's output goes: the protocol side's writer.
pub enum Downlink {
    /// SPDY: data and error are streams of the session.
    Spdy {
        tx: mpsc::Sender<Out>,
        data: u32,
        error: u32,
    },
    /// WebSocket: data on channel `2i`, errors on `2i + 1`.
    Ws {
        tx: mpsc::Sender<Vec<u8>>,
        channel: u8,
    },
}

impl Downlink {
    pub async fn data(&self, d: &[u8]) -> bool {
        match self {
            Downlink::Spdy { tx, data, .. } => {
                tx.send(Out::Data(*data, d.to_vec(), false)).await.is_ok()
            }
            Downlink::Ws { tx, channel } => tx.send(channel_frame(*channel, d)).await.is_ok(),
        }
    }

    pub async fn error(&self, message: &str) {
        match self {
            Downlink::Spdy { tx, error, .. } => {
                let _ = tx
                    .send(Out::Data(*error, message.as_bytes().to_vec(), false))
                    .await;
            }
            Downlink::Ws { tx, channel } => {
                let _ = tx
                    .send(channel_frame(channel.saturating_add(1), message.as_bytes()))
                    .await;
            }
        }
    }

    /// The end of the connection: SPDY closes both streams (kubectl waits for both);
    /// the WebSocket channel protocol has no per-channel end.
    pub async fn close(&self) {
        if let Downlink::Spdy { tx, data, error } = self {
            let _ = tx.send(Out::Data(*data, Vec::new(), true)).await;
            let _ = tx.send(Out::Data(*error, Vec::new(), true)).await;
        }
    }
}

/// One forwarded connection, from connect to close: `input` is what the client sends
/// (closed at the client's end of data), `down` where the pod's answer goes.
pub async fn forward(
    deps: Arc<ApiDeps>,
    target: Target,
    port: u16,
    mut input: mpsc::Receiver<Vec<u8>>,
    down: Downlink,
) {
    let failed = |e: String| {
        format!(
            "error forwarding port {port} to pod {}, uid {}: {e}",
            target.pod, target.uid
        )
    };
    let tcp = match connect(&deps, &target, port).await {
        Ok(t) => t,
        Err(e) => {
            down.error(&failed(e)).await;
            down.close().await;
            return;
        }
    };
    let (mut from, mut to) = tcp.into_split();
    let to_pod = async {
        while let Some(d) = input.recv().await {
            if to.write_all(&d).await.is_err() {
                break;
            }
        }
        // The client's end of data: the pod reads its end of input.
        let _ = to.shutdown().await;
    };
    let from_pod = async {
        let mut buf = vec![0u8; CHUNK];
        loop {
            match from.read(&mut buf).await {
                Ok(0) => return None,
                Ok(n) => {
                    if !down.data(&buf[..n]).await {
                        return None;
                    }
                }
                Err(e) => return Some(e.to_string()),
            }
        }
    };
    let mut to_pod = std::pin::pin!(to_pod);
    let mut from_pod = std::pin::pin!(from_pod);
    // The client half-closing does not end the answer; the pod closing ends it at
    // once (kubectl closes its local connection only once both streams have ended),
    // and what the client still sends has a moment more to reach the pod.
    tokio::select! {
        e = &mut from_pod => {
            if let Some(e) = e {
                down.error(&failed(e)).await;
            }
            down.close().await;
            let _ = tokio::time::timeout(LINGER, &mut to_pod).await;
        }
        () = &mut to_pod => {
            if let Some(e) = from_pod.await {
                down.error(&failed(e)).await;
            }
            down.close().await;
        }
    }
}
