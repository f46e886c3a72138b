//! The object manager: told which pods are on the node, it keeps every object they
//! reference followed (a watch thread each, up to a cap; polled by LIST beyond it),
//! stops following the rest and drops them from the store.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Condvar, Mutex, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{ConfigMap, Pod, Secret};
use tokio::sync::mpsc;

use super::watcher::{self, Control, Follow, Revive, Run, Streak};
use super::{
    references_all, Object, ObjectCache, ObjectFetcher, ObjectKey, ObjectKind, ObjectsError,
    References,
};
use crate::backoff::Backoff;
use crate::config::{check_dns1123_label, check_dns1123_subdomain};

/// How the manager follows objects.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ObjectManagerOptions {
    /// At most this many watch threads (each blocks in one watch read).
    pub max_watches: usize,
    /// A watch's `timeoutSeconds` is drawn from `[watch_timeout, 2 * watch_timeout]`.
    /// 30 minutes, the apiserver's own choice for a watch that names no timeout
    /// (`--min-request-timeout`): each followed object costs one request per 30 to 60
    /// minutes, not client-go's 5 to 10, which with ten referenced ConfigMaps was more
    /// than the node's whole status.
    pub watch_timeout: Duration,
    /// How often an object beyond `max_watches` is re-listed.
    pub poll_interval: Duration,
    /// Retry delays after a failed LIST or WATCH (with full jitter).
    pub backoff: Backoff,
}

impl Default for ObjectManagerOptions {
    fn default() -> Self {
        ObjectManagerOptions {
            max_watches: 16,
            watch_timeout: Duration::from_secs(1800),
            poll_interval: Duration::from_secs(60),
            backoff: Backoff {
                initial: Duration::from_millis(800),
                max: Duration::from_secs(30),
            },
        }
    }
}

#[derive(Default)]
struct SlotState {
    latest: Option<References>,
    closed: bool,
    poked: bool,
}

/// The newest pod set not yet picked up (older ones are replaced, never queued), and
/// pokes from watch threads that have returned.
#[derive(Default)]
struct Slot {
    state: Mutex<SlotState>,
    cv: Condvar,
}

impl Slot {
    fn update(&self, f: impl FnOnce(&mut SlotState)) {
        let mut s = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        f(&mut s);
        self.cv.notify_all();
    }
}

/// The caller's side of the pod set: "these are the node's pods now". Each call
/// replaces the set the manager has not picked up yet, so a burst of changes costs one
/// reconcile. Dropping it stops the manager and its watches.
pub struct PodSetSender {
    slot: Arc<Slot>,
}

impl PodSetSender {
    /// The node's pods are now exactly `pods`.
    pub fn set_pods<'a>(&self, pods: impl IntoIterator<Item = &'a Pod>) {
        self.set_references(references_all(pods));
    }

    /// The node's pods now reference exactly `refs`.
    pub fn set_references(&self, refs: References) {
        self.slot.update(|s| s.latest = Some(refs));
    }
}

impl Drop for PodSetSender {
    fn drop(&mut self) {
        self.slot.update(|s| s.closed = true);
    }
}

/// The manager's side of the pod set; hand it to [`spawn_object_manager`].
pub struct PodSetReceiver {
    slot: Arc<Slot>,
}

enum Wake {
    Pods(References),
    Poked,
    Timeout,
    Closed,
}

impl PodSetReceiver {
    fn wait(&self, timeout: Option<Duration>) -> Wake {
        let deadline = timeout.map(|t| Instant::now() + t);
        let mut s = self
            .slot
            .state
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        loop {
            if let Some(refs) = s.latest.take() {
                return Wake::Pods(refs);
            }
            if s.closed {
                return Wake::Closed;
            }
            if std::mem::take(&mut s.poked) {
                return Wake::Poked;
            }
            match deadline {
                None => s = self.slot.cv.wait(s).unwrap_or_else(PoisonError::into_inner),
                Some(d) => {
                    let left = d.saturating_duration_since(Instant::now());
                    if left.is_zero() {
                        return Wake::Timeout;
                    }
                    s = self
                        .slot
                        .cv
                        .wait_timeout(s, left)
                        .unwrap_or_else(PoisonError::into_inner)
                        .0;
                }
            }
        }
    }
}

/// A channel for the node's pod set, holding only the newest.
pub fn pod_set() -> (PodSetSender, PodSetReceiver) {
    let slot = Arc::new(Slot::default());
    (PodSetSender { slot: slot.clone() }, PodSetReceiver { slot })
}

/// Wakes the manager when a watch thread returns, however it returns.
struct PokeOnExit(Arc<Slot>);

impl Drop for PokeOnExit {
    fn drop(&mut self) {
        self.0.update(|s| s.poked = true);
    }
}

/// [`spawn_object_manager_with`] default options.
pub fn spawn_object_manager<F: ObjectFetcher>(
    client: F,
    cache: ObjectCache,
    wanted: PodSetReceiver,
    changed: mpsc::Sender<ObjectKey>,
) -> Result<JoinHandle<()>, ObjectsError> {
    spawn_object_manager_with(
        client,
        cache,
        wanted,
        changed,
        ObjectManagerOptions::default(),
    )
}

/// Starts the manager on its own thread. Until the first pod set arrives it leaves the
/// store alone; from then on it follows what the pods reference, stores each object
/// (only when its content changed) and sends its key on `changed`, and removes from the
/// store whatever no pod references. Offline, the store keeps what it has. Ends when
/// the [`PodSetSender`] is dropped (watch threads end on their own shortly after).
pub fn spawn_object_manager_with<F: ObjectFetcher>(
    client: F,
    cache: ObjectCache,
    wanted: PodSetReceiver,
    changed: mpsc::Sender<ObjectKey>,
    options: ObjectManagerOptions,
) -> Result<JoinHandle<()>, ObjectsError> {
    cache.follow();
    let manager = Manager {
        follow: Arc::new(Follow {
            fetcher: client,
            cache,
            changed,
            backoff: options.backoff,
            watch_timeout: options.watch_timeout,
        }),
        rx: wanted,
        options,
        wanted: BTreeSet::new(),
        watches: BTreeMap::new(),
        polled: BTreeMap::new(),
    };
    std::thread::Builder::new()
        .name("objects".into())
        .spawn(move || manager.run())
        .map_err(|source| ObjectsError::Spawn {
            what: "object manager",
            source,
        })
}

enum Watched {
    Thread {
        ctl: Arc<Control>,
        handle: JoinHandle<()>,
    },
    /// Immutable and stored: nothing to follow while it stays referenced.
    Settled,
}

struct Polled {
    due: Instant,
    streak: Streak,
}

struct Manager<F> {
    follow: Arc<Follow<F>>,
    rx: PodSetReceiver,
    options: ObjectManagerOptions,
    wanted: BTreeSet<ObjectKey>,
    watches: BTreeMap<ObjectKey, Watched>,
    polled: BTreeMap<ObjectKey, Polled>,
}

fn valid(key: &ObjectKey) -> bool {
    check_dns1123_label(&key.namespace).is_ok() && check_dns1123_subdomain(&key.name).is_ok()
}

impl<F: ObjectFetcher> Manager<F> {
    fn run(mut self) {
        loop {
            let now = Instant::now();
            let timeout = self
                .polled
                .values()
                .map(|p| p.due.saturating_duration_since(now))
                .min();
            match self.rx.wait(timeout) {
                Wake::Closed => {
                    for w in self.watches.values() {
                        if let Watched::Thread { ctl, .. } = w {
                            ctl.stop();
                        }
                    }
                    log::debug!("object manager stopped");
                    return;
                }
                Wake::Pods(refs) => self.set_wanted(refs),
                Wake::Poked | Wake::Timeout => {}
            }
            self.reap();
            self.place();
            self.poll_due();
        }
    }

    fn set_wanted(&mut self, refs: References) {
        let mut keys = BTreeSet::new();
        for key in refs.keys() {
            if valid(&key) {
                keys.insert(key);
            } else {
                log::warn!(
                    "not fetching {:?} {:?}/{:?}: not a valid name",
                    key.kind,
                    key.namespace,
                    key.name
                );
            }
        }
        // Stop first: by the time an object is gone from the store, its watch is told.
        for (key, w) in &self.watches {
            if let Watched::Thread { ctl, .. } = w {
                if !keys.contains(key) {
                    log::debug!("{key}: no pod references it; stopping its watch");
                    ctl.stop();
                }
            }
        }
        self.watches
            .retain(|k, w| keys.contains(k) || matches!(w, Watched::Thread { .. }));
        self.polled.retain(|k, _| keys.contains(k));
        match self.follow.cache.retain(&keys) {
            Ok(removed) => {
                for key in removed {
                    log::info!("{key}: no pod references it; removed from the store");
                }
            }
            Err(e) => log::error!("drop unreferenced objects from the store: {e}"),
        }
        self.wanted = keys;
    }

    /// Joins watch threads that have returned.
    fn reap(&mut self) {
        let finished: Vec<ObjectKey> = self
            .watches
            .iter()
            .filter(|(_, w)| matches!(w, Watched::Thread { handle, .. } if handle.is_finished()))
            .map(|(k, _)| k.clone())
            .collect();
        for key in finished {
            if let Some(Watched::Thread { ctl, handle }) = self.watches.remove(&key) {
                if handle.join().is_err() {
                    log::error!("{key}: watch thread panicked");
                }
                if ctl.state() == Run::Settled && self.wanted.contains(&key) {
                    self.watches.insert(key, Watched::Settled);
                }
            }
        }
    }

    fn threads(&self) -> usize {
        self.watches
            .values()
            .filter(|w| matches!(w, Watched::Thread { .. }))
            .count()
    }

    /// Gives every wanted object a watch thread while there are free ones, and a place
    /// in the poll list otherwise.
    fn place(&mut self) {
        let mut threads = self.threads();
        let wanted: Vec<ObjectKey> = self.wanted.iter().cloned().collect();
        for key in wanted {
            match self.watches.get(&key) {
                Some(Watched::Settled) => continue,
                // Stopped but not yet gone: take the stop back. Its object was dropped
                // from the store, and the thread may sit in a watch read for a while
                // before it relists, so list it now. If it has just returned, its poke
                // brings us back here to start a new one.
                Some(Watched::Thread { ctl, .. }) => {
                    if ctl.revive() == Revive::Revived {
                        self.list_now(&key);
                    }
                    continue;
                }
                None => {}
            }
            if threads < self.options.max_watches {
                match self.spawn_watch(&key) {
                    Ok(w) => {
                        threads += 1;
                        self.polled.remove(&key);
                        self.watches.insert(key, w);
                        continue;
                    }
                    Err(e) => log::warn!("{key}: cannot start a watch thread ({e}); polling it"),
                }
            }
            self.polled.entry(key).or_insert_with(|| Polled {
                due: Instant::now(),
                streak: Streak::default(),
            });
        }
    }

    fn spawn_watch(&self, key: &ObjectKey) -> std::io::Result<Watched> {
        match key.kind {
            ObjectKind::ConfigMap => self.spawn_watch_of::<ConfigMap>(key),
            ObjectKind::Secret => self.spawn_watch_of::<Secret>(key),
        }
    }

    fn spawn_watch_of<T: Object>(&self, key: &ObjectKey) -> std::io::Result<Watched> {
        let ctl = Control::new();
        let (follow, thread_ctl, key) = (self.follow.clone(), ctl.clone(), key.clone());
        let poke = PokeOnExit(self.rx.slot.clone());
        let handle = std::thread::Builder::new()
            .name("object-watch".into())
            .spawn(move || {
                let _poke = poke;
                watcher::run::<F, T>(&follow, &key, &thread_ctl);
            })?;
        Ok(Watched::Thread { ctl, handle })
    }

    /// One LIST outside the usual schedule; a failure is left to the object's watch.
    fn list_now(&self, key: &ObjectKey) {
        let result = match key.kind {
            ObjectKind::ConfigMap => self.follow.list_and_store::<ConfigMap>(key).map(|_| ()),
            ObjectKind::Secret => self.follow.list_and_store::<Secret>(key).map(|_| ()),
        };
        if let Err(e) = result {
            log::debug!("{key}: {}", watcher::describe(key, &e));
        }
    }

    /// LISTs the polled objects whose turn has come.
    fn poll_due(&mut self) {
        let now = Instant::now();
        let due: Vec<ObjectKey> = self
            .polled
            .iter()
            .filter(|(_, p)| p.due <= now)
            .map(|(k, _)| k.clone())
            .collect();
        for key in due {
            let result = match key.kind {
                ObjectKind::ConfigMap => self.follow.list_and_store::<ConfigMap>(&key),
                ObjectKind::Secret => self.follow.list_and_store::<Secret>(&key),
            };
            let Some(p) = self.polled.get_mut(&key) else {
                continue;
            };
            match result {
                Ok(listed) if listed.settled => {
                    self.polled.remove(&key);
                    self.watches.insert(key, Watched::Settled);
                }
                Ok(_) => {
                    p.streak.succeed(&key);
                    p.due = Instant::now() + self.options.poll_interval;
                }
                Err(e) => {
                    let delay = p.streak.fail(&key, &e, &self.options.backoff);
                    p.due = Instant::now() + delay;
                }
            }
        }
    }
}

#[cfg(test)]
#[path = "manager_tests.rs"]
mod tests;
