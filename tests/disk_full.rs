//! A full disk under the agent's root dir (a small loop-mounted ext4 made by the test,
//! filled by the test as runaway logs or images would fill it): running pods keep
//! running, DiskPressure reaches the cluster, the store loses nothing and is intact,
//! and writes resume once space frees. As root.

use support::{apiserver, loopfs, offline as site};

use std::time::{Duration, Instant};

use holdfast::store::{Store, Tree};
use loopfs::LoopFs;
use serde_json::Value;
use site::*;
use support::agent::need_root;
use support::tempdir::TempDir;

fn wait_for(what: &str, within: Duration, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + within;
    while Instant::now() < deadline {
        if cond() {
            return;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    panic!("timed out after {within:?} waiting for {what}");
}

fn key(i: usize) -> String {
    format!("during/{i:05}")
}

/// Writes 4 KB records until the store holds writes in memory; returns how many it wrote.
fn write_until_held(store: &Store, t: &Tree<String>) -> usize {
    let value = "y".repeat(4000);
    for i in 0..5000 {
        if store.holding().is_some() {
            return i;
        }
        t.put(&key(i), &value)
            .expect("a write on a full disk is not an error");
        if i % 16 == 0 {
            store
                .flush()
                .expect("a flush on a full disk is not an error");
        }
    }
    panic!("5000 writes of 4 KB on a full 24 MiB disk were never held");
}

/// What the test wrote, as a reopened store must have it (`late` aside).
fn assert_contents(store: &Store, during: usize, phase: &str) {
    let t: Tree<String> = store.tree("pods").expect("tree");
    let keys: Vec<String> = t
        .keys()
        .expect("keys")
        .into_iter()
        .filter(|k| k != "late")
        .collect();
    assert_eq!(
        keys.len(),
        49 + during + 1,
        "{phase}: 50 records before, one removed, {during} during, one extra"
    );
    assert_eq!(
        t.get("before/00").expect("get").as_deref(),
        Some("changed while full"),
        "{phase}"
    );
    assert_eq!(t.get("before/01").expect("get"), None, "{phase}: removed");
    assert_eq!(
        t.get("extra").expect("get").as_deref(),
        Some("written while held"),
        "{phase}"
    );
    for i in 0..during {
        assert!(
            t.get(&key(i)).expect("get").is_some(),
            "{phase}: {} lost",
            key(i)
        );
    }
}

/// Frees the space the filler took, waits for the held writes to be written, and
/// opens the store again.
fn free_and_reopen(store: Store, filler: &std::path::Path, db: &std::path::Path) -> Store {
    std::fs::remove_file(filler).expect("free the space");
    wait_for("held writes to be written", Duration::from_secs(10), || {
        store.holding().is_none()
    });
    drop(store);
    Store::open(db).expect("reopen")
}

/// Changes made while writes are held: an overwrite, a removal and a new record, read
/// back at once.
fn change_while_held(store: &Store) {
    let t: Tree<String> = store.tree("pods").expect("tree");
    t.put("before/00", &"changed while full".to_string())
        .expect("put");
    assert!(t.remove("before/01").expect("remove").is_some());
    t.put("extra", &"written while held".to_string())
        .expect("put");
    assert_eq!(
        t.get("before/00").expect("get").as_deref(),
        Some("changed while full"),
        "reads see held writes"
    );
    assert_eq!(t.get("before/01").expect("get"), None, "and held removals");
    let keys = t.keys().expect("keys");
    assert!(keys.contains(&"extra".to_string()) && !keys.contains(&"before/01".to_string()));
    let (held, records) = store.holding().expect("holding");
    assert!(records >= 3, "{records} held");
    assert!(held.reason.contains("space"), "{}", held.reason);
}

#[test]
fn the_store_loses_nothing_when_the_disk_fills_or_sled_fails() {
    if !need_root() {
        return;
    }
    let tmp = TempDir::new("disk-full-store");
    let fs = LoopFs::mount(&tmp.0.join("mnt"), 24).expect("loop filesystem");
    let db = fs.mount.join("db");
    {
        let store = Store::open(&db).expect("open");
        let t: Tree<String> = store.tree("pods").expect("tree");
        for i in 0..50 {
            t.put(&format!("before/{i:02}"), &"x".repeat(500))
                .expect("put");
        }
        store.flush().expect("flush");
    }

    // The disk fills while the store is open: its headroom takes writes, then memory.
    let store = Store::open(&db).expect("open");
    let filler = fs.fill("filler");
    assert_eq!(fs.free(), 0, "filled");
    let t: Tree<String> = store.tree("pods").expect("tree");
    let during = write_until_held(&store, &t);
    assert!(
        during >= 64,
        "only {during} writes of 4 KB went to the store's 2 MiB headroom"
    );
    change_while_held(&store);
    drop(t);
    let store = free_and_reopen(store, &filler, &db);
    assert_contents(&store, during, "after the disk filled under an open store");
    drop(store);

    // The agent restarts on a full disk. The store has changed since sled last wrote a
    // snapshot, so sled must write one as it opens: the store gives its headroom back
    // for that. Writes go on, and are held once there is no room left.
    {
        let store = Store::open(&db).expect("open");
        let t: Tree<String> = store.tree("pods").expect("tree");
        t.put("late", &"z".to_string()).expect("put");
        store.flush().expect("flush");
    }
    let snapshots = || -> Vec<String> {
        let mut s: Vec<String> = std::fs::read_dir(&db)
            .expect("store dir")
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| n.starts_with("snap.") && !n.ends_with(".generating"))
            .collect();
        s.sort();
        s
    };
    let before = snapshots();
    let filler = fs.fill("filler");
    assert_eq!(fs.free(), 0, "filled");
    let store = Store::open(&db).expect("a store opens on a full disk");
    assert_ne!(
        snapshots(),
        before,
        "sled wrote a snapshot on the full disk"
    );
    assert_contents(&store, during, "opened on a full disk");
    let t: Tree<String> = store.tree("pods").expect("tree");
    assert_eq!(t.get("late").expect("get").as_deref(), Some("z"));
    let after: Vec<String> = (0..during).map(key).collect();
    for k in &after {
        t.remove(k).expect("remove");
    }
    let more = write_until_held(&store, &t);
    assert!(store.holding().is_some());
    drop(t);
    let store = free_and_reopen(store, &filler, &db);
    assert_contents(&store, more, "after a start on a full disk");
    let t: Tree<String> = store.tree("pods").expect("tree");
    assert_eq!(t.get("late").expect("get").as_deref(), Some("z"));
    drop(t);
    drop(store);

    // sled itself fails to write (its log file made immutable, as a failing flash or a
    // filesystem gone read-only would): the store holds what sled lost, opens sled
    // again once the file takes writes, and writes it all.
    let store = Store::open(&db).expect("open");
    let t: Tree<String> = store.tree("pods").expect("tree");
    chattr("+i", &db.join("db"));
    let unlock = Unlock(db.join("db"));
    t.put("before/00", &"changed while sled failed".to_string())
        .expect("put");
    t.put("sled-failed", &"kept".to_string()).expect("put");
    store.flush().expect("flush");
    let (held, _) = store.holding().expect("sled's failure holds writes");
    assert!(held.reason.contains("sled could not"), "{}", held.reason);
    assert_eq!(
        t.get("before/00").expect("reads go on").as_deref(),
        Some("changed while sled failed")
    );
    drop(unlock);
    wait_for(
        "sled opened again and the writes replayed",
        Duration::from_secs(10),
        || store.holding().is_none(),
    );
    t.put("after", &"new".to_string()).expect("put");
    store.flush().expect("flush");
    drop(t);
    drop(store);
    let store = Store::open(&db).expect("reopen");
    let t: Tree<String> = store.tree("pods").expect("tree");
    for (k, v) in [
        ("before/00", "changed while sled failed"),
        ("sled-failed", "kept"),
        ("after", "new"),
        ("late", "z"),
    ] {
        assert_eq!(t.get(k).expect("get").as_deref(), Some(v), "{k}");
    }
    assert!(
        !fs.mount
            .read_dir()
            .expect("mount")
            .flatten()
            .any(|e| e.file_name().to_string_lossy().contains("broken")),
        "nothing was moved aside"
    );
}

fn chattr(flag: &str, path: &std::path::Path) {
    let st = std::process::Command::new("chattr")
        .arg(flag)
        .arg(path)
        .status()
        .expect("chattr");
    assert!(st.success(), "chattr {flag} {}", path.display());
}

/// Makes the file writable again when dropped, even when the test fails.
struct Unlock(std::path::PathBuf);

impl Drop for Unlock {
    fn drop(&mut self) {
        let _ = std::process::Command::new("chattr")
            .arg("-i")
            .arg(&self.0)
            .status();
    }
}

/// The node's DiskPressure condition as the cluster has it.
fn disk_pressure(api: &apiserver::ApiServerDouble) -> Option<(String, String)> {
    let node = api.get_node(NODE)?;
    let c = node
        .status?
        .conditions?
        .into_iter()
        .find(|c| c.type_ == "DiskPressure")?;
    Some((c.status, c.reason.unwrap_or_default()))
}

fn pressure_is(api: &apiserver::ApiServerDouble, status: &str) -> bool {
    disk_pressure(api).is_some_and(|(s, _)| s == status)
}

#[test]
fn a_full_disk_keeps_pods_running_reports_disk_pressure_and_loses_nothing() {
    if !need_root() {
        return;
    }
    // Declared first, dropped last: the agent and its containers go before the
    // filesystem they run on, even when the test fails.
    let mut fs_slot: Option<LoopFs>;
    let mut s = Site::new("disk-full");
    // The whole root dir (store, containers, logs, images) on a small filesystem.
    let image = s.a.dir.join("busybox.tar");
    std::fs::rename(s.a.root.join("images/busybox.tar"), &image).expect("keep the image");
    fs_slot = Some(LoopFs::mount(&s.a.root, 64).expect("loop filesystem"));
    let fs = fs_slot.as_ref().expect("mounted");
    std::fs::create_dir_all(s.a.root.join("images")).expect("images dir");
    std::fs::copy(&image, s.a.root.join("images/busybox.tar")).expect("image");

    s.a.write_manifest("steady.yaml", &static_pod_yaml("steady", RUN_FOREVER));
    s.a.start();
    s.run_bound(&[("crasher", RUN_FOREVER)]);
    let steady_name = format!("steady-{NODE}");
    wait(&s.api, &s.a, "the mirror pod of steady Running", |api| {
        running_in_cluster(api, &steady_name)
    });
    wait(&s.api, &s.a, "DiskPressure False", |api| {
        pressure_is(api, "False")
    });
    let steady = s.a.pod("steady").expect("steady");
    let steady_pid = container_pid(&s.a, &steady);
    let crasher = s.a.pod("crasher").expect("crasher");
    let crasher_pid = container_pid(&s.a, &crasher);

    let filler = fs.fill("filler");
    wait(&s.api, &s.a, "DiskPressure True", |api| {
        pressure_is(api, "True")
    });
    assert_eq!(
        disk_pressure(&s.api).map(|(_, r)| r).as_deref(),
        Some("KubeletHasDiskPressure")
    );

    // While the disk is full a new static pod arrives: the store keeps it, though no
    // container can be made for it yet.
    s.a.write_manifest("late.yaml", &static_pod_yaml("late", RUN_FOREVER));
    s.a.wait_until("late to be known", WAIT, |a| a.pod("late").is_some());
    assert_eq!(fs.free(), 0, "still full");
    // And a container dies: its exit is still recorded, with its true code and time.
    let killed_at = k8s_openapi::jiff::Timestamp::now();
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(crasher_pid),
        nix::sys::signal::Signal::SIGKILL,
    )
    .expect("kill the crasher's container");
    wait(&s.api, &s.a, "the crasher's exit reported", |api| {
        cluster_container(api, "crasher").is_some_and(|c| {
            let last = c.last_state.and_then(|l| l.terminated);
            let now = c.state.and_then(|s| s.terminated);
            last.or(now).is_some_and(|t| t.exit_code == 137)
        })
    });
    assert!(pid_alive(steady_pid), "the steady pod's container runs on");
    let steady_now = s.a.pod("steady").expect("steady");
    assert_eq!(container_id(&steady_now), container_id(&steady));
    assert_eq!(restart_count(&steady_now), 0);

    // Space frees: the crasher runs again with its true last state, late starts, and
    // DiskPressure clears.
    std::fs::remove_file(&filler).expect("free the space");
    wait(&s.api, &s.a, "DiskPressure False again", |api| {
        pressure_is(api, "False")
    });
    wait(&s.api, &s.a, "the crasher running again", |api| {
        running_in_cluster(api, "crasher")
    });
    let cs = cluster_container(&s.api, "crasher").expect("crasher status");
    assert_eq!(cs.restart_count, 1);
    let last = cs
        .last_state
        .and_then(|l| l.terminated)
        .expect("lastState.terminated");
    assert_eq!(last.exit_code, 137, "the exit recorded on the full disk");
    let finished = last.finished_at.expect("finishedAt").0;
    assert!(
        finished.as_second() >= killed_at.as_second(),
        "finishedAt {finished} is when it was killed ({killed_at}) or later"
    );
    let late = s.a.wait_pod("late", "running", WAIT, running_here);
    assert!(
        pid_alive(steady_pid),
        "the steady pod's container ran throughout"
    );

    // The store is intact: a restarted agent opens it, adopts every container and
    // knows every pod, including the one that arrived while the disk was full.
    let before: Vec<(String, String)> = ["steady", "crasher", "late"]
        .iter()
        .map(|n| {
            let p = s.a.pod(n).expect("pod");
            (n.to_string(), container_id(&p))
        })
        .collect();
    s.a.kill9();
    s.a.start();
    for (name, id) in &before {
        let p: Value = s.a.wait_pod(name, "adopted", WAIT, running_here);
        assert_eq!(&container_id(&p), id, "{name}: the same container, adopted");
    }
    assert_eq!(container_id(&late), before[2].1);
    let log = s.a.agent_log();
    assert!(!log.contains("STORE LOST"), "the store was not moved aside");
    assert!(
        !s.a.root
            .join("db")
            .with_file_name("store-moved-aside")
            .exists(),
        "no store was moved aside"
    );
    s.a.stop();
    s.a.reset();
    drop(fs_slot.take());
    s.a.assert_clean();
}
