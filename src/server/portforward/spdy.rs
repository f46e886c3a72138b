//! Port-forward over SPDY/3.1 (`X-Stream-Protocol-Version: portforward.k8s.io`), as
//! the apiserver relays `kubectl port-forward` to the kubelet: for each connection the
//! client opens two streams with the same `requestID` header, an error stream and a
//! data stream (`streamType`), both naming the `port`. Once both are there the
//! connection to the pod is made; its bytes go on the data stream, a failure as text
//! on the error stream, and both streams end with a FIN when it closes.
//!
//! A stream with a bad `port` or `streamType` header is refused (RST_STREAM), as the
//! kubelet's stream handler refuses it. Older clients send no `requestID`: the pair is
//! then found from the stream ids, as the kubelet does. A pair still incomplete after
//! 30 s gets an error.

use std::collections::HashMap;
use std::sync::Arc;

use tokio::io::{AsyncWriteExt, WriteHalf};
use tokio::sync::mpsc;
use tokio::task::{AbortHandle, JoinSet};
use tokio::time::Instant;

use super::tunnel::{forward, parse_port, Downlink, Out, Target, INPUT_QUEUE, MAX_CONNECTIONS};
use crate::server::deps::ApiDeps;
use crate::server::spdy::{
    control, data, goaway, read_frame, Frame, Headers, FLAG_FIN, GOAWAY, PING, RST_STREAM,
    STREAM_WAIT, SYN_REPLY, SYN_STREAM,
};
use crate::server::streams::Upgraded;

pub const PROTOCOL: &str = "portforward.k8s.io";
/// RST_STREAM status CANCEL, what spdystream sends when a stream is refused.
const CANCEL: u32 = 5;
/// Frames queued for the writer.
const OUT_QUEUE: usize = 32;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Data,
    Error,
}

/// One forwarded connection's two streams.
struct Pair {
    port: u16,
    data: Option<u32>,
    error: Option<u32>,
    created: Instant,
    /// Client data for the connection (queued until it is made); None after FIN.
    input: Option<mpsc::Sender<Vec<u8>>>,
    waiting: Option<mpsc::Receiver<Vec<u8>>>,
    running: Option<AbortHandle>,
}

pub async fn session(io: Upgraded, deps: Arc<ApiDeps>, target: Target) -> std::io::Result<()> {
    let (mut rd, wr) = tokio::io::split(io);
    let (tx, rx) = mpsc::channel::<Out>(OUT_QUEUE);
    let writer = tokio::spawn(write_loop(wr, rx));
    // Frames are read by a task of their own: reading is not cancel-safe, and the
    // loop below also waits for timers and finished connections.
    let (frames_tx, mut frames) = mpsc::channel::<Frame>(4);
    let reader = tokio::spawn(async move {
        while let Ok(f) = read_frame(&mut rd).await {
            if frames_tx.send(f).await.is_err() {
                break;
            }
        }
    });
    let mut headers = Headers::default();
    let mut pairs: HashMap<String, Pair> = HashMap::new();
    let mut streams: HashMap<u32, (String, Kind)> = HashMap::new();
    let mut running: JoinSet<String> = JoinSet::new();
    let mut tick = tokio::time::interval(std::time::Duration::from_secs(1));
    loop {
        tokio::select! {
            f = frames.recv() => {
                let Some(f) = f else { break };
                let go_on = on_frame(f, &mut headers, &mut pairs, &mut streams, &tx).await;
                if !go_on {
                    break;
                }
                start_complete(&mut pairs, &mut running, &deps, &target, &tx).await;
            }
            Some(done) = running.join_next(), if !running.is_empty() => {
                if let Ok(rid) = done {
                    if let Some(p) = pairs.remove(&rid) {
                        streams.retain(|id, _| Some(*id) != p.data && Some(*id) != p.error);
                    }
                }
            }
            _ = tick.tick() => {
                let stale: Vec<String> = pairs
                    .iter()
                    .filter(|(_, p)| p.running.is_none() && p.created.elapsed() > STREAM_WAIT)
                    .map(|(k, _)| k.clone())
                    .collect();
                for rid in stale {
                    if let Some(p) = pairs.remove(&rid) {
                        if let Some(e) = p.error {
                            let msg = format!("request {rid}: timed out waiting for streams");
                            let _ = tx.send(Out::Data(e, msg.into_bytes(), true)).await;
                        }
                        if let Some(d) = p.data {
                            let _ = tx.send(Out::Data(d, Vec::new(), true)).await;
                        }
                    }
                }
            }
        }
    }
    // The client is gone or said goodbye: its connections end with it.
    running.abort_all();
    reader.abort();
    drop(tx);
    let _ = writer.await;
    Ok(())
}

/// Handles one frame from the client; false once the session is over.
async fn on_frame(
    f: Frame,
    headers: &mut Headers,
    pairs: &mut HashMap<String, Pair>,
    streams: &mut HashMap<u32, (String, Kind)>,
    tx: &mpsc::Sender<Out>,
) -> bool {
    match f {
        Frame::Control { kind, payload, .. } => match kind {
            SYN_STREAM => {
                let Some(id) = stream_id(&payload) else {
                    return false;
                };
                let Ok(pairs_in) = headers.decode(payload.get(10..).unwrap_or(&[])) else {
                    // The compression state is lost: nothing more can be read.
                    return false;
                };
                match new_stream(id, &pairs_in, pairs) {
                    Ok((rid, kind)) => {
                        streams.insert(id, (rid, kind));
                        let _ = tx.send(Out::Reply(id)).await;
                    }
                    Err(why) => {
                        log::debug!("kubelet API: port-forward stream {id} refused: {why}");
                        let mut p = id.to_be_bytes().to_vec();
                        p.extend_from_slice(&CANCEL.to_be_bytes());
                        let _ = tx.send(Out::Raw(control(RST_STREAM, 0, &p))).await;
                    }
                }
                true
            }
            RST_STREAM => {
                let rid = stream_id(&payload)
                    .and_then(|id| streams.get(&id))
                    .map(|(rid, _)| rid.clone());
                if let Some(rid) = rid {
                    if let Some(p) = pairs.remove(&rid) {
                        if let Some(h) = p.running {
                            h.abort();
                        }
                        streams.retain(|id, _| Some(*id) != p.data && Some(*id) != p.error);
                    }
                }
                true
            }
            PING => tx.send(Out::Raw(control(PING, 0, &payload))).await.is_ok(),
            GOAWAY => false,
            _ => true,
        },
        Frame::Data {
            stream,
            flags,
            payload,
        } => {
            let Some((rid, Kind::Data)) = streams.get(&stream) else {
                // The error stream's FIN (clients close their side at once), or a
                // stream already gone.
                return true;
            };
            let Some(p) = pairs.get_mut(rid) else {
                return true;
            };
            if let Some(input) = &p.input {
                if !payload.is_empty() {
                    let sent = if p.running.is_some() {
                        input.send(payload).await.is_ok()
                    } else {
                        // Not connected yet: queue what fits; more is a client that
                        // does not wait for its streams, cut off.
                        input.try_send(payload).is_ok()
                    };
                    if !sent {
                        p.input = None;
                    }
                }
            }
            if flags & FLAG_FIN != 0 {
                p.input = None;
            }
            true
        }
    }
}

fn stream_id(payload: &[u8]) -> Option<u32> {
    let b = payload.get(..4)?;
    Some(u32::from_be_bytes([b[0], b[1], b[2], b[3]]) & 0x7fff_ffff)
}

/// Checks a new stream's headers and files it under its request; returns the request
/// id and the stream's kind, or why it is refused.
fn new_stream(
    id: u32,
    headers: &[(String, String)],
    pairs: &mut HashMap<String, Pair>,
) -> Result<(String, Kind), String> {
    let get = |k: &str| {
        headers
            .iter()
            .find(|(n, _)| n == k)
            .map(|(_, v)| v.as_str())
    };
    let port = match get("port") {
        None | Some("") => return Err("\"port\" header is required".into()),
        Some(p) => parse_port(p)?,
    };
    let kind = match get("streamtype") {
        Some("data") => Kind::Data,
        Some("error") => Kind::Error,
        None | Some("") => return Err("\"streamType\" header is required".into()),
        Some(other) => return Err(format!("invalid stream type {other:?}")),
    };
    let rid = match get("requestid").filter(|r| !r.is_empty()) {
        Some(r) => r.to_owned(),
        // Older clients: an error stream and the data stream after it, ids two apart.
        None => match kind {
            Kind::Error => id.to_string(),
            Kind::Data => id.saturating_sub(2).to_string(),
        },
    };
    let pair = pairs.entry(rid.clone()).or_insert_with(|| {
        let (input, waiting) = mpsc::channel(INPUT_QUEUE);
        Pair {
            port,
            data: None,
            error: None,
            created: Instant::now(),
            input: Some(input),
            waiting: Some(waiting),
            running: None,
        }
    });
    let slot = match kind {
        Kind::Data => &mut pair.data,
        Kind::Error => &mut pair.error,
    };
    if slot.is_some() {
        return Err(format!("request {rid} already has a {kind:?} stream"));
    }
    *slot = Some(id);
    Ok((rid, kind))
}

/// Starts the connections whose two streams are both there.
async fn start_complete(
    pairs: &mut HashMap<String, Pair>,
    running: &mut JoinSet<String>,
    deps: &Arc<ApiDeps>,
    target: &Target,
    tx: &mpsc::Sender<Out>,
) {
    let ready: Vec<String> = pairs
        .iter()
        .filter(|(_, p)| p.running.is_none() && p.data.is_some() && p.error.is_some())
        .map(|(k, _)| k.clone())
        .collect();
    for rid in ready {
        let Some(p) = pairs.get_mut(&rid) else {
            continue;
        };
        let (Some(data), Some(error), Some(waiting)) = (p.data, p.error, p.waiting.take()) else {
            continue;
        };
        let down = Downlink::Spdy {
            tx: tx.clone(),
            data,
            error,
        };
        if running.len() >= MAX_CONNECTIONS {
            let msg = format!(
                "error forwarding port {} to pod {}: {MAX_CONNECTIONS} connections are forwarded already",
                p.port, target.pod
            );
            down.error(&msg).await;
            down.close().await;
            pairs.remove(&rid);
            continue;
        }
        let (deps, target, port, id) = (deps.clone(), target.clone(), p.port, rid.clone());
        let handle = running.spawn(async move {
            forward(deps, target, port, waiting, down).await;
            id
        });
        p.running = Some(handle);
    }
}

async fn write_loop(mut wr: WriteHalf<Upgraded>, mut rx: mpsc::Receiver<Out>) {
    let mut headers = Headers::default();
    // The last stream of the client's that was taken, for the GOAWAY.
    let mut last = 0;
    while let Some(out) = rx.recv().await {
        let frame = match out {
            Out::Reply(id) => {
                last = last.max(id);
                let mut p = id.to_be_bytes().to_vec();
                p.extend_from_slice(&headers.encode(&[]));
                control(SYN_REPLY, 0, &p)
            }
            Out::Data(id, d, fin) => data(id, if fin { FLAG_FIN } else { 0 }, &d),
            Out::Raw(f) => f,
        };
        if wr.write_all(&frame).await.is_err() {
            return;
        }
    }
    let _ = wr.write_all(&goaway(last)).await;
    let _ = wr.flush().await;
    let _ = wr.shutdown().await;
}

#[cfg(test)]
mod tests {
    use super::*;

    fn h(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn streams_pair_up_by_request_id_or_stream_id() {
        let mut pairs = HashMap::new();
        let e = new_stream(
            1,
            &h(&[("streamtype", "error"), ("port", "80"), ("requestid", "0")]),
            &mut pairs,
        );
        assert_eq!(e, Ok(("0".into(), Kind::Error)));
        let d = new_stream(
            3,
            &h(&[("streamtype", "data"), ("port", "80"), ("requestid", "0")]),
            &mut pairs,
        );
        assert_eq!(d, Ok(("0".into(), Kind::Data)));
        assert_eq!((pairs["0"].error, pairs["0"].data), (Some(1), Some(3)));
        // Twice the same kind for one request: refused.
        assert!(new_stream(
            5,
            &h(&[("streamtype", "data"), ("port", "80"), ("requestid", "0")]),
            &mut pairs
        )
        .is_err());
        // No requestID: error stream 7 and data stream 9 make request "7".
        let _ = new_stream(
            7,
            &h(&[("streamtype", "error"), ("port", "81")]),
            &mut pairs,
        );
        let d = new_stream(9, &h(&[("streamtype", "data"), ("port", "81")]), &mut pairs);
        assert_eq!(d, Ok(("7".into(), Kind::Data)));
        // Bad headers: refused.
        for bad in [
            h(&[("streamtype", "data")]),
            h(&[("streamtype", "data"), ("port", "0")]),
            h(&[("streamtype", "data"), ("port", "99999")]),
            h(&[("port", "80")]),
            h(&[("streamtype", "stdin"), ("port", "80")]),
        ] {
            assert!(new_stream(11, &bad, &mut pairs).is_err(), "{bad:?}");
        }
    }
}
