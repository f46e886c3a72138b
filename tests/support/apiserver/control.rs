//! The test-side control API: seed and read objects as admin without HTTP (no request
//! log entries), inject faults, compact, cut watches, and wait for conditions.

use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{ConfigMap, Event, Node, Pod, Secret, Service};
use serde::de::DeserializeOwned;
use serde::Serialize;
use serde_json::{json, Value};

use super::api::{execute, Reply};
use super::auth::Identity;
use super::http::Request;
use super::store::{meta_str, Res};
use super::{lock, ApiServerDouble, Armed, Fault, Logged, Matcher};

fn typed<T: DeserializeOwned>(v: Value) -> T {
    serde_json::from_value(v).expect("stored object has the API type's shape")
}

fn value<T: Serialize>(t: &T) -> Value {
    serde_json::to_value(t).expect("API object serialises")
}

fn namespace_of(v: &Value) -> String {
    let ns = meta_str(v, "namespace");
    if ns.is_empty() {
        "default".into()
    } else {
        ns.to_string()
    }
}

impl ApiServerDouble {
    /// Runs one request as admin; `Err` is the Status an HTTP client would get.
    fn admin(&self, method: &str, path: &str, body: Option<&Value>) -> Result<Value, String> {
        let req = Request {
            method: method.into(),
            path: path.into(),
            query: String::new(),
            headers: vec![("content-type".into(), "application/json".into())],
            body: body.map(|b| b.to_string().into_bytes()).unwrap_or_default(),
        };
        match execute(&self.shared, &Identity::Admin.user(), &req) {
            Reply::Json(_, v) => Ok(v),
            Reply::Err(e) => Err(String::from_utf8_lossy(&e.body()).into_owned()),
            Reply::Watch(_) => Err("unexpected watch".into()),
        }
    }

    fn stored(&self, res: Res, ns: &str, name: &str) -> Option<Value> {
        lock(&self.shared.state).get(res, ns, name).cloned()
    }

    fn all(&self, res: Res) -> Vec<Value> {
        let state = lock(&self.shared.state);
        state.current(res).into_iter().map(|(_, v)| v).collect()
    }

    /// Creates a pod as admin, with the server's defaults; panics if the server refuses.
    pub fn create_pod(&self, pod: Pod) -> Pod {
        let v = value(&pod);
        let path = format!("/api/v1/namespaces/{}/pods", namespace_of(&v));
        typed(self.admin("POST", &path, Some(&v)).expect("create pod"))
    }

    /// Changes a pod as admin (a PUT of the edited object; spec changes bump
    /// `generation`, status is kept). Panics if the pod does not exist.
    pub fn update_pod(&self, namespace: &str, name: &str, edit: impl FnOnce(&mut Pod)) -> Pod {
        let mut pod: Pod = typed(self.stored(Res::Pods, namespace, name).expect("pod exists"));
        edit(&mut pod);
        let mut v = value(&pod);
        v["metadata"]["resourceVersion"] = Value::Null;
        let path = format!("/api/v1/namespaces/{namespace}/pods/{name}");
        typed(self.admin("PUT", &path, Some(&v)).expect("update pod"))
    }

    /// Deletes a pod as admin with `grace` (None: the pod's own grace period), as
    /// `DELETE` does: a bound pod gets a deletionTimestamp first, grace 0 removes it.
    /// Returns what the DELETE answered, or None if there was no such pod.
    pub fn delete_pod(&self, namespace: &str, name: &str, grace: Option<i64>) -> Option<Pod> {
        let opts = match grace {
            Some(g) => json!({"gracePeriodSeconds": g}),
            None => json!({}),
        };
        let path = format!("/api/v1/namespaces/{namespace}/pods/{name}");
        self.admin("DELETE", &path, Some(&opts)).ok().map(typed)
    }

    pub fn get_pod(&self, namespace: &str, name: &str) -> Option<Pod> {
        self.stored(Res::Pods, namespace, name).map(typed)
    }

    /// All pods, in key order.
    pub fn list_pods(&self) -> Vec<Pod> {
        self.all(Res::Pods).into_iter().map(typed).collect()
    }

    /// Creates a Node as admin (taint and all).
    pub fn create_node(&self, node: Node) -> Node {
        typed(
            self.admin("POST", "/api/v1/nodes", Some(&value(&node)))
                .expect("create node"),
        )
    }

    pub fn get_node(&self, name: &str) -> Option<Node> {
        self.stored(Res::Nodes, "", name).map(typed)
    }

    /// Deletes a Node; false if there was none.
    pub fn delete_node(&self, name: &str) -> bool {
        self.admin("DELETE", &format!("/api/v1/nodes/{name}"), None)
            .is_ok()
    }

    /// The node's Lease in `kube-node-lease`.
    pub fn get_lease(&self, name: &str) -> Option<Lease> {
        self.stored(Res::Leases, "kube-node-lease", name).map(typed)
    }

    fn put(&self, res: Res, v: Value) -> Value {
        let ns = namespace_of(&v);
        let name = meta_str(&v, "name").to_string();
        let base = format!("/api/v1/namespaces/{ns}/{}", res.plural());
        if self.stored(res, &ns, &name).is_some() {
            let mut v = v;
            v["metadata"]["resourceVersion"] = Value::Null;
            v["metadata"]["uid"] = Value::Null;
            self.admin("PUT", &format!("{base}/{name}"), Some(&v))
                .expect("replace object")
        } else {
            self.admin("POST", &base, Some(&v)).expect("create object")
        }
    }

    /// Creates or replaces a ConfigMap (MODIFIED for watchers when it existed).
    pub fn put_configmap(&self, cm: ConfigMap) -> ConfigMap {
        typed(self.put(Res::ConfigMaps, value(&cm)))
    }

    pub fn get_configmap(&self, namespace: &str, name: &str) -> Option<ConfigMap> {
        self.stored(Res::ConfigMaps, namespace, name).map(typed)
    }

    pub fn delete_configmap(&self, namespace: &str, name: &str) -> bool {
        let path = format!("/api/v1/namespaces/{namespace}/configmaps/{name}");
        self.admin("DELETE", &path, None).is_ok()
    }

    /// Creates or replaces a Secret (`stringData` folded into `data`).
    pub fn put_secret(&self, secret: Secret) -> Secret {
        typed(self.put(Res::Secrets, value(&secret)))
    }

    pub fn get_secret(&self, namespace: &str, name: &str) -> Option<Secret> {
        self.stored(Res::Secrets, namespace, name).map(typed)
    }

    pub fn delete_secret(&self, namespace: &str, name: &str) -> bool {
        let path = format!("/api/v1/namespaces/{namespace}/secrets/{name}");
        self.admin("DELETE", &path, None).is_ok()
    }

    /// Creates or replaces a Service. The double allocates no cluster IP: the Service
    /// has the one it is given. It runs no controller either, so there is no master
    /// service `default/kubernetes` unless a test puts one.
    pub fn put_service(&self, service: Service) -> Service {
        typed(self.put(Res::Services, value(&service)))
    }

    pub fn delete_service(&self, namespace: &str, name: &str) -> bool {
        let path = format!("/api/v1/namespaces/{namespace}/services/{name}");
        self.admin("DELETE", &path, None).is_ok()
    }

    /// core/v1 Events posted so far.
    pub fn list_events(&self) -> Vec<Event> {
        self.all(Res::Events).into_iter().map(typed).collect()
    }

    /// events.k8s.io/v1 Events posted so far.
    pub fn list_events_v1(&self) -> Vec<k8s_openapi::api::events::v1::Event> {
        self.all(Res::EventsV1).into_iter().map(typed).collect()
    }

    /// The current (global) resourceVersion.
    pub fn resource_version(&self) -> u64 {
        lock(&self.shared.state).rv
    }

    /// Every resourceVersion handed out so far becomes too old: watches from them get a
    /// 410 ERROR event, continue tokens from them a 410. Like the apiserver's compactor
    /// (which writes a key to etcd), this advances the revision by one, so a fresh LIST
    /// returns a resourceVersion that is still good.
    pub fn compact(&self) {
        let mut state = lock(&self.shared.state);
        state.rv += 1;
        state.compacted = state.rv;
        drop(state);
        self.shared.changed.notify_all();
    }

    /// Cuts every open watch connection mid-stream (no terminating chunk).
    pub fn drop_watches(&self) {
        lock(&self.shared.state).watch_epoch += 1;
        self.shared.changed.notify_all();
        for (tcp, watching) in lock(&self.shared.conns).open.values() {
            if *watching {
                let _ = tcp.shutdown(std::net::Shutdown::Both);
            }
        }
    }

    /// How many watch streams are open right now.
    pub fn open_watches(&self) -> usize {
        lock(&self.shared.state).watches
    }

    /// The next request matching `matcher` gets `fault` instead of its answer.
    pub fn fail_next(&self, matcher: impl Into<Matcher>, fault: Fault) {
        self.fail_times(matcher, fault, 1);
    }

    /// The next `times` requests matching `matcher` get `fault`.
    pub fn fail_times(&self, matcher: impl Into<Matcher>, fault: Fault, times: usize) {
        if times == 0 {
            return;
        }
        lock(&self.shared.faults).push(Armed {
            matcher: matcher.into(),
            fault,
            remaining: times,
        });
    }

    /// Disarms all faults not yet used.
    pub fn clear_faults(&self) {
        lock(&self.shared.faults).clear();
    }

    /// Every request so far, in arrival order.
    pub fn request_log(&self) -> Vec<Logged> {
        lock(&self.shared.log).clone()
    }

    /// Forgets the requests logged so far.
    /// The last `n` requests, newest first, one `METHOD path?query -> code` a line: for
    /// a failing test's message.
    pub fn recent_requests(&self, n: usize) -> String {
        self.request_log()
            .iter()
            .rev()
            .take(n)
            .map(|l| format!("{} {}?{} -> {}", l.method, l.path, l.query, l.code))
            .collect::<Vec<_>>()
            .join("\n")
    }

    pub fn clear_request_log(&self) {
        lock(&self.shared.log).clear();
    }

    /// Polls `cond` whenever the double changes (objects, requests, watches) until it
    /// holds (true) or `timeout` passes (false).
    pub fn wait_for(
        &self,
        timeout: Duration,
        mut cond: impl FnMut(&ApiServerDouble) -> bool,
    ) -> bool {
        let deadline = Instant::now() + timeout;
        loop {
            if cond(self) {
                return true;
            }
            let now = Instant::now();
            if now >= deadline {
                return false;
            }
            let state = lock(&self.shared.state);
            let wait = (deadline - now).min(Duration::from_millis(50));
            let _ = self.shared.changed.wait_timeout(state, wait);
        }
    }
}
