//! Following one object: LIST it, then WATCH it from the list's resourceVersion, resume
//! from the last resourceVersion seen when a watch ends or drops, relist on 410 Gone,
//! back off (with jitter) on failure. The same LIST-and-store step serves the objects
//! the manager polls instead of watching.
//!
//! The states are kube-runtime's watcher's: `Listing` (no resourceVersion yet, or it
//! expired) and `Watching(rv)`.

use std::sync::{Arc, Condvar, Mutex, PoisonError};
use std::time::{Duration, Instant};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::WatchEvent;
use tokio::sync::mpsc;

use super::{Object, ObjectCache, ObjectFetcher, ObjectKey, ObjectKind};
use crate::backoff::Backoff;
use crate::kube::ApiError;

/// A watch that ends sooner than this having delivered nothing is a failure (as in
/// client-go's reflector), so a server that closes watches at once is not hammered.
const MIN_WATCH: Duration = Duration::from_secs(1);

/// Where a watch thread stands, as its manager and the thread itself see it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Run {
    Running,
    /// Asked to stop: the object is no longer referenced.
    Stopping,
    /// The thread has returned.
    Exited,
    /// The thread has returned because the object is immutable and stored.
    Settled,
}

/// What [`Control::revive`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Revive {
    /// It had not been stopped.
    Running,
    /// It had been stopped and now goes on.
    Revived,
    /// The thread has already returned.
    Gone,
}

/// The manager's hold on one watch thread. A stop takes effect between events: a
/// blocked watch read returns by the next bookmark (about a minute) or its timeout.
pub(super) struct Control {
    state: Mutex<(Run, bool)>,
    cv: Condvar,
}

impl Control {
    pub(super) fn new() -> Arc<Self> {
        Arc::new(Control {
            state: Mutex::new((Run::Running, false)),
            cv: Condvar::new(),
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, (Run, bool)> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    pub(super) fn state(&self) -> Run {
        self.lock().0
    }

    pub(super) fn stop(&self) {
        let mut s = self.lock();
        if s.0 == Run::Running {
            s.0 = Run::Stopping;
        }
        self.cv.notify_all();
    }

    /// Takes back a stop the thread has not acted on. The object was dropped from the
    /// store meanwhile, so the thread relists at its next turn.
    pub(super) fn revive(&self) -> Revive {
        let mut s = self.lock();
        match s.0 {
            Run::Running => Revive::Running,
            Run::Stopping => {
                *s = (Run::Running, true);
                Revive::Revived
            }
            Run::Exited | Run::Settled => Revive::Gone,
        }
    }

    fn stop_requested(&self) -> bool {
        self.lock().0 == Run::Stopping
    }

    /// At the top of each turn: whether to go on (and whether to relist first). Deciding
    /// to stop and marking the thread gone happen under one lock, so a revive cannot
    /// slip in between.
    fn next_turn(&self) -> Option<bool> {
        let mut s = self.lock();
        match s.0 {
            Run::Running => Some(std::mem::take(&mut s.1)),
            _ => {
                s.0 = Run::Exited;
                None
            }
        }
    }

    fn settle(&self) {
        let mut s = self.lock();
        s.0 = if s.0 == Run::Running {
            Run::Settled
        } else {
            Run::Exited
        };
    }

    /// Sleeps for `d` unless asked to stop first.
    fn sleep(&self, d: Duration) {
        let s = self.lock();
        let _unused = self
            .cv
            .wait_timeout_while(s, d, |s| s.0 == Run::Running)
            .unwrap_or_else(PoisonError::into_inner);
    }
}

/// A run of consecutive failures for one object: how long to back off, and whether it
/// has been logged (each run is logged once at warn, the rest at debug).
#[derive(Default)]
pub(super) struct Streak {
    failures: u32,
    logged: bool,
}

impl Streak {
    pub(super) fn fail(&mut self, key: &ObjectKey, err: &ApiError, backoff: &Backoff) -> Duration {
        self.failures = self.failures.saturating_add(1);
        let what = describe(key, err);
        if self.logged {
            log::debug!("{key}: {what}; retrying (failure {})", self.failures);
        } else if err.is_forbidden() {
            log::warn!(
                "{key}: {what}; the Node authorizer allows it once a pod bound to this node \
                 references it; retrying with back-off"
            );
        } else {
            log::warn!("{key}: {what}; retrying with back-off");
        }
        self.logged = true;
        backoff.jittered(self.failures, random())
    }

    pub(super) fn succeed(&mut self, key: &ObjectKey) {
        if self.logged {
            log::info!("{key}: fetched after {} failure(s)", self.failures);
        }
        *self = Streak::default();
    }
}

/// An error as a log line may show it. The client's words for a body it could not
/// decode may quote the body, which for a Secret is its data: left out.
pub(super) fn describe(key: &ObjectKey, err: &ApiError) -> String {
    match err {
        ApiError::Decode { method, path, .. } if key.kind == ObjectKind::Secret => {
            format!("{method} {path}: bad response (details withheld: secret)")
        }
        e => e.to_string(),
    }
}

/// Full-jitter randomness without a random-number crate: std's `RandomState` is seeded
/// per process and advanced per call.
pub(super) fn random() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    h.write_u128(now);
    h.finish()
}

/// What a LIST came back with.
pub(super) struct ListOutcome {
    pub resource_version: String,
    /// The object is immutable and stored: nothing more to follow.
    pub settled: bool,
}

/// What following an object needs: the apiserver, the store, and where to say that a
/// stored object changed.
pub(super) struct Follow<F> {
    pub fetcher: F,
    pub cache: ObjectCache,
    pub changed: mpsc::Sender<ObjectKey>,
    pub backoff: Backoff,
    /// `timeoutSeconds` of a watch is drawn from `[watch_timeout, 2 * watch_timeout]`
    /// so that many agents' watches do not end together.
    pub watch_timeout: Duration,
}

enum WatchEnd {
    /// The server ended the stream: watch again from the last resourceVersion.
    Ended,
    Stopped,
    Settled,
    /// 410: the resourceVersion expired, relist.
    Gone,
    /// `healthy`: events arrived before the failure, so the failure run starts afresh.
    Failed {
        error: ApiError,
        healthy: bool,
    },
}

impl<F: ObjectFetcher> Follow<F> {
    /// Stores `object` (or its absence) and reports a change. Whether it was stored
    /// (or found already the same).
    fn store<T: Object>(&self, key: &ObjectKey, object: Option<&T>) -> bool {
        match self.cache.apply(key, object) {
            Ok(true) => {
                match object {
                    Some(_) => log::info!("{key}: stored"),
                    None => log::info!("{key}: gone from the cluster; removed from the store"),
                }
                if self.changed.blocking_send(key.clone()).is_err() {
                    log::debug!("{key}: nobody listens for object changes");
                }
                true
            }
            Ok(false) => {
                log::debug!("{key}: unchanged");
                true
            }
            // The error names the tree and key only.
            Err(e) => {
                log::error!("{key}: {e}");
                false
            }
        }
    }

    /// LISTs the object by name and stores what came back.
    pub(super) fn list_and_store<T: Object>(
        &self,
        key: &ObjectKey,
    ) -> Result<ListOutcome, ApiError> {
        let listed = self.fetcher.list::<T>(&key.namespace, &key.name)?;
        if listed.item.is_none() {
            log::debug!("{key}: does not exist");
        }
        let stored = self.store(key, listed.item.as_ref());
        Ok(ListOutcome {
            resource_version: listed.resource_version,
            settled: stored && listed.item.as_ref().is_some_and(T::is_immutable),
        })
    }

    fn watch_once<T: Object>(&self, key: &ObjectKey, rv: &mut String, ctl: &Control) -> WatchEnd {
        let base = self.watch_timeout.as_secs().max(1);
        let timeout = base + random() % (base + 1);
        let started = Instant::now();
        let stream = match self
            .fetcher
            .watch::<T>(&key.namespace, &key.name, rv, timeout)
        {
            Ok(s) => s,
            Err(e) if e.is_gone() => return WatchEnd::Gone,
            Err(error) => {
                return WatchEnd::Failed {
                    error,
                    healthy: false,
                }
            }
        };
        let mut events = 0usize;
        for item in stream {
            if ctl.stop_requested() {
                return WatchEnd::Stopped;
            }
            let event = match item {
                Ok(ev) => ev,
                Err(e) if e.is_gone() => return WatchEnd::Gone,
                Err(error) => {
                    return WatchEnd::Failed {
                        error,
                        healthy: events > 0,
                    }
                }
            };
            events += 1;
            match event {
                WatchEvent::Added(o) | WatchEvent::Modified(o) => {
                    if let Some(v) = &o.metadata().resource_version {
                        rv.clone_from(v);
                    }
                    if self.store(key, Some(&o)) && o.is_immutable() {
                        return WatchEnd::Settled;
                    }
                }
                WatchEvent::Deleted(o) => {
                    if let Some(v) = &o.metadata().resource_version {
                        rv.clone_from(v);
                    }
                    self.store::<T>(key, None);
                }
                WatchEvent::Bookmark {
                    resource_version, ..
                } => *rv = resource_version,
                WatchEvent::ErrorStatus(s) if s.code == Some(410) => return WatchEnd::Gone,
                WatchEvent::ErrorStatus(s) => {
                    let error = ApiError::Status {
                        method: "GET",
                        path: super::fetch::watch_path::<T>(&key.namespace, &key.name, rv, timeout),
                        code: s.code.and_then(|c| u16::try_from(c).ok()).unwrap_or(0),
                        reason: s.reason.unwrap_or_default(),
                        message: s.message.unwrap_or_default(),
                    };
                    return WatchEnd::Failed {
                        error,
                        healthy: events > 1,
                    };
                }
                WatchEvent::ErrorOther(_) => {
                    let error = ApiError::Decode {
                        method: "GET",
                        path: super::fetch::watch_path::<T>(&key.namespace, &key.name, rv, timeout),
                        message: "ERROR watch event without a Status".into(),
                    };
                    return WatchEnd::Failed {
                        error,
                        healthy: events > 1,
                    };
                }
            }
        }
        if events == 0 && started.elapsed() < MIN_WATCH {
            let error = ApiError::Transport {
                method: "GET",
                path: super::fetch::watch_path::<T>(&key.namespace, &key.name, rv, timeout),
                message: "watch ended at once without an event".into(),
            };
            return WatchEnd::Failed {
                error,
                healthy: false,
            };
        }
        WatchEnd::Ended
    }
}

enum Phase {
    Listing,
    Watching(String),
}

/// Follows `key` until `ctl` says stop or the object turns out immutable.
pub(super) fn run<F: ObjectFetcher, T: Object>(follow: &Follow<F>, key: &ObjectKey, ctl: &Control) {
    let mut phase = Phase::Listing;
    let mut streak = Streak::default();
    // A 410 right after a relist (no healthy watch between) is a failure, not a
    // reason to relist again at once.
    let mut relisted_for_gone = false;
    while let Some(relist) = ctl.next_turn() {
        if relist {
            phase = Phase::Listing;
        }
        let failure = match &mut phase {
            Phase::Listing => match follow.list_and_store::<T>(key) {
                Ok(listed) if listed.settled => {
                    log::debug!("{key}: immutable; no need to watch it");
                    ctl.settle();
                    return;
                }
                Ok(listed) => {
                    streak.succeed(key);
                    phase = Phase::Watching(listed.resource_version);
                    None
                }
                Err(e) => Some(e),
            },
            Phase::Watching(rv) => match follow.watch_once::<T>(key, rv, ctl) {
                WatchEnd::Ended => {
                    relisted_for_gone = false;
                    streak.succeed(key);
                    None
                }
                WatchEnd::Stopped => None,
                WatchEnd::Settled => {
                    ctl.settle();
                    return;
                }
                WatchEnd::Gone if !relisted_for_gone => {
                    log::info!("{key}: resourceVersion {rv} expired; relisting");
                    relisted_for_gone = true;
                    phase = Phase::Listing;
                    None
                }
                WatchEnd::Gone => {
                    let error = ApiError::Status {
                        method: "GET",
                        path: super::fetch::watch_path::<T>(&key.namespace, &key.name, rv, 0),
                        code: 410,
                        reason: "Expired".into(),
                        message: "resourceVersion from a fresh list expired at once".into(),
                    };
                    phase = Phase::Listing;
                    Some(error)
                }
                WatchEnd::Failed { error, healthy } => {
                    if healthy {
                        relisted_for_gone = false;
                        streak.succeed(key);
                    }
                    Some(error)
                }
            },
        };
        if let Some(error) = failure {
            let delay = streak.fail(key, &error, &follow.backoff);
            ctl.sleep(delay);
        }
    }
}

#[cfg(test)]
#[path = "watcher_tests.rs"]
mod tests;
