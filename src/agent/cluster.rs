//! agent::cluster: the cluster link and its services, for a node with a kubeconfig. The
//! one apiserver client (made on a thread of its own once the kubeconfig can be used),
//! the link's state every user of it shares, and the uplink's services: what the pods
//! use offline (the outbox, the ConfigMap, Secret and Service caches, the tokens) at
//! once, the threads that talk to the apiserver (node, pod status, object manager,
//! Service reflector) once the client is made. The pods run meanwhile.
//!
//! Wiring only: what each service does is the uplink's and kube's.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use k8s_openapi::api::core::v1::Pod;
use tokio::sync::mpsc;

use crate::backoff::Backoff;
use crate::config::Config;
use crate::kube::cert_state::ClientCertState;
use crate::kube::connect::{Connect, SharedClient};
use crate::kube::link::{Link, Stage};
use crate::kube::Client;
use crate::node::shutdown::ShuttingDown;
use crate::store::Store;
use crate::systemd::Notify;
use crate::uplink::device::DeviceModel;
use crate::uplink::node::{new_node_uid, NodeController, NodeLoop, Timing};
use crate::uplink::objects::{pod_set, spawn_object_manager, ObjectCache, ObjectKey};
use crate::uplink::objects::{PodSetReceiver, PodSetSender};
use crate::uplink::pods::{self, MirrorSet, NodeUid, PodUplink, SharedMirrors};
use crate::uplink::report::Outbox;
use crate::uplink::services::{ServiceCache, ServiceReflector, ServiceReflectorOptions};
use crate::uplink::tokens::TokenManager;
use crate::uplink::{Reporter, UplinkView};
use crate::Error;

/// The running cluster link, as the agent holds it. Dropping it ends every thread of it.
pub struct Cluster {
    /// The one client, once it is made.
    pub client: SharedClient,
    pub reporter: Reporter,
    /// The ConfigMaps and Secrets the cluster's pods reference, kept for offline use.
    pub objects: ObjectCache,
    /// The cluster's Services, for containers' environments, kept for offline use.
    pub services: ServiceCache,
    /// The pods' service-account tokens, kept for offline use.
    pub tokens: TokenManager,
    /// The link, the outbox and the credentials, for `holdfast status` and metrics.
    pub view: UplinkView,
    /// Tells the object manager which pods the cluster has bound here; the api
    /// source's tap takes it.
    pod_set: Option<PodSetSender>,
    mirrors: SharedMirrors,
    stop: Arc<AtomicBool>,
}

impl Drop for Cluster {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

/// Where the cluster link tells the sync loop of changes its pods wait for.
pub struct Changes {
    /// A ConfigMap or Secret changed in the cache.
    pub objects: mpsc::Sender<ObjectKey>,
    /// The Services have been read (once per run).
    pub services_read: mpsc::Sender<()>,
}

/// Starts the cluster link if the config names a kubeconfig (or a bootstrap one), and
/// tells `changes`. A Node the config cannot describe (a label NodeRestriction
/// refuses, ...) is an error.
pub fn start(
    config: &Config,
    store: &Store,
    notify: &Notify,
    changes: Changes,
    shutting_down: &ShuttingDown,
) -> Result<Option<Cluster>, Error> {
    let Some(kubeconfig) = crate::kube::bootstrap::node_kubeconfig(config) else {
        return Ok(None);
    };
    let model = DeviceModel::of(config, store)?.with_shutdown(shutting_down.clone());
    let link = link(config);
    let stop = Arc::new(AtomicBool::new(false));
    let credentials = ClientCertState::published();
    let client = connect(config, kubeconfig, &credentials, &stop);
    let (reporter, outbox) = Reporter::persistent(store, link.clone())?;
    let objects = ObjectCache::open(store).map_err(|e| Error::Cli(e.to_string()))?;
    let service_cache = ServiceCache::open(store)?.with_link(link.clone());
    let tokens = TokenManager::open(store, Some(link.clone()))?;
    let (pod_set, wanted) = pod_set();
    let services = Services {
        config: config.clone(),
        model,
        objects: objects.clone(),
        tokens: tokens.clone(),
        services: service_cache.clone(),
        wanted,
        changes,
        link: link.clone(),
        outbox: outbox.clone(),
        node_uid: new_node_uid(),
        mirrors: Arc::new(Mutex::new(MirrorSet::default())),
        stop: stop.clone(),
    };
    let cluster = Cluster {
        client: client.clone(),
        reporter,
        objects,
        services: service_cache,
        tokens,
        view: UplinkView {
            link,
            outbox,
            credentials,
            client: client.clone(),
        },
        pod_set: Some(pod_set),
        mirrors: services.mirrors.clone(),
        stop,
    };
    services.spawn(client);
    tell_systemd(notify, &cluster.view.link);
    Ok(Some(cluster))
}

impl Cluster {
    /// What the api source's pods pass through on their way to the mux (see
    /// [`pods::api_pods_tap`]); `None` once taken.
    pub fn api_pods_tap(&mut self) -> Option<impl Fn(&mut Vec<Pod>) + Send + Sync + 'static> {
        let pod_set = self.pod_set.take()?;
        Some(pods::api_pods_tap(self.mirrors.clone(), pod_set))
    }

    /// Set when the agent stops.
    pub fn stop(&self) -> Arc<AtomicBool> {
        self.stop.clone()
    }
}

/// The link's state. While the link is down it is probed as often as a healthy node
/// renews its Lease (see `kube::link`): no more load than the node puts on the
/// apiserver when up, and the node notices the link is back within one renewal
/// interval, however long it was gone. `uplinkRetryMax` can only make that period
/// shorter.
fn link(config: &Config) -> Link {
    Link::new(
        config
            .node_status_update_frequency
            .min(config.uplink_retry_max),
    )
}

/// The one client, made on a thread of its own: its handle at once.
fn connect(
    config: &Config,
    kubeconfig: PathBuf,
    credentials: &ClientCertState,
    stop: &Arc<AtomicBool>,
) -> SharedClient {
    let client = SharedClient::new();
    let connect = Connect {
        config: config.clone(),
        kubeconfig,
        credentials: credentials.clone(),
        stop: stop.clone(),
    };
    if let Err(e) = connect.spawn(client.clone()) {
        log::error!("uplink: cannot start a thread: {e}; running standalone");
    }
    client
}

/// The link's stage in the service manager's status line.
fn tell_systemd(notify: &Notify, link: &Link) {
    let link = link.clone();
    notify.set_uplink(move || match link.stage() {
        Stage::Down => "uplink down",
        Stage::NodeReady => "uplink up, sending what waited",
        Stage::Drained => "uplink up",
    });
}

/// What the uplink's apiserver threads are started with, once the client is made.
struct Services {
    config: Config,
    model: DeviceModel,
    objects: ObjectCache,
    tokens: TokenManager,
    services: ServiceCache,
    wanted: PodSetReceiver,
    changes: Changes,
    link: Link,
    outbox: Outbox,
    node_uid: NodeUid,
    mirrors: SharedMirrors,
    stop: Arc<AtomicBool>,
}

impl Services {
    /// Waits for the client on a thread of its own, then starts the services.
    fn spawn(self, client: SharedClient) {
        let spawned = std::thread::Builder::new()
            .name("uplink-services".into())
            .spawn(move || {
                if let Some(client) = client.wait(&self.stop) {
                    self.start(client);
                }
            });
        if let Err(e) = spawned {
            log::error!("uplink: cannot start a thread: {e}; nothing is reported");
        }
    }

    fn start(self, client: Client) {
        let Services {
            config,
            model,
            objects,
            tokens,
            services,
            wanted,
            changes,
            link,
            outbox,
            node_uid,
            mirrors,
            stop,
        } = self;
        tokens.set_minter(Arc::new(client.clone()));
        let node = NodeLoop {
            controller: node_controller(&config, model, &node_uid).with_link(link.clone()),
            client: client.clone(),
            stop: stop.clone(),
        };
        if let Err(e) = node.spawn() {
            log::error!("uplink: cannot start the node thread: {e}");
        }
        let reflector = ServiceReflector {
            lister: client.clone(),
            cache: services,
            link: Some(link.clone()),
            stop: stop.clone(),
            read: Some(changes.services_read),
            options: ServiceReflectorOptions::default(),
        };
        if let Err(e) = reflector.spawn() {
            log::error!("uplink: cannot start the Service reflector: {e}");
        }
        let pods = PodUplink {
            client: client.clone(),
            outbox,
            node_name: config.node_name.clone(),
            node_uid,
            mirrors,
            stop,
            link,
        };
        if let Err(e) = pods.spawn() {
            log::error!("uplink: cannot start the pod status thread: {e}");
        }
        if let Err(e) = spawn_object_manager(client, objects, wanted, changes.objects) {
            log::error!("uplink: cannot start the ConfigMap and Secret manager: {e}");
        }
    }
}

/// The node controller (registration, Lease and node status) at the config's intervals.
fn node_controller(
    config: &Config,
    model: DeviceModel,
    node_uid: &NodeUid,
) -> NodeController<DeviceModel> {
    let timing = Timing {
        renew: config.node_status_update_frequency,
        report: config.node_status_report_frequency,
        retry: Backoff {
            initial: pods::RETRY.initial,
            max: config.node_status_update_frequency,
        },
    };
    NodeController::new(config.node_name.clone(), model, timing, node_uid.clone())
}
