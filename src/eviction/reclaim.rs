//! What is reclaimed under disk pressure before any pod is evicted, as the kubelet's
//! node-level reclaim does: the leftovers of dead containers of pods that have ended,
//! then unused images. Image garbage collection belongs to the image store; this
//! module only calls it through [`ImageGc`].

use std::sync::Arc;

use crate::image::gc::ImagesInUse;
use crate::runtime::{ContainerState, Runtime};
use crate::store::Tree;
use crate::sync::record::{ContainerRecord, InstanceState};
use crate::sync::PodStates;

/// The image store's garbage collection, as eviction calls it under disk pressure:
/// remove unused images until `target_bytes` are freed (or nothing unused is left);
/// returns the bytes freed.
pub trait ImageGc: Send + Sync {
    fn gc(&self, target_bytes: u64) -> Result<u64, String>;
}

/// Frees nothing: for an agent without an image store to collect.
pub struct NoImageGc;

impl ImageGc for NoImageGc {
    fn gc(&self, _target_bytes: u64) -> Result<u64, String> {
        Ok(0)
    }
}

/// The image store's GC: unused images (as the store's pods say), least recently used
/// first, none used within `minimum_age` and none pinned.
pub struct StoreImageGc {
    pub images: Arc<crate::image::ImageStore>,
    pub in_use: crate::sync::NodeImages,
    pub minimum_age: std::time::Duration,
}

impl ImageGc for StoreImageGc {
    fn gc(&self, target_bytes: u64) -> Result<u64, String> {
        // Without knowing what pods use, nothing may go.
        let in_use = self.in_use.images_in_use().map_err(|e| e.to_string())?;
        crate::image::gc::reclaim(
            &self.images,
            &in_use,
            target_bytes,
            self.minimum_age,
            crate::time::now(),
        )
        .map_err(|e| e.to_string())
    }
}

/// Removes the exited containers (their writable layer and records on disk) of pods
/// whose phase is Succeeded or Failed: nothing will start them again, and their
/// statuses keep how they ended. Returns how many were removed.
pub fn dead_containers(
    runtime: &Arc<dyn Runtime>,
    podstates: &PodStates,
    containers: &Tree<ContainerRecord>,
) -> usize {
    let Ok(states) = podstates.entries() else {
        return 0;
    };
    let mut removed = 0;
    for (uid, state) in states {
        if !state.ended() {
            continue;
        }
        let Ok(records) = containers.scan_prefix(&format!("{uid}/")) else {
            continue;
        };
        for (_, rec) in records {
            let Some(cur) = &rec.current else { continue };
            if !matches!(cur.state, InstanceState::Terminated(_)) {
                continue;
            }
            if matches!(runtime.state(&cur.id), Ok(ContainerState::Exited(_))) {
                match runtime.remove(&cur.id) {
                    Ok(()) => removed += 1,
                    Err(e) => log::warn!("reclaim container {}: {e}", cur.id),
                }
            }
        }
    }
    removed
}
