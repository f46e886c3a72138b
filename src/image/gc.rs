//! Image GC as the kubelet does it: images no pod uses and unused for longer than
//! `imageMaximumGCAge` (when set) go whatever the disk; then, when the filesystem
//! holding the content store is fuller than `imageGCHighThresholdPercent`, images no
//! pod uses are removed, least recently used first, until it is down to
//! `imageGCLowThresholdPercent`. An image used within `imageMinimumGCAge` stays, and a
//! pinned one always (see [`crate::image::pins`]). Which images go and in what order is
//! [`policy`]'s; this file does it on the disk. Blobs shared by images are freed only
//! with the last of them, so they are counted once. `prune` removes every unused image
//! that is not pinned at once.

mod policy;

use std::collections::HashSet;
use std::path::Path;
use std::time::Duration;

pub use policy::Memory;

use k8s_openapi::api::core::v1::{Pod, PodStatus};

use super::reference::Reference;
use super::{ImageError, ImageRecord, ImageStore};
use crate::store::StoreError;
use crate::time::Timestamp;

/// When GC starts and stops.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GcPolicy {
    pub high_percent: u8,
    pub low_percent: u8,
    pub minimum_age: Duration,
    /// `imageMaximumGCAge`; zero: images are never removed for their age alone.
    pub maximum_age: Duration,
}

/// Where GC learns which images the node's pods use; the agent hands it the sync loop's
/// pod states, so that the image store never reads them itself.
pub trait ImagesInUse: Send + Sync {
    /// Every image a pod of this node wants or runs. An error means nothing may go.
    fn images_in_use(&self) -> Result<InUse, StoreError>;
}

/// Images pods of this node use: by normalised reference (what specs ask for) and by
/// image id (what containers run).
#[derive(Debug, Clone, Default)]
pub struct InUse {
    references: HashSet<String>,
    ids: HashSet<String>,
}

impl InUse {
    /// From each pod's spec (wanted) and status (running or exited).
    pub fn from_pods<'a>(
        pods: impl IntoIterator<Item = (&'a Pod, Option<&'a PodStatus>)>,
    ) -> InUse {
        let mut u = InUse::default();
        for (pod, status) in pods {
            let spec = pod.spec.iter();
            let images = spec.flat_map(|s| {
                s.containers
                    .iter()
                    .chain(s.init_containers.iter().flatten())
                    .map(|c| &c.image)
                    .chain(s.ephemeral_containers.iter().flatten().map(|c| &c.image))
            });
            for image in images.flatten() {
                u.add_reference(image);
            }
            for cs in status.into_iter().flat_map(|s| {
                s.container_statuses
                    .iter()
                    .flatten()
                    .chain(s.init_container_statuses.iter().flatten())
                    .chain(s.ephemeral_container_statuses.iter().flatten())
            }) {
                if !cs.image_id.is_empty() {
                    // `repo@sha256:<manifest>`: the manifest digest is what names it.
                    u.ids.insert(super::id_digest(&cs.image_id).to_string());
                }
            }
        }
        u
    }

    pub fn add_reference(&mut self, image: &str) {
        match Reference::parse(image) {
            Ok(r) => {
                self.references.insert(r.to_string());
            }
            Err(_) => {
                self.references.insert(image.to_string());
            }
        }
    }

    pub fn add_id(&mut self, id: &str) {
        self.ids.insert(id.to_string());
    }

    pub fn uses(&self, r: &ImageRecord) -> bool {
        self.ids.contains(&r.config_digest)
            || self.ids.contains(&r.manifest_digest)
            || r.references.iter().any(|x| self.references.contains(x))
    }
}

/// Bytes of the filesystem at a path.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Usage {
    pub capacity: u64,
    pub available: u64,
}

impl Usage {
    pub fn of(path: &Path) -> Result<Usage, ImageError> {
        let s = crate::node::facts::statfs(path).map_err(|e| ImageError::Io {
            context: format!("statfs {}", path.display()),
            source: std::io::Error::from(e),
        })?;
        Ok(Usage {
            capacity: s.capacity,
            available: s.available,
        })
    }

    pub fn used(&self) -> u64 {
        self.capacity.saturating_sub(self.available)
    }

    /// Percent used, as the kubelet computes it (100 - available * 100 / capacity).
    pub fn percent(&self) -> u64 {
        if self.capacity == 0 {
            return 0;
        }
        100 - self.available.saturating_mul(100) / self.capacity
    }
}

/// What a GC pass did.
#[derive(Debug, Clone, Default)]
pub struct GcOutcome {
    /// Percent used before and after.
    pub before: u64,
    pub after: u64,
    /// Bytes it aimed to free (zero when below the high threshold).
    pub wanted: u64,
    /// Bytes freed, as the filesystem counts them.
    pub freed: u64,
    /// Bytes the unused images held, each shared blob counted once.
    pub eligible: u64,
    /// References of the images removed, in the order removed: first those unused for
    /// longer than the maximum age (also in `aged`), then those removed for space.
    pub removed: Vec<String>,
    /// References of the images removed for their age.
    pub aged: Vec<String>,
    /// How long until the next unused image is older than the maximum age.
    pub next_due: Option<Duration>,
}

impl GcOutcome {
    /// The kubelet's FreeDiskSpaceFailed message, when GC could not free enough.
    pub fn shortfall(&self) -> Option<String> {
        (self.wanted > 0 && self.freed < self.wanted).then(|| {
            format!(
                "Failed to garbage collect required amount of images. Attempted to free {} bytes, but only found {} bytes eligible to free.",
                self.wanted, self.eligible
            )
        })
    }
}

fn blobs_of(r: &ImageRecord) -> impl Iterator<Item = &String> {
    std::iter::once(&r.manifest_digest)
        .chain(std::iter::once(&r.config_digest))
        .chain(&r.layers)
}

/// One GC pass at `now`: images older than the maximum age go, then, above
/// `high_percent`, the least recently used down to `low_percent`. `memory` is the GC
/// thread's own, kept from pass to pass.
pub fn collect(
    images: &ImageStore,
    policy: GcPolicy,
    in_use: &InUse,
    memory: &mut Memory,
    now: Timestamp,
) -> Result<GcOutcome, ImageError> {
    let root = images.content_root();
    let start = Usage::of(&root)?;
    // Partial downloads nobody resumed for a day go whatever the thresholds.
    let day_ago = std::time::SystemTime::now() - Duration::from_secs(86_400);
    let stale = images.content().remove_partials_before(day_ago);
    if stale > 0 {
        log::info!("image GC: removed {stale} bytes of partial downloads older than a day");
    }
    let all = images.list()?;
    let pins = images.pins()?;
    memory.observe(&all, in_use, now);
    let unused = policy::unused(&all, in_use, &pins);
    let old = policy::too_old(&unused, memory, policy.maximum_age, memory.running(), now);
    let mut out = GcOutcome {
        before: start.percent(),
        ..GcOutcome::default()
    };
    for r in &old {
        remove(
            images,
            r,
            memory,
            "unused for longer than imageMaximumGCAge",
        )?;
        out.aged.extend(r.references.iter().cloned());
    }
    out.removed = out.aged.clone();
    let aged: HashSet<&String> = old.iter().map(|r| &r.manifest_digest).collect();
    let unused: Vec<&ImageRecord> = unused
        .into_iter()
        .filter(|r| !aged.contains(&r.manifest_digest))
        .collect();
    let usage = Usage::of(&root)?;
    out.after = usage.percent();
    if usage.percent() > u64::from(policy.high_percent) {
        free_space(images, policy, &all, &unused, memory, now, &mut out)?;
    }
    let present: HashSet<String> = images
        .list()?
        .into_iter()
        .map(|r| r.manifest_digest)
        .collect();
    let left: Vec<&ImageRecord> = unused
        .into_iter()
        .filter(|r| present.contains(&r.manifest_digest))
        .collect();
    out.next_due = policy::next_due(&left, memory, policy.maximum_age, memory.running(), now);
    Ok(out)
}

/// Above the high threshold: removes `unused` images for space, down to the low one.
fn free_space(
    images: &ImageStore,
    policy: GcPolicy,
    all: &[ImageRecord],
    unused: &[&ImageRecord],
    memory: &Memory,
    now: Timestamp,
    out: &mut GcOutcome,
) -> Result<(), ImageError> {
    let root = images.content_root();
    let usage = Usage::of(&root)?;
    let target_used = usage.capacity / 100 * u64::from(policy.low_percent);
    out.wanted = usage.used().saturating_sub(target_used);
    // What removing every unused image would free: a blob shared by several counts
    // once, and one a kept image shares counts not at all.
    let freeable: HashSet<&String> = unused.iter().flat_map(|r| blobs_of(r)).collect();
    let kept: HashSet<&String> = all
        .iter()
        .filter(|r| {
            !unused
                .iter()
                .any(|u| u.manifest_digest == r.manifest_digest)
        })
        .flat_map(blobs_of)
        .collect();
    for d in freeable.difference(&kept) {
        out.eligible += images.disk_bytes(d)?;
    }
    let order = policy::space_order(unused, memory, policy.minimum_age, now);
    let (freed, removed) = remove_in_order(images, &order, memory, |used| used <= target_used)?;
    out.freed = freed;
    out.removed.extend(removed);
    out.after = Usage::of(&root)?.percent();
    Ok(())
}

fn remove(
    images: &ImageStore,
    r: &ImageRecord,
    memory: &Memory,
    why: &str,
) -> Result<(), ImageError> {
    images.remove(&r.manifest_digest, &[])?;
    log::info!(
        "image GC: removed {} ({}), last used {}: {why}",
        r.references.join(", "),
        r.manifest_digest,
        memory.last_use(r)
    );
    Ok(())
}

/// Removes the images of `order` in turn until `enough` holds for the bytes used on
/// the content store's filesystem; returns the bytes freed as the filesystem counts
/// them, and the references removed.
fn remove_in_order(
    images: &ImageStore,
    order: &[&ImageRecord],
    memory: &Memory,
    enough: impl Fn(u64) -> bool,
) -> Result<(u64, Vec<String>), ImageError> {
    let root = images.content_root();
    let (mut freed, mut removed) = (0, Vec::new());
    for r in order {
        let before = Usage::of(&root)?.used();
        if enough(before) {
            break;
        }
        remove(
            images,
            r,
            memory,
            "the disk is above imageGCHighThresholdPercent",
        )?;
        freed += before.saturating_sub(Usage::of(&root)?.used());
        removed.extend(r.references.iter().cloned());
    }
    Ok((freed, removed))
}

/// Frees at least `target` bytes if unused images that are not pinned hold them (the
/// kubelet's image reclaim under disk pressure, whatever the GC thresholds say);
/// returns the bytes freed.
pub fn reclaim(
    images: &ImageStore,
    in_use: &InUse,
    target: u64,
    minimum_age: Duration,
    now: Timestamp,
) -> Result<u64, ImageError> {
    let start = Usage::of(&images.content_root())?.used();
    let all = images.list()?;
    let pins = images.pins()?;
    let memory = Memory::new();
    let unused = policy::unused(&all, in_use, &pins);
    let order = policy::space_order(&unused, &memory, minimum_age, now);
    let (freed, _) = remove_in_order(images, &order, &memory, |used| {
        start.saturating_sub(used) >= target
    })?;
    Ok(freed)
}

/// Removes every image no pod uses and none pinned; returns what went.
pub fn prune(images: &ImageStore, in_use: &InUse) -> Result<Vec<ImageRecord>, ImageError> {
    let all = images.list()?;
    let pins = images.pins()?;
    let mut removed = Vec::new();
    for r in policy::unused(&all, in_use, &pins) {
        images.remove(&r.manifest_digest, &[])?;
        removed.push(r.clone());
    }
    Ok(removed)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn usage_percent_and_shortfall_words() {
        let u = Usage {
            capacity: 1000,
            available: 140,
        };
        assert_eq!((u.used(), u.percent()), (860, 86));
        let o = GcOutcome {
            wanted: 60,
            freed: 10,
            eligible: 10,
            ..GcOutcome::default()
        };
        assert_eq!(
            o.shortfall().as_deref(),
            Some("Failed to garbage collect required amount of images. Attempted to free 60 bytes, but only found 10 bytes eligible to free.")
        );
    }

    #[test]
    fn in_use_matches_normalised_references_and_ids() {
        let pod: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "p"},
            "spec": {"containers": [{"name": "c", "image": "busybox"}]},
        }))
        .expect("pod");
        let status: PodStatus = serde_json::from_value(serde_json::json!({
            "containerStatuses": [{"name": "c", "image": "x", "imageID": "sha256:1", "ready": true, "restartCount": 0}],
        }))
        .expect("status");
        let u = InUse::from_pods([(&pod, Some(&status))]);
        let rec = |refs: &[&str], config: &str| ImageRecord {
            references: refs.iter().map(|s| s.to_string()).collect(),
            manifest_digest: "sha256:m".into(),
            config_digest: config.into(),
            layers: vec![],
            size: 0,
            imported_at: crate::time::now(),
            last_used: None,
            pinned: false,
        };
        assert!(u.uses(&rec(&["docker.io/library/busybox:latest"], "sha256:9")));
        assert!(u.uses(&rec(&["other:1"], "sha256:1")));
        assert!(!u.uses(&rec(&["docker.io/library/busybox:1"], "sha256:9")));
        // An ephemeral container's image is the pod's as much as the others'.
        let debugged: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "p"},
            "spec": {"containers": [{"name": "c", "image": "busybox"}],
                     "ephemeralContainers": [{"name": "d", "image": "tools:1"}]},
        }))
        .expect("pod");
        let status: PodStatus = serde_json::from_value(serde_json::json!({
            "ephemeralContainerStatuses": [{"name": "d", "image": "x", "imageID": "sha256:2", "ready": false, "restartCount": 0}],
        }))
        .expect("status");
        let u = InUse::from_pods([(&debugged, Some(&status))]);
        assert!(u.uses(&rec(&["docker.io/library/tools:1"], "sha256:9")));
        assert!(u.uses(&rec(&["other:1"], "sha256:2")));
    }
}
