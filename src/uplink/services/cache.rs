//! The store's copy of the cluster's Services (the part the environment needs), written
//! by the reflector and read by the environment code.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use k8s_openapi::api::core::v1::{Service, ServicePort, ServiceSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use super::{MASTER_NAMESPACE, MASTER_SERVICE, TREE_SERVICES, TREE_SERVICES_LISTED};
use crate::kube::Link;
use crate::store::{Batch, Store, StoreError, Tree};

/// The one key of [`TREE_SERVICES_LISTED`].
const LISTED: &str = "complete";

/// Where the Services a container sees come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ListState {
    /// Read from the apiserver since the agent started (and followed since).
    Read,
    /// Not read yet, and the apiserver cannot be reached: the list the store kept from
    /// an earlier run stands in.
    Stored,
    /// Not read yet, but the apiserver answers and the list is on its way: the one the
    /// store kept may be out of date. A cluster pod waits for the new one, as with the
    /// kubelet; a static pod takes the kept one.
    Stale,
    /// Not read yet, and no list is stored: nothing to go by.
    Unread,
}

/// The Services a pod's containers see, by name, and where they come from.
pub struct Visible {
    pub services: Vec<Service>,
    pub list: ListState,
}

/// The kept Services (store tree `services`, keyed `<namespace>/<name>`) and whether
/// they have been read this run. Cheap to clone; clones share the trees and the flag.
#[derive(Clone)]
pub struct ServiceCache {
    services: Tree<Service>,
    listed: Tree<bool>,
    /// A LIST completed since the agent started.
    read: Arc<AtomicBool>,
    /// Whether the apiserver can be reached; `None`: taken as never.
    link: Option<Link>,
}

impl ServiceCache {
    pub fn open(store: &Store) -> Result<ServiceCache, StoreError> {
        Ok(ServiceCache {
            services: store.tree(TREE_SERVICES)?,
            listed: store.tree(TREE_SERVICES_LISTED)?,
            read: Arc::new(AtomicBool::new(false)),
            link: None,
        })
    }

    /// Tells a kept list from a stale one by whether `link` is up.
    pub fn with_link(mut self, link: Link) -> ServiceCache {
        self.link = Some(link);
        self
    }

    /// Whether the Services have been read from the apiserver since the agent started.
    pub fn is_read(&self) -> bool {
        self.read.load(Ordering::Acquire)
    }

    /// Where a lookup now would come from.
    pub fn list_state(&self) -> Result<ListState, StoreError> {
        Ok(if self.is_read() {
            ListState::Read
        } else if self.listed.get(LISTED)?.is_none() {
            ListState::Unread
        } else if self.link.as_ref().is_some_and(|l| !l.is_down()) {
            ListState::Stale
        } else {
            ListState::Stored
        })
    }

    /// The Services a pod in `namespace` sees, as the kubelet's `getServiceEnvVarMap`
    /// picks them: those of its namespace when `links` (`enableServiceLinks`), and the
    /// master service `default/kubernetes` always, unless the namespace has a Service
    /// of that name of its own. In name order.
    pub fn visible(&self, namespace: &str, links: bool) -> Result<Visible, StoreError> {
        let list = self.list_state()?;
        let mut by_name: BTreeMap<String, Service> = BTreeMap::new();
        if links {
            for (key, service) in self.services.scan_prefix(&format!("{namespace}/"))? {
                if let Some((_, name)) = key.split_once('/') {
                    by_name.insert(name.to_string(), service);
                }
            }
        }
        if !by_name.contains_key(MASTER_SERVICE) {
            let key = format!("{MASTER_NAMESPACE}/{MASTER_SERVICE}");
            if let Some(master) = self.services.get(&key)? {
                by_name.insert(MASTER_SERVICE.to_string(), master);
            }
        }
        Ok(Visible {
            services: by_name.into_values().collect(),
            list,
        })
    }

    /// How many Services are kept.
    pub fn len(&self) -> Result<usize, StoreError> {
        Ok(self.services.keys()?.len())
    }

    pub fn is_empty(&self) -> Result<bool, StoreError> {
        Ok(self.len()? == 0)
    }

    /// Makes the kept Services exactly `listed` (a complete LIST), in one transaction,
    /// and marks the list read. Writes only what changed. Returns how many keys changed.
    pub(super) fn replace(&self, listed: Vec<Service>) -> Result<usize, StoreError> {
        let mut batch = Batch::new();
        let mut keep = BTreeSet::new();
        for service in listed.iter().filter_map(kept) {
            let key = store_key(&service);
            batch.put(&self.services, &key, &service)?;
            keep.insert(key);
        }
        for key in self.services.keys()? {
            if !keep.contains(&key) {
                batch.remove(&self.services, &key);
            }
        }
        batch.put(&self.listed, LISTED, &true)?;
        let changed = self.services.store().apply(batch)?;
        self.read.store(true, Ordering::Release);
        Ok(changed)
    }

    /// A Service added or changed: kept (or dropped, if it has no cluster IP any more).
    /// Whether the store changed.
    pub(super) fn upsert(&self, service: &Service) -> Result<bool, StoreError> {
        match kept(service) {
            Some(k) => self.services.put(&store_key(&k), &k),
            None => self.remove(service),
        }
    }

    /// A Service deleted. Whether the store changed.
    pub(super) fn remove(&self, service: &Service) -> Result<bool, StoreError> {
        let key = store_key(service);
        Ok(self.services.remove(&key)?.is_some())
    }
}

#[cfg(test)]
impl ServiceCache {
    /// A cache holding `services`, as a LIST leaves it: read this run (`read`), or kept
    /// from an earlier one.
    pub fn seeded(store: &Store, services: Vec<Service>, read: bool) -> ServiceCache {
        let cache = ServiceCache::open(store).expect("open the service cache");
        cache.replace(services).expect("store the services");
        cache.read.store(read, Ordering::Release);
        cache
    }
}

fn store_key(service: &Service) -> String {
    let meta = &service.metadata;
    format!(
        "{}/{}",
        meta.namespace.as_deref().unwrap_or(""),
        meta.name.as_deref().unwrap_or("")
    )
}

/// The kubelet's `IsServiceIPSet`: a cluster IP that is neither empty nor `None`.
pub fn has_cluster_ip(service: &Service) -> bool {
    service
        .spec
        .as_ref()
        .and_then(|s| s.cluster_ip.as_deref())
        .is_some_and(|ip| !ip.is_empty() && ip != "None")
}

/// What is kept of `service`: its name, namespace, cluster IP and ports (name, port,
/// protocol); `None` for a Service that makes no variables (no cluster IP) or has no
/// name or namespace. Everything else changes without changing the environment, and
/// would only cost writes.
pub(super) fn kept(service: &Service) -> Option<Service> {
    let meta = &service.metadata;
    let (Some(name), Some(namespace)) = (&meta.name, &meta.namespace) else {
        return None;
    };
    if name.is_empty() || namespace.is_empty() || !has_cluster_ip(service) {
        return None;
    }
    let spec = service.spec.as_ref()?;
    let ports = spec
        .ports
        .iter()
        .flatten()
        .map(|p| ServicePort {
            name: p.name.clone().filter(|n| !n.is_empty()),
            port: p.port,
            protocol: p.protocol.clone(),
            ..ServicePort::default()
        })
        .collect();
    Some(Service {
        metadata: ObjectMeta {
            name: Some(name.clone()),
            namespace: Some(namespace.clone()),
            ..ObjectMeta::default()
        },
        spec: Some(ServiceSpec {
            cluster_ip: spec.cluster_ip.clone(),
            ports: Some(ports),
            ..ServiceSpec::default()
        }),
        status: None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::TempDir;

    fn service(ns: &str, name: &str, ip: &str, ports: serde_json::Value) -> Service {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": name, "namespace": ns, "resourceVersion": "7",
                         "uid": "u", "labels": {"app": name}},
            "spec": {"clusterIP": ip, "clusterIPs": [ip], "ports": ports,
                     "selector": {"app": name}, "type": "ClusterIP"},
        }))
        .expect("service")
    }

    fn tcp(port: i32) -> serde_json::Value {
        serde_json::json!([{"port": port, "protocol": "TCP", "targetPort": 8080}])
    }

    fn names(v: &Visible) -> Vec<String> {
        v.services
            .iter()
            .map(|s| {
                format!(
                    "{}/{}",
                    s.metadata.namespace.as_deref().unwrap_or(""),
                    s.metadata.name.as_deref().unwrap_or("")
                )
            })
            .collect()
    }

    #[test]
    fn a_pod_sees_its_namespace_and_the_master_service() {
        let tmp = TempDir::new("services-cache");
        let store = Store::open(&tmp.0.join("db")).expect("store");
        let cache = ServiceCache::open(&store).expect("cache");
        assert_eq!(cache.list_state().expect("state"), ListState::Unread);
        cache
            .replace(vec![
                service("default", "kubernetes", "10.0.0.1", tcp(443)),
                service("default", "web", "10.0.0.9", tcp(80)),
                service("apps", "db", "10.0.0.5", tcp(5432)),
                service("apps", "cache", "10.0.0.6", tcp(6379)),
                service("apps", "headless", "None", tcp(80)),
                service("apps", "external", "", tcp(80)),
                service("apps-2", "other", "10.0.0.7", tcp(80)),
            ])
            .expect("replace");
        assert_eq!(cache.list_state().expect("state"), ListState::Read);
        let v = cache.visible("apps", true).expect("visible");
        assert_eq!(
            names(&v),
            ["apps/cache", "apps/db", "default/kubernetes"],
            "no headless, no other namespace, no apps-2"
        );
        let v = cache.visible("apps", false).expect("visible");
        assert_eq!(names(&v), ["default/kubernetes"]);
        let v = cache.visible("default", true).expect("visible");
        assert_eq!(names(&v), ["default/kubernetes", "default/web"]);
        let v = cache.visible("default", false).expect("visible");
        assert_eq!(names(&v), ["default/kubernetes"]);
    }

    #[test]
    fn a_namespace_service_named_kubernetes_wins_over_the_master() {
        let tmp = TempDir::new("services-cache");
        let store = Store::open(&tmp.0.join("db")).expect("store");
        let cache = ServiceCache::open(&store).expect("cache");
        cache
            .replace(vec![
                service("default", "kubernetes", "10.0.0.1", tcp(443)),
                service("apps", "kubernetes", "10.0.0.2", tcp(80)),
            ])
            .expect("replace");
        let v = cache.visible("apps", true).expect("visible");
        assert_eq!(names(&v), ["apps/kubernetes"]);
        let v = cache.visible("apps", false).expect("visible");
        assert_eq!(names(&v), ["default/kubernetes"]);
    }

    #[test]
    fn keeps_only_what_the_environment_needs_and_writes_only_changes() {
        let tmp = TempDir::new("services-cache");
        let store = Store::open(&tmp.0.join("db")).expect("store");
        let cache = ServiceCache::open(&store).expect("cache");
        let web = service("apps", "web", "10.0.0.9", tcp(80));
        // Two keys: the Service and the marker.
        assert_eq!(cache.replace(vec![web.clone()]).expect("replace"), 2);
        let kept = &cache.visible("apps", true).expect("visible").services[0];
        let as_json = serde_json::to_value(kept).expect("json");
        assert_eq!(
            as_json,
            serde_json::json!({
                "apiVersion": "v1",
                "kind": "Service",
                "metadata": {"name": "web", "namespace": "apps"},
                "spec": {"clusterIP": "10.0.0.9", "ports": [{"port": 80, "protocol": "TCP"}]},
            })
        );
        // A relist of the same (new resourceVersion, new labels) writes nothing.
        let mut relabelled = web.clone();
        relabelled.metadata.resource_version = Some("99".into());
        relabelled.metadata.labels = None;
        assert_eq!(cache.replace(vec![relabelled.clone()]).expect("relist"), 0);
        assert!(!cache.upsert(&relabelled).expect("upsert"));
        // A port change writes; a change to headless drops it.
        assert!(cache
            .upsert(&service("apps", "web", "10.0.0.9", tcp(81)))
            .expect("upsert"));
        assert!(cache
            .upsert(&service("apps", "web", "None", tcp(81)))
            .expect("upsert"));
        assert!(cache.is_empty().expect("empty"));
        assert!(!cache.remove(&web).expect("remove"));
    }

    #[test]
    fn a_relist_drops_what_is_gone_and_the_list_survives_a_restart() {
        let tmp = TempDir::new("services-cache");
        {
            let store = Store::open(&tmp.0.join("db")).expect("store");
            let cache = ServiceCache::open(&store).expect("cache");
            cache
                .replace(vec![
                    service("apps", "a", "10.0.0.1", tcp(1)),
                    service("apps", "b", "10.0.0.2", tcp(2)),
                ])
                .expect("replace");
            cache
                .replace(vec![service("apps", "b", "10.0.0.2", tcp(2))])
                .expect("relist");
            assert_eq!(cache.len().expect("len"), 1);
            store.flush().expect("flush");
        }
        let store = Store::open(&tmp.0.join("db")).expect("store");
        let link = Link::new(std::time::Duration::from_secs(10));
        let cache = ServiceCache::open(&store)
            .expect("cache")
            .with_link(link.clone());
        assert!(!cache.is_read());
        let v = cache.visible("apps", true).expect("visible");
        assert_eq!(v.list, ListState::Stored, "the link is down");
        assert_eq!(names(&v), ["apps/b"]);
        link.node_ready(std::time::Instant::now(), crate::time::now());
        assert_eq!(cache.list_state().expect("state"), ListState::Stale);
        cache.replace(Vec::new()).expect("read");
        assert_eq!(cache.list_state().expect("state"), ListState::Read);
    }
}
