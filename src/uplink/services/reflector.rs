//! The Service reflector: an explicit state machine as client-go's reflector and
//! kube-runtime's watcher are, `Listing` (every page) → `Watching(resourceVersion)`; a
//! watch that ends or breaks resumes from the last resourceVersion seen, and only a 410
//! goes back to `Listing`. Each LIST replaces the kept Services in one transaction;
//! each event changes one.
//!
//! With a [`Link`], a failure that means the apiserver cannot be reached marks the link
//! down, and the loop waits for the link to come back and the outbox to drain before it
//! lists or watches again, as the pod source does: the node controller alone probes.

use std::io;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::RecvTimeoutError;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Service;
use tokio::sync::mpsc;

use super::cache::{kept, ServiceCache};
use super::lister::{watch_path, ServiceLister};
use crate::backoff::Backoff;
use crate::kube::reflect::{self, Change, Ended, Failures, ListError};
use crate::kube::{ApiError, Link, Stage};
use crate::store::StoreError;

/// A watch that ends sooner than this without an event is a failure (as in client-go),
/// so a proxy that cuts streams at once does not cause a busy loop.
const MIN_HEALTHY_WATCH: Duration = Duration::from_secs(1);
/// How often a waiting loop looks up to see whether it should stop or the link fell.
const MAX_WAIT: Duration = Duration::from_secs(1);
/// A LIST longer than this (500 each) is not a cluster this agent can keep: give up
/// and retry.
const MAX_PAGES: usize = 128;

/// How the reflector talks to the apiserver.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ServiceReflectorOptions {
    /// Retry delays after a failed LIST or WATCH while the link is up (full jitter).
    pub backoff: Backoff,
    /// A watch's `timeoutSeconds` is drawn from `[watch_timeout, 2 * watch_timeout]`:
    /// 30 minutes, as for the ConfigMaps and Secrets, so that the one watch costs a
    /// request or two an hour and many nodes do not renew theirs together.
    pub watch_timeout: Duration,
}

impl Default for ServiceReflectorOptions {
    fn default() -> Self {
        ServiceReflectorOptions {
            backoff: Backoff {
                initial: Duration::from_millis(800),
                max: Duration::from_secs(30),
            },
            watch_timeout: Duration::from_secs(1800),
        }
    }
}

/// Keeps `cache` the cluster's Services until `stop` is set.
pub struct ServiceReflector<L> {
    pub lister: L,
    pub cache: ServiceCache,
    pub link: Option<Link>,
    pub stop: Arc<AtomicBool>,
    /// Told once, when the first LIST of this run is stored: containers that waited
    /// for it can start.
    pub read: Option<mpsc::Sender<()>>,
    pub options: ServiceReflectorOptions,
}

/// Why a LIST or WATCH did not give what the reflector needs.
#[derive(Debug, thiserror::Error)]
enum Trouble {
    #[error(transparent)]
    Api(#[from] ApiError),
    #[error("store the services: {0}")]
    Store(#[from] StoreError),
}

impl Trouble {
    fn is_transient(&self) -> bool {
        matches!(self, Trouble::Api(e) if e.is_transient())
    }

    fn is_auth(&self) -> bool {
        matches!(self, Trouble::Api(e) if e.is_forbidden() || e.is_unauthorized())
    }

    /// What stays the same while the same trouble repeats (paths carry changing
    /// resourceVersions), so it is logged once.
    fn key(&self) -> String {
        match self {
            Trouble::Api(ApiError::Status {
                code,
                reason,
                message,
                ..
            }) => format!("{code} {reason} {message}"),
            Trouble::Api(ApiError::Transport { message, .. })
            | Trouble::Api(ApiError::Decode { message, .. }) => message.clone(),
            Trouble::Store(e) => e.to_string(),
        }
    }
}

enum State {
    Listing,
    Watching(String),
}

/// How one watch ended.
enum End {
    /// The server closed it, or the link fell under it: watch again from here.
    Ended,
    /// 410: the resourceVersion is too old.
    Gone(ApiError),
    Broken(ApiError),
    Stopped,
}

impl<L: ServiceLister> ServiceReflector<L> {
    /// Runs the reflector on a thread of its own.
    pub fn spawn(self) -> io::Result<JoinHandle<()>> {
        std::thread::Builder::new()
            .name("uplink-services".into())
            .spawn(move || self.run())
    }

    /// Runs until `stop` is set.
    pub fn run(self) {
        Loop {
            r: self,
            failures: Failures::new("services"),
        }
        .run()
    }
}

struct Loop<L> {
    r: ServiceReflector<L>,
    failures: Failures,
}

impl<L: ServiceLister> Loop<L> {
    fn stopped(&self) -> bool {
        self.r.stop.load(Ordering::Relaxed)
    }

    fn run(mut self) {
        let mut state = State::Listing;
        while !self.stopped() {
            if let Some(link) = &self.r.link {
                // Down: the node controller probes; then the outbox drains first.
                let stop = &self.r.stop;
                if !link.wait_until(Stage::Drained, &|| stop.load(Ordering::Relaxed)) {
                    return;
                }
            }
            state = match state {
                State::Listing => match self.list() {
                    Ok(rv) => {
                        if !self.failures.relisted_for_gone {
                            self.failures.succeeded();
                        }
                        State::Watching(rv)
                    }
                    Err(e) => {
                        self.failed(&e);
                        State::Listing
                    }
                },
                State::Watching(mut rv) => match self.watch(&mut rv) {
                    End::Ended => State::Watching(rv),
                    End::Broken(e) => {
                        self.failed(&e.into());
                        State::Watching(rv)
                    }
                    End::Gone(e) => {
                        log::info!("services: {e}; listing again");
                        if self.failures.relisted_for_gone {
                            self.failed(&e.into());
                        }
                        self.failures.relisted_for_gone = true;
                        State::Listing
                    }
                    End::Stopped => return,
                },
            };
        }
    }

    /// Every page of the cluster's Services, stored as one list.
    fn list(&mut self) -> Result<String, Trouble> {
        let lister = &self.r.lister;
        let listed = reflect::list_pages(
            "services",
            MAX_PAGES,
            |token| lister.list(token),
            // Only what is kept is held while the pages come.
            |s| kept(&s),
        )
        .map_err(|e| match e {
            ListError::Api(e) => e,
            ListError::TooManyPages(n) => decode(&format!("list not complete after {n} pages")),
        })?;
        let rv = listed
            .resource_version
            .ok_or_else(|| decode("list without metadata.resourceVersion"))?;
        self.store_list(listed.items, &rv)?;
        Ok(rv)
    }

    fn store_list(&mut self, services: Vec<Service>, rv: &str) -> Result<(), Trouble> {
        let count = services.len();
        let changed = self.r.cache.replace(services)?;
        self.synced();
        match self.r.read.take() {
            Some(read) => {
                log::info!(
                    "services: {count} with a cluster IP read at resourceVersion {rv} \
                     ({changed} stored change(s)); containers get their variables"
                );
                let _ = read.try_send(());
            }
            None => log::debug!(
                "services: {count} read again at resourceVersion {rv} ({changed} change(s))"
            ),
        }
        Ok(())
    }

    /// One watch from `rv`, which follows the stream's events and bookmarks.
    fn watch(&mut self, rv: &mut String) -> End {
        let base = self.r.options.watch_timeout.as_secs().max(1);
        let timeout = base + crate::backoff::random() % (base + 1);
        let stream = match self.r.lister.watch(rv, timeout) {
            Ok(stream) => stream,
            Err(e) if e.is_gone() => return End::Gone(e),
            Err(e) => return End::Broken(e),
        };
        let events = match reflect::read_ahead(stream, "uplink-services-watch") {
            Ok(events) => events,
            Err(e) => return End::Broken(transport(&format!("start the watch reader: {e}"))),
        };
        let opened = Instant::now();
        let mut seen = 0u64;
        loop {
            match events.recv_timeout(MAX_WAIT) {
                Ok(item) => {
                    if let Err(end) = self.take(item, rv) {
                        return end;
                    }
                    seen += 1;
                    if seen == 1 {
                        self.failures.healthy();
                    }
                }
                Err(RecvTimeoutError::Timeout) if self.stopped() => return End::Stopped,
                // The link went down under this watch: its connection may be dead
                // without a word. Watch again from here once the link is back.
                Err(RecvTimeoutError::Timeout)
                    if self.r.link.as_ref().is_some_and(Link::is_down) =>
                {
                    return End::Ended
                }
                Err(RecvTimeoutError::Timeout) => {}
                Err(RecvTimeoutError::Disconnected) => {
                    if seen == 0 && opened.elapsed() < MIN_HEALTHY_WATCH {
                        let message =
                            format!("watch ended after {:?} without an event", opened.elapsed());
                        return End::Broken(transport(&message));
                    }
                    self.failures.healthy();
                    return End::Ended;
                }
            }
        }
    }

    /// Applies one watch item; an ERROR event or a broken stream ends the watch.
    fn take(&mut self, item: reflect::Item<Service>, rv: &mut String) -> Result<(), End> {
        match reflect::sort(item) {
            Ok(Change::Upsert(s)) => {
                self.advance(rv, s.metadata.resource_version.as_deref());
                self.stored(&s, self.r.cache.upsert(&s));
            }
            Ok(Change::Delete(s)) => {
                self.advance(rv, s.metadata.resource_version.as_deref());
                self.stored(&s, self.r.cache.remove(&s));
            }
            Ok(Change::Bookmark(to)) => self.advance(rv, Some(&to)),
            Err(ended) => {
                let gone = ended.is_gone();
                let e = match ended {
                    Ended::Status {
                        code,
                        reason,
                        message,
                    } => ApiError::Status {
                        method: "GET",
                        path: watch_path(rv, 0),
                        code,
                        reason,
                        message,
                    },
                    Ended::Other(_) => decode("ERROR watch event without a Status"),
                    Ended::Broken(e) => e,
                };
                return Err(if gone { End::Gone(e) } else { End::Broken(e) });
            }
        }
        Ok(())
    }

    fn stored(&self, service: &Service, result: Result<bool, StoreError>) {
        let meta = &service.metadata;
        let ns = meta.namespace.as_deref().unwrap_or("");
        let name = meta.name.as_deref().unwrap_or("");
        match result {
            Ok(true) => log::debug!("services: {ns}/{name} changed"),
            Ok(false) => {}
            // The next LIST puts the store right; until then the change is missing.
            Err(e) => log::error!("services: {ns}/{name}: {e}"),
        }
    }

    /// The stream moved on to `to`: the next watch starts there.
    fn advance(&self, rv: &mut String, to: Option<&str>) {
        self.synced();
        if let Some(to) = to.filter(|v| !v.is_empty()) {
            *rv = to.to_string();
        }
    }

    fn synced(&self) {
        if let Some(link) = &self.r.link {
            link.synced(crate::time::now());
        }
    }

    /// Logs the trouble (once while it repeats) and waits: on the link when it is the
    /// link's, else out the back-off.
    fn failed(&mut self, e: &Trouble) {
        let refused = e.is_auth().then(|| {
            "containers of cluster pods wait until the apiserver allows the node to list \
             and watch Services (the ClusterRole system:node does); retrying with back-off"
                .to_owned()
        });
        let failures = self.failures.failed(e.key(), e, refused);
        if let (Some(link), true) = (&self.r.link, e.is_transient()) {
            link.report_down(crate::time::now());
            return;
        }
        let delay = self
            .r
            .options
            .backoff
            .jittered(failures, crate::backoff::random());
        let until = Instant::now() + delay;
        while !self.stopped() {
            let left = until.saturating_duration_since(Instant::now());
            if left.is_zero() {
                break;
            }
            std::thread::sleep(left.min(MAX_WAIT));
        }
    }
}

fn decode(message: &str) -> ApiError {
    ApiError::Decode {
        method: "GET",
        path: "/api/v1/services".into(),
        message: message.to_string(),
    }
}

fn transport(message: &str) -> ApiError {
    ApiError::Transport {
        method: "GET",
        path: "/api/v1/services".into(),
        message: message.to_string(),
    }
}

#[cfg(test)]
#[path = "reflector_tests.rs"]
mod tests;
