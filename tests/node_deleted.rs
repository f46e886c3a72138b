//! A gateway's Node deleted under it in a real cluster (etcd, kube-apiserver v1.36 and
//! the kube-controller-manager, whose garbage collector deletes what the Node owned):
//! the agent registers it again within seconds, its Lease and its mirror pod name the
//! new Node's UID, and a mirror pod force-deleted in the API is made again, by a running
//! agent and by one restarted after the deletion.

use support::control_plane;

use std::time::{Duration, Instant};

use control_plane::{ControlPlane, Options};
use serde_json::Value;
use support::agent::{need_root, Agent};

const NODE: &str = "edge-gw-2";
const WAIT: Duration = Duration::from_secs(90);

fn static_pod_yaml(name: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: {name}\n  namespace: default\nspec:\n  \
         hostNetwork: true\n  terminationGracePeriodSeconds: 1\n  containers:\n    - name: main\n      \
         image: busybox:demo\n      command: [\"sh\", \"-c\", \"exec sleep 100000\"]\n"
    )
}

fn uid(obj: &Value) -> String {
    obj["metadata"]["uid"]
        .as_str()
        .unwrap_or_default()
        .to_string()
}

fn owner_uid(obj: &Value) -> String {
    obj["metadata"]["ownerReferences"][0]["uid"]
        .as_str()
        .unwrap_or_default()
        .to_string()
}

#[test]
fn a_deleted_node_comes_back_with_its_lease_and_mirror_pod_owned_by_the_new_uid() {
    if !need_root() {
        return;
    }
    let cp = ControlPlane::start(Options {
        scheduler: false,
        ..Options::default()
    });
    let mut a = Agent::new("node-deleted");
    a.node_name = NODE.into();
    cp.join(
        &mut a,
        "",
        "nodeStatusUpdateFrequency: 10s\nnodeStatusReportFrequency: 5m\n",
    );
    a.write_manifest("web.yaml", &static_pod_yaml("web"));
    a.start();
    let log = || format!("--- agent log ---\n{}", a.agent_log());
    let mirror = format!("pod/web-{NODE}");
    let node = cp.wait_for("the Node", WAIT, log, |cp| {
        cp.get(&format!("node/{NODE}"), None)
    });
    let first = uid(&node);
    let m = cp.wait_for("the mirror pod", WAIT, log, |cp| {
        cp.get(&mirror, Some("default"))
            .filter(|p| owner_uid(p) == first)
    });
    let first_mirror = uid(&m);

    // Deleted: within a renewal interval or two the agent sees its Lease gone (the
    // garbage collector takes it with the Node) and registers the Node again.
    let t0 = Instant::now();
    cp.kubectl_ok(&["delete", "node", NODE, "--wait=false"]);
    let second = cp.wait_for("the Node again, with a new UID", WAIT, log, |cp| {
        cp.get(&format!("node/{NODE}"), None)
            .map(|n| uid(&n))
            .filter(|u| !u.is_empty() && *u != first)
    });
    let registered = t0.elapsed();
    cp.wait_for("the Lease owned by the new Node", WAIT, log, |cp| {
        cp.get(&format!("lease/{NODE}"), Some("kube-node-lease"))
            .filter(|l| owner_uid(l) == second)
    });
    let leased = t0.elapsed();
    let m = cp.wait_for("the mirror pod owned by the new Node", WAIT, log, |cp| {
        cp.get(&mirror, Some("default"))
            .filter(|p| owner_uid(p) == second && p["metadata"]["deletionTimestamp"].is_null())
    });
    let mirrored = t0.elapsed();
    assert_ne!(uid(&m), first_mirror);
    eprintln!(
        "Node deleted: registered again after {registered:?}, Lease owned by it after {leased:?}, \
         mirror pod after {mirrored:?}"
    );
    // Settled: the Lease stays (no more collections and re-creations).
    std::thread::sleep(Duration::from_secs(15));
    let lease = cp
        .get(&format!("lease/{NODE}"), Some("kube-node-lease"))
        .expect("lease");
    assert_eq!(owner_uid(&lease), second);

    // A mirror pod force-deleted in the API is made again by the running agent.
    let before = uid(&m);
    let t1 = Instant::now();
    cp.kubectl_ok(&[
        "delete",
        &mirror,
        "-n",
        "default",
        "--grace-period=0",
        "--force",
    ]);
    let m = cp.wait_for("the mirror pod made again", WAIT, log, |cp| {
        cp.get(&mirror, Some("default"))
            .filter(|p| uid(p) != before && p["metadata"]["deletionTimestamp"].is_null())
    });
    eprintln!(
        "force-deleted mirror pod made again after {:?}",
        t1.elapsed()
    );

    // And by an agent restarted after the deletion, whose static pod runs on unchanged.
    a.stop();
    let before = uid(&m);
    cp.kubectl_ok(&[
        "delete",
        &mirror,
        "-n",
        "default",
        "--grace-period=0",
        "--force",
    ]);
    a.start();
    let t2 = Instant::now();
    let log = || format!("--- agent log ---\n{}", a.agent_log());
    cp.wait_for(
        "the mirror pod made again after a restart",
        WAIT,
        log,
        |cp| {
            cp.get(&mirror, Some("default")).filter(|p| {
                uid(p) != before
                    && owner_uid(p) == second
                    && p["metadata"]["deletionTimestamp"].is_null()
            })
        },
    );
    eprintln!(
        "after a restart, mirror pod made again in {:?}",
        t2.elapsed()
    );
    a.stop();
}
