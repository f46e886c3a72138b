//! End-to-end against a real control plane (etcd, kube-apiserver v1.36 with Node and
//! RBAC authorization and NodeRestriction, kube-controller-manager, kube-scheduler):
//! `holdfast run --kubeconfig` as a node, real containers, and everything checked the
//! way a user sees it, through the real kubectl.

mod support;

#[path = "support/control_plane/mod.rs"]
mod control_plane;

use std::time::{Duration, Instant};

use control_plane::{ControlPlane, Options};
use serde_json::Value;
use support::agent::{need_root, Agent};

const WAIT: Duration = Duration::from_secs(60);

/// An agent that is node `node` of `cp`, with short node intervals.
fn node(cp: &ControlPlane, name: &str, node: &str, holdfast_keys: &str) -> Agent {
    let mut a = Agent::new(name);
    a.node_name = node.into();
    cp.join(
        &mut a,
        holdfast_keys,
        "nodeStatusUpdateFrequency: 1s\nnodeStatusReportFrequency: 3s\n",
    );
    a
}

fn condition<'a>(obj: &'a Value, type_: &str) -> &'a Value {
    obj["status"]["conditions"]
        .as_array()
        .and_then(|cs| cs.iter().find(|c| c["type"] == type_))
        .unwrap_or(&Value::Null)
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
