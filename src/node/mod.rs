//! node: facts about the device itself: its address, CPUs, memory, storage, kernel and
//! identity, read from /proc, /sys and /etc; what a directory holds of the disk ([`du`]);
//! and the node model built on them: the node as configured ([`NodeInput`]), its
//! reservations and hard eviction thresholds, and its capacity and allocatable as the
//! kubelet computes them ([`allocatable`]); whether the node is shutting down
//! ([`shutdown`], a flag the graceful shutdown sets). Reads only; never writes to the
//! device.

pub mod allocatable;
pub mod du;
pub mod facts;
pub mod input;
pub mod shutdown;

use std::net::IpAddr;

pub use facts::NodeFacts;
pub use input::{NodeInput, NodeStatusError};

/// The address of the interface that holds the default route (IPv4), as the kubelet
/// picks the node's InternalIP when `--node-ip` is not given.
pub fn host_ip() -> Option<String> {
    let routes = std::fs::read_to_string("/proc/net/route").ok()?;
    let iface = routes.lines().skip(1).find_map(|l| {
        let f: Vec<&str> = l.split_whitespace().collect();
        (f.len() > 2 && f[1] == "00000000").then(|| f[0].to_string())
    });
    let addrs = nix::ifaddrs::getifaddrs().ok()?;
    let mut fallback = None;
    for a in addrs {
        let Some(ip) = a
            .address
            .as_ref()
            .and_then(|s| s.as_sockaddr_in())
            .map(|s| IpAddr::V4(s.ip()))
        else {
            continue;
        };
        if Some(&a.interface_name) == iface.as_ref() {
            return Some(ip.to_string());
        }
        if !ip.is_loopback() && fallback.is_none() {
            fallback = Some(ip.to_string());
        }
    }
    fallback.or_else(|| Some("127.0.0.1".to_string()))
}
