//! What end-to-end tests on the real control plane share: an agent joined as a node
//! with a CNI network of its own, pod documents, waits on a pod's status as kubectl
//! shows it, and the start-to-Running timings a user would care about.

use std::time::{Duration, Instant};

use serde_json::{json, Value};

use super::link::NodeAddress;
use super::ControlPlane;
use crate::agent::Agent;
use crate::cni::TestNetwork;

pub const WAIT: Duration = Duration::from_secs(90);

/// No eviction threshold: the machine's disk and memory are shared by every test and
/// build on it, and its pressure (DiskPressure, and the node lifecycle controller's
/// `disk-pressure` taint that keeps the scheduler away) is no test's business unless
/// the test makes it itself.
pub const NO_PRESSURE: &str = "evictionHard:\n  memory.available: \"0%\"\n  \
                               nodefs.available: \"0%\"\n  imagefs.available: \"0%\"\n";

/// An agent that is node `node` of `cp` on a CNI network of its own (`net_index` tells
/// apart the networks of one test binary), with short node intervals, listening on
/// `address` if given (else 127.0.0.1). Not started.
pub fn node_on_network(
    cp: &ControlPlane,
    name: &str,
    node: &str,
    net_index: u32,
    address: Option<&NodeAddress>,
) -> (TestNetwork, Agent) {
    let mut a = Agent::new(name);
    a.node_name = node.into();
    if let Some(addr) = address {
        a.address = addr.ip.clone();
    }
    let net = TestNetwork::new(&a, net_index);
    cp.join(
        &mut a,
        &net.holdfast_keys(),
        &format!("nodeStatusUpdateFrequency: 1s\nnodeStatusReportFrequency: 3s\n{NO_PRESSURE}"),
    );
    (net, a)
}

/// The cheapest cluster with a node: etcd and the apiserver (the namespace's `default`
/// ServiceAccount made, which no controller makes here), and an agent named `name`
/// joined to it as node `node` and started.
pub fn bare_node(name: &str, node: &str) -> (ControlPlane, Agent) {
    let cp = ControlPlane::start(super::Options::bare());
    let _ = cp.kubectl(&["create", "serviceaccount", "default"]);
    let mut a = Agent::new(name);
    a.node_name = node.into();
    cp.join(&mut a, "", "");
    a.start();
    (cp, a)
}

/// Waits until node `node` is Ready and, if `untainted`, carries no taint (the
/// `not-ready` taint the apiserver puts on a new Node, which only the node lifecycle
/// controller takes off, keeps the scheduler away); returns it.
pub fn wait_node(cp: &ControlPlane, a: &Agent, node: &str, untainted: bool) -> Value {
    let log = || {
        let n = cp.get(&format!("node/{node}"), None).unwrap_or_default();
        format!(
            "--- node spec ---\n{}\n--- node conditions ---\n{}\n--- agent log ---\n{}",
            n["spec"],
            n["status"]["conditions"],
            tail(&a.agent_log(), 60)
        )
    };
    cp.wait_for(
        &format!("node {node} Ready (untainted: {untainted})"),
        WAIT,
        log,
        |cp| {
            cp.get(&format!("node/{node}"), None).filter(|n| {
                condition(n, "Ready")["status"] == "True"
                    && (!untainted || n["spec"]["taints"].as_array().is_none_or(|t| t.is_empty()))
            })
        },
    )
}

/// A condition of an object's status, or Null.
pub fn condition<'a>(obj: &'a Value, type_: &str) -> &'a Value {
    obj["status"]["conditions"]
        .as_array()
        .and_then(|cs| cs.iter().find(|c| c["type"] == type_))
        .unwrap_or(&Value::Null)
}

/// A pod (JSON) of one busybox container `main` running `script`, in `ns`, bound to
/// `node` when given (else left to the scheduler), with a short grace period.
pub fn pod(ns: &str, name: &str, node: Option<&str>, script: &str) -> Value {
    let mut p = json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": ns, "labels": {"app": name}},
        "spec": {
            "terminationGracePeriodSeconds": 5,
            "containers": [{
                "name": "main",
                "image": "busybox:demo",
                "command": ["sh", "-c", script],
            }],
        },
    });
    if let Some(n) = node {
        p["spec"]["nodeName"] = json!(n);
    }
    p
}

/// A namespace, and (bounded) wait for its `default` ServiceAccount, without which the
/// apiserver refuses pods in it.
pub fn fresh_namespace(cp: &ControlPlane, ns: &str) {
    cp.kubectl_ok(&["create", "namespace", ns]);
    cp.wait_for(
        &format!("serviceaccount default in {ns}"),
        WAIT,
        String::new,
        |cp| cp.get("serviceaccount/default", Some(ns)),
    );
}

/// A fresh namespace once its controllers are done with it: its `default`
/// ServiceAccount and the CA ConfigMaps every pod's service-account volume projects
/// (`kube-root-ca.crt`, and `openshift-service-ca.crt`, which this apiserver build's
/// ServiceAccount admission adds too).
pub fn settled_namespace(cp: &ControlPlane, ns: &str) {
    fresh_namespace(cp, ns);
    for cm in ["kube-root-ca.crt", "openshift-service-ca.crt"] {
        cp.wait_for(
            &format!("configmap {cm} in {ns}"),
            WAIT,
            String::new,
            |cp| cp.get(&format!("configmap/{cm}"), Some(ns)),
        );
    }
}

/// Waits until the pod's phase is Running as the API shows it; returns the pod.
pub fn wait_running(cp: &ControlPlane, a: &Agent, ns: &str, name: &str) -> Value {
    let log = || {
        format!(
            "--- pod ---\n{}\n--- events ---\n{}\n--- agent log ---\n{}",
            cp.get(&format!("pod/{name}"), Some(ns))
                .map(|p| p["status"].to_string())
                .unwrap_or_default(),
            String::from_utf8_lossy(&cp.kubectl(&["get", "events", "-n", ns]).stdout),
            tail(&a.agent_log(), 60)
        )
    };
    cp.wait_for(&format!("pod {ns}/{name} Running"), WAIT, log, |cp| {
        cp.get(&format!("pod/{name}"), Some(ns))
            .filter(|p| p["status"]["phase"] == "Running")
    })
}

pub fn tail(text: &str, lines: usize) -> String {
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

/// Asserts the pod's addresses: one pod IP on the agent's network, the node's as host IP.
pub fn assert_pod_ip(p: &Value, net: &TestNetwork, a: &Agent) {
    let ip = p["status"]["podIP"].as_str().unwrap_or("");
    assert!(
        ip.starts_with(&net.prefix),
        "podIP {ip:?} is not on the pod network {}: {}",
        net.subnet,
        p["status"]
    );
    assert_eq!(
        p["status"]["podIPs"],
        json!([{"ip": ip}]),
        "{}",
        p["status"]
    );
    assert_eq!(p["status"]["hostIP"], a.address.as_str(), "{}", p["status"]);
}

/// Start-to-Running durations, printed as p50/p95 (measured, never asserted).
#[derive(Default)]
pub struct Timings(Vec<Duration>);

impl Timings {
    pub fn add(&mut self, since: Instant) {
        self.0.push(since.elapsed());
    }

    pub fn add_duration(&mut self, d: Duration) {
        self.0.push(d);
    }

    pub fn print(&mut self, what: &str) {
        if self.0.is_empty() {
            return;
        }
        self.0.sort();
        let at = |q: f64| self.0[((self.0.len() - 1) as f64 * q).round() as usize];
        eprintln!(
            "{what}: n={} p50={:?} p95={:?} max={:?}",
            self.0.len(),
            at(0.5),
            at(0.95),
            self.0[self.0.len() - 1]
        );
    }
}
