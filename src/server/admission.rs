//! Admission: how many connections a listener holds, in all and from one source, so
//! that clients who open connections and never finish them (a TLS handshake left
//! half-way, a request header trickled in) cannot take the gateway's memory or crowd
//! out the apiserver. A connection over either cap is closed as soon as it is accepted,
//! before any buffer is made for it, and counted in `/metrics`.
//!
//! Why these numbers ([`super::MAX_CONNECTIONS`], [`super::MAX_CONNECTIONS_PER_SOURCE`]):
//! the kubelet API's clients are the apiserver (every `kubectl logs`, `exec`, `attach`,
//! `port-forward` and proxied request, all from its address or a few of them),
//! metrics-server and a Prometheus. One source may hold twice [`super::MAX_STREAMS`],
//! so that the apiserver's streams plus its short requests fit; the total lets four
//! such sources in at once. What a connection costs before it is authenticated is
//! bounded by the handshake timeout and the header read timeout, so a source that
//! keeps its cap full must keep opening connections, and the most a listener holds is
//! the total times one connection's buffers (a few tens of KiB).
//!
//! IPv6 sources count by their /64 (what one site or host is usually handed), so a
//! single client cannot spread over its own prefix to get round the per-source cap.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

/// Connections refused because the listener held its total.
pub static REFUSED_TOTAL: AtomicU64 = AtomicU64::new(0);
/// Connections refused because their source held its share.
pub static REFUSED_PER_SOURCE: AtomicU64 = AtomicU64::new(0);

/// Why a connection was not admitted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refused {
    Total,
    PerSource,
}

/// The connections one listener holds, by source.
#[derive(Debug)]
pub struct Admission {
    max_total: usize,
    max_per_source: usize,
    held: Mutex<Held>,
}

#[derive(Debug, Default)]
struct Held {
    total: usize,
    /// At most `max_total` entries: a source is removed with its last connection.
    by_source: HashMap<IpAddr, usize>,
}

/// One admitted connection; gives its place back when dropped.
#[derive(Debug)]
pub struct Permit {
    admission: Arc<Admission>,
    source: IpAddr,
}

impl Admission {
    pub fn new(max_total: usize, max_per_source: usize) -> Arc<Admission> {
        Arc::new(Admission {
            max_total,
            max_per_source,
            held: Mutex::new(Held::default()),
        })
    }

    /// Takes a place for a connection from `peer`, or says which cap is full (and
    /// counts the refusal).
    pub fn admit(self: &Arc<Self>, peer: IpAddr) -> Result<Permit, Refused> {
        let source = source_of(peer);
        let mut held = self.held.lock().unwrap_or_else(PoisonError::into_inner);
        let refused = if held.total >= self.max_total {
            Some((Refused::Total, &REFUSED_TOTAL))
        } else if held.by_source.get(&source).copied().unwrap_or(0) >= self.max_per_source {
            Some((Refused::PerSource, &REFUSED_PER_SOURCE))
        } else {
            None
        };
        if let Some((why, counter)) = refused {
            counter.fetch_add(1, Ordering::Relaxed);
            return Err(why);
        }
        held.total += 1;
        *held.by_source.entry(source).or_default() += 1;
        Ok(Permit {
            admission: self.clone(),
            source,
        })
    }

    /// Connections held now.
    #[cfg(test)]
    fn held(&self) -> usize {
        self.held
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .total
    }
}

impl Drop for Permit {
    fn drop(&mut self) {
        let mut held = self
            .admission
            .held
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        held.total = held.total.saturating_sub(1);
        if let Some(n) = held.by_source.get_mut(&self.source) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                held.by_source.remove(&self.source);
            }
        }
    }
}

/// The address a connection counts against: IPv4 (also when mapped into IPv6) as
/// itself, IPv6 by its /64.
fn source_of(peer: IpAddr) -> IpAddr {
    match peer.to_canonical() {
        IpAddr::V6(v6) => {
            let bits = u128::from(v6) & !((1u128 << 64) - 1);
            IpAddr::V6(bits.into())
        }
        v4 => v4,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn caps_hold_and_places_come_back() {
        let a = Admission::new(3, 2);
        let one: IpAddr = "192.0.2.1".parse().expect("ip");
        let two: IpAddr = "192.0.2.2".parse().expect("ip");
        let p1 = a.admit(one).expect("first");
        let _p2 = a.admit(one).expect("second");
        assert_eq!(a.admit(one).expect_err("third"), Refused::PerSource);
        let _p3 = a.admit(two).expect("other source");
        assert_eq!(a.admit(two).expect_err("full"), Refused::Total);
        drop(p1);
        assert_eq!(a.held(), 2);
        let _p4 = a.admit(one).expect("a place came back");
    }

    #[test]
    fn sources_are_addresses_and_v6_prefixes() {
        let a = Admission::new(10, 1);
        let v6: IpAddr = "2001:db8::1".parse().expect("ip");
        let same_64: IpAddr = "2001:db8::ffff:2".parse().expect("ip");
        let other_64: IpAddr = "2001:db8:0:1::1".parse().expect("ip");
        let _p = a.admit(v6).expect("first");
        assert_eq!(a.admit(same_64).expect_err("same /64"), Refused::PerSource);
        let _q = a.admit(other_64).expect("another /64");
        let v4: IpAddr = "192.0.2.9".parse().expect("ip");
        let mapped: IpAddr = "::ffff:192.0.2.9".parse().expect("ip");
        let _r = a.admit(v4).expect("v4");
        assert_eq!(a.admit(mapped).expect_err("same v4"), Refused::PerSource);
    }
}
