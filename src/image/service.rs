//! The agent's image service: the puller (registry client, mirrors, node credentials
//! read again for each pull) and image GC on a thread of its own, every 5 minutes as
//! the kubelet's, after each pull and import, and when the next unused image passes
//! `imageMaximumGCAge`. GC spares every image a pod of this node wants or runs, as
//! [`ImagesInUse`] says, and every pinned image. After a pull it gives the pull's memory
//! back.

use std::sync::mpsc::{self, RecvTimeoutError, SyncSender};
use std::sync::Arc;
use std::time::Duration;

use super::gc::{self, GcPolicy, ImagesInUse, Memory};
use super::registry::{Keyring, Puller, Registry};
use super::ImageStore;
use crate::config::ImageConfig;

/// How often image GC looks at the disk, as the kubelet's `ImageGCPeriod`.
pub const GC_PERIOD: Duration = Duration::from_secs(300);

/// The image service's handles: the puller, and a way to have GC look now.
pub struct ImageService {
    pub puller: Puller,
    pub gc: GcTrigger,
}

/// Asks the GC thread for a pass now (after an import, which fills the disk as a pull
/// does). Cheap to clone.
#[derive(Clone)]
pub struct GcTrigger(SyncSender<Why>);

impl GcTrigger {
    pub fn kick(&self) {
        // One pending look is enough; more would look at the same disk.
        let _ = self.0.try_send(Why::Import);
    }
}

enum Why {
    Pull,
    Import,
}

/// Builds the puller and starts image GC, which spares what `in_use` names and what
/// `config` pins.
pub fn start(
    images: Arc<ImageStore>,
    config: &ImageConfig,
    in_use: impl ImagesInUse + 'static,
) -> ImageService {
    let registry = Registry::new(
        config.registries.clone(),
        config.max_parallel_layer_downloads as usize,
    );
    let creds = config.clone();
    let puller = Puller::new(
        images.clone(),
        registry,
        config.max_parallel_pulls as usize,
        move || {
            match creds.node_keyring() {
                Ok(k) => k,
                // The message names the file, never what is in it.
                Err(e) => {
                    log::warn!("node registry credentials: {e}; pulling without them");
                    Keyring::default()
                }
            }
        },
    );
    if let Err(e) = images.set_configured_pins(&config.pinned_images) {
        log::warn!("keep holdfast.pinnedImages for `holdfast image` commands: {e}");
    }
    let policy = GcPolicy {
        high_percent: config.gc_high_percent,
        low_percent: config.gc_low_percent,
        minimum_age: config.minimum_gc_age,
        maximum_age: config.maximum_gc_age,
    };
    let (kick, kicked) = mpsc::sync_channel::<Why>(1);
    let on_pull = kick.clone();
    puller.on_pulled(move || {
        let _ = on_pull.try_send(Why::Pull);
    });
    let spawned = std::thread::Builder::new()
        .name("image-gc".into())
        .spawn(move || {
            let mut memory = Memory::new();
            let mut wait = GC_PERIOD;
            loop {
                match kicked.recv_timeout(wait) {
                    Ok(why) => {
                        wait = run_gc(&images, policy, &in_use, &mut memory);
                        if matches!(why, Why::Pull) {
                            // A pull's buffers (manifests, layer streams, TLS) are freed by now.
                            crate::malloc::trim_and_log("an image pull");
                        }
                    }
                    Err(RecvTimeoutError::Timeout) => {
                        wait = run_gc(&images, policy, &in_use, &mut memory)
                    }
                    Err(RecvTimeoutError::Disconnected) => return,
                }
            }
        });
    if let Err(e) = spawned {
        log::error!("image GC: start its thread: {e}; images will not be collected");
    }
    ImageService {
        puller,
        gc: GcTrigger(kick),
    }
}

/// One pass; returns how long until the next.
fn run_gc(
    images: &ImageStore,
    policy: GcPolicy,
    in_use: &dyn ImagesInUse,
    memory: &mut Memory,
) -> Duration {
    let in_use = match in_use.images_in_use() {
        Ok(u) => u,
        Err(e) => {
            // Without knowing what pods use, nothing may go.
            log::warn!("ImageGCFailed: read pod states: {e}");
            return GC_PERIOD;
        }
    };
    match gc::collect(images, policy, &in_use, memory, crate::time::now()) {
        Ok(outcome) => {
            if !outcome.removed.is_empty() {
                log::info!(
                    "image GC: disk {}% -> {}% used, {} bytes freed, removed {}",
                    outcome.before,
                    outcome.after,
                    outcome.freed,
                    outcome.removed.join(", ")
                );
            }
            if let Some(message) = outcome.shortfall() {
                log::warn!("FreeDiskSpaceFailed: {message}");
            }
            // Not busy: a removal that failed is tried again a second later at the soonest.
            outcome
                .next_due
                .map_or(GC_PERIOD, |d| d.clamp(Duration::from_secs(1), GC_PERIOD))
        }
        Err(e) => {
            log::warn!("ImageGCFailed: {e}");
            GC_PERIOD
        }
    }
}
