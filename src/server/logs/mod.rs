//! `/containerLogs/{namespace}/{pod}/{container}`: a container's CRI log as `kubectl
//! logs` shows it, with the kubelet's options (`follow`, `tailLines`, `limitBytes`,
//! `sinceSeconds`, `sinceTime`, `timestamps`, `previous`).
//!
//! The files are the shim's (`runtime::logs`), read by [`read`] on a thread of its
//! own, which hands its output to the response through a bounded channel; a client
//! that reads slowly holds the reader back, and one that goes away ends it.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use hyper::StatusCode;
use tokio::sync::mpsc;

use super::deps::ApiDeps;
use super::http::{error, segments, Body, Query, Resp};
use super::lookup;
use crate::runtime::log_read::{stream, LogOptions, Sink, CHUNK, FOLLOW_POLL};
use crate::runtime::{ContainerId, ContainerState, LibcontainerRuntime, Runtime};
use crate::time::Timestamp;

/// Chunks queued for a slow client before the reader waits: 256 KiB.
const QUEUE: usize = 8;

impl LogOptions {
    /// 400 for a value that does not parse, 422 for one that parses but is invalid (as
    /// the kubelet's decoding and `ValidatePodLogOptions` answer).
    pub fn parse(q: &Query, now: Timestamp) -> Result<LogOptions, (StatusCode, String)> {
        let bad = |m: String| (StatusCode::BAD_REQUEST, m);
        let invalid = |m: &str| (StatusCode::UNPROCESSABLE_ENTITY, m.to_owned());
        let mut o = LogOptions {
            follow: q.flag("follow").map_err(bad)?,
            previous: q.flag("previous").map_err(bad)?,
            timestamps: q.flag("timestamps").map_err(bad)?,
            ..Default::default()
        };
        if let Some(n) = q.int("tailLines").map_err(bad)? {
            o.tail_lines = Some(
                u64::try_from(n)
                    .map_err(|_| invalid("tailLines: must be greater than or equal to 0"))?,
            );
        }
        if let Some(n) = q.int("limitBytes").map_err(bad)? {
            if n < 1 {
                return Err(invalid("limitBytes: must be greater than 0"));
            }
            o.limit_bytes = u64::try_from(n).ok();
        }
        let since_seconds = q.int("sinceSeconds").map_err(bad)?;
        let since_time = match q.get("sinceTime") {
            Some(t) => Some(
                t.parse::<Timestamp>()
                    .map_err(|e| bad(format!("sinceTime: invalid RFC 3339 time {t:?}: {e}")))?,
            ),
            None => None,
        };
        match (since_seconds, since_time) {
            (Some(_), Some(_)) => {
                return Err(invalid(
                    "at most one of `sinceTime` or `sinceSeconds` may be specified",
                ))
            }
            (Some(s), None) => {
                if s < 1 {
                    return Err(invalid("sinceSeconds: must be greater than 0"));
                }
                o.since = Some(
                    now.checked_sub(k8s_openapi::jiff::SignedDuration::from_secs(s))
                        .unwrap_or(Timestamp::MIN),
                );
            }
            (None, t) => o.since = t,
        }
        Ok(o)
    }
}

pub async fn container_logs(deps: &Arc<ApiDeps>, path: &str, q: &Query) -> Resp {
    let seg = segments(path);
    let (ns, pod, uid, container) = match seg.as_slice() {
        [ns, pod, c] => (ns, pod, None, c),
        [ns, pod, uid, c] => (ns, pod, Some(uid.as_str()), c),
        [_, _] => {
            return error(
                StatusCode::BAD_REQUEST,
                r#"{"message": "Missing container name."}"#,
            )
        }
        _ => return error(StatusCode::BAD_REQUEST, r#"{"message": "Missing podID."}"#),
    };
    let opts = match LogOptions::parse(q, crate::time::now()) {
        Ok(o) => o,
        Err((status, m)) => return error(status, &m),
    };
    let state = match lookup::find(deps, ns, pod, uid).await {
        Ok(s) => s,
        Err(r) => return r,
    };
    let found = match lookup::container(&state, container) {
        Ok(c) => c,
        Err(r) => return r,
    };
    let live = match log_file(deps, &state, &found, pod, &opts) {
        Ok(l) => l,
        Err(r) => return r,
    };
    // The follower ends with the instance it reads; a previous one has ended.
    let watched = if opts.follow && !opts.previous {
        found.id(false)
    } else {
        None
    };
    // What cannot be read is an error, never an empty log: the kubelet's "failed to
    // open log file" (a 400, as every log failure it answers).
    let running = found
        .id(false)
        .filter(|_| !opts.previous)
        .filter(|id| container_runs(&deps.runtime, id));
    if let Err(e) = readable(&live, opts.follow && running.is_some(), running.is_some()).await {
        return error(
            StatusCode::BAD_REQUEST,
            &format!(
                "failed to open log file {:?}: {e}",
                live.display().to_string()
            ),
        );
    }
    let Ok(permit) = deps.streams.clone().try_acquire_owned() else {
        return error(StatusCode::TOO_MANY_REQUESTS, "too many open streams");
    };
    let (tx, rx) = mpsc::channel(QUEUE);
    let runtime = deps.runtime.clone();
    let spawned = std::thread::Builder::new()
        .name("api-logs".into())
        .spawn(move || {
            let _permit = permit;
            let alive = |id: &ContainerId| container_runs(&runtime, id);
            let mut out = Sender {
                tx,
                buf: Vec::with_capacity(CHUNK),
            };
            if let Err(e) = stream(&live, &opts, watched.as_ref(), &alive, &mut out) {
                log::debug!("kubelet API: logs {}: {e}", live.display());
            }
            out.flush();
        });
    if let Err(e) = spawned {
        return error(
            StatusCode::INTERNAL_SERVER_ERROR,
            &format!("start log reader: {e}"),
        );
    }
    let mut r = hyper::Response::new(Body::stream(rx));
    r.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static("text/plain"),
    );
    r
}

/// The log file `opts` asks for: the current instance's, or with `previous` the one
/// before it; else the kubelet's 400 for a container with no such instance.
#[allow(clippy::result_large_err)] // the error is the response, built once per request
fn log_file(
    deps: &ApiDeps,
    state: &crate::sync::PodView,
    found: &lookup::PodContainer<'_>,
    pod: &str,
    opts: &LogOptions,
) -> Result<PathBuf, Resp> {
    let container = &found.spec.name;
    let restarts = found.restart_count().unwrap_or(0);
    let index = if opts.previous {
        if found.id(true).is_none() || restarts == 0 {
            return Err(error(
                StatusCode::BAD_REQUEST,
                &format!(
                    "previous terminated container \"{container}\" in pod \"{pod}\" not found"
                ),
            ));
        }
        restarts - 1
    } else {
        if let Some(reason) = found.waiting_reason() {
            return Err(error(
                StatusCode::BAD_REQUEST,
                &format!(
                    "container \"{container}\" in pod \"{pod}\" is waiting to start: {reason}"
                ),
            ));
        }
        restarts
    };
    Ok(lookup::log_dir(deps, state)
        .join(container)
        .join(format!("{index}.log")))
}

/// How long a container that just started may take to open its log: its shim records
/// the start, then opens the log.
const LOG_OPEN_GRACE: Duration = Duration::from_secs(2);

/// Whether the log at `live` (or one of its rotated files) can be read. A follower of a
/// running container may wait for a log not made yet; anyone else waits at most
/// [`LOG_OPEN_GRACE`] for the log of a running container.
async fn readable(live: &Path, may_wait: bool, running: bool) -> std::io::Result<()> {
    let deadline = Instant::now() + LOG_OPEN_GRACE;
    loop {
        let e = match File::open(live) {
            Ok(_) => return Ok(()),
            Err(e) => e,
        };
        if e.kind() != std::io::ErrorKind::NotFound {
            return Err(e);
        }
        // Between a rotation's rename and the new file.
        if !crate::runtime::rotated_log_files(live)
            .unwrap_or_default()
            .is_empty()
            || may_wait
        {
            return Ok(());
        }
        if !running || Instant::now() >= deadline {
            return Err(e);
        }
        tokio::time::sleep(FOLLOW_POLL).await;
    }
}

fn container_runs(runtime: &LibcontainerRuntime, id: &ContainerId) -> bool {
    matches!(
        runtime.state(id),
        Ok(ContainerState::Running { .. }) | Ok(ContainerState::Created)
    )
}

/// Where output goes: chunks on the response's channel.
pub struct Sender {
    tx: mpsc::Sender<Bytes>,
    buf: Vec<u8>,
}

impl Sender {
    /// Queues `data`; false once the client is gone.
    fn push(&mut self, data: &[u8]) -> bool {
        self.buf.extend_from_slice(data);
        if self.buf.len() >= CHUNK {
            return self.flush();
        }
        true
    }

    fn flush(&mut self) -> bool {
        if self.buf.is_empty() {
            return !self.tx.is_closed();
        }
        let chunk = Bytes::from(std::mem::replace(&mut self.buf, Vec::with_capacity(CHUNK)));
        self.tx.blocking_send(chunk).is_ok()
    }
}

impl Sink for Sender {
    fn push(&mut self, data: &[u8]) -> bool {
        Sender::push(self, data)
    }
    fn flush(&mut self) -> bool {
        Sender::flush(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bad_options() {
        let now: Timestamp = "2026-12-01T00:00:10Z".parse().expect("time");
        let parse = |q: &str| LogOptions::parse(&Query::parse(q), now);
        assert_eq!(
            parse("tailLines=x").map_err(|e| e.0),
            Err(StatusCode::BAD_REQUEST)
        );
        assert_eq!(
            parse("tailLines=-1").map_err(|e| e.0),
            Err(StatusCode::UNPROCESSABLE_ENTITY)
        );
        assert_eq!(
            parse("follow=maybe").map_err(|e| e.0),
            Err(StatusCode::BAD_REQUEST)
        );
        assert_eq!(
            parse("sinceTime=yesterday").map_err(|e| e.0),
            Err(StatusCode::BAD_REQUEST)
        );
        assert_eq!(
            parse("sinceSeconds=5&sinceTime=2026-12-01T00:00:00Z").map_err(|e| e.0),
            Err(StatusCode::UNPROCESSABLE_ENTITY)
        );
        let o = parse("sinceSeconds=5&follow&timestamps=true&limitBytes=10").expect("parse");
        assert_eq!(o.since, "2026-12-01T00:00:05Z".parse().ok());
        assert!(o.follow && o.timestamps);
        assert_eq!(o.limit_bytes, Some(10));
    }
}
