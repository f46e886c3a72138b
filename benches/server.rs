//! The kubelet API, run on demand as root: `cargo bench --bench server`.
//!
//! - `containerLogs?follow` of a container writing 64 MiB as fast as it can: MB/s
//!   through curl, and the agent's RSS before, at its highest while streaming, after.
//! - `/stats/summary` latency with 50 running pods (p50, p95 of 40 requests).
//! - Memory per open exec stream: 16 SPDY execs of `sleep` held open at once; the
//!   agent's RSS growth per stream and each `holdfast shim exec` process's RSS.
//! - Memory per open attach stream: as many SPDY attaches as a container takes (8)
//!   held open to a `cat` with stdin, each seeing a line typed by one of them; the
//!   agent's and the container's shim's RSS growth per stream.
//!
//! Prints a table and writes `target/bench/server.json`.

use support::{agent, kubelet_api, spdy_client};

use std::process::Command;
use std::time::{Duration, Instant};

use kubelet_api::Api;
use spdy_client::{Event, Session};

const LOG_BYTES: u64 = 64 << 20;
const STATS_PODS: usize = 50;
const EXECS: usize = 16;
const ATTACHES: usize = holdfast::runtime::attach::MAX_CLIENTS;

fn rss_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("VmRSS:"))
                .and_then(|v| v.split_whitespace().next()?.parse().ok())
        })
        .unwrap_or(0)
}

fn pids_named(arg: &str) -> Vec<u32> {
    let mut out = Vec::new();
    for e in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let cmd = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
        if String::from_utf8_lossy(&cmd)
            .replace('\0', " ")
            .contains(arg)
        {
            out.push(pid);
        }
    }
    out
}

fn pct(v: &mut [f64], p: f64) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[((v.len() as f64 - 1.0) * p).round() as usize]
}

fn main() {
    if !nix::unistd::geteuid().is_root() {
        eprintln!("server bench: needs root (it runs containers)");
        std::process::exit(2);
    }
    let api = Api::start("bench-server");
    let agent_pid = api.agent.pid().expect("agent pid");

    // 1. Following a fast writer's log.
    api.agent.write_manifest(
        "writer.yaml",
        &format!(
            r#"apiVersion: v1
kind: Pod
metadata: {{name: writer}}
spec:
  restartPolicy: Never
  containers:
  - name: main
    image: docker.io/library/busybox:demo
    command: ["sh", "-c", "sleep 2; yes 0123456789abcdefghijklmnopqrstuvwxyz0123456789abcdefghijklmnopqrstuvwxyz0123456789abcdefghijklm | head -c {LOG_BYTES}"]
"#
        ),
    );
    api.agent
        .wait_pod("writer", "running", Duration::from_secs(60), |p| {
            !agent::container(p, "main")["state"]["running"].is_null()
        });
    let rss_before = rss_kib(agent_pid);
    let url = api.url("/containerLogs/default/writer-node-1/main?follow=true");
    let mut curl = Command::new("curl")
        .args([
            "-sk",
            "-o",
            "/dev/null",
            "-w",
            "%{size_download} %{time_total}",
        ])
        .arg("--cert")
        .arg(&api.client.cert)
        .arg("--key")
        .arg(&api.client.key)
        .arg(&url)
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("curl");
    let mut rss_peak = rss_before;
    while curl.try_wait().ok().flatten().is_none() {
        rss_peak = rss_peak.max(rss_kib(agent_pid));
        std::thread::sleep(Duration::from_millis(100));
    }
    let out = curl.wait_with_output().expect("curl");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let mut it = text.split_whitespace();
    let bytes: f64 = it.next().and_then(|v| v.parse().ok()).unwrap_or(0.0);
    let secs: f64 = it.next().and_then(|v| v.parse().ok()).unwrap_or(1.0);
    // The follow started 2 s before the first byte (the writer sleeps first).
    let mbps = bytes / (secs - 2.0).max(0.001) / 1e6;
    let rss_after = rss_kib(agent_pid);
    api.agent.remove_manifest("writer.yaml");

    // 2. /stats/summary with 50 pods.
    for i in 0..STATS_PODS {
        api.agent.write_manifest(
            &format!("s{i}.yaml"),
            &format!(
                "apiVersion: v1\nkind: Pod\nmetadata: {{name: s{i}}}\nspec:\n  containers:\n  - name: main\n    image: docker.io/library/busybox:demo\n    command: [\"sleep\", \"1000000\"]\n"
            ),
        );
    }
    api.agent
        .wait_until("50 pods running", Duration::from_secs(300), |a| {
            a.pods()
                .iter()
                .filter(|p| !agent::container(p, "main")["state"]["running"].is_null())
                .count()
                >= STATS_PODS
        });
    let _ = api.get("/stats/summary");
    let mut lat = Vec::new();
    for _ in 0..40 {
        let t = Instant::now();
        let (code, body) = api.get("/stats/summary");
        assert_eq!(code, 200, "{body}");
        lat.push(t.elapsed().as_secs_f64() * 1000.0);
    }
    let (p50, p95) = (pct(&mut lat, 0.5), pct(&mut lat, 0.95));

    // 3. Open exec streams.
    let rss_idle = rss_kib(agent_pid);
    let port = api.port;
    let mut threads = Vec::new();
    for i in 0..EXECS {
        let cert = api
            .ca
            .client(&format!("exec{i}"), "bench", &["system:masters"]);
        threads.push(std::thread::spawn(move || {
            spdy_client::exec(
                port,
                "/exec/default/s0-node-1/main?command=sleep&command=8&stdout=1",
                &cert,
                None,
            )
        }));
    }
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut open = 0;
    while Instant::now() < deadline {
        open = pids_named("shim exec").len();
        if open >= EXECS {
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    std::thread::sleep(Duration::from_millis(500));
    let rss_streams = rss_kib(agent_pid);
    let shim_rss: Vec<u64> = pids_named("shim exec")
        .iter()
        .map(|p| rss_kib(*p))
        .collect();
    let shim_avg = shim_rss.iter().sum::<u64>() / shim_rss.len().max(1) as u64;
    for t in threads {
        let _ = t.join();
    }
    // `open` counts every process with that command line, libcontainer's short-lived
    // helpers among them; the streams are the execs started.
    let per_stream = rss_streams.saturating_sub(rss_idle) as f64 / EXECS as f64;

    // 4. Open attach streams.
    api.agent.write_manifest(
        "attach.yaml",
        "apiVersion: v1\nkind: Pod\nmetadata: {name: a}\nspec:\n  containers:\n  - name: main\n    image: docker.io/library/busybox:demo\n    stdin: true\n    command: [\"cat\"]\n",
    );
    let p = api
        .agent
        .wait_pod("a", "running", Duration::from_secs(60), |p| {
            !agent::container(p, "main")["state"]["running"].is_null()
        });
    let id = kubelet_api::container_id(&p, "main");
    let shim = pids_named("shim run")
        .into_iter()
        .find(|pid| {
            std::fs::read(format!("/proc/{pid}/cmdline"))
                .is_ok_and(|c| String::from_utf8_lossy(&c).contains(&id))
        })
        .expect("the container's shim");
    std::thread::sleep(Duration::from_millis(500));
    let (agent_idle, shim_idle) = (rss_kib(agent_pid), rss_kib(shim));
    let mut sessions = Vec::new();
    for _ in 0..ATTACHES {
        let mut s = Session::open(
            port,
            "/attach/default/a-node-1/main?stdin=1&stdout=1",
            &api.client,
            &["v4.channel.k8s.io"],
        );
        s.stream(&[("streamtype", "error")]);
        let stdin = s.stream(&[("streamtype", "stdin")]);
        let stdout = s.stream(&[("streamtype", "stdout")]);
        sessions.push((s, stdin, stdout));
    }
    // Every client is attached once a line typed by the last reaches them all.
    std::thread::sleep(Duration::from_millis(500));
    if let Some((s, stdin, _)) = sessions.last_mut() {
        s.send(*stdin, b"ping\n", false);
    }
    for (s, _, stdout) in sessions.iter_mut() {
        let mut seen = Vec::new();
        while !seen.ends_with(b"ping\n") {
            match s.next() {
                Some(Event::Data { stream, data, .. }) if stream == *stdout => seen.extend(data),
                Some(_) => {}
                None => panic!("attach ended"),
            }
        }
    }
    let (agent_attached, shim_attached) = (rss_kib(agent_pid), rss_kib(shim));
    drop(sessions);
    let attach_agent = agent_attached.saturating_sub(agent_idle) as f64 / ATTACHES as f64;
    let attach_shim = shim_attached.saturating_sub(shim_idle) as f64 / ATTACHES as f64;

    println!("kubelet API (holdfast {})", env!("CARGO_PKG_VERSION"));
    println!("| measure | value |");
    println!("| --- | --- |");
    println!(
        "| containerLogs?follow, {} MiB | {mbps:.1} MB/s ({bytes:.0} bytes) |",
        LOG_BYTES >> 20
    );
    println!(
        "| agent RSS before / peak / after follow | {rss_before} / {rss_peak} / {rss_after} KiB |"
    );
    println!("| /stats/summary, {STATS_PODS} pods | p50 {p50:.1} ms, p95 {p95:.1} ms |");
    println!("| open exec streams | {EXECS} ({open} `shim exec` processes seen) |");
    println!("| agent RSS per open exec stream | {per_stream:.0} KiB |");
    println!("| `holdfast shim exec` RSS each | {shim_avg} KiB |");
    println!("| open attach streams | {ATTACHES} on one container |");
    println!(
        "| RSS per open attach stream | agent {attach_agent:.0} KiB, shim {attach_shim:.0} KiB (shim {shim_idle} KiB before) |"
    );
    let json = serde_json::json!({
        "follow_mb_per_s": mbps, "follow_bytes": bytes,
        "agent_rss_kib": {"before": rss_before, "peak": rss_peak, "after": rss_after},
        "summary_ms": {"p50": p50, "p95": p95, "pods": STATS_PODS},
        "exec": {"open": open, "agent_rss_per_stream_kib": per_stream, "shim_exec_rss_kib": shim_avg},
        "attach": {"open": ATTACHES, "agent_rss_per_stream_kib": attach_agent,
                   "shim_rss_per_stream_kib": attach_shim, "shim_rss_idle_kib": shim_idle},
    });
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("target/bench");
    let _ = std::fs::create_dir_all(&dir);
    let _ = std::fs::write(dir.join("server.json"), json.to_string());
}
