//! A pod for another OS, end to end: a real kube-apiserver v1.36, as root. The node
//! refuses a pod whose `os.name` or `kubernetes.io/os` node selector is not its own,
//! as the kubelet does: the pod ends Failed with the kubelet's reason, and nothing of
//! it runs. A pod for Linux beside it runs.

use std::time::Duration;

use support::agent::need_root;

const NODE: &str = "os-node-1";

fn pod(name: &str, extra: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: {name}\nspec:\n  nodeName: {NODE}\n  \
         automountServiceAccountToken: false\n  terminationGracePeriodSeconds: 1\n{extra}  \
         containers:\n    - name: main\n      image: docker.io/library/busybox:demo\n      \
         command: [\"sleep\", \"3600\"]\n"
    )
}

#[test]
fn a_pod_for_another_os_is_refused_with_the_kubelets_reason() {
    if !need_root() {
        return;
    }
    let (cp, mut a) = support::control_plane::cluster::bare_node("pod-os", NODE);
    cp.apply(&pod("windows", "  os: {name: windows}\n"));
    cp.apply(&pod(
        "windows-selector",
        "  nodeSelector: {kubernetes.io/os: windows}\n",
    ));
    cp.apply(&pod("linux", "  os: {name: linux}\n"));
    let log = || a.agent_log();
    for (name, reason, message) in [
        (
            "windows",
            "PodOSNotSupported",
            "Pod was rejected: Failed to admit pod as the OS field doesn't match node OS",
        ),
        (
            "windows-selector",
            "PodOSSelectorNodeLabelDoesNotMatch",
            "Pod was rejected: Failed to admit pod as the `kubernetes.io/os` label doesn't match node label",
        ),
    ] {
        let p = cp.wait_for(
            &format!("pod {name} failed"),
            Duration::from_secs(60),
            log,
            |cp| cp.get(&format!("pod/{name}"), None).filter(|p| p["status"]["phase"] == "Failed"),
        );
        assert_eq!(p["status"]["reason"], reason, "{}", p["status"]);
        assert_eq!(p["status"]["message"], message, "{}", p["status"]);
        assert!(
            p["status"]["containerStatuses"][0]["state"]["running"].is_null(),
            "{}",
            p["status"]
        );
    }
    cp.wait_for("pod linux running", Duration::from_secs(60), log, |cp| {
        cp.get("pod/linux", None)
            .filter(|p| p["status"]["containerStatuses"][0]["state"]["running"].is_object())
    });
    for name in ["windows", "windows-selector", "linux"] {
        let _ = cp.kubectl(&["delete", "pod", name, "--wait=false"]);
    }
    a.stop();
}
