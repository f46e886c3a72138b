//! The static pod URL source (the kubelet's `staticPodURL`): the URL fetched every
//! `httpCheckFrequency` on a thread of its own, its answer sent to the mux as the full
//! set of source `http` whenever it reads cleanly. A fetch that fails, an answer other
//! than 200 and an answer refused keep the set last sent, which the mux holds in the
//! store: a device restarted while the server is away runs the pods it last had, and a
//! pod goes only when the server answers without it.

use std::collections::HashMap;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Pod;
use sha2::{Digest, Sha256};
use tokio::sync::mpsc::Sender;

use super::http_fetch::Fetcher;
use super::http_pods::pods_from_body;
use super::static_pod::set_seen;
use super::{SourceError, SourceSnapshot};
use crate::config::StaticPodUrl;
use crate::pod::annotations::{CONFIG_SEEN, SOURCE_HTTP};
use crate::time::Timestamp;

/// How often the thread looks up from its wait to see whether anyone still listens.
const MAX_WAIT: Duration = Duration::from_secs(1);

/// Starts the URL source on its own thread, which fetches at once and then every
/// period, and ends when the receiver is dropped. `known` are the pods the store holds
/// from this source: they stand until the URL answers.
pub fn spawn_http_source(
    settings: StaticPodUrl,
    node_name: String,
    known: Vec<Pod>,
    tx: Sender<SourceSnapshot>,
) -> Result<JoinHandle<()>, SourceError> {
    let fetcher = Fetcher::new(settings.url.clone(), settings.headers).map_err(|reason| {
        SourceError::Url {
            url: settings.url.clone(),
            reason,
        }
    })?;
    let mut source = UrlSource::new(settings.url, node_name);
    source.remember(known);
    let period = settings.check_frequency;
    std::thread::Builder::new()
        .name("source-http".into())
        .spawn(move || run(fetcher, source, period, tx))
        .map_err(|source| SourceError::Io {
            context: "start the static pod URL source".into(),
            source,
        })
}

/// What the source remembers between fetches.
struct UrlSource {
    url: String,
    node_name: String,
    /// The digest of the last answer read, with why it was refused if it was: an
    /// answer that did not change is not decoded again.
    last_body: Option<([u8; 32], Option<String>)>,
    /// How many pods the set last sent (or found in the store) holds.
    kept: usize,
    /// The last failure said, so that each is logged once while it lasts.
    last_error: Option<String>,
    /// When each pod UID was first seen, so `config.seen` stays put.
    first_seen: HashMap<String, Timestamp>,
}

impl UrlSource {
    fn new(url: String, node_name: String) -> UrlSource {
        UrlSource {
            url,
            node_name,
            last_body: None,
            kept: 0,
            last_error: None,
            first_seen: HashMap::new(),
        }
    }

    fn remember(&mut self, known: Vec<Pod>) {
        self.kept = known.len();
        for pod in known {
            let seen = pod
                .metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get(CONFIG_SEEN))
                .and_then(|s| s.parse::<Timestamp>().ok());
            if let (Some(uid), Some(seen)) = (pod.metadata.uid, seen) {
                self.first_seen.insert(uid, seen);
            }
        }
    }

    /// What a fetch gave: the snapshot to send when the answer changed and reads
    /// cleanly; a failure is logged (once while it lasts) and sends nothing.
    fn take(&mut self, fetched: Result<Vec<u8>, String>) -> Option<SourceSnapshot> {
        let body = match fetched {
            Ok(body) => body,
            Err(reason) => {
                self.fail(reason);
                return None;
            }
        };
        let digest: [u8; 32] = Sha256::digest(&body).into();
        if let Some((last, refused)) = &self.last_body {
            if *last == digest {
                match refused.clone() {
                    Some(reason) => self.fail(reason),
                    None => self.recovered(),
                }
                return None;
            }
        }
        match pods_from_body(&body, &self.url, &self.node_name) {
            Ok(mut pods) => {
                self.last_body = Some((digest, None));
                self.recovered();
                self.stamp_seen(&mut pods);
                self.kept = pods.len();
                log::info!("static pod URL {}: read {} pod(s)", self.url, pods.len());
                Some(SourceSnapshot {
                    source: SOURCE_HTTP,
                    pods,
                    resource_version: None,
                })
            }
            Err(reason) => {
                let reason = format!("answer refused: {reason}");
                self.last_body = Some((digest, Some(reason.clone())));
                self.fail(reason);
                None
            }
        }
    }

    fn stamp_seen(&mut self, pods: &mut [Pod]) {
        let now = crate::time::now();
        let uids: Vec<String> = pods
            .iter()
            .map(|p| p.metadata.uid.clone().unwrap_or_default())
            .collect();
        self.first_seen.retain(|uid, _| uids.contains(uid));
        for (pod, uid) in pods.iter_mut().zip(uids) {
            let seen = *self.first_seen.entry(uid).or_insert(now);
            set_seen(pod, seen);
        }
    }

    fn fail(&mut self, reason: String) {
        if self.last_error.as_ref() != Some(&reason) {
            let e = SourceError::Url {
                url: self.url.clone(),
                reason: format!("{reason}; keeping the {} pod(s) it gave before", self.kept),
            };
            log::error!("{e}");
            self.last_error = Some(reason);
        }
    }

    fn recovered(&mut self) {
        if self.last_error.take().is_some() {
            log::info!("static pod URL {}: read again", self.url);
        }
    }
}

fn run(fetcher: Fetcher, mut source: UrlSource, period: Duration, tx: Sender<SourceSnapshot>) {
    loop {
        if tx.is_closed() {
            return;
        }
        let next = Instant::now() + period;
        if let Some(snapshot) = source.take(fetcher.fetch()) {
            if tx.blocking_send(snapshot).is_err() {
                return;
            }
        }
        // Decoding a list of pods goes tens of KiB deep; between fetches this thread
        // holds only the frames of its wait.
        crate::malloc::release_unused_stack();
        loop {
            let left = next.saturating_duration_since(Instant::now());
            if left.is_zero() || tx.is_closed() {
                break;
            }
            std::thread::sleep(left.min(MAX_WAIT));
        }
    }
}
