//! The cluster's Services, from which the kubelet makes the environment variables of
//! every container (`<NAME>_SERVICE_HOST`, `<NAME>_PORT_<port>_TCP`, ...): one LIST of
//! all Services, then one WATCH from its resourceVersion ([`ServiceReflector`]), and a
//! copy of what containers need of each in the store ([`ServiceCache`]). It never builds
//! an environment: `sync::env` reads the cache.
//!
//! # Why all of them, and kept
//! A container sees the Services of its pod's namespace and the master service
//! `default/kubernetes`, and a pod of any namespace may be bound to the node at any
//! time, so the kubelet follows every Service; so does this. Of each only the name,
//! namespace, cluster IP and ports are kept, and only Services that have a cluster IP
//! (a headless or ExternalName Service makes no variables): a few dozen bytes each.
//!
//! The kubelet starts no container before it has read the Service list once, so that
//! `KUBERNETES_SERVICE_HOST` is never missing. A site whose uplink is down after a
//! reboot cannot read it; the list kept in the store from the last time stands in, so a
//! pod restarting offline gets the same variables it had, and the environment code says
//! so in a log line. While the apiserver answers, a cluster pod waits for this run's
//! list instead (it may differ from the kept one), and so it does with no list stored,
//! as the kubelet's does (`services have not yet been read at least once`).
//!
//! # Uplink manners
//! One watch for the node, resumed from the last resourceVersion when it ends, with
//! bookmarks; a 410 relists once. No polling. While the link is down the reflector waits
//! on [`crate::kube::Link`] as the pod source does, and after a reconnect it goes after
//! the node status and the outbox.

mod cache;
mod lister;
mod reflector;

pub use cache::{ListState, ServiceCache, Visible};
pub use lister::{list_path, watch_path, ServiceList, ServiceLister, ServiceWatch};
pub use reflector::{ServiceReflector, ServiceReflectorOptions};

/// Store tree of the kept Services, keyed `<namespace>/<name>`.
pub const TREE_SERVICES: &str = "services";
/// Store tree saying that `services` holds a complete list (one key).
pub const TREE_SERVICES_LISTED: &str = "services-listed";

/// The master service every container sees, whatever its namespace.
pub const MASTER_NAMESPACE: &str = "default";
pub const MASTER_SERVICE: &str = "kubernetes";
