//! The konnectivity tunnel against the upstream agent, run on demand as root:
//! `cargo bench --bench tunnel`.
//!
//! One cluster (the real apiserver with its egress selector, the real `proxy-server`), one
//! node running one pod, and two ways of carrying its tunnel, taken in turns
//! (`ROUNDS` each, so that a drift of the machine falls on both): holdfast carrying the
//! tunnel itself, and holdfast with the tunnel off beside the upstream Go
//! `proxy-agent`. Each turn starts holdfast afresh (it adopts the running pod), waits
//! until `kubectl logs` comes through, and measures `kubectl port-forward` throughput
//! both ways (32 MiB, best of 3), `kubectl exec -- true` round trips, and the memory
//! (PSS) of holdfast and of the upstream agent: idle before the traffic, at its peak
//! during each part of it (sampled every 50 ms), and idle again `IDLE` after it. The
//! tunnel's cost is holdfast's PSS with the tunnel less its PSS without, at the same
//! point of the same turn order. The node's InternalIP is on a link of its own here, its kubelet API
//! listening there, where the upstream agent (which dials the address it is asked for)
//! reaches it. Both agents dial the proxy server's agent port directly, as a node
//! beside its control plane would.
//!
//! Prints a table and writes `target/bench/tunnel.json`, and holdfast's
//! `/proc/<pid>/smaps` at the idle point after the traffic of each turn to
//! `target/bench/tunnel/` (where the tunnel's memory lies).

mod common;

use support::agent::{free_port, need_root};
use support::control_plane;
use support::konnectivity::{cluster_at, exchange, konnectivity, port_forward, Cluster};

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

const BYTES: usize = 32 << 20;
/// Turns of each way of carrying the tunnel.
const ROUNDS: usize = 3;
/// `kubectl exec` round trips per turn.
const EXECS: usize = 10;
/// How long the node is left idle before a memory reading.
const IDLE: Duration = Duration::from_secs(3);
/// Between samples of the peak.
const SAMPLE: Duration = Duration::from_millis(50);

/// Memory in KiB: PSS, and its anonymous part (heap, stacks); the rest is file pages
/// (the binary's code and read-only data, shared libraries).
#[derive(Clone, Copy, Debug, Default)]
struct Mem {
    pss: u64,
    anon: u64,
}

impl Mem {
    fn of(pid: u32) -> Mem {
        let r = common::rollup(pid);
        Mem {
            pss: r.pss,
            anon: r.pss_anon,
        }
    }

    fn file(&self) -> u64 {
        self.pss.saturating_sub(self.anon)
    }

    fn json(&self) -> serde_json::Value {
        serde_json::json!({"pss_kib": self.pss, "anon_kib": self.anon, "file_kib": self.file()})
    }
}

/// The highest PSS of each of some processes, sampled on a thread of its own until
/// [`Peak::end`].
struct Peak {
    stop: Arc<AtomicBool>,
    thread: std::thread::JoinHandle<Vec<Mem>>,
}

impl Peak {
    fn start(pids: Vec<u32>) -> Peak {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let thread = std::thread::spawn(move || {
            let mut peak = vec![Mem::default(); pids.len()];
            while !flag.load(Ordering::Relaxed) {
                for (p, pid) in peak.iter_mut().zip(&pids) {
                    let now = Mem::of(*pid);
                    if now.pss > p.pss {
                        *p = now;
                    }
                }
                std::thread::sleep(SAMPLE);
            }
            peak
        });
        Peak { stop, thread }
    }

    fn end(self) -> Vec<Mem> {
        self.stop.store(true, Ordering::Relaxed);
        self.thread.join().expect("peak sampler")
    }
}

/// What one turn measured of whatever carried the tunnel.
#[derive(Default)]
struct Turn {
    down_mbps: f64,
    up_mbps: f64,
    exec_ms: Vec<f64>,
    /// holdfast's memory: idle before the traffic, at its peak, idle after it.
    before: Mem,
    peak: Mem,
    after: Mem,
    /// The upstream agent's, likewise (none when holdfast carries the tunnel).
    go_before: Mem,
    go_peak: Mem,
    go_after: Mem,
    /// holdfast's peak in each part of the traffic: download, upload, exec.
    phases: [Mem; 3],
}

impl Turn {
    /// Records the peaks of one part of the traffic (holdfast's first, then the
    /// upstream agent's if it ran).
    fn peaks(&mut self, phase: usize, peaks: Vec<Mem>) {
        let high = |a: Mem, b: Mem| if b.pss > a.pss { b } else { a };
        self.phases[phase] = peaks[0];
        self.peak = high(self.peak, peaks[0]);
        self.go_peak = high(self.go_peak, peaks.get(1).copied().unwrap_or_default());
    }
}

/// Port-forward both ways and exec round trips through whatever carries the tunnel.
fn traffic(c: &Cluster, (blob_port, sink_port): (u16, u16), pids: &[u32], t: &mut Turn) {
    let mb = BYTES as f64 / 1e6;
    let peak = Peak::start(pids.to_vec());
    let (mut pf, local) = port_forward(&c.cp, "bench", blob_port);
    for _ in 0..3 {
        let t0 = Instant::now();
        let got = exchange(local, b"GET /blob HTTP/1.0\r\n\r\n");
        let secs = t0.elapsed().as_secs_f64();
        assert!(got.len() > BYTES, "download: {} bytes", got.len());
        t.down_mbps = t.down_mbps.max(mb / secs);
    }
    let _ = pf.kill();
    let _ = pf.wait();
    t.peaks(0, peak.end());
    let upload = vec![0x5au8; BYTES];
    let peak = Peak::start(pids.to_vec());
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
        t.up_mbps = t.up_mbps.max(mb / secs);
    }
    let _ = pf.kill();
    let _ = pf.wait();
    t.peaks(1, peak.end());
    let peak = Peak::start(pids.to_vec());
    t.exec_ms = (0..EXECS)
        .map(|_| {
            let t0 = Instant::now();
            c.cp.kubectl_ok(&["exec", "bench", "--", "true"]);
            t0.elapsed().as_secs_f64() * 1e3
        })
        .collect();
    t.peaks(2, peak.end());
}

/// The upstream agent's process; killed and waited for when dropped.
struct Upstream(Child);

impl Drop for Upstream {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn upstream_agent(c: &Cluster) -> Upstream {
    let (cert, key) = c.client_cert_files();
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(c.scratch.0.join("proxy-agent.log"))
        .expect("log");
    Command::new(konnectivity().join("proxy-agent"))
        .args([
            format!("--ca-cert={}", c.cp.ca().display()),
            format!("--agent-cert={}", cert.display()),
            format!("--agent-key={}", key.display()),
            "--proxy-server-host=127.0.0.1".into(),
            format!("--proxy-server-port={}", c.servers[0].agent_port),
            format!("--agent-id={}", c.node),
            format!("--agent-identifiers=host={}&ipv4={}", c.node, c.node_ip),
            format!("--admin-server-port={}", free_port()),
            format!("--health-server-port={}", free_port()),
        ])
        .stdin(Stdio::null())
        .stdout(log.try_clone().expect("log fd"))
        .stderr(log)
        .spawn()
        .map(Upstream)
        .expect("spawn proxy-agent")
}

/// One turn: holdfast started afresh with the tunnel (`ours`) or without it and the
/// upstream agent beside it; the traffic, and the memory around it.
fn turn(c: &mut Cluster, ours: bool, ports: (u16, u16), smaps: &Path) -> Turn {
    c.agent.stop();
    let tunnel = format!(
        "  tunnel:\n    servers: [\"127.0.0.1:{}\"]\n    caFile: {}\n",
        c.servers[0].agent_port,
        c.cp.ca().display()
    );
    let keys = if ours {
        format!("{tunnel}{}", c.kubelet_keys)
    } else {
        c.kubelet_keys.clone()
    };
    c.agent.write_config(&keys);
    c.agent.start();
    let go = (!ours).then(|| upstream_agent(c));
    c.logs_within("bench", "ready", Duration::from_secs(60));
    let pid = c.agent.pid().expect("agent pid");
    let go_pid = go.as_ref().map(|g| g.0.id());
    let mem = |t: &mut Turn, at: fn(&mut Turn) -> (&mut Mem, &mut Mem)| {
        let (hf, up) = at(t);
        *hf = Mem::of(pid);
        *up = go_pid.map(Mem::of).unwrap_or_default();
    };
    let mut t = Turn::default();
    std::thread::sleep(IDLE);
    mem(&mut t, |t| (&mut t.before, &mut t.go_before));
    let pids: Vec<u32> = std::iter::once(pid).chain(go_pid).collect();
    traffic(c, ports, &pids, &mut t);
    std::thread::sleep(IDLE);
    mem(&mut t, |t| (&mut t.after, &mut t.go_after));
    let _ = std::fs::copy(format!("/proc/{pid}/smaps"), smaps);
    drop(go);
    t
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(0.0)
}

/// The middle value of each turn's reading.
fn median_mem(turns: &[Turn], at: fn(&Turn) -> Mem) -> Mem {
    let mut pss: Vec<u64> = turns.iter().map(|t| at(t).pss).collect();
    let mut anon: Vec<u64> = turns.iter().map(|t| at(t).anon).collect();
    pss.sort_unstable();
    anon.sort_unstable();
    Mem {
        pss: pss.get(pss.len() / 2).copied().unwrap_or(0),
        anon: anon.get(anon.len() / 2).copied().unwrap_or(0),
    }
}

/// The figures of one way of carrying the tunnel over its turns.
struct Summary {
    down_mbps: f64,
    up_mbps: f64,
    exec_median: f64,
    exec_p90: f64,
    /// Every round trip, in order of length.
    exec: Vec<f64>,
    before: Mem,
    peak: Mem,
    after: Mem,
    /// holdfast's peak in the download, the upload and the execs.
    phases: [Mem; 3],
}

fn summary(turns: &[Turn], go: bool) -> Summary {
    let mut exec: Vec<f64> = turns.iter().flat_map(|t| t.exec_ms.clone()).collect();
    let exec_median = median(&mut exec);
    let exec_p90 = exec.get(exec.len() * 9 / 10).copied().unwrap_or(0.0);
    let pick =
        |hf: fn(&Turn) -> Mem, up: fn(&Turn) -> Mem| median_mem(turns, if go { up } else { hf });
    Summary {
        down_mbps: turns.iter().map(|t| t.down_mbps).fold(0.0, f64::max),
        up_mbps: turns.iter().map(|t| t.up_mbps).fold(0.0, f64::max),
        exec_median,
        exec_p90,
        exec,
        before: pick(|t| t.before, |t| t.go_before),
        peak: pick(|t| t.peak, |t| t.go_peak),
        after: pick(|t| t.after, |t| t.go_after),
        phases: [
            median_mem(turns, |t| t.phases[0]),
            median_mem(turns, |t| t.phases[1]),
            median_mem(turns, |t| t.phases[2]),
        ],
    }
}

fn report(ours: &[Turn], plain: &[Turn]) {
    let (o, g) = (summary(ours, false), summary(plain, true));
    let p = summary(plain, false);
    let row = |name: &str, a: String, b: String| println!("{name:<40} {a:>14} {b:>14}");
    row("", "holdfast".into(), "proxy-agent".into());
    let f = |v: f64| format!("{v:.1}");
    row(
        "port-forward down, best (MB/s)",
        f(o.down_mbps),
        f(g.down_mbps),
    );
    row("port-forward up, best (MB/s)", f(o.up_mbps), f(g.up_mbps));
    row(
        "exec round trip, median (ms)",
        f(o.exec_median),
        f(g.exec_median),
    );
    row("exec round trip, p90 (ms)", f(o.exec_p90), f(g.exec_p90));
    let extra = |a: Mem, b: Mem| format!("{:+}", a.pss as i64 - b.pss as i64);
    row(
        "PSS of the tunnel, idle before (KiB)",
        extra(o.before, p.before),
        g.before.pss.to_string(),
    );
    row(
        "PSS of the tunnel, peak (KiB)",
        extra(o.peak, p.peak),
        g.peak.pss.to_string(),
    );
    row(
        "PSS of the tunnel, idle after (KiB)",
        extra(o.after, p.after),
        g.after.pss.to_string(),
    );
    println!("holdfast PSS in KiB (anon + file), medians of {ROUNDS} turns:");
    for (name, a, b) in [
        ("idle before", o.before, p.before),
        ("peak, down", o.phases[0], p.phases[0]),
        ("peak, up", o.phases[1], p.phases[1]),
        ("peak, exec", o.phases[2], p.phases[2]),
        ("idle after", o.after, p.after),
    ] {
        println!(
            "  {name:<12} with the tunnel {:>6} ({:>5} + {:>5})   without {:>6} ({:>5} + {:>5})",
            a.pss,
            a.anon,
            a.file(),
            b.pss,
            b.anon,
            b.file()
        );
    }
    for (i, (a, b)) in ours.iter().zip(plain).enumerate() {
        println!(
            "  turn {i}: idle after {} vs {} KiB ({:+}), exec median {:.0} vs {:.0} ms",
            a.after.pss,
            b.after.pss,
            a.after.pss as i64 - b.after.pss as i64,
            median(&mut a.exec_ms.clone()),
            median(&mut b.exec_ms.clone()),
        );
    }
    let side = |s: &Summary| {
        serde_json::json!({"down_mbps": s.down_mbps, "up_mbps": s.up_mbps,
            "exec_median_ms": s.exec_median, "exec_p90_ms": s.exec_p90,
            "exec_ms": s.exec.iter().map(|v| (v * 10.0).round() / 10.0).collect::<Vec<_>>(),
            "before": s.before.json(), "peak": s.peak.json(), "after": s.after.json(),
            "peak_down": s.phases[0].json(), "peak_up": s.phases[1].json(),
            "peak_exec": s.phases[2].json()})
    };
    let json = serde_json::json!({
        "bytes": BYTES, "rounds": ROUNDS, "execs_per_round": EXECS, "idle_s": IDLE.as_secs(),
        "holdfast": side(&o),
        "holdfast_without_tunnel": side(&p),
        "proxy_agent": side(&g),
        "tunnel_pss_kib": {
            "before": o.before.pss as i64 - p.before.pss as i64,
            "peak": o.peak.pss as i64 - p.peak.pss as i64,
            "after": o.after.pss as i64 - p.after.pss as i64,
        },
    });
    let dir = support::repo_root().join("target/bench");
    let _ = std::fs::create_dir_all(&dir);
    std::fs::write(dir.join("tunnel.json"), format!("{json:#}\n")).expect("write tunnel.json");
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
            "mkdir -p /www; head -c {BYTES} /dev/zero > /www/blob; \
             httpd -p 127.0.0.1:{blob_port} -h /www; nc -ll -p {sink_port} -e wc -c & \
             until netstat -ltn | grep -q ':{blob_port} ' && \
             netstat -ltn | grep -q ':{sink_port} '; do usleep 20000; done; \
             echo ready; wait"
        ),
    );
    c.logs_within("bench", "ready", Duration::from_secs(30));
    let smaps = support::repo_root().join("target/bench/tunnel");
    let _ = std::fs::create_dir_all(&smaps);
    let (mut ours, mut plain) = (Vec::new(), Vec::new());
    for i in 0..ROUNDS {
        let file = |name: &str| smaps.join(format!("smaps-{name}-{i}"));
        ours.push(turn(&mut c, true, (blob_port, sink_port), &file("tunnel")));
        plain.push(turn(&mut c, false, (blob_port, sink_port), &file("plain")));
    }
    let _ = c.cp.kubectl(&["delete", "pod", "bench", "--wait=false"]);
    c.agent.stop();
    drop(addr);
    report(&ours, &plain);
}
