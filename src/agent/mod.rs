//! agent: the one composition root of `holdfast run`. Start-up reads as its stages, in
//! order: the root (root dir, store, images, runtime, adoption), the pod sources and the
//! mux, the cluster link and its services (one apiserver client, the uplink), the local
//! services (control socket, kubelet API, the sync loop's deps, eviction), the tunnel to
//! the konnectivity servers where one is configured, the graceful node shutdown's
//! watch on logind where a grace period is configured, then the sync loop until the
//! agent stops.
//!
//! Holds no logic of its own: each stage only wires what the modules below provide, and
//! nothing else starts a service or a source.

mod cluster;
mod local;
mod root;
mod sources;

use std::future::Future;

use tokio::sync::mpsc;

use crate::config::Config;
use crate::node::shutdown::ShuttingDown;
use crate::sync::SyncLoop;
use crate::Error;

/// A changed ConfigMap or Secret, in flight to the sync loop.
const OBJECT_CHANGES: usize = 16;

/// Runs the agent until `shutdown` completes. Containers keep running afterwards.
pub async fn run(mut config: Config, shutdown: impl Future<Output = ()>) -> Result<(), Error> {
    // Before anything can fork: no shim, container or plugin may inherit NOTIFY_SOCKET.
    let notify = crate::systemd::Notify::from_env();
    // Before any connection out: every client made from here on uses these rules.
    crate::proxy::install(config.proxy.clone());
    let root = root::open(&mut config).await?;
    let sources = sources::open(&config, &root.store)?;
    // A changed ConfigMap or Secret resyncs the pods that reference it; the Services
    // read for the first time, every pod.
    let (objects_tx, objects_rx) = mpsc::channel(OBJECT_CHANGES);
    let (services_tx, services_rx) = mpsc::channel(1);
    let changes = cluster::Changes {
        objects: objects_tx,
        services_read: services_tx,
    };
    let shutting_down = ShuttingDown::default();
    let mut cluster = cluster::start(&config, &root.store, &notify, changes, &shutting_down)?;
    if let Some(cluster) = cluster.as_mut() {
        sources.start_api(&config, cluster);
    }
    let (initial, changes) = sources.run_mux();
    let local = local::start(&config, &root, cluster.as_ref(), &shutting_down).await?;
    let node_shutdown = crate::shutdown::Manager {
        config: config.shutdown.clone(),
        flag: shutting_down,
        store: root.store.clone(),
        reports: cluster.as_ref().map(|c| crate::shutdown::Reports {
            reporter: c.reporter.clone(),
            link: c.view.link.clone(),
        }),
    }
    .spawn();
    log::info!(
        "holdfast {} running as node {} (root {}, manifests {})",
        crate::VERSION,
        config.node_name,
        root.dir.display(),
        config.static_pod_path.display()
    );
    // The tunnel to the proxy servers, once the kubelet API it carries listens.
    let (tunnel_stop, tunnel_stopped) = tokio::sync::watch::channel(false);
    let tunnel_link = cluster.as_ref().map(|c| crate::tunnel::ClusterLink {
        client: c.client.clone(),
        tokens: c.tokens.clone(),
    });
    let _tunnel = crate::tunnel::spawn(&config, tunnel_link, tunnel_stopped);
    let _pinger = notify.start();
    let stopping = notify.clone();
    let shutdown = async move {
        shutdown.await;
        stopping.stopping();
        // The tunnel's streams say DRAIN, so that the proxy servers route no new
        // connections to a node that is stopping.
        crate::tunnel::drain(&tunnel_stop).await;
    };
    SyncLoop::new(local.deps)
        .with_object_changes(objects_rx)
        .with_services_read(services_rx)
        .with_evictions(local.evictions)
        .with_node_shutdown(node_shutdown)
        .with_notify(notify)
        .run(initial, changes, local.exits, local.resyncs, shutdown)
        .await;
    let _ = std::fs::remove_file(root.dir.join(crate::control::SOCKET));
    root.store.flush()?;
    drop(cluster);
    log::info!("holdfast stopped; containers keep running");
    Ok(())
}
