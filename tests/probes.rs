//! End-to-end: liveness, readiness and startup probes on real containers (exec,
//! httpGet against busybox httpd, tcpSocket), checked as `kubectl get pod` shows them:
//! READY, RESTARTS, the Ready condition and how the last instance ended. The probes
//! read control files on a hostPath volume the test owns, so the test decides when a
//! probe passes.

use std::path::Path;
use std::time::Duration;

use serde_json::Value;
use support::agent::{condition, container, free_port, need_root, Agent};

const MIN: Duration = Duration::from_secs(60);

fn touch(dir: &Path, name: &str) {
    std::fs::write(dir.join(name), "ok\n").expect("control file");
}

fn rm(dir: &Path, name: &str) {
    std::fs::remove_file(dir.join(name)).expect("remove control file");
}

fn ready(p: &Value, c: &str) -> bool {
    container(p, c)["ready"] == true
}

fn restarts(p: &Value, c: &str) -> i64 {
    container(p, c)["restartCount"].as_i64().unwrap_or(-1)
}

/// A host-network pod of one container with `probes` (YAML under the container) and
/// the control dir mounted at /ctl.
fn pod(name: &str, script: &str, probes: &str, ctl: &Path) -> String {
    format!(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: {name}\nspec:\n  hostNetwork: true\n  \
         terminationGracePeriodSeconds: 1\n  volumes:\n  - name: ctl\n    hostPath:\n      \
         path: {}\n      type: Directory\n  containers:\n  - name: app\n    image: busybox:demo\n    \
         command: [\"sh\", \"-c\", {}]\n    volumeMounts:\n    - name: ctl\n      mountPath: /ctl\n{probes}",
        ctl.display(),
        serde_json::to_string(script).expect("json string")
    )
}

#[test]
fn readiness_flips_ready_and_liveness_restarts_the_container() {
    if !need_root() {
        return;
    }
    let mut a = Agent::new("probes");
    let ctl = a.dir.join("ctl");
    std::fs::create_dir_all(&ctl).expect("ctl dir");
    let port = free_port();
    // httpd serves /ctl: GET /ready is 200 while the file is there, 404 when not.
    let script = format!("httpd -f -p {port} -h /ctl & exec sleep 3600");
    let probes = format!(
        "    startupProbe:\n      tcpSocket:\n        port: {port}\n      periodSeconds: 1\n      \
         failureThreshold: 30\n    readinessProbe:\n      httpGet:\n        path: /ready\n        \
         port: {port}\n        httpHeaders:\n        - name: X-Probe\n          value: ready\n      \
         periodSeconds: 1\n    livenessProbe:\n      exec:\n        command: [\"test\", \"-f\", \"/ctl/live\"]\n      \
         periodSeconds: 1\n      failureThreshold: 2\n"
    );
    touch(&ctl, "ready");
    touch(&ctl, "live");
    a.write_manifest("web.yaml", &pod("web", &script, &probes, &ctl));
    a.start();

    let p = a.wait_pod("web", "ready", MIN, |p| ready(p, "app"));
    assert_eq!(container(&p, "app")["started"], true);
    assert_eq!(condition(&p, "Ready")["status"], "True", "{p}");
    assert_eq!(condition(&p, "ContainersReady")["status"], "True");

    // Readiness fails: not ready, not restarted.
    rm(&ctl, "ready");
    let p = a.wait_pod("web", "unready", MIN, |p| !ready(p, "app"));
    let c = condition(&p, "Ready");
    assert_eq!(c["status"], "False", "{p}");
    assert_eq!(c["reason"], "ContainersNotReady");
    assert_eq!(c["message"], "containers with unready status: [app]");
    assert!(container(&p, "app")["state"]["running"].is_object(), "{p}");
    assert_eq!(restarts(&p, "app"), 0);
    assert_eq!(p["status"]["phase"], "Running");

    // And passes again.
    touch(&ctl, "ready");
    let p = a.wait_pod("web", "ready again", MIN, |p| ready(p, "app"));
    assert_eq!(restarts(&p, "app"), 0);

    // Liveness fails twice in a row: the container is killed and started again.
    rm(&ctl, "live");
    let p = a.wait_pod("web", "restarted", MIN, |p| restarts(p, "app") >= 1);
    touch(&ctl, "live");
    let last = &container(&p, "app")["lastState"]["terminated"];
    assert!(
        last["message"]
            .as_str()
            .unwrap_or("")
            .contains("failed liveness probe, will be restarted"),
        "{p}"
    );
    assert!(last["finishedAt"].is_string(), "{p}");
    // The new instance passes its probes and is ready, and is not restarted again.
    let p = a.wait_pod("web", "ready after the restart", MIN, |p| {
        ready(p, "app") && container(p, "app")["state"]["running"].is_object()
    });
    let n = restarts(&p, "app");
    // Three more liveness periods: no restart while the file is there.
    let deadline = std::time::Instant::now() + Duration::from_secs(3);
    while std::time::Instant::now() < deadline {
        let p = a.pod("web").expect("pod");
        assert_eq!(
            restarts(&p, "app"),
            n,
            "restarted with a passing probe: {p}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }

    a.stop();
    a.reset();
    a.assert_clean();
}

#[test]
fn startup_gates_readiness_and_a_failed_startup_restarts() {
    if !need_root() {
        return;
    }
    let mut a = Agent::new("startup");
    let ctl = a.dir.join("ctl");
    std::fs::create_dir_all(&ctl).expect("ctl dir");
    let closed = free_port();
    let probes = "    startupProbe:\n      exec:\n        command: [\"test\", \"-f\", \"/ctl/started\"]\n      \
         periodSeconds: 1\n      failureThreshold: 600\n    readinessProbe:\n      exec:\n        \
         command: [\"true\"]\n      periodSeconds: 1\n";
    a.write_manifest("slow.yaml", &pod("slow", "exec sleep 3600", probes, &ctl));
    // Its startup probe reaches a port nothing listens on: it fails for good.
    let failing = format!(
        "    startupProbe:\n      tcpSocket:\n        port: {closed}\n      periodSeconds: 1\n      \
         failureThreshold: 2\n"
    );
    a.write_manifest(
        "never.yaml",
        &pod("never", "exec sleep 3600", &failing, &ctl),
    );
    a.start();

    // Running but not started: the readiness probe (which would pass) does not run.
    let p = a.wait_pod("slow", "running", MIN, |p| {
        container(p, "app")["state"]["running"].is_object()
    });
    let deadline = std::time::Instant::now() + Duration::from_secs(3);
    while std::time::Instant::now() < deadline {
        let p = a.pod("slow").expect("pod");
        assert_eq!(container(&p, "app")["started"], false, "{p}");
        assert_eq!(container(&p, "app")["ready"], false, "{p}");
        std::thread::sleep(Duration::from_millis(200));
    }
    drop(p);
    touch(&ctl, "started");
    let p = a.wait_pod("slow", "started and ready", MIN, |p| ready(p, "app"));
    assert_eq!(container(&p, "app")["started"], true);
    assert_eq!(restarts(&p, "app"), 0);

    let p = a.wait_pod("never", "restarted", MIN, |p| restarts(p, "app") >= 1);
    let last = &container(&p, "app")["lastState"]["terminated"];
    assert!(
        last["message"]
            .as_str()
            .unwrap_or("")
            .contains("failed startup probe"),
        "{p}"
    );
    assert_eq!(container(&p, "app")["ready"], false);

    a.stop();
    a.reset();
    a.assert_clean();
}
