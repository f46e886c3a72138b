//! The kubelet HTTP API of a real agent, called by real clients: curl with client
//! certificates, Python's prometheus_client parser and websocket-client, and a SPDY/3.1
//! client built here from the protocol's spec. Real containers (as root).

use support::{agent, kubelet_api, spdy_client};

use std::time::{Duration, Instant};

use agent::{container, need_root};
use kubelet_api::{cgroup_file, container_id, curl, parse_prometheus, sample, Api, PYTHON};

fn running(p: &serde_json::Value, name: &str) -> bool {
    !container(p, name)["state"]["running"].is_null()
}

#[test]
fn logs_with_every_option_and_client_certificates() {
    if !need_root() {
        return;
    }
    let api = Api::start("api-logs");
    api.agent.write_manifest(
        "talk.yaml",
        r#"apiVersion: v1
kind: Pod
metadata: {name: talk}
spec:
  restartPolicy: Always
  containers:
  - name: main
    image: docker.io/library/busybox:demo
    command: ["sh", "-c", "echo run $(cat /proc/uptime); for i in 1 2 3 4 5; do echo line $i; echo warn $i >&2; done; sleep 2; exit 1"]
  - name: short
    image: docker.io/library/busybox:demo
    command: ["sh", "-c", "sleep 3; for i in 1 2 3; do echo tick $i; sleep 1; done; sleep 1000000"]
"#,
    );
    api.agent
        .wait_pod("talk", "main restarted", Duration::from_secs(60), |p| {
            container(p, "main")["restartCount"].as_i64().unwrap_or(0) >= 1 && running(p, "main")
        });
    let pod = "talk-node-1";
    let logs = |q: &str| api.get(&format!("/containerLogs/default/{pod}/main{q}"));

    // Authentication: no certificate, or one from another CA, is 401 everywhere but
    // /healthz; a wrong method is 405 and an unknown path 404.
    let url = api.url(&format!("/containerLogs/default/{pod}/main"));
    assert_eq!(curl(&url, None, &[]).0, 401);
    assert_eq!(curl(&url, Some(&api.stranger), &[]).0, 401);
    assert_eq!(curl(&api.url("/pods"), Some(&api.stranger), &[]).0, 401);
    assert_eq!(curl(&api.url("/healthz"), None, &[]), (200, "ok".into()));
    let plain = format!("http://127.0.0.1:{}/healthz", api.healthz_port);
    assert_eq!(curl(&plain, None, &[]), (200, "ok".into()));
    let ro = |p: &str| {
        curl(
            &format!("http://127.0.0.1:{}{p}", api.read_only_port),
            None,
            &[],
        )
        .0
    };
    assert_eq!(ro("/pods"), 200);
    assert_eq!(ro(&format!("/containerLogs/default/{pod}/main")), 404);
    assert_eq!(curl(&url, Some(&api.client), &["-X", "DELETE"]).0, 405);
    assert_eq!(api.get("/nothing-here").0, 404);

    // /configz: the running configuration as the kubelet shows it, read-only port off
    // limits; /runningpods/: the pods with their running containers.
    let (code, body) = api.get("/configz");
    assert_eq!(code, 200, "{body}");
    let cfg: serde_json::Value = serde_json::from_str(&body).expect("configz json");
    let k = &cfg["kubeletconfig"];
    assert_eq!(k["kind"], "KubeletConfiguration", "{body}");
    assert_eq!(k["port"], api.port, "{body}");
    assert_eq!(k["readOnlyPort"], api.read_only_port, "{body}");
    assert_eq!(k["syncFrequency"], "5s", "{body}");
    assert_eq!(ro("/configz"), 404);
    let (code, body) = api.get("/runningpods/");
    assert_eq!(code, 200, "{body}");
    let list: serde_json::Value = serde_json::from_str(&body).expect("runningpods json");
    assert_eq!(list["kind"], "PodList", "{body}");
    let talk = list["items"]
        .as_array()
        .and_then(|items| items.iter().find(|p| p["metadata"]["name"] == pod))
        .unwrap_or_else(|| panic!("{pod} in /runningpods/: {body}"));
    let names: Vec<&str> = talk["spec"]["containers"]
        .as_array()
        .map(|cs| cs.iter().filter_map(|c| c["name"].as_str()).collect())
        .unwrap_or_default();
    assert!(names.contains(&"short"), "{body}");

    // Unknown pod and container: 404 with the kubelet's words; bad values: 400.
    let (code, body) = api.get("/containerLogs/default/nope/main");
    assert_eq!((code, body.trim()), (404, "pod \"nope\" does not exist"));
    let (code, body) = api.get(&format!("/containerLogs/default/{pod}/nope"));
    assert_eq!(code, 404);
    assert!(body.contains("container \"nope\" not found"), "{body}");
    assert_eq!(logs("?tailLines=lots").0, 400);
    assert_eq!(logs("?sinceTime=yesterday").0, 400);
    assert_eq!(logs("?tailLines=-3").0, 422);

    // Every option: stdout and stderr together, tail, limit, timestamps, since.
    let (code, all) = logs("");
    assert_eq!(code, 200);
    assert!(
        all.contains("line 1\n") && all.contains("warn 5\n"),
        "{all}"
    );
    let (_, tail) = logs("?tailLines=2");
    assert_eq!(tail.lines().count(), 2, "{tail}");
    assert!(all.ends_with(&tail), "tail {tail:?} of {all:?}");
    let (_, limited) = logs("?limitBytes=7");
    assert_eq!(limited.len(), 7);
    assert!(all.starts_with(&limited));
    let (_, stamped) = logs("?timestamps=true&tailLines=1");
    let (ts, rest) = stamped.split_once(' ').expect("timestamp");
    assert!(ts.starts_with("20") && ts.ends_with('Z'), "{stamped}");
    assert_eq!(
        format!("{rest}"),
        tail.lines()
            .last()
            .map(|l| format!("{l}\n"))
            .unwrap_or_default()
    );
    let (_, future) = logs("?sinceTime=2099-01-01T00:00:00Z");
    assert_eq!(future, "");
    let (_, recent) = logs("?sinceSeconds=3600");
    assert_eq!(recent, all);

    // previous: the run before the restart, which the agent keeps.
    let (code, prev) = logs("?previous=true");
    assert_eq!(code, 200, "{prev}");
    assert!(
        prev.starts_with("run ") && prev.contains("line 5\n"),
        "{prev}"
    );
    let first_run = prev.lines().next().unwrap_or("");
    assert!(
        !all.contains(first_run),
        "current run repeats the previous one"
    );
    let (code, _) = api.get(&format!("/containerLogs/default/{pod}/short?previous=true"));
    assert_eq!(code, 400, "short never restarted");

    // follow: streams while the container writes, and ends when it exits (main exits
    // 2 s after its lines).
    let started = Instant::now();
    let (code, followed) = logs("?follow=true");
    assert_eq!(code, 200);
    assert!(followed.contains("line 5\n"), "{followed}");
    assert!(
        started.elapsed() < Duration::from_secs(30),
        "follow did not end with the container"
    );
    api.agent
        .wait_pod("talk", "short ticking", Duration::from_secs(30), |p| {
            running(p, "short")
        });
    let (_, ticks) = api.get(&format!(
        "/containerLogs/default/{pod}/short?follow=true&limitBytes=21"
    ));
    assert_eq!(ticks, "tick 1\ntick 2\ntick 3\n");
}

#[test]
fn metrics_and_stats_of_a_busy_and_a_fat_container() {
    if !need_root() {
        return;
    }
    let api = Api::start("api-metrics");
    api.agent.write_manifest(
        "load.yaml",
        r#"apiVersion: v1
kind: Pod
metadata: {name: load}
spec:
  containers:
  - name: burn
    image: docker.io/library/busybox:demo
    command: ["sh", "-c", "while :; do :; done"]
  - name: hold
    image: docker.io/library/busybox:demo
    command: ["sh", "-c", "head -c 50000000 /dev/zero > /dev/shm/hold; echo held; sleep 1000000"]
"#,
    );
    let p = api
        .agent
        .wait_pod("load", "running", Duration::from_secs(60), |p| {
            running(p, "burn") && running(p, "hold")
        });
    api.agent
        .wait_until("hold to fill its memory", Duration::from_secs(30), |_| {
            api.get("/containerLogs/default/load-node-1/hold")
                .1
                .contains("held")
        });
    // Let burn run a while.
    let hold_id = container_id(&p, "hold");
    let burn_id = container_id(&p, "burn");
    let cg = api.agent.root.clone();
    let cpu_file = cgroup_file(&cg, &burn_id, "cpuacct", "cpuacct.usage");
    let read_cpu = || -> u64 {
        if cpu_file.exists() {
            std::fs::read_to_string(&cpu_file)
                .ok()
                .and_then(|t| t.trim().parse().ok())
                .unwrap_or(0)
        } else {
            let f = cgroup_file(&cg, &burn_id, "", "cpu.stat");
            std::fs::read_to_string(f)
                .ok()
                .and_then(|t| {
                    t.lines()
                        .find_map(|l| l.strip_prefix("usage_usec ")?.trim().parse::<u64>().ok())
                })
                .unwrap_or(0)
                * 1000
        }
    };
    api.agent.wait_until(
        "burn to use a second of CPU",
        Duration::from_secs(60),
        |_| read_cpu() > 1_000_000_000,
    );

    // /metrics/resource: what metrics-server reads, parsed by a real parser.
    let (code, text) = api.get("/metrics/resource");
    assert_eq!(code, 200);
    let s = parse_prometheus(&text);
    let c = |n: &str, c: &str| {
        sample(
            &s,
            n,
            &[
                ("container", c),
                ("pod", "load-node-1"),
                ("namespace", "default"),
            ],
        )
    };
    assert!(
        c("container_cpu_usage_seconds_total", "burn").unwrap_or(0.0) >= 1.0,
        "{text}"
    );
    let hold_ws = c("container_memory_working_set_bytes", "hold").unwrap_or(0.0);
    assert!(
        (45e6..200e6).contains(&hold_ws),
        "hold working set {hold_ws}\n{text}"
    );
    assert!(c("container_start_time_seconds", "burn").unwrap_or(0.0) > 1.7e9);
    let pod_cpu =
        sample(&s, "pod_cpu_usage_seconds_total", &[("pod", "load-node-1")]).unwrap_or(0.0);
    assert!(pod_cpu >= c("container_cpu_usage_seconds_total", "burn").unwrap_or(0.0) - 0.001);
    assert!(
        sample(
            &s,
            "pod_memory_working_set_bytes",
            &[("pod", "load-node-1")]
        )
        .unwrap_or(0.0)
            >= hold_ws
    );
    assert!(sample(&s, "node_cpu_usage_seconds_total", &[]).unwrap_or(0.0) > 1.0);
    assert!(sample(&s, "node_memory_working_set_bytes", &[]).unwrap_or(0.0) > hold_ws);
    assert_eq!(sample(&s, "resource_scrape_error", &[]), Some(0.0));

    // /metrics: holdfast's own.
    let (code, own) = api.get("/metrics");
    assert_eq!(code, 200);
    let s = parse_prometheus(&own);
    assert_eq!(
        sample(&s, "holdfast_pods", &[("phase", "Running")]),
        Some(1.0),
        "{own}"
    );
    assert!(
        sample(&s, "holdfast_pod_sync_duration_seconds_count", &[]).unwrap_or(0.0) >= 1.0,
        "{own}"
    );
    assert!(sample(&s, "holdfast_kubelet_api_requests_total", &[]).unwrap_or(0.0) >= 3.0);
    assert_eq!(
        sample(&s, "holdfast_container_restarts", &[("container", "burn")]),
        Some(0.0)
    );

    // /stats/summary against the cgroup files, read around the request.
    let before = read_cpu();
    let (code, body) = api.get("/stats/summary");
    let after = read_cpu();
    assert_eq!(code, 200);
    let v: serde_json::Value = serde_json::from_str(&body).expect("summary json");
    assert_eq!(v["node"]["nodeName"], "node-1");
    assert!(v["node"]["fs"]["capacityBytes"].as_u64().unwrap_or(0) > 0);
    assert!(v["node"]["memory"]["workingSetBytes"].as_u64().unwrap_or(0) > 0);
    let pod = v["pods"]
        .as_array()
        .and_then(|ps| ps.iter().find(|p| p["podRef"]["name"] == "load-node-1"))
        .expect("pod in summary");
    let ct = |n: &str| {
        pod["containers"]
            .as_array()
            .and_then(|cs| cs.iter().find(|c| c["name"] == n))
            .cloned()
            .unwrap_or_default()
    };
    let burn = ct("burn");
    let ns = burn["cpu"]["usageCoreNanoSeconds"].as_u64().unwrap_or(0);
    assert!(ns >= before && ns <= after, "{before} <= {ns} <= {after}");
    // Busy-looping: well above a tenth of a core even on a shared machine.
    assert!(
        burn["cpu"]["usageNanoCores"].as_u64().unwrap_or(0) > 100_000_000,
        "{burn}"
    );
    let hold = ct("hold");
    let usage_file = cgroup_file(&cg, &hold_id, "memory", "memory.usage_in_bytes");
    let usage_file = if usage_file.exists() {
        usage_file
    } else {
        cgroup_file(&cg, &hold_id, "", "memory.current")
    };
    let usage: f64 = std::fs::read_to_string(&usage_file)
        .ok()
        .and_then(|t| t.trim().parse().ok())
        .unwrap_or(0.0);
    let reported = hold["memory"]["usageBytes"].as_f64().unwrap_or(0.0);
    assert!(
        (reported - usage).abs() <= usage * 0.05,
        "{reported} vs {usage}"
    );
    let ws = hold["memory"]["workingSetBytes"].as_f64().unwrap_or(0.0);
    assert!(ws >= 45e6 && ws <= reported, "{hold}");
    assert!(hold["rootfs"]["usedBytes"].as_u64().is_some());
    assert!(hold["logs"]["usedBytes"].as_u64().unwrap_or(0) > 0);
    assert!(pod["cpu"]["usageCoreNanoSeconds"].as_u64().unwrap_or(0) >= ns);
}

#[test]
fn exec_over_websocket_and_spdy() {
    if !need_root() {
        return;
    }
    let api = Api::start("api-exec");
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
    let path = "/exec/default/shell-node-1/main";

    // WebSocket (v5.channel.k8s.io) with Python's websocket-client: stdin, stdout,
    // stderr, the end of stdin, and the exit code in the error channel's status.
    let script = r#"
import json, ssl, sys, websocket
url, cert, key, mode = sys.argv[1:5]
ws = websocket.create_connection(url, sslopt={"cert_reqs": ssl.CERT_NONE, "certfile": cert, "keyfile": key},
                                 subprotocols=["v5.channel.k8s.io"], timeout=30)
out = {"1": b"", "2": b"", "3": b"", "protocol": ws.getsubprotocol()}
def pump(until):
    while True:
        op, data = ws.recv_data(control_frame=False)
        if op == websocket.ABNF.OPCODE_CLOSE or not data:
            return False
        ch = str(data[0])
        out[ch] = out.get(ch, b"") + data[1:]
        if until and until in out["1"]:
            return True
if mode == "pipe":
    ws.send_binary(b"\x00hello from stdin\n")
    ws.send_binary(b"\xff\x00")
    pump(None)
else:
    ws.send_binary(b"\x04" + json.dumps({"Width": 100, "Height": 30}).encode())
    ws.send_binary(b"\x00a\n")
    pump(b"30 100")
    ws.send_binary(b"\x04" + json.dumps({"Width": 120, "Height": 40}).encode())
    ws.send_binary(b"\x00b\n")
    pump(b"40 120")
    pump(None)
print(json.dumps({k: (v.decode() if isinstance(v, bytes) else v) for k, v in out.items()}))
"#;
    let ws = |query: &str, mode: &str| -> serde_json::Value {
        let url = format!("wss://127.0.0.1:{}{path}?{query}", api.port);
        let out = std::process::Command::new(PYTHON)
            .args(["-c", script, &url])
            .arg(&api.client.cert)
            .arg(&api.client.key)
            .arg(mode)
            .output()
            .expect("python3");
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice(&out.stdout).expect("client output")
    };
    let cmd = "command=sh&command=-c&command=cat%3B%20echo%20oops%20%3E%262%3B%20exit%203";
    let r = ws(&format!("{cmd}&stdin=true&stdout=true&stderr=true"), "pipe");
    assert_eq!(r["protocol"], "v5.channel.k8s.io");
    assert_eq!(r["1"], "hello from stdin\n");
    assert_eq!(r["2"], "oops\n");
    let status: serde_json::Value =
        serde_json::from_str(r["3"].as_str().unwrap_or("")).expect("status");
    assert_eq!(status["status"], "Failure");
    assert_eq!(status["reason"], "NonZeroExitCode");
    assert_eq!(status["details"]["causes"][0]["reason"], "ExitCode");
    assert_eq!(status["details"]["causes"][0]["message"], "3");

    // A terminal, resized twice: stty reads the sizes the client sent.
    let tty =
        "command=sh&command=-c&command=read%20x%3B%20stty%20size%3B%20read%20y%3B%20stty%20size";
    let r = ws(&format!("{tty}&stdin=true&stdout=true&tty=true"), "tty");
    let out = r["1"].as_str().unwrap_or("");
    assert!(out.contains("30 100") && out.contains("40 120"), "{out:?}");
    let status: serde_json::Value =
        serde_json::from_str(r["3"].as_str().unwrap_or("")).expect("status");
    assert_eq!(status["status"], "Success");

    // SPDY/3.1 (what the apiserver uses), with a client written from the spec.
    let q = format!("{cmd}&stdin=1&stdout=1&stderr=1");
    let r = spdy_client::exec(
        api.port,
        &format!("{path}?{q}"),
        &api.client,
        Some(b"through spdy\n"),
    );
    assert_eq!(r.protocol, "v4.channel.k8s.io");
    assert_eq!(String::from_utf8_lossy(&r.stdout), "through spdy\n");
    assert_eq!(String::from_utf8_lossy(&r.stderr), "oops\n");
    let status: serde_json::Value = serde_json::from_slice(&r.error).expect("status");
    assert_eq!(status["details"]["causes"][0]["message"], "3", "{status}");
    let ok = spdy_client::exec(
        api.port,
        &format!("{path}?command=echo&command=fine&stdout=1"),
        &api.client,
        None,
    );
    assert_eq!(String::from_utf8_lossy(&ok.stdout), "fine\n");
    let status: serde_json::Value = serde_json::from_slice(&ok.error).expect("status");
    assert_eq!(status["status"], "Success");

    // A command that does not exist: an error status, not a hang.
    let bad = spdy_client::exec(
        api.port,
        &format!("{path}?command=/no/such/binary&stdout=1"),
        &api.client,
        None,
    );
    let status: serde_json::Value = serde_json::from_slice(&bad.error).expect("status");
    assert_eq!(status["status"], "Failure", "{status}");

    // Unknown container: 404; no streams asked for: 400; without a certificate: 401.
    let (code, _) = api.get("/exec/default/shell-node-1/nope?command=ls&stdout=1");
    assert_eq!(code, 404);
    let (code, _) = api.get(&format!("{path}?command=ls"));
    assert_eq!(code, 400);
    assert_eq!(
        curl(&api.url(&format!("{path}?command=ls&stdout=1")), None, &[]).0,
        401
    );
}
