//! The Grafana dashboard in `docs/grafana/holdfast.json` is one Grafana imports, and
//! it queries only series a real agent exports: every metric name in its queries is
//! declared by the `/metrics` or `/metrics/resource` of a running agent with a pod.
//! A renamed or misspelled series fails here, not on an empty panel. Real containers
//! (as root) for the exported names; the dashboard's shape needs no root.

use support::{agent, kubelet_api};

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::time::Duration;

use serde_json::Value;

use agent::{container, need_root, sh_pod};
use kubelet_api::Api;

/// Where the template variable points every panel and query at.
const DATASOURCE: &str = "${datasource}";

fn dashboard() -> Value {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/grafana/holdfast.json");
    let text =
        std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{} is not JSON: {e}", path.display()))
}

fn panels(d: &Value) -> &[Value] {
    d["panels"].as_array().map_or(&[], Vec::as_slice)
}

fn variables(d: &Value) -> &[Value] {
    d["templating"]["list"]
        .as_array()
        .map_or(&[], Vec::as_slice)
}

/// A template variable's query: a string, or `{query: ...}` as newer Grafanas save it.
fn variable_query(v: &Value) -> &str {
    v["query"]
        .as_str()
        .or_else(|| v["query"]["query"].as_str())
        .unwrap_or("")
}

/// Every metric name the dashboard queries, with where it is queried (panel titles,
/// or `$name` for a template variable's `label_values(series, label)`).
fn queried(d: &Value) -> BTreeMap<String, BTreeSet<String>> {
    let mut by_name: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for p in panels(d) {
        let title = p["title"].as_str().unwrap_or("?");
        for t in p["targets"].as_array().into_iter().flatten() {
            for name in metric_names(t["expr"].as_str().unwrap_or("")) {
                by_name.entry(name).or_default().insert(title.to_owned());
            }
        }
    }
    for v in variables(d) {
        let q = variable_query(v);
        if let Some(series) = q
            .strip_prefix("label_values(")
            .and_then(|rest| rest.rsplit_once(','))
            .map(|(series, _)| series)
        {
            let at = format!("${}", v["name"].as_str().unwrap_or("?"));
            for name in metric_names(series) {
                by_name.entry(name).or_default().insert(at.clone());
            }
        }
    }
    by_name
}

/// PromQL words that are not metric names: aggregations, binary and modifier keywords,
/// and the grouping clauses whose parenthesised list holds label names.
const KEYWORDS: &[&str] = &[
    "sum",
    "min",
    "max",
    "avg",
    "group",
    "stddev",
    "stdvar",
    "count",
    "count_values",
    "bottomk",
    "topk",
    "quantile",
    "limitk",
    "limit_ratio",
    "and",
    "or",
    "unless",
    "bool",
    "offset",
    "atan2",
    "inf",
    "nan",
];
const GROUPING: &[&str] = &[
    "by",
    "without",
    "on",
    "ignoring",
    "group_left",
    "group_right",
];

/// The metric names a PromQL expression reads: each identifier outside label matchers
/// (`{...}`), ranges (`[...]`) and strings that is not a keyword, not a function (an
/// identifier followed by `(`), not in a grouping clause's label list and not a
/// Grafana variable (`$name`). Numbers and durations are skipped whole.
fn metric_names(expr: &str) -> Vec<String> {
    let b = expr.as_bytes();
    let ident = |c: u8| c.is_ascii_alphanumeric() || c == b'_' || c == b':';
    let mut names = Vec::new();
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'"' | b'\'' | b'`' => i = skip_string(b, i),
            b'{' => i = skip_past(b, i, b'}'),
            b'[' => i = skip_past(b, i, b']'),
            b'$' => {
                i += 1;
                while i < b.len() && ident(b[i]) {
                    i += 1;
                }
            }
            c if c.is_ascii_digit() || c == b'.' => {
                while i < b.len() && (ident(b[i]) || b[i] == b'.') {
                    i += 1;
                }
            }
            c if c.is_ascii_alphabetic() || c == b'_' || c == b':' => {
                let start = i;
                while i < b.len() && ident(b[i]) {
                    i += 1;
                }
                let word = &expr[start..i];
                let rest = expr[i..].trim_start();
                if GROUPING.contains(&word) {
                    if rest.starts_with('(') {
                        i = skip_past(b, b.len() - rest.len(), b')');
                    }
                } else if !KEYWORDS.contains(&word) && !rest.starts_with('(') {
                    names.push(word.to_owned());
                }
            }
            _ => i += 1,
        }
    }
    names
}

/// The index just past the `close` that ends the group opened at `i`, strings skipped.
fn skip_past(b: &[u8], mut i: usize, close: u8) -> usize {
    i += 1;
    while i < b.len() {
        match b[i] {
            b'"' | b'\'' | b'`' => i = skip_string(b, i),
            c if c == close => return i + 1,
            _ => i += 1,
        }
    }
    i
}

/// The index just past the string literal that starts at `i`.
fn skip_string(b: &[u8], mut i: usize) -> usize {
    let quote = b[i];
    i += 1;
    while i < b.len() {
        if b[i] == b'\\' && quote != b'`' {
            i += 2;
        } else if b[i] == quote {
            return i + 1;
        } else {
            i += 1;
        }
    }
    i
}

/// The metric names a Prometheus text exposition declares: each `# TYPE` line's name
/// (with `_bucket`, `_sum` and `_count` for a histogram, `_sum` and `_count` for a
/// summary) and each sample line's name. A series declared without samples (the
/// uplink's while the agent runs standalone) counts: the agent exports it when it has
/// a value.
fn exported(text: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    for line in text.lines() {
        if let Some(decl) = line.strip_prefix("# TYPE ") {
            let mut words = decl.split_whitespace();
            let (Some(name), kind) = (words.next(), words.next()) else {
                continue;
            };
            names.insert(name.to_owned());
            let suffixes: &[&str] = match kind {
                Some("histogram") => &["_bucket", "_sum", "_count"],
                Some("summary") => &["_sum", "_count"],
                _ => &[],
            };
            names.extend(suffixes.iter().map(|s| format!("{name}{s}")));
        } else if !line.starts_with('#') {
            let name = line.split(['{', ' ']).next().unwrap_or("");
            if !name.is_empty() {
                names.insert(name.to_owned());
            }
        }
    }
    names
}

#[test]
fn metric_names_are_read_out_of_promql() {
    let names = |e: &str| metric_names(e);
    assert_eq!(names(r#"up{instance=~"$instance"}"#), ["up"]);
    assert_eq!(
        names(
            r#"histogram_quantile(0.9, sum by (instance, le) (rate(a_seconds_bucket{x="}{"}[$__rate_interval])))"#
        ),
        ["a_seconds_bucket"]
    );
    assert_eq!(
        names("rate(a_total[5m]) * 60 + on (pod) group_left (node) b offset 1h"),
        ["a_total", "b"]
    );
    assert_eq!(
        names("sum without (pod) (c) / count(d) > bool 1e3"),
        ["c", "d"]
    );
    assert_eq!(names("rec:rule:rate5m"), ["rec:rule:rate5m"]);
}

#[test]
fn exposition_names_include_histogram_series() {
    let text = "# HELP h_seconds x\n# TYPE h_seconds histogram\nh_seconds_bucket{le=\"1\"} 0\n\
                # TYPE g gauge\n# TYPE c_total counter\nc_total{a=\"b\"} 1 1700000000000\n\
                untyped_sample 3\n";
    let names = exported(text);
    for n in [
        "h_seconds",
        "h_seconds_bucket",
        "h_seconds_sum",
        "h_seconds_count",
        "g",
        "c_total",
        "untyped_sample",
    ] {
        assert!(names.contains(n), "{n} in {names:?}");
    }
    assert!(!names.contains("HELP"), "{names:?}");
}

#[test]
fn the_dashboard_is_one_grafana_imports_over_its_datasource_variable() {
    let d = dashboard();
    assert_eq!(d["uid"], "holdfast");
    assert_eq!(d["title"], "holdfast");
    assert!(
        d["schemaVersion"].as_u64().unwrap_or(0) >= 36,
        "schemaVersion"
    );
    let var = |name: &str| {
        variables(&d)
            .iter()
            .find(|v| v["name"] == name)
            .unwrap_or_else(|| panic!("no template variable {name}"))
    };
    let ds = var("datasource");
    assert_eq!(
        (ds["type"].as_str(), variable_query(ds)),
        (Some("datasource"), "prometheus")
    );
    let instance = var("instance");
    assert_eq!(instance["type"], "query");
    assert_eq!(instance["datasource"]["uid"], DATASOURCE);
    assert!(!queried(&d).is_empty());

    let panels = panels(&d);
    assert!(!panels.is_empty(), "no panels");
    let mut problems = Vec::new();
    let mut ids = BTreeSet::new();
    for p in panels {
        let title = p["title"].as_str().unwrap_or("");
        let mut problem = |what: &str| problems.push(format!("panel {title:?}: {what}"));
        if title.is_empty() {
            problem("no title");
        }
        if !ids.insert(p["id"].as_u64()) || p["id"].as_u64().is_none() {
            problem("no id, or one another panel has");
        }
        if !matches!(p["type"].as_str(), Some("timeseries" | "stat")) {
            problem("neither timeseries nor stat");
        }
        if p["gridPos"]["w"].as_u64().unwrap_or(0) == 0 {
            problem("no gridPos");
        }
        if p["datasource"]["uid"] != DATASOURCE {
            problem("datasource is not the $datasource variable");
        }
        let targets = p["targets"].as_array().map_or(&[][..], Vec::as_slice);
        if targets.is_empty() {
            problem("no targets");
        }
        for t in targets {
            let expr = t["expr"].as_str().unwrap_or("").trim();
            if expr.is_empty() {
                problem("a target without expr");
            } else if metric_names(expr).is_empty() {
                problem(&format!("{expr:?} reads no metric by name"));
            }
            if !t["datasource"].is_null() && t["datasource"]["uid"] != DATASOURCE {
                problem("a target's datasource is not the $datasource variable");
            }
            if !expr.contains("$instance") {
                problem(&format!("{expr:?} ignores the $instance variable"));
            }
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

#[test]
fn every_series_the_dashboard_queries_is_exported_by_a_running_agent() {
    if !need_root() {
        return;
    }
    let queried = queried(&dashboard());
    let api = Api::start("grafana");
    api.agent.write_manifest(
        "idle.yaml",
        &sh_pod("idle", "", "main", "sleep 1000000", ""),
    );
    api.agent
        .wait_pod("idle", "running", Duration::from_secs(60), |p| {
            !container(p, "main")["state"]["running"].is_null()
        });
    // The pod's series are there once its cgroup has been read.
    let mut resource = String::new();
    api.agent.wait_until(
        "the pod in /metrics/resource",
        Duration::from_secs(30),
        |_| {
            let (code, body) = api.get("/metrics/resource");
            resource = body;
            code == 200 && resource.contains("pod_cpu_usage_seconds_total{")
        },
    );
    let (code, own) = api.get("/metrics");
    assert_eq!(code, 200, "{own}");
    let exported: BTreeSet<String> = exported(&own)
        .into_iter()
        .chain(exported(&resource))
        .collect();

    let missing: Vec<String> = queried
        .iter()
        .filter(|(name, _)| !exported.contains(*name))
        .map(|(name, at)| {
            format!(
                "{name} (in {})",
                Vec::from_iter(at.iter().cloned()).join(", ")
            )
        })
        .collect();
    assert!(
        missing.is_empty(),
        "the dashboard queries series the agent does not export:\n  {}\nexported: {exported:?}",
        missing.join("\n  ")
    );
}
