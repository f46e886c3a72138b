use super::*;
use crate::pod::requests::{pod_resources, Amounts};
use crate::testutil::TempDir;

fn pod(spec: serde_json::Value) -> k8s_openapi::api::core::v1::Pod {
    serde_json::from_value(
        serde_json::json!({"metadata": {"name": "p", "uid": "u1"}, "spec": spec}),
    )
    .expect("pod")
}

#[test]
fn the_kubelets_formulas() {
    assert_eq!(shares(0), 2);
    assert_eq!(shares(1), 2);
    assert_eq!(shares(100), 102);
    assert_eq!(shares(1000), 1024);
    assert_eq!(shares(1_000_000), MAX_SHARES);
    assert_eq!(quota(0), 1000);
    assert_eq!(quota(250), 25_000);
    assert_eq!(quota(2000), 200_000);
    assert_eq!(weight(2), 1);
    assert_eq!(weight(1024), 100);
    assert_eq!(weight(262_144), 10_000);
    assert_eq!(weight(256), 35);
    assert_eq!(weight(102), 17);
    assert_eq!(weight(0), 0);
    // A pod whose requests saturate still gets values the kernel takes.
    assert_eq!(shares(u64::MAX), 262_144);
    assert!(quota(u64::MAX) > 0);
}

#[test]
fn qos_classes_and_their_pod_values() {
    let guaranteed = pod(serde_json::json!({"containers": [{"name": "a",
        "resources": {"limits": {"cpu": "500m", "memory": "64Mi"}}}]}));
    let burstable = pod(serde_json::json!({"containers": [{"name": "a",
        "resources": {"requests": {"cpu": "100m", "memory": "16Mi"}, "limits": {"memory": "64Mi"}}}]}));
    let best = pod(serde_json::json!({"containers": [{"name": "a"}]}));
    assert_eq!(Qos::of(&guaranteed), Qos::Guaranteed);
    assert_eq!(Qos::of(&burstable), Qos::Burstable);
    assert_eq!(Qos::of(&best), Qos::BestEffort);

    let g = pod_limits(
        Qos::Guaranteed,
        &pod_resources(&guaranteed).expect("r"),
        Some(100),
    );
    assert_eq!(
        g,
        Limits {
            cpu_shares: Some(512),
            cpu_quota: Some(50_000),
            memory: Some(64 * 1024 * 1024),
            pids: Some(100),
        }
    );
    let b = pod_limits(Qos::Burstable, &pod_resources(&burstable).expect("r"), None);
    assert_eq!(
        b,
        Limits {
            cpu_shares: Some(102),
            cpu_quota: None,
            memory: Some(64 * 1024 * 1024),
            pids: None,
        }
    );
    let e = pod_limits(Qos::BestEffort, &PodResources::default(), None);
    assert_eq!(e.cpu_shares, Some(2));
    assert_eq!(e.memory, None);
    assert_eq!(
        pod_resources(&best).expect("r").requests,
        Amounts::default()
    );
}

/// A cgroup v2 tree as the kernel shows it, enough for the files written here.
fn fake_v2(dir: &Path) {
    std::fs::write(
        dir.join("cgroup.controllers"),
        "cpuset cpu io memory pids\n",
    )
    .expect("write");
    std::fs::write(dir.join("cgroup.subtree_control"), "").expect("write");
}

#[test]
fn v2_tree_paths_values_and_delegation() {
    let tmp = TempDir::new("cgroup-v2");
    fake_v2(&tmp.0);
    let tree = CgroupTree::at(&tmp.0, "/edge/");
    assert_eq!(tree.version(), Version::V2);
    assert_eq!(
        tree.pod_path("u1", Qos::Burstable),
        "/edge/kubepods/burstable/podu1"
    );
    assert_eq!(tree.pod_path("u2", Qos::Guaranteed), "/edge/kubepods/podu2");
    assert_eq!(
        tree.pod_path("u3", Qos::BestEffort),
        "/edge/kubepods/besteffort/podu3"
    );

    let rel = tree.pod_path("u1", Qos::Burstable);
    let limits = Limits {
        cpu_shares: Some(1024),
        cpu_quota: Some(50_000),
        memory: Some(1 << 26),
        pids: Some(64),
    };
    tree.ensure(&rel, &limits).expect("ensure");
    assert_eq!(tree.read("", &rel, "cpu.weight").as_deref(), Some("100"));
    assert_eq!(
        tree.read("", &rel, "cpu.max").as_deref(),
        Some("50000 100000")
    );
    assert_eq!(
        tree.read("", &rel, "memory.max").as_deref(),
        Some("67108864")
    );
    assert_eq!(tree.read("", &rel, "pids.max").as_deref(), Some("64"));
    // Every ancestor delegates cpu, memory and pids (not what the root lacks).
    assert_eq!(
        std::fs::read_to_string(tmp.0.join("cgroup.subtree_control")).expect("read"),
        "+cpu +memory +pids"
    );
    assert!(tmp.0.join("edge/kubepods/burstable/podu1").is_dir());

    let unlimited = Limits {
        cpu_shares: Some(2),
        ..Limits::default()
    };
    let be = tree.pod_path("u3", Qos::BestEffort);
    tree.ensure(&be, &unlimited).expect("ensure");
    assert_eq!(tree.read("", &be, "cpu.max").as_deref(), Some("max 100000"));
    assert_eq!(tree.read("", &be, "memory.max").as_deref(), Some("max"));
    assert_eq!(tree.read("", &be, "pids.max").as_deref(), Some("max"));
    assert_eq!(tree.read("", &be, "cpu.weight").as_deref(), Some("1"));
}

#[test]
fn a_delegated_tree_writes_no_subtree_control_above_its_base() {
    let tmp = TempDir::new("cgroup-v2-delegated");
    fake_v2(&tmp.0);
    let unit = tmp.0.join("system.slice/holdfast.service");
    std::fs::create_dir_all(&unit).expect("mkdir");
    fake_v2(&tmp.0.join("system.slice"));
    fake_v2(&unit);
    let tree = CgroupTree::at(&tmp.0, "/system.slice/holdfast.service/pods")
        .delegated_at("/system.slice/holdfast.service");
    let rel = tree.pod_path("u1", Qos::Burstable);
    assert_eq!(
        rel,
        "/system.slice/holdfast.service/pods/kubepods/burstable/podu1"
    );
    tree.ensure(&rel, &Limits::default()).expect("ensure");
    for above in [tmp.0.clone(), tmp.0.join("system.slice")] {
        assert_eq!(
            std::fs::read_to_string(above.join("cgroup.subtree_control")).expect("read"),
            "",
            "{}",
            above.display()
        );
    }
    assert_eq!(
        std::fs::read_to_string(unit.join("cgroup.subtree_control")).expect("read"),
        "+cpu +memory +pids"
    );
    assert!(unit.join("pods/kubepods/burstable/podu1").is_dir());
    // A root outside the base is not inside the delegation.
    let outside =
        CgroupTree::at(&tmp.0, "/holdfast").delegated_at("/system.slice/holdfast.service");
    outside
        .ensure("/holdfast/kubepods", &Limits::default())
        .expect("ensure");
    assert_eq!(
        std::fs::read_to_string(tmp.0.join("cgroup.subtree_control")).expect("read"),
        "+cpu +memory +pids"
    );
}

#[test]
fn v2_limits_and_working_set_are_read_as_the_kernel_writes_them() {
    let tmp = TempDir::new("cgroup-v2-read");
    fake_v2(&tmp.0);
    let tree = CgroupTree::at(&tmp.0, "/edge");
    let rel = tree.kubepods();
    std::fs::create_dir_all(tmp.0.join("edge/kubepods")).expect("mkdir");
    std::fs::write(tmp.0.join("edge/memory.max"), "209715200\n").expect("write");
    std::fs::write(tmp.0.join("edge/kubepods/memory.max"), "max\n").expect("write");
    std::fs::write(tmp.0.join("edge/kubepods/memory.current"), "1000000\n").expect("write");
    std::fs::write(
        tmp.0.join("edge/kubepods/memory.stat"),
        "anon 10\nfile 20\ninactive_file 250000\nactive_file 5\n",
    )
    .expect("write");
    assert_eq!(tree.effective_memory_limit(&rel), Some(209_715_200));
    assert_eq!(tree.working_set(&rel), Some(750_000));
}

#[test]
fn v1_tree_writes_each_controller_and_removes_deepest_first() {
    let tmp = TempDir::new("cgroup-v1");
    for c in ["cpu", "memory", "pids", "cpuset"] {
        std::fs::create_dir_all(tmp.0.join(c)).expect("mkdir");
    }
    let tree = CgroupTree::at(&tmp.0, "/edge");
    assert_eq!(tree.version(), Version::V1);
    let rel = tree.pod_path("u1", Qos::Guaranteed);
    let limits = Limits {
        cpu_shares: Some(512),
        cpu_quota: Some(50_000),
        memory: Some(1 << 26),
        pids: None,
    };
    tree.ensure(&rel, &limits).expect("ensure");
    assert_eq!(tree.read("cpu", &rel, "cpu.shares").as_deref(), Some("512"));
    assert_eq!(
        tree.read("cpu", &rel, "cpu.cfs_quota_us").as_deref(),
        Some("50000")
    );
    assert_eq!(
        tree.read("cpu", &rel, "cpu.cfs_period_us").as_deref(),
        Some("100000")
    );
    assert_eq!(
        tree.read("memory", &rel, "memory.limit_in_bytes")
            .as_deref(),
        Some("67108864")
    );
    assert_eq!(tree.read("pids", &rel, "pids.max").as_deref(), Some("max"));
    // What libcontainer makes for a container under it, in another hierarchy too.
    std::fs::create_dir_all(tmp.0.join("cpuset/edge/kubepods/podu1/c1")).expect("mkdir");
    // rmdir of a fake tree's directory fails on the files written: clear them as the
    // kernel would (its interface files go with the directory).
    for c in ["cpu", "memory", "pids"] {
        for e in std::fs::read_dir(tmp.0.join(c).join("edge/kubepods/podu1"))
            .expect("list")
            .flatten()
        {
            if e.path().is_file() {
                std::fs::remove_file(e.path()).expect("rm");
            }
        }
    }
    tree.remove(&rel).expect("remove");
    for c in ["cpu", "memory", "pids", "cpuset"] {
        assert!(!tmp.0.join(c).join("edge/kubepods/podu1").exists(), "{c}");
        assert!(
            tmp.0.join(c).join("edge/kubepods").exists() || c == "cpuset",
            "{c}"
        );
    }
}

#[test]
fn a_delegated_base_keeps_its_supervisor_and_itself() {
    let tmp = TempDir::new("reset-base");
    std::fs::write(tmp.0.join("cgroup.controllers"), "cpu memory pids\n").expect("write");
    let base = "/system.slice/holdfast.service";
    std::fs::create_dir_all(tmp.0.join("system.slice/holdfast.service/supervisor")).expect("mkdir");
    let tree = CgroupTree::at(&tmp.0, base);
    assert_eq!(removable(&tree, base), format!("{base}/pods"));
    assert_eq!(
        removable(&tree, &format!("{base}/pods")),
        format!("{base}/pods")
    );
    let tree = CgroupTree::at(&tmp.0, "/holdfast");
    assert_eq!(removable(&tree, "/holdfast"), "/holdfast");
    // Never every cgroup of the host.
    let tree = CgroupTree::at(&tmp.0, "/");
    assert_eq!(removable(&tree, "/"), "/kubepods");
}
