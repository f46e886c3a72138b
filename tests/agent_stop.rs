//! Stopping the agent while pods are being stopped: it exits within seconds whatever
//! their grace periods (pods outlive the agent), and the next agent finishes their stops
//! by the deadline the first one set, for static pods and for a pod deleted in a real
//! cluster. Real containers, as root.

use std::time::{Duration, Instant};

use support::agent::{container, container_pid, need_root, pid_alive, Agent};
use support::control_plane::{ControlPlane, Options};

const MIN: Duration = Duration::from_secs(60);

/// How soon after SIGTERM the agent has exited: what `TimeoutStopSec=` in the unit
/// (tests/systemd_unit.rs) must leave room for.
const STOP_BOUND: Duration = Duration::from_secs(15);

/// A static pod whose one container `c` ignores SIGTERM.
fn stubborn(name: &str, grace: u64) -> String {
    format!(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: {name}\nspec:\n  hostNetwork: true\n  \
         terminationGracePeriodSeconds: {grace}\n  containers:\n    - name: c\n      \
         image: busybox:demo\n      command: [\"sh\", \"-c\", \"trap '' TERM; while true; do sleep 0.1; done\"]\n"
    )
}

fn running_pid(a: &Agent, name: &str) -> i32 {
    let p = a.wait_pod(name, "running", MIN, |p| {
        container(p, "c")["state"]["running"].is_object()
    });
    container_pid(a, &p, "c")
}

/// SIGTERM to the agent; returns how long it took to exit (panics past `STOP_BOUND`).
fn stop_within_bound(a: &mut Agent) -> Duration {
    let pid = nix::unistd::Pid::from_raw(a.pid().expect("agent runs") as i32);
    let t = Instant::now();
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM).expect("SIGTERM");
    while a.exited().is_none() {
        if t.elapsed() > STOP_BOUND {
            a.kill9();
            panic!(
                "the agent did not exit within {STOP_BOUND:?} of SIGTERM\n{}",
                a.agent_log()
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let took = t.elapsed();
    // Reaped already: this only lets the agent be started again.
    a.kill9();
    took
}

/// Waits for the agent to log that it began stopping static pod `name` with `grace`
/// seconds.
fn wait_stopping(a: &Agent, name: &str, grace: u64) {
    wait_said(a, &format!("default/{name}-node-1"), grace);
}

/// Waits for the agent to log that it began stopping pod `full` (namespace/name).
fn wait_said(a: &Agent, full: &str, grace: u64) {
    let said = format!("pod {full}: stopping (grace period {grace}s)");
    a.wait_until(&format!("{full} to be stopping"), MIN, |a| {
        a.agent_log().contains(&said)
    });
}

#[test]
fn the_agent_stops_at_once_while_pods_wait_out_long_grace_periods() {
    if !need_root() {
        return;
    }
    let mut a = Agent::new("stop-long-grace");
    a.write_manifest("two-min.yaml", &stubborn("two-min", 120));
    a.write_manifest("a-year.yaml", &stubborn("a-year", 365 * 24 * 3600));
    a.start();
    let two_min = running_pid(&a, "two-min");
    let a_year = running_pid(&a, "a-year");
    a.remove_manifest("two-min.yaml");
    a.remove_manifest("a-year.yaml");
    wait_stopping(&a, "two-min", 120);
    wait_stopping(&a, "a-year", 365 * 24 * 3600);

    let took = stop_within_bound(&mut a);
    eprintln!("agent exited {took:?} after SIGTERM");
    // Handed over, not killed on the way out.
    assert!(pid_alive(two_min), "two-min killed with the agent");
    assert!(pid_alive(a_year), "a-year killed with the agent");

    // The next agent resumes the stops: still within their grace periods, so the
    // containers run on, and the pods are shown stopping, not forgotten.
    a.start();
    a.wait_until("the stops to be resumed", MIN, |a| {
        a.agent_log().matches("resuming its stop").count() >= 2
    });
    assert!(
        pid_alive(two_min),
        "two-min killed before its grace period ran out"
    );
    assert!(
        pid_alive(a_year),
        "a-year killed before its grace period ran out"
    );
    assert!(a.pod("two-min").is_some(), "{}", a.pods_table());
    let took = stop_within_bound(&mut a);
    eprintln!("restarted agent exited {took:?} after SIGTERM");
    a.reset();
    a.assert_clean();
}

#[test]
fn a_restarted_agent_kills_by_the_deadline_the_first_one_set() {
    if !need_root() {
        return;
    }
    const GRACE: u64 = 16;
    let mut a = Agent::new("stop-resume");
    a.write_manifest("short.yaml", &stubborn("short", GRACE));
    a.start();
    let pid = running_pid(&a, "short");
    a.remove_manifest("short.yaml");
    wait_stopping(&a, "short", GRACE);
    // The agent said it no later than this: SIGKILL is due by `seen + GRACE`.
    let seen = Instant::now();

    stop_within_bound(&mut a);
    assert!(pid_alive(pid), "the container was killed with the agent");
    // Down for a while, as across an upgrade: a countdown started again by the next
    // agent would end no earlier than `seen + 6 s + GRACE`.
    while seen.elapsed() < Duration::from_secs(6) {
        assert!(pid_alive(pid), "killed while no agent ran");
        std::thread::sleep(Duration::from_millis(100));
    }
    a.start();
    a.wait_until("the container to be killed", MIN, |_| !pid_alive(pid));
    let killed = seen.elapsed();
    assert!(
        killed >= Duration::from_secs(GRACE - 1),
        "killed {killed:?} after the stop began, before its {GRACE}s grace period ran out"
    );
    assert!(
        killed < Duration::from_secs(GRACE + 5),
        "killed {killed:?} after the stop began: the grace period started again\n{}",
        a.agent_log()
    );
    a.wait_gone("short", MIN);
    assert!(
        a.agent_log().contains("grace period over, killing"),
        "{}",
        a.agent_log()
    );
    a.stop();
    a.reset();
    a.assert_clean();
}

#[test]
fn a_pod_deleted_in_the_cluster_goes_when_its_grace_runs_out_across_a_restart() {
    if !need_root() {
        return;
    }
    const GRACE: u64 = 20;
    let cp = ControlPlane::start(Options::bare());
    // No controller makes the namespace's ServiceAccount in a bare cluster.
    let _ = cp.kubectl(&["create", "serviceaccount", "default"]);
    let mut a = Agent::new("stop-cluster");
    a.node_name = "stop-node-1".into();
    cp.join(&mut a, "", "");
    a.start();
    cp.apply(&format!(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: stubborn\nspec:\n  nodeName: stop-node-1\n  \
         hostNetwork: true\n  automountServiceAccountToken: false\n  \
         terminationGracePeriodSeconds: {GRACE}\n  containers:\n    - name: c\n      \
         image: docker.io/library/busybox:demo\n      \
         command: [\"sh\", \"-c\", \"trap '' TERM; while true; do sleep 0.1; done\"]\n"
    ));
    let pid = running_pid(&a, "stubborn");
    cp.kubectl_ok(&["delete", "pod", "stubborn", "--wait=false"]);
    wait_said(&a, "default/stubborn", GRACE);
    let seen = Instant::now();

    stop_within_bound(&mut a);
    assert!(pid_alive(pid), "the container was killed with the agent");
    let api = cp
        .get("pod/stubborn", None)
        .expect("the pod is still in the cluster");
    assert!(api["metadata"]["deletionTimestamp"].is_string(), "{api}");
    while seen.elapsed() < Duration::from_secs(6) {
        assert!(pid_alive(pid), "killed while no agent ran");
        std::thread::sleep(Duration::from_millis(100));
    }
    a.start();
    a.wait_until("the container to be killed", MIN, |_| !pid_alive(pid));
    let killed = seen.elapsed();
    assert!(
        killed >= Duration::from_secs(GRACE - 1),
        "killed {killed:?} after the stop began, before its {GRACE}s grace period ran out"
    );
    assert!(
        killed < Duration::from_secs(GRACE + 5),
        "killed {killed:?} after the stop began: the grace period started again\n{}",
        a.agent_log()
    );
    // The final status went out and the pod is gone from the cluster, as kubectl sees.
    cp.wait_for(
        "the pod gone from the cluster",
        MIN,
        || a.agent_log(),
        |cp| cp.get("pod/stubborn", None).is_none().then_some(()),
    );
    a.wait_gone("stubborn", MIN);
    a.stop();
    a.reset();
    a.assert_clean();
}
