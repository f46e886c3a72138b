//! Admission: how many connections a listener holds, in all and from one source, so
//! that clients who open connections and never finish them (a TLS handshake left
//! half-way, a request header trickled in) cannot take the gateway's memory or crowd
//! out the apiserver. A connection over its source's share is closed as soon as it is
//! accepted, before any buffer is made for it. A connection over the total takes the
//! place of the oldest one that has not proved a client certificate (on the plain
//! ports, the oldest), which is closed: refusing the newcomer instead would let a flood
//! from a few dozen sources, each renewing its connections every handshake timeout,
//! keep the apiserver out for as long as it lasts; this way the flood churns through
//! itself and a client that completes its handshake keeps its place. Only when every
//! connection held has proved a certificate is the newcomer refused. Refusals and
//! evictions are counted in `/metrics`.
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

use std::collections::{HashMap, VecDeque};
use std::net::IpAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use tokio::sync::Notify;

/// Connections refused because the listener held its total, every one of them a
/// client that had proved its certificate.
pub static REFUSED_TOTAL: AtomicU64 = AtomicU64::new(0);
/// Connections refused because their source held its share.
pub static REFUSED_PER_SOURCE: AtomicU64 = AtomicU64::new(0);
/// Connections without a proven client closed to make room for a newer one.
pub static EVICTED: AtomicU64 = AtomicU64::new(0);

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
    /// The connections that have not proved a client certificate, oldest first.
    unproven: VecDeque<Arc<Slot>>,
}

/// One connection's place: whose it is, and whether it was given up.
#[derive(Debug)]
struct Slot {
    source: IpAddr,
    /// Set under the lock, with the place released then.
    evicted: AtomicBool,
    notify: Notify,
}

/// One admitted connection; gives its place back when dropped.
#[derive(Debug)]
pub struct Permit {
    admission: Arc<Admission>,
    slot: Arc<Slot>,
}

impl Held {
    fn forget_unproven(&mut self, slot: &Arc<Slot>) {
        self.unproven.retain(|s| !Arc::ptr_eq(s, slot));
    }

    fn release(&mut self, source: IpAddr) {
        self.total = self.total.saturating_sub(1);
        if let Some(n) = self.by_source.get_mut(&source) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                self.by_source.remove(&source);
            }
        }
    }
}

impl Admission {
    pub fn new(max_total: usize, max_per_source: usize) -> Arc<Admission> {
        Arc::new(Admission {
            max_total,
            max_per_source,
            held: Mutex::new(Held::default()),
        })
    }

    /// Takes a place for a connection from `peer`. When the listener is full, the
    /// oldest connection that has not proved a client certificate gives its place up
    /// (a flood from many sources then churns through itself instead of locking the
    /// apiserver out); when every one has, or the source holds its share, the new
    /// connection is refused (and counted).
    pub fn admit(self: &Arc<Self>, peer: IpAddr) -> Result<Permit, Refused> {
        let source = source_of(peer);
        let mut held = self.lock();
        if held.by_source.get(&source).copied().unwrap_or(0) >= self.max_per_source {
            REFUSED_PER_SOURCE.fetch_add(1, Ordering::Relaxed);
            return Err(Refused::PerSource);
        }
        if held.total >= self.max_total {
            let Some(oldest) = held.unproven.pop_front() else {
                REFUSED_TOTAL.fetch_add(1, Ordering::Relaxed);
                return Err(Refused::Total);
            };
            // Its place is free from now on: its task only has to notice (the
            // notification is kept if the task is not waiting yet).
            oldest.evicted.store(true, Ordering::Relaxed);
            oldest.notify.notify_one();
            held.release(oldest.source);
            EVICTED.fetch_add(1, Ordering::Relaxed);
        }
        held.total += 1;
        *held.by_source.entry(source).or_default() += 1;
        let slot = Arc::new(Slot {
            source,
            evicted: AtomicBool::new(false),
            notify: Notify::new(),
        });
        held.unproven.push_back(slot.clone());
        Ok(Permit {
            admission: self.clone(),
            slot,
        })
    }

    /// Connections held now.
    #[cfg(test)]
    fn held(&self) -> usize {
        self.lock().total
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Held> {
        self.held.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl Permit {
    /// The client proved a certificate: this connection keeps its place.
    pub fn proven(&self) {
        self.admission.lock().forget_unproven(&self.slot);
    }

    /// Resolves once the connection has given its place up to a newer one.
    pub async fn evicted(&self) {
        if !self.slot.evicted.load(Ordering::Relaxed) {
            self.slot.notify.notified().await;
        }
    }
}

impl Drop for Permit {
    fn drop(&mut self) {
        let mut held = self.admission.lock();
        held.forget_unproven(&self.slot);
        if !self.slot.evicted.load(Ordering::Relaxed) {
            held.release(self.slot.source);
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
        let p2 = a.admit(one).expect("second");
        assert_eq!(a.admit(one).expect_err("third"), Refused::PerSource);
        let p3 = a.admit(two).expect("other source");
        for p in [&p1, &p2, &p3] {
            p.proven();
        }
        assert_eq!(a.admit(two).expect_err("full"), Refused::Total);
        drop(p1);
        assert_eq!(a.held(), 2);
        let _p4 = a.admit(one).expect("a place came back");
    }

    #[tokio::test]
    async fn a_full_listener_evicts_its_oldest_unproven_connection() {
        let a = Admission::new(3, 3);
        let ip = |n: u8| IpAddr::from([192, 0, 2, n]);
        let proven = a.admit(ip(1)).expect("first");
        proven.proven();
        let oldest = a.admit(ip(2)).expect("second");
        let newer = a.admit(ip(3)).expect("third");
        let newest = a
            .admit(ip(4))
            .expect("fourth, in place of the oldest unproven");
        oldest.evicted().await;
        assert_eq!(a.held(), 3);
        drop(oldest);
        assert_eq!(a.held(), 3, "an evicted place is not given back twice");
        // Eviction goes oldest first and never touches a proven connection.
        let _fifth = a.admit(ip(5)).expect("fifth");
        newer.evicted().await;
        drop(newer);
        newest.proven();
        let _sixth = a.admit(ip(6)).expect("sixth, in place of the fifth");
        let last = a.admit(ip(7)).expect("seventh, in place of the sixth");
        last.proven();
        assert_eq!(a.admit(ip(8)).expect_err("all proven"), Refused::Total);
        drop(proven);
        assert_eq!(a.held(), 2);
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
