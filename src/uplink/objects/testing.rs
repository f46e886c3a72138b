//! Test doubles: a scripted apiserver for [`ObjectFetcher`] and a logger that keeps
//! every line, so tests can look for what must never be logged.

use std::collections::{BTreeMap, VecDeque};
use std::marker::PhantomData;
use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock, PoisonError};
use std::time::{Duration, Instant};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::WatchEvent;
use serde_json::{json, Value};

use super::{Listed, Object, ObjectFetcher, ObjectKey};
use crate::kube::ApiError;

/// An error the fake can hand out again and again (`ApiError` is not `Clone`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fail {
    /// 403 from the Node authorizer (fixture 21).
    Forbidden,
    /// No answer (uplink down).
    Offline,
    /// 410 Expired.
    Gone,
}

impl Fail {
    fn error(self, path: &str) -> ApiError {
        match self {
            Fail::Forbidden => ApiError::Status {
                method: "GET",
                path: path.into(),
                code: 403,
                reason: "Forbidden".into(),
                message: "no relationship found between node 'edge-node-1' and this object".into(),
            },
            Fail::Offline => ApiError::Transport {
                method: "GET",
                path: path.into(),
                message: "connection refused".into(),
            },
            Fail::Gone => ApiError::Status {
                method: "GET",
                path: path.into(),
                code: 410,
                reason: "Expired".into(),
                message: "too old resource version".into(),
            },
        }
    }
}

/// One thing an open fake watch yields.
#[derive(Debug, Clone)]
pub enum Item {
    /// A watch event line, as the server sends it.
    Event(Value),
    /// The connection breaks.
    Drop,
}

/// A call the fake received.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Call {
    List(ObjectKey),
    /// Watch from this resourceVersion.
    Watch(ObjectKey, String),
}

#[derive(Default)]
struct State {
    /// Per object: LIST answers in order; the last one repeats.
    lists: BTreeMap<ObjectKey, VecDeque<Result<Value, Fail>>>,
    /// Per object: how the next watches open (`Err`) before they succeed.
    watch_opens: BTreeMap<ObjectKey, VecDeque<Fail>>,
    /// Per object: what open watches yield next.
    items: BTreeMap<ObjectKey, VecDeque<Item>>,
    calls: Vec<Call>,
    open_watches: BTreeMap<ObjectKey, usize>,
    max_open: usize,
    /// Shut down: open watches end, new calls fail.
    closed: bool,
}

/// The scripted apiserver. Clones share state.
#[derive(Clone)]
pub struct FakeApi {
    inner: Arc<(Mutex<State>, Condvar)>,
    /// How long a watch with nothing to say stays open before the server ends it with a
    /// bookmark (the real one does so at `timeoutSeconds`, fixture 45).
    idle: Duration,
}

impl FakeApi {
    pub fn new(idle: Duration) -> Self {
        FakeApi {
            inner: Arc::new((Mutex::new(State::default()), Condvar::new())),
            idle,
        }
    }

    fn state(&self) -> MutexGuard<'_, State> {
        self.inner.0.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn change(&self, f: impl FnOnce(&mut State)) {
        f(&mut self.state());
        self.inner.1.notify_all();
    }

    /// Scripts the LIST answers for `key` (the last one repeats).
    pub fn lists(&self, key: &ObjectKey, answers: Vec<Result<Value, Fail>>) {
        self.change(|s| {
            s.lists.insert(key.clone(), answers.into());
        });
    }

    pub fn watch_opens(&self, key: &ObjectKey, fails: Vec<Fail>) {
        self.change(|s| {
            s.watch_opens.insert(key.clone(), fails.into());
        });
    }

    /// Queues what open (or future) watches of `key` yield.
    pub fn push(&self, key: &ObjectKey, items: Vec<Item>) {
        self.change(|s| s.items.entry(key.clone()).or_default().extend(items));
    }

    /// Ends every open watch and fails every later call, so the threads of a finished
    /// test go away instead of waiting out a long idle watch.
    pub fn shutdown(&self) {
        self.change(|s| s.closed = true);
    }

    pub fn total_open_watches(&self) -> usize {
        self.state().open_watches.values().sum()
    }

    pub fn calls(&self) -> Vec<Call> {
        self.state().calls.clone()
    }

    pub fn calls_for(&self, key: &ObjectKey) -> Vec<Call> {
        self.calls()
            .into_iter()
            .filter(|c| match c {
                Call::List(k) | Call::Watch(k, _) => k == key,
            })
            .collect()
    }

    pub fn open_watches(&self, key: &ObjectKey) -> usize {
        self.state().open_watches.get(key).copied().unwrap_or(0)
    }

    pub fn max_open_watches(&self) -> usize {
        self.state().max_open
    }

    pub fn pending_items(&self, key: &ObjectKey) -> usize {
        self.state().items.get(key).map_or(0, VecDeque::len)
    }
}

fn key_of<T: Object>(namespace: &str, name: &str) -> ObjectKey {
    ObjectKey::new(T::OBJECT_KIND, namespace, name)
}

impl ObjectFetcher for FakeApi {
    fn list<T: Object>(&self, namespace: &str, name: &str) -> Result<Listed<T>, ApiError> {
        let key = key_of::<T>(namespace, name);
        let path = super::fetch::list_path::<T>(namespace, name);
        let answer = {
            let mut s = self.state();
            s.calls.push(Call::List(key.clone()));
            if s.closed {
                return Err(Fail::Offline.error(&path));
            }
            let script = s.lists.entry(key).or_default();
            let answer = if script.len() > 1 {
                script.pop_front()
            } else {
                script.front().cloned()
            };
            answer.unwrap_or(Err(Fail::Offline))
        };
        self.inner.1.notify_all();
        let body = answer.map_err(|f| f.error(&path))?;
        let list: k8s_openapi::List<T> =
            serde_json::from_value(body).map_err(|e| ApiError::Decode {
                method: "GET",
                path: path.clone(),
                message: e.to_string(),
            })?;
        super::fetch::listed(&path, list, name)
    }

    fn watch<T: Object>(
        &self,
        namespace: &str,
        name: &str,
        resource_version: &str,
        timeout_seconds: u64,
    ) -> Result<impl Iterator<Item = Result<WatchEvent<T>, ApiError>> + use<T>, ApiError> {
        let key = key_of::<T>(namespace, name);
        let path =
            super::fetch::watch_path::<T>(namespace, name, resource_version, timeout_seconds);
        {
            let mut s = self.state();
            s.calls
                .push(Call::Watch(key.clone(), resource_version.to_string()));
            if s.closed {
                return Err(Fail::Offline.error(&path));
            }
            if let Some(f) = s.watch_opens.get_mut(&key).and_then(VecDeque::pop_front) {
                drop(s);
                self.inner.1.notify_all();
                return Err(f.error(&path));
            }
            let open = s.open_watches.entry(key.clone()).or_default();
            *open += 1;
            let total: usize = s.open_watches.values().sum();
            s.max_open = s.max_open.max(total);
        }
        self.inner.1.notify_all();
        Ok(FakeWatch {
            api: self.clone(),
            key,
            path,
            rv: resource_version.to_string(),
            deadline: Instant::now() + self.idle,
            done: false,
            _t: PhantomData,
        })
    }
}

struct FakeWatch<T> {
    api: FakeApi,
    key: ObjectKey,
    path: String,
    rv: String,
    deadline: Instant,
    done: bool,
    _t: PhantomData<fn() -> T>,
}

impl<T: Object> Iterator for FakeWatch<T> {
    type Item = Result<WatchEvent<T>, ApiError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.done {
            return None;
        }
        let (lock, cv) = &*self.api.inner;
        let mut s = lock.lock().unwrap_or_else(PoisonError::into_inner);
        loop {
            if s.closed {
                self.done = true;
                return None;
            }
            if let Some(item) = s.items.get_mut(&self.key).and_then(VecDeque::pop_front) {
                drop(s);
                cv.notify_all();
                return Some(match item {
                    Item::Event(v) => {
                        if let Some(rv) = v["object"]["metadata"]["resourceVersion"].as_str() {
                            self.rv = rv.to_string();
                        }
                        serde_json::from_value(v).map_err(|e| ApiError::Decode {
                            method: "GET",
                            path: self.path.clone(),
                            message: e.to_string(),
                        })
                    }
                    Item::Drop => {
                        self.done = true;
                        Err(Fail::Offline.error(&self.path))
                    }
                });
            }
            let left = self.deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                // The server's last word before timeoutSeconds: a bookmark at the
                // newest resourceVersion this watch has seen.
                self.done = true;
                let bookmark = json!({"type": "BOOKMARK", "object": {
                    "kind": T::KIND_NAME, "apiVersion": "v1",
                    "metadata": {"resourceVersion": self.rv}}});
                drop(s);
                return Some(
                    serde_json::from_value(bookmark).map_err(|e| ApiError::Decode {
                        method: "GET",
                        path: self.path.clone(),
                        message: e.to_string(),
                    }),
                );
            }
            s = cv
                .wait_timeout(s, left)
                .unwrap_or_else(PoisonError::into_inner)
                .0;
        }
    }
}

impl<T> Drop for FakeWatch<T> {
    fn drop(&mut self) {
        self.api.change(|s| {
            if let Some(n) = s.open_watches.get_mut(&self.key) {
                *n = n.saturating_sub(1);
            }
        });
    }
}

/// `kind` of a watch event's object.
trait KindName {
    const KIND_NAME: &'static str;
}

impl<T: k8s_openapi::Resource> KindName for T {
    const KIND_NAME: &'static str = T::KIND;
}

/// A ConfigMapList/SecretList holding `items`, at list resourceVersion `rv`.
pub fn list_of(kind: &str, rv: &str, items: Vec<Value>) -> Value {
    json!({"kind": format!("{kind}List"), "apiVersion": "v1",
           "metadata": {"resourceVersion": rv}, "items": items})
}

/// Polls `cond` until it holds or `limit` passes.
pub fn wait_for(what: &str, limit: Duration, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + limit;
    while !cond() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(5));
    }
}

static LINES: Mutex<Vec<String>> = Mutex::new(Vec::new());

/// Installs (once) a logger that keeps every line of the process, all levels, and
/// returns the lines kept so far.
pub fn logs() -> Vec<String> {
    static INSTALLED: OnceLock<()> = OnceLock::new();
    INSTALLED.get_or_init(|| {
        log::set_logger(&Capture).expect("no other logger is installed in unit tests");
        log::set_max_level(log::LevelFilter::Trace);
    });
    LINES.lock().unwrap_or_else(PoisonError::into_inner).clone()
}

struct Capture;

impl log::Log for Capture {
    fn enabled(&self, _: &log::Metadata<'_>) -> bool {
        true
    }

    fn log(&self, record: &log::Record<'_>) {
        let line = format!("{} {}", record.level(), record.args());
        LINES
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(line);
    }

    fn flush(&self) {}
}
