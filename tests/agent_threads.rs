//! End-to-end: a burst of static pods started and stopped together does not make the
//! agent start a thread per pod, and the threads it did start go away after the burst.
//! The agent and the shims run with glibc's per-thread caches off, which would hold the
//! burst's freed blocks where the trim after it cannot reach them, and the stacks of the
//! threads that ended go back rather than into glibc's cache. Once the burst is over
//! the agent opens its store again (here after every burst, not only those that grew
//! its memory): the store works on, and a restarted agent finds what it wrote.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use support::agent::{container_pid, need_root, proc_status, sh_pod, Agent};
use support::maps::mappings;

const PODS: usize = 60;

/// The agent's long-lived threads (runtime, sources, store, sled's pool, exits, image
/// GC, eviction: 13 on a standalone node), the blocking pool's cap (32) and room for a
/// probe or pull thread. Without the cap the agent ran a blocking thread per pod
/// starting or stopping: over 150 threads for 100 pods.
const PEAK_BOUND: usize = 50;

fn threads(pid: u32) -> Option<usize> {
    proc_status(pid, "Threads").and_then(|n| usize::try_from(n).ok())
}

/// Whether process `pid` was started with `tunable` in `GLIBC_TUNABLES`. (glibc 2.36
/// cuts the value it was started with at the first `:` where `/proc/PID/environ` shows
/// it, so that only the first tunable can be read from there.)
fn started_with_tunable(pid: u32, tunable: &str) -> bool {
    let env = std::fs::read(format!("/proc/{pid}/environ")).unwrap_or_default();
    env.split(|b| *b == 0)
        .filter_map(|v| v.strip_prefix(b"GLIBC_TUNABLES="))
        .any(|v| v.split(|b| *b == b':').any(|t| t == tunable.as_bytes()))
}

/// Thread stacks mapped in process `pid`: writable anonymous mappings of 1 MiB and more
/// right above a guard page (glibc's layout; the main thread's `[stack]` is named).
fn thread_stacks(pid: u32) -> usize {
    let mut guard_end = None;
    let mut stacks = 0;
    for m in mappings(pid) {
        if m.perms == "rw-p" && m.anonymous() && guard_end == Some(m.start) && m.len() >= 1 << 20 {
            stacks += 1;
        }
        guard_end = (m.perms == "---p").then_some(m.end);
    }
    stacks
}

fn parent(pid: i32) -> Option<u32> {
    proc_status(u32::try_from(pid).ok()?, "PPid").and_then(|n| u32::try_from(n).ok())
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
    // Every trim opens the store again, whatever the burst left.
    a.extra_env
        .push(("HOLDFAST_TEST_REOPEN_GROWTH".into(), "0".into()));
    a.start();
    let pid = a.pid().expect("agent runs");
    assert!(
        started_with_tunable(pid, "glibc.malloc.tcache_count=0"),
        "the agent runs with glibc's thread caches off"
    );
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
    let pod = a.pod("burst-0").expect("pod burst-0");
    let shim = parent(container_pid(&a, &pod, "c")).expect("the container's shim");
    let cmdline = std::fs::read(format!("/proc/{shim}/cmdline")).unwrap_or_default();
    assert!(
        cmdline.split(|b| *b == 0).nth(1) == Some(b"shim".as_slice()),
        "the container's parent {shim} is a shim: {:?}",
        String::from_utf8_lossy(&cmdline)
    );
    assert!(
        started_with_tunable(shim, "glibc.malloc.tcache_count=0"),
        "a shim runs with glibc's thread caches off"
    );
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
    // Their stacks went back: glibc would keep up to 40 MiB of them (some 20 stacks,
    // with the pages their threads touched) for threads to come. The last thread to end
    // is still on its stack as it leaves, and another frees it later: a few may stay.
    let mut stacks = 0;
    a.wait_until(
        "the ended threads' stacks to be unmapped",
        Duration::from_secs(30),
        |_| {
            stacks = thread_stacks(pid);
            now = threads(pid).unwrap_or(usize::MAX);
            stacks <= now + 2
        },
    );
    eprintln!("after the burst: {now} threads, {stacks} thread stacks mapped");

    // The store was opened again after the burst, and takes the next pod's records.
    a.wait_until(
        "the store to be opened again after the burst",
        Duration::from_secs(60),
        |a| a.agent_log().contains("store opened again after a burst"),
    );
    let after = sh_pod(
        "after-burst",
        "  terminationGracePeriodSeconds: 1\n",
        "c",
        "trap 'exit 0' TERM; while true; do sleep 1; done",
        "",
    );
    a.write_manifest("after-burst.yaml", &after);
    let pod = a.wait_pod("after-burst", "Running", Duration::from_secs(60), running);
    let container = container_pid(&a, &pod, "c");
    // A restarted agent reads it back from the store and adopts the running container
    // rather than starting it again.
    a.stop();
    a.start();
    let pod = a.wait_pod("after-burst", "Running", Duration::from_secs(60), running);
    assert_eq!(
        container_pid(&a, &pod, "c"),
        container,
        "the container started after the store was opened again was adopted"
    );
    assert!(
        !a.agent_log().contains("open again after a burst:"),
        "opening the store again failed:\n{}",
        a.agent_log()
    );
    a.remove_manifest("after-burst.yaml");
    a.wait_gone("after-burst", Duration::from_secs(60));
    a.stop();
}
