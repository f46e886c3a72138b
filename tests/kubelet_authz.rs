//! Delegated authentication and authorization of the kubelet API against a real
//! control plane (etcd and kube-apiserver v1.36, Node and RBAC authorization): the
//! agent joins with `authentication.webhook.enabled` and `authorization.mode: Webhook`
//! and reaches the apiserver through a relay that the test can cut. Called directly
//! over TLS with curl: another node's certificate is refused, an admin's is let in,
//! ServiceAccount tokens are let in as far as their RBAC goes; `kubectl logs` and
//! `exec` through the apiserver keep working. With the relay dropping everything,
//! cached decisions hold until they expire, then only the offline policy's
//! identities are let in and every refusal says the apiserver could not be asked.
//! Prints the latency authorization adds (first request against cached) and the
//! cache hit ratio of the run, read from `/metrics`.

use support::{control_plane, proxy};

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use control_plane::{ControlPlane, Options};
use proxy::{Mode, Proxy};
use support::agent::{need_root, Agent};

const NODE: &str = "authz-node-1";
const WAIT: Duration = Duration::from_secs(90);
/// The SubjectAccessReview cache's lifetimes in this test, both ways.
const AUTHZ_TTL: &str = "5s";

/// A credential for the kubelet API.
enum Cred {
    Cert { cert: String, key: String },
    Token(String),
}

/// The client certificate and key a kubeconfig names (by path, as the harness writes
/// them).
fn cert_of(kubeconfig: &Path) -> Cred {
    let text = std::fs::read_to_string(kubeconfig).expect("read kubeconfig");
    let field = |name: &str| -> String {
        let line = text
            .lines()
            .map(str::trim)
            .find(|l| l.starts_with(name))
            .unwrap_or_else(|| panic!("{name} in {}", kubeconfig.display()));
        let value = line[name.len()..].trim();
        serde_json::from_str(value).unwrap_or_else(|_| value.to_string())
    };
    Cred::Cert {
        cert: field("client-certificate:"),
        key: field("client-key:"),
    }
}

/// One call of the agent's kubelet API: (status, body, seconds curl took).
fn call(a: &Agent, method: &str, path: &str, cred: &Cred) -> (u16, String, f64) {
    let mut c = Command::new("curl");
    c.args(["-sk", "--max-time", "60", "-X", method]);
    c.args(["-w", "\n%{http_code} %{time_total}"]);
    match cred {
        Cred::Cert { cert, key } => {
            c.args(["--cert", cert, "--key", key]);
        }
        Cred::Token(t) => {
            c.arg("-H").arg(format!("Authorization: Bearer {t}"));
        }
    }
    c.arg(format!("https://{}:{}{path}", a.address, a.port));
    let out = c.output().expect("run curl");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let (body, tail) = text.rsplit_once('\n').unwrap_or(("", &text));
    let mut tail = tail.split(' ');
    let code = tail.next().and_then(|c| c.parse().ok()).unwrap_or(0);
    let secs = tail.next().and_then(|c| c.parse().ok()).unwrap_or(0.0);
    (code, body.to_owned(), secs)
}

fn get(a: &Agent, path: &str, cred: &Cred) -> (u16, String) {
    let (code, body, _) = call(a, "GET", path, cred);
    (code, body)
}

fn post(a: &Agent, path: &str, cred: &Cred) -> (u16, String) {
    let (code, body, _) = call(a, "POST", path, cred);
    (code, body)
}

/// Polls `probe` until it returns Some, or panics after `within` with `what`.
fn poll<T>(what: &str, within: Duration, mut probe: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + within;
    loop {
        if let Some(v) = probe() {
            return v;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(200));
    }
}

fn tail(s: &str, n: usize) -> String {
    let lines: Vec<&str> = s.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// A ServiceAccount token, made by the apiserver (TokenRequest).
fn token(cp: &ControlPlane, sa: &str) -> Cred {
    let t = cp.kubectl_ok(&["create", "token", sa, "--duration=1h"]);
    Cred::Token(t.trim().to_string())
}

/// A value of a series in Prometheus text (the first sample whose line starts with
/// `prefix`).
fn sample(text: &str, prefix: &str) -> f64 {
    text.lines()
        .find(|l| l.starts_with(prefix))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no sample {prefix} in /metrics"))
}

#[test]
fn delegated_authn_and_authz_against_a_real_apiserver_and_offline() {
    if !need_root() {
        return;
    }
    let cp = ControlPlane::start(Options::bare());
    // No controller makes the namespace's ServiceAccount in a bare cluster.
    let _ = cp.kubectl(&["create", "serviceaccount", "default"]);
    let relay = Proxy::start(cp.addr());

    let mut a = Agent::new("kubelet-authz");
    a.node_name = NODE.into();
    cp.join(&mut a, "", "");
    // The agent reaches the apiserver only through the relay.
    cp.relay_kubeconfig(&mut a, &relay.url());
    // Webhook authentication and authorization, short cache lifetimes.
    ControlPlane::webhook_auth(
        &a,
        "{enabled: true, cacheTTL: 60s}",
        &format!(
            "  webhook: {{cacheAuthorizedTTL: {AUTHZ_TTL}, cacheUnauthorizedTTL: {AUTHZ_TTL}}}\n"
        ),
    );
    a.start();
    let log = || format!("--- agent log ---\n{}", tail(&a.agent_log(), 60));

    cp.apply(&format!(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: web\nspec:\n  nodeName: {NODE}\n  \
         automountServiceAccountToken: false\n  terminationGracePeriodSeconds: 1\n  \
         containers:\n    - name: main\n      image: docker.io/library/busybox:demo\n      \
         command: [\"sh\", \"-c\", \"echo hello-from-web; exec sleep 100000\"]\n"
    ));
    cp.wait_for("pod web running", WAIT, log, |cp| {
        cp.get("pod/web", None)
            .filter(|p| p["status"]["containerStatuses"][0]["state"]["running"].is_object())
    });

    let other = cert_of(&cp.node_kubeconfig("other"));
    let admin = cert_of(&cp.admin_kubeconfig);
    let logs = "/containerLogs/default/web/main";
    let exec = "/exec/default/web/main?command=true&output=1";
    let run = "/run/default/web/main?cmd=echo%20ran-here";

    // Another node: refused everywhere on this node, as the kubelet words it.
    let (code, body) = get(&a, "/pods", &other);
    assert_eq!(code, 403, "{body}");
    assert_eq!(
        body.trim(),
        "Forbidden (user=system:node:other, verb=get, resource=nodes, subresource(s)=[pods proxy])"
    );
    let (code, body) = get(&a, logs, &other);
    assert_eq!(
        (code, body.trim()),
        (
            403,
            "Forbidden (user=system:node:other, verb=get, resource=nodes, subresource=proxy)"
        )
    );
    let (code, body) = post(&a, exec, &other);
    assert_eq!(code, 403, "{body}");
    assert!(
        body.contains("verb=create, resource=nodes, subresource=proxy"),
        "{body}"
    );
    let (code, body) = post(&a, run, &other);
    assert_eq!(code, 403, "{body}");
    // Refusals are logged once per identity and reason, not once per request.
    for _ in 0..3 {
        assert_eq!(get(&a, "/pods", &other).0, 403);
    }
    let refused = "refused: Forbidden (user=system:node:other, verb=get, resource=nodes, \
                   subresource(s)=[pods proxy])";
    assert_eq!(a.agent_log().matches(refused).count(), 1, "{}", log());

    // An admin (system:masters): let in.
    let (code, body) = get(&a, "/pods", &admin);
    assert_eq!(code, 200, "{body}");
    assert!(body.contains("\"web\""), "{body}");
    let (code, body) = get(&a, logs, &admin);
    assert_eq!((code, body.as_str()), (200, "hello-from-web\n"));
    let (code, body) = post(&a, run, &admin);
    assert_eq!((code, body.as_str()), (200, "ran-here\n"));

    // Through the apiserver (its kubelet client is system:masters).
    let out = cp.kubectl_ok(&["logs", "web"]);
    assert_eq!(out, "hello-from-web\n");
    let out = cp.kubectl_ok(&["exec", "web", "--", "echo", "via-apiserver"]);
    assert_eq!(out, "via-apiserver\n");

    // ServiceAccount tokens, reviewed by the apiserver: RBAC decides.
    for sa in ["metrics-reader", "late-reader"] {
        cp.node_metrics_reader(sa);
    }
    cp.kubectl_ok(&["create", "serviceaccount", "nobody"]);
    let reader = token(&cp, "metrics-reader");
    let nobody = token(&cp, "nobody");
    let (code, body, first) = call(&a, "GET", "/metrics/resource", &reader);
    assert_eq!(code, 200, "{body}");
    let mut cached = Vec::new();
    for _ in 0..10 {
        let (code, body, secs) = call(&a, "GET", "/metrics/resource", &reader);
        assert_eq!(code, 200, "{body}");
        cached.push(secs);
    }
    cached.sort_by(f64::total_cmp);
    let median = cached[cached.len() / 2];
    println!(
        "authorization latency: first request (TokenReview + SubjectAccessReview) {:.1} ms, \
         cached median {:.1} ms, added {:.1} ms",
        first * 1e3,
        median * 1e3,
        (first - median) * 1e3
    );
    let (code, body) = get(&a, "/metrics/resource", &nobody);
    assert_eq!(code, 403, "{body}");
    assert_eq!(
        body.trim(),
        "Forbidden (user=system:serviceaccount:default:nobody, verb=get, resource=nodes, \
         subresource=metrics)"
    );
    let (code, body) = get(&a, "/pods", &Cred::Token("not-a-token".into()));
    assert_eq!((code, body.trim()), (401, "Unauthorized"));

    let (_, before) = get(&a, "/metrics", &admin);
    let hits = sample(
        &before,
        "holdfast_kubelet_api_authorization_cache_total{result=\"hit\"}",
    );
    let misses = sample(
        &before,
        "holdfast_kubelet_api_authorization_cache_total{result=\"miss\"}",
    );
    println!(
        "authorization cache while online: {hits} hits, {misses} misses, hit ratio {:.2}",
        hits / (hits + misses).max(1.0)
    );

    // The link is cut right after a fresh review of `late-reader`: its cached
    // decision holds until it expires.
    let late = token(&cp, "late-reader");
    let unknown = token(&cp, "nobody");
    assert_eq!(get(&a, "/metrics/resource", &late).0, 200);
    relay.set_mode(Mode::Blackhole);
    let cut = Instant::now();
    let (code, body) = get(&a, "/metrics/resource", &late);
    assert_eq!(code, 200, "the cached decision holds: {body}");
    println!("cached decision held {:?} after the cut", cut.elapsed());
    let body = poll("the cached decision to expire", WAIT, || {
        let (code, body) = get(&a, "/metrics/resource", &late);
        (code == 403).then_some(body)
    });
    assert!(
        body.starts_with(
            "Forbidden (user=system:serviceaccount:default:late-reader, verb=get, \
             resource=nodes, subresource=metrics): the apiserver could not be asked ("
        ),
        "{body}"
    );
    assert!(body.contains("holdfast.offlineAuthorization"), "{body}");
    println!(
        "offline refusal {:?} after the cut: {}",
        cut.elapsed(),
        body.trim()
    );
    // Offline: only the policy's identities (system:masters here) are let in.
    let (code, body) = get(&a, "/pods", &admin);
    assert_eq!(code, 200, "{body}");
    let (code, body) = post(&a, run, &admin);
    assert_eq!((code, body.as_str()), (200, "ran-here\n"));
    let (code, body) = get(&a, logs, &other);
    assert_eq!(code, 403, "{body}");
    assert!(body.contains("the apiserver could not be asked"), "{body}");
    let (code, body) = post(&a, exec, &other);
    assert_eq!(code, 403, "{body}");
    assert!(body.contains("the apiserver could not be asked"), "{body}");
    // A token never seen cannot be checked: 401, saying why.
    let (code, body) = get(&a, "/pods", &unknown);
    assert_eq!(code, 401, "{body}");
    assert!(
        body.starts_with(
            "Unauthorized: the bearer token could not be checked: the apiserver could not be asked"
        ),
        "{body}"
    );

    let (_, metrics) = get(&a, "/metrics", &admin);
    let hits = sample(
        &metrics,
        "holdfast_kubelet_api_authorization_cache_total{result=\"hit\"}",
    );
    let misses = sample(
        &metrics,
        "holdfast_kubelet_api_authorization_cache_total{result=\"miss\"}",
    );
    let offline_allowed = sample(
        &metrics,
        "holdfast_kubelet_api_authorization_decisions_total{decision=\"offline_allowed\"}",
    );
    let offline_denied = sample(
        &metrics,
        "holdfast_kubelet_api_authorization_decisions_total{decision=\"offline_denied\"}",
    );
    assert!(offline_allowed >= 1.0 && offline_denied >= 1.0, "{metrics}");
    assert!(
        metrics.contains("holdfast_kubelet_api_requests_by_user_total{user=\"system:node:other\"}"),
        "{metrics}"
    );
    println!(
        "authorization cache over the run: {hits} hits, {misses} misses, hit ratio {:.2}; \
         offline: {offline_allowed} allowed, {offline_denied} denied",
        hits / (hits + misses).max(1.0)
    );
    relay.set_mode(Mode::Pass);
}
