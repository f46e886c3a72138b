//! The kubelet API's attach, port-forward and terminal streams of a real agent, with
//! real clients: Python's websocket-client and a SPDY/3.1 client built here from the
//! protocol's spec. Real containers (as root).

use support::{agent, kubelet_api, spdy_client};

use std::time::{Duration, Instant};

use agent::{container, free_port, need_root};
use kubelet_api::{curl, status, ws_session, Api};
use serde_json::json;
use spdy_client::{Event, Session};

fn running(p: &serde_json::Value, name: &str) -> bool {
    !container(p, name)["state"]["running"].is_null()
}

fn exit_code(status: &serde_json::Value) -> &str {
    status["details"]["causes"][0]["message"]
        .as_str()
        .unwrap_or("")
}

#[test]
fn attach_to_stdin_output_terminal_and_exit() {
    if !need_root() {
        return;
    }
    let api = Api::start("api-attach");
    api.agent.write_manifest(
        "talk.yaml",
        r#"apiVersion: v1
kind: Pod
metadata: {name: talk}
spec:
  restartPolicy: Never
  containers:
  - name: echo
    image: docker.io/library/busybox:demo
    stdin: true
    command: ["sh", "-c", "while read line; do echo \"got $line\"; echo \"err $line\" >&2; done"]
  - name: once
    image: docker.io/library/busybox:demo
    stdin: true
    stdinOnce: true
    command: ["sh", "-c", "while read line; do echo \"got $line\"; done; echo bye; exit 7"]
  - name: term
    image: docker.io/library/busybox:demo
    stdin: true
    tty: true
    command: ["sh", "-c", "trap 'echo winch $(stty size)' WINCH; while :; do sleep 0.1; done"]
"#,
    );
    api.agent
        .wait_pod("talk", "running", Duration::from_secs(60), |p| {
            running(p, "echo") && running(p, "once") && running(p, "term")
        });
    let at = |c: &str| format!("/attach/default/talk-node-1/{c}");

    // WebSocket (v5.channel.k8s.io): input reaches the container's stdin, its stdout
    // and stderr come back on their channels.
    let r = ws_session(
        &api,
        &format!("{}?stdin=true&stdout=true&stderr=true", at("echo")),
        "v5.channel.k8s.io",
        json!([
            ["send", 0, "hello\n"],
            ["until", 1, "got hello\n"],
            ["until", 2, "err hello\n"]
        ]),
    );
    assert_eq!(r["protocol"], "v5.channel.k8s.io");
    assert_eq!(r["channels"]["1"], "got hello\n", "{r}");
    assert_eq!(r["channels"]["2"], "err hello\n", "{r}");

    // SPDY, after that client left: stdin is still open (no stdinOnce), and a new
    // client sees only what is written after it attached.
    let mut s = Session::open(
        api.port,
        &format!("{}?stdin=1&stdout=1", at("echo")),
        &api.client,
        &["v4.channel.k8s.io"],
    );
    let _error = s.stream(&[("streamtype", "error")]);
    let stdin = s.stream(&[("streamtype", "stdin")]);
    let stdout = s.stream(&[("streamtype", "stdout")]);
    s.send(stdin, b"again\n", false);
    let mut seen = Vec::new();
    while !seen.ends_with(b"got again\n") {
        match s.next() {
            Some(Event::Data { stream, data, .. }) if stream == stdout => seen.extend(data),
            Some(_) => {}
            None => panic!("attach ended early: {}", String::from_utf8_lossy(&seen)),
        }
    }
    assert_eq!(String::from_utf8_lossy(&seen), "got again\n");
    drop(s);

    // stdinOnce: the end of the client's input closes the container's stdin; the
    // container's exit ends the attach with its exit code, as kubectl reads it.
    let r = spdy_client::exec_streams(
        api.port,
        &format!("{}?stdin=1&stdout=1", at("once")),
        &api.client,
        &["error", "stdin", "stdout"],
        Some(b"last\n"),
    );
    assert_eq!(String::from_utf8_lossy(&r.stdout), "got last\nbye\n");
    let st = status(&String::from_utf8_lossy(&r.error));
    assert_eq!(st["reason"], "NonZeroExitCode", "{st}");
    assert_eq!(exit_code(&st), "7", "{st}");
    let p = api
        .agent
        .wait_pod("talk", "once exited", Duration::from_secs(30), |p| {
            !container(p, "once")["state"]["terminated"].is_null()
        });
    assert_eq!(container(&p, "once")["state"]["terminated"]["exitCode"], 7);
    let (code, body) = api.get(&format!("{}?stdout=1", at("once")));
    assert_eq!(code, 400, "{body}");

    // A terminal (tty in the spec): resizes reach the container's shell as SIGWINCH.
    let r = ws_session(
        &api,
        &format!("{}?stdin=true&stdout=true&tty=true", at("term")),
        "v5.channel.k8s.io",
        json!([
            ["resize", 100, 30],
            ["until", 1, "winch 30 100"],
            ["resize", 120, 40],
            ["until", 1, "winch 40 120"]
        ]),
    );
    let out = r["channels"]["1"].as_str().unwrap_or("");
    assert!(
        out.contains("winch 30 100") && out.contains("winch 40 120"),
        "{out:?}"
    );

    // What the container wrote is in its CRI log too.
    let (_, log) = api.get("/containerLogs/default/talk-node-1/echo");
    assert_eq!(log, "got hello\nerr hello\ngot again\nerr again\n");

    // Unknown container 404, without a certificate 401.
    assert_eq!(api.get(&format!("{}?stdout=1", at("nope"))).0, 404);
    assert_eq!(
        curl(&api.url(&format!("{}?stdout=1", at("echo"))), None, &[]).0,
        401
    );
    let mut api = api;
    api.agent.reset();
    api.agent.assert_clean();
}

#[test]
fn exec_with_a_controlling_terminal() {
    if !need_root() {
        return;
    }
    let api = Api::start("api-tty");
    api.agent.write_manifest(
        "shell.yaml",
        r#"apiVersion: v1
kind: Pod
metadata: {name: shell}
spec:
  containers:
  - name: main
    image: docker.io/library/busybox:demo
    command: ["sleep", "1000000"]
"#,
    );
    api.agent
        .wait_pod("shell", "running", Duration::from_secs(60), |p| {
            running(p, "main")
        });
    // /dev/tty opens only for a process with a controlling terminal; a resize sends
    // SIGWINCH to the terminal's foreground group; ^C sends it SIGINT.
    let script = "trap 'echo winch $(stty size)' WINCH; echo ctty > /dev/tty; echo ready; \
                  while :; do sleep 0.1; done";
    let cmd: String = ["sh", "-c", script]
        .iter()
        .map(|a| format!("command={}&", encode(a)))
        .collect();
    let r = ws_session(
        &api,
        &format!("/exec/default/shell-node-1/main?{cmd}stdin=true&stdout=true&tty=true"),
        "v5.channel.k8s.io",
        json!([
            ["resize", 100, 30],
            ["until", 1, "ready"],
            ["resize", 120, 40],
            ["until", 1, "winch 40 120"],
            ["send", 0, "\u{3}"],
            ["drain"]
        ]),
    );
    let out = r["channels"]["1"].as_str().unwrap_or("");
    assert!(out.contains("ctty\r\n"), "no controlling terminal: {out:?}");
    assert!(out.contains("winch 40 120"), "{out:?}");
    let st = status(r["channels"]["3"].as_str().unwrap_or(""));
    assert_eq!(
        exit_code(&st),
        "130",
        "^C did not interrupt the shell: {st}"
    );

    // A command that writes much before it reads its input: neither side waits for
    // the other (input is queued while its output is relayed).
    let cmd = "command=sh&command=-c&command=head%20-c%20300000%20%2Fdev%2Fzero%20%7C%20tr%20%27%5C0%27%20o%3B%20wc%20-c";
    let r = ws_session(
        &api,
        &format!("/exec/default/shell-node-1/main?{cmd}&stdin=true&stdout=true"),
        "v5.channel.k8s.io",
        json!([
            ["send", 0, "x".repeat(1000), 300],
            ["send", 255, "\u{0}"],
            ["drain"]
        ]),
    );
    let out = r["channels"]["1"].as_str().unwrap_or("");
    assert_eq!(out.matches('o').count(), 300_000);
    assert_eq!(
        out.trim_start_matches('o').trim(),
        "300000",
        "{}",
        &out[out.len().saturating_sub(100)..]
    );

    // A client that goes away ends its exec, and the command in the container with it
    // (with a terminal and without).
    for tty in ["true", "false"] {
        let cmd = "command=sh&command=-c&command=echo%20started%3B%20exec%20sleep%20998";
        let r = ws_session(
            &api,
            &format!("/exec/default/shell-node-1/main?{cmd}&stdout=true&tty={tty}"),
            "v5.channel.k8s.io",
            json!([["until", 1, "started"]]),
        );
        assert!(r["channels"]["1"]
            .as_str()
            .unwrap_or("")
            .contains("started"));
        api.agent
            .wait_until("the command to end", Duration::from_secs(15), |_| {
                sleeping("998").is_empty()
            });
    }
    let mut api = api;
    api.agent.reset();
    api.agent.assert_clean();
}

/// Processes running `sleep <arg>`.
fn sleeping(arg: &str) -> Vec<u32> {
    let want = format!("sleep\0{arg}\0").into_bytes();
    std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| std::fs::read(format!("/proc/{pid}/cmdline")).is_ok_and(|c| c == want))
        .collect()
}

/// Percent-encodes a query value.
fn encode(s: &str) -> String {
    s.bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() || b"-_.~".contains(&b) {
                (b as char).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect()
}

/// One connection through a port-forward session: sends `request` on a new data
/// stream and reads both streams to their end; returns (data, error text).
fn forward_once(s: &mut Session, request_id: &str, port: u16, request: &[u8]) -> (String, String) {
    let p = port.to_string();
    let error = s.stream(&[
        ("streamtype", "error"),
        ("port", &p),
        ("requestid", request_id),
    ]);
    let data = s.stream(&[
        ("streamtype", "data"),
        ("port", &p),
        ("requestid", request_id),
    ]);
    // As kubectl does: the error stream is only read.
    s.send(error, &[], true);
    s.send(data, request, false);
    let (mut d, mut e) = (Vec::new(), Vec::new());
    let (mut d_end, mut e_end) = (false, false);
    while !(d_end && e_end) {
        match s.next() {
            Some(Event::Data {
                stream,
                data: bytes,
                fin,
            }) => {
                if stream == data {
                    d.extend(bytes);
                    d_end |= fin;
                } else if stream == error {
                    e.extend(bytes);
                    e_end |= fin;
                }
            }
            Some(Event::Reset(id)) if id == data || id == error => panic!("stream {id} reset"),
            Some(_) => {}
            None => panic!("session ended: {}", String::from_utf8_lossy(&d)),
        }
    }
    (
        String::from_utf8_lossy(&d).into_owned(),
        String::from_utf8_lossy(&e).into_owned(),
    )
}

const GET: &[u8] = b"GET / HTTP/1.0\r\n\r\n";

#[test]
fn port_forward_over_spdy_and_websocket() {
    if !need_root() {
        return;
    }
    let api = Api::start("api-forward");
    let (host_port, pod_port) = (free_port(), free_port());
    let httpd = |text: &str, port: u16| {
        format!(
            "mkdir -p /tmp/www && echo {text} > /tmp/www/index.html && exec httpd -f -p 127.0.0.1:{port} -h /tmp/www"
        )
    };
    api.agent.write_manifest(
        "web.yaml",
        &format!(
            r#"apiVersion: v1
kind: Pod
metadata: {{name: web}}
spec:
  hostNetwork: true
  containers:
  - name: httpd
    image: docker.io/library/busybox:demo
    command: ["sh", "-c", "{}"]
---
apiVersion: v1
kind: Pod
metadata: {{name: inner}}
spec:
  containers:
  - name: httpd
    image: docker.io/library/busybox:demo
    command: ["sh", "-c", "{}"]
"#,
            httpd("hello from the host network", host_port),
            httpd("hello from the pod network", pod_port)
        ),
    );
    for pod in ["web", "inner"] {
        api.agent
            .wait_pod(pod, "running", Duration::from_secs(60), |p| {
                running(p, "httpd")
            });
    }
    let open = |pod: &str| {
        Session::open(
            api.port,
            &format!("/portForward/default/{pod}-node-1"),
            &api.client,
            &["portforward.k8s.io"],
        )
    };
    // httpd is up once a forwarded request gets an answer (bounded wait).
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut s = open("web");
    assert_eq!(s.protocol, "portforward.k8s.io");
    let mut n = 0;
    loop {
        let (data, error) = forward_once(&mut s, &n.to_string(), host_port, GET);
        n += 1;
        if data.contains("hello from the host network") {
            assert_eq!(error, "");
            break;
        }
        assert!(Instant::now() < deadline, "httpd never answered: {error}");
        std::thread::sleep(Duration::from_millis(200));
    }

    // Two connections at once on one session, told apart by requestID.
    let p = host_port.to_string();
    let mut ids = Vec::new();
    for rid in ["a", "b"] {
        let e = s.stream(&[("streamtype", "error"), ("port", &p), ("requestid", rid)]);
        let d = s.stream(&[("streamtype", "data"), ("port", &p), ("requestid", rid)]);
        ids.push((e, d));
    }
    for (_, d) in &ids {
        s.send(*d, GET, false);
    }
    let mut answers = std::collections::HashMap::<u32, Vec<u8>>::new();
    let mut ended = 0;
    while ended < 4 {
        match s.next() {
            Some(Event::Data { stream, data, fin }) => {
                answers.entry(stream).or_default().extend(data);
                ended += usize::from(fin);
            }
            Some(_) => {}
            None => panic!("session ended"),
        }
    }
    for (e, d) in &ids {
        let body = String::from_utf8_lossy(answers.get(d).map_or(&[][..], |v| v));
        assert!(body.contains("hello from the host network"), "{body}");
        assert!(answers.get(e).is_none_or(|v| v.is_empty()));
    }

    // Nothing listens: the kubelet's error on the error stream, and the data ends.
    let closed = free_port();
    let (data, error) = forward_once(&mut s, "c", closed, GET);
    assert_eq!(data, "");
    assert!(
        error.starts_with(&format!(
            "error forwarding port {closed} to pod web-node-1_default"
        )),
        "{error}"
    );
    // A stream without a valid port is refused.
    let bad = s.stream(&[("streamtype", "data"), ("port", "0"), ("requestid", "d")]);
    loop {
        match s.next() {
            Some(Event::Reset(id)) if id == bad => break,
            Some(_) => {}
            None => panic!("no RST_STREAM for a bad port"),
        }
    }
    drop(s);

    // A pod without hostNetwork: the connection is made from inside the network
    // namespace of its container.
    let mut s = open("inner");
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let (data, error) = forward_once(&mut s, &n.to_string(), pod_port, GET);
        n += 1;
        if data.contains("hello from the pod network") {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "inner httpd never answered: {error}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    drop(s);

    // WebSocket: each channel starts with the port, little-endian, then the data.
    let r = ws_session(
        &api,
        &format!("/portForward/default/web-node-1?port={host_port}"),
        "v4.channel.k8s.io",
        json!([
            ["frames", 2],
            ["send", 0, "GET / HTTP/1.0\r\n\r\n"],
            ["drain"]
        ]),
    );
    let le = format!("{:04x}", host_port.swap_bytes());
    assert_eq!(r["frames"][0], json!([0, le]), "{r}");
    assert_eq!(r["frames"][1], json!([1, le]), "{r}");
    let body = r["channels"]["0"].as_str().unwrap_or("");
    assert!(body.contains("hello from the host network"), "{r}");
    assert_eq!(r["closed"], true, "the session ends with the connection");

    // Bad requests: no port for WebSocket 400, unknown pod 404, no certificate 401.
    let ws_headers = [
        "-H",
        "Connection: Upgrade",
        "-H",
        "Upgrade: websocket",
        "-H",
        "Sec-WebSocket-Version: 13",
        "-H",
        "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==",
    ];
    let url = api.url("/portForward/default/web-node-1");
    assert_eq!(curl(&url, Some(&api.client), &ws_headers).0, 400);
    let nope = api.url("/portForward/default/nope?port=80");
    assert_eq!(curl(&nope, Some(&api.client), &ws_headers).0, 404);
    assert_eq!(curl(&url, None, &ws_headers).0, 401);
    let mut api = api;
    api.agent.reset();
    api.agent.assert_clean();
}
