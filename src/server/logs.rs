//! `/containerLogs/{namespace}/{pod}/{container}`: a container's CRI log as `kubectl
//! logs` shows it, with the kubelet's options (`follow`, `tailLines`, `limitBytes`,
//! `sinceSeconds`, `sinceTime`, `timestamps`, `previous`).
//!
//! The files are the shim's (`runtime::logs`): `<restart>.log` and its rotated
//! siblings `<restart>.log.<stamp>`, read oldest first, so that rotation loses
//! nothing. A reader thread turns records into output and hands it to the response
//! through a bounded channel; a client that reads slowly holds the reader back, and
//! one that goes away ends it. With `follow` the reader waits for more at the end of
//! the live file, moves to the new live file when the shim rotates it, and ends once
//! the container has exited and everything it wrote is sent.

use std::fs::File;
use std::io::{BufRead, BufReader, Read, Seek, SeekFrom};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use hyper::StatusCode;
use tokio::sync::mpsc;

use super::deps::ApiDeps;
use super::http::{error, segments, Body, Query, Resp};
use super::lookup;
use crate::runtime::{ContainerId, ContainerState, LibcontainerRuntime, Runtime};
use crate::time::Timestamp;

/// Output is sent in chunks of about this size.
const CHUNK: usize = 32 * 1024;
/// Chunks queued for a slow client before the reader waits: 256 KiB.
const QUEUE: usize = 8;
/// How often a follower looks for new output at the end of the live file.
const FOLLOW_POLL: Duration = Duration::from_millis(50);
/// How often a follower asks whether the container still runs while it is quiet.
const ALIVE_CHECK: Duration = Duration::from_millis(500);

/// The kubelet's log options, checked.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct LogOptions {
    pub follow: bool,
    pub previous: bool,
    pub timestamps: bool,
    pub tail_lines: Option<u64>,
    pub limit_bytes: Option<u64>,
    pub since: Option<Timestamp>,
}

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
    let mut r = hyper::Response::new(Body::Stream(rx));
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
    state: &crate::sync::PodState,
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

/// The output side of [`stream`], so that it can be tested without a channel.
pub trait Sink {
    /// Takes output; false when nobody wants more.
    fn push(&mut self, data: &[u8]) -> bool;
    /// Output so far should reach the client now (the reader is about to wait).
    fn flush(&mut self) -> bool;
}

impl Sink for Sender {
    fn push(&mut self, data: &[u8]) -> bool {
        Sender::push(self, data)
    }
    fn flush(&mut self) -> bool {
        Sender::flush(self)
    }
}

impl Sink for Vec<u8> {
    fn push(&mut self, data: &[u8]) -> bool {
        self.extend_from_slice(data);
        true
    }
    fn flush(&mut self) -> bool {
        true
    }
}

/// The live log and its rotated files, oldest first, live last.
fn files(live: &Path) -> Vec<PathBuf> {
    let mut rotated = crate::runtime::rotated_log_files(live).unwrap_or_default();
    // Rotation stamps sort as the files' ages do.
    rotated.sort();
    rotated.push(live.to_owned());
    rotated
}

/// Writes the log at `live` (with its rotated files) to `out` as `opts` asks; with
/// `follow`, goes on until `alive(watched)` says the container ended.
pub fn stream(
    live: &Path,
    opts: &LogOptions,
    watched: Option<&ContainerId>,
    alive: &dyn Fn(&ContainerId) -> bool,
    out: &mut dyn Sink,
) -> std::io::Result<()> {
    let list = files(live);
    let (mut index, mut offset) = match opts.tail_lines {
        Some(n) => tail_start(&list, n)?,
        None => (0, 0),
    };
    let mut fmt = Formatter {
        opts,
        written: 0,
        done: false,
    };
    // The files before the live one are complete.
    while index + 1 < list.len() {
        if let Ok(f) = File::open(&list[index]) {
            fmt.copy(f, offset, out)?;
        }
        if fmt.done {
            return Ok(());
        }
        index += 1;
        offset = 0;
    }
    let mut file = match File::open(live) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound && opts.follow => {
            // Not written yet: wait for it while the container runs.
            loop {
                if let Ok(f) = File::open(live) {
                    break f;
                }
                if !watched.is_some_and(alive) || !out.flush() {
                    return Ok(());
                }
                std::thread::sleep(FOLLOW_POLL);
            }
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(e),
    };
    file.seek(SeekFrom::Start(offset))?;
    let mut reader = BufReader::with_capacity(CHUNK, file);
    let Some(id) = watched.filter(|_| opts.follow) else {
        fmt.lines(&mut reader, out)?;
        return Ok(());
    };
    let mut last_check = Instant::now();
    let mut ending = false;
    loop {
        fmt.lines(&mut reader, out)?;
        if fmt.done || !out.flush() {
            return Ok(());
        }
        // Rotated: what is left of the old file was just read; go on in the new one.
        let rotated = match (std::fs::metadata(live), reader.get_ref().metadata()) {
            (Ok(now), Ok(open)) => now.ino() != open.ino(),
            _ => false,
        };
        if rotated {
            if let Ok(f) = File::open(live) {
                reader = BufReader::with_capacity(CHUNK, f);
                continue;
            }
        }
        if ending {
            return Ok(());
        }
        if last_check.elapsed() >= ALIVE_CHECK {
            last_check = Instant::now();
            if !alive(id) {
                // The shim writes everything before it records the exit: one more
                // read gets the rest.
                ending = true;
                continue;
            }
        }
        std::thread::sleep(FOLLOW_POLL);
    }
}

struct Formatter<'a> {
    opts: &'a LogOptions,
    written: u64,
    done: bool,
}

impl Formatter<'_> {
    fn copy(&mut self, mut f: File, offset: u64, out: &mut dyn Sink) -> std::io::Result<()> {
        f.seek(SeekFrom::Start(offset))?;
        self.lines(&mut BufReader::with_capacity(CHUNK, f), out)
    }

    /// Every whole record `reader` has now; a record still being written (no newline
    /// yet) is left for the next call.
    fn lines(&mut self, reader: &mut BufReader<File>, out: &mut dyn Sink) -> std::io::Result<()> {
        let mut line = Vec::with_capacity(1024);
        while !self.done {
            line.clear();
            let n = reader.read_until(b'\n', &mut line)?;
            if n == 0 {
                return Ok(());
            }
            if line.last() != Some(&b'\n') {
                // Torn: step back and wait for the rest.
                reader.seek_relative(-(n as i64))?;
                return Ok(());
            }
            line.pop();
            self.record(&line, out);
        }
        Ok(())
    }

    fn record(&mut self, line: &[u8], out: &mut dyn Sink) {
        let Some(rec) = parse_record(line) else {
            return;
        };
        if let Some(since) = self.opts.since {
            if rec.time.is_some_and(|t| t < since) {
                return;
            }
        }
        let mut text = Vec::with_capacity(rec.content.len() + 40);
        if self.opts.timestamps {
            text.extend_from_slice(rec.raw_time);
            text.push(b' ');
        }
        text.extend_from_slice(rec.content);
        if rec.full {
            text.push(b'\n');
        }
        if let Some(limit) = self.opts.limit_bytes {
            let left = limit.saturating_sub(self.written) as usize;
            if text.len() >= left {
                text.truncate(left);
                self.done = true;
            }
        }
        self.written += text.len() as u64;
        if !out.push(&text) {
            self.done = true;
        }
    }
}

struct Record<'a> {
    raw_time: &'a [u8],
    time: Option<Timestamp>,
    full: bool,
    content: &'a [u8],
}

/// `<time> <stream> <F|P> <content>`; None for a line that is not a record.
fn parse_record(line: &[u8]) -> Option<Record<'_>> {
    let mut parts = line.splitn(4, |&b| b == b' ');
    let raw_time = parts.next()?;
    let _stream = parts.next()?;
    let tag = parts.next()?;
    let content = parts.next().unwrap_or(b"");
    let time = std::str::from_utf8(raw_time).ok()?.parse().ok();
    Some(Record {
        raw_time,
        time,
        full: tag != b"P",
        content,
    })
}

/// Where the last `n` records start: (file index, offset), counting back from the
/// end of the live file through the rotated ones. Reads backwards in chunks, so the
/// cost is the tail's size, not the log's.
fn tail_start(files: &[PathBuf], n: u64) -> std::io::Result<(usize, u64)> {
    if n == 0 {
        let last = files.len().saturating_sub(1);
        let len = files
            .get(last)
            .and_then(|p| std::fs::metadata(p).ok())
            .map(|m| m.len())
            .unwrap_or(0);
        return Ok((last, len));
    }
    let mut seen = 0u64;
    let mut buf = vec![0u8; CHUNK];
    for (i, path) in files.iter().enumerate().rev() {
        let Ok(mut f) = File::open(path) else {
            continue;
        };
        let len = f.metadata()?.len();
        let mut end = len;
        // The newline ending the file's last record does not start a record.
        let mut skip_last = true;
        while end > 0 {
            let start = end.saturating_sub(CHUNK as u64);
            let size = (end - start) as usize;
            f.seek(SeekFrom::Start(start))?;
            f.read_exact(&mut buf[..size])?;
            for j in (0..size).rev() {
                if buf[j] != b'\n' {
                    continue;
                }
                if skip_last && start + j as u64 == len - 1 {
                    skip_last = false;
                    continue;
                }
                seen += 1;
                if seen == n {
                    return Ok((i, start + j as u64 + 1));
                }
            }
            skip_last = false;
            end = start;
        }
        // The whole file counts: its first record is one more.
        seen += u64::from(len > 0);
        if seen >= n {
            return Ok((i, 0));
        }
    }
    Ok((0, 0))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dir(name: &str) -> PathBuf {
        let d =
            std::env::temp_dir().join(format!("holdfast-apilogs-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).expect("mkdir");
        d
    }

    fn rec(t: &str, s: &str, tag: &str, c: &str) -> String {
        format!("{t} {s} {tag} {c}\n")
    }

    fn read(live: &Path, opts: &LogOptions) -> String {
        let mut out = Vec::new();
        stream(live, opts, None, &|_| false, &mut out).expect("stream");
        String::from_utf8(out).expect("utf8")
    }

    #[test]
    fn options_across_rotated_files() {
        let d = dir("rot");
        let live = d.join("0.log");
        std::fs::write(
            d.join("0.log.20261201-000001"),
            rec("2026-12-01T00:00:01Z", "stdout", "F", "one")
                + &rec("2026-12-01T00:00:02Z", "stderr", "F", "two"),
        )
        .expect("write");
        std::fs::write(
            &live,
            rec("2026-12-01T00:00:03Z", "stdout", "P", "thr")
                + &rec("2026-12-01T00:00:03.5Z", "stdout", "F", "ee")
                + &rec("2026-12-01T00:00:04Z", "stdout", "F", "four"),
        )
        .expect("write");
        let all = LogOptions::default();
        assert_eq!(read(&live, &all), "one\ntwo\nthree\nfour\n");
        let tail = |n| LogOptions {
            tail_lines: Some(n),
            ..LogOptions::default()
        };
        assert_eq!(read(&live, &tail(1)), "four\n");
        assert_eq!(read(&live, &tail(3)), "three\nfour\n");
        assert_eq!(read(&live, &tail(4)), "two\nthree\nfour\n");
        assert_eq!(read(&live, &tail(99)), "one\ntwo\nthree\nfour\n");
        assert_eq!(read(&live, &tail(0)), "");
        let since = LogOptions {
            since: "2026-12-01T00:00:02Z".parse().ok(),
            ..LogOptions::default()
        };
        assert_eq!(read(&live, &since), "two\nthree\nfour\n");
        let limit = LogOptions {
            limit_bytes: Some(6),
            ..LogOptions::default()
        };
        assert_eq!(read(&live, &limit), "one\ntw");
        let ts = LogOptions {
            timestamps: true,
            tail_lines: Some(1),
            ..LogOptions::default()
        };
        assert_eq!(read(&live, &ts), "2026-12-01T00:00:04Z four\n");
        let _ = std::fs::remove_dir_all(&d);
    }

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
