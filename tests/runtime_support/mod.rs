//! The harness of the runtime tests: a busybox image built from the host's
//! busybox-static, one runtime per test under its own directory and cgroup root, and a
//! guard that tears all of it down even when a test fails.
#![allow(dead_code)]
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use holdfast::runtime::ResolvedImage;
use holdfast::runtime::{
    ContainerId, ContainerState, ExitInfo, LibcontainerRuntime, Runtime, RuntimeError, StartRequest,
};
use k8s_openapi::api::core::v1::{Container, Pod, PodSpec, ResourceRequirements};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use oci_spec::image::{ConfigBuilder, ImageConfigurationBuilder};

pub const BUSYBOX: &str = "/bin/busybox";
/// The holdfast binary run as the shim: `HOLDFAST_TEST_SHIM` (a release build, say, to
/// measure it) or the one cargo built for these tests.
pub fn shim_binary() -> PathBuf {
    std::env::var_os("HOLDFAST_TEST_SHIM")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_BIN_EXE_holdfast")))
}
pub static SEQ: AtomicU32 = AtomicU32::new(0);

/// One test's runtime root, cgroup root and image; Drop tears all of it down.
pub struct Env {
    pub root: PathBuf,
    pub cgroup_root: String,
    pub image: ResolvedImage,
    pub rt: LibcontainerRuntime,
}

impl Env {
    pub fn new(name: &str) -> Env {
        Env::with_root(name, None, None)
    }

    pub fn with_root(name: &str, root: Option<PathBuf>, cgroup_root: Option<String>) -> Env {
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
            repo_digest: "local/busybox@sha256:test".into(),
            config: ImageConfigurationBuilder::default()
                .config(config)
                .build()
                .expect("image"),
            layers: vec![layer],
        };
        let rt = LibcontainerRuntime::new(root.join("rt"), &cgroup_root, Some(shim_binary()))
            .expect("runtime");
        Env {
            root,
            cgroup_root,
            image,
            rt,
        }
    }

    pub fn log_path(&self, name: &str) -> PathBuf {
        self.root.join("logs").join(name).join("0.log")
    }

    pub fn start(
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

    pub fn start_container(
        &self,
        pod: &Pod,
        container: &Container,
    ) -> Result<ContainerId, RuntimeError> {
        let id = ContainerId::derive("uid-1", &container.name, 0);
        let req = StartRequest {
            id: id.clone(),
            pod,
            container,
            env: &[],
            restart_count: 0,
            image: &self.image,
            node_name: "testnode",
            log_path: self.log_path(&container.name),
            sandbox: None,
            mounts: &[],
        };
        self.rt.start(&req).map(|_| id)
    }

    pub fn wait_exit(&self, id: &ContainerId) -> ExitInfo {
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

    pub fn cgroup_dirs(&self) -> Vec<PathBuf> {
        hierarchies()
            .into_iter()
            .map(|h| h.join(self.cgroup_root.trim_start_matches('/')))
            .filter(|d| d.exists())
            .collect()
    }
}

impl Drop for Env {
    fn drop(&mut self) {
        for id in self.rt.list().unwrap_or_default() {
            let dir = self.rt.state_dir(&id);
            if let Some(pid) = live_pid(&dir.join("started.json"), "init") {
                let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGKILL);
            }
            if let Some(shim) = live_pid(&dir.join("shim-pid.json"), "process") {
                // The shim records the exit and cleans up after its container dies.
                if !wait_until(Duration::from_secs(15), || !alive(shim)) {
                    let _ = nix::sys::signal::kill(shim, nix::sys::signal::Signal::SIGKILL);
                }
            }
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

pub fn busybox_layer(layer: &Path) {
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

pub fn pod() -> Pod {
    let mut pod = Pod::default();
    pod.metadata.name = Some("testpod".into());
    pod.metadata.uid = Some("uid-1".into());
    pod.spec = Some(PodSpec {
        host_network: Some(true),
        ..Default::default()
    });
    pod
}

pub fn wait_until(limit: Duration, mut cond: impl FnMut() -> bool) -> bool {
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

pub fn stat_start(pid: i32) -> Option<(char, u64)> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = &stat[stat.rfind(')')? + 1..];
    let mut f = rest.split_whitespace();
    let state = f.next()?.chars().next()?;
    Some((state, f.nth(18)?.parse().ok()?))
}

pub fn alive(pid: nix::unistd::Pid) -> bool {
    matches!(stat_start(pid.as_raw()), Some((s, _)) if s != 'Z' && s != 'X')
}

/// The pid in a record (`{"<key>": {"pid", "start_time"}}`) if that process still lives.
pub fn live_pid(record: &Path, key: &str) -> Option<nix::unistd::Pid> {
    let v: serde_json::Value = serde_json::from_slice(&std::fs::read(record).ok()?).ok()?;
    let pid = v[key]["pid"].as_i64()? as i32;
    let start = v[key]["start_time"].as_u64()?;
    match stat_start(pid) {
        Some((s, t)) if t == start && s != 'Z' => Some(nix::unistd::Pid::from_raw(pid)),
        _ => None,
    }
}

pub fn mounts_under(dir: &Path) -> Vec<PathBuf> {
    let info = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    info.lines()
        .filter_map(|l| l.split(' ').nth(4))
        .map(PathBuf::from)
        .filter(|p| p.starts_with(dir))
        .collect()
}

pub fn hierarchies() -> Vec<PathBuf> {
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
pub fn log_records(path: &Path) -> Vec<(String, String, String)> {
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

pub fn memory_limit(q: &str) -> Option<ResourceRequirements> {
    Some(ResourceRequirements {
        limits: Some(BTreeMap::from([(
            "memory".to_string(),
            Quantity(q.to_string()),
        )])),
        ..Default::default()
    })
}
