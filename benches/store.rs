//! The store's flash wear and size, run on demand as root: `cargo bench --bench store`.
//!
//! (a) Bytes an idle agent with 20 running pods (busybox sleep, no logs) writes: the
//!     agent process's `/proc/<pid>/io` (write_bytes: what reached the block layer;
//!     wchar: what it passed to write calls) and the growth of its store directory,
//!     over a window of HOLDFAST_BENCH_MINUTES (default 3) after the pods settled,
//!     extrapolated to one hour. Default intervals (file check 20 s, resync 1 min).
//! (b) The store's size on disk after HOLDFAST_BENCH_CYCLES (default 10 000) pod
//!     create/delete cycles through the real source mux and the sync loop's trees (20
//!     pods stay throughout), each step flushed as the agent does, and after
//!     `holdfast store compact`'s compaction.
//!
//! Prints a table and writes `target/bench/store.json`.

mod common;

use support::oci;

use std::path::Path;
use std::process::{Child, Command};
use std::time::{Duration, Instant};

use holdfast::pod::annotations::SOURCE_FILE;
use holdfast::source::{Mux, SourceSnapshot};
use holdfast::store::{dir_size, Batch, Store, Tree};
use holdfast::sync::record::{Instance, InstanceState};
use holdfast::sync::{ContainerRecord, PodState};
use k8s_openapi::api::core::v1::{Pod, PodStatus};

const BIN: &str = env!("CARGO_BIN_EXE_holdfast");
const PODS: usize = 20;
const CGROUP_ROOT: &str = "/holdfast-bench-store";

fn env_f64(name: &str, default: f64) -> f64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn main() {
    if !nix::unistd::geteuid().is_root() {
        eprintln!("store bench: needs root (it runs containers)");
        std::process::exit(2);
    }
    let minutes = env_f64("HOLDFAST_BENCH_MINUTES", 3.0);
    let cycles = env_f64("HOLDFAST_BENCH_CYCLES", 10_000.0) as usize;
    let dir = std::env::temp_dir().join(format!("holdfast-bench-store-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("bench dir");

    let steady = steady_state(&dir, minutes);
    let sizes = churn(&dir.join("churn-db"), cycles);

    println!(
        "\n(a) steady state, {PODS} running pods, measured over {minutes} min and extrapolated to 1 hour"
    );
    println!("{:<44} {:>14} {:>14}", "", "in window", "per hour");
    for (what, bytes) in [
        ("agent write_bytes (block layer)", steady.write_bytes as i64),
        ("agent wchar (write calls)", steady.wchar as i64),
        ("store directory growth", steady.db_growth),
    ] {
        println!(
            "{what:<44} {:>14} {:>14.0}",
            bytes,
            bytes as f64 * 60.0 / minutes
        );
    }
    println!(
        "{:<44} {:>14} {:>14.0}",
        "write_bytes + store growth",
        steady.write_bytes + steady.db_growth.max(0) as u64,
        (steady.write_bytes + steady.db_growth.max(0) as u64) as f64 * 60.0 / minutes
    );
    println!("target: <= 65536 bytes/hour");

    println!("\n(b) store size on disk, {PODS} pods kept, pod create/delete cycles");
    println!("{:<44} {:>14} {:>14}", "", "disk bytes", "live bytes");
    for (label, disk, live) in &sizes.rows {
        println!("{label:<44} {disk:>14} {live:>14}");
    }
    println!(
        "{:<44} {:>14}",
        "churn time (s)",
        format!("{:.1}", sizes.elapsed.as_secs_f64())
    );

    let json = serde_json::json!({
        "steady_state": {
            "pods": PODS,
            "window_minutes": minutes,
            "extrapolated_to_one_hour": true,
            "write_bytes": steady.write_bytes,
            "wchar": steady.wchar,
            "db_growth": steady.db_growth,
            "write_bytes_per_hour": steady.write_bytes as f64 * 60.0 / minutes,
            "wchar_per_hour": steady.wchar as f64 * 60.0 / minutes,
            "db_growth_per_hour": steady.db_growth as f64 * 60.0 / minutes,
            "target_per_hour": 65536,
        },
        "churn": {
            "cycles": cycles,
            "kept_pods": PODS,
            "seconds": sizes.elapsed.as_secs_f64(),
            "sizes": sizes.rows.iter().map(|(l, d, v)| serde_json::json!({"at": l, "disk_bytes": d, "live_bytes": v})).collect::<Vec<_>>(),
        },
    });
    common::write_json("store", &json);
    let _ = std::fs::remove_dir_all(&dir);
}

struct Steady {
    write_bytes: u64,
    wchar: u64,
    db_growth: i64,
}

fn proc_io(pid: u32) -> (u64, u64) {
    let text = std::fs::read_to_string(format!("/proc/{pid}/io")).expect("/proc/<pid>/io");
    let field = |name: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0)
    };
    (field("write_bytes:"), field("wchar:"))
}

fn steady_state(dir: &Path, minutes: f64) -> Steady {
    let root = dir.join("root");
    let manifests = dir.join("manifests");
    std::fs::create_dir_all(root.join("images")).expect("root");
    std::fs::create_dir_all(&manifests).expect("manifests");
    oci::busybox_image("docker.io/library/busybox:bench")
        .and_then(|i| i.write_layout_tar(&root.join("images/busybox.tar")))
        .expect("busybox image");
    let cfg = dir.join("config.yaml");
    std::fs::write(&cfg, format!("cgroupRoot: {CGROUP_ROOT}\n")).expect("config");
    for i in 0..PODS {
        let yaml = format!(
            "apiVersion: v1\nkind: Pod\nmetadata:\n  name: p{i}\nspec:\n  hostNetwork: true\n  \
             terminationGracePeriodSeconds: 0\n  containers:\n  - name: c\n    image: busybox:bench\n    \
             command: [\"sleep\", \"100000\"]\n"
        );
        std::fs::write(manifests.join(format!("p{i}.yaml")), yaml).expect("manifest");
    }
    let log = std::fs::File::create(dir.join("agent.log")).expect("log");
    let mut agent: Child = Command::new(BIN)
        .arg("run")
        .arg("--config")
        .arg(&cfg)
        .arg("--root-dir")
        .arg(&root)
        .arg("--pod-manifest-path")
        .arg(&manifests)
        .arg("--hostname-override")
        .arg("bench")
        .stdout(log.try_clone().expect("log"))
        .stderr(log)
        .spawn()
        .expect("holdfast run");
    let deadline = Instant::now() + Duration::from_secs(180);
    while common::running_containers(&root) < PODS {
        assert!(Instant::now() < deadline, "{PODS} pods did not start");
        std::thread::sleep(Duration::from_millis(200));
    }
    // Statuses written, sled's flusher done, the first resync past.
    std::thread::sleep(Duration::from_secs(70));
    let pid = agent.id();
    let (wb0, wc0) = proc_io(pid);
    let db0 = dir_size(&root.join("db")) as i64;
    eprintln!("steady state: measuring for {minutes} min");
    std::thread::sleep(Duration::from_secs_f64(minutes * 60.0));
    let (wb1, wc1) = proc_io(pid);
    let db1 = dir_size(&root.join("db")) as i64;
    assert_eq!(
        common::running_containers(&root),
        PODS,
        "pods stopped during the window"
    );
    let _ = nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid as i32),
        nix::sys::signal::Signal::SIGTERM,
    );
    let _ = agent.wait();
    let _ = Command::new(BIN)
        .args(["reset", "--root-dir"])
        .arg(&root)
        .args(["--cgroup-root", CGROUP_ROOT])
        .status();
    Steady {
        write_bytes: wb1 - wb0,
        wchar: wc1 - wc0,
        db_growth: db1 - db0,
    }
}

struct Sizes {
    rows: Vec<(String, u64, u64)>,
    elapsed: Duration,
}

fn pod(i: usize) -> Pod {
    serde_json::from_value(serde_json::json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": format!("churn-{i}-bench"),
            "namespace": "default",
            "uid": format!("{:032x}", i as u128 * 0x9e37_79b9_7f4a_7c15),
            "labels": {"app": "churn"},
            "annotations": {
                "kubernetes.io/config.source": "file",
                "kubernetes.io/config.hash": format!("{:032x}", i),
                "kubernetes.io/config.seen": "2026-11-23T14:00:00Z",
            },
        },
        "spec": {
            "nodeName": "bench",
            "hostNetwork": true,
            "restartPolicy": "Always",
            "terminationGracePeriodSeconds": 0,
            "containers": [{
                "name": "c",
                "image": "busybox:bench",
                "command": ["sleep", "100000"],
                "resources": {"limits": {"memory": "32Mi"}},
            }],
        },
    }))
    .expect("pod")
}

fn status(running: bool) -> PodStatus {
    serde_json::from_value(serde_json::json!({
        "phase": if running { "Running" } else { "Pending" },
        "hostIP": "10.0.0.2",
        "podIP": "10.0.0.2",
        "startTime": "2026-11-23T14:00:00Z",
        "conditions": [
            {"type": "Initialized", "status": "True", "lastTransitionTime": "2026-11-23T14:00:00Z"},
            {"type": "Ready", "status": if running { "True" } else { "False" }, "lastTransitionTime": "2026-11-23T14:00:01Z"},
            {"type": "ContainersReady", "status": if running { "True" } else { "False" }, "lastTransitionTime": "2026-11-23T14:00:01Z"},
            {"type": "PodScheduled", "status": "True", "lastTransitionTime": "2026-11-23T14:00:00Z"},
        ],
        "containerStatuses": [{
            "name": "c", "ready": running, "restartCount": 0, "started": running,
            "image": "busybox:bench", "imageID": "sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef",
            "containerID": "libcontainer://0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef",
            "state": if running { serde_json::json!({"running": {"startedAt": "2026-11-23T14:00:01Z"}}) } else { serde_json::json!({"waiting": {"reason": "ContainerCreating"}}) },
        }],
    }))
    .expect("status")
}

fn measure(store: &Store, label: String, rows: &mut Vec<(String, u64, u64)>) {
    store.flush().expect("flush");
    let live = store.live_bytes().expect("live bytes");
    rows.push((label, store.disk_bytes(), live));
}

/// Create and delete pods as the agent does: the mux stores the desired pod, the
/// worker writes container record and status (pending, then running), and on removal
/// the mux and the worker forget it. Every step is flushed, as in the agent.
fn churn(path: &Path, cycles: usize) -> Sizes {
    let mut rows = Vec::new();
    let t0 = Instant::now();
    {
        let store = Store::open(path).expect("open");
        let (mut mux, _) = Mux::open(&store).expect("mux");
        // The trees as the pod workers write them (`PodStates` reads them).
        let containers: Tree<ContainerRecord> = store.tree("containers").expect("tree");
        let podstates: Tree<PodState> = store.tree("podstates").expect("tree");
        let kept: Vec<Pod> = (0..PODS).map(pod).collect();
        let write_pod = |p: &Pod, running: bool| {
            let uid = p.metadata.uid.clone().expect("uid");
            let mut rec = ContainerRecord::new("c");
            rec.current = Some(Instance {
                id: holdfast::runtime::ContainerId::derive(&uid, "c", 0),
                image: "busybox:bench".into(),
                image_id: "sha256:0123456789abcdef".into(),
                state: InstanceState::Running {
                    started_at: holdfast::time::now(),
                },
            });
            let mut batch = Batch::new();
            batch
                .put(&containers, &ContainerRecord::key(&uid, "c"), &rec)
                .expect("put");
            let state = PodState {
                pod: p.clone(),
                status: status(running),
                start_time: holdfast::time::now(),
                stop_deadline: None,
            };
            batch.put(&podstates, &uid, &state).expect("put");
            store.apply(batch).expect("apply");
            store.flush().expect("flush");
        };
        mux.apply(SourceSnapshot {
            source: SOURCE_FILE,
            resource_version: None,
            pods: kept.clone(),
        })
        .expect("apply");
        for p in &kept {
            write_pod(p, true);
        }
        measure(&store, format!("{PODS} pods, before churn"), &mut rows);
        let checkpoints = [cycles / 10, cycles / 2, cycles];
        for i in 0..cycles {
            let p = pod(PODS + i);
            let mut with = kept.clone();
            with.push(p.clone());
            mux.apply(SourceSnapshot {
                source: SOURCE_FILE,
                resource_version: None,
                pods: with,
            })
            .expect("apply add");
            write_pod(&p, false);
            write_pod(&p, true);
            mux.apply(SourceSnapshot {
                source: SOURCE_FILE,
                resource_version: None,
                pods: kept.clone(),
            })
            .expect("apply remove");
            let uid = p.metadata.uid.clone().expect("uid");
            let mut batch = Batch::new();
            batch.remove(&containers, &ContainerRecord::key(&uid, "c"));
            batch.remove(&podstates, &uid);
            store.apply(batch).expect("apply");
            store.flush().expect("flush");
            if checkpoints.contains(&(i + 1)) {
                measure(&store, format!("after {} cycles", i + 1), &mut rows);
            }
        }
    }
    let elapsed = t0.elapsed();
    let c = holdfast::store::compact::compact(path).expect("compact");
    let store = Store::open(path).expect("reopen");
    let live = store.live_bytes().expect("live");
    rows.push((
        format!("after compaction (was {})", c.before),
        c.after,
        live,
    ));
    Sizes { rows, elapsed }
}
