//! `serverTLSBootstrap` against a real kube-apiserver and kube-controller-manager v1.36
//! (whose apiserver checks kubelets' serving certificates against the cluster CA): the
//! agent serves its self-signed certificate while its `kubernetes.io/kubelet-serving`
//! CSR is pending, so `kubectl logs` fails; once the test approves the CSR the agent
//! serves the cluster's certificate without a restart and `kubectl logs` and `exec`
//! work; a restart serves the kept certificate at once, asking for no new one. As root.

use support::control_plane;

use std::io::{Read, Write};
use std::net::{IpAddr, TcpStream};
use std::sync::Arc;
use std::time::{Duration, Instant};

use base64::Engine;
use control_plane::{ControlPlane, Options};
use rustls::client::danger::ServerCertVerifier;
use rustls::crypto::CryptoProvider;
use rustls_pki_types::{CertificateDer, ServerName, UnixTime};
use serde_json::Value;
use support::agent::{need_root, Agent};

const WAIT: Duration = Duration::from_secs(60);
const SIGNER: &str = "kubernetes.io/kubelet-serving";

fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

type Tls = rustls::StreamOwned<rustls::ClientConnection, TcpStream>;

/// A TLS connection to the agent's kubelet API, handshake done; None while nothing
/// listens.
fn connect(a: &Agent) -> Option<Tls> {
    let config = rustls::ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .expect("versions")
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(control_plane::pki::AnyServer(provider())))
        .with_no_client_auth();
    let tcp = TcpStream::connect((a.address.as_str(), a.port)).ok()?;
    tcp.set_read_timeout(Some(Duration::from_secs(10)))
        .expect("timeout");
    let name = ServerName::try_from(a.address.clone()).expect("server name");
    let conn = rustls::ClientConnection::new(Arc::new(config), name).expect("client");
    let mut tls = rustls::StreamOwned::new(conn, tcp);
    while tls.conn.is_handshaking() {
        tls.conn.complete_io(&mut tls.sock).expect("handshake");
    }
    Some(tls)
}

/// The certificate chain the agent serves a new connection now.
fn served(a: &Agent) -> Vec<CertificateDer<'static>> {
    let deadline = Instant::now() + WAIT;
    loop {
        if let Some(tls) = connect(a) {
            let certs = tls.conn.peer_certificates().expect("server certificates");
            return certs.iter().map(|c| c.clone().into_owned()).collect();
        }
        assert!(Instant::now() < deadline, "kubelet API not listening");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Why `chain` is not a certificate of the cluster CA for `name`, or Ok.
fn check_issued(
    cp: &ControlPlane,
    chain: &[CertificateDer<'_>],
    name: ServerName<'_>,
) -> Result<(), String> {
    let mut roots = rustls::RootCertStore::empty();
    let ca = std::fs::read(cp.ca()).expect("read CA");
    for c in rustls_pki_types::pem::PemObject::pem_slice_iter(&ca) {
        roots.add(c.expect("CA PEM")).expect("CA");
    }
    let verifier =
        rustls::client::WebPkiServerVerifier::builder_with_provider(Arc::new(roots), provider())
            .build()
            .expect("verifier");
    verifier
        .verify_server_cert(&chain[0], &chain[1..], &name, &[], UnixTime::now())
        .map(|_| ())
        .map_err(|e| e.to_string())
}

/// `GET /healthz` on an open connection: its response's status line and body.
fn healthz(tls: &mut Tls) -> String {
    tls.write_all(b"GET /healthz HTTP/1.1\r\nHost: node\r\n\r\n")
        .expect("send request");
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    while !String::from_utf8_lossy(&got).contains("\r\n\r\nok") {
        let n = tls.read(&mut buf).expect("read response");
        assert!(
            n > 0,
            "connection closed: {}",
            String::from_utf8_lossy(&got)
        );
        got.extend_from_slice(&buf[..n]);
    }
    String::from_utf8_lossy(&got).into_owned()
}

/// The kubelet-serving CSRs this node sent.
fn csrs(cp: &ControlPlane, node: &str) -> Vec<Value> {
    let list = cp.get("csr", None).expect("csr list");
    let user = format!("system:node:{node}");
    list["items"]
        .as_array()
        .expect("items")
        .iter()
        .filter(|c| c["spec"]["signerName"] == SIGNER && c["spec"]["username"] == user.as_str())
        .cloned()
        .collect()
}

/// `openssl req -noout -text` of a CSR's `spec.request`.
fn request_text(csr: &Value) -> String {
    let pem = base64::engine::general_purpose::STANDARD
        .decode(csr["spec"]["request"].as_str().expect("spec.request"))
        .expect("base64");
    let mut child = std::process::Command::new("openssl")
        .args(["req", "-noout", "-text"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("run openssl");
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(&pem)
        .expect("write CSR");
    let out = child.wait_with_output().expect("openssl");
    assert!(out.status.success(), "openssl req failed");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn tail(s: &str, n: usize) -> String {
    let lines: Vec<&str> = s.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// A cluster with the CSR signer (no approver for kubelet-serving runs in any cluster)
/// and an agent joined with `serverTLSBootstrap` and no `tlsCertFile`.
fn cluster(name: &str, node: &str) -> (ControlPlane, Agent) {
    let cp = ControlPlane::start(Options {
        controllers: "csrsigning".into(),
        scheduler: false,
        ..Options::default()
    });
    let _ = cp.kubectl(&["create", "serviceaccount", "default"]);
    let mut a = Agent::new(name);
    a.node_name = node.into();
    write_config(&cp, &a);
    let kubeconfig = cp.node_kubeconfig(node);
    a.extra_args
        .extend(["--kubeconfig".into(), kubeconfig.display().to_string()]);
    a.start();
    (cp, a)
}

fn write_config(cp: &ControlPlane, a: &Agent) {
    a.write_config(&format!(
        "serverTLSBootstrap: true\nauthentication:\n  x509:\n    clientCAFile: {}\n",
        cp.ca().display()
    ));
}

/// Waits for the node's one pending kubelet-serving CSR and returns it.
fn pending_csr(cp: &ControlPlane, a: &Agent, node: &str, not: &[String]) -> Value {
    let log = || format!("--- agent log ---\n{}", tail(&a.agent_log(), 40));
    cp.wait_for("a kubelet-serving CSR", WAIT, log, |cp| {
        csrs(cp, node).into_iter().find(|c| {
            let name = c["metadata"]["name"].as_str().unwrap_or_default();
            !not.iter().any(|n| n == name) && c["status"]["conditions"].is_null()
        })
    })
}

fn pod(cp: &ControlPlane, a: &Agent, node: &str) {
    cp.apply(&format!(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: talker\nspec:\n  nodeName: {node}\n  \
         automountServiceAccountToken: false\n  terminationGracePeriodSeconds: 1\n  \
         containers:\n    - name: main\n      image: docker.io/library/busybox:demo\n      \
         command: [\"sh\", \"-c\", \"echo hello from talker; sleep 3600\"]\n"
    ));
    let log = || format!("--- agent log ---\n{}", tail(&a.agent_log(), 40));
    cp.wait_for("pod talker running", WAIT, log, |cp| {
        cp.get("pod/talker", None)
            .filter(|p| p["status"]["containerStatuses"][0]["state"]["running"].is_object())
    });
}

#[test]
fn the_serving_certificate_comes_from_an_approved_csr_without_a_restart() {
    if !need_root() {
        return;
    }
    const NODE: &str = "tls-boot-node-1";
    let (cp, mut a) = cluster("tls-bootstrap", NODE);
    let ip: IpAddr = a.address.parse().expect("agent address");
    let csr = pending_csr(&cp, &a, NODE, &[]);
    let csr_name = csr["metadata"]["name"].as_str().expect("name").to_string();

    // What the kubelet asks for: its node's names, for serving, nothing more.
    assert_eq!(
        csr["spec"]["usages"],
        serde_json::json!(["digital signature", "server auth"])
    );
    let text = request_text(&csr);
    let subject = text
        .lines()
        .find(|l| l.trim_start().starts_with("Subject:"))
        .unwrap_or_default();
    assert!(
        subject.contains("O = system:nodes")
            && subject.contains(&format!("CN = system:node:{NODE}")),
        "{text}"
    );
    assert!(
        text.contains(&format!("DNS:{NODE}, IP Address:{ip}\n")),
        "the request names the node's hostname and InternalIP only:\n{text}"
    );

    // Pending: the self-signed certificate, which the apiserver does not trust.
    let self_signed = std::fs::read(a.root.join("pki/kubelet.crt")).expect("kubelet.crt");
    let self_signed: Vec<_> = rustls_pki_types::pem::PemObject::pem_slice_iter(&self_signed)
        .collect::<Result<Vec<CertificateDer<'static>>, _>>()
        .expect("PEM");
    assert_eq!(served(&a)[0], self_signed[0]);
    assert!(check_issued(&cp, &served(&a), ServerName::IpAddress(ip.into())).is_err());
    pod(&cp, &a, NODE);
    let out = cp.kubectl(&["logs", "talker"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && (err.contains("x509") || err.contains("certificate")),
        "kubectl logs while the CSR is pending: {err}"
    );
    // A connection made now, kept open across the swap.
    let mut before = connect(&a).expect("connect");
    assert!(healthz(&mut before).starts_with("HTTP/1.1 200"));

    cp.kubectl_ok(&["certificate", "approve", &csr_name]);
    let approved = Instant::now();
    let log = || format!("--- agent log ---\n{}", tail(&a.agent_log(), 40));
    cp.wait_for("the cluster's certificate served", WAIT, log, |_| {
        check_issued(&cp, &served(&a), ServerName::IpAddress(ip.into())).ok()
    });
    eprintln!(
        "the cluster's certificate served {:?} after the approval",
        approved.elapsed()
    );
    let chain = served(&a);
    let dns = ServerName::try_from(NODE.to_string()).expect("dns name");
    check_issued(&cp, &chain, dns).expect("the certificate names the node");
    let logs = cp.kubectl_ok(&["logs", "talker"]);
    assert_eq!(logs, "hello from talker\n");
    let exec = cp.kubectl_ok(&["exec", "talker", "--", "echo", "exec works"]);
    assert_eq!(exec, "exec works\n");
    assert!(
        healthz(&mut before).starts_with("HTTP/1.1 200"),
        "a connection open before the swap goes on"
    );
    drop(before);

    // Kept for the next start, readable by root only.
    use std::os::unix::fs::PermissionsExt;
    let current = a.root.join("pki/kubelet-server-current.pem");
    let mode = std::fs::metadata(&current)
        .expect("pair file")
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o600, "{}", current.display());

    // A restart serves it from the first connection and asks for no new one.
    let sent = csrs(&cp, NODE).len();
    let log_len = a.agent_log().len();
    a.stop();
    a.start();
    assert_eq!(served(&a), chain, "the kept certificate, at once");
    // Once exec works again the agent is all up: a request would have been sent.
    cp.wait_for(
        "exec after the restart",
        WAIT,
        || tail(&a.agent_log(), 40),
        |cp| {
            let out = cp.kubectl(&["exec", "talker", "--", "true"]);
            out.status.success().then_some(())
        },
    );
    assert_eq!(csrs(&cp, NODE).len(), sent, "no new CSR after the restart");
    let after = &a.agent_log()[log_len..];
    assert!(!after.contains(SIGNER), "no request sent:\n{after}");
    cp.kubectl_ok(&["delete", "pod", "talker", "--timeout=60s"]);
}

#[test]
fn a_denied_csr_keeps_the_certificate_served_and_a_moved_node_asks_again() {
    if !need_root() {
        return;
    }
    const NODE: &str = "tls-boot-node-2";
    let (cp, mut a) = cluster("tls-bootstrap-denied", NODE);
    let ip: IpAddr = a.address.parse().expect("agent address");
    let first = pending_csr(&cp, &a, NODE, &[]);
    let first = first["metadata"]["name"]
        .as_str()
        .expect("name")
        .to_string();
    let before = served(&a);
    cp.kubectl_ok(&["certificate", "deny", &first]);

    // Asked again (after a back-off), still serving what it had; denied again, asked
    // again, the reason said once.
    let second = pending_csr(&cp, &a, NODE, std::slice::from_ref(&first));
    let second = second["metadata"]["name"]
        .as_str()
        .expect("name")
        .to_string();
    assert_eq!(served(&a), before);
    cp.kubectl_ok(&["certificate", "deny", &second]);
    let third = pending_csr(&cp, &a, NODE, &[first, second]);
    let third = third["metadata"]["name"]
        .as_str()
        .expect("name")
        .to_string();
    assert_eq!(served(&a), before);
    let log = a.agent_log();
    assert_eq!(
        log.lines()
            .filter(|l| l.contains("no serving certificate from the cluster"))
            .count(),
        1,
        "the denial is logged once:\n{}",
        tail(&log, 40)
    );

    cp.kubectl_ok(&["certificate", "approve", &third]);
    let log = || format!("--- agent log ---\n{}", tail(&a.agent_log(), 40));
    cp.wait_for("the cluster's certificate served", WAIT, log, |_| {
        check_issued(&cp, &served(&a), ServerName::IpAddress(ip.into())).ok()
    });
    let issued = served(&a);

    // The node moves to another address while stopped: the kept certificate no longer
    // names it, so the self-signed one is served and a request for the new address is
    // sent.
    let asked: Vec<String> = csrs(&cp, NODE)
        .iter()
        .filter_map(|c| c["metadata"]["name"].as_str().map(str::to_string))
        .collect();
    a.stop();
    a.address = "127.0.0.2".into();
    write_config(&cp, &a);
    a.start();
    let moved = served(&a);
    assert_ne!(moved, issued, "the old address's certificate is not served");
    let new_ip = ServerName::IpAddress(IpAddr::from([127, 0, 0, 2]).into());
    assert!(check_issued(&cp, &moved, new_ip.clone()).is_err());
    let fourth = pending_csr(&cp, &a, NODE, &asked);
    let text = request_text(&fourth);
    assert!(
        text.contains(&format!("DNS:{NODE}, IP Address:127.0.0.2\n")),
        "the request names the new address:\n{text}"
    );
    let fourth = fourth["metadata"]["name"]
        .as_str()
        .expect("name")
        .to_string();
    cp.kubectl_ok(&["certificate", "approve", &fourth]);
    let log = || format!("--- agent log ---\n{}", tail(&a.agent_log(), 40));
    cp.wait_for("the new address's certificate served", WAIT, log, |_| {
        check_issued(&cp, &served(&a), new_ip.clone()).ok()
    });
}
