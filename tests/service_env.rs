//! The Service environment variables a container gets, end to end: a real
//! kube-apiserver v1.36 (which makes the master service `default/kubernetes` itself),
//! Services made with kubectl, real containers that print their environment, as root.
//! A pod sees its namespace's Services and the master service; with
//! `enableServiceLinks: false` only the master service; its own variables win and
//! `$(VAR)` can refer to a Service's; a static pod sees them too; a Service made later
//! is in a container started after it.
//!
//! And offline (the kube-apiserver double behind a proxy standing for the uplink): an
//! agent restarted while the link is down starts a crashed container again with the
//! same variables, from the list it kept, and says so.

use support::{control_plane, offline as site};

use std::collections::BTreeMap;
use std::time::Duration;

use control_plane::{ControlPlane, Options};
use k8s_openapi::api::core::v1::Service;
use serde_json::Value;
use support::agent::{need_root, Agent};

const NODE: &str = "service-env-node-1";
const NS: &str = "svc-env";
const IMAGE: &str = "docker.io/library/busybox:demo";
const WAIT: Duration = Duration::from_secs(90);

/// A pod that prints its environment with busybox `env` (not through `sh`, whose
/// busybox 1.35 drops names that are not shell names) and ends; `extra` lines go in
/// the container, `spec` lines in the pod's spec.
fn env_pod(ns: &str, name: &str, spec: &str, extra: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: {name}\n  namespace: {ns}\nspec:\n  \
         nodeName: {NODE}\n  automountServiceAccountToken: false\n  restartPolicy: Never\n\
         {spec}  containers:\n    - name: main\n      image: {IMAGE}\n      \
         command: [\"env\"]\n{extra}"
    )
}

fn service(ns: &str, name: &str, ports: &str, cluster_ip: Option<&str>) -> String {
    let ip = cluster_ip.map_or(String::new(), |ip| format!("  clusterIP: {ip}\n"));
    format!(
        "apiVersion: v1\nkind: Service\nmetadata:\n  name: {name}\n  namespace: {ns}\nspec:\n\
         {ip}  selector:\n    app: {name}\n  ports:\n{ports}"
    )
}

/// What pod `name` printed, once it has succeeded.
fn printed_env(cp: &ControlPlane, a: &Agent, ns: &str, name: &str) -> BTreeMap<String, String> {
    cp.wait_for(
        &format!("pod {ns}/{name} succeeded"),
        WAIT,
        || a.agent_log(),
        |cp| {
            cp.get(&format!("pod/{name}"), Some(ns))
                .filter(|p| p["status"]["phase"] == "Succeeded")
        },
    );
    cp.kubectl_ok(&["logs", "-n", ns, name])
        .lines()
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

fn cluster_ip(cp: &ControlPlane, ns: &str, name: &str) -> String {
    let s: Service = cp
        .get_as(&format!("service/{name}"), Some(ns))
        .unwrap_or_else(|| panic!("service {ns}/{name}"));
    s.spec.and_then(|s| s.cluster_ip).expect("a cluster IP")
}

fn get<'a>(env: &'a BTreeMap<String, String>, name: &str) -> Option<&'a str> {
    env.get(name).map(String::as_str)
}

fn with_prefix<'a>(env: &'a BTreeMap<String, String>, prefix: &str) -> Vec<&'a str> {
    env.keys()
        .filter(|k| k.starts_with(prefix))
        .map(String::as_str)
        .collect()
}

/// The namespace, its ServiceAccount and the Services of the test, before the agent
/// starts (so its first LIST holds them).
fn seed(cp: &ControlPlane) {
    cp.kubectl_ok(&["create", "namespace", NS]);
    for ns in ["default", NS] {
        let _ = cp.kubectl(&["create", "serviceaccount", "default", "-n", ns]);
    }
    cp.apply(&service(
        NS,
        "db",
        "    - {name: pg, port: 5432, targetPort: 5432}\n    \
         - {name: stats, port: 9187, protocol: UDP}\n",
        None,
    ));
    cp.apply(&service(NS, "headless", "    - {port: 80}\n", Some("None")));
    cp.apply(&service("default", "web", "    - {port: 80}\n", None));
    cp.apply(
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: settings\n  namespace: svc-env\n\
         data:\n  DB_PORT: from-the-configmap\n  data-1: value-1\n",
    );
}

#[test]
fn containers_see_their_namespaces_services_and_the_master_service() {
    if !need_root() {
        return;
    }
    let cp = ControlPlane::start(Options::bare());
    seed(&cp);
    let mut a = Agent::new("service-env");
    a.node_name = NODE.into();
    cp.join(&mut a, "", "");
    a.start();
    let db_ip = cluster_ip(&cp, NS, "db");
    let master_ip = cluster_ip(&cp, "default", "kubernetes");

    cp.apply(&env_pod(
        NS,
        "links",
        "",
        "      envFrom:\n        - configMapRef: {name: settings}\n      env:\n        \
         - {name: DB_URL, value: \"pg://$(DB_SERVICE_HOST):$(DB_SERVICE_PORT_PG)\"}\n        \
         - {name: DB_SERVICE_PORT, value: mine}\n        \
         - {name: MASTER, value: \"$(KUBERNETES_SERVICE_HOST)\"}\n",
    ));
    let env = printed_env(&cp, &a, NS, "links");
    assert_eq!(get(&env, "DB_SERVICE_HOST"), Some(db_ip.as_str()));
    assert_eq!(get(&env, "DB_SERVICE_PORT_PG"), Some("5432"));
    assert_eq!(get(&env, "DB_SERVICE_PORT_STATS"), Some("9187"));
    assert_eq!(
        get(&env, "DB_PORT_5432_TCP"),
        Some(format!("tcp://{db_ip}:5432").as_str())
    );
    assert_eq!(get(&env, "DB_PORT_9187_UDP_PROTO"), Some("udp"));
    assert_eq!(get(&env, "DB_PORT_9187_UDP_ADDR"), Some(db_ip.as_str()));
    // What the container sets wins: env over the Service, envFrom too.
    assert_eq!(get(&env, "DB_SERVICE_PORT"), Some("mine"));
    assert_eq!(get(&env, "DB_PORT"), Some("from-the-configmap"));
    // A reference sees the Service's variables.
    assert_eq!(
        get(&env, "DB_URL"),
        Some(format!("pg://{db_ip}:5432").as_str())
    );
    assert_eq!(get(&env, "MASTER"), Some(master_ip.as_str()));
    assert_eq!(
        get(&env, "KUBERNETES_SERVICE_HOST"),
        Some(master_ip.as_str())
    );
    assert_eq!(get(&env, "KUBERNETES_SERVICE_PORT_HTTPS"), Some("443"));
    // No variables of a headless Service, nor of another namespace's.
    assert!(with_prefix(&env, "HEADLESS_").is_empty(), "{env:?}");
    assert!(with_prefix(&env, "WEB_").is_empty(), "{env:?}");
    // A name that is not a shell name gets to the process as it is.
    assert_eq!(get(&env, "data-1"), Some("value-1"));

    cp.apply(&env_pod(
        NS,
        "no-links",
        "  enableServiceLinks: false\n",
        "",
    ));
    let env = printed_env(&cp, &a, NS, "no-links");
    assert!(with_prefix(&env, "DB_").is_empty(), "{env:?}");
    assert_eq!(
        get(&env, "KUBERNETES_SERVICE_HOST"),
        Some(master_ip.as_str())
    );
    assert_eq!(with_prefix(&env, "KUBERNETES_").len(), 8, "{env:?}");

    cp.apply(&env_pod("default", "in-default", "", ""));
    let env = printed_env(&cp, &a, "default", "in-default");
    let web_ip = cluster_ip(&cp, "default", "web");
    assert_eq!(get(&env, "WEB_SERVICE_HOST"), Some(web_ip.as_str()));
    assert!(with_prefix(&env, "DB_").is_empty(), "{env:?}");

    // A static pod of a node with an apiserver gets them too.
    a.write_manifest("static.yaml", &env_pod("default", "static-env", "", ""));
    let pod = a.wait_pod("static-env", "done", WAIT, |p| {
        p["status"]["phase"] == "Succeeded"
    });
    let env: BTreeMap<String, String> = a
        .container_log(&pod, "main", 0)
        .lines()
        .filter_map(|l| l.splitn(4, ' ').nth(3)?.split_once('='))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    assert_eq!(get(&env, "WEB_SERVICE_HOST"), Some(web_ip.as_str()));
    assert_eq!(
        get(&env, "KUBERNETES_SERVICE_HOST"),
        Some(master_ip.as_str())
    );

    // A Service made now is in the environment of a container started after the
    // agent has seen it (the kubelet's race between the two is the user's: the agent's
    // log says when it has).
    cp.apply(&service(NS, "late", "    - {port: 8080}\n", None));
    a.wait_until("the agent to see Service late", WAIT, |a| {
        a.agent_log().contains("services: svc-env/late changed")
    });
    cp.apply(&env_pod(NS, "later", "", ""));
    let env = printed_env(&cp, &a, NS, "later");
    let late_ip = cluster_ip(&cp, NS, "late");
    assert_eq!(get(&env, "LATE_SERVICE_HOST"), Some(late_ip.as_str()));
    assert_eq!(
        get(&env, "LATE_PORT"),
        Some(format!("tcp://{late_ip}:8080").as_str())
    );

    for (ns, name) in [
        (NS, "links"),
        (NS, "no-links"),
        ("default", "in-default"),
        (NS, "later"),
    ] {
        let _ = cp.kubectl(&["delete", "pod", "-n", ns, name, "--wait=false"]);
    }
    a.stop();
}

/// The variables the container printed in restart `restart`, once it printed `END`.
fn printed_here(a: &Agent, pod: &Value, restart: u32) -> BTreeMap<String, String> {
    let mut env = BTreeMap::new();
    a.wait_until(
        &format!("restart {restart} to print its environment"),
        WAIT,
        |a| {
            let lines: Vec<String> = a
                .container_log(pod, "main", restart)
                .lines()
                .filter_map(|l| l.splitn(4, ' ').nth(3).map(str::to_string))
                .collect();
            env = lines
                .iter()
                .filter_map(|l| l.split_once('='))
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect();
            lines.iter().any(|l| l == "END")
        },
    );
    env
}

fn double_service(ns: &str, name: &str, ip: &str, port: i32) -> Service {
    serde_json::from_value(serde_json::json!({
        "metadata": {"name": name, "namespace": ns},
        "spec": {"clusterIP": ip, "ports": [{"name": "main", "port": port, "protocol": "TCP"}]},
    }))
    .expect("service")
}

#[test]
fn a_container_restarted_offline_by_a_restarted_agent_gets_the_kept_variables() {
    if !need_root() {
        return;
    }
    let mut s = site::Site::new("service-env-offline");
    s.api
        .put_service(double_service("default", "kubernetes", "10.0.0.1", 443));
    s.api
        .put_service(double_service("default", "db", "10.0.0.3", 5432));
    s.a.start();
    let script = format!("env; echo END; {}", site::CRASH_ON_SIGNAL);
    s.run_bound(&[("crashy", script.as_str())]);
    let pod =
        s.a.wait_pod("crashy", "running", site::WAIT, site::running_here);
    let first = printed_here(&s.a, &pod, 0);
    assert_eq!(get(&first, "DB_SERVICE_HOST"), Some("10.0.0.3"));
    assert_eq!(get(&first, "KUBERNETES_SERVICE_PORT_MAIN"), Some("443"));

    // What the agent wrote reaches the store's file within a second (see offline.rs).
    site::wait_lease_renewals(&s.api, &s.a, 2);
    // The link goes, the agent is killed, the container crashes, the agent comes back.
    let from = s.cut();
    s.a.kill9();
    site::crash(&s.a, &pod);
    s.a.start();
    let pod =
        s.a.wait_pod("crashy", "restarted offline", site::WAIT, |p| {
            site::running_here(p) && site::restart_count(p) == 1
        });
    let again = printed_here(&s.a, &pod, 1);
    let services = |env: &BTreeMap<String, String>| -> BTreeMap<String, String> {
        env.iter()
            .filter(|(k, _)| k.starts_with("DB_") || k.starts_with("KUBERNETES_"))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect()
    };
    assert_eq!(
        services(&again),
        services(&first),
        "the same Service variables"
    );
    assert_eq!(services(&again).len(), 16);
    assert!(
        s.a.agent_log()
            .contains("pod default/crashy: container main: Service variables from the list stored"),
        "the agent did not say the list was a stored one:\n{}",
        s.a.agent_log()
    );
    s.assert_silent(from);
    s.finish();
}
