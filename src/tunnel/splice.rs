//! tunnel::splice: the connections a stream carries. A DIAL_REQ for this node's kubelet
//! API becomes a loopback TCP connection to it, spliced to the stream (the apiserver's
//! TLS to the kubelet runs inside, end to end); a DIAL_REQ for anything else is refused
//! with a DIAL_RSP error and a log line: the tunnel is no way into the node's network.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::{mpsc, Notify};

use super::packet::Packet;
use crate::metrics;

/// How long a dial of the kubelet API may take (the upstream agent's).
const DIAL_TIMEOUT: Duration = Duration::from_secs(5);
/// What one read from the kubelet API may carry in one DATA packet.
const READ_BUF: usize = 16 << 10;
/// Packets the connections may have waiting for their stream, all of them together:
/// what the kubelet API's answers hold in memory while the link is slower than it, up
/// to `READ_BUF` each. The stream takes them as its windows let it send, a batch at a
/// time; 256 of them held 8 MiB for a download through `kubectl port-forward`, for no
/// more throughput than this many.
pub(super) const OUT_QUEUE: usize = 4;

/// What a connection's task sends to its stream.
pub(super) enum Out {
    Packet(Packet),
    /// The connection is closed; forget it.
    Gone(i64),
}

/// The only addresses the tunnel dials for: this node's kubelet API.
#[derive(Debug, Clone)]
pub struct Policy {
    /// The host names and addresses the node goes by (its name, its addresses).
    pub hosts: Vec<String>,
    /// The kubelet API's port.
    pub port: u16,
    /// Where the kubelet API listens, as dialled (loopback when it listens on all).
    pub target: SocketAddr,
}

impl Policy {
    /// Whether a DIAL_REQ for `address` over `protocol` is for the kubelet API.
    pub fn allows(&self, protocol: &str, address: &str) -> Result<SocketAddr, String> {
        if protocol != "tcp" {
            return Err(format!("protocol {protocol:?} is not tcp"));
        }
        let (host, port) = address
            .rsplit_once(':')
            .ok_or_else(|| format!("address {address:?} has no port"))?;
        let host = host.trim_start_matches('[').trim_end_matches(']');
        if port.parse::<u16>().ok() != Some(self.port) {
            return Err(format!(
                "{address:?} is not this node's kubelet API (port {})",
                self.port
            ));
        }
        if !self.hosts.iter().any(|h| h.eq_ignore_ascii_case(host)) {
            return Err(format!(
                "{address:?} is not this node's kubelet API (host is none of {})",
                self.hosts.join(", ")
            ));
        }
        Ok(self.target)
    }
}

/// Received bytes written to the kubelet API and not yet given back to the server's
/// flow-control window, with a wake-up for the stream that gives them back.
#[derive(Default)]
pub(super) struct Consumed {
    bytes: AtomicU64,
    notify: Notify,
}

impl Consumed {
    pub(super) fn add(&self, n: usize) {
        self.bytes.fetch_add(n as u64, Ordering::Relaxed);
        self.notify.notify_one();
    }

    pub(super) fn take(&self) -> u64 {
        self.bytes.swap(0, Ordering::Relaxed)
    }

    pub(super) async fn notified(&self) {
        self.notify.notified().await;
    }
}

/// The connections of one stream, by the id this agent gave each.
pub(super) struct Conns {
    policy: Arc<Policy>,
    open: HashMap<i64, mpsc::UnboundedSender<Bytes>>,
    next_id: i64,
    out: mpsc::Sender<Out>,
    consumed: Arc<Consumed>,
    server: String,
}

impl Conns {
    pub(super) fn new(policy: Arc<Policy>, out: mpsc::Sender<Out>, server: String) -> Self {
        Conns {
            policy,
            open: HashMap::new(),
            next_id: 0,
            out,
            consumed: Arc::default(),
            server,
        }
    }

    pub(super) fn consumed(&self) -> Arc<Consumed> {
        self.consumed.clone()
    }

    pub(super) fn gone(&mut self, id: i64) {
        self.open.remove(&id);
    }

    /// Acts on a packet from the server; answers that need no connection go to
    /// `replies`. Returns how many of its bytes a connection took (given back to the
    /// window once written).
    pub(super) fn handle(&mut self, packet: Packet, replies: &mut Vec<Packet>) -> usize {
        match packet {
            Packet::DialReq {
                protocol,
                address,
                random,
            } => self.dial(&protocol, &address, random, replies),
            Packet::Data {
                connect_id, data, ..
            } => {
                let n = data.len();
                match self.open.get(&connect_id) {
                    Some(tx) if tx.send(data).is_ok() => return n,
                    _ => replies.push(Packet::CloseRsp {
                        error: "unrecognized connectID".into(),
                        connect_id,
                    }),
                }
            }
            Packet::CloseReq { connect_id } => {
                // Its task sees its channel close, closes the socket, says CLOSE_RSP.
                if self.open.remove(&connect_id).is_none() {
                    replies.push(Packet::CloseRsp {
                        error: "Unknown connectID".into(),
                        connect_id,
                    });
                }
            }
            Packet::DialCls { random } => {
                log::debug!("tunnel: {} gave up on dial {random}", self.server);
            }
            other => log::debug!("tunnel: {} sent {}, ignored", self.server, other.kind()),
        }
        0
    }

    fn dial(&mut self, protocol: &str, address: &str, random: i64, replies: &mut Vec<Packet>) {
        let target = match self.policy.allows(protocol, address) {
            Ok(target) => target,
            Err(reason) => {
                log::warn!(
                    "tunnel: refused a dial from proxy server {} to {address}: {reason}",
                    self.server
                );
                metrics::TUNNEL_DIALS_REFUSED.inc();
                replies.push(Packet::DialRsp {
                    error: format!("holdfast dials only this node's kubelet API: {reason}"),
                    connect_id: 0,
                    random,
                });
                return;
            }
        };
        self.next_id += 1;
        let id = self.next_id;
        let (tx, rx) = mpsc::unbounded_channel();
        self.open.insert(id, tx);
        let out = self.out.clone();
        let consumed = self.consumed.clone();
        tokio::spawn(splice(id, random, target, rx, out, consumed));
    }
}

/// Dials the kubelet API, answers the DIAL_REQ, then carries bytes both ways until
/// either side closes; says CLOSE_RSP at the end.
async fn splice(
    id: i64,
    random: i64,
    target: SocketAddr,
    mut rx: mpsc::UnboundedReceiver<Bytes>,
    out: mpsc::Sender<Out>,
    consumed: Arc<Consumed>,
) {
    let tcp = match tokio::time::timeout(DIAL_TIMEOUT, TcpStream::connect(target)).await {
        Ok(Ok(tcp)) => tcp,
        failed => {
            let error = match failed {
                Ok(Err(e)) => format!("dial tcp {target}: {e}"),
                _ => format!("dial tcp {target}: i/o timeout"),
            };
            log::warn!("tunnel: kubelet API at {target}: {error}");
            metrics::TUNNEL_DIALS_FAILED.inc();
            let rsp = Packet::DialRsp {
                error,
                connect_id: 0,
                random,
            };
            let _ = out.send(Out::Packet(rsp)).await;
            let _ = out.send(Out::Gone(id)).await;
            return;
        }
    };
    let _ = tcp.set_nodelay(true);
    metrics::TUNNEL_DIALS_SERVED.inc();
    let rsp = Packet::DialRsp {
        error: String::new(),
        connect_id: id,
        random,
    };
    if out.send(Out::Packet(rsp)).await.is_err() {
        return;
    }
    let (mut rd, mut wr) = tcp.into_split();
    let to_kubelet = async {
        while let Some(b) = rx.recv().await {
            if wr.write_all(&b).await.is_err() {
                break;
            }
            metrics::TUNNEL_BYTES_TO_KUBELET.add(b.len() as u64);
            consumed.add(b.len());
        }
    };
    let from_kubelet = async {
        let mut buf = vec![0u8; READ_BUF];
        loop {
            let n = match rd.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => n,
            };
            metrics::TUNNEL_BYTES_FROM_KUBELET.add(n as u64);
            let data = Packet::Data {
                connect_id: id,
                error: String::new(),
                data: Bytes::copy_from_slice(&buf[..n]),
            };
            if out.send(Out::Packet(data)).await.is_err() {
                break;
            }
        }
    };
    tokio::select! {
        () = to_kubelet => {}
        () = from_kubelet => {}
    }
    // What was on its way to the socket is dropped; its bytes go back to the window.
    rx.close();
    while let Ok(b) = rx.try_recv() {
        consumed.add(b.len());
    }
    let close = Packet::CloseRsp {
        error: String::new(),
        connect_id: id,
    };
    let _ = out.send(Out::Packet(close)).await;
    let _ = out.send(Out::Gone(id)).await;
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy() -> Policy {
        Policy {
            hosts: vec!["gw-1".into(), "203.0.113.9".into(), "fd00::9".into()],
            port: 10250,
            target: "127.0.0.1:10250".parse().expect("addr"),
        }
    }

    #[test]
    fn only_the_kubelet_api_is_dialled() {
        let p = policy();
        for ok in [
            "gw-1:10250",
            "GW-1:10250",
            "203.0.113.9:10250",
            "[fd00::9]:10250",
        ] {
            assert_eq!(p.allows("tcp", ok), Ok(p.target), "{ok}");
        }
        for refused in [
            "203.0.113.9:22",
            "10.96.0.1:443",
            "127.0.0.1:10250",
            "gw-1",
            "gw-1:",
            "169.254.169.254:80",
        ] {
            assert!(p.allows("tcp", refused).is_err(), "{refused}");
        }
        assert!(p.allows("udp", "gw-1:10250").is_err());
    }
}
