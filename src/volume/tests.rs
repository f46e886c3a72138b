use std::collections::BTreeMap;
use std::os::unix::fs::MetadataExt;

use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use serde_json::json;

use super::*;
use crate::pod::downward::DownwardInputs;
use crate::store::Store;
use crate::testutil::TempDir;
use crate::uplink::objects::{ObjectCache, TREE_CONFIG_MAPS, TREE_SECRETS};
use crate::uplink::tokens::{CachedToken, Minter, TokenKey, TokenManager};

struct Rig {
    tmp: TempDir,
    _store: Store,
    cache: ObjectCache,
    allocatable: BTreeMap<String, Quantity>,
    tokens: TokenManager,
}

/// Mints `token-for-<pod>-<expirationSeconds>` for every request.
struct Mint;

impl Minter for Mint {
    fn mint(&self, key: &TokenKey) -> Result<CachedToken, crate::kube::ApiError> {
        Ok(CachedToken {
            token: format!("token-for-{}-{}", key.pod_name, key.expiration_seconds),
            expiration: crate::time::now().as_second() + key.expiration_seconds,
            expiration_seconds: key.expiration_seconds,
        })
    }
}

impl Rig {
    fn new(objects: &[serde_json::Value]) -> Rig {
        let tmp = TempDir::new("volume");
        let store = Store::open(&tmp.0.join("db")).expect("store");
        let cms = store.tree::<ConfigMap>(TREE_CONFIG_MAPS).expect("tree");
        let secrets = store.tree::<Secret>(TREE_SECRETS).expect("tree");
        for o in objects {
            let key = format!("apps/{}", o["metadata"]["name"].as_str().unwrap_or(""));
            if o["kind"] == "Secret" {
                secrets
                    .put(
                        &key,
                        &serde_json::from_value::<Secret>(o.clone()).expect("secret"),
                    )
                    .expect("put");
            } else {
                cms.put(
                    &key,
                    &serde_json::from_value::<ConfigMap>(o.clone()).expect("cm"),
                )
                .expect("put");
            }
        }
        let cache = ObjectCache::open(&store).expect("cache");
        let tokens = TokenManager::open(&store, None).expect("tokens");
        Rig {
            tmp,
            _store: store,
            cache,
            allocatable: BTreeMap::new(),
            tokens,
        }
    }

    fn setup(&self, pod: &Pod) -> Result<PodVolumes, VolumeError> {
        let fs_group = pod
            .spec
            .as_ref()
            .and_then(|s| s.security_context.as_ref())
            .and_then(|s| s.fs_group)
            .and_then(|g| u32::try_from(g).ok());
        let sources = Sources {
            objects: &self.cache,
            downward: DownwardInputs {
                node_name: "gw-1",
                host_ip: Some("192.168.1.5"),
                pod_ips: &[],
                allocatable: &self.allocatable,
            },
            fs_group,
            tokens: Some(&self.tokens),
            allowed_host_paths: None,
        };
        setup(pod, &self.pod_dir(), &sources)
    }

    fn pod_dir(&self) -> PathBuf {
        self.tmp.0.join("pods/u1")
    }
}

impl Drop for Rig {
    fn drop(&mut self) {
        let _ = teardown(&self.pod_dir());
    }
}

/// Mounting tmpfs and bind mounts needs root; without it these tests say so and pass.
fn root() -> bool {
    let root = nix::unistd::geteuid().is_root();
    if !root {
        eprintln!("skipped: needs root to mount");
    }
    root
}

fn pod(volumes: serde_json::Value, mounts: serde_json::Value) -> Pod {
    serde_json::from_value(json!({
        "metadata": {"name": "web", "namespace": "apps", "uid": "u1",
                     "labels": {"app": "web", "tier": "front"}},
        "spec": {
            "securityContext": {"fsGroup": 2345},
            "containers": [{"name": "main", "image": "busybox", "volumeMounts": mounts,
                            "resources": {"limits": {"memory": "64Mi"}}}],
            "volumes": volumes
        }
    }))
    .expect("pod")
}

fn read(p: &Path) -> String {
    std::fs::read_to_string(p).unwrap_or_else(|e| panic!("read {}: {e}", p.display()))
}

#[test]
fn config_map_secret_and_downward_api_files() {
    if !root() {
        return;
    }
    let rig = Rig::new(&[
        json!({"kind": "ConfigMap", "metadata": {"name": "cfg"},
               "data": {"greeting": "hello", "app.ini": "[a]\n"},
               "binaryData": {"logo": "AAEC"}}),
        json!({"kind": "Secret", "metadata": {"name": "creds"},
               "data": {"password": "czNjcjN0", "user": "YWRtaW4="}}),
    ]);
    let p = pod(
        json!([
            {"name": "cfg", "configMap": {"name": "cfg", "items": [{"key": "greeting", "path": "conf/greeting"}]}},
            {"name": "all", "configMap": {"name": "cfg"}},
            {"name": "creds", "secret": {"secretName": "creds", "defaultMode": 0o400,
                                         "items": [{"key": "password", "path": "pw", "mode": 0o600}]}},
            {"name": "info", "downwardAPI": {"items": [
                {"path": "labels", "fieldRef": {"fieldPath": "metadata.labels"}},
                {"path": "name", "fieldRef": {"fieldPath": "metadata.name"}},
                {"path": "mem", "resourceFieldRef": {"containerName": "main", "resource": "limits.memory", "divisor": "1Mi"}}
            ]}}
        ]),
        json!([]),
    );
    let vols = rig.setup(&p).expect("setup");
    let path = |name: &str| vols.volumes[name].path.clone();
    assert_eq!(read(&path("cfg").join("conf/greeting")), "hello");
    assert!(!path("cfg").join("app.ini").exists());
    assert_eq!(read(&path("all").join("app.ini")), "[a]\n");
    assert_eq!(
        std::fs::read(path("all").join("logo")).expect("logo"),
        [0, 1, 2]
    );
    assert_eq!(read(&path("creds").join("pw")), "s3cr3t");
    // items' mode wins over defaultMode; fsGroup adds group read.
    let meta = std::fs::metadata(path("creds").join("pw")).expect("meta");
    assert_eq!(meta.mode() & 0o777, 0o640);
    assert_eq!(meta.gid(), 2345);
    assert_eq!(
        read(&path("info").join("labels")),
        "app=\"web\"\ntier=\"front\""
    );
    assert_eq!(read(&path("info").join("name")), "web");
    assert_eq!(read(&path("info").join("mem")), "64");
    for v in ["cfg", "creds", "info"] {
        assert!(vols.volumes[v].read_only, "{v}");
    }
    // The secret is on tmpfs, never on the disk.
    let mounts = crate::runtime::mounts_under(&rig.pod_dir()).expect("mountinfo");
    assert!(mounts.contains(&path("creds")), "{mounts:?}");
    assert!(!mounts.contains(&path("cfg")), "{mounts:?}");

    teardown(&rig.pod_dir()).expect("teardown");
    assert!(!volumes_dir(&rig.pod_dir()).exists());
    assert!(crate::runtime::mounts_under(&rig.pod_dir())
        .expect("mountinfo")
        .is_empty());
}

#[test]
fn missing_objects_and_keys_are_the_kubelets_errors_and_optional_is_fine() {
    if !root() {
        return;
    }
    let rig =
        Rig::new(&[json!({"kind": "ConfigMap", "metadata": {"name": "cfg"}, "data": {"a": "1"}})]);
    let err = rig
        .setup(&pod(
            json!([{"name": "v", "configMap": {"name": "nope"}}]),
            json!([]),
        ))
        .expect_err("missing");
    assert_eq!(err.to_string(), "configmap \"nope\" not found");
    assert_eq!(err.volume(), Some("v"));
    assert!(!err.is_waiting());
    let err = rig
        .setup(&pod(
            json!([{"name": "v", "configMap": {"name": "cfg", "items": [{"key": "b", "path": "b"}]}}]),
            json!([]),
        ))
        .expect_err("missing key");
    assert_eq!(
        err.to_string(),
        "configmap references non-existent config key: b"
    );
    let err = rig
        .setup(&pod(
            json!([{"name": "v", "secret": {"secretName": "s"}}]),
            json!([]),
        ))
        .expect_err("missing secret");
    assert_eq!(err.to_string(), "secret \"s\" not found");
    let vols = rig
        .setup(&pod(
            json!([{"name": "v", "secret": {"secretName": "s", "optional": true}}]),
            json!([]),
        ))
        .expect("optional");
    assert!(vols.volumes["v"].path.is_dir());
    let err = rig
        .setup(&pod(
            json!([{"name": "v", "persistentVolumeClaim": {"claimName": "data"}}]),
            json!([]),
        ))
        .expect_err("unsupported");
    assert!(matches!(err, VolumeError::Unsupported { .. }), "{err}");
}

#[test]
fn a_changed_config_map_lands_whole_in_the_volume() {
    let rig = Rig::new(&[json!({"kind": "ConfigMap", "metadata": {"name": "cfg"},
                                "data": {"a": "1", "b": "2"}})]);
    let p = pod(
        json!([{"name": "v", "configMap": {"name": "cfg"}}]),
        json!([]),
    );
    let vols = rig.setup(&p).expect("setup");
    let dir = vols.volumes["v"].path.clone();
    let before = std::fs::read_link(dir.join("..data")).expect("..data");
    // Nothing changed: nothing written.
    rig.setup(&p).expect("setup again");
    assert_eq!(
        std::fs::read_link(dir.join("..data")).expect("..data"),
        before
    );

    let cms = rig
        ._store
        .tree::<ConfigMap>(TREE_CONFIG_MAPS)
        .expect("tree");
    let cm: ConfigMap =
        serde_json::from_value(json!({"metadata": {"name": "cfg", "namespace": "apps"},
                                                      "data": {"a": "10", "c": "3"}}))
        .expect("cm");
    cms.put("apps/cfg", &cm).expect("put");
    rig.setup(&p).expect("update");
    let after = std::fs::read_link(dir.join("..data")).expect("..data");
    assert_ne!(before, after);
    assert_eq!(read(&dir.join("a")), "10");
    assert_eq!(read(&dir.join("c")), "3");
    assert!(!dir.join("b").exists());
    assert!(!dir.join(&before).exists());
}

#[test]
fn empty_dirs_and_sub_paths() {
    if !root() {
        return;
    }
    let mut rig = Rig::new(&[]);
    rig.allocatable
        .insert("memory".into(), Quantity("48Mi".into()));
    let p = pod(
        json!([
            {"name": "scratch", "emptyDir": {}},
            {"name": "ram", "emptyDir": {"medium": "Memory", "sizeLimit": "8Mi"}},
            {"name": "ram2", "emptyDir": {"medium": "Memory"}}
        ]),
        json!([
            {"name": "scratch", "mountPath": "/data"},
            {"name": "scratch", "mountPath": "/cache", "subPath": "cache/a", "readOnly": true},
            {"name": "ram", "mountPath": "/ram"}
        ]),
    );
    let vols = rig.setup(&p).expect("setup");
    let scratch = vols.volumes["scratch"].path.clone();
    let meta = std::fs::metadata(&scratch).expect("meta");
    assert_eq!(meta.mode() & 0o777, 0o777);
    assert_eq!(meta.gid(), 2345);
    assert_ne!(meta.mode() & 0o2000, 0);
    let ram = vols.volumes["ram"].path.clone();
    let statfs = nix::sys::statfs::statfs(&ram).expect("statfs");
    assert_eq!(statfs.filesystem_type(), nix::sys::statfs::TMPFS_MAGIC);
    assert_eq!(
        statfs.blocks() * statfs.block_size() as u64,
        8 * 1024 * 1024
    );
    // No sizeLimit: the node's allocatable memory (48Mi) bounds it, not half the RAM
    // (the pod's 64Mi limit is above it).
    let ram2 = nix::sys::statfs::statfs(&vols.volumes["ram2"].path).expect("statfs");
    assert_eq!(ram2.blocks() * ram2.block_size() as u64, 48 * 1024 * 1024);
    // What the pod writes on disk is on a mount of its own, nosuid and nodev.
    for dir in [&scratch, &ram] {
        let flags = nix::sys::statvfs::statvfs(dir).expect("statvfs").flags();
        assert!(
            flags.contains(nix::sys::statvfs::FsFlags::ST_NOSUID)
                && flags.contains(nix::sys::statvfs::FsFlags::ST_NODEV),
            "{}: {flags:?}",
            dir.display()
        );
    }

    let container = &p.spec.as_ref().expect("spec").containers[0];
    let mounts = container_mounts(&rig.pod_dir(), container, &vols, &[]).expect("mounts");
    assert_eq!(mounts.len(), 3);
    assert!(mounts.iter().all(|m| m.nosuid_nodev), "{mounts:?}");
    assert_eq!(mounts[0].source, scratch);
    assert!(!mounts[0].read_only);
    assert!(mounts[1].read_only);
    // The subPath was made, and is mounted at its staging path.
    assert!(scratch.join("cache/a").is_dir());
    std::fs::write(scratch.join("cache/a/x"), b"through").expect("write");
    assert_eq!(read(&mounts[1].source.join("x")), "through");

    // A symlink planted in the volume cannot take a subPath out of it.
    std::os::unix::fs::symlink("/etc", scratch.join("evil")).expect("symlink");
    let mut escaping = container.clone();
    escaping.volume_mounts = Some(vec![serde_json::from_value(
        json!({"name": "scratch", "mountPath": "/x", "subPath": "evil"}),
    )
    .expect("mount")]);
    let err = container_mounts(&rig.pod_dir(), &escaping, &vols, &[]).expect_err("escape");
    assert!(err.is_container_config(), "{err}");
    assert!(err.to_string().contains("not within volume path"), "{err}");
    escaping.volume_mounts = Some(vec![serde_json::from_value(
        json!({"name": "scratch", "mountPath": "/x", "subPath": "evil/new"}),
    )
    .expect("mount")]);
    assert!(container_mounts(&rig.pod_dir(), &escaping, &vols, &[]).is_err());
    assert!(!Path::new("/etc/new").exists());
    escaping.volume_mounts = Some(vec![serde_json::from_value(
        json!({"name": "scratch", "mountPath": "/x", "subPath": "../../etc"}),
    )
    .expect("mount")]);
    assert!(container_mounts(&rig.pod_dir(), &escaping, &vols, &[]).is_err());
    escaping.volume_mounts = Some(vec![serde_json::from_value(
        json!({"name": "nope", "mountPath": "/x"}),
    )
    .expect("mount")]);
    assert!(container_mounts(&rig.pod_dir(), &escaping, &vols, &[]).is_err());

    // subPathExpr expands the container's environment.
    escaping.volume_mounts = Some(vec![serde_json::from_value(
        json!({"name": "scratch", "mountPath": "/x", "subPathExpr": "logs/$(POD_NAME)"}),
    )
    .expect("mount")]);
    let m = container_mounts(
        &rig.pod_dir(),
        &escaping,
        &vols,
        &[("POD_NAME".into(), "web".into())],
    )
    .expect("expr");
    assert_eq!(m.len(), 1);
    assert!(scratch.join("logs/web").is_dir());

    teardown(&rig.pod_dir()).expect("teardown");
    assert!(crate::runtime::mounts_under(&rig.pod_dir())
        .expect("mountinfo")
        .is_empty());
    assert!(!scratch.exists());
    assert!(Path::new("/etc/passwd").exists());
}

/// Mints tokens already past 80 % of their 600 s, numbered.
struct Stale(std::sync::atomic::AtomicU32);

impl Minter for Stale {
    fn mint(&self, _: &TokenKey) -> Result<CachedToken, crate::kube::ApiError> {
        let n = self.0.fetch_add(1, std::sync::atomic::Ordering::Relaxed) + 1;
        Ok(CachedToken {
            token: format!("stale-{n}"),
            expiration: crate::time::now().as_second() + 100,
            expiration_seconds: 600,
        })
    }
}

#[test]
fn a_token_due_for_refresh_is_minted_again_and_swapped_in_whole() {
    if !root() {
        return;
    }
    let rig = Rig::new(&[]);
    rig.tokens
        .set_minter(std::sync::Arc::new(Stale(Default::default())));
    let p = pod(
        json!([{"name": "t", "projected": {"sources": [
            {"serviceAccountToken": {"expirationSeconds": 600, "path": "token"}}
        ]}}]),
        json!([]),
    );
    let vols = rig.setup(&p).expect("setup");
    let dir = vols.volumes["t"].path.clone();
    assert_eq!(read(&dir.join("token")), "stale-1");
    let before = std::fs::read_link(dir.join("..data")).expect("..data");
    // The pod's next resync.
    rig.setup(&p).expect("setup");
    assert_eq!(read(&dir.join("token")), "stale-2");
    let after = std::fs::read_link(dir.join("..data")).expect("..data");
    assert_ne!(before, after, "a new timestamped directory, swapped in");
}

#[test]
fn kube_api_access_gets_its_token_ca_and_namespace() {
    if !root() {
        return;
    }
    let rig = Rig::new(&[
        json!({"kind": "ConfigMap", "metadata": {"name": "kube-root-ca.crt"},
                                "data": {"ca.crt": "PEM"}}),
    ]);
    let mut p = pod(
        json!([{"name": "kube-api-access", "projected": {"defaultMode": 0o644, "sources": [
            {"serviceAccountToken": {"expirationSeconds": 3607, "path": "token"}},
            {"configMap": {"name": "kube-root-ca.crt", "items": [{"key": "ca.crt", "path": "ca.crt"}]}},
            {"downwardAPI": {"items": [{"path": "namespace", "fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.namespace"}}]}}
        ]}}]),
        json!([]),
    );
    // No apiserver yet and nothing kept: the kubelet's FailedMount, and no volume.
    let e = rig.setup(&p).expect_err("no token yet");
    assert_eq!(e.volume(), Some("kube-api-access"));
    assert_eq!(
        e.to_string(),
        "failed to fetch token: the node has not reached the apiserver yet"
    );

    rig.tokens.set_minter(std::sync::Arc::new(Mint));
    let vols = rig.setup(&p).expect("setup");
    let dir = &vols.volumes["kube-api-access"].path;
    assert_eq!(read(&dir.join("ca.crt")), "PEM");
    assert_eq!(read(&dir.join("namespace")), "apps");
    assert_eq!(read(&dir.join("token")), "token-for-web-3607");
    assert!(vols.warnings.is_empty(), "{:?}", vols.warnings);
    // With fsGroup: 0600 opened to the group, as SetVolumeOwnership leaves it.
    let meta = std::fs::metadata(dir.join("token")).expect("token");
    assert_eq!(meta.mode() & 0o7777, 0o640);
    assert_eq!(meta.gid(), 2345);
    // Without: defaultMode.
    p.spec.as_mut().expect("spec").security_context = None;
    rig.setup(&p).expect("setup");
    let meta = std::fs::metadata(dir.join("token")).expect("token");
    assert_eq!(meta.mode() & 0o7777, 0o644);
}

#[test]
fn static_pods_cannot_read_api_objects() {
    let rig =
        Rig::new(&[json!({"kind": "ConfigMap", "metadata": {"name": "cfg"}, "data": {"a": "1"}})]);
    let mut p = pod(
        json!([{"name": "v", "configMap": {"name": "cfg"}}]),
        json!([]),
    );
    p.metadata.annotations = Some(
        [(
            "kubernetes.io/config.source".to_string(),
            "file".to_string(),
        )]
        .into(),
    );
    let err = rig.setup(&p).expect_err("static");
    assert!(matches!(err, VolumeError::StaticPod { .. }), "{err}");
}

#[test]
fn an_object_not_fetched_yet_is_waited_for_not_called_missing() {
    if !root() {
        return;
    }
    let rig = Rig::new(&[]);
    rig.cache.follow();
    for vol in [
        json!({"name": "v", "configMap": {"name": "kube-root-ca.crt"}}),
        json!({"name": "v", "secret": {"secretName": "s"}}),
    ] {
        let err = rig
            .setup(&pod(json!([vol]), json!([])))
            .expect_err("not fetched yet");
        assert!(err.is_waiting(), "{err}");
        assert!(!err.to_string().contains("not found"), "{err}");
    }
}

#[test]
fn a_sub_path_expr_that_expands_past_path_max_is_refused() {
    let container: Container = serde_json::from_value(json!({"name": "app"})).expect("container");
    let vm: k8s_openapi::api::core::v1::VolumeMount =
        serde_json::from_value(json!({"name": "data", "mountPath": "/data"})).expect("mount");
    // 100 references to a 100 000-byte variable: 10 MB from 400 bytes of manifest.
    let env = [("V".to_string(), "x".repeat(100_000))];
    let err = match sub_path_expr(&container, &vm, &"$(V)".repeat(100), &env) {
        Err(e) => e,
        Ok(path) => panic!("accepted a {}-byte path", path.len()),
    };
    assert!(err.is_container_config(), "{err}");
    assert_eq!(
        err.to_string(),
        "subPathExpr of the mount of volume \"data\" at \"/data\" in container \"app\" would \
         take 10000001 bytes ($(VAR) references expanded, with its NUL), more than the 4096 \
         bytes a path may take (PATH_MAX): shorten it or the variables it refers to"
    );
    // Up to PATH_MAX with the NUL is a path.
    let env = [("V".to_string(), "x".repeat(4095))];
    assert_eq!(
        sub_path_expr(&container, &vm, "$(V)", &env)
            .expect("fits")
            .len(),
        4095
    );
    assert!(sub_path_expr(&container, &vm, "/$(V)", &env).is_err());
}
