//! A pod deleted in the cluster while its containers stop: its readiness probes go on
//! through the preStop hooks and the grace period, and what they change of its status
//! is reported at once, as the kubelet's status manager does, so that a container
//! that stops serving on SIGTERM leaves the pod's endpoints before it exits.

use std::future::Future;

use super::{sleep_until, whole_seconds, Worker};
use crate::runtime::ContainerId;

impl Worker {
    /// Awaits `work` (which holds nothing of the worker); for a pod being deleted,
    /// meanwhile runs its readiness probes and reports the status their verdicts change.
    pub(super) async fn serving_readiness<T>(&mut self, work: impl Future<Output = T>) -> T {
        if !self.probing_deleted() {
            return work.await;
        }
        tokio::pin!(work);
        loop {
            tokio::select! {
                out = &mut work => return out,
                _ = sleep_until(self.probes.wake) => self.start_due_probes(),
                Some(done) = self.probes.rx.recv() => {
                    if self.probed_deleting(done) {
                        self.report_stopping().await;
                    }
                    self.start_due_probes();
                }
            }
        }
    }

    /// Containers of a pod being deleted that exited: probed no more, and unready
    /// (reported) if a readiness probe said they were ready.
    pub(super) async fn unprobe_stopped(&mut self, gone: &[ContainerId]) {
        if !self.probing_deleted() || !self.forget_probes_of(gone) {
            return;
        }
        self.report_stopping().await;
    }

    /// The status of the pod while it stops, as its last pass left it but for what the
    /// readiness probes say now: reported and kept (with the stop's deadline) when it
    /// changed.
    async fn report_stopping(&mut self) {
        let status = whole_seconds(self.ended_status(self.status_now(false, true)));
        let Some(state) = self.state.as_mut() else {
            return;
        };
        if state.status == status {
            return;
        }
        state.status = status;
        self.deps.reporter.status(&self.pod, &state.status, false);
        let kept = state.clone();
        // Not written out: a status is derived again from the records after a cut.
        if let Err(e) = self.save_state(&kept, false).await {
            log::error!("pod {}: save status: {e}", self.name());
        }
    }
}
