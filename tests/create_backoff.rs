//! End-to-end: a container the runtime cannot create or start (here a memory limit of
//! one byte, which no cgroup can hold) is retried under CrashLoopBackOff like a
//! container that exits, each failed try leaves nothing behind, and a healthy pod
//! beside it runs on undisturbed.

use std::time::{Duration, Instant};

use serde_json::Value;
use support::agent::{cgroup_dirs, container, need_root, Agent};

const HEALTHY: &str = "apiVersion: v1\nkind: Pod\nmetadata:\n  name: healthy\nspec:\n  \
    hostNetwork: true\n  terminationGracePeriodSeconds: 1\n  containers:\n  - name: main\n    \
    image: busybox:demo\n    command: [\"sleep\", \"3600\"]\n";

const TINY: &str = "apiVersion: v1\nkind: Pod\nmetadata:\n  name: tiny\nspec:\n  \
    hostNetwork: true\n  terminationGracePeriodSeconds: 1\n  containers:\n  - name: main\n    \
    image: busybox:demo\n    command: [\"sleep\", \"3600\"]\n    resources:\n      limits:\n        \
    memory: \"1\"\n";

/// The agent with the kubelet's own CrashLoopBackOff (10 s doubling to 5 min).
fn agent(name: &str) -> Agent {
    let a = Agent::new(name);
    let cfg = format!(
        "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\n\
         fileCheckFrequency: 2s\nsyncFrequency: 5s\ncgroupRoot: {}\n\
         address: {}\nport: {}\nhealthzPort: {}\n\
         holdfast:\n  crashLoopBackOffInitial: 10s\n  crashLoopBackOffMax: 5m\n  \
         evictionMonitoringPeriod: 24h\n",
        a.cgroup_root, a.address, a.port, a.healthz_port
    );
    std::fs::write(a.dir.join("config.yaml"), cfg).expect("config");
    a
}

/// How many times the agent tried to create or start pod `pod`'s containers and
/// failed, as its log says.
fn failed_tries(a: &Agent, pod: &str) -> usize {
    let prefix = format!("pod default/{pod}-{}: container main: ", a.node_name);
    a.agent_log()
        .lines()
        .filter(|l| {
            l.split_once(&prefix).is_some_and(|(_, rest)| {
                rest.starts_with("create container") || rest.starts_with("start container")
            })
        })
        .count()
}

/// The containers' cgroups of pod `uid` that exist now.
fn pod_cgroups(a: &Agent, uid: &str) -> Vec<String> {
    let mut out = Vec::new();
    let needle = uid.replace('-', "_");
    for base in cgroup_dirs(&a.cgroup_root) {
        walk(&base, &mut |p| {
            let s = p.display().to_string();
            if s.contains(uid) || s.contains(&needle) {
                out.push(s);
            }
        });
    }
    out
}

fn walk(dir: &std::path::Path, f: &mut dyn FnMut(&std::path::Path)) {
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        if e.file_type().is_ok_and(|t| t.is_dir()) {
            f(&e.path());
            walk(&e.path(), f);
        }
    }
}

fn started_at(p: &Value) -> Value {
    container(p, "main")["state"]["running"]["startedAt"].clone()
}

#[test]
fn a_container_the_runtime_cannot_create_is_retried_with_back_off() {
    if !need_root() {
        return;
    }
    let mut a = agent("create-backoff");
    a.write_manifest("healthy.yaml", HEALTHY);
    a.start();
    let healthy = a.wait_pod("healthy", "running", Duration::from_secs(60), |p| {
        container(p, "main")["state"]["running"].is_object()
    });
    let healthy_id = container(&healthy, "main")["containerID"].clone();
    let healthy_started = started_at(&healthy);

    a.write_manifest("tiny.yaml", TINY);
    a.wait_until("the first failed try", Duration::from_secs(60), |a| {
        failed_tries(a, "tiny") >= 1
    });
    let first = Instant::now();
    let tiny = a.wait_pod("tiny", "recorded", Duration::from_secs(30), |_| true);
    let uid = tiny["pod"]["metadata"]["uid"]
        .as_str()
        .unwrap_or_default()
        .to_string();

    // Over 25 s: with 10 s doubling, tries come at 0, 10 and 30 s.
    let mut most_shims = 0;
    let mut most_dirs = 0;
    let mut reasons = Vec::new();
    while first.elapsed() < Duration::from_secs(25) {
        most_shims = most_shims.max(a.shim_dirs().len());
        // One container dir per try would pile up: at most the healthy one and the
        // one being tried.
        let dirs = std::fs::read_dir(a.root.join("containers"))
            .into_iter()
            .flatten()
            .count();
        most_dirs = most_dirs.max(dirs);
        if let Some(p) = a.pod("tiny") {
            let w = &container(&p, "main")["state"]["waiting"]["reason"];
            if let Some(r) = w.as_str() {
                if !reasons.iter().any(|x: &String| x == r) {
                    reasons.push(r.to_string());
                }
            }
        }
        assert!(a.exited().is_none(), "the agent died\n{}", a.agent_log());
        std::thread::sleep(Duration::from_millis(200));
    }
    let tries = failed_tries(&a, "tiny");
    eprintln!("{tries} failed tries in 25 s, shims for at most {most_shims} containers, waiting reasons {reasons:?}");
    let p = a.pod("tiny").expect("pod tiny");
    let main = container(&p, "main");
    assert!(
        (1..=3).contains(&tries),
        "{tries} tries in 25 s, expected at most 3 (10 s doubling back-off)\nstatus: {main:#}\n{}",
        a.pods_table()
    );
    // It says why: the create error first, then the back-off, with the error kept.
    assert!(
        reasons.iter().any(|r| r == "CrashLoopBackOff"
            || r == "CreateContainerError"
            || r == "RunContainerError"),
        "waiting reasons seen: {reasons:?}\nstatus: {main:#}"
    );
    let said = format!(
        "{} {}",
        main["state"]["waiting"]["message"], main["lastState"]["terminated"]["message"]
    );
    assert!(
        said.contains("memory") || said.contains("cgroup") || said.contains("create"),
        "the status does not say why: {main:#}"
    );
    // One shim at most per container: the healthy one's, and at most one trying.
    assert!(
        most_shims <= 2,
        "shims for up to {most_shims} containers ran at once"
    );
    assert!(most_dirs <= 2, "up to {most_dirs} container dirs at once");
    let now_shims = a.shim_dirs();
    assert!(now_shims.len() <= 2, "shims: {now_shims:#?}");

    // The healthy pod ran on, the same container.
    let healthy = a.pod("healthy").expect("pod healthy");
    assert_eq!(container(&healthy, "main")["containerID"], healthy_id);
    assert_eq!(started_at(&healthy), healthy_started);
    assert_eq!(container(&healthy, "main")["restartCount"], 0);

    // Removed, nothing of it stays: no container dir, no cgroup, no shim.
    a.remove_manifest("tiny.yaml");
    a.wait_gone("tiny", Duration::from_secs(60));
    a.wait_until(
        "the tiny pod's cgroups to go",
        Duration::from_secs(30),
        |a| pod_cgroups(a, &uid).is_empty(),
    );
    a.wait_until(
        "only the healthy pod's shim",
        Duration::from_secs(30),
        |a| a.shim_dirs().len() == 1,
    );
    let dirs: Vec<_> = std::fs::read_dir(a.root.join("containers"))
        .into_iter()
        .flatten()
        .flatten()
        .collect();
    assert_eq!(dirs.len(), 1, "container dirs: {dirs:?}");
    a.reset();
    a.assert_clean();
}
