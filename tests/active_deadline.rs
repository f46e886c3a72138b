//! End to end: a pod that runs past its `activeDeadlineSeconds` is ended as the kubelet
//! ends it (phase Failed, reason DeadlineExceeded, its containers stopped with its grace
//! period), on time, across an agent restart, and its neighbours run on.

use std::time::{Duration, Instant};

use k8s_openapi::jiff::{SignedDuration, Timestamp};
use serde_json::Value;
use support::agent::{container, container_pid, need_root, pid_alive, sh_pod, Agent};

const MIN: Duration = Duration::from_secs(60);
const MESSAGE: &str = "Pod was active on the node longer than the specified deadline";

fn pod(name: &str, pod_extra: &str) -> String {
    sh_pod(name, pod_extra, "app", "exec sleep 3600", "")
}

fn running(p: &Value) -> bool {
    container(p, "app")["state"]["running"].is_object()
}

fn failed(p: &Value) -> bool {
    p["status"]["phase"] == "Failed"
}

fn time(v: &Value, what: &str) -> Timestamp {
    v.as_str()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("{what}: not a time: {v}"))
}

/// Asserts `p` ran and was ended for its deadline, with the kubelet's words.
fn assert_deadline_exceeded(p: &Value) {
    assert!(failed(p), "{p}");
    assert_eq!(p["status"]["reason"], "DeadlineExceeded", "{p}");
    assert_eq!(p["status"]["message"], MESSAGE, "{p}");
}

/// Asserts `p` runs on, untouched.
fn assert_runs_on(p: &Value) {
    assert_eq!(p["status"]["phase"], "Running", "{p}");
    assert!(p["status"]["reason"].is_null(), "{p}");
    assert!(running(p), "{p}");
    assert_eq!(container(p, "app")["restartCount"], 0, "{p}");
}

#[test]
fn a_pod_past_its_active_deadline_fails_and_its_neighbours_run_on() {
    if !need_root() {
        return;
    }
    let mut a = Agent::new("active-deadline");
    // `sleep` as PID 1 ignores SIGTERM: it goes at the end of the 2 s grace period.
    let short = "  activeDeadlineSeconds: 3\n  restartPolicy: Never\n  \
                 terminationGracePeriodSeconds: 2\n";
    a.write_manifest("short.yaml", &pod("short", short));
    // Its deadline passes while the agent is down.
    let later = "  activeDeadlineSeconds: 20\n  restartPolicy: Never\n  \
                 terminationGracePeriodSeconds: 1\n";
    a.write_manifest("later.yaml", &pod("later", later));
    a.write_manifest(
        "patient.yaml",
        &pod(
            "patient",
            "  activeDeadlineSeconds: 3600\n  terminationGracePeriodSeconds: 1\n",
        ),
    );
    a.write_manifest(
        "healthy.yaml",
        &pod("healthy", "  terminationGracePeriodSeconds: 1\n"),
    );
    a.start();
    let before = a.wait_pod("short", "running", MIN, |p| running(p) || failed(p));
    let short_pid = running(&before).then(|| container_pid(&a, &before, "app"));

    let p = a.wait_pod("short", "Failed past its deadline", MIN, failed);
    assert_deadline_exceeded(&p);
    let p = a.wait_pod("short", "its container terminated", MIN, |p| {
        container(p, "app")["state"]["terminated"].is_object()
    });
    assert_deadline_exceeded(&p);
    let ended = &container(&p, "app")["state"]["terminated"];
    assert_eq!(
        ended["exitCode"], 137,
        "killed at the end of its grace: {p}"
    );
    assert_eq!(container(&p, "app")["restartCount"], 0, "{p}");
    if let Some(pid) = short_pid {
        assert!(!pid_alive(pid), "its process is gone: {p}");
    }
    // Ended at its deadline, not at a later resync: startTime (whole seconds) + 3 s of
    // deadline + 2 s of grace, with a second of rounding and one to spare. A worker that
    // only looked again on the 5 s resync would end it as late as 10 s.
    let started = time(&p["status"]["startTime"], "startTime");
    let finished = time(&ended["finishedAt"], "finishedAt");
    let took = finished.duration_since(started);
    assert!(
        took >= SignedDuration::from_secs(3) && took <= SignedDuration::from_secs(7),
        "ended {took} after its start: {p}"
    );
    assert!(
        a.agent_log().contains(MESSAGE),
        "the end is logged:\n{}",
        a.agent_log()
    );

    assert_runs_on(&a.pod("healthy").expect("healthy pod"));
    assert_runs_on(&a.pod("patient").expect("patient pod"));

    // The agent stops; `later`'s deadline passes meanwhile, and its container runs on.
    let p = a.wait_pod("later", "running", MIN, running);
    assert_runs_on(&p);
    let later_start = time(&p["status"]["startTime"], "startTime");
    a.stop();
    let due = later_start
        .checked_add(SignedDuration::from_secs(21))
        .expect("due");
    a.wait_until("the deadline of pod later to pass", MIN, |_| {
        Timestamp::now() >= due
    });
    // Restarted, the agent counts from the stored startTime: the pod is ended at once,
    // not 20 s from now.
    let restarted = Instant::now();
    a.start();
    let p = a.wait_pod("later", "Failed past its deadline", MIN, failed);
    let waited = restarted.elapsed();
    assert_deadline_exceeded(&p);
    assert!(
        waited < Duration::from_secs(18),
        "ended {waited:?} after the restart, as if its start were new: {p}"
    );
    assert_eq!(
        time(&p["status"]["startTime"], "startTime"),
        later_start,
        "{p}"
    );
    let p = a.wait_pod("later", "its container terminated", MIN, |p| {
        container(p, "app")["state"]["terminated"].is_object()
    });
    assert_deadline_exceeded(&p);

    // The first pod stays as it ended; the others run on.
    let p = a.pod("short").expect("short pod");
    assert_deadline_exceeded(&p);
    assert_eq!(container(&p, "app")["restartCount"], 0, "{p}");
    assert_runs_on(&a.pod("healthy").expect("healthy pod"));
    assert_runs_on(&a.pod("patient").expect("patient pod"));

    a.stop();
    a.reset();
    a.assert_clean();
}
