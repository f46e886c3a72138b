//! holdfast: a Kubernetes node agent for small ARM gateways whose uplink comes and goes.
//!
//! It runs the pods that belong on its node through youki's libcontainer, keeps every
//! fact it needs in a sled database, and keeps the site's pods running while the link
//! to the cluster is down.
//!
//! # Layout
//! - [`config`]: flags and the KubeletConfiguration-shaped config file.
//! - [`store`]: the sled database; nobody else opens sled.
//! - [`source`]: pod sources (static manifest files, the apiserver's list and watch) and
//!   the mux that merges them.
//! - [`sync`]: the sync loop, pod workers, restart back-off, probes, init containers
//!   and hooks, pod phase and conditions; other modules read its pods through
//!   [`sync::view`] only.
//! - [`pod`]: what every layer says about a pod: its annotations (source, config hash,
//!   mirror), the downward API's references into it, its requests and limits summed.
//! - [`runtime`]: containers on libcontainer, driven by a per-container shim process.
//! - [`image`]: the content-addressed image store, registry pulls, archive import,
//!   layer unpacking and image GC.
//! - [`malloc`]: the C allocator's arena and threshold limits, and giving memory back.
//! - [`backoff`]: exponential back-off shared by every retry.
//! - [`agent`]: the one composition root: `holdfast run`'s start-up as named stages (root,
//!   pod sources, cluster link, local services) and the sync loop.
//! - [`cli`]: the `holdfast` subcommands other than `run`.
//! - [`check`]: `holdfast check`, what the kernel and system provide and what is missing.
//! - [`control`]: the local control socket `pods` and `image` use while an agent runs.
//! - [`network`]: a pod's namespaces (held without a pause container), its CNI
//!   attachment and addresses, its `/etc/hosts` and `/etc/resolv.conf`.
//! - [`eviction`]: node-pressure eviction by `evictionHard`, reclaim before it; pods over
//!   their local storage limits.
//! - [`node`]: facts about the device: address, CPUs, memory, storage (and what a
//!   directory holds of it), identity; and the node model on them: the node as
//!   configured, its reservations and eviction thresholds, capacity and allocatable.
//! - [`kube`]: the apiserver client library: kubeconfig, credentials, TLS and the node's
//!   certificates (CSR, bootstrap, rotation), requests, watches, the link's state.
//! - [`uplink`]: the node's reports over that client: Node and Lease, pod status and
//!   final deletes, mirror pods, events, ConfigMaps and Secrets, tokens.
//! - [`time`]: wall-clock time as Kubernetes reports it; times taken before the clock
//!   was set (a board without an RTC boots in 1970) are corrected or held back.
//! - [`quantity`]: Kubernetes quantities (`64Mi`, `500m`), read and written back in
//!   canonical form.
//! - [`proxy`]: which HTTP proxy a connection out goes through (`HTTPS_PROXY`,
//!   `NO_PROXY`, `holdfast.proxy`) and the CONNECT tunnel through it, for the apiserver,
//!   registry and konnectivity connections alike.
//! - [`tls`]: the one TLS client stack (rustls under ureq), shared by the apiserver and
//!   registry clients, and the one DER reader for X.509 (`tls::der`).
//! - [`resources`]: pods' requests and limits, QoS classes, the pod cgroup hierarchy
//!   and admission against the node's allocatable.
//! - [`volume`]: a pod's volumes (emptyDir, hostPath, configMap, secret, downwardAPI,
//!   projected) and each container's mounts of them.
//! - [`server`]: the kubelet HTTP API (logs, exec, stats, metrics) for the apiserver,
//!   metrics-server and Prometheus.
//! - [`tunnel`]: the konnectivity agent: streams dialled out to the proxy servers that
//!   carry the apiserver's connections to this node's kubelet API, and nothing else.
//! - [`http2`]: HTTP/2 frames and HPACK, shared by the gRPC probe and the tunnel.
//! - [`metrics`]: holdfast's own Prometheus series, recorded by any module.
//! - [`dbus`]: a minimal D-Bus client (the system bus, method calls, properties,
//!   signals, file descriptors passed back), for systemd-logind.
//! - [`shutdown`]: the graceful node shutdown as the kubelet's: a delay inhibitor held
//!   with systemd-logind, the pods stopped by priority before the machine powers off.
//! - [`systemd`]: `Type=notify` readiness, status and a watchdog fed by the sync loop.
//! - [`redirect`]: where an HTTP redirect leads and the origin credentials are bound to,
//!   for the clients that follow redirects themselves.
//! - [`wire`]: what the apiserver and registry clients both put on the wire: the
//!   User-Agent, percent-encoding, base64.
//! - [`yaml`]: the bounded read and the look at nesting and aliases every YAML file
//!   from outside gets before serde_yaml decodes it.

pub mod agent;
pub mod backoff;
pub mod check;
pub mod cli;
pub mod config;
pub mod control;
pub mod dbus;
pub mod eviction;
pub mod http2;
pub mod image;
pub mod kube;
pub mod malloc;
pub mod metrics;
pub mod network;
pub mod node;
pub mod pod;
pub mod proxy;
pub mod quantity;
pub mod redirect;
pub mod resources;
pub mod runtime;
pub mod server;
pub mod shutdown;
pub mod source;
pub mod store;
pub mod sync;
pub mod systemd;
pub mod time;
pub mod tls;
pub mod tunnel;
pub mod uplink;
pub mod volume;
pub mod wire;
pub mod yaml;

mod error;
pub use error::{chain as error_chain, Error};
#[cfg(test)]
use support::tempdir as testutil;

/// The version reported by `holdfast version` and in node info.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");
