//! The api source's loop, an explicit state machine as client-go's reflector and
//! kube-runtime's watcher are: `Listing` (every page) → `Watching { resource_version }`;
//! a stream that ends or breaks resumes `Watching` from the last resourceVersion seen,
//! and only a 410 goes back to `Listing`. A source resumed from the store starts in
//! `Watching` at the stored resourceVersion.
//!
//! With a [`Link`], a failure that means the apiserver cannot be reached marks the
//! link down and the loop waits for the link to come back and the outbox to drain
//! (`Drained`) before it lists or watches again: the node controller alone probes.

use std::sync::mpsc::RecvTimeoutError;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Pod;
use tokio::sync::mpsc::Sender;

use super::lister::PodLister;
use super::pods::PodSet;
use super::{ApiSourceError, ApiSourceOptions, ApiSourceResume, Clock};
use crate::kube::reflect::{self, Change, Ended, Failures, ListError};
use crate::kube::{Link, Stage};
use crate::pod::annotations::SOURCE_API;
use crate::source::SourceSnapshot;

/// client-go's reflector asks for watches of 5 to 10 minutes, at random, so that many
/// clients do not reconnect in step.
const MIN_WATCH_TIMEOUT_SECS: u64 = 300;
/// A watch that ends sooner than this without an event is treated as a failure (as
/// client-go does), so a proxy that cuts streams at once does not cause a busy loop.
const MIN_HEALTHY_WATCH: Duration = Duration::from_secs(1);
/// How often a waiting loop looks up to see whether anyone still listens.
const MAX_WAIT: Duration = Duration::from_secs(1);
/// A LIST longer than this is not a node's pods (500 each); give up and retry.
const MAX_PAGES: usize = 64;

enum State {
    Listing,
    Watching { resource_version: String },
}

/// How one watch stream ended.
enum End {
    /// The server closed it (its `timeoutSeconds`): watch again at once.
    Ended,
    /// 410: the resourceVersion is too old.
    Gone(ApiSourceError),
    Broken(ApiSourceError),
    /// Nobody listens any more.
    Stopped,
}

pub(super) struct Reflector<L, C> {
    lister: L,
    node_name: String,
    options: ApiSourceOptions,
    clock: C,
    tx: Sender<SourceSnapshot>,
    pods: PodSet,
    /// The highest resourceVersion seen, from lists, events and bookmarks; a LIST
    /// below it comes from a stale cache.
    highest_rv: u64,
    failures: Failures,
    sent_at: Option<Instant>,
    /// An empty LIST came while pods ran; the next LIST decides.
    confirm_empty: bool,
    /// The resourceVersion the set is at, sent with each snapshot.
    rv: Option<String>,
    link: Option<Link>,
    /// Where to start: a stored resourceVersion to watch from.
    resume_from: Option<String>,
    tap: Option<super::PodTap>,
}

impl<L: PodLister, C: Clock> Reflector<L, C> {
    pub(super) fn new(
        lister: L,
        node_name: String,
        options: ApiSourceOptions,
        resume: ApiSourceResume,
        clock: C,
        tx: Sender<SourceSnapshot>,
    ) -> Self {
        let mut pods = PodSet::default();
        let resume_from = resume.resource_version.filter(|rv| !rv.is_empty());
        let highest_rv = resume_from
            .as_deref()
            .and_then(|rv| rv.parse::<u64>().ok())
            .unwrap_or(0);
        if resume_from.is_some() {
            pods.seed(resume.pods);
        }
        Reflector {
            lister,
            node_name,
            options,
            clock,
            tx,
            pods,
            highest_rv,
            failures: Failures::new("api pod source"),
            sent_at: None,
            confirm_empty: false,
            rv: resume_from.clone(),
            link: resume.link,
            resume_from,
            tap: resume.tap,
        }
    }

    pub(super) fn run(mut self) {
        let mut state = match self.resume_from.take() {
            Some(resource_version) => {
                log::info!(
                    "api pod source: {} pod(s) from the store; resuming the watch at resourceVersion {resource_version}",
                    self.pods.len()
                );
                if !self.send() {
                    return;
                }
                State::Watching { resource_version }
            }
            None => State::Listing,
        };
        while !self.tx.is_closed() {
            if let Some(link) = &self.link {
                // Down: the node controller probes; then the outbox drains first.
                let tx = &self.tx;
                if !link.wait_until(Stage::Drained, &|| tx.is_closed()) {
                    return;
                }
            }
            state = match state {
                State::Listing => match self.list() {
                    Ok(resource_version) => {
                        if !self.failures.relisted_for_gone {
                            self.failures.succeeded();
                        }
                        if !self.send() {
                            return;
                        }
                        State::Watching { resource_version }
                    }
                    Err(e) => {
                        self.failed(&e);
                        State::Listing
                    }
                },
                State::Watching {
                    mut resource_version,
                } => match self.watch(&mut resource_version) {
                    End::Ended => State::Watching { resource_version },
                    End::Broken(e) => {
                        self.failed(&e);
                        State::Watching { resource_version }
                    }
                    End::Gone(e) => {
                        log::info!("api pod source: {e}; listing again");
                        if self.failures.relisted_for_gone {
                            self.failed(&e);
                        }
                        self.failures.relisted_for_gone = true;
                        State::Listing
                    }
                    End::Stopped => return,
                },
            };
        }
    }

    /// Every page of the node's pods (a 410 on a continue page starts the list
    /// again, once); refused when it is older than what was seen, or empty while
    /// pods run until a second LIST says so too.
    fn list(&mut self) -> Result<String, ApiSourceError> {
        let (lister, node) = (&self.lister, self.node_name.as_str());
        let listed = reflect::list_pages(
            "api pod source",
            MAX_PAGES,
            |token| lister.list(node, token),
            Some,
        )
        .map_err(|e| match e {
            ListError::Api(e) => e.into(),
            ListError::TooManyPages(n) => ApiSourceError::TooManyPages(n),
        })?;
        let items = listed.items;
        let rv = listed
            .resource_version
            .ok_or(ApiSourceError::NoResourceVersion)?;
        if let Ok(listed) = rv.parse::<u64>() {
            if listed < self.highest_rv {
                return Err(ApiSourceError::StaleList {
                    listed,
                    seen: self.highest_rv,
                });
            }
            self.highest_rv = listed;
        }
        let running = if self.pods.is_listed() {
            self.pods.len()
        } else {
            self.options.known_pods
        };
        if items.is_empty() && running > 0 && !self.confirm_empty {
            // A transient fault (a cache not yet filled, a proxy answering for the
            // apiserver) must not stop a site's pods: ask again first.
            self.confirm_empty = true;
            return Err(ApiSourceError::EmptyList(running));
        }
        self.confirm_empty = false;
        self.pods.replace(items);
        self.rv = Some(rv.clone());
        self.synced();
        Ok(rv)
    }

    /// One watch from `rv`, which follows the stream's events and bookmarks.
    fn watch(&mut self, rv: &mut String) -> End {
        let timeout = MIN_WATCH_TIMEOUT_SECS + self.clock.random() % (MIN_WATCH_TIMEOUT_SECS + 1);
        let stream = match self.lister.watch(&self.node_name, rv, timeout) {
            Ok(stream) => stream,
            Err(e) if e.is_gone() => return End::Gone(e.into()),
            Err(e) => return End::Broken(e.into()),
        };
        let events = match reflect::read_ahead(stream, "source-api-watch") {
            Ok(events) => events,
            Err(e) => return End::Broken(ApiSourceError::Spawn(e)),
        };
        let opened = Instant::now();
        let mut seen = 0u64;
        loop {
            let first = match events.recv_timeout(self.wait()) {
                Ok(item) => item,
                Err(RecvTimeoutError::Timeout) => {
                    if self.tx.is_closed() {
                        return End::Stopped;
                    }
                    if self.link.as_ref().is_some_and(Link::is_down) {
                        // The link went down under this watch: its connection may be
                        // dead without a word (a cut uplink drops packets, it does not
                        // close connections), and reading on would wait out the whole
                        // timeout after the link is back. Watch again from here once
                        // the link is up and the outbox drained.
                        if !self.send() {
                            return End::Stopped;
                        }
                        return End::Ended;
                    }
                    if self.due() && !self.send() {
                        return End::Stopped;
                    }
                    continue;
                }
                Err(RecvTimeoutError::Disconnected) => {
                    if !self.send() {
                        return End::Stopped;
                    }
                    if seen == 0 && opened.elapsed() < MIN_HEALTHY_WATCH {
                        return End::Broken(ApiSourceError::ShortWatch(opened.elapsed()));
                    }
                    self.failures.healthy();
                    return End::Ended;
                }
            };
            // Take in everything already read before deciding to send.
            let mut next = Some(first);
            while let Some(item) = next {
                if let Err(end) = self.take(item, rv) {
                    return if self.send() { end } else { End::Stopped };
                }
                seen += 1;
                if seen == 1 {
                    self.failures.healthy();
                }
                next = events.try_recv().ok();
            }
            if self.due() && !self.send() {
                return End::Stopped;
            }
        }
    }

    /// Applies one watch item; an ERROR event or a broken stream ends the watch.
    fn take(&mut self, item: reflect::Item<Pod>, rv: &mut String) -> Result<(), End> {
        match reflect::sort(item) {
            Ok(Change::Upsert(pod)) => {
                self.advance(rv, pod.metadata.resource_version.as_deref());
                self.pods.upsert(pod);
            }
            Ok(Change::Delete(pod)) => {
                self.advance(rv, pod.metadata.resource_version.as_deref());
                self.pods.remove(&pod);
            }
            Ok(Change::Bookmark(to)) => self.advance(rv, Some(&to)),
            Err(ended) => {
                let gone = ended.is_gone();
                let e = match ended {
                    Ended::Status {
                        code,
                        reason,
                        message,
                    } => ApiSourceError::WatchStatus {
                        code,
                        reason,
                        message,
                    },
                    Ended::Other(raw) => ApiSourceError::WatchOther(raw),
                    Ended::Broken(e) => e.into(),
                };
                return Err(if gone { End::Gone(e) } else { End::Broken(e) });
            }
        }
        Ok(())
    }

    /// The stream moved on to `to`: the next watch starts there.
    fn advance(&mut self, rv: &mut String, to: Option<&str>) {
        self.synced();
        let Some(to) = to.filter(|v| !v.is_empty()) else {
            return;
        };
        if let Ok(n) = to.parse::<u64>() {
            self.highest_rv = self.highest_rv.max(n);
        }
        *rv = to.to_string();
        self.rv = Some(rv.clone());
    }

    fn synced(&self) {
        if let Some(link) = &self.link {
            link.synced(crate::time::now());
        }
    }

    /// How long to wait for the next event: until a held-back snapshot is due, or a
    /// while to look at whether anyone still listens.
    fn wait(&self) -> Duration {
        if !self.pods.is_dirty() {
            return MAX_WAIT;
        }
        match self.sent_at {
            Some(at) => (at + self.options.coalesce)
                .saturating_duration_since(Instant::now())
                .min(MAX_WAIT),
            None => Duration::ZERO,
        }
    }

    fn due(&self) -> bool {
        self.pods.is_dirty()
            && self
                .sent_at
                .is_none_or(|at| at.elapsed() >= self.options.coalesce)
    }

    /// Sends the set if it changed; false once nobody listens.
    fn send(&mut self) -> bool {
        let Some(mut pods) = self.pods.take_snapshot() else {
            return true;
        };
        if let Some(tap) = &self.tap {
            tap(&mut pods);
        }
        self.sent_at = Some(Instant::now());
        let snapshot = SourceSnapshot {
            source: SOURCE_API,
            pods,
            resource_version: self.rv.clone(),
        };
        self.tx.blocking_send(snapshot).is_ok()
    }

    /// Logs the trouble (once while it repeats) and waits out the back-off.
    fn failed(&mut self, e: &ApiSourceError) {
        let refused = e.is_auth().then(|| {
            format!(
                "the apiserver refuses node {}: check its credentials and that they name \
                 this node; retrying with back-off",
                self.node_name
            )
        });
        let failures = self.failures.failed(e.key(), e, refused);
        if let (Some(link), true) = (&self.link, e.is_transient()) {
            // The node controller probes a dead link; the loop waits on the link.
            link.report_down(crate::time::now());
            return;
        }
        let delay = self.options.backoff.jittered(failures, self.clock.random());
        let tx = &self.tx;
        self.clock.sleep(delay, &|| tx.is_closed());
    }
}
