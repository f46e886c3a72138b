//! A pod's host name as its containers see it, end to end: a real kube-apiserver v1.36,
//! a CNI network, real containers, as root. The pod's name; its `hostname` (with its
//! `subdomain`, the domain in `/etc/hosts`); its `hostnameOverride`, which wins over
//! both: every container of the pod sees the same name, which none of them renames.

use support::control_plane;

use std::time::Duration;

use control_plane::cluster::node_on_network;
use control_plane::{ControlPlane, Options};
use support::agent::need_root;

const NODE: &str = "hostname-node-1";

fn pod(name: &str, extra: &str) -> String {
    let script = "echo \"$(hostname);$(cat /etc/hostname)\"; grep -v '^#' /etc/hosts | tail -n 1";
    format!(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: {name}\nspec:\n  nodeName: {NODE}\n  \
         automountServiceAccountToken: false\n  restartPolicy: Never\n{extra}  \
         containers:\n    - name: a\n      image: docker.io/library/busybox:demo\n      \
         command: [\"sh\", \"-c\", {s}]\n    \
         - name: b\n      image: docker.io/library/busybox:demo\n      \
         command: [\"sh\", \"-c\", {s}]\n",
        s = serde_json::to_string(script).expect("json")
    )
}

#[test]
fn each_container_sees_the_pods_name_hostname_or_override() {
    if !need_root() || !support::cni::need_plugins() {
        return;
    }
    let cp = ControlPlane::start(Options::bare());
    let _ = cp.kubectl(&["create", "serviceaccount", "default"]);
    let (_net, mut a) = node_on_network(&cp, "pod-hostname", NODE, 0, None);
    a.start();
    cp.apply(&pod("plain", ""));
    cp.apply(&pod("named", "  hostname: given\n  subdomain: sub\n"));
    cp.apply(&pod(
        "overridden",
        "  hostname: given\n  subdomain: sub\n  hostnameOverride: override-host\n",
    ));
    let log = || a.agent_log();
    for (name, first, hosts_name) in [
        ("plain", "plain;plain", "\tplain"),
        // No clusterDomain on this node: no domain for the subdomain either.
        ("named", "given;given", "\tgiven"),
        (
            "overridden",
            "override-host;override-host",
            "\toverride-host",
        ),
    ] {
        cp.wait_for(
            &format!("pod {name} succeeded"),
            Duration::from_secs(90),
            log,
            |cp| {
                cp.get(&format!("pod/{name}"), None)
                    .filter(|p| p["status"]["phase"] == "Succeeded")
            },
        );
        for c in ["a", "b"] {
            let out = cp.kubectl_ok(&["logs", name, "-c", c]);
            let mut lines = out.lines();
            assert_eq!(lines.next(), Some(first), "{name}/{c}: {out}");
            let hosts = lines.next().unwrap_or_default();
            assert!(
                hosts.ends_with(hosts_name),
                "{name}/{c}: /etc/hosts ends {hosts:?}"
            );
        }
    }
    for name in ["plain", "named", "overridden"] {
        let _ = cp.kubectl(&["delete", "pod", name, "--wait=false"]);
    }
    a.stop();
}
