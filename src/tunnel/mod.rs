//! tunnel: the konnectivity agent. Gateways sit behind NAT, where the apiserver cannot
//! open a connection to the kubelet API; with the apiserver's egress selector sending
//! node traffic to konnectivity proxy servers, the node dials out to each server and the
//! server's connections to this node's kubelet API come back inside that stream. It
//! dials nothing but the kubelet API (see `splice`).
//!
//! One gRPC stream per proxy server (`serverid`), as many as the server says there are
//! (`servercount`) behind one address; each stream lost is dialled again at a random
//! phase (full jitter), soon after the link is back. The node's client certificate is
//! read from its files at every dial, so a rotated one is used by the next stream; or a
//! ServiceAccount token from the TokenRequest API (see `token`). Starts nothing else.

mod dial;
mod frames;
mod packet;
mod splice;
mod stream;
mod token;

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{mpsc, watch};

use crate::backoff::{self, Backoff};
use crate::config::{Config, TunnelConfig};
use crate::metrics;
pub use packet::{Packet, PacketError};
pub use splice::Policy;
pub use token::ClusterLink;

/// Streams lost are dialled again after 1 s doubling to 10 s, full jitter.
const RECONNECT: Backoff = Backoff {
    initial: Duration::from_secs(1),
    max: Duration::from_secs(10),
};
/// Between dials that found a server already held, while fewer than `servercount` are.
const SYNC: Duration = Duration::from_secs(2);
/// How long a stopping agent waits for its streams to have said DRAIN.
const DRAIN_WAIT: Duration = Duration::from_secs(2);

/// Why a stream could not be opened or ended.
#[derive(Debug, thiserror::Error)]
pub enum TunnelError {
    #[error("proxy server {addr}: {source}")]
    Io {
        addr: String,
        #[source]
        source: std::io::Error,
    },
    #[error("proxy server {addr}: connect timed out after {after:?}")]
    Timeout { addr: String, after: Duration },
    #[error("proxy server {addr}: {reason}")]
    Tls { addr: String, reason: String },
    #[error("proxy server {addr}: http/2: {reason}")]
    Protocol { addr: String, reason: String },
    #[error("proxy server {addr} refused the stream: grpc status {status}: {message}")]
    Refused {
        addr: String,
        status: String,
        message: String,
    },
    #[error("proxy server {addr}: no answer to a ping within {after:?}, the stream is dead")]
    Dead { addr: String, after: Duration },
    #[error("tunnel credentials: {0}")]
    Credentials(String),
    /// The node's HTTP proxy gave no tunnel to the server.
    #[error("proxy server {addr}: {reason}")]
    HttpProxy { addr: String, reason: String },
}

/// What every stream of the agent shares.
struct Agent {
    config: TunnelConfig,
    kubeconfig: Option<std::path::PathBuf>,
    node_name: String,
    identifiers: String,
    policy: Arc<Policy>,
    /// With `credential: serviceAccountToken`.
    token: Option<token::TokenSource>,
}

/// Starts the tunnel if `holdfast.tunnel.servers` is set: one task per server address,
/// until `stop` turns true (each stream then sends DRAIN and serves on until the
/// process ends). `cluster`: where a ServiceAccount token comes from.
pub fn spawn(
    config: &Config,
    cluster: Option<ClusterLink>,
    stop: watch::Receiver<bool>,
) -> Option<tokio::task::JoinSet<()>> {
    let tunnel = config.tunnel.clone()?;
    let token = match &tunnel.credential {
        crate::config::TunnelCredential::ServiceAccountToken(account) => Some(
            token::TokenSource::new(cluster, account.clone(), &config.node_name),
        ),
        crate::config::TunnelCredential::ClientCertificate => None,
    };
    let address = config.node_address();
    let mut hosts = vec![config.node_name.clone()];
    hosts.extend(address.clone());
    let target_ip = if config.server.address.is_unspecified() {
        match config.server.address {
            std::net::IpAddr::V6(_) => std::net::Ipv6Addr::LOCALHOST.into(),
            std::net::IpAddr::V4(_) => std::net::Ipv4Addr::LOCALHOST.into(),
        }
    } else {
        config.server.address
    };
    let identifiers = tunnel.identifiers.clone().unwrap_or_else(|| {
        let mut ids = format!("host={}", config.node_name);
        match address.as_deref().map(str::parse::<std::net::IpAddr>) {
            Some(Ok(std::net::IpAddr::V4(ip))) => ids.push_str(&format!("&ipv4={ip}")),
            Some(Ok(std::net::IpAddr::V6(ip))) => ids.push_str(&format!("&ipv6={ip}")),
            _ => {}
        }
        ids
    });
    let agent = Arc::new(Agent {
        policy: Arc::new(Policy {
            hosts,
            port: config.port,
            target: std::net::SocketAddr::new(target_ip, config.port),
        }),
        config: tunnel,
        kubeconfig: config.kubeconfig.clone(),
        node_name: config.node_name.clone(),
        identifiers,
        token,
    });
    log::info!(
        "tunnel: dialling {} as agent {} ({}), carrying only the kubelet API at {}",
        agent.config.servers.join(", "),
        agent.node_name,
        agent.identifiers,
        agent.policy.target
    );
    metrics::TUNNEL_ENABLED.store(true, Ordering::Relaxed);
    let mut set = tokio::task::JoinSet::new();
    for addr in agent.config.servers.clone() {
        set.spawn(supervise(agent.clone(), addr, stop.clone()));
    }
    Some(set)
}

/// Tells every stream to say DRAIN (see [`spawn`]) and waits until each has written it
/// or is gone, at most `DRAIN_WAIT`: the process may end right after, and a stream's
/// task is then never run again.
pub async fn drain(stop: &watch::Sender<bool>) {
    let _ = stop.send(true);
    if tokio::time::timeout(DRAIN_WAIT, stop.closed())
        .await
        .is_err()
    {
        log::warn!("tunnel: streams not drained within {DRAIN_WAIT:?}, stopping anyway");
    }
}

/// Keeps one stream to each distinct server behind `addr`, as many as it says there
/// are, dialling again with back-off when one is lost.
async fn supervise(agent: Arc<Agent>, addr: String, mut stop: watch::Receiver<bool>) {
    let mut held: HashMap<String, tokio::task::AbortHandle> = HashMap::new();
    let (ended_tx, mut ended_rx) = mpsc::channel::<String>(8);
    let mut want = 1usize;
    let mut failures = 0u32;
    loop {
        while let Ok(id) = ended_rx.try_recv() {
            held.remove(&id);
        }
        if *stop.borrow() {
            return;
        }
        if held.len() >= want {
            tokio::select! {
                Some(id) = ended_rx.recv() => {
                    held.remove(&id);
                    failures = 1;
                    let wait = RECONNECT.jittered(failures, backoff::random());
                    tokio::time::sleep(wait).await;
                }
                _ = stop.changed() => return,
            }
            continue;
        }
        let dialled = tokio::select! {
            r = dial::connect(&agent, &addr) => r,
            _ = stop.changed() => return,
        };
        let wait = match dialled {
            Ok(session) if !held.contains_key(&session.server_id) => {
                failures = 0;
                want = session.server_count;
                let id = session.server_id.clone();
                log::info!(
                    "tunnel: stream to proxy server {id} at {addr} up ({} of {want})",
                    held.len() + 1
                );
                let task = tokio::spawn(serve(
                    agent.clone(),
                    addr.clone(),
                    session,
                    stop.clone(),
                    ended_tx.clone(),
                ));
                held.insert(id, task.abort_handle());
                Duration::ZERO
            }
            Ok(session) => {
                want = session.server_count;
                log::debug!(
                    "tunnel: {addr} answered as {}, already held",
                    session.server_id
                );
                SYNC
            }
            Err(e) => {
                failures = failures.saturating_add(1);
                let wait = RECONNECT.jittered(failures, backoff::random());
                log::warn!("tunnel: {e}; dialling again in {wait:?}");
                wait
            }
        };
        tokio::select! {
            () = tokio::time::sleep(wait) => {}
            _ = stop.changed() => return,
        }
    }
}

/// Serves one stream until it ends; says which server it was to.
async fn serve(
    agent: Arc<Agent>,
    addr: String,
    session: dial::Session,
    stop: watch::Receiver<bool>,
    ended: mpsc::Sender<String>,
) {
    let id = session.server_id.clone();
    let (out_tx, mut out_rx) = mpsc::channel(splice::OUT_QUEUE);
    let mut conns = splice::Conns::new(agent.policy.clone(), out_tx, id.clone());
    metrics::TUNNEL_STREAMS.fetch_add(1, Ordering::Relaxed);
    let r = session
        .run(&mut conns, &mut out_rx, agent.config.keepalive, stop)
        .await;
    metrics::TUNNEL_STREAMS.fetch_sub(1, Ordering::Relaxed);
    match r {
        Ok(()) => log::info!("tunnel: stream to proxy server {id} at {addr} closed"),
        Err(e) => log::warn!("tunnel: stream to proxy server {id} lost: {e}"),
    }
    let _ = ended.send(id).await;
}
