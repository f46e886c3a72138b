//! TLS bootstrap and client certificate rotation against a real control plane set up as
//! kubeadm sets it up: bootstrap token authentication, a bootstrap token Secret, the
//! ClusterRoleBindings that let bootstrappers ask for node client certificates and
//! nodes renew their own, and kube-controller-manager's CSR approver and signer.
//! A node joins with only `--bootstrap-kubeconfig`, its CSR is approved by the
//! controller, its certificate is rotated while a pod runs, and a node whose certificate
//! expired offline with a dead token says so in `holdfast status` and keeps its pods.

use support::control_plane;

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use control_plane::cluster::{condition, pod, tail, wait_node, NO_PRESSURE};
use control_plane::{ControlPlane, Options};
use serde_json::{json, Value};
use support::agent::{need_root, sh_pod, Agent};
use support::tempdir::TempDir;

const TOKEN_ID: &str = "abcdef";
const TOKEN_SECRET: &str = "0123456789abcdef";

/// A control plane as kubeadm leaves it for joining nodes, with the audit log on and
/// the signer's certificates lasting `signing` (the signer backdates notBefore by 5 min).
/// The audit folder is removed when the test ends, failed or not.
fn bootstrap_cluster(signing: &str) -> (ControlPlane, PathBuf, TempDir) {
    let audit = TempDir::new(&format!("audit-{signing}"));
    let audit_dir = audit.0.clone();
    let policy = audit_dir.join("policy.yaml");
    std::fs::write(
        &policy,
        "apiVersion: audit.k8s.io/v1\nkind: Policy\nomitStages: [RequestReceived]\n\
         rules:\n- level: Metadata\n",
    )
    .expect("audit policy");
    let audit_log = audit_dir.join("audit.log");
    let cp = ControlPlane::start(Options {
        apiserver_args: vec![
            "--enable-bootstrap-token-auth".into(),
            format!("--audit-policy-file={}", policy.display()),
            format!("--audit-log-path={}", audit_log.display()),
        ],
        controller_manager_args: vec![format!("--cluster-signing-duration={signing}")],
        scheduler: false,
        ..Options::default()
    });
    cp.apply(&token_secret());
    for (name, role, group) in [
        (
            "kubeadm:kubelet-bootstrap",
            "system:node-bootstrapper",
            "system:bootstrappers",
        ),
        (
            "kubeadm:node-autoapprove-bootstrap",
            "system:certificates.k8s.io:certificatesigningrequests:nodeclient",
            "system:bootstrappers",
        ),
        (
            "kubeadm:node-autoapprove-certificate-rotation",
            "system:certificates.k8s.io:certificatesigningrequests:selfnodeclient",
            "system:nodes",
        ),
    ] {
        cp.apply(
            &json!({
                "apiVersion": "rbac.authorization.k8s.io/v1",
                "kind": "ClusterRoleBinding",
                "metadata": {"name": name},
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                            "name": role},
                "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "Group",
                              "name": group}],
            })
            .to_string(),
        );
    }
    (cp, audit_log, audit)
}

/// The bootstrap token Secret as `kubeadm token create` makes it.
fn token_secret() -> String {
    format!(
        "apiVersion: v1\nkind: Secret\nmetadata:\n  name: bootstrap-token-{TOKEN_ID}\n  \
         namespace: kube-system\ntype: bootstrap.kubernetes.io/token\nstringData:\n  \
         token-id: {TOKEN_ID}\n  token-secret: {TOKEN_SECRET}\n  \
         usage-bootstrap-authentication: \"true\"\n  usage-bootstrap-signing: \"true\"\n  \
         auth-extra-groups: system:bootstrappers:kubeadm:default-node-token\n"
    )
}

/// The bootstrap kubeconfig kubeadm writes (`bootstrap-kubelet.conf`): the server, the
/// cluster CA and the token.
fn bootstrap_kubeconfig(cp: &ControlPlane, dir: &Path) -> PathBuf {
    let path = dir.join("bootstrap-kubelet.conf");
    std::fs::write(
        &path,
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: kubernetes\n  cluster:\n    \
             server: {}\n    certificate-authority: {}\ncontexts:\n- name: tls-bootstrap\n  \
             context:\n    cluster: kubernetes\n    user: tls-bootstrap-token-user\n\
             current-context: tls-bootstrap\nusers:\n- name: tls-bootstrap-token-user\n  user:\n    \
             token: {TOKEN_ID}.{TOKEN_SECRET}\n",
            cp.url,
            cp.ca().display()
        ),
    )
    .expect("bootstrap kubeconfig");
    path
}

/// An agent that joins as `node` with only the bootstrap kubeconfig.
fn bootstrapping_node(cp: &ControlPlane, name: &str, node: &str) -> Agent {
    let mut a = Agent::new(name);
    a.node_name = node.into();
    let boot = bootstrap_kubeconfig(cp, &a.dir);
    cp.join_with(
        &mut a,
        "",
        &format!("nodeStatusUpdateFrequency: 1s\nnodeStatusReportFrequency: 3s\n{NO_PRESSURE}"),
        "--bootstrap-kubeconfig",
        &boot,
    );
    // The kubelet API asks the apiserver who calls and what they may do, with the
    // node's own (rotating) credentials.
    ControlPlane::webhook_auth(&a, "{enabled: true}", "");
    a
}

/// `GET /metrics/resource` of the agent's kubelet API with a bearer token: (status, body).
fn metrics_with_token(a: &Agent, token: &str) -> (u16, String) {
    let out = std::process::Command::new("curl")
        .args(["-sk", "--max-time", "30", "-w", "\n%{http_code}", "-H"])
        .arg(format!("Authorization: Bearer {token}"))
        .arg(format!("https://{}:{}/metrics/resource", a.address, a.port))
        .output()
        .expect("run curl");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let (body, code) = text.rsplit_once('\n').unwrap_or(("", &text));
    (code.trim().parse().unwrap_or(0), body.to_owned())
}

/// A ServiceAccount `sa` in `default` allowed to read `nodes/metrics`, and a token of it.
fn metrics_reader(cp: &ControlPlane, sa: &str) -> String {
    cp.node_metrics_reader(sa);
    cp.kubectl_ok(&["create", "token", sa, "--duration=1h"])
        .trim()
        .to_string()
}

/// When a pair file was written (its certificate was issued then), Unix seconds.
fn written_at(p: &Path) -> i64 {
    std::fs::metadata(p)
        .and_then(|m| m.modified())
        .map_or(0, |t| {
            t.duration_since(UNIX_EPOCH)
                .map_or(0, |d| d.as_secs() as i64)
        })
}

/// The CSRs whose requestor is `user`.
fn csrs_of(cp: &ControlPlane, user: &str) -> Vec<Value> {
    cp.get("csr", None)
        .and_then(|l| l["items"].as_array().cloned())
        .unwrap_or_default()
        .into_iter()
        .filter(|c| c["spec"]["username"] == user)
        .collect()
}

fn issued(csr: &Value) -> bool {
    csr["status"]["certificate"]
        .as_str()
        .is_some_and(|c| !c.is_empty())
}

fn mode(p: &Path) -> u32 {
    std::fs::metadata(p)
        .unwrap_or_else(|e| panic!("stat {}: {e}", p.display()))
        .permissions()
        .mode()
        & 0o777
}

fn unix_now() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64)
}

/// The audit log's requests of `users` (prefixes), as `user verb URI code` lines.
fn audit_flow(audit_log: &Path, users: &[&str], csr_only_for: &[&str]) -> Vec<String> {
    let text = std::fs::read_to_string(audit_log).unwrap_or_default();
    let mut out = Vec::new();
    for line in text.lines() {
        let Ok(e) = serde_json::from_str::<Value>(line) else {
            continue;
        };
        let user = e["user"]["username"].as_str().unwrap_or_default();
        let uri = e["requestURI"].as_str().unwrap_or_default();
        let wanted = users.iter().any(|u| user.starts_with(u))
            || (csr_only_for.iter().any(|u| user.starts_with(u))
                && uri.contains("certificatesigningrequests"));
        if !wanted {
            continue;
        }
        out.push(format!(
            "{} {} {} {}",
            user,
            e["verb"].as_str().unwrap_or_default(),
            uri,
            e["responseStatus"]["code"]
        ));
    }
    out
}

#[test]
fn a_node_bootstraps_with_a_token_and_rotates_its_certificate_while_its_pod_runs() {
    if !need_root() {
        return;
    }
    let (cp, audit_log, _audit) = bootstrap_cluster("120s");
    let node = "boot-node-1";
    let mut a = bootstrapping_node(&cp, "tls-boot", node);
    let t0 = Instant::now();
    a.start();
    let log = || format!("--- agent log ---\n{}", tail(&a.agent_log(), 80));

    // The bootstrap CSR, sent as the token's user and approved by the controller.
    let bootstrap_user = format!("system:bootstrap:{TOKEN_ID}");
    let first = cp.wait_for(
        "the bootstrap CSR issued",
        Duration::from_secs(90),
        log,
        |cp| csrs_of(cp, &bootstrap_user).into_iter().find(issued),
    );
    eprintln!(
        "agent start to bootstrap certificate issued: {:?}",
        t0.elapsed()
    );
    assert_eq!(
        first["spec"]["signerName"],
        "kubernetes.io/kube-apiserver-client-kubelet"
    );
    assert_eq!(
        first["spec"]["usages"],
        json!(["digital signature", "client auth"])
    );
    let approved = condition(&first, "Approved");
    assert_eq!(approved["status"], "True", "{first}");
    assert_eq!(
        approved["reason"], "AutoApproved",
        "approved by kube-controller-manager's csrapproving controller: {first}"
    );

    let n = wait_node(&cp, &a, node, false);
    eprintln!("agent start to node Ready: {:?}", t0.elapsed());
    assert_eq!(condition(&n, "Ready")["status"], "True");

    // What was written: the pair under a 0700 pki dir, the kubeconfig naming it.
    let pki = a.root.join("pki");
    assert_eq!(mode(&pki), 0o700, "{}", pki.display());
    let current = pki.join("kubelet-client-current.pem");
    let target = std::fs::canonicalize(&current).expect("current pair");
    assert_eq!(mode(&target), 0o600, "{}", target.display());
    let kubeconfig = a.root.join("kubeconfig");
    assert_eq!(mode(&kubeconfig), 0o600);
    let kc = std::fs::read_to_string(&kubeconfig).expect("kubeconfig");
    assert!(
        kc.contains(&current.display().to_string()),
        "the kubeconfig names the current pair:\n{kc}"
    );
    assert!(
        !kc.contains(TOKEN_SECRET),
        "no bootstrap token in it:\n{kc}"
    );

    // The kubelet API's reviews go out with the node's certificate of the moment.
    let early = metrics_reader(&cp, "early-reader");
    let reviewed_with = std::fs::canonicalize(&current).expect("current pair");
    let (code, body) = metrics_with_token(&a, &early);
    assert_eq!(code, 200, "{body}\n{}", log());

    // A pod bound to the node runs.
    let mut p = pod("default", "web", Some(node), "while true; do sleep 1; done");
    p["spec"]["hostNetwork"] = json!(true);
    p["spec"]["automountServiceAccountToken"] = json!(false);
    cp.apply(&p.to_string());
    let running = cp.wait_for("pod web Running", Duration::from_secs(90), log, |cp| {
        cp.get("pod/web", Some("default"))
            .filter(|p| p["status"]["phase"] == "Running")
    });
    let started =
        running["status"]["containerStatuses"][0]["state"]["running"]["startedAt"].clone();
    assert!(started.is_string(), "{running}");

    // Rotation: a second CSR of this node, sent with its own certificate, issued.
    let node_user = format!("system:node:{node}");
    let rotated = cp.wait_for(
        "a rotation CSR issued",
        Duration::from_secs(180),
        log,
        |cp| csrs_of(cp, &node_user).into_iter().find(issued),
    );
    eprintln!(
        "agent start to rotated certificate issued: {:?}",
        t0.elapsed()
    );
    assert_eq!(condition(&rotated, "Approved")["reason"], "AutoApproved");
    let first_pair = target.clone();

    // The first certificate expires (120 s after it was issued); the node keeps its
    // lease renewed after that, so with the new one.
    let first_issued = std::fs::metadata(&first_pair)
        .and_then(|m| m.modified())
        .map_or(0, |t| {
            t.duration_since(UNIX_EPOCH)
                .map_or(0, |d| d.as_secs() as i64)
        });
    let first_expiry = first_issued + 120;
    cp.wait_for(
        "the first certificate past its notAfter",
        Duration::from_secs(180),
        log,
        |_| (unix_now() > first_expiry + 2).then_some(()),
    );
    let renew_time = |cp: &ControlPlane| {
        cp.get(&format!("lease/{node}"), Some("kube-node-lease"))
            .and_then(|l| l["spec"]["renewTime"].as_str().map(String::from))
    };
    let before = renew_time(&cp);
    cp.wait_for(
        "the lease renewed after the first certificate expired",
        Duration::from_secs(30),
        log,
        |cp| renew_time(cp).filter(|t| Some(t) != before.as_ref()),
    );
    let n = wait_node(&cp, &a, node, false);
    assert_eq!(condition(&n, "Ready")["status"], "True");
    assert_ne!(
        std::fs::canonicalize(&current).expect("current pair"),
        first_pair,
        "the current link points at the rotated pair"
    );

    // Once the pair the first review used has expired, a token never seen before is
    // still reviewed: the API's apiserver client moves on to the current pair.
    let reviewed_expiry = written_at(&reviewed_with) + 120;
    cp.wait_for(
        "the pair of the first review past its notAfter",
        Duration::from_secs(180),
        log,
        |_| (unix_now() > reviewed_expiry + 2).then_some(()),
    );
    let late = metrics_reader(&cp, "late-reader");
    let (code, body) = metrics_with_token(&a, &late);
    assert_eq!(code, 200, "{body}\n{}", log());

    // The pod never restarted.
    let p = cp.get("pod/web", Some("default")).expect("pod web");
    let cs = &p["status"]["containerStatuses"][0];
    assert_eq!(cs["restartCount"], 0, "{p}");
    assert_eq!(cs["state"]["running"]["startedAt"], started, "{p}");

    // The status: the certificate's end, no problem.
    let status = a.status();
    assert!(
        status["clientCertificate"]["notAfter"].is_string(),
        "{status}"
    );
    assert!(status["clientCertificate"]["problem"].is_null(), "{status}");

    let flow = audit_flow(
        &audit_log,
        &["system:bootstrap:"],
        &[
            &node_user,
            "system:serviceaccount:kube-system:certificate-controller",
        ],
    );
    eprintln!("--- bootstrap and rotation, as the audit log shows them ---");
    for line in &flow {
        eprintln!("{line}");
    }
    assert!(
        flow.iter()
            .any(|l| l.starts_with("system:bootstrap:abcdef create")),
        "{flow:?}"
    );
    cp.kubectl_ok(&["delete", "pod", "web", "--grace-period=1"]);
    a.wait_until("pod web gone", Duration::from_secs(60), |a| {
        a.pod("web").is_none()
    });
    a.stop();
    a.reset();
    a.assert_clean();
}

#[test]
fn an_expired_certificate_with_a_dead_token_is_said_and_pods_keep_running() {
    if !need_root() {
        return;
    }
    let (cp, _audit_log, _audit) = bootstrap_cluster("1h");
    let node = "boot-node-2";
    let mut a = bootstrapping_node(&cp, "tls-expired", node);
    // What the node holds after a long time offline: a pair that expired, a kubeconfig
    // naming it; and the cluster deleted its bootstrap token meanwhile.
    let pki = a.root.join("pki");
    std::fs::create_dir_all(&pki).expect("pki");
    std::fs::set_permissions(&pki, std::fs::Permissions::from_mode(0o700)).expect("chmod");
    let (cert, key) = cp.expired_node_pair(node);
    let old = pki.join("kubelet-client-1000.pem");
    std::fs::write(&old, format!("{cert}{key}")).expect("old pair");
    std::os::unix::fs::symlink(
        "kubelet-client-1000.pem",
        pki.join("kubelet-client-current.pem"),
    )
    .expect("link");
    let current = pki.join("kubelet-client-current.pem");
    std::fs::write(
        a.root.join("kubeconfig"),
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: {}\n    \
             certificate-authority: {}\ncontexts:\n- name: c\n  context: {{cluster: c, user: u}}\n\
             current-context: c\nusers:\n- name: u\n  user:\n    client-certificate: {}\n    \
             client-key: {}\n",
            cp.url,
            cp.ca().display(),
            current.display(),
            current.display()
        ),
    )
    .expect("kubeconfig");
    cp.kubectl_ok(&[
        "delete",
        "secret",
        &format!("bootstrap-token-{TOKEN_ID}"),
        "-n",
        "kube-system",
    ]);
    a.write_manifest(
        "static.yaml",
        &sh_pod("static", "", "main", "while true; do sleep 1; done", ""),
    );
    a.start();

    // The static pod starts while the uplink cannot authenticate.
    let running = a.wait_pod("static", "Running", Duration::from_secs(60), |p| {
        p["status"]["phase"] == "Running"
    });
    let started =
        running["status"]["containerStatuses"][0]["state"]["running"]["startedAt"].clone();

    let mut said = Value::Null;
    a.wait_until(
        "holdfast status to say the certificate expired and the token was refused",
        Duration::from_secs(60),
        |a| {
            said = a.status();
            said["clientCertificate"]["problem"]
                .as_str()
                .is_some_and(|p| p.contains("refused the bootstrap kubeconfig"))
        },
    );
    let problem = said["clientCertificate"]["problem"]
        .as_str()
        .unwrap_or_default();
    eprintln!("holdfast status says: {problem}");
    assert!(problem.contains("expired"), "{problem}");
    let text = std::process::Command::new(env!("CARGO_BIN_EXE_holdfast"))
        .args(["status", "--root-dir"])
        .arg(&a.root)
        .output()
        .expect("holdfast status");
    let text = String::from_utf8_lossy(&text.stdout).into_owned();
    eprintln!("--- holdfast status ---\n{text}");
    assert!(text.contains("credentials:  "), "{text}");
    assert!(a.agent_log().contains("refused"), "the log says it too");

    // The pod keeps running through it: same container, no restart.
    let p = a.pod("static").expect("static pod");
    assert_eq!(p["status"]["phase"], "Running", "{p}");
    let cs = &p["status"]["containerStatuses"][0];
    assert_eq!(cs["restartCount"], 0, "{p}");
    assert_eq!(cs["state"]["running"]["startedAt"], started, "{p}");
    assert!(
        cp.get(&format!("node/{node}"), None).is_none(),
        "no node registered without a credential"
    );

    // A new token: the node bootstraps again by itself and registers, the pod still
    // the same container.
    cp.apply(&token_secret());
    let n = wait_node(&cp, &a, node, false);
    assert_eq!(condition(&n, "Ready")["status"], "True");
    a.wait_until("the problem cleared", Duration::from_secs(30), |a| {
        a.status()["clientCertificate"]["problem"].is_null()
    });
    assert!(
        std::fs::read_to_string(a.root.join("kubeconfig"))
            .expect("kubeconfig")
            .contains("kubelet-client-current.pem"),
        "the kubeconfig was written again"
    );
    let p = a.pod("static").expect("static pod");
    assert_eq!(
        p["status"]["containerStatuses"][0]["state"]["running"]["startedAt"], started,
        "{p}"
    );

    a.remove_manifest("static.yaml");
    a.wait_gone("static", Duration::from_secs(60));
    a.stop();
    a.reset();
    a.assert_clean();
}
