//! Start latency and memory, run on demand as root: `cargo bench --bench startup`.
//!
//! - Start latency of a static pod with a cached image, from the manifest written to the
//!   container's process running, p50/p95 over 30 pods; beside `crun run -d` and
//!   `runc run -d` of the same bundle (busybox `sleep`), in the same run.
//! - Agent RSS and PSS idle and with 20 running pods, and the per-container shims.
//!
//! Prints a table and writes `target/bench/startup.json`.

mod common;

use support::oci;

use common::{memory, shim_memory, stats, time_runtime, wait, Agent, Shims};
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
    let mut shims = Shims::default();
    for i in 0..PODS {
        let yaml = common::pod_manifest(&format!("p{i}"));
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
    let runc = time_runtime("runc", &bundle, &[], PODS);
    let crun = time_runtime("crun", &bundle, &["--cgroup-manager=cgroupfs"], PODS);

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
        format!("shims ({} in all)", shims.count),
        shims.rss,
        shims.pss
    );
    if shims.count > 0 {
        println!(
            "{:<32} {:>10} {:>10}",
            "per shim",
            shims.per_shim(shims.rss),
            shims.per_shim(shims.pss)
        );
    }
    let json = serde_json::json!({
        "pods": PODS,
        "start_latency_ms": rows.iter().map(|(n, s)| serde_json::json!({"what": n, "p50": s.0, "p95": s.1, "max": s.2})).collect::<Vec<_>>(),
        "agent_idle_kib": {"rss": idle.0, "pss": idle.1},
        "agent_with_pods_kib": {"pods": MEMORY_PODS, "rss": with_pods.0, "pss": with_pods.1},
        "shims_kib": {"count": shims.count, "rss": shims.rss, "pss": shims.pss},
    });
    common::write_json("startup", &json);
    let _ = std::fs::remove_dir_all(&dir);
}
