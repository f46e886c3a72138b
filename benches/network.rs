//! Pod start latency with a CNI bridge network versus hostNetwork, run on demand as
//! root: `cargo bench --bench network`.
//!
//! One agent, a cached image, a bridge network of the bench's own (Debian's
//! containernetworking-plugins: bridge, host-local, portmap, and loopback), and 30
//! pods of each kind started one at a time, the two kinds taking turns so that both
//! see the same agent and machine. Latency is from the manifest written to the
//! container's process running (for a CNI pod its namespaces, veth, address and
//! portmap rules are all set up before that). Prints p50/p95/max and writes
//! `target/bench/network.json`.

mod common;

use support::oci;

use std::path::Path;
use std::process::Command;

use common::{wait, Agent};
use std::time::{Duration, Instant};

const PODS: usize = 30;
const PLUGINS: &str = "/usr/lib/cni";
const CGROUP_ROOT: &str = "/holdfast-bench-net";

fn main() {
    if !nix::unistd::geteuid().is_root() {
        eprintln!("network bench: needs root (it runs containers and sets up networks)");
        std::process::exit(2);
    }
    if !Path::new(PLUGINS).join("bridge").exists() {
        eprintln!("network bench: needs containernetworking-plugins in {PLUGINS}");
        std::process::exit(2);
    }
    let pid = std::process::id();
    let dir = std::env::temp_dir().join(format!("holdfast-bench-net-{pid}"));
    let _ = std::fs::remove_dir_all(&dir);
    let root = dir.join("root");
    let manifests = dir.join("manifests");
    let conf = dir.join("cni");
    for d in [root.join("images"), manifests.clone(), conf.clone()] {
        std::fs::create_dir_all(d).expect("dirs");
    }
    oci::busybox_image("docker.io/library/busybox:bench")
        .and_then(|i| i.write_layout_tar(&root.join("images/busybox.tar")))
        .expect("busybox image");
    let bridge = format!("hfb{}", pid % 100_000);
    let subnet = format!("198.19.{}.0/24", pid % 250);
    let conflist = serde_json::json!({
        "cniVersion": "1.0.0",
        "name": "bench",
        "plugins": [
            {"type": "bridge", "bridge": bridge, "isGateway": true, "ipMasq": true,
             "ipam": {"type": "host-local", "ranges": [[{"subnet": subnet}]],
                      "dataDir": dir.join("ipam")}},
            {"type": "portmap", "capabilities": {"portMappings": true}}
        ]
    });
    std::fs::write(
        conf.join("10-bench.conflist"),
        serde_json::to_vec_pretty(&conflist).expect("json"),
    )
    .expect("conflist");
    let cfg = dir.join("config.yaml");
    std::fs::write(
        &cfg,
        format!(
            "cgroupRoot: {CGROUP_ROOT}\nfileCheckFrequency: 20s\nholdfast:\n  cniConfDir: {}\n  cniBinDir: {PLUGINS}\n",
            conf.display()
        ),
    )
    .expect("config");

    let mut agent = Agent::start(&root, &manifests, &cfg, &dir.join("agent.log"));
    wait(Duration::from_secs(60), || {
        root.join("holdfast.sock").exists()
    });
    wait(Duration::from_secs(60), || {
        root.join("content/layers")
            .read_dir()
            .map(|mut d| d.next().is_some())
            .unwrap_or(false)
    });

    let mut host = Vec::new();
    let mut cni = Vec::new();
    for i in 0..PODS * 2 {
        let host_network = i % 2 == 0;
        let yaml = format!(
            "apiVersion: v1\nkind: Pod\nmetadata:\n  name: p{i}\nspec:\n  hostNetwork: {host_network}\n  \
             terminationGracePeriodSeconds: 0\n  containers:\n  - name: c\n    image: busybox:bench\n    \
             command: [\"sleep\", \"100000\"]\n"
        );
        let t0 = Instant::now();
        std::fs::write(manifests.join(format!("p{i}.yaml")), yaml).expect("manifest");
        wait(Duration::from_secs(60), || {
            common::running_containers(&root) > i
        });
        if host_network {
            host.push(t0.elapsed());
        } else {
            cni.push(t0.elapsed());
        }
    }

    common::finish(
        &mut agent,
        &root,
        &manifests,
        CGROUP_ROOT,
        Duration::from_secs(180),
    );
    let _ = Command::new("ip").args(["link", "del", &bridge]).status();

    let rows = [("hostNetwork", stats(&host)), ("CNI bridge", stats(&cni))];
    println!(
        "\npod start latency over {PODS} pods each (manifest → container running, cached image)"
    );
    println!(
        "{:<16} {:>10} {:>10} {:>10}",
        "", "p50 ms", "p95 ms", "max ms"
    );
    for (name, s) in &rows {
        println!("{name:<16} {:>10.1} {:>10.1} {:>10.1}", s.0, s.1, s.2);
    }
    let json = serde_json::json!({
        "pods_each": PODS,
        "start_latency_ms": rows.iter().map(|(n, s)| serde_json::json!({"what": n, "p50": s.0, "p95": s.1, "max": s.2})).collect::<Vec<_>>(),
    });
    let out = Path::new(env!("CARGO_MANIFEST_DIR")).join("target/bench");
    std::fs::create_dir_all(&out).expect("target/bench");
    std::fs::write(
        out.join("network.json"),
        serde_json::to_vec_pretty(&json).expect("json"),
    )
    .expect("write json");
    println!("\nwrote {}", out.join("network.json").display());
    let _ = std::fs::remove_dir_all(&dir);
}

/// (p50, p95, max) in ms.
fn stats(samples: &[Duration]) -> (f64, f64, f64) {
    let mut ms: Vec<f64> = samples.iter().map(|d| d.as_secs_f64() * 1000.0).collect();
    ms.sort_by(|a, b| a.total_cmp(b));
    let at = |q: f64| ms[((ms.len() as f64 - 1.0) * q).round() as usize];
    (at(0.5), at(0.95), ms.last().copied().unwrap_or(0.0))
}
