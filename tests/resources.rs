//! Resources end to end, as root, on this machine's cgroup version: each QoS class's
//! pod gets the kubelet's cgroup hierarchy and values (read back from cgroupfs) and
//! its containers run in it; pods that do not fit in the node's allocatable are
//! rejected with the kubelet's reasons and messages.

use support::apiserver;

use std::path::{Path, PathBuf};
use std::time::Duration;

use apiserver::{ApiServerDouble, Identity, Options};
use k8s_openapi::api::core::v1::Pod;
use serde_json::{json, Value};
use support::agent::{container, need_root, Agent};

const WAIT: Duration = Duration::from_secs(60);

fn v2() -> bool {
    Path::new("/sys/fs/cgroup/cgroup.controllers").exists()
}

/// A cgroup file of `rel` for `controller` (v1), or of the one tree (v2).
fn read(controller: &str, rel: &str, file: &str) -> String {
    let rel = rel.trim_start_matches('/');
    let path: PathBuf = if v2() {
        Path::new("/sys/fs/cgroup").join(rel).join(file)
    } else {
        Path::new("/sys/fs/cgroup")
            .join(controller)
            .join(rel)
            .join(file)
    };
    std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("read {}: {e}", path.display()))
        .trim()
        .to_owned()
}

fn static_pod(name: &str, resources: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: {name}\nspec:\n  hostNetwork: true\n  \
         terminationGracePeriodSeconds: 1\n  containers:\n    - name: main\n      image: busybox:demo\n      \
         command: [\"sleep\", \"3600\"]\n{resources}"
    )
}

fn running(p: &Value) -> bool {
    container(p, "main")["state"]["running"].is_object()
}

/// The cgroup of the container's init, as /proc says (the memory hierarchy on v1).
fn proc_cgroup(a: &Agent, p: &Value) -> String {
    let id = container(p, "main")["containerID"]
        .as_str()
        .and_then(|c| c.strip_prefix("libcontainer://"))
        .unwrap_or_default()
        .to_owned();
    let started =
        std::fs::read_to_string(support::agent::state_dir(&a.root, &id).join("started.json"))
            .expect("started.json");
    let v: Value = serde_json::from_str(&started).expect("json");
    let pid = v["init"]["pid"].as_i64().expect("pid");
    let text = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).expect("cgroup");
    text.lines()
        .find(|l| {
            if v2() {
                l.starts_with("0::")
            } else {
                l.split(':')
                    .nth(1)
                    .is_some_and(|c| c.split(',').any(|c| c == "memory"))
            }
        })
        .and_then(|l| l.splitn(3, ':').nth(2))
        .unwrap_or_default()
        .to_owned()
}

#[test]
fn each_qos_class_gets_the_kubelets_cgroups() {
    if !need_root() {
        return;
    }
    let mut a = Agent::new("res-qos");
    a.write_config("podPidsLimit: 64\n");
    a.start();
    a.write_manifest(
        "g.yaml",
        &static_pod(
            "guaranteed",
            "      resources:\n        limits: {cpu: 500m, memory: 64Mi}\n",
        ),
    );
    a.write_manifest(
        "b.yaml",
        &static_pod(
            "burstable",
            "      resources:\n        requests: {cpu: 100m, memory: 16Mi}\n        limits: {memory: 64Mi}\n",
        ),
    );
    a.write_manifest("e.yaml", &static_pod("besteffort", ""));
    let root = a.cgroup_root.clone();
    let kubepods = format!("{root}/kubepods");
    let mi64 = (64u64 << 20).to_string();

    let g = a.wait_pod("guaranteed", "running", WAIT, running);
    let b = a.wait_pod("burstable", "running", WAIT, running);
    let e = a.wait_pod("besteffort", "running", WAIT, running);
    assert_eq!(g["status"]["qosClass"], "Guaranteed");
    assert_eq!(b["status"]["qosClass"], "Burstable");
    assert_eq!(e["status"]["qosClass"], "BestEffort");
    let uid = |p: &Value| {
        p["pod"]["metadata"]["uid"]
            .as_str()
            .unwrap_or_default()
            .to_owned()
    };
    let gp = format!("{kubepods}/pod{}", uid(&g));
    let bp = format!("{kubepods}/burstable/pod{}", uid(&b));
    let ep = format!("{kubepods}/besteffort/pod{}", uid(&e));

    // The containers run inside their pod's cgroup.
    assert!(
        proc_cgroup(&a, &g).starts_with(&format!("{gp}/")),
        "{}",
        proc_cgroup(&a, &g)
    );
    assert!(
        proc_cgroup(&a, &b).starts_with(&format!("{bp}/")),
        "{}",
        proc_cgroup(&a, &b)
    );
    assert!(
        proc_cgroup(&a, &e).starts_with(&format!("{ep}/")),
        "{}",
        proc_cgroup(&a, &e)
    );

    if v2() {
        assert_eq!(read("", &gp, "cpu.weight"), "59");
        assert_eq!(read("", &gp, "cpu.max"), "50000 100000");
        assert_eq!(read("", &gp, "memory.max"), mi64);
        assert_eq!(read("", &bp, "cpu.weight"), "17");
        assert_eq!(read("", &bp, "cpu.max"), "max 100000");
        assert_eq!(read("", &bp, "memory.max"), mi64);
        assert_eq!(read("", &ep, "cpu.weight"), "1");
        assert_eq!(read("", &ep, "memory.max"), "max");
        assert_eq!(
            read("", &format!("{kubepods}/besteffort"), "cpu.weight"),
            "1"
        );
        for p in [&gp, &bp, &ep] {
            assert_eq!(read("", p, "pids.max"), "64");
        }
    } else {
        assert_eq!(read("cpu", &gp, "cpu.shares"), "512");
        assert_eq!(read("cpu", &gp, "cpu.cfs_quota_us"), "50000");
        assert_eq!(read("cpu", &gp, "cpu.cfs_period_us"), "100000");
        assert_eq!(read("memory", &gp, "memory.limit_in_bytes"), mi64);
        assert_eq!(read("cpu", &bp, "cpu.shares"), "102");
        assert_eq!(read("cpu", &bp, "cpu.cfs_quota_us"), "-1");
        assert_eq!(read("memory", &bp, "memory.limit_in_bytes"), mi64);
        assert_eq!(read("cpu", &ep, "cpu.shares"), "2");
        assert_eq!(read("cpu", &ep, "cpu.cfs_quota_us"), "-1");
        let unlimited: u64 = read("memory", &ep, "memory.limit_in_bytes")
            .parse()
            .expect("number");
        assert!(unlimited > 1 << 60, "{unlimited}");
        // The QoS levels: burstable's shares are its pods' requests, besteffort's the
        // minimum.
        assert_eq!(
            read("cpu", &format!("{kubepods}/burstable"), "cpu.shares"),
            "102"
        );
        assert_eq!(
            read("cpu", &format!("{kubepods}/besteffort"), "cpu.shares"),
            "2"
        );
        for p in [&gp, &bp, &ep] {
            assert_eq!(read("pids", p, "pids.max"), "64");
        }
    }

    // A removed pod's cgroup goes.
    a.remove_manifest("b.yaml");
    a.wait_gone("burstable", WAIT);
    let gone = if v2() {
        Path::new("/sys/fs/cgroup").join(bp.trim_start_matches('/'))
    } else {
        Path::new("/sys/fs/cgroup/cpu").join(bp.trim_start_matches('/'))
    };
    a.wait_until("the burstable pod's cgroup to go", WAIT, |_| !gone.exists());
    a.reset();
    a.assert_clean();
}

fn double() -> ApiServerDouble {
    apiserver::start(Options {
        bookmark_interval: Duration::from_secs(1),
        ..Options::default()
    })
}

const NODE: &str = "res-node-1";

fn cluster_pod(name: &str, requests: Option<(&str, &str)>) -> Pod {
    let resources = match requests {
        Some((cpu, mem)) => json!({"requests": {"cpu": cpu, "memory": mem}}),
        None => json!({}),
    };
    serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": "default"},
        "spec": {
            "nodeName": NODE,
            "hostNetwork": true,
            "terminationGracePeriodSeconds": 1,
            "containers": [{"name": "main", "image": "busybox:demo",
                            "command": ["sleep", "3600"], "resources": resources}],
        },
    }))
    .expect("pod")
}

fn status(api: &ApiServerDouble, name: &str) -> (String, String, String) {
    let s = api
        .get_pod("default", name)
        .and_then(|p| p.status)
        .unwrap_or_default();
    (
        s.phase.unwrap_or_default(),
        s.reason.unwrap_or_default(),
        s.message.unwrap_or_default(),
    )
}

#[test]
fn pods_that_do_not_fit_are_rejected_as_the_kubelet_rejects_them() {
    if !need_root() {
        return;
    }
    let api = double();
    let mut a = Agent::new("res-admit");
    a.node_name = NODE.into();
    a.write_config("nodeStatusUpdateFrequency: 1s\nnodeStatusReportFrequency: 3s\nmaxPods: 3\n");
    let kubeconfig = api.kubeconfig(&a.dir, Identity::Node(NODE));
    a.extra_args = vec!["--kubeconfig".into(), kubeconfig.display().to_string()];
    a.start();
    let fail = |what: &str| -> ! {
        panic!(
            "timed out waiting for {what}\n{}\n{}",
            api.recent_requests(30),
            a.agent_log()
        )
    };
    // What the node offers, as it told the cluster.
    let mut allocatable = None;
    if !api.wait_for(WAIT, |api| {
        allocatable = api
            .get_node(NODE)
            .and_then(|n| n.status)
            .and_then(|s| s.allocatable);
        allocatable.as_ref().is_some_and(|a| a.contains_key("cpu"))
    }) {
        fail("node status");
    }
    let allocatable = allocatable.unwrap_or_default();
    let cpu = holdfast::quantity::parse_millicpu(&allocatable["cpu"].0).expect("cpu");
    let mem = holdfast::quantity::parse_bytes(&allocatable["memory"].0).expect("memory");

    api.create_pod(cluster_pod(
        "big",
        Some((&format!("{}m", cpu - 100), "16Mi")),
    ));
    if !api.wait_for(WAIT, |api| status(api, "big").0 == "Running") {
        fail("pod big Running");
    }
    api.create_pod(cluster_pod("cpu-hungry", Some(("200m", "16Mi"))));
    api.create_pod(cluster_pod(
        "mem-hungry",
        Some(("10m", &format!("{}", mem))),
    ));
    for name in ["cpu-hungry", "mem-hungry"] {
        if !api.wait_for(WAIT, |api| status(api, name).0 == "Failed") {
            fail(&format!("pod {name} rejected"));
        }
    }
    let (_, reason, message) = status(&api, "cpu-hungry");
    assert_eq!(reason, "OutOfcpu");
    assert_eq!(
        message,
        format!(
            "Pod was rejected: Node didn't have enough resource: cpu, requested: 200, used: {}, capacity: {cpu}",
            cpu - 100
        )
    );
    let (_, reason, message) = status(&api, "mem-hungry");
    assert_eq!(reason, "OutOfmemory");
    assert_eq!(
        message,
        format!(
            "Pod was rejected: Node didn't have enough resource: memory, requested: {mem}, used: {}, capacity: {mem}",
            16u64 << 20
        )
    );
    // BestEffort pods only count as pods: two more fit, then maxPods is reached.
    api.create_pod(cluster_pod("small-1", None));
    api.create_pod(cluster_pod("small-2", None));
    for name in ["small-1", "small-2"] {
        if !api.wait_for(WAIT, |api| status(api, name).0 == "Running") {
            fail(&format!("pod {name} Running"));
        }
    }
    api.create_pod(cluster_pod("one-too-many", None));
    if !api.wait_for(WAIT, |api| status(api, "one-too-many").0 == "Failed") {
        fail("pod one-too-many rejected");
    }
    let (_, reason, message) = status(&api, "one-too-many");
    assert_eq!(reason, "OutOfpods");
    assert_eq!(
        message,
        "Pod was rejected: Node didn't have enough resource: pods, requested: 1, used: 3, capacity: 3"
    );
    // Each rejection is an event with the reason, as the kubelet records it. Events go
    // out after the status that says Failed: waited for.
    for reason in ["OutOfcpu", "OutOfmemory", "OutOfpods"] {
        let posted = api.wait_for(WAIT, |api| {
            api.list_events().iter().any(|e| {
                e.reason.as_deref() == Some(reason) && e.type_.as_deref() == Some("Warning")
            })
        });
        assert!(posted, "no {reason} event");
    }
    a.reset();
    a.assert_clean();
}
