//! Real containers through the libcontainer runtime and its shim. Needs root, overlayfs
//! and cgroups; the image is one busybox layer built from the host's busybox-static.
//! Every test cleans up its containers, mounts, cgroups and directories, even on failure.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use holdfast::image::ResolvedImage;
use holdfast::runtime::{
    ContainerId, ContainerState, ExitInfo, LibcontainerRuntime, Runtime, RuntimeError, StartRequest,
};
use k8s_openapi::api::core::v1::{Container, Pod, PodSpec, ResourceRequirements};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use oci_spec::image::{ConfigBuilder, ImageConfigurationBuilder};

const BUSYBOX: &str = "/bin/busybox";
const SHIM: &str = env!("CARGO_BIN_EXE_holdfast");
static SEQ: AtomicU32 = AtomicU32::new(0);

/// One test's runtime root, cgroup root and image; Drop tears all of it down.
struct Env {
    root: PathBuf,
    cgroup_root: String,
    image: ResolvedImage,
    rt: LibcontainerRuntime,
}

impl Env {
    fn new(name: &str) -> Env {
        Env::with_root(name, None, None)
    }

    fn with_root(name: &str, root: Option<PathBuf>, cgroup_root: Option<String>) -> Env {
        assert!(nix::unistd::geteuid().is_root(), "runtime tests need root");
        assert!(
            Path::new(BUSYBOX).exists(),
            "apt-get install busybox-static"
        );
        let n = SEQ.fetch_add(1, Ordering::SeqCst);
        let pid = std::process::id();
        let root = root
            .unwrap_or_else(|| std::env::temp_dir().join(format!("holdfast-rt-{pid}-{n}-{name}")));
        let cgroup_root = cgroup_root.unwrap_or_else(|| format!("/holdfast-test-{pid}-{n}"));
        std::fs::create_dir_all(&root).expect("create test root");
        let layer = root.join("layer");
        if !layer.join("bin/busybox").exists() {
            busybox_layer(&layer);
        }
        let config = ConfigBuilder::default()
            .env(vec!["PATH=/bin".to_string()])
            .cmd(vec!["sh".to_string()])
            .build()
            .expect("image config");
        let image = ResolvedImage {
            reference: "local/busybox:test".into(),
            image_id: "sha256:test".into(),
            config: ImageConfigurationBuilder::default()
                .config(config)
                .build()
                .expect("image"),
            layers: vec![layer],
        };
        let rt = LibcontainerRuntime::new(root.join("rt"), &cgroup_root, Some(PathBuf::from(SHIM)))
            .expect("runtime");
        Env {
            root,
            cgroup_root,
            image,
            rt,
        }
    }

    fn log_path(&self, name: &str) -> PathBuf {
        self.root.join("logs").join(name).join("0.log")
    }

    fn start(
        &self,
        name: &str,
        script: &str,
        resources: Option<ResourceRequirements>,
    ) -> Result<ContainerId, RuntimeError> {
        let pod = pod();
        let container = Container {
            name: name.into(),
            command: Some(vec!["/bin/sh".into(), "-c".into(), script.into()]),
            resources,
            ..Default::default()
        };
        self.start_container(&pod, &container)
    }

    fn start_container(
        &self,
        pod: &Pod,
        container: &Container,
    ) -> Result<ContainerId, RuntimeError> {
        let id = ContainerId::derive("uid-1", &container.name, 0);
        let req = StartRequest {
            id: id.clone(),
            pod,
            container,
            restart_count: 0,
            image: &self.image,
            node_name: "testnode",
            log_path: self.log_path(&container.name),
        };
        self.rt.start(&req).map(|_| id)
    }

    fn wait_exit(&self, id: &ContainerId) -> ExitInfo {
        let mut last = None;
        let ok = wait_until(Duration::from_secs(30), || {
            let s = self.rt.state(id).expect("state");
            let done = matches!(s, ContainerState::Exited(_));
            last = Some(s);
            done
        });
        match last {
            Some(ContainerState::Exited(info)) if ok => info,
            other => panic!("container {id} did not exit: {other:?}"),
        }
    }

    fn cgroup_dirs(&self) -> Vec<PathBuf> {
        hierarchies()
            .into_iter()
            .map(|h| h.join(self.cgroup_root.trim_start_matches('/')))
            .filter(|d| d.exists())
            .collect()
    }
}

impl Drop for Env {
    fn drop(&mut self) {
        let containers = self.root.join("rt/containers");
        for entry in std::fs::read_dir(&containers)
            .into_iter()
            .flatten()
            .flatten()
        {
            let dir = entry.path();
            if let Some(pid) = live_pid(&dir.join("started.json"), "init") {
                let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGKILL);
            }
            if let Some(shim) = live_pid(&dir.join("shim-pid.json"), "process") {
                // The shim records the exit and cleans up after its container dies.
                if !wait_until(Duration::from_secs(15), || !alive(shim)) {
                    let _ = nix::sys::signal::kill(shim, nix::sys::signal::Signal::SIGKILL);
                }
            }
            let id = ContainerId(entry.file_name().to_string_lossy().into_owned());
            if let Err(e) = self.rt.remove(&id) {
                eprintln!("cleanup: remove {id}: {e}");
            }
        }
        for m in mounts_under(&self.root).into_iter().rev() {
            let _ = nix::mount::umount2(&m, nix::mount::MntFlags::MNT_DETACH);
        }
        for dir in self.cgroup_dirs() {
            for child in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
                if child.file_type().map(|t| t.is_dir()).unwrap_or(false) {
                    let _ = std::fs::remove_dir(child.path());
                }
            }
            if let Err(e) = std::fs::remove_dir(&dir) {
                eprintln!("cleanup: rmdir {}: {e}", dir.display());
            }
        }
        if mounts_under(&self.root).is_empty() {
            let _ = std::fs::remove_dir_all(&self.root);
        }
    }
}

fn busybox_layer(layer: &Path) {
    let bin = layer.join("bin");
    std::fs::create_dir_all(&bin).expect("mkdir bin");
    std::fs::copy(BUSYBOX, bin.join("busybox")).expect("copy busybox");
    let list = Command::new(BUSYBOX)
        .arg("--list")
        .output()
        .expect("busybox --list");
    for applet in String::from_utf8_lossy(&list.stdout).lines() {
        if applet != "busybox" && !applet.is_empty() {
            let _ = std::os::unix::fs::symlink("busybox", bin.join(applet));
        }
    }
    for d in ["tmp", "etc", "proc", "sys", "dev", "root"] {
        std::fs::create_dir_all(layer.join(d)).expect("mkdir");
    }
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(layer.join("tmp"), std::fs::Permissions::from_mode(0o1777))
        .expect("chmod tmp");
    std::fs::write(
        layer.join("etc/passwd"),
        "root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534::/:/bin/sh\n",
    )
    .expect("passwd");
    std::fs::write(layer.join("etc/group"), "root:x:0:\nnogroup:x:65534:\n").expect("group");
}

fn pod() -> Pod {
    let mut pod = Pod::default();
    pod.metadata.name = Some("testpod".into());
    pod.metadata.uid = Some("uid-1".into());
    pod.spec = Some(PodSpec {
        host_network: Some(true),
        ..Default::default()
    });
    pod
}

fn wait_until(limit: Duration, mut cond: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + limit;
    loop {
        if cond() {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn stat_start(pid: i32) -> Option<(char, u64)> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = &stat[stat.rfind(')')? + 1..];
    let mut f = rest.split_whitespace();
    let state = f.next()?.chars().next()?;
    Some((state, f.nth(18)?.parse().ok()?))
}

fn alive(pid: nix::unistd::Pid) -> bool {
    matches!(stat_start(pid.as_raw()), Some((s, _)) if s != 'Z' && s != 'X')
}

/// The pid in a record (`{"<key>": {"pid", "start_time"}}`) if that process still lives.
fn live_pid(record: &Path, key: &str) -> Option<nix::unistd::Pid> {
    let v: serde_json::Value = serde_json::from_slice(&std::fs::read(record).ok()?).ok()?;
    let pid = v[key]["pid"].as_i64()? as i32;
    let start = v[key]["start_time"].as_u64()?;
    match stat_start(pid) {
        Some((s, t)) if t == start && s != 'Z' => Some(nix::unistd::Pid::from_raw(pid)),
        _ => None,
    }
}

fn mounts_under(dir: &Path) -> Vec<PathBuf> {
    let info = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    info.lines()
        .filter_map(|l| l.split(' ').nth(4))
        .map(PathBuf::from)
        .filter(|p| p.starts_with(dir))
        .collect()
}

fn hierarchies() -> Vec<PathBuf> {
    let root = Path::new("/sys/fs/cgroup");
    if root.join("cgroup.controllers").exists() {
        return vec![root.to_owned()];
    }
    std::fs::read_dir(root)
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.is_dir())
        .collect()
}

/// (stream, tag, text) of each record in a CRI log.
fn log_records(path: &Path) -> Vec<(String, String, String)> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .map(|l| {
            let mut it = l.splitn(4, ' ');
            let ts = it.next().unwrap_or_default();
            assert!(
                ts.parse::<holdfast::time::Timestamp>().is_ok(),
                "bad timestamp in {l:?}"
            );
            let s = it.next().unwrap_or_default().to_owned();
            let t = it.next().unwrap_or_default().to_owned();
            (s, t, it.next().unwrap_or_default().to_owned())
        })
        .collect()
}

fn memory_limit(q: &str) -> Option<ResourceRequirements> {
    Some(ResourceRequirements {
        limits: Some(BTreeMap::from([(
            "memory".to_string(),
            Quantity(q.to_string()),
        )])),
        ..Default::default()
    })
}

#[test]
fn exit_code_logs_exit_event_and_remove() {
    let env = Env::new("exit");
    let (tx, mut rx) = tokio::sync::mpsc::channel(8);
    env.rt.watch_exits(tx).expect("watch exits");

    let id = env
        .start("exit", "echo hello; echo err >&2; exit 3", None)
        .expect("start");
    assert!(env.rt.list().expect("list").contains(&id));
    let mut event = None;
    assert!(
        wait_until(Duration::from_secs(30), || {
            event = rx.try_recv().ok();
            event.is_some()
        }),
        "no exit event"
    );
    assert_eq!(event.as_ref(), Some(&id));

    let info = env.wait_exit(&id);
    assert_eq!(info.exit_code, 3);
    assert_eq!(info.signal, None);
    assert!(!info.oom_killed);
    let started = info.started_at.expect("started_at");
    assert!(info.finished_at >= started, "{info:?}");

    let records = log_records(&env.log_path("exit"));
    assert!(
        records.contains(&("stdout".into(), "F".into(), "hello".into())),
        "{records:?}"
    );
    assert!(
        records.contains(&("stderr".into(), "F".into(), "err".into())),
        "{records:?}"
    );

    // The shim cleans up on its own; remove takes what is left and is idempotent.
    let dir = env.rt.container_dir(&id);
    env.rt.remove(&id).expect("remove");
    env.rt.remove(&id).expect("remove again");
    assert!(!dir.exists());
    assert!(
        mounts_under(&dir).is_empty(),
        "mount left under {}",
        dir.display()
    );
    let cgroups_path = env.rt.cgroups_path(&id);
    for h in hierarchies() {
        let d = h.join(cgroups_path.trim_start_matches('/'));
        assert!(!d.exists(), "cgroup {} left", d.display());
    }
    assert!(!env.rt.list().expect("list").contains(&id));
    assert!(matches!(
        env.rt.state(&id),
        Err(RuntimeError::NotFound { .. })
    ));
}

#[test]
fn signals_reach_the_init() {
    let env = Env::new("signals");
    let id = env
        .start("sleeper", "exec sleep 1000", None)
        .expect("start sleeper");
    assert!(matches!(
        env.rt.state(&id).expect("state"),
        ContainerState::Running { .. }
    ));
    assert!(matches!(
        env.rt.remove(&id),
        Err(RuntimeError::StillRunning { .. })
    ));
    let rootfs = env.rt.container_dir(&id).join("bundle/rootfs");
    assert!(
        mounts_under(&rootfs).contains(&rootfs),
        "rootfs is not mounted"
    );
    // PID 1 of a namespace never gets a signal it has no handler for, SIGTERM included:
    // that is why the kubelet follows up with SIGKILL.
    env.rt.kill(&id, libc_sigterm()).expect("sigterm");
    env.rt.kill(&id, 9).expect("sigkill");
    let info = env.wait_exit(&id);
    assert_eq!((info.exit_code, info.signal), (137, Some(9)), "{info:?}");
    assert!(
        wait_until(Duration::from_secs(10), || mounts_under(&rootfs).is_empty()),
        "rootfs still mounted"
    );

    let id = env
        .start(
            "trapper",
            "trap 'exit 7' TERM; echo ready; while true; do sleep 0.1; done",
            None,
        )
        .expect("start trapper");
    let log = env.log_path("trapper");
    assert!(
        wait_until(Duration::from_secs(10), || log_records(&log)
            .iter()
            .any(|r| r.2 == "ready")),
        "trap never set"
    );
    env.rt.kill(&id, libc_sigterm()).expect("sigterm");
    let info = env.wait_exit(&id);
    assert_eq!((info.exit_code, info.signal), (7, None), "{info:?}");
    // Killing an exited container is not an error.
    env.rt.kill(&id, 9).expect("kill after exit");
}

fn libc_sigterm() -> i32 {
    nix::sys::signal::Signal::SIGTERM as i32
}

#[test]
fn memory_limit_ends_in_oom_kill() {
    let env = Env::new("oom");
    // tail keeps a whole newline-free input in memory.
    let id = env
        .start("hog", "head -c 100m /dev/zero | tail", memory_limit("16Mi"))
        .expect("start");
    let info = env.wait_exit(&id);
    assert!(info.oom_killed, "{info:?}");
    assert_eq!(info.exit_code, 137, "{info:?}");
}

#[test]
fn missing_command_is_a_start_error() {
    let env = Env::new("missing");
    let pod = pod();
    let container = Container {
        name: "missing".into(),
        command: Some(vec!["/bin/nonexistent".into()]),
        ..Default::default()
    };
    match env.start_container(&pod, &container) {
        Err(RuntimeError::Start { message, .. }) => {
            assert!(message.contains("nonexistent"), "{message}")
        }
        other => panic!("expected a start error, got {other:?}"),
    }
    let id = ContainerId::derive("uid-1", "missing", 0);
    match env.rt.state(&id).expect("state") {
        ContainerState::Exited(info) => {
            assert_eq!(info.exit_code, 128);
            assert!(info.start_error.is_some());
        }
        other => panic!("expected exited, got {other:?}"),
    }
    env.rt.remove(&id).expect("remove");
    assert!(env.cgroup_dirs().iter().all(|d| std::fs::read_dir(d)
        .map(|mut r| r.all(|e| !e.map(|e| e.path().is_dir()).unwrap_or(false)))
        .unwrap_or(true)));
}

#[test]
fn log_rotation_keeps_at_most_max_files() {
    let mut env = Env::new("rotate");
    env.rt = LibcontainerRuntime::new(
        env.root.join("rt"),
        &env.cgroup_root,
        Some(PathBuf::from(SHIM)),
    )
    .expect("runtime")
    .with_log_limits(2048, 3);
    let script = "i=0; while [ $i -lt 500 ]; do echo line $i; i=$((i+1)); done";
    let id = env.start("chatty", script, None).expect("start");
    assert_eq!(env.wait_exit(&id).exit_code, 0);
    let log = env.log_path("chatty");
    let files: Vec<_> = std::fs::read_dir(log.parent().expect("log dir"))
        .expect("list logs")
        .flatten()
        .collect();
    assert_eq!(files.len(), 3, "{files:?}");
    assert!(std::fs::metadata(&log).expect("live log").len() <= 2048);
    assert_eq!(
        log_records(&log).last().map(|r| r.2.clone()),
        Some("line 499".to_string())
    );
}

/// Run only as a child of `shim_outlives_its_starter`: starts a container and exits.
#[test]
fn helper_start_and_exit() {
    let (Ok(root), Ok(cgroup_root)) = (
        std::env::var("HOLDFAST_TEST_DETACHED_ROOT"),
        std::env::var("HOLDFAST_TEST_DETACHED_CGROUP_ROOT"),
    ) else {
        return;
    };
    // The starter's root and cgroup root, so the test's guard cleans up after it.
    let env = Env::with_root("detached", Some(PathBuf::from(root)), Some(cgroup_root));
    let id = env
        .start("survivor", "echo up; exec sleep 1000", None)
        .expect("start");
    println!("started {id}");
    // Leave without the Drop guard: the container must outlive this process.
    std::mem::forget(env);
}

#[test]
fn shim_outlives_its_starter() {
    let env = Env::new("detached");
    let status = Command::new(std::env::current_exe().expect("test binary"))
        .args([
            "helper_start_and_exit",
            "--exact",
            "--nocapture",
            "--test-threads=1",
        ])
        .env("HOLDFAST_TEST_DETACHED_ROOT", &env.root)
        .env("HOLDFAST_TEST_DETACHED_CGROUP_ROOT", &env.cgroup_root)
        .status()
        .expect("run helper");
    assert!(status.success(), "helper failed");

    let id = ContainerId::derive("uid-1", "survivor", 0);
    let ContainerState::Running { pid, .. } = env.rt.state(&id).expect("state") else {
        panic!("container did not survive its starter");
    };
    let dir = env.rt.container_dir(&id);
    let shim = live_pid(&dir.join("shim-pid.json"), "process").expect("shim alive");
    // The shim's parent is no longer the (dead) starter.
    let ppid = std::fs::read_to_string(format!("/proc/{shim}/stat")).expect("shim stat");
    eprintln!(
        "shim {shim} stat: {}",
        ppid.split(") ")
            .nth(1)
            .unwrap_or_default()
            .split(' ')
            .take(3)
            .collect::<Vec<_>>()
            .join(" ")
    );
    if let Ok(rollup) = std::fs::read_to_string(format!("/proc/{shim}/smaps_rollup")) {
        let pick = |k: &str| {
            rollup
                .lines()
                .find(|l| l.starts_with(k))
                .unwrap_or_default()
                .to_owned()
        };
        eprintln!(
            "shim memory: {} | {} | {}",
            pick("Rss:"),
            pick("Pss:"),
            pick("Private_Dirty:")
        );
    }
    let log = env.log_path("survivor");
    assert!(
        wait_until(Duration::from_secs(10), || log_records(&log)
            .iter()
            .any(|r| r.2 == "up")),
        "no output logged"
    );

    env.rt.kill(&id, 9).expect("kill");
    let info = env.wait_exit(&id);
    assert_eq!(info.exit_code, 137);
    assert!(!alive(nix::unistd::Pid::from_raw(pid)));
    assert!(
        wait_until(Duration::from_secs(10), || !alive(shim)),
        "shim did not exit"
    );
}
