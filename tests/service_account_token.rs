//! Service-account tokens end to end against a real control plane (etcd and
//! kube-apiserver with Node and RBAC authorization and NodeRestriction): a pod created
//! through the apiserver gets the ServiceAccount admission's `kube-api-access-*`
//! volume, holdfast mints its token with the TokenRequest API, and the token read from
//! inside the container is one the apiserver accepts as the pod's service account; a
//! pod whose token cannot be minted waits with the kubelet's FailedMount event and
//! starts once it can.

use support::control_plane;

use std::process::{Command, Stdio};
use std::time::Duration;

use base64::Engine;
use control_plane::{ControlPlane, Options};
use serde_json::{json, Value};
use support::agent::{need_root, power_cut, Agent};

const NODE: &str = "sa-node-1";
const WAIT: Duration = Duration::from_secs(90);
const SA_DIR: &str = "/var/run/secrets/kubernetes.io/serviceaccount";

/// A host-network pod bound to `NODE` (no scheduler here) running as `sa`, printing
/// what its service-account directory holds, and an extra token for audience `vault`
/// with the shortest TTL the apiserver gives.
fn pod(name: &str, sa: &str) -> String {
    let script = format!(
        "d={SA_DIR}; echo TOKEN=$(cat $d/token); echo NS=$(cat $d/namespace); \
         echo CA=$(md5sum < $d/ca.crt | cut -d' ' -f1); echo MODE=$(stat -L -c %a $d/token); \
         echo VAULT=$(cat /vault/token); echo READY; exec sleep 3600"
    );
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {
            "nodeName": NODE,
            "serviceAccountName": sa,
            "hostNetwork": true,
            "terminationGracePeriodSeconds": 1,
            "containers": [{
                "name": "main",
                "image": "busybox:demo",
                "command": ["sh", "-c", script],
                "resources": {"limits": {"memory": "64Mi", "cpu": "100m"}},
                "volumeMounts": [{"name": "vault-token", "mountPath": "/vault", "readOnly": true}],
            }],
            "volumes": [{"name": "vault-token", "projected": {"sources": [
                {"serviceAccountToken": {"audience": "vault", "expirationSeconds": 600, "path": "token"}}
            ]}}],
        },
    })
    .to_string()
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

fn output_until_ready(a: &Agent, name: &str) -> Vec<String> {
    let mut out = Vec::new();
    a.wait_until(&format!("pod {name} to print READY"), WAIT, |a| {
        out = printed(a, name);
        out.iter().any(|l| l == "READY")
    });
    out
}

fn value<'a>(out: &'a [String], key: &str) -> &'a str {
    let prefix = format!("{key}=");
    out.iter()
        .find_map(|l| l.strip_prefix(&prefix))
        .unwrap_or_else(|| panic!("no {key}= in {out:?}"))
}

/// The claims of a JWT (not checked: the apiserver checks it).
fn claims(jwt: &str) -> Value {
    let payload = jwt.split('.').nth(1).expect("a JWT");
    let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(payload.trim_end_matches('='))
        .expect("base64url");
    serde_json::from_slice(&bytes).expect("claims")
}

/// SelfSubjectReview with `token` as the bearer, through the real kubectl and no
/// credentials of its own.
fn whoami(cp: &ControlPlane, token: &str) -> Value {
    let out = Command::new(cp.assets.join("kubectl"))
        .args(["--kubeconfig", "/dev/null", "--server", &cp.url])
        .arg("--certificate-authority")
        .arg(cp.ca())
        .args(["--token", token, "auth", "whoami", "-o", "json"])
        .stdin(Stdio::null())
        .output()
        .expect("kubectl");
    assert!(
        out.status.success(),
        "kubectl auth whoami with the pod's token: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("SelfSubjectReview")
}

fn md5(data: &[u8]) -> String {
    let mut child = Command::new("md5sum")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("md5sum");
    {
        use std::io::Write;
        child
            .stdin
            .take()
            .expect("stdin")
            .write_all(data)
            .expect("write");
    }
    let out = child.wait_with_output().expect("md5sum");
    String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .next()
        .unwrap_or_default()
        .to_string()
}

fn failed_mount_events(cp: &ControlPlane, pod: &str) -> Vec<String> {
    let sel = format!("involvedObject.name={pod},reason=FailedMount");
    let out = cp.kubectl_ok(&[
        "get",
        "events",
        "-n",
        "default",
        "--field-selector",
        &sel,
        "-o",
        "json",
    ]);
    let list: Value = serde_json::from_str(&out).expect("event list");
    list["items"]
        .as_array()
        .cloned()
        .unwrap_or_default()
        .iter()
        .filter_map(|e| e["message"].as_str().map(str::to_owned))
        .collect()
}

#[test]
fn pods_get_service_account_tokens_the_apiserver_accepts() {
    if !need_root() {
        return;
    }
    let cp = ControlPlane::start(Options::bare());
    // What the controller-manager would make: the ServiceAccounts and the CA bundle.
    let ca = std::fs::read_to_string(cp.ca()).expect("ca");
    cp.apply(
        &json!({"apiVersion": "v1", "kind": "List", "items": [
            {"apiVersion": "v1", "kind": "ServiceAccount",
             "metadata": {"name": "default", "namespace": "default"}},
            {"apiVersion": "v1", "kind": "ServiceAccount",
             "metadata": {"name": "late", "namespace": "default"}},
            {"apiVersion": "v1", "kind": "ConfigMap",
             "metadata": {"name": "kube-root-ca.crt", "namespace": "default"},
             "data": {"ca.crt": ca}},
        ]})
        .to_string(),
    );
    cp.create(&pod("reader", "default"));
    // Admitted with its ServiceAccount, then the ServiceAccount goes: its token cannot
    // be minted until it is back.
    cp.create(&pod("waiter", "late"));
    cp.kubectl_ok(&["delete", "serviceaccount", "late", "-n", "default"]);
    let admitted = cp.get("pod/reader", Some("default")).expect("pod");
    let access = admitted["spec"]["volumes"]
        .as_array()
        .and_then(|vs| {
            vs.iter().find(|v| {
                v["name"]
                    .as_str()
                    .is_some_and(|n| n.starts_with("kube-api-access-"))
            })
        })
        .expect("the admission's kube-api-access volume")
        .clone();
    // This apiserver's admission (an OpenShift build) also projects the service CA
    // bundle, which that distribution's operator publishes in every namespace.
    for source in access["projected"]["sources"]
        .as_array()
        .into_iter()
        .flatten()
    {
        let cm = &source["configMap"];
        let Some(name) = cm["name"].as_str().filter(|n| *n != "kube-root-ca.crt") else {
            continue;
        };
        let data: serde_json::Map<String, Value> = cm["items"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|i| i["key"].as_str())
            .map(|k| (k.to_string(), json!(ca)))
            .collect();
        cp.apply(
            &json!({"apiVersion": "v1", "kind": "ConfigMap",
                    "metadata": {"name": name, "namespace": "default"}, "data": data})
            .to_string(),
        );
    }
    let volume = access["name"].as_str().unwrap_or_default().to_string();

    let mut a = Agent::new("sa-token");
    a.node_name = NODE.into();
    cp.join(
        &mut a,
        "",
        "nodeStatusUpdateFrequency: 1s\nnodeStatusReportFrequency: 3s\n",
    );
    let t0 = std::time::Instant::now();
    a.start();

    let out = output_until_ready(&a, "reader");
    eprintln!(
        "agent start to the pod printing its token: {:?}",
        t0.elapsed()
    );
    let token = value(&out, "TOKEN");
    assert_eq!(value(&out, "NS"), "default");
    assert_eq!(value(&out, "CA"), md5(ca.as_bytes()));
    // kube-api-access's defaultMode 0644.
    assert_eq!(value(&out, "MODE"), "644");

    let review = whoami(&cp, token);
    let user = &review["status"]["userInfo"];
    assert_eq!(
        user["username"], "system:serviceaccount:default:default",
        "{review}"
    );
    assert_eq!(
        user["extra"]["authentication.kubernetes.io/pod-name"],
        json!(["reader"]),
        "{review}"
    );
    assert_eq!(
        user["extra"]["authentication.kubernetes.io/pod-uid"],
        json!([admitted["metadata"]["uid"]]),
        "{review}"
    );
    let c = claims(token);
    assert_eq!(
        c["kubernetes.io"]["pod"]["name"], "reader",
        "bound to the pod: {c}"
    );
    // The audience-bound, 600 s token.
    let vault = claims(value(&out, "VAULT"));
    assert_eq!(vault["aud"], json!(["vault"]), "{vault}");
    assert_eq!(
        vault["exp"].as_i64().unwrap_or(0) - vault["iat"].as_i64().unwrap_or(0),
        600,
        "{vault}"
    );

    // The waiter says why it waits, in the kubelet's words.
    let told = cp.wait_for(
        "FailedMount for the waiter",
        WAIT,
        || a.agent_log(),
        |cp| {
            failed_mount_events(cp, "waiter")
                .into_iter()
                .find(|m| m.contains("failed to fetch token"))
        },
    );
    assert!(
        told.starts_with("MountVolume.SetUp failed for volume \"")
            && told.contains(" : failed to fetch token: serviceaccounts \"late\" not found"),
        "{told}"
    );
    assert!(
        printed(&a, "waiter").is_empty(),
        "the waiter started without a token"
    );
    // Back: it starts.
    cp.apply(
        &json!({"apiVersion": "v1", "kind": "ServiceAccount",
                "metadata": {"name": "late", "namespace": "default"}})
        .to_string(),
    );
    let back = std::time::Instant::now();
    let out = output_until_ready(&a, "waiter");
    eprintln!(
        "service account back to the waiter running: {:?}",
        back.elapsed()
    );
    let review = whoami(&cp, value(&out, "TOKEN"));
    assert_eq!(
        review["status"]["userInfo"]["username"], "system:serviceaccount:default:late",
        "{review}"
    );
    eprintln!("kube-api-access volume {volume}: token accepted as the pod's service account");
    let waiter_uid = cp
        .get("pod/waiter", Some("default"))
        .and_then(|p| p["metadata"]["uid"].as_str().map(str::to_owned))
        .expect("waiter uid");
    cp.kubectl_ok(&["delete", "pod", "waiter", "-n", "default", "--wait=false"]);
    a.wait_gone("waiter", WAIT);

    // A power cut, and the device comes back with no uplink (its kubeconfig's server
    // is a port nobody listens on): the pod runs again with the token it had, from
    // the store (its tmpfs volume went with the power).
    let first = token.to_string();
    power_cut(&mut a);
    let at = a
        .extra_args
        .iter()
        .position(|x| x == "--kubeconfig")
        .expect("kubeconfig arg");
    let kubeconfig = a.extra_args[at + 1].clone();
    let text = std::fs::read_to_string(&kubeconfig).expect("kubeconfig");
    let dead = format!("https://127.0.0.1:{}", support::agent::free_port());
    std::fs::write(&kubeconfig, text.replace(&cp.url, &dead)).expect("kubeconfig");
    a.start();
    let mut again = Vec::new();
    a.wait_until("reader to run again offline", WAIT, |a| {
        let Some(p) = a.pod("reader") else {
            return false;
        };
        again = (1..4)
            .map(|n| a.container_log(&p, "main", n))
            .filter(|l| l.contains(" READY"))
            .flat_map(|l| {
                l.lines()
                    .filter_map(|l| l.splitn(4, ' ').nth(3).map(str::to_owned))
                    .collect::<Vec<_>>()
            })
            .collect();
        !again.is_empty()
    });
    assert!(
        again.iter().any(|l| *l == format!("TOKEN={first}")),
        "the stored token, offline"
    );
    assert_eq!(value(&again, "NS"), "default");

    // The store holds the reader's two tokens and none of the deleted waiter's; no
    // token ever reached the log.
    let log = a.agent_log();
    a.stop();
    assert!(!log.contains(&first), "a token in the agent's log");
    let store = holdfast::store::Store::open(&a.root.join("db")).expect("store");
    let tokens = store
        .tree::<Value>("serviceaccounttokens")
        .expect("tree")
        .keys()
        .expect("keys");
    let reader_uid = admitted["metadata"]["uid"].as_str().unwrap_or_default();
    assert_eq!(tokens.len(), 2, "{tokens:?}");
    assert!(
        tokens
            .iter()
            .all(|k| k.starts_with(&format!("{reader_uid}/"))),
        "{tokens:?}"
    );
    assert!(!tokens.iter().any(|k| k.starts_with(&waiter_uid)));
}
