//! Wall-clock time as Kubernetes reports it.

pub use k8s_openapi::jiff::Timestamp;

/// Now, as a Kubernetes `Time`.
pub fn now() -> Timestamp {
    Timestamp::now()
}

/// RFC 3339 with nanoseconds, as CRI log lines carry it.
pub fn rfc3339_nano(t: Timestamp) -> String {
    // jiff prints up to nanosecond precision and trims trailing zeros; CRI readers accept both.
    t.to_string()
}

/// `t + d`, saturating at the far future rather than failing.
pub fn add(t: Timestamp, d: std::time::Duration) -> Timestamp {
    let span = k8s_openapi::jiff::SignedDuration::try_from(d)
        .unwrap_or(k8s_openapi::jiff::SignedDuration::MAX);
    t.checked_add(span).unwrap_or(Timestamp::MAX)
}
