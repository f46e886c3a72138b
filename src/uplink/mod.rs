//! uplink: everything that talks to the kube-apiserver: the client (kubeconfig, TLS,
//! retries), node registration and status, the lease, pod status patches, mirror pods
//! and events. It runs on its own threads and never blocks the sync loop.

pub mod client;
pub mod error;
pub mod kubeconfig;
pub mod objects;

pub use client::{Client, Patch, Watch};
pub use error::ApiError;
pub use kubeconfig::KubeconfigError;
