//! Rebuilding a fresh store from the containers that still run: each container's spec
//! annotations name its pod and restart count (and carry the pod), so the sync loop
//! finds records for them and adopts them instead of removing them as orphans.
//! Static pods are then confirmed by their manifests and cluster pods by the
//! apiserver's LIST, as after any restart.

use std::collections::BTreeMap;

use crate::runtime::{ContainerState, Runtime};
use crate::source::DesiredPod;
use crate::store::{Batch, Store, StoreError, Tree};

use super::record::{ContainerRecord, Instance, InstanceState, Terminated};

/// What [`rebuild`] put back.
#[derive(Debug, Default, PartialEq)]
pub struct Rebuilt {
    pub containers: usize,
    pub pods: usize,
}

/// Writes a container record for every container the runtime holds whose annotations
/// name its owner (the newest instance per pod and container), and the desired pod
/// each came from, in one transaction.
pub fn rebuild(store: &Store, runtime: &dyn Runtime) -> Result<Rebuilt, StoreError> {
    let containers: Tree<ContainerRecord> = store.tree("containers")?;
    let pods: Tree<DesiredPod> = store.tree(crate::source::PODS_TREE)?;
    let ids = match runtime.list() {
        Ok(ids) => ids,
        Err(e) => {
            log::error!("rebuild the store: list containers: {e}");
            return Ok(Rebuilt::default());
        }
    };
    let mut records: BTreeMap<String, ContainerRecord> = BTreeMap::new();
    let mut desired: BTreeMap<String, DesiredPod> = BTreeMap::new();
    for id in ids {
        let owner = match runtime.owner(&id) {
            Ok(Some(o)) => o,
            Ok(None) => {
                log::warn!("container {id} does not say which pod it belongs to; not adopted");
                continue;
            }
            Err(e) => {
                log::warn!("container {id}: {e}; not adopted");
                continue;
            }
        };
        let state = match runtime.state(&id) {
            Ok(ContainerState::Running { started_at, .. }) => InstanceState::Running { started_at },
            Ok(ContainerState::Exited(exit)) => {
                InstanceState::Terminated(Terminated::from_exit(&id, &exit))
            }
            // Being created, or lost: nothing to adopt.
            Ok(_) => continue,
            Err(e) => {
                log::warn!("container {id}: {e}; not adopted");
                continue;
            }
        };
        let key = ContainerRecord::key(&owner.pod_uid, &owner.container);
        if records
            .get(&key)
            .is_some_and(|r| r.restart_count >= owner.restart_count)
        {
            continue;
        }
        let mut rec = ContainerRecord::new(&owner.container);
        rec.restart_count = owner.restart_count;
        rec.current = Some(Instance {
            id: id.clone(),
            image: owner.image.clone(),
            image_id: owner.image_id.clone(),
            state,
        });
        log::info!(
            "adopting container {id}: pod {}/{} ({}), container {}, restart {}",
            owner.namespace,
            owner.pod_name,
            owner.pod_uid,
            owner.container,
            owner.restart_count
        );
        records.insert(key, rec);
        if let Some(pod) = owner.pod {
            let source = owner
                .source
                .unwrap_or_else(|| crate::pod::annotations::SOURCE_API.to_string());
            desired
                .entry(owner.pod_uid.clone())
                .or_insert(DesiredPod { source, pod });
        }
    }
    let mut batch = Batch::new();
    for (key, rec) in &records {
        batch.put(&containers, key, rec)?;
    }
    for (uid, pod) in &desired {
        batch.put(&pods, uid, pod)?;
    }
    store.apply(batch)?;
    store.flush()?;
    Ok(Rebuilt {
        containers: records.len(),
        pods: desired.len(),
    })
}
