//! Init containers and sidecars: in order, each regular one to completion before the
//! next starts, a sidecar started before the next starts; and, after a reboot, the
//! completed ones again.

use k8s_openapi::api::core::v1::Container;

use super::super::record::InstanceState;
use super::super::status;
use super::Worker;

impl Worker {
    /// Brings the init containers toward their spec; true once they are all through
    /// (every regular one completed, every sidecar started) and the app containers may
    /// run. `done`: the pod's work is over, and its sidecars are not restarted.
    pub(super) async fn sync_init(
        &mut self,
        inits: &[Container],
        policy: &str,
        done: bool,
    ) -> bool {
        for c in inits {
            if status::is_sidecar(c) {
                self.sync_container(c, if done { "Never" } else { "Always" })
                    .await;
                if !self.sidecar_started(c) {
                    return false;
                }
                continue;
            }
            if self.completed(c) {
                continue;
            }
            self.sync_container(c, status::init_policy(policy)).await;
            return false;
        }
        true
    }

    /// The pod's containers were lost with their sandbox (a reboot): as the kubelet
    /// does for a new sandbox, its completed init containers run again, each as its
    /// next attempt, before the app containers come back.
    pub(super) async fn init_again(&mut self, inits: &[Container]) {
        let mut again = Vec::new();
        for c in inits.iter().filter(|c| !status::is_sidecar(c)) {
            let Some(rec) = self.records.get_mut(&c.name) else {
                continue;
            };
            let Some(cur) = rec
                .current
                .take_if(|cur| matches!(cur.state, InstanceState::Terminated(_)))
            else {
                continue;
            };
            if let InstanceState::Terminated(t) = cur.state {
                rec.last = Some(t);
            }
            rec.restart_count = rec.restart_count.saturating_add(1);
            rec.failures = 0;
            again.push(c.name.as_str());
            self.remove_container(&cur.id).await;
        }
        if !again.is_empty() {
            log::info!(
                "pod {}: its containers were lost (a reboot or power cut?): init containers {} run again",
                self.name(),
                again.join(", ")
            );
        }
    }

    /// A regular init container whose current instance completed.
    fn completed(&self, c: &Container) -> bool {
        self.records
            .get(&c.name)
            .and_then(|r| r.current.as_ref())
            .is_some_and(
                |cur| matches!(&cur.state, InstanceState::Terminated(t) if t.exit_code == 0),
            )
    }

    /// A sidecar started (running, its startup probe passed), now or before: the init
    /// containers after it may go on. One that restarts later holds nothing up.
    fn sidecar_started(&self, c: &Container) -> bool {
        let Some(rec) = self.records.get(&c.name) else {
            return false;
        };
        if rec.last.is_some() {
            return true;
        }
        let running = rec
            .current
            .as_ref()
            .is_some_and(|cur| matches!(cur.state, InstanceState::Running { .. }));
        running && self.probe_views().get(&c.name).is_none_or(|v| v.started)
    }
}
