//! A command run in a running container through the runtime's exec process, in the
//! non-interactive form exec probes and lifecycle hooks use (`exec_sync`): output,
//! exit code, output cap, timeout. Real containers (as root).

mod runtime_support;

use std::time::{Duration, Instant};

use holdfast::runtime::Runtime;
use k8s_openapi::api::core::v1::Container;

use runtime_support::*;

fn sh(script: &str) -> Vec<String> {
    vec!["sh".into(), "-c".into(), script.into()]
}

/// Processes whose root is `rootfs` and whose command line is `cmdline` (words).
fn processes_in(rootfs: &std::path::Path, cmdline: &[&str]) -> Vec<u32> {
    let want: Vec<u8> = cmdline
        .iter()
        .flat_map(|w| [w.as_bytes(), b"\0"].concat())
        .collect();
    std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            std::fs::read_link(format!("/proc/{pid}/root")).is_ok_and(|r| r == rootfs)
                && std::fs::read(format!("/proc/{pid}/cmdline")).is_ok_and(|c| c == want)
        })
        .collect()
}

#[test]
fn exec_sync_output_exit_code_cap_and_timeout() {
    if !nix::unistd::geteuid().is_root() {
        eprintln!("skipped: needs root to run containers");
        return;
    }
    let env = Env::new("exec-sync");
    let pod = pod();
    let container = Container {
        name: "main".into(),
        command: Some(sh("exec sleep 1000")),
        working_dir: Some("/tmp".into()),
        ..Default::default()
    };
    let id = env.start_container(&pod, &container).expect("start");
    let rootfs = env.rt.state_dir(&id).join("bundle/rootfs");

    // Output and exit code; the command runs where the container's process does.
    let r = env
        .rt
        .exec_sync(
            &id,
            &sh("pwd; echo err >&2; exit 4"),
            Duration::from_secs(10),
            1024,
        )
        .expect("exec");
    assert_eq!(r.exit.exit_code, Some(4), "{r:?}");
    assert_eq!(String::from_utf8_lossy(&r.stdout), "/tmp\n");
    assert_eq!(String::from_utf8_lossy(&r.stderr), "err\n");
    assert!(!r.truncated && !r.timed_out);

    // Output past the cap is dropped, and said so.
    let r = env
        .rt
        .exec_sync(
            &id,
            &sh("head -c 100000 /dev/zero"),
            Duration::from_secs(10),
            1000,
        )
        .expect("exec");
    assert_eq!((r.stdout.len(), r.truncated), (1000, true));
    assert_eq!(r.exit.exit_code, Some(0));

    // A command past its timeout is killed, not left running in the container.
    let started = Instant::now();
    let r = env
        .rt
        .exec_sync(
            &id,
            &["sleep".into(), "999".into()],
            Duration::from_secs(1),
            1024,
        )
        .expect("exec");
    assert!(r.timed_out, "{r:?}");
    assert_eq!(r.exit.exit_code, Some(137), "{r:?}");
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );
    assert!(
        wait_until(Duration::from_secs(5), || processes_in(
            &rootfs,
            &["sleep", "999"]
        )
        .is_empty()),
        "the timed-out command still runs"
    );

    // A command that does not exist fails, it does not hang.
    let r = env
        .rt
        .exec_sync(&id, &["/no/such".into()], Duration::from_secs(10), 1024)
        .expect("exec");
    assert!(!r.timed_out && r.exit.exit_code != Some(0), "{r:?}");

    // The container itself ran on throughout.
    assert!(matches!(
        env.rt.state(&id).expect("state"),
        holdfast::runtime::ContainerState::Running { .. }
    ));
}
