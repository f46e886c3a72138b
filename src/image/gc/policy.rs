//! Which images a GC pass may remove, and in what order, as the kubelet's image GC
//! manager decides it: the decisions alone, without the disk, so that they can be
//! checked with ages and pins.
//!
//! - Never an image a pod uses ([`InUse`]) or a pinned one ([`Pins`]).
//! - `imageMaximumGCAge`: an image unused for longer goes whatever the disk, once the
//!   agent itself has run that long (an image in use before a restart may have stopped
//!   being used only now; the kubelet waits as well). Its last use is the latest of the
//!   last container start from it (kept in the image's record), its import, and the
//!   last pass that saw a pod use it.
//! - For space: least recently used first, the one imported first among equals; an
//!   image used within `imageMinimumGCAge` stays.
//!
//! Ages are measured only between real wall times: a time taken while the clock was
//! not yet set (a board without a real-time clock booting in 1970) is moved by the
//! clock's jump where that is known, and otherwise makes no image old.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use super::InUse;
use crate::image::pins::Pins;
use crate::image::ImageRecord;
use crate::time::Timestamp;

/// What GC remembers between its passes: when it began, and when each image was last
/// seen in use by a pod.
#[derive(Debug, Clone)]
pub struct Memory {
    began: Instant,
    seen: HashMap<String, Timestamp>,
}

impl Default for Memory {
    fn default() -> Self {
        Memory::new()
    }
}

impl Memory {
    /// GC begins now, having seen nothing.
    pub fn new() -> Memory {
        Memory {
            began: Instant::now(),
            seen: HashMap::new(),
        }
    }

    /// How long GC has run.
    pub fn running(&self) -> Duration {
        self.began.elapsed()
    }

    /// Notes that the images `in_use` names were in use at `now`, and forgets those no
    /// longer in the store.
    pub fn observe(&mut self, all: &[ImageRecord], in_use: &InUse, now: Timestamp) {
        self.seen
            .retain(|digest, _| all.iter().any(|r| &r.manifest_digest == digest));
        for r in all.iter().filter(|r| in_use.uses(r)) {
            self.seen.insert(r.manifest_digest.clone(), now);
        }
    }

    /// When `r` was last used: its last container start or its import, or the last pass
    /// that saw it in use, whichever is later.
    pub fn last_use(&self, r: &ImageRecord) -> Timestamp {
        let stored = r.last_used.unwrap_or(r.imported_at);
        match self.seen.get(&r.manifest_digest) {
            Some(seen) => stored.max(*seen),
            None => stored,
        }
    }
}

/// The images GC may consider at all: no pod uses them and none is pinned.
pub fn unused<'a>(all: &'a [ImageRecord], in_use: &InUse, pins: &Pins) -> Vec<&'a ImageRecord> {
    all.iter()
        .filter(|r| !in_use.uses(r) && !pins.holds(r))
        .collect()
}

/// How long ago `at` was, when both it and `now` are real times (see the module doc).
fn age(at: Timestamp, now: Timestamp) -> Option<Duration> {
    if !crate::time::is_sane(now) {
        return None;
    }
    let at = crate::time::correct(at)?;
    Duration::try_from(now.duration_since(at)).ok()
}

/// Of the `unused` images, those unused for longer than `maximum_age` (none when it is
/// zero, or when GC has not `running` for that long yet), least recently used first.
pub fn too_old<'a>(
    unused: &[&'a ImageRecord],
    memory: &Memory,
    maximum_age: Duration,
    running: Duration,
    now: Timestamp,
) -> Vec<&'a ImageRecord> {
    if maximum_age.is_zero() || running <= maximum_age {
        return Vec::new();
    }
    let mut old: Vec<&ImageRecord> = unused
        .iter()
        .copied()
        .filter(|r| age(memory.last_use(r), now).is_some_and(|a| a > maximum_age))
        .collect();
    old.sort_by_key(|r| (memory.last_use(r), r.imported_at));
    old
}

/// The `unused` images in the order GC removes them to free space: least recently
/// used first, the one imported first among equals; those used within `minimum_age`
/// are left out.
pub fn space_order<'a>(
    unused: &[&'a ImageRecord],
    memory: &Memory,
    minimum_age: Duration,
    now: Timestamp,
) -> Vec<&'a ImageRecord> {
    let mut order: Vec<&ImageRecord> = unused
        .iter()
        .copied()
        .filter(|r| {
            let since = now.duration_since(memory.last_use(r));
            since.as_secs() >= minimum_age.as_secs() as i64
        })
        .collect();
    order.sort_by_key(|r| (memory.last_use(r), r.imported_at));
    order
}

/// How long until the next of the `unused` images is older than `maximum_age` and GC
/// may remove it; None when `maximum_age` is zero or no image will be.
pub fn next_due(
    unused: &[&ImageRecord],
    memory: &Memory,
    maximum_age: Duration,
    running: Duration,
    now: Timestamp,
) -> Option<Duration> {
    if maximum_age.is_zero() {
        return None;
    }
    // Past the strict "longer than", and clear of the clock's rounding.
    let margin = Duration::from_millis(250);
    let until_running = maximum_age.saturating_sub(running);
    unused
        .iter()
        .filter_map(|r| age(memory.last_use(r), now))
        .map(|a| maximum_age.saturating_sub(a).max(until_running) + margin)
        .min()
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::jiff::SignedDuration;

    fn at(now: Timestamp, minutes_ago: i64) -> Timestamp {
        now - SignedDuration::from_mins(minutes_ago)
    }

    /// An image imported `imported` minutes ago, last started `used` minutes ago.
    fn image(name: &str, imported: i64, used: Option<i64>, now: Timestamp) -> ImageRecord {
        ImageRecord {
            references: vec![format!("registry.local/p/{name}:1")],
            manifest_digest: format!("sha256:m-{name}"),
            config_digest: format!("sha256:c-{name}"),
            layers: vec![],
            size: 0,
            imported_at: at(now, imported),
            last_used: used.map(|u| at(now, u)),
            pinned: false,
        }
    }

    fn names(images: &[&ImageRecord]) -> Vec<String> {
        images
            .iter()
            .map(|r| {
                let name = r.references[0].trim_start_matches("registry.local/p/");
                name.trim_end_matches(":1").to_string()
            })
            .collect()
    }

    const HOUR: Duration = Duration::from_secs(3600);

    #[test]
    fn space_goes_least_recently_used_first_and_spares_the_used_the_pinned_and_the_recent() {
        let now = crate::time::now();
        let mut flagged = image("flagged", 500, None, now);
        flagged.pinned = true;
        let all = vec![
            image("newer", 300, Some(20), now),
            image("oldest", 400, Some(200), now),
            image("never-run", 150, None, now),
            image("tie-late", 200, Some(100), now),
            image("tie-early", 300, Some(100), now),
            image("running", 600, Some(590), now),
            image("preloaded", 700, None, now),
            flagged,
            image("just-used", 50, Some(1), now),
        ];
        let mut in_use = InUse::default();
        in_use.add_reference("registry.local/p/running:1");
        let pins = Pins::new(&["registry.local/p/preloaded:1".into()]);
        let unused = unused(&all, &in_use, &pins);
        let order = space_order(&unused, &Memory::new(), Duration::from_secs(120), now);
        // Equal last use: the one imported first goes first.
        assert_eq!(
            names(&order),
            ["oldest", "never-run", "tie-early", "tie-late", "newer"]
        );
    }

    #[test]
    fn a_pass_that_saw_an_image_in_use_makes_it_recent() {
        let now = crate::time::now();
        // Started 10 hours ago by a pod that ran until a moment ago.
        let all = vec![
            image("long-runner", 900, Some(600), now),
            image("idle", 300, None, now),
        ];
        let mut in_use = InUse::default();
        in_use.add_reference("registry.local/p/long-runner:1");
        let mut memory = Memory::new();
        memory.observe(&all, &in_use, at(now, 1));
        let unused = unused(&all, &InUse::default(), &Pins::default());
        assert_eq!(
            names(&space_order(&unused, &memory, Duration::ZERO, now)),
            ["idle", "long-runner"]
        );
        assert!(too_old(&unused, &memory, HOUR, 2 * HOUR, now)
            .iter()
            .all(|r| r.references[0].ends_with("idle:1")));
    }

    #[test]
    fn maximum_age_takes_only_the_unused_images_older_than_it() {
        let now = crate::time::now();
        let mut flagged = image("flagged", 900, None, now);
        flagged.pinned = true;
        let all = vec![
            image("stale", 300, Some(120), now),
            image("staler", 600, None, now),
            image("fresh", 600, Some(30), now),
            image("running", 900, Some(890), now),
            flagged,
        ];
        let mut in_use = InUse::default();
        in_use.add_reference("registry.local/p/running:1");
        let memory = Memory::new();
        let unused = unused(&all, &in_use, &Pins::default());
        let old = too_old(&unused, &memory, HOUR, 2 * HOUR, now);
        assert_eq!(names(&old), ["staler", "stale"]);
        // Off when zero; and not before GC itself has run that long.
        assert!(too_old(&unused, &memory, Duration::ZERO, 2 * HOUR, now).is_empty());
        assert!(too_old(&unused, &memory, HOUR, HOUR, now).is_empty());
        // The next one due is fresh, in 30 minutes (and a margin).
        let fresh_only: Vec<&ImageRecord> = unused
            .iter()
            .copied()
            .filter(|r| r.references[0].ends_with("fresh:1"))
            .collect();
        let due = next_due(&fresh_only, &memory, HOUR, 2 * HOUR, now).expect("due");
        assert!(
            due > Duration::from_secs(1800) && due < Duration::from_secs(1802),
            "{due:?}"
        );
        // Before GC has run for the maximum age, not earlier than that.
        let due = next_due(&fresh_only, &memory, HOUR, Duration::from_secs(600), now).expect("due");
        assert!(due > Duration::from_secs(3000), "{due:?}");
        assert_eq!(
            next_due(&fresh_only, &memory, Duration::ZERO, HOUR, now),
            None
        );
    }

    #[test]
    fn a_time_from_before_the_clock_was_set_makes_no_image_old() {
        let now = crate::time::now();
        let mut booted_in_1970 = image("early", 0, None, now);
        booted_in_1970.imported_at = Timestamp::from_second(3600).expect("time");
        let all = vec![booted_in_1970];
        let unused = unused(&all, &InUse::default(), &Pins::default());
        assert!(too_old(&unused, &Memory::new(), HOUR, 2 * HOUR, now).is_empty());
    }
}
