//! The store across a power cut (as root): what a flush returned for is on the disk, as
//! ext4 brings it back after the cut. The store's filesystem is a loop-mounted ext4
//! whose journal commits only when asked (`commit=600`), so nothing but the store's own
//! syncs can have put its writes there; the cut is a copy of the loop device's image,
//! mounted (the journal replayed) and opened as the agent would open it at the next boot.
//! Takes about 30 s: the last part waits for the store's thread to sync by itself.

use support::loopfs;

use std::path::Path;
use std::time::{Duration, Instant};

use holdfast::store::{Store, Tree};
use loopfs::LoopFs;
use support::agent::need_root;
use support::tempdir::TempDir;

#[test]
fn what_a_flush_returned_for_survives_a_power_cut() {
    if !need_root() {
        return;
    }
    let tmp = TempDir::new("store-powercut");
    let fs = LoopFs::mount_with(&tmp.0.join("disk"), 64, "commit=600").expect("loop ext4");
    let dir = fs.mount.join("db");
    let store = Store::open(&dir).expect("open the store");
    let exits: Tree<u32> = store.tree("exits").expect("tree");
    // A store in use: its log has grown past what its first flush wrote.
    for round in 0..3u32 {
        for i in 0..50u32 {
            exits
                .put(&format!("c{i}"), &(round * 100 + i))
                .expect("put");
        }
        store.flush().expect("flush");
    }
    exits.put("last", &3).expect("put");
    store.flush().expect("flush");

    // The power goes now: the store is never closed.
    after_cut(&fs, &tmp.0.join("after"), |tree| {
        assert_eq!(
            tree.get("last").expect("get"),
            Some(3),
            "the last flushed write"
        );
        assert_eq!(values(tree), (0..50).map(|i| 200 + i).collect::<Vec<_>>());
    });

    // Writes the store's thread wrote out, unflushed: the filesystem has not committed
    // them, and a cut may take them, but never what was flushed before them, and the
    // store still opens.
    let written = fs.bytes_written().expect("device counters");
    for i in 0..50u32 {
        exits.put(&format!("c{i}"), &(900 + i)).expect("put");
    }
    wait_until(
        Duration::from_secs(10),
        "the store's thread wrote nothing out",
        || fs.bytes_written().expect("device counters") != written,
    );
    after_cut(&fs, &tmp.0.join("after-write-out"), |tree| {
        assert_eq!(
            tree.get("last").expect("get"),
            Some(3),
            "the last flushed write"
        );
        let kept = values(tree).iter().filter(|&&v| v >= 900).count();
        eprintln!("{kept} of 50 writes only written out survived the cut");
    });

    // Left alone, the store's thread syncs what it wrote out within 30 s (it then
    // records a new generation in its file): from then on a cut takes none of it.
    let generation = dir.join(holdfast::store::generation::FILE);
    let before = std::fs::read(&generation).expect("read the generation file");
    wait_until(
        Duration::from_secs(45),
        "the store's thread did not sync what it wrote out",
        || std::fs::read(&generation).expect("read the generation file") != before,
    );
    after_cut(&fs, &tmp.0.join("after-sync"), |tree| {
        assert_eq!(values(tree), (0..50).map(|i| 900 + i).collect::<Vec<_>>());
    });
    drop(exits);
    drop(store);
    drop(fs);
}

/// Cuts the power on `fs` now (see [`LoopFs::cut`]), opens the store the cut left at
/// `at` and hands its tree to `check`; unmounts the copy afterwards.
fn after_cut(fs: &LoopFs, at: &Path, check: impl FnOnce(&Tree<u32>)) {
    let after = fs.cut(at).expect("the disk after the cut");
    let back = open_after_cut(&after);
    let tree: Tree<u32> = back.tree("exits").expect("tree");
    check(&tree);
}

/// `c0` to `c49` as the tree holds them (0 for one it does not).
fn values(tree: &Tree<u32>) -> Vec<u32> {
    (0..50)
        .map(|i| tree.get(&format!("c{i}")).expect("get").unwrap_or(0))
        .collect()
}

/// Polls `done` until it holds, failing with `what` after `within`.
fn wait_until(within: Duration, what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + within;
    while !done() {
        assert!(Instant::now() < deadline, "{what} within {within:?}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The store on a disk a cut left, opened as the agent opens it at its start: it must
/// open as it is, not be moved aside.
fn open_after_cut(disk: &LoopFs) -> Store {
    let opened = holdfast::store::recover::open_or_recover_with(&disk.mount.join("db"), None)
        .expect("open the store after the cut");
    assert!(
        opened.moved.is_none(),
        "the store was moved aside after the cut: {:?}",
        opened.moved.map(|m| m.reason)
    );
    opened.store
}
