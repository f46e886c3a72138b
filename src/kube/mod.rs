//! kube: the apiserver client library, as kube-rs's `kube-client` is one. The
//! kubeconfig and its credentials, TLS to the apiserver and the node's certificates
//! (CSR, bootstrap, rotation), requests and watches, the link's state; escaping and the
//! user agent are [`crate::wire`]'s, shared with the registry client, and named here too. One [`Client`] is made per agent and handed to whoever talks to the
//! apiserver; its credentials are swapped in place when a certificate is rotated.
//!
//! It must not know about pods, nodes or the sync loop: what the node reports, and what
//! the cluster asks of it, are the business of the modules above (`uplink`, `source`,
//! `server`). Blocking: callers run it on threads of their own.

pub mod bootstrap;
pub mod cert_state;
pub mod client;
pub mod connect;
pub mod credentials;
pub mod csr;
pub mod endpoints;
pub mod error;
pub mod kubeconfig;
pub mod link;
pub mod reflect;
pub mod rotation;
pub mod site;
pub mod tls;
pub mod watch;

#[cfg(test)]
pub(crate) mod testpki;

pub use crate::wire::escape;
pub use client::{Client, Patch, Watch};
pub use error::ApiError;
pub use kubeconfig::KubeconfigError;
pub use link::{Link, LinkReport, Stage};
