//! Ephemeral containers, end to end: the real kubectl through a real kube-apiserver
//! v1.36 to real containers, as root. `kubectl debug --target` adds one to a running
//! pod that runs in the target's PID namespace (it sees the target's processes), shows
//! in `ephemeralContainerStatuses`, and is reached by `kubectl logs` and `exec`; one
//! added by a patch of the `ephemeralcontainers` subresource, with no target, sees only
//! its own; `kubectl debug -i` attaches to one, which ends when its shell exits and is
//! never started again; a privileged one is refused on a node that allows none. The
//! pod's own container runs on untouched throughout.

use support::control_plane;

use std::io::Write;
use std::process::Stdio;
use std::time::{Duration, Instant};

use control_plane::ControlPlane;
use serde_json::Value;
use support::agent::{need_root, Agent};

const WAIT: Duration = Duration::from_secs(90);
const NODE: &str = "ephemeral-node-1";
const POD: &str = "debugged";
const IMAGE: &str = "docker.io/library/busybox:demo";
/// What the pod's own container runs: the process an ephemeral container with it as
/// target sees.
const TARGET_CMD: &str = "sleep 3600";

fn pod_yaml() -> String {
    format!(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: {POD}\nspec:\n  nodeName: {NODE}\n  \
         automountServiceAccountToken: false\n  terminationGracePeriodSeconds: 1\n  \
         containers:\n    \
         - name: main\n      image: {IMAGE}\n      command: [\"sleep\", \"3600\"]\n"
    )
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

fn tail(s: &str, n: usize) -> String {
    let lines: Vec<&str> = s.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// The status of container `name` in list `list` of the pod's status.
fn status_of<'a>(pod: &'a Value, list: &str, name: &str) -> Option<&'a Value> {
    pod["status"][list]
        .as_array()?
        .iter()
        .find(|c| c["name"] == name)
}

/// The pod once ephemeral container `name` is in state `state` (`running`,
/// `terminated`).
fn wait_ephemeral(cp: &ControlPlane, a: &Agent, name: &str, state: &str) -> Value {
    let log = || format!("--- agent log ---\n{}", tail(&a.agent_log(), 40));
    cp.wait_for(
        &format!("ephemeral container {name} {state}"),
        WAIT,
        log,
        |cp| {
            cp.get(&format!("pod/{POD}"), None).filter(|p| {
                status_of(p, "ephemeralContainerStatuses", name)
                    .is_some_and(|s| s["state"][state].is_object())
            })
        },
    )
}

/// `kubectl exec POD -c container -- args`: its stdout; panics if it fails.
fn exec(cp: &ControlPlane, container: &str, args: &[&str]) -> String {
    let mut all = vec!["exec", POD, "-c", container, "--"];
    all.extend_from_slice(args);
    let out = cp.kubectl(&all);
    assert!(
        out.status.success(),
        "kubectl {}: {}",
        all.join(" "),
        text(&out.stderr)
    );
    text(&out.stdout)
}

/// `kubectl debug -i` with a shell that reads `input`: kubectl's output once it ended
/// (it is killed after a while).
fn debug_interactive(cp: &ControlPlane, name: &str, input: &str) -> String {
    let args = ["debug", POD, "-i", "--image", IMAGE, "-c", name, "--", "sh"];
    let mut child = cp
        .kubectl_cmd(&args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("kubectl debug -i");
    let mut stdin = child.stdin.take().expect("stdin");
    stdin.write_all(input.as_bytes()).expect("write stdin");
    let deadline = Instant::now() + WAIT;
    while child.try_wait().expect("kubectl debug").is_none() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(100));
    }
    let _ = child.kill();
    drop(stdin);
    let out = child.wait_with_output().expect("kubectl debug -i");
    format!("{}{}", text(&out.stdout), text(&out.stderr))
}

/// The main container's id and restart count, which no ephemeral container changes.
fn main_instance(pod: &Value) -> (Value, Value) {
    let main = status_of(pod, "containerStatuses", "main").expect("main's status");
    (main["containerID"].clone(), main["restartCount"].clone())
}

#[test]
fn ephemeral_containers_through_the_apiserver() {
    if !need_root() {
        return;
    }
    let (cp, a) = control_plane::cluster::bare_node("ephemeral", NODE);
    cp.apply(&pod_yaml());
    let log = || format!("--- agent log ---\n{}", tail(&a.agent_log(), 40));
    let pod = cp.wait_for("main running", WAIT, log, |cp| {
        cp.get(&format!("pod/{POD}"), None).filter(|p| {
            status_of(p, "containerStatuses", "main")
                .is_some_and(|s| s["state"]["running"].is_object())
        })
    });
    let main = main_instance(&pod);

    // kubectl debug with the main container as target.
    let script = "echo polo; while sleep 1; do :; done";
    cp.kubectl_ok(&[
        "debug", POD, "--image", IMAGE, "--target", "main", "-c", "debugger", "--", "sh", "-c",
        script,
    ]);
    let pod = wait_ephemeral(&cp, &a, "debugger", "running");
    let debugger = status_of(&pod, "ephemeralContainerStatuses", "debugger").expect("status");
    assert_eq!(debugger["ready"], false, "{debugger}");
    assert_eq!(debugger["restartCount"], 0, "{debugger}");
    assert!(debugger["containerID"].as_str().is_some(), "{debugger}");
    assert_eq!(main_instance(&pod), main, "main was not restarted");
    cp.logs_showing(&[POD, "-c", "debugger"], "polo");
    assert_eq!(exec(&cp, "debugger", &["echo", "marco"]), "marco\n");
    let ps = exec(&cp, "debugger", &["ps", "-o", "pid,args"]);
    assert!(ps.contains(TARGET_CMD), "the target's processes:\n{ps}");

    // kubectl debug -i: attached to a shell, which ends with it.
    let out = debug_interactive(&cp, "shell", "echo marco-$((6*7))\nexit 3\n");
    assert!(out.contains("marco-42"), "kubectl debug -i said:\n{out}");
    let pod = wait_ephemeral(&cp, &a, "shell", "terminated");
    let shell = status_of(&pod, "ephemeralContainerStatuses", "shell").expect("status");
    assert_eq!(shell["state"]["terminated"]["exitCode"], 3, "{shell}");

    // Added by a patch of the subresource, with no target: its own PID namespace.
    let patch = serde_json::json!({"spec": {"ephemeralContainers": [{
        "name": "loner", "image": IMAGE,
        "command": ["sh", "-c", "while sleep 1; do :; done"],
    }]}});
    cp.kubectl_ok(&[
        "patch",
        "pod",
        POD,
        "--subresource",
        "ephemeralcontainers",
        "--type",
        "strategic",
        "-p",
        &patch.to_string(),
    ]);
    wait_ephemeral(&cp, &a, "loner", "running");
    let ps = exec(&cp, "loner", &["ps", "-o", "pid,args"]);
    assert!(
        !ps.contains(TARGET_CMD),
        "no target, its own processes:\n{ps}"
    );

    // A privileged one on a node that allows no privileged container: refused, for
    // good, with the reason.
    cp.kubectl_ok(&[
        "debug",
        POD,
        "--image",
        IMAGE,
        "--profile",
        "sysadmin",
        "-c",
        "root",
        "--",
        "sh",
    ]);
    let pod = cp.wait_for("the privileged one refused", WAIT, log, |cp| {
        cp.get(&format!("pod/{POD}"), None).filter(|p| {
            status_of(p, "ephemeralContainerStatuses", "root")
                .is_some_and(|s| s["state"]["waiting"]["reason"] == "CreateContainerConfigError")
        })
    });
    let root = status_of(&pod, "ephemeralContainerStatuses", "root").expect("status");
    let message = root["state"]["waiting"]["message"]
        .as_str()
        .unwrap_or_default();
    assert!(
        message.contains("privileged ephemeral container, but is disallowed"),
        "{root}"
    );
    assert!(root.get("containerID").is_none(), "nothing ran: {root}");

    // After all that, the shell that ended is still the one that ran, and main runs on.
    let shell_now = status_of(&pod, "ephemeralContainerStatuses", "shell").expect("status");
    assert_eq!(
        shell_now, shell,
        "an ephemeral container is never restarted"
    );
    assert_eq!(main_instance(&pod), main, "main was not restarted");
    // One status each, in the spec's order (a strategic patch puts its own first).
    let names = |list: &Value| -> Vec<String> {
        let all = list.as_array().map(Vec::as_slice).unwrap_or_default();
        all.iter()
            .filter_map(|c| c["name"].as_str())
            .map(String::from)
            .collect()
    };
    let spec = names(&pod["spec"]["ephemeralContainers"]);
    assert_eq!(names(&pod["status"]["ephemeralContainerStatuses"]), spec);
    let mut sorted = spec.clone();
    sorted.sort();
    assert_eq!(sorted, ["debugger", "loner", "root", "shell"]);
}
