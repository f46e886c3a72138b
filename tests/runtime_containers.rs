//! Real containers through the libcontainer runtime and its shim. Needs root, overlayfs
//! and cgroups; the image is one busybox layer built from the host's busybox-static.
//! Every test cleans up its containers, mounts, cgroups and directories, even on failure.

use support::maps;
mod runtime_support;

use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use holdfast::runtime::{ContainerId, ContainerState, LibcontainerRuntime, Runtime, RuntimeError};
use k8s_openapi::api::core::v1::Container;

use runtime_support::*;

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
    let (dir, state) = (env.rt.container_dir(&id), env.rt.state_dir(&id));
    env.rt.remove(&id).expect("remove");
    env.rt.remove(&id).expect("remove again");
    assert!(!dir.exists());
    assert!(!state.exists());
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
    let rootfs = env.rt.state_dir(&id).join("bundle/rootfs");
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
    env.rt = LibcontainerRuntime::new(env.root.join("rt"), &env.cgroup_root, Some(shim_binary()))
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

/// Resident pages of process `pid`'s main stack below the page its stack pointer is in,
/// read while it is blocked in a system call; None while it runs or if it is gone.
fn stack_pages_below_sp(pid: u32) -> Option<usize> {
    // `nr arg1 ... arg6 sp pc` for a task blocked in a call, `running` otherwise.
    let syscall = std::fs::read_to_string(format!("/proc/{pid}/syscall")).ok()?;
    let fields: Vec<&str> = syscall.split_whitespace().collect();
    if fields.len() < 9 {
        return None;
    }
    let sp = u64::from_str_radix(fields[fields.len() - 2].trim_start_matches("0x"), 16).ok()?;
    let stack = maps::mappings(pid)
        .into_iter()
        .find(|m| m.name == "[stack]")?;
    let sp_page = sp & !(maps::page_size() - 1);
    if !(stack.start..stack.end).contains(&sp_page) {
        return None;
    }
    let pages = maps::resident(pid, stack.start, sp_page)?;
    Some(pages.into_iter().filter(|&r| r).count())
}

/// The stack that creating a container reached down to (libcontainer's builder, the
/// spec, the init's set-up) goes back before the shim waits on it: the shim of a running
/// container keeps only the frames of its wait, for as long as the container runs.
#[test]
fn a_waiting_shim_keeps_no_stack_below_its_wait() {
    let env = Env::new("stack");
    let id = env.start("quiet", "exec sleep 1000", None).expect("start");
    let shim =
        live_pid(&env.rt.state_dir(&id).join("shim-pid.json"), "process").expect("shim alive");
    let shim = u32::try_from(shim.as_raw()).expect("pid");
    // It gives the pages back after it reports the container started: poll for that.
    let mut below = None;
    let released = wait_until(Duration::from_secs(10), || {
        below = stack_pages_below_sp(shim);
        below.is_some_and(|n| n <= 1)
    });
    assert!(
        released,
        "shim {shim}: {below:?} stack pages resident below the one it waits in"
    );
    env.rt.kill(&id, 9).expect("kill");
    assert_eq!(env.wait_exit(&id).exit_code, 137);
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
    let dir = env.rt.state_dir(&id);
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
