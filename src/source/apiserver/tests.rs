//! The api source's decisions against a scripted lister: what it calls, in which order,
//! what it sends and how long it waits. The recorded apiserver answers (fixtures 26–30,
//! 36, 62, 63) drive some of the scripts.

use std::sync::mpsc as std_mpsc;
use std::time::{Duration, Instant};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::WatchEvent;

use super::fake::*;
use super::*;
use crate::pod::annotations::{CONFIG_SEEN, CONFIG_SOURCE, SOURCE_API};

const F26: &str = include_str!("testdata/26-node-list-pods.json");
const F27: &str = include_str!("testdata/27-node-list-pods-limit2.json");
const F28: &str = include_str!("testdata/28-node-list-pods-limit2-page2.json");
const F30: &str = include_str!("testdata/30-node-watch-pods.jsonl");
const F36: &str = include_str!("testdata/36-node-watch-pods-bookmarks.jsonl");
const F62: &str = include_str!("testdata/62-node-watch-pods-too-old-rv-gone.jsonl");
const F63: &str = include_str!("testdata/63-node-list-pods-continue-too-old-gone.json");

#[test]
fn list_then_watch_events_give_the_right_snapshots() {
    let mut h = start(
        vec![page(
            10,
            vec![pod("a", 5, "app:1"), pod("b", 6, "app:1")],
            None,
        )],
        vec![WatchStep::Stream(vec![
            Ok(WatchEvent::Added(pod("c", 11, "app:1"))),
            Ok(WatchEvent::Modified(pod("a", 12, "app:2"))),
            Ok(WatchEvent::Deleted(pod("b", 13, "app:1"))),
        ])],
    );
    let calls = h.calls_once(3);
    assert_eq!(calls, [list_call(), watch_call("10"), watch_call("13")]);
    let sent = h.sent();
    assert_eq!(names(&sent[0]), ["a", "b"], "the list, as listed");
    let last = sent.last().expect("snapshots");
    assert_eq!(names(last), ["a", "c"]);
    let a = &last.pods[0];
    assert_eq!(a.metadata.uid.as_deref(), Some("uid-a"));
    let spec = a.spec.as_ref().expect("spec");
    assert_eq!(spec.containers[0].image.as_deref(), Some("app:2"));
    for p in &last.pods {
        assert!(p.status.is_none());
        assert!(p.metadata.managed_fields.is_none());
        assert!(p.metadata.resource_version.is_none());
        assert_eq!(p.metadata.generation, Some(1));
        let ann = p.metadata.annotations.as_ref().expect("annotations");
        assert_eq!(ann.get(CONFIG_SOURCE).map(String::as_str), Some("api"));
        assert!(ann.contains_key(CONFIG_SEEN));
    }
    for t in h.fake.timeouts() {
        assert!((300..=600).contains(&t), "watch timeout {t}");
    }
    assert!(h.sleeps().is_empty());
    h.stop();
}

#[test]
fn recorded_list_watch_bookmarks_and_expiry() {
    let mut h = start(
        vec![fixture_list(F26), fixture_list(F26)],
        vec![
            fixture_events(F30),
            fixture_events(F36),
            fixture_events(F62),
        ],
    );
    let calls = h.calls_once(6);
    assert_eq!(
        calls,
        [
            list_call(),
            // From the list's resourceVersion, then from the last bookmarks of 30
            // (253, beyond any event it carried) and 36 (267).
            watch_call("231"),
            watch_call("253"),
            watch_call("267"),
            // 62's ERROR 410 relists; the answer (26 again, rv 231 < 267) is stale.
            list_call(),
            list_call(),
        ]
    );
    let sent = h.sent();
    assert_eq!(names(&sent[0]), ["app-with-refs", "sleep-1", "sleep-2"]);
    assert_eq!(
        names(sent.last().expect("snapshots")),
        ["app-with-refs", "sleep-1", "sleep-3"],
        "sleep-2 deleted and the stale list ignored"
    );
    assert_eq!(h.sleeps(), jitter(&[1]), "one back-off, for the stale list");
    h.stop();
}

#[test]
fn recorded_pages_and_expired_continue_token() {
    let token =
        "eyJ2IjoibWV0YS5rOHMuaW8vdjEiLCJydiI6MjMxLCJzdGFydCI6Ii9kZWZhdWx0L3NsZWVwLTFcdTAwMDAifQ";
    let gone = || {
        ListStep::Fail(ApiError::from_status(
            "GET",
            "/api/v1/pods",
            410,
            F63.as_bytes(),
        ))
    };
    let mut h = start(
        vec![
            fixture_list(F27),
            gone(),
            fixture_list(F27),
            gone(),
            fixture_list(F27),
            fixture_list(F28),
        ],
        vec![],
    );
    let calls = h.calls_once(7);
    let next = Call::List(Some(token.into()));
    assert_eq!(
        calls,
        [
            list_call(),
            next.clone(),
            // 410 on the continue page: from scratch, at once.
            list_call(),
            next.clone(),
            // Again before any success: a back-off first.
            list_call(),
            next,
            watch_call("231"),
        ]
    );
    let sent = h.sent();
    assert_eq!(sent.len(), 1, "no snapshot from a partial list");
    assert_eq!(names(&sent[0]), ["app-with-refs", "sleep-1", "sleep-2"]);
    assert_eq!(h.sleeps(), jitter(&[1]));
    h.stop();
}

#[test]
fn a_broken_stream_resumes_from_the_last_rv_without_relisting() {
    let mut h = start(
        vec![page(10, vec![pod("a", 5, "app:1")], None)],
        vec![
            WatchStep::Stream(vec![
                Ok(WatchEvent::Added(pod("b", 11, "app:1"))),
                Err(transport("connection reset")),
            ]),
            WatchStep::Fail(transport("connection refused")),
            WatchStep::Stream(vec![Ok(WatchEvent::Added(pod("c", 12, "app:1")))]),
        ],
    );
    let calls = h.calls_once(5);
    assert_eq!(
        calls,
        [
            list_call(),
            watch_call("10"),
            watch_call("11"),
            watch_call("11"),
            watch_call("12"),
        ]
    );
    assert_eq!(names(h.sent().last().expect("snapshots")), ["a", "b", "c"]);
    assert_eq!(h.sleeps(), jitter(&[1, 2]));
    h.stop();
}

#[test]
fn gone_relists_exactly_once() {
    let mut h = start(
        vec![
            page(10, vec![pod("a", 5, "app:1")], None),
            page(40, vec![pod("a", 5, "app:1"), pod("b", 30, "app:1")], None),
            page(50, vec![pod("b", 30, "app:1")], None),
        ],
        vec![
            // HTTP 410 on opening the watch.
            WatchStep::Fail(status(410, "Expired")),
            WatchStep::Stream(vec![bookmark(45)]),
            // ERROR 410 inside the stream.
            WatchStep::Stream(vec![expired_event()]),
        ],
    );
    let calls = h.calls_once(7);
    assert_eq!(
        calls,
        [
            list_call(),
            watch_call("10"),
            list_call(),
            watch_call("40"),
            watch_call("45"),
            list_call(),
            watch_call("50"),
        ]
    );
    let sent = h.sent();
    let seen: Vec<Vec<String>> = sent.iter().map(names).collect();
    assert_eq!(seen, [vec!["a"], vec!["a", "b"], vec!["b"]]);
    assert!(h.sleeps().is_empty(), "a 410 relists at once");
    h.stop();
}

#[test]
fn expiring_every_watch_backs_off_instead_of_listing_in_a_loop() {
    let h = start(
        vec![
            page(10, vec![], None),
            page(20, vec![], None),
            page(30, vec![], None),
        ],
        vec![
            WatchStep::Stream(vec![expired_event()]),
            WatchStep::Stream(vec![expired_event()]),
        ],
    );
    let calls = h.calls_once(6);
    assert_eq!(
        calls,
        [
            list_call(),
            watch_call("10"),
            list_call(),
            watch_call("20"),
            list_call(),
            watch_call("30"),
        ]
    );
    assert_eq!(h.sleeps(), jitter(&[1]));
    h.stop();
}

#[test]
fn failed_or_stale_lists_keep_the_pods() {
    let mut h = start(
        vec![
            page(10, vec![pod("a", 5, "app:1"), pod("b", 6, "app:1")], None),
            ListStep::Fail(transport("network unreachable")),
            // A lagging apiserver's cache: older than the event at 15.
            page(12, vec![pod("a", 5, "app:1")], None),
            page(30, vec![pod("a", 5, "app:1"), pod("c", 15, "app:1")], None),
        ],
        vec![
            WatchStep::Stream(vec![
                Ok(WatchEvent::Added(pod("c", 15, "app:1"))),
                Err(transport("connection reset")),
            ]),
            WatchStep::Stream(vec![expired_event()]),
        ],
    );
    let calls = h.calls_once(7);
    assert_eq!(
        calls,
        [
            list_call(),
            watch_call("10"),
            watch_call("15"),
            list_call(),
            list_call(),
            list_call(),
            watch_call("30"),
        ]
    );
    let seen: Vec<Vec<String>> = h.sent().iter().map(names).collect();
    assert_eq!(
        seen.first().map(Vec::as_slice),
        Some(&["a".to_string(), "b".into()][..])
    );
    assert_eq!(
        seen.last().map(Vec::as_slice),
        Some(&["a".to_string(), "c".into()][..])
    );
    assert!(
        !seen.iter().any(|s| s == &["a"]),
        "the stale list never became a snapshot: {seen:?}"
    );
    // The broken stream, the failed list, the stale list.
    assert_eq!(h.sleeps(), jitter(&[1, 2, 3]));
    h.stop();
}

#[test]
fn backoff_grows_to_its_cap_and_resets_after_a_success() {
    let h = start(
        vec![
            ListStep::Fail(transport("network unreachable")),
            ListStep::Fail(status(401, "Unauthorized")),
            ListStep::Fail(status(403, "Forbidden")),
            ListStep::Fail(status(503, "ServiceUnavailable")),
            page(10, vec![], None),
        ],
        vec![
            WatchStep::Fail(transport("connection refused")),
            WatchStep::Fail(transport("connection refused")),
            WatchStep::Stream(vec![bookmark(11)]),
            WatchStep::Fail(transport("connection refused")),
            // Open, but ends at once without an event: a failure too.
            WatchStep::Stream(vec![]),
        ],
    );
    let calls = h.calls_once(11);
    assert_eq!(calls.len(), 11, "{calls:?}");
    assert_eq!(
        calls[5..],
        [
            watch_call("10"),
            watch_call("10"),
            watch_call("10"),
            watch_call("11"),
            watch_call("11"),
            watch_call("11")
        ]
    );
    let sleeps = h.sleeps();
    assert_eq!(sleeps, jitter(&[1, 2, 3, 4, 1, 2, 1, 2]));
    let cap = options().backoff.max;
    assert!(sleeps.iter().all(|d| *d <= cap));
    h.stop();
}

#[test]
fn finished_pods_stay_with_their_phase_until_deleted() {
    let mut h = start(
        vec![page(
            10,
            vec![
                with_phase(pod("a", 5, "app:1"), "Running"),
                with_phase(pod("b", 6, "app:1"), "Succeeded"),
                with_phase(pod("c", 7, "app:1"), "Failed"),
            ],
            None,
        )],
        vec![WatchStep::Stream(vec![
            Ok(WatchEvent::Modified(with_phase(
                pod("a", 11, "app:1"),
                "Succeeded",
            ))),
            Ok(WatchEvent::Deleted(with_phase(
                pod("b", 12, "app:1"),
                "Succeeded",
            ))),
        ])],
    );
    h.calls_once(3);
    let phases = |snapshot: &SourceSnapshot| -> Vec<(String, Option<String>)> {
        let mut v: Vec<_> = snapshot
            .pods
            .iter()
            .map(|p| {
                (
                    p.metadata.name.clone().unwrap_or_default(),
                    p.status.as_ref().and_then(|s| s.phase.clone()),
                )
            })
            .collect();
        v.sort();
        v
    };
    let sent = h.sent();
    let succeeded = || Some("Succeeded".to_string());
    assert_eq!(
        sent.first().map(phases),
        Some(vec![
            ("a".to_string(), None),
            ("b".to_string(), succeeded()),
            ("c".to_string(), Some("Failed".to_string())),
        ])
    );
    assert_eq!(
        sent.last().map(phases),
        Some(vec![
            ("a".to_string(), succeeded()),
            ("c".to_string(), Some("Failed".to_string())),
        ])
    );
    h.stop();
}

#[test]
fn status_only_changes_send_nothing() {
    let mut running = with_phase(pod("a", 11, "app:1"), "Running");
    running.metadata.managed_fields = Some(vec![]);
    let mut h = start(
        vec![page(10, vec![pod("a", 5, "app:1")], None)],
        vec![WatchStep::Stream(vec![Ok(WatchEvent::Modified(running))])],
    );
    assert_eq!(h.calls_once(3)[2], watch_call("11"));
    let sent = h.sent();
    assert_eq!(sent.len(), 1, "only the list");
    h.stop();
}

#[test]
fn bursts_are_coalesced_and_the_tail_is_sent_without_waiting_for_more() {
    let (feed, events) = std_mpsc::channel();
    let mut opts = options();
    opts.coalesce = Duration::from_millis(300);
    let mut h = start_with(
        vec![page(10, vec![], None)],
        vec![WatchStep::Live(events)],
        opts,
    );
    assert_eq!(h.until(&[]), 1);
    // Events a few milliseconds apart: each would be a snapshot of its own without
    // the window.
    let total = 20;
    let mut want = Vec::new();
    for i in 0..total {
        let name = format!("p{i:02}");
        feed.send(Ok(WatchEvent::Added(pod(&name, 11 + i, "app:1"))))
            .expect("feed");
        want.push(name);
        std::thread::sleep(Duration::from_millis(5));
    }
    // The stream stays open and quiet: the held-back changes go out on their own.
    let want: Vec<&str> = want.iter().map(String::as_str).collect();
    let count = h.until(&want);
    assert!(
        count <= total as usize / 2,
        "{count} snapshots for {total} events"
    );
    drop(feed);
    h.stop();
}

#[test]
fn stops_when_the_receiver_is_dropped_during_a_quiet_watch() {
    let (feed, events) = std_mpsc::channel::<Item>();
    let mut h = start(vec![page(10, vec![], None)], vec![WatchStep::Live(events)]);
    assert_eq!(h.until(&[]), 1);
    h.calls_once(2);
    // `stop` asserts the thread ends while the stream is still open.
    h.stop();
    drop(feed);
}

#[test]
fn system_clock_sleep_ends_early_when_asked() {
    let mut clock = SystemClock;
    let t = Instant::now();
    clock.sleep(Duration::from_secs(60), &|| true);
    assert!(t.elapsed() < Duration::from_secs(1));
    let t = Instant::now();
    clock.sleep(Duration::from_millis(30), &|| false);
    assert!(t.elapsed() >= Duration::from_millis(30));
    assert_ne!(clock.random(), clock.random());
}

#[test]
fn repeated_trouble_has_one_key_whatever_the_path() {
    let forbidden = |path: &str| {
        ApiSourceError::Api(ApiError::Status {
            method: "GET",
            path: path.into(),
            code: 403,
            reason: "Forbidden".into(),
            message: "pods is forbidden".into(),
        })
    };
    let a = forbidden(&watch_path(NODE, "10", 321));
    let b = forbidden(&watch_path(NODE, "11", 456));
    assert!(a.is_auth() && !a.is_gone());
    assert_eq!(a.key(), b.key());
    assert_ne!(
        a.key(),
        ApiSourceError::from(status(401, "Unauthorized")).key()
    );
    let gone = ApiError::from_status("GET", "/api/v1/pods", 410, F63.as_bytes());
    assert!(ApiSourceError::from(gone).is_gone());
}

#[test]
fn normalise_keeps_what_the_sync_loop_acts_on() {
    let list: PodList = serde_json::from_str(F26).expect("recorded PodList");
    let raw = list
        .items
        .iter()
        .find(|p| p.metadata.name.as_deref() == Some("app-with-refs"))
        .expect("app-with-refs")
        .clone();
    let pod = normalise(raw.clone());
    assert!(pod.status.is_none());
    assert!(pod.metadata.managed_fields.is_none());
    assert!(pod.metadata.resource_version.is_none());
    assert_eq!(pod.metadata.uid, raw.metadata.uid);
    assert_eq!(pod.metadata.generation, raw.metadata.generation);
    assert_eq!(pod.metadata.labels, raw.metadata.labels);
    assert_eq!(
        pod.metadata.creation_timestamp,
        raw.metadata.creation_timestamp
    );
    assert_eq!(pod.spec, raw.spec);
    let ann = pod.metadata.annotations.expect("annotations");
    assert_eq!(ann.get(CONFIG_SOURCE).map(String::as_str), Some(SOURCE_API));
    assert_eq!(ann.len(), 1);
}

#[test]
fn normalise_keeps_the_conditions_readiness_gates_name() {
    use k8s_openapi::api::core::v1::{PodCondition, PodReadinessGate};
    let cond = |t: &str, s: &str| PodCondition {
        type_: t.into(),
        status: s.into(),
        ..PodCondition::default()
    };
    let mut raw = with_phase(pod("a", 11, "app:1"), "Running");
    if let Some(st) = raw.status.as_mut() {
        st.conditions = Some(vec![
            cond("Ready", "False"),
            cond("example.com/gate", "True"),
            cond("example.com/other", "True"),
        ]);
    }
    // Without gates the status goes, as any status that changes on every update.
    assert!(normalise(raw.clone()).status.is_none());
    if let Some(spec) = raw.spec.as_mut() {
        spec.readiness_gates = Some(vec![PodReadinessGate {
            condition_type: "example.com/gate".into(),
        }]);
    }
    let status = normalise(raw).status.expect("the gate's condition");
    assert_eq!(status.phase, None, "only a terminal phase is kept");
    assert_eq!(
        status.conditions,
        Some(vec![cond("example.com/gate", "True")])
    );
}

#[test]
fn held_back_changes_go_out_when_the_stream_ends() {
    let mut opts = options();
    opts.coalesce = Duration::from_secs(3600);
    let mut h = start_with(
        vec![page(10, vec![], None)],
        vec![
            WatchStep::Stream(vec![Ok(WatchEvent::Added(pod("a", 11, "app:1")))]),
            WatchStep::Stream(vec![
                Ok(WatchEvent::Added(pod("b", 12, "app:1"))),
                Err(transport("connection reset")),
            ]),
        ],
        opts,
    );
    let calls = h.calls_once(4);
    assert_eq!(
        calls,
        [
            list_call(),
            watch_call("10"),
            watch_call("11"),
            watch_call("12")
        ]
    );
    let seen: Vec<Vec<String>> = h.sent().iter().map(names).collect();
    assert_eq!(seen, [vec![], vec!["a"], vec!["a", "b"]]);
    h.stop();
}

#[test]
fn an_empty_list_after_a_drop_is_believed_only_when_repeated() {
    let mut h = start(
        vec![
            page(10, vec![pod("a", 5, "app:1"), pod("b", 6, "app:1")], None),
            // After the 410: empty (a cache not filled yet), then the pods again.
            page(20, vec![], None),
            page(21, vec![pod("a", 5, "app:1"), pod("b", 6, "app:1")], None),
        ],
        vec![WatchStep::Stream(vec![expired_event()])],
    );
    let calls = h.calls_once(5);
    assert_eq!(
        calls[..5],
        [
            list_call(),
            watch_call("10"),
            list_call(),
            list_call(),
            watch_call("21")
        ]
    );
    let sent = h.sent();
    assert!(
        sent.iter().all(|s| names(s) == ["a", "b"]),
        "the empty list never reached the mux: {:?}",
        sent.iter().map(names).collect::<Vec<_>>()
    );
    assert_eq!(h.sleeps(), jitter(&[1]), "one back-off before asking again");
    h.stop();
}

#[test]
fn an_empty_list_repeated_stops_the_pods() {
    let mut h = start(
        vec![
            page(10, vec![pod("a", 5, "app:1")], None),
            page(20, vec![], None),
            page(21, vec![], None),
        ],
        vec![WatchStep::Stream(vec![expired_event()])],
    );
    assert_eq!(h.until(&[]), 2, "the list, then the confirmed empty one");
    h.stop();
}

#[test]
fn an_empty_first_list_with_stored_pods_is_confirmed_first() {
    let opts = ApiSourceOptions {
        known_pods: 3,
        ..options()
    };
    let mut h = start_with(
        vec![
            page(20, vec![], None),
            page(21, vec![pod("a", 5, "app:1")], None),
        ],
        vec![],
        opts,
    );
    assert_eq!(
        h.until(&["a"]),
        1,
        "nothing went out before the second list"
    );
    h.stop();
}

fn stored(name: &str) -> Pod {
    let mut p = normalise(pod(name, 1, "app:1"));
    crate::source::static_pod::set_seen(
        &mut p,
        crate::time::Timestamp::from_second(1_700_000_000).expect("ts"),
    );
    p
}

fn resumed(pods: Vec<Pod>, rv: &str, link: Option<Link>) -> ApiSourceResume {
    ApiSourceResume {
        link,
        pods,
        resource_version: Some(rv.into()),
        tap: None,
    }
}

#[test]
fn a_resumed_source_watches_from_the_stored_version_without_listing() {
    let mut h = start_resumed(
        vec![],
        vec![WatchStep::Stream(vec![
            // Deleted and bound in the cluster while the agent was away.
            Ok(WatchEvent::Deleted(pod("b", 41, "app:1"))),
            Ok(WatchEvent::Added(pod("c", 42, "app:1"))),
        ])],
        options(),
        resumed(vec![stored("a"), stored("b")], "40", None),
    );
    let calls = h.calls_once(2);
    assert_eq!(calls, [watch_call("40"), watch_call("42")], "no LIST");
    let sent = h.sent();
    assert_eq!(
        names(&sent[0]),
        ["a", "b"],
        "the stored set, once, at start"
    );
    assert_eq!(sent[0].resource_version.as_deref(), Some("40"));
    let last = sent.last().expect("snapshots");
    assert_eq!(names(last), ["a", "c"]);
    assert_eq!(last.resource_version.as_deref(), Some("42"));
    // The stored pod kept its first-seen time: it is the same pod, not a new one.
    let a = &last.pods[0];
    assert_eq!(a, &stored("a"));
    h.stop();
}

#[test]
fn a_resumed_source_lists_once_when_its_version_is_gone() {
    let mut h = start_resumed(
        vec![page(
            90,
            vec![pod("a", 5, "app:1"), pod("c", 80, "app:1")],
            None,
        )],
        vec![WatchStep::Fail(status(410, "Expired"))],
        options(),
        resumed(vec![stored("a"), stored("b")], "40", None),
    );
    let calls = h.calls_once(3);
    assert_eq!(calls, [watch_call("40"), list_call(), watch_call("90")]);
    assert_eq!(h.until(&["a", "c"]), 2);
    assert!(h.sleeps().is_empty(), "a 410 relists at once");
    h.stop();
}

#[test]
fn with_a_link_a_dead_apiserver_is_waited_for_not_retried() {
    let link = Link::new(Duration::from_secs(60));
    link.node_ready(Instant::now(), crate::time::now());
    link.drained();
    let mut h = start_resumed(
        vec![],
        vec![
            WatchStep::Fail(transport("connection refused")),
            WatchStep::Stream(vec![Ok(WatchEvent::Added(pod("c", 42, "app:1")))]),
        ],
        options(),
        resumed(vec![stored("a")], "40", Some(link.clone())),
    );
    assert_eq!(h.calls_once(1), [watch_call("40")]);
    let deadline = Instant::now() + DEADLINE;
    while !link.is_down() {
        assert!(Instant::now() < deadline, "the link was not marked down");
        std::thread::sleep(Duration::from_millis(2));
    }
    // Down: nothing more until the node controller brings it back and the outbox
    // drains. (A bounded look: the source would have retried at once otherwise.)
    std::thread::sleep(Duration::from_millis(50));
    assert_eq!(h.fake.calls().len(), 1, "{:?}", h.fake.calls());
    link.node_ready(Instant::now(), crate::time::now());
    std::thread::sleep(Duration::from_millis(50));
    assert_eq!(h.fake.calls().len(), 1, "waits for the outbox to drain too");
    link.drained();
    assert_eq!(h.calls_once(2)[..2], [watch_call("40"), watch_call("40")]);
    assert_eq!(h.until(&["a", "c"]), 2);
    assert!(h.sleeps().is_empty(), "no back-off of its own");
    assert!(link.report().last_sync.is_some());
    h.stop();
}

#[test]
fn a_watch_open_when_the_link_went_down_is_given_up_and_opened_again_once_it_is_back() {
    let link = Link::new(Duration::from_secs(60));
    link.node_ready(Instant::now(), crate::time::now());
    link.drained();
    // A watch whose connection went silent: no event, no end (a cut uplink drops
    // packets; it does not close connections).
    let (_silent, stalled) = std_mpsc::channel();
    let mut h = start_resumed(
        vec![],
        vec![
            WatchStep::Live(stalled),
            WatchStep::Stream(vec![Ok(WatchEvent::Added(pod("c", 42, "app:1")))]),
        ],
        options(),
        resumed(vec![stored("a")], "40", Some(link.clone())),
    );
    assert_eq!(h.calls_once(1), [watch_call("40")]);
    link.report_down(crate::time::now());
    // Within a wait of the loop the stalled watch is left; nothing more while down.
    std::thread::sleep(Duration::from_millis(1500));
    assert_eq!(h.fake.calls().len(), 1, "{:?}", h.fake.calls());
    link.node_ready(Instant::now(), crate::time::now());
    link.drained();
    assert_eq!(h.calls_once(2)[..2], [watch_call("40"), watch_call("40")]);
    assert_eq!(h.until(&["a", "c"]), 2);
    h.stop();
}
