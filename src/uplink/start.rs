//! Starting the uplink: reads the kubeconfig (again and again, with back-off, until it
//! is usable — the pods run meanwhile) and then starts the node, pod-status and pod
//! source threads.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Node, NodeStatus};
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
use crate::kube::link::{Link, LinkReport};
use crate::kube::rotation::{ClientCertState, Rotation};
use crate::node::facts::NodeFacts;
use crate::node::NodeInput;
use crate::source::{ApiSourceResume, SourceSnapshot};
use crate::store::Store;
use crate::time::Timestamp;

/// How often a kubeconfig that cannot be used is read again, at most.
const RELOAD: Backoff = Backoff {
    initial: Duration::from_secs(2),
    max: Duration::from_secs(300),
};

/// The running uplink, as the agent holds it.
pub struct Uplink {
    pub reporter: Reporter,
    /// Tells the object manager which pods the cluster has bound here (the agent
    /// takes it; dropping it stops the manager).
    pub pod_set: Option<PodSetSender>,
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

/// What the store kept of the api source: its pods and where they were, so the source
/// resumes its watch there after a restart.
#[derive(Debug, Clone, Default)]
pub struct ApiSeed {
    pub pods: Vec<k8s_openapi::api::core::v1::Pod>,
    pub resource_version: Option<String>,
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

/// Starts the uplink if the config names a kubeconfig. Cluster pods arrive on
/// `api_pods` (mirror pods included: the caller sorts them out); `seed` is what the
/// store holds from the api source. A Node the config cannot describe (a label
/// NodeRestriction refuses, ...) is an error.
pub fn start(
    config: &Config,
    store: &Store,
    seed: ApiSeed,
    api_pods: mpsc::Sender<SourceSnapshot>,
    objects_changed: mpsc::Sender<ObjectKey>,
) -> Result<Option<Uplink>, crate::Error> {
    let Some(kubeconfig) = crate::kube::bootstrap::node_kubeconfig(config) else {
        return Ok(None);
    };
    let model = DeviceModel {
        input: config.node_input().map_err(crate::Error::Node)?,
        root_dir: config.root_dir.clone(),
        lease_seconds: config.node_lease_duration_seconds,
        images: store
            .tree("images")
            .map_err(|e| log::warn!("node status: open the image index: {e}"))
            .ok(),
    };
    // While the link is down it is probed as often as a healthy node renews its Lease
    // (see `link`): no more load than the node puts on the apiserver when up, and the
    // node notices the link is back within one renewal interval, however long it was
    // gone. `uplinkRetryMax` can only make that period shorter.
    let link = Link::new(
        config
            .node_status_update_frequency
            .min(config.uplink_retry_max),
    );
    let (reporter, outbox) = Reporter::persistent(store, link.clone())?;
    let stop = Arc::new(AtomicBool::new(false));
    let node_uid = new_node_uid();
    let mirrors: SharedMirrors = Arc::new(std::sync::Mutex::new(MirrorSet::default()));
    let objects = ObjectCache::open(store).map_err(|e| crate::Error::Cli(e.to_string()))?;
    let tokens = TokenManager::open(store, Some(link.clone()))?;
    let (pod_set, wanted) = pod_set();
    let credentials = ClientCertState::published();
    let uplink = Uplink {
        reporter,
        pod_set: Some(pod_set),
        objects: objects.clone(),
        tokens: tokens.clone(),
        mirrors: mirrors.clone(),
        node_uid: node_uid.clone(),
        view: UplinkView {
            link: link.clone(),
            outbox: outbox.clone(),
            credentials: credentials.clone(),
        },
        stop: stop.clone(),
    };
    let parts = Parts {
        config: config.clone(),
        model,
        objects,
        tokens,
        wanted,
        objects_changed,
        seed,
        link,
        outbox,
        node_uid,
        mirrors,
        stop,
        api_pods,
        credentials,
    };
    let spawned = std::thread::Builder::new()
        .name("uplink-start".into())
        .spawn(move || parts.run(&kubeconfig));
    if let Err(e) = spawned {
        log::error!("uplink: cannot start a thread: {e}; running standalone");
        return Ok(None);
    }
    Ok(Some(uplink))
}

struct Parts {
    config: Config,
    model: DeviceModel,
    objects: ObjectCache,
    tokens: TokenManager,
    wanted: PodSetReceiver,
    objects_changed: mpsc::Sender<ObjectKey>,
    seed: ApiSeed,
    link: Link,
    outbox: Outbox,
    node_uid: NodeUid,
    mirrors: SharedMirrors,
    stop: Arc<AtomicBool>,
    api_pods: mpsc::Sender<SourceSnapshot>,
    credentials: ClientCertState,
}

impl Parts {
    fn run(self, kubeconfig: &std::path::Path) {
        let mut failures = 0u32;
        let mut last_error = String::new();
        let client = loop {
            if self.stop.load(Ordering::Relaxed) {
                return;
            }
            // With a bootstrap kubeconfig this also asks the cluster for the node's
            // client certificate, waiting for the signer; the pods run meanwhile.
            match crate::kube::bootstrap::connect(&self.config, kubeconfig, &self.credentials) {
                Ok(c) => break c,
                Err(e) => {
                    let msg = e.message;
                    if msg != last_error {
                        log::error!(
                            "{msg}; pods keep running, the kubeconfig is read again with back-off"
                        );
                        last_error = msg;
                    }
                    if wait_for_clock(&self.stop) {
                        // The certificates looked not yet valid to a clock that was not
                        // set: read the file again now that it is, not after a back-off
                        // that grew while the board was in 1970.
                        continue;
                    }
                    failures = failures.saturating_add(1);
                    let wait = RELOAD.jittered(failures, crate::backoff::random());
                    sleep_unless_stopped(&self.stop, wait.max(RELOAD.initial));
                }
            }
        };
        log::info!("uplink: apiserver {}", client.server());
        self.start_rotation(&client);
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
            link: self.link.clone(),
        };
        if let Err(e) = pods.spawn() {
            log::error!("uplink: cannot start the pod status thread: {e}");
        }
        if let Err(e) = spawn_object_manager(
            client.clone(),
            self.objects,
            self.wanted,
            self.objects_changed,
        ) {
            log::error!("uplink: cannot start the ConfigMap and Secret manager: {e}");
        }
        if let Err(e) = crate::source::spawn_api_source(
            client,
            self.config.node_name.clone(),
            crate::source::ApiSourceOptions {
                known_pods: self.seed.pods.len(),
                ..crate::source::ApiSourceOptions::default()
            },
            ApiSourceResume {
                link: Some(self.link),
                pods: self.seed.pods,
                resource_version: self.seed.resource_version,
            },
            self.api_pods,
        ) {
            log::error!("uplink: cannot start the pod source: {e}");
        }
    }
}

impl Parts {
    /// With `rotateCertificates` and a client certificate from the bootstrap, the thread
    /// that renews it before it expires.
    fn start_rotation(&self, client: &Client) {
        let Some(bootstrap) = self.config.bootstrap_kubeconfig.clone() else {
            return;
        };
        if !self.config.rotate_certificates || client.client_certificate_validity().is_none() {
            return;
        }
        let rotation = Rotation {
            client: client.clone(),
            files: crate::kube::bootstrap::client_pair_files(&self.config),
            node_name: self.config.node_name.clone(),
            bootstrap: Some(bootstrap),
            state: self.credentials.clone(),
            stop: self.stop.clone(),
        };
        if let Err(e) = rotation.spawn() {
            log::error!("uplink: cannot start the certificate rotation thread: {e}");
        }
    }
}

/// Waits while the wall clock is not set (reading the local clock only); true if it
/// had to wait.
fn wait_for_clock(stop: &AtomicBool) -> bool {
    let mut waited = false;
    while !stop.load(Ordering::Relaxed) && !crate::time::clock_is_sane() {
        waited = true;
        std::thread::sleep(Duration::from_millis(500));
    }
    waited
}

fn sleep_unless_stopped(stop: &AtomicBool, total: Duration) {
    let deadline = std::time::Instant::now() + total;
    while !stop.load(Ordering::Relaxed) {
        let now = std::time::Instant::now();
        if now >= deadline {
            return;
        }
        std::thread::sleep((deadline - now).min(Duration::from_millis(500)));
    }
}
