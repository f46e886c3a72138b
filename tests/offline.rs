//! End-to-end offline autonomy: `holdfast run --kubeconfig` against the kube-apiserver
//! double through a TCP proxy that stands for the site's uplink (tests/support/proxy.rs),
//! running real libcontainer containers. The link is cut (blackholed), the agent is
//! killed or the device "rebooted" meanwhile, the cluster changes behind its back, and
//! on reconnect the cluster must learn what really happened, with as few requests as
//! the truth needs.
//!
//! Outages are compressed: a few seconds of blackhole, then every connection from
//! before is reset, as it would be after an outage longer than every client and
//! server timeout.

mod support;

#[path = "support/apiserver/mod.rs"]
mod apiserver;
#[path = "support/proxy.rs"]
mod proxy;

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use apiserver::{ApiServerDouble, Fault, Identity, KubeconfigOptions, Matcher, Options};
use k8s_openapi::api::core::v1::{Container, ContainerStatus, Pod, PodSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::jiff::Timestamp;
use proxy::{Mode, Proxy};
use serde_json::Value;
use support::agent::{cgroup_dirs, container, need_root, Agent};

const NODE: &str = "edge-node-1";
const WAIT: Duration = Duration::from_secs(60);
/// How long the link stays down once the outage's events have happened: several node
/// status periods (1 s), lease renewals and crash-loop back-offs of the test config.
const OUTAGE: Duration = Duration::from_secs(4);

/// Runs forever; exits 3 once `/tmp/crash` appears in its own root (a new container
/// after a restart has a fresh `/tmp`, so it runs on).
const CRASH_ON_SIGNAL: &str = "while [ ! -e /tmp/crash ]; do sleep 0.1; done; exit 3";
const RUN_FOREVER: &str = "exec sleep 100000";

fn double() -> ApiServerDouble {
    apiserver::start(Options {
        bookmark_interval: Duration::from_secs(1),
        ..Options::default()
    })
}

/// An agent that is node `NODE`, reaching the double only through `proxy`, with short
/// node intervals.
fn agent(name: &str, api: &ApiServerDouble, proxy: &Proxy) -> Agent {
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
fn bound_pod(name: &str, script: &str) -> Pod {
    Pod {
        metadata: ObjectMeta {
            name: Some(name.into()),
            namespace: Some("default".into()),
            labels: Some(BTreeMap::from([("app".to_string(), name.to_string())])),
            ..ObjectMeta::default()
        },
        spec: Some(PodSpec {
            node_name: Some(NODE.into()),
            host_network: Some(true),
            termination_grace_period_seconds: Some(1),
            containers: vec![Container {
                name: "main".into(),
                image: Some("busybox:demo".into()),
                command: Some(vec!["sh".into(), "-c".into(), script.into()]),
                ..Container::default()
            }],
            ..PodSpec::default()
        }),
        status: None,
    }
}

fn static_pod_yaml(name: &str, script: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: {name}\nspec:\n  hostNetwork: true\n  \
         terminationGracePeriodSeconds: 1\n  containers:\n    - name: main\n      \
         image: busybox:demo\n      command: [\"sh\", \"-c\", {}]\n",
        serde_json::to_string(script).expect("json string")
    )
}

fn fail(what: &str, api: &ApiServerDouble, a: &Agent) -> ! {
    panic!(
        "timed out waiting for {what}\n--- last requests (newest first) ---\n{}\n\
         --- pods ---\n{}\n--- agent log ---\n{}",
        api.recent_requests(40),
        a.pods_table(),
        a.agent_log()
    )
}

fn wait(api: &ApiServerDouble, a: &Agent, what: &str, cond: impl FnMut(&ApiServerDouble) -> bool) {
    if !api.wait_for(WAIT, cond) {
        fail(what, api, a);
    }
}

/// The one container's status as the cluster has it.
fn cluster_container(api: &ApiServerDouble, name: &str) -> Option<ContainerStatus> {
    api.get_pod("default", name)?
        .status?
        .container_statuses?
        .into_iter()
        .next()
}

/// The pod runs in the cluster's eyes: phase Running, its container running and ready.
fn running_in_cluster(api: &ApiServerDouble, name: &str) -> bool {
    let phase = api
        .get_pod("default", name)
        .and_then(|p| p.status)
        .and_then(|s| s.phase);
    phase.as_deref() == Some("Running")
        && cluster_container(api, name)
            .is_some_and(|c| c.ready && c.state.is_some_and(|s| s.running.is_some()))
}

/// The pod's container runs locally (`holdfast pods`).
fn running_here(p: &Value) -> bool {
    container(p, "main")["state"]["running"].is_object()
}

fn container_id(p: &Value) -> String {
    container(p, "main")["containerID"]
        .as_str()
        .unwrap_or_default()
        .to_string()
}

fn restart_count(p: &Value) -> i64 {
    container(p, "main")["restartCount"].as_i64().unwrap_or(-1)
}

/// The pid of a pod's container init, from the runtime's record of it.
fn container_pid(a: &Agent, p: &Value) -> i32 {
    let id = container_id(p);
    let id = id.strip_prefix("libcontainer://").expect("containerID");
    let started = std::fs::read_to_string(a.root.join("containers").join(id).join("started.json"))
        .expect("started.json");
    let v: Value = serde_json::from_str(&started).expect("started.json parses");
    v["init"]["pid"]
        .as_i64()
        .and_then(|p| i32::try_from(p).ok())
        .expect("init pid")
}

fn pid_alive(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| {
        !matches!(
            s.rsplit(") ").next().and_then(|r| r.chars().next()),
            Some('Z' | 'X')
        )
    })
}

/// When a crash happened, as the test saw it: between the signal and the exit seen.
#[derive(Debug, Clone, Copy)]
struct Window {
    from: Timestamp,
    to: Timestamp,
}

/// Makes the pod's container (running `CRASH_ON_SIGNAL`) exit 3; returns when it did.
fn crash(a: &Agent, p: &Value) -> Window {
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
fn count(api: &ApiServerDouble, from: usize, method: &str, path: &str) -> usize {
    api.request_log()
        .iter()
        .skip(from)
        .filter(|l| l.method == method && l.path == path)
        .count()
}

fn status_path(name: &str) -> String {
    format!("/api/v1/namespaces/default/pods/{name}/status")
}

/// LISTs (not watches) of the node's pods so far.
fn pod_lists(api: &ApiServerDouble) -> usize {
    api.request_log()
        .iter()
        .filter(|l| {
            l.method == "GET" && l.path == "/api/v1/pods" && !l.query.contains("watch=true")
        })
        .count()
}

/// Waits until the node's Lease has been renewed `n` more times: the uplink is up and
/// has had time for everything it does on reconnect.
fn wait_lease_renewals(api: &ApiServerDouble, a: &Agent, n: usize) {
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

fn time(t: &k8s_openapi::apimachinery::pkg::apis::meta::v1::Time) -> Timestamp {
    t.0
}

/// A time the agent reported, checked against when the test saw the thing happen.
/// Kubernetes times have whole seconds: the reported second is within the window's.
fn assert_within(what: &str, reported: Timestamp, seen: Window) {
    let r = reported.as_second();
    assert!(
        r >= seen.from.as_second() && r <= seen.to.as_second(),
        "{what}: reported {reported}, happened between {} and {}",
        seen.from,
        seen.to
    );
}

/// Everything a device loses in a power cut: the agent, every shim and container
/// (SIGKILL), the containers' mounts and cgroups. The root dir stays, as flash does.
fn power_cut(a: &mut Agent) {
    a.kill9();
    let root = a.root.display().to_string();
    let ours = |pid: u32| {
        let cmd = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
        let in_root =
            std::fs::read_link(format!("/proc/{pid}/root")).is_ok_and(|r| r.starts_with(&a.root));
        String::from_utf8_lossy(&cmd).contains(&root) || in_root
    };
    let deadline = Instant::now() + WAIT;
    loop {
        let pids: Vec<u32> = std::fs::read_dir("/proc")
            .into_iter()
            .flatten()
            .flatten()
            .filter_map(|e| e.file_name().to_string_lossy().parse::<u32>().ok())
            .filter(|&pid| pid != std::process::id() && ours(pid))
            .filter(|&pid| pid_alive(pid as i32))
            .collect();
        if pids.is_empty() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "processes survive SIGKILL: {pids:?}"
        );
        for pid in pids {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid as i32),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let dir = a.dir.display().to_string();
    let mut mounts: Vec<String> = std::fs::read_to_string("/proc/self/mountinfo")
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.split_whitespace().nth(4).map(str::to_string))
        .filter(|mp| mp.starts_with(&dir))
        .collect();
    mounts.sort_by_key(|m| std::cmp::Reverse(m.len()));
    for mp in mounts {
        nix::mount::umount2(mp.as_str(), nix::mount::MntFlags::MNT_DETACH)
            .unwrap_or_else(|e| panic!("unmount {mp}: {e}"));
    }
    for cg in cgroup_dirs(&a.cgroup_root) {
        remove_cgroup_tree(&cg);
    }
}

/// Removes a cgroup and every cgroup below it, deepest first, killing what is left in
/// them and waiting (bounded) for the kernel to let go of a cgroup whose last process
/// just died.
fn remove_cgroup_tree(dir: &std::path::Path) {
    if let Ok(entries) = std::fs::read_dir(dir) {
        for e in entries.flatten() {
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                remove_cgroup_tree(&e.path());
            }
        }
    }
    let deadline = Instant::now() + WAIT;
    while dir.exists() {
        let procs = std::fs::read_to_string(dir.join("cgroup.procs")).unwrap_or_default();
        for pid in procs.lines().filter_map(|l| l.trim().parse::<i32>().ok()) {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
        match std::fs::remove_dir(dir) {
            Ok(()) => return,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return,
            Err(e) => assert!(
                Instant::now() < deadline,
                "remove cgroup {}: {e} (processes: {procs:?})",
                dir.display()
            ),
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Names of the pods `holdfast pods` shows.
fn local_pods(a: &Agent) -> BTreeSet<String> {
    a.pods()
        .iter()
        .filter_map(|p| p["pod"]["metadata"]["name"].as_str().map(str::to_string))
        .collect()
}

/// The test's world: the double, the link, the agent (dropped first: killed and reset).
struct Site {
    a: Agent,
    link: Proxy,
    api: ApiServerDouble,
}

impl Site {
    fn new(name: &str) -> Site {
        let api = double();
        let link = Proxy::start(api.addr());
        let a = agent(name, &api, &link);
        Site { a, link, api }
    }

    /// Creates bound pods and waits until the cluster sees each of them running.
    fn run_bound(&self, pods: &[(&str, &str)]) {
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
    fn cut(&self) -> usize {
        self.link.set_mode(Mode::Blackhole);
        self.api.request_log().len()
    }

    /// Asserts that nothing reached the double since `from` (the link is really down).
    fn assert_silent(&self, from: usize) {
        let log = self.api.request_log();
        assert_eq!(
            log.len(),
            from,
            "requests reached the double through a cut link:\n{}",
            self.api.recent_requests(log.len() - from)
        );
    }

    fn finish(mut self) {
        self.a.stop();
        self.a.reset();
        self.a.assert_clean();
    }
}

/// What the cluster must show of a container that crashed offline: the restarts, the
/// exit code and time of the last crash (before `up_at`: the reconnect, or the agent's
/// return), the running container's start (after that crash, before the test saw it
/// run) and its ID.
struct Crashed<'a> {
    name: &'a str,
    restarts: i32,
    crashed_at: Window,
    running_by: Timestamp,
    up_at: Timestamp,
    here: &'a Value,
}

fn assert_reported(api: &ApiServerDouble, c: &Crashed) {
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

#[test]
fn a_long_outage_keeps_pods_running_and_ends_in_one_true_status_patch_per_changed_pod() {
    if !need_root() {
        return;
    }
    let mut s = Site::new("offline-outage");
    s.a.write_manifest("local.yaml", &static_pod_yaml("local", CRASH_ON_SIGNAL));
    s.a.start();
    s.run_bound(&[("steady", RUN_FOREVER), ("crashy", CRASH_ON_SIGNAL)]);
    let mirror = format!("local-{NODE}");
    wait(&s.api, &s.a, "the mirror pod Running", |api| {
        running_in_cluster(api, &mirror)
    });
    let steady = s.a.wait_pod("steady", "running", WAIT, running_here);
    let steady_pid = container_pid(&s.a, &steady);
    let crashy = s.a.wait_pod("crashy", "running", WAIT, running_here);
    let local = s.a.wait_pod("local", "running", WAIT, running_here);

    let from = s.cut();
    // crashy crashes twice, restarted by policy (the second time after a back-off) with
    // no apiserver to ask: several statuses in turn, of which only the last is news.
    // The static pod crashes once.
    crash(&s.a, &crashy);
    let crashy = s.a.wait_pod("crashy", "restarted", WAIT, |p| {
        running_here(p) && restart_count(p) == 1
    });
    let local_crashed_at = crash(&s.a, &local);
    let crashed_at = crash(&s.a, &crashy);
    let crashy = s.a.wait_pod("crashy", "restarted again", WAIT, |p| {
        running_here(p) && restart_count(p) == 2
    });
    let local = s.a.wait_pod("local", "restarted", WAIT, |p| {
        running_here(p) && restart_count(p) == 1
    });
    let running_by = Timestamp::now();
    std::thread::sleep(OUTAGE); // the outage itself, not a wait for anything
    s.assert_silent(from);
    assert!(pid_alive(steady_pid), "steady's container died offline");
    let steady = s.a.pod("steady").expect("steady still served");
    assert!(running_here(&steady));
    assert_eq!(restart_count(&steady), 0);

    let up_at = Timestamp::now();
    s.link.restore_after_outage();
    wait(&s.api, &s.a, "the restarts reported", |api| {
        cluster_container(api, "crashy").is_some_and(|c| c.restart_count == 2)
            && running_in_cluster(api, "crashy")
            && cluster_container(api, &mirror).is_some_and(|c| c.restart_count == 1)
            && running_in_cluster(api, &mirror)
    });
    wait_lease_renewals(&s.api, &s.a, 3);

    // One PATCH for each pod that changed, none for the one that did not.
    for (name, want) in [("crashy", 1), (mirror.as_str(), 1), ("steady", 0)] {
        assert_eq!(
            count(&s.api, from, "PATCH", &status_path(name)),
            want,
            "status PATCHes for {name} after the outage:\n{}",
            s.api.recent_requests(60)
        );
    }
    // With the times things happened, not the time the cluster heard of them.
    assert_reported(
        &s.api,
        &Crashed {
            name: "crashy",
            restarts: 2,
            crashed_at,
            running_by,
            up_at,
            here: &crashy,
        },
    );
    assert_reported(
        &s.api,
        &Crashed {
            name: &mirror,
            restarts: 1,
            crashed_at: local_crashed_at,
            running_by,
            up_at,
            here: &local,
        },
    );
    s.finish();
}

#[test]
fn an_agent_killed_offline_and_restarted_offline_adopts_its_containers_and_reports_after_reconnect()
{
    if !need_root() {
        return;
    }
    let mut s = Site::new("offline-kill");
    s.a.write_manifest("local.yaml", &static_pod_yaml("local", RUN_FOREVER));
    s.a.start();
    s.run_bound(&[("steady", RUN_FOREVER), ("crashy", CRASH_ON_SIGNAL)]);
    let mirror = format!("local-{NODE}");
    wait(&s.api, &s.a, "the mirror pod Running", |api| {
        running_in_cluster(api, &mirror)
    });
    let before = local_pods(&s.a);
    let pids: BTreeMap<String, (String, i32)> = ["local", "steady", "crashy"]
        .iter()
        .map(|n| {
            let p = s.a.pod(n).expect("pod");
            (n.to_string(), (container_id(&p), container_pid(&s.a, &p)))
        })
        .collect();
    let steady_started = cluster_container(&s.api, "steady")
        .and_then(|c| c.state)
        .and_then(|s| s.running)
        .and_then(|r| r.started_at);

    let crashy = s.a.pod("crashy").expect("crashy");
    // Status writes reach the store within a second (sled's flush period, for flash
    // wear): let them, so that what the agent kept is the state the cluster saw.
    wait_lease_renewals(&s.api, &s.a, 2);
    let from = s.cut();
    s.a.kill9();
    // A container exits while no agent runs: its shim keeps the exit.
    let crashed_at = crash(&s.a, &crashy);
    std::thread::sleep(Duration::from_millis(1100)); // a clear gap between exit and restart
    let back_at = Timestamp::now();
    s.a.start();

    // The same pods, the same containers (adopted, not restarted), crashy restarted by
    // policy, all without the apiserver.
    let crashy = s.a.wait_pod("crashy", "restarted", WAIT, |p| {
        running_here(p) && restart_count(p) == 1
    });
    let running_by = Timestamp::now();
    for name in ["local", "steady"] {
        let p = s.a.wait_pod(name, "adopted", WAIT, running_here);
        let (id, pid) = &pids[name];
        assert_eq!(&container_id(&p), id, "{name}: the same container");
        assert_eq!(container_pid(&s.a, &p), *pid, "{name}: the same process");
        assert!(pid_alive(*pid), "{name}: its process lives");
        assert_eq!(restart_count(&p), 0, "{name}");
    }
    assert_eq!(
        local_pods(&s.a),
        before,
        "the restarted agent serves the same pods"
    );
    std::thread::sleep(OUTAGE); // the outage goes on, not a wait for anything
    s.assert_silent(from);

    s.link.restore_after_outage();
    wait(&s.api, &s.a, "crashy's restart reported", |api| {
        cluster_container(api, "crashy").is_some_and(|c| c.restart_count == 1)
            && running_in_cluster(api, "crashy")
    });
    wait_lease_renewals(&s.api, &s.a, 2);
    // Only the pod that changed is reported; the adopted ones told the cluster nothing
    // new.
    for (name, want) in [("crashy", 1), ("steady", 0), (mirror.as_str(), 0)] {
        assert_eq!(
            count(&s.api, from, "PATCH", &status_path(name)),
            want,
            "status PATCHes for {name} after the restart and the outage:\n{}",
            s.api.recent_requests(60)
        );
    }
    // The exit the shim kept is reported with its true time, before the agent was back.
    assert_reported(
        &s.api,
        &Crashed {
            name: "crashy",
            restarts: 1,
            crashed_at,
            running_by,
            up_at: back_at,
            here: &crashy,
        },
    );
    let steady = cluster_container(&s.api, "steady").expect("steady's status");
    assert_eq!(steady.container_id, Some(pids["steady"].0.clone()));
    assert_eq!(steady.restart_count, 0);
    assert_eq!(
        steady
            .state
            .and_then(|s| s.running)
            .and_then(|r| r.started_at),
        steady_started,
        "steady's startedAt is still when it started"
    );
    assert!(running_in_cluster(&s.api, "steady"));
    assert!(running_in_cluster(&s.api, &mirror));
    s.finish();
}

#[test]
fn a_reboot_while_offline_starts_every_pod_again_from_the_store() {
    if !need_root() {
        return;
    }
    let mut s = Site::new("offline-reboot");
    s.a.write_manifest("local.yaml", &static_pod_yaml("local", RUN_FOREVER));
    s.a.start();
    s.run_bound(&[("web", RUN_FOREVER)]);
    let old: BTreeMap<String, (String, i32)> = ["local", "web"]
        .iter()
        .map(|n| {
            let p = s.a.wait_pod(n, "running", WAIT, running_here);
            (n.to_string(), (container_id(&p), container_pid(&s.a, &p)))
        })
        .collect();

    let from = s.cut();
    power_cut(&mut s.a);
    s.a.start();
    for name in ["local", "web"] {
        let p = s.a.wait_pod(name, "running again", WAIT, |p| {
            running_here(p) && container_id(p) != old[name].0
        });
        // A new container, the restart counted as the kubelet counts one.
        assert_eq!(restart_count(&p), 1, "{name}: {p}");
        let pid = container_pid(&s.a, &p);
        assert_ne!(pid, old[name].1, "{name}: a new process");
        assert!(pid_alive(pid), "{name}");
    }
    s.assert_silent(from);

    s.link.restore_after_outage();
    wait(&s.api, &s.a, "web's new container reported", |api| {
        cluster_container(api, "web").is_some_and(|c| c.restart_count == 1)
            && running_in_cluster(api, "web")
    });
    let mirror = format!("local-{NODE}");
    wait(
        &s.api,
        &s.a,
        "the static pod's restart on its mirror pod",
        |api| {
            cluster_container(api, &mirror).is_some_and(|c| c.restart_count == 1)
                && running_in_cluster(api, &mirror)
        },
    );
    for (name, in_cluster) in [("web", "web".to_string()), ("local", mirror)] {
        let p = s.a.pod(name).expect("pod");
        assert_eq!(
            cluster_container(&s.api, &in_cluster).and_then(|c| c.container_id),
            Some(container_id(&p)),
            "{name}: the cluster sees the new container"
        );
    }
    s.finish();
}

#[test]
fn a_reboot_while_offline_gives_a_pod_its_secret_and_configmap_env_from_the_store() {
    use k8s_openapi::api::core::v1::{
        ConfigMap, ConfigMapEnvSource, EnvFromSource, EnvVar, EnvVarSource, Secret,
        SecretKeySelector,
    };
    if !need_root() {
        return;
    }
    let mut s = Site::new("offline-secret");
    let secret = "offline-s3cr3t";
    let meta = |name: &str| ObjectMeta {
        name: Some(name.into()),
        namespace: Some("default".into()),
        ..ObjectMeta::default()
    };
    s.api.put_secret(Secret {
        metadata: meta("app-secret"),
        string_data: Some(BTreeMap::from([("token".to_string(), secret.to_string())])),
        ..Secret::default()
    });
    s.api.put_configmap(ConfigMap {
        metadata: meta("app-config"),
        data: Some(BTreeMap::from([(
            "LOG_LEVEL".to_string(),
            "debug".to_string(),
        )])),
        ..ConfigMap::default()
    });
    s.a.start();
    let mut pod = bound_pod("app", RUN_FOREVER);
    if let Some(spec) = pod.spec.as_mut() {
        spec.containers[0].env = Some(vec![EnvVar {
            name: "TOKEN".into(),
            value_from: Some(EnvVarSource {
                secret_key_ref: Some(SecretKeySelector {
                    name: "app-secret".into(),
                    key: "token".into(),
                    optional: None,
                }),
                ..EnvVarSource::default()
            }),
            ..EnvVar::default()
        }]);
        spec.containers[0].env_from = Some(vec![EnvFromSource {
            config_map_ref: Some(ConfigMapEnvSource {
                name: "app-config".into(),
                optional: None,
            }),
            ..EnvFromSource::default()
        }]);
    }
    s.api.create_pod(pod);
    wait(&s.api, &s.a, "pod app Running", |api| {
        running_in_cluster(api, "app")
    });
    let want = [format!("TOKEN={secret}"), "LOG_LEVEL=debug".to_string()];
    // The container's own environment, as its process has it.
    let check = |a: &Agent, p: &Value, when: &str| {
        let raw = std::fs::read(format!("/proc/{}/environ", container_pid(a, p)))
            .expect("the container's environment");
        let env: Vec<String> = String::from_utf8_lossy(&raw)
            .split('\0')
            .map(str::to_string)
            .collect();
        for kv in &want {
            let name = kv.split('=').next().unwrap_or_default();
            assert!(
                env.contains(kv),
                "{when}: {name} is not what the cluster holds (variables: {:?})",
                env.iter()
                    .map(|kv| kv.split('=').next().unwrap_or_default())
                    .collect::<Vec<_>>()
            );
        }
    };
    let p = s.a.wait_pod("app", "running", WAIT, running_here);
    check(&s.a, &p, "online");
    let old_id = container_id(&p);

    let from = s.cut();
    power_cut(&mut s.a);
    s.a.start();
    let p = s.a.wait_pod("app", "running again offline", WAIT, |p| {
        running_here(p) && container_id(p) != old_id
    });
    check(&s.a, &p, "after a reboot, offline");
    s.assert_silent(from);
    assert!(
        !s.a.agent_log().contains(secret),
        "a secret's value reached the log"
    );
    s.link.restore_after_outage();
    s.finish();
}

/// Deleted and bound during the outage; `compact` also compacts the watch history away.
/// Returns the number of pod LISTs the reconnect took.
fn changes_during_outage(name: &str, compact: bool) -> usize {
    let mut s = Site::new(name);
    s.a.start();
    s.run_bound(&[("keep", RUN_FOREVER), ("gone", RUN_FOREVER)]);
    let keep = s.a.wait_pod("keep", "running", WAIT, running_here);
    let keep_id = container_id(&keep);
    let keep_pid = container_pid(&s.a, &keep);
    let gone = s.a.wait_pod("gone", "running", WAIT, running_here);
    let gone_pid = container_pid(&s.a, &gone);
    let lists_before = pod_lists(&s.api);

    let from = s.cut();
    s.api.delete_pod("default", "gone", Some(1));
    s.api.create_pod(bound_pod("new", RUN_FOREVER));
    if compact {
        s.api.compact();
    }
    std::thread::sleep(OUTAGE); // the outage itself, not a wait for anything
                                // Nothing changes here while the cluster cannot be heard.
    assert!(
        pid_alive(gone_pid),
        "gone stopped before the agent could know"
    );
    assert!(
        s.a.pod("new").is_none(),
        "new started before the agent could know"
    );
    s.assert_silent(from);

    s.link.restore_after_outage();
    wait(&s.api, &s.a, "pod new Running", |api| {
        running_in_cluster(api, "new")
    });
    s.a.wait_pod("new", "running here", WAIT, running_here);
    wait(&s.api, &s.a, "pod gone deleted from the cluster", |api| {
        api.get_pod("default", "gone").is_none()
    });
    s.a.wait_gone("gone", WAIT);
    assert!(!pid_alive(gone_pid), "gone's container still runs");
    // The pod that needed nothing was left alone.
    let keep = s.a.pod("keep").expect("keep");
    assert_eq!(container_id(&keep), keep_id, "keep was restarted");
    assert_eq!(restart_count(&keep), 0);
    assert!(pid_alive(keep_pid));
    assert!(running_in_cluster(&s.api, "keep"));
    let lists = pod_lists(&s.api) - lists_before;
    s.finish();
    lists
}

#[test]
fn pods_deleted_and_bound_during_an_outage_are_stopped_and_started_after_it() {
    if !need_root() {
        return;
    }
    let lists = changes_during_outage("offline-changes", false);
    assert_eq!(
        lists, 0,
        "the watch resumes from its resourceVersion: no LIST"
    );
}

#[test]
fn watch_history_compacted_during_an_outage_costs_one_relist() {
    if !need_root() {
        return;
    }
    let lists = changes_during_outage("offline-compact", true);
    assert_eq!(lists, 1, "a 410 relists once");
}

#[test]
fn a_failing_or_empty_list_after_reconnect_stops_no_pod() {
    if !need_root() {
        return;
    }
    let mut s = Site::new("offline-badlist");
    s.a.start();
    s.run_bound(&[("one", RUN_FOREVER), ("two", RUN_FOREVER)]);
    let ids: BTreeMap<&str, String> = ["one", "two"]
        .into_iter()
        .map(|n| {
            (
                n,
                container_id(&s.a.wait_pod(n, "running", WAIT, running_here)),
            )
        })
        .collect();

    let from = s.cut();
    // The watch's history is gone: reconnecting needs a LIST, and the first LISTs fail
    // or lie. (One empty answer: a second one in a row is the truth to the agent, as
    // it would be to the kubelet.)
    s.api.compact();
    let list = || Matcher::new("GET", "/api/v1/pods").query("limit=");
    s.api.fail_next(list(), Fault::Status(500));
    s.api.fail_next(list(), Fault::Drop);
    s.api.fail_next(list(), Fault::EmptyList);
    std::thread::sleep(OUTAGE); // the outage itself, not a wait for anything
    s.assert_silent(from);
    let lists_before = pod_lists(&s.api);

    s.link.restore_after_outage();
    wait(&s.api, &s.a, "the three bad LISTs and a good one", |api| {
        pod_lists(api) >= lists_before + 4
    });
    // The source is in sync again: a pod bound now starts.
    s.run_bound(&[("three", RUN_FOREVER)]);
    for (name, id) in &ids {
        let p =
            s.a.pod(name)
                .unwrap_or_else(|| panic!("pod {name} is gone"));
        assert!(running_here(&p), "{name}: {p}");
        assert_eq!(&container_id(&p), id, "{name} was restarted");
        assert!(running_in_cluster(&s.api, name), "{name}");
    }
    let log = s.a.agent_log();
    assert!(!log.contains(": stopping"), "a pod was stopped:\n{log}");
    s.finish();
}

#[test]
fn reconnect_renews_the_lease_then_node_status_then_drains_the_outbox_then_resyncs() {
    if !need_root() {
        return;
    }
    let mut s = Site::new("offline-order");
    s.a.start();
    s.run_bound(&[("crashy", CRASH_ON_SIGNAL)]);
    let crashy = s.a.wait_pod("crashy", "running", WAIT, running_here);
    let from = s.cut();
    s.api.compact();
    crash(&s.a, &crashy);
    s.a.wait_pod("crashy", "restarted", WAIT, |p| {
        running_here(p) && restart_count(p) == 1
    });
    std::thread::sleep(OUTAGE); // the outage itself, not a wait for anything
    s.link.restore_after_outage();
    wait(
        &s.api,
        &s.a,
        "crashy's restart reported and a relist",
        |api| {
            cluster_container(api, "crashy").is_some_and(|c| c.restart_count == 1)
                && pod_lists(api) >= 2
        },
    );
    let log = s.api.request_log();
    let first = |pred: &dyn Fn(&apiserver::Logged) -> bool| {
        log.iter()
            .skip(from)
            .position(|l| l.code < 300 && pred(l))
            .unwrap_or(usize::MAX)
    };
    let lease = first(&|l| {
        l.path
            .starts_with("/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases/")
    });
    let node = first(&|l| l.method == "PATCH" && l.path == format!("/api/v1/nodes/{NODE}/status"));
    let outbox = first(&|l| l.method == "PATCH" && l.path == status_path("crashy"));
    let resync = first(&|l| l.method == "GET" && l.path == "/api/v1/pods");
    assert!(
        lease < node && node < outbox && outbox < resync && resync != usize::MAX,
        "lease {lease}, node status {node}, outbox {outbox}, resync {resync}:\n{}",
        s.api.recent_requests(log.len() - from)
    );
    s.finish();
}

#[test]
fn a_refused_link_is_retried_with_capped_back_off_and_no_storm() {
    if !need_root() {
        return;
    }
    let mut s = Site::new("offline-backoff");
    s.a.extra_args
        .extend(["--uplink-retry-max".to_string(), "2s".to_string()]);
    s.a.start();
    s.run_bound(&[("web", RUN_FOREVER)]);
    let web_id = container_id(&s.a.wait_pod("web", "running", WAIT, running_here));

    // Every connection is refused at once (RST): each uplink loop fails fast and backs
    // off, doubling up to the 2 s cap, with jitter.
    let from = s.api.request_log().len();
    s.link.set_mode(Mode::Reset);
    let tried_before = s.link.connections();
    let refused_for = Duration::from_secs(8);
    std::thread::sleep(refused_for); // the outage itself, not a wait for anything
    let tried = s.link.connections() - tried_before;
    s.assert_silent(from);
    // While the link is down one loop probes it, a try at most 2 s after the last and
    // about 1 s on average (full jitter): about ten tries (7 to 10 measured). Forty
    // leaves room for unlucky jitter; retrying without back-off would be hundreds.
    assert!(
        (1..=40).contains(&tried),
        "{tried} connection attempts in {refused_for:?} of refused link"
    );

    let up = Instant::now();
    s.link.set_mode(Mode::Pass);
    wait_lease_renewals(&s.api, &s.a, 1);
    // Back within the cap (plus a lease period and slack for a loaded machine).
    assert!(
        up.elapsed() < Duration::from_secs(2 + 1 + 3),
        "the lease was renewed {:?} after the link came back",
        up.elapsed()
    );
    let p = s.a.pod("web").expect("web");
    assert_eq!(container_id(&p), web_id, "web was restarted");
    s.finish();
}

#[test]
fn a_restarted_agent_resumes_its_watch_from_the_stored_resource_version() {
    if !need_root() {
        return;
    }
    let mut s = Site::new("offline-resume");
    s.a.start();
    s.run_bound(&[("steady", RUN_FOREVER)]);
    let steady_id = container_id(&s.a.wait_pod("steady", "running", WAIT, running_here));
    let lists_before = pod_lists(&s.api);

    let from = s.cut();
    s.a.kill9();
    s.a.start();
    s.a.wait_pod("steady", "adopted", WAIT, running_here);
    // The cluster moves on meanwhile, within its watch history.
    s.api.create_pod(bound_pod("later", RUN_FOREVER));
    std::thread::sleep(OUTAGE); // the outage itself, not a wait for anything
    s.assert_silent(from);

    s.link.restore_after_outage();
    wait(&s.api, &s.a, "pod later Running", |api| {
        running_in_cluster(api, "later")
    });
    assert_eq!(
        pod_lists(&s.api),
        lists_before,
        "the restarted agent resumed its watch where the old one stopped, without a LIST:\n{}",
        s.api.recent_requests(60)
    );
    let steady = s.a.pod("steady").expect("steady");
    assert_eq!(container_id(&steady), steady_id, "steady was restarted");
    s.finish();
}
