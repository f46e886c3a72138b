use super::*;
use crate::runtime::ContainerId;
use crate::sync::record::Instance;
use k8s_openapi::api::core::v1::PodSpec;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

/// What the kubelet's back-off and the tests' clock are here.
const BACKOFF: Backoff = Backoff {
    initial: Duration::from_secs(10),
    max: Duration::from_secs(300),
};

/// Inputs with nothing but the clock, the back-off and `terminal`.
fn inputs(terminal: bool) -> StatusInputs<'static> {
    StatusInputs {
        now: Timestamp::from_second(1_800_000_001).expect("ts"),
        backoff: &BACKOFF,
        start_time: None,
        host_ip: None,
        previous: None,
        terminal,
        sandbox: None,
        probes: None,
    }
}

fn pod(policy: &str) -> Pod {
    Pod {
        metadata: ObjectMeta {
            name: Some("web".into()),
            uid: Some("u1".into()),
            ..ObjectMeta::default()
        },
        spec: Some(PodSpec {
            restart_policy: Some(policy.into()),
            containers: vec![Container {
                name: "main".into(),
                image: Some("busybox".into()),
                ..Container::default()
            }],
            ..PodSpec::default()
        }),
        status: None,
    }
}

fn ended(code: i32) -> BTreeMap<String, ContainerRecord> {
    let id = ContainerId::derive("u1", "main", 0);
    let mut rec = ContainerRecord::new("main");
    rec.current = Some(Instance {
        id: id.clone(),
        image: "busybox".into(),
        image_id: String::new(),
        state: InstanceState::Terminated(Terminated {
            container_id: Some(id.uri()),
            exit_code: code,
            signal: None,
            reason: if code == 0 { "Completed" } else { "Error" }.into(),
            message: None,
            started_at: None,
            finished_at: Timestamp::from_second(1_800_000_000).expect("ts"),
        }),
    });
    BTreeMap::from([("main".to_string(), rec)])
}

fn status_of(policy: &str, code: i32, terminal: bool) -> PodStatus {
    let inputs = inputs(terminal);
    pod_status(&pod(policy), &ended(code), &inputs)
}

#[test]
fn a_deleted_pod_ends_in_a_terminal_phase_with_its_exit_codes() {
    // Running, restarting: a restartPolicy Always pod whose container ended.
    assert_eq!(
        status_of("Always", 0, false).phase.as_deref(),
        Some("Running")
    );
    // Deleted and stopped: terminal, by the exit codes, whatever the policy.
    let s = status_of("Always", 0, true);
    assert_eq!(s.phase.as_deref(), Some("Succeeded"));
    let cs = &s.container_statuses.expect("statuses")[0];
    let t = cs
        .state
        .as_ref()
        .and_then(|st| st.terminated.as_ref())
        .expect("terminated");
    assert_eq!(t.exit_code, 0);
    assert_eq!(
        status_of("Always", 143, true).phase.as_deref(),
        Some("Failed")
    );
    assert_eq!(
        status_of("OnFailure", 143, true).phase.as_deref(),
        Some("Failed")
    );
    let ready = status_of("Always", 0, true)
        .conditions
        .expect("conditions")
        .into_iter()
        .find(|c| c.type_ == "Ready")
        .expect("Ready");
    assert_eq!(ready.status, "False");
    assert_eq!(ready.reason.as_deref(), Some("PodCompleted"));
}

fn c(name: &str, sidecar: bool) -> Container {
    Container {
        name: name.into(),
        image: Some("busybox".into()),
        restart_policy: sidecar.then(|| "Always".to_string()),
        ..Container::default()
    }
}

fn record(name: &str, state: Option<InstanceState>) -> ContainerRecord {
    let mut r = ContainerRecord::new(name);
    r.current = state.map(|state| Instance {
        id: ContainerId::derive("u1", name, 0),
        image: "busybox".into(),
        image_id: String::new(),
        state,
    });
    r
}

fn exited(code: i32) -> Option<InstanceState> {
    Some(InstanceState::Terminated(Terminated {
        container_id: None,
        exit_code: code,
        signal: None,
        reason: if code == 0 { "Completed" } else { "Error" }.into(),
        message: None,
        started_at: None,
        finished_at: Timestamp::from_second(1_800_000_000).expect("ts"),
    }))
}

fn running() -> Option<InstanceState> {
    Some(InstanceState::Running {
        started_at: Timestamp::from_second(1_800_000_000).expect("ts"),
    })
}

fn with_inits(policy: &str, inits: Vec<Container>, recs: Vec<ContainerRecord>) -> PodStatus {
    let mut p = pod(policy);
    if let Some(spec) = p.spec.as_mut() {
        spec.init_containers = Some(inits);
    }
    let records: BTreeMap<String, ContainerRecord> =
        recs.into_iter().map(|r| (r.name.clone(), r)).collect();
    let inputs = inputs(false);
    pod_status(&p, &records, &inputs)
}

fn cond<'a>(s: &'a PodStatus, t: &str) -> &'a PodCondition {
    s.conditions
        .iter()
        .flatten()
        .find(|c| c.type_ == t)
        .expect("condition")
}

fn waiting_reason(s: &ContainerStatus) -> Option<&str> {
    s.state
        .as_ref()
        .and_then(|st| st.waiting.as_ref())
        .and_then(|w| w.reason.as_deref())
}

#[test]
fn a_pod_initializing_is_pending_with_the_kubelets_condition() {
    let s = with_inits(
        "Always",
        vec![c("a", false), c("b", false)],
        vec![record("a", exited(0)), record("b", running())],
    );
    assert_eq!(s.phase.as_deref(), Some("Pending"));
    let init = cond(&s, "Initialized");
    assert_eq!(init.status, "False");
    assert_eq!(init.reason.as_deref(), Some("ContainersNotInitialized"));
    assert_eq!(
        init.message.as_deref(),
        Some("containers with incomplete status: [b]")
    );
    let app = &s.container_statuses.as_ref().expect("app")[0];
    assert_eq!(waiting_reason(app), Some("PodInitializing"));
    let inits = s.init_container_statuses.as_ref().expect("inits");
    assert!(inits[0].ready, "completed init container is ready");
    assert!(!inits[1].ready);
    assert_eq!(inits[1].started, Some(true));
}

#[test]
fn a_failed_init_container_fails_a_never_pod_and_waits_otherwise() {
    let s = with_inits("Never", vec![c("a", false)], vec![record("a", exited(2))]);
    assert_eq!(s.phase.as_deref(), Some("Failed"));
    let mut failed = record("a", exited(2));
    failed.failures = 1;
    let s = with_inits("OnFailure", vec![c("a", false)], vec![failed]);
    assert_eq!(s.phase.as_deref(), Some("Pending"));
    let a = &s.init_container_statuses.as_ref().expect("inits")[0];
    assert_eq!(waiting_reason(a), Some("CrashLoopBackOff"));
}

#[test]
fn sidecars_must_start_and_count_for_readiness() {
    // Not started yet: pending.
    let s = with_inits("Always", vec![c("side", true)], vec![]);
    assert_eq!(s.phase.as_deref(), Some("Pending"));
    assert_eq!(
        waiting_reason(&s.init_container_statuses.as_ref().expect("inits")[0]),
        Some("PodInitializing")
    );
    // Running beside the app: initialized, running, ready with both.
    let s = with_inits(
        "Always",
        vec![c("side", true)],
        vec![record("side", running()), record("main", running())],
    );
    assert_eq!(s.phase.as_deref(), Some("Running"));
    assert_eq!(cond(&s, "Initialized").status, "True");
    assert_eq!(cond(&s, "Ready").status, "True");
    // The sidecar died and waits in back-off: the pod stays initialized, unready.
    let mut side = record("side", exited(1));
    side.failures = 1;
    let s = with_inits(
        "Always",
        vec![c("side", true)],
        vec![side, record("main", running())],
    );
    assert_eq!(cond(&s, "Initialized").status, "True");
    assert_eq!(
        cond(&s, "Ready").message.as_deref(),
        Some("containers with unready status: [side]")
    );
}

#[test]
fn qos_counts_init_containers() {
    let mut limited = c("a", false);
    limited.resources = Some(k8s_openapi::api::core::v1::ResourceRequirements {
        requests: Some(BTreeMap::from([(
            "cpu".to_string(),
            k8s_openapi::apimachinery::pkg::api::resource::Quantity("100m".into()),
        )])),
        ..Default::default()
    });
    let s = with_inits("Always", vec![limited], vec![]);
    assert_eq!(s.qos_class.as_deref(), Some("Burstable"));
}

fn addresses(host_network: bool, sandbox: Option<&SandboxStatus>, terminal: bool) -> PodStatus {
    let mut p = pod("Always");
    if let Some(spec) = p.spec.as_mut() {
        spec.host_network = Some(host_network);
    }
    let previous = PodStatus {
        pod_ip: Some("10.77.0.9".into()),
        pod_ips: Some(vec![PodIP {
            ip: "10.77.0.9".into(),
        }]),
        ..PodStatus::default()
    };
    let inputs = StatusInputs {
        host_ip: Some("192.0.2.2"),
        previous: Some(&previous),
        sandbox,
        ..inputs(terminal)
    };
    pod_status(&p, &BTreeMap::new(), &inputs)
}

#[test]
fn a_pod_network_without_an_address_yet_shows_none() {
    let waiting = SandboxStatus::default();
    for sandbox in [None, Some(&waiting)] {
        let s = addresses(false, sandbox, false);
        assert_eq!(s.pod_ip, None);
        assert_eq!(s.pod_ips, None);
        assert_eq!(s.host_ip.as_deref(), Some("192.0.2.2"));
    }
    let up = SandboxStatus {
        ready: true,
        pod_ips: vec!["10.77.0.5".into(), "fd00::5".into()],
    };
    let s = addresses(false, Some(&up), false);
    assert_eq!(s.pod_ip.as_deref(), Some("10.77.0.5"));
    let ips: Vec<&str> = s.pod_ips.iter().flatten().map(|p| p.ip.as_str()).collect();
    assert_eq!(ips, ["10.77.0.5", "fd00::5"]);
}

#[test]
fn a_host_network_pod_shows_the_nodes_address() {
    let s = addresses(true, Some(&SandboxStatus::default()), false);
    assert_eq!(s.pod_ip.as_deref(), Some("192.0.2.2"));
    assert_eq!(
        s.pod_ips,
        Some(vec![PodIP {
            ip: "192.0.2.2".into()
        }])
    );
}

#[test]
fn an_ended_pod_keeps_its_addresses_when_its_sandbox_is_gone() {
    let s = addresses(false, Some(&SandboxStatus::default()), true);
    assert_eq!(s.pod_ip.as_deref(), Some("10.77.0.9"));
}

#[test]
fn the_status_names_the_generation_it_describes_and_no_signal() {
    let mut p = pod("Never");
    p.metadata.generation = Some(3);
    let mut records = ended(137);
    if let Some(InstanceState::Terminated(t)) = records
        .get_mut("main")
        .and_then(|r| r.current.as_mut())
        .map(|c| &mut c.state)
    {
        t.signal = Some(9);
    }
    let inputs = inputs(false);
    let s = pod_status(&p, &records, &inputs);
    assert_eq!(s.observed_generation, Some(3));
    assert!(s
        .conditions
        .iter()
        .flatten()
        .all(|c| c.observed_generation == Some(3)));
    let t = s.container_statuses.expect("statuses")[0]
        .state
        .clone()
        .and_then(|st| st.terminated)
        .expect("terminated");
    assert_eq!((t.exit_code, t.signal), (137, None));
}

fn ephemeral(name: &str) -> k8s_openapi::api::core::v1::EphemeralContainer {
    k8s_openapi::api::core::v1::EphemeralContainer {
        name: name.into(),
        image: Some("busybox".into()),
        target_container_name: Some("main".into()),
        ..Default::default()
    }
}

#[test]
fn ephemeral_containers_have_statuses_of_their_own_and_never_restart() {
    let mut p = pod("Always");
    if let Some(spec) = p.spec.as_mut() {
        let all = ["debug", "once", "later"].map(ephemeral).to_vec();
        spec.ephemeral_containers = Some(all);
    }
    let records: BTreeMap<String, ContainerRecord> = [
        record("main", running()),
        record("debug", running()),
        record("once", exited(1)),
    ]
    .into_iter()
    .map(|r| (r.name.clone(), r))
    .collect();
    let inputs = inputs(false);
    let s = pod_status(&p, &records, &inputs);
    let eph = s.ephemeral_container_statuses.clone().expect("ephemeral");
    let names: Vec<&str> = eph.iter().map(|c| c.name.as_str()).collect();
    assert_eq!(names, ["debug", "once", "later"]);
    let state = |i: usize| eph[i].state.clone().unwrap_or_default();
    assert!(state(0).running.is_some());
    // Running, yet neither ready nor said to have started, as the kubelet reports it.
    assert!(!eph[0].ready);
    assert_eq!(eph[0].started, None);
    // Under restartPolicy Always it ended for good: no CrashLoopBackOff.
    let ended = state(1).terminated.expect("terminated");
    assert_eq!((ended.exit_code, eph[1].restart_count), (1, 0));
    assert_eq!(waiting_reason(&eph[2]), Some("ContainerCreating"));
    // They count for neither phase nor readiness; the app containers' list is theirs.
    assert_eq!(s.phase.as_deref(), Some("Running"));
    assert_eq!(cond(&s, "Ready").status, "True");
    assert_eq!(s.container_statuses.map(|c| c.len()), Some(1));
    let plain = pod_status(&pod("Always"), &records, &inputs);
    assert_eq!(plain.ephemeral_container_statuses, None);
}

/// The Ready condition of a running pod with readiness gates `a` and `b`, whose
/// status holds `conditions` (type, status) set by others, and whose container is
/// `container_ready`.
fn gated_ready(conditions: &[(&str, &str)], container_ready: bool) -> PodCondition {
    use k8s_openapi::api::core::v1::PodReadinessGate;
    let mut p = pod("Always");
    if let Some(spec) = p.spec.as_mut() {
        spec.readiness_gates = Some(
            ["example.com/a", "example.com/b"]
                .map(|t| PodReadinessGate {
                    condition_type: t.into(),
                })
                .to_vec(),
        );
    }
    p.status = Some(PodStatus {
        conditions: Some(
            conditions
                .iter()
                .map(|(t, s)| PodCondition {
                    type_: (*t).into(),
                    status: (*s).into(),
                    ..PodCondition::default()
                })
                .collect(),
        ),
        ..PodStatus::default()
    });
    let records = BTreeMap::from([("main".to_string(), record("main", running()))]);
    let views = BTreeMap::from([(
        "main".to_string(),
        ProbeView {
            started: true,
            ready: container_ready,
        },
    )]);
    let inputs = StatusInputs {
        probes: Some(&views),
        ..inputs(false)
    };
    let s = pod_status(&p, &records, &inputs);
    assert_eq!(
        cond(&s, "ContainersReady").status,
        if container_ready { "True" } else { "False" },
        "the gates hold back Ready only"
    );
    cond(&s, "Ready").clone()
}

#[test]
fn readiness_gates_hold_ready_back_in_the_kubelets_words() {
    let r = gated_ready(&[], true);
    assert_eq!(r.status, "False");
    assert_eq!(r.reason.as_deref(), Some("ReadinessGatesNotReady"));
    assert_eq!(
        r.message.as_deref(),
        Some(
            "corresponding condition of pod readiness gate \"example.com/a\" does not exist., \
             corresponding condition of pod readiness gate \"example.com/b\" does not exist."
        )
    );
    let r = gated_ready(
        &[("example.com/a", "True"), ("example.com/b", "False")],
        true,
    );
    assert_eq!(r.status, "False");
    assert_eq!(
        r.message.as_deref(),
        Some("the status of pod readiness gate \"example.com/b\" is not \"True\", but False")
    );
    let r = gated_ready(
        &[("example.com/b", "True"), ("example.com/a", "True")],
        true,
    );
    assert_eq!(
        (r.status.as_str(), r.reason, r.message),
        ("True", None, None)
    );
    // Unready containers say so first, gates or not.
    let r = gated_ready(
        &[("example.com/a", "True"), ("example.com/b", "True")],
        false,
    );
    assert_eq!(r.status, "False");
    assert_eq!(r.reason.as_deref(), Some("ContainersNotReady"));
}
