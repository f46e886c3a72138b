//! End-to-end: init containers (in order, to completion, failures by restart policy),
//! sidecars (init containers with `restartPolicy: Always`) and the postStart and
//! preStop hooks, on real containers, checked as `kubectl get pod -o yaml` shows them.

use std::path::Path;
use std::time::Duration;

use serde_json::Value;
use support::agent::{condition, need_root, power_cut, Agent};

const MIN: Duration = Duration::from_secs(60);

fn status_of<'a>(p: &'a Value, list: &str, name: &str) -> &'a Value {
    p["status"][list]
        .as_array()
        .and_then(|cs| cs.iter().find(|c| c["name"] == name))
        .unwrap_or_else(|| panic!("no {list} entry {name}: {p}"))
}

fn init<'a>(p: &'a Value, name: &str) -> &'a Value {
    status_of(p, "initContainerStatuses", name)
}

fn app<'a>(p: &'a Value, name: &str) -> &'a Value {
    status_of(p, "containerStatuses", name)
}

fn c(name: &str, script: &str, extra: &str) -> String {
    format!(
        "  - name: {name}\n    image: busybox:demo\n    command: [\"sh\", \"-c\", {}]\n    \
         volumeMounts:\n    - name: ctl\n      mountPath: /ctl\n{extra}",
        serde_json::to_string(script).expect("json string")
    )
}

/// A host-network pod with the control dir `ctl` at /ctl in every container.
fn pod(name: &str, policy: &str, inits: &str, containers: &str, ctl: &Path) -> String {
    let inits = if inits.is_empty() {
        String::new()
    } else {
        format!("  initContainers:\n{inits}")
    };
    format!(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: {name}\nspec:\n  hostNetwork: true\n  \
         restartPolicy: {policy}\n  terminationGracePeriodSeconds: 5\n  volumes:\n  - name: ctl\n    \
         hostPath:\n      path: {}\n      type: Directory\n{inits}  containers:\n{containers}",
        ctl.display()
    )
}

fn ctl_dir(a: &Agent, pod: &str) -> std::path::PathBuf {
    let d = a.dir.join(format!("ctl-{pod}"));
    std::fs::create_dir_all(&d).expect("ctl dir");
    d
}

fn read(dir: &Path, name: &str) -> String {
    std::fs::read_to_string(dir.join(name)).unwrap_or_default()
}

#[test]
fn init_containers_run_in_order_after_the_sidecar_has_started() {
    if !need_root() {
        return;
    }
    let mut a = Agent::new("init-order");
    let ctl = ctl_dir(&a, "ordered");
    // The sidecar counts as started once its startup probe sees its line written.
    let sidecar = c(
        "sidecar",
        "echo sidecar >> /ctl/order; exec sleep 3600",
        "    restartPolicy: Always\n    startupProbe:\n      exec:\n        \
         command: [\"grep\", \"-q\", \"sidecar\", \"/ctl/order\"]\n      periodSeconds: 1\n",
    );
    let inits = format!(
        "{sidecar}{}{}",
        c("first", "sleep 1; echo first >> /ctl/order", ""),
        c("second", "echo second >> /ctl/order", "")
    );
    let apps = c("app", "echo app >> /ctl/order; exec sleep 3600", "");
    a.write_manifest(
        "ordered.yaml",
        &pod("ordered", "Always", &inits, &apps, &ctl),
    );
    a.start();

    let p = a.wait_pod("ordered", "app running", MIN, |p| {
        p["status"]["containerStatuses"][0]["state"]["running"].is_object()
    });
    assert_eq!(read(&ctl, "order"), "sidecar\nfirst\nsecond\napp\n");
    for name in ["first", "second"] {
        let s = init(&p, name);
        assert_eq!(s["state"]["terminated"]["exitCode"], 0, "{p}");
        assert_eq!(s["state"]["terminated"]["reason"], "Completed");
        assert_eq!(s["ready"], true, "a completed init container is ready: {p}");
        assert_eq!(s["restartCount"], 0);
    }
    assert!(init(&p, "sidecar")["state"]["running"].is_object(), "{p}");
    assert_eq!(init(&p, "sidecar")["started"], true);
    assert_eq!(p["status"]["phase"], "Running");
    assert_eq!(condition(&p, "Initialized")["status"], "True");
    let p = a.wait_pod("ordered", "ready", MIN, |p| {
        condition(p, "Ready")["status"] == "True"
    });
    assert_eq!(app(&p, "app")["ready"], true);

    a.stop();
    a.reset();
    a.assert_clean();
}

#[test]
fn a_failing_init_container_holds_the_pod_until_it_succeeds() {
    if !need_root() {
        return;
    }
    let mut a = Agent::new("init-retry");
    let ctl = ctl_dir(&a, "held");
    let never = ctl_dir(&a, "failed");
    a.write_manifest(
        "held.yaml",
        &pod(
            "held",
            "Always",
            &c("wait", "test -f /ctl/go", ""),
            &c("app", "exec sleep 3600", ""),
            &ctl,
        ),
    );
    a.write_manifest(
        "failed.yaml",
        &pod(
            "failed",
            "Never",
            &c("setup", "exit 3", ""),
            &c("app", "touch /ctl/app-ran; exec sleep 3600", ""),
            &never,
        ),
    );
    a.start();

    // Restarted with back-off while the pod waits in Pending.
    let p = a.wait_pod("held", "init restarted", MIN, |p| {
        p["status"]["initContainerStatuses"][0]["restartCount"]
            .as_i64()
            .unwrap_or(0)
            >= 1
    });
    assert_eq!(p["status"]["phase"], "Pending", "{p}");
    let cond = condition(&p, "Initialized");
    assert_eq!(cond["status"], "False");
    assert_eq!(cond["reason"], "ContainersNotInitialized");
    assert_eq!(cond["message"], "containers with incomplete status: [wait]");
    assert_eq!(
        app(&p, "app")["state"]["waiting"]["reason"],
        "PodInitializing"
    );
    assert_eq!(
        init(&p, "wait")["lastState"]["terminated"]["exitCode"],
        1,
        "{p}"
    );

    // restartPolicy Never: the pod fails and its app never starts.
    let p = a.wait_pod("failed", "failed", MIN, |p| {
        p["status"]["phase"] == "Failed"
    });
    assert_eq!(init(&p, "setup")["state"]["terminated"]["exitCode"], 3);
    assert_eq!(init(&p, "setup")["restartCount"], 0);
    assert_eq!(
        app(&p, "app")["state"]["waiting"]["reason"],
        "PodInitializing"
    );
    assert!(!never.join("app-ran").exists());

    std::fs::write(ctl.join("go"), "").expect("go");
    let p = a.wait_pod("held", "app running", MIN, |p| {
        p["status"]["containerStatuses"][0]["state"]["running"].is_object()
    });
    assert_eq!(p["status"]["phase"], "Running");
    assert_eq!(condition(&p, "Initialized")["status"], "True");
    assert_eq!(init(&p, "wait")["state"]["terminated"]["exitCode"], 0);
    assert!(!never.join("app-ran").exists());

    a.stop();
    a.reset();
    a.assert_clean();
}

#[test]
fn sidecars_stop_once_the_work_is_done() {
    if !need_root() {
        return;
    }
    let mut a = Agent::new("sidecar-done");
    let ctl = ctl_dir(&a, "job");
    // The sidecar says when it is told to stop; the job needs it to have started.
    let sidecar = c(
        "proxy",
        "trap 'echo stopped > /ctl/proxy; exit 0' TERM; touch /ctl/proxy-up; \
         while true; do sleep 0.2; done",
        "    restartPolicy: Always\n",
    );
    let job = c("job", "test -f /ctl/proxy-up && echo done > /ctl/job", "");
    a.write_manifest("job.yaml", &pod("job", "Never", &sidecar, &job, &ctl));
    a.start();

    let p = a.wait_pod("job", "succeeded", MIN, |p| {
        p["status"]["phase"] == "Succeeded"
    });
    assert_eq!(read(&ctl, "job"), "done\n");
    assert_eq!(app(&p, "job")["state"]["terminated"]["exitCode"], 0, "{p}");
    let proxy = init(&p, "proxy");
    assert_eq!(proxy["state"]["terminated"]["exitCode"], 0, "{p}");
    assert_eq!(proxy["restartCount"], 0, "not restarted after the job: {p}");
    assert_eq!(read(&ctl, "proxy"), "stopped\n", "stopped with SIGTERM");

    a.stop();
    a.reset();
    a.assert_clean();
}

#[test]
fn post_start_and_pre_stop_hooks() {
    if !need_root() {
        return;
    }
    let mut a = Agent::new("hooks");
    let ctl = ctl_dir(&a, "hooked");
    let hooks = "    lifecycle:\n      postStart:\n        exec:\n          \
                 command: [\"sh\", \"-c\", \"echo post > /ctl/post\"]\n      preStop:\n        \
                 exec:\n          command: [\"sh\", \"-c\", \"echo pre > /ctl/pre\"]\n";
    // The app sees the postStart file only after its hook ran, and writes what it saw
    // when SIGTERM comes (after preStop).
    let script = "trap 'cat /ctl/pre > /ctl/term-saw; exit 0' TERM; \
                  while true; do sleep 0.2; done";
    a.write_manifest(
        "hooked.yaml",
        &pod("hooked", "Always", "", &c("app", script, hooks), &ctl),
    );
    let bad = ctl_dir(&a, "badhook");
    let failing = "    lifecycle:\n      postStart:\n        exec:\n          \
                   command: [\"sh\", \"-c\", \"exit 7\"]\n";
    a.write_manifest(
        "badhook.yaml",
        &pod(
            "badhook",
            "Always",
            "",
            &c("app", "exec sleep 3600", failing),
            &bad,
        ),
    );
    a.start();

    let p = a.wait_pod("hooked", "running", MIN, |p| {
        p["status"]["containerStatuses"][0]["state"]["running"].is_object()
    });
    assert_eq!(
        read(&ctl, "post"),
        "post\n",
        "postStart ran before Running: {p}"
    );

    // A failing postStart kills the container; policy starts it again.
    let p = a.wait_pod("badhook", "restarted", MIN, |p| {
        p["status"]["containerStatuses"][0]["restartCount"]
            .as_i64()
            .unwrap_or(0)
            >= 1
    });
    let last = &app(&p, "app")["lastState"]["terminated"];
    assert!(
        last["message"]
            .as_str()
            .unwrap_or("")
            .contains("lifecycle hook"),
        "{p}"
    );

    // preStop runs before SIGTERM.
    a.remove_manifest("hooked.yaml");
    a.wait_gone("hooked", MIN);
    assert_eq!(read(&ctl, "pre"), "pre\n");
    assert_eq!(
        read(&ctl, "term-saw"),
        "pre\n",
        "SIGTERM came after preStop"
    );

    a.stop();
    a.reset();
    a.assert_clean();
}

#[test]
fn init_containers_run_again_after_a_power_cut() {
    if !need_root() {
        return;
    }
    let mut a = Agent::new("init-reboot");
    let ctl = ctl_dir(&a, "rebooted");
    a.write_manifest(
        "rebooted.yaml",
        &pod(
            "rebooted",
            "Always",
            &c("setup", "echo setup >> /ctl/order", ""),
            &c("app", "echo app >> /ctl/order; exec sleep 3600", ""),
            &ctl,
        ),
    );
    a.start();
    a.wait_pod("rebooted", "app running", MIN, |p| {
        app(p, "app")["state"]["running"].is_object()
    });
    assert_eq!(read(&ctl, "order"), "setup\napp\n");

    // The device loses power: the agent, its shims and containers are gone, the root
    // dir stays. As the kubelet does for a new sandbox, the init container runs again
    // (its next attempt) before the app comes back.
    power_cut(&mut a);
    a.start();
    let p = a.wait_pod("rebooted", "app running again", MIN, |p| {
        app(p, "app")["state"]["running"].is_object() && app(p, "app")["restartCount"] == 1
    });
    assert_eq!(read(&ctl, "order"), "setup\napp\nsetup\napp\n");
    let setup = init(&p, "setup");
    assert_eq!(setup["restartCount"], 1, "{p}");
    assert_eq!(setup["state"]["terminated"]["exitCode"], 0, "{p}");
    assert_eq!(condition(&p, "Initialized")["status"], "True");

    a.stop();
    a.reset();
    a.assert_clean();
}
