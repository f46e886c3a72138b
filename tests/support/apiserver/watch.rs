//! Watches: HTTP 200, `Transfer-Encoding: chunked`, one compact JSON event plus `\n` per
//! chunk (`45`). From a resourceVersion the stream replays later changes only; with none
//! (or `0`) it starts with an ADDED per object (and, for `sendInitialEvents`, the
//! initial-events-end BOOKMARK). BOOKMARKs come every `bookmark_interval` and once
//! shortly before `timeoutSeconds`, carrying the resource's latest revision even when
//! the selector hid that change. A resourceVersion older than the compaction point is one
//! ERROR event (410 Expired) and the end (`62`). `drop_watches` cuts streams mid-body.

use std::io;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use super::api::{Route, PF};
use super::http::{write_chunk, write_last_chunk, write_stream_head, Request};
use super::resources::filter;
use super::server::Tls;
use super::status::{self, event_json, to_compact, ApiErr};
use super::store::{Change, EvType, Filter, Res, State};
use super::{lock, Shared};

/// A watch as requested.
#[derive(Debug, Clone)]
pub struct Spec {
    res: Res,
    filter: Filter,
    /// `None`: from now, with the current objects as ADDED first.
    from: Option<u64>,
    bookmarks: bool,
    initial_events_end: bool,
    timeout: Option<Duration>,
}

pub fn spec(_shared: &Shared, route: &Route, req: &Request) -> Result<Spec, ApiErr> {
    let rv = req.param("resourceVersion").unwrap_or_default();
    let from = match rv.as_str() {
        "" | "0" => None,
        s => Some(
            s.parse::<u64>()
                .map_err(|_| status::bad_request(format!("invalid resource version: {s}")))?,
        ),
    };
    let bookmarks = req.param("allowWatchBookmarks").as_deref() == Some("true");
    Ok(Spec {
        res: route.res,
        filter: filter(route, req),
        from,
        bookmarks,
        initial_events_end: bookmarks && req.param("sendInitialEvents").as_deref() == Some("true"),
        timeout: req
            .param("timeoutSeconds")
            .and_then(|t| t.parse::<u64>().ok())
            .filter(|t| *t > 0)
            .map(Duration::from_secs),
    })
}

fn with_kind(res: Res, mut o: Value) -> Value {
    o["kind"] = json!(res.kind());
    o["apiVersion"] = json!(res.api_version());
    o
}

/// What a change looks like through `filter` (a MODIFIED that leaves or enters the
/// selection is a DELETED or an ADDED).
fn translate(c: &Change, res: Res, f: &Filter) -> Option<String> {
    if c.res != res {
        return None;
    }
    let now = f.matches(&c.obj);
    let before = c.prev.as_ref().is_some_and(|p| f.matches(p));
    let ty = match c.ty {
        EvType::Added if now => EvType::Added,
        EvType::Modified if now && before => EvType::Modified,
        EvType::Modified if now => EvType::Added,
        EvType::Modified if before => EvType::Deleted,
        EvType::Deleted if now => EvType::Deleted,
        _ => return None,
    };
    Some(event_json(
        ty.name(),
        &to_compact(&with_kind(res, c.obj.clone())),
    ))
}

fn bookmark(state: &State, spec: &Spec, end_of_initial: bool) -> String {
    let rv = state
        .type_rv
        .get(&spec.res)
        .copied()
        .unwrap_or(0)
        .max(spec.from.unwrap_or(0));
    let annotations = end_of_initial.then(|| json!({"k8s.io/initial-events-end": "true"}));
    let rv = if end_of_initial { state.rv } else { rv };
    event_json("BOOKMARK", &to_compact(&spec.res.bookmark(rv, annotations)))
}

/// Marks the connection as a watch while it streams.
struct Open<'a> {
    shared: &'a Shared,
    conn: u64,
}

impl Drop for Open<'_> {
    fn drop(&mut self) {
        lock(&self.shared.state).watches -= 1;
        if let Some(c) = lock(&self.shared.conns).open.get_mut(&self.conn) {
            c.1 = false;
        }
        self.shared.changed.notify_all();
    }
}

fn cut() -> io::Error {
    io::Error::new(io::ErrorKind::ConnectionAborted, "watch cut")
}

pub fn stream(
    shared: &Shared,
    conn: u64,
    spec: Spec,
    audit: &str,
    out: &mut Tls,
) -> io::Result<()> {
    let started = Instant::now();
    let end = spec.timeout.map(|t| started + t);
    let before = shared.options.bookmark_before_timeout;
    let mut last_bookmark = end
        .and_then(|e| e.checked_sub(before))
        .filter(|t| *t > started);
    let mut next_periodic = started + shared.options.bookmark_interval;
    let mut pending: Vec<String> = Vec::new();
    let (epoch, mut cursor) = {
        let mut state = lock(&shared.state);
        if let Some(from) = spec.from.filter(|f| *f < state.compacted) {
            let message = format!("too old resource version: {from} ({})", state.compacted);
            drop(state);
            let e = ApiErr::new(410, "Expired", message);
            write_stream_head(out, 200, audit, &PF)?;
            write_chunk(out, event_json("ERROR", &e.event_object()).as_bytes())?;
            return write_last_chunk(out);
        }
        if spec.from.is_none() {
            for (_, o) in state.current(spec.res) {
                if spec.filter.matches(&o) {
                    pending.push(event_json("ADDED", &to_compact(&with_kind(spec.res, o))));
                }
            }
            if spec.initial_events_end {
                pending.push(bookmark(&state, &spec, true));
            }
        }
        state.watches += 1;
        (state.watch_epoch, spec.from.unwrap_or(state.rv))
    };
    if let Some(c) = lock(&shared.conns).open.get_mut(&conn) {
        c.1 = true;
    }
    let _open = Open { shared, conn };
    write_stream_head(out, 200, audit, &PF)?;
    loop {
        for e in pending.drain(..) {
            write_chunk(out, e.as_bytes())?;
        }
        let mut state = lock(&shared.state);
        loop {
            if shared.stop.load(Ordering::SeqCst) || state.watch_epoch != epoch {
                return Err(cut());
            }
            let start = state.history.partition_point(|c| c.rv <= cursor);
            for c in &state.history[start..] {
                if let Some(e) = translate(c, spec.res, &spec.filter) {
                    pending.push(e);
                }
            }
            cursor = cursor.max(state.rv);
            if !pending.is_empty() {
                break;
            }
            let now = Instant::now();
            if end.is_some_and(|e| now >= e) {
                drop(state);
                return write_last_chunk(out);
            }
            if spec.bookmarks {
                if last_bookmark.is_some_and(|t| now >= t) {
                    last_bookmark = None;
                    pending.push(bookmark(&state, &spec, false));
                    break;
                }
                if now >= next_periodic {
                    next_periodic += shared.options.bookmark_interval;
                    pending.push(bookmark(&state, &spec, false));
                    break;
                }
            }
            let mut wake = end.unwrap_or(now + Duration::from_secs(3600));
            if spec.bookmarks {
                wake = wake.min(next_periodic);
                if let Some(t) = last_bookmark {
                    wake = wake.min(t);
                }
            }
            let wait = wake
                .saturating_duration_since(now)
                .clamp(Duration::from_millis(1), Duration::from_secs(1));
            state = shared
                .changed
                .wait_timeout(state, wait)
                .map(|(g, _)| g)
                .unwrap_or_else(|e| e.into_inner().0);
        }
    }
}
