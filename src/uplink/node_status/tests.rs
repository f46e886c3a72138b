use std::net::IpAddr;

use serde_json::{json, Value};

use super::fixtures;
use super::*;
use crate::config::Config;
use crate::node::allocatable::{Resources, Threshold};
use crate::node::facts::FsStats;
use crate::node::NodeStatusError;

fn ts(s: &str) -> Timestamp {
    s.parse().expect("timestamp")
}

/// The device fixture 08 describes.
fn edge_facts() -> NodeFacts {
    NodeFacts {
        cpus: 4,
        memory_total: Some(8_048_572 * 1024),
        memory_available: Some(6 << 30),
        storage: Some(FsStats {
            capacity: 61_255_492 * 1024,
            available: 40 << 30,
            free: 40 << 30,
            inodes: 3_900_000,
            inodes_free: 3_500_000,
        }),
        kernel_version: "6.6.23-yocto-standard".into(),
        os_image: "Poky (Yocto Project Reference Distro) 5.0".into(),
        machine_id: "3f2b8c1e9a7d4e6f8b0c1d2e3f4a5b6c".into(),
        system_uuid: "4c4c4544-0042-3510-8053-b7c04f4e3132".into(),
        boot_id: "6a0e3b0c-2f4e-4d59-9d8a-1b2c3d4e5f60".into(),
        architecture: "amd64".into(),
        pid_max: Some(4_194_304),
        processes: Some(400),
        host_ip: Some(IpAddr::from([10, 9, 9, 9])),
    }
}

fn edge_config() -> Config {
    let mut c = Config::with_defaults("edge-node-1".into());
    c.board = Some("edge-gateway".into());
    c.node_ip = Some(IpAddr::from([192, 168, 50, 10]));
    for map in [&mut c.system_reserved, &mut c.kube_reserved] {
        map.insert("cpu".into(), "100m".into());
        map.insert("memory".into(), "100Mi".into());
    }
    c
}

fn edge_input() -> NodeInput {
    edge_config().node_input().expect("input")
}

/// Fixture 08's Node with what holdfast reports differently: no deprecated beta
/// labels, no hugepages, its own versions, and the empty kubeProxyVersion the
/// apiserver fills in.
fn expected_registration() -> Value {
    let mut want: Value = serde_json::from_str(fixtures::NODE_08).expect("fixture");
    let labels = want["metadata"]["labels"].as_object_mut().expect("labels");
    labels.retain(|k, _| !k.starts_with("beta.kubernetes.io/"));
    for list in ["capacity", "allocatable"] {
        if let Some(m) = want["status"][list].as_object_mut() {
            m.remove("hugepages-2Mi");
        }
    }
    let info = &mut want["status"]["nodeInfo"];
    info["kubeletVersion"] = json!(KUBELET_VERSION);
    info["containerRuntimeVersion"] = json!(CONTAINER_RUNTIME_VERSION);
    info["kubeProxyVersion"] = json!("");
    // What holdfast's runtime does and does not do (the recording's runtime differs).
    want["status"]["runtimeHandlers"] = json!([{"name": "", "features":
        {"recursiveReadOnlyMounts": false, "userNamespaces": false}}]);
    want["status"]["features"] = json!({"supplementalGroupsPolicy": false});
    want
}

#[test]
fn registration_matches_the_recorded_node() {
    let node = registration_node(&edge_input(), &edge_facts(), ts("2026-11-22T07:30:40.154Z"));
    let got = serde_json::to_value(&node).expect("json");
    assert_eq!(got, expected_registration());
}

#[test]
fn registration_labels_and_taints() {
    let mut input = edge_input();
    input
        .labels
        .insert("example.com/site".into(), "north".into());
    // A config label overrides the node's own; NodeRestriction-refused ones are left out.
    input
        .labels
        .insert("node.kubernetes.io/instance-type".into(), "rpi4".into());
    input
        .labels
        .insert("node-role.kubernetes.io/edge".into(), String::new());
    input
        .labels
        .insert("kubernetes.io/role".into(), "edge".into());
    input.taints =
        vec![crate::config::parse_taint("example.com/edge=true:NoSchedule").expect("taint")];
    let node = registration_node(&input, &edge_facts(), ts("2026-11-22T07:30:40Z"));
    let labels = node.metadata.labels.expect("labels");
    assert_eq!(labels["example.com/site"], "north");
    assert_eq!(labels["node.kubernetes.io/instance-type"], "rpi4");
    assert_eq!(labels["kubernetes.io/arch"], "amd64");
    assert!(!labels.contains_key("node-role.kubernetes.io/edge"));
    assert!(!labels.contains_key("kubernetes.io/role"));
    let spec = serde_json::to_value(node.spec).expect("json");
    assert_eq!(
        spec,
        json!({"taints": [{"key": "example.com/edge", "value": "true", "effect": "NoSchedule"}]})
    );
}

#[test]
fn from_config_refuses_and_defaults() {
    let mut c = edge_config();
    c.node_labels
        .insert("node-role.kubernetes.io/edge".into(), String::new());
    match c.node_input() {
        Err(e @ NodeStatusError::Label { .. }) => {
            assert!(e.to_string().contains("NodeRestriction"), "{e}")
        }
        other => panic!("{other:?}"),
    }

    let input = edge_input();
    let signals: Vec<&str> = input.eviction_hard.keys().map(String::as_str).collect();
    assert_eq!(
        signals,
        [
            "imagefs.available",
            "memory.available",
            "nodefs.available",
            "nodefs.inodesFree"
        ]
    );
    assert_eq!(
        input.reserved(),
        Resources {
            cpu_millis: 200,
            memory: 200 << 20,
            ephemeral_storage: 0
        }
    );
    assert_eq!((input.max_pods, input.port), (110, 10250));

    // Any evictionHard replaces the defaults whole; 0% turns a signal off.
    let mut c = edge_config();
    c.eviction_hard
        .insert("memory.available".into(), "250Mi".into());
    c.eviction_hard
        .insert("nodefs.available".into(), "0%".into());
    let input = c.node_input().expect("input");
    assert_eq!(
        input.eviction_hard,
        BTreeMap::from([("memory.available".into(), Threshold::Quantity(250 << 20))])
    );

    let mut c = edge_config();
    c.kube_reserved.insert("memory".into(), "lots".into());
    match c.node_input() {
        Err(e @ NodeStatusError::Reserved { .. }) => {
            assert!(e.to_string().starts_with("kubeReserved.memory: "), "{e}")
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn heartbeat_after_registration_is_fixture_11() {
    let input = edge_input();
    let facts = edge_facts();
    let first = registration_node(&input, &facts, ts("2026-11-22T07:30:40Z"))
        .status
        .expect("status");
    let second = node_status(&input, &facts, Some(&first), ts("2026-11-22T07:30:41.323Z"));
    assert!(!needs_report(Some(&first), &second));
    let want: Value = serde_json::from_str(fixtures::PATCH_11).expect("fixture");
    assert_eq!(status_patch(Some(&first), &second), want);
}

#[test]
fn going_not_ready_and_back() {
    let mut input = edge_input();
    let facts = edge_facts();
    let t0 = ts("2026-11-22T07:30:40Z");
    let first = node_status(&input, &facts, None, t0);

    input.not_ready = vec!["container runtime network not ready: NetworkReady=false".into()];
    let second = node_status(&input, &facts, Some(&first), ts("2026-11-22T07:30:42Z"));
    assert!(needs_report(Some(&first), &second));
    let patch = status_patch(Some(&first), &second);
    let ready = &patch["status"]["conditions"][3];
    assert_eq!(
        ready,
        &json!({
            "type": "Ready",
            "status": "False",
            "lastHeartbeatTime": "2026-11-22T07:30:42Z",
            "lastTransitionTime": "2026-11-22T07:30:42Z",
            "reason": "KubeletNotReady",
            "message": "container runtime network not ready: NetworkReady=false",
        })
    );
    assert_eq!(
        patch["status"]["conditions"][0],
        json!({"type": "MemoryPressure", "lastHeartbeatTime": "2026-11-22T07:30:42Z"})
    );

    input.not_ready.clear();
    let third = node_status(&input, &facts, Some(&second), ts("2026-11-22T07:30:43Z"));
    let conditions = third.conditions.as_deref().unwrap_or_default();
    let ready = conditions
        .iter()
        .find(|c| c.type_ == "Ready")
        .expect("ready");
    assert_eq!(ready.status, "True");
    assert_eq!(
        ready.last_transition_time,
        Some(conditions::wire_time(ts("2026-11-22T07:30:43Z")))
    );
    let memory = &conditions[0];
    assert_eq!(memory.last_transition_time, Some(conditions::wire_time(t0)));
}

#[test]
fn status_keeps_what_others_set() {
    let input = edge_input();
    let facts = edge_facts();
    let mut previous = node_status(&input, &facts, None, ts("2026-11-22T07:30:40Z"));
    previous.volumes_in_use = Some(vec!["kubernetes.io/csi/x".into()]);
    previous.images = Some(Vec::new());
    let next = node_status(&input, &facts, Some(&previous), ts("2026-11-22T07:30:50Z"));
    assert_eq!(next.volumes_in_use, previous.volumes_in_use);
    assert_eq!(next.images, previous.images);
    // A reboot shows as a new boot id, a change worth reporting at once.
    let rebooted = NodeFacts {
        boot_id: "new".into(),
        ..facts
    };
    let after = node_status(&input, &rebooted, Some(&next), ts("2026-11-22T07:31:00Z"));
    assert!(needs_report(Some(&next), &after));
    assert_eq!(
        status_patch(Some(&next), &after)["status"]["nodeInfo"],
        json!({"bootID": "new"})
    );
}

#[test]
fn internal_ip_choice() {
    let facts = edge_facts();
    let addresses = |input: &NodeInput, facts: &NodeFacts| {
        let s = node_status(input, facts, None, ts("2026-11-22T07:30:40Z"));
        serde_json::to_value(s.addresses).expect("json")
    };
    let mut input = edge_input();
    assert_eq!(
        addresses(&input, &facts),
        json!([{"type": "InternalIP", "address": "192.168.50.10"},
               {"type": "Hostname", "address": "edge-node-1"}])
    );
    input.node_ip = None;
    assert_eq!(addresses(&input, &facts)[0]["address"], "10.9.9.9");
    input.listen_ip = Some(IpAddr::from([127, 0, 0, 1]));
    assert_eq!(addresses(&input, &facts)[0]["address"], "127.0.0.1");
    input.node_name = "10.0.240.5".into();
    assert_eq!(addresses(&input, &facts)[0]["address"], "10.0.240.5");
    input.listen_ip = None;
    input.node_name = "gw".into();
    let none = NodeFacts {
        host_ip: None,
        ..edge_facts()
    };
    assert_eq!(
        addresses(&input, &none),
        json!([{"type": "Hostname", "address": "gw"}])
    );
}

#[test]
fn ports_and_pods_come_from_config() {
    let mut c = edge_config();
    c.port = 10260;
    c.max_pods = 16;
    let input = c.node_input().expect("input");
    let s = node_status(&input, &edge_facts(), None, ts("2026-11-22T07:30:40Z"));
    let v = serde_json::to_value(&s).expect("json");
    assert_eq!(
        v["daemonEndpoints"],
        json!({"kubeletEndpoint": {"Port": 10260}})
    );
    assert_eq!(v["capacity"]["pods"], "16");
    assert_eq!(v["allocatable"]["pods"], "16");
}

#[test]
fn lease_matches_fixture_15() {
    let uid = "66454182-185b-4b7f-9262-abf533eb104a";
    let want: Value = serde_json::from_str(fixtures::LEASE_15).expect("fixture");
    // Nanoseconds on the clock; microseconds on the wire.
    let l = lease(
        "edge-node-1",
        Some(uid),
        40,
        ts("2026-11-22T07:30:43.930335789Z"),
    );
    assert_eq!(serde_json::to_value(&l).expect("json"), want);
    let back: Lease = serde_json::from_value(want).expect("lease");
    assert_eq!(back, l);

    // Before the Node's uid is known: no owner yet.
    let l = lease("edge-node-1", None, 40, ts("2026-11-22T07:30:43Z"));
    assert_eq!(l.metadata.owner_references, None);
    assert_eq!(
        serde_json::to_value(&l.spec).expect("json")["renewTime"],
        "2026-11-22T07:30:43.000000Z"
    );
}

#[test]
fn versions() {
    let lock = include_str!("../../../Cargo.lock");
    let pkg = lock
        .split("[[package]]")
        .find(|p| p.contains("\nname = \"libcontainer\"\n"))
        .expect("libcontainer in Cargo.lock");
    assert!(
        pkg.contains(&format!("\nversion = \"{LIBCONTAINER_VERSION}\"\n")),
        "LIBCONTAINER_VERSION is out of step with Cargo.lock: {pkg}"
    );
    assert_eq!(
        CONTAINER_RUNTIME_VERSION,
        format!("libcontainer://{LIBCONTAINER_VERSION}")
    );
    assert_eq!(
        KUBELET_VERSION,
        format!("v1.34.0+holdfast-{}", crate::VERSION)
    );
}
