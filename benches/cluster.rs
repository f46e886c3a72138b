//! A node in a cluster, run on demand as root: `cargo bench --bench cluster`. One
//! `holdfast run --kubeconfig` against the kube-apiserver double (tests/support/apiserver),
//! with the default node intervals (lease renewed every 10 s, full node status every
//! 5 min), running real containers:
//!
//! - Requests per minute an idle node with one running pod sends at steady state, in all
//!   and by kind, over a window of `HOLDFAST_BENCH_IDLE_SECS` (default 120) seconds.
//! - Pod start as the cluster sees it: from a bound pod created (it reaches the node's
//!   watch) to its status PATCHed to Running, p50/p95/max over 30 pods created one after
//!   another 200 ms apart.
//! - Agent memory (VmRSS, VmHWM, Pss) with no pods and with 100 pods running.
//!
//! Prints a table and writes `target/bench/cluster.json`.

mod common;

use support::{agent, apiserver};

use std::sync::Mutex;
use std::time::{Duration, Instant};

use agent::Agent;
use apiserver::{ApiServerDouble, Identity, Logged, Options};
use k8s_openapi::api::core::v1::Pod;

const NODE: &str = "bench-node-1";
/// Pods whose start latency is measured.
const LATENCY_PODS: usize = 30;
/// Time between two of them being created.
const LATENCY_SPACING: Duration = Duration::from_millis(200);
/// Pods running when memory is read.
const MEMORY_PODS: usize = 100;
/// Settling time after the idle pod runs, before the request window opens.
const SETTLE: Duration = Duration::from_secs(20);
/// Requests per minute an idle node may send.
const IDLE_TARGET_PER_MIN: f64 = 7.0;
const WAIT: Duration = Duration::from_secs(120);

fn main() {
    if !nix::unistd::geteuid().is_root() {
        eprintln!("cluster bench: needs root (it runs containers)");
        std::process::exit(2);
    }
    let idle_secs: u64 = match std::env::var("HOLDFAST_BENCH_IDLE_SECS") {
        Ok(v) => v.parse().expect("HOLDFAST_BENCH_IDLE_SECS: whole seconds"),
        Err(_) => 120,
    };
    let api = apiserver::start(Options::default());
    // Dropped before the double; its Drop kills the agent and resets (every container,
    // mount and cgroup) should anything below panic.
    let mut a = Agent::new("bench-cluster");
    a.node_name = NODE.into();
    // Only the cgroup root: every interval is the default.
    std::fs::write(
        a.dir.join("config.yaml"),
        format!(
            "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\ncgroupRoot: {}\n",
            a.cgroup_root
        ),
    )
    .expect("config");
    let kubeconfig = api.kubeconfig(&a.dir, Identity::Node(NODE));
    a.extra_args = vec!["--kubeconfig".into(), kubeconfig.display().to_string()];
    a.start();
    let pid = a.pid().expect("agent pid");

    // No pods: the node registered and its lease held.
    wait(&api, &a, "the node Ready and its lease", |api| {
        api.get_lease(NODE).is_some()
            && api.get_node(NODE).is_some_and(|n| {
                n.status
                    .and_then(|s| s.conditions)
                    .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
            })
    });
    std::thread::sleep(Duration::from_secs(2));
    let mem_idle = memory(pid);

    // 1. Requests of an idle node with one running pod.
    api.create_pod(bound_pod(&pod_name(0)));
    wait(&api, &a, "the idle pod Running", |api| {
        running(api, &pod_name(0))
    });
    std::thread::sleep(SETTLE);
    api.clear_request_log();
    let opened = Instant::now();
    std::thread::sleep(Duration::from_secs(idle_secs));
    let closed = Instant::now();
    let window: Vec<Logged> = api
        .request_log()
        .into_iter()
        .filter(|l| l.at >= opened && l.at < closed)
        .collect();
    let idle = Requests::count(&window);
    let minutes = closed.duration_since(opened).as_secs_f64() / 60.0;

    // 2. Created to Running, pods created one after another.
    let created: Mutex<Vec<Option<Instant>>> = Mutex::new(vec![None; LATENCY_PODS]);
    let mut ran: Vec<Option<Instant>> = vec![None; LATENCY_PODS];
    std::thread::scope(|s| {
        s.spawn(|| {
            for i in 0..LATENCY_PODS {
                if i > 0 {
                    std::thread::sleep(LATENCY_SPACING);
                }
                let t0 = Instant::now();
                created.lock().expect("created")[i] = Some(t0);
                api.create_pod(bound_pod(&pod_name(1 + i)));
            }
        });
        wait(&api, &a, "the latency pods Running", |api| {
            let now = Instant::now();
            let created = created.lock().expect("created").clone();
            for i in 0..LATENCY_PODS {
                if ran[i].is_none() && created[i].is_some() && running(api, &pod_name(1 + i)) {
                    ran[i] = Some(now);
                }
            }
            ran.iter().all(Option::is_some)
        });
    });
    let created = created.into_inner().expect("created");
    let latency: Vec<Duration> = created
        .iter()
        .zip(&ran)
        .filter_map(|(c, r)| Some(r.as_ref()?.duration_since(*c.as_ref()?)))
        .collect();
    let latency = stats(&latency);

    // 3. Memory with 100 pods running.
    let rest = Instant::now();
    for i in 1 + LATENCY_PODS..MEMORY_PODS {
        api.create_pod(bound_pod(&pod_name(i)));
    }
    wait(&api, &a, "all pods Running", |api| {
        (0..MEMORY_PODS).all(|i| running(api, &pod_name(i)))
    });
    let rest = rest.elapsed();
    std::thread::sleep(Duration::from_secs(5));
    let mem_pods = memory(pid);
    let processes = common::running_containers(&a.root);
    assert_eq!(processes, MEMORY_PODS, "container processes running");

    a.stop();
    a.reset();
    drop(a);
    drop(api);

    let machine = Machine::read();
    println!(
        "\ncluster bench: {} ({} CPUs), kernel {}",
        machine.cpu, machine.cpus, machine.kernel
    );
    println!(
        "\nidle node, default intervals, 1 running pod, {:.0} s window",
        minutes * 60.0
    );
    println!(
        "{:<28} {:>8} {:>8} {:>10}",
        "requests", "count", "per min", "target"
    );
    let per_min = |n: usize| n as f64 / minutes;
    for (what, n, target) in [
        ("all", idle.total, format!("<= {IDLE_TARGET_PER_MIN}")),
        ("lease PATCH", idle.lease_put, String::new()),
        ("node status PATCH", idle.node_patch, String::new()),
        ("pod WATCH (re-open)", idle.pod_watch, String::new()),
        ("LIST", idle.list, "0".to_string()),
        ("other", idle.other.len(), String::new()),
    ] {
        println!("{what:<28} {n:>8} {:>8.2} {target:>10}", per_min(n));
    }
    for o in &idle.other {
        println!("  other: {o}");
    }
    println!(
        "\ncreated -> status Running, {LATENCY_PODS} pods created {} ms apart",
        LATENCY_SPACING.as_millis()
    );
    println!("{:<28} {:>8} {:>8} {:>8}", "", "p50 ms", "p95 ms", "max ms");
    println!(
        "{:<28} {:>8.1} {:>8.1} {:>8.1}",
        "bound pod (busybox sleep)", latency.0, latency.1, latency.2
    );
    println!(
        "\nagent memory (MiB)           {:>8} {:>8} {:>8}",
        "VmRSS", "VmHWM", "Pss"
    );
    for (what, m) in [
        ("no pods".to_string(), &mem_idle),
        (format!("{MEMORY_PODS} pods Running"), &mem_pods),
    ] {
        println!(
            "{what:<28} {:>8.1} {:>8.1} {:>8}",
            mib(m.rss),
            mib(m.hwm),
            m.pss.map_or("-".to_string(), |p| format!("{:.1}", mib(p)))
        );
    }
    println!(
        "({processes} container processes running; the last {} pods, created at once, \
         were all Running {:.1} s later)",
        MEMORY_PODS - 1 - LATENCY_PODS,
        rest.as_secs_f64()
    );

    let memory_json = |m: &Memory| {
        serde_json::json!({
            "vm_rss_mib": mib(m.rss), "vm_hwm_mib": mib(m.hwm), "pss_mib": m.pss.map(mib),
        })
    };
    let json = serde_json::json!({
        "machine": {"cpu": machine.cpu, "cpus": machine.cpus, "kernel": machine.kernel},
        "idle_requests": {
            "window_s": minutes * 60.0,
            "pods": 1,
            "target_per_min": IDLE_TARGET_PER_MIN,
            "count": {
                "all": idle.total, "lease_put": idle.lease_put, "node_status_patch": idle.node_patch,
                "pod_watch": idle.pod_watch, "list": idle.list, "other": idle.other.len(),
            },
            "per_min": {
                "all": per_min(idle.total), "lease_put": per_min(idle.lease_put),
                "node_status_patch": per_min(idle.node_patch), "pod_watch": per_min(idle.pod_watch),
                "list": per_min(idle.list), "other": per_min(idle.other.len()),
            },
            "other": idle.other,
        },
        "created_to_running_ms": {
            "pods": LATENCY_PODS, "spacing_ms": LATENCY_SPACING.as_millis() as u64,
            "p50": latency.0, "p95": latency.1, "max": latency.2,
        },
        "agent_memory": {
            "no_pods": memory_json(&mem_idle),
            "pods_running": MEMORY_PODS,
            "container_processes": processes,
            "last_pods_all_running_s": rest.as_secs_f64(),
            "with_pods": memory_json(&mem_pods),
        },
    });
    common::write_json("cluster", &json);
}

fn pod_name(i: usize) -> String {
    format!("bench-{i:03}")
}

/// A pod bound to `NODE` that sleeps for an hour.
fn bound_pod(name: &str) -> Pod {
    apiserver::bound_pod(NODE, name, &["sleep", "3600"], 1)
}

fn running(api: &ApiServerDouble, name: &str) -> bool {
    api.get_pod("default", name)
        .and_then(|p| p.status)
        .and_then(|s| s.phase)
        .as_deref()
        == Some("Running")
}

/// Waits for `cond`, re-checked on every change to the double; panics (the agent's
/// Drop cleans up) with the last requests and the agent's log after `WAIT`.
fn wait(api: &ApiServerDouble, a: &Agent, what: &str, cond: impl FnMut(&ApiServerDouble) -> bool) {
    if !api.wait_for(WAIT, cond) {
        let log = api.recent_requests(40);
        let agent_log = a.agent_log();
        let tail: Vec<&str> = agent_log.lines().rev().take(60).collect();
        panic!(
            "timed out waiting for {what}\n--- last requests (newest first) ---\n{}\n--- agent log (newest first) ---\n{}",
            log,
            tail.join("\n")
        );
    }
}

/// Requests by kind.
#[derive(Default)]
struct Requests {
    total: usize,
    lease_put: usize,
    node_patch: usize,
    pod_watch: usize,
    list: usize,
    /// `METHOD path?query -> code` of the rest.
    other: Vec<String>,
}

impl Requests {
    fn count(log: &[Logged]) -> Requests {
        let mut r = Requests::default();
        for l in log {
            r.total += 1;
            let watch = l
                .query
                .split('&')
                .any(|p| p == "watch=true" || p == "watch=1");
            if l.method == "PATCH"
                && l.path
                    == format!(
                        "/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases/{NODE}"
                    )
            {
                r.lease_put += 1;
            } else if l.method == "PATCH" && l.path == format!("/api/v1/nodes/{NODE}/status") {
                r.node_patch += 1;
            } else if l.method == "GET" && l.path == "/api/v1/pods" && watch {
                r.pod_watch += 1;
            } else if l.method == "GET" && !watch && is_collection(&l.path) {
                r.list += 1;
            } else {
                r.other
                    .push(format!("{} {}?{} -> {}", l.method, l.path, l.query, l.code));
            }
        }
        r
    }
}

/// `/api/v1/<res>`, `/api/v1/namespaces/<ns>/<res>`, `/apis/<g>/<v>/<res>`,
/// `/apis/<g>/<v>/namespaces/<ns>/<res>`: a collection, not one object.
fn is_collection(path: &str) -> bool {
    let parts: Vec<&str> = path.trim_matches('/').split('/').collect();
    let rest = match parts.first() {
        Some(&"api") => parts.get(2..),
        Some(&"apis") => parts.get(3..),
        _ => None,
    };
    matches!(rest, Some([_] | ["namespaces", _, _]))
}

/// In KiB, from /proc/<pid>/status and smaps_rollup.
struct Memory {
    rss: u64,
    hwm: u64,
    pss: Option<u64>,
}

fn memory(pid: u32) -> Memory {
    let field = |text: &str, name: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.split_whitespace().next())
            .and_then(|v| v.parse::<u64>().ok())
    };
    let status =
        std::fs::read_to_string(format!("/proc/{pid}/status")).expect("/proc/<pid>/status");
    let rollup = std::fs::read_to_string(format!("/proc/{pid}/smaps_rollup")).unwrap_or_default();
    Memory {
        rss: field(&status, "VmRSS:").expect("VmRSS"),
        hwm: field(&status, "VmHWM:").expect("VmHWM"),
        pss: field(&rollup, "Pss:"),
    }
}

fn mib(kib: u64) -> f64 {
    kib as f64 / 1024.0
}

struct Machine {
    cpu: String,
    cpus: usize,
    kernel: String,
}

impl Machine {
    fn read() -> Machine {
        let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
        let cpu = cpuinfo
            .lines()
            .find_map(|l| {
                let (k, v) = l.split_once(':')?;
                (k.trim() == "model name").then(|| v.trim().to_string())
            })
            .unwrap_or_else(|| "unknown".into());
        let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease")
            .map(|s| s.trim().to_string())
            .unwrap_or_default();
        Machine {
            cpu,
            cpus: std::thread::available_parallelism().map_or(0, |n| n.get()),
            kernel,
        }
    }
}

/// (p50, p95, max) in ms.
fn stats(samples: &[Duration]) -> (f64, f64, f64) {
    let mut ms: Vec<f64> = samples.iter().map(|d| d.as_secs_f64() * 1000.0).collect();
    ms.sort_by(|a, b| a.total_cmp(b));
    if ms.is_empty() {
        return (0.0, 0.0, 0.0);
    }
    let at = |q: f64| ms[((ms.len() as f64 - 1.0) * q).round() as usize];
    (at(0.5), at(0.95), ms[ms.len() - 1])
}
