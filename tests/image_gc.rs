//! Image GC on a real, small filesystem (ext4 on a loop device, as root) holding a real
//! image store: above the high threshold it removes unused images least recently used
//! first, down to the low threshold and no further; an image a pod uses stays whatever
//! its age; a blob two images share is counted once; when the unused images cannot free
//! enough it says so in the kubelet's words.

use support::{loopfs, oci, tempdir};

use std::time::Duration;

use holdfast::image::gc::{self, GcPolicy, InUse, Memory, Usage};
use holdfast::image::{ImageRecord, ImageStore};
use holdfast::store::Store;
use oci::{Entry, Image, Layer};

fn layer(name: &str, mib: usize, seed: u64) -> Layer {
    Layer::new(vec![Entry::file(
        name,
        &oci::noise(mib * 1024 * 1024, seed),
        0o644,
    )])
    .gzipped()
}

fn image(name: &str, layers: Vec<Layer>) -> Image {
    Image {
        layers,
        ref_name: Some(format!("registry.local/gc/{name}:1")),
        ..Image::default()
    }
}

fn percent_of(usage: &Usage, used: u64) -> u8 {
    (used * 100 / usage.capacity) as u8
}

#[test]
fn gc_removes_unused_images_oldest_first_down_to_the_low_threshold() {
    if !nix::unistd::geteuid().is_root() {
        eprintln!("skipped: needs root to mount a loop filesystem");
        return;
    }
    let tmp = tempdir::TempDir::new("image-gc");
    let fs = loopfs::LoopFs::mount(&tmp.0.join("mnt"), 96).expect("loop filesystem");
    let root = fs.mount.join("root");
    let store = Store::open(&root.join("db")).expect("store");
    let images = ImageStore::open(&root, &store).expect("image store");

    // a and b share a base layer; c is what a pod runs; d is the newest.
    let base = layer("base", 3, 1);
    let specs = [
        ("a", vec![base.clone(), layer("a", 4, 2)]),
        ("b", vec![base, layer("b", 4, 3)]),
        ("c", vec![layer("c", 4, 4)]),
        ("d", vec![layer("d", 4, 5)]),
    ];
    let now = holdfast::time::now();
    let mut records: Vec<ImageRecord> = Vec::new();
    for (i, (name, layers)) in specs.into_iter().enumerate() {
        let dir = tmp.0.join(format!("layout-{name}"));
        image(name, layers).write_layout_dir(&dir).expect("layout");
        let rec = images.import(&dir).expect("import").remove(0);
        // Used 4, 3, 2 and 1 hours ago.
        let used = now - jiff_hours(4 - i as i64);
        images
            .mark_used(&rec.config_digest, used)
            .expect("mark used");
        records.push(rec);
    }
    let [a, b, c, d] = [&records[0], &records[1], &records[2], &records[3]];
    let sizes = images.unique_sizes().expect("sizes");
    let unique = |r: &ImageRecord| {
        sizes
            .iter()
            .find(|(x, _)| x.manifest_digest == r.manifest_digest)
            .map(|(_, n)| *n)
            .unwrap_or(0)
    };
    let base_bytes = images.disk_bytes(&a.layers[0]).expect("base bytes");
    assert!(
        base_bytes > 3 * 1024 * 1024,
        "base layer and its unpacked copy: {base_bytes}"
    );
    // The shared base is no one image's own: a's own bytes are its layer, config and
    // manifest.
    let own = |r: &ImageRecord| -> u64 {
        [
            &r.layers[r.layers.len() - 1],
            &r.config_digest,
            &r.manifest_digest,
        ]
        .iter()
        .map(|d| images.disk_bytes(d).expect("bytes"))
        .sum()
    };
    assert_eq!(unique(a), own(a));

    let mut in_use = InUse::default();
    in_use.add_reference("registry.local/gc/c:1");
    let usage = Usage::of(&images.content_root()).expect("usage");
    // Low threshold: a alone does not free enough (its base stays with b), a and b do.
    let target = usage.used() - unique(a) - unique(b) / 2;
    let policy = GcPolicy {
        high_percent: percent_of(&usage, usage.used()) - 1,
        low_percent: percent_of(&usage, target),
        minimum_age: Duration::from_secs(1800),
        maximum_age: Duration::ZERO,
    };
    let outcome = gc::collect(&images, policy, &in_use, &mut Memory::new(), now).expect("gc");
    let left: Vec<String> = images
        .list()
        .expect("list")
        .into_iter()
        .flat_map(|r| r.references)
        .collect();
    assert_eq!(
        outcome.removed,
        vec![
            "registry.local/gc/a:1".to_string(),
            "registry.local/gc/b:1".to_string()
        ],
        "oldest unused first, and no more than needed"
    );
    assert!(
        left.contains(&"registry.local/gc/c:1".to_string())
            && left.contains(&"registry.local/gc/d:1".to_string()),
        "{left:?}"
    );
    assert!(
        outcome.after <= u64::from(policy.low_percent),
        "{outcome:?}"
    );
    assert!(outcome.shortfall().is_none());
    // Eligible: a, b (with their shared base once) and d; never c.
    let expected = unique(a) + unique(b) + base_bytes + unique(d);
    assert_eq!(outcome.eligible, expected, "{outcome:?}");
    // Their blobs and unpacked layers are gone from the disk.
    for digest in a.layers.iter().chain(&b.layers) {
        assert_eq!(images.disk_bytes(digest).expect("bytes"), 0, "{digest}");
    }

    // Below the high threshold now: nothing happens.
    let again = gc::collect(&images, policy, &in_use, &mut Memory::new(), now).expect("gc");
    assert!(again.removed.is_empty() && again.wanted == 0, "{again:?}");

    // Asked for more than the unused images hold: all of them go (d), the used one
    // stays, and the shortfall is said as the kubelet says it.
    let usage = Usage::of(&images.content_root()).expect("usage");
    let greedy = GcPolicy {
        high_percent: 0,
        low_percent: 0,
        minimum_age: Duration::ZERO,
        maximum_age: Duration::ZERO,
    };
    let outcome = gc::collect(&images, greedy, &in_use, &mut Memory::new(), now).expect("gc");
    assert_eq!(outcome.removed, vec!["registry.local/gc/d:1".to_string()]);
    let message = outcome.shortfall().expect("a shortfall");
    assert!(
        message
            .starts_with("Failed to garbage collect required amount of images. Attempted to free "),
        "{message}"
    );
    assert!(outcome.wanted >= usage.used() - 1, "{outcome:?}");
    let left: Vec<String> = images
        .list()
        .expect("list")
        .into_iter()
        .flat_map(|r| r.references)
        .collect();
    assert_eq!(left, vec!["registry.local/gc/c:1".to_string()]);
    assert!(left.iter().any(|r| c.references.contains(r)));
    drop(images);
    drop(store);
}

#[test]
fn an_image_used_within_the_minimum_age_stays() {
    if !nix::unistd::geteuid().is_root() {
        eprintln!("skipped: needs root to mount a loop filesystem");
        return;
    }
    let tmp = tempdir::TempDir::new("image-gc-age");
    let fs = loopfs::LoopFs::mount(&tmp.0.join("mnt"), 64).expect("loop filesystem");
    let root = fs.mount.join("root");
    let store = Store::open(&root.join("db")).expect("store");
    let images = ImageStore::open(&root, &store).expect("image store");
    let dir = tmp.0.join("layout");
    image("recent", vec![layer("r", 4, 9)])
        .write_layout_dir(&dir)
        .expect("layout");
    let rec = images.import(&dir).expect("import").remove(0);
    let now = holdfast::time::now();
    images
        .mark_used(&rec.config_digest, now)
        .expect("mark used");
    let policy = GcPolicy {
        high_percent: 0,
        low_percent: 0,
        minimum_age: Duration::from_secs(120),
        maximum_age: Duration::ZERO,
    };
    let outcome =
        gc::collect(&images, policy, &InUse::default(), &mut Memory::new(), now).expect("gc");
    assert!(outcome.removed.is_empty(), "{outcome:?}");
    assert_eq!(images.list().expect("list").len(), 1);
    drop(images);
    drop(store);
}

fn jiff_hours(h: i64) -> k8s_openapi::jiff::SignedDuration {
    k8s_openapi::jiff::SignedDuration::from_hours(h)
}

#[test]
fn reclaim_under_disk_pressure_frees_what_is_asked_least_recently_used_first() {
    if !nix::unistd::geteuid().is_root() {
        eprintln!("skipped: needs root to mount a loop filesystem");
        return;
    }
    let tmp = tempdir::TempDir::new("image-reclaim");
    let fs = loopfs::LoopFs::mount(&tmp.0.join("mnt"), 64).expect("loop filesystem");
    let root = fs.mount.join("root");
    let store = Store::open(&root.join("db")).expect("store");
    let images = ImageStore::open(&root, &store).expect("image store");
    let now = holdfast::time::now();
    let mut records = Vec::new();
    for (i, name) in ["old", "newer", "running"].into_iter().enumerate() {
        let dir = tmp.0.join(format!("layout-{name}"));
        image(name, vec![layer(name, 3, 40 + i as u64)])
            .write_layout_dir(&dir)
            .expect("layout");
        let rec = images.import(&dir).expect("import").remove(0);
        images
            .mark_used(&rec.config_digest, now - jiff_hours(3 - i as i64))
            .expect("mark used");
        records.push(rec);
    }
    let mut in_use = InUse::default();
    in_use.add_reference("registry.local/gc/running:1");
    let names = |images: &ImageStore| -> Vec<String> {
        images
            .list()
            .expect("list")
            .into_iter()
            .flat_map(|r| r.references)
            .collect()
    };

    // A little is asked: the least recently used image alone goes, whatever the GC
    // thresholds say.
    let freed = gc::reclaim(&images, &in_use, 1024 * 1024, Duration::ZERO, now).expect("reclaim");
    assert!(freed >= 1024 * 1024, "freed {freed}");
    let left = names(&images);
    assert!(
        !left.contains(&"registry.local/gc/old:1".to_string()),
        "{left:?}"
    );
    assert!(
        left.contains(&"registry.local/gc/newer:1".to_string()),
        "{left:?}"
    );

    // More than the unused images hold: every unused one goes, the running one stays.
    let freed = gc::reclaim(&images, &in_use, 1 << 40, Duration::ZERO, now).expect("reclaim");
    assert!(freed > 0 && freed < 1 << 40);
    assert_eq!(
        names(&images),
        vec!["registry.local/gc/running:1".to_string()]
    );
    drop(images);
    drop(store);
}
