//! How a container's shim starts and waits, with real containers (as root): the agent
//! learns of a start or of a dead shim from the readiness pipe, not a timer; records of
//! processes a power cut killed do not stop a container from being removed; the shim
//! is one exec of the binary; an idle shim sleeps until something happens; a shim
//! leaves its exit record unsynced when the agent says its store holds the exit, and
//! syncs it itself when no agent does.

mod runtime_support;

use std::sync::mpsc;
use std::time::Duration;

use holdfast::runtime::{ContainerId, ContainerState, LibcontainerRuntime, Runtime, RuntimeError};
use nix::sys::signal::{kill, Signal};

use runtime_support::*;

/// The field `name` of `/proc/<pid>/status`.
fn status_field(pid: nix::unistd::Pid, name: &str) -> Option<u64> {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()?
        .lines()
        .find_map(|l| l.strip_prefix(name))
        .and_then(|v| v.trim().parse().ok())
}

fn shim_of(env: &Env, id: &ContainerId) -> nix::unistd::Pid {
    live_pid(&env.rt.state_dir(id).join("shim-pid.json"), "process").expect("shim alive")
}

/// Starts `sleep` and waits until its output is logged.
fn start_sleeper(env: &Env, name: &str) -> ContainerId {
    let id = env
        .start(name, "echo up; exec sleep 1000", None)
        .expect("start");
    let log = env.log_path(name);
    assert!(
        wait_until(Duration::from_secs(10), || log_records(&log)
            .iter()
            .any(|r| r.2 == "up")),
        "no output logged"
    );
    id
}

fn stop(env: &Env, id: &ContainerId) {
    env.rt.kill(id, 9).expect("kill");
    assert_eq!(env.wait_exit(id).exit_code, 137);
}

#[test]
fn a_shim_that_dies_before_its_record_is_noticed_at_once() {
    let mut env = Env::new("dies");
    // `shim start` succeeds, but no shim is left to write a record.
    let fake = env.root.join("fake-shim");
    std::fs::write(&fake, "#!/bin/sh\nexit 0\n").expect("write fake shim");
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&fake, std::fs::Permissions::from_mode(0o755))
            .expect("chmod fake shim");
    }
    // A start timeout far beyond the test's own deadline: only the pipe can end it in
    // time.
    env.rt = LibcontainerRuntime::new(env.root.join("rt"), &env.cgroup_root, Some(fake))
        .expect("runtime")
        .with_start_timeout(Duration::from_secs(600));
    let env = std::sync::Arc::new(env);
    let (tx, rx) = mpsc::channel();
    let starter = std::sync::Arc::clone(&env);
    std::thread::spawn(move || {
        let _ = tx.send(starter.start("dies", "exec sleep 1000", None));
    });
    match rx.recv_timeout(Duration::from_secs(20)) {
        Ok(Err(RuntimeError::Create { message, .. })) => {
            assert!(
                message.contains("shim exited without a record"),
                "{message}"
            )
        }
        Ok(other) => panic!("expected a create error, got {other:?}"),
        Err(_) => panic!("the shim's death was not noticed within 20 s"),
    }
}

#[test]
fn records_torn_by_a_power_cut_do_not_stop_a_remove() {
    let env = Env::new("torn");
    let id = start_sleeper(&env, "torn");
    let dir = env.rt.state_dir(&id);
    let init = live_pid(&dir.join("started.json"), "init").expect("init alive");
    // A power cut: the shim and its container die without a word, and records written
    // without a sync are cut short.
    let _ = kill(shim_of(&env, &id), Signal::SIGKILL);
    let _ = kill(init, Signal::SIGKILL);
    assert!(
        wait_until(Duration::from_secs(10), || !alive(init)),
        "init lives"
    );
    for record in ["started.json", "shim-pid.json"] {
        std::fs::write(dir.join(record), b"{\"init\": {\"pid\"").expect("tear record");
    }
    match env.rt.state(&id) {
        Ok(ContainerState::Unknown) => {}
        other => panic!("expected an unknown state, got {other:?}"),
    }
    env.rt.remove(&id).expect("remove");
    assert!(!dir.exists());
}

#[test]
fn the_shim_is_the_process_the_agent_started_not_a_second_exec() {
    let env = Env::new("one-exec");
    let id = start_sleeper(&env, "one");
    let shim = shim_of(&env, &id);
    let cmdline = std::fs::read(format!("/proc/{shim}/cmdline")).expect("shim cmdline");
    let args: Vec<&[u8]> = cmdline.split(|b| *b == 0).collect();
    assert_eq!(
        args.get(2).copied(),
        Some(&b"start"[..]),
        "shim command line {:?}",
        String::from_utf8_lossy(&cmdline)
    );
    stop(&env, &id);
}

#[test]
fn an_idle_shim_does_not_wake_up() {
    let env = Env::new("idle");
    let id = start_sleeper(&env, "idle");
    let shim = shim_of(&env, &id);
    let sleeping = || {
        std::fs::read_to_string(format!("/proc/{shim}/stat"))
            .ok()
            .and_then(|s| s.rsplit_once(") ").map(|(_, rest)| rest.starts_with('S')))
            .unwrap_or(false)
    };
    assert!(
        wait_until(Duration::from_secs(10), sleeping),
        "shim never sleeps"
    );
    let before = status_field(shim, "voluntary_ctxt_switches:").expect("switches");
    // The window watched, not a wait for anything: longer than two of the slow
    // timer's periods (2 s).
    std::thread::sleep(Duration::from_millis(4500));
    let after = status_field(shim, "voluntary_ctxt_switches:").expect("switches");
    assert_eq!(
        after,
        before,
        "the idle shim woke up {} times",
        after - before
    );
    // It still sees its container end at once.
    stop(&env, &id);
    assert!(
        wait_until(Duration::from_secs(10), || !alive(shim)),
        "shim did not exit"
    );
}

/// The exit record's costly `fsync` is skipped when the agent took the exit: the shim
/// waits for that word (its `exits/<id>` removed) and goes at once when it comes; with
/// no word it syncs the record itself and goes after its wait (3 s), the record kept.
#[test]
fn a_shim_goes_once_its_exit_is_taken_and_keeps_it_when_none_takes_it() {
    let env = Env::new("taken");
    let taken = env.start("taken", "sleep 1; exit 3", None).expect("start");
    let left = env.start("left", "sleep 1; exit 4", None).expect("start");
    let (taken_shim, left_shim) = (shim_of(&env, &taken), shim_of(&env, &left));
    assert_eq!(env.wait_exit(&taken).exit_code, 3);
    let exited = std::time::Instant::now();
    env.rt.exit_recorded(&taken);
    assert!(
        wait_until(Duration::from_secs(10), || !alive(taken_shim)),
        "shim lives on"
    );
    let gone_after = exited.elapsed();
    assert!(
        gone_after < Duration::from_millis(2500),
        "the shim whose exit was taken waited {gone_after:?}, as if no one had"
    );
    assert_eq!(env.wait_exit(&left).exit_code, 4);
    assert!(alive(left_shim), "the shim no agent answered did not wait");
    assert!(
        wait_until(Duration::from_secs(10), || !alive(left_shim)),
        "shim lives on"
    );
    // Its record, synced, reads as the exit.
    assert_eq!(env.wait_exit(&left).exit_code, 4);
}
