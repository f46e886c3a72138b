use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

use super::*;
use crate::store::Store;
use crate::testutil::TempDir;
use crate::uplink::objects::{TREE_CONFIG_MAPS, TREE_SECRETS};

/// A store with the given objects cached, as the object manager leaves them.
struct Cached {
    _tmp: TempDir,
    _store: Store,
    cache: ObjectCache,
    allocatable: BTreeMap<String, Quantity>,
}

impl Cached {
    fn new(objects: &[serde_json::Value]) -> Cached {
        let tmp = TempDir::new("sync-env");
        let store = Store::open(&tmp.0.join("db")).expect("store");
        let cms = store.tree::<ConfigMap>(TREE_CONFIG_MAPS).expect("tree");
        let secrets = store.tree::<Secret>(TREE_SECRETS).expect("tree");
        for o in objects {
            let key = format!(
                "{}/{}",
                o["metadata"]["namespace"].as_str().unwrap_or("default"),
                o["metadata"]["name"].as_str().unwrap_or("")
            );
            if o["kind"] == "Secret" {
                let s: Secret = serde_json::from_value(o.clone()).expect("secret");
                secrets.put(&key, &s).expect("put");
            } else {
                let cm: ConfigMap = serde_json::from_value(o.clone()).expect("configmap");
                cms.put(&key, &cm).expect("put");
            }
        }
        let cache = ObjectCache::open(&store).expect("cache");
        let allocatable = [
            ("cpu", "3500m"),
            ("memory", "3Gi"),
            ("ephemeral-storage", "10Gi"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), Quantity(v.to_string())))
        .collect();
        Cached {
            _tmp: tmp,
            _store: store,
            cache,
            allocatable,
        }
    }

    fn resolve(&self, pod: &Pod) -> Result<Environment, EnvError> {
        let container = &pod.spec.as_ref().expect("spec").containers[0];
        let inputs = EnvInputs {
            objects: &self.cache,
            services: None,
            downward: DownwardInputs {
                node_name: "gw-1",
                host_ip: Some("10.1.2.3"),
                pod_ips: &[],
                allocatable: &self.allocatable,
            },
        };
        resolve(pod, container, &inputs)
    }

    fn vars(&self, pod: &Pod) -> Vec<(String, String)> {
        match self.resolve(pod) {
            Ok(env) => env.vars,
            Err(e) => panic!("resolve: {e}"),
        }
    }

    fn error(&self, pod: &Pod) -> String {
        match self.resolve(pod) {
            Ok(env) => panic!("resolved {} vars, expected an error", env.vars.len()),
            Err(e) => e.to_string(),
        }
    }
}

fn config_map(name: &str, data: serde_json::Value) -> serde_json::Value {
    serde_json::json!({"kind": "ConfigMap", "metadata": {"name": name, "namespace": "apps"},
                       "data": data})
}

/// A Secret with `data` given as plain text (stored base64, as the API sends it).
fn secret(name: &str, data: &[(&str, &str)]) -> serde_json::Value {
    let data: serde_json::Map<String, serde_json::Value> = data
        .iter()
        .map(|(k, v)| {
            let bytes = serde_json::to_value(k8s_openapi::ByteString(v.as_bytes().to_vec()))
                .expect("bytes");
            (k.to_string(), bytes)
        })
        .collect();
    serde_json::json!({"kind": "Secret", "metadata": {"name": name, "namespace": "apps"},
                       "type": "Opaque", "data": data})
}

/// A cluster pod in namespace `apps` whose one container has `container` merged in.
fn pod(container: serde_json::Value) -> Pod {
    let mut c = serde_json::json!({"name": "main", "image": "busybox:demo"});
    if let (Some(c), Some(extra)) = (c.as_object_mut(), container.as_object()) {
        for (k, v) in extra {
            c.insert(k.clone(), v.clone());
        }
    }
    serde_json::from_value(serde_json::json!({
        "metadata": {"name": "web", "namespace": "apps", "uid": "u-123",
                     "labels": {"app": "web", "tier": "front"},
                     "annotations": {"example.com/owner": "ops \"team\""}},
        "spec": {"nodeName": "gw-1", "serviceAccountName": "runner", "containers": [c]},
    }))
    .expect("pod")
}

fn pairs(p: &[(&str, &str)]) -> Vec<(String, String)> {
    p.iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

#[test]
fn values_expand_against_earlier_variables() {
    let cached = Cached::new(&[config_map("base", serde_json::json!({"HOST": "db"}))]);
    let p = pod(serde_json::json!({
        "envFrom": [{"configMapRef": {"name": "base"}}],
        "env": [
            {"name": "URL", "value": "pg://$(HOST):$(PORT)/$(LATER)"},
            {"name": "PORT", "value": "5432"},
            {"name": "URL2", "value": "pg://$(HOST):$(PORT)"},
            {"name": "ESCAPED", "value": "$$(HOST) costs $$5 $(NOPE"},
            {"name": "LATER", "value": "x"},
            {"name": "EMPTY"},
        ],
    }));
    assert_eq!(
        cached.vars(&p),
        pairs(&[
            ("HOST", "db"),
            ("URL", "pg://db:$(PORT)/$(LATER)"),
            ("PORT", "5432"),
            ("URL2", "pg://db:5432"),
            ("ESCAPED", "$(HOST) costs $5 $(NOPE"),
            ("LATER", "x"),
            ("EMPTY", ""),
        ])
    );
}

#[test]
fn config_map_and_secret_keys_and_env_from_with_prefix() {
    let cached = Cached::new(&[
        config_map("app", serde_json::json!({"mode": "fast", "LEVEL": "3"})),
        secret(
            "creds",
            &[("user", "admin"), ("password", "s3cr3t $(HOST)")],
        ),
    ]);
    let p = pod(serde_json::json!({
        "envFrom": [
            {"configMapRef": {"name": "app"}},
            {"secretRef": {"name": "creds"}, "prefix": "DB_"},
        ],
        "env": [
            {"name": "MODE", "valueFrom": {"configMapKeyRef": {"name": "app", "key": "mode"}}},
            {"name": "PASS", "valueFrom": {"secretKeyRef": {"name": "creds", "key": "password"}}},
            // env replaces what envFrom set, in place.
            {"name": "LEVEL", "value": "override"},
        ],
    }));
    assert_eq!(
        cached.vars(&p),
        pairs(&[
            ("LEVEL", "override"),
            ("mode", "fast"),
            ("DB_password", "s3cr3t $(HOST)"),
            ("DB_user", "admin"),
            ("MODE", "fast"),
            // A value from an object is not expanded.
            ("PASS", "s3cr3t $(HOST)"),
        ])
    );
}

#[test]
fn missing_objects_and_keys_are_the_kubelets_errors() {
    let cached = Cached::new(&[
        config_map("app", serde_json::json!({"mode": "fast"})),
        secret("creds", &[("user", "admin")]),
    ]);
    let key_ref = |kind: &str, name: &str, key: &str| {
        pod(serde_json::json!({"env": [
            {"name": "V", "valueFrom": {kind: {"name": name, "key": key}}}]}))
    };
    assert_eq!(
        cached.error(&key_ref("configMapKeyRef", "nope", "k")),
        r#"configmap "nope" not found"#
    );
    assert_eq!(
        cached.error(&key_ref("secretKeyRef", "nope", "k")),
        r#"secret "nope" not found"#
    );
    assert_eq!(
        cached.error(&key_ref("configMapKeyRef", "app", "k")),
        "couldn't find key k in ConfigMap apps/app"
    );
    assert_eq!(
        cached.error(&key_ref("secretKeyRef", "creds", "password")),
        "couldn't find key password in Secret apps/creds"
    );
    let from =
        |kind: &str, name: &str| pod(serde_json::json!({"envFrom": [{kind: {"name": name}}]}));
    assert_eq!(
        cached.error(&from("configMapRef", "gone")),
        r#"configmap "gone" not found"#
    );
    assert_eq!(
        cached.error(&from("secretRef", "gone")),
        r#"secret "gone" not found"#
    );
}

#[test]
fn optional_references_to_nothing_leave_variables_unset() {
    let cached = Cached::new(&[
        config_map("app", serde_json::json!({"V": "from-envfrom"})),
        secret("creds", &[("user", "admin")]),
    ]);
    let p = pod(serde_json::json!({
        "envFrom": [
            {"configMapRef": {"name": "app"}},
            {"configMapRef": {"name": "gone", "optional": true}},
            {"secretRef": {"name": "gone", "optional": true}},
        ],
        "env": [
            // A missing optional key keeps what envFrom set.
            {"name": "V", "valueFrom": {"configMapKeyRef": {"name": "app", "key": "nokey", "optional": true}}},
            {"name": "W", "valueFrom": {"configMapKeyRef": {"name": "gone", "key": "k", "optional": true}}},
            {"name": "X", "valueFrom": {"secretKeyRef": {"name": "creds", "key": "nokey", "optional": true}}},
            {"name": "Y", "valueFrom": {"secretKeyRef": {"name": "gone", "key": "k", "optional": true}}},
            {"name": "Z", "value": "$(W)$(Y)"},
        ],
    }));
    assert_eq!(
        cached.vars(&p),
        pairs(&[("V", "from-envfrom"), ("Z", "$(W)$(Y)")])
    );
}

#[test]
fn invalid_env_from_keys_are_skipped_with_a_warning() {
    let cached = Cached::new(&[
        config_map(
            "app",
            serde_json::json!({"1bad": "a", "ok.name-x": "b", "..dots": "c", "GOOD": "d"}),
        ),
        secret("creds", &[("2alsobad", "x"), ("fine", "y")]),
    ]);
    let p = pod(serde_json::json!({
        "envFrom": [{"configMapRef": {"name": "app"}}, {"secretRef": {"name": "creds"}},
                    {"secretRef": {"name": "creds"}, "prefix": "P_"}],
    }));
    let env = cached.resolve(&p).expect("resolve");
    assert_eq!(
        env.vars,
        pairs(&[
            ("GOOD", "d"),
            ("ok.name-x", "b"),
            ("fine", "y"),
            ("P_2alsobad", "x"),
            ("P_fine", "y"),
        ])
    );
    assert_eq!(
        env.invalid_names,
        vec![
            "Keys [..dots, 1bad] from the EnvFrom configMap apps/app were skipped since they \
             are considered invalid environment variable names."
                .to_string(),
            "Keys [2alsobad] from the EnvFrom secret apps/creds were skipped since they are \
             considered invalid environment variable names."
                .to_string(),
        ]
    );
}

#[test]
fn static_pods_cannot_reference_api_objects() {
    let cached = Cached::new(&[config_map("app", serde_json::json!({"mode": "fast"}))]);
    let mut p = pod(serde_json::json!({"env": [
        {"name": "V", "valueFrom": {"configMapKeyRef": {"name": "app", "key": "mode", "optional": true}}}]}));
    p.metadata
        .annotations
        .get_or_insert_with(BTreeMap::new)
        .insert("kubernetes.io/config.source".into(), "file".into());
    assert_eq!(
        cached.error(&p),
        "couldn't get configMap apps/app, static pods cannot reference API objects"
    );
    // Everything else still works for a static pod.
    let mut p = pod(serde_json::json!({"env": [{"name": "A", "value": "1"},
        {"name": "N", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}]}));
    p.metadata.annotations = Some(BTreeMap::from([(
        "kubernetes.io/config.source".to_string(),
        "file".to_string(),
    )]));
    assert_eq!(cached.vars(&p), pairs(&[("A", "1"), ("N", "web")]));
}

#[test]
fn field_refs() {
    let cached = Cached::new(&[]);
    let paths = [
        "metadata.name",
        "metadata.namespace",
        "metadata.uid",
        "metadata.labels['tier']",
        "metadata.labels['missing']",
        "metadata.annotations['example.com/owner']",
        "metadata.labels",
        "spec.nodeName",
        "spec.serviceAccountName",
        "status.podIP",
        "status.podIPs",
        "status.hostIP",
        "status.hostIPs",
    ];
    let env: Vec<serde_json::Value> = paths
        .iter()
        .enumerate()
        .map(|(i, p)| {
            serde_json::json!({"name": format!("F{i}"),
                               "valueFrom": {"fieldRef": {"apiVersion": "v1", "fieldPath": p}}})
        })
        .collect();
    let p = pod(serde_json::json!({ "env": env }));
    let values: Vec<String> = cached.vars(&p).into_iter().map(|(_, v)| v).collect();
    assert_eq!(
        values,
        vec![
            "web",
            "apps",
            "u-123",
            "front",
            "",
            "ops \"team\"",
            "app=\"web\"\ntier=\"front\"",
            "gw-1",
            "runner",
            "10.1.2.3",
            "10.1.2.3",
            "10.1.2.3",
            "10.1.2.3",
        ]
    );
    let one = |path: &str, version: &str| {
        pod(serde_json::json!({"env": [{"name": "F", "valueFrom": {
            "fieldRef": {"apiVersion": version, "fieldPath": path}}}]}))
    };
    assert_eq!(
        cached.error(&one("spec.containers", "v1")),
        "field label not supported: spec.containers"
    );
    assert_eq!(
        cached.error(&one("status.phase", "v1")),
        "unsupported fieldPath: status.phase"
    );
    assert_eq!(
        cached.error(&one("metadata.name", "v2")),
        "unsupported pod version: v2"
    );
    assert_eq!(
        cached.error(&one("metadata.name['x']", "v1")),
        "field label does not support subscript: metadata.name['x']"
    );
    assert!(cached
        .error(&one("metadata.labels['bad key!']", "v1"))
        .starts_with("invalid key subscript in metadata.labels['bad key!']"));
}

#[test]
fn resource_field_refs_default_limits_to_allocatable() {
    let cached = Cached::new(&[]);
    let refs = [
        ("limits.cpu", None, None),
        ("limits.cpu", Some("1m"), None),
        ("requests.cpu", Some("1m"), None),
        ("limits.memory", Some("1Mi"), None),
        ("requests.memory", None, None),
        ("limits.ephemeral-storage", Some("1Gi"), None),
        // No limits set on this one: the node's allocatable, as the kubelet reports.
        ("limits.cpu", Some("1m"), Some("side")),
        ("limits.memory", Some("1Mi"), Some("side")),
        ("limits.ephemeral-storage", Some("1Gi"), Some("side")),
        ("requests.cpu", None, Some("side")),
        // A zero divisor is 1.
        ("limits.memory", Some("0"), None),
    ];
    let env: Vec<serde_json::Value> = refs
        .iter()
        .enumerate()
        .map(|(i, (r, d, c))| {
            let mut sel = serde_json::json!({"resource": r});
            if let Some(d) = d {
                sel["divisor"] = serde_json::json!(d);
            }
            if let Some(c) = c {
                sel["containerName"] = serde_json::json!(c);
            }
            serde_json::json!({"name": format!("R{i}"), "valueFrom": {"resourceFieldRef": sel}})
        })
        .collect();
    let mut p = pod(serde_json::json!({
        "env": env,
        "resources": {"limits": {"cpu": "1500m", "memory": "100Mi", "ephemeral-storage": "2G"}},
    }));
    if let Some(spec) = p.spec.as_mut() {
        spec.containers.push(Container {
            name: "side".into(),
            ..Container::default()
        });
    }
    let values: Vec<String> = cached.vars(&p).into_iter().map(|(_, v)| v).collect();
    assert_eq!(
        values,
        vec![
            "2",    // 1.5 cores, rounded up
            "1500", // millicores
            "1500", // requests default to limits
            "100",
            "104857600",
            "2", // 2G in Gi, rounded up
            "3500",
            "3072",
            "10",
            "0",
            "104857600",
        ]
    );
    let one = |r: &str, c: Option<&str>| {
        let mut sel = serde_json::json!({"resource": r});
        if let Some(c) = c {
            sel["containerName"] = serde_json::json!(c);
        }
        pod(serde_json::json!({"env": [{"name": "R", "valueFrom": {"resourceFieldRef": sel}}]}))
    };
    assert_eq!(
        cached.error(&one("limits.gpu", None)),
        "unsupported container resource : limits.gpu"
    );
    assert_eq!(
        cached.error(&one("cpu", None)),
        "unsupported container resource : cpu"
    );
    assert_eq!(
        cached.error(&one("limits.cpu", Some("ghost"))),
        "container ghost not found"
    );
}

#[test]
fn names_and_values_the_runtime_cannot_pass_are_errors() {
    let cached = Cached::new(&[secret("bin", &[("k", "a\0b")])]);
    let p = pod(serde_json::json!({"env": [{"name": "A=B", "value": "x"}]}));
    assert_eq!(
        cached.error(&p),
        r#"env name "A=B" of container "main" is not valid"#
    );
    let p = pod(serde_json::json!({"env": [
        {"name": "S", "valueFrom": {"secretKeyRef": {"name": "bin", "key": "k"}}}]}));
    let message = cached.error(&p);
    assert_eq!(
        message,
        r#"env "S" of container "main": the value contains a NUL byte"#
    );
}

#[test]
fn env_var_names_as_the_kubelet_checks_them() {
    for good in ["A", "a_b", "my.env-name", "MY_ENV.NAME", "_x", "-x", ".x"] {
        assert!(is_env_var_name(good), "{good}");
    }
    for bad in ["", "1a", "a b", "a=b", ".", "..", "..x", "é"] {
        assert!(!is_env_var_name(bad), "{bad}");
    }
}

/// `V0` of `first` bytes, then `V1` .. `V{n}`, each `$(prev)$(prev)`.
fn doubling(first: usize, n: usize) -> Pod {
    let mut env = vec![serde_json::json!({"name": "V0", "value": "x".repeat(first)})];
    for i in 1..=n {
        let prev = i - 1;
        env.push(
            serde_json::json!({"name": format!("V{i}"), "value": format!("$(V{prev})$(V{prev})")}),
        );
    }
    pod(serde_json::json!({ "env": env }))
}

#[test]
fn a_value_that_doubles_itself_is_refused_before_it_is_built() {
    let cached = Cached::new(&[]);
    // 60 KB of manifest that would expand to 983 MB (2.35 GB of agent before bounds).
    let message = cached.error(&doubling(60_000, 13));
    assert_eq!(
        message,
        "env \"V2\" of container \"main\" would take 240004 bytes (NAME=value, $(VAR) \
         references expanded), more than the 131072 bytes one variable may take (the \
         kernel's MAX_ARG_STRLEN): shorten it or the variables it refers to"
    );
    // Within the bound, the same pattern resolves.
    let vars = cached.vars(&doubling(1000, 5));
    assert_eq!(vars.last().map(|(_, v)| v.len()), Some(32_000));
}

#[test]
fn one_variable_may_take_up_to_max_arg_strlen() {
    let cached = Cached::new(&[]);
    // "A=" + value + NUL.
    let fits = MAX_VAR_BYTES - 3;
    let p = pod(serde_json::json!({"env": [{"name": "A", "value": "x".repeat(fits)}]}));
    assert_eq!(cached.vars(&p)[0].1.len(), fits);
    let p = pod(serde_json::json!({"env": [{"name": "A", "value": "x".repeat(fits + 1)}]}));
    assert!(cached.error(&p).contains("\"A\""));
    // Expanded: one byte of literal past a value that fits.
    let p = pod(serde_json::json!({"env": [
        {"name": "A", "value": "x".repeat(fits)},
        {"name": "B", "value": "$(A)y"},
    ]}));
    assert!(cached
        .error(&p)
        .starts_with("env \"B\" of container \"main\" would take 131073 bytes"));
}

#[test]
fn a_whole_environment_past_a_mebibyte_is_refused() {
    let cached = Cached::new(&[]);
    let big = "x".repeat(120 * 1024);
    let env: Vec<_> = (0..9)
        .map(|i| serde_json::json!({"name": format!("BIG{i}"), "value": big}))
        .collect();
    let message = cached.error(&pod(serde_json::json!({ "env": env })));
    assert!(
        message.starts_with("environment of container \"main\" would take "),
        "{message}"
    );
    assert!(message.contains("with env \"BIG8\""), "{message}");
    assert!(
        message.contains("more than the 1048576 bytes (1 MiB)"),
        "{message}"
    );
    // A name set again replaces its value: only the last one counts.
    let env: Vec<_> = (0..20)
        .map(|_| serde_json::json!({"name": "SAME", "value": big}))
        .collect();
    assert_eq!(
        cached.vars(&pod(serde_json::json!({ "env": env }))).len(),
        1
    );
}

#[test]
fn env_from_values_are_bounded_too() {
    let huge = "x".repeat(MAX_VAR_BYTES);
    let cached = Cached::new(&[config_map("big", serde_json::json!({"HUGE": huge}))]);
    let p = pod(serde_json::json!({"envFrom": [{"configMapRef": {"name": "big"}}]}));
    assert!(
        cached
            .error(&p)
            .starts_with("env \"HUGE\" of container \"main\" would take"),
        "{}",
        cached.error(&p)
    );
}
