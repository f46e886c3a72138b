//! Static pods from `staticPodURL`, end to end: a real agent, real containers, and a
//! plain HTTP server on 127.0.0.1 the test runs, serving the manifest and recording the
//! requests. The pods follow the server's answer, keep running while it is away (the
//! agent restarted meanwhile runs them from its store), and an absurd answer leaves
//! them as they were, with the reason in the log.

use std::time::Duration;

use serde_json::Value;
use support::agent::{container, need_root, sh_pod, Agent};
use support::http_server::HttpServer;

const MIN: Duration = Duration::from_secs(60);
/// Pods stop at once when replaced or removed: sleep ignores SIGTERM.
const GRACE: &str = "  terminationGracePeriodSeconds: 0\n";
const TOKEN: &str = "Bearer t0ken-for-the-manifest-server";

fn running_with(p: &Value, marker: &str) -> bool {
    container(p, "main")["state"]["running"].is_object()
        && p["pod"]["spec"]["containers"][0]["command"]
            .to_string()
            .contains(marker)
}

fn uid(p: &Value) -> String {
    p["pod"]["metadata"]["uid"]
        .as_str()
        .unwrap_or("")
        .to_string()
}

/// The log says `what` (one more time than it did when `before` was taken).
fn wait_log(a: &Agent, what: &str, before: usize) {
    a.wait_until(&format!("the log to say {what:?}"), MIN, |a| {
        a.agent_log().matches(what).count() > before
    });
}

#[test]
fn pods_follow_the_url_and_outlive_its_server() {
    if !need_root() {
        return;
    }
    let server = HttpServer::start();
    let port = server.addr.port();
    server.answer(
        200,
        sh_pod("web", GRACE, "main", "exec sleep 1000 # v1", ""),
    );
    let mut a = Agent::new("source-http");
    a.write_config(&format!(
        "staticPodURL: {}\nstaticPodURLHeader:\n  Authorization: ['{TOKEN}']\nhttpCheckFrequency: 1s\n",
        server.url("/node-1/pods.yaml")
    ));
    a.start();

    let p = a.wait_pod("web", "running from the URL", MIN, |p| {
        running_with(p, "v1")
    });
    let ann = &p["pod"]["metadata"]["annotations"];
    assert_eq!(ann["kubernetes.io/config.source"], "http");
    assert_eq!(ann["kubernetes.io/config.hash"], uid(&p).as_str());
    let heads = server.heads();
    assert!(!heads.is_empty());
    for head in &heads {
        assert_eq!(head.path, "/node-1/pods.yaml");
        assert_eq!(head.header("authorization"), Some(TOKEN));
    }
    assert!(
        !a.agent_log().contains("t0ken"),
        "the header's value is in the log"
    );

    // A new manifest, as a list: the pod follows it.
    let v2 = sh_pod("web", GRACE, "main", "exec sleep 1000 # v2", "");
    server.answer(
        200,
        format!(
            "{{\"apiVersion\": \"v1\", \"kind\": \"PodList\", \"items\": [{}]}}",
            yaml_to_json(&v2)
        ),
    );
    let p = a.wait_pod("web", "running the new manifest", MIN, |p| {
        running_with(p, "v2")
    });
    let kept = uid(&p);

    // Absurd answers: each said in the log, the pod left as it is.
    let bad_name = sh_pod("Bad_Name", "", "main", "exec sleep 1000", "");
    for (status, body, said) in [
        (
            200,
            "#".repeat(2 << 20),
            "larger than the 1048576 bytes allowed",
        ),
        (
            200,
            format!("{}{}", "[".repeat(500), "]".repeat(500)),
            "nested deeper than 64 levels",
        ),
        (200, bad_name, "answer refused: invalid pod: metadata.name"),
        (503, String::new(), "answered 503"),
    ] {
        let before = a.agent_log().matches(said).count();
        server.answer(status, body);
        wait_log(&a, said, before);
        let p = a.pod("web").expect("web kept");
        assert_eq!(uid(&p), kept);
        assert!(running_with(&p, "v2"), "{p}");
    }
    // The server goes away: the pod keeps running, and keeps running from the store
    // when the agent is restarted meanwhile.
    let kept_said = "keeping the 1 pod(s) it gave before";
    let before = a.agent_log().matches(kept_said).count();
    drop(server);
    wait_log(&a, kept_said, before);
    a.stop();
    let restarted_at = a.agent_log().len();
    a.start();
    let p = a.wait_pod("web", "running from the store", MIN, |p| {
        running_with(p, "v2")
    });
    assert_eq!(uid(&p), kept);
    a.wait_until("the restarted agent to fail to reach the URL", MIN, |a| {
        a.agent_log()[restarted_at..].contains(kept_said)
    });

    // Back, with an empty answer: no pods.
    let server = HttpServer::start_on(port);
    server.answer(200, "");
    a.wait_gone("web", MIN);
    assert!(!server.heads().is_empty());
    a.stop();
    a.reset();
    a.assert_clean();
}

/// The pod as JSON: the URL may answer in either.
fn yaml_to_json(yaml: &str) -> String {
    let v: Value = serde_yaml::from_str(yaml).expect("test pod yaml");
    v.to_string()
}
