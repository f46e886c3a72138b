//! A real `holdfast run` process on a private root dir, manifest dir and cgroup root,
//! for integration tests (as root). Everything it creates is removed on drop, even when
//! the test fails.

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use serde_json::Value;

pub use crate::oci;

/// The `holdfast` binary under test: `HOLDFAST_BIN` if set (another build, such as an
/// older commit's), else the one cargo built beside the running test or bench (cargo
/// builds a package's binaries for its integration tests and benches).
pub fn bin() -> &'static Path {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| {
        let bin = std::env::var_os("HOLDFAST_BIN")
            .map(PathBuf::from)
            .unwrap_or_else(|| crate::profile_dir().join("holdfast"));
        assert!(
            bin.is_file(),
            "no holdfast binary at {}: build it (`cargo build`, which `cargo test` and \
             `cargo bench` do) or point HOLDFAST_BIN at one",
            bin.display()
        );
        bin
    })
}

/// Skips the calling test (with a printed reason) when not root: containers need it.
pub fn need_root() -> bool {
    if nix::unistd::geteuid().is_root() {
        true
    } else {
        eprintln!("skipped: needs root to run containers");
        false
    }
}

/// The busybox image tar, built once per test binary.
pub fn busybox_tar() -> &'static Path {
    static TAR: OnceLock<PathBuf> = OnceLock::new();
    TAR.get_or_init(|| {
        // Under target/ (removed by `cargo clean`), rebuilt once per test run, swapped in
        // whole so a concurrent reader never sees half of it.
        let dir = crate::target_tmpdir();
        std::fs::create_dir_all(dir).expect("target tmp dir");
        let tar = dir.join("busybox-demo.tar");
        let tmp = dir.join(format!(".busybox-demo.tar.{}", std::process::id()));
        oci::busybox_image("docker.io/library/busybox:demo")
            .and_then(|image| image.write_layout_tar(&tmp))
            .expect("busybox image");
        std::fs::rename(&tmp, &tar).expect("rename image tar");
        tar
    })
}

pub struct Agent {
    pub name: String,
    pub dir: PathBuf,
    pub root: PathBuf,
    pub manifests: PathBuf,
    pub cgroup_root: String,
    pub log: PathBuf,
    /// `--hostname-override`, `node-1` unless a test sets another.
    pub node_name: String,
    /// More `holdfast run` arguments (`--kubeconfig`, ...).
    pub extra_args: Vec<String>,
    /// More environment for `holdfast run` (its shims inherit it too).
    pub extra_env: Vec<(String, String)>,
    /// The kubelet API's HTTPS port (`port`) and `healthzPort`, both on 127.0.0.1:
    /// free ports picked for this agent, so that agents running side by side (test
    /// threads, test files) do not fight over 10250 and 10248.
    pub port: u16,
    pub healthz_port: u16,
    /// The kubelet API's `address`: 127.0.0.1 unless a test gives the agent an address
    /// of its own (the apiserver's node proxy refuses loopback node addresses).
    pub address: String,
    /// How the agent and the CLI are told the root dir, when not as `root`: a relative
    /// path, resolved against `cwd` (both set by a test of such a layout).
    pub root_arg: Option<PathBuf>,
    /// The working directory of the agent and of the CLI commands run on its root.
    pub cwd: Option<PathBuf>,
    child: Option<Child>,
}

/// A port free now on 127.0.0.1 (the kernel's pick; closed again before use).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("free port")
}

impl Agent {
    /// A new agent (not started) with a short crash-loop back-off (1 s doubling to 4 s).
    pub fn new(name: &str) -> Self {
        let dir = std::env::temp_dir().join(format!("holdfast-it-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let root = dir.join("root");
        let manifests = dir.join("manifests");
        std::fs::create_dir_all(root.join("images")).expect("root dir");
        std::fs::create_dir_all(&manifests).expect("manifest dir");
        let cgroup_root = format!("/holdfast-it-{name}-{}", std::process::id());
        let agent = Agent {
            name: name.to_string(),
            dir: dir.clone(),
            root,
            manifests,
            cgroup_root: cgroup_root.clone(),
            log: dir.join("agent.log"),
            node_name: "node-1".into(),
            extra_args: Vec::new(),
            extra_env: Vec::new(),
            port: free_port(),
            healthz_port: free_port(),
            address: "127.0.0.1".into(),
            root_arg: None,
            cwd: None,
            child: None,
        };
        agent.write_config("");
        std::fs::copy(busybox_tar(), agent.root.join("images/busybox.tar")).expect("copy image");
        agent
    }

    /// Writes the config file; `extra` is appended under the `holdfast:` section's
    /// siblings (top-level KubeletConfiguration keys). The kubelet API listens on the
    /// agent's own ports on its `address` (`extra` must not set `address`, `port` or
    /// `healthzPort`).
    pub fn write_config(&self, extra: &str) {
        // Tests share the machine's disk and memory: its pressure is no test's business
        // unless the test makes it itself (then it sets its own period).
        let eviction = if extra.contains("evictionMonitoringPeriod") {
            ""
        } else {
            "  evictionMonitoringPeriod: 24h\n"
        };
        let cfg = format!(
            "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\n\
             fileCheckFrequency: 2s\nsyncFrequency: 5s\ncgroupRoot: {}\n\
             address: {}\nport: {}\nhealthzPort: {}\n\
             holdfast:\n  crashLoopBackOffInitial: 1s\n  crashLoopBackOffMax: 4s\n{eviction}{extra}",
            self.cgroup_root, self.address, self.port, self.healthz_port
        );
        std::fs::write(self.dir.join("config.yaml"), cfg).expect("config");
    }

    /// `holdfast ARGS --root-dir ROOT`, run where the agent runs.
    pub fn command(&self, args: &[&str]) -> Command {
        let mut cmd = Command::new(bin());
        cmd.args(args)
            .arg("--root-dir")
            .arg(self.root_arg.as_ref().unwrap_or(&self.root));
        if let Some(cwd) = &self.cwd {
            cmd.current_dir(cwd);
        }
        cmd
    }

    pub fn start(&mut self) {
        self.spawn();
        // The control socket appears once the agent holds its store and runs.
        self.wait_until("the agent to answer", Duration::from_secs(60), |a| {
            a.root.join("holdfast.sock").exists() && a.try_pods().is_some()
        });
    }

    /// Starts `holdfast run` without waiting for it to answer (to kill it at any
    /// moment of its start-up).
    pub fn spawn(&mut self) {
        assert!(self.child.is_none(), "agent already running");
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .expect("agent log");
        let child = self
            .command(&["run"])
            .arg("--config")
            .arg(self.dir.join("config.yaml"))
            .arg("--pod-manifest-path")
            .arg(&self.manifests)
            .arg("--hostname-override")
            .arg(&self.node_name)
            .arg("--v=2")
            .args(&self.extra_args)
            .envs(self.extra_env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("log fd"))
            .stderr(log)
            .spawn()
            .expect("spawn holdfast run");
        self.child = Some(child);
    }

    /// Whether the agent process has exited on its own (a crash), with its status.
    pub fn exited(&mut self) -> Option<std::process::ExitStatus> {
        self.child
            .as_mut()
            .and_then(|c| c.try_wait().ok().flatten())
    }

    /// The running agent's process id, or None when it is not running.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// SIGKILL: the agent dies at once, as in a crash.
    pub fn kill9(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// SIGTERM and wait: an orderly stop.
    pub fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let pid = nix::unistd::Pid::from_raw(c.id() as i32);
            let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
            let deadline = Instant::now() + Duration::from_secs(30);
            while Instant::now() < deadline {
                if let Ok(Some(_)) = c.try_wait() {
                    return;
                }
                std::thread::sleep(Duration::from_millis(50));
            }
            let _ = c.kill();
            let _ = c.wait();
            panic!(
                "agent did not stop within 30s of SIGTERM\n{}",
                self.agent_log()
            );
        }
    }

    pub fn agent_log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    pub fn write_manifest(&self, file: &str, yaml: &str) {
        // Write then rename, as editors and config managers do, so the agent never
        // reads half a file.
        let tmp = self.manifests.join(format!(".{file}.tmp"));
        std::fs::write(&tmp, yaml).expect("write manifest");
        std::fs::rename(&tmp, self.manifests.join(file)).expect("rename manifest");
    }

    pub fn remove_manifest(&self, file: &str) {
        std::fs::remove_file(self.manifests.join(file)).expect("remove manifest");
    }

    fn try_pods(&self) -> Option<Vec<Value>> {
        let out = self.command(&["pods", "-o", "json"]).output().ok()?;
        if !out.status.success() {
            return None;
        }
        serde_json::from_slice(&out.stdout).ok()
    }

    /// Pod states (`{pod, status, start_time}`) as `holdfast pods -o json` prints them.
    pub fn pods(&self) -> Vec<Value> {
        self.try_pods().expect("holdfast pods -o json")
    }

    /// What `holdfast status --json` prints (uplink, outbox, store size, pods).
    #[allow(dead_code)]
    pub fn status(&self) -> Value {
        let out = self
            .command(&["status", "--json"])
            .output()
            .expect("holdfast status");
        assert!(
            out.status.success(),
            "holdfast status: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice(&out.stdout).expect("holdfast status --json")
    }

    /// The table `holdfast pods` prints.
    pub fn pods_table(&self) -> String {
        let out = self.command(&["pods"]).output().expect("holdfast pods");
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// The static pod `name` (suffixed with the node's name), or the cluster pod `name`.
    pub fn pod(&self, name: &str) -> Option<Value> {
        let full = format!("{name}-{}", self.node_name);
        let pods = self.pods();
        let named = |n: &str| {
            pods.iter()
                .find(|p| p["pod"]["metadata"]["name"] == n)
                .cloned()
        };
        named(&full).or_else(|| named(name))
    }

    pub fn wait_until(&self, what: &str, within: Duration, mut cond: impl FnMut(&Self) -> bool) {
        let deadline = Instant::now() + within;
        while Instant::now() < deadline {
            if cond(self) {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        panic!(
            "timed out after {within:?} waiting for {what}\n--- pods ---\n{}\n--- agent log ---\n{}",
            self.pods_table(),
            self.agent_log()
        );
    }

    /// Waits until pod `name` exists and `cond` holds for it; returns it.
    pub fn wait_pod(
        &self,
        name: &str,
        what: &str,
        within: Duration,
        cond: impl Fn(&Value) -> bool,
    ) -> Value {
        let mut found = None;
        self.wait_until(&format!("pod {name}: {what}"), within, |a| {
            match a.pod(name) {
                Some(p) if cond(&p) => {
                    found = Some(p);
                    true
                }
                _ => false,
            }
        });
        found.expect("pod")
    }

    pub fn wait_gone(&self, name: &str, within: Duration) {
        self.wait_until(&format!("pod {name} to be gone"), within, |a| {
            a.pod(name).is_none()
        });
    }

    /// A pod's log file for a container and restart, read whole.
    pub fn container_log(&self, pod: &Value, container: &str, restart: u32) -> String {
        let m = &pod["pod"]["metadata"];
        let dir = format!(
            "{}_{}_{}",
            m["namespace"].as_str().unwrap_or("default"),
            m["name"].as_str().unwrap_or(""),
            m["uid"].as_str().unwrap_or("")
        );
        let path = self
            .root
            .join("logs/pods")
            .join(dir)
            .join(container)
            .join(format!("{restart}.log"));
        std::fs::read_to_string(&path).unwrap_or_default()
    }

    /// Asserts nothing of this agent's is left: no mount under its dir, no cgroup under
    /// its cgroup root, no process started from its root. Call after `reset`.
    pub fn assert_clean(&self) {
        let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
        let dir = self.dir.display().to_string();
        let left: Vec<&str> = mounts.lines().filter(|l| l.contains(&dir)).collect();
        assert!(left.is_empty(), "mounts left behind: {left:#?}");
        for cg in cgroup_dirs(&self.cgroup_root) {
            assert!(!cg.exists(), "cgroup left behind: {}", cg.display());
        }
        // Shims name their container dir on their command line; containers run in it.
        let root = self.root.display().to_string();
        let mut procs = Vec::new();
        for e in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
            let Ok(pid) = e.file_name().to_string_lossy().parse::<u32>() else {
                continue;
            };
            let cmd = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
            let cwd = std::fs::read_link(format!("/proc/{pid}/root")).unwrap_or_default();
            if String::from_utf8_lossy(&cmd).contains(&root) || cwd.starts_with(&self.root) {
                procs.push(format!(
                    "{pid}: {}",
                    String::from_utf8_lossy(&cmd).replace('\0', " ")
                ));
            }
        }
        assert!(procs.is_empty(), "processes left behind: {procs:#?}");
    }

    /// The container dirs this agent's shims are for (a shim names its container's dir,
    /// under the root, last on its command line; `shim start` and the `shim run` it
    /// detaches are one container's).
    pub fn shim_dirs(&self) -> Vec<String> {
        let root = self.root.display().to_string();
        let mut out = Vec::new();
        for e in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
            let Ok(pid) = e.file_name().to_string_lossy().parse::<u32>() else {
                continue;
            };
            let cmd = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
            let args: Vec<String> = String::from_utf8_lossy(&cmd)
                .split('\0')
                .map(str::to_owned)
                .collect();
            if args.iter().any(|x| x == "shim") {
                if let Some(dir) = args.iter().rev().find(|x| x.starts_with(&root)) {
                    if !out.contains(dir) {
                        out.push(dir.clone());
                    }
                }
            }
        }
        out
    }

    /// The agent's peak resident memory (VmHWM), in KiB.
    pub fn peak_rss_kib(&self) -> u64 {
        let pid = self.pid().expect("agent runs");
        proc_status(pid, "VmHWM").expect("VmHWM in /proc/PID/status")
    }

    /// Stops the agent and removes everything (`holdfast reset`).
    pub fn reset(&mut self) {
        self.kill9();
        let out = self
            .command(&["reset"])
            .arg("--cgroup-root")
            .arg(&self.cgroup_root)
            .output()
            .expect("holdfast reset");
        assert!(
            out.status.success(),
            "holdfast reset failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

/// Where a cgroup path lives on this host: one dir per v1 controller, or one on v2.
pub fn cgroup_dirs(path: &str) -> Vec<PathBuf> {
    let rel = path.trim_start_matches('/');
    let base = Path::new("/sys/fs/cgroup");
    if base.join("cgroup.controllers").exists() {
        return vec![base.join(rel)];
    }
    let mut out = Vec::new();
    if let Ok(entries) = std::fs::read_dir(base) {
        for e in entries.flatten() {
            let p = e.path();
            if p.is_dir() && !p.is_symlink() {
                out.push(p.join(rel));
            }
        }
    }
    out
}

impl Drop for Agent {
    fn drop(&mut self) {
        self.kill9();
        let _ = self
            .command(&["reset"])
            .arg("--cgroup-root")
            .arg(&self.cgroup_root)
            .output();
        // Belt and braces, should reset itself have failed.
        if let Ok(mounts) = std::fs::read_to_string("/proc/self/mountinfo") {
            let dir = self.dir.display().to_string();
            for l in mounts.lines() {
                if let Some(mp) = l.split_whitespace().nth(4) {
                    if mp.starts_with(&dir) {
                        let _ = nix::mount::umount2(mp, nix::mount::MntFlags::MNT_DETACH);
                    }
                }
            }
        }
        for cg in cgroup_dirs(&self.cgroup_root) {
            let _ = std::fs::remove_dir(&cg);
        }
        if !std::thread::panicking() {
            let _ = std::fs::remove_dir_all(&self.dir);
        } else {
            eprintln!("agent dir kept for inspection: {}", self.dir.display());
            let _ = std::fs::remove_dir_all(self.root.join("content"));
        }
    }
}

impl Agent {
    /// The lines container `main` of pod `name` printed in its first run (the CRI log's
    /// text), once one of them is `END`.
    pub fn output(&self, name: &str) -> Vec<String> {
        let mut out = Vec::new();
        self.wait_until(
            &format!("pod {name} to print its output"),
            std::time::Duration::from_secs(60),
            |a| {
                let Some(p) = a.pod(name) else { return false };
                out = a
                    .container_log(&p, "main", 0)
                    .lines()
                    .filter_map(|l| l.splitn(4, ' ').nth(3).map(str::to_owned))
                    .collect();
                out.iter().any(|l| l == "END")
            },
        );
        out
    }
}

/// What follows `prefix` on the first line of `out` that starts with it.
pub fn line<'a>(out: &'a [String], prefix: &str) -> &'a str {
    out.iter()
        .find(|l| l.starts_with(prefix))
        .map(|l| l[prefix.len()..].trim())
        .unwrap_or_else(|| panic!("no line {prefix:?} in {out:?}"))
}

/// A field of a container's status, by container name.
pub fn container<'a>(pod: &'a Value, name: &str) -> &'a Value {
    pod["status"]["containerStatuses"]
        .as_array()
        .and_then(|cs| cs.iter().find(|c| c["name"] == name))
        .unwrap_or(&Value::Null)
}

pub fn condition<'a>(pod: &'a Value, type_: &str) -> &'a Value {
    pod["status"]["conditions"]
        .as_array()
        .and_then(|cs| cs.iter().find(|c| c["type"] == type_))
        .unwrap_or(&Value::Null)
}

/// A container's state dir (its bundle, the shim's records and log), on the tmpfs the
/// runtime mounts at `<root>/boot`.
pub fn state_dir(root: &std::path::Path, id: &str) -> std::path::PathBuf {
    root.join("boot/containers").join(id)
}

/// The pid of a pod's container init, from the runtime's record of it.
pub fn container_pid(agent: &Agent, pod: &Value, c: &str) -> i32 {
    let id = container(pod, c)["containerID"]
        .as_str()
        .and_then(|s| s.strip_prefix("libcontainer://"))
        .expect("containerID")
        .to_string();
    let started = std::fs::read_to_string(state_dir(&agent.root, &id).join("started.json"))
        .expect("started.json");
    let v: Value = serde_json::from_str(&started).expect("started.json parses");
    v["init"]["pid"]
        .as_i64()
        .and_then(|p| i32::try_from(p).ok())
        .expect("init pid")
}

/// Whether a process lives (a zombie counts as gone).
pub fn pid_alive(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| {
        !matches!(
            s.rsplit(") ").next().and_then(|r| r.chars().next()),
            Some('Z' | 'X')
        )
    })
}

/// Everything a device loses in a power cut: the agent, every shim and container
/// (SIGKILL), the containers' mounts and cgroups. The root dir stays, as flash does.
pub fn power_cut(a: &mut Agent) {
    a.kill9();
    let root = a.root.display().to_string();
    let ours = |pid: u32| {
        let cmd = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
        let in_root =
            std::fs::read_link(format!("/proc/{pid}/root")).is_ok_and(|r| r.starts_with(&a.root));
        String::from_utf8_lossy(&cmd).contains(&root) || in_root
    };
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let pids: Vec<u32> = std::fs::read_dir("/proc")
            .into_iter()
            .flatten()
            .flatten()
            .filter_map(|e| e.file_name().to_string_lossy().parse::<u32>().ok())
            .filter(|&pid| pid != std::process::id() && ours(pid))
            .filter(|&pid| pid_alive(pid as i32))
            .collect();
        if pids.is_empty() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "processes survive SIGKILL: {pids:?}"
        );
        for pid in pids {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid as i32),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let dir = a.dir.display().to_string();
    let mut mounts: Vec<String> = std::fs::read_to_string("/proc/self/mountinfo")
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.split_whitespace().nth(4).map(str::to_string))
        .filter(|mp| mp.starts_with(&dir))
        .collect();
    mounts.sort_by_key(|m| std::cmp::Reverse(m.len()));
    for mp in mounts {
        nix::mount::umount2(mp.as_str(), nix::mount::MntFlags::MNT_DETACH)
            .unwrap_or_else(|e| panic!("unmount {mp}: {e}"));
    }
    for cg in cgroup_dirs(&a.cgroup_root) {
        remove_cgroup_tree(&cg);
    }
}

/// Removes a cgroup and every cgroup below it, deepest first, killing what is left in
/// them and waiting (bounded) for the kernel to let go of a cgroup whose last process
/// just died.
pub fn remove_cgroup_tree(dir: &std::path::Path) {
    if let Ok(entries) = std::fs::read_dir(dir) {
        for e in entries.flatten() {
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                remove_cgroup_tree(&e.path());
            }
        }
    }
    let deadline = Instant::now() + Duration::from_secs(60);
    while dir.exists() {
        let procs = std::fs::read_to_string(dir.join("cgroup.procs")).unwrap_or_default();
        for pid in procs.lines().filter_map(|l| l.trim().parse::<i32>().ok()) {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
        match std::fs::remove_dir(dir) {
            Ok(()) => return,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return,
            Err(e) => assert!(
                Instant::now() < deadline,
                "remove cgroup {}: {e} (processes: {procs:?})",
                dir.display()
            ),
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A number of `/proc/<pid>/status` (`Threads`, `PPid`; `VmRSS`, `VmHWM` in KiB, as
/// the kernel gives them in kB); None when the process is gone.
pub fn proc_status(pid: u32, field: &str) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
}

/// A host-network pod `name` with one busybox container `container` running the shell
/// `script`; `pod_extra` goes under `spec:`, `container_extra` under the container (each
/// line indented as it belongs there).
pub fn sh_pod(
    name: &str,
    pod_extra: &str,
    container: &str,
    script: &str,
    container_extra: &str,
) -> String {
    format!(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: {name}\nspec:\n  hostNetwork: true\n\
         {pod_extra}  containers:\n  - name: {container}\n    image: busybox:demo\n    \
         command: [\"sh\", \"-c\", {}]\n{container_extra}",
        serde_json::to_string(script).expect("json string")
    )
}
