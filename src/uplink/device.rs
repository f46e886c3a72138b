//! The Node as the config and the device describe it: what the node controller
//! registers, reports and renews, read from the device's facts and the image index each
//! time it is asked. The shaping is [`super::node_status`]'s; this only gathers.

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{ContainerImage, Node, NodeStatus};
use serde_json::Value;

use super::node::NodeModel;
use super::node_status;
use crate::config::Config;
use crate::image::ImageRecord;
use crate::node::facts::NodeFacts;
use crate::node::shutdown::{ShuttingDown, NOT_READY_MESSAGE};
use crate::node::NodeInput;
use crate::store::{Store, Tree};
use crate::time::Timestamp;

/// The Node as the config and the device describe it.
pub struct DeviceModel {
    input: NodeInput,
    root_dir: std::path::PathBuf,
    lease_seconds: i32,
    /// The image store's index, for `status.images`.
    images: Option<Tree<ImageRecord>>,
    /// Set while the node shuts down: Ready is False with the kubelet's message.
    shutting_down: ShuttingDown,
}

impl DeviceModel {
    /// The model of this node. A Node the config cannot describe (a label
    /// NodeRestriction refuses, ...) is an error.
    pub fn of(config: &Config, store: &Store) -> Result<DeviceModel, crate::Error> {
        Ok(DeviceModel {
            input: config.node_input().map_err(crate::Error::Node)?,
            root_dir: config.root_dir.clone(),
            lease_seconds: config.node_lease_duration_seconds,
            images: store
                .tree("images")
                .map_err(|e| log::warn!("node status: open the image index: {e}"))
                .ok(),
            shutting_down: ShuttingDown::default(),
        })
    }

    /// The model whose Ready condition follows `flag`.
    pub fn with_shutdown(mut self, flag: ShuttingDown) -> Self {
        self.shutting_down = flag;
        self
    }

    /// The node's images, as the kubelet lists them; none if the index cannot be read.
    fn images(&self) -> Vec<ContainerImage> {
        let records: Vec<ImageRecord> = match &self.images {
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
        let shutting_down;
        let input = if self.shutting_down.is_set() {
            let mut i = self.input.clone();
            i.not_ready.push(NOT_READY_MESSAGE.into());
            shutting_down = i;
            &shutting_down
        } else {
            &self.input
        };
        let mut s = node_status::node_status(input, &facts, previous, now);
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
    fn report_now(&self) -> bool {
        self.shutting_down.take_report()
    }
}
