//! A real `holdfast run` pulling from Debian's `docker-registry` on 127.0.0.1 (TLS from
//! the test's CA, images pushed with skopeo), running real containers: pull policies
//! and the waiting reasons ErrImagePull then ImagePullBackOff in the pod status, the
//! offline fallback (and turning it off), `holdfast image pull` through the running agent
//! with its progress, `image prune`, and a cluster pod whose pull secret comes through
//! the kube-apiserver double, with the kubelet's events and no credential in the log.

use support::{apiserver, pki, registry};

use std::collections::BTreeMap;
use std::process::Command;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Container, LocalObjectReference, Pod, PodSpec, Secret};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::ByteString;
use registry::{push_busybox, sleep_pod, waiting, Auth, Registry};
use serde_json::Value;
use support::agent::{bin, container, need_root, Agent};

const WAIT: Duration = Duration::from_secs(60);

/// The agent's config: trust the test CA for `hosts`, a short pull back-off.
fn registry_config(hosts: &[&Registry], extra: &str) -> String {
    format!(
        "  imagePullBackOffInitial: 2s\n  imagePullBackOffMax: 4s\n{}{extra}",
        registry::trusted(hosts)
    )
}

fn running(p: &Value) -> bool {
    container(p, "c")["state"]["running"].is_object()
}

#[test]
fn pull_policies_and_pull_back_off_in_the_pod_status() {
    if !need_root() || !registry::tools_present() {
        return;
    }
    let mut a = Agent::new("pull-policies");
    let pki = pki::Pki::new(&a.dir.join("pki"));
    let reg = Registry::start(&a.dir.join("registry"), &pki, Auth::None);
    push_busybox(&reg, &a.dir, "edge/app", "1", None);
    a.write_config(&registry_config(&[&reg], ""));
    let host = reg.host();
    let app = format!("{host}/edge/app:1");
    // Two pods want the new image at once: one download.
    a.write_manifest("always.yaml", &sleep_pod("always", &app, "Always"));
    a.write_manifest("always-too.yaml", &sleep_pod("always-too", &app, "Always"));
    a.start();
    a.wait_pod("always", "running from the pulled image", WAIT, running);
    a.wait_pod("always-too", "running from the pulled image", WAIT, running);
    let blob_gets: Vec<String> = reg
        .requests("/v2/edge/app/blobs/")
        .iter()
        .filter_map(|l| {
            l.split_whitespace()
                .find(|w| w.starts_with("/v2/"))
                .map(str::to_string)
        })
        .collect();
    let distinct: std::collections::BTreeSet<&String> = blob_gets.iter().collect();
    assert!(!blob_gets.is_empty());
    assert_eq!(
        blob_gets.len(),
        distinct.len(),
        "a blob fetched twice: {blob_gets:?}"
    );
    let log = a.agent_log();
    assert!(
        log.contains(&format!("Successfully pulled image \"{app}\" in "))
            && log.contains("Image size: "),
        "{log}"
    );
    let manifest_gets = || reg.requests("/v2/edge/app/manifests/1").len();
    let after_always = manifest_gets();
    assert!(after_always >= 1);

    // IfNotPresent with the image here: no request to the registry.
    a.write_manifest("ifnot.yaml", &sleep_pod("ifnot", &app, "IfNotPresent"));
    a.wait_pod("ifnot", "running", WAIT, running);
    assert_eq!(
        manifest_gets(),
        after_always,
        "IfNotPresent asked the registry"
    );

    // Never with an image that is not here.
    a.write_manifest(
        "never.yaml",
        &sleep_pod("never", &format!("{host}/edge/app:2"), "Never"),
    );
    let p = a.wait_pod("never", "ErrImageNeverPull", WAIT, |p| {
        waiting(p).0 == "ErrImageNeverPull"
    });
    assert!(
        waiting(&p)
            .1
            .contains("is not present with pull policy of Never"),
        "{p}"
    );

    // A tag the registry does not have: ErrImagePull with its error, then the back-off.
    let missing = format!("{host}/edge/app:nope");
    a.write_manifest(
        "missing.yaml",
        &sleep_pod("missing", &missing, "IfNotPresent"),
    );
    let p = a.wait_pod("missing", "ErrImagePull", WAIT, |p| {
        waiting(p).0 == "ErrImagePull"
    });
    let (_, message) = waiting(&p);
    assert!(
        message.contains(&missing) && message.contains("MANIFEST_UNKNOWN"),
        "{message}"
    );
    let p = a.wait_pod("missing", "ImagePullBackOff", WAIT, |p| {
        waiting(p).0 == "ImagePullBackOff"
    });
    let (_, message) = waiting(&p);
    assert!(
        message.starts_with(&format!(
            "Back-off pulling image \"{missing}\": ErrImagePull: "
        )),
        "{message}"
    );
    assert_eq!(p["status"]["phase"], "Pending");
    // Once the tag exists, the next try after the back-off pulls it and the pod runs.
    push_busybox(&reg, &a.dir, "edge/app", "nope", None);
    a.wait_pod("missing", "running once the tag exists", WAIT, running);
    drop(reg);
    a.reset();
    a.assert_clean();
}

#[test]
fn offline_an_always_pull_runs_the_image_that_is_here_unless_turned_off() {
    if !need_root() || !registry::tools_present() {
        return;
    }
    let mut a = Agent::new("pull-offline");
    let pki = pki::Pki::new(&a.dir.join("pki"));
    let mut reg = Registry::start(&a.dir.join("registry"), &pki, Auth::None);
    push_busybox(&reg, &a.dir, "edge/app", "1", None);
    a.write_config(&registry_config(&[&reg], ""));
    let app = format!("{}/edge/app:1", reg.host());
    a.write_manifest("first.yaml", &sleep_pod("first", &app, "Always"));
    a.start();
    a.wait_pod("first", "running", WAIT, running);

    // The registry is gone (the uplink is down): the image that is here runs.
    reg.stop();
    a.write_manifest("second.yaml", &sleep_pod("second", &app, "Always"));
    a.wait_pod("second", "running from the image here", WAIT, running);
    let log = a.agent_log();
    assert!(
        log.contains("the registry cannot be reached, so the image present on this node"),
        "{log}"
    );

    // Turned off, the same pod waits in ErrImagePull with the connection's error.
    a.stop();
    a.write_config(&registry_config(
        &[&reg],
        "  imagePullOfflineFallback: false\n",
    ));
    a.start();
    a.write_manifest("third.yaml", &sleep_pod("third", &app, "Always"));
    let p = a.wait_pod("third", "ErrImagePull", WAIT, |p| {
        matches!(waiting(p).0.as_str(), "ErrImagePull" | "ImagePullBackOff")
    });
    assert!(waiting(&p).1.contains(&reg.host()), "{p}");
    a.wait_pod("first", "still running", WAIT, running);
    a.reset();
    a.assert_clean();
}

#[test]
fn image_pull_goes_through_the_running_agent_and_prune_keeps_what_pods_use() {
    if !need_root() || !registry::tools_present() {
        return;
    }
    let mut a = Agent::new("pull-cli");
    let pki = pki::Pki::new(&a.dir.join("pki"));
    let reg = Registry::start(&a.dir.join("registry"), &pki, Auth::None);
    push_busybox(&reg, &a.dir, "edge/app", "1", None);
    push_busybox(&reg, &a.dir, "edge/other", "1", None);
    // The read-only port serves /metrics without a client certificate.
    let metrics_port = support::agent::free_port();
    a.write_config(&format!(
        "{}readOnlyPort: {metrics_port}\n",
        registry_config(&[&reg], "")
    ));
    a.start();
    let metric = |name: &str| -> f64 {
        let out = Command::new("curl")
            .args(["-sf", &format!("http://127.0.0.1:{metrics_port}/metrics")])
            .output()
            .expect("curl");
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        text.lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
            .unwrap_or_else(|| panic!("no {name} in /metrics:\n{text}"))
    };
    assert_eq!(metric("holdfast_image_pull_duration_seconds_count"), 0.0);
    let pull = |r: &str| {
        Command::new(bin())
            .args(["image", "pull", r, "--root-dir"])
            .arg(&a.root)
            .output()
            .expect("holdfast image pull")
    };
    let app = format!("{}/edge/app:1", reg.host());
    let out = pull(&app);
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "{said}\n{}", a.agent_log());
    // Not a terminal: one line per layer as it goes and when it is done.
    assert!(
        said.contains("layer ") && said.contains(": done "),
        "{said}"
    );
    assert!(said.contains(&format!("pulled {app}")), "{said}");
    // The pull is counted in the agent's own metrics, bytes and time.
    assert_eq!(metric("holdfast_image_pull_duration_seconds_count"), 1.0);
    assert!(metric("holdfast_image_pull_bytes_total") > 100_000.0);
    let other = format!("{}/edge/other:1", reg.host());
    assert!(pull(&other).status.success());

    a.write_manifest(
        "uses-app.yaml",
        &sleep_pod("uses-app", &app, "IfNotPresent"),
    );
    a.wait_pod("uses-app", "running", WAIT, running);
    let out = Command::new(bin())
        .args(["image", "prune", "--root-dir"])
        .arg(&a.root)
        .output()
        .expect("holdfast image prune");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let ls = Command::new(bin())
        .args(["image", "ls", "--root-dir"])
        .arg(&a.root)
        .output()
        .expect("holdfast image ls");
    let ls = String::from_utf8_lossy(&ls.stdout);
    assert!(ls.contains(&format!("{}/edge/app", reg.host())), "{ls}");
    assert!(!ls.contains("edge/other"), "{ls}");
    // The image a pod ran from says when.
    let row = ls.lines().find(|l| l.contains("edge/app")).unwrap_or("");
    assert!(!row.ends_with("never"), "{row}");
    a.reset();
    a.assert_clean();
}

#[test]
fn a_static_pod_pulls_with_the_nodes_docker_config() {
    if !need_root() || !registry::tools_present() {
        return;
    }
    let mut a = Agent::new("pull-node-creds");
    let password = "node-config-pw-0x7e";
    let reg = Registry::start(
        &a.dir.join("registry"),
        &pki::Pki::new(&a.dir.join("pki")),
        Auth::Basic {
            user: "site",
            password,
        },
    );
    push_busybox(&reg, &a.dir, "site/app", "1", Some(("site", password)));
    a.write_config(&registry_config(&[&reg], ""));
    a.start();
    let image = format!("{}/site/app:1", reg.host());
    a.write_manifest("app.yaml", &sleep_pod("app", &image, "IfNotPresent"));
    // No credentials on the node yet: the registry refuses, the pod waits.
    let p = a.wait_pod("app", "refused", WAIT, |p| {
        matches!(waiting(p).0.as_str(), "ErrImagePull" | "ImagePullBackOff")
    });
    let (_, message) = waiting(&p);
    assert!(message.contains("authentication failed"), "{message}");
    // The node's docker config.json (in the root dir, the kubelet's first place to
    // look), base64 `auth` form: the next try pulls.
    let config = format!(
        "{{\"auths\":{{\"{}\":{{\"auth\":\"{}\"}}}}}}",
        reg.host(),
        registry::b64(format!("site:{password}").as_bytes())
    );
    std::fs::write(a.root.join("config.json"), config).expect("config.json");
    a.wait_pod("app", "running", WAIT, running);
    let log = a.agent_log();
    assert!(!log.contains(password), "the password in the log");
    a.reset();
    a.assert_clean();
}

#[test]
fn a_cluster_pod_pulls_with_its_pull_secret_and_the_cluster_sees_the_kubelets_events() {
    if !need_root() || !registry::tools_present() {
        return;
    }
    let api = apiserver::start(apiserver::Options::default());
    let mut a = Agent::new("pull-cluster");
    let password = "pull-secret-pw-0x51";
    let reg = Registry::start(
        &a.dir.join("registry"),
        &pki::Pki::new(&a.dir.join("pki")),
        Auth::Basic {
            user: "puller",
            password,
        },
    );
    push_busybox(&reg, &a.dir, "team/app", "1", Some(("puller", password)));
    a.node_name = "edge-node-1".into();
    a.write_config(&registry_config(&[&reg], ""));
    let kubeconfig = api.kubeconfig_with(
        &a.dir,
        apiserver::Identity::Node("edge-node-1"),
        &apiserver::KubeconfigOptions::default(),
    );
    a.extra_args = vec![
        "--kubeconfig".into(),
        kubeconfig.display().to_string(),
        "--v=4".into(),
    ];
    let auth = registry::b64(format!("puller:{password}").as_bytes());
    let dockerconfig = format!(
        "{{\"auths\":{{\"{}\":{{\"auth\":\"{auth}\"}}}}}}",
        reg.host()
    );
    api.put_secret(Secret {
        metadata: ObjectMeta {
            name: Some("regcred".into()),
            namespace: Some("default".into()),
            ..ObjectMeta::default()
        },
        type_: Some("kubernetes.io/dockerconfigjson".into()),
        data: Some(BTreeMap::from([(
            ".dockerconfigjson".to_string(),
            ByteString(dockerconfig.into_bytes()),
        )])),
        ..Secret::default()
    });
    let pod = |name: &str, image: String| Pod {
        metadata: ObjectMeta {
            name: Some(name.into()),
            namespace: Some("default".into()),
            ..ObjectMeta::default()
        },
        spec: Some(PodSpec {
            node_name: Some("edge-node-1".into()),
            host_network: Some(true),
            termination_grace_period_seconds: Some(1),
            image_pull_secrets: Some(vec![LocalObjectReference {
                name: "regcred".into(),
            }]),
            containers: vec![Container {
                name: "c".into(),
                image: Some(image),
                command: Some(vec!["sleep".into(), "3600".into()]),
                ..Container::default()
            }],
            ..PodSpec::default()
        }),
        status: None,
    };
    let app = format!("{}/team/app:1", reg.host());
    let missing = format!("{}/team/app:nope", reg.host());
    api.create_pod(pod("app", app.clone()));
    api.create_pod(pod("missing", missing.clone()));
    a.start();
    let events = |pod: &str| -> Vec<(String, String, String)> {
        api.list_events()
            .into_iter()
            .filter(|e| e.involved_object.name.as_deref() == Some(pod))
            .map(|e| {
                (
                    e.type_.unwrap_or_default(),
                    e.reason.unwrap_or_default(),
                    e.message.unwrap_or_default(),
                )
            })
            .collect()
    };
    let has = |pod: &str, reason: &str, start: &str| {
        events(pod)
            .iter()
            .any(|(_, r, m)| r == reason && m.starts_with(start))
    };
    let ok = api.wait_for(WAIT, |api| {
        api.get_pod("default", "app")
            .and_then(|p| p.status)
            .and_then(|s| s.phase)
            .as_deref()
            == Some("Running")
            && has(
                "app",
                "Pulled",
                &format!("Successfully pulled image \"{app}\" in "),
            )
    });
    assert!(
        ok,
        "app never ran with its events: {:?}\n{}",
        events("app"),
        a.agent_log()
    );
    assert!(
        has("app", "Pulling", &format!("Pulling image \"{app}\"")),
        "{:?}",
        events("app")
    );
    let pulled = events("app")
        .into_iter()
        .find(|(_, r, _)| r == "Pulled")
        .map(|e| e.2)
        .unwrap_or_default();
    assert!(
        pulled.contains("including waiting). Image size: ") && pulled.ends_with(" bytes."),
        "{pulled}"
    );

    let ok = api.wait_for(WAIT, |_| {
        has(
            "missing",
            "Failed",
            &format!("Failed to pull image \"{missing}\": "),
        ) && has("missing", "Failed", "Error: ErrImagePull")
            && has(
                "missing",
                "BackOff",
                &format!("Back-off pulling image \"{missing}\""),
            )
            && has("missing", "Failed", "Error: ImagePullBackOff")
    });
    assert!(
        ok,
        "pull failure events: {:?}\n{}",
        events("missing"),
        a.agent_log()
    );
    let waiting = api
        .get_pod("default", "missing")
        .and_then(|p| p.status)
        .and_then(|s| s.container_statuses)
        .and_then(|c| c.into_iter().next())
        .and_then(|c| c.state)
        .and_then(|s| s.waiting)
        .and_then(|w| w.reason);
    assert!(
        matches!(
            waiting.as_deref(),
            Some("ErrImagePull" | "ImagePullBackOff")
        ),
        "{waiting:?}"
    );

    // No credential in the agent's log, at --v=4.
    let log = a.agent_log();
    assert!(
        !log.contains(password) && !log.contains(&auth),
        "a credential in the agent log"
    );
    a.reset();
    a.assert_clean();
}
