//! `holdfast check` as a user runs it: against fixture kernel configs, where the file
//! decides every kernel feature so the verdict does not depend on this machine, and
//! against this machine, where only the shape of the report is asserted.

use std::path::PathBuf;
use std::process::{Command, Output};

const BIN: &str = env!("CARGO_BIN_EXE_holdfast");

fn fixture(name: &str) -> String {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/kernel")
        .join(name)
        .display()
        .to_string()
}

fn check(args: &[&str]) -> Output {
    Command::new(BIN)
        .arg("check")
        .args(args)
        .output()
        .expect("run holdfast check")
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// The item lines of one group (`required:` or `optional:`).
fn group<'a>(report: &'a str, title: &str) -> Vec<&'a str> {
    report
        .lines()
        .skip_while(|l| *l != title)
        .skip(1)
        .take_while(|l| l.starts_with("  "))
        .collect()
}

/// Items whose verdict depends on this machine even when a kernel config decides the
/// kernel features; they only ever warn.
fn machine_dependent(line: &str) -> bool {
    ["disk space:", "free inodes:", "clock:"]
        .iter()
        .any(|n| line.contains(n))
}

fn well_formed(line: &str) -> bool {
    let Some(rest) = line.strip_prefix("  ") else {
        return false;
    };
    let body = ["[ok]   ", "[MISSING] ", "[warn] "]
        .iter()
        .find_map(|tag| rest.strip_prefix(tag));
    body.and_then(|b| b.split_once(": "))
        .is_some_and(|(name, detail)| {
            !name.is_empty() && !name.starts_with(' ') && !detail.trim().is_empty()
        })
}

#[test]
fn complete_kernel_config_passes() {
    let o = check(&["--kernel-config", &fixture("complete.config")]);
    let out = stdout(&o);
    assert_eq!(o.status.code(), Some(0), "{out}{}", stderr(&o));
    let required = group(&out, "required:");
    assert!(required.len() >= 10, "{out}");
    for line in &required {
        assert!(well_formed(line), "{line:?}");
        if !machine_dependent(line) {
            assert!(line.starts_with("  [ok]   "), "not ok: {line}\n{out}");
        }
        assert!(!line.contains("[MISSING]"), "{line}");
    }
    for name in [
        "pid namespace",
        "mount namespace",
        "ipc namespace",
        "uts namespace",
        "network namespace",
        "cgroup memory controller",
        "cgroup pids controller",
        "overlayfs",
    ] {
        assert!(
            required.iter().any(|l| l
                .split_once("] ")
                .is_some_and(|(_, rest)| rest.trim_start().starts_with(&format!("{name}: ")))),
            "{name} not reported\n{out}"
        );
    }
    assert!(out.contains("overlayfs: CONFIG_OVERLAY_FS=m"), "{out}");
    assert!(out.contains("decides kernel features"), "{out}");
    assert!(
        out.ends_with("result: every required item is there\n"),
        "{out}"
    );
}

#[test]
fn kernel_without_overlayfs_fails_naming_it() {
    let o = check(&["--kernel-config", &fixture("no-overlayfs.config")]);
    let out = stdout(&o);
    assert_eq!(o.status.code(), Some(1), "{out}{}", stderr(&o));
    assert!(
        out.contains("  [MISSING] overlayfs: CONFIG_OVERLAY_FS not set"),
        "{out}"
    );
    assert!(out.contains("result: missing overlayfs\n"), "{out}");
}

#[test]
fn kernel_without_memcg_fails_naming_the_memory_cgroup() {
    let o = check(&["--kernel-config", &fixture("no-memcg.config")]);
    let out = stdout(&o);
    assert_eq!(o.status.code(), Some(1), "{out}{}", stderr(&o));
    assert!(
        out.contains("  [MISSING] cgroup memory controller: CONFIG_MEMCG not set"),
        "{out}"
    );
    assert!(
        out.contains("result: missing cgroup memory controller\n"),
        "{out}"
    );
}

#[test]
fn this_machine_gets_a_well_formed_report() {
    let o = check(&[]);
    let out = stdout(&o);
    assert!(
        matches!(o.status.code(), Some(0) | Some(1)),
        "{out}{}",
        stderr(&o)
    );
    assert!(out.starts_with("holdfast check: kernel "), "{out}");
    let required = group(&out, "required:");
    let optional = group(&out, "optional:");
    assert!(!required.is_empty() && !optional.is_empty(), "{out}");
    for line in out.lines() {
        if line.starts_with("  ") {
            assert!(well_formed(line), "malformed: {line:?}");
        } else {
            assert!(
                line.starts_with("holdfast check:")
                    || line == "required:"
                    || line == "optional:"
                    || line.starts_with("result: "),
                "unexpected line {line:?}"
            );
        }
    }
    let missing = required.iter().any(|l| l.contains("[MISSING]"));
    assert_eq!(o.status.code() == Some(1), missing, "{out}");
}

#[test]
fn board_expectation_with_a_kernel_config_only_warns() {
    let o = check(&[
        "--kernel-config",
        &fixture("complete.config"),
        "--board=rpi4",
    ]);
    let out = stdout(&o);
    assert_eq!(o.status.code(), Some(0), "{out}{}", stderr(&o));
    assert!(
        out.contains("  [warn] cgroup version for board rpi4: expects v2"),
        "{out}"
    );
}

#[test]
fn usage_errors_exit_2() {
    let o = check(&["--frobnicate"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("--frobnicate"), "{}", stderr(&o));

    let o = check(&["--kernel-config", "/nonexistent/.config"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(
        stderr(&o).contains("/nonexistent/.config"),
        "{}",
        stderr(&o)
    );

    let o = check(&["--board", "rpi9"]);
    assert_eq!(o.status.code(), Some(2));
    let err = stderr(&o);
    assert!(err.contains("unknown board \"rpi9\""), "{err}");
    for known in ["rpi4", "rpi3-armv7", "imx8m", "arm64-vm"] {
        assert!(err.contains(known), "{err}");
    }
}

/// A root dir on a filesystem in memory (a read-only rootfs binds /var/lib to a tmpfs)
/// is said to lose every pod's state at the next power cut; one on disk is said to keep
/// it. The tmpfs is mounted here, so the verdict does not depend on this machine.
#[test]
fn a_root_dir_in_memory_is_said_to_lose_its_state() {
    if !support::agent::need_root() {
        return;
    }
    let dir = support::tempdir::TempDir::new("check-tmpfs");
    let mnt = dir.0.join("tmpfs");
    std::fs::create_dir_all(&mnt).expect("mount point");
    nix::mount::mount(
        Some("tmpfs"),
        &mnt,
        Some("tmpfs"),
        nix::mount::MsFlags::empty(),
        Some("size=8m"),
    )
    .expect("mount a tmpfs");
    let root = mnt.join("holdfast");
    let o = check(&["--root-dir", &root.display().to_string()]);
    let _ = nix::mount::umount2(&mnt, nix::mount::MntFlags::MNT_DETACH);
    let out = stdout(&o);
    assert!(
        out.lines()
            .any(|l| l.starts_with("  [warn] state kept across power cuts: ")
                && l.contains("is in memory (tmpfs)")),
        "{out}"
    );
    // The build's own folder is on the disk the tests run from.
    let target = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target");
    let on_disk = nix::sys::statfs::statfs(&target)
        .is_ok_and(|fs| fs.filesystem_type() != nix::sys::statfs::TMPFS_MAGIC);
    if on_disk {
        let out = stdout(&check(&[
            "--root-dir",
            &target.join("no-such-root").display().to_string(),
        ]));
        assert!(
            out.contains("  [ok]   state kept across power cuts: "),
            "{out}"
        );
    }
}
