//! Pod status against a real control plane (etcd, kube-apiserver v1.36 with
//! NodeRestriction, kube-controller-manager): what `kubectl` shows of a pod holdfast
//! runs in a namespace made a moment before, with its own network.

use support::control_plane;

use std::time::Duration;

use control_plane::{ControlPlane, Options};
use serde_json::Value;
use support::agent::{need_root, Agent};
use support::cni::{need_plugins, TestNetwork};

const NODE: &str = "edge-node-1";
const WAIT: Duration = Duration::from_secs(90);

fn cluster() -> ControlPlane {
    ControlPlane::start(Options {
        scheduler: false,
        ..Options::default()
    })
}

/// Node `NODE` of `cp`, with a CNI network of its own.
fn node(cp: &ControlPlane, name: &str) -> (TestNetwork, Agent) {
    let mut a = Agent::new(name);
    a.node_name = NODE.into();
    let net = TestNetwork::new(&a, 0);
    cp.join(
        &mut a,
        &net.holdfast_keys(),
        "nodeStatusUpdateFrequency: 1s\nnodeStatusReportFrequency: 3s\n",
    );
    (net, a)
}

fn pod(ns: &str, name: &str, policy: &str, script: &str) -> String {
    serde_json::json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": ns},
        "spec": {
            "nodeName": NODE,
            "restartPolicy": policy,
            "terminationGracePeriodSeconds": 2,
            "containers": [{
                "name": "main",
                "image": "busybox:demo",
                "command": ["sh", "-c", script],
            }],
        },
    })
    .to_string()
}

fn main_status(p: &Value) -> &Value {
    p["status"]["containerStatuses"]
        .as_array()
        .and_then(|cs| cs.iter().find(|c| c["name"] == "main"))
        .unwrap_or(&Value::Null)
}

/// The repo digest the Node lists for the busybox image.
fn image_id_digest(node: &Value) -> Option<String> {
    node["status"]["images"].as_array()?.iter().find_map(|i| {
        i["names"].as_array()?.iter().find_map(|n| {
            n.as_str()
                .filter(|n| n.starts_with("docker.io/library/busybox@sha256:"))
                .map(str::to_string)
        })
    })
}

/// A namespace of its own, once the controller-manager gave it its `default`
/// ServiceAccount (before that, the apiserver refuses pods in it).
fn namespace(cp: &ControlPlane, a: &Agent, ns: &str) {
    cp.kubectl_ok(&["create", "namespace", ns]);
    cp.wait_for(
        "the default ServiceAccount",
        WAIT,
        || a.agent_log(),
        |cp| cp.get("serviceaccount/default", Some(ns)),
    );
}

#[test]
fn a_pod_in_a_fresh_namespace_runs_with_its_own_address_restarts_and_goes() {
    if !need_root() || !need_plugins() {
        return;
    }
    let cp = cluster();
    let (net, mut a) = node(&cp, "status-real");
    a.start();
    let log = || format!("--- agent log ---\n{}", a.agent_log());
    cp.wait_for("node Ready", WAIT, log, |cp| {
        cp.get(&format!("node/{NODE}"), None).filter(|n| {
            n["status"]["conditions"].as_array().is_some_and(|cs| {
                cs.iter()
                    .any(|c| c["type"] == "Ready" && c["status"] == "True")
            })
        })
    });

    // What the Node says of its runtime and hardware.
    let n = cp.get(&format!("node/{NODE}"), None).expect("node");
    let digest = image_id_digest(&n);
    assert!(digest.is_some(), "images: {}", n["status"]["images"]);
    assert_eq!(n["status"]["runtimeHandlers"][0]["name"], "");
    assert_eq!(n["status"]["features"]["supplementalGroupsPolicy"], false);
    let info = &n["status"]["nodeInfo"];
    assert_ne!(info["systemUUID"], info["machineID"]);
    if let Ok(uuid) = std::fs::read_to_string("/sys/class/dmi/id/product_uuid") {
        assert_eq!(info["systemUUID"], uuid.trim());
    }

    // The first pod of a new namespace: its service-account volume waits for
    // kube-root-ca.crt, and meanwhile the pod has no address of its own.
    namespace(&cp, &a, "fresh");
    let created = std::time::Instant::now();
    cp.create(&pod("fresh", "web", "Always", "echo up; exec sleep 3600"));
    cp.create(&pod(
        "fresh",
        "crash",
        "Always",
        "echo once; sleep 1; exit 3",
    ));
    let web = cp.wait_for("pod web Running", WAIT, log, |cp| {
        cp.get("pod/web", Some("fresh"))
            .filter(|p| p["status"]["phase"] == "Running" && main_status(p)["ready"] == true)
    });
    eprintln!(
        "first pod of a new namespace: create to Running and ready in the API in {:?}",
        created.elapsed()
    );
    let ip = web["status"]["podIP"].as_str().unwrap_or_default();
    assert!(
        ip.starts_with(&net.prefix),
        "podIP {ip} from the pod network"
    );
    assert_eq!(web["status"]["podIPs"], serde_json::json!([{"ip": ip}]));
    assert_eq!(web["status"]["hostIP"], "127.0.0.1");
    // The kubelet's fields: containerd's repo digest as imageID, the generation the
    // status describes.
    let image_id = main_status(&web)["imageID"].as_str().unwrap_or_default();
    assert!(
        image_id.starts_with("docker.io/library/busybox@sha256:"),
        "imageID {image_id}"
    );
    assert_eq!(digest.as_deref(), Some(image_id), "the Node lists the same");
    assert_eq!(
        web["status"]["observedGeneration"],
        web["metadata"]["generation"]
    );
    let table = cp.kubectl_ok(&["get", "pods", "-n", "fresh", "-o", "wide"]);
    assert!(
        table
            .lines()
            .any(|l| l.starts_with("web ") && l.contains(" Running ")),
        "{table}"
    );

    // Restarts are counted in the API.
    cp.wait_for("crash restarted twice", WAIT, log, |cp| {
        cp.get("pod/crash", Some("fresh"))
            .filter(|p| main_status(p)["restartCount"].as_i64() >= Some(2))
    });

    // What an agent that sent the node's address before left in the API is replaced
    // with the next status (a restart of crash), not merged with it.
    cp.kubectl_ok(&[
        "patch",
        "pod",
        "crash",
        "-n",
        "fresh",
        "--subresource=status",
        "--type=merge",
        "-p",
        r#"{"status":{"podIP":"127.0.0.1","podIPs":[{"ip":"127.0.0.1"}]}}"#,
    ]);
    let crash = cp.wait_for("crash's own address back", WAIT, log, |cp| {
        cp.get("pod/crash", Some("fresh")).filter(|p| {
            p["status"]["podIPs"].as_array().is_some_and(|ips| {
                ips.len() == 1
                    && ips[0]["ip"]
                        .as_str()
                        .is_some_and(|i| i.starts_with(&net.prefix))
            })
        })
    });
    assert_eq!(crash["status"]["podIP"], crash["status"]["podIPs"][0]["ip"]);

    let agent_log = a.agent_log();
    assert!(
        !agent_log.contains(" 422 ") && !agent_log.contains("refused"),
        "no status was refused:\n{agent_log}"
    );
    // No event claims kube-root-ca.crt is missing once it exists. Before the
    // controller-manager has published it in the new namespace, it is rightly so.
    let cm = cp
        .get("configmap/kube-root-ca.crt", Some("fresh"))
        .expect("kube-root-ca.crt published");
    let published = cm["metadata"]["creationTimestamp"]
        .as_str()
        .expect("creationTimestamp")
        .to_owned();
    let events = cp
        .get("events", Some("fresh"))
        .expect("events of the namespace");
    let late: Vec<&Value> = events["items"]
        .as_array()
        .expect("event list")
        .iter()
        .filter(|e| {
            e["message"]
                .as_str()
                .is_some_and(|m| m.contains("\"kube-root-ca.crt\" not found"))
        })
        .filter(|e| {
            // RFC 3339 in UTC, whole seconds: ordered as strings; the same second
            // cannot be told apart, and counts as before.
            let at = e["lastTimestamp"].as_str().unwrap_or("");
            at.is_empty() || at > published.as_str()
        })
        .collect();
    assert!(
        late.is_empty(),
        "kube-root-ca.crt published at {published}, said missing after: {late:#?}"
    );

    // kubectl delete waits for the node to confirm, and returns.
    let out = cp.kubectl(&[
        "delete",
        "pod",
        "web",
        "crash",
        "-n",
        "fresh",
        "--timeout=60s",
    ]);
    assert!(
        out.status.success(),
        "kubectl delete: {}\n{}",
        String::from_utf8_lossy(&out.stderr),
        a.agent_log()
    );
    assert!(cp.get("pod/web", Some("fresh")).is_none());
    a.stop();
}

/// A namespace being deleted: its pods stop, their statuses still land, and the events
/// the apiserver refuses there (403, the namespace is terminating) are said in the
/// agent's log with the apiserver's message rather than dropped without a word.
#[test]
fn a_terminating_namespace_refuses_events_and_its_pods_still_go() {
    if !need_root() || !need_plugins() {
        return;
    }
    let cp = cluster();
    let (_net, mut a) = node(&cp, "status-ns-gone");
    a.start();
    let log = || format!("--- agent log ---\n{}", a.agent_log());
    namespace(&cp, &a, "leaving");
    cp.create(&pod("leaving", "web", "Always", "exec sleep 3600"));
    cp.wait_for("pod web Running", WAIT, log, |cp| {
        cp.get("pod/web", Some("leaving"))
            .filter(|p| p["status"]["phase"] == "Running")
    });
    cp.kubectl_ok(&["delete", "namespace", "leaving", "--wait=false"]);
    a.wait_until("the refused event in the log", WAIT, |a| {
        let l = a.agent_log();
        l.contains("refused") && l.contains("because it is being terminated")
    });
    cp.wait_for("the namespace gone", WAIT, log, |cp| {
        cp.get("namespace/leaving", None).is_none().then_some(())
    });
    a.stop();
}
