//! The cost of probes, run on demand as root: `cargo bench --bench probes`.
//!
//! An agent runs 50 host-network pods (busybox httpd on a port of its own each), three
//! times over with a fresh agent each time, and each phase is measured in steady state:
//! - no probes (the baseline);
//! - 2 network probes per pod at a 1 s period (httpGet readiness, tcpSocket liveness);
//! - 2 exec probes per pod at a 1 s period (`true` run inside the container; each is a
//!   `holdfast shim exec` process joining the container, as runc exec would be).
//!
//! For each: the agent's memory (RSS, PSS) and the CPU the agent and its exec
//! processes spent over a window (utime + stime, children included), as a share of
//! one core. Prints a table and writes `target/bench/probes.json`.

mod common;

use support::oci;

use std::path::Path;
use std::process::Command;

use common::{memory, wait, Agent, BIN};
use std::time::{Duration, Instant};

const PODS: usize = 50;
const WINDOW: Duration = Duration::from_secs(60);
const CGROUP_ROOT: &str = "/holdfast-bench-probes";

fn main() {
    if !nix::unistd::geteuid().is_root() {
        eprintln!("probes bench: needs root (it runs containers)");
        std::process::exit(2);
    }
    let pid = std::process::id();
    let dir = std::env::temp_dir().join(format!("holdfast-bench-probes-{pid}"));
    let _ = std::fs::remove_dir_all(&dir);
    let root = dir.join("root");
    let manifests = dir.join("manifests");
    for d in [root.join("images"), manifests.clone()] {
        std::fs::create_dir_all(d).expect("dirs");
    }
    let image = dir.join("busybox.tar");
    oci::busybox_image("docker.io/library/busybox:bench")
        .and_then(|i| i.write_layout_tar(&image))
        .expect("busybox image");
    let cfg = dir.join("config.yaml");
    std::fs::write(
        &cfg,
        format!("cgroupRoot: {CGROUP_ROOT}\nfileCheckFrequency: 20s\nholdfast:\n  evictionMonitoringPeriod: 24h\n"),
    )
    .expect("config");
    let base_port = 20000 + (pid % 20000) as u16;

    let phases = [
        ("no probes", ""),
        (
            "httpGet + tcpSocket, 1 s",
            "    readinessProbe:\n      httpGet:\n        path: /\n        port: PORT\n      periodSeconds: 1\n    \
             livenessProbe:\n      tcpSocket:\n        port: PORT\n      periodSeconds: 1\n",
        ),
        (
            "2 exec, 1 s",
            "    readinessProbe:\n      exec:\n        command: [\"true\"]\n      periodSeconds: 1\n    \
             livenessProbe:\n      exec:\n        command: [\"true\"]\n      periodSeconds: 1\n",
        ),
    ];
    let mut rows = Vec::new();
    let mut per_exec_ms = None;
    let mut runc = None;
    // Each phase has an agent of its own, so that none inherits the heap another's
    // pod starts and stops left.
    for (phase, (name, probes)) in phases.iter().enumerate() {
        std::fs::create_dir_all(root.join("images")).expect("images dir");
        std::fs::copy(&image, root.join("images/busybox.tar")).expect("copy image");
        for i in 0..PODS {
            let port = base_port + i as u16;
            let yaml = format!(
                "apiVersion: v1\nkind: Pod\nmetadata:\n  name: p{i}\n  labels:\n    phase: \"{phase}\"\nspec:\n  \
                 hostNetwork: true\n  terminationGracePeriodSeconds: 0\n  containers:\n  - name: c\n    \
                 image: busybox:bench\n    command: [\"sh\", \"-c\", \"mkdir -p /www; echo ok > /www/index.html; \
                 exec httpd -f -p {port} -h /www\"]\n{}",
                probes.replace("PORT", &port.to_string())
            );
            std::fs::write(manifests.join(format!("p{i}.yaml")), yaml).expect("manifest");
        }
        let mut agent = Agent::start(&root, &manifests, &cfg, &dir.join("agent.log"));
        // Settled: every pod runs this phase's container and says so.
        wait(Duration::from_secs(300), || {
            ready_pods(&root, phase) == PODS && common::running_containers(&root) == PODS
        });
        std::thread::sleep(Duration::from_secs(10));
        let before = cpu_ticks(agent.pid());
        let t0 = Instant::now();
        std::thread::sleep(WINDOW);
        let ticks = cpu_ticks(agent.pid()).saturating_sub(before);
        let secs = t0.elapsed().as_secs_f64();
        let tick = ticks_per_second();
        let core = ticks as f64 / tick / secs * 100.0;
        let mem = memory(agent.pid());
        let threads = threads(agent.pid());
        println!(
            "{name}: {core:.1}% of a core, RSS {:.1} MiB, {threads} threads",
            mem.0 as f64 / 1024.0
        );
        rows.push((name.to_string(), core, mem));
        if phase == 2 {
            // Per exec: the agent's and its exec processes' CPU over the window, for
            // the 100 execs a second the 50 pods ask for.
            per_exec_ms = Some(core / 100.0 * 1000.0 / 100.0);
            // The same rootfs and `true` through runc, for a reference.
            let bundle = dir.join("bundle");
            common::make_bundle(&root, &bundle);
            runc = runc_exec(&bundle);
        }

        common::finish(
            &mut agent,
            &root,
            &manifests,
            CGROUP_ROOT,
            Duration::from_secs(300),
        );
    }

    println!(
        "\n{PODS} pods, {}-second window in steady state (agent and its exec processes)",
        WINDOW.as_secs()
    );
    println!(
        "{:<26} {:>12} {:>12} {:>12}",
        "", "CPU % core", "RSS MiB", "Pss MiB"
    );
    for (name, core, (rss, pss)) in &rows {
        println!(
            "{name:<26} {core:>12.1} {:>12.1} {:>12.1}",
            *rss as f64 / 1024.0,
            *pss as f64 / 1024.0
        );
    }
    if let Some(ms) = per_exec_ms {
        println!(
            "\nCPU per exec of `true`: holdfast exec probe {ms:.1} ms (agent and exec process)"
        );
    }
    if let Some((cpu, wall)) = runc {
        println!(
            "CPU per exec of `true`: runc exec {cpu:.1} ms ({wall:.1} ms wall), the runtime alone, same rootfs, same run"
        );
    }
    common::write_json(
        "probes",
        &serde_json::json!({
            "pods": PODS,
            "window_s": WINDOW.as_secs(),
            "cpu_ms_per_exec_probe": per_exec_ms,
            "runc_exec_ms": runc.map(|(cpu, wall)| serde_json::json!({"cpu": cpu, "wall": wall})),
            "phases": rows.iter().map(|(n, c, (rss, pss))| serde_json::json!({
                "what": n, "cpu_percent_of_core": c, "rss_kib": rss, "pss_kib": pss,
            })).collect::<Vec<_>>(),
        }),
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// Pods of phase `phase` whose container is ready, from `holdfast pods -o json`.
fn ready_pods(root: &Path, phase: usize) -> usize {
    let Ok(out) = Command::new(BIN)
        .args(["pods", "-o", "json", "--root-dir"])
        .arg(root)
        .output()
    else {
        return 0;
    };
    let pods: Vec<serde_json::Value> = serde_json::from_slice(&out.stdout).unwrap_or_default();
    pods.iter()
        .filter(|p| p["pod"]["metadata"]["labels"]["phase"] == phase.to_string().as_str())
        .filter(|p| p["status"]["containerStatuses"][0]["ready"] == true)
        .count()
}

/// utime + stime of `pid` and its waited-for children, in clock ticks.
fn cpu_ticks(pid: u32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // Fields after the command name (which may hold spaces) start at field 3.
    let rest = stat.rsplit_once(')').map(|(_, r)| r).unwrap_or("");
    let f: Vec<u64> = rest
        .split_whitespace()
        .map(|v| v.parse().unwrap_or(0))
        .collect();
    // utime, stime, cutime, cstime are fields 14..=17, here 11..=14.
    f.get(11..15).map(|v| v.iter().sum()).unwrap_or(0)
}

fn ticks_per_second() -> f64 {
    nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK)
        .ok()
        .flatten()
        .map(|t| t as f64)
        .unwrap_or(100.0)
}

/// The threads of process `pid` now.
fn threads(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("Threads:"))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0)
}

/// CPU and wall time per `runc exec <id> true` into a runc container of `bundle`, over
/// 100 execs (CPU of the runc processes, from this process's children's rusage), or None
/// without runc.
fn runc_exec(bundle: &Path) -> Option<(f64, f64)> {
    const EXECS: u32 = 100;
    let state = format!("/run/holdfast-bench-probes-{}", std::process::id());
    let id = "bench-probe";
    let run = |args: &[&str]| {
        Command::new("runc")
            .args(["--root", &state])
            .args(args)
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .status()
            .map(|s| s.success())
            .unwrap_or(false)
    };
    let bundle = bundle.display().to_string();
    if !run(&["run", "-d", "--bundle", &bundle, id]) {
        eprintln!("runc not installed or failed (apt-get install runc); left out");
        return None;
    }
    let before = children_cpu();
    let t0 = Instant::now();
    let mut ok = true;
    for _ in 0..EXECS {
        ok &= run(&["exec", id, "true"]);
    }
    let wall = t0.elapsed().as_secs_f64() * 1000.0 / f64::from(EXECS);
    let cpu = (children_cpu() - before) * 1000.0 / f64::from(EXECS);
    run(&["delete", "-f", id]);
    ok.then_some((cpu, wall))
}

/// User and system CPU seconds of this process's waited-for children.
fn children_cpu() -> f64 {
    nix::sys::resource::getrusage(nix::sys::resource::UsageWho::RUSAGE_CHILDREN)
        .map(|u| {
            let t = |tv: nix::sys::time::TimeVal| tv.tv_sec() as f64 + tv.tv_usec() as f64 / 1e6;
            t(u.user_time()) + t(u.system_time())
        })
        .unwrap_or(0.0)
}
