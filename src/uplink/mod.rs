//! uplink: everything that talks to the kube-apiserver: the client (kubeconfig, TLS,
//! retries), node registration and status, the lease, pod status patches, mirror pods
//! and events, and the pods' service-account tokens. It runs on its own threads and
//! never blocks the sync loop (tokens are asked for on the blocking thread that sets a
//! pod's volumes up).

pub mod bootstrap;
pub mod client;
pub mod credentials;
pub mod csr;
pub mod der;
pub mod error;
pub mod events;
pub mod kubeconfig;
pub mod link;
pub mod mirror;
pub mod node;
pub mod node_status;
pub mod objects;
pub mod pod_status;
pub mod pods;
pub mod report;
pub mod rotation;
pub mod start;
pub mod tls;
pub mod tokens;
pub mod watch;

#[cfg(test)]
pub(crate) mod testpki;

pub use client::{Client, Patch, Watch};
pub use error::ApiError;
pub use kubeconfig::KubeconfigError;
pub use link::{Link, LinkReport, Stage};
pub use report::{Outbox, Reporter};

/// Percent-encodes `s` for a URL path segment or query value: everything but the
/// unreserved characters of RFC 3986.
pub fn escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}
