//! A pod stopped for the node's shutdown (see `sync::shutdown`): its containers
//! stopped within the grace period it is given (preStop hooks, SIGTERM, SIGKILL), then
//! ended as the kubelet ends it: phase Failed, reason `Terminated`, the DisruptionTarget
//! condition, its sandbox torn down, its status kept in the store and reported, so that
//! it is still the truth after the reboot.

use tokio::sync::oneshot;

use super::{Ended, Worker};

/// The pod status reason of a pod stopped for the node's shutdown.
pub const REASON: &str = "Terminated";
/// Its message, also the DisruptionTarget condition's.
pub const MESSAGE: &str = "Pod was terminated in response to imminent node shutdown.";

/// A worker's part: stop the pod within `grace` seconds, then say so on `done`.
#[derive(Debug)]
pub struct ShutdownStop {
    pub grace: i64,
    pub done: oneshot::Sender<()>,
}

impl Worker {
    pub(super) async fn shut_down(&mut self, grace: i64) {
        if self.ended.is_some() || self.finished {
            return;
        }
        log::info!(
            "pod {}: stopping for the node's shutdown (grace period {grace}s)",
            self.name()
        );
        self.ended = Some(Ended {
            reason: REASON.into(),
            message: MESSAGE.into(),
            rejected: false,
            disruption: true,
        });
        self.refresh().await;
        self.stop_containers(grace).await;
        self.refresh().await;
        self.teardown_sandbox().await;
        self.persist().await;
    }
}
