//! A root dir that is not a plain absolute path, as gateways have it: reached through a
//! symlink (`/var/lib/holdfast -> /data/holdfast`, the state on a data partition) or
//! given relative (`--root-dir ./state`). Pods with a hostPath mounted by `subPath`
//! come and go without touching the host's files, a crash-looping pod's restarts leave
//! no mounts behind, and `holdfast reset` removes everything. Real containers, as root.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde_json::Value;
use support::agent::{busybox_tar, container, need_root, sh_pod, Agent};

const WAIT: Duration = Duration::from_secs(90);

/// Mount points at or below `root` (a resolved path, as the kernel lists them).
fn mounts_under(root: &Path) -> Vec<String> {
    let table = std::fs::read_to_string("/proc/self/mountinfo").expect("mountinfo");
    table
        .lines()
        .filter_map(|l| l.split(' ').nth(4))
        .filter(|mp| Path::new(mp).starts_with(root))
        .map(str::to_owned)
        .collect()
}

/// A pod whose container writes into the hostPath `host`'s `sub` through a `subPath`
/// mount, and keeps running.
fn host_path_pod(host: &Path) -> String {
    sh_pod(
        "keeper",
        &format!(
            "  terminationGracePeriodSeconds: 1\n  volumes:\n  \
             - {{name: host, hostPath: {{path: {}, type: Directory}}}}\n  \
             - {{name: scratch, emptyDir: {{}}}}\n",
            host.display()
        ),
        "main",
        "echo from-pod > /data/from-pod && echo x > /scratch/x && echo END; exec sleep 3600",
        "    volumeMounts:\n    - {name: host, mountPath: /data, subPath: sub}\n    \
         - {name: scratch, mountPath: /scratch}\n",
    )
}

/// The host's directory behind the hostPath, with files of its own.
fn host_dir(a: &Agent) -> PathBuf {
    let host = a.dir.join("host-data");
    std::fs::create_dir_all(host.join("sub")).expect("host dir");
    std::fs::write(host.join("sub/keep.txt"), "host file\n").expect("host file");
    std::fs::write(host.join("other.txt"), "other host file\n").expect("host file");
    host
}

fn restarts(p: &Value) -> u64 {
    container(p, "main")["restartCount"].as_u64().unwrap_or(0)
}

/// The containers whose mounts are under `root`, by the 64-hex ids in their paths.
fn containers_mounted(root: &Path) -> Vec<String> {
    let mut ids: Vec<String> = mounts_under(root)
        .iter()
        .filter_map(|m| {
            m.split('/')
                .find(|c| c.len() == 64 && c.bytes().all(|b| b.is_ascii_hexdigit()))
                .map(str::to_owned)
        })
        .collect();
    ids.sort();
    ids.dedup();
    ids
}

/// Waits for pod `crasher` to back off after its `n`th restart, and returns the id of
/// the container that last exited (the one the kubelet keeps), checking meanwhile that
/// no more than one of its containers has mounts: a restart removes the one kept
/// before it starts the next.
fn backing_off_after(a: &Agent, root: &Path, n: u64) -> String {
    let deadline = Instant::now() + WAIT;
    loop {
        let p = a.pod("crasher").expect("crasher");
        let mounted = containers_mounted(root);
        assert!(
            mounted.len() <= 1,
            "containers of one crash-looping pod with mounts at once: {mounted:#?}\n{:#?}",
            mounts_under(root)
        );
        let main = container(&p, "main");
        if restarts(&p) >= n && main["state"]["waiting"].is_object() {
            let id = main["lastState"]["terminated"]["containerID"]
                .as_str()
                .expect("the last exit's containerID");
            return id.rsplit('/').next().unwrap_or(id).to_owned();
        }
        assert!(
            Instant::now() < deadline,
            "crasher not seen backing off after restart {n}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Runs a hostPath/subPath pod and a crash-looping pod on `a`, removes the first, then
/// resets the root with the second still there. `root` is the root dir resolved.
fn pods_come_and_go(a: &mut Agent, root: &Path) {
    let host = host_dir(a);
    a.start();
    a.write_manifest("keeper.yaml", &host_path_pod(&host));
    a.write_manifest("crasher.yaml", &sh_pod("crasher", "", "main", "exit 1", ""));
    a.output("keeper");
    assert_eq!(
        std::fs::read_to_string(host.join("sub/from-pod")).expect("written through subPath"),
        "from-pod\n"
    );

    let uid = a.pod("keeper").expect("keeper")["pod"]["metadata"]["uid"]
        .as_str()
        .expect("uid")
        .to_owned();
    let pod_dir = root.join("pods").join(&uid);
    a.remove_manifest("keeper.yaml");
    a.wait_gone("keeper", WAIT);
    let deadline = Instant::now() + WAIT;
    while pod_dir.exists() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(100));
    }
    // The host's files stay, whatever became of the pod's dir.
    for f in ["sub/keep.txt", "sub/from-pod", "other.txt"] {
        assert!(
            host.join(f).exists(),
            "host file {f} deleted with the pod\n{}",
            a.agent_log()
        );
    }
    assert!(!pod_dir.exists(), "pod dir left: {}", a.agent_log());
    let left: Vec<String> = mounts_under(root)
        .into_iter()
        .filter(|m| m.contains(&uid))
        .collect();
    assert!(left.is_empty(), "mounts of the removed pod left: {left:#?}");

    // Each exit's container goes with all of its mounts.
    let early_at = restarts(&a.pod("crasher").expect("crasher")) + 1;
    let early = backing_off_after(a, root, early_at);
    let later = backing_off_after(a, root, early_at + 2);
    assert_ne!(early, later, "the same container exited twice");
    let left: Vec<String> = mounts_under(root)
        .into_iter()
        .filter(|m| m.contains(&early))
        .collect();
    assert!(
        left.is_empty(),
        "mounts of container {early}, two restarts ago, left: {left:#?}"
    );

    // The crash-looping pod is still there: reset stops it and removes everything.
    a.reset();
    a.assert_clean();
    let left = mounts_under(root);
    assert!(left.is_empty(), "mounts left under the root: {left:#?}");
    assert!(
        std::fs::read_dir(root).map_or(true, |mut d| d.next().is_none()),
        "reset left files in the root"
    );
    assert!(
        host.join("sub/keep.txt").exists(),
        "reset deleted host files"
    );
}

#[test]
fn a_root_dir_reached_through_a_symlink() {
    if !need_root() {
        return;
    }
    let mut a = Agent::new("root-symlink");
    // The state on a "data partition", the configured root a symlink to it.
    let data = a.dir.join("data/holdfast");
    std::fs::create_dir_all(data.parent().expect("parent")).expect("data dir");
    std::fs::rename(&a.root, &data).expect("move the root");
    std::os::unix::fs::symlink(&data, &a.root).expect("symlink the root");
    pods_come_and_go(&mut a, &data);
    // The link is the host's layout: reset emptied its target and kept both, so that
    // an agent starts there again.
    assert!(data.is_dir(), "reset removed the symlink's target");
    std::fs::create_dir_all(data.join("images")).expect("images dir");
    std::fs::copy(busybox_tar(), data.join("images/busybox.tar")).expect("copy image");
    a.write_manifest(
        "again.yaml",
        &sh_pod("again", "", "main", "echo END; exec sleep 3600", ""),
    );
    a.start();
    a.wait_pod("again", "running", WAIT, |p| {
        container(p, "main")["state"]["running"].is_object()
    });
    a.reset();
    a.assert_clean();
}

#[test]
fn a_relative_root_dir() {
    if !need_root() {
        return;
    }
    let mut a = Agent::new("root-relative");
    a.cwd = Some(a.dir.clone());
    a.root_arg = Some(PathBuf::from("./root"));
    let root = a.root.canonicalize().expect("root");
    pods_come_and_go(&mut a, &root);
}
