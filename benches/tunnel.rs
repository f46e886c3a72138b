//! The konnectivity tunnel against the upstream agent, run on demand as root:
//! `cargo bench --bench tunnel`.
//!
//! One cluster (the real apiserver with its egress selector, the real `proxy-server`), one
//! node: first holdfast carries the tunnel itself, then holdfast runs with the tunnel off
//! and the upstream Go `proxy-agent` carries it beside it. For each: `kubectl
//! port-forward` throughput both ways (32 MiB, best of 3), `kubectl exec -- true` round
//! trip (median of 10), and the memory (PSS) of what carries the tunnel. The node's
//! InternalIP is on a link of its own here, its kubelet API listening there, where the
//! upstream agent (which dials the address it is asked for) reaches it.
//!
//! Prints a table and writes `target/bench/tunnel.json`.

use support::agent::{free_port, need_root};
use support::control_plane;
use support::konnectivity::{cluster_at, exchange, konnectivity, port_forward, Cluster};

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const BYTES: usize = 32 << 20;

fn pss_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/smaps_rollup"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("Pss:"))
                .and_then(|v| v.split_whitespace().next()?.parse().ok())
        })
        .unwrap_or(0)
}

struct Figures {
    down_mbps: f64,
    up_mbps: f64,
    exec_ms: f64,
}

/// Port-forward both ways and exec round trips through whatever carries the tunnel.
fn measure(c: &Cluster, blob_port: u16, sink_port: u16) -> Figures {
    let mb = BYTES as f64 / 1e6;
    let mut down = 0f64;
    let (mut pf, local) = port_forward(&c.cp, "bench", blob_port);
    for _ in 0..3 {
        let t0 = Instant::now();
        let got = exchange(local, b"GET /blob HTTP/1.0\r\n\r\n");
        let secs = t0.elapsed().as_secs_f64();
        assert!(got.len() > BYTES, "download: {} bytes", got.len());
        down = down.max(mb / secs);
    }
    let _ = pf.kill();
    let _ = pf.wait();
    let upload = vec![0x5au8; BYTES];
    let mut up = 0f64;
    let (mut pf, local) = port_forward(&c.cp, "bench", sink_port);
    for _ in 0..3 {
        let t0 = Instant::now();
        let got = exchange(local, &upload);
        let secs = t0.elapsed().as_secs_f64();
        assert!(
            String::from_utf8_lossy(&got).starts_with(&BYTES.to_string()),
            "upload: {}",
            String::from_utf8_lossy(&got)
        );
        up = up.max(mb / secs);
    }
    let _ = pf.kill();
    let _ = pf.wait();
    let mut rtts: Vec<f64> = (0..10)
        .map(|_| {
            let t0 = Instant::now();
            c.cp.kubectl_ok(&["exec", "bench", "--", "true"]);
            t0.elapsed().as_secs_f64() * 1e3
        })
        .collect();
    rtts.sort_by(f64::total_cmp);
    Figures {
        down_mbps: down,
        up_mbps: up,
        exec_ms: rtts[rtts.len() / 2],
    }
}

fn upstream_agent(c: &Cluster) -> Child {
    let (cert, key) = c.client_cert_files();
    let log = std::fs::File::create(c.scratch.0.join("proxy-agent.log")).expect("log");
    Command::new(konnectivity().join("proxy-agent"))
        .args([
            format!("--ca-cert={}", c.cp.ca().display()),
            format!("--agent-cert={}", cert.display()),
            format!("--agent-key={}", key.display()),
            "--proxy-server-host=127.0.0.1".into(),
            format!("--proxy-server-port={}", c.relay.port),
            format!("--agent-id={}", c.node),
            format!("--agent-identifiers=host={}&ipv4={}", c.node, c.node_ip),
            format!("--admin-server-port={}", free_port()),
            format!("--health-server-port={}", free_port()),
        ])
        .stdin(Stdio::null())
        .stdout(log.try_clone().expect("log fd"))
        .stderr(log)
        .spawn()
        .expect("spawn proxy-agent")
}

fn main() {
    if !need_root() {
        return;
    }
    let addr = control_plane::link::NodeAddress::new(0);
    let mut c = cluster_at("tunnel-bench", "tunnel-bench-node", 1, &addr.ip, true);
    c.agent.start();
    control_plane::cluster::wait_node(&c.cp, &c.agent, &c.node, false);
    let (blob_port, sink_port) = (free_port(), free_port());
    c.pod(
        "bench",
        &format!(
            "echo ready; mkdir -p /www; head -c {BYTES} /dev/zero > /www/blob; \
             httpd -p 127.0.0.1:{blob_port} -h /www; \
             while true; do nc -l -p {sink_port} -e wc -c; done"
        ),
    );
    c.logs_within("bench", "ready", Duration::from_secs(30));
    let pid = c.agent.pid().expect("agent pid");
    let ours = measure(&c, blob_port, sink_port);
    let ours_pss = pss_kib(pid);

    // The same node with the tunnel off, the upstream agent beside it.
    c.agent.stop();
    c.agent.write_config(&c.kubelet_keys.clone());
    c.agent.start();
    let mut go = upstream_agent(&c);
    c.logs_within("bench", "ready", Duration::from_secs(60));
    let theirs = measure(&c, blob_port, sink_port);
    let go_pss = pss_kib(go.id());
    let plain_pss = c.agent.pid().map_or(0, pss_kib);
    let _ = go.kill();
    let _ = go.wait();
    let _ = c.cp.kubectl(&["delete", "pod", "bench", "--wait=false"]);
    c.agent.stop();
    drop(addr);

    let extra = ours_pss as i64 - plain_pss as i64;
    println!("{:<34} {:>14} {:>14}", "", "holdfast", "proxy-agent");
    println!(
        "{:<34} {:>14.1} {:>14.1}",
        "port-forward down (MB/s)", ours.down_mbps, theirs.down_mbps
    );
    println!(
        "{:<34} {:>14.1} {:>14.1}",
        "port-forward up (MB/s)", ours.up_mbps, theirs.up_mbps
    );
    println!(
        "{:<34} {:>14.1} {:>14.1}",
        "exec round trip, median (ms)", ours.exec_ms, theirs.exec_ms
    );
    println!(
        "{:<34} {:>14} {:>14}",
        "PSS of the tunnel (KiB)",
        format!("{extra:+}"),
        go_pss
    );
    println!("(holdfast: {ours_pss} KiB with the tunnel, {plain_pss} KiB without, after the same transfers)");
    let json = serde_json::json!({
        "bytes": BYTES,
        "holdfast": {"down_mbps": ours.down_mbps, "up_mbps": ours.up_mbps, "exec_ms": ours.exec_ms,
                     "pss_kib": ours_pss, "pss_without_tunnel_kib": plain_pss, "tunnel_pss_kib": extra},
        "proxy_agent": {"down_mbps": theirs.down_mbps, "up_mbps": theirs.up_mbps, "exec_ms": theirs.exec_ms,
                        "pss_kib": go_pss},
    });
    let dir = support::repo_root().join("target/bench");
    let _ = std::fs::create_dir_all(&dir);
    std::fs::write(dir.join("tunnel.json"), format!("{json:#}\n")).expect("write tunnel.json");
}
