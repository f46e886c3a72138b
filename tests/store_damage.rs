//! A damaged store, with real containers (as root): a sled file that will not open is
//! moved aside and nothing on disk is lost with it (images stay, and are listed and
//! used again, with no registry); a sled file that opens on an older state is noticed
//! and not believed; a panic inside sled at open moves the store aside instead of
//! taking the agent down.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use support::agent::{bin, container, container_pid, need_root, pid_alive, Agent};

const MIN: Duration = Duration::from_secs(60);

fn pod_yaml(name: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: {name}\nspec:\n  hostNetwork: true\n  \
         terminationGracePeriodSeconds: 1\n  containers:\n    - name: main\n      \
         image: busybox:demo\n      command: [\"sh\", \"-c\", \"exec sleep 1000\"]\n"
    )
}

fn running(p: &serde_json::Value) -> bool {
    container(p, "main")["state"]["running"].is_object()
}

/// Names in `dir` (blobs, unpacked layers).
fn names(dir: &Path) -> BTreeSet<String> {
    std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect()
}

fn broken_stores(root: &Path) -> Vec<PathBuf> {
    std::fs::read_dir(root)
        .into_iter()
        .flatten()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with("db.broken-"))
        .map(|e| e.path())
        .collect()
}

fn holdfast(args: &[&str], root: &Path) -> std::process::Output {
    Command::new(bin())
        .args(args)
        .arg("--root-dir")
        .arg(root)
        .output()
        .expect("run holdfast")
}

/// What a user sees of a running container's files: `ls /bin` through its root.
fn container_sees_busybox(pid: i32) -> bool {
    std::fs::read_dir(format!("/proc/{pid}/root/bin"))
        .map(|d| d.flatten().any(|e| e.file_name() == "ls"))
        .unwrap_or(false)
}

/// The store damaged two ways that sled refuses (so the agent moves it aside), with
/// the image's archive gone from the drop-in folder and no registry anywhere: the
/// image's blobs and layers must all stay, the running container must keep its files,
/// the image must be listed under its tag again and a new pod must start from it.
fn image_survives(name: &str, damage: impl Fn(&Path)) {
    let mut a = Agent::new(name);
    a.start();
    a.write_manifest("web.yaml", &pod_yaml("web"));
    let before = a.wait_pod("web", "running", MIN, running);
    let pid = container_pid(&a, &before, "main");
    // Imported once; from now on only the content store holds it.
    std::fs::remove_file(a.root.join("images/busybox.tar")).expect("remove the archive");
    let content = a.root.join("content");
    let blobs = names(&content.join("blobs/sha256"));
    let layers = names(&content.join("layers"));
    assert!(!blobs.is_empty() && !layers.is_empty(), "nothing imported");

    a.kill9();
    damage(&a.root.join("db"));
    a.start();

    assert_eq!(
        broken_stores(&a.root).len(),
        1,
        "the store was not moved aside"
    );
    let after_blobs = names(&content.join("blobs/sha256"));
    let after_layers = names(&content.join("layers"));
    assert!(
        after_blobs.is_superset(&blobs),
        "blobs lost: {:?}\n{}",
        blobs.difference(&after_blobs).collect::<Vec<_>>(),
        a.agent_log()
    );
    assert!(
        after_layers.is_superset(&layers),
        "layers lost: {:?}",
        layers.difference(&after_layers).collect::<Vec<_>>()
    );
    assert!(pid_alive(pid), "the running container was stopped");
    assert!(
        container_sees_busybox(pid),
        "the running container lost its image's files"
    );
    let ls = holdfast(&["image", "ls"], &a.root);
    let listed = String::from_utf8_lossy(&ls.stdout);
    assert!(
        ls.status.success() && listed.contains("busybox") && listed.contains("demo"),
        "image not listed again: {listed}{}",
        String::from_utf8_lossy(&ls.stderr)
    );
    a.write_manifest("fresh.yaml", &pod_yaml("fresh"));
    a.wait_pod(
        "fresh",
        "a new pod running from the kept image",
        MIN,
        running,
    );
    let web = a.wait_pod("web", "adopted", MIN, running);
    assert_eq!(container_pid(&a, &web, "main"), pid, "web was restarted");

    a.reset();
    a.assert_clean();
}

#[test]
fn a_truncated_sled_file_loses_no_image() {
    if !need_root() {
        return;
    }
    image_survives("damage-truncated", |db| {
        let file = std::fs::OpenOptions::new()
            .write(true)
            .open(db.join("db"))
            .expect("open db/db");
        file.set_len(100).expect("truncate db/db");
    });
}

#[test]
fn flipped_bytes_in_sleds_conf_lose_no_image() {
    if !need_root() {
        return;
    }
    image_survives("damage-conf", |db| {
        let path = db.join("conf");
        let mut bytes = std::fs::read(&path).expect("read conf");
        assert!(bytes.len() > 12, "conf too short");
        for b in &mut bytes[8..12] {
            *b ^= 0xff;
        }
        std::fs::write(&path, bytes).expect("write conf");
    });
}

/// sled's recovery stops at the first damaged entry of its log and opens on what came
/// before: the store is back at an older state. Copying sled's files back from an
/// earlier moment leaves exactly that.
#[test]
fn a_store_that_went_back_in_time_is_not_believed() {
    if !need_root() {
        return;
    }
    let mut a = Agent::new("damage-went-back");
    a.start();
    a.write_manifest("keep.yaml", &pod_yaml("keep"));
    a.write_manifest("old.yaml", &pod_yaml("old"));
    let keep = a.wait_pod("keep", "running", MIN, running);
    a.wait_pod("old", "running", MIN, running);
    let keep_pid = container_pid(&a, &keep, "main");
    a.stop();
    let db = a.root.join("db");
    let saved = a.dir.join("db-earlier");
    std::fs::create_dir_all(&saved).expect("saved dir");
    for f in ["db", "conf"] {
        std::fs::copy(db.join(f), saved.join(f)).expect("save sled file");
    }

    a.start();
    a.remove_manifest("old.yaml");
    a.wait_gone("old", MIN);
    a.stop();
    for f in ["db", "conf"] {
        std::fs::copy(saved.join(f), db.join(f)).expect("put the earlier file back");
    }

    // With no agent, `holdfast pods` reads the store itself: it must not show `old`.
    let out = holdfast(&["pods"], &a.root);
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !stdout.contains("old-node-1"),
        "a removed pod is shown from a store that went back in time:\n{stdout}"
    );
    assert!(
        !out.status.success() && stderr.contains("went back in time"),
        "holdfast pods does not say the store went back: {stderr}"
    );

    a.start();
    let log = a.agent_log();
    assert!(
        log.contains("STORE WENT BACK IN TIME"),
        "the agent did not say so:\n{log}"
    );
    assert_eq!(
        broken_stores(&a.root).len(),
        1,
        "the store was not moved aside"
    );
    let keep = a.wait_pod("keep", "adopted", MIN, running);
    assert_eq!(
        container_pid(&a, &keep, "main"),
        keep_pid,
        "keep was restarted"
    );
    assert!(a.pod("old").is_none(), "old is back");
    let out = holdfast(&["pods"], &a.root);
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("went back in time"),
        "holdfast pods does not tell why the store was moved aside"
    );

    a.reset();
    a.assert_clean();
}

/// A panic inside sled while it opens the store. Built with `panic = "abort"`, the
/// agent cannot catch it; it must still come up, with the store moved aside and its
/// containers adopted. sled 0.34 was not found to panic on any damaged file it reads
/// at open, so debug builds panic on request (outside any `catch_unwind`, as an abort).
#[test]
fn a_panic_inside_sled_at_open_moves_the_store_aside() {
    if !need_root() {
        return;
    }
    let mut a = Agent::new("damage-panic");
    a.start();
    a.write_manifest("web.yaml", &pod_yaml("web"));
    let before = a.wait_pod("web", "running", MIN, running);
    let pid = container_pid(&a, &before, "main");
    a.kill9();
    std::fs::write(a.root.join("db/make-sled-panic"), b"").expect("fault file");
    a.extra_env.push((
        "HOLDFAST_TEST_SLED_PANIC_IF".into(),
        "make-sled-panic".into(),
    ));
    a.spawn();
    // Up when it says so a second time; `holdfast pods` alone could read the store
    // itself while no agent answers.
    let deadline = Instant::now() + MIN;
    while a.agent_log().matches("running as node").count() < 2 {
        if let Some(status) = a.exited() {
            panic!(
                "the agent died at start ({status}) instead of moving the store aside:\n{}",
                a.agent_log()
            );
        }
        assert!(
            Instant::now() < deadline,
            "the agent did not come up:\n{}",
            a.agent_log()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    let web = a.wait_pod("web", "adopted", MIN, running);
    assert!(a.exited().is_none(), "the agent died:\n{}", a.agent_log());
    let log = a.agent_log();
    assert!(log.contains("injected: sled panicked"), "{log}");
    assert!(log.contains("STORE LOST"), "{log}");
    let aside = broken_stores(&a.root);
    assert_eq!(aside.len(), 1, "the store was not moved aside");
    assert!(aside[0].join("make-sled-panic").exists());
    assert_eq!(container_pid(&a, &web, "main"), pid, "web was restarted");

    a.reset();
    a.assert_clean();
}
