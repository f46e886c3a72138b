//! A container's create+start through the shim, and the shim's memory, run on demand as
//! root: `cargo bench --bench shim`.
//!
//! - Latency of `LibcontainerRuntime::start` (bundle, `shim start`, readiness) for a
//!   busybox `sleep`, p50/p95 over `RUNS` containers, beside `crun run -d` and
//!   `runc run -d` of a bundle with the same rootfs and command, in the same run.
//! - Each shim's RSS, PSS and Private_Dirty with all `RUNS` running, the private dirty
//!   split by where it lies: the binary's own mappings (relocations), the heap, the
//!   stack, other anonymous memory and other files (libc, ld.so).
//!
//! `HOLDFAST_TEST_SHIM` runs another build as the shim (a non-PIE one, say). Prints a
//! table and writes `target/bench/shim.json`.

mod common;

#[path = "../tests/runtime_support/mod.rs"]
mod runtime_support;

use std::path::Path;
use std::time::{Duration, Instant};

use common::{make_bundle_from_layer, stats, time_runtime};
use holdfast::runtime::{ContainerId, Runtime};
use runtime_support::{live_pid, Env};

const RUNS: usize = 20;

fn main() {
    if !nix::unistd::geteuid().is_root() {
        eprintln!("shim bench: needs root (it runs containers)");
        std::process::exit(2);
    }
    let env = Env::new("bench-shim");
    let mut ids = Vec::new();
    let mut took = Vec::new();
    for i in 0..RUNS {
        let name = format!("c{i}");
        let t0 = Instant::now();
        let id = env.start(&name, "exec sleep 100000", None).expect("start");
        took.push(t0.elapsed());
        ids.push(id);
    }
    // Let each shim settle into its wait before reading its memory.
    std::thread::sleep(Duration::from_millis(500));
    let shims: Vec<Split> = ids.iter().filter_map(|id| shim_split(&env, id)).collect();
    for id in &ids {
        let _ = env.rt.kill(id, 9);
    }
    for id in &ids {
        env.wait_exit(id);
    }

    let bundle = env.root.join("bundle");
    make_bundle_from_layer(&env.image.layers[0], &bundle);
    let runc = time_runtime("runc", &bundle, &[], RUNS);
    let crun = time_runtime("crun", &bundle, &["--cgroup-manager=cgroupfs"], RUNS);

    let mut rows = vec![("holdfast create+start (shim)", stats(&took))];
    if let Some(r) = &runc {
        rows.push(("runc run -d", stats(r)));
    }
    if let Some(c) = &crun {
        rows.push(("crun run -d", stats(c)));
    }
    println!("\ncreate+start over {RUNS} containers (busybox sleep)");
    println!("{:<32} {:>8} {:>8} {:>8}", "", "p50 ms", "p95 ms", "max ms");
    for (name, s) in &rows {
        println!("{name:<32} {:>8.1} {:>8.1} {:>8.1}", s.0, s.1, s.2);
    }
    let n = shims.len().max(1) as u64;
    let avg = |f: fn(&Split) -> u64| shims.iter().map(f).sum::<u64>() / n;
    let mean = Split {
        rss: avg(|s| s.rss),
        pss: avg(|s| s.pss),
        private_dirty: avg(|s| s.private_dirty),
        binary: avg(|s| s.binary),
        heap: avg(|s| s.heap),
        stack: avg(|s| s.stack),
        anon: avg(|s| s.anon),
        files: avg(|s| s.files),
    };
    println!("\nper shim (KiB, mean of {})", shims.len());
    println!(
        "RSS {}  PSS {}  Private_Dirty {} = binary {} + heap {} + stack {} + other anon {} + other files {}",
        mean.rss, mean.pss, mean.private_dirty, mean.binary, mean.heap, mean.stack, mean.anon, mean.files
    );
    let json = serde_json::json!({
        "runs": RUNS,
        "start_latency_ms": rows.iter().map(|(n, s)| serde_json::json!({"what": n, "p50": s.0, "p95": s.1, "max": s.2})).collect::<Vec<_>>(),
        "shim_kib": {"count": shims.len(), "rss": mean.rss, "pss": mean.pss,
            "private_dirty": mean.private_dirty, "binary": mean.binary, "heap": mean.heap,
            "stack": mean.stack, "other_anon": mean.anon, "other_files": mean.files},
    });
    common::write_json("shim", &json);
}

/// A process's memory in KiB, private dirty split by mapping.
#[derive(Default)]
struct Split {
    rss: u64,
    pss: u64,
    private_dirty: u64,
    binary: u64,
    heap: u64,
    stack: u64,
    anon: u64,
    files: u64,
}

fn shim_split(env: &Env, id: &ContainerId) -> Option<Split> {
    let pid = live_pid(&env.rt.state_dir(id).join("shim-pid.json"), "process")?;
    let exe = std::fs::read_link(format!("/proc/{pid}/exe")).ok()?;
    let smaps = std::fs::read_to_string(format!("/proc/{pid}/smaps")).ok()?;
    let mut out = Split::default();
    let mut name = String::new();
    for line in smaps.lines() {
        let mut words = line.split_whitespace();
        let first = words.next().unwrap_or("");
        if first.contains('-') && !first.ends_with(':') {
            name = line.split_whitespace().nth(5).unwrap_or("").to_owned();
            continue;
        }
        let kib = || {
            words
                .clone()
                .next()
                .and_then(|v| v.parse::<u64>().ok())
                .unwrap_or(0)
        };
        match first {
            "Rss:" => out.rss += kib(),
            "Pss:" => out.pss += kib(),
            "Private_Dirty:" => {
                let v = kib();
                out.private_dirty += v;
                match name.as_str() {
                    n if Path::new(n) == exe => out.binary += v,
                    "[heap]" => out.heap += v,
                    "[stack]" => out.stack += v,
                    "" => out.anon += v,
                    n if n.starts_with('[') => out.anon += v,
                    _ => out.files += v,
                }
            }
            _ => {}
        }
    }
    Some(out)
}
