//! The apiserver client against the kube-apiserver double over TLS (trust, client
//! certificates, tokens, tls-server-name), and against a scripted plain-HTTP peer for
//! what the double does not do on purpose (oversized bodies, broken watches).

use support::{apiserver, tempdir};

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime};

use apiserver::pki::Pki;
use apiserver::{ApiServerDouble, Credential, Identity, KubeconfigOptions, Options};
use holdfast::kube::kubeconfig::Kubeconfig;
use holdfast::kube::{ApiError, Client, Patch};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::WatchEvent;
use serde_json::Value;
use tempdir::TempDir;

const NODE: Identity<'static> = Identity::Node("edge-node-1");

fn version(client: &Client) -> Result<Value, ApiError> {
    client.get::<Value>("/version")
}

fn kubeconfig(d: &ApiServerDouble, dir: &Path, opts: KubeconfigOptions) -> PathBuf {
    d.kubeconfig_with(dir, NODE, &opts)
}

fn last_user(d: &ApiServerDouble) -> String {
    d.request_log()
        .last()
        .map(|l| l.user.clone())
        .unwrap_or_default()
}

#[test]
fn client_certificate_authenticates_as_the_node() {
    let d = ApiServerDouble::start(Options::default());
    let dir = TempDir::new("uplink-tls-cert");
    for embed in [false, true] {
        let opts = KubeconfigOptions {
            embed,
            ..KubeconfigOptions::default()
        };
        let client = Client::from_kubeconfig(&kubeconfig(&d, &dir.0, opts)).expect("client");
        assert_eq!(client.server(), d.url());
        let v = version(&client).expect("GET /version");
        assert_eq!(v["gitVersion"], "v1.36.2");
        assert_eq!(last_user(&d), "system:node:edge-node-1", "embed={embed}");
        let clone = client.clone();
        version(&clone).expect("second GET");
        assert_eq!(client.requests_sent(), 2, "clones share the counter");
    }
}

#[test]
fn a_server_certificate_from_another_ca_is_not_trusted() {
    let d = ApiServerDouble::start(Options::default());
    let dir = TempDir::new("uplink-tls-wrong-ca");
    let path = kubeconfig(&d, &dir.0, KubeconfigOptions::default());
    // The kubeconfig's ca.crt now holds a CA that did not sign the double's certificate.
    let other = Pki::new(&dir.0.join("other-pki"));
    std::fs::write(dir.0.join("ca.crt"), &other.ca_pem).expect("replace ca.crt");
    let client = Client::from_kubeconfig(&path).expect("client");
    match version(&client) {
        Err(e @ ApiError::Transport { .. }) => {
            let message = e.to_string();
            assert!(
                message.contains("the server certificate is not trusted by the kubeconfig's CA"),
                "{message}"
            );
            // Same CA name, other key: webpki reports the signature (UnknownIssuer when
            // the names differ); either way rustls's words follow.
            assert!(
                message.contains("invalid peer certificate: BadSignature"),
                "rustls's words: {message}"
            );
            assert!(e.is_transient());
        }
        other => panic!("expected a transport error, got {other:?}"),
    }
    assert!(d.request_log().is_empty(), "no request got through");

    // A CA by another name: webpki finds no issuer at all.
    let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).expect("params");
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, "some-other-ca");
    params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    let key = rcgen::KeyPair::generate().expect("key");
    let ca = params.self_signed(&key).expect("ca");
    std::fs::write(dir.0.join("ca.crt"), ca.pem()).expect("replace ca.crt");
    let client = Client::from_kubeconfig(&path).expect("client");
    let message = version(&client).expect_err("untrusted").to_string();
    assert!(
        message.contains("not trusted by the kubeconfig's CA")
            && message.contains("invalid peer certificate: UnknownIssuer"),
        "{message}"
    );
}

#[test]
fn bearer_token_authenticates_inline_and_from_a_token_file() {
    let d = ApiServerDouble::start(Options::default());
    let dir = TempDir::new("uplink-tls-token");
    let path = d.kubeconfig_token(&dir.0, NODE);
    let client = Client::from_kubeconfig(&path).expect("client");
    version(&client).expect("GET with token");
    assert_eq!(last_user(&d), "system:node:edge-node-1");

    let token = d.token(Identity::Admin);
    std::fs::write(dir.0.join("admin.token"), format!("{token}\n")).expect("token file");
    let text = std::fs::read_to_string(&path).expect("read kubeconfig");
    let text: String = text
        .lines()
        .map(|l| {
            if l.trim_start().starts_with("token:") {
                "    tokenFile: admin.token".to_string()
            } else {
                l.to_string()
            }
        })
        .collect::<Vec<_>>()
        .join("\n");
    let file_path = dir.0.join("tokenfile.kubeconfig");
    std::fs::write(&file_path, text).expect("write kubeconfig");
    let client = Client::from_kubeconfig(&file_path).expect("client");
    version(&client).expect("GET with token file");
    assert_eq!(last_user(&d), "admin");
}

#[test]
fn an_unknown_token_is_unauthorized() {
    let d = ApiServerDouble::start(Options::default());
    let dir = TempDir::new("uplink-tls-badtoken");
    let opts = KubeconfigOptions {
        credential: Credential::UnknownToken,
        ..KubeconfigOptions::default()
    };
    let client = Client::from_kubeconfig(&kubeconfig(&d, &dir.0, opts)).expect("client");
    match version(&client) {
        Err(e) => {
            assert!(e.is_unauthorized(), "{e}");
            assert!(!e.is_transient());
            assert!(matches!(&e, ApiError::Status { reason, .. } if reason == "Unauthorized"));
        }
        Ok(v) => panic!("expected 401, got {v}"),
    }
}

#[test]
fn an_expired_client_certificate_is_refused_at_load() {
    let d = ApiServerDouble::start(Options::default());
    let dir = TempDir::new("uplink-tls-expired");
    let opts = KubeconfigOptions {
        credential: Credential::ExpiredCertificate,
        ..KubeconfigOptions::default()
    };
    let path = kubeconfig(&d, &dir.0, opts);
    let err = match Client::from_kubeconfig(&path) {
        Err(e) => e,
        Ok(_) => panic!("an expired certificate must not load"),
    };
    assert!(err.is_clock_dependent());
    let message = err.to_string();
    assert!(
        message.contains("client certificate expired at"),
        "{message}"
    );
    assert!(message.contains(&path.display().to_string()), "{message}");

    // Had it been loaded (a clock two days behind), the server would refuse it anyway.
    let two_days_ago = SystemTime::now() - Duration::from_secs(2 * 86_400 - 60);
    let kc = Kubeconfig::load_at(&path, two_days_ago).expect("valid by that clock");
    let client = Client::new(&kc).expect("client");
    let err = version(&client).expect_err("401");
    assert!(err.is_unauthorized(), "{err}");
}

#[test]
fn a_kubeconfig_without_credentials_is_refused() {
    let d = ApiServerDouble::start(Options::default());
    let dir = TempDir::new("uplink-tls-anonymous");
    let opts = KubeconfigOptions {
        credential: Credential::None,
        ..KubeconfigOptions::default()
    };
    let err = match Client::from_kubeconfig(&kubeconfig(&d, &dir.0, opts)) {
        Err(e) => e.to_string(),
        Ok(_) => panic!("anonymous kubeconfig must not load"),
    };
    assert!(err.contains("no credentials"), "{err}");
}

#[test]
fn tls_server_name_verifies_the_certificate_against_that_name() {
    let d = ApiServerDouble::start(Options {
        server_names: vec!["apiserver.edge.internal".to_string()],
        ..Options::default()
    });
    let dir = TempDir::new("uplink-tls-sni");
    let named = KubeconfigOptions {
        tls_server_name: Some("apiserver.edge.internal".to_string()),
        ..KubeconfigOptions::default()
    };
    let client = Client::from_kubeconfig(&kubeconfig(&d, &dir.0, named)).expect("client");
    assert!(client.server().starts_with("https://127.0.0.1:"));
    version(&client).expect("verified as apiserver.edge.internal");

    let unnamed = kubeconfig(&d, &dir.0, KubeconfigOptions::default());
    let client = Client::from_kubeconfig(&unnamed).expect("client");
    match version(&client) {
        Err(e @ ApiError::Transport { .. }) => {
            let message = e.to_string();
            assert!(
                message.contains("the server certificate does not name 127.0.0.1"),
                "{message}"
            );
            assert!(message.contains("tls-server-name"), "{message}");
        }
        other => panic!("expected a name mismatch, got {other:?}"),
    }
}

#[test]
fn a_missing_resource_is_not_found_and_a_closed_port_is_transient() {
    let d = ApiServerDouble::start(Options::default());
    let dir = TempDir::new("uplink-tls-404");
    let client = Client::from_kubeconfig(&kubeconfig(&d, &dir.0, KubeconfigOptions::default()))
        .expect("client");
    // The node's own Node, before it registers (fixture 06): 404, not 403.
    let err = client
        .get::<Value>("/api/v1/nodes/edge-node-1")
        .expect_err("404");
    assert!(err.is_not_found(), "{err}");

    let closed = TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = closed.local_addr().expect("addr").port();
    drop(closed);
    let opts = KubeconfigOptions {
        server: Some(format!("https://127.0.0.1:{port}")),
        ..KubeconfigOptions::default()
    };
    let client = Client::from_kubeconfig(&kubeconfig(&d, &dir.0, opts)).expect("client");
    match version(&client) {
        Err(e @ ApiError::Transport { .. }) => {
            assert!(e.is_transient());
            assert!(e.to_string().contains(&format!("127.0.0.1:{port}")), "{e}");
        }
        other => panic!("expected a transport error, got {other:?}"),
    }
    assert_eq!(client.requests_sent(), 1);
}

// ---- a scripted plain-HTTP peer ----

/// What the peer received: the request head (lines) and body.
struct Received {
    head: Vec<String>,
    body: Vec<u8>,
}

impl Received {
    fn header(&self, name: &str) -> Option<&str> {
        self.head.iter().find_map(|l| {
            let (n, v) = l.split_once(':')?;
            n.eq_ignore_ascii_case(name).then(|| v.trim())
        })
    }
}

/// Serves one connection: reads one request, hands it over, then runs `respond`.
fn peer(
    respond: impl FnOnce(&mut TcpStream) + Send + 'static,
) -> (String, mpsc::Receiver<Received>, JoinHandle<()>) {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let url = format!("http://{}", listener.local_addr().expect("addr"));
    let (tx, rx) = mpsc::channel();
    let handle = std::thread::spawn(move || {
        let (mut stream, _) = listener.accept().expect("accept");
        let mut reader = BufReader::new(stream.try_clone().expect("clone"));
        let mut head = Vec::new();
        loop {
            let mut line = String::new();
            reader.read_line(&mut line).expect("read head");
            let line = line.trim_end().to_string();
            if line.is_empty() {
                break;
            }
            head.push(line);
        }
        let len = head
            .iter()
            .find_map(|l| {
                l.to_ascii_lowercase()
                    .strip_prefix("content-length:")
                    .map(|v| v.trim().to_string())
            })
            .and_then(|v| v.parse::<usize>().ok())
            .unwrap_or(0);
        let mut body = vec![0; len];
        reader.read_exact(&mut body).expect("read body");
        let _ = tx.send(Received { head, body });
        respond(&mut stream);
    });
    (url, rx, handle)
}

fn http_client(url: &str, dir: &Path) -> Client {
    let path = dir.join("http.kubeconfig");
    std::fs::write(
        &path,
        format!(
            "apiVersion: v1\nkind: Config\ncurrent-context: x\nclusters:\n- name: x\n  cluster:\n    \
             server: {url}\nusers:\n- name: x\n  user:\n    token: tok-123\ncontexts:\n- name: x\n  \
             context:\n    cluster: x\n    user: x\n"
        ),
    )
    .expect("write kubeconfig");
    Client::from_kubeconfig(&path).expect("client")
}

fn chunk(stream: &mut TcpStream, data: &str) {
    let _ = write!(stream, "{:x}\r\n{data}\r\n", data.len());
}

const WATCH_HEAD: &str =
    "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n";
const ADDED: &str = "{\"type\":\"ADDED\",\"object\":{\"kind\":\"Pod\",\"apiVersion\":\"v1\",\"metadata\":{\"name\":\"p\",\"resourceVersion\":\"7\"}}}\n";

#[test]
fn requests_carry_the_headers_the_apiserver_expects() {
    let dir = TempDir::new("uplink-http-headers");
    let (url, rx, handle) = peer(|s| {
        let body = r#"{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":"pods \"p\" already exists","reason":"AlreadyExists","code":409}"#;
        let _ = write!(
            s,
            "HTTP/1.1 409 Conflict\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        );
    });
    let client = http_client(&url, &dir.0);
    let patch = serde_json::json!({"status": {"phase": "Running"}});
    let err = client
        .patch::<Value>(
            "/api/v1/namespaces/d/pods/p/status",
            Patch::Strategic,
            &patch,
        )
        .expect_err("409");
    assert!(err.is_already_exists(), "{err}");
    let got = rx.recv_timeout(Duration::from_secs(10)).expect("request");
    assert_eq!(
        got.head[0],
        "PATCH /api/v1/namespaces/d/pods/p/status HTTP/1.1"
    );
    assert_eq!(got.header("authorization"), Some("Bearer tok-123"));
    assert_eq!(got.header("accept"), Some("application/json"));
    assert_eq!(
        got.header("content-type"),
        Some("application/strategic-merge-patch+json")
    );
    let ua = got.header("user-agent").unwrap_or_default();
    assert!(
        ua.starts_with(&format!("holdfast/{} (linux/", env!("CARGO_PKG_VERSION"))),
        "{ua}"
    );
    assert_eq!(
        serde_json::from_slice::<Value>(&got.body).expect("json"),
        patch
    );
    handle.join().expect("peer");
}

#[test]
fn an_oversized_body_is_a_decode_error() {
    let dir = TempDir::new("uplink-http-big");
    let (url, _rx, handle) = peer(|s| {
        let len = (16 << 20) + 1;
        let _ = write!(s, "HTTP/1.1 200 OK\r\nContent-Length: {len}\r\n\r\n");
        let block = vec![b' '; 1 << 16];
        let mut left = len;
        while left > 0 {
            let n = left.min(block.len());
            if s.write_all(&block[..n]).is_err() {
                break;
            }
            left -= n;
        }
    });
    let client = http_client(&url, &dir.0);
    match client.get::<Value>("/api/v1/pods") {
        Err(ApiError::Decode { message, .. }) => {
            assert!(message.contains("larger than"), "{message}")
        }
        other => panic!("expected a decode error, got {other:?}"),
    }
    handle.join().expect("peer");
}

#[test]
fn a_watch_yields_events_until_the_server_ends_it() {
    let dir = TempDir::new("uplink-http-watch");
    let (url, rx, handle) = peer(|s| {
        let _ = s.write_all(WATCH_HEAD.as_bytes());
        chunk(s, ADDED);
        chunk(s, "{\"type\":\"BOOKMARK\",\"object\":{\"kind\":\"Pod\",\"apiVersion\":\"v1\",\"metadata\":{\"resourceVersion\":\"9\"},\"spec\":{\"containers\":null},\"status\":{}}}\n");
        let _ = s.write_all(b"0\r\n\r\n");
    });
    let client = http_client(&url, &dir.0);
    let path = "/api/v1/pods?watch=true&resourceVersion=5";
    let events: Vec<_> = client
        .watch::<Pod>(path, Duration::from_secs(30))
        .expect("watch")
        .collect();
    assert_eq!(events.len(), 2, "{events:?}");
    assert!(
        matches!(&events[0], Ok(WatchEvent::Added(p)) if p.metadata.name.as_deref() == Some("p"))
    );
    assert!(
        matches!(&events[1], Ok(WatchEvent::Bookmark { resource_version, .. }) if resource_version == "9")
    );
    let got = rx.recv_timeout(Duration::from_secs(10)).expect("request");
    assert_eq!(got.head[0], format!("GET {path} HTTP/1.1"));
    handle.join().expect("peer");
}

#[test]
fn a_watch_that_outlives_its_timeout_is_a_transport_error() {
    let dir = TempDir::new("uplink-http-watch-timeout");
    let (release, hold) = mpsc::channel::<()>();
    let (url, _rx, handle) = peer(move |s| {
        let _ = s.write_all(WATCH_HEAD.as_bytes());
        chunk(s, ADDED);
        let _ = s.flush();
        // Keep the stream open, silent, until the test has seen the timeout.
        let _ = hold.recv_timeout(Duration::from_secs(30));
    });
    let client = http_client(&url, &dir.0);
    let mut watch = client
        .watch::<Pod>("/api/v1/pods?watch=true", Duration::from_millis(500))
        .expect("watch");
    assert!(matches!(watch.next(), Some(Ok(WatchEvent::Added(_)))));
    let started = Instant::now();
    match watch.next() {
        Some(Err(e @ ApiError::Transport { .. })) => {
            assert!(e.to_string().contains("timed out"), "{e}");
        }
        other => panic!("expected a timeout, got {other:?}"),
    }
    assert!(started.elapsed() < Duration::from_secs(10));
    assert!(watch.next().is_none());
    let _ = release.send(());
    handle.join().expect("peer");
}

#[test]
fn a_watch_refused_by_the_server_is_a_status_error() {
    let dir = TempDir::new("uplink-http-watch-410");
    let (url, _rx, handle) = peer(|s| {
        let body = r#"{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":"too old","reason":"Expired","code":410}"#;
        let _ = write!(
            s,
            "HTTP/1.1 410 Gone\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        );
    });
    let client = http_client(&url, &dir.0);
    match client.watch::<Pod>("/api/v1/pods?watch=true", Duration::from_secs(30)) {
        Err(e) => assert!(e.is_gone(), "{e}"),
        Ok(_) => panic!("expected 410"),
    }
    handle.join().expect("peer");
}
