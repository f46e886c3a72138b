//! What a worker keeps of its pod: the status its records give now, and records and
//! status written to the store when they changed.

use k8s_openapi::api::core::v1::PodStatus;

use super::super::record::ContainerRecord;
use super::super::record::InstanceState;
use super::super::status::{self, StatusInputs};
use super::{blocking, is_terminal, whole_seconds, PodState, Worker};
use crate::time;

impl Worker {
    /// The pod's status as its records give it now: as an ended pod's (`terminal`),
    /// with what the readiness probes say when `probed`.
    pub(super) fn status_now(&self, terminal: bool, probed: bool) -> PodStatus {
        let sandbox = self.sandbox_status();
        let views = probed.then(|| self.probe_views());
        let inputs = StatusInputs {
            now: time::now(),
            backoff: &self.deps.backoff,
            start_time: Some(self.start_time),
            host_ip: self.deps.host_ip.as_deref(),
            previous: self.state.as_ref().map(|s| &s.status),
            terminal,
            sandbox: Some(&sandbox),
            probes: views.as_ref(),
        };
        status::pod_status(&self.pod, &self.records, &inputs)
    }

    /// Puts `state` in the store in a transaction of its own, written out to the
    /// kernel with `write_out`.
    pub(super) async fn save_state(
        &self,
        state: &PodState,
        write_out: bool,
    ) -> Result<(), crate::store::StoreError> {
        let (store, tree, uid) = (
            self.deps.store.clone(),
            self.deps.podstates.tree().clone(),
            self.uid.clone(),
        );
        let kept = state.clone();
        blocking(move || {
            let mut batch = crate::store::Batch::new();
            batch.put(&tree, &uid, &kept)?;
            store.apply(batch)?;
            if write_out {
                store.write_out()?;
            }
            Ok(())
        })
        .await
    }

    /// Writes records and status that changed, as one transaction. It is flushed (a
    /// journal commit on the flash) when it holds what a power cut must not take: a
    /// container record of a pod that does not restart its containers whatever happens
    /// (`Never`, `OnFailure`: a container that ran, and how it ended, decide whether it
    /// runs again), or a pod that ran its course. A pod whose containers always restart
    /// loses little to a cut: every container runs again after it, and its init
    /// containers too (a fresh sandbox); its records are written out to the kernel at
    /// once (an agent killed loses none) and become durable with the filesystem's next
    /// commit (ext4: within 5 s), so a cut can take the restart counts of those last
    /// seconds only. A status alone (a probe's readiness, a condition) is derived again
    /// from the records, and waits for the store's own write-out within a second.
    /// Nothing is written when nothing changed.
    pub(super) async fn persist(&mut self) {
        let mut batch = crate::store::Batch::new();
        let mut records_changed = false;
        for rec in self.records.values() {
            if self.saved.get(&rec.name) == Some(rec) {
                continue;
            }
            records_changed = true;
            let key = ContainerRecord::key(&self.uid, &rec.name);
            if let Err(e) = batch.put(&self.deps.containers, &key, rec) {
                log::error!("pod {}: save container record: {e}", self.name());
            }
        }
        // An ended pod restarts nothing: its containers show how they ended.
        let terminal = self.ended.is_some() || self.finished;
        let status = whole_seconds(self.ended_status(self.status_now(terminal, true)));
        // A pod synced is wanted: a stop an earlier agent began (its manifest put back
        // while the agent was down) is over.
        let changed = match &self.state {
            Some(s) => s.status != status || s.pod != self.pod || s.stop_deadline.is_some(),
            None => true,
        };
        let state = PodState {
            pod: self.pod.clone(),
            status,
            start_time: self.start_time,
            stop_deadline: None,
        };
        if changed {
            if let Err(e) = batch.put(self.deps.podstates.tree(), &self.uid, &state) {
                log::error!("pod {}: save status: {e}", self.name());
            }
        }
        let store = self.deps.store.clone();
        let always = self.restarts_always();
        let flush = (records_changed && !always) || (changed && is_terminal(&state.status));
        let written = blocking(move || {
            let n = store.apply(batch)?;
            // Taken only if not held in memory for a full disk.
            let mut taken = false;
            if n > 0 {
                if flush {
                    store.flush()?;
                } else if records_changed {
                    // In the kernel's hands at once: an agent killed now loses none.
                    store.write_out()?;
                }
                taken = store.holding().is_none();
            }
            Ok::<(usize, bool), crate::store::StoreError>((n, taken))
        })
        .await;
        let taken = matches!(written, Ok((_, true)));
        if let Err(e) = written {
            // Kept in memory: the next change writes it all again.
            log::error!("pod {}: save records and status: {e}", self.name());
            if changed {
                self.deps.reporter.status(&self.pod, &state.status, false);
                self.state = Some(state);
            }
            return;
        }
        self.saved.clone_from(&self.records);
        if taken {
            // The exits just written are the store's now (flushed where a power cut
            // must not take them): their shims need not sync their own records.
            for inst in self.records.values().filter_map(|r| r.current.as_ref()) {
                if matches!(inst.state, InstanceState::Terminated(_)) {
                    self.deps.runtime.exit_recorded(&inst.id);
                }
            }
        }
        if !changed {
            if !self.reported && crate::pod::is_static_pod(&self.pod) {
                // A restarted agent whose static pod runs on unchanged: its mirror pod
                // may have been deleted while the agent was down, and the uplink checks
                // (and makes again) a mirror pod when the static pod's status goes out.
                self.reported = true;
                self.deps.reporter.status(&self.pod, &state.status, false);
            }
            return;
        }
        self.reported = true;
        self.deps.reporter.status(&self.pod, &state.status, false);
        self.state = Some(state);
    }
}
