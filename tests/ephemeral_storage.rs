//! Local ephemeral storage limits end to end, on a real control plane, as root: cluster
//! pods that write past a container's `limits.ephemeral-storage`, past their pod's
//! total of limits, or past a disk emptyDir's `sizeLimit` are evicted as the kubelet
//! evicts them (phase Failed, reason Evicted, its message, an Evicted Warning event,
//! their containers stopped), as kubectl shows it; a pod within its limits (a
//! memory-backed emptyDir counts against memory, not disk) runs on, and so does a
//! static pod over its limit, which the kubelet never evicts.

use support::control_plane;

use std::time::Duration;

use control_plane::cluster::{condition, tail, NO_PRESSURE, WAIT};
use control_plane::{ControlPlane, Options};
use serde_json::{json, Value};
use support::agent::{need_root, Agent};

const NODE: &str = "storage-node-1";
const NS: &str = "default";

/// A pod bound to the node: containers `(name, ephemeral-storage limit, script)`, and
/// `volumes` mounted at `/<name>` in every container.
fn pod(name: &str, containers: &[(&str, Option<&str>, &str)], volumes: Value) -> String {
    let mounts: Vec<Value> = volumes
        .as_array()
        .into_iter()
        .flatten()
        .map(|v| json!({"name": v["name"], "mountPath": format!("/{}", v["name"].as_str().unwrap_or(""))}))
        .collect();
    let containers: Vec<Value> = containers
        .iter()
        .map(|(c, limit, script)| {
            let resources = match limit {
                Some(l) => json!({"limits": {"ephemeral-storage": l}}),
                None => json!({}),
            };
            json!({"name": c, "image": "busybox:demo", "command": ["sh", "-c", script],
                   "resources": resources, "volumeMounts": mounts})
        })
        .collect();
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": NS},
        "spec": {
            "nodeName": NODE,
            "hostNetwork": true,
            "automountServiceAccountToken": false,
            "terminationGracePeriodSeconds": 30,
            "containers": containers,
            "volumes": volumes,
        },
    })
    .to_string()
}

/// Writes `mib` MiB to `path`, says so, and stays.
fn fill(path: &str, mib: u32) -> String {
    format!("dd if=/dev/zero of={path} bs=1M count={mib} 2>/dev/null; echo FILLED; exec sleep 3600")
}

/// Waits until the pod is Failed in the API; asserts the kubelet's eviction of it with
/// `message` (status, no DisruptionTarget, containers stopped, the Evicted event).
fn assert_evicted(cp: &ControlPlane, a: &Agent, name: &str, message: &str) {
    let log = || {
        format!(
            "--- pods ---\n{}\n--- agent log ---\n{}",
            cp.kubectl_ok(&["get", "pods", "-n", NS, "-o", "wide"]),
            tail(&a.agent_log(), 60)
        )
    };
    let p = cp.wait_for(&format!("pod {name} evicted"), WAIT, log, |cp| {
        cp.get(&format!("pod/{name}"), Some(NS))
            .filter(|p| p["status"]["phase"] == "Failed")
    });
    let status = &p["status"];
    assert_eq!(status["reason"], "Evicted", "{status}");
    assert_eq!(status["message"], message, "{status}");
    // The kubelet marks only node-pressure evictions as a disruption.
    assert!(condition(&p, "DisruptionTarget").is_null(), "{status}");
    for c in status["containerStatuses"].as_array().into_iter().flatten() {
        assert!(c["state"]["terminated"].is_object(), "{status}");
    }
    let events = cp.wait_for(&format!("the Evicted event of {name}"), WAIT, log, |cp| {
        let list = cp.get("events", Some(NS))?;
        let items = list["items"].as_array()?.clone();
        let of_pod: Vec<Value> = items
            .into_iter()
            .filter(|e| e["involvedObject"]["name"] == name && e["reason"] == "Evicted")
            .collect();
        (!of_pod.is_empty()).then_some(of_pod)
    });
    assert!(
        events
            .iter()
            .any(|e| e["type"] == "Warning" && e["message"] == message),
        "{events:?}"
    );
}

#[test]
fn pods_over_their_local_storage_limits_are_evicted_static_pods_are_not() {
    if !need_root() {
        return;
    }
    let cp = ControlPlane::start(Options::bare());
    // No controller makes the namespace's ServiceAccount in a bare cluster.
    let _ = cp.kubectl(&["create", "serviceaccount", "default"]);
    let mut a = Agent::new("ephemeral-storage");
    a.node_name = NODE.into();
    cp.join(
        &mut a,
        "  evictionMonitoringPeriod: 1s\n",
        &format!("nodeStatusUpdateFrequency: 1s\nnodeStatusReportFrequency: 3s\n{NO_PRESSURE}"),
    );
    // Over its 5Mi, and never evicted: it comes from a file on the node.
    a.write_manifest(
        "static.yaml",
        &format!(
            "apiVersion: v1\nkind: Pod\nmetadata:\n  name: static-over\nspec:\n  hostNetwork: true\n  \
             terminationGracePeriodSeconds: 1\n  containers:\n    - name: main\n      image: busybox:demo\n      \
             command: [\"sh\", \"-c\", {}]\n      resources:\n        limits:\n          \
             ephemeral-storage: 5Mi\n",
            serde_json::to_string(&fill("/blob", 8)).expect("json")
        ),
    );
    a.start();

    cp.create(&pod(
        "over-pod",
        &[("main", Some("5Mi"), &fill("/blob", 8))],
        json!([]),
    ));
    cp.create(&pod(
        "over-container",
        &[
            ("small", Some("5Mi"), &fill("/blob", 8)),
            ("large", Some("20Mi"), "exec sleep 3600"),
        ],
        json!([]),
    ));
    cp.create(&pod(
        "over-emptydir",
        &[("main", None, &fill("/scratch/blob", 8))],
        json!([{"name": "scratch", "emptyDir": {"sizeLimit": "5Mi"}}]),
    ));
    // 3Mi on disk, 2Mi in its disk emptyDir, 4Mi in memory: within every limit.
    cp.create(&pod(
        "within",
        &[(
            "main",
            Some("6Mi"),
            "dd if=/dev/zero of=/ram/blob bs=1M count=4 2>/dev/null; \
             dd if=/dev/zero of=/scratch/blob bs=1M count=2 2>/dev/null; \
             dd if=/dev/zero of=/blob bs=1M count=3 2>/dev/null; echo FILLED; exec sleep 3600",
        )],
        json!([
            {"name": "scratch", "emptyDir": {"sizeLimit": "5Mi"}},
            {"name": "ram", "emptyDir": {"medium": "Memory", "sizeLimit": "5Mi"}},
        ]),
    ));

    assert_evicted(
        &cp,
        &a,
        "over-pod",
        "Pod ephemeral local storage usage exceeds the total limit of containers 5Mi. ",
    );
    assert_evicted(
        &cp,
        &a,
        "over-container",
        "Container small exceeded its local ephemeral storage limit \"5Mi\". ",
    );
    assert_evicted(
        &cp,
        &a,
        "over-emptydir",
        "Usage of EmptyDir volume \"scratch\" exceeds the limit \"5Mi\". ",
    );

    // The static pod was measured over its limit, and left running.
    let static_uid = a.pod("static-over").expect("static pod")["pod"]["metadata"]["uid"]
        .as_str()
        .expect("uid")
        .to_string();
    let said = format!("pod {static_uid} is over its local storage limits, but is critical");
    a.wait_until("the static pod found over its limit", WAIT, |a| {
        a.agent_log().contains(&said)
    });
    a.wait_until("pod within to write what it writes", WAIT, |a| {
        a.pod("within")
            .is_some_and(|p| a.container_log(&p, "main", 0).contains("FILLED"))
    });
    // Through several more looks of the manager (one a second), both run on.
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while std::time::Instant::now() < deadline {
        for name in [format!("static-over-{NODE}"), "within".to_string()] {
            let p = cp.get(&format!("pod/{name}"), Some(NS)).expect("pod");
            assert_eq!(
                p["status"]["phase"],
                "Running",
                "{name}: {}\n{}",
                p["status"],
                tail(&a.agent_log(), 40)
            );
        }
        std::thread::sleep(Duration::from_millis(500));
    }
    a.reset();
    a.assert_clean();
}
