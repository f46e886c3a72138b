use super::*;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use std::time::Duration;

fn pod(uid: &str) -> Pod {
    Pod {
        metadata: ObjectMeta {
            name: Some(format!("p-{uid}")),
            namespace: Some("ns".into()),
            uid: Some(uid.into()),
            ..ObjectMeta::default()
        },
        ..Pod::default()
    }
}

fn status(phase: &str) -> PodStatus {
    PodStatus {
        phase: Some(phase.into()),
        ..PodStatus::default()
    }
}

#[test]
fn newest_status_wins_and_finished_sticks() {
    let (r, out) = Reporter::connected();
    r.status(&pod("a"), &status("Pending"), false);
    r.status(&pod("a"), &status("Running"), false);
    r.status(&pod("b"), &status("Running"), true);
    r.status(&pod("b"), &status("Failed"), false);
    let got = out.take(Duration::ZERO);
    assert_eq!(got.statuses.len(), 2);
    assert_eq!(got.statuses["a"].status.phase.as_deref(), Some("Running"));
    assert_eq!(got.statuses["b"].status.phase.as_deref(), Some("Failed"));
    assert!(got.statuses["b"].finished);
    assert!(out.take(Duration::ZERO).statuses.is_empty());
}

#[test]
fn a_retried_status_does_not_replace_a_newer_one() {
    let (r, out) = Reporter::connected();
    r.status(&pod("a"), &status("Pending"), false);
    let mut got = out.take(Duration::ZERO);
    r.status(&pod("a"), &status("Running"), false);
    let old = got.statuses.remove("a").expect("a");
    out.retry_status("a".into(), old);
    let got = out.take(Duration::ZERO);
    assert_eq!(got.statuses["a"].status.phase.as_deref(), Some("Running"));
}

#[test]
fn events_are_a_bounded_ring() {
    let (r, out) = Reporter::connected();
    for n in 0..EVENT_RING + 10 {
        r.event(
            &pod("a"),
            None,
            EventType::Normal,
            "Started",
            format!("{n}"),
        );
    }
    let got = out.take(Duration::ZERO);
    assert_eq!(got.events.len(), EVENT_RING);
    assert_eq!(got.events_dropped, 10);
    assert_eq!(got.events.front().map(|e| e.message.as_str()), Some("10"));
    out.retry_events(got.events.into_iter().collect());
    r.event(&pod("a"), None, EventType::Normal, "Started", "new".into());
    let got = out.take(Duration::ZERO);
    assert_eq!(got.events.len(), EVENT_RING);
    assert_eq!(got.events_dropped, 11);
    assert_eq!(got.events.back().map(|e| e.message.as_str()), Some("new"));
}

#[test]
fn removed_drops_unsent_status_but_not_a_final_one() {
    let (r, out) = Reporter::connected();
    r.status(&pod("a"), &status("Running"), false);
    r.status(&pod("b"), &status("Failed"), true);
    r.removed(&pod("a"), true);
    r.removed(&pod("b"), false);
    let got = out.take(Duration::ZERO);
    assert!(!got.statuses.contains_key("a"));
    assert!(got.statuses.contains_key("b"));
    assert_eq!(got.removed_static.len(), 1);
    assert_eq!(got.removed_static[0].uid, "a");
}

fn link() -> Link {
    Link::new(Duration::from_secs(60))
}

/// A status with a container that ended at a fixed time, as its record says.
fn crashed_at(secs: i64) -> PodStatus {
    use k8s_openapi::api::core::v1::{ContainerState, ContainerStateTerminated, ContainerStatus};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
    let t = Timestamp::from_second(secs).expect("ts");
    PodStatus {
        phase: Some("Running".into()),
        container_statuses: Some(vec![ContainerStatus {
            name: "c".into(),
            restart_count: 3,
            last_state: Some(ContainerState {
                terminated: Some(ContainerStateTerminated {
                    exit_code: 1,
                    finished_at: Some(Time(t)),
                    ..ContainerStateTerminated::default()
                }),
                ..ContainerState::default()
            }),
            ..ContainerStatus::default()
        }]),
        ..PodStatus::default()
    }
}

fn stored_keys(store: &Store, tree: &'static str) -> Vec<String> {
    let t: Tree<serde_json::Value> = store.tree(tree).expect("tree");
    t.keys().expect("keys")
}

#[test]
fn what_waits_while_down_survives_a_restart_with_its_true_times() {
    let dir = crate::testutil::TempDir::new("outbox-restart");
    {
        let store = Store::open(&dir.0).expect("store");
        let (r, _out) = Reporter::persistent(&store, link()).expect("outbox");
        r.status(&pod("a"), &status("Pending"), false);
        r.status(&pod("a"), &crashed_at(1_700_000_100), false);
        r.status(&pod("b"), &status("Failed"), true);
        r.event(
            &pod("a"),
            Some("c"),
            EventType::Warning,
            "BackOff",
            "x".into(),
        );
        r.event(&pod("a"), None, EventType::Normal, "Killing", "y".into());
        r.removed(&pod("s"), true);
        assert_eq!(stored_keys(&store, STATUS_TREE), ["a", "b"]);
        store.flush().expect("flush");
    }
    let store = Store::open(&dir.0).expect("reopen");
    let (r, out) = Reporter::persistent(&store, link()).expect("outbox");
    let depth = out.depth_report();
    assert_eq!(
        (depth.statuses, depth.events, depth.removed_static),
        (2, 2, 1)
    );
    let got = out.take(Duration::ZERO);
    let a = &got.statuses["a"].status;
    assert_eq!(
        a,
        &crashed_at(1_700_000_100),
        "newest wins, times untouched"
    );
    assert!(got.statuses["b"].finished);
    let reasons: Vec<&str> = got.events.iter().map(|e| e.reason.as_ref()).collect();
    assert_eq!(reasons, ["BackOff", "Killing"], "in order");
    assert_eq!(got.events[0].container.as_deref(), Some("c"));
    assert_eq!(got.removed_static[0].uid, "s");
    // New events follow the loaded ones.
    r.event(&pod("a"), None, EventType::Normal, "Started", "z".into());
    let next = out.take(Duration::ZERO);
    assert!(next.events[0].id > got.events[1].id);

    // Once sent, the records go.
    let ids: Vec<u64> = got
        .events
        .iter()
        .chain(&next.events)
        .map(|e| e.id)
        .collect();
    out.sent(&["a".into(), "b".into()], &ids, &["s".into()]);
    for tree in [STATUS_TREE, EVENT_TREE, REMOVED_TREE] {
        assert!(stored_keys(&store, tree).is_empty(), "{tree}");
    }
}

#[test]
fn nothing_is_written_while_up_until_a_send_fails() {
    let dir = crate::testutil::TempDir::new("outbox-up");
    let store = Store::open(&dir.0).expect("store");
    let l = link();
    l.node_ready(std::time::Instant::now(), time::now());
    let (r, out) = Reporter::persistent(&store, l.clone()).expect("outbox");
    r.status(&pod("a"), &status("Running"), false);
    r.event(&pod("a"), None, EventType::Normal, "Started", "x".into());
    assert!(stored_keys(&store, STATUS_TREE).is_empty());
    assert!(stored_keys(&store, EVENT_TREE).is_empty());

    let mut got = out.take(Duration::ZERO);
    // A newer status arrives while the old one is in flight, then the send fails.
    r.status(&pod("a"), &crashed_at(1_700_000_200), false);
    let old = got.statuses.remove("a").expect("a");
    out.retry_status("a".into(), old);
    out.retry_events(got.events.into_iter().collect());
    assert_eq!(stored_keys(&store, STATUS_TREE), ["a"]);
    assert_eq!(stored_keys(&store, EVENT_TREE).len(), 1);
    let t: Tree<StatusReport> = store.tree(STATUS_TREE).expect("tree");
    let kept = t.get("a").expect("get").expect("stored");
    assert_eq!(kept.status, crashed_at(1_700_000_200), "the newest is kept");
    // Later statuses for a pod with a record keep the record current, link up or not.
    r.status(&pod("a"), &crashed_at(1_700_000_300), false);
    let kept = t.get("a").expect("get").expect("stored");
    assert_eq!(kept.status, crashed_at(1_700_000_300));
    let got = out.take(Duration::ZERO);
    let ids: Vec<u64> = got.events.iter().map(|e| e.id).collect();
    out.sent(&["a".into()], &ids, &[]);
    assert!(stored_keys(&store, STATUS_TREE).is_empty());
    assert!(stored_keys(&store, EVENT_TREE).is_empty());
}

#[test]
fn the_stored_ring_is_bounded_by_its_size_not_the_outage() {
    let dir = crate::testutil::TempDir::new("outbox-ring");
    let store = Store::open(&dir.0).expect("store");
    let (r, out) = Reporter::persistent(&store, link()).expect("outbox");
    for n in 0..EVENT_RING + 40 {
        r.event(
            &pod("a"),
            None,
            EventType::Normal,
            "Started",
            format!("{n}"),
        );
        r.status(&pod("a"), &status(&format!("P{n}")), false);
    }
    assert_eq!(stored_keys(&store, EVENT_TREE).len(), EVENT_RING);
    assert_eq!(stored_keys(&store, STATUS_TREE).len(), 1);
    let depth = out.depth_report();
    assert_eq!(depth.events, EVENT_RING);
    assert_eq!(depth.events_dropped, 40);
    // A pod gone from the node takes its unsent status with it.
    r.removed(&pod("a"), false);
    assert!(stored_keys(&store, STATUS_TREE).is_empty());
}

#[test]
fn standalone_keeps_nothing() {
    let r = Reporter::standalone();
    r.status(&pod("a"), &status("Running"), false);
    r.event(&pod("a"), None, EventType::Warning, "BackOff", "x".into());
    assert!(!r.is_connected());
}
