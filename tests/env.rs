//! Container environments as the kubelet builds them, end to end: `holdfast run
//! --kubeconfig` against the kube-apiserver double, real containers that print their
//! environment to their log, ConfigMaps and Secrets put at the double.

use support::apiserver;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use apiserver::{ApiServerDouble, Identity, Options};
use k8s_openapi::api::core::v1::{ConfigMap, ContainerStateWaiting, Pod, Secret};
use serde_json::json;
use support::agent::{need_root, Agent};

const NODE: &str = "env-node-1";
const WAIT: Duration = Duration::from_secs(60);

fn double() -> ApiServerDouble {
    apiserver::start(Options {
        bookmark_interval: Duration::from_secs(1),
        ..Options::default()
    })
}

/// An agent that is node `NODE` of the double's cluster. `sync_frequency` is the
/// periodic resync: long where a test must show that something else woke the pod.
fn agent(name: &str, api: &ApiServerDouble, sync_frequency: &str) -> Agent {
    let mut a = Agent::new(name);
    a.node_name = NODE.into();
    let config = format!(
        "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\n\
         fileCheckFrequency: 2s\nsyncFrequency: {sync_frequency}\ncgroupRoot: {}\n\
         nodeStatusUpdateFrequency: 1s\nnodeStatusReportFrequency: 3s\n\
         address: 127.0.0.1\nport: {}\nhealthzPort: {}\n\
         holdfast:\n  crashLoopBackOffInitial: 1s\n  crashLoopBackOffMax: 4s\n\
         # The machine's own disk or memory pressure is not what these tests are about.\n  \
         evictionMonitoringPeriod: 24h\n",
        a.cgroup_root, a.port, a.healthz_port
    );
    std::fs::write(a.dir.join("config.yaml"), config).expect("config");
    let kubeconfig = api.kubeconfig(&a.dir, Identity::Node(NODE));
    a.extra_args = vec!["--kubeconfig".into(), kubeconfig.display().to_string()];
    a
}

fn config_map(name: &str, data: &[(&str, &str)]) -> ConfigMap {
    serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": "default"},
        "data": data.iter().map(|(k, v)| (k.to_string(), json!(v))).collect::<serde_json::Map<_, _>>(),
    }))
    .expect("configmap")
}

fn secret(name: &str, data: &[(&str, &str)]) -> Secret {
    Secret {
        metadata: k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
            name: Some(name.into()),
            namespace: Some("default".into()),
            ..Default::default()
        },
        type_: Some("Opaque".into()),
        string_data: Some(
            data.iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect::<BTreeMap<_, _>>(),
        ),
        ..Default::default()
    }
}

/// A pod bound to `NODE` whose container prints its environment, sorted, then waits.
fn env_pod(name: &str, container: serde_json::Value) -> Pod {
    let mut c = json!({
        "name": "main",
        "image": "busybox:demo",
        "command": ["sh", "-c", "env | sort; echo END-OF-ENV; exec sleep 3600"],
    });
    if let (Some(c), Some(extra)) = (c.as_object_mut(), container.as_object()) {
        for (k, v) in extra {
            c.insert(k.clone(), v.clone());
        }
    }
    serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": "default", "labels": {"app": name}},
        "spec": {
            "nodeName": NODE,
            "hostNetwork": true,
            "terminationGracePeriodSeconds": 1,
            "containers": [c],
        },
    }))
    .expect("pod")
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

fn phase(api: &ApiServerDouble, name: &str) -> Option<String> {
    api.get_pod("default", name)
        .and_then(|p| p.status)
        .and_then(|s| s.phase)
}

fn waiting(api: &ApiServerDouble, name: &str) -> Option<ContainerStateWaiting> {
    api.get_pod("default", name)?
        .status?
        .container_statuses?
        .first()?
        .state
        .as_ref()?
        .waiting
        .clone()
}

/// The environment container `main` of pod `name` printed in restart `restart`'s log,
/// once it has printed all of it.
fn printed_env(a: &Agent, name: &str, restart: u32) -> BTreeMap<String, String> {
    let mut env = None;
    a.wait_until(&format!("pod {name} to print its environment"), WAIT, |a| {
        let Some(pod) = a.pod(name) else {
            return false;
        };
        // CRI format: `<time> <stream> <tag> <line>`.
        let lines: Vec<String> = a
            .container_log(&pod, "main", restart)
            .lines()
            .filter_map(|l| l.splitn(4, ' ').nth(3).map(str::to_string))
            .collect();
        if !lines.iter().any(|l| l == "END-OF-ENV") {
            return false;
        }
        env = Some(
            lines
                .iter()
                .filter_map(|l| l.split_once('='))
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        );
        true
    });
    env.unwrap_or_default()
}

fn get<'a>(env: &'a BTreeMap<String, String>, name: &str) -> Option<&'a str> {
    env.get(name).map(String::as_str)
}

/// The cluster pod that uses every kind of env source.
fn full_env_pod() -> Pod {
    env_pod(
        "envy",
        json!({
            "resources": {"limits": {"cpu": "250m", "memory": "64Mi"}},
            "envFrom": [
                {"configMapRef": {"name": "app-config"}},
                {"secretRef": {"name": "app-secret"}, "prefix": "DB_"},
            ],
            "env": [
                {"name": "MODE", "valueFrom": {"configMapKeyRef": {"name": "app-config", "key": "mode"}}},
                {"name": "PASSWORD", "valueFrom": {"secretKeyRef": {"name": "app-secret", "key": "password"}}},
                {"name": "GREETING", "value": "$(greeting), $(POD_NAME)! $$(literal)"},
                {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
                {"name": "GREETING_AFTER", "value": "$(greeting), $(POD_NAME)!"},
                {"name": "POD_NAMESPACE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
                {"name": "POD_UID", "valueFrom": {"fieldRef": {"fieldPath": "metadata.uid"}}},
                {"name": "APP_LABEL", "valueFrom": {"fieldRef": {"fieldPath": "metadata.labels['app']"}}},
                {"name": "NODE_NAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
                {"name": "HOST_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.hostIP"}}},
                {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
                {"name": "CPU_MILLIS", "valueFrom": {"resourceFieldRef": {"resource": "limits.cpu", "divisor": "1m"}}},
                {"name": "MEM_MIB", "valueFrom": {"resourceFieldRef": {"resource": "limits.memory", "divisor": "1Mi"}}},
                {"name": "MEM_REQUEST", "valueFrom": {"resourceFieldRef": {"resource": "requests.memory"}}},
                {"name": "STORAGE_LIMIT", "valueFrom": {"resourceFieldRef": {"resource": "limits.ephemeral-storage"}}},
            ],
        }),
    )
}

#[test]
fn env_from_configmaps_secrets_fields_and_resources() {
    if !need_root() {
        return;
    }
    let api = double();
    let mut a = agent("env-full", &api, "5s");
    api.put_configmap(config_map(
        "app-config",
        &[("mode", "fast"), ("greeting", "hello"), ("1bad", "skipped")],
    ));
    api.put_secret(secret(
        "app-secret",
        &[("password", "s3cr3t-pa55"), ("user", "admin")],
    ));
    a.start();
    api.create_pod(full_env_pod());
    wait(&api, &a, "pod envy Running", |api| {
        phase(api, "envy").as_deref() == Some("Running")
    });
    let env = printed_env(&a, "envy", 0);

    // ConfigMap: a key by name, and every valid key through envFrom.
    assert_eq!(get(&env, "MODE"), Some("fast"));
    assert_eq!(get(&env, "mode"), Some("fast"));
    assert_eq!(get(&env, "greeting"), Some("hello"));
    assert_eq!(get(&env, "1bad"), None);
    // Secret: a key by name, and envFrom with a prefix.
    assert_eq!(get(&env, "PASSWORD"), Some("s3cr3t-pa55"));
    assert_eq!(get(&env, "DB_password"), Some("s3cr3t-pa55"));
    assert_eq!(get(&env, "DB_user"), Some("admin"));
    assert_eq!(get(&env, "user"), None);
    // $(VAR) sees envFrom and earlier variables only; $$ escapes.
    assert_eq!(
        get(&env, "GREETING"),
        Some("hello, $(POD_NAME)! $(literal)")
    );
    assert_eq!(get(&env, "GREETING_AFTER"), Some("hello, envy!"));
    // Fields of the pod as the cluster has it.
    let pod = api.get_pod("default", "envy").expect("pod");
    let status = pod.status.clone().expect("status");
    assert_eq!(get(&env, "POD_NAME"), Some("envy"));
    assert_eq!(get(&env, "POD_NAMESPACE"), Some("default"));
    assert_eq!(get(&env, "POD_UID"), pod.metadata.uid.as_deref());
    assert_eq!(get(&env, "APP_LABEL"), Some("envy"));
    assert_eq!(get(&env, "NODE_NAME"), Some(NODE));
    assert_eq!(get(&env, "HOST_IP"), status.host_ip.as_deref());
    assert_eq!(get(&env, "POD_IP"), status.pod_ip.as_deref());
    assert!(get(&env, "HOST_IP").is_some_and(|ip| !ip.is_empty()));
    // Resources: the container's limits, requests defaulted to them, and an unset
    // limit reported as the node's allocatable.
    assert_eq!(get(&env, "CPU_MILLIS"), Some("250"));
    assert_eq!(get(&env, "MEM_MIB"), Some("64"));
    assert_eq!(get(&env, "MEM_REQUEST"), Some("67108864"));
    let node = api.get_node(NODE).expect("node");
    let allocatable = node
        .status
        .and_then(|s| s.allocatable)
        .and_then(|a| a.get("ephemeral-storage").cloned())
        .expect("allocatable ephemeral-storage");
    let storage = holdfast::quantity::parse_bytes(&allocatable.0).expect("quantity");
    assert_eq!(
        get(&env, "STORAGE_LIMIT"),
        Some(storage.to_string().as_str())
    );
    // The image's own environment is still there.
    assert!(get(&env, "PATH").is_some());

    // The skipped key is reported as the kubelet reports it.
    wait(
        &api,
        &a,
        "an InvalidEnvironmentVariableNames event",
        |api| {
            api.list_events().iter().any(|e| {
                e.involved_object.name.as_deref() == Some("envy")
                    && e.reason.as_deref() == Some("InvalidEnvironmentVariableNames")
                    && e.message.as_deref()
                        == Some(
                            "Keys [1bad] from the EnvFrom configMap default/app-config were \
                         skipped since they are considered invalid environment variable names.",
                        )
            })
        },
    );
    // No secret value in the agent's log, and the OCI config that holds them is
    // root's alone.
    let log = a.agent_log();
    assert!(!log.contains("s3cr3t-pa55"), "secret value logged:\n{log}");
    let id = status
        .container_statuses
        .as_ref()
        .and_then(|cs| cs.first())
        .and_then(|c| c.container_id.as_deref())
        .and_then(|id| id.strip_prefix("libcontainer://"))
        .expect("containerID")
        .to_string();
    let config = support::agent::state_dir(&a.root, &id).join("bundle/config.json");
    let mode = std::fs::metadata(&config)
        .expect("config.json")
        .permissions();
    assert_eq!(
        std::os::unix::fs::PermissionsExt::mode(&mode) & 0o777,
        0o600,
        "{}",
        config.display()
    );
    a.stop();
    a.reset();
}

#[test]
fn a_missing_key_waits_in_create_container_config_error_until_the_configmap_has_it() {
    if !need_root() {
        return;
    }
    let api = double();
    // A resync only every 10 minutes: only the ConfigMap's arrival can start the
    // container within the test's time.
    let mut a = agent("env-late", &api, "10m");
    api.put_configmap(config_map("late-config", &[("other", "x")]));
    a.start();
    api.create_pod(env_pod(
        "late",
        json!({"env": [{"name": "MODE", "valueFrom":
            {"configMapKeyRef": {"name": "late-config", "key": "mode"}}}]}),
    ));
    let message = "couldn't find key mode in ConfigMap default/late-config";
    wait(
        &api,
        &a,
        "CreateContainerConfigError in the pod status",
        |api| {
            waiting(api, "late").is_some_and(|w| {
                w.reason.as_deref() == Some("CreateContainerConfigError")
                    && w.message.as_deref() == Some(message)
            })
        },
    );
    assert_eq!(phase(&api, "late").as_deref(), Some("Pending"));
    wait(&api, &a, "a Failed event with the message", |api| {
        api.list_events().iter().any(|e| {
            e.involved_object.name.as_deref() == Some("late")
                && e.reason.as_deref() == Some("Failed")
                && e.message.as_deref() == Some(&format!("Error: {message}"))
        })
    });

    let put = Instant::now();
    api.put_configmap(config_map(
        "late-config",
        &[("other", "x"), ("mode", "late")],
    ));
    wait(&api, &a, "pod late Running", |api| {
        phase(api, "late").as_deref() == Some("Running")
    });
    assert!(
        put.elapsed() < Duration::from_secs(60),
        "started {:?} after the ConfigMap arrived",
        put.elapsed()
    );
    let env = printed_env(&a, "late", 0);
    assert_eq!(get(&env, "MODE"), Some("late"));
    assert_eq!(waiting(&api, "late"), None);
    a.stop();
    a.reset();
}

/// SIGKILLs every shim and container of `a`, as a power cut would: no exit records.
fn kill_all_containers(a: &Agent) {
    let root = a.root.display().to_string();
    let ours = |pid: u32| {
        let cmd = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
        // Containers see their own root; their cgroup is under the agent's.
        let cgroup = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).unwrap_or_default();
        String::from_utf8_lossy(&cmd).contains(&root) || cgroup.contains(&a.cgroup_root)
    };
    let pids = || -> Vec<u32> {
        std::fs::read_dir("/proc")
            .into_iter()
            .flatten()
            .flatten()
            .filter_map(|e| e.file_name().to_string_lossy().parse::<u32>().ok())
            .filter(|&pid| ours(pid))
            .collect()
    };
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let left = pids();
        if left.is_empty() {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "processes of {root} survive SIGKILL: {left:?}"
        );
        for pid in left {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid as i32),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn after_a_reboot_with_no_uplink_secret_env_comes_from_the_store() {
    if !need_root() {
        return;
    }
    let api = double();
    let mut a = agent("env-offline", &api, "5s");
    api.put_secret(secret("app-secret", &[("password", "offline-pa55")]));
    a.start();
    api.create_pod(env_pod(
        "offline",
        json!({"env": [{"name": "PASSWORD", "valueFrom":
            {"secretKeyRef": {"name": "app-secret", "key": "password"}}}],
               "envFrom": [{"secretRef": {"name": "app-secret"}, "prefix": "S_"}]}),
    ));
    wait(&api, &a, "pod offline Running", |api| {
        phase(api, "offline").as_deref() == Some("Running")
    });
    assert_eq!(
        get(&printed_env(&a, "offline", 0), "PASSWORD"),
        Some("offline-pa55")
    );

    // Power cut: the agent and every container die at once; the uplink is gone when
    // the device comes back.
    a.kill9();
    kill_all_containers(&a);
    drop(api);
    a.start();
    a.wait_pod("offline", "running again", WAIT, |p| {
        p["status"]["phase"] == "Running"
            && support::agent::container(p, "main")["restartCount"] == 1
    });
    let env = printed_env(&a, "offline", 1);
    assert_eq!(get(&env, "PASSWORD"), Some("offline-pa55"));
    assert_eq!(get(&env, "S_password"), Some("offline-pa55"));
    let log = a.agent_log();
    assert!(!log.contains("offline-pa55"), "secret value logged:\n{log}");
    a.stop();
    a.reset();
}
