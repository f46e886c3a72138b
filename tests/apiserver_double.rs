//! The kube-apiserver double against the recorded real server
//! (`tests/fixtures/kube-apiserver/`): each test replays a recorded request through a raw
//! TLS client and compares status code, reason, details and the shape of the body.

#[path = "support/apiserver/mod.rs"]
mod apiserver;

use std::path::PathBuf;

use apiserver::{ApiServerDouble, Identity, Options, RawClient, RawResponse};

/// One recorded exchange.
struct Fixture {
    method: String,
    target: String,
    content_type: Option<String>,
    body: Vec<u8>,
    code: u16,
    reason: String,
    response_headers: Vec<(String, String)>,
    response_body: Vec<u8>,
}

fn fixture_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/kube-apiserver")
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

fn fixture(name: &str) -> Fixture {
    let dir = fixture_dir();
    let req = std::fs::read(dir.join(format!("{name}.request.txt"))).expect("request fixture");
    let start = req
        .split(|&b| b == b'\n')
        .take_while(|l| l.starts_with(b"#"))
        .map(|l| l.len() + 1)
        .sum::<usize>();
    let (head, body) = split_head(&req[start..]);
    let mut first = head[0].split(' ');
    let method = first.next().expect("method").to_string();
    let target = first.next().expect("target").to_string();
    let req_headers = headers(&head[1..]);
    let content_type = req_headers
        .iter()
        .find(|(n, _)| n.eq_ignore_ascii_case("content-type"))
        .map(|(_, v)| v.clone());
    let resp = std::fs::read(dir.join(format!("{name}.response.txt"))).expect("response fixture");
    let (rhead, rbody) = split_head(&resp);
    let mut status = rhead[0].splitn(3, ' ');
    status.next();
    let code = status.next().and_then(|c| c.parse().ok()).expect("code");
    let reason = status.next().unwrap_or("").to_string();
    Fixture {
        method,
        target,
        content_type,
        body,
        code,
        reason,
        response_headers: headers(&rhead[1..]),
        response_body: rbody,
    }
}

fn replay(client: &mut RawClient, f: &Fixture) -> RawResponse {
    client
        .request(&f.method, &f.target, f.content_type.as_deref(), &f.body)
        .expect("request")
}

#[test]
fn version_matches_00_for_nodes_and_04_for_anonymous() {
    let d = ApiServerDouble::start(Options::default());
    for (name, id) in [
        ("00-get-version", Some(Identity::Node("edge-node-1"))),
        ("04-anonymous-get-version", None),
    ] {
        let f = fixture(name);
        let r = replay(&mut d.raw(id), &f);
        assert_eq!((r.code, r.reason.as_str()), (f.code, f.reason.as_str()));
        assert_eq!(
            String::from_utf8_lossy(&r.body),
            String::from_utf8_lossy(&f.response_body)
        );
        assert_eq!(r.header("content-length"), Some("390"));
        for h in ["Content-Type", "Cache-Control"] {
            let want = f
                .response_headers
                .iter()
                .find(|(n, _)| n == h)
                .map(|(_, v)| v.as_str());
            assert_eq!(r.header(h), want, "{name} header {h}");
        }
        assert!(r.header("audit-id").is_some_and(|a| a.len() == 36));
    }
}
