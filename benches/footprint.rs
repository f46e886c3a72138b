//! The footprint against its goals, run on demand as root: `cargo bench --bench footprint`.
//!
//! - Stripped size of each `target/<triple>/release/holdfast` built, and its section
//!   split from `size -A` (`.text`, `.rodata`, `.eh_frame*`, `.rela.dyn`, `.data.rel.ro`).
//! - Agent PSS fresh with no pods; again after a burst of pods started and stopped at
//!   once, with the peak threads and malloc arenas during the burst.
//! - Agent plus shims PSS with 20 and 100 running pods; per-shim PSS and Private_Dirty,
//!   and how much of that is the binary's own (relocated) pages.
//! - Bytes written to disk per pod started and stopped, the agent's root dir on a
//!   loop-mounted ext4 image (sectors written from `/sys/block/loopN/stat`, synced).
//! - One container's create+start through the shim (the agent writes `shim.json`, the
//!   shim writes `started.json`: the two mtimes) beside `crun run -d` and `runc run -d`
//!   of the same bundle, p50.
//!
//! Prints the figures beside their goals and writes `target/bench/footprint.json`:
//! `{figure: {value, unit, goal, ok}, ..., "crun": {...}, "runc": {...}, "commit": ...}`.
//!
//! Knobs (environment):
//! - `HOLDFAST_BIN=/path`: measure that binary (agent and shims) instead of the one cargo
//!   built, e.g. an older commit's; `HOLDFAST_COMMIT` then names its commit. Sizes come
//!   from the target dir that binary is in.
//! - `FOOTPRINT_PODS_BURST` (100), `FOOTPRINT_PODS_RUNNING` (`20,100`),
//!   `FOOTPRINT_WRITE_PODS` (20), `FOOTPRINT_START_SAMPLES` (30),
//!   `FOOTPRINT_SETTLE_SECS` (30, the agent's idle time before its memory is read).
//! - `FOOTPRINT_BURSTS` (1): bursts in a row, to tell memory kept per pod from a
//!   high-water mark.
//! - `FOOTPRINT_SKIP=sizes,burst,running,start,writes`: leave those parts out.
//! - `FOOTPRINT_CODE_PAGES=DIR`: the agent's mapped code pages, fresh and after each
//!   burst, into DIR (`cross/hot-text.sh` reads them).

mod common;

use support::{loopfs, oci};

use std::collections::{BTreeMap, HashSet};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use common::{poll, rollup, shim_memory, stats, time_runtime, wait, Agent, Rollup};
use serde_json::json;

const MIB: f64 = 1024.0 * 1024.0;
const CGROUP_ROOT: &str = "/holdfast-footprint";
/// Long enough for 100 pods on a slow, shared machine.
const PODS_WITHIN: Duration = Duration::from_secs(600);

fn main() {
    if !nix::unistd::geteuid().is_root() {
        eprintln!("footprint bench: needs root (it runs containers and mounts a loop device)");
        std::process::exit(2);
    }
    let knobs = match Knobs::from_env() {
        Ok(k) => k,
        Err(e) => {
            eprintln!("footprint bench: {e}");
            std::process::exit(2);
        }
    };
    let started = Instant::now();
    let mut report = Report::default();
    let dir = std::env::temp_dir().join(format!("holdfast-footprint-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("bench dir");
    let _dir = RemoveOnDrop(dir.clone());
    let image = dir.join("busybox.tar");
    oci::busybox_image("docker.io/library/busybox:bench")
        .and_then(|i| i.write_layout_tar(&image))
        .expect("busybox image");

    if !knobs.skips("sizes") {
        sizes(&mut report);
    }
    if !(knobs.skips("burst") && knobs.skips("running") && knobs.skips("start")) {
        let mut s = Session::start(&dir.join("agent"), &dir.join("agent/root"), &image);
        fresh_and_burst(&knobs, &mut s, &mut report);
        running_and_start(&knobs, &mut s, &mut report);
    }
    if !knobs.skips("writes") {
        writes(&knobs, &dir, &image, &mut report);
    }

    report.print();
    println!(
        "\nbinary {} at {}; the run took {:.0} s",
        common::bin().display(),
        commit(),
        started.elapsed().as_secs_f64()
    );
    common::write_json("footprint", &report.json());
}

struct Knobs {
    burst: usize,
    /// Bursts in a row: memory that grows with each is kept per pod, not a high-water
    /// mark.
    bursts: usize,
    running: Vec<usize>,
    write_pods: usize,
    samples: usize,
    settle: Duration,
    skip: Vec<String>,
}

impl Knobs {
    fn from_env() -> Result<Knobs, String> {
        let num = |name: &str, default: usize| -> Result<usize, String> {
            match std::env::var(name) {
                Err(_) => Ok(default),
                Ok(v) => v
                    .trim()
                    .parse::<usize>()
                    .ok()
                    .filter(|n| *n <= 1000)
                    .ok_or_else(|| format!("{name}={v:?}: give a whole number up to 1000")),
            }
        };
        let mut running = Vec::new();
        for part in std::env::var("FOOTPRINT_PODS_RUNNING")
            .unwrap_or_else(|_| "20,100".into())
            .split(',')
            .filter(|p| !p.trim().is_empty())
        {
            let n = part
                .trim()
                .parse::<usize>()
                .ok()
                .filter(|n| (1..=1000).contains(n))
                .ok_or_else(|| {
                    format!("FOOTPRINT_PODS_RUNNING: {part:?} is not a pod count from 1 to 1000")
                })?;
            running.push(n);
        }
        running.sort_unstable();
        running.dedup();
        let skip = std::env::var("FOOTPRINT_SKIP")
            .unwrap_or_default()
            .split(',')
            .map(|s| s.trim().to_string())
            .filter(|s| !s.is_empty())
            .collect();
        Ok(Knobs {
            burst: num("FOOTPRINT_PODS_BURST", 100)?,
            bursts: num("FOOTPRINT_BURSTS", 1)?.max(1),
            running,
            write_pods: num("FOOTPRINT_WRITE_PODS", 20)?.max(1),
            samples: num("FOOTPRINT_START_SAMPLES", 30)?,
            settle: Duration::from_secs(num("FOOTPRINT_SETTLE_SECS", 30)? as u64),
            skip,
        })
    }

    fn skips(&self, part: &str) -> bool {
        self.skip.iter().any(|s| s == part)
    }
}

/// One measured figure; `value` None when it could not be measured (`note` says why).
struct Figure {
    key: String,
    label: String,
    value: Option<f64>,
    unit: &'static str,
    /// (the most `value` may be, how the goal reads).
    goal: Option<(f64, String)>,
    crun: Option<String>,
    runc: Option<String>,
    note: String,
}

impl Figure {
    fn new(key: &str, label: &str, value: Option<f64>, unit: &'static str) -> Figure {
        Figure {
            key: key.into(),
            label: label.into(),
            value,
            unit,
            goal: None,
            crun: None,
            runc: None,
            note: String::new(),
        }
    }

    fn goal(mut self, max: f64, text: impl Into<String>) -> Figure {
        self.goal = Some((max, text.into()));
        self
    }

    fn note(mut self, note: impl Into<String>) -> Figure {
        self.note = note.into();
        self
    }

    fn ok(&self) -> Option<bool> {
        Some(self.value? <= self.goal.as_ref()?.0)
    }
}

#[derive(Default)]
struct Report {
    figures: Vec<Figure>,
    /// Raw figures behind the table, for the JSON.
    detail: BTreeMap<String, serde_json::Value>,
    crun: serde_json::Value,
    runc: serde_json::Value,
}

impl Report {
    fn print(&self) {
        println!(
            "\n{:<52} {:>12} {:<5} {:<18} {:<4} {:>14} {:>14}",
            "figure", "value", "unit", "goal", "ok", "crun", "runc"
        );
        for f in &self.figures {
            let value = f
                .value
                .map(|v| format!("{v:.2}"))
                .unwrap_or_else(|| "-".into());
            let ok = match f.ok() {
                Some(true) => "yes",
                Some(false) => "NO",
                None => "-",
            };
            println!(
                "{:<52} {:>12} {:<5} {:<18} {:<4} {:>14} {:>14}",
                f.label,
                value,
                f.unit,
                f.goal.as_ref().map(|g| g.1.as_str()).unwrap_or("-"),
                ok,
                f.crun.as_deref().unwrap_or("-"),
                f.runc.as_deref().unwrap_or("-"),
            );
            if !f.note.is_empty() {
                println!("    {}", f.note);
            }
        }
    }

    fn json(&self) -> serde_json::Value {
        let mut out = serde_json::Map::new();
        for f in &self.figures {
            out.insert(
                f.key.clone(),
                json!({
                    "label": f.label,
                    "value": f.value,
                    "unit": f.unit,
                    "goal": f.goal.as_ref().map(|g| g.1.clone()),
                    "ok": f.ok(),
                    "note": f.note,
                }),
            );
        }
        out.insert("crun".into(), self.crun.clone());
        out.insert("runc".into(), self.runc.clone());
        out.insert("commit".into(), json!(commit()));
        out.insert("binary".into(), json!(common::bin()));
        out.insert("detail".into(), json!(self.detail));
        serde_json::Value::Object(out)
    }
}

/// The commit the measured binary was built from: `HOLDFAST_COMMIT` with `HOLDFAST_BIN`,
/// else this tree's HEAD (`+dirty` when it has uncommitted changes).
fn commit() -> String {
    if std::env::var_os("HOLDFAST_BIN").is_some() {
        return std::env::var("HOLDFAST_COMMIT").unwrap_or_else(|_| "unknown".into());
    }
    let git = |args: &[&str]| {
        Command::new("git")
            .args(args)
            .current_dir(env!("CARGO_MANIFEST_DIR"))
            .output()
            .ok()
            .filter(|o| o.status.success())
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
    };
    let Some(head) = git(&["rev-parse", "--short=12", "HEAD"]) else {
        return "unknown".into();
    };
    match git(&["status", "--porcelain", "--untracked-files=no"]) {
        Some(s) if !s.is_empty() => format!("{head}+dirty"),
        _ => head,
    }
}

// ---------------------------------------------------------------------------------------
// Sizes

fn sizes(report: &mut Report) {
    let host = common::bin();
    // target/release/holdfast → target; with HOLDFAST_BIN, the target dir it was built in.
    let target = host
        .parent()
        .and_then(Path::parent)
        .map(Path::to_path_buf)
        .unwrap_or_default();
    let mut builds: Vec<(String, PathBuf)> =
        vec![(format!("host ({})", std::env::consts::ARCH), host.clone())];
    if let Ok(dir) = std::fs::read_dir(&target) {
        let mut triples: Vec<_> = dir
            .flatten()
            .map(|e| e.path())
            .filter(|p| p.join("release/holdfast").is_file())
            .collect();
        triples.sort();
        for t in triples {
            let name = t
                .file_name()
                .unwrap_or_default()
                .to_string_lossy()
                .into_owned();
            builds.push((name, t.join("release/holdfast")));
        }
    }
    let mut seen_aarch64 = false;
    let mut detail = serde_json::Map::new();
    for (name, path) in builds {
        let arch = name.split('-').next().unwrap_or("").to_string();
        let (strip, size) = match arch.as_str() {
            "aarch64" => ("aarch64-linux-gnu-strip", "aarch64-linux-gnu-size"),
            "armv7" => ("arm-linux-gnueabihf-strip", "arm-linux-gnueabihf-size"),
            _ => ("strip", "size"),
        };
        let stripped =
            std::env::temp_dir().join(format!("holdfast-footprint-{}-{name}", std::process::id()));
        let _gone = RemoveOnDrop(stripped.clone());
        let ok = Command::new(strip)
            .arg("-o")
            .arg(&stripped)
            .arg(&path)
            .status()
            .map(|s| s.success())
            .unwrap_or(false);
        let Some(bytes) = ok
            .then(|| std::fs::metadata(&stripped).ok())
            .flatten()
            .map(|m| m.len())
        else {
            eprintln!(
                "{name}: `{strip}` failed on {}; size left out",
                path.display()
            );
            continue;
        };
        let split = sections(size, &stripped);
        let split_text = split
            .iter()
            .map(|(s, b)| format!("{s} {:.2}", *b as f64 / MIB))
            .collect::<Vec<_>>()
            .join(", ");
        let modified = std::fs::metadata(&path)
            .and_then(|m| m.modified())
            .ok()
            .map(humantime_utc)
            .unwrap_or_default();
        let mut f = Figure::new(
            &format!("size_{arch}"),
            &format!("{name} binary, stripped"),
            Some(bytes as f64 / MIB),
            "MiB",
        )
        .note(format!("{split_text} (MiB; built {modified})"));
        if arch == "aarch64" {
            f = f.goal(8.0, "≤ 8 MiB");
            seen_aarch64 = true;
        }
        if name.starts_with("host") {
            f.key = "size_host".into();
        }
        detail.insert(
            f.key.clone(),
            json!({"path": path, "bytes": bytes, "sections": split.iter().cloned().collect::<BTreeMap<_, _>>(), "built": modified}),
        );
        report.figures.push(f);
    }
    if !seen_aarch64 {
        report.figures.push(
            Figure::new("size_aarch64", "aarch64 binary, stripped", None, "MiB")
                .goal(8.0, "≤ 8 MiB")
                .note(format!(
                    "not built: no {}/aarch64-unknown-linux-gnu/release/holdfast",
                    target.display()
                )),
        );
    }
    report.detail.insert("sizes".into(), detail.into());
}

/// Bytes of the sections that matter for size, from `size -A`.
fn sections(tool: &str, file: &Path) -> Vec<(String, u64)> {
    let out = Command::new(tool)
        .arg("-A")
        .arg(file)
        .output()
        .ok()
        .filter(|o| o.status.success())
        .or_else(|| Command::new("size").arg("-A").arg(file).output().ok());
    let text = out
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        .unwrap_or_default();
    let mut sums: Vec<(String, u64)> = [
        ".text",
        ".rodata",
        ".eh_frame*",
        ".rela.dyn",
        ".data.rel.ro",
    ]
    .iter()
    .map(|s| (s.to_string(), 0))
    .collect();
    for line in text.lines() {
        let mut words = line.split_whitespace();
        let (Some(name), Some(bytes)) = (words.next(), words.next()) else {
            continue;
        };
        let Ok(bytes) = bytes.parse::<u64>() else {
            continue;
        };
        for (section, sum) in sums.iter_mut() {
            let hit = match section.strip_suffix('*') {
                Some(prefix) => name.starts_with(prefix),
                None => name == section,
            };
            if hit {
                *sum = sum.saturating_add(bytes);
            }
        }
    }
    sums
}

fn humantime_utc(t: SystemTime) -> String {
    let secs = t
        .duration_since(SystemTime::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    let (h, m) = ((secs / 3600) % 24, (secs / 60) % 60);
    let days = secs / 86_400;
    format!("day {days} {h:02}:{m:02} UTC")
}

// ---------------------------------------------------------------------------------------
// An agent run

/// An agent on its own root dir, with its manifests folder; dropped, it removes every
/// pod, waits for their containers to stop, stops the agent and resets the root dir and
/// cgroups, also when the bench fails half-way.
struct Session {
    agent: Agent,
    root: PathBuf,
    manifests: PathBuf,
}

impl Session {
    /// An agent with its root dir at `root` and its manifests, config and log under
    /// `dir`, with the busybox image to import; returns once it has.
    fn start(dir: &Path, root: &Path, image: &Path) -> Session {
        let root = root.to_path_buf();
        let manifests = dir.join("manifests");
        std::fs::create_dir_all(root.join("images")).expect("root dir");
        std::fs::create_dir_all(&manifests).expect("manifests dir");
        std::fs::copy(image, root.join("images/busybox.tar")).expect("copy the image");
        let cfg = dir.join("config.yaml");
        std::fs::write(
            &cfg,
            format!("cgroupRoot: {CGROUP_ROOT}\nfileCheckFrequency: 20s\n"),
        )
        .expect("config");
        let agent = Agent::start(&root, &manifests, &cfg, &dir.join("agent.log"));
        let s = Session {
            agent,
            root,
            manifests,
        };
        wait(Duration::from_secs(60), || {
            s.root.join("holdfast.sock").exists()
        });
        // The image is imported (cached) before anything is measured.
        wait(Duration::from_secs(120), || {
            s.root
                .join("content/layers")
                .read_dir()
                .map(|mut d| d.next().is_some())
                .unwrap_or(false)
        });
        s
    }

    fn pid(&self) -> u32 {
        self.agent.pid()
    }

    fn add(&self, name: &str) {
        // Written beside and renamed in, so the agent never reads half a manifest.
        let tmp = self.manifests.join(format!(".{name}.tmp"));
        std::fs::write(&tmp, common::pod_manifest(name)).expect("write manifest");
        std::fs::rename(&tmp, self.manifests.join(format!("{name}.yaml"))).expect("manifest");
    }

    fn remove_all(&self) {
        for f in std::fs::read_dir(&self.manifests)
            .expect("manifests")
            .flatten()
        {
            let _ = std::fs::remove_file(f.path());
        }
    }

    fn running(&self) -> usize {
        common::running_containers(&self.root)
    }

    /// No container dir left: every pod removed has been cleaned up.
    fn no_containers(&self) -> bool {
        ["containers", "boot/containers"].iter().all(|d| {
            std::fs::read_dir(self.root.join(d))
                .map(|mut d| d.next().is_none())
                .unwrap_or(true)
        })
    }

    /// Removes every pod and waits until their containers are gone.
    fn clear(&self) {
        self.remove_all();
        wait(PODS_WITHIN, || self.running() == 0 && self.no_containers());
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        common::finish(
            &mut self.agent,
            &self.root,
            &self.manifests,
            CGROUP_ROOT,
            Duration::from_secs(120),
        );
    }
}

struct RemoveOnDrop(PathBuf);

impl Drop for RemoveOnDrop {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0).or_else(|_| std::fs::remove_file(&self.0));
    }
}

/// Thread names of a process and how many of each (`tokio-runtime-w` ×3).
fn thread_names(pid: u32) -> BTreeMap<String, u64> {
    let mut names = BTreeMap::new();
    if let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) {
        for t in tasks.flatten() {
            let comm = std::fs::read_to_string(t.path().join("comm")).unwrap_or_default();
            *names.entry(comm.trim().to_string()).or_insert(0) += 1;
        }
    }
    names
}

fn kib_to_mib(kib: u64) -> f64 {
    kib as f64 / 1024.0
}

// ---------------------------------------------------------------------------------------
// Fresh agent and the burst

fn fresh_and_burst(knobs: &Knobs, s: &mut Session, report: &mut Report) {
    // Memory settles: startup allocations are trimmed, the blocking pool's threads
    // (2 s keep-alive) exit, timers have run once.
    std::thread::sleep(knobs.settle);
    let pid = s.pid();
    let fresh_rollup = rollup(pid);
    save_code_pages(pid, "fresh");
    let (fresh, fresh_anon) = (fresh_rollup.pss, fresh_rollup.pss_anon);
    let fresh_threads = common::threads(pid);
    let fresh_arenas = common::arenas(pid);
    report.figures.push(
        Figure::new(
            "agent_fresh_pss",
            "agent PSS, fresh, no pods",
            Some(kib_to_mib(fresh)),
            "MiB",
        )
        .goal(6.0, "≤ 6 MiB")
        .note(format!(
            "{:.2} MiB of it anonymous, the rest file pages; {fresh_threads} threads, \
             {fresh_arenas} malloc arenas, after {} s idle",
            kib_to_mib(fresh_anon),
            knobs.settle.as_secs()
        )),
    );
    report.detail.insert(
        "fresh".into(),
        json!({"pss_kib": fresh, "pss_anon_kib": fresh_anon, "threads": fresh_threads, "arenas": fresh_arenas, "thread_names": thread_names(pid),
               "anon_mappings": common::anon_mappings(pid, 12)}),
    );
    if knobs.skips("burst") || knobs.burst == 0 {
        return;
    }

    // Sampled every 100 ms while the burst runs: the peaks are what the device must hold.
    let stop = Arc::new(AtomicBool::new(false));
    let peak_threads = Arc::new(AtomicU64::new(0));
    let peak_arenas = Arc::new(AtomicU64::new(0));
    let sampler = {
        let (stop, threads, arenas) = (stop.clone(), peak_threads.clone(), peak_arenas.clone());
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                threads.fetch_max(common::threads(pid), Ordering::Relaxed);
                arenas.fetch_max(common::arenas(pid), Ordering::Relaxed);
                std::thread::sleep(Duration::from_millis(100));
            }
        })
    };
    let mut anon_after_each = Vec::new();
    let (mut up, mut down) = (Duration::ZERO, Duration::ZERO);
    let mut after_rollup = Rollup::default();
    for round in 0..knobs.bursts {
        let t0 = Instant::now();
        for i in 0..knobs.burst {
            s.add(&format!("burst{round}-{i}"));
        }
        wait(PODS_WITHIN, || s.running() >= knobs.burst);
        up = t0.elapsed();
        let t1 = Instant::now();
        s.clear();
        down = t1.elapsed();
        // Idle again: the same settle as the fresh figure, so the two compare.
        std::thread::sleep(knobs.settle);
        after_rollup = rollup(pid);
        save_code_pages(pid, &format!("after-burst-{round}"));
        anon_after_each.push(kib_to_mib(after_rollup.pss_anon));
    }
    stop.store(true, Ordering::Relaxed);
    let _ = sampler.join();
    let (after, after_anon) = (after_rollup.pss, after_rollup.pss_anon);
    let threads = peak_threads.load(Ordering::Relaxed);
    let arenas = peak_arenas.load(Ordering::Relaxed);
    let after_arenas = common::arenas(pid);
    let after_threads = common::threads(pid);
    let n = knobs.burst;
    report.figures.push(
        Figure::new(
            "agent_after_burst_pss",
            &format!("agent PSS, no pods, after a burst of {n}"),
            Some(kib_to_mib(after)),
            "MiB",
        )
        .goal(
            kib_to_mib(fresh) * 1.2,
            format!("≤ 1.2 × fresh ({:.2})", kib_to_mib(fresh) * 1.2),
        )
        .note(format!(
            "{:.2} × fresh; anonymous {:.2} → {} MiB; burst peak {threads} threads, {arenas} \
             arenas; after: {after_threads} threads, {after_arenas} arenas; {n} up in {:.1} s, \
             down in {:.1} s",
            after as f64 / fresh.max(1) as f64,
            kib_to_mib(fresh_anon),
            anon_after_each
                .iter()
                .map(|m| format!("{m:.2}"))
                .collect::<Vec<_>>()
                .join(" → "),
            up.as_secs_f64(),
            down.as_secs_f64()
        )),
    );
    report.figures.push(Figure::new(
        "burst_peak_threads",
        "agent peak threads during the burst",
        Some(threads as f64),
        "",
    ));
    report.figures.push(Figure::new(
        "burst_peak_arenas",
        "agent peak malloc arenas during the burst",
        Some(arenas as f64),
        "",
    ));
    report.detail.insert(
        "burst".into(),
        json!({"pods": n, "pss_after_kib": after, "pss_anon_after_kib": after_anon, "ratio": after as f64 / fresh.max(1) as f64,
               "peak_threads": threads, "peak_arenas": arenas, "threads_after": after_threads,
               "arenas_after": after_arenas, "thread_names_after": thread_names(pid),
               "anon_mappings_after": common::anon_mappings(pid, 12),
               "up_s": up.as_secs_f64(), "down_s": down.as_secs_f64()}),
    );
}

/// With `FOOTPRINT_CODE_PAGES=DIR` (set by `cross/hot-text.sh`): the pages of the
/// agent's code that are mapped at this point, one hex address per line, into
/// `DIR/<what>.pages` (from `/proc/<pid>/pagemap`, root).
fn save_code_pages(pid: u32, what: &str) {
    let Some(dir) = std::env::var_os("FOOTPRINT_CODE_PAGES") else {
        return;
    };
    let exe = std::fs::read_link(format!("/proc/{pid}/exe")).expect("the agent's exe");
    let page = support::maps::page_size();
    let mut out = String::new();
    for m in support::maps::mappings(pid) {
        if m.perms != "r-xp" || Path::new(&m.name) != exe {
            continue;
        }
        let resident = support::maps::resident(pid, m.start, m.end).expect("the agent's pagemap");
        for (i, _) in resident.iter().enumerate().filter(|(_, r)| **r) {
            out.push_str(&format!("{:x}\n", m.start + i as u64 * page));
        }
    }
    std::fs::write(Path::new(&dir).join(format!("{what}.pages")), out).expect("pages file");
}

// ---------------------------------------------------------------------------------------
// Running pods and the start path

fn running_and_start(knobs: &Knobs, s: &mut Session, report: &mut Report) {
    let counts: Vec<usize> = if knobs.skips("running") {
        Vec::new()
    } else {
        knobs.running.clone()
    };
    let samples = if knobs.skips("start") {
        0
    } else {
        knobs.samples
    };
    let total = counts.last().copied().unwrap_or(0).max(samples);
    let mut e2e = Vec::new();
    let mut shim = Vec::new();
    let mut seen = HashSet::new();
    // One pod after another: each start is timed alone, and memory is read on the way up.
    for i in 0..total {
        let t0 = Instant::now();
        s.add(&format!("p{i}"));
        wait(Duration::from_secs(60), || s.running() > i);
        if i < samples {
            e2e.push(t0.elapsed());
            shim.extend(new_shim_starts(&s.root, &mut seen));
        }
        if counts.contains(&(i + 1)) {
            // Settled as pods run for days: status written, logs opened, the start's
            // threads let go and the agent's trim after the burst of starts done.
            std::thread::sleep(knobs.settle);
            running_memory(s, i + 1, report);
        }
    }

    if samples > 0 {
        let bundle = s.manifests.parent().expect("agent dir").join("bundle");
        common::make_bundle(&s.root, &bundle);
        let crun = time_runtime("crun", &bundle, &["--cgroup-manager=cgroupfs"], samples);
        let runc = time_runtime("runc", &bundle, &[], samples);
        let p50 = |v: &Option<Vec<Duration>>| v.as_ref().map(|v| stats(v).0);
        let (shim_p, e2e_p) = (stats(&shim), stats(&e2e));
        let mut f = Figure::new(
            "start_shim_p50",
            "create+start via the shim, p50",
            (!shim.is_empty()).then_some(shim_p.0),
            "ms",
        );
        f = match p50(&crun) {
            Some(c) => f.goal(c * 1.2, format!("≤ 1.2 × crun ({:.1})", c * 1.2)),
            None => f.note("crun not installed: no goal to hold it to"),
        };
        f.crun = Some(p50(&crun).map_or("not installed".into(), |c| format!("{c:.1}")));
        f.runc = Some(p50(&runc).map_or("not installed".into(), |c| format!("{c:.1}")));
        if f.note.is_empty() {
            f = f.note(format!(
                "shim.json → started.json over {} starts; p95 {:.1}",
                shim.len(),
                shim_p.1
            ));
        }
        report.figures.push(f);
        report.figures.push(
            Figure::new(
                "start_manifest_p50",
                "manifest → running (agent and shim), p50",
                Some(e2e_p.0),
                "ms",
            )
            .note(format!("p95 {:.1}, max {:.1}", e2e_p.1, e2e_p.2)),
        );
        let rt_json = |v: &Option<Vec<Duration>>| match v {
            Some(v) => {
                let (p50, p95, max) = stats(v);
                json!({"run_d_ms": {"p50": p50, "p95": p95, "max": max, "n": v.len()}})
            }
            None => json!("not installed"),
        };
        report.crun = rt_json(&crun);
        report.runc = rt_json(&runc);
        report.detail.insert(
            "start".into(),
            json!({"samples": samples,
                   "shim_ms": {"p50": shim_p.0, "p95": shim_p.1, "max": shim_p.2},
                   "manifest_to_running_ms": {"p50": e2e_p.0, "p95": e2e_p.1, "max": e2e_p.2}}),
        );
    }
    if total > 0 {
        s.clear();
    }
}

/// The shim's create+start of containers that started since the last call: from the
/// agent writing `shim.json` (just before it runs `shim start`) to the shim writing
/// `started.json`.
fn new_shim_starts(root: &Path, seen: &mut HashSet<PathBuf>) -> Vec<Duration> {
    let mut out = Vec::new();
    let Ok(dir) = std::fs::read_dir(root.join("boot/containers")) else {
        return out;
    };
    for e in dir.flatten() {
        let path = e.path();
        if seen.contains(&path) || !path.join("started.json").exists() {
            continue;
        }
        let mtime = |f: &str| {
            std::fs::metadata(path.join(f))
                .and_then(|m| m.modified())
                .ok()
        };
        if let (Some(a), Some(b)) = (mtime("shim.json"), mtime("started.json")) {
            if let Ok(d) = b.duration_since(a) {
                out.push(d);
            }
        }
        seen.insert(path);
    }
    out
}

fn running_memory(s: &Session, pods: usize, report: &mut Report) {
    let agent = rollup(s.pid()).pss;
    let shims = shim_memory(&s.root);
    let total = agent + shims.pss;
    let mut f = Figure::new(
        &format!("running_{pods}_pss"),
        &format!("{pods} running pods, agent + shims PSS"),
        Some(kib_to_mib(total)),
        "MiB",
    );
    match pods {
        20 => f = f.goal(16.0, "≤ 16 MiB"),
        100 => f = f.goal(48.0, "≤ 48 MiB"),
        _ => {}
    }
    f = f.note(format!(
        "agent {:.2} MiB, {} shims {:.2} MiB; per shim PSS {} KiB, Private_Dirty {} KiB \
         ({} KiB of it in the binary's own pages)",
        kib_to_mib(agent),
        shims.count,
        kib_to_mib(shims.pss),
        shims.per_shim(shims.pss),
        shims.per_shim(shims.private_dirty),
        shims.per_shim(shims.binary_private_dirty),
    ));
    report.figures.push(f);
    report.detail.insert(
        format!("running_{pods}"),
        json!({"agent_pss_kib": agent, "agent_threads": common::threads(s.pid()),
               "shims": shims.count, "shims_pss_kib": shims.pss, "shims_rss_kib": shims.rss,
               "per_shim_pss_kib": shims.per_shim(shims.pss),
               "per_shim_private_dirty_kib": shims.per_shim(shims.private_dirty),
               "per_shim_binary_private_dirty_kib": shims.per_shim(shims.binary_private_dirty)}),
    );
}

// ---------------------------------------------------------------------------------------
// Writes per pod

fn writes(knobs: &Knobs, dir: &Path, image: &Path, report: &mut Report) {
    let n = knobs.write_pods;
    // Declared first, dropped last: the agent is stopped before the unmount.
    let disk = match loopfs::LoopFs::mount(&dir.join("disk"), 512) {
        Ok(d) => d,
        Err(e) => {
            report.figures.push(
                Figure::new(
                    "writes_per_pod",
                    "written to disk per pod started and stopped",
                    None,
                    "KiB",
                )
                .goal(32.0, "≤ 32 KiB")
                .note(format!("no loop-mounted ext4: {e}")),
            );
            return;
        }
    };
    let s = Session::start(&dir.join("writes"), &disk.mount.join("root"), image);
    // The image import is written out before counting starts.
    quiet(&disk, Duration::from_secs(60));
    let idle = disk
        .bytes_written_during(|| std::thread::sleep(Duration::from_secs(5)))
        .map(|(b, ())| b)
        .unwrap_or(0);
    let t0 = Instant::now();
    let measured = disk.bytes_written_during(|| {
        for i in 0..n {
            s.add(&format!("w{i}"));
            wait(Duration::from_secs(60), || s.running() == 1);
            s.clear();
        }
        // What the agent still holds back (a store flush timer) lands before the count.
        quiet(&disk, Duration::from_secs(30));
    });
    let took = t0.elapsed();
    let f = match measured {
        Ok((bytes, ())) => {
            let per_pod = bytes as f64 / 1024.0 / n as f64;
            Figure::new(
                "writes_per_pod",
                &format!("written to disk per pod started and stopped ({n})"),
                Some(per_pod),
                "KiB",
            )
            .goal(32.0, "≤ 32 KiB")
            .note(format!(
                "{:.0} KiB in {:.1} s, journal included; idle agent writes {:.1} KiB per 5 s",
                bytes as f64 / 1024.0,
                took.as_secs_f64(),
                idle as f64 / 1024.0
            ))
        }
        Err(e) => Figure::new(
            "writes_per_pod",
            "written to disk per pod started and stopped",
            None,
            "KiB",
        )
        .goal(32.0, "≤ 32 KiB")
        .note(format!("could not read the loop device's counters: {e}")),
    };
    report.detail.insert(
        "writes".into(),
        json!({"pods": n, "per_pod_kib": f.value, "idle_kib_per_5s": idle as f64 / 1024.0, "seconds": took.as_secs_f64()}),
    );
    report.figures.push(f);
    drop(s);
    drop(disk);
}

/// Waits (up to `within`) until a second passes with nothing written to `disk` after a
/// sync: what was pending is on it.
fn quiet(disk: &loopfs::LoopFs, within: Duration) {
    let mut last = None;
    let settled = poll(within, || {
        nix::unistd::sync();
        let now = disk.bytes_written().ok();
        let same = now.is_some() && now == last;
        last = now;
        if !same {
            std::thread::sleep(Duration::from_secs(1));
        }
        same
    });
    if !settled {
        eprintln!("the disk did not go quiet within {within:?}; counting anyway");
    }
}
