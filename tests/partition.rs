//! A gateway cut off from a real control plane (etcd, kube-apiserver v1.36 and the
//! kube-controller-manager with a 20 s `--node-monitor-grace-period`): the uplink is a
//! relay on 127.0.0.1 in front of the apiserver, blackholed for shorter and for longer
//! than the grace period. Measured (and printed, never asserted as a timing): how long
//! the node stays NotReady/Unknown after the link returns. Asserted: it goes Ready
//! again, and its pod kept running throughout, in the same container; a pod whose
//! toleration of `node.kubernetes.io/unreachable` ran out during the outage was deleted
//! in the cluster meanwhile (taint-based eviction), and the gateway stops it once the
//! link is back.

use support::{control_plane, proxy};

use std::time::{Duration, Instant};

use control_plane::{ControlPlane, Options};
use proxy::{Mode, Proxy};
use serde_json::Value;
use support::agent::{need_root, Agent};

const NODE: &str = "edge-gw-1";
const WAIT: Duration = Duration::from_secs(90);
const GRACE: Duration = Duration::from_secs(20);

fn ready(node: &Value) -> String {
    node["status"]["conditions"]
        .as_array()
        .and_then(|cs| cs.iter().find(|c| c["type"] == "Ready"))
        .and_then(|c| c["status"].as_str())
        .unwrap_or("")
        .to_string()
}

/// The agent as node `NODE` of `cp`, reaching the apiserver only through `relay`.
fn gateway(cp: &ControlPlane, relay: &Proxy) -> Agent {
    let mut a = Agent::new("partition");
    a.node_name = NODE.into();
    cp.join(&mut a, "", "");
    cp.relay_kubeconfig(&mut a, &relay.url());
    a
}

fn pod_yaml(name: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: {name}\n  namespace: default\nspec:\n  \
         nodeName: {NODE}\n  automountServiceAccountToken: false\n  hostNetwork: true\n  \
         terminationGracePeriodSeconds: 1\n  containers:\n    - name: main\n      \
         image: busybox:demo\n      command: [\"sh\", \"-c\", \"exec sleep 100000\"]\n"
    )
}

/// [`pod_yaml`], tolerating the node's being unreachable for only `seconds`.
fn short_tolerance_pod_yaml(name: &str, seconds: u32) -> String {
    format!(
        "{}  tolerations:\n    - key: node.kubernetes.io/unreachable\n      \
         operator: Exists\n      effect: NoExecute\n      tolerationSeconds: {seconds}\n",
        pod_yaml(name)
    )
}

fn container_id(pod: &Value) -> String {
    pod["status"]["containerStatuses"][0]["containerID"]
        .as_str()
        .unwrap_or_default()
        .to_string()
}

/// Cuts the link for `outage`, then measures from the link's return until the node is
/// Ready with a lease renewed after it. Returns (worst Ready status seen, time to Ready).
fn outage(
    cp: &ControlPlane,
    relay: &Proxy,
    a: &Agent,
    outage: Duration,
    long: bool,
) -> (String, Duration) {
    let log = || format!("--- agent log ---\n{}", a.agent_log());
    relay.set_mode(Mode::Blackhole);
    let cut = Instant::now();
    let mut worst = "True".to_string();
    while cut.elapsed() < outage {
        if let Some(n) = cp.get(&format!("node/{NODE}"), None) {
            let r = ready(&n);
            if r != "True" {
                worst = r;
            }
        }
        std::thread::sleep(Duration::from_millis(500));
    }
    if long {
        // Well past the grace period: the node controller has marked it Unknown.
        assert_eq!(worst, "Unknown", "node after {outage:?} of outage");
        relay.restore_after_outage();
    } else {
        relay.set_mode(Mode::Pass);
    }
    let back = Instant::now();
    cp.wait_for("the node to be Ready again", WAIT, log, |cp| {
        let n = cp.get(&format!("node/{NODE}"), None)?;
        let r = ready(&n);
        if r != "True" {
            worst = r;
            return None;
        }
        Some(())
    });
    (worst, back.elapsed())
}

#[test]
fn a_gateway_cut_off_shorter_and_longer_than_the_grace_period_keeps_its_pod_and_comes_back_ready() {
    if !need_root() {
        return;
    }
    let cp = ControlPlane::start(Options {
        node_monitor_grace_period: GRACE,
        scheduler: false,
        ..Options::default()
    });
    let relay = Proxy::start(cp.addr());
    let mut a = gateway(&cp, &relay);
    a.start();
    let log = || format!("--- agent log ---\n{}", a.agent_log());
    cp.wait_for("node Ready", WAIT, log, |cp| {
        cp.get(&format!("node/{NODE}"), None)
            .filter(|n| ready(n) == "True")
    });
    // The default ServiceAccount comes from the controller-manager; the pod needs it.
    cp.wait_for("the default ServiceAccount", WAIT, log, |cp| {
        cp.get("serviceaccount/default", Some("default"))
    });
    cp.apply(&pod_yaml("web"));
    let running = cp.wait_for("web Running in the cluster", WAIT, log, |cp| {
        cp.get("pod/web", Some("default"))
            .filter(|p| p["status"]["phase"] == "Running" && !container_id(p).is_empty())
    });
    let id = container_id(&running);
    cp.apply(&short_tolerance_pod_yaml("brief", 1));
    cp.wait_for("brief Running in the cluster", WAIT, log, |cp| {
        cp.get("pod/brief", Some("default"))
            .filter(|p| p["status"]["phase"] == "Running")
    });

    let (worst, took) = outage(&cp, &relay, &a, GRACE / 2, false);
    eprintln!(
        "outage of {:?} (under the {GRACE:?} grace period): worst Ready {worst}, Ready {took:?} after the link returned",
        GRACE / 2
    );
    assert_eq!(
        worst, "True",
        "a short outage does not make the node NotReady"
    );

    let (worst, took) = outage(&cp, &relay, &a, GRACE * 2, true);
    eprintln!(
        "outage of {:?} (over the {GRACE:?} grace period): node {worst} until {took:?} after the link returned",
        GRACE * 2
    );

    // `brief` tolerated the unreachable taint for 1 s: the cluster deleted it while the
    // gateway could not hear (it waits, Terminating, for the node), and the gateway stops
    // it and lets it go once the link is back. But this cluster has one node: when the
    // node lifecycle controller sees every node not ready before it has tainted this one
    // (a race of its monitor period), it enters "master disruption mode", takes the
    // NoExecute taints back and evicts nothing, by design. Then brief stays, rightly.
    let back = Instant::now();
    let deadline = back + WAIT;
    let gone = loop {
        if cp.get("pod/brief", Some("default")).is_none() {
            break true;
        }
        let events = cp.kubectl_ok(&["get", "events", "-n", "default", "-o", "json"]);
        let disruption = cp
            .log_tail("kube-controller-manager", 5000)
            .contains("Entering master disruption mode");
        if disruption && !events.contains("TaintManagerEviction") && back.elapsed() > GRACE {
            break false;
        }
        assert!(
            Instant::now() < deadline,
            "brief not gone from the cluster\n{}",
            log()
        );
        std::thread::sleep(Duration::from_millis(500));
    };
    if gone {
        a.wait_until("brief stopped on the gateway", WAIT, |a| {
            a.pod("brief").is_none()
        });
        eprintln!(
            "evicted pod gone from the cluster and the gateway {:?} after the node was Ready again",
            back.elapsed()
        );
        let events = cp.kubectl_ok(&["get", "events", "-n", "default", "-o", "json"]);
        assert!(
            events.contains("TaintManagerEviction"),
            "no taint-based eviction event for brief: {events}"
        );
    } else {
        eprintln!(
            "the one-node cluster entered master disruption mode before tainting: nothing \
             evicted, brief runs on"
        );
        let p = cp
            .get("pod/brief", Some("default"))
            .expect("brief in the cluster");
        assert!(
            p["metadata"]["deletionTimestamp"].is_null(),
            "brief is being deleted: {p}"
        );
    }

    // The pod ran on through both, in the same container, and the cluster says so.
    let p = cp.wait_for("web Running and Ready in the cluster", WAIT, log, |cp| {
        cp.get("pod/web", Some("default")).filter(|p| {
            p["status"]["phase"] == "Running"
                && p["status"]["containerStatuses"][0]["ready"] == true
                && p["metadata"]["deletionTimestamp"].is_null()
        })
    });
    assert_eq!(container_id(&p), id, "web was restarted");
    let local = a.pod("web").expect("web on the gateway");
    assert!(
        support::agent::container(&local, "main")["state"]["running"].is_object(),
        "{local}"
    );
    // The taint the node controller set while the node was unreachable goes.
    cp.wait_for("the unreachable taint to go", WAIT, log, |cp| {
        let node = cp.get(&format!("node/{NODE}"), None)?;
        let taints = node["spec"]["taints"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        (!taints
            .iter()
            .any(|t| t["key"] == "node.kubernetes.io/unreachable"))
        .then_some(())
    });
    a.stop();
}
