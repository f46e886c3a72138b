//! Probes of a pod being deleted, end to end: a real kube-apiserver v1.36, real
//! containers, as root. Between the DELETE and its containers' exit the pod's readiness
//! probes go on, so a container that stops serving on SIGTERM makes the pod unready
//! (and its endpoints go) while it still winds down; its liveness probes are over, so
//! one that fails now restarts nothing. The same for a sidecar, stopped after the app
//! container.

use support::control_plane;

use std::time::{Duration, Instant};

use control_plane::cluster::tail;
use control_plane::{ControlPlane, Options};
use serde_json::Value;
use support::agent::{condition, need_root, Agent};

const NODE: &str = "probe-termination-node-1";
const IMAGE: &str = "docker.io/library/busybox:demo";
/// On SIGTERM: no longer ready nor live, and a long wind-down before the exit.
const WIND_DOWN: &str = "trap 'rm -f /tmp/ready /tmp/live; sleep 25; exit 0' TERM; \
                         touch /tmp/ready /tmp/live; while true; do sleep 1; done";
/// On SIGTERM: out at once.
const QUICK: &str = "trap 'exit 0' TERM; while true; do sleep 1; done";

/// A container running `script`, with readiness and liveness probes on its files.
fn probed(name: &str, script: &str, extra: &str) -> String {
    let probe = |file: &str| {
        format!("exec: {{command: [cat, /tmp/{file}]}}, periodSeconds: 1, failureThreshold: 1")
    };
    format!(
        "    - name: {name}\n      image: {IMAGE}\n      command: [\"sh\", \"-c\", {}]\n      \
         readinessProbe: {{{}}}\n      livenessProbe: {{{}}}\n{extra}",
        serde_json::to_string(script).expect("json"),
        probe("ready"),
        probe("live"),
    )
}

fn pod(name: &str, init: Option<&str>, containers: &str) -> String {
    let init = init.map_or(String::new(), |c| format!("  initContainers:\n{c}"));
    format!(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: {name}\nspec:\n  nodeName: {NODE}\n  \
         automountServiceAccountToken: false\n  terminationGracePeriodSeconds: 40\n{init}  \
         containers:\n{containers}"
    )
}

fn plain(name: &str, script: &str) -> String {
    format!(
        "    - name: {name}\n      image: {IMAGE}\n      command: [\"sh\", \"-c\", {}]\n",
        serde_json::to_string(script).expect("json")
    )
}

/// The pod's events, as `(reason, message)`.
fn events(cp: &ControlPlane, pod: &str) -> Vec<(String, String)> {
    let selector = format!("involvedObject.name={pod}");
    let list = cp.kubectl_ok(&["get", "events", "--field-selector", &selector, "-o", "json"]);
    let list: Value = serde_json::from_str(&list).expect("event list");
    list["items"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|e| {
            let s = |k: &str| e[k].as_str().unwrap_or_default().to_string();
            (s("reason"), s("message"))
        })
        .collect()
}

#[test]
fn a_deleted_pod_goes_unready_while_it_stops_and_liveness_rests() {
    if !need_root() {
        return;
    }
    let cp = ControlPlane::start(Options::bare());
    let _ = cp.kubectl(&["create", "serviceaccount", "default"]);
    let mut a = Agent::new("probe-termination");
    a.node_name = NODE.into();
    cp.join(&mut a, "", "");
    a.start();
    let sidecar = probed("side", WIND_DOWN, "      restartPolicy: Always\n");
    cp.apply(&pod("app", None, &probed("main", WIND_DOWN, "")));
    cp.apply(&pod("sidecar", Some(&sidecar), &plain("main", QUICK)));
    let log = || tail(&a.agent_log(), 40);
    for name in ["app", "sidecar"] {
        cp.wait_for(
            &format!("{name} ready"),
            Duration::from_secs(90),
            log,
            |cp| {
                cp.get(&format!("pod/{name}"), None)
                    .filter(|p| condition(p, "Ready")["status"] == "True")
            },
        );
    }

    let deleted = Instant::now();
    cp.kubectl_ok(&["delete", "pod", "app", "sidecar", "--wait=false"]);
    // The containers wind down for 25 s after SIGTERM; their readiness probes fail
    // within a second or two of it.
    for name in ["app", "sidecar"] {
        let p = cp.wait_for(
            &format!("{name} unready while it stops"),
            Duration::from_secs(12).saturating_sub(deleted.elapsed()),
            log,
            |cp| {
                cp.get(&format!("pod/{name}"), None)
                    .filter(|p| condition(p, "Ready")["status"] == "False")
            },
        );
        assert!(p["metadata"]["deletionTimestamp"].is_string(), "{p}");
        assert_eq!(
            condition(&p, "Ready")["reason"],
            "ContainersNotReady",
            "{p}"
        );
        assert_eq!(p["status"]["phase"], "Running", "{p}");
    }
    for name in ["app", "sidecar"] {
        cp.wait_for(
            &format!("{name} gone"),
            Duration::from_secs(60),
            log,
            |cp| cp.get(&format!("pod/{name}"), None).is_none().then_some(()),
        );
        let said = events(&cp, name);
        assert!(
            said.iter()
                .any(|(r, m)| r == "Unhealthy" && m.starts_with("Readiness probe failed")),
            "{name}: the readiness probe ran on: {said:?}"
        );
        assert!(
            !said.iter().any(|(_, m)| m.contains("iveness probe")),
            "{name}: a liveness probe ran after the DELETE: {said:?}"
        );
    }
    a.stop();
}
