//! Following single objects, through the manager, against a scripted apiserver: LIST,
//! WATCH, bookmarks, drops, 403, 410, and what reaches the log.

use serde_json::json;

use super::super::rig::*;
use super::super::testing::{list_of, logs, wait_for, Call, Fail, Item};

#[test]
fn referenced_objects_are_listed_cached_reported_then_watched_from_the_list_rv() {
    let api = idle_api();
    let cm = cm_key("app-config");
    let secret = secret_key("app-secret");
    api.lists(
        &cm,
        vec![Ok(list_of(
            "ConfigMap",
            "273",
            vec![app_config("app-config", "info", "220")],
        ))],
    );
    api.lists(
        &secret,
        vec![Ok(list_of(
            "Secret",
            "273",
            vec![app_secret("app-secret", "czNjcjN0LWZvci1maXh0dXJlcw==")],
        ))],
    );
    let mut rig = Rig::start(&api, options());
    rig.set_pods(&[&pod("app-with-refs", &["app-config"], &["app-secret"])]);

    wait_for("both reported", LIMIT, || {
        let c = rig.changes();
        c.contains(&cm) && c.contains(&secret)
    });
    assert_eq!(rig.level("app-config").as_deref(), Some("info"));
    let s = rig
        .cache
        .secret("default", "app-secret")
        .expect("read")
        .expect("cached");
    let password = s
        .data
        .expect("data")
        .get("password")
        .cloned()
        .expect("password");
    assert_eq!(password.0, b"s3cr3t-for-fixtures");
    wait_for("a watch from the list rv", LIMIT, || {
        rig.watched_from(&cm, "273")
    });
    assert_eq!(api.calls_for(&cm)[0], Call::List(cm.clone()));
    // Idle watches end with a bookmark and are resumed from it, never relisted.
    wait_for("a few watches", LIMIT, || api.calls_for(&cm).len() >= 4);
    assert_eq!(rig.lists(&cm), 1);
}

#[test]
fn a_change_through_the_watch_is_stored_and_reported_and_the_watch_resumes() {
    let api = idle_api();
    let cm = cm_key("watched-config");
    api.lists(
        &cm,
        vec![Ok(list_of(
            "ConfigMap",
            "273",
            vec![app_config("watched-config", "info", "220")],
        ))],
    );
    let mut rig = Rig::start(&api, options());
    rig.set_pods(&[&pod("p", &["watched-config"], &[])]);
    wait_for("first report", LIMIT, || rig.changes().len() == 1);

    // Fixture 45: MODIFIED at 274, then bookmarks at 275.
    api.push(
        &cm,
        vec![
            event(
                "ConfigMap",
                "MODIFIED",
                app_config("watched-config", "debug", "274"),
            ),
            bookmark("275"),
        ],
    );
    wait_for("the change stored", LIMIT, || {
        rig.level("watched-config").as_deref() == Some("debug")
    });
    wait_for("the change reported", LIMIT, || {
        rig.changes() == vec![cm.clone(), cm.clone()]
    });
    wait_for("a watch from the bookmark", LIMIT, || {
        rig.watched_from(&cm, "275")
    });

    // A dropped connection resumes from the last rv too; a bookmark alone stores nothing.
    api.push(&cm, vec![bookmark("280"), Item::Drop]);
    wait_for("a watch from after the drop", LIMIT, || {
        rig.watched_from(&cm, "280")
    });
    assert_eq!(rig.lists(&cm), 1);
    assert_eq!(rig.changes().len(), 2);

    // Deleted in the cluster: gone from the store, and reported.
    api.push(
        &cm,
        vec![event(
            "ConfigMap",
            "DELETED",
            app_config("watched-config", "debug", "290"),
        )],
    );
    wait_for("the deletion", LIMIT, || {
        rig.level("watched-config").is_none()
    });
    wait_for("the deletion reported", LIMIT, || rig.changes().len() == 3);
}

#[test]
fn gone_relists_once_and_watches_from_the_new_list() {
    let api = idle_api();
    let cm = cm_key("gone-config");
    api.lists(
        &cm,
        vec![
            Ok(list_of(
                "ConfigMap",
                "100",
                vec![app_config("gone-config", "info", "90")],
            )),
            Ok(list_of(
                "ConfigMap",
                "400",
                vec![app_config("gone-config", "warn", "390")],
            )),
        ],
    );
    let rig = Rig::start(&api, options());
    rig.set_pods(&[&pod("p", &["gone-config"], &[])]);
    wait_for("the first watch", LIMIT, || rig.watched_from(&cm, "100"));
    // Fixture 62: a 410 delivered as an ERROR event.
    api.push(
        &cm,
        vec![Item::Event(
            json!({"type": "ERROR", "object": {"kind": "Status", "apiVersion": "v1",
            "metadata": {}, "status": "Failure", "message": "too old resource version: 1 (326)",
            "reason": "Expired", "code": 410}}),
        )],
    );
    wait_for("a watch from the relist", LIMIT, || {
        rig.watched_from(&cm, "400")
    });
    assert_eq!(rig.lists(&cm), 2);
    assert_eq!(rig.level("gone-config").as_deref(), Some("warn"));

    // A 410 answer to the watch request relists too; a second one straight after the
    // relist is a failure (backed off and logged), and relists again.
    api.watch_opens(&cm, vec![Fail::Gone, Fail::Gone]);
    wait_for("two more lists", LIMIT, || rig.lists(&cm) == 4);
    wait_for("watching again", LIMIT, || {
        api.calls_for(&cm).last() == Some(&Call::Watch(cm.clone(), "400".into()))
    });
    let warned = logs()
        .into_iter()
        .filter(|l| l.starts_with("WARN") && l.contains("configmap default/gone-config"))
        .collect::<Vec<_>>();
    assert_eq!(warned.len(), 1, "{warned:#?}");
    assert!(warned[0].contains("expired at once"), "{warned:#?}");
}

#[test]
fn a_watch_that_cannot_open_is_retried_from_the_same_rv() {
    let api = idle_api();
    let cm = cm_key("retry-config");
    api.lists(
        &cm,
        vec![Ok(list_of(
            "ConfigMap",
            "50",
            vec![app_config("retry-config", "info", "40")],
        ))],
    );
    api.watch_opens(&cm, vec![Fail::Offline, Fail::Offline, Fail::Forbidden]);
    let rig = Rig::start(&api, options());
    rig.set_pods(&[&pod("p", &["retry-config"], &[])]);
    wait_for("five watch attempts", LIMIT, || {
        api.calls_for(&cm)
            .iter()
            .filter(|c| matches!(c, Call::Watch(..)))
            .count()
            >= 5
    });
    assert_eq!(rig.lists(&cm), 1);
    for c in api.calls_for(&cm).into_iter().skip(1) {
        assert_eq!(c, Call::Watch(cm.clone(), "50".into()));
    }
}

#[test]
fn forbidden_until_the_pod_is_bound_is_retried_and_logged_once() {
    let api = idle_api();
    let cm = cm_key("bound-later-config");
    // Fixture 21 three times, then fixture 44's answer once the pod exists.
    api.lists(
        &cm,
        vec![
            Err(Fail::Forbidden),
            Err(Fail::Forbidden),
            Err(Fail::Forbidden),
            Ok(list_of(
                "ConfigMap",
                "273",
                vec![app_config("bound-later-config", "info", "220")],
            )),
        ],
    );
    let mut rig = Rig::start(&api, options());
    rig.set_pods(&[&pod("p", &["bound-later-config"], &[])]);
    wait_for("the object cached", LIMIT, || {
        rig.level("bound-later-config").is_some()
    });
    wait_for("the report", LIMIT, || rig.changes() == vec![cm.clone()]);
    assert_eq!(rig.lists(&cm), 4);
    let about: Vec<String> = logs()
        .into_iter()
        .filter(|l| l.contains("configmap default/bound-later-config"))
        .collect();
    let warned = about
        .iter()
        .filter(|l| l.starts_with("WARN") && l.contains("Node authorizer"))
        .count();
    assert_eq!(warned, 1, "{about:#?}");
    assert!(
        about
            .iter()
            .any(|l| l.starts_with("INFO") && l.contains("after 3 failure(s)")),
        "{about:#?}"
    );
}

#[test]
fn immutable_objects_are_not_watched() {
    let api = idle_api();
    let (frozen, live) = (cm_key("frozen"), cm_key("live"));
    let mut object = app_config("frozen", "info", "5");
    object["immutable"] = json!(true);
    api.lists(&frozen, vec![Ok(list_of("ConfigMap", "10", vec![object]))]);
    api.lists(
        &live,
        vec![Ok(list_of(
            "ConfigMap",
            "10",
            vec![app_config("live", "info", "5")],
        ))],
    );
    let rig = Rig::start(&api, options());
    rig.set_pods(&[&pod("p", &["frozen", "live"], &[])]);
    wait_for("frozen cached", LIMIT, || rig.level("frozen").is_some());
    wait_for("live watched a few times", LIMIT, || {
        api.calls_for(&live).len() >= 4
    });
    assert_eq!(api.calls_for(&frozen), vec![Call::List(frozen.clone())]);
}

#[test]
fn secret_data_never_reaches_the_log() {
    let api = idle_api();
    let key = secret_key("logged-secret");
    // The first answer does not decode, and the decoder's words quote the bad value.
    let mut broken = app_secret("logged-secret", "czNjcjN0");
    broken["data"] = json!("plain-leak-canary");
    let words = serde_json::from_value::<k8s_openapi::api::core::v1::Secret>(broken.clone())
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default();
    assert!(
        words.contains("plain-leak-canary"),
        "the decoder no longer quotes: {words}"
    );
    api.lists(
        &key,
        vec![
            Ok(list_of("Secret", "10", vec![broken])),
            // base64 of "first-canary-value"
            Ok(list_of(
                "Secret",
                "10",
                vec![app_secret("logged-secret", "Zmlyc3QtY2FuYXJ5LXZhbHVl")],
            )),
        ],
    );
    let mut rig = Rig::start(&api, options());
    rig.set_pods(&[&pod("p", &[], &["logged-secret"])]);
    wait_for("stored", LIMIT, || rig.changes().len() == 1);
    // base64 of "second-canary-value"
    let modified = app_secret("logged-secret", "c2Vjb25kLWNhbmFyeS12YWx1ZQ==");
    api.push(
        &key,
        vec![
            event("Secret", "MODIFIED", modified.clone()),
            event("Secret", "DELETED", modified),
        ],
    );
    wait_for("modified and deleted", LIMIT, || rig.changes().len() == 3);
    assert!(rig
        .cache
        .secret("default", "logged-secret")
        .expect("read")
        .is_none());

    let lines = logs();
    let about: Vec<&String> = lines
        .iter()
        .filter(|l| l.contains("secret default/logged-secret"))
        .collect();
    assert!(about.iter().any(|l| l.contains("stored")), "{about:#?}");
    assert!(
        about.iter().any(|l| l.contains("details withheld")),
        "{about:#?}"
    );
    for needle in [
        "plain-leak-canary",
        "first-canary-value",
        "Zmlyc3QtY2FuYXJ5LXZhbHVl",
        "second-canary-value",
        "c2Vjb25kLWNhbmFyeS12YWx1ZQ",
        "dG9rZW4tdmFsdWU",
        "token-value",
    ] {
        assert!(
            !lines.iter().any(|l| l.contains(needle)),
            "{needle} was logged"
        );
    }
}
