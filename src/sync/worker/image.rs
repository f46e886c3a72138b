//! A container's image before it starts, with the kubelet's semantics: `imagePullPolicy`
//! Always / IfNotPresent / Never (`:latest` or no tag defaults to Always), a pull on the
//! image service's thread that never holds up the worker (it is woken when the pull
//! ends), the waiting reasons ContainerCreating while it is in progress, ErrImagePull
//! then ImagePullBackOff with the registry's error in the message, the pull back-off per image (10 s doubling to 5 min), and the
//! kubelet's Pulling / Pulled / Failed / BackOff events. With the registry out of reach
//! an image that is here runs in place of an `Always` pull, with a warning, unless the
//! node is configured otherwise.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::Container;
use tokio::time::Instant;

use super::super::record::{ContainerRecord, Waiting};
use super::{blocking, Worker};
use crate::image::registry::{Job, Keyring, PullDone, PullFailure, PullRequest, Puller};
use crate::image::{Platform, Reference};
use crate::runtime::ResolvedImage;
use crate::uplink::report::EventType;

/// How soon after a failed pull the status turns from ErrImagePull to
/// ImagePullBackOff, as the kubelet's next pod sync does.
const BACKOFF_SHOWN_AFTER: Duration = Duration::from_secs(1);

/// How long a first pull waits for pull secrets the pod names that are not cached yet
/// (they change the worker's pod as they arrive); then it goes ahead without them, as
/// the kubelet does with a secret that does not exist.
const SECRET_WAIT: Duration = Duration::from_secs(10);

/// One image's pulls for this pod (the kubelet keys its pull back-off by pod and image).
#[derive(Default)]
pub(super) struct ImagePulls {
    job: Option<(Arc<Job>, Instant)>,
    failures: u32,
    retry_at: Option<Instant>,
    /// `ErrImagePull: <message>` of the last failure, for the back-off message.
    last_error: Option<String>,
    last_unreachable: bool,
    /// The back-off period for which BackOff was told.
    told: Option<u32>,
    /// The offline fallback was announced for this failure streak.
    fallback_told: bool,
    /// When a pull was first wanted, for the wait for pull secrets.
    first_wanted: Option<Instant>,
}

/// The kubelet's default when the pod does not say (the apiserver and the static pod
/// source normally fill it in).
fn default_policy(image: &str) -> &'static str {
    match Reference::parse(image) {
        Ok(r) if r.digest.is_some() => "IfNotPresent",
        Ok(r) if r.tag.as_deref() != Some("latest") => "IfNotPresent",
        _ => "Always",
    }
}

/// A duration as Go prints one truncated to milliseconds (`1.234s`, `850ms`, `1m2.5s`).
fn go_ms(d: Duration) -> String {
    let ms = d.as_millis();
    if ms < 1000 {
        return format!("{ms}ms");
    }
    let secs = (ms / 1000) as u64;
    let frac = ms % 1000;
    let frac = if frac == 0 {
        String::new()
    } else {
        format!(".{}", format!("{frac:03}").trim_end_matches('0'))
    };
    if secs < 60 {
        format!("{secs}{frac}s")
    } else if secs < 3600 {
        format!("{}m{}{frac}s", secs / 60, secs % 60)
    } else {
        format!(
            "{}h{}m{}{frac}s",
            secs / 3600,
            (secs % 3600) / 60,
            secs % 60
        )
    }
}

impl Worker {
    /// The image to start `c` from, or None with `rec` waiting (pulling, ErrImagePull,
    /// ImagePullBackOff, ErrImageNeverPull, ...) until a later sync.
    pub(super) async fn ensure_image(
        &mut self,
        c: &Container,
        rec: &mut ContainerRecord,
    ) -> Option<ResolvedImage> {
        let image_ref = c.image.clone().unwrap_or_default();
        let policy = c
            .image_pull_policy
            .clone()
            .unwrap_or_else(|| default_policy(&image_ref).to_string());
        let present = match self.present_image(c, &image_ref).await {
            Ok(p) => p,
            Err(waiting) => {
                rec.waiting = Some(waiting);
                return None;
            }
        };
        // A pull this worker asked for comes first: its outcome is told whatever the
        // policy would decide now that the image may be here.
        let in_flight = self
            .pulls
            .get(&image_ref)
            .and_then(|s| s.job.as_ref())
            .is_some();
        let must_pull = in_flight
            || match policy.as_str() {
                "Never" => false,
                "IfNotPresent" => present.is_none(),
                _ => true,
            };
        if !must_pull {
            return self.without_pull(c, &image_ref, present, rec);
        }
        let Some(puller) = self.deps.puller.clone() else {
            // No registry access configured for this agent: what is here is all there is.
            if let Some(image) = present {
                return Some(image);
            }
            rec.waiting = Some(Waiting {
                reason: "ErrImagePull".into(),
                message: Some(format!(
                    "image {image_ref} is not present and this node does not pull images"
                )),
            });
            return None;
        };
        let state = self.pulls.entry(image_ref.clone()).or_default();
        // A pull in flight, or one that just ended.
        if let Some((job, asked)) = state.job.clone() {
            let Some(outcome) = job.outcome() else {
                // Still pulling: ContainerCreating, as the kubelet shows it, not what
                // the last try said.
                rec.waiting = None;
                return None;
            };
            state.job = None;
            return match outcome {
                Ok(done) => self.pulled(c, &image_ref, &done, asked, rec).await,
                Err(failure) => self.pull_failed(c, &image_ref, present, &failure, rec),
            };
        }
        // In back-off after a failure.
        if let Some(at) = state.retry_at.filter(|at| Instant::now() < *at) {
            return self.backing_off(c, &image_ref, present, at, rec);
        }
        self.start_pull(c, &image_ref, &puller, rec).await;
        None
    }

    /// The image as the store has it (None when it is not here), or how the container
    /// waits when the reference is no good.
    async fn present_image(
        &self,
        c: &Container,
        image_ref: &str,
    ) -> Result<Option<ResolvedImage>, Waiting> {
        let images = self.deps.images.clone();
        let lookup = image_ref.to_string();
        blocking(move || images.resolve(&lookup))
            .await
            .map_err(|e| {
                let reason = e.kubelet_reason();
                log::error!("pod {}: container {}: {e}", self.name(), c.name);
                if reason == "InvalidImageName" {
                    let message = format!("Failed to apply default image tag {image_ref:?}: {e}");
                    self.event(c, EventType::Warning, "InspectFailed", message.clone());
                    self.event(
                        c,
                        EventType::Warning,
                        "Failed",
                        "Error: InvalidImageName".into(),
                    );
                }
                Waiting {
                    reason: reason.into(),
                    message: Some(e.to_string()),
                }
            })
    }

    /// The policy asks for no pull: the image that is here, or ErrImageNeverPull.
    fn without_pull(
        &self,
        c: &Container,
        image_ref: &str,
        present: Option<ResolvedImage>,
        rec: &mut ContainerRecord,
    ) -> Option<ResolvedImage> {
        if let Some(image) = present {
            self.event(
                c,
                EventType::Normal,
                "Pulled",
                format!("Container image \"{image_ref}\" already present on machine"),
            );
            return Some(image);
        }
        let message =
            format!("Container image \"{image_ref}\" is not present with pull policy of Never");
        self.event(c, EventType::Warning, "ErrImageNeverPull", message.clone());
        log::warn!(
            "pod {}: container {}: image {image_ref} is not present",
            self.name(),
            c.name
        );
        rec.waiting = Some(Waiting {
            reason: "ErrImageNeverPull".into(),
            message: Some(message),
        });
        None
    }

    /// A pull of this worker's succeeded: the kubelet's Pulled event, and the image.
    async fn pulled(
        &mut self,
        c: &Container,
        image_ref: &str,
        done: &PullDone,
        asked: Instant,
        rec: &mut ContainerRecord,
    ) -> Option<ResolvedImage> {
        self.pulls
            .insert(image_ref.to_string(), ImagePulls::default());
        let message = format!(
            "Successfully pulled image \"{image_ref}\" in {} ({} including waiting). Image size: {} bytes.",
            go_ms(done.pull_duration),
            go_ms(asked.elapsed()),
            done.record.size
        );
        log::info!("pod {}: {message}", self.name());
        self.event(c, EventType::Normal, "Pulled", message);
        let images = self.deps.images.clone();
        let lookup = image_ref.to_string();
        match blocking(move || images.resolve(&lookup)).await {
            Ok(Some(image)) => Some(image),
            Ok(None) => {
                // Removed between the pull and now (GC, `image rm`): pull again.
                self.wake_at(Instant::now());
                None
            }
            Err(e) => {
                rec.waiting = Some(Waiting {
                    reason: e.kubelet_reason().into(),
                    message: Some(e.to_string()),
                });
                None
            }
        }
    }

    /// A pull of this worker's failed: ErrImagePull and the back-off, or the offline
    /// fallback when the registry was out of reach and the image is here.
    fn pull_failed(
        &mut self,
        c: &Container,
        image_ref: &str,
        present: Option<ResolvedImage>,
        failure: &PullFailure,
        rec: &mut ContainerRecord,
    ) -> Option<ResolvedImage> {
        let now = Instant::now();
        let state = self.pulls.entry(image_ref.to_string()).or_default();
        state.failures = state.failures.saturating_add(1);
        let delay = self.deps.pull_backoff.delay(state.failures);
        state.retry_at = Some(now + delay);
        state.last_unreachable = failure.unreachable;
        let message = format!("failed to pull image \"{image_ref}\": {}", failure.message);
        state.last_error = Some(format!("ErrImagePull: {message}"));
        state.told = None;
        if let Some(image) = present.filter(|_| failure.unreachable && self.deps.offline_fallback) {
            return Some(self.fall_back(c, image_ref, image, &failure.message));
        }
        log::warn!("pod {}: container {}: {message}", self.name(), c.name);
        self.event(
            c,
            EventType::Warning,
            "Failed",
            format!("Failed to pull image \"{image_ref}\": {}", failure.message),
        );
        self.event(
            c,
            EventType::Warning,
            "Failed",
            "Error: ErrImagePull".into(),
        );
        rec.waiting = Some(Waiting {
            reason: "ErrImagePull".into(),
            message: Some(message),
        });
        self.wake_at(now + BACKOFF_SHOWN_AFTER.min(delay));
        None
    }

    /// Until `at`, the next try waits: ImagePullBackOff, told once per failure; or,
    /// offline, the image that is here.
    fn backing_off(
        &mut self,
        c: &Container,
        image_ref: &str,
        present: Option<ResolvedImage>,
        at: Instant,
        rec: &mut ContainerRecord,
    ) -> Option<ResolvedImage> {
        let offline_fallback = self.deps.offline_fallback;
        let state = self.pulls.entry(image_ref.to_string()).or_default();
        if let Some(image) = present.filter(|_| state.last_unreachable && offline_fallback) {
            // Offline: the image that is here keeps serving until the next try.
            return Some(image);
        }
        let failures = state.failures;
        let told = state.told == Some(failures);
        state.told = Some(failures);
        let back_off = format!("Back-off pulling image \"{image_ref}\"");
        let message = match &state.last_error {
            Some(e) => format!("{back_off}: {e}"),
            None => back_off.clone(),
        };
        if !told {
            self.event(c, EventType::Normal, "BackOff", back_off);
            self.event(
                c,
                EventType::Warning,
                "Failed",
                "Error: ImagePullBackOff".into(),
            );
        }
        rec.waiting = Some(Waiting {
            reason: "ImagePullBackOff".into(),
            message: Some(message),
        });
        self.wake_at(at);
        None
    }

    /// Starts a pull (the worker is woken when it ends), unless a pull secret the pod
    /// names has not arrived yet (a new pod's secrets are fetched as it arrives):
    /// pulling without it would only fail.
    async fn start_pull(
        &mut self,
        c: &Container,
        image_ref: &str,
        puller: &Puller,
        rec: &mut ContainerRecord,
    ) {
        let now = Instant::now();
        let state = self.pulls.entry(image_ref.to_string()).or_default();
        let first_wanted = *state.first_wanted.get_or_insert(now);
        let (keyring, missing) = self.pull_secrets_keyring().await;
        if missing > 0 && now < first_wanted + SECRET_WAIT {
            log::debug!(
                "pod {}: waiting up to {SECRET_WAIT:?} for {missing} pull secret(s)",
                self.name()
            );
            self.wake_at(first_wanted + SECRET_WAIT);
            return;
        }
        let notify = self.pull_notify.clone();
        let job = puller.pull(
            PullRequest {
                reference: image_ref.to_string(),
                platform: Platform::host(),
                keyring,
                progress: None,
            },
            move || notify.notify_one(),
        );
        if let Some(state) = self.pulls.get_mut(image_ref) {
            state.job = Some((job, now));
        }
        // The back-off (or error) of the last try is over: this one is in progress.
        rec.waiting = None;
        log::info!("pod {}: pulling image {image_ref}", self.name());
        self.event(
            c,
            EventType::Normal,
            "Pulling",
            format!("Pulling image \"{image_ref}\""),
        );
    }

    /// The registry is out of reach and the image is here: it runs, with a warning.
    fn fall_back(
        &mut self,
        c: &Container,
        image_ref: &str,
        image: ResolvedImage,
        error: &str,
    ) -> ResolvedImage {
        let first = self
            .pulls
            .get_mut(image_ref)
            .map(|s| !std::mem::replace(&mut s.fallback_told, true))
            .unwrap_or(true);
        if first {
            let message = format!(
                "Failed to pull image \"{image_ref}\": {error}; the registry cannot be reached, \
                 so the image present on this node ({}) is used",
                image.image_id
            );
            log::warn!("pod {}: {message}", self.name());
            self.event(c, EventType::Warning, "PullOfflineFallback", message);
        }
        image
    }

    /// The pod's pull secrets from the store's copy (there after a reboot with no
    /// uplink), and how many of those it names are not there. One that cannot be read
    /// is skipped with a warning naming it.
    async fn pull_secrets_keyring(&self) -> (Keyring, usize) {
        let objects = self.deps.objects.clone();
        let pod = self.pod.clone();
        blocking(move || {
            let named: std::collections::BTreeSet<&str> = pod
                .spec
                .iter()
                .flat_map(|s| s.image_pull_secrets.iter().flatten())
                .map(|r| r.name.as_str())
                .filter(|n| !n.is_empty())
                .collect();
            let secrets = objects.pull_secrets(&pod);
            let missing = named.len().saturating_sub(secrets.len());
            let mut keyring = Keyring::default();
            for secret in secrets {
                match Keyring::from_secret(&secret) {
                    Ok(k) => keyring.extend(k),
                    Err(e) => log::warn!("{e}; pulling without it"),
                }
            }
            (keyring, missing)
        })
        .await
    }

    /// Records that a container started from the image now (for GC's order).
    pub(super) async fn image_used(&self, image_id: &str) {
        let images = self.deps.images.clone();
        let id = image_id.to_string();
        let marked = blocking(move || images.mark_used(&id, crate::time::now())).await;
        if let Err(e) = marked {
            log::warn!("image {image_id}: record its use: {e}");
        }
    }

    fn event(&self, c: &Container, type_: EventType, reason: &'static str, message: String) {
        self.deps
            .reporter
            .event(&self.pod, Some(&c.name), type_, reason, message);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn go_durations_truncated_to_milliseconds() {
        assert_eq!(go_ms(Duration::from_micros(850_400)), "850ms");
        assert_eq!(go_ms(Duration::from_millis(1234)), "1.234s");
        assert_eq!(go_ms(Duration::from_millis(1200)), "1.2s");
        assert_eq!(go_ms(Duration::from_secs(2)), "2s");
        assert_eq!(go_ms(Duration::from_millis(62_500)), "1m2.5s");
    }

    #[test]
    fn latest_and_untagged_default_to_always() {
        assert_eq!(default_policy("busybox"), "Always");
        assert_eq!(default_policy("busybox:latest"), "Always");
        assert_eq!(default_policy("busybox:1.36"), "IfNotPresent");
        assert_eq!(default_policy("reg:5000/x"), "Always");
        let digest = format!("busybox@sha256:{}", "a".repeat(64));
        assert_eq!(default_policy(&digest), "IfNotPresent");
    }
}
