//! The agent's image service: the puller (registry client, mirrors, node credentials
//! read again for each pull) and image GC on a thread of its own, every 5 minutes as
//! the kubelet's and after each pull. GC spares every image a pod of this node wants or
//! runs, as [`ImagesInUse`] (the sync loop's pod states) says. After a pull it gives the
//! pull's memory back.

use std::sync::mpsc::{self, RecvTimeoutError};
use std::sync::Arc;
use std::time::Duration;

use super::gc::{self, GcPolicy, ImagesInUse};
use super::registry::{Keyring, Puller, Registry};
use super::ImageStore;
use crate::config::ImageConfig;

/// How often image GC looks at the disk, as the kubelet's `ImageGCPeriod`.
pub const GC_PERIOD: Duration = Duration::from_secs(300);

/// Builds the puller and starts image GC, which spares what `in_use` names.
pub fn start(
    images: Arc<ImageStore>,
    config: &ImageConfig,
    in_use: impl ImagesInUse + 'static,
) -> Puller {
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
    let policy = GcPolicy {
        high_percent: config.gc_high_percent,
        low_percent: config.gc_low_percent,
        minimum_age: config.minimum_gc_age,
    };
    let (kick, kicked) = mpsc::sync_channel::<()>(1);
    puller.on_pulled(move || {
        // One pending look is enough; more would look at the same disk.
        let _ = kick.try_send(());
    });
    let spawned = std::thread::Builder::new()
        .name("image-gc".into())
        .spawn(move || loop {
            match kicked.recv_timeout(GC_PERIOD) {
                Ok(()) => {
                    run_gc(&images, policy, &in_use);
                    // A pull's buffers (manifests, layer streams, TLS) are freed by now.
                    crate::malloc::trim_and_log("an image pull");
                }
                Err(RecvTimeoutError::Timeout) => run_gc(&images, policy, &in_use),
                Err(RecvTimeoutError::Disconnected) => return,
            }
        });
    if let Err(e) = spawned {
        log::error!("image GC: start its thread: {e}; images will not be collected");
    }
    puller
}

fn run_gc(images: &ImageStore, policy: GcPolicy, in_use: &dyn ImagesInUse) {
    let in_use = match in_use.images_in_use() {
        Ok(u) => u,
        Err(e) => {
            // Without knowing what pods use, nothing may go.
            log::warn!("ImageGCFailed: read pod states: {e}");
            return;
        }
    };
    match gc::collect(images, policy, &in_use, crate::time::now()) {
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
        }
        Err(e) => log::warn!("ImageGCFailed: {e}"),
    }
}
