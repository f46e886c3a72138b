//! `exec` over every WebSocket protocol the kubelet speaks, through a real
//! kube-apiserver v1.36 to real containers, as root, with Python's websocket-client:
//! `v5`/`v4.channel.k8s.io` (the status as JSON), the older `v3`, `v2` and unversioned
//! `channel.k8s.io` (only a failure's message, as text), and their `base64.` forms.
//! And a container's log read over a WebSocket (`binary.k8s.io`, `base64.binary.k8s.io`).

use std::time::Duration;

use serde_json::Value;
use support::agent::need_root;
use support::kubelet_api::PYTHON;

const NODE: &str = "ws-node-1";

const CLIENT: &str = r#"
import base64, json, ssl, sys, websocket
url, cert, key, ca, protocol = sys.argv[1:6]
ws = websocket.create_connection(url, sslopt={"ca_certs": ca, "certfile": cert, "keyfile": key},
                                 subprotocols=[protocol], timeout=30)
out = {"protocol": ws.getsubprotocol()}
while True:
    op, data = ws.recv_data(control_frame=False)
    if op == websocket.ABNF.OPCODE_CLOSE or not data:
        break
    if op == websocket.ABNF.OPCODE_TEXT:
        ch, data = chr(data[0]), base64.b64decode(data[1:])
    else:
        ch, data = str(data[0]), data[1:]
    out[ch] = out.get(ch, "") + data.decode()
print(json.dumps(out))
"#;

/// Percent-encodes a query value.
fn escape(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'a'..=b'z' | b'A'..=b'Z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// Pod `ws`, whose container says `container is alive` and sleeps, running.
fn start_pod(cp: &support::control_plane::ControlPlane, a: &support::agent::Agent) {
    cp.apply(&format!(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: ws\nspec:\n  nodeName: {NODE}\n  \
         automountServiceAccountToken: false\n  terminationGracePeriodSeconds: 1\n  \
         containers:\n    - name: main\n      image: docker.io/library/busybox:demo\n      \
         command: [\"sh\", \"-c\", \"echo container is alive; exec sleep 3600\"]\n"
    ));
    let log = || a.agent_log();
    cp.wait_for("pod ws running", Duration::from_secs(60), log, |cp| {
        cp.get("pod/ws", None)
            .filter(|p| p["status"]["containerStatuses"][0]["state"]["running"].is_object())
    });
    cp.logs_showing(&["ws"], "container is alive");
}

/// Runs the Python `client` on `url` with the admin's certificate, asking for
/// `protocol`; what it prints, as JSON.
fn run_client(
    client: &str,
    cp: &support::control_plane::ControlPlane,
    url: &str,
    protocol: &str,
) -> Value {
    let (cert, key) = cp.admin_cert();
    let out = std::process::Command::new(PYTHON)
        .args(["-c", client, url])
        .arg(&cert)
        .arg(&key)
        .arg(cp.ca())
        .arg(protocol)
        .output()
        .expect("python3");
    assert!(
        out.status.success(),
        "{protocol}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("client output")
}

#[test]
fn exec_over_each_websocket_protocol_through_the_apiserver() {
    if !need_root() {
        return;
    }
    let (cp, mut a) = support::control_plane::cluster::bare_node("websocket-exec", NODE);
    start_pod(&cp, &a);
    let exec = |protocol: &str, script: &str| -> Value {
        let url = format!(
            "{}/api/v1/namespaces/default/pods/ws/exec?command=sh&command=-c&command={}\
             &container=main&stdout=1&stderr=1",
            cp.url.replace("https://", "wss://"),
            escape(script)
        );
        run_client(CLIENT, &cp, &url, protocol)
    };
    for protocol in [
        "v5.channel.k8s.io",
        "v4.channel.k8s.io",
        "v4.base64.channel.k8s.io",
        "v3.channel.k8s.io",
        "v2.base64.channel.k8s.io",
        "channel.k8s.io",
        "base64.channel.k8s.io",
    ] {
        let ok = exec(protocol, "echo remote execution test; echo to-stderr >&2");
        assert_eq!(ok["protocol"], protocol, "{ok}");
        assert_eq!(ok["1"], "remote execution test\n", "{protocol}: {ok}");
        assert_eq!(ok["2"], "to-stderr\n", "{protocol}: {ok}");
        let failed = exec(protocol, "exit 3");
        let error = failed["3"].as_str().unwrap_or_default();
        if protocol.starts_with("v5.") || protocol.starts_with("v4.") {
            let ok_status: Value =
                serde_json::from_str(ok["3"].as_str().unwrap_or("")).expect("json");
            assert_eq!(ok_status["status"], "Success", "{protocol}: {ok}");
            let status: Value = serde_json::from_str(error).expect("status json");
            assert_eq!(status["reason"], "NonZeroExitCode", "{protocol}: {failed}");
        } else {
            // Nothing on the error channel for a success; a failure's message, as text.
            assert!(ok.get("3").is_none(), "{protocol}: {ok}");
            assert!(
                !error.is_empty() && !error.starts_with('{'),
                "{protocol}: {failed}"
            );
            assert!(error.contains('3'), "{protocol}: {failed}");
        }
    }
    let _ = cp.kubectl(&["delete", "pod", "ws", "--wait=false"]);
    a.stop();
}

const LOG_CLIENT: &str = r#"
import base64, json, ssl, sys, websocket
url, cert, key, ca, protocol = sys.argv[1:6]
ws = websocket.create_connection(url, sslopt={"ca_certs": ca, "certfile": cert, "keyfile": key},
                                 subprotocols=[protocol], timeout=30)
out = b""
while True:
    op, data = ws.recv_data(control_frame=False)
    if op == websocket.ABNF.OPCODE_CLOSE:
        break
    out += base64.b64decode(data) if op == websocket.ABNF.OPCODE_TEXT else data
print(json.dumps({"protocol": ws.getsubprotocol(), "log": out.decode()}))
"#;

/// `GET .../log` upgraded to a WebSocket, as the conformance suite and web consoles
/// read logs: the apiserver copies the kubelet's response into messages, and drops
/// the last data if it comes in one read with the response's end. Read again and
/// again, each time whole.
#[test]
fn logs_over_a_websocket_through_the_apiserver() {
    if !need_root() {
        return;
    }
    let (cp, mut a) = support::control_plane::cluster::bare_node("websocket-logs", NODE);
    start_pod(&cp, &a);
    let url = format!(
        "{}/api/v1/namespaces/default/pods/ws/log?container=main",
        cp.url.replace("https://", "wss://")
    );
    for protocol in ["binary.k8s.io", "base64.binary.k8s.io"] {
        for _ in 0..10 {
            let got = run_client(LOG_CLIENT, &cp, &url, protocol);
            assert_eq!(got["protocol"], protocol, "{got}");
            assert_eq!(got["log"], "container is alive\n", "{protocol}: {got}");
        }
    }
    let _ = cp.kubectl(&["delete", "pod", "ws", "--wait=false"]);
    a.stop();
}
