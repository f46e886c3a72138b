//! What a container's streams and environment hold when the agent runs with
//! `RUST_LOG=debug` (its shims inherit it): only what the command wrote and the pod's
//! environment, never the runtime's own log lines; and an image whose config sets no
//! PATH still runs `sh` with containerd's default one. Real containers (as root), exec
//! through the kubelet API with Python's websocket-client.

use support::{agent, kubelet_api};

use std::time::Duration;

use agent::{container, need_root, oci};
use kubelet_api::{ws_session, Api};
use serde_json::json;

const WAIT: Duration = Duration::from_secs(60);

/// The lines of a CRI log file, as (stream, text).
fn cri_lines(log: &str) -> Vec<(String, String)> {
    log.lines()
        .map(|l| {
            let mut f = l.splitn(4, ' ');
            let _time = f.next();
            let stream = f.next().unwrap_or_default().to_owned();
            let _tag = f.next();
            (stream, f.next().unwrap_or_default().to_owned())
        })
        .collect()
}

#[test]
fn streams_and_environment_hold_only_the_pods_own() {
    if !need_root() {
        return;
    }
    let mut api = Api::start("streams-clean");
    // Again with the runtime at its most talkative.
    api.agent.kill9();
    api.agent
        .extra_env
        .push(("RUST_LOG".into(), "debug".into()));
    // An image built without Env: no PATH in its config.
    let mut nopath = oci::busybox_image("docker.io/library/nopath:1").expect("image");
    nopath.config.env.clear();
    nopath
        .write_layout_tar(&api.agent.root.join("images/nopath.tar"))
        .expect("image tar");
    api.agent.start();
    api.agent.write_manifest(
        "talk.yaml",
        r#"apiVersion: v1
kind: Pod
metadata: {name: talk}
spec:
  hostNetwork: true
  terminationGracePeriodSeconds: 1
  containers:
  - name: main
    image: docker.io/library/busybox:demo
    env: [{name: MINE, value: "yes"}]
    command: ["sh", "-c", "echo out-1; echo err-1 >&2; env | sort | grep -v '^HOSTNAME=' | sed 's/^/env /'; echo END; exec sleep 3600"]
  - name: nopath
    image: docker.io/library/nopath:1
    command: ["sh", "-c", "echo PATH=$PATH; exec sleep 3600"]
"#,
    );
    let a = &api.agent;
    let p = a.wait_pod("talk", "both containers running", WAIT, |p| {
        ["main", "nopath"]
            .iter()
            .all(|c| !container(p, c)["state"]["running"].is_null())
    });
    let mut lines = Vec::new();
    a.wait_until("the container's output", WAIT, |a| {
        lines = cri_lines(&a.container_log(&p, "main", 0));
        lines.iter().any(|(_, t)| t == "END")
    });
    let of = |stream: &str| -> Vec<String> {
        lines
            .iter()
            .filter(|(s, _)| s == stream)
            .map(|(_, t)| t.clone())
            .collect()
    };
    assert_eq!(of("stderr"), vec!["err-1"], "{lines:#?}");
    let out = of("stdout");
    assert_eq!(out.first().map(String::as_str), Some("out-1"), "{out:#?}");
    assert_eq!(out.last().map(String::as_str), Some("END"), "{out:#?}");
    // The pod's variables, the image's PATH and what the runtime adds (HOME, and
    // HOSTNAME left out above); nothing of the agent's environment.
    let env: Vec<&str> = out.iter().filter_map(|l| l.strip_prefix("env ")).collect();
    assert_eq!(
        env,
        vec![
            "HOME=/root",
            "MINE=yes",
            "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
            "PWD=/",
            "SHLVL=1",
        ],
        "{out:#?}"
    );
    assert_eq!(
        out.len(),
        env.len() + 2,
        "only what the command wrote: {out:#?}"
    );

    // The runtime did log at debug: into the shims' own logs.
    let shim_logs: String = std::fs::read_dir(a.root.join("boot/containers"))
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| std::fs::read_to_string(e.path().join("shim.log")).ok())
        .collect();
    assert!(
        shim_logs.contains("DEBUG libcontainer"),
        "no libcontainer debug lines in shim.log: {shim_logs}"
    );

    // An exec's stderr: the command's words alone.
    let cmd = "command=sh&command=-c&command=echo%20hello%3B%20echo%20oops%20%3E%262%3B%20exit%203";
    let r = ws_session(
        &api,
        &format!("/exec/default/talk-node-1/main?{cmd}&stdout=true&stderr=true"),
        "v4.channel.k8s.io",
        json!([["drain"]]),
    );
    assert_eq!(r["channels"]["1"], "hello\n", "{r}");
    assert_eq!(r["channels"]["2"], "oops\n", "{r}");
    assert!(
        r["channels"]["3"].as_str().unwrap_or("").contains("\"3\""),
        "{r}"
    );

    // No PATH in the image: containerd's default one, and `sh` is found with it.
    let mut nopath = Vec::new();
    a.wait_until("the PATH-less container's output", WAIT, |a| {
        nopath = cri_lines(&a.container_log(&p, "nopath", 0));
        !nopath.is_empty()
    });
    assert_eq!(
        nopath,
        vec![(
            "stdout".to_owned(),
            "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin".to_owned()
        )]
    );

    api.agent.reset();
    api.agent.assert_clean();
}
