//! The manager against a scripted apiserver: which objects are followed, how, and
//! what the store keeps when objects stop being referenced or the uplink is down.

use k8s_openapi::api::core::v1::ConfigMap;

use super::super::rig::*;
use super::super::testing::{list_of, wait_for, Call, Fail, FakeApi};
use super::*;

#[test]
fn unreferenced_objects_leave_the_store_and_are_no_longer_watched() {
    // Watches stay open until the test says something, so what each thread does is
    // decided by the test, not by timing.
    let api = FakeApi::new(LIMIT * 3);
    let (a, b, c) = (cm_key("keep-a"), cm_key("drop-b"), cm_key("later-c"));
    for (key, name) in [(&a, "keep-a"), (&b, "drop-b"), (&c, "later-c")] {
        api.lists(
            key,
            vec![Ok(list_of(
                "ConfigMap",
                "10",
                vec![app_config(name, "info", "5")],
            ))],
        );
    }
    let mut rig = Rig::start(&api, options());
    let (pa, pb) = (pod("pa", &["keep-a"], &[]), pod("pb", &["drop-b"], &[]));
    rig.set_pods(&[&pa, &pb]);
    wait_for("both watched", LIMIT, || {
        api.open_watches(&a) == 1 && api.open_watches(&b) == 1
    });
    assert!(rig.level("drop-b").is_some());

    rig.set_pods(&[&pa]);
    wait_for("b gone from the store", LIMIT, || {
        rig.level("drop-b").is_none()
    });
    // b's watch is told to stop before its object leaves the store; the next thing the
    // server sends ends it, and nothing is stored.
    api.push(
        &b,
        vec![event(
            "ConfigMap",
            "MODIFIED",
            app_config("drop-b", "debug", "11"),
        )],
    );
    wait_for("b's watch closed", LIMIT, || {
        api.open_watches(&b) == 0 && api.pending_items(&b) == 0
    });
    let b_calls = api.calls_for(&b).len();

    rig.set_pods(&[&pa, &pod("pc", &["later-c"], &[])]);
    wait_for("c cached", LIMIT, || rig.level("later-c").is_some());
    assert_eq!(api.calls_for(&b).len(), b_calls, "b was fetched again");
    assert!(rig.level("drop-b").is_none());
    assert_eq!(rig.level("keep-a").as_deref(), Some("info"));
    assert_eq!(api.open_watches(&a), 1);
    // Removal for lack of reference is not a change anyone needs to hear about.
    assert_eq!(rig.changes().iter().filter(|k| **k == b).count(), 1);
}

#[test]
fn an_object_referenced_again_while_its_watch_winds_down_is_listed_again() {
    let api = FakeApi::new(LIMIT * 3);
    let b = cm_key("again-b");
    api.lists(
        &b,
        vec![Ok(list_of(
            "ConfigMap",
            "10",
            vec![app_config("again-b", "info", "5")],
        ))],
    );
    let rig = Rig::start(&api, options());
    let p = pod("pb", &["again-b"], &[]);
    rig.set_pods(&[&p]);
    wait_for("b watched", LIMIT, || api.open_watches(&b) == 1);
    rig.set_pods(&[]);
    wait_for("b gone from the store", LIMIT, || {
        rig.level("again-b").is_none()
    });
    api.lists(
        &b,
        vec![Ok(list_of(
            "ConfigMap",
            "20",
            vec![app_config("again-b", "warn", "15")],
        ))],
    );
    rig.set_pods(&[&p]);
    wait_for("b back in the store", LIMIT, || {
        rig.level("again-b").as_deref() == Some("warn")
    });
    assert_eq!(api.open_watches(&b), 1, "one watch, not a second thread");
}

#[test]
fn offline_keeps_the_cache_as_it_was() {
    let api = idle_api();
    let cm = cm_key("offline-config");
    let secret = secret_key("offline-secret");
    api.lists(&cm, vec![Err(Fail::Offline)]);
    api.lists(&secret, vec![Err(Fail::Offline)]);
    let before = |cache: &ObjectCache| {
        let old: ConfigMap =
            serde_json::from_value(app_config("offline-config", "info", "1")).expect("cm");
        cache.apply(&cm, Some(&old)).expect("seed");
        let old: k8s_openapi::api::core::v1::Secret =
            serde_json::from_value(app_secret("offline-secret", "b2xk")).expect("secret");
        cache.apply(&secret, Some(&old)).expect("seed");
    };
    let mut rig = Rig::start_with(&api, options(), before);
    rig.set_pods(&[&pod("p", &["offline-config"], &["offline-secret"])]);
    wait_for("several attempts", LIMIT, || {
        rig.lists(&cm) >= 4 && rig.lists(&secret) >= 4
    });
    assert_eq!(rig.level("offline-config").as_deref(), Some("info"));
    let s = rig
        .cache
        .secret("default", "offline-secret")
        .expect("read")
        .expect("kept");
    assert_eq!(
        s.data.expect("data").get("password").expect("password").0,
        b"old"
    );
    assert!(rig.changes().is_empty());
    assert!(api
        .calls_for(&cm)
        .iter()
        .all(|c| matches!(c, Call::List(_))));
}

#[test]
fn beyond_the_watch_cap_objects_are_polled_and_promoted_when_a_slot_frees() {
    let api = idle_api();
    let (a, b) = (cm_key("cap-a"), cm_key("cap-b"));
    api.lists(
        &a,
        vec![Ok(list_of(
            "ConfigMap",
            "10",
            vec![app_config("cap-a", "info", "5")],
        ))],
    );
    api.lists(
        &b,
        vec![Ok(list_of(
            "ConfigMap",
            "10",
            vec![app_config("cap-b", "info", "5")],
        ))],
    );
    let mut rig = Rig::start(
        &api,
        ObjectManagerOptions {
            max_watches: 1,
            ..options()
        },
    );
    let (pa, pb) = (pod("pa", &["cap-a"], &[]), pod("pb", &["cap-b"], &[]));
    rig.set_pods(&[&pa, &pb]);
    wait_for("both cached", LIMIT, || {
        rig.level("cap-a").is_some() && rig.level("cap-b").is_some()
    });
    wait_for("b polled", LIMIT, || rig.lists(&b) >= 3);
    assert!(!api
        .calls_for(&b)
        .iter()
        .any(|c| matches!(c, Call::Watch(..))));

    // A change to the polled object is picked up by the next poll.
    api.lists(
        &b,
        vec![Ok(list_of(
            "ConfigMap",
            "30",
            vec![app_config("cap-b", "debug", "25")],
        ))],
    );
    wait_for("b's change", LIMIT, || {
        rig.level("cap-b").as_deref() == Some("debug")
    });
    wait_for("b's change reported", LIMIT, || {
        rig.changes().iter().filter(|k| **k == b).count() == 2
    });

    // a no longer referenced: its thread ends and b gets it.
    rig.set_pods(&[&pb]);
    wait_for("b watched", LIMIT, || rig.watched_from(&b, "30"));
    assert_eq!(api.max_open_watches(), 1);
}

#[test]
fn invalid_names_are_not_fetched() {
    let api = idle_api();
    let good = cm_key("good");
    api.lists(
        &good,
        vec![Ok(list_of(
            "ConfigMap",
            "10",
            vec![app_config("good", "info", "5")],
        ))],
    );
    let rig = Rig::start(&api, options());
    rig.set_pods(&[&pod("p", &["good", "x&watch=false", "../up"], &[])]);
    wait_for("good cached", LIMIT, || rig.level("good").is_some());
    for call in api.calls() {
        let (Call::List(k) | Call::Watch(k, _)) = call;
        assert!(
            k.name != "x&watch=false" && k.name != "../up",
            "fetched {k}"
        );
    }
}

#[test]
fn dropping_the_sender_stops_the_manager_and_its_watches() {
    let api = idle_api();
    let cm = cm_key("stop-config");
    api.lists(
        &cm,
        vec![Ok(list_of(
            "ConfigMap",
            "10",
            vec![app_config("stop-config", "info", "5")],
        ))],
    );
    let mut rig = Rig::start(&api, options());
    rig.set_pods(&[&pod("p", &["stop-config"], &[])]);
    wait_for("watched", LIMIT, || api.open_watches(&cm) == 1);
    rig.pods.take();
    let handle = rig.handle.take().expect("handle");
    wait_for("the manager to stop", LIMIT, || handle.is_finished());
    handle.join().expect("join");
    // The idle watch ends on its own (the fake's server-side timeout) and is not renewed.
    wait_for("the watch to stop", LIMIT, || api.open_watches(&cm) == 0);
    // The store keeps what it had.
    assert_eq!(rig.level("stop-config").as_deref(), Some("info"));
}
