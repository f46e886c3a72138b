//! Termination messages as `kubectl get pod` shows them, end to end: a real
//! kube-apiserver v1.36, real containers, as root. What a container writes at its
//! `terminationMessagePath` (the default one, and another as a non-root user) is its
//! terminated state's `message`; with `FallbackToLogsOnError` the end of its log stands
//! in when it failed and wrote nothing there, and not when it succeeded.

use support::control_plane;

use std::time::Duration;

use control_plane::ControlPlane;
use serde_json::Value;
use support::agent::{need_root, Agent};

const NODE: &str = "termination-node-1";
const IMAGE: &str = "docker.io/library/busybox:demo";

/// A pod of one container running `script` once, with `extra` lines in the container.
fn pod(name: &str, script: &str, extra: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: {name}\nspec:\n  nodeName: {NODE}\n  \
         automountServiceAccountToken: false\n  restartPolicy: Never\n  \
         containers:\n    - name: main\n      image: {IMAGE}\n      \
         command: [\"sh\", \"-c\", {}]\n{extra}",
        serde_json::to_string(script).expect("json string")
    )
}

/// The container's terminated state, once there is one.
fn terminated(cp: &ControlPlane, a: &Agent, name: &str) -> Value {
    let log = || {
        let lines: Vec<String> = a.agent_log().lines().map(str::to_string).collect();
        lines[lines.len().saturating_sub(30)..].join("\n")
    };
    let pod = cp.wait_for(
        &format!("pod {name} terminated"),
        Duration::from_secs(90),
        log,
        |cp| {
            cp.get(&format!("pod/{name}"), None)
                .filter(|p| p["status"]["containerStatuses"][0]["state"]["terminated"].is_object())
        },
    );
    pod["status"]["containerStatuses"][0]["state"]["terminated"].clone()
}

#[test]
fn the_message_a_container_leaves_or_its_log_when_it_failed() {
    if !need_root() {
        return;
    }
    let (cp, mut a) = control_plane::cluster::bare_node("termination-message", NODE);

    cp.apply(&pod(
        "default-path",
        "printf DONE > /dev/termination-log",
        "",
    ));
    cp.apply(&pod(
        "non-root",
        "printf DONE > /dev/termination-custom-log; ls -l /dev/termination-custom-log",
        "      terminationMessagePath: /dev/termination-custom-log\n      \
         securityContext: {runAsUser: 1000}\n",
    ));
    let fallback = "      terminationMessagePolicy: FallbackToLogsOnError\n";
    cp.apply(&pod("failed", "echo first; echo -n DONE; exit 1", fallback));
    cp.apply(&pod("succeeded", "echo to the log; exit 0", fallback));
    cp.apply(&pod(
        "failed-with-file",
        "echo from the log; printf OK > /dev/termination-log; exit 2",
        fallback,
    ));

    let t = terminated(&cp, &a, "default-path");
    assert_eq!(t["message"], "DONE", "{t}");
    assert_eq!(t["exitCode"], 0);
    let t = terminated(&cp, &a, "non-root");
    assert_eq!(t["message"], "DONE", "{t}");
    assert_eq!(t["exitCode"], 0, "{t}");
    let t = terminated(&cp, &a, "failed");
    assert_eq!(t["message"], "first\nDONE", "{t}");
    let t = terminated(&cp, &a, "succeeded");
    assert!(t.get("message").is_none_or(Value::is_null), "{t}");
    let t = terminated(&cp, &a, "failed-with-file");
    assert_eq!(t["message"], "OK", "{t}");

    // Whatever a container leaves there stays out of reach of the host's other users:
    // the file sits in the container's dir under the 0700 root.
    let mode = std::fs::metadata(&a.root).expect("root").permissions();
    assert_eq!(
        std::os::unix::fs::PermissionsExt::mode(&mode) & 0o077,
        0,
        "root dir {} is open to others",
        a.root.display()
    );
    for name in [
        "default-path",
        "non-root",
        "failed",
        "succeeded",
        "failed-with-file",
    ] {
        let _ = cp.kubectl(&["delete", "pod", name, "--wait=false"]);
    }
    a.stop();
}
