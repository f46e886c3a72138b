//! Starting the node's reports: the outbox, the ConfigMap and Secret cache and the
//! token manager at once (the pods use them offline), and the node, pod-status and
//! object manager threads as soon as the agent's one client is made (the pods run
//! meanwhile). Builds no client and starts no pod source: the agent hands it the
//! client's handle and the link, and routes the api source's pods through
//! [`Uplink::api_pods_tap`].

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Node, NodeStatus, Pod};
use serde_json::Value;
use tokio::sync::mpsc;

use super::node::{new_node_uid, NodeController, NodeLoop, NodeModel, Timing};
use super::node_status;
use super::objects::{
    pod_set, spawn_object_manager, ObjectCache, ObjectKey, PodSetReceiver, PodSetSender,
};
use super::pods::{MirrorSet, NodeUid, PodUplink, SharedMirrors};
use super::report::{Depth, Outbox, Reporter};
use super::tokens::TokenManager;
use crate::backoff::Backoff;
use crate::config::Config;
use crate::kube::client::Client;
use crate::kube::connect::SharedClient;
use crate::kube::link::{Link, LinkReport};
use crate::kube::rotation::ClientCertState;
use crate::node::facts::NodeFacts;
use crate::node::NodeInput;
use crate::store::Store;
use crate::time::Timestamp;

/// The running uplink, as the agent holds it.
pub struct Uplink {
    pub reporter: Reporter,
    /// Tells the object manager which pods the cluster has bound here (the api pods'
    /// tap takes it; dropping it stops the manager).
    pod_set: Option<PodSetSender>,
    /// The ConfigMaps and Secrets those pods reference, kept for offline use.
    pub objects: ObjectCache,
    /// The pods' service-account tokens, kept for offline use.
    pub tokens: TokenManager,
    pub mirrors: SharedMirrors,
    pub node_uid: NodeUid,
    /// The link and the outbox, for `holdfast status`.
    pub view: UplinkView,
    stop: Arc<AtomicBool>,
}

/// What `holdfast status` reads from a running uplink. Cheap to clone.
#[derive(Clone)]
pub struct UplinkView {
    pub link: Link,
    pub outbox: Outbox,
    /// The client certificate: until when, and why there is no working one.
    pub credentials: ClientCertState,
}

impl UplinkView {
    pub fn link(&self) -> LinkReport {
        self.link.report()
    }
    pub fn outbox(&self) -> Depth {
        self.outbox.depth_report()
    }
}

impl Drop for Uplink {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

/// The Node as the config and the device describe it.
pub struct DeviceModel {
    input: NodeInput,
    root_dir: std::path::PathBuf,
    lease_seconds: i32,
    /// The image store's index, for `status.images`.
    images: Option<crate::store::Tree<crate::image::ImageRecord>>,
}

impl DeviceModel {
    /// The node's images, as the kubelet lists them; none if the index cannot be read.
    fn images(&self) -> Vec<k8s_openapi::api::core::v1::ContainerImage> {
        let records: Vec<crate::image::ImageRecord> = match &self.images {
            Some(tree) => match tree.entries() {
                Ok(entries) => entries.into_iter().map(|(_, r)| r).collect(),
                Err(e) => {
                    log::warn!("node status: read the image index: {e}");
                    Vec::new()
                }
            },
            None => Vec::new(),
        };
        node_status::images(&records, node_status::MAX_IMAGES)
    }
}

impl NodeModel for DeviceModel {
    fn registration(&self, now: Timestamp) -> Node {
        let facts = NodeFacts::read(&self.root_dir);
        let mut node = node_status::registration_node(&self.input, &facts, now);
        if let Some(s) = node.status.as_mut() {
            s.images = Some(self.images());
        }
        node
    }
    fn status(&self, previous: Option<&NodeStatus>, now: Timestamp) -> NodeStatus {
        let facts = NodeFacts::read(&self.root_dir);
        let mut s = node_status::node_status(&self.input, &facts, previous, now);
        s.images = Some(self.images());
        s
    }
    fn status_patch(&self, old: Option<&NodeStatus>, new: &NodeStatus) -> Value {
        node_status::status_patch(old, new)
    }
    fn changed(&self, old: &NodeStatus, new: &NodeStatus) -> bool {
        node_status::needs_report(Some(old), new)
    }
    fn lease(&self, node_uid: &str, now: Timestamp) -> Lease {
        let uid = Some(node_uid).filter(|u| !u.is_empty());
        node_status::lease(&self.input.node_name, uid, self.lease_seconds, now)
    }
}

/// What the uplink is started with: the agent's, shared with the rest of it.
pub struct Cluster {
    /// The one client, once it is made.
    pub client: SharedClient,
    pub link: Link,
    /// The client certificate's state, which the connection and its rotation keep.
    pub credentials: ClientCertState,
    /// Set when the [`Uplink`] is dropped: every uplink thread ends.
    pub stop: Arc<AtomicBool>,
}

/// Starts the node's reports for a node with a kubeconfig: what the pods use offline at
/// once, the threads that talk to the apiserver once `cluster.client` is made. A
/// changed ConfigMap or Secret is told on `objects_changed`. A Node the config cannot
/// describe (a label NodeRestriction refuses, ...) is an error.
pub fn start(
    config: &Config,
    store: &Store,
    cluster: Cluster,
    objects_changed: mpsc::Sender<ObjectKey>,
) -> Result<Uplink, crate::Error> {
    let model = DeviceModel::of(config, store)?;
    let Cluster {
        client,
        link,
        credentials,
        stop,
    } = cluster;
    let (reporter, outbox) = Reporter::persistent(store, link.clone())?;
    let mirrors: SharedMirrors = Arc::new(std::sync::Mutex::new(MirrorSet::default()));
    let objects = ObjectCache::open(store).map_err(|e| crate::Error::Cli(e.to_string()))?;
    let tokens = TokenManager::open(store, Some(link.clone()))?;
    let (pod_set, wanted) = pod_set();
    let parts = Parts {
        config: config.clone(),
        model,
        objects: objects.clone(),
        tokens: tokens.clone(),
        wanted,
        objects_changed,
        link: link.clone(),
        outbox: outbox.clone(),
        node_uid: new_node_uid(),
        mirrors: mirrors.clone(),
        stop: stop.clone(),
    };
    let uplink = Uplink {
        reporter,
        pod_set: Some(pod_set),
        objects,
        tokens,
        mirrors,
        node_uid: parts.node_uid.clone(),
        view: UplinkView {
            link,
            outbox,
            credentials,
        },
        stop: stop.clone(),
    };
    let spawned = std::thread::Builder::new()
        .name("uplink-services".into())
        .spawn(move || {
            if let Some(client) = client.wait(&stop) {
                parts.run(client);
            }
        });
    if let Err(e) = spawned {
        log::error!("uplink: cannot start a thread: {e}; nothing is reported");
    }
    Ok(uplink)
}

impl Uplink {
    /// What the api source's pods pass through on their way to the mux, on the source's
    /// thread: the cluster's mirror pods are kept for the mirror check and taken out
    /// (they are not the node's to run), and the rest tell the object manager which
    /// ConfigMaps and Secrets to follow. `None` once taken.
    pub fn api_pods_tap(&mut self) -> Option<impl Fn(&mut Vec<Pod>) + Send + Sync + 'static> {
        let pod_set = self.pod_set.take()?;
        let mirrors = self.mirrors.clone();
        Some(move |pods: &mut Vec<Pod>| {
            super::pods::update_mirrors(&mirrors, pods);
            pods.retain(|p| !crate::pod::is_mirror(p));
            pod_set.set_pods(pods.iter());
        })
    }
}

impl DeviceModel {
    fn of(config: &Config, store: &Store) -> Result<DeviceModel, crate::Error> {
        Ok(DeviceModel {
            input: config.node_input().map_err(crate::Error::Node)?,
            root_dir: config.root_dir.clone(),
            lease_seconds: config.node_lease_duration_seconds,
            images: store
                .tree("images")
                .map_err(|e| log::warn!("node status: open the image index: {e}"))
                .ok(),
        })
    }
}

struct Parts {
    config: Config,
    model: DeviceModel,
    objects: ObjectCache,
    tokens: TokenManager,
    wanted: PodSetReceiver,
    objects_changed: mpsc::Sender<ObjectKey>,
    link: Link,
    outbox: Outbox,
    node_uid: NodeUid,
    mirrors: SharedMirrors,
    stop: Arc<AtomicBool>,
}

impl Parts {
    fn run(self, client: Client) {
        self.tokens.set_minter(Arc::new(client.clone()));
        let timing = Timing {
            renew: self.config.node_status_update_frequency,
            report: self.config.node_status_report_frequency,
            retry: Backoff {
                initial: super::pods::RETRY.initial,
                max: self.config.node_status_update_frequency,
            },
        };
        let node = NodeLoop {
            controller: NodeController::new(
                self.config.node_name.clone(),
                self.model,
                timing,
                self.node_uid.clone(),
            )
            .with_link(self.link.clone()),
            client: client.clone(),
            stop: self.stop.clone(),
        };
        if let Err(e) = node.spawn() {
            log::error!("uplink: cannot start the node thread: {e}");
        }
        let pods = PodUplink {
            client: client.clone(),
            outbox: self.outbox,
            node_name: self.config.node_name.clone(),
            node_uid: self.node_uid,
            mirrors: self.mirrors,
            stop: self.stop.clone(),
            link: self.link,
        };
        if let Err(e) = pods.spawn() {
            log::error!("uplink: cannot start the pod status thread: {e}");
        }
        if let Err(e) =
            spawn_object_manager(client, self.objects, self.wanted, self.objects_changed)
        {
            log::error!("uplink: cannot start the ConfigMap and Secret manager: {e}");
        }
    }
}
