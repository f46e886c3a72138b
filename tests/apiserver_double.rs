//! The kube-apiserver double against the recorded real server
//! (`tests/fixtures/kube-apiserver/`): each test replays recorded requests in recording
//! order through a raw TLS client and compares status line, headers, Status bodies byte
//! for byte, and the shape of object bodies (server-generated uids, resourceVersions and
//! timestamps by form).

use support::apiserver;

use std::time::Duration;

use apiserver::fixture::{
    self, drain, events, recorded_events, replay_all, rv_of, unrecorded_objects, NODE_SETUP,
    POD_SETUP,
};
use apiserver::{ApiServerDouble, Options};
use serde_json::Value;

fn double() -> ApiServerDouble {
    ApiServerDouble::start(Options::default())
}

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

#[test]
fn pod_watch_from_list_rv_matches_30_with_filtered_changes_advancing_the_bookmark() {
    let d = double();
    let mut s = d.fixture_session();
    replay_all(&mut s, &NODE_SETUP);
    replay_all(&mut s, &POD_SETUP);
    s.replay("26-node-list-pods");
    let f = fixture::load("30-node-watch-pods");
    // Same request with a 6 s server timeout: the last bookmark comes 2 s before it.
    let target = s
        .rewrites
        .target(&f.target)
        .replace("timeoutSeconds=30", "timeoutSeconds=6");
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

#[test]
fn configmap_watch_by_name_is_framed_one_event_per_chunk_as_in_45() {
    let d = double();
    let mut s = d.fixture_session();
    replay_all(&mut s, &NODE_SETUP);
    replay_all(&mut s, &POD_SETUP);
    unrecorded_objects(&d);
    let list_rv = rv_of(&s.replay("44-node-list-configmap-by-name"));
    let f = fixture::load("45-node-watch-configmap-by-name");
    let target = s
        .rewrites
        .target(&f.target)
        .replace("resourceVersion=273", &format!("resourceVersion={list_rv}"))
        .replace("timeoutSeconds=10", "timeoutSeconds=5");
    let mut watch = s.node.stream(&target).expect("watch");
    assert_eq!(watch.code, 200);
    s.replay("46-admin-patch-configmap");
    let unrelated_rv = rv_of(&s.replay("47-admin-patch-unrelated-configmap"));
    let ours = events(&drain(&mut watch));
    let recorded = recorded_events("45-node-watch-configmap-by-name");
    assert_eq!(ours[0]["type"], "MODIFIED");
    assert_eq!(ours[0]["object"]["data"], recorded[0]["object"]["data"]);
    assert!(ours.len() >= 2, "{ours:?}");
    for b in &ours[1..] {
        let mut want = recorded[1].clone();
        want["object"]["metadata"]["resourceVersion"] = Value::from(unrelated_rv.clone());
        assert_eq!(*b, want, "a ConfigMap bookmark carries only metadata");
    }
}

#[test]
fn watch_list_sends_initial_events_then_the_end_bookmark_as_in_59() {
    let d = double();
    let mut s = d.fixture_session();
    replay_all(&mut s, &NODE_SETUP);
    replay_all(&mut s, &POD_SETUP);
    let f = fixture::load("59-node-watchlist-pods-initial-events");
    let target = f.target.replace("timeoutSeconds=5", "timeoutSeconds=1");
    let mut watch = s.node.stream(&target).expect("watch");
    let ours = events(&drain(&mut watch));
    let names: Vec<&str> = ours
        .iter()
        .filter(|e| e["type"] == "ADDED")
        .map(|e| e["object"]["metadata"]["name"].as_str().unwrap_or(""))
        .collect();
    assert_eq!(names, ["app-with-refs", "sleep-1", "sleep-2"]);
    let recorded = recorded_events("59-node-watchlist-pods-initial-events");
    let end = recorded
        .iter()
        .find(|e| e["type"] == "BOOKMARK")
        .expect("bookmark");
    let mut want = end.clone();
    want["object"]["metadata"]["resourceVersion"] = Value::from(d.resource_version().to_string());
    assert_eq!(ours[3], want);
}

#[test]
fn after_compaction_old_watches_and_continue_tokens_are_410_as_in_62_and_63() {
    let d = double();
    let mut s = d.fixture_session();
    replay_all(&mut s, &NODE_SETUP);
    replay_all(&mut s, &POD_SETUP);
    s.replay("27-node-list-pods-limit2");
    d.compact();
    let current = d.resource_version();
    s.replay("63-node-list-pods-continue-too-old-gone");

    let f = fixture::load("62-node-watch-pods-too-old-rv-gone");
    let mut watch = s.node.stream(&f.target).expect("watch");
    assert_eq!(watch.code, 200);
    let chunks = drain(&mut watch);
    assert_eq!(chunks.len(), 1, "one ERROR event, then the end");
    let recorded = String::from_utf8_lossy(&f.response_body)
        .trim_end()
        .replace("(326)", &format!("({current})"));
    assert_eq!(String::from_utf8_lossy(&chunks[0]).trim_end(), recorded);

    // The current revision is not too old: a watch from it just waits.
    let target = format!(
        "/api/v1/pods?fieldSelector=spec.nodeName%3Dedge-node-1&watch=true&resourceVersion={current}&timeoutSeconds=1"
    );
    let mut watch = s.node.stream(&target).expect("watch");
    assert!(drain(&mut watch).is_empty());
}

fn pod(name: &str, node: &str) -> k8s_openapi::api::core::v1::Pod {
    serde_json::from_value(serde_json::json!({
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"nodeName": node, "containers": [{"name": "main", "image": "busybox:1.36"}]}
    }))
    .expect("pod")
}

const NODE_PODS: &str = "/api/v1/pods?fieldSelector=spec.nodeName%3Dedge-node-1";

#[test]
fn injected_faults_hit_the_next_matching_request_only() {
    let d = double();
    let node = || d.raw(Some(apiserver::Identity::Node("edge-node-1")));
    d.create_pod(pod("a", "edge-node-1"));

    d.fail_next(("GET", "/api/v1/pods"), apiserver::Fault::Status(503));
    let r = node().request("GET", NODE_PODS, None, b"").expect("answer");
    assert_eq!(
        (r.code, r.json()["reason"].as_str()),
        (503, Some("ServiceUnavailable"))
    );
    let r = node().request("GET", NODE_PODS, None, b"").expect("answer");
    assert_eq!(r.code, 200, "the fault was used up");

    d.fail_next(apiserver::Matcher::any(), apiserver::Fault::Drop);
    assert!(
        node().request("GET", NODE_PODS, None, b"").is_err(),
        "no answer"
    );

    d.fail_next(("GET", "/api/v1/pods"), apiserver::Fault::StaleList);
    let watch = format!("{NODE_PODS}&watch=true&timeoutSeconds=1");
    let mut w = node().stream(&watch).expect("a watch is not a LIST");
    assert_eq!(w.code, 200);
    assert_eq!(drain(&mut w).len(), 1, "the ADDED for pod a");
    let stale = node()
        .request("GET", NODE_PODS, None, b"")
        .expect("answer")
        .json();
    assert_eq!(stale["items"].as_array().map(Vec::len), Some(0));
    let rv: u64 = stale["metadata"]["resourceVersion"]
        .as_str()
        .and_then(|v| v.parse().ok())
        .expect("rv");
    assert!(rv < d.resource_version());

    d.fail_next(("GET", "/api/v1/pods"), apiserver::Fault::EmptyList);
    let empty = node()
        .request("GET", NODE_PODS, None, b"")
        .expect("answer")
        .json();
    assert_eq!(empty["items"].as_array().map(Vec::len), Some(0));
    assert_eq!(
        empty["metadata"]["resourceVersion"],
        d.resource_version().to_string(),
        "an empty answer that looks current"
    );
    let full = node()
        .request("GET", NODE_PODS, None, b"")
        .expect("answer")
        .json();
    assert_eq!(full["items"].as_array().map(Vec::len), Some(1), "once only");

    let log = d.request_log();
    let codes: Vec<u16> = log.iter().map(|l| l.code).collect();
    assert_eq!(codes, [503, 200, 0, 200, 200, 200, 200]);
    assert!(log.iter().all(|l| l.user == "system:node:edge-node-1"));
    assert!(log.windows(2).all(|w| w[0].at <= w[1].at));
    assert_eq!(
        log[3].query,
        "fieldSelector=spec.nodeName%3Dedge-node-1&watch=true&timeoutSeconds=1"
    );
}

#[test]
fn dropped_watches_end_without_the_final_chunk_and_graceful_deletes_show_up() {
    let d = double();
    let p = d.create_pod(pod("web", "edge-node-1"));
    let from = d.resource_version();
    let mut node = d.raw(Some(apiserver::Identity::Node("edge-node-1")));
    let mut w = node
        .stream(&format!("{NODE_PODS}&watch=true&resourceVersion={from}"))
        .expect("watch");
    assert!(d.wait_for(Duration::from_secs(10), |d| d.open_watches() == 1));
    let deleting = d
        .delete_pod("default", "web", None)
        .expect("graceful delete");
    assert_eq!(deleting.metadata.deletion_grace_period_seconds, Some(30));
    assert_eq!(deleting.metadata.generation, Some(2));
    assert!(
        d.get_pod("default", "web").is_some(),
        "still there during its grace period"
    );
    d.delete_pod("default", "web", Some(0));
    assert!(d.get_pod("default", "web").is_none());
    w.set_timeout(Duration::from_secs(10));
    let mut types = Vec::new();
    for _ in 0..3 {
        let c = w.next_chunk().expect("chunk").expect("event");
        let e: Value = serde_json::from_slice(&c).expect("event");
        assert_eq!(
            e["object"]["metadata"]["uid"],
            p.metadata.uid.clone().expect("uid").as_str()
        );
        types.push(e["type"].as_str().unwrap_or("").to_string());
    }
    assert_eq!(types, ["MODIFIED", "MODIFIED", "DELETED"]);
    d.drop_watches();
    assert!(w.next_chunk().is_err(), "cut, not ended");
    assert!(d.wait_for(Duration::from_secs(10), |d| d.open_watches() == 0));
}

#[test]
fn credentials_expired_certificates_tokens_and_server_names() {
    let d = ApiServerDouble::start(Options {
        server_names: vec!["apiserver.holdfast.test".into()],
        ..Options::default()
    });
    let own = "/api/v1/nodes/edge-node-1";
    let node = apiserver::Identity::Node("edge-node-1");
    let mut by_ip = d.raw(Some(node));
    assert!(
        by_ip.request("GET", own, None, b"").is_err(),
        "certificate names another host"
    );
    let mut named = d
        .raw(Some(node))
        .with_server_name("apiserver.holdfast.test");
    assert_eq!(
        named.request("GET", own, None, b"").expect("answer").code,
        404
    );

    let expired = d
        .pki()
        .expired_client("old", "system:node:edge-node-1", &["system:nodes"]);
    let mut old = apiserver::RawClient::new(d.addr(), d.pki(), Some(&expired))
        .with_server_name("apiserver.holdfast.test");
    let r = old.request("GET", own, None, b"").expect("answer");
    assert_eq!(
        r.code, 401,
        "the x509 authenticator rejects it, TLS does not"
    );

    let token = d.token(node);
    let mut bearer = d
        .raw(None)
        .with_bearer(&token)
        .with_server_name("apiserver.holdfast.test");
    assert_eq!(
        bearer.request("GET", own, None, b"").expect("answer").code,
        404
    );
    let other = bearer
        .request("GET", "/api/v1/nodes/other-node", None, b"")
        .expect("answer");
    assert_eq!(other.code, 403);
    assert_eq!(
        other.json()["message"],
        "nodes \"other-node\" is forbidden: User \"system:node:edge-node-1\" cannot get resource \"nodes\" in API group \"\" at the cluster scope: node 'edge-node-1' cannot read 'other-node', only its own Node object"
    );
    let users: Vec<String> = d.request_log().into_iter().map(|l| l.user).collect();
    assert_eq!(
        users,
        [
            "system:node:edge-node-1",
            "",
            "system:node:edge-node-1",
            "system:node:edge-node-1"
        ]
    );
}

#[test]
fn kubeconfigs_name_the_double_and_its_files() {
    let d = double();
    let dir =
        std::env::temp_dir().join(format!("holdfast-double-kubeconfig-{}", std::process::id()));
    let read = |p: &std::path::Path| -> serde_yaml::Value {
        serde_yaml::from_str(&std::fs::read_to_string(p).expect("kubeconfig")).expect("yaml")
    };
    let files = d.kubeconfig(&dir, apiserver::Identity::Node("edge-node-1"));
    let k = read(&files);
    assert_eq!(k["current-context"], "double");
    assert_eq!(
        k["clusters"][0]["cluster"]["server"].as_str(),
        Some(d.url().as_str())
    );
    let ca = k["clusters"][0]["cluster"]["certificate-authority"]
        .as_str()
        .expect("ca path");
    assert_eq!(std::fs::read_to_string(ca).expect("ca"), d.pki().ca_pem);
    for key in ["client-certificate", "client-key"] {
        let p = k["users"][0]["user"][key].as_str().expect(key);
        assert!(std::fs::read_to_string(p)
            .expect(key)
            .starts_with("-----BEGIN"));
    }
    let data = d.kubeconfig_with(
        &dir,
        apiserver::Identity::Admin,
        &apiserver::KubeconfigOptions {
            embed: true,
            ..Default::default()
        },
    );
    let k = read(&data);
    let ca = k["clusters"][0]["cluster"]["certificate-authority-data"]
        .as_str()
        .expect("ca data");
    assert!(!ca.is_empty() && k["users"][0]["user"]["client-key-data"].is_string());
    let token = read(&d.kubeconfig_token(&dir, apiserver::Identity::Admin));
    let t = token["users"][0]["user"]["token"].as_str().expect("token");
    let mut admin = d.raw(None).with_bearer(t);
    assert_eq!(
        admin
            .request("GET", "/api/v1/pods", None, b"")
            .expect("answer")
            .code,
        200
    );
    let _ = std::fs::remove_dir_all(&dir);
}
