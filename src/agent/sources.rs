//! agent::sources: the pod sources and the mux that merges them. The file source starts
//! at once and decides the first desired state; the URL source starts beside it and
//! leaves the pods the store holds from it standing until the URL answers; the api source starts with the cluster
//! link's client, resumes from what the store kept of it, and sends straight to the mux
//! (its pods pass the uplink's tap on the way). The mux runs on a blocking thread per
//! snapshot and hands the sync loop its changes.
//!
//! Wiring only: what a source or the mux does is the source module's.

use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use tokio::sync::mpsc;

use super::cluster::Cluster;
use crate::config::Config;
use crate::kube::connect::SharedClient;
use crate::kube::Link;
use crate::pod::annotations::SOURCE_HTTP;
use crate::source::{self, Mux, PodChange, PodTap, SourceSnapshot};
use crate::store::Store;
use crate::Error;

/// The sources' snapshots in flight to the mux.
const SNAPSHOTS: usize = 8;
/// The mux's changes in flight to the sync loop.
const CHANGES: usize = 64;

/// The mux with the sources that feed it.
pub struct Sources {
    mux: Mux,
    /// What the sync loop starts from.
    pub initial: Vec<PodChange>,
    tx: mpsc::Sender<SourceSnapshot>,
    rx: mpsc::Receiver<SourceSnapshot>,
}

/// Opens the mux on the store and starts the file source.
pub fn open(config: &Config, store: &Store) -> Result<Sources, Error> {
    let (mut mux, mut initial) = Mux::open(store)?;
    let (tx, rx) = mpsc::channel(SNAPSHOTS);
    let (_, first_files) = source::spawn_file_source(
        config.static_pod_path.clone(),
        config.node_name.clone(),
        config.file_check_frequency,
        mux.source_pods(crate::pod::annotations::SOURCE_FILE),
        tx.clone(),
    )
    .map_err(|source| Error::Io {
        context: "start the file pod source".into(),
        source,
    })?;
    // The manifest folder is here and now: the pods to start are what it holds, not what
    // the store held (a manifest removed while the agent was down, or one whose rename a
    // power cut undid, is not started once before it is stopped). The URL's and the api
    // source's pods stay as stored until their servers speak.
    if let Some(first) = first_files {
        mux.apply(first)?;
        initial = mux.desired();
    }
    if start_url(config, &mut mux, &tx)? {
        initial = mux.desired();
    }
    Ok(Sources {
        mux,
        initial,
        tx,
        rx,
    })
}

/// Starts the URL source when a URL is set. With none, the pods the store holds from
/// one set before have no source left to remove them: they go now. True when that
/// changed the desired pods.
fn start_url(
    config: &Config,
    mux: &mut Mux,
    tx: &mpsc::Sender<SourceSnapshot>,
) -> Result<bool, Error> {
    let Some(url) = config.static_pod_url.clone() else {
        let gone = mux.apply(SourceSnapshot {
            source: SOURCE_HTTP,
            pods: Vec::new(),
            resource_version: None,
        })?;
        return Ok(!gone.is_empty());
    };
    let known = mux.source_pods(SOURCE_HTTP);
    source::spawn_http_source(url, config.node_name.clone(), known, tx.clone())?;
    Ok(false)
}

impl Sources {
    /// Starts the api source, once `cluster`'s client is made, on a thread that waits
    /// for it: pods the cluster binds to this node join the file source's.
    pub fn start_api(&self, config: &Config, cluster: &mut Cluster) {
        let api = ApiSource {
            node_name: config.node_name.clone(),
            pods: self.mux.source_pods(crate::pod::annotations::SOURCE_API),
            resource_version: self
                .mux
                .resource_version(crate::pod::annotations::SOURCE_API),
            link: cluster.view.link.clone(),
            tap: cluster
                .api_pods_tap()
                .map(|tap| -> PodTap { Arc::new(tap) }),
            tx: self.tx.clone(),
        };
        let client = cluster.client.clone();
        let stop = cluster.stop();
        let spawned = std::thread::Builder::new()
            .name("source-api-start".into())
            .spawn(move || api.start(client, &stop));
        if let Err(e) = spawned {
            log::error!("uplink: cannot start the pod source: {e}");
        }
    }

    /// Runs the mux on the sources' snapshots; returns the changes for the sync loop and
    /// what it starts from.
    pub fn run_mux(self) -> (Vec<PodChange>, mpsc::Receiver<PodChange>) {
        let Sources {
            mut mux,
            initial,
            tx,
            mut rx,
        } = self;
        // The sources hold their own senders; this one would keep the mux waiting.
        drop(tx);
        let (change_tx, change_rx) = mpsc::channel(CHANGES);
        tokio::spawn(async move {
            while let Some(snapshot) = rx.recv().await {
                let applied = tokio::task::spawn_blocking(move || {
                    let r = mux.apply(snapshot);
                    (mux, r)
                })
                .await;
                let result = match applied {
                    Ok((back, result)) => {
                        mux = back;
                        result
                    }
                    Err(e) => {
                        log::error!("pod source mux stopped: {e}");
                        return;
                    }
                };
                match result {
                    Ok(changes) => {
                        for c in changes {
                            if change_tx.send(c).await.is_err() {
                                return;
                            }
                        }
                    }
                    Err(e) => log::error!("pod sources: {e}"),
                }
            }
        });
        (initial, change_rx)
    }
}

/// The api pod source before its client is made: what the store kept of it (its pods
/// and where they were, so that it resumes its watch there after a restart), the link
/// it follows, and the mux it sends to.
struct ApiSource {
    node_name: String,
    pods: Vec<k8s_openapi::api::core::v1::Pod>,
    resource_version: Option<String>,
    link: Link,
    tap: Option<PodTap>,
    tx: mpsc::Sender<SourceSnapshot>,
}

impl ApiSource {
    /// Waits for the client, then starts the source on it.
    fn start(self, client: SharedClient, stop: &AtomicBool) {
        let Some(client) = client.wait(stop) else {
            return;
        };
        let options = source::ApiSourceOptions {
            known_pods: self.pods.len(),
            ..source::ApiSourceOptions::default()
        };
        let resume = source::ApiSourceResume {
            link: Some(self.link),
            pods: self.pods,
            resource_version: self.resource_version,
            tap: self.tap,
        };
        if let Err(e) = source::spawn_api_source(client, self.node_name, options, resume, self.tx) {
            log::error!("uplink: cannot start the pod source: {e}");
        }
    }
}
