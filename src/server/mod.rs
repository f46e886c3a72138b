//! server: the kubelet HTTP API, on the agent's tokio runtime. The apiserver reaches it
//! for `kubectl logs`, `exec`, `attach` and `port-forward`, metrics-server for
//! `kubectl top`, Prometheus for `/metrics`.
//!
//! It reads what others own and changes none of it: pod states from the store (tree
//! `podstates`, written by the sync loop), CRI log files (written by the shims),
//! cgroup files, and the uplink's view. Containers are reached only through the
//! runtime's exec process and the shim's attach socket, never libcontainer. Every
//! file, cgroup or process operation runs on a blocking thread; a client that reads
//! slowly holds only its own bounded buffer.
//!
//! Listeners (see [`listen`]):
//! - `address:port` (10250): TLS; every route but `/healthz` is authenticated and
//!   authorized by [`auth`] (a client certificate from
//!   `authentication.x509.clientCAFile`, a bearer token the apiserver reviews, or
//!   anonymous; `authorization.mode`), 401 or 403 otherwise.
//! - `address:readOnlyPort` (off by default): plain HTTP, only `/healthz`, `/pods`,
//!   `/stats/summary`, `/metrics` and `/metrics/resource`, as the kubelet serves there.
//! - `healthzBindAddress:healthzPort` (127.0.0.1:10248): plain `/healthz`.
//!
//! Each listener holds at most [`MAX_CONNECTIONS`] connections, [`MAX_CONNECTIONS_PER_SOURCE`]
//! of them from one source; a connection over the source's share is closed at once, one
//! over the total takes the place of the oldest connection that has not proved a
//! client certificate (or is closed if all have), and both are counted ([`admission`]
//! says why). A TLS handshake has [`HANDSHAKE_TIMEOUT`], a
//! request's headers [`HEADER_READ_TIMEOUT`].
//!
//! Layers, each importing only those below it:
//! - [`connection`]: each listener's accept loop, [`admission`], the TLS handshake
//!   ([`tls`] with [`x509`] and [`serving`], the cluster's certificate) and one hyper
//!   connection per client, whose requests go to
//! - [`routes`]: one table of path, methods, ports and handler; [`auth`] first.
//! - the handlers, which never call one another: [`pods`], [`logs`], [`stats`] (with
//!   [`cgroups`] and [`sampler`]), [`metrics`], [`run`], [`exec`] (exec and attach) and
//!   [`portforward`] (TCP into the pod's network namespace).
//! - what handlers share: [`lookup`] (a pod or container from the store), [`deps`]
//!   (what the API reads), the stream protocols [`spdy`] and [`websocket`], which know
//!   no handler.
//! - the vocabularies at the bottom: [`http`] (responses, the caller, the query) and
//!   [`streams`] (what a stream protocol and its handler pass each other); [`error`].

mod admission;
mod auth;
pub mod cgroups;
mod connection;
mod deps;
mod error;
mod exec;
mod http;
mod logs;
mod lookup;
mod metrics;
mod pods;
mod portforward;
mod routes;
mod run;
pub mod sampler;
pub mod serving;
mod spdy;
mod stats;
mod streams;
pub mod tls;
mod websocket;
mod x509;

use std::net::SocketAddr;
use std::sync::Arc;

use tokio::sync::Semaphore;

use crate::runtime::LibcontainerRuntime;
use crate::sync::PodStates;

pub use auth::Auth;
pub use connection::{
    HANDSHAKE_TIMEOUT, HEADER_READ_TIMEOUT, MAX_CONNECTIONS, MAX_CONNECTIONS_PER_SOURCE,
};
pub use deps::{ApiDeps, MAX_STREAMS};
pub use error::ServerError;
pub use http::{Identity, User};
pub use routes::Port;

/// Starts the listeners the settings ask for, each in its own task; a listener whose
/// port is taken is retried with back-off, so the pods run whatever happens here.
/// Fails only for what retrying cannot fix (a certificate or CA that cannot be used).
/// With `bootstrap`, the cluster's certificate is served from the first connection on
/// if one is kept, and asked for if not.
pub async fn listen(
    deps: ApiDeps,
    bootstrap: Option<serving::Bootstrap>,
) -> Result<(), ServerError> {
    let s = deps.settings.clone();
    let tls = {
        let (root, node, settings) = (deps.root_dir.clone(), deps.node_name.clone(), s.clone());
        tokio::task::spawn_blocking(move || {
            let tls = tls::server_config(&root, &node, &settings)?;
            if let Some(b) = bootstrap {
                b.start(&tls.serving);
            }
            Ok::<_, ServerError>(tls)
        })
        .await
        .map_err(|e| ServerError::Tls(e.to_string()))??
    };
    let acceptor = tokio_rustls::TlsAcceptor::from(tls.config);
    let verifier = tls.clients;
    let secure = SocketAddr::new(s.address, deps.port);
    connection::spawn_listener(
        secure,
        Port::Secure,
        deps.clone(),
        Some((acceptor, verifier)),
    );
    if s.read_only_port != 0 {
        let addr = SocketAddr::new(s.address, s.read_only_port);
        connection::spawn_listener(addr, Port::ReadOnly, deps.clone(), None);
    }
    if s.healthz_port != 0 {
        let addr = SocketAddr::new(s.healthz_bind_address, s.healthz_port);
        connection::spawn_listener(addr, Port::Healthz, deps, None);
    }
    Ok(())
}

/// Starts the kubelet API for `holdfast run`. A failure here is logged and the agent
/// runs its pods without the API: a bad certificate must not take the site down.
/// `client` is the agent's apiserver client, for delegated auth and the serving
/// certificate; `None` on a node with no kubeconfig.
pub async fn start(
    config: &crate::config::Config,
    root: &std::path::Path,
    runtime: &Arc<LibcontainerRuntime>,
    podstates: &PodStates,
    uplink: Option<crate::uplink::UplinkView>,
    client: Option<crate::kube::connect::SharedClient>,
) {
    let deps = ApiDeps {
        node_name: config.node_name.clone(),
        port: config.port,
        root_dir: root.to_owned(),
        podstates: podstates.clone(),
        runtime: runtime.clone(),
        uplink,
        configz: Arc::new(configz(config)),
        settings: config.server.clone(),
        sampler: Arc::new(sampler::Sampler::default()),
        streams: Arc::new(Semaphore::new(MAX_STREAMS)),
        auth: Auth::new(&config.server, &config.node_name, client.clone()),
    };
    if let Err(e) = listen(deps, serving::Bootstrap::from_config(config, client)).await {
        log::error!("kubelet API not started: {}", crate::error_chain(&e));
    }
}

/// The parsers a client's bytes reach, for the fuzz tests in `tests/fuzz.rs`; not an
/// API.
#[doc(hidden)]
pub mod fuzz {
    pub use super::connection::serve_connection;
    pub use super::http::Query;
    pub use super::spdy::{read_frame, Frame, Headers};
    pub use super::websocket::read_message;
    pub use crate::runtime::log_read::{stream as read_log, LogOptions, Sink};
}

/// The running configuration as `/configz` shows it, in KubeletConfiguration's
/// spelling. Paths of keys are shown; no key material is.
pub fn configz(c: &crate::config::Config) -> serde_json::Value {
    let s = &c.server;
    let secs = |d: std::time::Duration| format!("{}s", d.as_secs());
    serde_json::json!({
        "kind": "KubeletConfiguration",
        "apiVersion": "kubelet.config.k8s.io/v1beta1",
        "staticPodPath": c.static_pod_path,
        "syncFrequency": secs(c.sync_frequency),
        "fileCheckFrequency": secs(c.file_check_frequency),
        "address": s.address.to_string(),
        "port": c.port,
        "readOnlyPort": s.read_only_port,
        "healthzPort": s.healthz_port,
        "healthzBindAddress": s.healthz_bind_address.to_string(),
        "tlsCertFile": s.tls_cert_file,
        "tlsPrivateKeyFile": s.tls_private_key_file,
        "serverTLSBootstrap": s.server_tls_bootstrap,
        "authentication": {
            "x509": {"clientCAFile": s.client_ca_file},
            "anonymous": {"enabled": s.anonymous},
            "webhook": {"enabled": s.token_webhook, "cacheTTL": secs(s.token_cache_ttl)},
        },
        "authorization": {
            "mode": format!("{:?}", s.authorization),
            "webhook": {
                "cacheAuthorizedTTL": secs(s.authorized_ttl),
                "cacheUnauthorizedTTL": secs(s.unauthorized_ttl),
            },
        },
        "cgroupRoot": c.cgroup_root,
        "containerLogMaxSize": c.container_log_max_size.to_string(),
        "containerLogMaxFiles": c.container_log_max_files,
        "maxPods": c.max_pods,
        "nodeStatusUpdateFrequency": secs(c.node_status_update_frequency),
        "nodeStatusReportFrequency": secs(c.node_status_report_frequency),
        "nodeLeaseDurationSeconds": c.node_lease_duration_seconds,
        "systemReserved": c.system_reserved,
        "kubeReserved": c.kube_reserved,
        "evictionHard": c.eviction_hard,
    })
}
