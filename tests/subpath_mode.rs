//! A `subPath` that does not exist yet, end to end: a real kube-apiserver v1.36, real
//! containers, as root. The node makes it with the volume root's mode, whole whatever
//! the umask: in an emptyDir with an `fsGroup`, 0777 and the group's, as the kubelet
//! makes it.

use std::time::Duration;

use support::agent::need_root;

const NODE: &str = "subpath-node-1";

#[test]
fn a_new_sub_path_takes_the_volume_roots_mode() {
    if !need_root() {
        return;
    }
    let (cp, mut a) = support::control_plane::cluster::bare_node("subpath-mode", NODE);
    let script = "stat -c '%a %g' /test-volume /root-volume";
    cp.apply(&format!(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: sub\nspec:\n  nodeName: {NODE}\n  \
         automountServiceAccountToken: false\n  restartPolicy: Never\n  \
         securityContext: {{fsGroup: 123}}\n  \
         volumes: [{{name: scratch, emptyDir: {{}}}}]\n  containers:\n    - name: main\n      \
         image: docker.io/library/busybox:demo\n      command: [\"sh\", \"-c\", {}]\n      \
         volumeMounts:\n        - {{name: scratch, mountPath: /test-volume, subPath: new/sub}}\n        \
         - {{name: scratch, mountPath: /root-volume}}\n",
        serde_json::to_string(script).expect("json")
    ));
    let log = || a.agent_log();
    cp.wait_for("pod sub succeeded", Duration::from_secs(60), log, |cp| {
        cp.get("pod/sub", None)
            .filter(|p| p["status"]["phase"] == "Succeeded")
    });
    let out = cp.kubectl_ok(&["logs", "sub"]);
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines.len(), 2, "{out}");
    assert_eq!(
        lines[0], lines[1],
        "the subPath's mode is not the volume root's: {out}"
    );
    assert!(
        lines[0].starts_with("2777 ") || lines[0].starts_with("777 "),
        "{out}"
    );
    assert!(lines[0].ends_with(" 123"), "{out}");
    let _ = cp.kubectl(&["delete", "pod", "sub", "--wait=false"]);
    a.stop();
}
