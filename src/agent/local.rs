//! agent::local: the node's local services and what the sync loop runs with: container
//! exits, image pulls, the control socket, the kubelet API, the sync loop's deps (the
//! pods' sandboxes, the ConfigMap, Secret and Service caches, the node's allocatable), the pod
//! cgroups and node-pressure eviction. On a cluster node the kubelet API and the pods
//! share the cluster link's client, reports and caches.
//!
//! Wiring only: what each service does is its own module's.

use std::collections::BTreeMap;
use std::sync::Arc;

use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use tokio::sync::mpsc;

use super::cluster::Cluster;
use super::root::Root;
use crate::backoff::Backoff;
use crate::config::Config;
use crate::control::server::{self, Control};
use crate::image::registry::Puller;
use crate::image::service::ImageService;
use crate::node::allocatable::capacity_and_allocatable;
use crate::node::shutdown::ShuttingDown;
use crate::node::NodeFacts;
use crate::runtime::ContainerId;
use crate::store::Tree;
use crate::sync::{ContainerRecord, Deps, Eviction, PodStates};
use crate::uplink::objects::ObjectCache;
use crate::Error;

/// Container exits in flight to the sync loop.
const EXITS: usize = 64;
/// Resyncs asked for through the control socket, in flight.
const RESYNCS: usize = 4;

/// What the sync loop runs with, besides the pod sources.
pub struct Local {
    pub deps: Arc<Deps>,
    pub exits: mpsc::Receiver<ContainerId>,
    pub resyncs: mpsc::Receiver<()>,
    pub evictions: mpsc::Receiver<Eviction>,
}

/// Starts the local services.
pub async fn start(
    config: &Config,
    root: &Root,
    cluster: Option<&Cluster>,
    shutting_down: &ShuttingDown,
) -> Result<Local, Error> {
    let (exit_tx, exits) = mpsc::channel(EXITS);
    crate::runtime::Runtime::watch_exits(root.runtime.as_ref(), exit_tx)?;
    let (containers, podstates) = Deps::trees(&root.store)?;
    let in_use = crate::sync::NodeImages::new(&podstates)?;
    let images = crate::image::service::start(root.images.clone(), &config.images, in_use);
    let resyncs = control_socket(root, &podstates, &images, cluster);
    crate::server::start(
        config,
        &root.dir,
        &root.runtime,
        &podstates,
        cluster.map(|c| c.view.clone()),
        cluster.map(|c| c.client.clone()),
    )
    .await;
    let trees = (containers, podstates);
    let mut deps = deps(config, root, cluster, trees, images.puller).await?;
    deps.shutting_down = shutting_down.clone();
    let deps = Arc::new(deps);
    pod_cgroups(config, &deps).await;
    let evictions = evictions(config, &deps);
    Ok(Local {
        deps,
        exits,
        resyncs,
        evictions,
    })
}

/// The control socket `holdfast pods` and `image` reach a running agent through; the
/// resyncs it asks for.
fn control_socket(
    root: &Root,
    podstates: &PodStates,
    images: &ImageService,
    cluster: Option<&Cluster>,
) -> mpsc::Receiver<()> {
    let (resync_tx, resync_rx) = mpsc::channel(RESYNCS);
    let control = Arc::new(Control {
        images: root.images.clone(),
        podstates: podstates.clone(),
        resync: resync_tx,
        root_dir: root.dir.clone(),
        uplink: cluster.map(|c| c.view.clone()),
        puller: Some(images.puller.clone()),
        gc: Some(images.gc.clone()),
    });
    match server::bind(&root.dir) {
        Ok(listener) => {
            tokio::spawn(control.serve(listener));
        }
        Err(e) => log::warn!("control socket: {e}; `holdfast pods` will not reach this agent"),
    }
    resync_rx
}

/// What the sync loop's pod workers share.
async fn deps(
    config: &Config,
    root: &Root,
    cluster: Option<&Cluster>,
    (containers, podstates): (Tree<ContainerRecord>, PodStates),
    puller: Puller,
) -> Result<Deps, Error> {
    // Standalone, the cache is empty and static pods may not use it; a cluster node
    // reads what the uplink keeps, which is there after a reboot with no uplink.
    let objects = match cluster {
        Some(c) => c.objects.clone(),
        None => ObjectCache::open(&root.store).map_err(|e| Error::Cli(e.to_string()))?,
    };
    let allocatable = allocatable(config, &root.dir).await;
    let binary = std::env::current_exe().map_err(|source| Error::Io {
        context: "find own executable".into(),
        source,
    })?;
    let sandboxes = crate::sync::sandbox::Sandboxes::new(config, &allocatable, binary);
    Ok(Deps {
        runtime: root.runtime.clone(),
        images: root.images.clone(),
        store: root.store.clone(),
        containers,
        podstates,
        root_dir: root.dir.clone(),
        node_name: config.node_name.clone(),
        host_ip: config.node_address(),
        objects,
        services: cluster.map(|c| c.services.clone()),
        tokens: cluster.map(|c| c.tokens.clone()),
        allocatable,
        backoff: Backoff {
            initial: config.crash_loop.initial,
            max: config.crash_loop.max,
        },
        crash_loop_reset: config.crash_loop.reset,
        sync_frequency: config.sync_frequency,
        reporter: cluster.map(|c| c.reporter.clone()).unwrap_or_default(),
        puller: Some(puller),
        pull_backoff: Backoff {
            initial: config.images.pull_backoff_initial,
            max: config.images.pull_backoff_max,
        },
        offline_fallback: config.images.offline_fallback,
        sandboxes,
        shutting_down: ShuttingDown::default(),
    })
}

/// The kubelet's cgroup tree for the pods' QoS classes.
async fn pod_cgroups(config: &Config, deps: &Arc<Deps>) {
    let deps = deps.clone();
    match tokio::task::spawn_blocking(move || deps.sandboxes.ensure_qos()).await {
        Ok(Ok(())) => {}
        Ok(Err(e)) => log::error!("pod cgroups under {}: {e}", config.cgroup_root),
        Err(e) => log::error!("pod cgroups: {e}"),
    }
}

/// Node-pressure eviction. Disk pressure reclaims dead containers, then unused images,
/// before evicting.
fn evictions(config: &Config, deps: &Arc<Deps>) -> mpsc::Receiver<Eviction> {
    let images_gc: Box<dyn crate::eviction::reclaim::ImageGc> =
        match crate::sync::NodeImages::new(&deps.podstates) {
            Ok(in_use) => Box::new(crate::eviction::reclaim::StoreImageGc {
                images: deps.images.clone(),
                in_use,
                minimum_age: config.images.minimum_gc_age,
            }),
            Err(e) => {
                log::error!(
                    "disk pressure: read the pods' images: {e}; no image will be reclaimed"
                );
                Box::new(crate::eviction::reclaim::NoImageGc)
            }
        };
    crate::eviction::start(config, deps.clone(), images_gc)
}

/// The node's allocatable resources as its status reports them, which
/// `resourceFieldRef` gives a container without limits. Empty if the config cannot
/// describe the node (the uplink reports that).
async fn allocatable(config: &Config, root: &std::path::Path) -> BTreeMap<String, Quantity> {
    let input = match config.node_input() {
        Ok(i) => i,
        Err(e) => {
            log::warn!("node allocatable unknown ({e}): resourceFieldRef limits default to 0");
            return BTreeMap::new();
        }
    };
    let root = root.to_owned();
    let facts = tokio::task::spawn_blocking(move || NodeFacts::read(&root)).await;
    match facts {
        Ok(facts) => capacity_and_allocatable(&input, &facts, None).1,
        Err(e) => {
            log::warn!("read node facts: {e}: resourceFieldRef limits default to 0");
            BTreeMap::new()
        }
    }
}
