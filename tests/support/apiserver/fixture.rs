//! Replaying the recorded exchanges (`tests/fixtures/kube-apiserver/`) against the
//! double: parse a fixture pair, rewrite the server-generated values it carries (uids,
//! resourceVersions, continue tokens) to the double's, send it, and compare status,
//! headers and the shape of the body.

use std::path::PathBuf;
use std::time::Duration;

use serde_json::Value;

use super::client::{RawClient, RawResponse, RawStream};
use super::{ApiServerDouble, Identity};

/// One recorded exchange.
#[derive(Debug, Clone)]
pub struct Fixture {
    pub name: String,
    pub method: String,
    pub target: String,
    pub content_type: Option<String>,
    pub body: Vec<u8>,
    pub code: u16,
    pub reason: String,
    pub headers: Vec<(String, String)>,
    pub response_body: Vec<u8>,
}

impl Fixture {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

pub fn dir() -> PathBuf {
    crate::repo_root().join("tests/fixtures/kube-apiserver")
}

fn split_head(text: &[u8]) -> (Vec<String>, Vec<u8>) {
    let mut lines = Vec::new();
    let mut pos = 0;
    while pos < text.len() {
        let end = text[pos..]
            .iter()
            .position(|&b| b == b'\n')
            .map_or(text.len(), |e| pos + e);
        let line = String::from_utf8_lossy(&text[pos..end])
            .trim_end_matches('\r')
            .to_string();
        pos = (end + 1).min(text.len());
        if line.is_empty() {
            return (lines, text[pos..].to_vec());
        }
        lines.push(line);
    }
    (lines, Vec::new())
}

fn headers(lines: &[String]) -> Vec<(String, String)> {
    lines
        .iter()
        .filter_map(|l| l.split_once(':'))
        .map(|(n, v)| (n.trim().to_string(), v.trim().to_string()))
        .collect()
}

/// Loads `NN-name` (the file stem without `.request.txt`).
pub fn load(name: &str) -> Fixture {
    let d = dir();
    let req = std::fs::read(d.join(format!("{name}.request.txt"))).expect("request fixture");
    let start: usize = req
        .split(|&b| b == b'\n')
        .take_while(|l| l.starts_with(b"#"))
        .map(|l| l.len() + 1)
        .sum();
    let (head, body) = split_head(&req[start..]);
    let mut first = head[0].split(' ');
    let method = first.next().expect("method").to_string();
    let target = first.next().expect("target").to_string();
    let req_headers = headers(&head[1..]);
    let content_type = req_headers
        .iter()
        .find(|(n, _)| n.eq_ignore_ascii_case("content-type"))
        .map(|(_, v)| v.clone());
    let resp = std::fs::read(d.join(format!("{name}.response.txt"))).expect("response fixture");
    let (rhead, rbody) = split_head(&resp);
    let mut status = rhead[0].splitn(3, ' ');
    status.next();
    let code = status
        .next()
        .and_then(|c| c.parse().ok())
        .expect("status code");
    Fixture {
        name: name.to_string(),
        method,
        target,
        content_type,
        body: body.trim_ascii_end().to_vec(),
        code,
        reason: status.next().unwrap_or("").to_string(),
        headers: headers(&rhead[1..]),
        response_body: rbody,
    }
}

/// Values that differ between the recording and the double: uid, resourceVersion and
/// continue token, learnt from responses seen side by side.
#[derive(Debug, Default, Clone)]
pub struct Rewrites(pub Vec<(String, String)>);

const LEARNT: [&str; 3] = ["uid", "resourceVersion", "continue"];

impl Rewrites {
    pub fn learn(&mut self, recorded: &Value, ours: &Value) {
        match (recorded, ours) {
            (Value::Object(r), Value::Object(o)) => {
                for (k, rv) in r {
                    let Some(ov) = o.get(k) else { continue };
                    if let (true, Some(a), Some(b)) =
                        (LEARNT.contains(&k.as_str()), rv.as_str(), ov.as_str())
                    {
                        if a != b && !self.0.iter().any(|(f, _)| f == a) {
                            self.0.push((a.to_string(), b.to_string()));
                        }
                    } else {
                        self.learn(rv, ov);
                    }
                }
            }
            (Value::Array(r), Value::Array(o)) => {
                for (a, b) in r.iter().zip(o) {
                    self.learn(a, b);
                }
            }
            _ => {}
        }
    }

    /// Rewrites recorded text (a body or a message) to the double's values.
    pub fn text(&self, s: &str) -> String {
        let mut s = s.to_string();
        for (f, d) in &self.0 {
            if f.len() >= 16 {
                s = s.replace(f, d);
            } else {
                s = s.replace(&format!("\"{f}\""), &format!("\"{d}\""));
            }
        }
        s
    }

    /// Rewrites query parameter values of a request target.
    pub fn target(&self, t: &str) -> String {
        let Some((path, query)) = t.split_once('?') else {
            return t.to_string();
        };
        let params: Vec<String> = query
            .split('&')
            .map(|kv| match kv.split_once('=') {
                Some((k, v)) => match self.0.iter().find(|(f, _)| f == v) {
                    Some((_, d)) => format!("{k}={d}"),
                    None => kv.to_string(),
                },
                None => kv.to_string(),
            })
            .collect();
        format!("{path}?{}", params.join("&"))
    }
}

fn is_timestamp(s: &str) -> bool {
    s.len() == 20 && s.ends_with('Z') && s.as_bytes()[10] == b'T'
}

/// Compares `ours` with `recorded`: the same keys everywhere (managedFields aside), the
/// same values, except creation/deletion timestamps, which only need the same form.
pub fn same_shape(recorded: &Value, ours: &Value, path: &str, diffs: &mut Vec<String>) {
    match (recorded, ours) {
        (Value::Object(r), Value::Object(o)) => {
            for k in r.keys().filter(|k| *k != "managedFields") {
                if !o.contains_key(k) {
                    diffs.push(format!("{path}.{k}: missing"));
                }
            }
            for k in o.keys().filter(|k| !r.contains_key(*k)) {
                diffs.push(format!("{path}.{k}: not in the recording"));
            }
            for (k, rv) in r {
                let Some(ov) = o.get(k) else { continue };
                let p = format!("{path}.{k}");
                if matches!(k.as_str(), "creationTimestamp" | "deletionTimestamp") {
                    let ok = match (rv.as_str(), ov.as_str()) {
                        (Some(a), Some(b)) => is_timestamp(a) && is_timestamp(b),
                        _ => rv.is_null() && ov.is_null(),
                    };
                    if !ok {
                        diffs.push(format!("{p}: {rv} vs {ov}"));
                    }
                } else if k != "managedFields" {
                    same_shape(rv, ov, &p, diffs);
                }
            }
        }
        (Value::Array(r), Value::Array(o)) if r.len() == o.len() => {
            for (i, (a, b)) in r.iter().zip(o).enumerate() {
                same_shape(a, b, &format!("{path}[{i}]"), diffs);
            }
        }
        (r, o) if r == o => {}
        (r, o) => diffs.push(format!("{path}: recorded {r} vs ours {o}")),
    }
}

/// A replay session: clients per identity and the rewrites learnt so far.
pub struct Session {
    pub node: RawClient,
    pub admin: RawClient,
    pub anon: RawClient,
    pub badtoken: RawClient,
    pub rewrites: Rewrites,
}

impl Session {
    fn client_for(&mut self, f: &Fixture) -> &mut RawClient {
        let raw = std::fs::read_to_string(dir().join(format!("{}.request.txt", f.name)))
            .expect("request fixture");
        let identity = raw
            .lines()
            .find(|l| l.starts_with("# Identity:"))
            .unwrap_or("");
        if identity.contains("system:node:") {
            &mut self.node
        } else if identity.contains("admin") {
            &mut self.admin
        } else if identity.contains("bearer token") {
            &mut self.badtoken
        } else {
            &mut self.anon
        }
    }

    /// Sends the fixture's request (rewritten) as its identity.
    pub fn send(&mut self, f: &Fixture) -> RawResponse {
        let target = self.rewrites.target(&f.target);
        let body = self.rewrites.text(&String::from_utf8_lossy(&f.body));
        let ct = f.content_type.clone();
        self.client_for(f)
            .request(&f.method, &target, ct.as_deref(), body.as_bytes())
            .expect("request to the double")
    }

    /// Replays `name` and checks the answer against the recording; returns ours.
    pub fn replay(&mut self, name: &str) -> RawResponse {
        let f = load(name);
        let r = self.send(&f);
        check(&mut self.rewrites, &f, &r);
        r
    }
}

/// Status line, framing-independent headers, and body.
pub fn check(rewrites: &mut Rewrites, f: &Fixture, r: &RawResponse) {
    let name = &f.name;
    assert_eq!(
        (r.code, r.reason.as_str()),
        (f.code, f.reason.as_str()),
        "{name}: status line; body {}",
        String::from_utf8_lossy(&r.body)
    );
    assert_eq!(r.header("content-type"), Some("application/json"), "{name}");
    assert_eq!(
        r.header("cache-control"),
        f.header("cache-control"),
        "{name}"
    );
    assert!(r.header("audit-id").is_some(), "{name}: Audit-Id");
    for h in ["x-content-type-options", "x-kubernetes-pf-flowschema-uid"] {
        assert_eq!(
            r.header(h).is_some(),
            f.header(h).is_some(),
            "{name}: header {h}"
        );
    }
    let chunked = r.header("transfer-encoding") == Some("chunked");
    assert_eq!(
        chunked,
        r.body.len() > 2048,
        "{name}: framing for {} bytes",
        r.body.len()
    );
    let recorded: Value = serde_json::from_slice(&f.response_body).expect("recorded JSON");
    let ours: Value = serde_json::from_slice(&r.body).expect("our JSON");
    rewrites.learn(&recorded, &ours);
    let recorded_text = rewrites.text(&String::from_utf8_lossy(&f.response_body));
    if recorded["kind"] == "Status" {
        assert_eq!(
            String::from_utf8_lossy(&r.body),
            recorded_text,
            "{name}: Status body byte for byte"
        );
        return;
    }
    let recorded: Value = serde_json::from_str(&recorded_text).expect("rewritten JSON");
    let mut diffs = Vec::new();
    same_shape(&recorded, &ours, "", &mut diffs);
    assert!(diffs.is_empty(), "{name}: {diffs:#?}");
}

impl ApiServerDouble {
    /// Clients for the recording's identities: `system:node:edge-node-1`, `admin`,
    /// anonymous, and an unknown bearer token.
    pub fn fixture_session(&self) -> Session {
        Session {
            node: self.raw(Some(Identity::Node("edge-node-1"))),
            admin: self.raw(Some(Identity::Admin)),
            anon: self.raw(None),
            badtoken: self
                .raw(None)
                .with_bearer("0123456789abcdef0123456789abcdef"),
            rewrites: Rewrites::default(),
        }
    }
}

/// The events of a watch body, one JSON object per chunk.
pub fn events(chunks: &[Vec<u8>]) -> Vec<Value> {
    chunks
        .iter()
        .map(|c| {
            assert_eq!(
                c.last(),
                Some(&b'\n'),
                "one event per chunk, newline-terminated"
            );
            assert_eq!(
                c.iter().filter(|b| **b == b'\n').count(),
                1,
                "one event per chunk"
            );
            serde_json::from_slice(c).expect("event JSON")
        })
        .collect()
}

pub fn recorded_events(name: &str) -> Vec<Value> {
    let f = load(name);
    String::from_utf8_lossy(&f.response_body)
        .lines()
        .filter(|l| l.starts_with('{'))
        .map(|l| serde_json::from_str(l).expect("recorded event"))
        .collect()
}

pub fn drain(watch: &mut RawStream) -> Vec<Vec<u8>> {
    watch.set_timeout(Duration::from_secs(20));
    let mut chunks = Vec::new();
    while let Some(c) = watch.next_chunk().expect("chunk") {
        chunks.push(c);
    }
    chunks
}

pub fn rv_of(r: &RawResponse) -> String {
    r.json()["metadata"]["resourceVersion"]
        .as_str()
        .expect("resourceVersion")
        .to_string()
}

/// Replays each fixture in turn.
pub fn replay_all(s: &mut Session, names: &[&str]) {
    for n in names {
        s.replay(n);
    }
}

/// Objects the recording created without recording them.
pub fn unrecorded_objects(d: &ApiServerDouble) {
    let cm: k8s_openapi::api::core::v1::ConfigMap = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "unrelated-config", "namespace": "default"}, "data": {"k": "v"}
    }))
    .expect("configmap");
    d.put_configmap(cm);
    let secret: k8s_openapi::api::core::v1::Secret = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "unrelated-secret", "namespace": "default"}, "stringData": {"k": "v"}
    }))
    .expect("secret");
    d.put_secret(secret);
}

pub const NODE_SETUP: [&str; 1] = ["08-node-create"];
pub const POD_SETUP: [&str; 6] = [
    "19-admin-create-configmap",
    "20-admin-create-secret",
    "22-admin-create-pod-sleep-1",
    "23-admin-create-pod-sleep-2",
    "24-admin-create-pod-app-with-refs",
    "25-admin-create-pod-on-other-node",
];
