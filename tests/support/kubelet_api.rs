//! A real agent with its kubelet API on 127.0.0.1 (ports picked free), a client CA,
//! a client certificate from it and one from another CA, and `curl` to call it.

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::Command;

use super::agent::{free_port, Agent};
use super::pki::{Issued, Pki};

pub struct Api {
    pub agent: Agent,
    pub port: u16,
    pub healthz_port: u16,
    pub read_only_port: u16,
    pub ca: Pki,
    pub client: Issued,
    pub stranger: Issued,
}

impl Api {
    pub fn start(name: &str) -> Api {
        let mut agent = Agent::new(name);
        let ca = Pki::new(&agent.dir.join("ca"));
        let other = Pki::new(&agent.dir.join("other-ca"));
        let client = ca.client(
            "apiserver-client",
            "kube-apiserver-kubelet-client",
            &["system:masters"],
        );
        let stranger = other.client("stranger", "mallory", &["system:masters"]);
        let (port, healthz_port, read_only_port) = (agent.port, agent.healthz_port, free_port());
        agent.write_config(&format!(
            "readOnlyPort: {read_only_port}\n\
             authentication:\n  x509:\n    clientCAFile: {}\n",
            ca.ca.display()
        ));
        agent.start();
        let api = Api {
            agent,
            port,
            healthz_port,
            read_only_port,
            ca,
            client,
            stranger,
        };
        api.agent.wait_until(
            "the kubelet API to listen",
            std::time::Duration::from_secs(30),
            |_| api.get("/healthz").0 == 200,
        );
        api
    }

    pub fn url(&self, path: &str) -> String {
        format!("https://127.0.0.1:{}{path}", self.port)
    }

    /// GET with the valid client certificate: (status, body).
    pub fn get(&self, path: &str) -> (u16, String) {
        curl(&self.url(path), Some(&self.client), &[])
    }

    pub fn serving_cert(&self) -> PathBuf {
        self.agent.root.join("pki/kubelet.crt")
    }
}

/// `curl` (status, body); `-k`: the serving certificate is the agent's self-signed one.
pub fn curl(url: &str, cert: Option<&Issued>, extra: &[&str]) -> (u16, String) {
    let mut c = Command::new("curl");
    c.args(["-sk", "--max-time", "60", "-w", "\n%{http_code}"]);
    if let Some(i) = cert {
        c.arg("--cert").arg(&i.cert).arg("--key").arg(&i.key);
    }
    c.args(extra).arg(url);
    let out = c.output().expect("run curl");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let (body, code) = text.rsplit_once('\n').unwrap_or(("", &text));
    (code.trim().parse().unwrap_or(0), body.to_owned())
}

/// The Debian python3 (with python3-prometheus-client and python3-websocket).
pub const PYTHON: &str = "/usr/bin/python3";

/// Parses Prometheus text with prometheus_client's parser; returns every sample as
/// (name, labels, value), or panics with the parser's complaint.
pub fn parse_prometheus(
    text: &str,
) -> Vec<(String, serde_json::Map<String, serde_json::Value>, f64)> {
    let script = r#"
import json, sys
from prometheus_client.parser import text_string_to_metric_families
out = []
for fam in text_string_to_metric_families(sys.stdin.read()):
    for s in fam.samples:
        out.append([s.name, s.labels, s.value])
print(json.dumps(out))
"#;
    let mut child = Command::new(PYTHON)
        .args(["-c", script])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("python3");
    {
        use std::io::Write;
        let mut stdin = child.stdin.take().expect("stdin");
        stdin.write_all(text.as_bytes()).expect("write");
    }
    let out = child.wait_with_output().expect("python3");
    assert!(
        out.status.success(),
        "prometheus_client rejected the text: {}\n{text}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: Vec<(String, serde_json::Map<String, serde_json::Value>, f64)> =
        serde_json::from_slice(&out.stdout).expect("parser output");
    v
}

/// The value of a sample with these labels.
pub fn sample(
    samples: &[(String, serde_json::Map<String, serde_json::Value>, f64)],
    name: &str,
    labels: &[(&str, &str)],
) -> Option<f64> {
    samples
        .iter()
        .find(|(n, l, _)| {
            n == name
                && labels
                    .iter()
                    .all(|(k, v)| l.get(*k).and_then(|x| x.as_str()) == Some(*v))
        })
        .map(|(_, _, v)| *v)
}

/// The container's runtime id from a pod's status (`libcontainer://<id>`).
pub fn container_id(pod: &serde_json::Value, name: &str) -> String {
    super::agent::container(pod, name)["containerID"]
        .as_str()
        .and_then(|s| s.rsplit("://").next())
        .unwrap_or("")
        .to_owned()
}

/// A cgroup v1 or v2 file of a container.
pub fn cgroup_file(root: &Path, id: &str, v1_controller: &str, file: &str) -> PathBuf {
    // Where the runtime made it, as the container's shim config records it (under its
    // pod's cgroup).
    let config = std::fs::read_to_string(root.join("boot/containers").join(id).join("shim.json"))
        .expect("the container's shim.json");
    let config: serde_json::Value = serde_json::from_str(&config).expect("shim.json parses");
    let rel = config["cgroups_path"]
        .as_str()
        .expect("cgroups_path in shim.json")
        .trim_start_matches('/')
        .to_string();
    let base = Path::new("/sys/fs/cgroup");
    if base.join("cgroup.controllers").exists() {
        base.join(rel).join(file)
    } else {
        base.join(v1_controller).join(rel).join(file)
    }
}

/// A WebSocket session with the kubelet API through Python's websocket-client:
/// connects to `path` (with the valid client certificate), offering `protocol` (none
/// if empty), and plays `actions` (JSON list):
/// `["send", channel, text, times]` (text as latin-1 bytes; times optional),
/// `["resize", width, height]`,
/// `["until", channel, text]` (read until the channel holds text), `["frames", n]`
/// (read n messages), `["drain"]` (read until the server closes).
/// Returns `{"protocol", "channels": {"<n>": text}, "frames": [[channel, hex]],
/// "closed"}`.
pub fn ws_session(
    api: &Api,
    path: &str,
    protocol: &str,
    actions: serde_json::Value,
) -> serde_json::Value {
    let script = r#"
import json, ssl, sys, websocket
url, cert, key, proto, actions = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4], json.loads(sys.argv[5])
ws = websocket.create_connection(url, sslopt={"cert_reqs": ssl.CERT_NONE, "certfile": cert, "keyfile": key},
                                 subprotocols=[proto] if proto else None, timeout=30)
chans, frames, closed = {}, [], False
def recv():
    global closed
    if closed:
        return False
    op, data = ws.recv_data(control_frame=False)
    if op == websocket.ABNF.OPCODE_CLOSE or not data:
        closed = True
        return False
    chans[data[0]] = chans.get(data[0], b"") + data[1:]
    frames.append([data[0], data[1:].hex()])
    return True
for a in actions:
    if a[0] == "send":
        for _ in range(a[3] if len(a) > 3 else 1):
            ws.send_binary(bytes([a[1]]) + a[2].encode("latin-1"))
    elif a[0] == "resize":
        ws.send_binary(b"\x04" + json.dumps({"Width": a[1], "Height": a[2]}).encode())
    elif a[0] == "until":
        while a[2].encode("latin-1") not in chans.get(a[1], b"") and recv():
            pass
    elif a[0] == "frames":
        for _ in range(a[1]):
            recv()
    elif a[0] == "drain":
        while recv():
            pass
print(json.dumps({"protocol": ws.getsubprotocol(), "closed": closed, "frames": frames,
                  "channels": {str(k): v.decode("latin-1") for k, v in chans.items()}}))
"#;
    let url = format!("wss://127.0.0.1:{}{path}", api.port);
    let out = Command::new(PYTHON)
        .args(["-c", script, &url])
        .arg(&api.client.cert)
        .arg(&api.client.key)
        .arg(protocol)
        .arg(actions.to_string())
        .output()
        .expect("python3");
    assert!(
        out.status.success(),
        "websocket session on {path}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("client output")
}

/// The status JSON a stream ended with (the error channel's text).
pub fn status(text: &str) -> serde_json::Value {
    serde_json::from_str(text).unwrap_or_else(|e| panic!("status {text:?}: {e}"))
}
