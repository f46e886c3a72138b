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

use support::{apiserver, offline as site, proxy};

use site::*;
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use apiserver::{Fault, Matcher};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::jiff::Timestamp;
use proxy::Mode;
use serde_json::Value;
use support::agent::{need_root, Agent};

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
    // new, but for the static pod's one report after the restart, with which its mirror
    // pod is checked (it may have been deleted while the agent was down).
    for (name, want) in [("crashy", 1), ("steady", 0), (mirror.as_str(), 1)] {
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
    // The container's own environment, as its process has it. A container is told
    // started once libcontainer has started it, a moment before its init execs the
    // command (the kubelet's Running with runc is the same): until then the process is
    // the runtime's own, with the runtime's environment.
    let check = |a: &Agent, p: &Value, when: &str| {
        let pid = container_pid(a, p);
        let runtime = std::fs::canonicalize(support::agent::bin()).ok();
        let deadline = Instant::now() + Duration::from_secs(10);
        while std::fs::read_link(format!("/proc/{pid}/exe")).ok() == runtime {
            assert!(
                Instant::now() < deadline,
                "{when}: the container's init did not exec its command within 10 s"
            );
            std::thread::sleep(Duration::from_millis(10));
        }
        let raw =
            std::fs::read(format!("/proc/{pid}/environ")).expect("the container's environment");
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

    // Every connection is refused at once (RST): only the node controller probes, once
    // per probe period (the 1 s renewal interval of the test config, under the 2 s
    // cap), at a random phase.
    let from = s.api.request_log().len();
    s.link.set_mode(Mode::Reset);
    let tried_before = s.link.connections();
    let refused_for = Duration::from_secs(8);
    std::thread::sleep(refused_for); // the outage itself, not a wait for anything
    let tried = s.link.connections() - tried_before;
    s.assert_silent(from);
    // While the link is down one loop probes it, one try a second: about eight. Forty
    // leaves room for a loaded machine; retrying without pacing would be hundreds.
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

/// The proxy itself: what the tests above rely on it to do.
mod uplink_proxy {
    use std::io::{ErrorKind, Read, Write};
    use std::net::{SocketAddr, TcpListener, TcpStream};
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;
    use std::time::{Duration, Instant};

    use support::proxy::{Mode, Proxy};

    const POLL: Duration = Duration::from_millis(20);

    /// An echo server on 127.0.0.1 whose threads end when the listener's owner drops it.
    struct Echo {
        addr: SocketAddr,
        stop: Arc<AtomicBool>,
    }

    impl Echo {
        fn start() -> Echo {
            let listener = TcpListener::bind("127.0.0.1:0").expect("bind echo");
            let addr = listener.local_addr().expect("echo address");
            let stop = Arc::new(AtomicBool::new(false));
            let s = stop.clone();
            std::thread::spawn(move || {
                for conn in listener.incoming() {
                    if s.load(Ordering::SeqCst) {
                        return;
                    }
                    let Ok(mut c) = conn else { continue };
                    let s = s.clone();
                    std::thread::spawn(move || {
                        let _ = c.set_read_timeout(Some(POLL));
                        let mut buf = [0u8; 1024];
                        while !s.load(Ordering::SeqCst) {
                            match c.read(&mut buf) {
                                Ok(0) => return,
                                Ok(n) => {
                                    if c.write_all(&buf[..n]).is_err() {
                                        return;
                                    }
                                }
                                Err(e) if e.kind() == ErrorKind::WouldBlock => {}
                                Err(e) if e.kind() == ErrorKind::TimedOut => {}
                                Err(_) => return,
                            }
                        }
                    });
                }
            });
            Echo { addr, stop }
        }
    }

    impl Drop for Echo {
        fn drop(&mut self) {
            self.stop.store(true, Ordering::SeqCst);
            let _ = TcpStream::connect_timeout(&self.addr, Duration::from_secs(1));
        }
    }

    fn client(proxy: &Proxy) -> TcpStream {
        let c = TcpStream::connect(proxy.addr()).expect("connect to the proxy");
        c.set_read_timeout(Some(Duration::from_millis(300)))
            .expect("read timeout");
        c
    }

    /// What comes back within the read timeout: Ok(bytes), or the error kind.
    fn echo(c: &mut TcpStream, msg: &[u8]) -> Result<Vec<u8>, ErrorKind> {
        c.write_all(msg).map_err(|e| e.kind())?;
        let mut got = Vec::new();
        let mut buf = [0u8; 64];
        while got.len() < msg.len() {
            match c.read(&mut buf) {
                Ok(0) => return Err(ErrorKind::UnexpectedEof),
                Ok(n) => got.extend_from_slice(&buf[..n]),
                Err(e) => return Err(e.kind()),
            }
        }
        Ok(got)
    }

    fn is_timeout(k: ErrorKind) -> bool {
        matches!(k, ErrorKind::WouldBlock | ErrorKind::TimedOut)
    }

    #[test]
    fn proxy_passes_holds_and_resumes() {
        let upstream = Echo::start();
        let proxy = Proxy::start(upstream.addr);
        let mut c = client(&proxy);
        assert_eq!(echo(&mut c, b"hello"), Ok(b"hello".to_vec()));
        assert_eq!(proxy.connections(), 1);

        // Blackhole: the open connection stalls and a new one is accepted and held.
        proxy.set_mode(Mode::Blackhole);
        let stalled = echo(&mut c, b"during");
        assert!(
            stalled.as_ref().is_err_and(|k| is_timeout(*k)),
            "{stalled:?}"
        );
        let mut held = client(&proxy);
        let r = echo(&mut held, b"new");
        assert!(r.as_ref().is_err_and(|k| is_timeout(*k)), "{r:?}");
        assert_eq!(proxy.connections(), 2);
        assert_eq!(proxy.open_connections(), 2);

        // Back to Pass: both go on where they stopped, nothing lost.
        proxy.set_mode(Mode::Pass);
        let mut buf = [0u8; 16];
        let n = c.read(&mut buf).expect("stalled bytes arrive");
        assert_eq!(&buf[..n], b"during");
        let n = held.read(&mut buf).expect("held connection forwards");
        assert_eq!(&buf[..n], b"new");
        assert_eq!(echo(&mut c, b"after"), Ok(b"after".to_vec()));
    }

    #[test]
    fn proxy_resets_open_and_new_connections() {
        let upstream = Echo::start();
        let proxy = Proxy::start(upstream.addr);
        let mut c = client(&proxy);
        assert_eq!(echo(&mut c, b"x"), Ok(b"x".to_vec()));
        proxy.set_mode(Mode::Blackhole);
        let mut held = client(&proxy);
        // connect() returns once the kernel has queued it: the proxy holds it once its
        // accept loop has taken it.
        let deadline = Instant::now() + Duration::from_secs(10);
        while proxy.open_connections() < 2 {
            assert!(
                Instant::now() < deadline,
                "the proxy never accepted the held connection"
            );
            std::thread::sleep(Duration::from_millis(10));
        }

        proxy.set_mode(Mode::Reset);
        assert_eq!(proxy.open_connections(), 0);
        let mut buf = [0u8; 4];
        let r = c.read(&mut buf).map_err(|e| e.kind());
        assert_eq!(r, Err(ErrorKind::ConnectionReset));
        let r = held.read(&mut buf).map_err(|e| e.kind());
        assert_eq!(r, Err(ErrorKind::ConnectionReset));

        // A new connection is reset as soon as it is accepted.
        let mut fresh = client(&proxy);
        let r = fresh.read(&mut buf).map_err(|e| e.kind());
        assert_eq!(r, Err(ErrorKind::ConnectionReset));
        assert_eq!(proxy.connections(), 3);

        proxy.set_mode(Mode::Pass);
        let mut again = client(&proxy);
        assert_eq!(echo(&mut again, b"ok"), Ok(b"ok".to_vec()));
    }

    #[test]
    fn proxy_threads_end_when_dropped() {
        let upstream = Echo::start();
        let proxy = Proxy::start(upstream.addr);
        let mut c = client(&proxy);
        assert_eq!(echo(&mut c, b"x"), Ok(b"x".to_vec()));
        proxy.set_mode(Mode::Blackhole);
        let _held = client(&proxy);
        let threads = proxy.threads();
        drop(proxy);
        let deadline = Instant::now() + Duration::from_secs(5);
        while !threads.ended() && Instant::now() < deadline {
            std::thread::sleep(POLL);
        }
        assert!(threads.ended(), "proxy threads still run");
    }
}
