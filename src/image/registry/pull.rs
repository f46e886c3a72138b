//! One image pull: resolve the reference (mirrors that may resolve first, then the
//! upstream), pick the node's platform from an index, fetch config and layers (mirrors
//! that may serve content first), at most N layer downloads at once across all pulls,
//! unpack each layer as it lands, then record the image and its tag in one transaction.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, PoisonError};
use std::time::{Duration, Instant};

use super::super::digest::sha256_hex;
use super::super::import::{parse_config, Pending, JSON_LIMIT};
use super::super::platform::{self, Descriptor, Platform};
use super::super::reference::Reference;
use super::super::{ImageRecord, ImageStore};
use super::auth::{Session, TokenCache};
use super::blob::{self, Fetched};
use super::hosts::{Endpoint, RegistryHosts};
use super::http::{status_error, Http};
use super::keyring::Keyring;
use super::manifest::{self, Parsed};
use super::reachability::Unreachable;
use super::{Progress, ProgressFn, RegistryError};
use crate::image::ImageError;

const MAX_INDEX_DEPTH: usize = 4;

/// A counting semaphore: at most `n` holders at once.
pub(crate) struct Slots {
    free: Mutex<usize>,
    cv: Condvar,
}

pub(crate) struct Slot<'a>(&'a Slots);

impl Slots {
    pub(crate) fn new(n: usize) -> Slots {
        Slots {
            free: Mutex::new(n.max(1)),
            cv: Condvar::new(),
        }
    }

    pub(crate) fn acquire(&self) -> Slot<'_> {
        let mut free = self.free.lock().unwrap_or_else(PoisonError::into_inner);
        while *free == 0 {
            free = self.cv.wait(free).unwrap_or_else(PoisonError::into_inner);
        }
        *free -= 1;
        Slot(self)
    }
}

impl Drop for Slot<'_> {
    fn drop(&mut self) {
        *self.0.free.lock().unwrap_or_else(PoisonError::into_inner) += 1;
        self.0.cv.notify_one();
    }
}

/// The registry client: endpoints, connections, tokens and the layer download limit,
/// shared by every pull of the process.
pub struct Registry {
    hosts: RegistryHosts,
    http: Http,
    tokens: TokenCache,
    layer_slots: Slots,
    /// What recent pulls found out of reach: a pod whose pull would only wait for
    /// the same timeouts fails at once instead.
    unreachable: Unreachable,
}

/// What one pull is asked to do.
pub struct PullOptions {
    /// The platform to pick from an index (the node's by default).
    pub platform: Platform,
    /// Pod pull secrets first, then the node's credentials.
    pub keyring: Keyring,
    pub progress: Option<Arc<ProgressFn>>,
    /// Set to stop the pull at the next chunk.
    pub cancel: Arc<AtomicBool>,
}

impl PullOptions {
    pub fn new(keyring: Keyring) -> PullOptions {
        PullOptions {
            platform: Platform::host(),
            keyring,
            progress: None,
            cancel: Arc::new(AtomicBool::new(false)),
        }
    }
}

/// A finished pull.
#[derive(Debug, Clone)]
pub struct PullResult {
    pub record: ImageRecord,
    /// Bytes downloaded now (resumed and present blobs not counted).
    pub downloaded: u64,
    pub duration: Duration,
}

/// Tells the progress callback which manifest and layers a pull settled on.
fn announce(opts: &PullOptions, normalized: &str, resolved: &Resolved) {
    if let Some(p) = &opts.progress {
        p(Progress::Resolved {
            reference: normalized.to_owned(),
            manifest: resolved.manifest_digest.clone(),
            layers: resolved
                .layers
                .iter()
                .map(|l| (l.digest.clone(), l.size))
                .collect(),
        });
    }
}

/// A pull of an image already complete in the store: every layer is cached, and only
/// the name is recorded.
fn retag(
    images: &ImageStore,
    existing: ImageRecord,
    normalized: String,
    resolved: &Resolved,
    opts: &PullOptions,
    started: Instant,
) -> Result<PullResult, RegistryError> {
    if let Some(p) = &opts.progress {
        for l in &resolved.layers {
            p(Progress::LayerDone {
                digest: l.digest.clone(),
                cached: true,
            });
        }
    }
    let pending = Pending {
        names: vec![normalized],
        manifest_digest: existing.manifest_digest.clone(),
        config_digest: existing.config_digest.clone(),
        layers: existing.layers.clone(),
        diff_ids: Vec::new(),
        size: existing.size,
    };
    let record = images.record_pulled(pending)?;
    Ok(PullResult {
        record,
        downloaded: 0,
        duration: started.elapsed(),
    })
}

/// The manifest a pull settled on, and where it came from.
struct Resolved {
    manifest_digest: String,
    manifest: Vec<u8>,
    config: Descriptor,
    layers: Vec<Descriptor>,
}

impl Registry {
    /// `max_layer_downloads` bounds concurrent layer downloads across all pulls.
    pub fn new(hosts: RegistryHosts, max_layer_downloads: usize) -> Registry {
        Registry {
            hosts,
            http: Http::new(),
            tokens: TokenCache::default(),
            layer_slots: Slots::new(max_layer_downloads),
            unreachable: Unreachable::default(),
        }
    }

    /// The error of a recent pull that found the registry host of `reference`, or its
    /// repository, out of reach, while that is recent enough to be believed.
    pub fn recently_unreachable(&self, reference: &str) -> Option<RegistryError> {
        let parsed = Reference::parse(reference).ok()?;
        self.unreachable.recently(&parsed)
    }

    /// Pulls `reference` into `images`. Blocking; the caller's thread does the work
    /// and up to N layer threads help it.
    pub fn pull(
        &self,
        images: &ImageStore,
        reference: &str,
        opts: &PullOptions,
    ) -> Result<PullResult, RegistryError> {
        let parsed = Reference::parse(reference)?;
        let result = self.pull_parsed(images, &parsed, opts);
        self.unreachable.note(&parsed, result.as_ref().err());
        result
    }

    fn pull_parsed(
        &self,
        images: &ImageStore,
        parsed: &Reference,
        opts: &PullOptions,
    ) -> Result<PullResult, RegistryError> {
        let parsed = parsed.clone();
        let started = Instant::now();
        let normalized = parsed.to_string();
        let endpoints = self.hosts.endpoints(&parsed.domain)?;
        let resolved = self.resolve(&endpoints, &parsed, &normalized, opts)?;
        announce(opts, &normalized, &resolved);
        // Already here (an `Always` pull of an unchanged tag): only the tag is recorded.
        if let Some(existing) = images.complete(&resolved.manifest_digest)? {
            return retag(images, existing, normalized, &resolved, opts, started);
        }
        let mut fetched_small = Vec::new();
        let result = (|| {
            let diff_ids = self.manifest_and_config(
                images,
                &endpoints,
                &parsed,
                &resolved,
                opts,
                &mut fetched_small,
            )?;
            if diff_ids.len() != resolved.layers.len() {
                return Err(RegistryError::Invalid {
                    what: format!("image {normalized}"),
                    reason: format!(
                        "{} layers but {} diff ids in config {}",
                        resolved.layers.len(),
                        diff_ids.len(),
                        resolved.config.digest
                    ),
                });
            }
            let downloaded = self.layers(
                &endpoints,
                &parsed,
                images,
                &resolved.layers,
                &diff_ids,
                opts,
            )?;
            let size = resolved.manifest.len() as u64
                + resolved.config.size
                + resolved.layers.iter().map(|l| l.size).sum::<u64>();
            let pending = Pending {
                names: vec![normalized.clone()],
                manifest_digest: resolved.manifest_digest.clone(),
                config_digest: resolved.config.digest.clone(),
                layers: resolved.layers.iter().map(|l| l.digest.clone()).collect(),
                diff_ids,
                size,
            };
            let record = images.record_pulled(pending)?;
            Ok(PullResult {
                record,
                downloaded,
                duration: started.elapsed(),
            })
        })();
        if result.is_err() {
            let layers: Vec<String> = resolved.layers.iter().map(|l| l.digest.clone()).collect();
            images.abandon(&layers, &fetched_small);
        }
        result
    }

    /// Stores the manifest as it was served and the config as fetched; returns the
    /// config's diff ids. What was not in the store before goes into `fetched`.
    fn manifest_and_config(
        &self,
        images: &ImageStore,
        endpoints: &[Endpoint],
        parsed: &Reference,
        resolved: &Resolved,
        opts: &PullOptions,
        fetched: &mut Vec<String>,
    ) -> Result<Vec<String>, RegistryError> {
        let content = images.content();
        // The manifest goes in as it was served: its digest is what names the image.
        let known = content.has_blob(&resolved.manifest_digest)?;
        content.write_blob(
            &mut resolved.manifest.as_slice(),
            &format!("manifest {}", resolved.manifest_digest),
            super::super::digest::Expect {
                digest: Some(&resolved.manifest_digest),
                size: Some(resolved.manifest.len() as u64),
            },
        )?;
        if !known {
            fetched.push(resolved.manifest_digest.clone());
        }
        let config = self.small_blob(endpoints, parsed, &resolved.config, opts)?;
        if !content.has_blob(&resolved.config.digest)? {
            fetched.push(resolved.config.digest.clone());
        }
        content.write_blob(
            &mut config.as_slice(),
            &format!("config {}", resolved.config.digest),
            super::super::digest::Expect {
                digest: Some(&resolved.config.digest),
                size: Some(resolved.config.size),
            },
        )?;
        Ok(parse_config(&config, &resolved.config.digest)?)
    }

    fn credentials(
        &self,
        ep: &Endpoint,
        repository: &str,
        opts: &PullOptions,
    ) -> Vec<super::Credential> {
        opts.keyring.lookup(&ep.host, repository)
    }

    fn session<'a>(
        &'a self,
        ep: &'a Endpoint,
        parsed: &Reference,
        opts: &PullOptions,
    ) -> Session<'a> {
        let creds = self.credentials(ep, &parsed.path, opts);
        Session::new(&self.http, &self.tokens, ep, &parsed.path, creds)
    }

    /// Runs `op` against each endpoint that `usable` admits, in order, until one
    /// succeeds. Errors name every endpoint tried.
    fn each<T>(
        &self,
        endpoints: &[Endpoint],
        usable: impl Fn(&Endpoint) -> bool,
        mut op: impl FnMut(&Endpoint) -> Result<T, RegistryError>,
    ) -> Result<T, RegistryError> {
        let mut errors: Vec<RegistryError> = Vec::new();
        for ep in endpoints.iter().filter(|e| usable(e)) {
            match op(ep) {
                Ok(v) => {
                    if !errors.is_empty() {
                        log::info!(
                            "{}: served after {} endpoint(s) failed",
                            ep.base,
                            errors.len()
                        );
                    }
                    return Ok(v);
                }
                Err(e) if e.try_next_endpoint() => {
                    if ep.mirror {
                        log::warn!("mirror {}: {e}; trying the next endpoint", ep.base);
                    }
                    errors.push(e);
                }
                Err(e) => return Err(e),
            }
        }
        if errors.len() <= 1 {
            return Err(errors.pop().unwrap_or(RegistryError::Config {
                reason: "no endpoint may serve this request".into(),
            }));
        }
        let unreachable = errors.iter().all(RegistryError::is_unreachable);
        let hosts_down: Option<Vec<String>> =
            errors.iter().map(RegistryError::host_unreachable).collect();
        Err(RegistryError::AllEndpoints {
            errors: errors.iter().map(|e| crate::error_chain(e)).collect(),
            unreachable,
            hosts_down: hosts_down.map(|h| h.join("; ")),
        })
    }

    /// The platform manifest for the reference.
    fn resolve(
        &self,
        endpoints: &[Endpoint],
        parsed: &Reference,
        normalized: &str,
        opts: &PullOptions,
    ) -> Result<Resolved, RegistryError> {
        let (by, usable): (String, fn(&Endpoint) -> bool) = match (&parsed.digest, &parsed.tag) {
            (Some(d), _) => (d.clone(), |e| e.pull),
            (None, Some(t)) => (t.clone(), |e| e.resolve),
            (None, None) => ("latest".into(), |e| e.resolve),
        };
        let (digest, bytes, content_type) =
            self.each(endpoints, usable, |ep| self.manifest(ep, parsed, &by, opts))?;
        let mut digest = digest;
        let mut bytes = bytes;
        let mut content_type = content_type;
        for _ in 0..MAX_INDEX_DEPTH {
            let what = format!("{normalized} manifest {digest}");
            match manifest::parse(&bytes, content_type.as_deref(), normalized, &what)? {
                Parsed::Manifest { config, layers } => {
                    return Ok(Resolved {
                        manifest_digest: digest,
                        manifest: bytes,
                        config,
                        layers,
                    })
                }
                Parsed::Index(entries) => {
                    let pick = platform::choose(&entries, &opts.platform).ok_or_else(|| {
                        RegistryError::Image(ImageError::NoMatchingPlatform {
                            what: format!("{normalized} (index {digest})"),
                            wanted: opts.platform.to_string(),
                            available: platform::describe(&entries),
                        })
                    })?;
                    let want = pick.digest.clone();
                    log::debug!("{normalized}: {} is {want}", opts.platform);
                    let (d, b, c) = self.each(
                        endpoints,
                        |e| e.pull,
                        |ep| self.manifest(ep, parsed, &want, opts),
                    )?;
                    digest = d;
                    bytes = b;
                    content_type = c;
                }
            }
        }
        Err(RegistryError::Invalid {
            what: normalized.to_string(),
            reason: format!("image indexes nested deeper than {MAX_INDEX_DEPTH}"),
        })
    }

    /// GETs a manifest by tag or digest: (its digest, its bytes, its content type). A
    /// digest asked for is checked; a tag's digest is the served bytes' (and must match
    /// `Docker-Content-Digest` when the registry sends it).
    fn manifest(
        &self,
        ep: &Endpoint,
        parsed: &Reference,
        by: &str,
        opts: &PullOptions,
    ) -> Result<(String, Vec<u8>, Option<String>), RegistryError> {
        let mut session = self.session(ep, parsed, opts);
        let path = format!("/v2/{}/manifests/{by}", parsed.path);
        let url = format!("{}{path}", ep.base);
        let response = retry(|| {
            session.get(
                &path,
                vec![("Accept", manifest::ACCEPT.to_string())],
                Some(Duration::from_secs(60)),
            )
        })?;
        if response.status().as_u16() != 200 {
            return Err(status_error("GET", &url, response));
        }
        let header = |name: &str| {
            response
                .headers()
                .get(name)
                .and_then(|v| v.to_str().ok())
                .map(str::to_string)
        };
        let content_type = header("content-type");
        let served_digest = header("docker-content-digest");
        let (_, mut body) = response.into_parts();
        let bytes = body
            .with_config()
            .limit(JSON_LIMIT)
            .read_to_vec()
            .map_err(|e| match e {
                ureq::Error::BodyExceedsLimit(n) => RegistryError::Invalid {
                    what: url.clone(),
                    reason: format!("manifest larger than {n} bytes"),
                },
                e => super::http::transport(&url, e),
            })?;
        let digest = sha256_hex(&bytes);
        let expected = if super::super::reference::is_digest(by) {
            Some(by.to_string())
        } else {
            served_digest.filter(|d| d.starts_with("sha256:"))
        };
        if let Some(want) = expected {
            if want != digest {
                return Err(ImageError::DigestMismatch {
                    what: format!("manifest from {url}"),
                    expected: want,
                    actual: digest,
                }
                .into());
            }
        }
        Ok((digest, bytes, content_type))
    }

    /// A config blob, read whole (bounded) and verified.
    fn small_blob(
        &self,
        endpoints: &[Endpoint],
        parsed: &Reference,
        desc: &Descriptor,
        opts: &PullOptions,
    ) -> Result<Vec<u8>, RegistryError> {
        if desc.size > JSON_LIMIT {
            return Err(ImageError::TooLarge {
                what: format!("config {}", desc.digest),
                limit: JSON_LIMIT,
            }
            .into());
        }
        super::super::digest::hex_of(&desc.digest)?;
        self.each(
            endpoints,
            |e| e.pull,
            |ep| {
                let mut session = self.session(ep, parsed, opts);
                let path = format!("/v2/{}/blobs/{}", parsed.path, desc.digest);
                let url = format!("{}{path}", ep.base);
                let response =
                    retry(|| session.get(&path, Vec::new(), Some(Duration::from_secs(60))))?;
                if response.status().as_u16() != 200 {
                    return Err(status_error("GET", &url, response));
                }
                let (_, mut body) = response.into_parts();
                let bytes = body
                    .with_config()
                    .limit(JSON_LIMIT)
                    .read_to_vec()
                    .map_err(|e| super::http::transport(&url, e))?;
                let digest = sha256_hex(&bytes);
                super::super::digest::verify(
                    &format!("config from {url}"),
                    &desc.digest,
                    desc.size,
                    &digest,
                    bytes.len() as u64,
                )?;
                Ok(bytes)
            },
        )
    }

    /// Every layer into the store and unpacked; returns the bytes downloaded.
    fn layers(
        &self,
        endpoints: &[Endpoint],
        parsed: &Reference,
        images: &ImageStore,
        layers: &[Descriptor],
        diff_ids: &[String],
        opts: &PullOptions,
    ) -> Result<u64, RegistryError> {
        let next = AtomicUsize::new(0);
        let failed: Mutex<Option<RegistryError>> = Mutex::new(None);
        let downloaded = std::sync::atomic::AtomicU64::new(0);
        // Threads beyond the global limit would only wait; one more than it keeps the
        // pipeline full while one layer unpacks.
        let threads = layers.len().clamp(1, 4);
        std::thread::scope(|scope| {
            for _ in 0..threads {
                scope.spawn(|| loop {
                    if opts.cancel.load(Ordering::Relaxed) {
                        return;
                    }
                    let i = next.fetch_add(1, Ordering::SeqCst);
                    let Some(layer) = layers.get(i) else { return };
                    match self.layer(endpoints, parsed, images, layer, diff_ids.get(i), opts) {
                        Ok(n) => {
                            downloaded.fetch_add(n, Ordering::Relaxed);
                        }
                        Err(e) => {
                            opts.cancel.store(true, Ordering::Relaxed);
                            let mut f = failed.lock().unwrap_or_else(PoisonError::into_inner);
                            // The first real failure, not a cancellation it caused.
                            if f.is_none() {
                                *f = Some(e);
                            }
                            return;
                        }
                    }
                });
            }
        });
        if let Some(e) = failed.into_inner().unwrap_or_else(PoisonError::into_inner) {
            return Err(e);
        }
        Ok(downloaded.into_inner())
    }

    fn layer(
        &self,
        endpoints: &[Endpoint],
        parsed: &Reference,
        images: &ImageStore,
        layer: &Descriptor,
        diff_id: Option<&String>,
        opts: &PullOptions,
    ) -> Result<u64, RegistryError> {
        let content = images.content();
        let fetched = if content.has_blob(&layer.digest)? {
            Fetched::Present
        } else {
            let _slot = self.layer_slots.acquire();
            let progress = opts.progress.clone();
            let digest = layer.digest.clone();
            let total = layer.size;
            let mut last = Instant::now() - Duration::from_secs(1);
            let mut report = move |done: u64| {
                if let Some(p) = &progress {
                    // A line or a bar redraw per 64 KiB is too much; a few per second do.
                    if done == total || last.elapsed() >= Duration::from_millis(200) {
                        last = Instant::now();
                        p(Progress::Layer {
                            digest: digest.clone(),
                            done,
                            total,
                        });
                    }
                }
            };
            self.each(
                endpoints,
                |e| e.pull,
                |ep| {
                    let mut session = self.session(ep, parsed, opts);
                    blob::fetch(
                        &mut session,
                        content,
                        &layer.digest,
                        layer.size,
                        &mut report,
                        &opts.cancel,
                    )
                },
            )?
        };
        content.ensure_unpacked(&layer.digest, diff_id.map(String::as_str))?;
        if let Some(p) = &opts.progress {
            p(Progress::LayerDone {
                digest: layer.digest.clone(),
                cached: fetched == Fetched::Present,
            });
        }
        Ok(match fetched {
            Fetched::Present => 0,
            Fetched::Downloaded { resumed_from } => layer.size - resumed_from.min(layer.size),
        })
    }
}

/// Tries a request again on a transient failure: three tries, jittered pauses.
fn retry<T>(mut op: impl FnMut() -> Result<T, RegistryError>) -> Result<T, RegistryError> {
    let pause = crate::backoff::Backoff {
        initial: Duration::from_millis(500),
        max: Duration::from_secs(4),
    };
    let mut tries = 0;
    loop {
        match op() {
            Err(e) if e.is_retryable() && tries < 2 => {
                tries += 1;
                let wait = pause.jittered(tries, crate::backoff::random());
                log::debug!("{e}; trying again in {wait:?}");
                std::thread::sleep(wait);
            }
            other => return other,
        }
    }
}

/// Pulls `reference` with a registry client made for this one pull (the CLI's case).
pub fn pull(
    hosts: RegistryHosts,
    max_layer_downloads: usize,
    images: &ImageStore,
    reference: &str,
    opts: &PullOptions,
) -> Result<PullResult, RegistryError> {
    Registry::new(hosts, max_layer_downloads).pull(images, reference, opts)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::TempDir;

    #[test]
    fn a_registry_out_of_reach_is_not_tried_again_at_once() {
        let tmp = TempDir::new("pull-unreachable");
        let store = crate::store::Store::open(&tmp.0.join("db")).expect("store");
        let images = ImageStore::open(&tmp.0, &store).expect("images");
        // Nothing listens on port 1 of the loopback: refused at once.
        let registry = Registry::new(RegistryHosts::default(), 2);
        let reference = "127.0.0.1:1/app:1";
        assert!(registry.recently_unreachable(reference).is_none());
        let e = registry
            .pull(&images, reference, &PullOptions::new(Keyring::default()))
            .expect_err("refused");
        assert!(e.is_unreachable(), "{e}");
        let again = registry
            .recently_unreachable(reference)
            .expect("remembered");
        assert!(again.is_unreachable());
        assert!(again.to_string().contains("not tried again"), "{again}");
        // Another registry is not affected.
        assert!(registry.recently_unreachable("127.0.0.1:2/app:1").is_none());
    }
}
