//! `cgroupRoot: delegated` where it cannot be honoured: on a cgroup v1 or hybrid host
//! the agent says why once and runs its pods under `/holdfast`, as root. On a cgroup v2
//! host the agent would take over this test's own cgroup: the VM test (tests/vm, cgroup
//! v2 only, the agent started in a unit's cgroup as systemd does) covers that side.

use std::path::Path;
use std::time::Duration;

use support::agent::{need_root, Agent};

const WAIT: Duration = Duration::from_secs(60);

#[test]
fn delegated_on_a_v1_host_falls_back_to_holdfast_with_one_warning() {
    if !need_root() {
        return;
    }
    if Path::new("/sys/fs/cgroup/cgroup.controllers").exists() {
        eprintln!("skipped: a cgroup v2 host (the VM test covers delegation there)");
        return;
    }
    let mut a = Agent::new("delegated");
    a.cgroup_root = "delegated".into();
    a.write_config("");
    a.start();
    // What `holdfast reset` and the clean-up check look at: where the pods went.
    a.cgroup_root = "/holdfast".into();
    a.write_manifest(
        "p.yaml",
        "apiVersion: v1\nkind: Pod\nmetadata: {name: p}\nspec:\n  hostNetwork: true\n  \
         terminationGracePeriodSeconds: 1\n  containers:\n  - name: main\n    \
         image: busybox:demo\n    command: [sleep, '3600']\n    \
         resources:\n      requests: {memory: 16Mi}\n      limits: {memory: 64Mi}\n",
    );
    let p = a.wait_pod("p", "running", WAIT, |p| p["status"]["phase"] == "Running");
    let log = a.agent_log();
    let warnings: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("cgroupRoot delegated cannot be honoured"))
        .collect();
    assert_eq!(warnings.len(), 1, "{log}");
    assert!(
        warnings[0].contains("cgroup v1 or hybrid host"),
        "{}",
        warnings[0]
    );
    assert!(
        warnings[0].contains("go under /holdfast"),
        "{}",
        warnings[0]
    );
    // The pod's memory limit is where the fallback says.
    let uid = p["pod"]["metadata"]["uid"]
        .as_str()
        .expect("uid")
        .to_owned();
    let limit = Path::new("/sys/fs/cgroup/memory/holdfast/kubepods/burstable")
        .join(format!("pod{uid}"))
        .join("memory.limit_in_bytes");
    let read = std::fs::read_to_string(&limit);
    a.reset();
    a.assert_clean();
    assert_eq!(
        read.unwrap_or_else(|e| panic!("read {}: {e}", limit.display()))
            .trim(),
        (64u64 << 20).to_string()
    );
}
