//! End-to-end: hostile manifests and images, one per test, fed to a real agent that runs
//! one healthy static pod. After each the agent still runs, the healthy pod's container
//! is the very one it was (same ID, same start, no restart), the bad pod is refused or
//! fails saying why, and once its manifest is removed nothing of it is left: no
//! container, cgroup, mount or shim process. Real containers (as root).

use support::{agent, kubelet_api, pki};

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use agent::oci::{self, Entry, Layer};
use agent::{cgroup_dirs, container, need_root, sh_pod, Agent};
use serde_json::Value;

const MIN: Duration = Duration::from_secs(60);

/// A pod `name` of one container `main` running `script`, with `spec` and `main` added
/// to the pod's spec and to the container.
fn pod(name: &str, spec: &str, script: &str, main: &str) -> String {
    sh_pod(name, spec, "main", script, main)
}

/// `i64::MAX`, the largest number the API's int64 fields take.
const HUGE: &str = "9223372036854775807";

const HEALTHY: &str = "apiVersion: v1\nkind: Pod\nmetadata:\n  name: healthy\nspec:\n  \
    hostNetwork: true\n  terminationGracePeriodSeconds: 1\n  containers:\n  - name: main\n    \
    image: busybox:demo\n    command: [\"sleep\", \"3600\"]\n";

/// A container script that ends at once on SIGTERM (sleep as PID 1 ignores it).
const TRAP_TERM: &str = "trap 'exit 0' TERM; while true; do sleep 1; done";

/// An agent running the healthy pod, and what its container was when it started.
struct Bench {
    a: Agent,
    healthy_id: String,
    healthy_uid: String,
    healthy_started: Value,
}

impl Bench {
    fn new(name: &str) -> Bench {
        Bench::with(name, |_| {})
    }

    /// As `new`, with `setup` run on the agent before it starts.
    fn with(name: &str, setup: impl FnOnce(&mut Agent)) -> Bench {
        let mut a = Agent::new(&format!("hostile-{name}"));
        setup(&mut a);
        a.write_manifest("healthy.yaml", HEALTHY);
        a.start();
        let p = a.wait_pod("healthy", "running", MIN, |p| {
            container(p, "main")["state"]["running"].is_object()
        });
        let healthy_id = container(&p, "main")["containerID"]
            .as_str()
            .and_then(|s| s.strip_prefix("libcontainer://"))
            .expect("healthy containerID")
            .to_string();
        let healthy_started = container(&p, "main")["state"]["running"]["startedAt"].clone();
        let healthy_uid = p["pod"]["metadata"]["uid"]
            .as_str()
            .expect("healthy uid")
            .to_string();
        Bench {
            a,
            healthy_id,
            healthy_uid,
            healthy_started,
        }
    }

    /// The agent runs, and the healthy pod's container is the one it was.
    fn assert_undisturbed(&mut self) {
        if let Some(status) = self.a.exited() {
            panic!(
                "the agent died ({status})\n--- agent log ---\n{}",
                tail(&self.a.agent_log())
            );
        }
        let p = self.a.pod("healthy").expect("the healthy pod is listed");
        let main = container(&p, "main");
        assert_eq!(
            main["containerID"],
            format!("libcontainer://{}", self.healthy_id),
            "the healthy pod's container changed: {main:#}"
        );
        assert_eq!(
            main["state"]["running"]["startedAt"], self.healthy_started,
            "the healthy pod's container restarted: {main:#}"
        );
        assert_eq!(main["restartCount"], 0, "{main:#}");
    }

    /// The pod `name` of manifest `file`: its UID once the agent lists it, or None when
    /// the agent refused the manifest (then its log says why; printed here).
    fn admitted(&self, file: &str, name: &str) -> Option<String> {
        let mut uid = None;
        let mut refused = None;
        self.a
            .wait_until(&format!("pod {name} listed or refused"), MIN, |a| {
                if let Some(p) = a.pod(name) {
                    uid = p["pod"]["metadata"]["uid"].as_str().map(str::to_owned);
                    return true;
                }
                refused = a
                    .agent_log()
                    .lines()
                    .find(|l| l.contains(file) && (l.contains("ERROR") || l.contains("WARN")))
                    .map(str::to_owned);
                refused.is_some()
            });
        if let Some(line) = refused {
            eprintln!("{name}: refused: {line}");
        }
        uid
    }

    /// Removes manifest `file`, which the agent refused: nothing changed.
    fn remove_refused(&mut self, file: &str) {
        self.a.remove_manifest(file);
        self.assert_undisturbed();
        let left: Vec<String> = self.leftovers("no-such-uid-at-all");
        assert!(left.is_empty(), "left behind: {left:#?}");
    }

    /// The pod `name`'s UID, once the agent lists it.
    fn uid(&self, name: &str) -> String {
        let p = self.a.wait_pod(name, "listed", MIN, |_| true);
        p["pod"]["metadata"]["uid"]
            .as_str()
            .expect("uid")
            .to_string()
    }

    /// Removes manifest `file` of pod `name` (UID `uid`), waits for the pod to go, and
    /// asserts nothing of it is left.
    fn remove(&mut self, file: &str, name: &str, uid: &str) {
        self.a.remove_manifest(file);
        self.a.wait_gone(name, MIN);
        self.assert_nothing_left(uid);
        self.assert_undisturbed();
    }

    /// No container, shim, cgroup or mount but the healthy pod's, and nothing named
    /// after pod `uid` under the agent's root.
    fn assert_nothing_left(&self, uid: &str) {
        let mut left = Vec::new();
        let deadline = Instant::now() + Duration::from_secs(30);
        while Instant::now() < deadline {
            left = self.leftovers(uid);
            if left.is_empty() {
                return;
            }
            std::thread::sleep(Duration::from_millis(200));
        }
        panic!(
            "left behind by pod {uid}: {left:#?}\n--- agent log ---\n{}",
            tail(&self.a.agent_log())
        );
    }

    fn leftovers(&self, uid: &str) -> Vec<String> {
        let a = &self.a;
        let mut left = Vec::new();
        let names = uid_forms(uid);
        let named = |s: &str| names.iter().any(|n| s.contains(n.as_str()));
        for e in ["containers", "boot/containers"]
            .iter()
            .flat_map(|d| std::fs::read_dir(a.root.join(d)))
            .flatten()
            .flatten()
        {
            if e.file_name().to_string_lossy() != self.healthy_id {
                left.push(format!("container dir {}", e.path().display()));
            }
        }
        for dir in a.shim_dirs() {
            if !dir.ends_with(&self.healthy_id) {
                left.push(format!("shim for {dir}"));
            }
        }
        for base in cgroup_dirs(&a.cgroup_root) {
            walk(&base, 6, &mut |p| {
                if named(&p.display().to_string()) {
                    left.push(format!("cgroup {}", p.display()));
                }
            });
        }
        let dir = a.dir.display().to_string();
        let healthy = format!("containers/{}", self.healthy_id);
        // The runtime's own tmpfs for what lasts one boot: the agent's, not a pod's.
        let boot = a.root.join("boot").display().to_string();
        for l in std::fs::read_to_string("/proc/self/mountinfo")
            .unwrap_or_default()
            .lines()
        {
            let Some(mp) = l.split_whitespace().nth(4) else {
                continue;
            };
            let theirs = mp.contains(&healthy)
                || uid_forms(&self.healthy_uid)
                    .iter()
                    .any(|n| mp.contains(n.as_str()));
            if named(mp) || (mp.starts_with(&dir) && !theirs && mp != boot) {
                left.push(format!("mount {mp}"));
            }
        }
        for sub in ["pods", "logs", "containers", "boot/containers", "volumes"] {
            walk(&a.root.join(sub), 3, &mut |p| {
                if named(&p.file_name().unwrap_or_default().to_string_lossy()) {
                    left.push(format!("path {}", p.display()));
                }
            });
        }
        left
    }
}

impl Drop for Bench {
    fn drop(&mut self) {
        // The agent's own drop resets everything; say what the agent said first.
        if std::thread::panicking() {
            eprintln!("--- pods ---\n{}", self.a.pods_table());
        }
    }
}

/// The ways a pod's UID shows in paths: as is, without dashes (cgroups), with
/// underscores (systemd).
fn uid_forms(uid: &str) -> Vec<String> {
    let mut v = vec![uid.to_string(), uid.replace('-', ""), uid.replace('-', "_")];
    v.dedup();
    v.retain(|s| s.len() >= 8);
    v
}

/// The last 200 lines of a log.
fn tail(log: &str) -> String {
    let lines: Vec<&str> = log.lines().collect();
    lines[lines.len().saturating_sub(200)..].join("\n")
}

fn walk(dir: &Path, depth: u32, f: &mut dyn FnMut(&Path)) {
    if depth == 0 {
        return;
    }
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        if e.file_type().is_ok_and(|t| t.is_dir()) {
            f(&e.path());
            walk(&e.path(), depth - 1, f);
        } else {
            f(&e.path());
        }
    }
}

/// Why the pod is not running, as its status says: the pod's reason and message, and
/// each container's waiting or terminated reason and message.
fn why(p: &Value) -> String {
    let s = &p["status"];
    let mut out = Vec::new();
    for k in ["reason", "message"] {
        if let Some(v) = s[k].as_str() {
            out.push(v.to_string());
        }
    }
    for list in ["initContainerStatuses", "containerStatuses"] {
        for c in s[list].as_array().into_iter().flatten() {
            for state in ["waiting", "terminated"] {
                for k in ["reason", "message"] {
                    if let Some(v) = c["state"][state][k].as_str() {
                        out.push(v.to_string());
                    }
                }
            }
        }
    }
    out.join(" | ")
}

fn running(p: &Value) -> bool {
    container(p, "main")["state"]["running"].is_object()
}

fn phase(p: &Value) -> &str {
    p["status"]["phase"].as_str().unwrap_or("")
}

/// A pod that ends at once on SIGTERM runs, and is removed promptly even though its
/// grace period is `i64::MAX` seconds.
#[test]
fn a_grace_period_of_i64_max() {
    if !need_root() {
        return;
    }
    let mut b = Bench::new("grace");
    let spec = format!("  terminationGracePeriodSeconds: {HUGE}\n");
    b.a.write_manifest("grace.yaml", &pod("grace", &spec, TRAP_TERM, ""));
    let Some(uid) = b.admitted("grace.yaml", "grace") else {
        return b.remove_refused("grace.yaml");
    };
    let p = b.a.wait_pod("grace", "running or refused", MIN, |p| {
        running(p) || phase(p) == "Failed"
    });
    eprintln!("grace: phase {} {}", phase(&p), why(&p));
    b.assert_undisturbed();
    let t = Instant::now();
    b.remove("grace.yaml", "grace", &uid);
    eprintln!("grace: removed in {:?}", t.elapsed());
}

/// A liveness probe that fails, with its own grace period of `i64::MAX` seconds: the
/// container is killed and restarted, and the agent lives on.
#[test]
fn a_liveness_probe_grace_period_of_i64_max() {
    if !need_root() {
        return;
    }
    let mut b = Bench::new("probe-grace");
    let main = format!(
        "    livenessProbe:\n      exec:\n        command: [\"false\"]\n      \
         periodSeconds: 1\n      failureThreshold: 1\n      \
         terminationGracePeriodSeconds: {HUGE}\n"
    );
    b.a.write_manifest(
        "probe.yaml",
        &pod(
            "probe",
            "  terminationGracePeriodSeconds: 5\n",
            TRAP_TERM,
            &main,
        ),
    );
    let Some(uid) = b.admitted("probe.yaml", "probe") else {
        return b.remove_refused("probe.yaml");
    };
    let p =
        b.a.wait_pod("probe", "restarted by its probe, or refused", MIN, |p| {
            container(p, "main")["restartCount"].as_u64() >= Some(1) || phase(p) == "Failed"
        });
    eprintln!(
        "probe-grace: restartCount {} last {}",
        container(&p, "main")["restartCount"],
        container(&p, "main")["lastState"]
    );
    b.assert_undisturbed();
    b.remove("probe.yaml", "probe", &uid);
}

/// `activeDeadlineSeconds: i64::MAX` is a deadline never reached: the pod runs.
#[test]
fn an_active_deadline_of_i64_max() {
    if !need_root() {
        return;
    }
    let mut b = Bench::new("deadline");
    let spec = format!("  terminationGracePeriodSeconds: 1\n  activeDeadlineSeconds: {HUGE}\n");
    b.a.write_manifest("deadline.yaml", &pod("deadline", &spec, "sleep 3600", ""));
    let Some(uid) = b.admitted("deadline.yaml", "deadline") else {
        return b.remove_refused("deadline.yaml");
    };
    b.a.wait_pod("deadline", "running", MIN, running);
    // It stays running: the deadline did not wrap round into the past.
    let until = Instant::now() + Duration::from_secs(8);
    while Instant::now() < until {
        let p = b.a.pod("deadline").expect("pod deadline");
        assert!(
            running(&p) && phase(&p) == "Running",
            "the pod stopped: phase {} {}",
            phase(&p),
            why(&p)
        );
        std::thread::sleep(Duration::from_millis(500));
    }
    b.assert_undisturbed();
    b.remove("deadline.yaml", "deadline", &uid);
}

/// Thirteen variables, each `$(prev)$(prev)`: 8 KiB doubled twelve times is 32 MiB in
/// the last one. The pod fails saying why, and the agent's memory does not balloon.
#[test]
fn a_variable_expansion_bomb() {
    if !need_root() {
        return;
    }
    let mut b = Bench::new("env-bomb");
    let mut env = format!(
        "    env:\n    - name: V0\n      value: \"{}\"\n",
        "0123456789abcdef".repeat(512)
    );
    for i in 1..13 {
        env.push_str(&format!(
            "    - name: V{i}\n      value: \"$(V{p})$(V{p})\"\n",
            p = i - 1
        ));
    }
    let before = b.a.peak_rss_kib();
    b.a.write_manifest(
        "bomb.yaml",
        &pod(
            "bomb",
            "  terminationGracePeriodSeconds: 1\n",
            "sleep 3600",
            &env,
        ),
    );
    let Some(uid) = b.admitted("bomb.yaml", "bomb") else {
        let after = b.a.peak_rss_kib();
        assert!(
            after.saturating_sub(before) < 64 * 1024,
            "the agent's peak memory grew from {before} KiB to {after} KiB"
        );
        return b.remove_refused("bomb.yaml");
    };
    let p =
        b.a.wait_pod("bomb", "refused or failed, saying why", MIN, |p| {
            !why(p).is_empty() && !running(p) && !why(p).contains("ContainerCreating")
        });
    let after = b.a.peak_rss_kib();
    eprintln!(
        "env-bomb: {}; agent peak RSS {before} KiB -> {after} KiB",
        why(&p)
    );
    b.assert_undisturbed();
    assert!(
        after.saturating_sub(before) < 64 * 1024,
        "the agent's peak memory grew from {before} KiB to {after} KiB"
    );
    b.remove("bomb.yaml", "bomb", &uid);
}

/// A memory limit of one byte: no cgroup can hold the container. Its tries follow the
/// back-off (this agent's is 1 s doubling to 4 s), one shim at a time.
#[test]
fn a_memory_limit_of_one_byte() {
    if !need_root() {
        return;
    }
    let mut b = Bench::new("memory-one");
    let main = "    resources:\n      limits:\n        memory: \"1\"\n";
    b.a.write_manifest(
        "tiny.yaml",
        &pod(
            "tiny",
            "  terminationGracePeriodSeconds: 1\n",
            "sleep 3600",
            main,
        ),
    );
    let Some(uid) = b.admitted("tiny.yaml", "tiny") else {
        return b.remove_refused("tiny.yaml");
    };
    let p = b.a.wait_pod("tiny", "failing, saying why", MIN, |p| {
        container(p, "main")["state"]["waiting"]["message"].is_string()
            || container(p, "main")["lastState"]["terminated"].is_object()
    });
    let first = Instant::now();
    let prefix = format!("pod default/tiny-{}: container main: ", b.a.node_name);
    let tries = |a: &Agent| a.agent_log().matches(prefix.as_str()).count();
    let at_first = tries(&b.a);
    let mut most = 0;
    while first.elapsed() < Duration::from_secs(20) {
        most = most.max(b.a.shim_dirs().len());
        assert!(b.a.exited().is_none(), "the agent died");
        std::thread::sleep(Duration::from_millis(200));
    }
    let n = tries(&b.a) - at_first;
    eprintln!(
        "memory-one: {n} log lines about it in 20 s, shims for at most {most} containers; {}",
        why(&p)
    );
    // 1 + 2 + 4 + 4 + 4 + 4 s: six tries at most, each saying so once or twice.
    assert!(n <= 12, "{n} failures in 20 s: no back-off\n{}", why(&p));
    assert!(most <= 2, "shims for {most} containers at once");
    b.assert_undisturbed();
    b.remove("tiny.yaml", "tiny", &uid);
}

/// A new manifest is picked up, and runs, promptly.
fn assert_a_new_manifest_runs(b: &mut Bench) {
    let t = Instant::now();
    b.a.write_manifest(
        "after.yaml",
        &pod(
            "after",
            "  terminationGracePeriodSeconds: 1\n",
            "sleep 3600",
            "",
        ),
    );
    b.a.wait_pod("after", "running", Duration::from_secs(30), running);
    eprintln!("a new manifest ran {:?} after it was written", t.elapsed());
    let uid = b.uid("after");
    b.remove("after.yaml", "after", &uid);
}

/// 100 000 nested arrays (200 KB of JSON) as a manifest: refused, saying so, and the
/// source reads the next manifest.
#[test]
fn a_manifest_of_nested_arrays() {
    if !need_root() {
        return;
    }
    let mut b = Bench::new("nested");
    let text = format!("{}{}", "[".repeat(100_000), "]".repeat(100_000));
    b.a.write_manifest("nested.json", &text);
    b.a.wait_until("the agent to refuse nested.json", MIN, |a| {
        a.agent_log()
            .lines()
            .any(|l| l.contains("nested.json") && !l.contains("DEBUG"))
    });
    let said: Vec<String> =
        b.a.agent_log()
            .lines()
            .filter(|l| l.contains("nested.json"))
            .map(|l| l.chars().take(300).collect())
            .collect();
    eprintln!("nested: {said:#?}");
    b.assert_undisturbed();
    assert_a_new_manifest_runs(&mut b);
    b.a.remove_manifest("nested.json");
    b.assert_undisturbed();
}

/// A symlink to /proc/kmsg (a read blocks until the kernel logs) in the manifest
/// folder does not hold up the source: a manifest written after it runs promptly.
#[test]
fn a_manifest_symlink_to_proc_kmsg() {
    if !need_root() {
        return;
    }
    let mut b = Bench::new("kmsg");
    std::os::unix::fs::symlink("/proc/kmsg", b.a.manifests.join("kmsg.yaml")).expect("symlink");
    assert_a_new_manifest_runs(&mut b);
    let said: Vec<String> =
        b.a.agent_log()
            .lines()
            .filter(|l| l.contains("kmsg.yaml"))
            .map(|l| l.chars().take(300).collect())
            .collect();
    eprintln!("kmsg: {said:#?}");
    b.a.remove_manifest("kmsg.yaml");
    b.assert_undisturbed();
}

/// An emptyDir in memory with no sizeLimit is a tmpfs capped by the pod's memory
/// limit, not half the device's RAM.
#[test]
fn an_empty_dir_in_memory_without_a_size_limit() {
    if !need_root() {
        return;
    }
    let mut b = Bench::new("tmpfs");
    let spec = "  terminationGracePeriodSeconds: 1\n  volumes:\n  - name: cache\n    \
                emptyDir:\n      medium: Memory\n";
    let main = "    resources:\n      limits:\n        memory: 64Mi\n    \
                volumeMounts:\n    - name: cache\n      mountPath: /cache\n";
    b.a.write_manifest("tmpfs.yaml", &pod("tmpfs", spec, "sleep 3600", main));
    let uid = b.uid("tmpfs");
    b.a.wait_pod("tmpfs", "running", MIN, running);
    let names = uid_forms(&uid);
    let mut found = Vec::new();
    for l in std::fs::read_to_string("/proc/self/mountinfo")
        .unwrap_or_default()
        .lines()
    {
        let f: Vec<&str> = l.split_whitespace().collect();
        let Some(mp) = f.get(4) else { continue };
        let fstype = l
            .split(" - ")
            .nth(1)
            .and_then(|r| r.split_whitespace().next());
        if fstype == Some("tmpfs") && mp.contains("cache") && names.iter().any(|n| mp.contains(n)) {
            found.push(PathBuf::from(mp));
        }
    }
    assert!(!found.is_empty(), "no tmpfs for the emptyDir in mountinfo");
    for mp in &found {
        let st = nix::sys::statvfs::statvfs(mp).expect("statvfs");
        let size = st.blocks() as u64 * st.fragment_size() as u64;
        eprintln!("tmpfs: {} is {} MiB", mp.display(), size >> 20);
        assert!(
            size <= 64 << 20,
            "the emptyDir's tmpfs {} is {} MiB, more than the pod's 64 MiB limit",
            mp.display(),
            size >> 20
        );
    }
    b.assert_undisturbed();
    b.remove("tmpfs.yaml", "tmpfs", &uid);
}

/// A 63-character namespace and a 253-character pod name (the API's longest): the
/// pod runs, and its logs answer through the kubelet API.
#[test]
fn the_longest_namespace_and_pod_name() {
    if !need_root() {
        return;
    }
    let mut client = None;
    let mut b = Bench::with("long-names", |a| {
        let ca = pki::Pki::new(&a.dir.join("ca"));
        client = Some(ca.client(
            "apiserver-client",
            "kube-apiserver-kubelet-client",
            &["system:masters"],
        ));
        a.write_config(&format!(
            "authentication:\n  x509:\n    clientCAFile: {}\n",
            ca.ca.display()
        ));
    });
    let client = client.expect("client certificate");
    let ns = format!("n{}", "s".repeat(62));
    // The static pod's name gets `-<node>` appended: 253 characters in all.
    let suffix = format!("-{}", b.a.node_name);
    let base = format!("p{}", "o".repeat(252 - suffix.len()));
    let full = format!("{base}{suffix}");
    assert_eq!((ns.len(), full.len()), (63, 253));
    let manifest = format!(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: {base}\n  namespace: {ns}\nspec:\n  \
         hostNetwork: true\n  terminationGracePeriodSeconds: 1\n  containers:\n  - name: main\n    \
         image: busybox:demo\n    command: [\"sh\", \"-c\", \"echo hello-long; exec sleep 3600\"]\n"
    );
    b.a.write_manifest("long.yaml", &manifest);
    let p = b.a.wait_pod(&full, "running or refused", MIN, |p| {
        running(p) || phase(p) == "Failed"
    });
    let uid = p["pod"]["metadata"]["uid"]
        .as_str()
        .expect("uid")
        .to_string();
    assert!(running(&p), "the pod does not run: {}", why(&p));
    let url = format!(
        "https://127.0.0.1:{}/containerLogs/{ns}/{full}/main",
        b.a.port
    );
    let mut got = (0, String::new());
    let deadline = Instant::now() + Duration::from_secs(30);
    while Instant::now() < deadline {
        got = kubelet_api::curl(&url, Some(&client), &[]);
        if got.0 == 200 && got.1.contains("hello-long") {
            break;
        }
        std::thread::sleep(Duration::from_millis(300));
    }
    assert!(
        got.0 == 200 && got.1.contains("hello-long"),
        "logs of the long-named pod: HTTP {}: {}",
        got.0,
        got.1
    );
    b.assert_undisturbed();
    b.remove("long.yaml", &full, &uid);
}

/// An image whose layer holds a device node (the host's /dev/mem, 1:1) and a setuid
/// root file: nothing in the container reaches the host's memory through it.
#[test]
fn an_image_with_a_device_node_and_a_setuid_file() {
    if !need_root() {
        return;
    }
    let mut b = Bench::with("image-dev", |a| {
        let mut image = oci::busybox_image("docker.io/library/evil:1").expect("busybox image");
        image.layers.push(Layer::new(vec![
            Entry::dir("evil/", 0o755),
            Entry::Device {
                path: "evil/mem".into(),
                block: false,
                major: 1,
                minor: 1,
                mode: 0o666,
            },
            Entry::file("evil/suid-sh", b"#!/bin/sh\nid -u\n", 0o4755),
        ]));
        image
            .write_layout_tar(&a.root.join("images/evil.tar"))
            .expect("evil image");
    });
    let script = "if head -c 16 /evil/mem >/dev/null 2>&1; then echo MEM-READ; \
                  else echo mem-refused; fi; ls -ln /evil; exec sleep 3600";
    let main = "    image: evil:1\n";
    let text = pod("evil", "  terminationGracePeriodSeconds: 1\n", script, "")
        .replace("    image: busybox:demo\n", main);
    b.a.write_manifest("evil.yaml", &text);
    let Some(uid) = b.admitted("evil.yaml", "evil") else {
        return b.remove_refused("evil.yaml");
    };
    let p = b.a.wait_pod("evil", "running or refused", MIN, |p| {
        running(p) || (!why(p).is_empty() && !why(p).contains("ContainerCreating"))
    });
    if running(&p) {
        let mut out = String::new();
        b.a.wait_until("the evil pod's output", MIN, |a| {
            out = a
                .pod("evil")
                .map(|p| a.container_log(&p, "main", 0))
                .unwrap_or_default();
            out.contains("mem-") && out.contains("suid")
        });
        eprintln!("image-dev: ran:\n{out}");
        assert!(
            !out.contains("MEM-READ"),
            "the container read the host's memory through the image's device node:\n{out}"
        );
    } else {
        eprintln!("image-dev: refused: {}", why(&p));
    }
    b.assert_undisturbed();
    b.remove("evil.yaml", "evil", &uid);
}
