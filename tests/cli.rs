//! The `holdfast` command line as a user meets it: subcommands, their output and exit
//! codes, and clear errors for bad flags and config files.

use std::process::{Command, Output};

use support::agent::{bin, need_root, oci};
use support::tempdir::TempDir;

fn holdfast(args: &[&str]) -> Output {
    Command::new(bin())
        .args(args)
        .output()
        .expect("run holdfast")
}

fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

#[test]
fn version_and_usage() {
    let o = holdfast(&["version"]);
    assert!(o.status.success());
    assert!(
        text(&o).starts_with(&format!("holdfast {}", env!("CARGO_PKG_VERSION"))),
        "{}",
        text(&o)
    );
    let o = holdfast(&["frobnicate"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(text(&o).contains("unknown command"), "{}", text(&o));
}

#[test]
fn bad_flags_and_config_files_are_named() {
    let dir = TempDir::new("config");
    let o = holdfast(&["run", "--no-such-flag"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(text(&o).contains("--no-such-flag"), "{}", text(&o));

    let cfg = dir.0.join("config.yaml");
    std::fs::write(&cfg, "fileCheckFrequency: often\n").expect("config");
    let o = holdfast(&[
        "run",
        "--config",
        cfg.to_str().expect("utf-8"),
        "--root-dir",
        dir.0.join("root").to_str().expect("utf-8"),
    ]);
    assert_eq!(o.status.code(), Some(2));
    assert!(text(&o).contains("fileCheckFrequency"), "{}", text(&o));

    let o = holdfast(&[
        "run",
        "--config",
        dir.0.join("missing.yaml").to_str().expect("utf-8"),
    ]);
    assert_eq!(o.status.code(), Some(2));
    assert!(text(&o).contains("missing.yaml"), "{}", text(&o));
}

#[test]
fn image_import_ls_rm_without_an_agent() {
    if !need_root() {
        return;
    }
    let dir = TempDir::new("image");
    let root = dir.0.join("root");
    let root_s = root.to_str().expect("utf-8");
    let tar = dir.0.join("busybox.tar");
    oci::busybox_image("registry.local:5000/tools/busybox:1.36")
        .and_then(|i| i.write_layout_tar(&tar))
        .expect("image");

    let o = holdfast(&[
        "image",
        "import",
        tar.to_str().expect("utf-8"),
        "--root-dir",
        root_s,
    ]);
    assert!(o.status.success(), "{}", text(&o));
    assert!(
        text(&o).contains("registry.local:5000/tools/busybox:1.36"),
        "{}",
        text(&o)
    );

    let o = holdfast(&["image", "ls", "--root-dir", root_s]);
    assert!(o.status.success(), "{}", text(&o));
    let ls = text(&o);
    // Repository and tag in columns of their own, then digest, size and last use.
    assert!(
        ls.lines().any(|l| {
            let cols: Vec<&str> = l.split_whitespace().collect();
            cols.first() == Some(&"registry.local:5000/tools/busybox")
                && cols.get(1) == Some(&"1.36")
                && cols.get(2).is_some_and(|d| d.starts_with("sha256:"))
                && cols.last() == Some(&"never")
        }),
        "{ls}"
    );

    let o = holdfast(&[
        "image",
        "rm",
        "registry.local:5000/tools/busybox:1.36",
        "--root-dir",
        root_s,
    ]);
    assert!(o.status.success(), "{}", text(&o));
    let o = holdfast(&["image", "ls", "--root-dir", root_s]);
    assert!(!text(&o).contains("tools/busybox"), "{}", text(&o));

    let o = holdfast(&[
        "image",
        "import",
        dir.0.join("nope.tar").to_str().expect("utf-8"),
        "--root-dir",
        root_s,
    ]);
    assert!(!o.status.success());
    assert!(text(&o).contains("nope.tar"), "{}", text(&o));

    let o = holdfast(&["pods", "--root-dir", root_s]);
    assert!(o.status.success(), "{}", text(&o));
    assert!(text(&o).starts_with("POD"), "{}", text(&o));
    // `holdfast pods -o json | head` and `holdfast image ls | head`, their reader gone.
    for args in [&["pods", "-o", "json"][..], &["pods"], &["image", "ls"]] {
        let o = into_closed_pipe(&[args, &["--root-dir", root_s]].concat());
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(err.trim().is_empty(), "{args:?} said: {err}");
        assert_eq!(o.status.code(), Some(141), "{args:?}: {err}");
    }
    let o = holdfast(&[
        "reset",
        "--root-dir",
        root_s,
        "--cgroup-root",
        "/holdfast-cli-test",
    ]);
    assert!(o.status.success(), "{}", text(&o));
    assert!(!root.exists(), "reset removes the root dir");
}

#[test]
fn status_without_an_agent_says_so() {
    let dir = TempDir::new("status");
    let root = dir.0.join("root");
    std::fs::create_dir_all(&root).expect("root");
    let root_s = root.to_str().expect("utf-8");
    let o = holdfast(&["status", "--root-dir", root_s]);
    assert!(o.status.success(), "{}", text(&o));
    let t = text(&o);
    assert!(t.contains("agent:        not running"), "{t}");
    assert!(t.contains("store:        0 B"), "{t}");
    assert!(!root.join("db").exists(), "status makes no store");
    let o = holdfast(&["status", "--json", "--root-dir", root_s]);
    assert!(o.status.success(), "{}", text(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).expect("json");
    assert_eq!(v["agentRunning"], false);
    assert_eq!(v["uplink"]["state"], "unknown");
    assert_eq!(v["storeBytes"], 0);
    let o = holdfast(&["status", "--bogus", "--root-dir", root_s]);
    assert!(!o.status.success());
    assert!(text(&o).contains("--bogus"), "{}", text(&o));
}

/// `holdfast status | head` and the like: output to a pipe whose reader has gone ends the
/// command quietly with 141, what a shell reports for coreutils and kubectl killed by
/// SIGPIPE, instead of a panic.
#[test]
fn output_to_a_closed_pipe_ends_quietly() {
    let dir = TempDir::new("pipe");
    let root = dir.0.join("root");
    std::fs::create_dir_all(&root).expect("root");
    let root_s = root.to_str().expect("utf-8");
    for args in [
        &["version"][..],
        &["help"],
        &["check", "--help"],
        &["status", "--root-dir", root_s],
        &["status", "--json", "--root-dir", root_s],
    ] {
        let o = into_closed_pipe(args);
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(!err.contains("panicked"), "{args:?}: {err}");
        assert!(err.trim().is_empty(), "{args:?} said: {err}");
        assert_eq!(o.status.code(), Some(141), "{args:?}: {err}");
    }
}

/// Runs holdfast with its standard output a pipe whose read end is closed before the
/// command starts, so its first write fails as under `| head` once head has quit.
fn into_closed_pipe(args: &[&str]) -> Output {
    let (read, write) = nix::unistd::pipe().expect("pipe");
    drop(read);
    Command::new(bin())
        .args(args)
        .stdout(std::process::Stdio::from(write))
        .output()
        .expect("run holdfast")
}
