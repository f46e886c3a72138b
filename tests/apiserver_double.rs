//! The kube-apiserver double against the recorded real server
//! (`tests/fixtures/kube-apiserver/`): each test replays recorded requests in recording
//! order through a raw TLS client and compares status line, headers, Status bodies byte
//! for byte, and the shape of object bodies (server-generated uids, resourceVersions and
//! timestamps by form).

#[path = "support/apiserver/mod.rs"]
mod apiserver;

use std::time::Duration;

use apiserver::fixture::{self, Session};
use apiserver::{ApiServerDouble, Options};
use serde_json::Value;

fn double() -> ApiServerDouble {
    ApiServerDouble::start(Options::default())
}

fn replay_all(s: &mut Session, names: &[&str]) {
    for n in names {
        s.replay(n);
    }
}

/// Objects the recording created without recording them.
fn unrecorded_objects(d: &ApiServerDouble) {
    let cm: k8s_openapi::api::core::v1::ConfigMap = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "unrelated-config", "namespace": "default"}, "data": {"k": "v"}
    }))
    .expect("configmap");
    d.put_configmap(cm);
    let secret: k8s_openapi::api::core::v1::Secret = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "unrelated-secret", "namespace": "default"}, "stringData": {"k": "v"}
    }))
    .expect("secret");
    d.put_secret(secret);
}

const NODE_SETUP: [&str; 1] = ["08-node-create"];
const POD_SETUP: [&str; 6] = [
    "19-admin-create-configmap",
    "20-admin-create-secret",
    "22-admin-create-pod-sleep-1",
    "23-admin-create-pod-sleep-2",
    "24-admin-create-pod-app-with-refs",
    "25-admin-create-pod-on-other-node",
];

#[test]
fn version_is_answered_to_nodes_and_anonymous_alike() {
    let d = double();
    let mut s = d.fixture_session();
    for name in ["00-get-version", "04-anonymous-get-version"] {
        let f = fixture::load(name);
        let r = s.send(&f);
        assert_eq!((r.code, r.reason.as_str()), (200, "OK"), "{name}");
        assert_eq!(r.body, f.response_body, "{name}: body byte for byte");
        assert_eq!(r.header("content-length"), Some("390"));
    }
}

#[test]
fn authentication_and_node_registration_match_the_recording() {
    let d = double();
    let mut s = d.fixture_session();
    replay_all(
        &mut s,
        &[
            "03-anonymous-list-pods-forbidden",
            "05-bad-token-unauthorized",
            "06-node-get-before-create-notfound",
            "07-node-create-forbidden-label",
            "08-node-create",
            "09-node-create-again-alreadyexists",
            "10-node-get",
            "11-node-status-patch-strategic",
            "12-node-status-patch-merge",
            "13-node-status-patch-strategic-restore",
        ],
    );
    let node = d.get_node("edge-node-1").expect("node stored");
    let conditions = node.status.and_then(|s| s.conditions).expect("conditions");
    let types: Vec<&str> = conditions.iter().map(|c| c.type_.as_str()).collect();
    assert_eq!(
        types,
        ["MemoryPressure", "DiskPressure", "PIDPressure", "Ready"]
    );
}

#[test]
fn lease_lifecycle_matches_the_recording() {
    let d = double();
    let mut s = d.fixture_session();
    replay_all(&mut s, &NODE_SETUP);
    replay_all(
        &mut s,
        &[
            "14-lease-get-missing-notfound",
            "15-lease-create",
            "16-lease-update",
            "17-lease-update-stale-conflict",
            "18-lease-get-other-node-forbidden",
        ],
    );
    let lease = d.get_lease("edge-node-1").expect("lease stored");
    let renew = lease.spec.and_then(|s| s.renew_time).expect("renewTime");
    let micros = serde_json::to_value(&renew).expect("renewTime json");
    assert_eq!(micros, "2026-11-22T07:30:46.150678Z", "microseconds kept");
}

#[test]
fn pods_configmaps_secrets_events_and_lists_match_the_recording() {
    let d = double();
    let mut s = d.fixture_session();
    replay_all(&mut s, &NODE_SETUP);
    replay_all(&mut s, &POD_SETUP[..2]);
    unrecorded_objects(&d);
    s.replay("21-node-get-configmap-unreferenced-yet-forbidden");
    replay_all(&mut s, &POD_SETUP[2..]);
    replay_all(
        &mut s,
        &[
            "26-node-list-pods",
            "27-node-list-pods-limit2",
            "28-node-list-pods-limit2-page2",
            "29-node-list-pods-no-selector-forbidden",
            "38-node-get-configmap-referenced",
            "39-node-get-configmap-unreferenced-forbidden",
            "40-node-get-secret-referenced",
            "41-node-get-secret-unreferenced-forbidden",
            "42-node-create-event-core-v1",
            "43-node-create-event-events-k8s-io-v1",
            "44-node-list-configmap-by-name",
            "46-admin-patch-configmap",
            "47-admin-patch-unrelated-configmap",
        ],
    );
    assert_eq!(d.list_events().len(), 1);
    assert_eq!(d.list_events_v1().len(), 1);
}

#[test]
fn pod_status_delete_and_mirror_pods_match_the_recording() {
    let d = double();
    let mut s = d.fixture_session();
    replay_all(&mut s, &NODE_SETUP);
    replay_all(&mut s, &POD_SETUP);
    replay_all(
        &mut s,
        &[
            "31-admin-create-pod-sleep-3",
            "32-node-patch-pod-status-running",
            "33-admin-delete-pod-sleep-2-graceful",
            "34-node-delete-pod-sleep-2-final",
            "35-admin-patch-pod-on-other-node-label",
            "48-node-patch-pod-status-strategic",
            "49-node-patch-pod-status-merge",
            "50-node-patch-pod-status-spec-ignored",
            "51-node-patch-pod-status-other-node-forbidden",
            "52-node-patch-pod-status-uid-mismatch-invalid",
            "53-node-delete-pod-uid-precondition-conflict",
            "54-node-delete-missing-pod-notfound",
            "55-admin-create-invalid-pod-unprocessable",
            "56-node-create-mirror-pod-no-controller-forbidden",
            "57-node-create-mirror-pod",
            "58-node-create-regular-pod-forbidden",
        ],
    );
    assert!(
        d.get_pod("default", "sleep-2").is_none(),
        "sleep-2 deleted by 34"
    );
    assert!(
        d.get_pod("default", "sleep-3").is_some(),
        "53 deleted nothing"
    );
    let pod = d
        .get_pod("default", "app-with-refs")
        .expect("app-with-refs");
    let image = pod.spec.expect("spec").containers[0].image.clone();
    assert_eq!(
        image.as_deref(),
        Some("busybox:1.36"),
        "50's spec change ignored"
    );
}

#[test]
fn without_node_restriction_a_node_patches_another_nodes_pod_status() {
    let d = ApiServerDouble::start(Options {
        node_restriction: false,
        ..Options::default()
    });
    let mut s = d.fixture_session();
    replay_all(&mut s, &NODE_SETUP);
    replay_all(&mut s, &POD_SETUP);
    let f = fixture::load("64-node-patch-pod-status-other-node-no-noderestriction");
    let r = s.send(&f);
    assert_eq!(r.code, 200);
    let pod = d.get_pod("default", "on-other-node").expect("pod");
    assert_eq!(pod.status.and_then(|s| s.phase).as_deref(), Some("Running"));
}

/// The events of a watch body, one JSON object per chunk.
fn events(chunks: &[Vec<u8>]) -> Vec<Value> {
    chunks
        .iter()
        .map(|c| {
            assert_eq!(
                c.last(),
                Some(&b'\n'),
                "one event per chunk, newline-terminated"
            );
            assert_eq!(
                c.iter().filter(|b| **b == b'\n').count(),
                1,
                "one event per chunk"
            );
            serde_json::from_slice(c).expect("event JSON")
        })
        .collect()
}

fn recorded_events(name: &str) -> Vec<Value> {
    let f = fixture::load(name);
    String::from_utf8_lossy(&f.response_body)
        .lines()
        .filter(|l| l.starts_with('{'))
        .map(|l| serde_json::from_str(l).expect("recorded event"))
        .collect()
}

#[test]
fn pod_watch_from_list_rv_matches_30_with_filtered_changes_advancing_the_bookmark() {
    let d = double();
    let mut s = d.fixture_session();
    replay_all(&mut s, &NODE_SETUP);
    replay_all(&mut s, &POD_SETUP);
    s.replay("26-node-list-pods");
    let f = fixture::load("30-node-watch-pods");
    // Same request with a 5 s server timeout: the last bookmark comes 2 s before it.
    let target = s
        .rewrites
        .target(&f.target)
        .replace("timeoutSeconds=30", "timeoutSeconds=5");
    let mut watch = s.node.stream(&target).expect("watch");
    assert_eq!(watch.code, 200);
    let header = |n: &str| {
        watch
            .headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(n))
            .map(|(_, v)| v.clone())
    };
    assert_eq!(header("content-type").as_deref(), Some("application/json"));
    assert_eq!(header("transfer-encoding").as_deref(), Some("chunked"));
    let mut last_rv = String::new();
    for name in [
        "31-admin-create-pod-sleep-3",
        "32-node-patch-pod-status-running",
        "33-admin-delete-pod-sleep-2-graceful",
        "34-node-delete-pod-sleep-2-final",
        "35-admin-patch-pod-on-other-node-label",
    ] {
        let r = s.replay(name);
        last_rv = r.json()["metadata"]["resourceVersion"]
            .as_str()
            .expect("rv")
            .to_string();
    }
    watch.set_timeout(Duration::from_secs(20));
    let mut chunks = Vec::new();
    while let Some(c) = watch.next_chunk().expect("chunk") {
        chunks.push(c);
    }
    let ours = events(&chunks);
    let recorded = recorded_events("30-node-watch-pods");
    let types = |v: &[Value]| -> Vec<String> {
        v.iter()
            .map(|e| e["type"].as_str().unwrap_or("").to_string())
            .collect()
    };
    assert_eq!(types(&ours), types(&recorded));
    for (i, (r, o)) in recorded.iter().zip(&ours).enumerate() {
        s.rewrites.learn(r, o);
        let r: Value = serde_json::from_str(&s.rewrites.text(&r.to_string())).expect("json");
        let mut diffs = Vec::new();
        if r["type"] == "BOOKMARK" {
            assert_eq!(o["object"]["metadata"]["resourceVersion"], last_rv.as_str());
            assert_eq!(o["object"]["spec"], r["object"]["spec"]);
            continue;
        }
        fixture::same_shape(&r, o, &format!("event {i}"), &mut diffs);
        assert!(diffs.is_empty(), "{diffs:#?}");
    }
}

#[test]
fn periodic_bookmarks_repeat_the_latest_revision_as_in_36() {
    let d = ApiServerDouble::start(Options {
        bookmark_interval: Duration::from_millis(700),
        ..Options::default()
    });
    let mut s = d.fixture_session();
    replay_all(&mut s, &NODE_SETUP);
    replay_all(&mut s, &POD_SETUP);
    let from = s.replay("26-node-list-pods").json()["metadata"]["resourceVersion"]
        .as_str()
        .expect("rv")
        .to_string();
    let other = s.replay("35-admin-patch-pod-on-other-node-label").json()["metadata"]
        ["resourceVersion"]
        .as_str()
        .expect("rv")
        .to_string();
    let target = format!(
        "/api/v1/pods?fieldSelector=spec.nodeName%3Dedge-node-1&watch=true&allowWatchBookmarks=true&resourceVersion={from}&timeoutSeconds=3"
    );
    let mut watch = s.node.stream(&target).expect("watch");
    watch.set_timeout(Duration::from_secs(20));
    let mut chunks = Vec::new();
    while let Some(c) = watch.next_chunk().expect("chunk") {
        chunks.push(c);
    }
    let ours = events(&chunks);
    assert!(
        ours.len() >= 3,
        "periodic bookmarks plus the last one: {ours:?}"
    );
    let recorded = recorded_events("36-node-watch-pods-bookmarks");
    for e in &ours {
        assert_eq!(e["type"], "BOOKMARK");
        assert_eq!(e["object"]["metadata"]["resourceVersion"], other.as_str());
        let mut shape = recorded[0].clone();
        shape["object"]["metadata"]["resourceVersion"] = Value::from(other.clone());
        assert_eq!(*e, shape);
    }
}
