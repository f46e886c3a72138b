//! Pinned images: those image GC, reclaim under disk pressure and `image prune` never
//! remove, as the kubelet spares the images its runtime calls pinned. An image is pinned
//! when it was imported with `--pin` (its record says so, and keeps saying so when it is
//! imported again), or when `holdfast.pinnedImages` names it: by reference
//! (`repo:tag`, normalised as a pod's image is) or by manifest digest (`repo@sha256:..`
//! or a bare `sha256:..`). Only `holdfast image rm` removes a pinned image.

use std::collections::BTreeSet;

use super::reference::{is_digest, Reference};
use super::ImageRecord;

/// The configured pins, normalised; with each record's own flag, what is pinned.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Pins {
    references: BTreeSet<String>,
    digests: BTreeSet<String>,
}

impl Pins {
    /// From the references `holdfast.pinnedImages` lists. One that cannot be read
    /// (the config reader refuses those) pins by its exact text.
    pub fn new(configured: &[String]) -> Pins {
        let mut pins = Pins::default();
        for c in configured {
            if is_digest(c) {
                pins.digests.insert(c.clone());
                continue;
            }
            match Reference::parse(c) {
                Ok(r) => {
                    pins.digests.extend(r.digest.clone());
                    pins.references.insert(r.to_string());
                }
                Err(_) => {
                    pins.references.insert(c.clone());
                }
            }
        }
        pins
    }

    /// The configured pins, normalised and sorted.
    pub fn configured(&self) -> Vec<String> {
        self.references
            .iter()
            .chain(&self.digests)
            .cloned()
            .collect()
    }

    /// Whether GC must keep `r`: pinned on import, or named by a configured pin.
    pub fn holds(&self, r: &ImageRecord) -> bool {
        r.pinned
            || self.digests.contains(&r.manifest_digest)
            || r.references.iter().any(|x| self.references.contains(x))
    }

    /// `records` as `image ls` shows them: pinned where a configured pin names them.
    pub fn shown(&self, mut records: Vec<ImageRecord>) -> Vec<ImageRecord> {
        for r in &mut records {
            r.pinned = self.holds(r);
        }
        records
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(references: &[&str], manifest: &str, pinned: bool) -> ImageRecord {
        ImageRecord {
            references: references.iter().map(|s| s.to_string()).collect(),
            manifest_digest: manifest.into(),
            config_digest: "sha256:c".into(),
            layers: vec![],
            size: 0,
            imported_at: crate::time::now(),
            last_used: None,
            pinned,
        }
    }

    #[test]
    fn pins_match_normalised_references_digests_and_the_records_flag() {
        let m = format!("sha256:{}", "a".repeat(64));
        let pins = Pins::new(&[
            "busybox:1.36".into(),
            format!("registry.local:5000/site/app@{m}"),
        ]);
        assert!(pins.holds(&record(
            &["docker.io/library/busybox:1.36"],
            "sha256:x",
            false
        )));
        assert!(!pins.holds(&record(
            &["docker.io/library/busybox:1.37"],
            "sha256:x",
            false
        )));
        // By digest: whatever names the image now.
        assert!(pins.holds(&record(&["other/name:2"], &m, false)));
        assert!(pins.holds(&record(&["anything:1"], "sha256:y", true)));
        assert_eq!(
            pins.configured(),
            vec![
                "docker.io/library/busybox:1.36".to_string(),
                format!("registry.local:5000/site/app@{m}"),
                m.clone(),
            ]
        );
        let shown = pins.shown(vec![record(
            &["docker.io/library/busybox:1.36"],
            "sha256:x",
            false,
        )]);
        assert!(shown[0].pinned);
        assert!(!Pins::default().holds(&record(&["x:1"], "sha256:x", false)));
    }
}
