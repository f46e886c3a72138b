//! A pod that ran its course (Succeeded, or Failed) keeps its containers' logs and its
//! final status until it is removed, as the kubelet keeps them until the pod is deleted:
//! `kubectl logs` of a finished Job answers. What it held goes at once (its volumes,
//! network files, `/dev/shm` and cgroups). Real containers (as root), logs through the
//! kubelet API.

use support::{agent, kubelet_api};

use std::time::Duration;

use agent::cgroup_dirs;
use kubelet_api::Api;

const WAIT: Duration = Duration::from_secs(60);

fn job(name: &str, exit: i32) -> String {
    format!(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: {name}\nspec:\n  hostNetwork: true\n  \
         restartPolicy: Never\n  volumes:\n    - name: scratch\n      emptyDir: {{medium: Memory}}\n  \
         containers:\n    - name: main\n      image: busybox:demo\n      \
         command: [\"sh\", \"-c\", \"echo work of {name}; echo to stderr >&2; exit {exit}\"]\n      \
         volumeMounts:\n        - name: scratch\n          mountPath: /scratch\n"
    )
}

#[test]
fn a_finished_pod_keeps_its_logs_until_it_is_removed() {
    if !agent::need_root() {
        return;
    }
    let api = Api::start("finished-pods");
    let a = &api.agent;
    a.write_manifest("done.yaml", &job("done", 0));
    a.write_manifest("broken.yaml", &job("broken", 3));
    let mut uids = Vec::new();
    for (name, phase) in [("done", "Succeeded"), ("broken", "Failed")] {
        let p = a.wait_pod(name, phase, WAIT, |p| p["status"]["phase"] == phase);
        let uid = p["pod"]["metadata"]["uid"]
            .as_str()
            .unwrap_or_default()
            .to_owned();
        // What the pod held is given back: its directory (volumes, network files,
        // /dev/shm) and its cgroups.
        let pod_dir = a.root.join("pods").join(&uid);
        a.wait_until(&format!("{name}'s sandbox to be torn down"), WAIT, |_| {
            !pod_dir.exists()
        });
        let leftover: Vec<_> = cgroup_dirs(&a.cgroup_root)
            .into_iter()
            .flat_map(|root| walk(&root))
            .filter(|d| d.to_string_lossy().contains(uid.as_str()))
            .collect();
        assert!(leftover.is_empty(), "{name}: cgroups left: {leftover:?}");
        let (code, body) = api.get(&format!("/containerLogs/default/{name}-node-1/main"));
        assert_eq!(code, 200, "{name}: {body}");
        assert_eq!(body, format!("work of {name}\nto stderr\n"));
        uids.push((name, uid));
    }
    // Still there after an agent restart, and nothing runs again.
    let mut api = api;
    api.agent.kill9();
    api.agent.start();
    let a = &api.agent;
    std::thread::sleep(Duration::from_secs(3));
    for (name, phase) in [("done", "Succeeded"), ("broken", "Failed")] {
        let p = a.pod(name).expect("pod");
        assert_eq!(p["status"]["phase"], phase);
        assert_eq!(
            agent::container(&p, "main")["restartCount"],
            0,
            "{name} ran again"
        );
        let (code, body) = api.get(&format!("/containerLogs/default/{name}-node-1/main"));
        assert_eq!((code, body), (200, format!("work of {name}\nto stderr\n")));
    }

    // Removed: the logs go with it.
    a.remove_manifest("done.yaml");
    a.wait_gone("done", WAIT);
    let (code, _) = api.get("/containerLogs/default/done-node-1/main");
    assert_eq!(code, 404);
    let logs = a.root.join("logs/pods");
    let left: Vec<String> = std::fs::read_dir(&logs)
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    let (_, done_uid) = &uids[0];
    let (_, broken_uid) = &uids[1];
    assert!(
        !left.iter().any(|d| d.ends_with(done_uid.as_str())),
        "{left:?}"
    );
    assert!(
        left.iter().any(|d| d.ends_with(broken_uid.as_str())),
        "{left:?}"
    );

    api.agent.reset();
    api.agent.assert_clean();
}

/// Every directory under `root`, itself included.
fn walk(root: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    let mut todo = vec![root.to_path_buf()];
    while let Some(d) = todo.pop() {
        if let Ok(entries) = std::fs::read_dir(&d) {
            todo.extend(entries.flatten().map(|e| e.path()).filter(|p| p.is_dir()));
        }
        out.push(d);
    }
    out
}
