//! `/metrics/resource` (what metrics-server reads for `kubectl top`: the kubelet's
//! resource metrics, same names, help, labels and millisecond timestamps) and
//! `/metrics` (holdfast's own: [`crate::metrics`] plus what is counted at scrape time
//! from the pod states and the uplink).

use std::collections::BTreeMap;
use std::fmt::Write;
use std::path::Path;
use std::sync::Arc;

use hyper::StatusCode;

use super::cgroups::{Hierarchy, Usage};
use super::deps::{ApiDeps, MAX_STREAMS};
use super::http::{error, respond, Resp};
use super::lookup;
use crate::metrics::{escape, header};

const TEXT: &str = "text/plain; version=0.0.4; charset=utf-8";

pub async fn resource(deps: &Arc<ApiDeps>) -> Resp {
    let states = match lookup::all(deps).await {
        Ok(s) => s,
        Err(r) => return r,
    };
    let d = deps.clone();
    match tokio::task::spawn_blocking(move || render_resource(&d, &states)).await {
        Ok(text) => respond(StatusCode::OK, TEXT, text),
        Err(e) => error(StatusCode::INTERNAL_SERVER_ERROR, &e.to_string()),
    }
}

struct Sample {
    container: String,
    pod: String,
    namespace: String,
    cpu_s: Option<f64>,
    working_set: Option<u64>,
    start: Option<f64>,
}

fn render_resource(deps: &ApiDeps, states: &[crate::sync::PodView]) -> String {
    let h = Hierarchy::host();
    let ms = crate::time::now().as_millisecond();
    let node = h.node(Path::new("/proc"));
    let (samples, scrape_error) = samples(deps, &h, states);
    let mut out = String::new();
    write_containers(&mut out, &samples, ms);
    write_node(&mut out, &node, ms);
    write_pods(&mut out, &samples, ms);
    header(
        &mut out,
        "resource_scrape_error",
        "[STABLE] 1 if there was an error while getting container metrics, 0 otherwise",
        "gauge",
    );
    let _ = writeln!(out, "resource_scrape_error {scrape_error}");
    out
}

/// Each running container's figures, and 1 if a container's cgroup could not be read.
fn samples(deps: &ApiDeps, h: &Hierarchy, states: &[crate::sync::PodView]) -> (Vec<Sample>, u8) {
    let mut samples = Vec::new();
    let mut scrape_error = 0;
    for s in states {
        let m = &s.pod().metadata;
        for (name, id) in lookup::running_ids(s) {
            let Some(u) = h.read(&deps.runtime.cgroups_path(&id)) else {
                scrape_error = 1;
                continue;
            };
            let start = s
                .status()
                .container_statuses
                .iter()
                .flatten()
                .find(|c| c.name == name)
                .and_then(|c| c.state.as_ref()?.running.as_ref()?.started_at.as_ref())
                .map(|t| t.0.as_millisecond() as f64 / 1000.0);
            samples.push(Sample {
                container: name,
                pod: m.name.clone().unwrap_or_default(),
                namespace: m.namespace.clone().unwrap_or_else(|| "default".into()),
                cpu_s: u.cpu_ns.map(|n| n as f64 / 1e9),
                working_set: u.memory.map(|m| m.working_set),
                start,
            });
        }
    }
    (samples, scrape_error)
}

/// The container series: CPU, working set and start time.
fn write_containers(out: &mut String, samples: &[Sample], ms: i64) {
    let c_labels = |s: &Sample| {
        format!(
            "container=\"{}\",namespace=\"{}\",pod=\"{}\"",
            escape(&s.container),
            escape(&s.namespace),
            escape(&s.pod)
        )
    };
    header(
        out,
        "container_cpu_usage_seconds_total",
        "[STABLE] Cumulative cpu time consumed by the container in core-seconds",
        "counter",
    );
    for s in samples {
        if let Some(v) = s.cpu_s {
            let _ = writeln!(
                out,
                "container_cpu_usage_seconds_total{{{}}} {v} {ms}",
                c_labels(s)
            );
        }
    }
    header(
        out,
        "container_memory_working_set_bytes",
        "[STABLE] Current working set of the container in bytes",
        "gauge",
    );
    for s in samples {
        if let Some(v) = s.working_set {
            let _ = writeln!(
                out,
                "container_memory_working_set_bytes{{{}}} {v} {ms}",
                c_labels(s)
            );
        }
    }
    header(
        out,
        "container_start_time_seconds",
        "[STABLE] Start time of the container since unix epoch in seconds",
        "gauge",
    );
    for s in samples {
        if let Some(v) = s.start {
            let _ = writeln!(
                out,
                "container_start_time_seconds{{{}}} {v} {}",
                c_labels(s),
                (v * 1000.0) as i64
            );
        }
    }
}

/// The node series.
fn write_node(out: &mut String, node: &Usage, ms: i64) {
    header(
        out,
        "node_cpu_usage_seconds_total",
        "[STABLE] Cumulative cpu time consumed by the node in core-seconds",
        "counter",
    );
    if let Some(ns) = node.cpu_ns {
        let _ = writeln!(out, "node_cpu_usage_seconds_total {} {ms}", ns as f64 / 1e9);
    }
    header(
        out,
        "node_memory_working_set_bytes",
        "[STABLE] Current working set of the node in bytes",
        "gauge",
    );
    if let Some(m) = node.memory {
        let _ = writeln!(out, "node_memory_working_set_bytes {} {ms}", m.working_set);
    }
}

/// The pod series: the sums of their containers.
fn write_pods(out: &mut String, samples: &[Sample], ms: i64) {
    let mut by_pod: BTreeMap<(String, String), (f64, u64)> = BTreeMap::new();
    for s in samples {
        let e = by_pod
            .entry((s.namespace.clone(), s.pod.clone()))
            .or_default();
        e.0 += s.cpu_s.unwrap_or(0.0);
        e.1 += s.working_set.unwrap_or(0);
    }
    header(
        out,
        "pod_cpu_usage_seconds_total",
        "[STABLE] Cumulative cpu time consumed by the pod in core-seconds",
        "counter",
    );
    for ((ns, pod), (cpu, _)) in &by_pod {
        let _ = writeln!(
            out,
            "pod_cpu_usage_seconds_total{{namespace=\"{}\",pod=\"{}\"}} {cpu} {ms}",
            escape(ns),
            escape(pod)
        );
    }
    header(
        out,
        "pod_memory_working_set_bytes",
        "[STABLE] Current working set of the pod in bytes",
        "gauge",
    );
    for ((ns, pod), (_, ws)) in &by_pod {
        let _ = writeln!(
            out,
            "pod_memory_working_set_bytes{{namespace=\"{}\",pod=\"{}\"}} {ws} {ms}",
            escape(ns),
            escape(pod)
        );
    }
}

/// holdfast's own series.
pub async fn own(deps: &Arc<ApiDeps>) -> Resp {
    let states = match lookup::all(deps).await {
        Ok(s) => s,
        Err(r) => return r,
    };
    let mut out = String::new();
    crate::metrics::render_all(&mut out);
    write_phases(&mut out, &states);
    write_restarts(&mut out, &states);
    write_uplink(&mut out, deps);
    write_api(&mut out, deps);
    respond(StatusCode::OK, TEXT, out)
}

/// Pods by phase, every phase named even when none is in it.
fn write_phases(out: &mut String, states: &[crate::sync::PodView]) {
    let mut phases: BTreeMap<&str, u64> = ["Pending", "Running", "Succeeded", "Failed", "Unknown"]
        .into_iter()
        .map(|p| (p, 0))
        .collect();
    for s in states {
        let phase = s.status().phase.as_deref().unwrap_or("Unknown");
        *phases.entry(phase).or_default() += 1;
    }
    header(
        out,
        "holdfast_pods",
        "Pods the agent runs, by phase",
        "gauge",
    );
    for (phase, n) in &phases {
        let _ = writeln!(out, "holdfast_pods{{phase=\"{}\"}} {n}", escape(phase));
    }
}

/// Each container's restarts, as its pod's status counts them.
fn write_restarts(out: &mut String, states: &[crate::sync::PodView]) {
    header(
        out,
        "holdfast_container_restarts",
        "Restarts of each container, as its pod's status counts them",
        "gauge",
    );
    for s in states {
        let m = &s.pod().metadata;
        for c in s.status().container_statuses.iter().flatten() {
            let _ = writeln!(
                out,
                "holdfast_container_restarts{{container=\"{}\",namespace=\"{}\",pod=\"{}\"}} {}",
                escape(&c.name),
                escape(m.namespace.as_deref().unwrap_or("default")),
                escape(m.name.as_deref().unwrap_or("")),
                c.restart_count
            );
        }
    }
}

/// The uplink's state and its outbox; the headers alone when standalone.
fn write_uplink(out: &mut String, deps: &ApiDeps) {
    header(
        out,
        "holdfast_uplink_up",
        "1 while the apiserver answers, 0 while the link is down; absent when standalone",
        "gauge",
    );
    header(
        out,
        "holdfast_uplink_consecutive_failures",
        "Failed tries to reach the apiserver since it last answered",
        "gauge",
    );
    header(
        out,
        "holdfast_outbox_depth",
        "Pod statuses and events waiting to be sent to the apiserver",
        "gauge",
    );
    if let Some(v) = &deps.uplink {
        let link = v.link();
        let up = u8::from(link.stage != crate::kube::link::Stage::Down);
        let _ = writeln!(out, "holdfast_uplink_up {up}");
        let _ = writeln!(
            out,
            "holdfast_uplink_consecutive_failures {}",
            link.failures
        );
        let depth = v.outbox();
        let _ = writeln!(
            out,
            "holdfast_outbox_depth {}",
            depth.statuses + depth.events + depth.removed_static
        );
    }
}

/// The API's own load: open streams, and connections refused or evicted.
fn write_api(out: &mut String, deps: &ApiDeps) {
    header(
        out,
        "holdfast_api_streams_open",
        "Log follows, exec, attach and port-forward streams open now",
        "gauge",
    );
    let open = MAX_STREAMS - deps.streams.available_permits();
    let _ = writeln!(out, "holdfast_api_streams_open {open}");
    header(
        out,
        "holdfast_kubelet_api_connections_refused_total",
        "Connections to the kubelet API closed on arrival because a listener held its \
         total of proven clients (reason=total) or their source held its share \
         (reason=per_source)",
        "counter",
    );
    for (reason, n) in [
        ("total", &super::admission::REFUSED_TOTAL),
        ("per_source", &super::admission::REFUSED_PER_SOURCE),
    ] {
        let n = n.load(std::sync::atomic::Ordering::Relaxed);
        let _ = writeln!(
            out,
            "holdfast_kubelet_api_connections_refused_total{{reason=\"{reason}\"}} {n}"
        );
    }
    header(
        out,
        "holdfast_kubelet_api_connections_evicted_total",
        "Connections to the kubelet API without a proven client certificate closed to make \
         room for a newer one when a listener held its total",
        "counter",
    );
    let evicted = super::admission::EVICTED.load(std::sync::atomic::Ordering::Relaxed);
    let _ = writeln!(
        out,
        "holdfast_kubelet_api_connections_evicted_total {evicted}"
    );
}
