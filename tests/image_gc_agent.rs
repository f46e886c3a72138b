//! Image GC as a running standalone agent does it (no apiserver: offline by definition),
//! with real imported images, as root:
//!
//! - on a small real filesystem (ext4 on a loop device) holding the root dir, filled past
//!   `imageGCHighThresholdPercent` by imports and a file that grows, GC removes the
//!   unused images least recently used first down to `imageGCLowThresholdPercent`, and
//!   keeps the images `holdfast.pinnedImages` names, those imported with `--pin`, and
//!   the image of a static pod that does not run (refused at admission); `image prune`
//!   keeps them too;
//! - with `imageMaximumGCAge`, an image no pod uses goes once it has been unused that
//!   long, with no disk pressure, while a pinned one and a static pod's stay.

use support::{agent, loopfs, oci};

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use agent::Agent;
use holdfast::image::gc::Usage;
use loopfs::LoopFs;
use oci::{Entry, Image, Layer};

const WAIT: Duration = Duration::from_secs(30);
const MIB: u64 = 1024 * 1024;
/// The noise in each image's one layer.
const LAYER_MIB: u64 = 3;

/// An OCI layout tar of `registry.local/gc/<name>:1`, one layer of noise.
fn archive(dir: &Path, name: &str, seed: u64) -> PathBuf {
    let path = dir.join(format!("{name}.tar"));
    Image {
        layers: vec![Layer::new(vec![Entry::file(
            name,
            &oci::noise((LAYER_MIB * MIB) as usize, seed),
            0o644,
        )])
        .gzipped()],
        ref_name: Some(reference(name)),
        ..Image::default()
    }
    .write_layout_tar(&path)
    .expect("image archive");
    path
}

fn reference(name: &str) -> String {
    format!("registry.local/gc/{name}:1")
}

fn run(a: &Agent, args: &[&str]) -> String {
    let out = a.command(args).output().expect("holdfast");
    assert!(
        out.status.success(),
        "holdfast {args:?}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn import(a: &Agent, archive: &Path, pin: bool) {
    let path = archive.to_str().expect("path");
    let args: &[&str] = if pin {
        &["image", "import", "--pin", path]
    } else {
        &["image", "import", path]
    };
    let out = run(a, args);
    assert!(out.starts_with("imported "), "{out}");
    assert_eq!(out.contains("(pinned)"), pin, "{out}");
}

/// The names (`registry.local/gc/<name>:1`) `holdfast image ls` lists, and whether
/// each row says pinned.
fn listed(a: &Agent) -> Vec<(String, bool)> {
    run(a, &["image", "ls"])
        .lines()
        .skip(1)
        .filter_map(|row| {
            let repo = row.split_whitespace().next()?;
            let name = repo.strip_prefix("registry.local/gc/")?;
            Some((name.to_string(), row.trim_end().ends_with("pinned")))
        })
        .collect()
}

fn names(a: &Agent) -> Vec<String> {
    let mut n: Vec<String> = listed(a).into_iter().map(|(n, _)| n).collect();
    n.sort();
    n
}

/// A static pod of `image` for another OS: refused at admission, it never runs.
fn refused_static_pod(image: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: keeper\nspec:\n  hostNetwork: true\n  \
         os:\n    name: windows\n  containers:\n  - name: main\n    image: {image}\n    \
         imagePullPolicy: IfNotPresent\n    command: [\"/keeper\"]\n"
    )
}

#[test]
fn a_filling_disk_loses_the_least_recently_used_images_and_keeps_pinned_and_static_ones() {
    if !agent::need_root() {
        return;
    }
    // Declared first, dropped last: the agent goes before the filesystem it runs on.
    let fs_slot: Option<LoopFs>;
    let mut a = Agent::new("image-gc-disk");
    std::fs::remove_dir_all(&a.root).expect("empty root");
    fs_slot = Some(LoopFs::mount(&a.root, 160).expect("loop filesystem"));
    let fs = fs_slot.as_ref().expect("mounted");
    let (high, low) = (60u64, 56u64);
    a.write_config(&format!(
        "  pinnedImages: [\"{}\"]\nimageGCHighThresholdPercent: {high}\n\
         imageGCLowThresholdPercent: {low}\nimageMinimumGCAge: 1s\n",
        reference("preloaded")
    ));
    a.start();

    // Imported oldest first: without their protection the static pod's image and the
    // pinned ones would be the first to go.
    let archives = a.dir.join("archives");
    std::fs::create_dir_all(&archives).expect("archives dir");
    let order = [
        "static",
        "preloaded",
        "kept",
        "old1",
        "old2",
        "old3",
        "old4",
    ];
    let tars: Vec<PathBuf> = order
        .iter()
        .enumerate()
        .map(|(i, n)| archive(&archives, n, 100 + i as u64))
        .collect();
    for (name, tar) in order.iter().zip(&tars).take(6) {
        import(&a, tar, *name == "kept");
    }
    let imported = Instant::now();
    a.write_manifest("keeper.yaml", &refused_static_pod(&reference("static")));
    let keeper = a.wait_pod("keeper", "refused", WAIT, |p| {
        p["status"]["phase"] == "Failed"
    });
    assert_eq!(keeper["status"]["reason"], "PodOSNotSupported", "{keeper}");

    // A file grows until the next image takes the disk past the high threshold, by
    // about one and a half images above the low one: two images must go, not one.
    let image_bytes = 2 * LAYER_MIB * MIB + 64 * 1024;
    let content = a.root.join("content");
    let usage = Usage::of(&content).expect("usage");
    let low_bytes = usage.capacity / 100 * low;
    let aim = low_bytes + image_bytes / 2;
    assert!(
        aim > usage.used() && low_bytes + image_bytes * 3 / 2 > usage.capacity / 100 * high,
        "the filesystem does not fit the plan: {usage:?}"
    );
    grow(&fs.mount.join("growing.log"), aim - usage.used());
    // Time itself, not a condition: the images must be older than imageMinimumGCAge.
    std::thread::sleep(Duration::from_millis(1100).saturating_sub(imported.elapsed()));
    assert!(Usage::of(&content).expect("usage").percent() <= high);
    // The last import takes it past: GC looks after each import, as after each pull.
    import(&a, &tars[6], false);
    a.wait_until("GC to remove two images", WAIT, |a| {
        !names(a).contains(&"old2".to_string())
    });

    assert_eq!(
        names(&a),
        ["kept", "old3", "old4", "preloaded", "static"].map(String::from),
        "least recently used first, and no more than needed\n{}",
        a.agent_log()
    );
    let after = Usage::of(&content).expect("usage");
    assert!(after.percent() <= low, "{after:?}");
    let log = a.agent_log();
    let at = |name: &str| {
        log.find(&format!("image GC: removed {}", reference(name)))
            .unwrap_or_else(|| panic!("{name} removed in the log:\n{log}"))
    };
    assert!(at("old1") < at("old2"), "{log}");
    // The image ls rows say which are pinned, by the config or at import.
    let pinned: Vec<String> = listed(&a)
        .into_iter()
        .filter(|(_, p)| *p)
        .map(|(n, _)| n)
        .collect();
    assert_eq!(pinned, ["kept", "preloaded"].map(String::from));
    // The static pod is still refused, and its image still here to start it with.
    let keeper = a.pod("keeper").expect("keeper");
    assert_eq!(keeper["status"]["phase"], "Failed", "{keeper}");

    // Prune: every image no pod uses, and still none pinned.
    let out = run(&a, &["image", "prune"]);
    assert!(out.contains("2 image(s) removed"), "{out}");
    assert_eq!(names(&a), ["kept", "preloaded", "static"].map(String::from));
    a.stop();
    drop(a);
}

/// Writes `bytes` to `path` a MiB at a time, as a log grows, and makes them take their
/// blocks.
fn grow(path: &Path, bytes: u64) {
    use std::io::Write;
    let mut f = std::fs::File::create(path).expect("growing file");
    let chunk = vec![0x5au8; MIB as usize];
    let mut left = bytes;
    while left > 0 {
        let n = left.min(MIB);
        f.write_all(&chunk[..n as usize]).expect("grow");
        left -= n;
    }
    f.sync_all().expect("sync");
}

#[test]
fn an_image_unused_for_longer_than_the_maximum_age_goes_with_no_disk_pressure() {
    if !agent::need_root() {
        return;
    }
    let mut a = Agent::new("image-gc-age");
    // Never for space: only age removes an image here.
    a.write_config(
        "imageGCHighThresholdPercent: 100\nimageGCLowThresholdPercent: 99\n\
         imageMinimumGCAge: 1s\nimageMaximumGCAge: 4s\n",
    );
    // A static pod runs busybox:demo (the agent imports it at start).
    a.write_manifest(
        "runner.yaml",
        &agent::sh_pod("runner", "", "main", "sleep 3600", ""),
    );
    a.start();
    a.wait_pod("runner", "running", WAIT, |p| {
        p["status"]["phase"] == "Running"
    });
    let archives = a.dir.join("archives");
    std::fs::create_dir_all(&archives).expect("archives dir");
    import(&a, &archive(&archives, "kept", 1), true);
    let imported = Instant::now();
    import(&a, &archive(&archives, "stale", 2), false);
    assert_eq!(
        names(&a),
        ["kept", "stale"].map(String::from),
        "not at once"
    );
    a.wait_until("the stale image to go", WAIT, |a| {
        !names(a).contains(&"stale".to_string())
    });
    let gone_after = imported.elapsed();
    assert!(gone_after >= Duration::from_secs(4), "{gone_after:?}");
    assert_eq!(names(&a), ["kept"].map(String::from));
    let all = run(&a, &["image", "ls"]);
    assert!(all.contains("docker.io/library/busybox"), "{all}");
    let log = a.agent_log();
    assert!(
        log.contains(&format!("image GC: removed {}", reference("stale")))
            && log.contains("unused for longer than imageMaximumGCAge"),
        "{log}"
    );
    let runner = a.pod("runner").expect("runner");
    assert_eq!(runner["status"]["phase"], "Running", "{runner}");
    a.stop();
}
