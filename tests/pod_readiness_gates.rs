//! Pod readiness gates, end to end: a real kube-apiserver v1.36, real containers, as
//! root. A pod whose container is ready is Ready only once every condition its
//! `spec.readinessGates` name is True in its status; those conditions are others' to
//! set (a load balancer controller, here the test), and the agent's own status
//! updates leave them as they are. The Ready condition says why it is not, in the
//! kubelet's words, and says nothing more once it is.

use support::control_plane;

use std::time::Duration;

use control_plane::cluster::tail;
use control_plane::{ControlPlane, Options};
use serde_json::Value;
use support::agent::{condition, container, need_root, Agent};

const NODE: &str = "gates-node-1";
const GATE_A: &str = "example.com/lb-ready";
const GATE_B: &str = "example.com/dns-ready";

fn pod() -> String {
    format!(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: gated\nspec:\n  nodeName: {NODE}\n  \
         automountServiceAccountToken: false\n  terminationGracePeriodSeconds: 1\n  \
         readinessGates:\n    - conditionType: {GATE_A}\n    - conditionType: {GATE_B}\n  \
         containers:\n    - name: main\n      image: docker.io/library/busybox:demo\n      \
         command: [\"sleep\", \"3600\"]\n"
    )
}

/// Sets the pod's condition `type_` to `status` as a controller does: a strategic
/// merge patch of the status naming that one condition.
fn set_condition(cp: &ControlPlane, type_: &str, status: &str) {
    let patch = serde_json::json!({"status": {"conditions": [{"type": type_, "status": status}]}});
    cp.kubectl_ok(&[
        "patch",
        "pod",
        "gated",
        "--subresource=status",
        "--type=strategic",
        "-p",
        &patch.to_string(),
    ]);
}

/// The pod once its Ready condition has `status` and `message` (None: no message).
fn wait_ready(cp: &ControlPlane, a: &Agent, status: &str, message: Option<&str>) -> Value {
    let log = || tail(&a.agent_log(), 30);
    let want = format!("Ready {status} with message {message:?}");
    cp.wait_for(&want, Duration::from_secs(60), log, |cp| {
        cp.get("pod/gated", None).filter(|p| {
            let r = condition(p, "Ready");
            r["status"] == status && r["message"].as_str() == message
        })
    })
}

#[test]
fn ready_waits_for_every_gate_and_others_conditions_stay() {
    if !need_root() {
        return;
    }
    let cp = ControlPlane::start(Options::bare());
    let _ = cp.kubectl(&["create", "serviceaccount", "default"]);
    let mut a = Agent::new("readiness-gates");
    a.node_name = NODE.into();
    cp.join(&mut a, "", "");
    a.start();
    cp.apply(&pod());

    let none = format!(
        "corresponding condition of pod readiness gate \"{GATE_A}\" does not exist., \
         corresponding condition of pod readiness gate \"{GATE_B}\" does not exist."
    );
    let p = wait_ready(&cp, &a, "False", Some(&none));
    assert_eq!(container(&p, "main")["ready"], true, "{p}");
    assert_eq!(condition(&p, "ContainersReady")["status"], "True", "{p}");
    assert_eq!(condition(&p, "Ready")["reason"], "ReadinessGatesNotReady");

    set_condition(&cp, GATE_A, "True");
    let b_missing =
        format!("corresponding condition of pod readiness gate \"{GATE_B}\" does not exist.");
    wait_ready(&cp, &a, "False", Some(&b_missing));

    set_condition(&cp, GATE_B, "True");
    let p = wait_ready(&cp, &a, "True", None);
    assert!(
        condition(&p, "Ready").get("reason").is_none(),
        "a Ready True keeps no reason: {p}"
    );
    for gate in [GATE_A, GATE_B] {
        assert_eq!(condition(&p, gate)["status"], "True", "{gate}: {p}");
    }

    set_condition(&cp, GATE_A, "False");
    let a_false =
        format!("the status of pod readiness gate \"{GATE_A}\" is not \"True\", but False");
    let p = wait_ready(&cp, &a, "False", Some(&a_false));
    assert_eq!(condition(&p, "ContainersReady")["status"], "True", "{p}");
    assert_eq!(condition(&p, GATE_B)["status"], "True", "{p}");

    let _ = cp.kubectl(&["delete", "pod", "gated", "--wait=false"]);
    a.stop();
}
