//! agent: wires config, store, sources, sync loop and runtime together for `holdfast run`.

use std::collections::BTreeMap;
use std::future::Future;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use tokio::sync::mpsc;

use crate::backoff::Backoff;
use crate::config::Config;
use crate::control::server::{self, Control};
use crate::image::ImageStore;
use crate::node::allocatable::capacity_and_allocatable;
use crate::node::NodeFacts;
use crate::runtime::LibcontainerRuntime;
use crate::source::{self, Mux};
use crate::store::Store;
use crate::sync::{Deps, SyncLoop};
use crate::uplink::objects::ObjectCache;
use crate::Error;

/// Runs the agent until `shutdown` completes. Containers keep running afterwards.
pub async fn run(mut config: Config, shutdown: impl Future<Output = ()>) -> Result<(), Error> {
    // Before anything can fork: no shim, container or plugin may inherit NOTIFY_SOCKET.
    let notify = crate::systemd::Notify::from_env();
    // `cgroupRoot: delegated` settles the agent in its service's cgroup before any fork.
    config.cgroup_root = crate::runtime::delegation::settle(&config.cgroup_root)?;
    let root = prepare_root(&config.root_dir)?;
    config.root_dir = root.clone();
    let _lock = crate::control::presence::lock(&root, std::time::Duration::from_secs(2)).map_err(
        |source| Error::Io {
            context: "lock the root dir".into(),
            source,
        },
    )?;
    // What the agent sees of an unset clock outlives it within the boot.
    crate::time::remember_in(&root.join("clock"));
    let store = open_store(&root)?;
    let images = Arc::new(ImageStore::open(&root, &store)?);
    {
        let images = images.clone();
        let imported = tokio::task::spawn_blocking(move || images.import_dropins()).await;
        match imported {
            Ok(Ok(found)) if !found.is_empty() => {
                log::info!(
                    "imported {} image(s) from {}",
                    found.len(),
                    root.join("images").display()
                )
            }
            Ok(Ok(_)) => {}
            Ok(Err(e)) => log::error!("import images from {}: {e}", root.join("images").display()),
            Err(e) => log::error!("import images: {e}"),
        }
    }
    let runtime = Arc::new(
        LibcontainerRuntime::new(&root, &config.cgroup_root, None)?.with_log_limits(
            config.container_log_max_size,
            config.container_log_max_files,
        ),
    );

    if store.is_fresh() {
        // A new or moved-aside store: containers that still run tell whose they are.
        let rt = runtime.clone();
        let st = store.clone();
        match tokio::task::spawn_blocking(move || crate::sync::adopt::rebuild(&st, rt.as_ref()))
            .await
        {
            Ok(Ok(r)) if r.containers > 0 => log::warn!(
                "store rebuilt from running containers: {} container(s) of {} pod(s) adopted",
                r.containers,
                r.pods
            ),
            Ok(Ok(_)) => {}
            Ok(Err(e)) => log::error!("rebuild the store from running containers: {e}"),
            Err(e) => log::error!("rebuild the store from running containers: {e}"),
        }
    }

    let (mut mux, mut initial) = Mux::open(&store)?;
    let (snap_tx, mut snap_rx) = mpsc::channel(8);
    let snap_tx_api = snap_tx.clone();
    let known_file_pods = mux.source_pods(crate::pod::annotations::SOURCE_FILE);
    let (_, first_files) = source::spawn_file_source(
        config.static_pod_path.clone(),
        config.node_name.clone(),
        config.file_check_frequency,
        known_file_pods,
        snap_tx,
    )
    .map_err(|source| Error::Io {
        context: "start the file pod source".into(),
        source,
    })?;
    // The manifest folder is here and now: the pods to start are what it holds, not what
    // the store held (a manifest removed while the agent was down, or one whose rename a
    // power cut undid, is not started once before it is stopped). The api source's
    // pods stay as stored until the apiserver speaks.
    if let Some(first) = first_files {
        mux.apply(first)?;
        initial = mux.desired();
    }
    // With a kubeconfig, one client for the apiserver, made once the kubeconfig can be
    // used; pods the cluster binds to this node join the file source's, and mirror pods
    // (the cluster's view of our static pods) go to the uplink instead.
    // A changed ConfigMap or Secret resyncs the pods that reference it.
    let (objects_tx, objects_rx) = mpsc::channel(16);
    let mut uplink = None;
    let mut client = None;
    if let Some(kubeconfig) = crate::kube::bootstrap::node_kubeconfig(&config) {
        let cluster = cluster(&config, kubeconfig);
        let shared = cluster.client.clone();
        let stop = cluster.stop.clone();
        let link = cluster.link.clone();
        let mut u = crate::uplink::start::start(&config, &store, cluster, objects_tx)?;
        notify.set_uplink(move || match link.stage() {
            crate::kube::Stage::Down => "uplink down",
            crate::kube::Stage::NodeReady => "uplink up, sending what waited",
            crate::kube::Stage::Drained => "uplink up",
        });
        let api = ApiSource {
            pods: mux.source_pods(crate::pod::annotations::SOURCE_API),
            resource_version: mux.resource_version(crate::pod::annotations::SOURCE_API),
            link: u.view.link.clone(),
            tap: u.api_pods_tap().map(|t| -> source::PodTap { Arc::new(t) }),
            tx: snap_tx_api,
        };
        api.start(&config.node_name, shared.clone(), stop);
        uplink = Some(u);
        client = Some(shared);
    }
    let reporter = uplink
        .as_ref()
        .map(|u| u.reporter.clone())
        .unwrap_or_default();
    let (change_tx, change_rx) = mpsc::channel(64);
    tokio::spawn(async move {
        while let Some(snapshot) = snap_rx.recv().await {
            let (back, result) = match tokio::task::spawn_blocking(move || {
                let r = mux.apply(snapshot);
                (mux, r)
            })
            .await
            {
                Ok(v) => v,
                Err(e) => {
                    log::error!("pod source mux stopped: {e}");
                    return;
                }
            };
            mux = back;
            match result {
                Ok(changes) => {
                    for c in changes {
                        if change_tx.send(c).await.is_err() {
                            return;
                        }
                    }
                }
                Err(e) => log::error!("pod sources: {e}"),
            }
        }
    });

    let (exit_tx, exit_rx) = mpsc::channel(64);
    crate::runtime::Runtime::watch_exits(runtime.as_ref(), exit_tx)?;

    let (containers, podstates) = Deps::trees(&store)?;
    let puller = crate::image::service::start(images.clone(), &config.images, podstates.clone());
    let (resync_tx, resync_rx) = mpsc::channel(4);
    let control = Arc::new(Control {
        images: images.clone(),
        podstates: podstates.clone(),
        resync: resync_tx,
        root_dir: root.clone(),
        uplink: uplink.as_ref().map(|u| u.view.clone()),
        puller: Some(puller.clone()),
    });
    match server::bind(&root) {
        Ok(listener) => {
            tokio::spawn(control.serve(listener));
        }
        Err(e) => log::warn!("control socket: {e}; `holdfast pods` will not reach this agent"),
    }

    crate::server::start(
        &config,
        &root,
        &runtime,
        &podstates,
        uplink.as_ref().map(|u| u.view.clone()),
        client,
    )
    .await;

    // Standalone, the cache is empty and static pods may not use it; a cluster node
    // reads what the uplink keeps, which is there after a reboot with no uplink.
    let objects = match uplink.as_ref() {
        Some(u) => u.objects.clone(),
        None => ObjectCache::open(&store).map_err(|e| Error::Cli(e.to_string()))?,
    };
    let allocatable = allocatable(&config, &root).await;
    let binary = std::env::current_exe().map_err(|source| Error::Io {
        context: "find own executable".into(),
        source,
    })?;
    let sandboxes = crate::sync::sandbox::Sandboxes::new(&config, &allocatable, binary);
    let deps = Deps {
        runtime,
        images,
        store: store.clone(),
        containers,
        podstates,
        root_dir: root.clone(),
        node_name: config.node_name.clone(),
        host_ip: config.node_address(),
        objects,
        tokens: uplink.as_ref().map(|u| u.tokens.clone()),
        allocatable,
        backoff: Backoff {
            initial: config.crash_loop.initial,
            max: config.crash_loop.max,
        },
        crash_loop_reset: config.crash_loop.reset,
        sync_frequency: config.sync_frequency,
        reporter,
        puller: Some(puller),
        pull_backoff: Backoff {
            initial: config.images.pull_backoff_initial,
            max: config.images.pull_backoff_max,
        },
        offline_fallback: config.images.offline_fallback,
        sandboxes,
    };
    let deps = Arc::new(deps);
    {
        let deps = deps.clone();
        match tokio::task::spawn_blocking(move || deps.sandboxes.ensure_qos()).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => log::error!("pod cgroups under {}: {e}", config.cgroup_root),
            Err(e) => log::error!("pod cgroups: {e}"),
        }
    }
    // Disk pressure reclaims dead containers, then unused images, before evicting.
    let images_gc = Box::new(crate::eviction::reclaim::StoreImageGc {
        images: deps.images.clone(),
        podstates: deps.podstates.clone(),
        minimum_age: config.images.minimum_gc_age,
    });
    let evictions = crate::eviction::start(&config, deps.clone(), images_gc);
    log::info!(
        "holdfast {} running as node {} (root {}, manifests {})",
        crate::VERSION,
        config.node_name,
        root.display(),
        config.static_pod_path.display()
    );
    let _pinger = notify.start();
    let stopping = notify.clone();
    let shutdown = async move {
        shutdown.await;
        stopping.stopping();
    };
    SyncLoop::new(deps)
        .with_object_changes(objects_rx)
        .with_evictions(evictions)
        .with_notify(notify)
        .run(initial, change_rx, exit_rx, resync_rx, shutdown)
        .await;
    let _ = std::fs::remove_file(root.join(crate::control::SOCKET));
    store.flush()?;
    drop(uplink);
    log::info!("holdfast stopped; containers keep running");
    Ok(())
}

/// The cluster link: the one client, made on a thread of its own once the node's
/// kubeconfig can be used, and the link's state every user of it shares.
fn cluster(config: &Config, kubeconfig: PathBuf) -> crate::uplink::start::Cluster {
    // While the link is down it is probed as often as a healthy node renews its Lease
    // (see `kube::link`): no more load than the node puts on the apiserver when up, and
    // the node notices the link is back within one renewal interval, however long it
    // was gone. `uplinkRetryMax` can only make that period shorter.
    let link = crate::kube::Link::new(
        config
            .node_status_update_frequency
            .min(config.uplink_retry_max),
    );
    let cluster = crate::uplink::start::Cluster {
        client: crate::kube::connect::SharedClient::new(),
        link,
        credentials: crate::kube::rotation::ClientCertState::published(),
        stop: Arc::new(std::sync::atomic::AtomicBool::new(false)),
    };
    let connect = crate::kube::connect::Connect {
        config: config.clone(),
        kubeconfig,
        credentials: cluster.credentials.clone(),
        stop: cluster.stop.clone(),
    };
    if let Err(e) = connect.spawn(cluster.client.clone()) {
        log::error!("uplink: cannot start a thread: {e}; running standalone");
    }
    cluster
}

/// The api pod source, started once the client is made: what the store kept of it
/// (its pods and where they were, so that it resumes its watch there after a restart),
/// the link it follows, and the mux it sends to.
struct ApiSource {
    pods: Vec<k8s_openapi::api::core::v1::Pod>,
    resource_version: Option<String>,
    link: crate::kube::Link,
    tap: Option<source::PodTap>,
    tx: mpsc::Sender<source::SourceSnapshot>,
}

impl ApiSource {
    fn start(
        self,
        node_name: &str,
        client: crate::kube::connect::SharedClient,
        stop: Arc<std::sync::atomic::AtomicBool>,
    ) {
        let node_name = node_name.to_owned();
        let spawned = std::thread::Builder::new()
            .name("source-api-start".into())
            .spawn(move || {
                let Some(client) = client.wait(&stop) else {
                    return;
                };
                let options = source::ApiSourceOptions {
                    known_pods: self.pods.len(),
                    ..source::ApiSourceOptions::default()
                };
                let resume = source::ApiSourceResume {
                    link: Some(self.link),
                    pods: self.pods,
                    resource_version: self.resource_version,
                    tap: self.tap,
                };
                if let Err(e) =
                    source::spawn_api_source(client, node_name, options, resume, self.tx)
                {
                    log::error!("uplink: cannot start the pod source: {e}");
                }
            });
        if let Err(e) = spawned {
            log::error!("uplink: cannot start the pod source: {e}");
        }
    }
}

/// The first stage: the root dir made private (0700, narrowed from a wider mode) and
/// resolved, with the folders the agent writes to first. Returns it resolved.
fn prepare_root(root: &Path) -> Result<PathBuf, Error> {
    // Containers' files live below the root dir: no other user of the host may reach it.
    match crate::runtime::root_dir::secure(root) {
        Ok(Some(mode)) => log::warn!(
            "root dir {} was mode {mode:04o}, reachable by other users of the host: now 0700",
            root.display()
        ),
        Ok(None) => {}
        Err(source) => {
            return Err(Error::Io {
                context: format!("create {} with mode 0700", root.display()),
                source,
            })
        }
    }
    // A config not made by `config::load` (tests, embedders) may name it otherwise.
    let root = std::fs::canonicalize(root).map_err(|source| Error::Io {
        context: format!("resolve {}", root.display()),
        source,
    })?;
    for dir in [root.join("images"), root.join("logs")] {
        crate::runtime::root_dir::create_private(&dir).map_err(|source| Error::Io {
            context: format!("create {}", dir.display()),
            source,
        })?;
    }
    Ok(root)
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

/// Quarantines one tree's undecodable records; returns how many.
type TreeCheck = fn(&Store, &'static str) -> Result<usize, crate::store::StoreError>;

/// Opens the store under `root`, moving a broken one aside (see
/// [`crate::store::recover`]), and quarantines records that no longer decode.
fn open_store(root: &std::path::Path) -> Result<Store, Error> {
    let opened = crate::store::recover::open_or_recover(&root.join("db"))?;
    let store = opened.store;
    let checks: [(&'static str, TreeCheck); 6] = [
        (crate::source::PODS_TREE, |s, n| {
            s.quarantine_undecodable::<crate::source::DesiredPod>(n)
        }),
        ("containers", |s, n| {
            s.quarantine_undecodable::<crate::sync::ContainerRecord>(n)
        }),
        ("podstates", |s, n| {
            s.quarantine_undecodable::<crate::sync::PodState>(n)
        }),
        (crate::uplink::objects::TREE_CONFIG_MAPS, |s, n| {
            s.quarantine_undecodable::<k8s_openapi::api::core::v1::ConfigMap>(n)
        }),
        (crate::uplink::objects::TREE_SECRETS, |s, n| {
            s.quarantine_undecodable::<k8s_openapi::api::core::v1::Secret>(n)
        }),
        ("*images", |s, _| {
            crate::image::ImageStore::quarantine_undecodable(s)
        }),
    ];
    let mut bad = 0;
    for (name, check) in checks {
        match check(&store, name) {
            Ok(n) => bad += n,
            Err(e) => log::error!("store integrity check of {name}: {e}"),
        }
    }
    if bad > 0 {
        log::error!(
            "store: {bad} record(s) did not decode and were moved to tree {}",
            crate::store::recover::QUARANTINE
        );
        store.flush()?;
    }
    if !store.is_fresh() && store.needs_compaction()? {
        let path = store.path().to_path_buf();
        drop(store);
        let c = crate::store::compact::compact(&path)?;
        log::warn!(
            "store compacted at start: {} -> {} bytes on disk",
            c.before,
            c.after
        );
        return Ok(Store::open(&path)?);
    }
    Ok(store)
}
