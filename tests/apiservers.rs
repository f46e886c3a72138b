//! A control plane of several kube-apiservers on one etcd and no load balancer, the
//! node given all of them (`holdfast.apiservers`), as root: kill the apiserver the node
//! uses and the node keeps reporting through the next one at once (its Lease renewed,
//! read through a surviving apiserver with kubectl), a pod created after the kill is
//! started and its status reported; `holdfast status` names the endpoint in use. Then
//! the killed one comes back and the one now in use is killed: the node moves on again,
//! in the list's order, round to the first.

use std::time::{Duration, Instant};

use serde_json::Value;
use support::agent::{need_root, Agent};
use support::control_plane::cluster::{condition, tail};
use support::control_plane::{ControlPlane, Options};

const WAIT: Duration = Duration::from_secs(60);

fn pod(node: &str, name: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: {name}\nspec:\n  nodeName: {node}\n  \
         automountServiceAccountToken: false\n  terminationGracePeriodSeconds: 1\n  \
         containers:\n    - name: main\n      image: docker.io/library/busybox:demo\n      \
         command: [\"sleep\", \"3600\"]\n"
    )
}

/// The endpoint `holdfast status` says is in use.
fn in_use(a: &Agent) -> Value {
    a.status()["uplink"]["apiserver"].clone()
}

fn renew_time(cp: &ControlPlane, node: &str) -> String {
    cp.get(&format!("lease/{node}"), Some("kube-node-lease"))
        .map(|l| {
            l["spec"]["renewTime"]
                .as_str()
                .unwrap_or_default()
                .to_string()
        })
        .unwrap_or_default()
}

/// A node of a cluster of `count` apiservers, each killed in turn while in use.
fn node_keeps_reporting_while_apiservers_die(count: usize, name: &str) {
    let node = format!("{name}-gw");
    let t0 = Instant::now();
    let mut cp = ControlPlane::start(Options::bare());
    cp.add_apiservers(count - 1);
    let urls = cp.apiserver_urls();
    let started = t0.elapsed();
    let _ = cp.kubectl(&["create", "serviceaccount", "default"]);
    let mut a = Agent::new(name);
    a.node_name = node.clone();
    let list = urls
        .iter()
        .map(|u| format!("\"{u}\""))
        .collect::<Vec<_>>()
        .join(", ");
    cp.join(
        &mut a,
        &format!("  apiservers: [{list}]\n"),
        "nodeStatusUpdateFrequency: 1s\nnodeStatusReportFrequency: 3s\n",
    );
    a.start();
    let log = || format!("--- agent log ---\n{}", tail(&a.agent_log(), 60));
    cp.wait_for("the node Ready", WAIT, log, |cp| {
        cp.get(&format!("node/{node}"), None)
            .filter(|n| condition(n, "Ready")["status"] == "True")
    });
    let first = in_use(&a);
    assert_eq!(first["url"], urls[0].as_str(), "{first}");
    assert_eq!(first["index"], 0, "{first}");
    assert_eq!(first["count"], count, "{first}");

    let mut at = 0;
    for round in 0..2 {
        let dead = urls[at].clone();
        let next = (at + 1) % count;
        let t = Instant::now();
        cp.kill_apiserver(&dead);
        cp.kubectl_via(&urls[next]);
        // The Lease keeps moving: renewed at least twice after the kill.
        let mut seen = renew_time(&cp, &node);
        for renewal in 0..2 {
            seen = cp.wait_for(
                &format!("renewal {renewal} of the Lease after {dead} died"),
                WAIT,
                log,
                |cp| Some(renew_time(cp, &node)).filter(|r| !r.is_empty() && *r != seen),
            );
        }
        let renewed = t.elapsed();
        let n = cp.get(&format!("node/{node}"), None).expect("node");
        assert_eq!(
            condition(&n, "Ready")["status"],
            "True",
            "{}",
            n["status"]["conditions"]
        );
        let now = in_use(&a);
        assert_eq!(now["url"], urls[next].as_str(), "round {round}: {now}");
        assert_eq!(now["index"], next, "{now}");
        // A pod created after the kill runs, and its status comes back through the
        // apiserver now in use.
        let pod_name = format!("after-kill-{round}");
        cp.apply(&pod(&node, &pod_name));
        cp.wait_for(&format!("pod {pod_name} running"), WAIT, log, |cp| {
            cp.get(&format!("pod/{pod_name}"), None).filter(|p| {
                p["status"]["phase"] == "Running"
                    && p["status"]["containerStatuses"][0]["state"]["running"].is_object()
            })
        });
        eprintln!(
            "{count} apiservers, {dead} killed: Lease renewed twice in {renewed:?}, pod \
             {pod_name} running in {:?}",
            t.elapsed()
        );
        cp.restart_apiserver(&dead);
        at = next;
    }
    let status = a.status();
    assert_eq!(status["uplink"]["state"], "up", "{status}");
    for round in 0..2 {
        let _ = cp.kubectl(&[
            "delete",
            "pod",
            &format!("after-kill-{round}"),
            "--wait=false",
        ]);
    }
    a.stop();
    eprintln!(
        "{count} apiservers started in {started:?}; whole test {:?}",
        t0.elapsed()
    );
}

#[test]
fn with_two_apiservers_the_node_moves_to_the_other_and_back() {
    if !need_root() {
        return;
    }
    node_keeps_reporting_while_apiservers_die(2, "apiservers-two");
}

#[test]
fn with_three_apiservers_the_node_moves_on_in_the_lists_order() {
    if !need_root() {
        return;
    }
    node_keeps_reporting_while_apiservers_die(3, "apiservers-three");
}
