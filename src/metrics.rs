//! metrics: holdfast's own Prometheus series, recorded by whichever module does the work
//! and rendered by the kubelet API's `/metrics` (see `server::metrics`).
//!
//! A series is a `static` of atomics: recording is one relaxed atomic add, nothing is
//! allocated, no lock is taken, and a series nobody records into costs its few bytes.
//! Series computed from state at scrape time (pods by phase, restarts, outbox depth)
//! are not kept here; `server::metrics` reads them from their owners. Owns nothing
//! else and touches no IO.
//!
//! Recording, from any thread:
//! ```
//! use std::time::Instant;
//! let t = Instant::now();
//! holdfast::metrics::IMAGE_PULL_BYTES.add(4096);
//! holdfast::metrics::IMAGE_PULL_DURATION.observe(t.elapsed());
//! ```

use std::fmt::Write;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// A monotonically increasing count.
pub struct Counter {
    name: &'static str,
    help: &'static str,
    value: AtomicU64,
}

impl Counter {
    pub const fn new(name: &'static str, help: &'static str) -> Self {
        Counter {
            name,
            help,
            value: AtomicU64::new(0),
        }
    }

    pub fn inc(&self) {
        self.add(1);
    }

    pub fn add(&self, n: u64) {
        self.value.fetch_add(n, Ordering::Relaxed);
    }

    pub fn get(&self) -> u64 {
        self.value.load(Ordering::Relaxed)
    }

    pub fn render(&self, out: &mut String) {
        header(out, self.name, self.help, "counter");
        let _ = writeln!(out, "{} {}", self.name, self.get());
    }
}

/// Upper bounds (seconds) of a histogram's buckets; `+Inf` is implied.
pub type Buckets = &'static [f64];

/// Sync, store and HTTP latencies: 1 ms to 10 s.
pub const LATENCY_BUCKETS: Buckets = &[
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];
/// Image pulls: 100 ms to 10 min.
pub const PULL_BUCKETS: Buckets = &[
    0.1, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0,
];

/// The most buckets a histogram may have (a constant, so the counts are a fixed array).
const MAX_BUCKETS: usize = 16;

/// A distribution of durations over fixed buckets.
pub struct Histogram {
    name: &'static str,
    help: &'static str,
    bounds: Buckets,
    /// Per bucket (not cumulative; summed when rendered), then the overflow bucket.
    counts: [AtomicU64; MAX_BUCKETS + 1],
    sum_micros: AtomicU64,
}

impl Histogram {
    /// `bounds` must be ascending and at most 16 long (longer lists are cut).
    pub const fn new(name: &'static str, help: &'static str, bounds: Buckets) -> Self {
        Histogram {
            name,
            help,
            bounds,
            counts: [const { AtomicU64::new(0) }; MAX_BUCKETS + 1],
            sum_micros: AtomicU64::new(0),
        }
    }

    pub fn observe(&self, d: Duration) {
        let secs = d.as_secs_f64();
        let bounds = &self.bounds[..self.bounds.len().min(MAX_BUCKETS)];
        let at = bounds
            .iter()
            .position(|b| secs <= *b)
            .unwrap_or(MAX_BUCKETS);
        self.counts[at].fetch_add(1, Ordering::Relaxed);
        let micros = u64::try_from(d.as_micros()).unwrap_or(u64::MAX);
        self.sum_micros.fetch_add(micros, Ordering::Relaxed);
    }

    /// How many observations so far.
    pub fn count(&self) -> u64 {
        self.counts.iter().map(|c| c.load(Ordering::Relaxed)).sum()
    }

    pub fn render(&self, out: &mut String) {
        header(out, self.name, self.help, "histogram");
        let bounds = &self.bounds[..self.bounds.len().min(MAX_BUCKETS)];
        let mut cumulative = 0u64;
        for (i, b) in bounds.iter().enumerate() {
            cumulative += self.counts[i].load(Ordering::Relaxed);
            let _ = writeln!(out, "{}_bucket{{le=\"{b}\"}} {cumulative}", self.name);
        }
        cumulative += self.counts[MAX_BUCKETS].load(Ordering::Relaxed);
        let _ = writeln!(out, "{}_bucket{{le=\"+Inf\"}} {cumulative}", self.name);
        let sum = self.sum_micros.load(Ordering::Relaxed) as f64 / 1e6;
        let _ = writeln!(out, "{}_sum {sum}", self.name);
        let _ = writeln!(out, "{}_count {cumulative}", self.name);
    }
}

/// `# HELP` and `# TYPE` lines of one metric family.
pub fn header(out: &mut String, name: &str, help: &str, kind: &str) {
    let _ = writeln!(out, "# HELP {name} {help}");
    let _ = writeln!(out, "# TYPE {name} {kind}");
}

/// A label value as the text format wants it: `\`, `"` and newlines escaped.
pub fn escape(value: &str) -> String {
    let mut s = String::with_capacity(value.len());
    for c in value.chars() {
        match c {
            '\\' => s.push_str("\\\\"),
            '"' => s.push_str("\\\""),
            '\n' => s.push_str("\\n"),
            c => s.push(c),
        }
    }
    s
}

/// How long one pod worker's sync took (sync loop latency).
pub static SYNC_DURATION: Histogram = Histogram::new(
    "holdfast_pod_sync_duration_seconds",
    "Time one pod worker took to bring its pod toward its spec and record the result",
    LATENCY_BUCKETS,
);
/// Probes of the apiserver that failed while the link was down (each one a retry).
pub static UPLINK_RETRIES: Counter = Counter::new(
    "holdfast_uplink_retries_total",
    "Failed tries to reach the apiserver while the link was down",
);
/// Bytes of keys and values handed to the store to write.
pub static STORE_BYTES_WRITTEN: Counter = Counter::new(
    "holdfast_store_written_bytes_total",
    "Bytes of records written to the store (keys and values)",
);
/// Flushes that made the store's writes durable (sled's flush returned). Each one
/// syncs sled's file: on flash, how often the store syncs wears it as much as how much
/// it writes.
pub static STORE_FLUSHES: Counter = Counter::new(
    "holdfast_store_flushes_total",
    "Flushes that made the store's writes durable on disk",
);
/// Stores found at open to hold an older state than they had made durable.
pub static STORE_WENT_BACK: Counter = Counter::new(
    "holdfast_store_went_back_total",
    "Stores found at open to be behind the generation they had flushed (moved aside)",
);
/// Bytes of image blobs fetched from registries.
pub static IMAGE_PULL_BYTES: Counter = Counter::new(
    "holdfast_image_pull_bytes_total",
    "Bytes of image blobs fetched from registries",
);
/// How long each image pull took.
pub static IMAGE_PULL_DURATION: Histogram = Histogram::new(
    "holdfast_image_pull_duration_seconds",
    "Time each image pull took, manifest to unpacked layers",
    PULL_BUCKETS,
);
/// Requests sent to the kube-apiserver that it answered, any verb and code: watches
/// and their re-establishments, retries and refused requests included, so that it
/// agrees with the apiserver's audit log. A request that never reached it (connection
/// refused, a timeout before an answer) is counted by `holdfast_uplink_retries_total`
/// when it was a probe of a dead link.
pub static API_REQUESTS: Counter = Counter::new(
    "holdfast_api_requests_total",
    "Requests sent to the kube-apiserver and answered by it (any code), watches included",
);
/// Moves from one apiserver endpoint to the next after a failure (`holdfast.apiservers`).
pub static APISERVER_SWITCHES: Counter = Counter::new(
    "holdfast_apiserver_switches_total",
    "Moves to the next apiserver endpoint after the one in use failed",
);
/// The place of the apiserver endpoint in use in the list (0: the kubeconfig's server).
pub static APISERVER_IN_USE: std::sync::atomic::AtomicI64 = std::sync::atomic::AtomicI64::new(0);
fn render_apiserver(out: &mut String) {
    APISERVER_SWITCHES.render(out);
    let name = "holdfast_apiserver_endpoint";
    header(
        out,
        name,
        "Place of the apiserver endpoint in use in the list (0: the kubeconfig's server, then holdfast.apiservers)",
        "gauge",
    );
    let _ = writeln!(out, "{name} {}", APISERVER_IN_USE.load(Ordering::Relaxed));
}
/// notAfter (Unix seconds, 0 while there is none) of the apiserver client certificate,
/// rendered as the kubelet's TTL gauge.
pub static CLIENT_CERT_NOT_AFTER: std::sync::atomic::AtomicI64 =
    std::sync::atomic::AtomicI64::new(0);
/// Client certificate rotations that failed, under the kubelet's name.
pub static CLIENT_CERT_RENEW_ERRORS: Counter = Counter::new(
    "kubelet_certificate_manager_client_expiration_renew_errors",
    "Client certificate renewals that failed",
);
fn render_client_cert(out: &mut String) {
    let not_after = CLIENT_CERT_NOT_AFTER.load(Ordering::Relaxed);
    if not_after != 0 {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX));
        let name = "kubelet_certificate_manager_client_ttl_seconds";
        header(
            out,
            name,
            "Seconds until the client certificate expires",
            "gauge",
        );
        let _ = writeln!(out, "{name} {}", not_after.saturating_sub(now));
    }
    CLIENT_CERT_RENEW_ERRORS.render(out);
}
/// Requests the kubelet API answered, any route.
pub static KUBELET_API_REQUESTS: Counter = Counter::new(
    "holdfast_kubelet_api_requests_total",
    "Requests the kubelet API answered",
);

/// A counter with one label whose values are fixed in advance: one atomic per value.
pub struct LabelledCounter<const N: usize> {
    name: &'static str,
    help: &'static str,
    label: &'static str,
    values: [&'static str; N],
    counts: [AtomicU64; N],
}

impl<const N: usize> LabelledCounter<N> {
    pub const fn new(
        name: &'static str,
        help: &'static str,
        label: &'static str,
        values: [&'static str; N],
    ) -> Self {
        LabelledCounter {
            name,
            help,
            label,
            values,
            counts: [const { AtomicU64::new(0) }; N],
        }
    }

    /// Counts one for `value`; a value not declared is not counted.
    pub fn inc(&self, value: &str) {
        if let Some(i) = self.values.iter().position(|v| *v == value) {
            self.counts[i].fetch_add(1, Ordering::Relaxed);
        }
    }

    pub fn get(&self, value: &str) -> u64 {
        self.values
            .iter()
            .position(|v| *v == value)
            .map_or(0, |i| self.counts[i].load(Ordering::Relaxed))
    }

    pub fn render(&self, out: &mut String) {
        header(out, self.name, self.help, "counter");
        for (v, c) in self.values.iter().zip(&self.counts) {
            let n = c.load(Ordering::Relaxed);
            let _ = writeln!(out, "{}{{{}=\"{v}\"}} {n}", self.name, self.label);
        }
    }
}

/// A counter per user name, for at most [`MAX_USERS`] names; the rest count as
/// `other`, so that a client cycling through names cannot grow the series without
/// bound.
pub struct UserCounter {
    name: &'static str,
    help: &'static str,
    counts: std::sync::Mutex<Vec<(String, u64)>>,
}

/// How many distinct user names a [`UserCounter`] keeps.
pub const MAX_USERS: usize = 64;

impl UserCounter {
    pub const fn new(name: &'static str, help: &'static str) -> Self {
        UserCounter {
            name,
            help,
            counts: std::sync::Mutex::new(Vec::new()),
        }
    }

    pub fn inc(&self, user: &str) {
        let mut counts = self
            .counts
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let key = if counts.len() < MAX_USERS || counts.iter().any(|(u, _)| u == user) {
            user
        } else {
            "other"
        };
        match counts.iter_mut().find(|(u, _)| u == key) {
            Some((_, n)) => *n = n.saturating_add(1),
            None => counts.push((key.to_owned(), 1)),
        }
    }

    pub fn render(&self, out: &mut String) {
        header(out, self.name, self.help, "counter");
        let counts = self
            .counts
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        for (user, n) in counts.iter() {
            let _ = writeln!(out, "{}{{user=\"{}\"}} {n}", self.name, escape(user));
        }
    }
}

/// Kubelet API connections by the user their client certificate names.
pub static KUBELET_API_CONNECTIONS_BY_USER: UserCounter = UserCounter::new(
    "holdfast_kubelet_api_connections_by_user_total",
    "Kubelet API connections by the user of their client certificate (at most 64 users, then other)",
);
/// Kubelet API requests by authenticated user (anonymous ones as system:anonymous).
pub static KUBELET_API_REQUESTS_BY_USER: UserCounter = UserCounter::new(
    "holdfast_kubelet_api_requests_by_user_total",
    "Kubelet API requests by authenticated user (at most 64 users, then other)",
);
/// Authorization decisions: asked of the apiserver or its cache (allowed, denied), or
/// by the offline policy while it could not be asked.
pub static KUBELET_API_AUTHZ_DECISIONS: LabelledCounter<4> = LabelledCounter::new(
    "holdfast_kubelet_api_authorization_decisions_total",
    "Kubelet API authorization decisions",
    "decision",
    ["allowed", "denied", "offline_allowed", "offline_denied"],
);
/// Lookups in the SubjectAccessReview cache.
pub static KUBELET_API_AUTHZ_CACHE: LabelledCounter<2> = LabelledCounter::new(
    "holdfast_kubelet_api_authorization_cache_total",
    "Kubelet API authorization decisions looked up in the cache",
    "result",
    ["hit", "miss"],
);
/// Lookups in the TokenReview cache.
pub static KUBELET_API_TOKEN_CACHE: LabelledCounter<2> = LabelledCounter::new(
    "holdfast_kubelet_api_token_cache_total",
    "Kubelet API bearer tokens looked up in the cache",
    "result",
    ["hit", "miss"],
);
/// How long authentication and authorization of one request took.
pub static KUBELET_API_AUTH_DURATION: Histogram = Histogram::new(
    "holdfast_kubelet_api_auth_duration_seconds",
    "Time the kubelet API took to authenticate and authorize a request",
    LATENCY_BUCKETS,
);

/// Whether the tunnel is configured (its streams are then worth a status line).
pub static TUNNEL_ENABLED: std::sync::atomic::AtomicBool =
    std::sync::atomic::AtomicBool::new(false);
/// Tunnel streams open to konnectivity proxy servers.
pub static TUNNEL_STREAMS: std::sync::atomic::AtomicI64 = std::sync::atomic::AtomicI64::new(0);
/// Dials the tunnel made to the kubelet API for a proxy server.
pub static TUNNEL_DIALS_SERVED: Counter = Counter::new(
    "holdfast_tunnel_dials_served_total",
    "Connections to the kubelet API opened for a konnectivity proxy server",
);
/// Dials asked for something other than the kubelet API, refused.
pub static TUNNEL_DIALS_REFUSED: Counter = Counter::new(
    "holdfast_tunnel_dials_refused_total",
    "Dial requests refused: their address is not this node's kubelet API",
);
/// Dials of the kubelet API that failed.
pub static TUNNEL_DIALS_FAILED: Counter = Counter::new(
    "holdfast_tunnel_dials_failed_total",
    "Dials of the kubelet API that failed for a konnectivity proxy server",
);
pub static TUNNEL_BYTES_TO_KUBELET: Counter = Counter::new(
    "holdfast_tunnel_bytes_to_kubelet_total",
    "Bytes carried from the proxy servers to the kubelet API",
);
pub static TUNNEL_BYTES_FROM_KUBELET: Counter = Counter::new(
    "holdfast_tunnel_bytes_from_kubelet_total",
    "Bytes carried from the kubelet API to the proxy servers",
);
fn render_tunnel(out: &mut String) {
    let name = "holdfast_tunnel_streams";
    header(
        out,
        name,
        "Tunnel streams open to konnectivity proxy servers",
        "gauge",
    );
    let _ = writeln!(out, "{name} {}", TUNNEL_STREAMS.load(Ordering::Relaxed));
    TUNNEL_DIALS_SERVED.render(out);
    TUNNEL_DIALS_REFUSED.render(out);
    TUNNEL_DIALS_FAILED.render(out);
    TUNNEL_BYTES_TO_KUBELET.render(out);
    TUNNEL_BYTES_FROM_KUBELET.render(out);
}

/// Renders every series kept here.
pub fn render_all(out: &mut String) {
    SYNC_DURATION.render(out);
    UPLINK_RETRIES.render(out);
    STORE_BYTES_WRITTEN.render(out);
    STORE_FLUSHES.render(out);
    STORE_WENT_BACK.render(out);
    IMAGE_PULL_BYTES.render(out);
    IMAGE_PULL_DURATION.render(out);
    API_REQUESTS.render(out);
    render_apiserver(out);
    render_client_cert(out);
    KUBELET_API_REQUESTS.render(out);
    KUBELET_API_CONNECTIONS_BY_USER.render(out);
    KUBELET_API_REQUESTS_BY_USER.render(out);
    KUBELET_API_AUTHZ_DECISIONS.render(out);
    KUBELET_API_AUTHZ_CACHE.render(out);
    KUBELET_API_TOKEN_CACHE.render(out);
    KUBELET_API_AUTH_DURATION.render(out);
    render_tunnel(out);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn histogram_buckets_are_cumulative() {
        static H: Histogram = Histogram::new("t_seconds", "test", &[0.1, 1.0]);
        H.observe(Duration::from_millis(50));
        H.observe(Duration::from_millis(500));
        H.observe(Duration::from_secs(5));
        let mut out = String::new();
        H.render(&mut out);
        assert!(out.contains("t_seconds_bucket{le=\"0.1\"} 1\n"), "{out}");
        assert!(out.contains("t_seconds_bucket{le=\"1\"} 2\n"), "{out}");
        assert!(out.contains("t_seconds_bucket{le=\"+Inf\"} 3\n"), "{out}");
        assert!(out.contains("t_seconds_count 3\n"), "{out}");
        assert!(out.contains("t_seconds_sum 5.55\n"), "{out}");
        assert_eq!(H.count(), 3);
    }

    #[test]
    fn counters_and_escaping() {
        static C: Counter = Counter::new("c_total", "test");
        C.inc();
        C.add(41);
        let mut out = String::new();
        C.render(&mut out);
        assert_eq!(
            out,
            "# HELP c_total test\n# TYPE c_total counter\nc_total 42\n"
        );
        assert_eq!(escape("a\"b\\c\nd"), "a\\\"b\\\\c\\nd");
    }
}
