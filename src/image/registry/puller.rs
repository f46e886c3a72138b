//! The agent's pulls: each on a thread of its own, so a pod worker never waits on the
//! network; one pull per image and set of credentials at a time (a second pod asking for
//! the same image joins the first pull); at most `maxParallelImagePulls` images at once
//! (one when `serializeImagePulls`, as the kubelet's default); whoever asked is woken
//! when it ends.

use std::collections::HashMap;
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use sha2::{Digest, Sha256};

use super::super::{ImageRecord, ImageStore, Platform};
use super::keyring::Keyring;
use super::pull::{PullOptions, Registry, Slots};
use super::ProgressFn;

/// What a pull needs from its caller.
pub struct PullRequest {
    /// The image as the pod names it.
    pub reference: String,
    pub platform: Platform,
    /// The pod's pull secrets (or the CLI's `--creds`); the node's come after them.
    pub keyring: Keyring,
    pub progress: Option<Arc<ProgressFn>>,
}

/// A pull that succeeded.
#[derive(Debug, Clone)]
pub struct PullDone {
    pub record: ImageRecord,
    /// Time spent pulling, from the moment it was let start.
    pub pull_duration: Duration,
    pub downloaded: u64,
}

/// A pull that failed, in words fit for a pod's status.
#[derive(Debug, Clone)]
pub struct PullFailure {
    pub message: String,
    /// The registry was not reached (the uplink is down).
    pub unreachable: bool,
}

type Outcome = Result<PullDone, PullFailure>;
type Waker = Box<dyn FnOnce() + Send>;

/// One pull in flight or finished. Callers keep it and read [`Job::outcome`] when woken.
pub struct Job {
    state: Mutex<(Option<Outcome>, Vec<Waker>)>,
    pub requested_at: Instant,
}

impl Job {
    /// The result once the pull has ended.
    pub fn outcome(&self) -> Option<Result<PullDone, PullFailure>> {
        self.state
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .0
            .clone()
    }

    fn add_waker(&self, wake: Waker) {
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        if state.0.is_some() {
            drop(state);
            wake();
        } else {
            state.1.push(wake);
        }
    }

    fn finish(&self, outcome: Outcome) {
        let wakers = {
            let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
            state.0 = Some(outcome);
            std::mem::take(&mut state.1)
        };
        for w in wakers {
            w();
        }
    }
}

/// The pull service. Cheap to clone.
#[derive(Clone)]
pub struct Puller {
    inner: Arc<Inner>,
}

struct Inner {
    images: Arc<ImageStore>,
    registry: Registry,
    pulls: Slots,
    jobs: Mutex<HashMap<String, Arc<Job>>>,
    /// Called after every successful pull (image GC looks at the disk then).
    after_pull: Mutex<Option<Box<dyn Fn() + Send + Sync>>>,
    /// The node's credentials, read again for every pull (the file may change).
    node_credentials: Box<dyn Fn() -> Keyring + Send + Sync>,
}

impl Puller {
    /// `max_pulls` images at once, `registry` shared by all of them; every pull also
    /// gets what `node_credentials` returns, after the request's own credentials.
    pub fn new(
        images: Arc<ImageStore>,
        registry: Registry,
        max_pulls: usize,
        node_credentials: impl Fn() -> Keyring + Send + Sync + 'static,
    ) -> Puller {
        Puller {
            inner: Arc::new(Inner {
                images,
                registry,
                pulls: Slots::new(max_pulls),
                jobs: Mutex::new(HashMap::new()),
                after_pull: Mutex::new(None),
                node_credentials: Box::new(node_credentials),
            }),
        }
    }

    /// Runs `f` after each successful pull.
    pub fn on_pulled(&self, f: impl Fn() + Send + Sync + 'static) {
        *self
            .inner
            .after_pull
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = Some(Box::new(f));
    }

    pub fn images(&self) -> &Arc<ImageStore> {
        &self.inner.images
    }

    /// Starts a pull of `req` (or joins the one in flight for the same image and
    /// credentials) and returns at once; `wake` is called when it ends.
    pub fn pull(&self, req: PullRequest, wake: impl FnOnce() + Send + 'static) -> Arc<Job> {
        let key = job_key(&req);
        let mut jobs = self
            .inner
            .jobs
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if let Some(job) = jobs.get(&key) {
            job.add_waker(Box::new(wake));
            return job.clone();
        }
        let job = Arc::new(Job {
            state: Mutex::new((None, vec![Box::new(wake)])),
            requested_at: Instant::now(),
        });
        jobs.insert(key.clone(), job.clone());
        drop(jobs);
        let inner = self.inner.clone();
        let running = job.clone();
        let spawned = std::thread::Builder::new()
            .name("image-pull".into())
            .spawn(move || {
                let outcome = if let Some(e) = inner.registry.recently_unreachable(&req.reference) {
                    // Out of reach a moment ago: fail at once rather than queue for the
                    // same timeouts again.
                    Err(PullFailure {
                        message: e.to_string(),
                        unreachable: true,
                    })
                } else {
                    let _slot = inner.pulls.acquire();
                    let started = Instant::now();
                    let mut keyring = req.keyring;
                    keyring.extend((inner.node_credentials)());
                    let opts = PullOptions {
                        platform: req.platform,
                        keyring,
                        progress: req.progress,
                        cancel: Arc::new(AtomicBool::new(false)),
                    };
                    let found = match inner.registry.recently_unreachable(&req.reference) {
                        Some(e) => Err(e),
                        None => inner.registry.pull(&inner.images, &req.reference, &opts),
                    };
                    match found {
                        Ok(r) => {
                            let pull_duration = started.elapsed();
                            crate::metrics::IMAGE_PULL_BYTES.add(r.downloaded);
                            crate::metrics::IMAGE_PULL_DURATION.observe(pull_duration);
                            Ok(PullDone {
                                record: r.record,
                                pull_duration,
                                downloaded: r.downloaded,
                            })
                        }
                        Err(e) => Err(PullFailure {
                            message: crate::error_chain(&e),
                            unreachable: e.is_unreachable(),
                        }),
                    }
                };
                let ok = outcome.is_ok();
                // Gone from the map before the wakers run: a caller woken by a failure
                // that asks again starts a fresh pull rather than joining this one.
                inner
                    .jobs
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .remove(&key);
                running.finish(outcome);
                if ok {
                    if let Some(f) = inner
                        .after_pull
                        .lock()
                        .unwrap_or_else(PoisonError::into_inner)
                        .as_ref()
                    {
                        f();
                    }
                }
            });
        if let Err(e) = spawned {
            self.inner
                .jobs
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .retain(|_, j| !Arc::ptr_eq(j, &job));
            job.finish(Err(PullFailure {
                message: format!("start a pull thread: {e}"),
                unreachable: false,
            }));
        }
        job
    }
}

/// Pulls of one image with different credentials are different pulls: one pod's secret
/// must not serve another's pull, nor a wrong one spoil it.
fn job_key(req: &PullRequest) -> String {
    let mut h = Sha256::new();
    h.update(req.reference.as_bytes());
    h.update([0]);
    h.update(req.platform.to_string().as_bytes());
    h.update([0]);
    h.update(format!("{:?}", req.keyring).as_bytes());
    for c in req.keyring.all() {
        h.update(c.password.as_bytes());
        h.update([0]);
    }
    super::super::digest::hex(&h.finalize())
}
