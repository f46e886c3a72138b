//! Start latency and memory, run on demand as root: `cargo bench --bench startup`.
//!
//! - Start latency of a static pod with a cached image, from the manifest written to the
//!   container's process running, p50/p95 over 30 pods; beside `crun run -d` and
//!   `runc run -d` of the same bundle (busybox `sleep`), in the same run.
//! - Agent RSS and PSS idle and with 20 running pods, and the per-container shims.
//!
//! Prints a table and writes `target/bench/startup.json`.

mod common;

#[path = "../tests/support/oci.rs"]
mod oci;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use common::{memory, wait, Agent};
use std::time::{Duration, Instant};

const PODS: usize = 30;
const MEMORY_PODS: usize = 20;

fn main() {
    if !nix::unistd::geteuid().is_root() {
        eprintln!("startup bench: needs root (it runs containers)");
        std::process::exit(2);
    }
    let dir = std::env::temp_dir().join(format!("holdfast-bench-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let root = dir.join("root");
    let manifests = dir.join("manifests");
    std::fs::create_dir_all(root.join("images")).expect("root");
    std::fs::create_dir_all(&manifests).expect("manifests");
    oci::busybox_image("docker.io/library/busybox:bench")
        .and_then(|i| i.write_layout_tar(&root.join("images/busybox.tar")))
        .expect("busybox image");
    let cfg = dir.join("config.yaml");
    std::fs::write(
        &cfg,
        "cgroupRoot: /holdfast-bench\nfileCheckFrequency: 20s\n",
    )
    .expect("config");

    let mut agent = Agent::start(&root, &manifests, &cfg, &dir.join("agent.log"));
    wait(Duration::from_secs(60), || {
        root.join("holdfast.sock").exists()
    });
    // The image is imported (cached) before the clock starts.
    wait(Duration::from_secs(60), || {
        root.join("content/layers")
            .read_dir()
            .map(|mut d| d.next().is_some())
            .unwrap_or(false)
    });
    std::thread::sleep(Duration::from_millis(500));
    let idle = memory(agent.pid());

    let mut holdfast = Vec::new();
    let mut with_pods = (0, 0);
    let mut shims = (0, 0, 0);
    for i in 0..PODS {
        let yaml = format!(
            "apiVersion: v1\nkind: Pod\nmetadata:\n  name: p{i}\nspec:\n  hostNetwork: true\n  \
             terminationGracePeriodSeconds: 0\n  containers:\n  - name: c\n    image: busybox:bench\n    \
             command: [\"sleep\", \"100000\"]\n"
        );
        let t0 = Instant::now();
        std::fs::write(manifests.join(format!("p{i}.yaml")), yaml).expect("manifest");
        wait(Duration::from_secs(60), || {
            common::running_containers(&root) > i
        });
        holdfast.push(t0.elapsed());
        if i + 1 == MEMORY_PODS {
            // Let the agent settle (status written, logs opened) before reading memory.
            std::thread::sleep(Duration::from_millis(500));
            with_pods = memory(agent.pid());
            shims = shim_memory(&root);
        }
    }

    // The same rootfs and process for runc and crun.
    let bundle = dir.join("bundle");
    common::make_bundle(&root, &bundle);
    let runc = time_runtime("runc", &bundle, &[]);
    let crun = time_runtime("crun", &bundle, &["--cgroup-manager=cgroupfs"]);

    common::finish(
        &mut agent,
        &root,
        &manifests,
        "/holdfast-bench",
        Duration::from_secs(120),
    );

    let mut rows = vec![("holdfast (manifest → running)", stats(&holdfast))];
    if let Some(r) = &runc {
        rows.push(("runc run -d", stats(r)));
    }
    if let Some(c) = &crun {
        rows.push(("crun run -d", stats(c)));
    }
    println!("\nstart latency over {PODS} containers (busybox sleep, cached image)");
    println!(
        "{:<32} {:>10} {:>10} {:>10}",
        "", "p50 ms", "p95 ms", "max ms"
    );
    for (name, s) in &rows {
        println!("{name:<32} {:>10.1} {:>10.1} {:>10.1}", s.0, s.1, s.2);
    }
    println!("\nmemory (KiB)                          RSS        PSS");
    println!("{:<32} {:>10} {:>10}", "agent idle", idle.0, idle.1);
    println!(
        "{:<32} {:>10} {:>10}",
        format!("agent with {MEMORY_PODS} pods"),
        with_pods.0,
        with_pods.1
    );
    println!(
        "{:<32} {:>10} {:>10}",
        format!("shims ({} in all)", shims.0),
        shims.1,
        shims.2
    );
    if shims.0 > 0 {
        println!(
            "{:<32} {:>10} {:>10}",
            "per shim",
            shims.1 / shims.0 as u64,
            shims.2 / shims.0 as u64
        );
    }
    let json = serde_json::json!({
        "pods": PODS,
        "start_latency_ms": rows.iter().map(|(n, s)| serde_json::json!({"what": n, "p50": s.0, "p95": s.1, "max": s.2})).collect::<Vec<_>>(),
        "agent_idle_kib": {"rss": idle.0, "pss": idle.1},
        "agent_with_pods_kib": {"pods": MEMORY_PODS, "rss": with_pods.0, "pss": with_pods.1},
        "shims_kib": {"count": shims.0, "rss": shims.1, "pss": shims.2},
    });
    common::write_json("startup", &json);
    let _ = std::fs::remove_dir_all(&dir);
}

/// (count, total RSS, total PSS) of the shims of containers under `root`.
fn shim_memory(root: &Path) -> (usize, u64, u64) {
    let mut n = 0;
    let (mut rss, mut pss) = (0, 0);
    for e in std::fs::read_dir("/proc").expect("/proc").flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let cmd = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
        let cmd = String::from_utf8_lossy(&cmd);
        if cmd.contains("\0shim\0") && cmd.contains(&*root.display().to_string()) {
            let (r, p) = memory(pid);
            n += 1;
            rss += r;
            pss += p;
        }
    }
    (n, rss, pss)
}

/// Wall time of `<rt> run -d` for each of PODS containers, or None when `rt` is missing.
/// crun refuses this host's hybrid cgroup v1 layout unless the unified mount is hidden,
/// so it runs in a private mount namespace without it (a few ms of `unshare` included).
fn time_runtime(rt: &str, bundle: &Path, extra: &[&str]) -> Option<Vec<Duration>> {
    if Command::new(rt)
        .arg("--version")
        .stdout(Stdio::null())
        .status()
        .is_err()
    {
        eprintln!("{rt} not installed (apt-get install {rt}); left out");
        return None;
    }
    let state = PathBuf::from(format!("/run/holdfast-bench-{rt}"));
    let hybrid = Path::new("/sys/fs/cgroup/unified").exists();
    let mut out = Vec::new();
    for i in 0..PODS {
        let id = format!("bench-{rt}-{i}");
        let mut cmd = if rt == "crun" && hybrid {
            let mut c = Command::new("unshare");
            c.args([
                "-m",
                "sh",
                "-c",
                "umount /sys/fs/cgroup/unified 2>/dev/null; exec \"$@\"",
                "sh",
                rt,
            ]);
            c
        } else {
            Command::new(rt)
        };
        cmd.arg("--root")
            .arg(&state)
            .args(extra)
            .args(["run", "-d", "--bundle"])
            .arg(bundle)
            .arg(&id);
        cmd.stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        let t0 = Instant::now();
        let ok = cmd.status().map(|s| s.success()).unwrap_or(false);
        let took = t0.elapsed();
        let _ = Command::new(rt)
            .arg("--root")
            .arg(&state)
            .args(["delete", "-f", &id])
            .status();
        if !ok {
            eprintln!("{rt} run failed; left out");
            return None;
        }
        out.push(took);
    }
    let _ = std::fs::remove_dir("/sys/fs/cgroup/unified/holdfast-bench-oci");
    if let Ok(d) = std::fs::read_dir("/sys/fs/cgroup") {
        for e in d.flatten() {
            let _ = std::fs::remove_dir(e.path().join("holdfast-bench-oci/c"));
            let _ = std::fs::remove_dir(e.path().join("holdfast-bench-oci"));
        }
    }
    Some(out)
}

/// (p50, p95, max) in ms.
fn stats(samples: &[Duration]) -> (f64, f64, f64) {
    let mut ms: Vec<f64> = samples.iter().map(|d| d.as_secs_f64() * 1000.0).collect();
    ms.sort_by(|a, b| a.total_cmp(b));
    let at = |q: f64| ms[((ms.len() as f64 - 1.0) * q).round() as usize];
    (at(0.5), at(0.95), ms.last().copied().unwrap_or(0.0))
}
