//! A running object manager over a scripted apiserver and a real store, and the
//! fixtures' objects (19, 20, 44, 45) to script it with.

use std::thread::JoinHandle;
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use serde_json::{json, Value};
use tokio::sync::mpsc;

use super::testing::{logs, wait_for, Call, FakeApi, Item};
use super::{
    pod_set, spawn_object_manager_with, ObjectCache, ObjectKey, ObjectKind, ObjectManagerOptions,
    PodSetSender,
};
use crate::backoff::Backoff;
use crate::store::Store;
use crate::testutil::TempDir;

pub const LIMIT: Duration = Duration::from_secs(10);

/// Fixture 44's item.
pub fn app_config(name: &str, level: &str, rv: &str) -> Value {
    json!({"metadata": {"name": name, "namespace": "default",
                        "uid": "e18f45dc-af1b-454a-9b73-4a7ff7f77023", "resourceVersion": rv},
           "data": {"greeting": "hello from app-config", "log.level": level}})
}

/// Fixture 40's secret (password `s3cr3t-for-fixtures`, token `token-value`).
pub fn app_secret(name: &str, password_b64: &str) -> Value {
    json!({"metadata": {"name": name, "namespace": "default",
                        "uid": "fbe0465a-13c9-4c65-8dca-293e2a087f5e", "resourceVersion": "221"},
           "data": {"password": password_b64, "token": "dG9rZW4tdmFsdWU="}, "type": "Opaque"})
}

pub fn event(kind: &str, type_: &str, object: Value) -> Item {
    let mut object = object;
    object["kind"] = json!(kind);
    object["apiVersion"] = json!("v1");
    Item::Event(json!({"type": type_, "object": object}))
}

pub fn bookmark(rv: &str) -> Item {
    Item::Event(
        json!({"type": "BOOKMARK", "object": {"kind": "ConfigMap", "apiVersion": "v1",
                                                     "metadata": {"resourceVersion": rv}}}),
    )
}

pub fn pod(name: &str, config_maps: &[&str], secrets: &[&str]) -> Pod {
    let env: Vec<Value> = config_maps
        .iter()
        .map(|cm| json!({"configMapRef": {"name": cm}}))
        .chain(secrets.iter().map(|s| json!({"secretRef": {"name": s}})))
        .collect();
    serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"containers": [{"name": "c", "image": "busybox", "envFrom": env}]},
    }))
    .expect("pod")
}

pub fn cm_key(name: &str) -> ObjectKey {
    ObjectKey::new(ObjectKind::ConfigMap, "default", name)
}

pub fn secret_key(name: &str) -> ObjectKey {
    ObjectKey::new(ObjectKind::Secret, "default", name)
}

pub fn options() -> ObjectManagerOptions {
    ObjectManagerOptions {
        max_watches: 16,
        watch_timeout: Duration::from_secs(1),
        poll_interval: Duration::from_millis(30),
        backoff: Backoff {
            initial: Duration::from_millis(5),
            max: Duration::from_millis(20),
        },
    }
}

pub struct Rig {
    pub api: FakeApi,
    pub cache: ObjectCache,
    pub pods: Option<PodSetSender>,
    changed: mpsc::Receiver<ObjectKey>,
    seen: Vec<ObjectKey>,
    pub handle: Option<JoinHandle<()>>,
    _store: Store,
    _tmp: TempDir,
}

impl Rig {
    pub fn start(api: &FakeApi, options: ObjectManagerOptions) -> Rig {
        Rig::start_with(api, options, |_| {})
    }

    /// `before` sees the cache before the manager starts (a previous run's leftovers).
    pub fn start_with(
        api: &FakeApi,
        options: ObjectManagerOptions,
        before: impl FnOnce(&ObjectCache),
    ) -> Rig {
        logs();
        let tmp = TempDir::new("objects");
        let store = Store::open(&tmp.0.join("db")).expect("store");
        let cache = ObjectCache::open(&store).expect("cache");
        before(&cache);
        let (tx, rx) = pod_set();
        let (changed_tx, changed) = mpsc::channel(64);
        let handle = spawn_object_manager_with(api.clone(), cache.clone(), rx, changed_tx, options)
            .expect("spawn");
        Rig {
            api: api.clone(),
            cache,
            pods: Some(tx),
            changed,
            seen: Vec::new(),
            handle: Some(handle),
            _store: store,
            _tmp: tmp,
        }
    }

    pub fn set_pods(&self, pods: &[&Pod]) {
        self.pods
            .as_ref()
            .expect("running")
            .set_pods(pods.iter().copied());
    }

    /// Every key reported on `changed` so far.
    pub fn changes(&mut self) -> Vec<ObjectKey> {
        while let Ok(k) = self.changed.try_recv() {
            self.seen.push(k);
        }
        self.seen.clone()
    }

    pub fn level(&self, name: &str) -> Option<String> {
        let cm = self
            .cache
            .config_map("default", name)
            .expect("read cache")?;
        cm.data?.get("log.level").cloned()
    }

    pub fn lists(&self, key: &ObjectKey) -> usize {
        let calls = self.api.calls_for(key);
        calls.iter().filter(|c| matches!(c, Call::List(_))).count()
    }

    pub fn watched_from(&self, key: &ObjectKey, rv: &str) -> bool {
        self.api
            .calls_for(key)
            .contains(&Call::Watch(key.clone(), rv.to_string()))
    }
}

impl Drop for Rig {
    fn drop(&mut self) {
        self.pods.take();
        if let Some(h) = self.handle.take() {
            wait_for("the manager to stop", LIMIT, || h.is_finished());
            h.join().expect("manager thread");
        }
        self.api.shutdown();
        wait_for("the watches to end", LIMIT, || {
            self.api.total_open_watches() == 0
        });
    }
}

pub fn idle_api() -> FakeApi {
    FakeApi::new(Duration::from_millis(40))
}
