//! Reconnecting after an outage, against the kube-apiserver double (tests/support/apiserver):
//! `cargo bench --bench reconnect`. No containers and no root: the uplink's own pieces
//! (node controller, pod-status thread, api pod source, sharing one `Link`) run in this
//! process, and a fake sync side hands statuses to the outbox as pod workers would.
//!
//! - (a) One node with 100 bound pods whose status changed during an outage (every
//!   request dropped for `HOLDFAST_BENCH_OUTAGE_SECS`, default 20 s, watches cut): time
//!   from the apiserver answering again to the lease renewed, and to every pod's status
//!   in the cluster; the requests it took, by kind (expected: one PATCH per pod).
//! - (b) A fleet of `HOLDFAST_BENCH_FLEET` (default 200) uplink client instances (node
//!   controller and pod-status thread each, one pending status each) through the same
//!   outage, reconnecting to one double at the same moment: peak (per second) and mean
//!   request rate over the first minute, with a random probe phase and without (every
//!   instance probes at the end of the whole period, all at one moment).
//!
//! Prints a table and writes `target/bench/reconnect.json`.

mod common;

use support::apiserver;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use apiserver::{ApiServerDouble, Fault, Identity, Logged, Matcher, Options};
use holdfast::backoff::Backoff;
use holdfast::kube::link::{Link, Stage};
use holdfast::kube::Client;
use holdfast::source::{spawn_api_source, ApiSourceOptions, ApiSourceResume, SourceSnapshot};
use holdfast::time::Timestamp;
use holdfast::uplink::node::{new_node_uid, NodeController, NodeModel, Timing};
use holdfast::uplink::pods::{MirrorSet, PodUplink};
use holdfast::uplink::Reporter;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{
    Container, ContainerState, ContainerStateRunning, ContainerStateTerminated, ContainerStatus,
    Node, NodeCondition, NodeStatus, Pod, PodSpec, PodStatus,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use serde_json::{json, Value};

const PODS: usize = 100;
const WAIT: Duration = Duration::from_secs(120);
/// The kubelet's and holdfast's defaults.
const RENEW: Duration = Duration::from_secs(10);
const RETRY_INITIAL: Duration = Duration::from_millis(800);
/// `uplinkRetryMax`: only a value under `RENEW` shortens the probe period.
const RETRY_MAX: Duration = Duration::from_secs(300);
const WINDOW: Duration = Duration::from_secs(60);

fn main() {
    let outage = Duration::from_secs(common::env_secs("HOLDFAST_BENCH_OUTAGE_SECS", 20));
    let fleet = common::env_secs("HOLDFAST_BENCH_FLEET", 200) as usize;

    eprintln!("(a) one node, {PODS} pods, {}s outage", outage.as_secs());
    let a = convergence(outage);
    eprintln!("(b) {fleet} uplinks with jitter");
    let jittered = fleet_run(fleet, outage, true);
    eprintln!("(b) {fleet} uplinks without jitter");
    let unjittered = fleet_run(fleet, outage, false);

    println!();
    println!("reconnect after a {}s outage", outage.as_secs());
    println!("{:<58} {:>12}", "measure", "value");
    let row = |k: &str, v: String| println!("{k:<58} {v:>12}");
    row(
        "(a) apiserver back → lease renewed",
        format!("{:.2} s", a.to_lease.as_secs_f64()),
    );
    row(
        "(a) lease renewed → 100 pod statuses in the cluster",
        format!("{:.2} s", a.lease_to_converged.as_secs_f64()),
    );
    row(
        "(a) apiserver back → converged",
        format!("{:.2} s", a.to_converged.as_secs_f64()),
    );
    row(
        "(a) requests, apiserver back → watch resumed",
        a.requests.total.to_string(),
    );
    row(
        "(a)   pod status PATCHes",
        a.requests.pod_status.to_string(),
    );
    row("(a)   lease GET/PATCH", a.requests.lease.to_string());
    row(
        "(a)   node status PATCHes",
        a.requests.node_status.to_string(),
    );
    row(
        "(a)   pod LIST / WATCH",
        format!("{} / {}", a.requests.list, a.requests.watch),
    );
    row("(a)   other", a.requests.other.len().to_string());
    for (name, r) in [("jitter", &jittered), ("no jitter", &unjittered)] {
        row(
            &format!("(b) {fleet} uplinks, {name}: peak requests/s, first minute"),
            r.peak_per_sec.to_string(),
        );
        row(
            &format!("(b) {fleet} uplinks, {name}: mean requests/s, first minute"),
            format!("{:.1}", r.mean_per_sec),
        );
        row(
            &format!("(b) {fleet} uplinks, {name}: all nodes ready again"),
            match r.all_ready {
                Some(d) => format!("{:.1} s", d.as_secs_f64()),
                None => "not in 60 s".into(),
            },
        );
    }

    let out = json!({
        "outage_secs": outage.as_secs(),
        "convergence": {
            "pods": PODS,
            "to_lease_secs": a.to_lease.as_secs_f64(),
            "lease_to_converged_secs": a.lease_to_converged.as_secs_f64(),
            "to_converged_secs": a.to_converged.as_secs_f64(),
            "requests": a.requests.json(),
        },
        "fleet": {
            "uplinks": fleet,
            "window_secs": WINDOW.as_secs(),
            "jitter": jittered.json(),
            "no_jitter": unjittered.json(),
        },
    });
    common::write_json("reconnect", &out);
}

/// A Node with a Ready condition and the real Lease shape.
struct Model {
    name: String,
}

impl NodeModel for Model {
    fn registration(&self, now: Timestamp) -> Node {
        Node {
            metadata: ObjectMeta {
                name: Some(self.name.clone()),
                ..ObjectMeta::default()
            },
            spec: None,
            status: Some(self.status(None, now)),
        }
    }
    fn status(&self, _previous: Option<&NodeStatus>, now: Timestamp) -> NodeStatus {
        NodeStatus {
            conditions: Some(vec![NodeCondition {
                type_: "Ready".into(),
                status: "True".into(),
                reason: Some("KubeletReady".into()),
                last_heartbeat_time: Some(Time(now)),
                ..NodeCondition::default()
            }]),
            ..NodeStatus::default()
        }
    }
    fn status_patch(&self, _old: Option<&NodeStatus>, new: &NodeStatus) -> Value {
        json!({ "status": new })
    }
    fn changed(&self, old: &NodeStatus, new: &NodeStatus) -> bool {
        let ready = |s: &NodeStatus| {
            s.conditions
                .iter()
                .flatten()
                .map(|c| (c.type_.clone(), c.status.clone()))
                .collect::<Vec<_>>()
        };
        ready(old) != ready(new)
    }
    fn lease(&self, node_uid: &str, now: Timestamp) -> Lease {
        let uid = Some(node_uid).filter(|u| !u.is_empty());
        holdfast::uplink::node_status::lease(&self.name, uid, 40, now)
    }
}

/// One uplink: a node controller on its own thread (probing at a random phase of the
/// period, or all at its end) and a pod-status thread, sharing a link.
struct Instance {
    link: Link,
    reporter: Reporter,
    stop: Arc<AtomicBool>,
    threads: Vec<std::thread::JoinHandle<()>>,
}

impl Instance {
    fn start(client: Client, node: &str, jitter: bool) -> Instance {
        let backoff = Backoff {
            initial: RETRY_INITIAL,
            max: RENEW,
        };
        // A dead link is probed once per period, as the agent sets it up.
        let period = RENEW.min(RETRY_MAX);
        let link = Link::new(period);
        let (reporter, outbox) = Reporter::connected();
        let stop = Arc::new(AtomicBool::new(false));
        let node_uid = new_node_uid();
        let mut controller = NodeController::new(
            node.to_string(),
            Model { name: node.into() },
            Timing {
                renew: RENEW,
                report: Duration::from_secs(300),
                retry: backoff,
            },
            node_uid.clone(),
        )
        .with_link(link.clone());
        let mut threads = Vec::new();
        {
            let (client, stop) = (client.clone(), stop.clone());
            threads.push(
                std::thread::Builder::new()
                    .name(format!("bench-node-{node}"))
                    .spawn(move || {
                        while !stop.load(Ordering::Relaxed) {
                            let random = if jitter {
                                holdfast::backoff::random()
                            } else {
                                // The phase is drawn as `random % (period + 1)`: the
                                // period itself, for every instance alike.
                                period.as_nanos() as u64
                            };
                            let next = controller.step(
                                &client,
                                Instant::now(),
                                holdfast::time::now(),
                                random,
                            );
                            while !stop.load(Ordering::Relaxed) && Instant::now() < next {
                                std::thread::sleep(
                                    (next - Instant::now()).min(Duration::from_millis(200)),
                                );
                            }
                        }
                    })
                    .expect("node thread"),
            );
        }
        let pods = PodUplink {
            client,
            outbox,
            node_name: node.into(),
            node_uid,
            mirrors: Arc::new(std::sync::Mutex::new(MirrorSet::default())),
            stop: stop.clone(),
            link: link.clone(),
        };
        threads.push(pods.spawn().expect("pod status thread"));
        Instance {
            link,
            reporter,
            stop,
            threads,
        }
    }

    fn stop(self) {
        stop_all(vec![self]);
    }
}

/// Tells every instance to stop before waiting for any (each thread looks once a second).
fn stop_all(instances: Vec<Instance>) {
    for i in &instances {
        i.stop.store(true, Ordering::Relaxed);
    }
    for i in instances {
        for t in i.threads {
            let _ = t.join();
        }
    }
}

fn bound_pod(name: &str, node: &str) -> Pod {
    Pod {
        metadata: ObjectMeta {
            name: Some(name.into()),
            namespace: Some("default".into()),
            ..ObjectMeta::default()
        },
        spec: Some(PodSpec {
            node_name: Some(node.into()),
            containers: vec![Container {
                name: "main".into(),
                image: Some("busybox:demo".into()),
                ..Container::default()
            }],
            ..PodSpec::default()
        }),
        status: None,
    }
}

/// Running, after `restarts` crashes, the last one at `crashed`: what a pod worker
/// reports, with the container records' own times.
fn status(restarts: i32, crashed: Timestamp, started: Timestamp) -> PodStatus {
    PodStatus {
        phase: Some("Running".into()),
        container_statuses: Some(vec![ContainerStatus {
            name: "main".into(),
            image: "busybox:demo".into(),
            image_id: String::new(),
            ready: true,
            restart_count: restarts,
            started: Some(true),
            state: Some(ContainerState {
                running: Some(ContainerStateRunning {
                    started_at: Some(Time(started)),
                }),
                ..ContainerState::default()
            }),
            last_state: Some(ContainerState {
                terminated: Some(ContainerStateTerminated {
                    exit_code: 1,
                    reason: Some("Error".into()),
                    finished_at: Some(Time(crashed)),
                    ..ContainerStateTerminated::default()
                }),
                ..ContainerState::default()
            }),
            ..ContainerStatus::default()
        }]),
        ..PodStatus::default()
    }
}

fn restart_count(api: &ApiServerDouble, name: &str) -> i32 {
    api.get_pod("default", name)
        .and_then(|p| p.status)
        .and_then(|s| s.container_statuses)
        .and_then(|cs| cs.first().map(|c| c.restart_count))
        .unwrap_or(0)
}

fn wait(api: &ApiServerDouble, what: &str, cond: impl FnMut(&ApiServerDouble) -> bool) {
    if !api.wait_for(WAIT, cond) {
        panic!(
            "timed out waiting for {what}\n--- last requests (newest first) ---\n{}",
            api.recent_requests(40)
        );
    }
}

fn wait_stage(link: &Link, stage: Stage, what: &str) {
    assert!(link.wait_for(stage, WAIT), "timed out waiting for {what}");
}

/// Requests by kind.
#[derive(Default)]
struct Requests {
    total: usize,
    pod_status: usize,
    lease: usize,
    node_status: usize,
    list: usize,
    watch: usize,
    other: Vec<String>,
}

impl Requests {
    fn count(log: &[&Logged]) -> Requests {
        let mut r = Requests::default();
        for l in log {
            r.total += 1;
            let watch = l
                .query
                .split('&')
                .any(|p| p == "watch=true" || p == "watch=1");
            if l.path.contains("/leases") {
                r.lease += 1;
            } else if l.method == "PATCH"
                && l.path.ends_with("/status")
                && l.path.contains("/pods/")
            {
                r.pod_status += 1;
            } else if l.method == "PATCH" && l.path.contains("/nodes/") {
                r.node_status += 1;
            } else if l.method == "GET" && l.path == "/api/v1/pods" && watch {
                r.watch += 1;
            } else if l.method == "GET" && l.path == "/api/v1/pods" {
                r.list += 1;
            } else {
                r.other
                    .push(format!("{} {}?{} -> {}", l.method, l.path, l.query, l.code));
            }
        }
        r
    }

    fn json(&self) -> Value {
        json!({
            "total": self.total,
            "pod_status_patch": self.pod_status,
            "lease": self.lease,
            "node_status_patch": self.node_status,
            "pod_list": self.list,
            "pod_watch": self.watch,
            "other": self.other,
        })
    }
}

struct Convergence {
    to_lease: Duration,
    lease_to_converged: Duration,
    to_converged: Duration,
    requests: Requests,
}

/// (a): one node, 100 pods whose status changed during the outage.
fn convergence(outage: Duration) -> Convergence {
    const NODE: &str = "bench-reconnect-1";
    let api = apiserver::start(Options {
        bookmark_interval: Duration::from_secs(1),
        ..Options::default()
    });
    let dir = std::env::temp_dir().join(format!("holdfast-bench-reconnect-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let kubeconfig = api.kubeconfig(&dir, Identity::Node(NODE));
    let client = Client::from_kubeconfig(&kubeconfig).expect("kubeconfig");
    let names: Vec<String> = (0..PODS).map(|n| format!("pod-{n:03}")).collect();
    let mut pods = Vec::new();
    for n in &names {
        pods.push(api.create_pod(bound_pod(n, NODE)));
    }

    let inst = Instance::start(client.clone(), NODE, true);
    let (tx, mut rx) = tokio::sync::mpsc::channel::<SourceSnapshot>(8);
    let source = spawn_api_source(
        client,
        NODE.into(),
        ApiSourceOptions::default(),
        ApiSourceResume {
            link: Some(inst.link.clone()),
            ..ApiSourceResume::default()
        },
        tx,
    )
    .expect("api source");
    // Stands in for the mux; dropping the receiver (when `done` is set) ends the source.
    let done = Arc::new(AtomicBool::new(false));
    let snapshots = {
        let done = done.clone();
        std::thread::spawn(move || {
            let mut last = 0;
            while !done.load(Ordering::Relaxed) {
                match rx.try_recv() {
                    Ok(s) => last = s.pods.len(),
                    Err(_) => std::thread::sleep(Duration::from_millis(20)),
                }
            }
            last
        })
    };
    wait_stage(&inst.link, Stage::Drained, "the link up");
    wait(&api, "the pod watch", |api| api.open_watches() > 0);

    // The outage: every request dropped, open watches cut.
    let t_down = holdfast::time::now();
    api.fail_times(Matcher::any(), Fault::Drop, usize::MAX / 2);
    api.drop_watches();
    // Within the outage each pod crashed and came back, twice; the newest status wins.
    std::thread::sleep(outage / 2);
    for (n, pod) in pods.iter().enumerate() {
        let crashed = holdfast::time::add(t_down, Duration::from_millis(n as u64));
        let started = holdfast::time::add(crashed, Duration::from_secs(1));
        inst.reporter
            .status(pod, &status(1, crashed, started), false);
        inst.reporter
            .status(pod, &status(2, crashed, started), false);
    }
    std::thread::sleep(outage - outage / 2);
    assert!(inst.link.is_down(), "the link saw the outage");

    let from = api.request_log().len();
    let t_up = Instant::now();
    api.clear_faults();
    wait(&api, "every pod status", |api| {
        names.iter().all(|n| restart_count(api, n) == 2)
    });
    let t_converged = Instant::now();
    wait_stage(&inst.link, Stage::Drained, "the outbox drained");
    // The pod source resyncs after the drain: let its watch open before counting.
    wait(&api, "the pod watch again", |api| api.open_watches() > 0);
    let log = api.request_log();
    let after: Vec<&Logged> = log[from..].iter().filter(|l| l.at <= t_converged).collect();
    let t_lease = after
        .iter()
        .find(|l| l.path.contains("/leases") && l.method == "PATCH" && l.code == 200)
        .map(|l| l.at)
        .unwrap_or(t_converged);
    let with_resync: Vec<&Logged> = log[from..].iter().collect();
    let requests = Requests::count(&with_resync);
    inst.stop();
    done.store(true, Ordering::Relaxed);
    let seen = snapshots.join().unwrap_or(0);
    assert_eq!(seen, PODS, "the pod source saw every pod");
    let _ = source.join();
    drop(api);
    let _ = std::fs::remove_dir_all(&dir);
    Convergence {
        to_lease: t_lease.saturating_duration_since(t_up),
        lease_to_converged: t_converged.saturating_duration_since(t_lease),
        to_converged: t_converged.saturating_duration_since(t_up),
        requests,
    }
}

struct Fleet {
    peak_per_sec: usize,
    mean_per_sec: f64,
    per_sec: Vec<usize>,
    all_ready: Option<Duration>,
}

impl Fleet {
    fn json(&self) -> Value {
        json!({
            "peak_per_sec": self.peak_per_sec,
            "mean_per_sec": self.mean_per_sec,
            "per_sec": self.per_sec,
            "all_ready_secs": self.all_ready.map(|d| d.as_secs_f64()),
        })
    }
}

/// (b): `n` uplinks through the same outage, back at the same moment.
fn fleet_run(n: usize, outage: Duration, jitter: bool) -> Fleet {
    let api = apiserver::start(Options::default());
    let dir = std::env::temp_dir().join(format!(
        "holdfast-bench-fleet-{}-{jitter}",
        std::process::id()
    ));
    let _ = std::fs::remove_dir_all(&dir);
    // One admin identity for all: 200 node certificates would only slow the setup.
    let kubeconfig = api.kubeconfig(&dir, Identity::Admin);
    let client = Client::from_kubeconfig(&kubeconfig).expect("kubeconfig");
    let mut pods = Vec::new();
    let mut fleet = Vec::new();
    for i in 0..n {
        let node = format!("fleet-{i:03}");
        pods.push(api.create_pod(bound_pod(&format!("fleet-pod-{i:03}"), &node)));
        fleet.push(Instance::start(client.clone(), &node, jitter));
    }
    for inst in &fleet {
        wait_stage(&inst.link, Stage::Drained, "every uplink up");
    }
    api.fail_times(Matcher::any(), Fault::Drop, usize::MAX / 2);
    let t_down = holdfast::time::now();
    for (inst, pod) in fleet.iter().zip(&pods) {
        inst.reporter
            .status(pod, &status(1, t_down, holdfast::time::now()), false);
    }
    std::thread::sleep(outage);
    let from = api.request_log().len();
    let t_up = Instant::now();
    api.clear_faults();
    let mut all_ready = None;
    while t_up.elapsed() < WINDOW {
        if all_ready.is_none() && fleet.iter().all(|i| i.link.stage() == Stage::Drained) {
            all_ready = Some(t_up.elapsed());
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let log = api.request_log();
    let mut per_sec: BTreeMap<u64, usize> = BTreeMap::new();
    let mut total = 0;
    for l in &log[from..] {
        let at = l.at.saturating_duration_since(t_up);
        if at < WINDOW {
            *per_sec.entry(at.as_secs()).or_default() += 1;
            total += 1;
        }
    }
    let per_sec: Vec<usize> = (0..WINDOW.as_secs())
        .map(|s| per_sec.get(&s).copied().unwrap_or(0))
        .collect();
    stop_all(fleet);
    drop(api);
    let _ = std::fs::remove_dir_all(&dir);
    Fleet {
        peak_per_sec: per_sec.iter().copied().max().unwrap_or(0),
        mean_per_sec: total as f64 / WINDOW.as_secs_f64(),
        per_sec,
        all_ready,
    }
}
