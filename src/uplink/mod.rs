//! uplink: the node's reports to the kube-apiserver: node registration and status, the
//! lease, pod status patches, mirror pods and events, the outbox they wait in, the
//! ConfigMap and Secret cache, the cluster's Services for containers' environments,
//! and the pods' service-account tokens. It runs on its own threads and never blocks the
//! sync loop (tokens are asked for on the blocking thread that sets a pod's volumes up).
//!
//! It talks through the one [`crate::kube::Client`] the agent hands it and never builds
//! a client of its own; it starts no pod source and none of its own threads: the agent
//! wires it, and starts each service with what it needs.

pub mod device;
pub mod events;
pub mod lease;
pub mod mirror;
pub mod node;
pub mod node_status;
pub mod objects;
pub mod pod_status;
pub mod pods;
pub mod report;
pub mod services;
pub mod tokens;
pub mod view;

pub use report::{Outbox, Reporter};
pub use view::UplinkView;
