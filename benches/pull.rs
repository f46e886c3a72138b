//! Image pull time and memory, run on demand: `cargo bench --bench pull`.
//!
//! A local Debian `docker-registry` (TLS from a CA made here) holds three images of five
//! layers each, about 10, 50 and 200 MB of incompressible data. Each is pulled into a
//! fresh root by `holdfast image pull` (no agent: the whole pull in that one process,
//! layers unpacked too) and copied by `skopeo copy docker://... oci:DIR` (blobs only), in
//! the same run, twice each. Wall time and peak RSS (VmHWM, read every 10 ms until the
//! process exits) of each; the point of the 10/50/200 MB rows is that holdfast's peak
//! RSS does not grow with the image: blobs are streamed to disk.
//!
//! Prints a table and writes `target/bench/pull.json`.

use support::{oci, pki, registry};

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_holdfast");
const RUNS: usize = 2;

struct Run {
    seconds: f64,
    peak_rss_kib: u64,
}

/// Runs `cmd` to the end, sampling its VmHWM.
fn measure(cmd: &mut Command) -> Run {
    let start = Instant::now();
    let mut child = cmd
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    let status_file = format!("/proc/{}/status", child.id());
    let mut peak = 0;
    loop {
        if let Ok(text) = std::fs::read_to_string(&status_file) {
            for line in text.lines() {
                if let Some(v) = line.strip_prefix("VmHWM:") {
                    let kib: u64 = v.trim().trim_end_matches("kB").trim().parse().unwrap_or(0);
                    peak = peak.max(kib);
                }
            }
        }
        match child.try_wait() {
            Ok(Some(status)) => {
                let mut err = String::new();
                if let Some(mut e) = child.stderr.take() {
                    let _ = std::io::Read::read_to_string(&mut e, &mut err);
                }
                assert!(status.success(), "{cmd:?} failed: {err}");
                break;
            }
            Ok(None) => std::thread::sleep(Duration::from_millis(10)),
            Err(e) => panic!("wait: {e}"),
        }
    }
    Run {
        seconds: start.elapsed().as_secs_f64(),
        peak_rss_kib: peak,
    }
}

fn best(runs: &[Run]) -> (f64, u64) {
    let t = runs.iter().map(|r| r.seconds).fold(f64::INFINITY, f64::min);
    let m = runs.iter().map(|r| r.peak_rss_kib).max().unwrap_or(0);
    (t, m)
}

fn main() {
    if !registry::tools_present() {
        std::process::exit(2);
    }
    let dir = std::env::temp_dir().join(format!("holdfast-bench-pull-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("bench dir");
    let pki = pki::Pki::new(&dir.join("pki"));
    let reg = registry::Registry::start(&dir.join("registry"), &pki, registry::Auth::None);
    let cfg = dir.join("config.yaml");
    std::fs::write(
        &cfg,
        format!(
            "holdfast:\n  registries:\n    \"{}\":\n      caFile: {}\n",
            reg.host(),
            pki.ca.display()
        ),
    )
    .expect("config");

    let mut rows = Vec::new();
    for (mib, seed) in [(10usize, 11u64), (50, 12), (200, 13)] {
        let layout = dir.join(format!("layout-{mib}"));
        let layers = (0..5)
            .map(|i| {
                let bytes = oci::noise(mib * 1024 * 1024 / 5, seed * 10 + i);
                oci::Layer::new(vec![oci::Entry::file(&format!("data{i}"), &bytes, 0o644)])
                    .gzipped()
            })
            .collect();
        let image = oci::Image {
            layers,
            ..oci::Image::default()
        };
        let (arch, variant) = oci::goarch();
        let platform = match variant {
            Some(v) => format!("linux/{arch}/{v}"),
            None => format!("linux/{arch}"),
        };
        oci::write_index_dir(&layout, &[(&platform, &image)]).expect("layout");
        reg.push(&layout, "bench/image", &format!("{mib}m"), None);
        let _ = std::fs::remove_dir_all(&layout);
        let reference = format!("{}/bench/image:{mib}m", reg.host());

        let mut holdfast = Vec::new();
        let mut skopeo = Vec::new();
        for run in 0..RUNS {
            let root = dir.join(format!("root-{mib}-{run}"));
            holdfast.push(measure(
                Command::new(BIN)
                    .args(["image", "pull", &reference, "--root-dir"])
                    .arg(&root)
                    .arg("--config")
                    .arg(&cfg)
                    .env("HOME", &root),
            ));
            let _ = std::fs::remove_dir_all(&root);
            let out = dir.join(format!("oci-{mib}-{run}"));
            skopeo.push(measure(
                Command::new("skopeo")
                    .args(["copy", "--quiet", "--src-cert-dir"])
                    .arg(&reg.cert_dir)
                    .arg(format!("docker://{reference}"))
                    .arg(format!("oci:{}", out.display())),
            ));
            let _ = std::fs::remove_dir_all(&out);
        }
        rows.push((mib, best(&holdfast), best(&skopeo)));
    }

    println!("\nimage pull from a local registry (TLS), 5 layers, best of {RUNS} runs; peak RSS is the highest seen");
    println!(
        "{:>8}  {:>14} {:>16}  {:>14} {:>16}",
        "image", "holdfast s", "holdfast RSS MiB", "skopeo s", "skopeo RSS MiB"
    );
    for (mib, h, s) in &rows {
        println!(
            "{:>6}MB  {:>14.2} {:>16.1}  {:>14.2} {:>16.1}",
            mib,
            h.0,
            h.1 as f64 / 1024.0,
            s.0,
            s.1 as f64 / 1024.0
        );
    }
    let json = serde_json::json!({
        "runs": RUNS,
        "rows": rows.iter().map(|(mib, h, s)| serde_json::json!({
            "image_mb": mib,
            "holdfast": {"seconds": h.0, "peak_rss_kib": h.1},
            "skopeo": {"seconds": s.0, "peak_rss_kib": s.1},
        })).collect::<Vec<_>>(),
    });
    let out: PathBuf = Path::new(env!("CARGO_MANIFEST_DIR")).join("target/bench");
    std::fs::create_dir_all(&out).expect("target/bench");
    std::fs::write(
        out.join("pull.json"),
        serde_json::to_vec_pretty(&json).expect("json"),
    )
    .expect("write json");
    println!("\nwrote {}", out.join("pull.json").display());
    drop(reg);
    let _ = std::fs::remove_dir_all(&dir);
}
