//! End-to-end: `holdfast run` on real libcontainer containers, as root, checked the way
//! a user checks them (`holdfast pods`, log files, processes).

use std::time::{Duration, Instant};

use support::agent::{condition, container, container_pid, need_root, pid_alive, Agent};

const MIN: Duration = Duration::from_secs(60);

fn pod_yaml(name: &str, policy: &str, grace: u32, containers: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: {name}\nspec:\n  hostNetwork: true\n  \
         restartPolicy: {policy}\n  terminationGracePeriodSeconds: {grace}\n  containers:\n{containers}"
    )
}

fn sh(name: &str, script: &str) -> String {
    format!(
        "    - name: {name}\n      image: busybox:demo\n      command: [\"sh\", \"-c\", {}]\n",
        serde_json::to_string(script).expect("json string")
    )
}

fn running(p: &serde_json::Value, c: &str) -> bool {
    container(p, c)["state"]["running"].is_object()
}

#[test]
fn static_pod_runs_logs_in_cri_format_and_shows_running() {
    if !need_root() {
        return;
    }
    let mut a = Agent::new("basic");
    a.write_manifest(
        "web.yaml",
        &pod_yaml(
            "web",
            "Always",
            2,
            &sh(
                "main",
                "echo hello out; echo hello err >&2; exec sleep 1000",
            ),
        ),
    );
    a.start();
    let p = a.wait_pod("web", "running", MIN, |p| running(p, "main"));
    assert_eq!(p["status"]["phase"], "Running");
    assert_eq!(p["pod"]["metadata"]["namespace"], "default");
    assert_eq!(p["pod"]["spec"]["nodeName"], "node-1");
    let c = container(&p, "main");
    assert_eq!(c["ready"], true);
    assert_eq!(c["started"], true);
    assert_eq!(c["restartCount"], 0);
    assert_eq!(c["image"], "busybox:demo");
    assert!(
        c["imageID"]
            .as_str()
            .unwrap_or("")
            .starts_with("docker.io/library/busybox@sha256:"),
        "{c}"
    );
    assert!(
        c["containerID"]
            .as_str()
            .unwrap_or("")
            .starts_with("libcontainer://"),
        "{c}"
    );
    assert!(c["state"]["running"]["startedAt"].is_string());
    for t in [
        "Ready",
        "ContainersReady",
        "Initialized",
        "PodReadyToStartContainers",
    ] {
        assert_eq!(condition(&p, t)["status"], "True", "condition {t}: {p}");
    }
    assert!(p["status"]["hostIP"].is_string());
    assert!(p["status"]["startTime"].is_string());

    let table = a.pods_table();
    assert!(table.contains("web-node-1"), "{table}");
    assert!(table.contains("Running"), "{table}");

    a.wait_until("both log lines", MIN, |a| {
        let log = a.container_log(&p, "main", 0);
        log.contains("hello out") && log.contains("hello err")
    });
    let log = a.container_log(&p, "main", 0);
    for line in log.lines() {
        let f: Vec<&str> = line.splitn(4, ' ').collect();
        assert_eq!(f.len(), 4, "CRI line has four fields: {line:?}");
        assert!(
            f[0].parse::<k8s_openapi::jiff::Timestamp>().is_ok(),
            "RFC 3339 time: {line:?}"
        );
        assert!(f[1] == "stdout" || f[1] == "stderr", "stream: {line:?}");
        assert!(f[2] == "F" || f[2] == "P", "tag: {line:?}");
    }
    assert!(
        log.lines().any(|l| l.ends_with(" stdout F hello out")),
        "{log}"
    );
    assert!(
        log.lines().any(|l| l.ends_with(" stderr F hello err")),
        "{log}"
    );

    // The agent's own log, as journald or a log file takes it: `[time LEVEL target]
    // message`, a UTC time to the second, no colour codes, later lines of a message
    // indented.
    let agent_log = a.agent_log();
    for line in agent_log.lines().filter(|l| !l.starts_with("    ")) {
        let head = line
            .strip_prefix('[')
            .and_then(|l| l.split_once("] "))
            .map(|(head, _)| head.splitn(3, ' ').collect::<Vec<_>>());
        let ok = head.as_deref().is_some_and(|h| {
            h.len() == 3
                && h[0].len() == 20
                && h[0].ends_with('Z')
                && h[0].parse::<k8s_openapi::jiff::Timestamp>().is_ok()
                && ["ERROR", "WARN", "INFO", "DEBUG", "TRACE"].contains(&h[1])
                && h[2].trim_start().split("::").all(|m| {
                    !m.is_empty() && m.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
                })
        });
        assert!(ok && !line.contains('\u{1b}'), "agent log line: {line:?}");
    }
    assert!(
        agent_log
            .lines()
            .any(|l| l.contains(" INFO  holdfast::agent] holdfast ")
                && l.contains(" running as node node-1")),
        "{agent_log}"
    );

    // A periodic resync writes nothing when nothing changed: the status is stable.
    let before = a.pod("web").expect("pod");
    a.stop();
    a.reset();
    a.assert_clean();
    drop(before);
}

#[test]
fn restart_policies_and_crash_loop_back_off() {
    if !need_root() {
        return;
    }
    let mut a = Agent::new("restart");
    a.write_manifest(
        "always.yaml",
        &pod_yaml("always", "Always", 1, &sh("c", "echo run; exit 3")),
    );
    a.write_manifest(
        "onfailure.yaml",
        &pod_yaml("onfailure", "OnFailure", 1, &sh("c", "exit 0")),
    );
    a.write_manifest(
        "never.yaml",
        &pod_yaml("never", "Never", 1, &sh("c", "exit 1")),
    );
    a.start();

    let p = a.wait_pod("always", "restarted three times", MIN, |p| {
        container(p, "c")["restartCount"].as_i64().unwrap_or(0) >= 3
    });
    let c = container(&p, "c");
    let last = &c["lastState"]["terminated"];
    assert_eq!(last["exitCode"], 3, "{c}");
    assert_eq!(last["reason"], "Error", "{c}");
    assert!(last["finishedAt"].is_string());
    assert_eq!(
        p["status"]["phase"], "Running",
        "Always keeps a crashing pod Running"
    );

    let p = a.wait_pod("always", "in CrashLoopBackOff", MIN, |p| {
        container(p, "c")["state"]["waiting"]["reason"] == "CrashLoopBackOff"
    });
    let msg = container(&p, "c")["state"]["waiting"]["message"]
        .as_str()
        .unwrap_or("")
        .to_string();
    assert!(msg.starts_with("back-off "), "{msg}");
    assert!(
        msg.contains("restarting failed container=c pod=always-node-1_default("),
        "{msg}"
    );

    // Each run logged to its own file, `<restart>.log`.
    let log0 = a.container_log(&p, "c", 0);
    assert!(log0.contains("run"), "first run logged: {log0:?}");

    let p = a.wait_pod("onfailure", "succeeded", MIN, |p| {
        p["status"]["phase"] == "Succeeded"
    });
    let c = container(&p, "c");
    assert_eq!(c["restartCount"], 0);
    assert_eq!(c["state"]["terminated"]["reason"], "Completed");
    assert_eq!(c["state"]["terminated"]["exitCode"], 0);

    let p = a.wait_pod("never", "failed", MIN, |p| p["status"]["phase"] == "Failed");
    let c = container(&p, "c");
    assert_eq!(c["restartCount"], 0);
    assert_eq!(c["state"]["terminated"]["exitCode"], 1);
    assert_eq!(c["state"]["terminated"]["reason"], "Error");
    assert_eq!(condition(&p, "Ready")["status"], "False");

    // Restart timing, from the start times the runtime recorded: each gap is at least
    // the back-off step (1 s, 2 s, 4 s) it had to serve.
    let p = a.wait_pod("always", "restarted four times", MIN, |p| {
        container(p, "c")["restartCount"].as_i64().unwrap_or(0) >= 4
    });
    let first_line_time = |restart: u32| -> k8s_openapi::jiff::Timestamp {
        let log = a.container_log(&p, "c", restart);
        let first = log
            .lines()
            .next()
            .unwrap_or_else(|| panic!("{restart}.log is empty"));
        first
            .split(' ')
            .next()
            .and_then(|t| t.parse().ok())
            .expect("CRI timestamp")
    };
    let starts: Vec<_> = (0..4).map(first_line_time).collect();
    let gaps: Vec<f64> = starts
        .windows(2)
        .map(|w| w[1].duration_since(w[0]).as_secs_f64())
        .collect();
    // Back-off of 1 s doubling to a 4 s cap: the waits before restarts 1, 2 and 3.
    for (gap, want) in gaps.iter().zip([1.0, 2.0, 4.0]) {
        assert!(
            *gap >= want,
            "restart came after {gap:.2}s, before its {want}s back-off: {gaps:?}"
        );
    }
    assert!(gaps[2] > gaps[0], "back-off grows: {gaps:?}");
    a.stop();
    a.reset();
    a.assert_clean();
}

#[test]
fn memory_limit_ends_in_oom_killed() {
    if !need_root() {
        return;
    }
    let mut a = Agent::new("oom");
    let c = "    - name: hog\n      image: busybox:demo\n      command: [\"sh\", \"-c\", \"head -c 200m /dev/zero | tail\"]\n      resources:\n        limits:\n          memory: 16Mi\n";
    a.write_manifest("hog.yaml", &pod_yaml("hog", "Never", 1, c));
    a.start();
    let p = a.wait_pod("hog", "terminated", MIN, |p| {
        container(p, "hog")["state"]["terminated"].is_object()
    });
    let t = &container(&p, "hog")["state"]["terminated"];
    assert_eq!(t["reason"], "OOMKilled", "{t}");
    assert_eq!(t["exitCode"], 137, "{t}");
    assert_eq!(p["status"]["phase"], "Failed");
    a.stop();
    a.reset();
    a.assert_clean();
}

#[test]
fn removed_manifest_stops_the_pod_gracefully() {
    if !need_root() {
        return;
    }
    let mut a = Agent::new("graceful");
    a.write_manifest(
        "polite.yaml",
        &pod_yaml(
            "polite",
            "Always",
            20,
            &sh(
                "c",
                "trap 'echo got TERM; exit 0' TERM; while true; do sleep 0.1; done",
            ),
        ),
    );
    a.write_manifest(
        "stubborn.yaml",
        &pod_yaml(
            "stubborn",
            "Always",
            3,
            &sh(
                "c",
                "trap 'echo ignoring TERM' TERM; while true; do sleep 0.1; done",
            ),
        ),
    );
    a.start();
    let polite = a.wait_pod("polite", "running", MIN, |p| running(p, "c"));
    let stubborn = a.wait_pod("stubborn", "running", MIN, |p| running(p, "c"));
    let polite_pid = container_pid(&a, &polite, "c");
    let stubborn_pid = container_pid(&a, &stubborn, "c");
    let polite_log_dir = a.container_log(&polite, "c", 0);
    drop(polite_log_dir);

    let t0 = Instant::now();
    a.remove_manifest("polite.yaml");
    a.remove_manifest("stubborn.yaml");
    a.wait_until("the polite container to exit", MIN, |_| {
        !pid_alive(polite_pid)
    });
    let polite_took = t0.elapsed();
    a.wait_until("the stubborn container to be killed", MIN, |_| {
        !pid_alive(stubborn_pid)
    });
    let stubborn_took = t0.elapsed();
    assert!(
        polite_took < Duration::from_secs(15),
        "SIGTERM handled within its grace period: {polite_took:?}"
    );
    assert!(
        stubborn_took >= Duration::from_secs(3),
        "killed only after its 3 s grace period: {stubborn_took:?}"
    );
    a.wait_gone("polite", MIN);
    a.wait_gone("stubborn", MIN);
    let log = a.agent_log();
    assert!(log.contains("grace period over, killing"), "{log}");
    a.stop();
    a.reset();
    a.assert_clean();
}

#[test]
fn containers_outlive_a_killed_agent_and_exits_are_not_lost() {
    if !need_root() {
        return;
    }
    let mut a = Agent::new("outlive");
    a.write_manifest(
        "long.yaml",
        &pod_yaml("long", "Always", 1, &sh("c", "exec sleep 1000")),
    );
    a.write_manifest(
        "short.yaml",
        &pod_yaml(
            "short",
            "Never",
            1,
            &sh("c", "while [ ! -e /tmp/go ]; do sleep 0.1; done; exit 7"),
        ),
    );
    a.start();
    let long = a.wait_pod("long", "running", MIN, |p| running(p, "c"));
    let short = a.wait_pod("short", "running", MIN, |p| running(p, "c"));
    let long_pid = container_pid(&a, &long, "c");
    let short_pid = container_pid(&a, &short, "c");
    let long_id = container(&long, "c")["containerID"].clone();

    a.kill9();
    assert!(pid_alive(long_pid), "container died with the agent");
    // Let the short container finish while no agent runs.
    std::fs::write(format!("/proc/{short_pid}/root/tmp/go"), b"").expect("signal the container");
    let t_exit = k8s_openapi::jiff::Timestamp::now();
    let deadline = Instant::now() + MIN;
    while pid_alive(short_pid) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(!pid_alive(short_pid), "short container did not exit");
    std::thread::sleep(Duration::from_millis(1100)); // a clear gap between exit and restart times
    let t_restart = k8s_openapi::jiff::Timestamp::now();

    a.start();
    let short = a.wait_pod("short", "reported as exited", MIN, |p| {
        container(p, "c")["state"]["terminated"].is_object()
    });
    let t = &container(&short, "c")["state"]["terminated"];
    assert_eq!(t["exitCode"], 7, "{t}");
    let finished: k8s_openapi::jiff::Timestamp = t["finishedAt"]
        .as_str()
        .expect("finishedAt")
        .parse()
        .expect("time");
    // Kubernetes times have whole seconds.
    assert!(
        finished.as_second() <= t_exit.as_second() + 1,
        "finishedAt {finished} is the real exit time ({t_exit})"
    );
    assert!(
        finished < t_restart,
        "finishedAt {finished} is before the agent came back ({t_restart})"
    );
    assert_eq!(short["status"]["phase"], "Failed");

    let long = a.wait_pod("long", "adopted", MIN, |p| running(p, "c"));
    assert_eq!(
        container(&long, "c")["containerID"],
        long_id,
        "the same container was adopted"
    );
    assert_eq!(container(&long, "c")["restartCount"], 0);
    assert!(pid_alive(long_pid));
    a.stop();
    a.reset();
    a.assert_clean();
}

#[test]
fn restart_with_manifest_removed_or_edited_meanwhile() {
    if !need_root() {
        return;
    }
    let mut a = Agent::new("edits");
    a.write_manifest(
        "gone.yaml",
        &pod_yaml("gone", "Always", 1, &sh("c", "exec sleep 1000")),
    );
    a.write_manifest(
        "edit.yaml",
        &pod_yaml("edit", "Always", 1, &sh("c", "echo v1; exec sleep 1000")),
    );
    a.start();
    let gone = a.wait_pod("gone", "running", MIN, |p| running(p, "c"));
    let edit = a.wait_pod("edit", "running", MIN, |p| running(p, "c"));
    let gone_pid = container_pid(&a, &gone, "c");
    let edit_pid = container_pid(&a, &edit, "c");
    let old_uid = edit["pod"]["metadata"]["uid"].clone();
    a.stop();

    a.remove_manifest("gone.yaml");
    a.write_manifest(
        "edit.yaml",
        &pod_yaml("edit", "Always", 1, &sh("c", "echo v2; exec sleep 1000")),
    );
    a.start();
    a.wait_gone("gone", MIN);
    a.wait_until("the removed pod's container to stop", MIN, |_| {
        !pid_alive(gone_pid)
    });
    let edit = a.wait_pod("edit", "replaced", MIN, |p| {
        p["pod"]["metadata"]["uid"] != old_uid && running(p, "c")
    });
    a.wait_until("the old container to stop", MIN, |_| !pid_alive(edit_pid));
    a.wait_until("the new version to log", MIN, |a| {
        a.container_log(&edit, "c", 0).contains("v2")
    });
    a.stop();
    a.reset();
    a.assert_clean();
}

#[test]
fn bad_manifests_and_missing_images_do_not_disturb_good_pods() {
    if !need_root() {
        return;
    }
    let mut a = Agent::new("bad");
    a.write_manifest(
        "good.yaml",
        &pod_yaml("good", "Always", 1, &sh("c", "exec sleep 1000")),
    );
    a.write_manifest(
        "broken.yaml",
        "apiVersion: v1\nkind: Pod\nmetadata: [this is not\n",
    );
    a.write_manifest(
        "deploy.yaml",
        "apiVersion: apps/v1\nkind: Deployment\nmetadata:\n  name: nope\n",
    );
    // Never: this node must not go looking for it on the internet.
    let missing = "    - name: c\n      image: example.org/not/here:1.0\n      imagePullPolicy: Never\n      command: [\"true\"]\n";
    a.write_manifest("missing.yaml", &pod_yaml("missing", "Always", 1, missing));
    a.start();
    a.wait_pod("good", "running", MIN, |p| running(p, "c"));
    let p = a.wait_pod("missing", "waiting for its image", MIN, |p| {
        container(p, "c")["state"]["waiting"]["reason"] == "ErrImageNeverPull"
    });
    assert_eq!(p["status"]["phase"], "Pending");
    let msg = container(&p, "c")["state"]["waiting"]["message"]
        .as_str()
        .unwrap_or("")
        .to_string();
    assert!(msg.contains("example.org/not/here:1.0"), "{msg}");
    let log = a.agent_log();
    assert!(
        log.contains("broken.yaml"),
        "the broken file is named: {log}"
    );
    assert!(
        log.contains("deploy.yaml"),
        "the wrong kind is named: {log}"
    );
    assert!(a.pod("nope").is_none());
    a.stop();
    a.reset();
    a.assert_clean();
}
