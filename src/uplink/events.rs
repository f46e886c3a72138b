//! Events: core/v1 Events as the kubelet posts them, with client-go's spam filter (a
//! token bucket per pod: 25 at once, then one per five minutes) and its de-duplication
//! of repeats, so a crash-looping container cannot flood the apiserver.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Event, EventSource, ObjectReference};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};

use super::report::EventReport;
use crate::time::Timestamp;

/// client-go's EventSourceObjectSpamFilter: burst 25, refill one per 5 minutes.
const BURST: f64 = 25.0;
const REFILL_EVERY: Duration = Duration::from_secs(300);
/// An identical event (same pod, container, reason, message) inside this window is
/// not sent again.
const REPEAT_WINDOW: Duration = Duration::from_secs(600);
/// Bound on the filter's memory.
const MAX_KEYS: usize = 1024;

/// The Event the kubelet would post for `e`.
pub fn event_object(e: &EventReport, node_name: &str) -> Event {
    let at = Time(truncate_to_seconds(e.at));
    let nanos = e.at.as_nanosecond().max(0) as u128;
    Event {
        metadata: ObjectMeta {
            name: Some(format!("{}.{:x}", e.pod.name, nanos)),
            namespace: Some(e.pod.namespace.clone()),
            ..ObjectMeta::default()
        },
        involved_object: ObjectReference {
            kind: Some("Pod".into()),
            namespace: Some(e.pod.namespace.clone()),
            name: Some(e.pod.name.clone()),
            uid: Some(e.pod.uid.clone()),
            api_version: Some("v1".into()),
            field_path: e
                .container
                .as_ref()
                .map(|c| format!("spec.containers{{{c}}}")),
            ..ObjectReference::default()
        },
        reason: Some(e.reason.to_string()),
        message: Some(e.message.clone()),
        source: Some(EventSource {
            component: Some("kubelet".into()),
            host: Some(node_name.to_string()),
        }),
        first_timestamp: Some(at.clone()),
        last_timestamp: Some(at),
        count: Some(1),
        type_: Some(e.type_.as_str().to_string()),
        reporting_component: Some("kubelet".into()),
        reporting_instance: Some(node_name.to_string()),
        ..Event::default()
    }
}

fn truncate_to_seconds(t: Timestamp) -> Timestamp {
    Timestamp::from_second(t.as_second()).unwrap_or(t)
}

/// Decides which events go out.
#[derive(Default)]
pub struct SpamFilter {
    buckets: HashMap<String, (f64, Instant)>,
    recent: HashMap<
        (
            String,
            Option<String>,
            std::borrow::Cow<'static, str>,
            String,
        ),
        Instant,
    >,
}

impl SpamFilter {
    /// Whether `e` may be sent now; counts it against its pod's bucket if so.
    pub fn admit(&mut self, e: &EventReport, now: Instant) -> bool {
        let key = (
            e.pod.uid.clone(),
            e.container.clone(),
            e.reason.clone(),
            e.message.clone(),
        );
        if let Some(at) = self.recent.get(&key) {
            if now.duration_since(*at) < REPEAT_WINDOW {
                return false;
            }
        }
        let (tokens, last) = self
            .buckets
            .entry(e.pod.uid.clone())
            .or_insert((BURST, now));
        let refill = now.duration_since(*last).as_secs_f64() / REFILL_EVERY.as_secs_f64();
        *tokens = (*tokens + refill).min(BURST);
        *last = now;
        if *tokens < 1.0 {
            return false;
        }
        *tokens -= 1.0;
        if self.recent.len() >= MAX_KEYS {
            self.recent
                .retain(|_, at| now.duration_since(*at) < REPEAT_WINDOW);
        }
        if self.recent.len() < MAX_KEYS {
            self.recent.insert(key, now);
        }
        if self.buckets.len() > MAX_KEYS {
            self.buckets
                .retain(|_, (t, at)| *t < BURST || now.duration_since(*at) < REFILL_EVERY);
        }
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::uplink::report::{EventType, PodRef};

    fn report(uid: &str, reason: &'static str, message: &str) -> EventReport {
        EventReport {
            pod: PodRef {
                namespace: "default".into(),
                name: "web".into(),
                uid: uid.into(),
            },
            container: Some("app".into()),
            type_: EventType::Normal,
            reason: reason.into(),
            message: message.into(),
            id: 0,
            at: Timestamp::from_second(1_763_796_801).expect("ts"),
        }
    }

    #[test]
    fn event_matches_the_kubelet_shape() {
        let e = event_object(&report("u1", "Pulled", "already present"), "edge-node-1");
        let v = serde_json::to_value(&e).expect("json");
        assert_eq!(v["involvedObject"]["fieldPath"], "spec.containers{app}");
        assert_eq!(v["involvedObject"]["kind"], "Pod");
        assert_eq!(v["involvedObject"]["uid"], "u1");
        assert_eq!(v["source"]["component"], "kubelet");
        assert_eq!(v["source"]["host"], "edge-node-1");
        assert_eq!(v["reportingInstance"], "edge-node-1");
        assert_eq!(v["count"], 1);
        assert_eq!(v["type"], "Normal");
        assert_eq!(v["firstTimestamp"], "2025-11-22T07:33:21Z");
        let name = v["metadata"]["name"].as_str().expect("name");
        assert!(name.starts_with("web."), "{name}");
    }

    #[test]
    fn repeats_are_dropped_inside_the_window() {
        let mut f = SpamFilter::default();
        let t0 = Instant::now();
        assert!(f.admit(&report("u1", "BackOff", "m"), t0));
        assert!(!f.admit(&report("u1", "BackOff", "m"), t0 + Duration::from_secs(60)));
        assert!(f.admit(&report("u1", "BackOff", "m"), t0 + REPEAT_WINDOW));
    }

    #[test]
    fn burst_then_one_per_five_minutes() {
        let mut f = SpamFilter::default();
        let t0 = Instant::now();
        let sent = (0..40)
            .filter(|n| f.admit(&report("u1", "Started", &format!("{n}")), t0))
            .count();
        assert_eq!(sent, 25);
        assert!(!f.admit(&report("u1", "Started", "x"), t0 + Duration::from_secs(200)));
        assert!(f.admit(&report("u1", "Started", "y"), t0 + Duration::from_secs(301)));
        // Another pod has its own bucket.
        assert!(f.admit(&report("u2", "Started", "z"), t0));
    }
}
