//! Workloads on a real control plane, as a user drives them with kubectl: a pod that
//! waits for a ConfigMap made after it, and a Deployment rolled out, scaled and deleted,
//! its pods coming and going on the holdfast node.

use support::control_plane;

use std::collections::BTreeMap;
use std::time::Instant;

use control_plane::cluster::{
    assert_pod_ip, condition, node_on_network, pod, settled_namespace, tail, wait_node,
    wait_running, Timings, WAIT,
};
use control_plane::link::NodeAddress;
use control_plane::{ControlPlane, Options};
use serde_json::{json, Value};
use support::agent::{need_root, Agent};
use support::cni::{need_plugins, TestNetwork};

const NODE: &str = "edge-node-1";

/// A cluster and a Ready holdfast node on a network of its own (untainted when the
/// controller-manager runs).
fn cluster(
    name: &str,
    index: u32,
    opts: Options,
) -> (ControlPlane, NodeAddress, TestNetwork, Agent) {
    let untainted = opts.controller_manager;
    let cp = ControlPlane::start(opts);
    eprintln!("control plane ready in {:?}", cp.started_in);
    let addr = NodeAddress::new(index);
    let (net, mut a) = node_on_network(&cp, name, NODE, index, Some(&addr));
    a.start();
    wait_node(&cp, &a, NODE, untainted);
    (cp, addr, net, a)
}

#[test]
fn a_pod_waiting_for_a_configmap_starts_once_it_exists() {
    if !need_root() || !need_plugins() {
        return;
    }
    let (cp, _addr, net, a) = cluster(
        "cp-configmap",
        0,
        Options {
            scheduler: false,
            ..Options::default()
        },
    );
    let ns = "config";
    settled_namespace(&cp, ns);
    let mut p = pod(
        ns,
        "reader",
        Some(NODE),
        "cat /config/greeting; echo; exec sleep 3600",
    );
    p["spec"]["volumes"] = json!([{"name": "config", "configMap": {"name": "settings"}}]);
    p["spec"]["containers"][0]["volumeMounts"] =
        json!([{"name": "config", "mountPath": "/config"}]);
    cp.create(&p.to_string());

    // Waiting: Pending, its container not created, and the user is told why.
    let log = || tail(&a.agent_log(), 60);
    cp.wait_for("FailedMount naming the ConfigMap", WAIT, log, |cp| {
        let ev = cp.kubectl_ok(&[
            "get",
            "events",
            "-n",
            ns,
            "--field-selector=reason=FailedMount",
        ]);
        ev.contains("\"settings\" not found").then_some(())
    });
    let waiting = cp.get("pod/reader", Some(ns)).expect("pod");
    assert_eq!(
        waiting["status"]["phase"], "Pending",
        "{}",
        waiting["status"]
    );
    assert_eq!(
        waiting["status"]["containerStatuses"][0]["state"]["waiting"]["reason"],
        "ContainerCreating"
    );

    let t = Instant::now();
    cp.create(
        &json!({
            "apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": "settings", "namespace": ns},
            "data": {"greeting": "hello from the cluster"},
        })
        .to_string(),
    );
    let running = wait_running(&cp, &a, ns, "reader");
    eprintln!("ConfigMap created to pod Running: {:?}", t.elapsed());
    assert_pod_ip(&running, &net, &a);
    let logs = cp.wait_for("the container's output", WAIT, log, |cp| {
        let out = cp.kubectl(&["logs", "-n", ns, "reader"]);
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        (!text.is_empty()).then_some(text)
    });
    assert_eq!(logs, "hello from the cluster\n");
}

/// The Deployment's pods as the API lists them, by name.
fn app_pods(cp: &ControlPlane, ns: &str, app: &str) -> BTreeMap<String, Value> {
    let list = cp
        .get("pods", Some(ns))
        .map(|l| l["items"].as_array().cloned().unwrap_or_default())
        .unwrap_or_default();
    list.into_iter()
        .filter(|p| p["metadata"]["labels"]["app"] == app)
        .filter_map(|p| Some((p["metadata"]["name"].as_str()?.to_string(), p)))
        .collect()
}

/// The names of the pods the agent runs in `ns`.
fn local_pods(a: &Agent, ns: &str) -> Vec<String> {
    a.pods()
        .iter()
        .filter(|p| p["pod"]["metadata"]["namespace"] == ns)
        .filter_map(|p| p["pod"]["metadata"]["name"].as_str().map(str::to_string))
        .collect()
}

/// Waits until `n` pods of the app are Running in the API (and no others are left),
/// adding each pod's time to Running since `since` to `timings`.
fn wait_replicas(
    cp: &ControlPlane,
    a: &Agent,
    ns: &str,
    n: usize,
    since: Instant,
    timings: &mut Timings,
) {
    let mut seen = BTreeMap::new();
    let log = || {
        format!(
            "{}\n--- agent ---\n{}",
            cp.kubectl_ok(&["get", "pods", "-n", ns, "-o", "wide"]),
            tail(&a.agent_log(), 40)
        )
    };
    cp.wait_for(&format!("{n} pods of web Running"), WAIT, log, |cp| {
        let pods = app_pods(cp, ns, "web");
        for (name, p) in &pods {
            if p["status"]["phase"] == "Running" && !seen.contains_key(name) {
                seen.insert(name.clone(), since.elapsed());
            }
        }
        let running = pods
            .values()
            .filter(|p| p["status"]["phase"] == "Running")
            .count();
        (pods.len() == n && running == n && local_pods(a, ns).len() == n).then_some(())
    });
    for (name, d) in seen {
        if app_pods(cp, ns, "web").contains_key(&name) {
            timings.add_duration(d);
        }
    }
}

#[test]
fn a_deployment_rolls_out_scales_and_goes_away() {
    if !need_root() || !need_plugins() {
        return;
    }
    let (cp, _addr, net, a) = cluster("cp-deploy", 1, Options::default());
    let ns = "web";
    settled_namespace(&cp, ns);
    let template = pod(
        ns,
        "web",
        None,
        "trap 'exit 0' TERM; while true; do sleep 0.2; done",
    );
    let deployment = json!({
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": "web", "namespace": ns},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": {"app": "web"}},
            "template": {"metadata": {"labels": {"app": "web"}}, "spec": template["spec"]},
        },
    });
    let mut timings = Timings::default();
    let t = Instant::now();
    cp.apply(&deployment.to_string());
    wait_replicas(&cp, &a, ns, 1, t, &mut timings);
    cp.wait_for("rollout complete", WAIT, String::new, |cp| {
        cp.get("deployment/web", Some(ns))
            .filter(|d| d["status"]["readyReplicas"] == 1 && d["status"]["updatedReplicas"] == 1)
    });
    eprintln!("Deployment applied to rolled out: {:?}", t.elapsed());

    let t = Instant::now();
    cp.kubectl_ok(&["scale", "-n", ns, "deployment/web", "--replicas=3"]);
    wait_replicas(&cp, &a, ns, 3, t, &mut timings);
    eprintln!("scaled 1 to 3, all Running: {:?}", t.elapsed());
    let pods = app_pods(&cp, ns, "web");
    let mut ips: Vec<&str> = Vec::new();
    for p in pods.values() {
        assert_eq!(p["spec"]["nodeName"], NODE);
        assert_pod_ip(p, &net, &a);
        ips.push(p["status"]["podIP"].as_str().unwrap_or(""));
    }
    ips.sort();
    ips.dedup();
    assert_eq!(ips.len(), 3, "pod IPs {ips:?}");

    let t = Instant::now();
    cp.kubectl_ok(&["scale", "-n", ns, "deployment/web", "--replicas=1"]);
    wait_replicas(&cp, &a, ns, 1, t, &mut Timings::default());
    eprintln!(
        "scaled 3 to 1, two pods gone from the API and the node: {:?}",
        t.elapsed()
    );

    let t = Instant::now();
    cp.kubectl_ok(&["delete", "-n", ns, "deployment/web", "--timeout=60s"]);
    cp.wait_for(
        "no pod of web left",
        WAIT,
        || tail(&a.agent_log(), 40),
        |cp| (app_pods(cp, ns, "web").is_empty() && local_pods(&a, ns).is_empty()).then_some(()),
    );
    eprintln!("Deployment deleted to its pods gone: {:?}", t.elapsed());
    assert!(cp
        .get("replicasets", Some(ns))
        .is_some_and(|l| l["items"] == json!([])));
    timings.print("scheduled to Running through the apiserver (Deployment pods)");
}

/// The Events of `reason` about pod `name`, as `kubectl get events -o json` lists them.
fn events(cp: &ControlPlane, ns: &str, name: &str, reason: &str) -> Vec<Value> {
    let list = cp.get("events", Some(ns)).unwrap_or_default();
    list["items"]
        .as_array()
        .cloned()
        .unwrap_or_default()
        .into_iter()
        .filter(|e| e["involvedObject"]["name"] == name && e["reason"] == reason)
        .collect()
}

/// Failing probes show as the kubelet's Unhealthy and Killing events, and the pod's
/// status shows the restart and Ready False. Only etcd and the apiserver: the pod names
/// its node and mounts no service-account token, so no controller is needed.
#[test]
fn failing_probes_reach_the_cluster_as_the_kubelets_events() {
    if !need_root() || !need_plugins() {
        return;
    }
    let (cp, _addr, _net, a) = cluster("cp-probes", 2, Options::bare());
    let ns = "default";
    cp.kubectl_ok(&["create", "serviceaccount", "default", "-n", ns]);
    let mut p = pod(ns, "sick", Some(NODE), "exec sleep 3600");
    p["spec"]["automountServiceAccountToken"] = json!(false);
    p["spec"]["terminationGracePeriodSeconds"] = json!(1);
    let exec =
        |cmd: &[&str]| json!({"exec": {"command": cmd}, "periodSeconds": 1, "failureThreshold": 2});
    p["spec"]["containers"][0]["readinessProbe"] = exec(&["sh", "-c", "echo not yet; exit 1"]);
    p["spec"]["containers"][0]["livenessProbe"] = exec(&["false"]);
    cp.create(&p.to_string());

    let log = || tail(&a.agent_log(), 60);
    cp.wait_for("Unhealthy and Killing events", WAIT, log, |cp| {
        let unhealthy = events(cp, ns, "sick", "Unhealthy");
        let message = |e: &Value| e["message"].as_str().unwrap_or("").to_string();
        let ok = unhealthy
            .iter()
            .any(|e| message(e) == "Readiness probe failed: not yet\n")
            && unhealthy
                .iter()
                .any(|e| message(e).starts_with("Liveness probe failed: "))
            && events(cp, ns, "sick", "Killing")
                .iter()
                .any(|e| message(e) == "Container main failed liveness probe, will be restarted");
        ok.then(|| unhealthy[0].clone())
    });
    let warning = &events(&cp, ns, "sick", "Unhealthy")[0];
    assert_eq!(warning["type"], "Warning");
    assert_eq!(
        warning["involvedObject"]["fieldPath"],
        "spec.containers{main}"
    );
    assert_eq!(warning["source"]["component"], "kubelet");
    // And the cluster sees it restarted and not ready.
    let sick = cp.wait_for("a restart in the pod's status", WAIT, log, |cp| {
        cp.get("pod/sick", Some(ns)).filter(|p| {
            let c = &p["status"]["containerStatuses"][0];
            c["restartCount"].as_u64().is_some_and(|n| n >= 1) && c["ready"] == false
        })
    });
    assert_eq!(condition(&sick, "Ready")["status"], "False");
}

/// A pod as Pod Security's `restricted` level and the upstream e2e framework shape it
/// (non-root, RuntimeDefault seccomp, no privilege escalation, every capability dropped,
/// the service-account token volume the apiserver adds), in a namespace that enforces
/// `restricted`: it runs to Succeeded, and its logs stay readable after it finished,
/// until the pod is deleted.
#[test]
fn a_restricted_pod_runs_to_completion_and_keeps_its_logs() {
    if !need_root() || !need_plugins() {
        return;
    }
    let (cp, _addr, _net, a) = cluster(
        "cp-restricted",
        3,
        Options {
            scheduler: false,
            ..Options::default()
        },
    );
    let ns = "restricted";
    settled_namespace(&cp, ns);
    cp.kubectl_ok(&[
        "label",
        "namespace",
        ns,
        "pod-security.kubernetes.io/enforce=restricted",
    ]);
    let sa = "/var/run/secrets/kubernetes.io/serviceaccount";
    let script = format!(
        "echo uid=$(id -u); grep '^Seccomp:' /proc/self/status; \
         grep '^NoNewPrivs:' /proc/self/status; grep '^CapEff:' /proc/self/status; \
         echo namespace=$(cat {sa}/namespace); \
         test -s {sa}/token && echo token=present; echo END"
    );
    let mut p = pod(ns, "job", Some(NODE), &script);
    p["spec"]["restartPolicy"] = json!("Never");
    p["spec"]["securityContext"] = json!({
        "runAsNonRoot": true,
        "runAsUser": 1000,
        "seccompProfile": {"type": "RuntimeDefault"},
    });
    p["spec"]["containers"][0]["securityContext"] = json!({
        "allowPrivilegeEscalation": false,
        "capabilities": {"drop": ["ALL"]},
    });
    // The namespace enforces `restricted`: the apiserver admits only a pod of that shape.
    cp.create(&p.to_string());
    let admitted = cp.get("pod/job", Some(ns)).expect("pod");
    let volumes = admitted["spec"]["volumes"].to_string();
    assert!(
        volumes.contains("serviceAccountToken"),
        "no token volume: {volumes}"
    );

    let log = || tail(&a.agent_log(), 60);
    let done = cp.wait_for("the pod to Succeed", WAIT, log, |cp| {
        cp.get("pod/job", Some(ns))
            .filter(|p| p["status"]["phase"] == "Succeeded")
    });
    let terminated = &done["status"]["containerStatuses"][0]["state"]["terminated"];
    assert_eq!(terminated["exitCode"], 0, "{}", done["status"]);
    assert_eq!(terminated["reason"], "Completed", "{}", done["status"]);

    // Read after the pod finished, as `kubectl logs` of a Job's pod is.
    let logs = cp.kubectl_ok(&["logs", "-n", ns, "job"]);
    let lines: Vec<&str> = logs.lines().collect();
    assert_eq!(
        lines,
        [
            "uid=1000",
            "Seccomp:\t2",
            "NoNewPrivs:\t1",
            "CapEff:\t0000000000000000",
            "namespace=restricted",
            "token=present",
            "END",
        ],
        "{logs}"
    );

    let t = Instant::now();
    cp.kubectl_ok(&["delete", "pod", "-n", ns, "job", "--timeout=60s"]);
    eprintln!("finished pod deleted in {:?}", t.elapsed());
    a.wait_until("the finished pod to leave the node", WAIT, |a| {
        !local_pods(a, ns).iter().any(|n| n == "job")
    });
}
