//! Node-pressure eviction end to end, as root: the agent's pods live under a
//! cgroupRoot whose memory the test caps (as a device integrator would put them in a
//! slice), a BestEffort pod fills a memory-backed emptyDir until the pods' available
//! memory falls below `evictionHard`, and the eviction manager evicts it — not the
//! Burstable pod that stays within its requests — with the kubelet's status,
//! message, condition and event. Under disk pressure on a small filesystem of the
//! test's own, the leftovers of a finished pod are reclaimed first, and only then is
//! the pod that fills the disk evicted.

use support::{apiserver, loopfs};

use std::path::{Path, PathBuf};
use std::time::Duration;

use apiserver::{ApiServerDouble, Identity, Options};
use k8s_openapi::api::core::v1::Pod;
use serde_json::json;
use support::agent::{need_root, Agent};

const NODE: &str = "evict-node-1";
const WAIT: Duration = Duration::from_secs(90);
const MI: u64 = 1 << 20;

/// The cgroupRoot's memory limit file, made by the test before the agent starts.
fn limit_file(cgroup_root: &str) -> PathBuf {
    let rel = cgroup_root.trim_start_matches('/');
    if Path::new("/sys/fs/cgroup/cgroup.controllers").exists() {
        Path::new("/sys/fs/cgroup").join(rel).join("memory.max")
    } else {
        Path::new("/sys/fs/cgroup/memory")
            .join(rel)
            .join("memory.limit_in_bytes")
    }
}

fn pod(
    name: &str,
    script: &str,
    resources: serde_json::Value,
    volumes: serde_json::Value,
    mounts: serde_json::Value,
) -> Pod {
    serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": "default"},
        "spec": {
            "nodeName": NODE,
            "hostNetwork": true,
            "terminationGracePeriodSeconds": 30,
            "containers": [{"name": "main", "image": "busybox:demo", "command": ["sh", "-c", script],
                            "resources": resources, "volumeMounts": mounts}],
            "volumes": volumes,
        },
    }))
    .expect("pod")
}

fn phase(api: &ApiServerDouble, name: &str) -> Option<String> {
    api.get_pod("default", name)?.status?.phase
}

#[test]
fn memory_pressure_evicts_the_best_effort_pod_first() {
    if !need_root() {
        return;
    }
    let api = apiserver::start(Options {
        bookmark_interval: Duration::from_secs(1),
        ..Options::default()
    });
    let mut a = Agent::new("evict-memory");
    a.node_name = NODE.into();
    a.write_config(
        "  evictionMonitoringPeriod: 1s\nnodeStatusUpdateFrequency: 1s\nnodeStatusReportFrequency: 3s\n\
         evictionHard:\n  memory.available: 60Mi\n",
    );
    let kubeconfig = api.kubeconfig(&a.dir, Identity::Node(NODE));
    a.extra_args = vec!["--kubeconfig".into(), kubeconfig.display().to_string()];
    // The pods may use 200Mi in all; pressure starts when less than 60Mi of it is left.
    let limit = limit_file(&a.cgroup_root);
    std::fs::create_dir_all(limit.parent().expect("dir")).expect("cgroup root");
    std::fs::write(&limit, (200 * MI).to_string()).expect("memory limit");
    a.start();
    let fail = |what: &str, a: &Agent| -> ! {
        panic!(
            "timed out waiting for {what}\n--- pods ---\n{}\n--- agent log ---\n{}",
            a.pods_table(),
            a.agent_log()
        )
    };

    // Within its requests: 40Mi of 64Mi requested, in its /dev/shm.
    api.create_pod(pod(
        "steady",
        "dd if=/dev/zero of=/dev/shm/fill bs=1M count=40 2>/dev/null; echo FILLED; exec sleep 3600",
        json!({"requests": {"memory": "64Mi"}}),
        json!([]),
        json!([]),
    ));
    if !api.wait_for(WAIT, |api| {
        phase(api, "steady").as_deref() == Some("Running")
    }) {
        fail("pod steady Running", &a);
    }
    a.wait_until("steady to fill its memory", WAIT, |a| {
        a.pod("steady")
            .is_some_and(|p| a.container_log(&p, "main", 0).contains("FILLED"))
    });
    // Requests nothing, takes 120Mi: together above 140Mi.
    api.create_pod(pod(
        "hog",
        "dd if=/dev/zero of=/ram/fill bs=1M count=120 2>/dev/null; echo FILLED; exec sleep 3600",
        json!({}),
        json!([{"name": "ram", "emptyDir": {"medium": "Memory", "sizeLimit": "128Mi"}}]),
        json!([{"name": "ram", "mountPath": "/ram"}]),
    ));
    if !api.wait_for(WAIT, |api| phase(api, "hog").as_deref() == Some("Failed")) {
        fail("pod hog evicted", &a);
    }
    let hog = api.get_pod("default", "hog").expect("hog");
    let status = hog.status.expect("status");
    assert_eq!(status.reason.as_deref(), Some("Evicted"));
    let message = status.message.unwrap_or_default();
    assert!(
        message.starts_with(
            "The node was low on resource: memory. Threshold quantity: 60Mi, available: "
        ),
        "{message}"
    );
    assert!(
        message.contains(". Container main was using ")
            && message.ends_with(", request is 0, has larger consumption of memory. "),
        "{message}"
    );
    let disruption = status
        .conditions
        .unwrap_or_default()
        .into_iter()
        .find(|c| c.type_ == "DisruptionTarget")
        .expect("DisruptionTarget condition");
    assert_eq!(disruption.status, "True");
    assert_eq!(disruption.reason.as_deref(), Some("TerminationByKubelet"));
    let main = status
        .container_statuses
        .unwrap_or_default()
        .into_iter()
        .next()
        .expect("container status");
    assert!(
        main.state
            .as_ref()
            .and_then(|s| s.terminated.as_ref())
            .is_some(),
        "the evicted pod's container is stopped: {:?}",
        main.state
    );
    assert!(
        api.list_events()
            .iter()
            .any(|e| e.reason.as_deref() == Some("Evicted")
                && e.type_.as_deref() == Some("Warning")
                && e.message.as_deref() == Some(message.as_str())),
        "an Evicted event with the message"
    );

    // The pressure is gone with the hog's memory: the Burstable pod within its
    // requests keeps running, through several more looks of the manager.
    let steady_running = |api: &ApiServerDouble| phase(api, "steady").as_deref() == Some("Running");
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while std::time::Instant::now() < deadline {
        assert!(
            steady_running(&api),
            "steady was evicted too\n{}",
            a.agent_log()
        );
        std::thread::sleep(Duration::from_millis(500));
    }
    // The evicted pod holds nothing any more (its memory volume is gone).
    let uid = hog.metadata.uid.unwrap_or_default();
    assert!(!a.root.join("pods").join(&uid).join("volumes").exists());
    a.reset();
    a.assert_clean();
}

fn disk_pod(name: &str, script: &str, policy: &str) -> Pod {
    serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": "default"},
        "spec": {
            "nodeName": NODE,
            "hostNetwork": true,
            "restartPolicy": policy,
            "terminationGracePeriodSeconds": 1,
            "containers": [{"name": "main", "image": "busybox:demo", "command": ["sh", "-c", script]}],
        },
    }))
    .expect("pod")
}

#[test]
fn disk_pressure_reclaims_dead_containers_before_it_evicts() {
    if !need_root() {
        return;
    }
    let api = apiserver::start(Options {
        bookmark_interval: Duration::from_secs(1),
        ..Options::default()
    });
    let mut a = Agent::new("evict-disk");
    a.node_name = NODE.into();
    a.write_config(
        "  evictionMonitoringPeriod: 1s\nnodeStatusUpdateFrequency: 1s\nnodeStatusReportFrequency: 3s\n\
         evictionHard:\n  memory.available: 1Mi\n  nodefs.available: 20%\n  imagefs.available: 20%\n",
    );
    let kubeconfig = api.kubeconfig(&a.dir, Identity::Node(NODE));
    a.extra_args = vec!["--kubeconfig".into(), kubeconfig.display().to_string()];
    // The whole root dir on a 256 MiB filesystem of the test's own.
    let image = a.dir.join("busybox.tar");
    std::fs::rename(a.root.join("images/busybox.tar"), &image).expect("keep the image");
    let fs = loopfs::LoopFs::mount(&a.root, 256).expect("loop filesystem");
    std::fs::create_dir_all(a.root.join("images")).expect("images dir");
    std::fs::copy(&image, a.root.join("images/busybox.tar")).expect("image");
    a.start();
    let fail = |what: &str, a: &Agent| -> ! {
        panic!(
            "timed out waiting for {what}\n--- pods ---\n{}\n--- agent log ---\n{}",
            a.pods_table(),
            a.agent_log()
        )
    };

    // A static pod that wrote 12 MiB into its container's root and finished: a cluster
    // pod that ends is forgotten at once, a static pod stays until its manifest goes.
    a.write_manifest(
        "done.yaml",
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: done\nspec:\n  hostNetwork: true\n  \
         restartPolicy: Never\n  containers:\n    - name: main\n      image: busybox:demo\n      \
         command: [\"sh\", \"-c\", \"dd if=/dev/zero of=/blob bs=1M count=12 2>/dev/null; sync\"]\n",
    );
    let done = a.wait_pod("done", "Succeeded", WAIT, |p| {
        p["status"]["phase"] == "Succeeded"
    });
    let done_id = support::agent::container(&done, "main")["containerID"]
        .as_str()
        .and_then(|c| c.strip_prefix("libcontainer://"))
        .expect("container id")
        .to_owned();
    let done_dir = a.root.join("containers").join(&done_id);
    assert!(done_dir.exists());
    api.create_pod(disk_pod("steady", "exec sleep 3600", "Always"));
    if !api.wait_for(WAIT, |api| {
        phase(api, "steady").as_deref() == Some("Running")
    }) {
        fail("pod steady Running", &a);
    }

    // Ballast leaves 4 MiB less than the threshold free: the 12 MiB the finished pod
    // left are enough to relieve it.
    let capacity = holdfast::node::facts::statfs(&a.root)
        .expect("statvfs")
        .capacity;
    let threshold = capacity / 5;
    let free = fs.free();
    assert!(
        free > threshold + 8 * MI,
        "{free} free of {capacity} before the ballast"
    );
    let ballast_size = free - threshold + 4 * MI;
    let ballast = a.root.join("ballast");
    {
        use std::io::Write;
        let mut f = std::fs::File::create(&ballast).expect("ballast");
        let chunk = vec![0u8; MI as usize];
        for _ in 0..ballast_size / MI {
            f.write_all(&chunk).expect("write ballast");
        }
        f.sync_all().expect("sync ballast");
    }
    a.wait_until("the finished pod's container to be reclaimed", WAIT, |_| {
        !done_dir.exists()
    });
    // ext4 hands freed blocks back when its journal commits.
    a.wait_until("the disk to be relieved", WAIT, |_| fs.free() > threshold);
    let done = a.pod("done").expect("done");
    assert_eq!(
        done["status"]["phase"], "Succeeded",
        "reclaimed, not evicted"
    );
    assert_eq!(phase(&api, "steady").as_deref(), Some("Running"));

    // A pod that fills the disk: nothing is left to reclaim, so it is evicted.
    api.create_pod(disk_pod(
        "filler",
        "dd if=/dev/zero of=/fill bs=1M count=20 2>/dev/null; sync; exec sleep 3600",
        "Always",
    ));
    if !api.wait_for(WAIT, |api| {
        phase(api, "filler").as_deref() == Some("Failed")
    }) {
        fail("pod filler evicted", &a);
    }
    let status = api
        .get_pod("default", "filler")
        .and_then(|p| p.status)
        .expect("status");
    assert_eq!(status.reason.as_deref(), Some("Evicted"));
    let message = status.message.unwrap_or_default();
    assert!(
        message
            .starts_with("The node was low on resource: ephemeral-storage. Threshold quantity: ")
            && message.contains(". Container main was using ")
            && message.ends_with(", request is 0, has larger consumption of ephemeral-storage. "),
        "{message}"
    );
    // Its leftovers go next (it has ended), and the pod that stayed small runs on.
    a.wait_until("the disk to be relieved", WAIT, |_| fs.free() > threshold);
    assert_eq!(phase(&api, "steady").as_deref(), Some("Running"));
    std::fs::remove_file(&ballast).expect("remove ballast");
    a.reset();
    drop(fs);
    a.assert_clean();
}
