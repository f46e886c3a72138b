//! What the benchmarks share.

#![allow(dead_code)]

use support::maps;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub const BIN: &str = env!("CARGO_BIN_EXE_holdfast");

/// The binary the agent and its shims run: `HOLDFAST_BIN` if set (to measure another
/// build, such as an older commit's), else the one cargo built for the bench.
pub fn bin() -> PathBuf {
    std::env::var_os("HOLDFAST_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(BIN))
}

/// `holdfast run` on a root dir, a manifest folder and a config, logging to `log`.
pub struct Agent(Child);

impl Agent {
    pub fn start(root: &Path, manifests: &Path, cfg: &Path, log: &Path) -> Self {
        let log = std::fs::File::create(log).expect("log");
        let child = Command::new(bin())
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

/// An agent a bench panicked over is stopped all the same (a stopped one is left alone).
impl Drop for Agent {
    fn drop(&mut self) {
        if matches!(self.0.try_wait(), Ok(None)) {
            self.stop();
        }
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
    // Not `wait`: this also runs while a failed bench unwinds, and must not panic then.
    if !poll(within, || running_containers(root) == 0) {
        eprintln!("containers still running after {within:?}; resetting anyway");
    }
    agent.stop();
    let _ = Command::new(bin())
        .args(["reset", "--root-dir"])
        .arg(root)
        .args(["--cgroup-root", cgroup_root])
        .status();
}

/// Polls `cond` until it holds; panics after `within`.
pub fn wait(within: Duration, cond: impl FnMut() -> bool) {
    assert!(poll(within, cond), "timed out");
}

/// Polls `cond` until it holds (true) or `within` has passed (false).
pub fn poll(within: Duration, mut cond: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + within;
    while !cond() {
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(Duration::from_micros(500));
    }
    true
}

/// (RSS, PSS) of a process in KiB, from smaps_rollup.
pub fn memory(pid: u32) -> (u64, u64) {
    let r = rollup(pid);
    (r.rss, r.pss)
}

/// A process's memory in KiB, from `smaps_rollup` (zeros once it is gone).
#[derive(Clone, Copy, Debug, Default)]
pub struct Rollup {
    pub rss: u64,
    pub pss: u64,
    /// The PSS of anonymous memory (heap, stacks): what the process allocated, as
    /// against the binary's and libraries' file pages, which the kernel can drop.
    pub pss_anon: u64,
    pub private_dirty: u64,
}

pub fn rollup(pid: u32) -> Rollup {
    let s = std::fs::read_to_string(format!("/proc/{pid}/smaps_rollup")).unwrap_or_default();
    Rollup {
        rss: kib_field(&s, "Rss:"),
        pss: kib_field(&s, "Pss:"),
        pss_anon: kib_field(&s, "Pss_Anon:"),
        private_dirty: kib_field(&s, "Private_Dirty:"),
    }
}

/// The number after `name` on the first line starting with it (`Pss:   1234 kB`).
fn kib_field(text: &str, name: &str) -> u64 {
    text.lines()
        .find(|l| l.starts_with(name))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

/// Private_Dirty in KiB of the mappings of `file` in a process (from `smaps`): what
/// relocations cost each process running that binary.
pub fn file_private_dirty(pid: u32, file: &Path) -> u64 {
    let file = file.to_string_lossy();
    mappings(pid)
        .iter()
        .filter(|m| m.name == *file)
        .map(|m| m.private_dirty)
        .sum()
}

/// The mappings of a process holding the most anonymous memory, largest first: `(size,
/// Anonymous, name)` in KiB, the name `[heap]`, `[stack]`, a file, or `anon` for a
/// mapping of no name (malloc arenas, thread stacks, mmap'd blocks).
pub fn anon_mappings(pid: u32, top: usize) -> Vec<(u64, u64, String)> {
    let mut maps: Vec<(u64, u64, String)> = mappings(pid)
        .into_iter()
        .filter(|m| m.anonymous > 0)
        .map(|m| (m.size, m.anonymous, m.name))
        .collect();
    maps.sort_by_key(|m| std::cmp::Reverse(m.1));
    maps.truncate(top);
    maps
}

/// One mapping of `/proc/<pid>/smaps`, its sizes in KiB.
struct Mapping {
    /// `[heap]`, `[stack]`, a file, or `anon` for a mapping of no name.
    name: String,
    size: u64,
    anonymous: u64,
    private_dirty: u64,
}

/// The mappings of a process, in address order (none once it is gone).
fn mappings(pid: u32) -> Vec<Mapping> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/smaps")).unwrap_or_default();
    let mut maps: Vec<Mapping> = Vec::new();
    for line in s.lines() {
        let first = line.split_whitespace().next().unwrap_or("");
        // A mapping's header starts with its address range, `start-end`.
        if first.contains('-') && !first.ends_with(':') {
            let name = line.split_whitespace().nth(5).unwrap_or("anon").to_string();
            maps.push(Mapping {
                name,
                size: 0,
                anonymous: 0,
                private_dirty: 0,
            });
        } else if let Some(m) = maps.last_mut() {
            for (field, value) in [
                ("Size:", &mut m.size),
                ("Anonymous:", &mut m.anonymous),
                ("Private_Dirty:", &mut m.private_dirty),
            ] {
                if line.starts_with(field) {
                    *value = kib_field(line, field);
                }
            }
        }
    }
    maps
}

/// `Threads:` of a process (0 once it is gone).
pub fn threads(pid: u32) -> u64 {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    kib_field(&s, "Threads:")
}

/// glibc malloc arenas of a process: the main one plus each heap of the others, an
/// anonymous reservation of HEAP_MAX_SIZE (64 MiB on 64-bit, 1 MiB on 32-bit) aligned to
/// its size, seen in `maps` as a read-write part followed by a `---p` rest.
pub fn arenas(pid: u32) -> u64 {
    let heap: u64 = if cfg!(target_pointer_width = "64") {
        64 << 20
    } else {
        1 << 20
    };
    let anon: Vec<(u64, u64)> = maps::mappings(pid)
        .into_iter()
        .filter(|m| m.anonymous())
        .map(|m| (m.start, m.end))
        .collect();
    let mut n = 0;
    for (i, &(start, end)) in anon.iter().enumerate() {
        if start % heap != 0 {
            continue;
        }
        // Contiguous anonymous mappings that together make up exactly one heap.
        let mut reach = end;
        for &(s, e) in &anon[i + 1..] {
            if s != reach || reach >= start + heap {
                break;
            }
            reach = e;
        }
        if reach == start + heap {
            n += 1;
        }
    }
    n + 1
}

/// Containers whose process runs under `root` (the shim wrote `started.json`, on the
/// `boot/` tmpfs, and no `exit.json`, on the disk).
pub fn running_containers(root: &Path) -> usize {
    std::fs::read_dir(root.join("boot/containers"))
        .map(|d| {
            d.flatten()
                .filter(|e| {
                    e.path().join("started.json").exists()
                        && !root
                            .join("containers")
                            .join(e.file_name())
                            .join("exit.json")
                            .exists()
                })
                .count()
        })
        .unwrap_or(0)
}

/// A static pod running busybox `sleep` on the host network, `name` also its file name.
pub fn pod_manifest(name: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: {name}\nspec:\n  hostNetwork: true\n  \
         terminationGracePeriodSeconds: 0\n  containers:\n  - name: c\n    image: busybox:bench\n    \
         command: [\"sleep\", \"100000\"]\n"
    )
}

/// The shims of containers under `root`, and their memory in KiB.
#[derive(Clone, Copy, Debug, Default)]
pub struct Shims {
    pub count: usize,
    pub rss: u64,
    pub pss: u64,
    pub private_dirty: u64,
    /// Of `private_dirty`, the part in the mappings of the binary itself.
    pub binary_private_dirty: u64,
}

impl Shims {
    pub fn per_shim(&self, total: u64) -> u64 {
        total / (self.count.max(1) as u64)
    }
}

pub fn shim_memory(root: &Path) -> Shims {
    let mut out = Shims::default();
    let root = root.display().to_string();
    for e in std::fs::read_dir("/proc").expect("/proc").flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let cmd = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
        let cmd = String::from_utf8_lossy(&cmd);
        if cmd.contains("\0shim\0") && cmd.contains(&*root) {
            let r = rollup(pid);
            out.count += 1;
            out.rss += r.rss;
            out.pss += r.pss;
            out.private_dirty += r.private_dirty;
            if let Ok(exe) = std::fs::read_link(format!("/proc/{pid}/exe")) {
                out.binary_private_dirty += file_private_dirty(pid, &exe);
            }
        }
    }
    out
}

/// Wall time of `<rt> run -d` for each of `n` containers of `bundle`, or None when `rt`
/// is missing or fails. crun refuses a hybrid cgroup v1 layout unless the unified mount
/// is hidden, so it runs in a private mount namespace without it (a few ms of `unshare`
/// included).
pub fn time_runtime(rt: &str, bundle: &Path, extra: &[&str], n: usize) -> Option<Vec<Duration>> {
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
    for i in 0..n {
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
    // Empty by now: every container was deleted.
    let _ = std::fs::remove_dir_all(&state);
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
pub fn stats(samples: &[Duration]) -> (f64, f64, f64) {
    let mut ms: Vec<f64> = samples.iter().map(|d| d.as_secs_f64() * 1000.0).collect();
    if ms.is_empty() {
        return (0.0, 0.0, 0.0);
    }
    ms.sort_by(|a, b| a.total_cmp(b));
    let at = |q: f64| ms[((ms.len() as f64 - 1.0) * q).round() as usize];
    (at(0.5), at(0.95), ms.last().copied().unwrap_or(0.0))
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
    make_bundle_from_layer(&layer, bundle);
}

/// The same bundle with the unpacked layer `layer` as its rootfs.
pub fn make_bundle_from_layer(layer: &Path, bundle: &Path) {
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

/// A whole number from the environment variable `name` (a count, or seconds), or
/// `default` where it is not set.
pub fn env_secs(name: &str, default: u64) -> u64 {
    match std::env::var(name) {
        Ok(v) => v
            .parse()
            .unwrap_or_else(|_| panic!("{name}: whole seconds, got {v:?}")),
        Err(_) => default,
    }
}
