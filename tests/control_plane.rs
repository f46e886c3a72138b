//! End-to-end against a real control plane (etcd, kube-apiserver v1.36 with Node and
//! RBAC authorization and NodeRestriction, kube-controller-manager, kube-scheduler):
//! `holdfast run --kubeconfig` as a node, real containers, and everything checked the
//! way a user sees it, through the real kubectl.

use support::control_plane;

use std::time::{Duration, Instant};

use control_plane::cluster::{
    assert_pod_ip, condition, fresh_namespace, node_on_network, pod, settled_namespace, tail,
    wait_node, wait_running, Timings, NO_PRESSURE, WAIT,
};
use control_plane::link::NodeAddress;
use control_plane::{ControlPlane, Options};
use serde_json::Value;
use support::agent::{need_root, Agent};

/// An agent that is node `node` of `cp`, with short node intervals.
fn node(cp: &ControlPlane, name: &str, node: &str, holdfast_keys: &str) -> Agent {
    let mut a = Agent::new(name);
    a.node_name = node.into();
    cp.join(
        &mut a,
        holdfast_keys,
        &format!("nodeStatusUpdateFrequency: 1s\nnodeStatusReportFrequency: 3s\n{NO_PRESSURE}"),
    );
    a
}

#[test]
fn node_registers_goes_ready_and_renews_its_lease() {
    if !need_root() {
        return;
    }
    let cp = ControlPlane::start(Options::bare());
    eprintln!(
        "control plane (etcd + apiserver) ready in {:?}",
        cp.started_in
    );
    let mut a = node(&cp, "cp-node", "edge-node-1", "");
    let t0 = Instant::now();
    a.start();
    let log = || format!("--- agent log ---\n{}", a.agent_log());

    let node = cp.wait_for("node Ready", WAIT, log, |cp| {
        cp.get("node/edge-node-1", None)
            .filter(|n| condition(n, "Ready")["status"] == "True")
    });
    eprintln!("agent start to node Ready: {:?}", t0.elapsed());
    let addresses = &node["status"]["addresses"];
    assert_eq!(
        addresses,
        &serde_json::json!([{"type": "InternalIP", "address": "127.0.0.1"},
                            {"type": "Hostname", "address": "edge-node-1"}])
    );
    assert_eq!(
        node["status"]["daemonEndpoints"]["kubeletEndpoint"]["Port"],
        i64::from(a.port)
    );
    assert_eq!(
        node["metadata"]["labels"]["kubernetes.io/hostname"],
        "edge-node-1"
    );

    let table = cp.kubectl_ok(&["get", "nodes"]);
    let row = table
        .lines()
        .find(|l| l.starts_with("edge-node-1 "))
        .unwrap_or_else(|| panic!("no node row in:\n{table}"));
    assert!(row.split_whitespace().nth(1) == Some("Ready"), "{table}");

    let lease = cp.wait_for("the node's lease", WAIT, log, |cp| {
        cp.get("lease/edge-node-1", Some("kube-node-lease"))
    });
    assert_eq!(lease["spec"]["holderIdentity"], "edge-node-1");
    assert_eq!(lease["metadata"]["ownerReferences"][0]["kind"], "Node");
    assert_eq!(
        lease["metadata"]["ownerReferences"][0]["uid"],
        node["metadata"]["uid"]
    );
    let first = lease["spec"]["renewTime"]
        .as_str()
        .unwrap_or("")
        .to_string();
    cp.wait_for("the lease to be renewed", WAIT, log, |cp| {
        cp.get("lease/edge-node-1", Some("kube-node-lease"))
            .and_then(|l| l["spec"]["renewTime"].as_str().map(str::to_string))
            .filter(|t| *t > first)
    });
}

/// Pods, one bound by name and one placed by the scheduler, run with their own pod IP;
/// `kubectl logs` (and `-f`), the node's stats through the apiserver's node proxy, and
/// `kubectl delete pod` work on them.
#[test]
fn pods_run_with_their_own_pod_ip_and_serve_logs_and_stats() {
    if !need_root() || !support::cni::need_plugins() {
        return;
    }
    let cp = ControlPlane::start(Options::default());
    eprintln!("control plane (all four) ready in {:?}", cp.started_in);
    let addr = NodeAddress::new(0);
    let (net, mut a) = node_on_network(&cp, "cp-pods", "edge-node-1", 0, Some(&addr));
    a.start();
    let log = || tail(&a.agent_log(), 60);
    cp.wait_for("node Ready", WAIT, log, |cp| {
        cp.get("node/edge-node-1", None)
            .filter(|n| condition(n, "Ready")["status"] == "True")
    });

    let mut timings = Timings::default();
    let ns = "apps";
    settled_namespace(&cp, ns);
    let script = "i=0; while true; do echo tick $i; i=$((i+1)); sleep 0.2; done";
    let t = Instant::now();
    cp.create(&pod(ns, "bound", Some("edge-node-1"), script).to_string());
    let bound = wait_running(&cp, &a, ns, "bound");
    timings.add(t);
    assert_pod_ip(&bound, &net, &a);

    wait_node(&cp, &a, "edge-node-1", true);
    let t = Instant::now();
    cp.create(&pod(ns, "scheduled", None, script).to_string());
    let scheduled = wait_running(&cp, &a, ns, "scheduled");
    timings.add(t);
    assert_eq!(scheduled["spec"]["nodeName"], "edge-node-1");
    assert_eq!(condition(&scheduled, "PodScheduled")["status"], "True");
    assert_pod_ip(&scheduled, &net, &a);
    assert_ne!(scheduled["status"]["podIP"], bound["status"]["podIP"]);

    // kubectl logs: what the container printed so far.
    let logs = cp.kubectl_ok(&["logs", "-n", ns, "bound"]);
    assert!(logs.starts_with("tick 0\n"), "{logs}");
    // kubectl logs -f: new lines keep coming.
    let mut follow = cp
        .kubectl_cmd(&["logs", "-f", "-n", ns, "scheduled", "--tail=1"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("kubectl logs -f");
    let stdout = follow.stdout.take().expect("stdout");
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        use std::io::BufRead;
        for line in std::io::BufReader::new(stdout)
            .lines()
            .map_while(Result::ok)
        {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let mut seen = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(20);
    while seen.len() < 5 && Instant::now() < deadline {
        if let Ok(l) = rx.recv_timeout(Duration::from_millis(500)) {
            seen.push(l);
        }
    }
    let _ = follow.kill();
    let _ = follow.wait();
    assert!(seen.len() >= 5, "kubectl logs -f gave only {seen:?}");
    let n = |l: &String| l.strip_prefix("tick ").and_then(|n| n.parse::<u64>().ok());
    let ticks: Vec<u64> = seen.iter().filter_map(n).collect();
    assert_eq!(ticks.len(), seen.len(), "{seen:?}");
    assert!(ticks.windows(2).all(|w| w[1] == w[0] + 1), "{seen:?}");

    // The node's stats through the apiserver's node proxy (kubectl top's path).
    let raw = cp.kubectl_ok(&[
        "get",
        "--raw",
        "/api/v1/nodes/edge-node-1/proxy/stats/summary",
    ]);
    let summary: Value = serde_json::from_str(&raw).expect("summary json");
    assert_eq!(summary["node"]["nodeName"], "edge-node-1");
    let names: Vec<&str> = summary["pods"]
        .as_array()
        .map(|ps| {
            ps.iter()
                .filter(|p| p["podRef"]["namespace"] == ns)
                .filter_map(|p| p["podRef"]["name"].as_str())
                .collect()
        })
        .unwrap_or_default();
    assert!(
        names.contains(&"bound") && names.contains(&"scheduled"),
        "{names:?}"
    );

    // kubectl delete pod returns once the pod is gone (no Terminating left behind).
    for name in ["bound", "scheduled"] {
        let t = Instant::now();
        cp.kubectl_ok(&["delete", "pod", "-n", ns, name, "--timeout=60s"]);
        eprintln!("kubectl delete pod {name}: {:?}", t.elapsed());
        assert!(cp.get(&format!("pod/{name}"), Some(ns)).is_none());
    }
    a.wait_gone("bound", WAIT);
    a.wait_gone("scheduled", WAIT);
    timings.print("create to Running through the apiserver");
}

/// A pod created with its namespace, before the namespace's `kube-root-ca.crt` exists
/// (its service-account volume cannot be set up yet), shows no pod IP but its own while
/// it waits, and runs with its own once the ConfigMap is there. The ConfigMap's
/// publisher is left out of the controller-manager so that the wait is certain.
#[test]
fn a_pod_made_with_its_namespace_shows_only_its_own_pod_ip() {
    if !need_root() || !support::cni::need_plugins() {
        return;
    }
    let cp = ControlPlane::start(Options {
        controllers: "*,-root-ca-cert-publisher".into(),
        scheduler: false,
        ..Options::default()
    });
    let addr = NodeAddress::new(1);
    let (net, mut a) = node_on_network(&cp, "cp-fresh", "edge-node-1", 1, Some(&addr));
    a.start();
    let log = || tail(&a.agent_log(), 60);
    cp.wait_for("node Ready", WAIT, log, |cp| {
        cp.get("node/edge-node-1", None)
            .filter(|n| condition(n, "Ready")["status"] == "True")
    });
    let ns = "fresh";
    fresh_namespace(&cp, ns);
    let t = Instant::now();
    cp.create(&pod(ns, "early", Some("edge-node-1"), "sleep 3600").to_string());

    // Waiting for its volume: no address but its own, ever.
    cp.wait_for("FailedMount for kube-root-ca.crt", WAIT, log, |cp| {
        let ev = cp.kubectl_ok(&["get", "events", "-n", ns, "-o", "json"]);
        ev.contains("kube-root-ca.crt").then_some(())
    });
    let until = Instant::now() + Duration::from_secs(3);
    while Instant::now() < until {
        let p = cp.get("pod/early", Some(ns)).expect("pod");
        let ip = p["status"]["podIP"].as_str().unwrap_or("");
        assert!(
            ip.is_empty() || ip.starts_with(&net.prefix),
            "a waiting pod shows podIP {ip}: {}",
            p["status"]
        );
        std::thread::sleep(Duration::from_millis(300));
    }
    let ca = std::fs::read_to_string(cp.ca()).expect("ca");
    cp.create(
        &serde_json::json!({
            "apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": "kube-root-ca.crt", "namespace": ns},
            "data": {"ca.crt": ca},
        })
        .to_string(),
    );
    let p = wait_running(&cp, &a, ns, "early");
    eprintln!(
        "create to Running, waiting on kube-root-ca.crt: {:?}",
        t.elapsed()
    );
    assert_pod_ip(&p, &net, &a);
    let t = Instant::now();
    cp.kubectl_ok(&["delete", "pod", "-n", ns, "early", "--timeout=60s"]);
    eprintln!("kubectl delete pod early: {:?}", t.elapsed());
}

/// A static pod shows in the cluster as its mirror pod (owned by the Node), made again
/// when deleted there; a Node deleted under a running agent is registered again; the
/// manifest removed, the mirror pod goes too.
#[test]
fn static_pod_shows_as_a_mirror_pod_and_a_deleted_node_comes_back() {
    if !need_root() {
        return;
    }
    let cp = ControlPlane::start(Options::bare());
    let mut a = node(&cp, "cp-mirror", "edge-node-1", "");
    a.write_manifest(
        "static.yaml",
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: static-web\nspec:\n  hostNetwork: true\n  \
         terminationGracePeriodSeconds: 1\n  containers:\n    - name: web\n      image: busybox:demo\n      \
         command: [\"sleep\", \"3600\"]\n",
    );
    a.start();
    let log = || tail(&a.agent_log(), 60);
    let mirror = "pod/static-web-edge-node-1";
    let first = cp.wait_for("the mirror pod Running", WAIT, log, |cp| {
        cp.get(mirror, Some("default"))
            .filter(|p| p["status"]["phase"] == "Running")
    });
    assert!(
        first["metadata"]["annotations"]["kubernetes.io/config.mirror"].is_string(),
        "{}",
        first["metadata"]
    );
    let owner = &first["metadata"]["ownerReferences"][0];
    assert_eq!(
        (&owner["kind"], &owner["controller"]),
        (&Value::from("Node"), &Value::from(true))
    );
    // A host-network pod shows the node's address as its own.
    assert_eq!(first["status"]["podIP"], "127.0.0.1");
    assert_eq!(first["status"]["hostIP"], "127.0.0.1");
    // The static pod itself is not run twice: one pod, from the file.
    assert_eq!(a.pods().len(), 1);

    // Deleted in the cluster: made again (a new UID), the static pod untouched.
    cp.kubectl_ok(&["delete", mirror, "--wait=false"]);
    let first_uid = first["metadata"]["uid"].clone();
    cp.wait_for("a new mirror pod Running", WAIT, log, |cp| {
        cp.get(mirror, Some("default")).filter(|p| {
            p["metadata"]["uid"] != first_uid
                && p["metadata"]["deletionTimestamp"].is_null()
                && p["status"]["phase"] == "Running"
        })
    });
    assert_eq!(a.pods().len(), 1);

    // The Node deleted under a running agent is registered again.
    let node_uid = cp.get("node/edge-node-1", None).expect("node")["metadata"]["uid"].clone();
    cp.kubectl_ok(&["delete", "node", "edge-node-1"]);
    cp.wait_for("the node registered again", WAIT, log, |cp| {
        cp.get("node/edge-node-1", None)
            .filter(|n| n["metadata"]["uid"] != node_uid)
    });

    // The manifest removed: the mirror pod goes too.
    a.remove_manifest("static.yaml");
    cp.wait_for("the mirror pod deleted", WAIT, log, |cp| {
        cp.get(mirror, Some("default")).is_none().then_some(())
    });
    a.wait_gone("static-web", WAIT);
}
