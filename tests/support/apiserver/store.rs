//! The double's etcd: objects as JSON values keyed by resource and `namespace/name`, one
//! global resourceVersion counter shared by every resource, and the full history of
//! changes (for watches from an older resourceVersion and for consistent list pages).
//! `compact()` makes everything up to the current revision too old to read.

use std::collections::{BTreeMap, HashMap};

use serde_json::{json, Value};

/// The resources the double serves.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Res {
    Pods,
    Nodes,
    Leases,
    ConfigMaps,
    Secrets,
    Services,
    Events,
    EventsV1,
}

impl Res {
    pub fn plural(self) -> &'static str {
        match self {
            Res::Pods => "pods",
            Res::Nodes => "nodes",
            Res::Leases => "leases",
            Res::ConfigMaps => "configmaps",
            Res::Secrets => "secrets",
            Res::Services => "services",
            Res::Events | Res::EventsV1 => "events",
        }
    }

    pub fn group(self) -> &'static str {
        match self {
            Res::Leases => "coordination.k8s.io",
            Res::EventsV1 => "events.k8s.io",
            _ => "",
        }
    }

    pub fn kind(self) -> &'static str {
        match self {
            Res::Pods => "Pod",
            Res::Nodes => "Node",
            Res::Leases => "Lease",
            Res::ConfigMaps => "ConfigMap",
            Res::Secrets => "Secret",
            Res::Services => "Service",
            Res::Events | Res::EventsV1 => "Event",
        }
    }

    pub fn api_version(self) -> &'static str {
        match self {
            Res::Leases => "coordination.k8s.io/v1",
            Res::EventsV1 => "events.k8s.io/v1",
            _ => "v1",
        }
    }

    pub fn namespaced(self) -> bool {
        self != Res::Nodes
    }

    /// What a BOOKMARK's object looks like for this resource (README semantics 4).
    pub fn bookmark(self, rv: u64, annotations: Option<Value>) -> Value {
        let mut meta = json!({ "resourceVersion": rv.to_string() });
        if let Some(a) = annotations {
            meta["annotations"] = a;
        }
        let mut o =
            json!({ "kind": self.kind(), "apiVersion": self.api_version(), "metadata": meta });
        match self {
            Res::Pods => {
                o["spec"] = json!({ "containers": null });
                o["status"] = json!({});
            }
            Res::Nodes => {
                o["spec"] = json!({});
                o["status"] = json!({});
            }
            Res::Leases => o["spec"] = json!({}),
            _ => {}
        }
        o
    }
}

/// The watch event kinds stored in the history.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EvType {
    Added,
    Modified,
    Deleted,
}

impl EvType {
    pub fn name(self) -> &'static str {
        match self {
            EvType::Added => "ADDED",
            EvType::Modified => "MODIFIED",
            EvType::Deleted => "DELETED",
        }
    }
}

/// One change, as a watch replays it.
#[derive(Debug, Clone)]
pub struct Change {
    pub rv: u64,
    pub res: Res,
    pub key: String,
    pub ty: EvType,
    pub obj: Value,
    pub prev: Option<Value>,
}

/// `namespace/name`, or `name` for cluster-scoped objects (etcd key order).
pub fn key(ns: &str, name: &str) -> String {
    if ns.is_empty() {
        name.to_string()
    } else {
        format!("{ns}/{name}")
    }
}

pub fn meta_str<'a>(o: &'a Value, field: &str) -> &'a str {
    o["metadata"][field].as_str().unwrap_or("")
}

/// All state, under one lock.
#[derive(Default)]
pub struct State {
    pub rv: u64,
    pub objects: BTreeMap<(Res, String), Value>,
    pub history: Vec<Change>,
    /// The last revision that changed each resource (what its watch cache has seen).
    pub type_rv: HashMap<Res, u64>,
    /// Revisions at or below this are too old (0: nothing compacted).
    pub compacted: u64,
    /// Bumped by `drop_watches`: open watches with an older epoch end abruptly.
    pub watch_epoch: u64,
    /// Open watch streams.
    pub watches: usize,
}

impl State {
    pub fn new() -> State {
        State {
            rv: 1,
            ..State::default()
        }
    }

    pub fn get(&self, res: Res, ns: &str, name: &str) -> Option<&Value> {
        self.objects.get(&(res, key(ns, name)))
    }

    fn record(&mut self, res: Res, k: String, ty: EvType, obj: Value, prev: Option<Value>) {
        self.type_rv.insert(res, self.rv);
        self.history.push(Change {
            rv: self.rv,
            res,
            key: k,
            ty,
            obj,
            prev,
        });
    }

    /// Stores `obj` (ADDED if new, else MODIFIED) at the next revision; returns it.
    pub fn put(&mut self, res: Res, mut obj: Value) -> Value {
        self.rv += 1;
        obj["metadata"]["resourceVersion"] = Value::from(self.rv.to_string());
        if obj.get("kind").is_none() {
            obj["kind"] = Value::from(res.kind());
        }
        if obj.get("apiVersion").is_none() {
            obj["apiVersion"] = Value::from(res.api_version());
        }
        let k = key(meta_str(&obj, "namespace"), meta_str(&obj, "name"));
        let prev = self.objects.insert((res, k.clone()), obj.clone());
        let ty = if prev.is_some() {
            EvType::Modified
        } else {
            EvType::Added
        };
        self.record(res, k, ty, obj.clone(), prev);
        obj
    }

    /// Removes an object at the next revision; returns it as the DELETED event shows it.
    pub fn remove(&mut self, res: Res, ns: &str, name: &str) -> Option<Value> {
        let k = key(ns, name);
        let mut obj = self.objects.remove(&(res, k.clone()))?;
        self.rv += 1;
        obj["metadata"]["resourceVersion"] = Value::from(self.rv.to_string());
        self.record(res, k, EvType::Deleted, obj.clone(), None);
        Some(obj)
    }

    /// The objects of `res` as they were at revision `at`, in key order.
    pub fn snapshot(&self, res: Res, at: u64) -> Vec<(String, Value)> {
        let mut m: BTreeMap<String, Option<Value>> = BTreeMap::new();
        for c in self.history.iter().filter(|c| c.res == res && c.rv <= at) {
            let v = (c.ty != EvType::Deleted).then(|| c.obj.clone());
            m.insert(c.key.clone(), v);
        }
        m.into_iter()
            .filter_map(|(k, v)| v.map(|v| (k, v)))
            .collect()
    }

    /// The current objects of `res`, in key order.
    pub fn current(&self, res: Res) -> Vec<(String, Value)> {
        self.objects
            .range((res, String::new())..)
            .take_while(|((r, _), _)| *r == res)
            .map(|((_, k), v)| (k.clone(), v.clone()))
            .collect()
    }
}

/// One `field=value` / `field!=value` requirement (field or label selector).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Requirement {
    pub key: String,
    pub op: Op,
    pub value: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    Equals,
    DoubleEquals,
    NotEquals,
    Exists,
    NotExists,
}

/// Parses `a=b,c!=d` (and, for labels, `k` / `!k`).
pub fn parse_selector(s: &str) -> Vec<Requirement> {
    s.split(',')
        .map(str::trim)
        .filter(|p| !p.is_empty())
        .map(|p| {
            let (k, op, v) = if let Some((k, v)) = p.split_once("!=") {
                (k, Op::NotEquals, v)
            } else if let Some((k, v)) = p.split_once("==") {
                (k, Op::DoubleEquals, v)
            } else if let Some((k, v)) = p.split_once('=') {
                (k, Op::Equals, v)
            } else if let Some(k) = p.strip_prefix('!') {
                (k, Op::NotExists, "")
            } else {
                (p, Op::Exists, "")
            };
            Requirement {
                key: k.trim().to_string(),
                op,
                value: v.trim().to_string(),
            }
        })
        .collect()
}

/// The value of a field selector's field on an object.
pub fn field_value(o: &Value, field: &str) -> Option<String> {
    let v = match field {
        "metadata.name" => &o["metadata"]["name"],
        "metadata.namespace" => &o["metadata"]["namespace"],
        "spec.nodeName" => &o["spec"]["nodeName"],
        "status.phase" => &o["status"]["phase"],
        "spec.schedulerName" => &o["spec"]["schedulerName"],
        "spec.serviceAccountName" => &o["spec"]["serviceAccountName"],
        "type" => &o["type"],
        _ => return None,
    };
    Some(v.as_str().unwrap_or("").to_string())
}

fn matches(reqs: &[Requirement], get: impl Fn(&str) -> Option<String>) -> bool {
    reqs.iter().all(|r| {
        let v = get(&r.key);
        match r.op {
            Op::Equals | Op::DoubleEquals => v.as_deref() == Some(r.value.as_str()),
            Op::NotEquals => v.as_deref() != Some(r.value.as_str()),
            Op::Exists => v.is_some(),
            Op::NotExists => v.is_none(),
        }
    })
}

/// Namespace, field selector and label selector of a list or watch.
#[derive(Debug, Clone, Default)]
pub struct Filter {
    pub namespace: String,
    pub fields: Vec<Requirement>,
    pub labels: Vec<Requirement>,
}

impl Filter {
    pub fn matches(&self, o: &Value) -> bool {
        (self.namespace.is_empty() || meta_str(o, "namespace") == self.namespace)
            && matches(&self.fields, |f| field_value(o, f))
            && matches(&self.labels, |l| {
                o["metadata"]["labels"][l].as_str().map(str::to_string)
            })
    }
}
