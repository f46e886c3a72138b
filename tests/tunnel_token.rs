//! The konnectivity tunnel with a ServiceAccount token as the node's credential: the real
//! `proxy-server` checks the token with a TokenReview against the real kube-apiserver
//! (`--agent-namespace`, `--agent-service-account`, `--authentication-audience`), with
//! no client certificate asked for. The node, under NodeRestriction, may only get a
//! token bound to one of its pods: it binds it to a pod of that ServiceAccount on it.

use support::agent::need_root;
use support::control_plane;
use support::konnectivity::{cluster, tail, Cluster};

use std::time::{Duration, Instant};

const ACCOUNT: &str = "konnectivity-agent";
const AUDIENCE: &str = "system:konnectivity-server";

/// A pod of the agent's ServiceAccount on the node, in kube-system, once running. Its
/// projected token for the servers' audience is what lets the node ask for that
/// audience (the Node authorizer checks the pod's volumes), as in the upstream agent's
/// DaemonSet.
fn holder(c: &Cluster, name: &str) {
    c.cp.apply(&format!(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: {name}\n  namespace: kube-system\n\
         spec:\n  nodeName: {}\n  serviceAccountName: {ACCOUNT}\n  \
         automountServiceAccountToken: false\n  hostNetwork: true\n  \
         terminationGracePeriodSeconds: 1\n  containers:\n    - name: pause\n      \
         image: docker.io/library/busybox:demo\n      command: [\"sleep\", \"3600\"]\n      \
         volumeMounts:\n        - {{name: token, mountPath: /var/run/secrets/tokens}}\n  \
         volumes:\n    - name: token\n      projected:\n        sources:\n          \
         - serviceAccountToken: {{path: konnectivity-agent-token, audience: {AUDIENCE}}}\n",
        c.node
    ));
    c.cp.wait_for(
        &format!("pod kube-system/{name} running"),
        Duration::from_secs(60),
        || tail(&c.agent.agent_log(), 30),
        |cp| {
            cp.get(&format!("pod/{name}"), Some("kube-system"))
                .filter(|p| p["status"]["containerStatuses"][0]["state"]["running"].is_object())
        },
    );
}

/// Polls the agent's log until it holds `want`.
fn agent_says(c: &Cluster, want: &str, within: Duration) {
    let t0 = Instant::now();
    while !c.agent.agent_log().contains(want) {
        assert!(
            t0.elapsed() < within,
            "the agent did not say {want:?} within {within:?}:\n{}",
            tail(&c.agent.agent_log(), 30)
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

#[test]
fn a_service_account_token_opens_the_stream_and_a_refused_one_is_replaced() {
    if !need_root() {
        return;
    }
    let mut c = cluster("tunnel-sa", "tunnel-node-4", 1);
    c.cp.kubectl_ok(&["create", "serviceaccount", ACCOUNT, "-n", "kube-system"]);
    // The proxy server checks tokens, not certificates.
    let admin = c.cp.admin_kubeconfig.display().to_string();
    let s = &mut c.servers[0];
    s.stop();
    s.args.retain(|a| !a.starts_with("--cluster-ca-cert="));
    s.args.extend([
        "--agent-namespace=kube-system".to_string(),
        format!("--agent-service-account={ACCOUNT}"),
        format!("--authentication-audience={AUDIENCE}"),
        format!("--kubeconfig={admin}"),
    ]);
    s.spawn();
    c.agent.write_config(&format!(
        "  tunnel:\n    servers: [\"127.0.0.1:{}\"]\n    caFile: {}\n    \
         credential: serviceAccountToken\n{}",
        c.relay.port,
        c.cp.ca().display(),
        c.kubelet_keys
    ));
    c.agent.start();
    control_plane::cluster::wait_node(&c.cp, &c.agent, &c.node, false);
    c.pod("tok", "echo hello-with-a-token; sleep 3600");

    // No pod of the ServiceAccount on the node: no token, no stream, and the log says why.
    agent_says(
        &c,
        "no pod of ServiceAccount kube-system/konnectivity-agent runs on node tunnel-node-4",
        Duration::from_secs(30),
    );
    let before = c.cp.kubectl(&["logs", "tok"]);
    assert!(!before.status.success(), "logs without a token worked");

    // With one, the token bound to it opens the stream.
    holder(&c, "konnectivity-agent-a");
    let took = c.logs_within("tok", "hello-with-a-token", Duration::from_secs(30));
    eprintln!("through the tunnel with a token {took:?} after its pod ran");
    assert_eq!(c.metric("holdfast_tunnel_streams"), 1);
    let server_log = std::fs::read_to_string(&c.servers[0].log).unwrap_or_default();
    assert!(
        !server_log.contains("Client authentication failed"),
        "{}",
        c.servers[0].tail()
    );

    // The pod it was bound to goes, another comes: the node binds the next token to it.
    c.cp.kubectl_ok(&[
        "delete",
        "pod",
        "konnectivity-agent-a",
        "-n",
        "kube-system",
        "--wait=true",
        "--timeout=60s",
    ]);
    holder(&c, "konnectivity-agent-b");
    restart(&mut c);
    agent_says(
        &c,
        "is bound to pod kube-system/konnectivity-agent-b",
        Duration::from_secs(30),
    );
    c.logs_within("tok", "hello-with-a-token", Duration::from_secs(30));

    // The ServiceAccount is made anew (a redeploy): the token the node holds names the
    // old one, the server refuses it at the next dial, and the node gets a new one.
    // The pod's projected token for the audience is the node's one token for it (one
    // cache): once the apiserver no longer takes it, neither does the proxy server.
    let held = c.cp.kubectl_ok(&[
        "exec",
        "-n",
        "kube-system",
        "konnectivity-agent-b",
        "--",
        "cat",
        "/var/run/secrets/tokens/konnectivity-agent-token",
    ]);
    assert!(authenticated(&c, &held), "the token held is not valid");
    c.cp.kubectl_ok(&["delete", "serviceaccount", ACCOUNT, "-n", "kube-system"]);
    c.cp.kubectl_ok(&["create", "serviceaccount", ACCOUNT, "-n", "kube-system"]);
    let t0 = Instant::now();
    while authenticated(&c, &held) {
        assert!(
            t0.elapsed() < Duration::from_secs(60),
            "the apiserver still takes the old ServiceAccount's token"
        );
        std::thread::sleep(Duration::from_millis(500));
    }
    restart(&mut c);
    let t0 = Instant::now();
    agent_says(&c, "refused the stream", Duration::from_secs(30));
    c.logs_within("tok", "hello-with-a-token", Duration::from_secs(30));
    eprintln!(
        "back {:?} after the refusal, with a new token",
        t0.elapsed()
    );
    let server_log = std::fs::read_to_string(&c.servers[0].log).unwrap_or_default();
    assert!(
        server_log.contains("Client authentication failed"),
        "the server never refused the old token:\n{}",
        c.servers[0].tail()
    );
    let _ = c.cp.kubectl(&["delete", "pod", "tok", "--wait=false"]);
    c.agent.stop();
}

/// Whether the apiserver takes `token` for the servers' audience (what the proxy server
/// asks it).
fn authenticated(c: &Cluster, token: &str) -> bool {
    let review = serde_json::json!({
        "apiVersion": "authentication.k8s.io/v1",
        "kind": "TokenReview",
        "spec": {"token": token.trim(), "audiences": [AUDIENCE]},
    });
    let out = c.cp.create_with(&review.to_string(), &["-o", "json"]);
    let v: serde_json::Value = serde_json::from_str(&out).expect("tokenreview json");
    v["status"]["authenticated"] == true
}

/// The proxy server restarted: the node dials again.
fn restart(c: &mut Cluster) {
    let s = &mut c.servers[0];
    s.stop();
    s.spawn();
}
