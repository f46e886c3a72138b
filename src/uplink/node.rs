//! The node side of the uplink: registers the Node (taking over one that exists), renews
//! the Lease every `nodeStatusUpdateFrequency` and sends the full node status only when
//! it changed or every `nodeStatusReportFrequency` — virtual-kubelet's node controller,
//! with the kubelet's intervals. A Node deleted under a running agent is made again:
//! the garbage collector deletes the Lease of a deleted Node within a second or two (its
//! ownerReference names the Node's UID), so the next renewal's 409 or 404 is the sign,
//! checked with one GET of the Node; no watch of the Node costs a request meanwhile.
//!
//! The controller is a state machine stepped on a clock it is given, so its schedule is
//! tested on a virtual clock; [`NodeLoop`] runs it on its own thread.
//!
//! It is the uplink's only prober while the apiserver does not answer: it probes on the
//! [`Link`]'s schedule (once per renewal interval), and a successful Lease renewal and
//! node status move the link to `NodeReady`, which lets the pod-status thread drain the
//! outbox. The first status after an outage is computed against the Node as the
//! apiserver has it (one GET): the node controller set Ready to `Unknown` meanwhile,
//! and a patch of heartbeat times alone would leave it there.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Node, NodeStatus};
use serde_json::Value;

use super::pods::NodeUid;
use crate::backoff::Backoff;
use crate::kube::client::{Client, Patch};
use crate::kube::error::ApiError;
use crate::kube::link::Link;
use crate::time::Timestamp;

/// The calls the controller makes; [`Client`] makes them over HTTP.
pub trait NodeApi {
    fn create_node(&self, node: &Node) -> Result<Node, ApiError>;
    fn get_node(&self, name: &str) -> Result<Node, ApiError>;
    fn patch_node(&self, name: &str, body: &Value) -> Result<Node, ApiError>;
    fn patch_node_status(&self, name: &str, body: &Value) -> Result<Node, ApiError>;
    fn get_lease(&self, name: &str) -> Result<Lease, ApiError>;
    fn create_lease(&self, lease: &Lease) -> Result<Lease, ApiError>;
    /// Makes the Lease `held` (as last read or written) into `wanted`.
    fn update_lease(&self, held: &Lease, wanted: &Lease) -> Result<Lease, ApiError>;
    /// The link is back after an outage: connections from before are not to be
    /// trusted (see [`Client::reset_connections`]).
    fn reconnected(&self) {}
}

const LEASE_NS: &str = "kube-node-lease";

use crate::kube::link::MIN_RETRY;

impl NodeApi for Client {
    fn create_node(&self, node: &Node) -> Result<Node, ApiError> {
        self.post("/api/v1/nodes", node)
    }
    fn get_node(&self, name: &str) -> Result<Node, ApiError> {
        self.get(&format!("/api/v1/nodes/{}", crate::kube::escape(name)))
    }
    fn patch_node(&self, name: &str, body: &Value) -> Result<Node, ApiError> {
        self.patch(
            &format!("/api/v1/nodes/{}", crate::kube::escape(name)),
            Patch::Strategic,
            body,
        )
    }
    fn patch_node_status(&self, name: &str, body: &Value) -> Result<Node, ApiError> {
        self.patch(
            &format!("/api/v1/nodes/{}/status", crate::kube::escape(name)),
            Patch::Strategic,
            body,
        )
    }
    fn get_lease(&self, name: &str) -> Result<Lease, ApiError> {
        self.get(&format!(
            "/apis/coordination.k8s.io/v1/namespaces/{LEASE_NS}/leases/{}",
            crate::kube::escape(name)
        ))
    }
    fn create_lease(&self, lease: &Lease) -> Result<Lease, ApiError> {
        self.post(
            &format!("/apis/coordination.k8s.io/v1/namespaces/{LEASE_NS}/leases"),
            lease,
        )
    }
    fn reconnected(&self) {
        self.reset_connections();
    }
    fn update_lease(&self, held: &Lease, wanted: &Lease) -> Result<Lease, ApiError> {
        let name = held.metadata.name.as_deref().unwrap_or_default();
        self.patch(
            &format!(
                "/apis/coordination.k8s.io/v1/namespaces/{LEASE_NS}/leases/{}",
                crate::kube::escape(name)
            ),
            Patch::Merge,
            &super::lease::renewal_patch(held, wanted),
        )
    }
}

/// What the Node looks like: the object to register and its current status.
pub trait NodeModel {
    fn registration(&self, now: Timestamp) -> Node;
    fn status(&self, previous: Option<&NodeStatus>, now: Timestamp) -> NodeStatus;
    /// The strategic-merge body that turns `old` into `new`.
    fn status_patch(&self, old: Option<&NodeStatus>, new: &NodeStatus) -> Value;
    /// Whether `new` differs from `old` beyond heartbeat times.
    fn changed(&self, old: &NodeStatus, new: &NodeStatus) -> bool;
    fn lease(&self, node_uid: &str, now: Timestamp) -> Lease;
    /// Whether the status is to be looked at now rather than on schedule (the node
    /// began shutting down). Asked once a second at most.
    fn report_now(&self) -> bool {
        false
    }
}

/// Intervals, from the config.
#[derive(Debug, Clone, Copy)]
pub struct Timing {
    /// Lease renewal and status check: `nodeStatusUpdateFrequency`, 10 s.
    pub renew: Duration,
    /// Full status at least this often: `nodeStatusReportFrequency`, 5 min.
    pub report: Duration,
    /// Retry pacing after a refusal (full jitter, never longer than `renew`); a dead
    /// link is probed on the [`Link`]'s schedule instead.
    pub retry: Backoff,
}

pub struct NodeController<M: NodeModel> {
    name: String,
    model: M,
    timing: Timing,
    node_uid: NodeUid,
    registered: bool,
    lease: Option<Lease>,
    reported: Option<NodeStatus>,
    reported_at: Option<Instant>,
    /// The link was down: read the Node before the next status (the node controller
    /// may have marked it `Unknown`).
    reread_node: bool,
    next_renew: Option<Instant>,
    failures: u32,
    /// The last error, logged once until something changes.
    last_error: Option<String>,
    link: Link,
}

impl<M: NodeModel> NodeController<M> {
    pub fn new(name: String, model: M, timing: Timing, node_uid: NodeUid) -> Self {
        NodeController {
            name,
            model,
            timing,
            node_uid,
            registered: false,
            lease: None,
            reported: None,
            reported_at: None,
            reread_node: false,
            next_renew: None,
            failures: 0,
            last_error: None,
            link: Link::new(timing.renew),
        }
    }

    /// Probes and reports on `link` (shared with the other uplink threads) instead of
    /// a link of its own.
    pub fn with_link(mut self, link: Link) -> Self {
        self.link = link;
        self
    }

    /// The link this controller probes; the pod-status thread and the pod source wait
    /// on it.
    pub fn link(&self) -> Link {
        self.link.clone()
    }

    /// Brings the next status check forward to now if the model asks for it; whether
    /// it did.
    pub fn wants_report(&mut self) -> bool {
        if self.model.report_now() {
            self.next_renew = None;
            return true;
        }
        false
    }

    pub fn is_registered(&self) -> bool {
        self.registered
    }

    /// Does what is due at `now` and returns when to step again. `random` feeds the
    /// retry jitter.
    pub fn step(
        &mut self,
        api: &dyn NodeApi,
        now: Instant,
        wall: Timestamp,
        random: u64,
    ) -> Instant {
        // The Lease and the node's heartbeats carry the wall time: from a clock that is
        // not set they would tell the cluster 1970, and a renewTime older than the last
        // renews nothing. They wait for the clock, on the usual schedule.
        if !crate::time::is_sane(wall) {
            return now + self.timing.renew;
        }
        let reconnecting = self.link.is_down() && self.link.report().ever_up;
        if self.link.is_down() {
            // Back from an outage (or another thread saw one): the cluster may have
            // marked the node Unknown meanwhile, so full status goes right after the
            // Lease, whether or not it changed, against the Node as it is now.
            self.reported_at = None;
            self.reread_node = true;
            self.next_renew = None;
        }
        match self.try_step(api, now, wall) {
            Ok(next) => {
                if self.failures > 0 || self.last_error.is_some() {
                    log::info!("node {}: apiserver answers again", self.name);
                }
                self.failures = 0;
                self.last_error = None;
                if reconnecting {
                    // Before the other threads go: their requests use fresh
                    // connections, and the watches left on old ones are opened again.
                    api.reconnected();
                }
                self.link.node_ready(now, wall);
                next
            }
            Err(e) => {
                self.failures = self.failures.saturating_add(1);
                let msg = e.to_string();
                if self.last_error.as_deref() != Some(msg.as_str()) {
                    if e.is_forbidden() {
                        log::error!(
                            "node {}: the apiserver refuses: {msg} (check the node's credentials and labels)",
                            self.name
                        );
                    } else {
                        log::warn!("node {}: {msg}; retrying", self.name);
                    }
                    self.last_error = Some(msg);
                }
                if e.is_transient() {
                    // The link is down: probe again on the link's schedule.
                    return now + self.link.probe_failed(now, wall, random);
                }
                // The apiserver answers but refuses (a conflict, a forbidden label): the
                // link itself is up, and the pod statuses and the pod source must not
                // wait on what only an operator can fix. Retry on the renewal schedule.
                self.link.node_ready(now, wall);
                let delay = self
                    .timing
                    .retry
                    .jittered(self.failures, random)
                    .clamp(MIN_RETRY, self.timing.renew.max(MIN_RETRY));
                now + delay
            }
        }
    }

    fn try_step(
        &mut self,
        api: &dyn NodeApi,
        now: Instant,
        wall: Timestamp,
    ) -> Result<Instant, ApiError> {
        if !self.registered {
            self.register(api, now, wall)?;
        }
        let renew_due = self.next_renew.is_none_or(|t| now >= t);
        if renew_due {
            self.renew_lease(api, wall)?;
            self.next_renew = Some(now + self.timing.renew);
            if self.reread_node && self.registered {
                self.reread(api)?;
                if !self.registered {
                    // Someone made the Node again: take it over, and own the Lease by
                    // the UID it has now.
                    self.register(api, now, wall)?;
                    self.renew_lease(api, wall)?;
                    self.next_renew = Some(now + self.timing.renew);
                }
            }
            self.report_status(api, now, wall)?;
        }
        Ok(self.next_renew.unwrap_or(now + self.timing.renew))
    }

    fn register(
        &mut self,
        api: &dyn NodeApi,
        now: Instant,
        wall: Timestamp,
    ) -> Result<(), ApiError> {
        let node = self.model.registration(wall);
        let uid = match api.create_node(&node) {
            Ok(created) => {
                log::info!("node {} registered", self.name);
                self.reported = created.status.clone();
                self.reported_at = Some(now);
                self.reread_node = false;
                created.metadata.uid
            }
            Err(e) if e.is_already_exists() => {
                let existing = api.get_node(&self.name)?;
                log::info!("node {} exists; taking it over", self.name);
                // Labels and annotations the agent sets are brought up to date; others
                // (set by an operator) are left alone.
                let wanted_labels = node.metadata.labels.clone().unwrap_or_default();
                let have = existing.metadata.labels.clone().unwrap_or_default();
                if wanted_labels.iter().any(|(k, v)| have.get(k) != Some(v)) {
                    api.patch_node(
                        &self.name,
                        &serde_json::json!({"metadata": {"labels": wanted_labels}}),
                    )?;
                }
                self.reported = existing.status.clone();
                self.reported_at = None;
                self.reread_node = false;
                existing.metadata.uid
            }
            Err(e) => return Err(e),
        };
        *self.node_uid.lock().unwrap_or_else(|p| p.into_inner()) = uid;
        self.registered = true;
        self.lease = None;
        self.next_renew = None;
        Ok(())
    }

    fn node_uid(&self) -> String {
        self.node_uid
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
            .unwrap_or_default()
    }

    fn renew_lease(&mut self, api: &dyn NodeApi, wall: Timestamp) -> Result<(), ApiError> {
        let fresh = self.model.lease(&self.node_uid(), wall);
        let current = match self.lease.take() {
            Some(l) => Some(l),
            None => match api.get_lease(&self.name) {
                Ok(l) => Some(l),
                Err(e) if e.is_not_found() => None,
                Err(e) => return Err(e),
            },
        };
        let result = match &current {
            None => api.create_lease(&fresh),
            Some(l) => {
                let mut wanted = l.clone();
                wanted.spec = fresh.spec.clone();
                // The kubelet's rule: the Lease is owned by the Node as it is now. One
                // still naming a Node deleted and made again would be collected.
                if fresh.metadata.owner_references.is_some() {
                    wanted.metadata.owner_references = fresh.metadata.owner_references.clone();
                }
                api.update_lease(l, &wanted)
            }
        };
        match result {
            Ok(l) => {
                self.lease = Some(l);
                Ok(())
            }
            Err(e) if e.is_conflict() || e.is_already_exists() || e.is_not_found() => {
                // Someone else wrote it, or the garbage collector deleted it with its
                // Node (a PUT of a deleted Lease is a 409, since the update names a
                // resourceVersion): is the Node still ours? Read the Lease again next
                // time, right away.
                self.lease = None;
                self.next_renew = None;
                self.check_node(api)?;
                Err(e)
            }
            Err(e) => {
                // The link, most likely: the Lease we had is still the one to update.
                self.lease = current;
                Err(e)
            }
        }
    }

    /// Whether the Node is still the one registered: gone, or made again by someone else
    /// (another UID), it is registered again, and the Lease and mirror pods follow the
    /// UID it has then.
    fn check_node(&mut self, api: &dyn NodeApi) -> Result<(), ApiError> {
        match api.get_node(&self.name) {
            Ok(node) if node.metadata.uid.is_some() && node.metadata.uid != self.uid() => {
                self.node_gone();
                Ok(())
            }
            Ok(_) => Ok(()),
            Err(e) if e.is_not_found() => {
                self.node_gone();
                Err(e)
            }
            Err(e) => Err(e),
        }
    }

    fn uid(&self) -> Option<String> {
        self.node_uid
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// The first status after an outage is computed against the Node as the cluster has
    /// it now, so the patch carries every condition the node controller changed (Ready
    /// back from `Unknown`, with a fresh transition time) and not only heartbeats.
    fn reread(&mut self, api: &dyn NodeApi) -> Result<(), ApiError> {
        let node = match api.get_node(&self.name) {
            Ok(node) => node,
            Err(e) if e.is_not_found() => {
                self.node_gone();
                return Err(e);
            }
            Err(e) => return Err(e),
        };
        if node.metadata.uid.is_some() && node.metadata.uid != self.uid() {
            // Deleted and made again (by an operator) while the link was down.
            self.node_gone();
            return Ok(());
        }
        self.reported = node.status;
        self.reported_at = None;
        self.reread_node = false;
        Ok(())
    }

    /// The Node is gone from the cluster: register it again, with a new lease.
    fn node_gone(&mut self) {
        log::warn!(
            "node {} was deleted from the cluster; registering it again",
            self.name
        );
        self.registered = false;
        self.reported = None;
        self.reported_at = None;
        self.lease = None;
        self.next_renew = None;
    }

    fn report_status(
        &mut self,
        api: &dyn NodeApi,
        now: Instant,
        wall: Timestamp,
    ) -> Result<(), ApiError> {
        let status = self.model.status(self.reported.as_ref(), wall);
        let due = match (&self.reported, self.reported_at) {
            (Some(old), Some(at)) => {
                self.model.changed(old, &status) || now.duration_since(at) >= self.timing.report
            }
            _ => true,
        };
        if !due {
            return Ok(());
        }
        let body = self.model.status_patch(self.reported.as_ref(), &status);
        match api.patch_node_status(&self.name, &body) {
            Ok(node) => {
                self.reported = node.status.or(Some(status));
                self.reported_at = Some(now);
                Ok(())
            }
            Err(e) if e.is_not_found() => {
                self.node_gone();
                Err(e)
            }
            Err(e) => Err(e),
        }
    }
}

/// Runs a controller on its own thread until `stop` is set.
pub struct NodeLoop<M: NodeModel + Send + 'static> {
    pub controller: NodeController<M>,
    pub client: Client,
    pub stop: Arc<AtomicBool>,
}

impl<M: NodeModel + Send + 'static> NodeLoop<M> {
    pub fn spawn(mut self) -> std::io::Result<std::thread::JoinHandle<()>> {
        std::thread::Builder::new()
            .name("uplink-node".into())
            .spawn(move || {
                while !self.stop.load(Ordering::Relaxed) {
                    let next = self.controller.step(
                        &self.client,
                        Instant::now(),
                        crate::time::now(),
                        crate::backoff::random(),
                    );
                    // Wake at least once a second to notice `stop`, or a status wanted now.
                    while !self.stop.load(Ordering::Relaxed) {
                        let now = Instant::now();
                        if now >= next || self.controller.wants_report() {
                            break;
                        }
                        std::thread::sleep((next - now).min(Duration::from_secs(1)));
                    }
                }
            })
    }
}

/// Shared, so tests and the uplink can see the Node's UID.
pub fn new_node_uid() -> NodeUid {
    Arc::new(Mutex::new(None))
}

#[cfg(test)]
#[path = "node_tests.rs"]
mod tests;
