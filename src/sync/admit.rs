//! Admission in the sync loop: a pod new to the agent is checked (see
//! `resources::admission`) against the pods admitted before it that are still
//! active, and refused pods get a worker that only reports why. The burstable QoS
//! level's cpu shares follow the requests of the burstable pods admitted.

use std::sync::atomic::Ordering;

use k8s_openapi::api::core::v1::Pod;

use super::SyncLoop;
use crate::pod::requests::{pod_resources, Amounts};
use crate::resources::admission;
use crate::resources::Qos;

impl SyncLoop {
    /// Admits `pod`, or says why not: `(reason, message)`.
    pub(super) fn admit(&mut self, uid: &str, pod: &Pod) -> Option<(String, String)> {
        let requests = pod_resources(pod).map(|r| r.requests).unwrap_or_default();
        // A pod the store knows was admitted before this start (it may be running, or
        // have been refused, which its status keeps): no new decision.
        if let Ok(Some(_)) = self.deps.podstates.tree().get(uid) {
            self.track(uid, pod, requests);
            return None;
        }
        // The kubelet's shutdown manager admits nothing once the node shuts down.
        if self.deps.shutting_down.is_set() {
            return Some((
                super::shutdown::NOT_ADMITTED_REASON.into(),
                super::shutdown::NOT_ADMITTED_MESSAGE.into(),
            ));
        }
        let active: Vec<Amounts> = self
            .admitted
            .iter()
            .filter(|(u, _)| u.as_str() != uid && !self.terminal(u))
            .map(|(_, (_, a))| *a)
            .collect();
        let pressure = self.deps.sandboxes.memory_pressure.load(Ordering::Relaxed);
        match admission::admit(pod, &active, &self.deps.sandboxes.admission, pressure) {
            Ok(()) => {
                self.track(uid, pod, requests);
                None
            }
            Err(r) => Some((r.reason, r.message)),
        }
    }

    fn track(&mut self, uid: &str, pod: &Pod, requests: Amounts) {
        self.admitted
            .insert(uid.to_owned(), (Qos::of(pod), requests));
        self.update_burstable_shares();
    }

    /// The pod ran its course (its status says Succeeded or Failed): it holds nothing.
    fn terminal(&self, uid: &str) -> bool {
        matches!(
            self.deps.podstates.tree().get(uid),
            Ok(Some(s)) if matches!(s.status.phase.as_deref(), Some("Succeeded" | "Failed"))
        )
    }

    /// Forgets a pod that is gone.
    pub(super) fn release(&mut self, uid: &str) {
        if self.admitted.remove(uid).is_some() {
            self.update_burstable_shares();
        }
    }

    fn update_burstable_shares(&self) {
        let total = self
            .admitted
            .values()
            .filter(|(q, _)| *q == Qos::Burstable)
            .map(|(_, a)| a.cpu_milli)
            .fold(0, u64::saturating_add);
        // Counted here, in order; written by whichever blocking thread runs last.
        self.deps.sandboxes.count_burstable_requests(total);
        let deps = self.deps.clone();
        tokio::task::spawn_blocking(move || {
            if let Err(e) = deps.sandboxes.write_burstable_shares() {
                log::warn!("burstable pods' cpu shares: {e}");
            }
        });
    }
}
