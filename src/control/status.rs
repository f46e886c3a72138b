//! `holdfast status`: how the agent and its uplink are doing — up, or down since when
//! and retrying when; what waits in the outbox; when anything last got through; how
//! big the store is and how many pods it knows. Gathered by the running agent, or,
//! when none runs, from the root dir.

use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::kube::link::{LinkReport, Stage};
use crate::store::{dir_size, Store};
use crate::sync::PodStates;
use crate::time::Timestamp;
use crate::uplink::report::{self, Depth};
use crate::uplink::UplinkView;

/// The uplink as the status shows it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct UplinkStatus {
    /// `standalone` (no kubeconfig), `up`, `down`, or `unknown` (no agent runs).
    pub state: String,
    /// While up: `nodeReady` (the outbox is draining) or `drained`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stage: Option<Stage>,
    /// Since when it is up or down.
    pub since: Option<Timestamp>,
    pub next_retry: Option<Timestamp>,
    pub failures: u32,
    /// The last successful LIST, watch event, status patch or lease renewal.
    pub last_sync: Option<Timestamp>,
    /// The apiserver endpoint in use, once the client is made.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub apiserver: Option<ApiserverInUse>,
}

/// The apiserver endpoint the uplink uses, of those it may use (`holdfast.apiservers`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ApiserverInUse {
    pub url: String,
    /// Its place in the list: 0 is the kubeconfig's server.
    pub index: usize,
    /// How many endpoints there are.
    pub count: usize,
}

impl UplinkStatus {
    fn without_link(state: &str) -> UplinkStatus {
        UplinkStatus {
            state: state.into(),
            stage: None,
            since: None,
            next_retry: None,
            failures: 0,
            last_sync: None,
            apiserver: None,
        }
    }

    fn of(r: &LinkReport) -> UplinkStatus {
        UplinkStatus {
            state: if r.stage == Stage::Down { "down" } else { "up" }.into(),
            stage: Some(r.stage).filter(|s| *s != Stage::Down),
            since: r.since,
            next_retry: r.next_retry,
            failures: r.failures,
            last_sync: r.last_sync,
            apiserver: None,
        }
    }
}

/// The node's client certificate: until when, and why there is no working one.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ClientCertStatus {
    pub not_after: Option<Timestamp>,
    pub rotated_at: Option<Timestamp>,
    /// What is wrong (an expired certificate and a refused bootstrap token, a failing
    /// rotation); `None` when well.
    pub problem: Option<String>,
}

impl ClientCertStatus {
    fn of(r: &crate::kube::cert_state::CertReport) -> Option<ClientCertStatus> {
        let at = |s: Option<i64>| s.and_then(|s| Timestamp::from_second(s).ok());
        let status = ClientCertStatus {
            not_after: at(r.not_after),
            rotated_at: at(r.rotated_at),
            problem: r.problem.clone(),
        };
        (status.not_after.is_some() || status.problem.is_some()).then_some(status)
    }
}

/// Writes held in memory while the store's disk is full.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct HeldWrites {
    pub since: Timestamp,
    pub reason: String,
    pub records: usize,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AgentStatus {
    /// Whether a running agent answered (otherwise this came from the root dir).
    pub agent_running: bool,
    pub uplink: UplinkStatus,
    /// The client certificate, when the uplink uses one or has a problem with it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client_certificate: Option<ClientCertStatus>,
    /// What waits to be reported; from the store when no agent runs.
    pub outbox: Option<Depth>,
    /// Bytes the store takes on disk.
    pub store_bytes: u64,
    /// Writes the store keeps in memory because its disk is full.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub store_held: Option<HeldWrites>,
    /// Pods the store knows (with their status).
    pub pods: Option<usize>,
    /// Streams up to konnectivity proxy servers, when the tunnel is configured.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tunnel_streams: Option<i64>,
}

/// Gathered by the running agent.
pub fn from_agent(
    root_dir: &Path,
    podstates: &PodStates,
    uplink: Option<&UplinkView>,
) -> AgentStatus {
    AgentStatus {
        agent_running: true,
        uplink: match uplink {
            Some(v) => UplinkStatus {
                apiserver: v.apiserver().map(|(url, index, count)| ApiserverInUse {
                    url,
                    index,
                    count,
                }),
                ..UplinkStatus::of(&v.link())
            },
            None => UplinkStatus::without_link("standalone"),
        },
        client_certificate: uplink.and_then(|v| ClientCertStatus::of(&v.credentials.report())),
        outbox: uplink.map(UplinkView::outbox),
        store_bytes: dir_size(&root_dir.join("db")),
        store_held: podstates.store().holding().map(|(h, records)| HeldWrites {
            since: h.since,
            reason: h.reason,
            records,
        }),
        pods: podstates.count().ok(),
        tunnel_streams: crate::metrics::TUNNEL_ENABLED
            .load(std::sync::atomic::Ordering::Relaxed)
            .then(|| crate::metrics::TUNNEL_STREAMS.load(std::sync::atomic::Ordering::Relaxed)),
    }
}

/// Gathered from the root dir, no agent running: the store's size, and, if there is
/// a store, what it holds. Never creates a store.
pub fn from_root(root_dir: &Path) -> AgentStatus {
    let db = root_dir.join("db");
    let mut status = AgentStatus {
        agent_running: false,
        uplink: UplinkStatus::without_link("unknown"),
        client_certificate: None,
        outbox: None,
        store_bytes: dir_size(&db),
        store_held: None,
        pods: None,
        tunnel_streams: None,
    };
    if !db.exists() {
        return status;
    }
    match Store::open(&db) {
        Ok(store) => {
            if let Ok(t) = PodStates::open(&store) {
                status.pods = t.count().ok();
            }
            let count = |name: &'static str| {
                store
                    .tree::<serde_json::Value>(name)
                    .and_then(|t| t.keys())
                    .map(|k| k.len())
                    .unwrap_or(0)
            };
            status.outbox = Some(Depth {
                statuses: count(report::STATUS_TREE),
                events: count(report::EVENT_TREE),
                events_dropped: 0,
                removed_static: count(report::REMOVED_TREE),
            });
        }
        Err(e) => log::warn!("status: {e}"),
    }
    status
}

/// The human form.
pub fn render(s: &AgentStatus, now: Timestamp) -> String {
    let mut out = String::new();
    let when = |t: &Option<Timestamp>| match t {
        Some(t) => format!("{t} ({})", ago(*t, now)),
        None => "never".to_string(),
    };
    if !s.agent_running {
        out.push_str("agent:        not running (read from the root dir)\n");
    } else {
        out.push_str("agent:        running\n");
    }
    let u = &s.uplink;
    let line = match u.state.as_str() {
        "up" => {
            let stage = match u.stage {
                Some(Stage::NodeReady) => ", draining the outbox",
                _ => "",
            };
            format!("up since {}{stage}", when(&u.since))
        }
        "down" => {
            let since = match u.since {
                Some(_) => format!("since {}", when(&u.since)),
                None => "(not reached since the agent started)".into(),
            };
            let retry = match &u.next_retry {
                Some(t) => format!(", next retry {t} ({})", until(*t, now)),
                None => String::new(),
            };
            let tries = if u.failures == 1 { "try" } else { "tries" };
            format!("down {since}{retry}, {} failed {tries}", u.failures)
        }
        "standalone" => "standalone (no kubeconfig)".into(),
        _ => "unknown (no agent running)".into(),
    };
    out.push_str(&format!("uplink:       {line}\n"));
    if u.state == "up" || u.state == "down" {
        out.push_str(&format!("last sync:    {}\n", when(&u.last_sync)));
    }
    if let Some(a) = &u.apiserver {
        let of = if a.count > 1 {
            format!(" ({} of {})", a.index + 1, a.count)
        } else {
            String::new()
        };
        out.push_str(&format!("apiserver:    {}{of}\n", a.url));
    }
    if let Some(c) = &s.client_certificate {
        if let Some(t) = c.not_after {
            let state = if t < now { "expired" } else { "valid until" };
            let rotated = match c.rotated_at {
                Some(r) => format!(", rotated {}", ago(r, now)),
                None => String::new(),
            };
            let rel = if t < now { ago(t, now) } else { until(t, now) };
            out.push_str(&format!("client cert:  {state} {t} ({rel}){rotated}\n"));
        }
        if let Some(p) = &c.problem {
            out.push_str(&format!("credentials:  {p}\n"));
        }
    }
    match &s.outbox {
        Some(o) => out.push_str(&format!(
            "outbox:       {} pod status(es), {} event(s), {} dropped, {} mirror pod deletion(s)\n",
            o.statuses, o.events, o.events_dropped, o.removed_static
        )),
        None if u.state == "standalone" => out.push_str("outbox:       none (standalone)\n"),
        None => out.push_str("outbox:       unknown\n"),
    }
    out.push_str(&format!("store:        {}\n", human_bytes(s.store_bytes)));
    if let Some(h) = &s.store_held {
        out.push_str(&format!(
            "store writes: {} record(s) held in memory since {} ({}): {}\n",
            h.records,
            h.since,
            ago(h.since, now),
            h.reason
        ));
    }
    match s.tunnel_streams {
        Some(0) => out.push_str("tunnel:       down, no stream to a proxy server\n"),
        Some(n) => out.push_str(&format!(
            "tunnel:       {n} stream(s) to proxy servers up\n"
        )),
        None => {}
    }
    match s.pods {
        Some(n) => out.push_str(&format!("pods known:   {n}\n")),
        None => out.push_str("pods known:   unknown\n"),
    }
    out
}

fn ago(t: Timestamp, now: Timestamp) -> String {
    let secs = now.duration_since(t).as_secs();
    if secs < 0 {
        return "in the future".into();
    }
    format!("{} ago", span(secs as u64))
}

fn until(t: Timestamp, now: Timestamp) -> String {
    let secs = t.duration_since(now).as_secs();
    if secs <= 0 {
        return "due".into();
    }
    format!("in {}", span(secs as u64))
}

fn span(secs: u64) -> String {
    match secs {
        s if s < 120 => format!("{s}s"),
        s if s < 7200 => format!("{}m", s / 60),
        s if s < 172_800 => format!("{}h", s / 3600),
        s => format!("{}d", s / 86_400),
    }
}

fn human_bytes(bytes: u64) -> String {
    const UNITS: [&str; 4] = ["B", "KiB", "MiB", "GiB"];
    let mut v = bytes as f64;
    let mut u = 0;
    while v >= 1024.0 && u < UNITS.len() - 1 {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{bytes} B")
    } else {
        format!("{v:.1} {} ({bytes} bytes)", UNITS[u])
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kube::link::Link;
    use crate::uplink::report::Reporter;
    use std::time::{Duration, Instant};

    fn at(secs: i64) -> Timestamp {
        Timestamp::from_second(1_800_000_000 + secs).expect("ts")
    }

    #[test]
    fn a_down_link_shows_since_when_and_the_next_retry() {
        let link = Link::new(Duration::from_secs(300));
        link.node_ready(Instant::now(), at(0));
        link.drained();
        link.probe_failed(Instant::now(), at(100), 0);
        let (reporter, outbox) = Reporter::connected();
        reporter.event(
            &k8s_openapi::api::core::v1::Pod::default(),
            None,
            crate::uplink::report::EventType::Normal,
            "Started",
            "x".into(),
        );
        let view = UplinkView {
            link,
            outbox,
            credentials: Default::default(),
            client: Default::default(),
        };
        let dir = crate::testutil::TempDir::new("status-down");
        let store = Store::open(&dir.0.join("db")).expect("store");
        let podstates = PodStates::open(&store).expect("tree");
        store.flush().expect("flush");
        let s = from_agent(&dir.0, &podstates, Some(&view));
        assert!(s.agent_running);
        assert_eq!(s.uplink.state, "down");
        assert_eq!(s.uplink.since, Some(at(100)));
        assert_eq!(s.uplink.failures, 1);
        assert_eq!(s.uplink.last_sync, Some(at(0)));
        assert_eq!(s.outbox.map(|o| o.events), Some(1));
        assert!(s.store_bytes > 0);
        assert_eq!(s.pods, Some(0));
        let text = render(&s, at(160));
        assert!(text.contains("uplink:       down since"), "{text}");
        assert!(text.contains("(60s ago)"), "{text}");
        assert!(text.contains("next retry"), "{text}");
        assert!(text.contains("1 failed try"), "{text}");
        assert!(text.contains("1 event(s)"), "{text}");
        let json = serde_json::to_value(&s).expect("json");
        assert_eq!(json["uplink"]["state"], "down");
        assert!(
            json.get("clientCertificate").is_none(),
            "no certificate, no entry"
        );
        assert_eq!(json["outbox"]["events"], 1);
        assert!(json["uplink"]["nextRetry"].is_string());
    }

    #[test]
    fn an_expired_certificate_and_a_refused_bootstrap_are_said() {
        let (_, outbox) = Reporter::connected();
        let view = UplinkView {
            link: Link::new(Duration::from_secs(300)),
            outbox,
            credentials: Default::default(),
            client: Default::default(),
        };
        view.credentials
            .set_validity(Some(crate::tls::der::Validity {
                not_before: at(-100).as_second(),
                not_after: at(-10).as_second(),
            }));
        view.credentials
            .set_problem("the apiserver refused the bootstrap kubeconfig".into());
        let dir = crate::testutil::TempDir::new("status-cert");
        let store = Store::open(&dir.0.join("db")).expect("store");
        let podstates = PodStates::open(&store).expect("tree");
        let s = from_agent(&dir.0, &podstates, Some(&view));
        let text = render(&s, at(0));
        assert!(text.contains("client cert:  expired "), "{text}");
        assert!(text.contains("(10s ago)"), "{text}");
        assert!(
            text.contains("credentials:  the apiserver refused the bootstrap kubeconfig"),
            "{text}"
        );
        let json = serde_json::to_value(&s).expect("json");
        assert!(json["clientCertificate"]["problem"].is_string(), "{json}");
        let back: AgentStatus = serde_json::from_value(json).expect("read back");
        assert_eq!(back, s);
    }

    #[test]
    fn a_standalone_agent_has_no_uplink_and_no_outbox() {
        let dir = crate::testutil::TempDir::new("status-standalone");
        let store = Store::open(&dir.0.join("db")).expect("store");
        let podstates = PodStates::open(&store).expect("tree");
        let s = from_agent(&dir.0, &podstates, None);
        assert_eq!(s.uplink.state, "standalone");
        assert_eq!(s.outbox, None);
        let text = render(&s, at(0));
        assert!(text.contains("uplink:       standalone"), "{text}");
        assert!(!text.contains("last sync"), "{text}");
    }

    #[test]
    fn the_apiserver_in_use_is_named_with_its_place_when_there_are_several() {
        let dir = crate::testutil::TempDir::new("status-apiserver");
        let mut s = from_root(&dir.0);
        s.uplink = UplinkStatus::of(&Link::new(Duration::from_secs(10)).report());
        let url = "https://10.0.0.2:6443".to_string();
        s.uplink.apiserver = Some(ApiserverInUse {
            url: url.clone(),
            index: 1,
            count: 3,
        });
        let text = render(&s, at(0));
        assert!(
            text.contains("apiserver:    https://10.0.0.2:6443 (2 of 3)\n"),
            "{text}"
        );
        let json = serde_json::to_value(&s).expect("json");
        assert_eq!(json["uplink"]["apiserver"]["url"], url.as_str());
        s.uplink.apiserver = Some(ApiserverInUse {
            url,
            index: 0,
            count: 1,
        });
        let text = render(&s, at(0));
        assert!(
            text.contains("apiserver:    https://10.0.0.2:6443\n"),
            "{text}"
        );
    }

    #[test]
    fn without_an_agent_the_root_dir_still_tells_the_store_size() {
        let dir = crate::testutil::TempDir::new("status-root");
        let s = from_root(&dir.0);
        assert!(!s.agent_running);
        assert_eq!(s.store_bytes, 0);
        assert!(!dir.0.join("db").exists(), "no store is made");
        {
            let store = Store::open(&dir.0.join("db")).expect("store");
            let t: crate::store::Tree<serde_json::Value> =
                store.tree(report::STATUS_TREE).expect("tree");
            t.put("uid-a", &serde_json::json!({})).expect("put");
            store.flush().expect("flush");
        }
        let s = from_root(&dir.0);
        assert!(s.store_bytes > 0);
        assert_eq!(s.outbox.map(|o| o.statuses), Some(1));
        let text = render(&s, at(0));
        assert!(text.contains("not running"), "{text}");
        assert!(text.contains("unknown (no agent running)"), "{text}");
        assert!(text.contains("1 pod status(es)"), "{text}");
    }
}
