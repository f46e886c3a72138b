//! What the benchmarks share.

#![allow(dead_code)]

use std::path::Path;
use std::process::{Child, Command};
use std::time::{Duration, Instant};

pub const BIN: &str = env!("CARGO_BIN_EXE_holdfast");

/// `holdfast run` on a root dir, a manifest folder and a config, logging to `log`.
pub struct Agent(Child);

impl Agent {
    pub fn start(root: &Path, manifests: &Path, cfg: &Path, log: &Path) -> Self {
        let log = std::fs::File::create(log).expect("log");
        let child = Command::new(BIN)
            .arg("run")
            .arg("--config")
            .arg(cfg)
            .arg("--root-dir")
            .arg(root)
            .arg("--pod-manifest-path")
            .arg(manifests)
            .arg("--hostname-override")
            .arg("bench")
            .stdout(log.try_clone().expect("log"))
            .stderr(log)
            .spawn()
            .expect("holdfast run");
        Agent(child)
    }

    pub fn pid(&self) -> u32 {
        self.0.id()
    }

    /// SIGTERM and wait.
    pub fn stop(&mut self) {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(self.0.id() as i32),
            nix::sys::signal::Signal::SIGTERM,
        );
        let _ = self.0.wait();
    }
}

/// Ends a bench's agent run: removes every manifest, waits (up to `within`) for the
/// agent to have stopped all its containers, stops it, and resets its root dir and
/// cgroups.
pub fn finish(
    agent: &mut Agent,
    root: &Path,
    manifests: &Path,
    cgroup_root: &str,
    within: Duration,
) {
    for f in std::fs::read_dir(manifests).expect("manifests").flatten() {
        let _ = std::fs::remove_file(f.path());
    }
    wait(within, || running_containers(root) == 0);
    agent.stop();
    let _ = Command::new(BIN)
        .args(["reset", "--root-dir"])
        .arg(root)
        .args(["--cgroup-root", cgroup_root])
        .status();
}

/// Polls `cond` until it holds; panics after `within`.
pub fn wait(within: Duration, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + within;
    while !cond() {
        assert!(Instant::now() < deadline, "timed out");
        std::thread::sleep(Duration::from_micros(500));
    }
}

/// (RSS, PSS) of a process in KiB, from smaps_rollup.
pub fn memory(pid: u32) -> (u64, u64) {
    let s = std::fs::read_to_string(format!("/proc/{pid}/smaps_rollup")).unwrap_or_default();
    let field = |name: &str| {
        s.lines()
            .find(|l| l.starts_with(name))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)
    };
    (field("Rss:"), field("Pss:"))
}

/// Containers whose process runs under `root` (the shim wrote `started.json` and no
/// `exit.json`).
pub fn running_containers(root: &Path) -> usize {
    std::fs::read_dir(root.join("containers"))
        .map(|d| {
            d.flatten()
                .filter(|e| {
                    e.path().join("started.json").exists() && !e.path().join("exit.json").exists()
                })
                .count()
        })
        .unwrap_or(0)
}

/// Writes a benchmark's figures to `target/bench/<name>.json` and says where.
pub fn write_json(name: &str, value: &serde_json::Value) {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("target/bench");
    std::fs::create_dir_all(&dir).expect("target/bench");
    let path = dir.join(format!("{name}.json"));
    std::fs::write(
        &path,
        serde_json::to_string_pretty(value).expect("json") + "\n",
    )
    .expect("write the bench's json");
    println!("\nwrote {}", path.display());
}

/// An OCI bundle for runc and crun at `bundle`: a copy of the busybox layer the agent
/// under `root` unpacked, and `runc spec`'s config running `sleep`, in cgroup
/// `/holdfast-bench-oci/c`.
pub fn make_bundle(root: &Path, bundle: &Path) {
    let layer = std::fs::read_dir(root.join("content/layers"))
        .expect("layers")
        .flatten()
        .map(|e| e.path())
        .find(|p| p.join("bin/busybox").exists())
        .expect("busybox layer");
    let rootfs = bundle.join("rootfs");
    std::fs::create_dir_all(&rootfs).expect("bundle");
    let ok = Command::new("cp")
        .arg("-a")
        .arg(format!("{}/.", layer.display()))
        .arg(&rootfs)
        .status();
    assert!(matches!(ok, Ok(s) if s.success()), "copy rootfs");
    let spec = Command::new("runc")
        .arg("spec")
        .current_dir(bundle)
        .status();
    if !matches!(spec, Ok(s) if s.success()) {
        // Without runc there is no reference spec; crun writes the same one.
        let _ = Command::new("crun")
            .arg("spec")
            .current_dir(bundle)
            .status();
    }
    let path = bundle.join("config.json");
    let Ok(text) = std::fs::read_to_string(&path) else {
        return;
    };
    let mut v: serde_json::Value = serde_json::from_str(&text).expect("config.json");
    v["process"]["args"] = serde_json::json!(["sleep", "100000"]);
    v["process"]["terminal"] = serde_json::json!(false);
    v["linux"]["cgroupsPath"] = serde_json::json!("/holdfast-bench-oci/c");
    std::fs::write(&path, serde_json::to_vec_pretty(&v).expect("json")).expect("write config.json");
}
