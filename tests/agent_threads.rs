//! End-to-end: a burst of static pods started and stopped together does not make the
//! agent start a thread per pod, and the threads it did start go away after the burst.

mod support;

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use support::agent::{need_root, sh_pod, Agent};

const PODS: usize = 60;

/// The agent's long-lived threads (runtime, sources, store, sled's pool, exits, image
/// GC, eviction: 13 on a standalone node), the blocking pool's cap (32) and room for a
/// probe or pull thread. Without the cap the agent ran a blocking thread per pod
/// starting or stopping: over 150 threads for 100 pods.
const PEAK_BOUND: usize = 50;

fn threads(pid: u32) -> Option<usize> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("Threads:"))
        .and_then(|v| v.trim().parse().ok())
}

fn running(pod: &serde_json::Value) -> bool {
    pod["status"]["phase"] == "Running"
}

#[test]
fn a_burst_of_pods_runs_on_a_bounded_number_of_threads_that_go_away_after() {
    if !need_root() {
        return;
    }
    let mut a = Agent::new("threads");
    a.start();
    let pid = a.pid().expect("agent runs");
    // Settled: start-up's blocking threads have gone.
    let mut fresh = usize::MAX;
    a.wait_until(
        "the agent's start-up threads to end",
        Duration::from_secs(30),
        |_| {
            fresh = threads(pid).unwrap_or(usize::MAX);
            fresh <= PEAK_BOUND / 2
        },
    );

    let peak = Arc::new(AtomicUsize::new(0));
    let done = Arc::new(AtomicBool::new(false));
    let sampler = {
        let (peak, done) = (peak.clone(), done.clone());
        std::thread::spawn(move || {
            while !done.load(Ordering::Relaxed) {
                if let Some(n) = threads(pid) {
                    peak.fetch_max(n, Ordering::Relaxed);
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        })
    };

    for i in 0..PODS {
        let pod = sh_pod(
            &format!("burst-{i}"),
            "  terminationGracePeriodSeconds: 1\n",
            "c",
            "trap 'exit 0' TERM; while true; do sleep 1; done",
            "",
        );
        a.write_manifest(&format!("burst-{i}.yaml"), &pod);
    }
    let started = Instant::now();
    for i in 0..PODS {
        a.wait_pod(
            &format!("burst-{i}"),
            "Running",
            Duration::from_secs(180),
            running,
        );
    }
    let start_took = started.elapsed();
    for i in 0..PODS {
        a.remove_manifest(&format!("burst-{i}.yaml"));
    }
    for i in 0..PODS {
        a.wait_gone(&format!("burst-{i}"), Duration::from_secs(180));
    }
    done.store(true, Ordering::Relaxed);
    let _ = sampler.join();
    let peak = peak.load(Ordering::Relaxed);
    eprintln!(
        "{PODS} pods: Running after {start_took:?}; agent threads {fresh} fresh, {peak} at most"
    );
    assert!(
        peak <= PEAK_BOUND,
        "the agent ran {peak} threads during a burst of {PODS} pods (bound {PEAK_BOUND})"
    );
    // The blocking threads the burst needed leave once idle.
    let mut now = usize::MAX;
    a.wait_until(
        "the burst's threads to end",
        Duration::from_secs(30),
        |_| {
            now = threads(pid).unwrap_or(usize::MAX);
            now <= fresh + 2
        },
    );
    a.stop();
}
