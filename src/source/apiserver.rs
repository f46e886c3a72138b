//! The apiserver pod source: the pods the cluster has bound to this node, kept as the
//! kubelet's reflector keeps them (LIST, then WATCH from the list's resourceVersion),
//! and sent to the mux as full snapshots. Built for an uplink that comes and goes: a
//! broken watch resumes from the last resourceVersion seen, only a 410 relists, every
//! failure waits a jittered, growing back-off, and nothing but a complete, consistent
//! LIST or an explicit DELETED event takes a pod away.
//!
//! Pods the cluster records as finished (phase Succeeded or Failed) stay in the
//! snapshot with that phase until they are deleted: the sync loop stops what still runs
//! of them and never starts them again, as the kubelet never restarts a pod the
//! apiserver calls terminal, and keeps their logs and final status until the deletion.
//!
//! Runs on its own thread (ureq blocks); never starts containers.

#[cfg(test)]
mod fake;
mod lister;
mod pods;
mod reflector;
#[cfg(test)]
mod tests;

use std::io;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;

use tokio::sync::mpsc::Sender;

use super::SourceSnapshot;
use crate::backoff::Backoff;
use crate::kube::{ApiError, Link};

pub use lister::{list_path, watch_path, PodList, PodLister, PodWatch, LIST_LIMIT};
pub use pods::normalise;

/// How the source paces itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ApiSourceOptions {
    /// Wait after each consecutive failure: full jitter over `initial` doubling up to
    /// `max`, reset by a success.
    pub backoff: Backoff,
    /// While watch events keep coming, snapshots go out at most this often.
    pub coalesce: Duration,
    /// How many pods from this source the store holds (from before a restart): an
    /// empty first LIST must be confirmed before they are stopped.
    pub known_pods: usize,
}

impl Default for ApiSourceOptions {
    fn default() -> Self {
        ApiSourceOptions {
            backoff: Backoff {
                initial: Duration::from_secs(1),
                max: Duration::from_secs(300),
            },
            coalesce: Duration::from_millis(100),
            known_pods: 0,
        }
    }
}

/// What sees each snapshot's pods on the source's thread before the mux does, and may
/// take out those that are not the node's to run (the cluster's mirrors of its static
/// pods). Given by whoever wires the source; the source knows nothing of them.
pub type PodTap = Arc<dyn Fn(&mut Vec<Pod>) + Send + Sync>;

/// Where the source starts from, whom it follows and who sees its pods first.
#[derive(Clone, Default)]
pub struct ApiSourceResume {
    /// The uplink's link: while it is down the source waits for it (the node controller
    /// probes) instead of retrying on its own, and after a reconnect it resyncs only
    /// once the outbox is drained (`Drained`). `None`: the source paces itself.
    pub link: Option<Link>,
    /// The pods the store holds from this source, from before a restart.
    pub pods: Vec<Pod>,
    /// The resourceVersion stored with them: with one, the source starts by watching
    /// from it (no LIST), and lists only if the apiserver answers 410.
    pub resource_version: Option<String>,
    /// Sees every snapshot's pods before they are sent; `None`: all are sent.
    pub tap: Option<PodTap>,
}

/// Starts the api source on its own thread. It sends a snapshot after each successful
/// LIST and after each change a watch brings, and ends when the receiver is dropped.
/// Until the first LIST succeeds it sends nothing, so the pods the store holds from
/// before a restart keep running while the uplink is down; a source resumed from a
/// stored resourceVersion sends the stored pods once at start instead.
pub fn spawn_api_source(
    lister: impl PodLister + Send + 'static,
    node_name: String,
    options: ApiSourceOptions,
    resume: ApiSourceResume,
    tx: Sender<SourceSnapshot>,
) -> io::Result<JoinHandle<()>> {
    spawn_with_clock(lister, node_name, options, resume, SystemClock, tx)
}

fn spawn_with_clock(
    lister: impl PodLister + Send + 'static,
    node_name: String,
    options: ApiSourceOptions,
    resume: ApiSourceResume,
    clock: impl Clock + 'static,
    tx: Sender<SourceSnapshot>,
) -> io::Result<JoinHandle<()>> {
    let reflector = reflector::Reflector::new(lister, node_name, options, resume, clock, tx);
    std::thread::Builder::new()
        .name("source-api".into())
        .spawn(move || reflector.run())
}

/// Why a LIST or WATCH did not give what the source needs.
#[derive(Debug, thiserror::Error)]
pub enum ApiSourceError {
    #[error(transparent)]
    Api(#[from] ApiError),
    /// An ERROR event in the watch stream.
    #[error("watch error event: {code} {reason}: {message}")]
    WatchStatus {
        code: u16,
        reason: String,
        message: String,
    },
    #[error("watch error event without a status: {0}")]
    WatchOther(String),
    /// A LIST older than what this source already saw: a lagging apiserver or cache.
    #[error("list at resourceVersion {listed} is older than resourceVersion {seen} already seen (a stale cache); keeping the pods as they are")]
    StaleList { listed: u64, seen: u64 },
    /// A LIST with no pods while pods from the cluster run: believed only when the
    /// next LIST says the same.
    #[error("list came back empty while {0} pod(s) from the cluster run; listing once more before stopping them")]
    EmptyList(usize),
    #[error("list response has no resourceVersion")]
    NoResourceVersion,
    #[error("list still not complete after {0} pages")]
    TooManyPages(usize),
    /// Ended at once without a single event: likely a proxy cutting the stream.
    #[error("watch ended after {0:?} without an event")]
    ShortWatch(Duration),
    #[error("start the watch reader thread: {0}")]
    Spawn(#[source] io::Error),
}

impl ApiSourceError {
    /// 410 Gone / Expired: the resourceVersion is too old, only a new LIST helps.
    pub fn is_gone(&self) -> bool {
        match self {
            ApiSourceError::Api(e) => e.is_gone(),
            ApiSourceError::WatchStatus { code, .. } => *code == 410,
            _ => false,
        }
    }

    /// The apiserver could not be reached or is overloaded: the link is down (as
    /// opposed to the apiserver answering something the source must act on).
    pub fn is_transient(&self) -> bool {
        match self {
            ApiSourceError::Api(e) => e.is_transient(),
            ApiSourceError::WatchStatus { code, .. } => *code == 429 || *code >= 500,
            _ => false,
        }
    }

    /// 401 or 403: the credentials are refused or lack the right.
    pub fn is_auth(&self) -> bool {
        matches!(self, ApiSourceError::Api(e) if e.is_unauthorized() || e.is_forbidden())
    }

    /// What stays the same while the same trouble repeats (paths carry changing
    /// resourceVersions and timeouts), so it is logged once, not on every retry.
    fn key(&self) -> String {
        match self {
            ApiSourceError::Api(ApiError::Status {
                code,
                reason,
                message,
                ..
            }) => format!("{code} {reason} {message}"),
            ApiSourceError::Api(
                ApiError::Transport { message, .. } | ApiError::Decode { message, .. },
            ) => message.clone(),
            ApiSourceError::StaleList { .. } => "stale list".into(),
            ApiSourceError::ShortWatch(_) => "short watch".into(),
            other => other.to_string(),
        }
    }
}

/// Sleeping and chance, injected so tests neither sleep nor guess.
trait Clock: Send {
    /// Waits `duration`, or less once `stop` returns true.
    fn sleep(&mut self, duration: Duration, stop: &dyn Fn() -> bool);
    fn random(&mut self) -> u64;
}

struct SystemClock;

/// How often a long back-off looks up to see whether anyone still listens.
const STOP_CHECK: Duration = Duration::from_secs(1);

impl Clock for SystemClock {
    fn sleep(&mut self, duration: Duration, stop: &dyn Fn() -> bool) {
        let until = std::time::Instant::now() + duration;
        loop {
            let left = until.saturating_duration_since(std::time::Instant::now());
            if left.is_zero() || stop() {
                return;
            }
            std::thread::sleep(left.min(STOP_CHECK));
        }
    }

    fn random(&mut self) -> u64 {
        use std::hash::{BuildHasher, Hasher};
        // std seeds every RandomState from the OS and varies it per call: enough
        // randomness for jitter without a crate.
        let mut h = std::collections::hash_map::RandomState::new().build_hasher();
        h.write_u128(
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap_or_default()
                .as_nanos(),
        );
        h.finish()
    }
}
