//! End-to-end with a cluster: `holdfast run --kubeconfig` against the kube-apiserver
//! double (tests/support/apiserver, which follows the recorded real server), running
//! real libcontainer containers, checked the way `kubectl` would show them.
//!
//! What needs no fault runs against the real control plane instead
//! (tests/control_plane.rs, tests/control_plane_workloads.rs). The double stays for
//! what the real server cannot be made to do on demand: a failed DELETE and the order
//! of the node's requests (`node_registers_and_a_bound_pod_runs_until_deleted`), a
//! dropped watch, a 410 and a stale LIST (`watch_resumes_after_a_drop_and_relists_once_after_410`),
//! which LIST and WATCH requests carry which selector
//! (`configmaps_and_secrets_a_pod_references_are_fetched_and_followed`), an uplink that
//! drops every request (`status_shows_the_uplink_go_down_and_come_back`), the version a
//! restarted watch resumes from (`a_restarted_agent_resumes_its_watch_from_the_stored_version`),
//! and a second CA and an expired certificate made at will
//! (`a_kubeconfig_that_cannot_work_leaves_the_pods_running`).

use support::apiserver;

use std::collections::BTreeMap;
use std::time::Duration;

use apiserver::{ApiServerDouble, Fault, Identity, Matcher, Options};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use support::agent::{need_root, Agent};

const NODE: &str = "edge-node-1";
const WAIT: Duration = Duration::from_secs(60);

fn double() -> ApiServerDouble {
    apiserver::start(Options {
        bookmark_interval: Duration::from_secs(1),
        ..Options::default()
    })
}

/// An agent that is node `NODE` of the double's cluster, with short node intervals.
fn agent(name: &str, api: &ApiServerDouble) -> Agent {
    let mut a = Agent::new(name);
    a.node_name = NODE.into();
    a.write_config("nodeStatusUpdateFrequency: 1s\nnodeStatusReportFrequency: 3s\n");
    let kubeconfig = api.kubeconfig(&a.dir, Identity::Node(NODE));
    a.extra_args = vec!["--kubeconfig".into(), kubeconfig.display().to_string()];
    a
}

/// A pod bound to `NODE` whose container traps SIGTERM, says so, and exits 0.
fn bound_pod(name: &str, grace: i64) -> Pod {
    let script = "trap 'echo got TERM; exit 0' TERM; echo started; while true; do sleep 0.2; done";
    apiserver::bound_pod(NODE, name, &["sh", "-c", script], grace)
}

fn phase(api: &ApiServerDouble, name: &str) -> Option<String> {
    api.get_pod("default", name)
        .and_then(|p| p.status)
        .and_then(|s| s.phase)
}

fn condition(pod: &Pod, type_: &str) -> Option<String> {
    pod.status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == type_)
        .map(|c| c.status.clone())
}

fn wait(api: &ApiServerDouble, a: &Agent, what: &str, cond: impl FnMut(&ApiServerDouble) -> bool) {
    if !api.wait_for(WAIT, cond) {
        let log = api.recent_requests(40);
        panic!(
            "timed out waiting for {what}\n--- last requests (newest first) ---\n{}\n--- agent log ---\n{}",
            log,
            a.agent_log()
        );
    }
}

fn lists(api: &ApiServerDouble) -> usize {
    api.request_log()
        .iter()
        .filter(|l| {
            l.method == "GET" && l.path == "/api/v1/pods" && !l.query.contains("watch=true")
        })
        .count()
}

#[test]
fn node_registers_and_a_bound_pod_runs_until_deleted() {
    if !need_root() {
        return;
    }
    let api = double();
    let mut a = agent("cluster-node", &api);
    a.start();

    // The Node: registered with the device's capacity and the kubelet's labels, Ready.
    wait(&api, &a, "the node to be Ready", |api| {
        api.get_node(NODE).is_some_and(|n| {
            n.status
                .and_then(|s| s.conditions)
                .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
        })
    });
    let node = api.get_node(NODE).expect("node");
    let labels = node.metadata.labels.clone().unwrap_or_default();
    assert_eq!(
        labels.get("kubernetes.io/hostname").map(String::as_str),
        Some(NODE)
    );
    assert_eq!(
        labels.get("kubernetes.io/os").map(String::as_str),
        Some("linux")
    );
    let arch = match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        "arm" => "arm",
        other => other,
    };
    assert_eq!(
        labels.get("kubernetes.io/arch").map(String::as_str),
        Some(arch)
    );
    let status = node.status.clone().expect("status");
    let capacity = status.capacity.clone().expect("capacity");
    let cpus = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1);
    let online = std::fs::read_to_string("/sys/devices/system/cpu/online").unwrap_or_default();
    let cpu = capacity.get("cpu").map(|q| q.0.clone()).unwrap_or_default();
    assert!(
        cpu == cpus.to_string() || !online.is_empty(),
        "cpu capacity {cpu} (available {cpus}, online {online:?})"
    );
    let meminfo = std::fs::read_to_string("/proc/meminfo").expect("meminfo");
    let total_kib = meminfo
        .lines()
        .find_map(|l| l.strip_prefix("MemTotal:"))
        .map(|v| v.trim().trim_end_matches("kB").trim().to_string())
        .expect("MemTotal");
    assert_eq!(
        capacity.get("memory").map(|q| q.0.clone()),
        Some(format!("{total_kib}Ki"))
    );
    assert_eq!(capacity.get("pods").map(|q| q.0.as_str()), Some("110"));
    let info = status.node_info.clone().expect("nodeInfo");
    assert!(info
        .container_runtime_version
        .starts_with("libcontainer://"));
    assert_eq!(
        info.boot_id,
        std::fs::read_to_string("/proc/sys/kernel/random/boot_id")
            .expect("boot_id")
            .trim()
    );

    // The Lease: held by the node, owned by its Node, renewed on schedule.
    wait(&api, &a, "the lease", |api| api.get_lease(NODE).is_some());
    let lease = api.get_lease(NODE).expect("lease");
    let spec = lease.spec.clone().expect("spec");
    assert_eq!(spec.holder_identity.as_deref(), Some(NODE));
    assert_eq!(spec.lease_duration_seconds, Some(40));
    let owner = &lease.metadata.owner_references.clone().expect("owner")[0];
    assert_eq!(
        (owner.kind.as_str(), owner.uid.as_str()),
        ("Node", node.metadata.uid.as_deref().unwrap_or(""))
    );
    let first = spec.renew_time.expect("renewTime").0;
    wait(&api, &a, "the lease to be renewed", |api| {
        api.get_lease(NODE)
            .and_then(|l| l.spec)
            .and_then(|s| s.renew_time)
            .is_some_and(|t| t.0 > first)
    });

    // A pod the scheduler bound here runs as a real container and reports Running.
    api.create_pod(bound_pod("web", 10));
    wait(&api, &a, "pod web Running", |api| {
        phase(api, "web").as_deref() == Some("Running")
    });
    let pod = api.get_pod("default", "web").expect("pod");
    assert_eq!(condition(&pod, "Ready").as_deref(), Some("True"));
    assert_eq!(condition(&pod, "ContainersReady").as_deref(), Some("True"));
    let status = pod.status.clone().expect("status");
    let cs = &status
        .container_statuses
        .clone()
        .expect("containerStatuses")[0];
    assert!(cs.ready);
    assert!(cs
        .container_id
        .as_deref()
        .is_some_and(|id| id.starts_with("libcontainer://")));
    assert!(cs.state.as_ref().and_then(|s| s.running.as_ref()).is_some());
    assert_eq!(status.qos_class.as_deref(), Some("BestEffort"));
    assert!(status.start_time.is_some());
    a.wait_pod("web", "running locally", WAIT, |p| {
        p["status"]["phase"] == "Running"
    });
    // Running means the process was started; its SIGTERM trap is set once it says so.
    a.wait_until("web to say it started", WAIT, |a| {
        a.pod("web")
            .is_some_and(|p| a.container_log(&p, "main", 0).contains("started"))
    });
    wait(&api, &a, "events Created and Started", |api| {
        let reasons: Vec<String> = api
            .list_events()
            .iter()
            .filter(|e| e.involved_object.name.as_deref() == Some("web"))
            .filter_map(|e| e.reason.clone())
            .collect();
        ["Pulled", "Created", "Started"]
            .iter()
            .all(|r| reasons.iter().any(|x| x == r))
    });

    // kubectl delete: SIGTERM within the grace period, final status, then the node's
    // own final DELETE, so the pod does not hang in Terminating.
    api.clear_request_log();
    // The first final DELETE fails (an apiserver hiccup): the pod shows its final
    // status meanwhile, and the DELETE is retried.
    api.fail_next(
        Matcher::new("DELETE", "/api/v1/namespaces/default/pods/web"),
        Fault::Status(503),
    );
    api.delete_pod("default", "web", Some(10));
    wait(&api, &a, "pod web Succeeded while terminating", |api| {
        api.get_pod("default", "web").is_some_and(|p| {
            p.metadata.deletion_timestamp.is_some()
                && p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Succeeded")
        })
    });
    let last = api.get_pod("default", "web").expect("pod");
    let cs = &last
        .status
        .clone()
        .and_then(|s| s.container_statuses)
        .expect("statuses")[0];
    let t = cs
        .state
        .as_ref()
        .and_then(|s| s.terminated.clone())
        .expect("terminated");
    assert_eq!((t.exit_code, t.reason.as_deref()), (0, Some("Completed")));
    assert!(!cs.ready);
    wait(&api, &a, "pod web gone from the cluster", |api| {
        api.get_pod("default", "web").is_none()
    });
    let node_user = format!("system:node:{NODE}");
    // The request log is written after the answer: wait for the DELETE's line.
    wait(&api, &a, "the node's final DELETE in the log", |api| {
        api.request_log()
            .iter()
            .any(|l| l.method == "DELETE" && l.path.ends_with("/pods/web") && l.code == 200)
    });
    let log = api.request_log();
    let status_patch = log.iter().position(|l| {
        l.method == "PATCH" && l.path.ends_with("/pods/web/status") && l.user == node_user
    });
    let delete = log.iter().rposition(|l| {
        l.method == "DELETE"
            && l.path.ends_with("/pods/web")
            && l.user == node_user
            && l.code == 200
    });
    assert!(
        matches!((status_patch, delete), (Some(p), Some(d)) if p < d),
        "final status, then the final delete: {:?}",
        log.iter()
            .map(|l| format!("{} {}", l.method, l.path))
            .collect::<Vec<_>>()
    );
    a.wait_gone("web", WAIT);
    // The container took the SIGTERM (its trap exits 0); no SIGKILL was needed.
    let log = a.agent_log();
    assert!(
        log.contains("pod default/web: container main exited with code 0"),
        "{log}"
    );
    assert!(!log.contains("pod default/web: grace period over"), "{log}");
    wait(&api, &a, "a Killing event", |api| {
        api.list_events().iter().any(|e| {
            e.involved_object.name.as_deref() == Some("web")
                && e.reason.as_deref() == Some("Killing")
        })
    });
    a.stop();
    a.reset();
}

#[test]
fn watch_resumes_after_a_drop_and_relists_once_after_410() {
    if !need_root() {
        return;
    }
    let api = double();
    let mut a = agent("cluster-watch", &api);
    a.start();
    api.create_pod(bound_pod("one", 1));
    wait(&api, &a, "pod one Running", |api| {
        phase(api, "one").as_deref() == Some("Running")
    });
    let listed = lists(&api);
    assert_eq!(listed, 1, "one LIST at start");

    // A dropped watch resumes from the last resourceVersion: no LIST.
    api.drop_watches();
    api.create_pod(bound_pod("two", 1));
    wait(&api, &a, "pod two Running", |api| {
        phase(api, "two").as_deref() == Some("Running")
    });
    assert_eq!(lists(&api), 1, "a drop does not relist");

    // The resourceVersion is compacted away: 410, one relist.
    api.compact();
    api.drop_watches();
    api.create_pod(bound_pod("three", 1));
    wait(&api, &a, "pod three Running", |api| {
        phase(api, "three").as_deref() == Some("Running")
    });
    assert_eq!(lists(&api), 2, "a 410 relists once");

    // An empty LIST from a lagging cache after a drop does not stop running pods.
    api.fail_next(Matcher::new("GET", "/api/v1/pods"), Fault::StaleList);
    api.compact();
    api.drop_watches();
    wait(
        &api,
        &a,
        "two more LISTs (the stale one and its check)",
        |api| lists(api) >= 4,
    );
    for name in ["one", "two", "three"] {
        let p = a
            .pod(name)
            .unwrap_or_else(|| panic!("pod {name} is still there"));
        assert_eq!(p["status"]["phase"], "Running", "{name}");
    }
    assert!(
        !a.agent_log().contains("pod default/one: stopping"),
        "no pod was stopped:\n{}",
        a.agent_log()
    );
    a.stop();
    a.reset();
}

#[test]
fn a_kubeconfig_that_cannot_work_leaves_the_pods_running() {
    if !need_root() {
        return;
    }
    let api = double();
    let other = double(); // another cluster: another CA
    let mut a = Agent::new("cluster-badca");
    a.node_name = NODE.into();
    // The other cluster's kubeconfig, pointed at this server: the CA does not match.
    let kubeconfig = other.kubeconfig_with(
        &a.dir,
        Identity::Node(NODE),
        &apiserver::KubeconfigOptions {
            server: Some(api.url()),
            ..Default::default()
        },
    );
    a.extra_args = vec!["--kubeconfig".into(), kubeconfig.display().to_string()];
    a.write_manifest(
        "static.yaml",
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: local\nspec:\n  hostNetwork: true\n  \
         terminationGracePeriodSeconds: 1\n  containers:\n    - name: c\n      image: busybox:demo\n      \
         command: [\"sleep\", \"3600\"]\n",
    );
    a.start();
    a.wait_pod("local", "running", WAIT, |p| {
        p["status"]["phase"] == "Running"
    });
    a.wait_until("the CA mismatch logged", WAIT, |a| {
        a.agent_log().contains("not trusted by the kubeconfig's CA")
    });
    assert!(api.get_node(NODE).is_none());
    a.stop();

    // An expired client certificate: one clear error at start, pods run on.
    let expired = api.kubeconfig_with(
        &a.dir,
        Identity::Node(NODE),
        &apiserver::KubeconfigOptions {
            credential: apiserver::Credential::ExpiredCertificate,
            ..Default::default()
        },
    );
    a.extra_args = vec!["--kubeconfig".into(), expired.display().to_string()];
    a.start();
    a.wait_until("the expired certificate logged", WAIT, |a| {
        a.agent_log().contains("expired")
    });
    a.wait_pod("local", "running", WAIT, |p| {
        p["status"]["phase"] == "Running"
    });
    assert!(api.get_node(NODE).is_none());
    a.stop();
    a.reset();
}

#[test]
fn configmaps_and_secrets_a_pod_references_are_fetched_and_followed() {
    use k8s_openapi::api::core::v1::{
        ConfigMap, ConfigMapVolumeSource, Secret, SecretVolumeSource, Volume,
    };
    if !need_root() {
        return;
    }
    let api = double();
    let meta = |name: &str| ObjectMeta {
        name: Some(name.into()),
        namespace: Some("default".into()),
        ..ObjectMeta::default()
    };
    api.put_configmap(ConfigMap {
        metadata: meta("app-config"),
        data: Some(BTreeMap::from([(
            "log.level".to_string(),
            "info".to_string(),
        )])),
        ..ConfigMap::default()
    });
    api.put_secret(Secret {
        metadata: meta("app-secret"),
        string_data: Some(BTreeMap::from([(
            "token".to_string(),
            "s3cr3t-value".to_string(),
        )])),
        ..Secret::default()
    });
    let mut a = agent("cluster-objects", &api);
    a.start();
    let mut pod = bound_pod("app", 1);
    if let Some(spec) = pod.spec.as_mut() {
        spec.volumes = Some(vec![
            Volume {
                name: "config".into(),
                config_map: Some(ConfigMapVolumeSource {
                    name: "app-config".into(),
                    ..ConfigMapVolumeSource::default()
                }),
                ..Volume::default()
            },
            Volume {
                name: "secret".into(),
                secret: Some(SecretVolumeSource {
                    secret_name: Some("app-secret".into()),
                    ..SecretVolumeSource::default()
                }),
                ..Volume::default()
            },
        ]);
    }
    api.create_pod(pod);
    let node_user = format!("system:node:{NODE}");
    for kind in ["configmaps", "secrets"] {
        wait(
            &api,
            &a,
            &format!("the node to list and watch its {kind}"),
            |api| {
                let log = api.request_log();
                let by_node = |watch: bool| {
                    log.iter().any(|l| {
                        l.user == node_user
                            && l.code == 200
                            && l.path == format!("/api/v1/namespaces/default/{kind}")
                            && l.query.contains("fieldSelector=metadata.name%3Dapp-")
                            && l.query.contains("watch=true") == watch
                    })
                };
                by_node(false) && by_node(true)
            },
        );
    }
    // A change arrives through the watch, once the pod runs: a change that lands before
    // its worker exists is simply read at its start, with no resync to log.
    a.wait_until("the pod's container started", WAIT, |a| {
        a.agent_log()
            .contains("pod default/app: container main started")
    });
    api.put_configmap(ConfigMap {
        metadata: meta("app-config"),
        data: Some(BTreeMap::from([(
            "log.level".to_string(),
            "debug".to_string(),
        )])),
        ..ConfigMap::default()
    });
    a.wait_until("the change noticed", WAIT, |a| {
        a.agent_log()
            .contains("configmap default/app-config changed")
    });
    assert!(
        !a.agent_log().contains("s3cr3t-value"),
        "a secret's value reached the log"
    );
    a.stop();
    a.reset();
}

#[test]
fn status_shows_the_uplink_go_down_and_come_back() {
    if !need_root() {
        return;
    }
    let api = double();
    let mut a = agent("cluster-status", &api);
    a.write_config(
        "nodeStatusUpdateFrequency: 1s\nnodeStatusReportFrequency: 3s\nuplinkRetryMax: 2s\n",
    );
    a.start();
    wait(&api, &a, "the lease", |api| api.get_lease(NODE).is_some());
    a.wait_until("status to say up", WAIT, |a| {
        a.status()["uplink"]["state"] == "up"
    });
    let s = a.status();
    assert_eq!(s["agentRunning"], true);
    assert!(s["uplink"]["lastSync"].is_string(), "{s}");
    assert!(s["storeBytes"].as_u64().is_some_and(|b| b > 0), "{s}");
    assert_eq!(s["outbox"]["statuses"], 0, "{s}");

    // Every request is cut: the lease renewal fails and the link goes down.
    api.fail_times(Matcher::any(), Fault::Drop, 100_000);
    a.wait_until("status to say down", WAIT, |a| {
        a.status()["uplink"]["state"] == "down"
    });
    a.wait_until("a failed probe", WAIT, |a| {
        let s = a.status();
        s["uplink"]["failures"].as_u64().is_some_and(|n| n >= 1)
            && s["uplink"]["nextRetry"].is_string()
            && s["uplink"]["since"].is_string()
    });
    let text = std::process::Command::new(support::agent::bin())
        .args(["status", "--root-dir"])
        .arg(&a.root)
        .output()
        .expect("holdfast status");
    let text = String::from_utf8_lossy(&text.stdout).into_owned();
    assert!(text.contains("uplink:       down since"), "{text}");
    assert!(text.contains("next retry"), "{text}");

    api.clear_faults();
    a.wait_until("status to say up again", WAIT, |a| {
        let s = a.status();
        s["uplink"]["state"] == "up" && s["uplink"]["failures"] == 0
    });
    a.stop();
    // No agent: it says so, and still tells the store's size.
    let s = a.status();
    assert_eq!(s["agentRunning"], false);
    assert!(s["storeBytes"].as_u64().is_some_and(|b| b > 0), "{s}");
    a.reset();
}

#[test]
fn a_restarted_agent_resumes_its_watch_from_the_stored_version() {
    if !need_root() {
        return;
    }
    let api = double();
    let mut a = agent("cluster-resume", &api);
    a.start();
    api.create_pod(bound_pod("stays", 1));
    api.create_pod(bound_pod("goes", 1));
    wait(&api, &a, "both pods Running", |api| {
        phase(api, "stays").as_deref() == Some("Running")
            && phase(api, "goes").as_deref() == Some("Running")
    });
    assert_eq!(lists(&api), 1);
    a.stop();

    // While the agent is away: one pod deleted, one bound.
    api.delete_pod("default", "goes", Some(0));
    api.create_pod(bound_pod("new", 1));
    api.clear_request_log();
    a.start();
    wait(&api, &a, "pod new Running", |api| {
        phase(api, "new").as_deref() == Some("Running")
    });
    a.wait_until("pod goes stopped", WAIT, |a| a.pod("goes").is_none());
    assert_eq!(lists(&api), 0, "resumed with a WATCH, no LIST");
    let p = a.pod("stays").expect("pod stays");
    assert_eq!(p["status"]["phase"], "Running");
    assert_eq!(
        p["status"]["containerStatuses"][0]["restartCount"], 0,
        "the pod that stayed was not restarted"
    );
    a.stop();
    a.reset();
}
