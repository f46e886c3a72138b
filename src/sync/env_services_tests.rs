//! The Service variables in a container's environment: which Services, what wins over
//! them, `$(VAR)` references to them, and what happens before they were ever read.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Service;

use super::*;
use crate::store::Store;
use crate::testutil::TempDir;

struct Rig {
    _tmp: TempDir,
    _store: Store,
    objects: ObjectCache,
    services: Option<ServiceCache>,
}

/// What the node's store holds of the Services.
enum Seed {
    /// No apiserver: no cache at all.
    Standalone,
    /// Never a list.
    Unread,
    /// A list read this run.
    Read(Vec<Service>),
    /// A list kept from an earlier run, not read this one, the apiserver out of reach.
    Stored(Vec<Service>),
    /// The same, the apiserver answering (this run's list on its way).
    Stale(Vec<Service>),
}

impl Rig {
    fn new(seed: Seed) -> Rig {
        let tmp = TempDir::new("sync-env-services");
        let store = Store::open(&tmp.0.join("db")).expect("store");
        let objects = ObjectCache::open(&store).expect("objects");
        let services = match seed {
            Seed::Standalone => None,
            Seed::Unread => Some(ServiceCache::open(&store).expect("cache")),
            Seed::Read(list) => Some(ServiceCache::seeded(&store, list, true)),
            Seed::Stored(list) => Some(ServiceCache::seeded(&store, list, false)),
            Seed::Stale(list) => {
                let link = crate::kube::Link::new(std::time::Duration::from_secs(10));
                link.node_ready(std::time::Instant::now(), crate::time::now());
                Some(ServiceCache::seeded(&store, list, false).with_link(link))
            }
        };
        Rig {
            _tmp: tmp,
            _store: store,
            objects,
            services,
        }
    }

    fn resolve(&self, pod: &Pod) -> Result<Environment, EnvError> {
        let allocatable = BTreeMap::new();
        let inputs = EnvInputs {
            objects: &self.objects,
            services: self.services.as_ref(),
            downward: DownwardInputs {
                node_name: "gw-1",
                host_ip: None,
                pod_ips: &[],
                allocatable: &allocatable,
            },
        };
        resolve(
            pod,
            &pod.spec.as_ref().expect("spec").containers[0],
            &inputs,
        )
    }

    fn vars(&self, pod: &Pod) -> Vec<(String, String)> {
        match self.resolve(pod) {
            Ok(env) => env.vars,
            Err(e) => panic!("resolve: {e}"),
        }
    }
}

fn service(ns: &str, name: &str, ip: &str, port: i32) -> Service {
    serde_json::from_value(serde_json::json!({
        "metadata": {"name": name, "namespace": ns},
        "spec": {"clusterIP": ip, "ports": [{"port": port, "protocol": "TCP"}]},
    }))
    .expect("service")
}

fn cluster() -> Vec<Service> {
    vec![
        service("default", "kubernetes", "10.0.0.1", 443),
        service("default", "web", "10.0.0.2", 80),
        service("apps", "db", "10.0.0.3", 5432),
        service("other", "secret-db", "10.0.0.4", 5432),
    ]
}

/// A pod in `apps` (a static one when `static_pod`), with `spec` and `container` merged.
fn pod(spec: serde_json::Value, container: serde_json::Value, static_pod: bool) -> Pod {
    let mut c = serde_json::json!({"name": "main", "image": "busybox:demo"});
    let mut s = serde_json::json!({"containers": []});
    for (base, extra) in [(&mut c, container), (&mut s, spec)] {
        if let (Some(base), Some(extra)) = (base.as_object_mut(), extra.as_object()) {
            base.extend(extra.clone());
        }
    }
    s["containers"] = serde_json::json!([c]);
    let annotations = if static_pod {
        serde_json::json!({"kubernetes.io/config.source": "file"})
    } else {
        serde_json::json!({})
    };
    serde_json::from_value(serde_json::json!({
        "metadata": {"name": "client", "namespace": "apps", "annotations": annotations},
        "spec": s,
    }))
    .expect("pod")
}

fn names(vars: &[(String, String)]) -> Vec<&str> {
    vars.iter().map(|(k, _)| k.as_str()).collect()
}

fn get<'a>(vars: &'a [(String, String)], name: &str) -> Option<&'a str> {
    vars.iter()
        .find(|(k, _)| k == name)
        .map(|(_, v)| v.as_str())
}

#[test]
fn a_pod_gets_its_namespaces_services_and_the_master_service_after_its_own() {
    let rig = Rig::new(Seed::Read(cluster()));
    let vars = rig.vars(&pod(
        serde_json::json!({}),
        serde_json::json!({"env": [{"name": "OWN", "value": "1"}]}),
        false,
    ));
    assert_eq!(
        names(&vars),
        [
            "OWN",
            "DB_SERVICE_HOST",
            "DB_SERVICE_PORT",
            "DB_PORT",
            "DB_PORT_5432_TCP",
            "DB_PORT_5432_TCP_PROTO",
            "DB_PORT_5432_TCP_PORT",
            "DB_PORT_5432_TCP_ADDR",
            "KUBERNETES_SERVICE_HOST",
            "KUBERNETES_SERVICE_PORT",
            "KUBERNETES_PORT",
            "KUBERNETES_PORT_443_TCP",
            "KUBERNETES_PORT_443_TCP_PROTO",
            "KUBERNETES_PORT_443_TCP_PORT",
            "KUBERNETES_PORT_443_TCP_ADDR",
        ],
        "no Service of default other than the master, none of another namespace"
    );
    assert_eq!(get(&vars, "DB_PORT"), Some("tcp://10.0.0.3:5432"));
    assert_eq!(get(&vars, "KUBERNETES_SERVICE_HOST"), Some("10.0.0.1"));
}

#[test]
fn enable_service_links_false_leaves_only_the_master_service() {
    let rig = Rig::new(Seed::Read(cluster()));
    let vars = rig.vars(&pod(
        serde_json::json!({"enableServiceLinks": false}),
        serde_json::json!({}),
        false,
    ));
    assert!(
        vars.iter().all(|(k, _)| k.starts_with("KUBERNETES_")),
        "{:?}",
        names(&vars)
    );
    assert_eq!(vars.len(), 7);
}

#[test]
fn the_containers_own_variables_win_and_references_see_the_services() {
    let rig = Rig::new(Seed::Read(cluster()));
    let vars = rig.vars(&pod(
        serde_json::json!({}),
        serde_json::json!({"env": [
            {"name": "DB_URL", "value": "postgres://$(DB_SERVICE_HOST):$(DB_SERVICE_PORT)/app"},
            {"name": "DB_SERVICE_HOST", "value": "db.example"},
            {"name": "AFTER", "value": "$(DB_SERVICE_HOST)"},
        ]}),
        false,
    ));
    // Before DB_SERVICE_HOST is set, a reference sees the Service's; after, its own.
    assert_eq!(get(&vars, "DB_URL"), Some("postgres://10.0.0.3:5432/app"));
    assert_eq!(get(&vars, "AFTER"), Some("db.example"));
    assert_eq!(get(&vars, "DB_SERVICE_HOST"), Some("db.example"));
    assert_eq!(
        vars.iter().filter(|(k, _)| k == "DB_SERVICE_HOST").count(),
        1,
        "set once, by the container"
    );
    assert_eq!(names(&vars)[..3], ["DB_URL", "DB_SERVICE_HOST", "AFTER"]);
}

#[test]
fn before_the_services_were_ever_read_a_cluster_pod_waits_and_a_static_one_does_not() {
    let unread = Rig::new(Seed::Unread);
    let cluster_pod = pod(serde_json::json!({}), serde_json::json!({}), false);
    match unread.resolve(&cluster_pod) {
        Err(e) => assert_eq!(
            e.to_string(),
            "services have not yet been read at least once, cannot construct envvars"
        ),
        Ok(_) => panic!("a cluster pod started before the Services were read"),
    }
    let static_pod = pod(serde_json::json!({}), serde_json::json!({}), true);
    let env = unread
        .resolve(&static_pod)
        .expect("a static pod does not wait");
    assert!(env.vars.is_empty());
    assert_eq!(env.services, Some(ListState::Unread));
}

#[test]
fn a_stored_list_stands_in_until_the_services_are_read() {
    let rig = Rig::new(Seed::Stored(cluster()));
    let env = rig
        .resolve(&pod(serde_json::json!({}), serde_json::json!({}), false))
        .expect("the stored list stands in");
    assert_eq!(env.services, Some(ListState::Stored));
    assert_eq!(get(&env.vars, "DB_SERVICE_HOST"), Some("10.0.0.3"));
}

#[test]
fn a_node_without_an_apiserver_gives_no_service_variables() {
    let rig = Rig::new(Seed::Standalone);
    let env = rig
        .resolve(&pod(serde_json::json!({}), serde_json::json!({}), false))
        .expect("resolve");
    assert!(env.vars.is_empty());
    assert_eq!(env.services, None);
}

#[test]
fn service_variables_count_towards_the_environments_bound() {
    let many: Vec<Service> = (0..5_000)
        .map(|i| service("apps", &format!("svc-{i}"), "10.0.0.9", 8080))
        .collect();
    let rig = Rig::new(Seed::Read(many));
    let p = pod(serde_json::json!({}), serde_json::json!({}), false);
    match rig.resolve(&p) {
        Err(e @ EnvError::ServiceEnvTooLarge { .. }) => {
            assert!(e.to_string().contains("5000 Service(s)"), "{e}")
        }
        Err(e) => panic!("wrong error: {e}"),
        Ok(env) => panic!("{} variables accepted", env.vars.len()),
    }
    let links_off = pod(
        serde_json::json!({"enableServiceLinks": false}),
        serde_json::json!({}),
        false,
    );
    assert!(rig.resolve(&links_off).expect("resolve").vars.is_empty());
}

#[test]
fn while_the_apiserver_answers_a_cluster_pod_waits_for_the_new_list() {
    let rig = Rig::new(Seed::Stale(cluster()));
    let cluster_pod = pod(serde_json::json!({}), serde_json::json!({}), false);
    assert!(matches!(
        rig.resolve(&cluster_pod),
        Err(EnvError::ServicesNotRead)
    ));
    // A static pod does not wait, and takes the kept list meanwhile.
    let static_pod = pod(serde_json::json!({}), serde_json::json!({}), true);
    let env = rig
        .resolve(&static_pod)
        .expect("a static pod does not wait");
    assert_eq!(env.services, Some(ListState::Stale));
    assert_eq!(get(&env.vars, "DB_SERVICE_HOST"), Some("10.0.0.3"));
}
