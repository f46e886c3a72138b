//! What the host's other users can reach of what containers write: nothing. Real
//! containers, run as root; each check is then made as `nobody` (65534) through
//! `setpriv`, as an unprivileged user of the gateway would try it. Also the logs of a
//! pod whose names are the longest the API allows.

use support::{agent, kubelet_api};

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::{Command, Output};
use std::time::Duration;

use agent::{container, need_root, Agent};
use kubelet_api::{container_id, Api};

const WAIT: Duration = Duration::from_secs(60);

/// Runs `program args` as nobody, with no supplementary groups. A shell finds the
/// program once it is nobody (setpriv looks its own argument up while still root).
fn as_nobody(program: &Path, args: &[&str]) -> Output {
    Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups"])
        .args(["/bin/sh", "-c", "exec \"$0\" \"$@\""])
        .arg(program)
        .args(args)
        .output()
        .expect("run setpriv (util-linux)")
}

fn text(out: &Output) -> String {
    format!(
        "status {}, stdout {:?}, stderr {:?}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

fn mode(p: &Path) -> u32 {
    std::fs::metadata(p).expect("stat").permissions().mode() & 0o7777
}

#[test]
fn a_setuid_binary_and_a_secret_a_pod_leaves_are_out_of_reach_of_host_users() {
    if !need_root() {
        return;
    }
    let mut a = Agent::new("host-users");
    // A root dir left wide open, as older versions and `holdfast reset` made it.
    std::fs::set_permissions(&a.root, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    a.write_manifest(
        "suid.yaml",
        r#"apiVersion: v1
kind: Pod
metadata: {name: suid}
spec:
  containers:
  - name: main
    image: docker.io/library/busybox:demo
    command: ["sh", "-c", "for d in /tmp /data; do cp /bin/busybox $d/busybox && chmod 4755 $d/busybox; done && echo password=hunter2 && sleep 1000000"]
    volumeMounts: [{name: data, mountPath: /data}]
  volumes: [{name: data, emptyDir: {}}]
"#,
    );
    a.start();
    assert_eq!(mode(&a.root), 0o700, "root dir after start");
    assert!(
        a.agent_log().contains("now 0700"),
        "the agent says it narrowed the root dir:\n{}",
        a.agent_log()
    );
    let pod = a.wait_pod("suid", "running", WAIT, |p| {
        !container(p, "main")["state"]["running"].is_null()
    });
    let id = container_id(&pod, "main");
    let upper_tmp = a.root.join("containers").join(&id).join("upper/tmp");
    let binary = upper_tmp.join("busybox");
    let uid = pod["pod"]["metadata"]["uid"].as_str().expect("uid");
    let empty_dir = a
        .root
        .join("pods")
        .join(uid)
        .join("volumes/kubernetes.io~empty-dir/data");
    for b in [&binary, &empty_dir.join("busybox")] {
        a.wait_until(
            &format!("the pod's setuid copy {}", b.display()),
            WAIT,
            |_| std::fs::metadata(b).is_ok_and(|m| m.permissions().mode() & 0o4000 != 0),
        );
    }
    let log = a
        .root
        .join("logs/pods")
        .join(format!("default_suid-node-1_{uid}"))
        .join("main/0.log");
    a.wait_until("the secret in the log", WAIT, |_| {
        std::fs::read_to_string(&log).is_ok_and(|l| l.contains("password=hunter2"))
    });

    // As nobody: the binary can be neither run nor even found, the log not read.
    for b in [&binary, &empty_dir.join("busybox")] {
        let run = as_nobody(b, &["id", "-u"]);
        assert!(
            !run.status.success(),
            "nobody ran {}: {}",
            b.display(),
            text(&run)
        );
        assert!(
            String::from_utf8_lossy(&run.stderr).contains("Permission denied"),
            "{}",
            text(&run)
        );
    }
    let stat = as_nobody(Path::new("/usr/bin/stat"), &[&binary.to_string_lossy()]);
    assert!(!stat.status.success(), "{}", text(&stat));
    let cat = as_nobody(Path::new("/bin/cat"), &[&log.to_string_lossy()]);
    assert!(!cat.status.success(), "nobody read the log: {}", text(&cat));
    assert!(!String::from_utf8_lossy(&cat.stdout).contains("hunter2"));
    assert_eq!(mode(&log) & 0o007, 0, "log mode {:o}", mode(&log));
    assert_eq!(mode(log.parent().expect("dir")), 0o700);

    // Where the container writes, setuid bits and device nodes mean nothing on the
    // host's side of the path.
    for dir in [&upper_tmp, &empty_dir] {
        let flags = nix::sys::statvfs::statvfs(dir).expect("statvfs").flags();
        assert!(
            flags.contains(nix::sys::statvfs::FsFlags::ST_NOSUID)
                && flags.contains(nix::sys::statvfs::FsFlags::ST_NODEV),
            "{} is on a mount with {flags:?}",
            dir.display()
        );
    }
    // Mounts of holdfast's own, not whatever the root dir happens to sit on (a test's
    // /tmp may be nosuid already).
    let container_dir = a.root.join("containers").join(&id);
    for (path, mount_point) in [(&upper_tmp, &container_dir), (&empty_dir, &empty_dir)] {
        let findmnt = Command::new("findmnt")
            .args(["-n", "-o", "TARGET,OPTIONS", "-T"])
            .arg(path)
            .output()
            .expect("findmnt");
        let found = String::from_utf8_lossy(&findmnt.stdout).into_owned();
        let (target, options) = found.trim().split_once(' ').unwrap_or_default();
        assert_eq!(Path::new(target), mount_point.as_path(), "{found}");
        assert!(
            options.contains("nosuid") && options.contains("nodev"),
            "{found}"
        );
    }

    // Reset leaves nothing, and the next start makes the root dir 0700 again.
    a.reset();
    a.assert_clean();
    a.remove_manifest("suid.yaml");
    a.start();
    assert_eq!(mode(&a.root), 0o700, "root dir after reset and start");
}

#[test]
fn the_longest_valid_names_keep_their_logs() {
    if !need_root() {
        return;
    }
    let api = Api::start("long-names");
    // 63 bytes of namespace, 253 of pod name (with the node's suffix), 63 of container.
    let ns = format!("ns-{}", "n".repeat(60));
    let name = format!("pod-{}", "p".repeat(253 - 4 - "-node-1".len()));
    let full = format!("{name}-node-1");
    let c = format!("c-{}", "c".repeat(61));
    assert_eq!((ns.len(), full.len(), c.len()), (63, 253, 63));
    api.agent.write_manifest(
        "long.yaml",
        &format!(
            r#"apiVersion: v1
kind: Pod
metadata: {{name: {name}, namespace: {ns}}}
spec:
  containers:
  - name: {c}
    image: docker.io/library/busybox:demo
    command: ["sh", "-c", "echo said by the long pod; sleep 1000000"]
"#
        ),
    );
    api.agent.wait_pod(&name, "running", WAIT, |p| {
        !container(p, &c)["state"]["running"].is_null()
    });
    let path = format!("/containerLogs/{ns}/{full}/{c}");
    let mut last = (0, String::new());
    api.agent
        .wait_until("the long pod's output through the API", WAIT, |_| {
            last = api.get(&path);
            last.0 == 200 && last.1.contains("said by the long pod")
        });
    assert_eq!(last.1, "said by the long pod\n");
    let (code, body) = api.get(&format!("{path}?tailLines=1&timestamps=true"));
    assert_eq!(code, 200, "{body}");
    assert!(body.ends_with(" said by the long pod\n"), "{body}");

    // A log that cannot be read is an error, not an empty answer.
    let logs = api.agent.root.join("logs/pods");
    let dir = std::fs::read_dir(&logs)
        .expect("log folders")
        .flatten()
        .map(|e| e.path())
        .find(|p| p.to_string_lossy().contains(&ns))
        .expect("the long pod's log folder");
    assert!(dir.file_name().expect("name").len() <= 255);
    std::fs::remove_file(dir.join(&c).join("0.log")).expect("remove the log");
    let (code, body) = api.get(&path);
    assert_eq!(code, 400, "{body}");
    assert!(body.contains("failed to open log file"), "{body}");
}
