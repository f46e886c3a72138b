//! Init containers and sidecars through the kubelet API, end to end: the real kubectl
//! through a real kube-apiserver v1.36 to real containers, as root. A pod's init
//! container (which failed once and ran again) and its sidecar (an init container with
//! `restartPolicy: Always`) are reached as its app containers are: `kubectl logs` (with
//! `--previous`), `exec` and `attach`, and `/run` called directly; a container the pod
//! does not have is refused with a clear message.

use support::control_plane;

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use control_plane::ControlPlane;
use serde_json::Value;
use support::agent::{need_root, Agent};

const WAIT: Duration = Duration::from_secs(90);
const NODE: &str = "inits-node-1";
const POD: &str = "with-inits";
const IMAGE: &str = "docker.io/library/busybox:demo";

/// `setup` fails on its first run and succeeds on its second, leaving a file for the
/// others; `sidecar` keeps running beside `main`, printing a tick a second.
fn pod_yaml() -> String {
    let setup = "if [ -e /shared/tried ]; then echo setup-second-run; \
                 echo from-setup > /shared/greeting; else touch /shared/tried; \
                 echo setup-first-run; exit 1; fi";
    let sidecar = "echo sidecar-up; while sleep 1; do echo tick; done";
    let js = |s: &str| serde_json::to_string(s).expect("json string");
    format!(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: {POD}\nspec:\n  nodeName: {NODE}\n  \
         automountServiceAccountToken: false\n  terminationGracePeriodSeconds: 1\n  \
         volumes:\n    - name: shared\n      emptyDir: {{}}\n  \
         initContainers:\n    \
         - name: setup\n      image: {IMAGE}\n      command: [\"sh\", \"-c\", {}]\n      \
         volumeMounts: [{{name: shared, mountPath: /shared}}]\n    \
         - name: sidecar\n      image: {IMAGE}\n      restartPolicy: Always\n      \
         command: [\"sh\", \"-c\", {}]\n      \
         volumeMounts: [{{name: shared, mountPath: /shared}}]\n  \
         containers:\n    \
         - name: main\n      image: {IMAGE}\n      command: [\"sleep\", \"3600\"]\n",
        js(setup),
        js(sidecar)
    )
}

fn tail(s: &str, n: usize) -> String {
    let lines: Vec<&str> = s.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// The pod once `setup` has succeeded on its second run and `sidecar` and `main` run.
fn wait_started(cp: &ControlPlane, a: &Agent) -> Value {
    let log = || format!("--- agent log ---\n{}", tail(&a.agent_log(), 40));
    cp.wait_for(
        "init containers done, sidecar and main running",
        WAIT,
        log,
        |cp| {
            cp.get(&format!("pod/{POD}"), None).filter(|p| {
                let s = &p["status"];
                let setup = &s["initContainerStatuses"][0];
                setup["state"]["terminated"]["exitCode"] == 0
                    && setup["restartCount"] == 1
                    && s["initContainerStatuses"][1]["state"]["running"].is_object()
                    && s["containerStatuses"][0]["state"]["running"].is_object()
            })
        },
    )
}

/// A call of the agent's kubelet API with the admin's certificate: (status, body).
fn kubelet_api(cp: &ControlPlane, a: &Agent, method: &str, path: &str) -> (u16, String) {
    let (cert, key) = cp.admin_cert();
    let out = Command::new("curl")
        .args([
            "-sk",
            "--max-time",
            "30",
            "-X",
            method,
            "-w",
            "\n%{http_code}",
        ])
        .arg("--cert")
        .arg(&cert)
        .arg("--key")
        .arg(&key)
        .arg(format!("https://{}:{}{path}", a.address, a.port))
        .output()
        .expect("run curl");
    let out = text(&out.stdout);
    let (body, code) = out.rsplit_once('\n').unwrap_or(("", &out));
    (code.trim().parse().unwrap_or(0), body.to_owned())
}

/// `kubectl attach POD -c sidecar` until it shows a tick the sidecar printed after it
/// attached; kubectl is killed once it has, or after a while.
fn attach_shows_tick(cp: &ControlPlane) -> Result<(), String> {
    let mut child = cp
        .kubectl_cmd(&["attach", POD, "-c", "sidecar"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("kubectl attach");
    let stdout = child.stdout.take().expect("stdout");
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                return;
            }
        }
    });
    let seen = rx.recv_timeout(Duration::from_secs(20));
    let _ = child.kill();
    let out = child.wait_with_output().expect("kubectl attach");
    match seen {
        Ok(line) if line == "tick" => Ok(()),
        Ok(line) => Err(format!("attach showed {line:?}")),
        Err(_) => Err(format!("attach showed nothing: {}", text(&out.stderr))),
    }
}

#[test]
fn init_containers_and_sidecars_through_the_apiserver() {
    if !need_root() {
        return;
    }
    let (cp, a) = control_plane::cluster::bare_node("kubectl-inits", NODE);
    cp.apply(&pod_yaml());
    wait_started(&cp, &a);

    // The init container that completed: its last run, and with --previous the one
    // that failed before it.
    let out = cp.logs_showing(&[POD, "-c", "setup"], "setup-second-run");
    assert_eq!(out, "setup-second-run\n");
    let out = cp.logs_showing(&[POD, "-c", "setup", "--previous"], "setup-first-run");
    assert_eq!(out, "setup-first-run\n");

    // The sidecar: its log, a command in it, its output attached to.
    let out = cp.logs_showing(&[POD, "-c", "sidecar"], "sidecar-up");
    assert!(out.starts_with("sidecar-up\n"), "{out}");
    let out = cp.kubectl(&[
        "exec",
        POD,
        "-c",
        "sidecar",
        "--",
        "cat",
        "/shared/greeting",
    ]);
    assert_eq!(
        (text(&out.stdout), out.status.code()),
        ("from-setup\n".into(), Some(0)),
        "{}",
        text(&out.stderr)
    );
    attach_shows_tick(&cp).unwrap_or_else(|e| panic!("kubectl attach -c sidecar: {e}"));
    let (code, body) = kubelet_api(
        &cp,
        &a,
        "POST",
        &format!("/run/default/{POD}/sidecar?cmd=cat%20/shared/greeting"),
    );
    assert_eq!((code, body.as_str()), (200, "from-setup\n"));
    // A completed init container has nothing to run a command in: the kubelet's 400.
    let (code, body) = kubelet_api(
        &cp,
        &a,
        "POST",
        &format!("/run/default/{POD}/setup?cmd=true"),
    );
    assert_eq!(code, 400, "{body}");
    assert!(body.contains("container setup is not valid"), "{body}");

    // A container the pod does not have: refused by the apiserver, and by the agent
    // when asked directly.
    let out = cp.kubectl(&["logs", POD, "-c", "nosuch"]);
    assert!(!out.status.success());
    let err = text(&out.stderr);
    assert!(
        err.contains("container nosuch is not valid for pod with-inits"),
        "{err}"
    );
    let (code, body) = kubelet_api(
        &cp,
        &a,
        "GET",
        &format!("/containerLogs/default/{POD}/nosuch"),
    );
    assert_eq!(code, 404, "{body}");
    assert!(
        body.contains("container \"nosuch\" not found in pod \"with-inits\""),
        "{body}"
    );
}
