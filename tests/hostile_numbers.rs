//! End to end: numbers and sizes a manifest may legally write but no workload means
//! (the largest grace period, an environment that doubles itself a dozen times, a
//! command line or subPath that repeats a variable) stop nothing but the pod that wrote
//! them. The agent stays up, and the other pods run on.

use std::time::Duration;

use serde_json::Value;
use support::agent::{need_root, sh_pod, Agent};

const MIN: Duration = Duration::from_secs(60);

/// A host-network pod with one container `app` running `script`; `pod_extra` goes under
/// `spec:`, `container_extra` under the container.
fn pod(name: &str, pod_extra: &str, script: &str, container_extra: &str) -> String {
    sh_pod(name, pod_extra, "app", script, container_extra)
}

/// A container that exits 0 on SIGTERM, so that a grace period, however long, ends as
/// soon as the signal comes.
const TERM_EXITS: &str = "trap 'exit 0' TERM; while :; do sleep 1; done";

fn running(p: &Value) -> bool {
    p["status"]["containerStatuses"][0]["state"]["running"].is_object()
}

fn restarts(p: &Value) -> i64 {
    p["status"]["containerStatuses"][0]["restartCount"]
        .as_i64()
        .unwrap_or(0)
}

/// Fails the test, with the agent's log, when the agent process has died.
fn assert_alive(a: &mut Agent) {
    if let Some(status) = a.exited() {
        panic!(
            "the agent died ({status})\n--- agent log ---\n{}",
            a.agent_log()
        );
    }
}

#[test]
fn the_largest_grace_period_stops_its_pod_and_not_the_agent() {
    if !need_root() {
        return;
    }
    let mut a = Agent::new("max-grace");
    let forever = "  terminationGracePeriodSeconds: 9223372036854775807\n";
    a.write_manifest("forever.yaml", &pod("forever", forever, TERM_EXITS, ""));
    a.write_manifest(
        "bystander.yaml",
        &pod(
            "bystander",
            "  terminationGracePeriodSeconds: 1\n",
            "exec sleep 3600",
            "",
        ),
    );
    a.start();
    a.wait_pod("forever", "running", MIN, running);
    a.wait_pod("bystander", "running", MIN, running);

    // Removing the manifest stops the pod: SIGTERM, and the container exits on it.
    a.remove_manifest("forever.yaml");
    a.wait_gone("forever", MIN);
    assert_alive(&mut a);
    let by = a.pod("bystander").expect("bystander pod");
    assert!(running(&by), "bystander still runs: {by}");
    assert_eq!(restarts(&by), 0, "bystander untouched: {by}");
    assert!(
        a.agent_log().contains("stopped and removed"),
        "{}",
        a.agent_log()
    );

    a.stop();
    a.reset();
    a.assert_clean();
}

#[test]
fn a_liveness_probe_with_the_largest_grace_period_restarts_its_container() {
    if !need_root() {
        return;
    }
    let mut a = Agent::new("max-probe-grace");
    // The probe fails from the start: the container is killed with the probe's own
    // grace period, exits on SIGTERM, and restart policy starts it again.
    let probe = "    livenessProbe:\n      exec:\n        command: [\"false\"]\n      \
                 periodSeconds: 1\n      failureThreshold: 1\n      \
                 terminationGracePeriodSeconds: 9223372036854775807\n";
    a.write_manifest("probed.yaml", &pod("probed", "", TERM_EXITS, probe));
    a.start();
    let p = a.wait_pod("probed", "restarted by its liveness probe", MIN, |p| {
        restarts(p) >= 1
    });
    assert_alive(&mut a);
    let last = &p["status"]["containerStatuses"][0]["lastState"]["terminated"];
    assert_eq!(last["exitCode"], 0, "ended by SIGTERM, not SIGKILL: {p}");

    a.stop();
    a.reset();
    a.assert_clean();
}

#[test]
fn an_environment_that_doubles_itself_is_refused_with_a_reason() {
    if !need_root() {
        return;
    }
    let mut a = Agent::new("env-bomb");
    // 60 KB of manifest: each variable is the one before twice, V13 would be 491 MB and
    // the thirteen of them, with their copies, took the agent to 2.35 GB.
    let mut env = format!(
        "    env:\n    - name: V0\n      value: {}\n",
        "x".repeat(60_000)
    );
    for i in 1..=13 {
        let prev = i - 1;
        env.push_str(&format!(
            "    - name: V{i}\n      value: \"$(V{prev})$(V{prev})\"\n"
        ));
    }
    a.write_manifest("bomb.yaml", &pod("bomb", "", "exec sleep 3600", &env));
    a.write_manifest(
        "bystander.yaml",
        &pod(
            "bystander",
            "  terminationGracePeriodSeconds: 1\n",
            "exec sleep 3600",
            "",
        ),
    );
    a.start();
    let p = a.wait_pod("bomb", "refused its environment", MIN, |p| {
        p["status"]["containerStatuses"][0]["state"]["waiting"]["reason"]
            == "CreateContainerConfigError"
    });
    let message = p["status"]["containerStatuses"][0]["state"]["waiting"]["message"]
        .as_str()
        .unwrap_or("")
        .to_string();
    // V2 is the first past 128 KiB: 240 000 bytes.
    assert!(message.contains("\"V2\""), "names the variable: {message}");
    assert!(message.contains("131072"), "names the bound: {message}");
    a.wait_pod("bystander", "running", MIN, running);
    assert_alive(&mut a);
    let peak = a.peak_rss_kib();
    eprintln!("agent peak RSS with the refused environment: {peak} KiB");
    assert!(peak < 256 * 1024, "the agent peaked at {peak} KiB");

    a.stop();
    a.reset();
    a.assert_clean();
}

/// A pod whose `app` container's env has `V`, 120 000 bytes built from a 60 000-byte
/// `W`; `container_extra` goes under the container after its env.
fn pod_with_big_var(name: &str, command: &str, container_extra: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: {name}\nspec:\n  hostNetwork: true\n  \
         containers:\n  - name: app\n    image: busybox:demo\n    command: {command}\n    \
         env:\n    - name: W\n      value: {}\n    - name: V\n      value: \"$(W)$(W)\"\n\
         {container_extra}",
        "w".repeat(60_000)
    )
}

/// Waits for `name` to be refused with CreateContainerConfigError while `bystander`
/// runs and the agent stays up and small; returns the status message.
fn refused_beside_a_bystander(a: &mut Agent, name: &str) -> String {
    let p = a.wait_pod(name, "refused its container's config", MIN, |p| {
        p["status"]["containerStatuses"][0]["state"]["waiting"]["reason"]
            == "CreateContainerConfigError"
    });
    a.wait_pod("bystander", "running", MIN, running);
    assert_alive(a);
    let peak = a.peak_rss_kib();
    eprintln!("agent peak RSS with {name} refused: {peak} KiB");
    assert!(peak < 256 * 1024, "the agent peaked at {peak} KiB");
    let message = p["status"]["containerStatuses"][0]["state"]["waiting"]["message"]
        .as_str()
        .unwrap_or("")
        .to_string();
    // What the message may quote of the manifest is long: a failure shows its start.
    message.chars().take(600).collect()
}

fn bystander() -> String {
    pod(
        "bystander",
        "  terminationGracePeriodSeconds: 1\n",
        "exec sleep 3600",
        "",
    )
}

#[test]
fn a_command_line_that_repeats_a_variable_is_refused_with_a_reason() {
    if !need_root() {
        return;
    }
    let mut a = Agent::new("argv-bomb");
    // 60 KB of manifest: 15 000 references to a 120 000-byte variable in one argument
    // would be 1.8 GB.
    let bomb = "$(V)".repeat(15_000);
    let command = serde_json::to_string(&["sh", "-c", "exec sleep 3600", &bomb]).expect("json");
    a.write_manifest("bomb.yaml", &pod_with_big_var("bomb", &command, ""));
    a.write_manifest("bystander.yaml", &bystander());
    a.start();
    let message = refused_beside_a_bystander(&mut a, "bomb");
    assert!(
        message.contains("container \"app\": command[3] would take 1800000001 bytes"),
        "names the argument and its size: {message}"
    );
    assert!(message.contains("131072"), "names the bound: {message}");

    a.stop();
    a.reset();
    a.assert_clean();
}

#[test]
fn a_sub_path_expr_that_repeats_a_variable_is_refused_with_a_reason() {
    if !need_root() {
        return;
    }
    let mut a = Agent::new("subpath-bomb");
    // 4 KB of manifest: 1 000 references would make a 120 MB path.
    let mount = format!(
        "    volumeMounts:\n    - name: data\n      mountPath: /data\n      \
         subPathExpr: {}\n  volumes:\n  - name: data\n    emptyDir: {{}}\n",
        "$(V)".repeat(1_000)
    );
    let command = r#"["sh", "-c", "exec sleep 3600"]"#;
    a.write_manifest("bomb.yaml", &pod_with_big_var("bomb", command, &mount));
    a.write_manifest("bystander.yaml", &bystander());
    a.start();
    let message = refused_beside_a_bystander(&mut a, "bomb");
    assert!(
        message.contains(
            "subPathExpr of the mount of volume \"data\" at \"/data\" in container \"app\" \
             would take 120000001 bytes"
        ),
        "names the mount and its size: {message}"
    );
    assert!(message.contains("4096"), "names the bound: {message}");

    a.stop();
    a.reset();
    a.assert_clean();
}
