//! What the offline tests share: the double, the proxy and the agent wired together,
//! pods to run, and the checks on what the cluster was told.

#![allow(dead_code)]

use std::collections::BTreeSet;
use std::time::Duration;

pub use crate::agent::pid_alive;
use crate::agent::{container, Agent};
use crate::apiserver::{ApiServerDouble, Identity, KubeconfigOptions, Options};
use crate::proxy::{Mode, Proxy};
use k8s_openapi::api::core::v1::{ContainerStatus, Pod};
use k8s_openapi::jiff::Timestamp;
use serde_json::Value;

pub const NODE: &str = "edge-node-1";
pub const WAIT: Duration = Duration::from_secs(60);
/// How long the link stays down once the outage's events have happened: several node
/// status periods (1 s), lease renewals and crash-loop back-offs of the test config.
pub const OUTAGE: Duration = Duration::from_secs(4);

/// Runs forever; exits 3 once `/tmp/crash` appears in its own root (a new container
/// after a restart has a fresh `/tmp`, so it runs on).
pub const CRASH_ON_SIGNAL: &str = "while [ ! -e /tmp/crash ]; do sleep 0.1; done; exit 3";
pub const RUN_FOREVER: &str = "exec sleep 100000";

pub fn double() -> ApiServerDouble {
    crate::apiserver::start(Options {
        bookmark_interval: Duration::from_secs(1),
        ..Options::default()
    })
}

/// An agent that is node `NODE`, reaching the double only through `proxy`, with short
/// node intervals.
pub fn agent(name: &str, api: &ApiServerDouble, proxy: &Proxy) -> Agent {
    let mut a = Agent::new(name);
    a.node_name = NODE.into();
    a.write_config("nodeStatusUpdateFrequency: 1s\nnodeStatusReportFrequency: 3s\n");
    let kubeconfig = api.kubeconfig_with(
        &a.dir,
        Identity::Node(NODE),
        &KubeconfigOptions {
            server: Some(proxy.url()),
            ..KubeconfigOptions::default()
        },
    );
    a.extra_args = vec!["--kubeconfig".into(), kubeconfig.display().to_string()];
    a
}

/// A pod bound to `NODE` running `script` in one container `main`.
pub fn bound_pod(name: &str, script: &str) -> Pod {
    crate::apiserver::bound_pod(NODE, name, &["sh", "-c", script], 1)
}

pub fn static_pod_yaml(name: &str, script: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: {name}\nspec:\n  hostNetwork: true\n  \
         terminationGracePeriodSeconds: 1\n  containers:\n    - name: main\n      \
         image: busybox:demo\n      command: [\"sh\", \"-c\", {}]\n",
        serde_json::to_string(script).expect("json string")
    )
}

pub fn fail(what: &str, api: &ApiServerDouble, a: &Agent) -> ! {
    panic!(
        "timed out waiting for {what}\n--- last requests (newest first) ---\n{}\n\
         --- pods ---\n{}\n--- agent log ---\n{}",
        api.recent_requests(40),
        a.pods_table(),
        a.agent_log()
    )
}

pub fn wait(
    api: &ApiServerDouble,
    a: &Agent,
    what: &str,
    cond: impl FnMut(&ApiServerDouble) -> bool,
) {
    if !api.wait_for(WAIT, cond) {
        fail(what, api, a);
    }
}

/// The one container's status as the cluster has it.
pub fn cluster_container(api: &ApiServerDouble, name: &str) -> Option<ContainerStatus> {
    api.get_pod("default", name)?
        .status?
        .container_statuses?
        .into_iter()
        .next()
}

/// The pod runs in the cluster's eyes: phase Running, its container running and ready.
pub fn running_in_cluster(api: &ApiServerDouble, name: &str) -> bool {
    let phase = api
        .get_pod("default", name)
        .and_then(|p| p.status)
        .and_then(|s| s.phase);
    phase.as_deref() == Some("Running")
        && cluster_container(api, name)
            .is_some_and(|c| c.ready && c.state.is_some_and(|s| s.running.is_some()))
}

/// The pod's container runs locally (`holdfast pods`).
pub fn running_here(p: &Value) -> bool {
    container(p, "main")["state"]["running"].is_object()
}

pub fn container_id(p: &Value) -> String {
    container(p, "main")["containerID"]
        .as_str()
        .unwrap_or_default()
        .to_string()
}

pub fn restart_count(p: &Value) -> i64 {
    container(p, "main")["restartCount"].as_i64().unwrap_or(-1)
}

/// The pid of a pod's container `main`, from the runtime's record of it.
pub fn container_pid(a: &Agent, p: &Value) -> i32 {
    crate::agent::container_pid(a, p, "main")
}

/// When a crash happened, as the test saw it: between the signal and the exit seen.
#[derive(Debug, Clone, Copy)]
pub struct Window {
    pub from: Timestamp,
    pub to: Timestamp,
}

/// Makes the pod's container (running `CRASH_ON_SIGNAL`) exit 3; returns when it did.
pub fn crash(a: &Agent, p: &Value) -> Window {
    let pid = container_pid(a, p);
    let from = Timestamp::now();
    std::fs::write(format!("/proc/{pid}/root/tmp/crash"), b"").expect("signal the container");
    a.wait_until("the container to exit", WAIT, |_| !pid_alive(pid));
    Window {
        from,
        to: Timestamp::now(),
    }
}

/// Requests that reached the double from index `from` of its log on: `method` on `path`.
pub fn count(api: &ApiServerDouble, from: usize, method: &str, path: &str) -> usize {
    api.request_log()
        .iter()
        .skip(from)
        .filter(|l| l.method == method && l.path == path)
        .count()
}

pub fn status_path(name: &str) -> String {
    format!("/api/v1/namespaces/default/pods/{name}/status")
}

/// LISTs (not watches) of the node's pods so far.
pub fn pod_lists(api: &ApiServerDouble) -> usize {
    api.request_log()
        .iter()
        .filter(|l| {
            l.method == "GET" && l.path == "/api/v1/pods" && !l.query.contains("watch=true")
        })
        .count()
}

/// Waits until the node's Lease has been renewed `n` more times: the uplink is up and
/// has had time for everything it does on reconnect.
pub fn wait_lease_renewals(api: &ApiServerDouble, a: &Agent, n: usize) {
    let renew = |api: &ApiServerDouble| {
        api.get_lease(NODE)
            .and_then(|l| l.spec)
            .and_then(|s| s.renew_time)
            .map(|t| t.0)
    };
    for i in 0..n {
        let before = renew(api);
        wait(api, a, &format!("lease renewal {} of {n}", i + 1), |api| {
            renew(api).is_some_and(|t| Some(t) > before)
        });
    }
}

pub fn time(t: &k8s_openapi::apimachinery::pkg::apis::meta::v1::Time) -> Timestamp {
    t.0
}

/// A time the agent reported, checked against when the test saw the thing happen.
/// Kubernetes times have whole seconds: the reported second is within the window's.
pub fn assert_within(what: &str, reported: Timestamp, seen: Window) {
    let r = reported.as_second();
    assert!(
        r >= seen.from.as_second() && r <= seen.to.as_second(),
        "{what}: reported {reported}, happened between {} and {}",
        seen.from,
        seen.to
    );
}

pub use crate::agent::power_cut;

/// Names of the pods `holdfast pods` shows.
pub fn local_pods(a: &Agent) -> BTreeSet<String> {
    a.pods()
        .iter()
        .filter_map(|p| p["pod"]["metadata"]["name"].as_str().map(str::to_string))
        .collect()
}

/// The test's world: the double, the link, the agent (dropped first: killed and reset).
pub struct Site {
    pub a: Agent,
    pub link: Proxy,
    pub api: ApiServerDouble,
}

impl Site {
    pub fn new(name: &str) -> Site {
        let api = double();
        let link = Proxy::start(api.addr());
        let a = agent(name, &api, &link);
        Site { a, link, api }
    }

    /// Creates bound pods and waits until the cluster sees each of them running.
    pub fn run_bound(&self, pods: &[(&str, &str)]) {
        for (name, script) in pods {
            self.api.create_pod(bound_pod(name, script));
        }
        for (name, _) in pods {
            wait(&self.api, &self.a, &format!("pod {name} Running"), |api| {
                running_in_cluster(api, name)
            });
        }
    }

    /// Cuts the link; returns the double's log length, from which nothing more arrives.
    pub fn cut(&self) -> usize {
        self.link.set_mode(Mode::Blackhole);
        self.api.request_log().len()
    }

    /// Asserts that nothing reached the double since `from` (the link is really down).
    pub fn assert_silent(&self, from: usize) {
        let log = self.api.request_log();
        assert_eq!(
            log.len(),
            from,
            "requests reached the double through a cut link:\n{}",
            self.api.recent_requests(log.len() - from)
        );
    }

    pub fn finish(mut self) {
        self.a.stop();
        self.a.reset();
        self.a.assert_clean();
    }
}

/// What the cluster must show of a container that crashed offline: the restarts, the
/// exit code and time of the last crash (before `up_at`: the reconnect, or the agent's
/// return), the running container's start (after that crash, before the test saw it
/// run) and its ID.
pub struct Crashed<'a> {
    pub name: &'a str,
    pub restarts: i32,
    pub crashed_at: Window,
    pub running_by: Timestamp,
    pub up_at: Timestamp,
    pub here: &'a Value,
}

pub fn assert_reported(api: &ApiServerDouble, c: &Crashed) {
    let name = c.name;
    let cs = cluster_container(api, name).unwrap_or_else(|| panic!("{name}: no status"));
    assert_eq!(cs.restart_count, c.restarts, "{name}: restartCount");
    let last = cs
        .last_state
        .and_then(|s| s.terminated)
        .unwrap_or_else(|| panic!("{name}: no lastState.terminated"));
    assert_eq!(last.exit_code, 3, "{name}");
    let finished = time(last.finished_at.as_ref().expect("finishedAt"));
    assert_within(
        &format!("{name}: lastState finishedAt"),
        finished,
        c.crashed_at,
    );
    assert!(
        finished < c.up_at,
        "{name}: finishedAt {finished} is before reconnect {}",
        c.up_at
    );
    let started = time(
        cs.state
            .and_then(|s| s.running)
            .and_then(|r| r.started_at)
            .as_ref()
            .expect("running startedAt"),
    );
    assert!(
        started.as_second() >= finished.as_second() && started <= c.running_by,
        "{name}: startedAt {started}: after the crash ({finished}), before the test saw it run ({})",
        c.running_by
    );
    assert_eq!(
        cs.container_id,
        Some(container_id(c.here)),
        "{name}: the container the cluster sees is the one running here"
    );
}
