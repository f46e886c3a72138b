//! Volumes end to end, as root, on real containers: configMap, secret, downwardAPI and
//! projected volumes of cluster pods (objects put at the kube-apiserver double) read
//! from inside the container, a ConfigMap update landing whole in a mounted volume,
//! and emptyDir, hostPath, subPath and readOnly of a static pod; what the pod leaves
//! goes with it.

use support::apiserver;

use std::collections::BTreeMap;
use std::time::Duration;

use apiserver::{ApiServerDouble, Identity, Options};
use k8s_openapi::api::core::v1::{ConfigMap, Pod, Secret};
use serde_json::json;
use support::agent::{container, need_root, Agent};

const NODE: &str = "vol-node-1";
const WAIT: Duration = Duration::from_secs(60);

fn double() -> ApiServerDouble {
    apiserver::start(Options {
        bookmark_interval: Duration::from_secs(1),
        ..Options::default()
    })
}

fn agent(name: &str, api: &ApiServerDouble) -> Agent {
    let mut a = Agent::new(name);
    a.node_name = NODE.into();
    a.write_config("nodeStatusUpdateFrequency: 1s\nnodeStatusReportFrequency: 3s\n");
    let kubeconfig = api.kubeconfig(&a.dir, Identity::Node(NODE));
    a.extra_args = vec!["--kubeconfig".into(), kubeconfig.display().to_string()];
    a
}

fn config_map(name: &str, data: &[(&str, &str)]) -> ConfigMap {
    serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": "default"},
        "data": data.iter().map(|(k, v)| (k.to_string(), json!(v))).collect::<serde_json::Map<_, _>>(),
    }))
    .expect("configmap")
}

fn secret(name: &str, data: &[(&str, &str)]) -> Secret {
    Secret {
        metadata: k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
            name: Some(name.into()),
            namespace: Some("default".into()),
            ..Default::default()
        },
        type_: Some("Opaque".into()),
        string_data: Some(
            data.iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect::<BTreeMap<_, _>>(),
        ),
        ..Default::default()
    }
}

/// A host-network pod bound to `NODE` whose container `main` runs `script`.
fn pod(name: &str, script: &str, volumes: serde_json::Value, mounts: serde_json::Value) -> Pod {
    serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": "default", "labels": {"app": name, "tier": "edge"}},
        "spec": {
            "nodeName": NODE,
            "hostNetwork": true,
            "terminationGracePeriodSeconds": 1,
            "securityContext": {"fsGroup": 2000},
            "containers": [{
                "name": "main",
                "image": "busybox:demo",
                "command": ["sh", "-c", script],
                "resources": {"limits": {"memory": "64Mi", "cpu": "100m"}},
                "volumeMounts": mounts,
            }],
            "volumes": volumes,
        },
    }))
    .expect("pod")
}

fn printed(a: &Agent, name: &str) -> Vec<String> {
    let Some(p) = a.pod(name) else {
        return Vec::new();
    };
    a.container_log(&p, "main", 0)
        .lines()
        .filter_map(|l| l.splitn(4, ' ').nth(3).map(str::to_owned))
        .collect()
}

fn output_until(a: &Agent, name: &str, last: &str) -> Vec<String> {
    let mut out = Vec::new();
    a.wait_until(&format!("pod {name} to print {last:?}"), WAIT, |a| {
        out = printed(a, name);
        out.iter().any(|l| l.starts_with(last))
    });
    out
}

#[test]
fn api_object_volumes_are_read_from_inside_and_updates_land_whole() {
    if !need_root() {
        return;
    }
    let api = double();
    let mut a = agent("vol-objects", &api);
    api.put_configmap(config_map(
        "app-config",
        &[("a", "1"), ("b", "1"), ("greeting", "hello")],
    ));
    api.put_configmap(config_map("kube-root-ca.crt", &[("ca.crt", "PEM")]));
    api.put_secret(secret(
        "app-secret",
        &[("password", "s3cr3t"), ("user", "admin")],
    ));
    a.start();
    // Reads everything once, then watches /cfg: each look resolves ..data once and
    // reads both keys through it, so a torn update would show as a mixed pair. A look
    // that resolved the old directory just before the swap may find it removed (as
    // with the kubelet's writer): that is a failed read, looked at again, not a mix.
    let script = "cat /cfg/greeting; echo; \
                  echo pw=$(cat /secret/pw) mode=$(stat -L -c '%a %g' /secret/pw); \
                  ls /secret | tr '\\n' ' '; echo; \
                  echo name=$(cat /info/name) labels=$(cat /info/labels | tr '\\n' ,); \
                  echo ca=$(cat /api/ca.crt) ns=$(cat /api/namespace) token=$(ls /api/token 2>&1 | grep -c 'No such'); \
                  if touch /cfg/new 2>/dev/null; then echo cfg=rw; else echo cfg=ro; fi; \
                  echo READY; \
                  while true; do d=$(readlink /cfg/..data); \
                  if a=$(cat /cfg/$d/a 2>/dev/null) && b=$(cat /cfg/$d/b 2>/dev/null); then \
                  [ \"$a\" = \"$b\" ] || echo MIXED $a $b; \
                  if [ \"$a\" = 2 ]; then echo UPDATED $a $b $(cat /cfg/a); break; fi; fi; done; \
                  exec sleep 3600";
    api.create_pod(pod(
        "reader",
        script,
        json!([
            {"name": "cfg", "configMap": {"name": "app-config"}},
            {"name": "secret", "secret": {"secretName": "app-secret", "defaultMode": 0o400,
                                          "items": [{"key": "password", "path": "pw"}]}},
            {"name": "info", "downwardAPI": {"items": [
                {"path": "name", "fieldRef": {"fieldPath": "metadata.name"}},
                {"path": "labels", "fieldRef": {"fieldPath": "metadata.labels"}}
            ]}},
            {"name": "api", "projected": {"sources": [
                {"configMap": {"name": "kube-root-ca.crt", "items": [{"key": "ca.crt", "path": "ca.crt"}]}},
                {"downwardAPI": {"items": [{"path": "namespace", "fieldRef": {"fieldPath": "metadata.namespace"}}]}}
            ]}}
        ]),
        json!([
            {"name": "cfg", "mountPath": "/cfg"},
            {"name": "secret", "mountPath": "/secret"},
            {"name": "info", "mountPath": "/info"},
            {"name": "api", "mountPath": "/api", "readOnly": true}
        ]),
    ));
    let out = output_until(&a, "reader", "READY");
    assert_eq!(out[0], "hello", "{out:?}");
    // defaultMode 0400 with fsGroup: group read added, the group is fsGroup.
    assert!(
        out.contains(&"pw=s3cr3t mode=440 2000".to_string()),
        "{out:?}"
    );
    assert!(
        out.contains(&"pw ".to_string()),
        "only the item asked for: {out:?}"
    );
    assert!(
        out.contains(&"name=reader labels=app=\"reader\",tier=\"edge\"".to_string()),
        "{out:?}"
    );
    assert!(
        out.contains(&"ca=PEM ns=default token=1".to_string()),
        "{out:?}"
    );
    assert!(out.contains(&"cfg=ro".to_string()), "{out:?}");
    // The update, both keys at once.
    api.put_configmap(config_map(
        "app-config",
        &[("a", "2"), ("b", "2"), ("greeting", "hi")],
    ));
    let out = output_until(&a, "reader", "UPDATED");
    assert!(out.contains(&"UPDATED 2 2 2".to_string()), "{out:?}");
    assert!(!out.iter().any(|l| l.starts_with("MIXED")), "{out:?}");

    // Secrets never reach the disk: the secret volume is a tmpfs. And none of it is
    // left once the pod goes.
    let p = a.pod("reader").expect("pod");
    let uid = p["pod"]["metadata"]["uid"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    let secret_dir = a
        .root
        .join("pods")
        .join(&uid)
        .join("volumes/kubernetes.io~secret/secret");
    let fs = nix::sys::statfs::statfs(&secret_dir).expect("statfs");
    assert_eq!(fs.filesystem_type(), nix::sys::statfs::TMPFS_MAGIC);
    assert!(
        !a.agent_log().contains("s3cr3t"),
        "a secret value in the log"
    );
    api.delete_pod("default", "reader", Some(0));
    a.wait_until("the pod's volumes to be gone", WAIT, |a| {
        !a.root.join("pods").join(&uid).exists()
    });
    a.reset();
    a.assert_clean();
}

#[test]
fn empty_dir_host_path_sub_path_and_read_only() {
    if !need_root() {
        return;
    }
    let mut a = Agent::new("vol-local");
    a.start();
    let host = a.dir.join("host-data");
    let manifest = format!(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: local\nspec:\n  hostNetwork: true\n  \
         terminationGracePeriodSeconds: 1\n  containers:\n    - name: main\n      image: busybox:demo\n      \
         command: [\"sh\", \"-c\", {script}]\n      volumeMounts:\n        \
         - {{name: host, mountPath: /host}}\n        \
         - {{name: host, mountPath: /host-ro, readOnly: true}}\n        \
         - {{name: scratch, mountPath: /scratch}}\n        \
         - {{name: scratch, mountPath: /logs, subPath: app/logs}}\n        \
         - {{name: ram, mountPath: /ram}}\n  volumes:\n    \
         - {{name: host, hostPath: {{path: {host}, type: DirectoryOrCreate}}}}\n    \
         - {{name: scratch, emptyDir: {{}}}}\n    \
         - {{name: ram, emptyDir: {{medium: Memory, sizeLimit: 8Mi}}}}\n    \
         - {{name: missing, hostPath: {{path: {host}/nope, type: Directory}}}}\n",
        script = serde_json::to_string("exec sleep 3600").expect("json"),
        host = host.display(),
    );
    // A hostPath of type Directory that is not there: the pod waits with the
    // kubelet's FailedMount reason, and its container never starts.
    a.write_manifest("local.yaml", &manifest);
    a.wait_until("the hostPath type check to fail", WAIT, |a| {
        a.agent_log().contains(&format!(
            "MountVolume.SetUp failed for volume \"missing\" : hostPath type check failed: {}/nope is not a directory",
            host.display()
        ))
    });
    let p = a.pod("local").expect("pod");
    assert_eq!(
        container(&p, "main")["state"]["waiting"]["reason"],
        "ContainerCreating"
    );
    std::fs::create_dir_all(host.join("nope")).expect("mkdir");

    let script = "echo from-pod > /host/written; \
                  if echo x > /host-ro/y 2>/dev/null; then echo host-ro=rw; else echo host-ro=ro; fi; \
                  echo log-line > /logs/app.log; \
                  mount | grep ' /ram ' | grep -o 'tmpfs.*size=[0-9a-z]*'; echo END; exec sleep 3600";
    let manifest = manifest.replace(
        &serde_json::to_string("exec sleep 3600").expect("json"),
        &serde_json::to_string(script).expect("json"),
    );
    a.write_manifest("local.yaml", &manifest);
    let out = output_until(&a, "local", "END");
    assert!(out.contains(&"host-ro=ro".to_string()), "{out:?}");
    assert!(
        out.iter()
            .any(|l| l.starts_with("tmpfs") && l.ends_with("size=8192k")),
        "{out:?}"
    );
    assert_eq!(
        std::fs::read_to_string(host.join("written")).expect("written on the host"),
        "from-pod\n"
    );
    let p = a.pod("local").expect("pod");
    let uid = p["pod"]["metadata"]["uid"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    let scratch = a
        .root
        .join("pods")
        .join(&uid)
        .join("volumes/kubernetes.io~empty-dir/scratch");
    assert_eq!(
        std::fs::read_to_string(scratch.join("app/logs/app.log")).expect("subPath file"),
        "log-line\n"
    );
    // An agent restart adopts the pod with its volumes as they are: the same
    // container, the memory volume still mounted with what was written to it.
    let cid = container(&p, "main")["containerID"].clone();
    let ram = a
        .root
        .join("pods")
        .join(&uid)
        .join("volumes/kubernetes.io~empty-dir/ram");
    std::fs::write(ram.join("kept"), b"still here").expect("write to the memory volume");
    a.kill9();
    a.start();
    a.wait_until("the agent to resync the pod", WAIT, |a| {
        a.agent_log().matches("running as node").count() == 2
    });
    let p = a.wait_pod("local", "adopted", WAIT, |p| {
        container(p, "main")["state"]["running"].is_object()
    });
    assert_eq!(container(&p, "main")["containerID"], cid);
    assert_eq!(
        std::fs::read(ram.join("kept")).expect("kept"),
        b"still here"
    );
    a.remove_manifest("local.yaml");
    a.wait_gone("local", WAIT);
    a.wait_until("the pod's volumes to be gone", WAIT, |a| {
        !a.root.join("pods").join(&uid).exists()
    });
    // The host's own data stays.
    assert!(host.join("written").exists());
    a.reset();
    a.assert_clean();
}
