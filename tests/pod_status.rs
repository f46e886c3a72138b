//! A pod status the apiserver refuses: said in the agent's log with the apiserver's
//! message, then sent whole (PUT of `/status`) so the API converges. Against the
//! kube-apiserver double: only the double can refuse one chosen request on demand.

use support::apiserver;

use std::time::Duration;

use apiserver::{ApiServerDouble, Fault, Identity, Matcher, Options};
use support::agent::{need_root, Agent};

const NODE: &str = "edge-node-1";
const WAIT: Duration = Duration::from_secs(60);

fn double() -> ApiServerDouble {
    apiserver::start(Options {
        bookmark_interval: Duration::from_secs(1),
        ..Options::default()
    })
}

fn agent(name: &str, api: &ApiServerDouble) -> Agent {
    let mut a = Agent::new(name);
    a.node_name = NODE.into();
    a.write_config("nodeStatusUpdateFrequency: 1s\nnodeStatusReportFrequency: 3s\n");
    let kubeconfig = api.kubeconfig(&a.dir, Identity::Node(NODE));
    a.extra_args = vec!["--kubeconfig".into(), kubeconfig.display().to_string()];
    a
}

fn wait(api: &ApiServerDouble, a: &Agent, what: &str, cond: impl FnMut(&ApiServerDouble) -> bool) {
    if !api.wait_for(WAIT, cond) {
        panic!(
            "timed out waiting for {what}\n--- last requests (newest first) ---\n{}\n--- agent log ---\n{}",
            api.recent_requests(40),
            a.agent_log()
        );
    }
}

#[test]
fn a_refused_status_patch_is_said_and_the_status_sent_whole() {
    if !need_root() {
        return;
    }
    let api = double();
    let mut a = agent("status-refused", &api);
    let path = "/api/v1/namespaces/default/pods/web/status";
    // Every patch of this pod's status is refused three times over.
    api.fail_times(Matcher::new("PATCH", path), Fault::Status(422), 3);
    a.start();
    let script = "echo started; while true; do sleep 0.2; done";
    api.create_pod(apiserver::bound_pod(NODE, "web", &["sh", "-c", script], 5));
    wait(&api, &a, "pod web Running", |api| {
        api.get_pod("default", "web")
            .and_then(|p| p.status)
            .and_then(|s| s.phase)
            .as_deref()
            == Some("Running")
    });
    wait(&api, &a, "the whole status PUT", |api| {
        api.request_log()
            .iter()
            .any(|l| l.method == "PUT" && l.path == path && l.code == 200)
    });
    let log = a.agent_log();
    assert!(
        log.contains("status patch refused") && log.contains("injected failure (422)"),
        "the refusal is said with the apiserver's message:\n{log}"
    );

    // A pod deleted in the cluster still goes for good after the refusals.
    api.delete_pod("default", "web", None);
    wait(&api, &a, "pod web gone from the API", |api| {
        api.get_pod("default", "web").is_none()
    });
    a.stop();
}
