//! The static pod file source against the manifests in tests/fixtures.

use std::path::{Path, PathBuf};
use std::time::Duration;

use holdfast::pod::annotations::CONFIG_SEEN;
use holdfast::source::{read_manifests, spawn_file_source, SourceSnapshot};
use k8s_openapi::api::core::v1::Pod;
use tokio::sync::mpsc;

use support::tempdir;
use tempdir::TempDir;

const NODE: &str = "gw-1";

/// A temp dir holding copies of the named fixtures.
fn with_fixtures(tag: &str, names: &[&str]) -> TempDir {
    let dir = TempDir::new(tag);
    for name in names {
        std::fs::copy(fixture(name), dir.0.join(name)).expect("copy fixture");
    }
    dir
}

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name)
}

fn names(pods: &[Pod]) -> Vec<String> {
    pods.iter()
        .map(|p| {
            format!(
                "{}/{}",
                p.metadata.namespace.as_deref().unwrap_or(""),
                p.metadata.name.as_deref().unwrap_or("")
            )
        })
        .collect()
}

fn without_seen(mut pod: Pod) -> Pod {
    if let Some(a) = pod.metadata.annotations.as_mut() {
        a.remove(CONFIG_SEEN);
    }
    pod
}

/// Reads one fixture alone and returns its single error's text.
fn only_error(name: &str) -> String {
    let dir = with_fixtures("one", &[name]);
    let (pods, errors) = read_manifests(&dir.0, NODE);
    assert!(pods.is_empty(), "{name} gave pods: {:?}", names(&pods));
    assert_eq!(errors.len(), 1, "{name}: {errors:?}");
    let msg = errors[0].to_string();
    assert!(msg.contains(name), "error does not name the file: {msg}");
    msg
}

#[test]
fn sleep_manifest_becomes_a_static_pod() {
    let dir = with_fixtures("sleep", &["sleep.yaml"]);
    let (pods, errors) = read_manifests(&dir.0, NODE);
    assert!(errors.is_empty(), "{errors:?}");
    assert_eq!(names(&pods), ["default/sleep-gw-1"]);
    let pod = &pods[0];
    let uid = pod.metadata.uid.as_deref().expect("uid");
    assert_eq!(uid.len(), 32);
    let ann = pod.metadata.annotations.as_ref().expect("annotations");
    assert_eq!(ann["kubernetes.io/config.source"], "file");
    assert_eq!(ann["kubernetes.io/config.hash"], uid);
    assert!(ann[CONFIG_SEEN]
        .parse::<k8s_openapi::jiff::Timestamp>()
        .is_ok());
    let spec = pod.spec.as_ref().expect("spec");
    assert_eq!(spec.node_name.as_deref(), Some(NODE));
    let c = &spec.containers[0];
    assert_eq!(c.image.as_deref(), Some("busybox:demo"));
    assert_eq!(
        c.command.as_deref(),
        Some(&["sleep".to_string(), "3600".to_string()][..])
    );
    assert_eq!(c.image_pull_policy.as_deref(), Some("IfNotPresent"));

    // Same folder, same content: same UID on every read.
    let (again, _) = read_manifests(&dir.0, NODE);
    assert_eq!(again[0].metadata.uid, pod.metadata.uid);
}

#[test]
fn multi_document_file_gives_each_pod() {
    let dir = with_fixtures("multi", &["multi.yaml"]);
    let (pods, errors) = read_manifests(&dir.0, NODE);
    assert!(errors.is_empty(), "{errors:?}");
    assert_eq!(names(&pods), ["default/first-gw-1", "edge/second-gw-1"]);
    assert_ne!(pods[0].metadata.uid, pods[1].metadata.uid);
    let second = pods[1].spec.as_ref().expect("spec");
    assert_eq!(second.restart_policy.as_deref(), Some("OnFailure"));
    assert_eq!(
        second.containers[0].image_pull_policy.as_deref(),
        Some("Always")
    );
    let port = &second.containers[0].ports.as_ref().expect("ports")[0];
    assert_eq!(port.protocol.as_deref(), Some("TCP"));
}

#[test]
fn invalid_yaml_names_file_and_position() {
    let msg = only_error("invalid-yaml.yaml");
    assert!(msg.contains("not valid YAML"), "{msg}");
    assert!(msg.contains("line "), "{msg}");
}

#[test]
fn wrong_kind_is_refused() {
    let msg = only_error("deployment.yaml");
    assert!(msg.contains("kind Deployment"), "{msg}");
    assert!(msg.contains("expected apiVersion v1 and kind Pod"), "{msg}");
}

#[test]
fn missing_image_names_the_field() {
    let msg = only_error("missing-image.yaml");
    assert!(msg.contains("spec.containers[0].image: required"), "{msg}");
}

#[test]
fn bad_restart_policy_names_the_field() {
    let msg = only_error("bad-restart-policy.yaml");
    assert!(msg.contains("spec.restartPolicy"), "{msg}");
    assert!(msg.contains("\"Sometimes\""), "{msg}");
}

#[test]
fn duplicate_container_names_are_refused() {
    let msg = only_error("duplicate-containers.yaml");
    assert!(
        msg.contains("spec.containers[1].name: duplicate container name \"main\""),
        "{msg}"
    );
}

#[test]
fn wrong_type_names_path_line_and_column() {
    let msg = only_error("wrong-type.yaml");
    assert!(
        msg.contains("spec.containers[0].ports[0].containerPort"),
        "{msg}"
    );
    assert!(msg.contains("line 10 column"), "{msg}");
}

#[test]
fn bad_files_do_not_affect_good_ones() {
    let all = [
        "sleep.yaml",
        "multi.yaml",
        "invalid-yaml.yaml",
        "deployment.yaml",
        "missing-image.yaml",
        "bad-restart-policy.yaml",
        "duplicate-containers.yaml",
        "wrong-type.yaml",
    ];
    let dir = with_fixtures("mixed", &all);
    let (pods, errors) = read_manifests(&dir.0, NODE);
    assert_eq!(
        names(&pods),
        [
            "default/first-gw-1",
            "edge/second-gw-1",
            "default/sleep-gw-1"
        ]
    );
    assert_eq!(errors.len(), 6, "{errors:#?}");

    // The good pods are exactly what they are when read on their own.
    for name in ["sleep.yaml", "multi.yaml"] {
        std::fs::remove_file(dir.0.join(name)).expect("rm");
    }
    let alone = TempDir::new("alone");
    for name in ["sleep.yaml", "multi.yaml"] {
        std::fs::copy(fixture(name), alone.0.join(name)).expect("copy");
    }
    let (alone_pods, _) = read_manifests(&alone.0, NODE);
    let strip = |pods: &[Pod]| -> Vec<Pod> {
        pods.iter()
            .cloned()
            .map(without_seen)
            .map(|mut p| {
                // The UID hashes the file's path, which differs between the two folders,
                // as does the file the pod names.
                p.metadata.uid = None;
                if let Some(a) = p.metadata.annotations.as_mut() {
                    a.remove("kubernetes.io/config.hash");
                    a.remove(holdfast::pod::annotations::MANIFEST_FILE);
                }
                p
            })
            .collect()
    };
    assert_eq!(strip(&pods), strip(&alone_pods));
}

#[test]
fn the_later_of_two_files_with_one_pod_name_is_refused() {
    let dir = TempDir::new("clash");
    std::fs::copy(fixture("sleep.yaml"), dir.0.join("a-sleep.yaml")).expect("copy");
    let edited = std::fs::read_to_string(fixture("sleep.yaml"))
        .expect("read")
        .replace("3600", "60");
    std::fs::write(dir.0.join("b-sleep.yaml"), edited).expect("write");
    let (pods, errors) = read_manifests(&dir.0, NODE);
    assert_eq!(names(&pods), ["default/sleep-gw-1"]);
    let cmd = pods[0].spec.as_ref().expect("spec").containers[0]
        .command
        .clone();
    assert_eq!(cmd, Some(vec!["sleep".to_string(), "3600".to_string()]));
    assert_eq!(errors.len(), 1);
    let msg = errors[0].to_string();
    assert!(
        msg.contains("b-sleep.yaml") && msg.contains("a-sleep.yaml"),
        "{msg}"
    );
}

#[test]
fn only_visible_manifest_files_are_read() {
    let dir = with_fixtures("filter", &["sleep.yaml"]);
    let sleep = std::fs::read_to_string(fixture("sleep.yaml")).expect("read");
    for name in [".hidden.yaml", "notes.txt", "sleep.yaml.swp", "sleep.yaml~"] {
        std::fs::write(
            dir.0.join(name),
            sleep.replace("name: sleep", "name: other"),
        )
        .expect("write");
    }
    std::fs::create_dir(dir.0.join("sub.yaml")).expect("mkdir");
    let (pods, errors) = read_manifests(&dir.0, NODE);
    assert!(errors.is_empty(), "{errors:?}");
    assert_eq!(names(&pods), ["default/sleep-gw-1"]);
}

#[test]
fn json_manifests_are_read() {
    let dir = TempDir::new("json");
    std::fs::write(
        dir.0.join("web.json"),
        "{\n\t\"apiVersion\": \"v1\",\n\t\"kind\": \"Pod\",\n\t\"metadata\": {\"name\": \"web\"},\n\t\"spec\": {\"containers\": [{\"name\": \"web\", \"image\": \"busybox:demo\"}]}\n}\n",
    )
    .expect("write");
    let (pods, errors) = read_manifests(&dir.0, NODE);
    assert!(errors.is_empty(), "{errors:?}");
    assert_eq!(names(&pods), ["default/web-gw-1"]);
}

#[test]
fn a_missing_folder_is_empty() {
    let (pods, errors) = read_manifests(Path::new("/nonexistent/holdfast/manifests"), NODE);
    assert!(pods.is_empty());
    assert!(errors.is_empty(), "{errors:?}");
}

async fn next(rx: &mut mpsc::Receiver<SourceSnapshot>) -> SourceSnapshot {
    tokio::time::timeout(Duration::from_secs(5), rx.recv())
        .await
        .expect("a snapshot within 5 s")
        .expect("source still running")
}

async fn nothing_within(rx: &mut mpsc::Receiver<SourceSnapshot>, wait: Duration) {
    if let Ok(Some(s)) = tokio::time::timeout(wait, rx.recv()).await {
        panic!("unexpected snapshot: {:?}", names(&s.pods));
    }
}

/// Writes through a hidden temporary file and a rename, as careful tools do.
fn write_atomic(path: &Path, text: &str) {
    let tmp = path.with_file_name(format!(
        ".{}.tmp",
        path.file_name().and_then(|n| n.to_str()).unwrap_or("x")
    ));
    std::fs::write(&tmp, text).expect("write");
    std::fs::rename(&tmp, path).expect("rename");
}

#[tokio::test]
async fn watcher_follows_the_folder() {
    let dir = TempDir::new("watch");
    let (tx, mut rx) = mpsc::channel(4);
    // A long period: every change below must arrive through inotify.
    let handle = spawn_file_source(
        dir.0.clone(),
        NODE.into(),
        Duration::from_secs(600),
        Vec::new(),
        tx,
    )
    .expect("spawn")
    .0;

    let first = next(&mut rx).await;
    assert_eq!(first.source, "file");
    assert!(first.pods.is_empty());

    let sleep = std::fs::read_to_string(fixture("sleep.yaml")).expect("read");
    let path = dir.0.join("sleep.yaml");
    std::fs::write(&path, &sleep).expect("write");
    let added = next(&mut rx).await;
    assert_eq!(names(&added.pods), ["default/sleep-gw-1"]);
    let uid = added.pods[0].metadata.uid.clone();

    // Half-written: the pod stays and nothing is sent.
    std::fs::write(&path, "apiVersion: v1\nkind: Pod\nmetadata: {name: sleep\n").expect("write");
    nothing_within(&mut rx, Duration::from_millis(700)).await;

    // Saved for good with an edit: a new UID replaces the pod.
    write_atomic(&path, &sleep.replace("3600", "7200"));
    let edited = next(&mut rx).await;
    assert_eq!(names(&edited.pods), ["default/sleep-gw-1"]);
    assert_ne!(edited.pods[0].metadata.uid, uid);

    // Unrelated files change nothing.
    std::fs::write(dir.0.join("README.txt"), "hello").expect("write");
    nothing_within(&mut rx, Duration::from_millis(500)).await;

    std::fs::remove_file(&path).expect("rm");
    let removed = next(&mut rx).await;
    assert!(removed.pods.is_empty());

    drop(rx);
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while !handle.is_finished() {
        assert!(std::time::Instant::now() < deadline, "source did not stop");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    handle.join().expect("join");
}

#[tokio::test]
async fn unchanged_folder_sends_nothing_on_resync() {
    let dir = with_fixtures("resync", &["sleep.yaml"]);
    let (tx, mut rx) = mpsc::channel(4);
    let _handle = spawn_file_source(
        dir.0.clone(),
        NODE.into(),
        Duration::from_millis(100),
        Vec::new(),
        tx,
    )
    .expect("spawn")
    .0;
    let first = next(&mut rx).await;
    assert_eq!(names(&first.pods), ["default/sleep-gw-1"]);
    nothing_within(&mut rx, Duration::from_millis(800)).await;
}

#[tokio::test]
async fn a_folder_that_appears_later_is_picked_up() {
    let parent = TempDir::new("late");
    let dir = parent.0.join("manifests");
    let (tx, mut rx) = mpsc::channel(4);
    let _handle = spawn_file_source(
        dir.clone(),
        NODE.into(),
        Duration::from_millis(300),
        Vec::new(),
        tx,
    )
    .expect("spawn")
    .0;
    assert!(next(&mut rx).await.pods.is_empty());

    std::fs::create_dir(&dir).expect("mkdir");
    std::fs::copy(fixture("sleep.yaml"), dir.join("sleep.yaml")).expect("copy");
    let found = next(&mut rx).await;
    assert_eq!(names(&found.pods), ["default/sleep-gw-1"]);

    // Removed and made again: watched again.
    std::fs::remove_dir_all(&dir).expect("rm");
    assert!(next(&mut rx).await.pods.is_empty());
    std::fs::create_dir(&dir).expect("mkdir");
    nothing_within(&mut rx, Duration::from_millis(700)).await;
    std::fs::copy(fixture("multi.yaml"), dir.join("multi.yaml")).expect("copy");
    let found = next(&mut rx).await;
    assert_eq!(
        names(&found.pods),
        ["default/first-gw-1", "edge/second-gw-1"]
    );
}

/// A restart after a power cut: the first scan comes back from the call itself, a
/// manifest the cut left empty keeps the pods the store holds from it, and one whose
/// file is gone gives none.
#[tokio::test]
async fn after_a_power_cut_an_empty_manifest_keeps_its_pods_and_a_missing_one_has_none() {
    let dir = TempDir::new("cut");
    let sleep = std::fs::read_to_string(fixture("sleep.yaml")).expect("read");
    std::fs::write(
        dir.0.join("kept.yaml"),
        sleep.replace("name: sleep", "name: kept"),
    )
    .expect("write");
    std::fs::write(
        dir.0.join("gone.yaml"),
        sleep.replace("name: sleep", "name: gone"),
    )
    .expect("write");
    let (before, errors) = read_manifests(&dir.0, NODE);
    assert!(errors.is_empty(), "{errors:?}");
    assert_eq!(names(&before), ["default/gone-gw-1", "default/kept-gw-1"]);

    // What a power cut leaves: kept.yaml's name with no content, gone.yaml not at all.
    std::fs::write(dir.0.join("kept.yaml"), "").expect("truncate");
    std::fs::remove_file(dir.0.join("gone.yaml")).expect("rm");
    let (alone, errors) = read_manifests(&dir.0, NODE);
    assert!(alone.is_empty(), "{:?}", names(&alone));
    assert!(
        errors
            .iter()
            .any(|e| e.to_string().contains("file is empty")),
        "{errors:?}"
    );

    let (tx, mut rx) = mpsc::channel(4);
    let (_handle, first) = spawn_file_source(
        dir.0.clone(),
        NODE.into(),
        Duration::from_secs(600),
        before.clone(),
        tx,
    )
    .expect("spawn");
    let first = first.expect("the first scan");
    assert_eq!(names(&first.pods), ["default/kept-gw-1"]);
    assert_eq!(first.pods[0].metadata.uid, before[1].metadata.uid);
    // The thread sends the same at once.
    assert_eq!(names(&next(&mut rx).await.pods), ["default/kept-gw-1"]);

    // Still empty after another write: still kept. Removed: the pods go.
    write_atomic(&dir.0.join("kept.yaml"), "");
    nothing_within(&mut rx, Duration::from_millis(500)).await;
    std::fs::remove_file(dir.0.join("kept.yaml")).expect("rm");
    assert!(next(&mut rx).await.pods.is_empty());
}

/// What the source must never do: spend minutes on one file, or wait for ever on one.
/// A file of 100 000 nested arrays, a link to /proc/kmsg (a regular file of size 0 that
/// blocks when read) and a FIFO with no writer sit in the folder; the first scan ends at
/// once, says what is wrong with each, and a good manifest added later is picked up.
#[tokio::test]
async fn deep_endless_and_fifo_files_neither_stall_nor_block_the_source() {
    let dir = TempDir::new("stall");
    let depth = 100_000;
    std::fs::write(
        dir.0.join("nested.json"),
        format!("{}{}", "[".repeat(depth), "]".repeat(depth)),
    )
    .expect("write");
    let kmsg = Path::new("/proc/kmsg");
    let with_kmsg = kmsg.exists();
    if with_kmsg {
        std::os::unix::fs::symlink(kmsg, dir.0.join("kmsg.yaml")).expect("symlink");
    } else {
        eprintln!("no /proc/kmsg here: only the nested file and the FIFO are tried");
    }
    nix::unistd::mkfifo(
        &dir.0.join("fifo.yaml"),
        nix::sys::stat::Mode::from_bits_truncate(0o600),
    )
    .expect("mkfifo");

    // The first scan runs in the caller: on a thread of its own here, so a source that
    // blocks fails the test instead of hanging it.
    let (tx, mut rx) = mpsc::channel(4);
    let (done_tx, done_rx) = std::sync::mpsc::channel();
    let folder = dir.0.clone();
    let started = std::time::Instant::now();
    std::thread::spawn(move || {
        let spawned = spawn_file_source(
            folder,
            NODE.into(),
            Duration::from_secs(600),
            Vec::new(),
            tx,
        );
        let _ = done_tx.send(spawned.map(|(handle, first)| (handle, first.map(|s| s.pods.len()))));
    });
    let (handle, first) = done_rx
        .recv_timeout(Duration::from_secs(10))
        .expect("the first scan ends within 10 s")
        .expect("spawn");
    assert_eq!(first, Some(0));
    let took = started.elapsed();
    assert!(took < Duration::from_secs(5), "first scan took {took:?}");
    assert!(next(&mut rx).await.pods.is_empty());

    // A good manifest added afterwards is picked up.
    std::fs::copy(fixture("sleep.yaml"), dir.0.join("sleep.yaml")).expect("copy");
    let found = next(&mut rx).await;
    assert_eq!(names(&found.pods), ["default/sleep-gw-1"]);

    // Each bad file is reported, by name, with why.
    let (pods, errors) = read_manifests(&dir.0, NODE);
    assert_eq!(names(&pods), ["default/sleep-gw-1"]);
    let said: Vec<String> = errors.iter().map(ToString::to_string).collect();
    let about = |file: &str| {
        said.iter()
            .find(|e| e.contains(file))
            .unwrap_or_else(|| panic!("nothing said about {file}: {said:?}"))
            .clone()
    };
    assert!(
        about("nested.json").contains("nested deeper than 64 levels"),
        "{said:?}"
    );
    assert!(
        about("fifo.yaml").contains("is a FIFO, not a regular file"),
        "{said:?}"
    );
    if with_kmsg {
        assert!(about("kmsg.yaml").contains("is on procfs"), "{said:?}");
    }
    assert_eq!(errors.len(), if with_kmsg { 3 } else { 2 }, "{said:?}");

    drop(rx);
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while !handle.is_finished() {
        assert!(std::time::Instant::now() < deadline, "source did not stop");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[test]
fn oversized_and_alias_bomb_manifests_are_refused_by_name() {
    let dir = TempDir::new("big");
    let sleep = std::fs::read_to_string(fixture("sleep.yaml")).expect("read");
    // A valid pod padded past 1 MiB with a comment.
    let big = format!("{sleep}# {}\n", "x".repeat(1024 * 1024));
    std::fs::write(dir.0.join("big.yaml"), big).expect("write");
    let mut bomb = String::from("a0: &a0 [x, x, x, x, x, x, x, x, x, x]\n");
    for i in 1..9 {
        let p = i - 1;
        bomb.push_str(&format!(
            "a{i}: &a{i} [{}]\n",
            vec![format!("*a{p}"); 10].join(", ")
        ));
    }
    std::fs::write(dir.0.join("bomb.yaml"), bomb).expect("write");
    let started = std::time::Instant::now();
    let (pods, errors) = read_manifests(&dir.0, NODE);
    assert!(started.elapsed() < Duration::from_secs(5));
    assert!(pods.is_empty());
    let said: Vec<String> = errors.iter().map(ToString::to_string).collect();
    assert_eq!(said.len(), 2, "{said:?}");
    assert!(
        said[0].contains("big.yaml") && said[0].contains("larger than the 1048576 bytes allowed"),
        "{said:?}"
    );
    assert!(
        said[1].contains("bomb.yaml") && said[1].contains("once its aliases are expanded"),
        "{said:?}"
    );
}
