//! What an idle gateway costs a real kube-apiserver (v1.36, Node,RBAC, NodeRestriction),
//! counted by the apiserver's own audit log (`level: Metadata` for the node's user): at
//! most 7 requests a minute with pods that reference ten ConfigMaps, the Lease renewal's
//! 6 a minute being the floor; and `holdfast_api_requests_total` agrees with the audit
//! log's count.

use support::control_plane;

use std::collections::HashSet;
use std::path::Path;
use std::time::{Duration, Instant};

use control_plane::{ControlPlane, Options};
use support::agent::{need_root, Agent};

const NODE: &str = "edge-gw-3";
const WAIT: Duration = Duration::from_secs(120);
/// `HOLDFAST_BUDGET_PODS` (default 5) pods share the ConfigMaps.
fn pods() -> usize {
    std::env::var("HOLDFAST_BUDGET_PODS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(5)
}
const CONFIG_MAPS: usize = 10;

/// Distinct requests of the node's user in the audit log (a watch logs a
/// ResponseStarted and a ResponseComplete event under one auditID).
fn audited(log: &Path) -> usize {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    let mut ids = HashSet::new();
    for line in text.lines() {
        let Ok(ev) = serde_json::from_str::<serde_json::Value>(line) else {
            continue;
        };
        if ev["user"]["username"] == format!("system:node:{NODE}") {
            if let Some(id) = ev["auditID"].as_str() {
                ids.insert(id.to_string());
            }
        }
    }
    ids.len()
}

/// `holdfast_api_requests_total` from the agent's /metrics, read straight from its
/// kubelet API with the admin's client certificate (not through the apiserver).
fn metric(cp: &ControlPlane, port: u16) -> Option<u64> {
    let kubeconfig = std::fs::read_to_string(&cp.admin_kubeconfig).ok()?;
    let field = |key: &str| {
        kubeconfig
            .lines()
            .find_map(|l| l.trim().strip_prefix(key))
            .map(|v| v.trim().trim_matches('"').to_string())
    };
    let (cert, key) = (field("client-certificate:")?, field("client-key:")?);
    let out = std::process::Command::new("curl")
        .args(["-sk", "--max-time", "10", "--cert", &cert, "--key", &key])
        .arg(format!("https://127.0.0.1:{port}/metrics"))
        .output()
        .ok()?;
    if !out.status.success() {
        eprintln!("curl /metrics: {}", String::from_utf8_lossy(&out.stderr));
        return None;
    }
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .find_map(|l| l.strip_prefix("holdfast_api_requests_total "))
        .and_then(|v| v.trim().parse::<f64>().ok())
        .map(|v| v as u64)
}

fn pod_yaml(n: usize) -> String {
    let (a, b) = (2 * n % CONFIG_MAPS, (2 * n + 1) % CONFIG_MAPS);
    format!(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: idle-{n}\n  namespace: default\nspec:\n  \
         nodeName: {NODE}\n  automountServiceAccountToken: false\n  hostNetwork: true\n  \
         terminationGracePeriodSeconds: 1\n  containers:\n    - name: main\n      \
         image: busybox:demo\n      command: [\"sh\", \"-c\", \"exec sleep 100000\"]\n      \
         volumeMounts:\n        - {{name: a, mountPath: /a}}\n        - {{name: b, mountPath: /b}}\n  \
         volumes:\n    - {{name: a, configMap: {{name: cm-{a}}}}}\n    - {{name: b, configMap: {{name: cm-{b}}}}}\n"
    )
}

#[test]
fn an_idle_gateway_stays_within_seven_requests_a_minute_and_its_metric_matches_the_audit_log() {
    if !need_root() {
        return;
    }
    let dir = support::tempdir::TempDir::new("request-budget");
    let policy = dir.0.join("audit-policy.yaml");
    let audit_log = dir.0.join("audit.log");
    std::fs::write(
        &policy,
        format!(
            "apiVersion: audit.k8s.io/v1\nkind: Policy\nomitStages: [RequestReceived]\nrules:\n  \
             - level: Metadata\n    users: [\"system:node:{NODE}\"]\n  - level: None\n"
        ),
    )
    .expect("audit policy");
    let cp = ControlPlane::start(Options {
        apiserver_args: vec![
            format!("--audit-policy-file={}", policy.display()),
            format!("--audit-log-path={}", audit_log.display()),
            "--audit-log-mode=blocking".into(),
        ],
        ..Options::bare()
    });
    cp.kubectl_ok(&["create", "serviceaccount", "default", "-n", "default"]);
    for n in 0..CONFIG_MAPS {
        cp.kubectl_ok(&[
            "create",
            "configmap",
            &format!("cm-{n}"),
            "-n",
            "default",
            &format!("--from-literal=k=v{n}"),
        ]);
    }
    let mut a = Agent::new("request-budget");
    a.node_name = NODE.into();
    // The kubelet's own intervals: the budget is the default configuration's.
    cp.join(&mut a, "", "");
    a.start();
    let log = || format!("--- agent log ---\n{}", a.agent_log());
    cp.wait_for("the Node", WAIT, log, |cp| {
        cp.get(&format!("node/{NODE}"), None)
    });
    let pods = pods();
    for n in 0..pods {
        cp.apply(&pod_yaml(n));
    }
    cp.wait_for("every pod Running in the cluster", WAIT * 3, log, |cp| {
        let list = cp.get("pods", Some("default"))?;
        let items = list["items"].as_array()?;
        (items.len() == pods && items.iter().all(|p| p["status"]["phase"] == "Running"))
            .then_some(())
    });
    // Idle from here: statuses sent, ConfigMaps watched.
    std::thread::sleep(Duration::from_secs(15));

    let window = Duration::from_secs(180);
    let port = a.port;
    let m1 = cp.wait_for("the agent's /metrics", WAIT, log, |cp| metric(cp, port));
    let a1 = audited(&audit_log);
    let t1 = Instant::now();
    std::thread::sleep(window);
    let m2 = cp.wait_for("the agent's /metrics", WAIT, log, |cp| metric(cp, port));
    let a2 = audited(&audit_log);
    let minutes = t1.elapsed().as_secs_f64() / 60.0;
    let rate = (a2 - a1) as f64 / minutes;
    eprintln!(
        "idle, {pods} pods, {CONFIG_MAPS} ConfigMaps: {} requests in {:.1} min by the audit log \
         = {rate:.2}/min; holdfast_api_requests_total {m1} -> {m2} ({} in the window); \
         totals since start: metric {m2}, audit log {a2}",
        a2 - a1,
        minutes,
        m2 - m1
    );
    assert!(rate <= 7.0, "{rate:.2} requests a minute");
    // Every request the apiserver saw is counted, and only those: a request in flight
    // while one side was read may fall on either side of it.
    assert!(
        (m2 as i64 - a2 as i64).abs() <= 2,
        "holdfast_api_requests_total {m2}, audit log {a2}"
    );
    a.stop();
}
