//! What a standalone gateway gets by default, end to end on real containers as root: the
//! shipped config's pid limit holds a fork bomb to its own pod, and static pods may use
//! only the host paths `holdfast.staticPodAllowedHostPaths` allows.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::Value;
use support::agent::{container, need_root, Agent};

const MIN: Duration = Duration::from_secs(60);

/// The config the Yocto layer and the Debian packages install.
const SHIPPED_CONFIG: &str = "yocto/meta-holdfast/recipes-containers/holdfast/files/config.yaml";

/// `podPidsLimit` as the shipped config sets it.
fn shipped_pid_limit() -> u64 {
    let path = support::repo_root().join(SHIPPED_CONFIG);
    let text = std::fs::read_to_string(&path).expect("read the shipped config");
    let config: Value = serde_yaml::from_str(&text).expect("the shipped config parses");
    let limit = config["podPidsLimit"].as_i64().unwrap_or_else(|| {
        panic!(
            "{} sets no podPidsLimit: a fork bomb in one pod takes every pid of the host",
            path.display()
        )
    });
    u64::try_from(limit)
        .ok()
        .filter(|n| (64..=32768).contains(n))
        .unwrap_or_else(|| panic!("podPidsLimit {limit} is no sensible bound"))
}

fn pod(name: &str, policy: &str, script: &str, volumes: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: {name}\nspec:\n  hostNetwork: true\n  \
         restartPolicy: {policy}\n  terminationGracePeriodSeconds: 1\n  containers:\n    \
         - name: main\n      image: busybox:demo\n      command: [\"sh\", \"-c\", {}]\n{volumes}",
        serde_json::to_string(script).expect("json string")
    )
}

/// The lines pod `name`'s container printed so far (its first run).
fn printed(a: &Agent, name: &str) -> Vec<String> {
    let Some(p) = a.pod(name) else {
        return Vec::new();
    };
    a.container_log(&p, "main", 0)
        .lines()
        .filter_map(|l| l.splitn(4, ' ').nth(3).map(str::to_owned))
        .collect()
}

/// A file of the pod's cgroup (BestEffort) on cgroup v2, or of its pids hierarchy on v1.
fn pod_cgroup_file(a: &Agent, p: &Value, file: &str) -> PathBuf {
    let uid = p["pod"]["metadata"]["uid"].as_str().expect("uid");
    let rel = format!(
        "{}/kubepods/besteffort/pod{uid}",
        a.cgroup_root.trim_start_matches('/')
    );
    let base = Path::new("/sys/fs/cgroup");
    if base.join("cgroup.controllers").exists() {
        base.join(rel).join(file)
    } else {
        base.join("pids").join(rel).join(file)
    }
}

#[test]
fn the_shipped_pid_limit_holds_a_fork_bomb_to_its_own_pod() {
    if !need_root() {
        return;
    }
    let limit = shipped_pid_limit();
    let mut a = Agent::new("pids-default");
    a.write_config(&format!("podPidsLimit: {limit}\n"));
    // A neighbour that forks once a second, and says so.
    a.write_manifest(
        "neighbour.yaml",
        &pod(
            "neighbour",
            "Always",
            "i=0; while true; do i=$((i+1)); (echo fork $i); sleep 1; done",
            "",
        ),
    );
    a.start();
    a.wait_until("the neighbour to fork", MIN, |a| {
        printed(a, "neighbour").iter().any(|l| l == "fork 2")
    });
    // The bomb, bounded (this machine is shared): a shell that starts more sleepers
    // than the limit allows; its parent, which is done forking, says how it ended and
    // keeps the sleepers' pids taken.
    let bomb = format!(
        "sh -c 'i=0; while [ $i -lt {} ]; do sleep 120 & i=$((i+1)); done; echo ALL STARTED'; \
         echo bomb ended; exec sleep 120",
        limit + 64
    );
    a.write_manifest("bomb.yaml", &pod("bomb", "Never", &bomb, ""));
    a.wait_until("the bomb to end", MIN, |a| {
        printed(a, "bomb").iter().any(|l| l == "bomb ended")
    });
    let out = printed(&a, "bomb");
    assert!(
        !out.iter().any(|l| l == "ALL STARTED"),
        "{} processes started in one pod under podPidsLimit {limit}",
        limit + 64
    );
    assert!(
        out.iter().any(|l| l.contains("can't fork")),
        "no fork failed in the bomb: {out:?}"
    );
    let p = a.pod("bomb").expect("bomb pod");
    let max = pod_cgroup_file(&a, &p, "pids.max");
    let read = |f: &Path| std::fs::read_to_string(f).unwrap_or_default();
    assert_eq!(read(&max).trim(), limit.to_string(), "{}", max.display());
    let current: u64 = read(&pod_cgroup_file(&a, &p, "pids.current"))
        .trim()
        .parse()
        .expect("pids.current");
    assert!(
        current + 8 >= limit,
        "the bomb holds {current} of {limit} pids"
    );
    // While the bomb holds its pod's every pid, the neighbour still forks.
    let last = printed(&a, "neighbour").len();
    a.wait_until("the neighbour to fork beside the bomb", MIN, |a| {
        printed(a, "neighbour").len() >= last + 2
    });
    let n = a.pod("neighbour").expect("neighbour");
    assert_eq!(container(&n, "main")["restartCount"], 0, "{n}");
    assert!(container(&n, "main")["state"]["running"].is_object(), "{n}");
    a.reset();
    a.assert_clean();
}

#[test]
fn static_pods_use_only_the_allowed_host_paths() {
    if !need_root() {
        return;
    }
    let a = Agent::new("hostpath-allow");
    let data = a.dir.join("data");
    std::fs::create_dir_all(&data).expect("mkdir data");
    std::fs::create_dir_all(a.dir.join("database")).expect("mkdir database");
    // A link out of the allowed folder, to one beside it.
    let secret = a.dir.join("secret");
    std::fs::create_dir_all(&secret).expect("mkdir secret");
    std::os::unix::fs::symlink(&secret, data.join("out")).expect("link out");
    a.write_config(&format!(
        "  staticPodAllowedHostPaths: [{}]\n",
        data.display()
    ));
    let mut a = a;
    let host = |name: &str, path: &Path| {
        pod(
            name,
            "Always",
            "echo written > /host/proof; exec sleep 3600",
            &format!(
                "      volumeMounts: [{{name: host, mountPath: /host}}]\n  volumes:\n    \
                 - {{name: host, hostPath: {{path: {}, type: DirectoryOrCreate}}}}\n",
                path.display()
            ),
        )
    };
    a.write_manifest("inside.yaml", &host("inside", &data.join("app")));
    a.write_manifest("sibling.yaml", &host("sibling", &a.dir.join("database")));
    a.write_manifest("via-link.yaml", &host("via-link", &data.join("out")));
    a.start();

    a.wait_pod("inside", "running", MIN, |p| {
        container(p, "main")["state"]["running"].is_object()
    });
    a.wait_until("the allowed hostPath to be written", MIN, |_| {
        data.join("app/proof").exists()
    });
    let refused =
        |name: &str| a.wait_pod(name, "refused", MIN, |p| p["status"]["phase"] == "Failed");
    let sibling = refused("sibling");
    assert_eq!(
        sibling["status"]["reason"], "HostPathForbidden",
        "{sibling}"
    );
    let message = sibling["status"]["message"].as_str().unwrap_or("");
    assert_eq!(
        message,
        format!(
            "Pod was rejected: hostPath volume \"host\": {} is not under \
             holdfast.staticPodAllowedHostPaths ({})",
            a.dir.join("database").display(),
            data.display()
        ),
        "{sibling}"
    );
    let via = refused("via-link");
    let message = via["status"]["message"].as_str().unwrap_or("");
    assert!(
        message.contains(&format!("(resolves to {})", secret.display())),
        "{via}"
    );
    // Not started: no container, nothing written through the volume.
    for p in [&sibling, &via] {
        assert!(
            p["status"]["containerStatuses"]
                .as_array()
                .is_none_or(Vec::is_empty),
            "{p}"
        );
    }
    assert!(!a.dir.join("database/proof").exists());
    assert!(!secret.join("proof").exists());
    let table = a.pods_table();
    assert!(table.contains("HostPathForbidden"), "{table}");
    let log = a.agent_log();
    assert!(
        log.contains("is not under holdfast.staticPodAllowedHostPaths"),
        "{log}"
    );
    a.reset();
    a.assert_clean();
}
