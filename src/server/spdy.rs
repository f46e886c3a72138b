//! SPDY/3.1 as the kube-apiserver speaks it to the kubelet (`Upgrade: SPDY/3.1`,
//! `X-Stream-Protocol-Version: v4.channel.k8s.io`): the client opens one stream per
//! channel with a SYN_STREAM whose `streamtype` header says which (error, stdin,
//! stdout, stderr, resize); the server answers each with a SYN_REPLY, starts the
//! command once every expected stream is there, and ends by writing the status JSON
//! on the error stream and closing every stream.
//!
//! Header blocks ([`headers`]) are one zlib stream per direction, primed with the
//! SPDY/3 dictionary (`spdy3.dict`, 1423 bytes, from the SPDY/3 draft). Flow control
//! is not enforced: the peers Kubernetes uses (moby/spdystream) send no WINDOW_UPDATE
//! either.

use std::collections::HashMap;
use std::time::Duration;

use hyper::body::Incoming;
use hyper::{Request, StatusCode};
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

use super::http::{error, Body, Resp};
use super::streams::{sizes, Ends, In, Launch, Opts, Out, Upgraded};

mod headers;
pub use headers::Headers;

const PROTOCOL: &str = "v4.channel.k8s.io";
const VERSION: u16 = 3;
pub const SYN_STREAM: u16 = 1;
pub const SYN_REPLY: u16 = 2;
pub const RST_STREAM: u16 = 3;
pub const PING: u16 = 6;
pub const GOAWAY: u16 = 7;
pub const FLAG_FIN: u8 = 1;
/// The largest frame accepted (header blocks and stdin chunks are far smaller).
const MAX_FRAME: usize = 1 << 20;
/// How long the client has to open its streams (the kubelet's default).
pub const STREAM_WAIT: Duration = Duration::from_secs(30);

pub fn is_upgrade(req: &Request<Incoming>) -> bool {
    req.headers()
        .get(hyper::header::UPGRADE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.eq_ignore_ascii_case("SPDY/3.1"))
}

pub fn upgrade(req: Request<Incoming>, opts: Opts, start: Launch) -> Resp {
    accept(req, &[PROTOCOL], move |io, _| session(io, opts, start))
}

/// Answers an upgrade to SPDY/3.1 with the first of `protocols` the client offers in
/// `X-Stream-Protocol-Version` (403 if none), then runs `serve` on the connection.
pub fn accept<F, Fut>(req: Request<Incoming>, protocols: &'static [&'static str], serve: F) -> Resp
where
    F: FnOnce(Upgraded, &'static str) -> Fut + Send + 'static,
    Fut: std::future::Future<Output = std::io::Result<()>> + Send + 'static,
{
    let offered: Vec<String> = req
        .headers()
        .get_all("X-Stream-Protocol-Version")
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(',').map(|s| s.trim().to_owned()))
        .collect();
    let Some(protocol) = protocols
        .iter()
        .copied()
        .find(|p| offered.iter().any(|o| o == p))
    else {
        return error(
            StatusCode::FORBIDDEN,
            &format!(
                "unable to upgrade: unable to negotiate protocol: client supports {offered:?}, server supports {protocols:?}"
            ),
        );
    };
    let mut resp = hyper::Response::new(Body::Full(None));
    *resp.status_mut() = StatusCode::SWITCHING_PROTOCOLS;
    let h = resp.headers_mut();
    h.insert(
        hyper::header::UPGRADE,
        hyper::header::HeaderValue::from_static("SPDY/3.1"),
    );
    h.insert(
        hyper::header::CONNECTION,
        hyper::header::HeaderValue::from_static("Upgrade"),
    );
    h.insert(
        "X-Stream-Protocol-Version",
        hyper::header::HeaderValue::from_static(protocol),
    );
    tokio::spawn(async move {
        match hyper::upgrade::on(req).await {
            Ok(upgraded) => {
                if let Err(e) = serve(TokioIo::new(upgraded), protocol).await {
                    log::debug!("kubelet API: spdy stream: {e}");
                }
            }
            Err(e) => log::debug!("kubelet API: spdy upgrade: {e}"),
        }
    });
    resp
}

/// One frame as read.
#[derive(Debug, PartialEq)]
pub enum Frame {
    Control {
        kind: u16,
        flags: u8,
        payload: Vec<u8>,
    },
    Data {
        stream: u32,
        flags: u8,
        payload: Vec<u8>,
    },
}

pub async fn read_frame<R: AsyncRead + Unpin>(rd: &mut R) -> std::io::Result<Frame> {
    let mut h = [0u8; 8];
    rd.read_exact(&mut h).await?;
    let flags = h[4];
    let len = u32::from_be_bytes([0, h[5], h[6], h[7]]) as usize;
    if len > MAX_FRAME {
        return Err(std::io::Error::other(format!("spdy frame of {len} bytes")));
    }
    let mut payload = vec![0u8; len];
    rd.read_exact(&mut payload).await?;
    if h[0] & 0x80 != 0 {
        let version = u16::from_be_bytes([h[0] & 0x7f, h[1]]);
        if version != VERSION {
            return Err(std::io::Error::other(format!("spdy version {version}")));
        }
        Ok(Frame::Control {
            kind: u16::from_be_bytes([h[2], h[3]]),
            flags,
            payload,
        })
    } else {
        Ok(Frame::Data {
            stream: u32::from_be_bytes([h[0], h[1], h[2], h[3]]),
            flags,
            payload,
        })
    }
}

pub fn control(kind: u16, flags: u8, payload: &[u8]) -> Vec<u8> {
    let mut f = Vec::with_capacity(8 + payload.len());
    f.extend_from_slice(&(0x8000 | VERSION).to_be_bytes());
    f.extend_from_slice(&kind.to_be_bytes());
    f.push(flags);
    f.extend_from_slice(&(payload.len() as u32).to_be_bytes()[1..]);
    f.extend_from_slice(payload);
    f
}

/// GOAWAY with status OK, naming the last stream of the client's that was taken (as
/// spdystream's Close does; 0 when none was).
pub fn goaway(last_good: u32) -> Vec<u8> {
    let mut p = Vec::with_capacity(8);
    p.extend_from_slice(&(last_good & 0x7fff_ffff).to_be_bytes());
    p.extend_from_slice(&0u32.to_be_bytes());
    control(GOAWAY, 0, &p)
}

pub fn data(stream: u32, flags: u8, payload: &[u8]) -> Vec<u8> {
    let mut f = Vec::with_capacity(8 + payload.len());
    f.extend_from_slice(&(stream & 0x7fff_ffff).to_be_bytes());
    f.push(flags);
    f.extend_from_slice(&(payload.len() as u32).to_be_bytes()[1..]);
    f.extend_from_slice(payload);
    f
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Channel {
    Error,
    Stdin,
    Stdout,
    Stderr,
    Resize,
}

async fn session<IO>(io: IO, opts: Opts, start: Launch) -> std::io::Result<()>
where
    IO: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let (mut rd, mut wr) = tokio::io::split(io);
    let mut headers = Headers::default();
    // Streams first: the command starts once every expected one is open.
    let streams = open_streams(&mut rd, &mut wr, &mut headers, &wanted(opts)).await?;
    let Ends {
        input,
        output,
        status,
    } = start(opts).await;
    let (ctl_tx, ctl_rx) = tokio::sync::mpsc::channel::<Vec<u8>>(4);
    let stdin_id = streams.get(&Channel::Stdin).copied();
    let resize_id = streams.get(&Channel::Resize).copied();
    let reader = tokio::spawn(read_client(rd, input, stdin_id, resize_id, ctl_tx));
    let out = Outputs {
        stdout: streams.get(&Channel::Stdout).copied(),
        stderr: streams.get(&Channel::Stderr).copied(),
    };
    write_output(&mut wr, &mut headers, output, ctl_rx, out).await?;
    let st = status.await.unwrap_or_default();
    finish(&mut wr, &streams, &st).await?;
    reader.abort();
    Ok(())
}

/// The streams a client with these options opens: always the error stream.
fn wanted(opts: Opts) -> Vec<Channel> {
    let mut want = vec![Channel::Error];
    if opts.stdin {
        want.push(Channel::Stdin);
    }
    if opts.stdout {
        want.push(Channel::Stdout);
    }
    if opts.stderr {
        want.push(Channel::Stderr);
    }
    if opts.tty {
        want.push(Channel::Resize);
    }
    want
}

/// Answers the client's SYN_STREAMs until every stream in `want` is open, within
/// [`STREAM_WAIT`]; returns each channel's stream id.
async fn open_streams<R, W>(
    rd: &mut R,
    wr: &mut W,
    headers: &mut Headers,
    want: &[Channel],
) -> std::io::Result<HashMap<Channel, u32>>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let mut streams: HashMap<Channel, u32> = HashMap::new();
    let deadline = tokio::time::Instant::now() + STREAM_WAIT;
    while want.iter().any(|c| !streams.contains_key(c)) {
        let f = tokio::time::timeout_at(deadline, read_frame(rd))
            .await
            .map_err(|_| std::io::Error::other("timed out waiting for the client's streams"))??;
        if let Some(reply) = on_control(&f, headers, &mut streams)? {
            wr.write_all(&reply).await?;
        }
    }
    Ok(streams)
}

/// What the client sends once the command runs: stdin and terminal sizes go to
/// `input`; pings and late SYN_STREAMs go to the writer through `ctl` (it holds the
/// compressor). The client's end (GOAWAY, or the connection closing) ends stdin.
async fn read_client<R>(
    mut rd: R,
    input: tokio::sync::mpsc::Sender<In>,
    stdin_id: Option<u32>,
    resize_id: Option<u32>,
    ctl: tokio::sync::mpsc::Sender<Vec<u8>>,
) where
    R: AsyncRead + Unpin,
{
    let mut resize_buf = Vec::new();
    while let Ok(f) = read_frame(&mut rd).await {
        match &f {
            Frame::Data {
                stream,
                flags,
                payload,
            } => {
                if Some(*stream) == stdin_id {
                    if !payload.is_empty() && input.send(In::Stdin(payload.clone())).await.is_err()
                    {
                        break;
                    }
                    if flags & FLAG_FIN != 0 {
                        let _ = input.send(In::StdinEof).await;
                    }
                } else if Some(*stream) == resize_id {
                    resize_buf.extend_from_slice(payload);
                    for s in sizes(&mut resize_buf) {
                        let _ = input.send(In::Resize(s.width, s.height)).await;
                    }
                    if resize_buf.len() > 4096 {
                        resize_buf.clear();
                    }
                }
            }
            Frame::Control { kind, payload, .. } => {
                if *kind == GOAWAY {
                    break;
                }
                if *kind == RST_STREAM
                    && payload
                        .get(..4)
                        .map(|p| u32::from_be_bytes([p[0], p[1], p[2], p[3]]))
                        == stdin_id
                {
                    let _ = input.send(In::StdinEof).await;
                }
                if *kind == PING {
                    let _ = ctl.send(control(PING, 0, payload)).await;
                }
                // A late SYN_STREAM (a stream not asked for) still gets its
                // reply; the writer holds the compressor, so it is asked to.
                if *kind == SYN_STREAM {
                    if let Some(id) = payload.get(..4) {
                        let id = u32::from_be_bytes([id[0], id[1], id[2], id[3]]) & 0x7fff_ffff;
                        let _ = ctl.send(id.to_be_bytes().to_vec()).await;
                    }
                }
            }
        }
    }
    let _ = input.send(In::StdinEof).await;
}

/// The streams the command's output goes to.
struct Outputs {
    stdout: Option<u32>,
    stderr: Option<u32>,
}

/// Writes the command's output, and what the reader asks to be sent, until the output
/// ends.
async fn write_output<W>(
    wr: &mut W,
    headers: &mut Headers,
    mut output: tokio::sync::mpsc::Receiver<Out>,
    mut ctl_rx: tokio::sync::mpsc::Receiver<Vec<u8>>,
    to: Outputs,
) -> std::io::Result<()>
where
    W: AsyncWrite + Unpin,
{
    loop {
        tokio::select! {
            msg = output.recv() => match msg {
                Some(Out::Stdout(d)) => if let Some(id) = to.stdout {
                    wr.write_all(&data(id, 0, &d)).await?
                },
                Some(Out::Stderr(d)) => if let Some(id) = to.stderr {
                    wr.write_all(&data(id, 0, &d)).await?
                },
                None => return Ok(()),
            },
            Some(ctl) = ctl_rx.recv() => {
                if ctl.len() == 4 {
                    // A SYN_STREAM that came late: reply to it.
                    let id = u32::from_be_bytes([ctl[0], ctl[1], ctl[2], ctl[3]]);
                    wr.write_all(&reply(headers, id)).await?;
                } else {
                    wr.write_all(&ctl).await?;
                }
            }
        }
    }
}

/// The end: the status on the error stream, FIN on the output streams, GOAWAY.
async fn finish<W>(
    wr: &mut W,
    streams: &HashMap<Channel, u32>,
    status: &k8s_openapi::apimachinery::pkg::apis::meta::v1::Status,
) -> std::io::Result<()>
where
    W: AsyncWrite + Unpin,
{
    let json = serde_json::to_vec(status).unwrap_or_default();
    if let Some(id) = streams.get(&Channel::Error) {
        wr.write_all(&data(*id, FLAG_FIN, &json)).await?;
    }
    for c in [Channel::Stdout, Channel::Stderr] {
        if let Some(id) = streams.get(&c) {
            wr.write_all(&data(*id, FLAG_FIN, &[])).await?;
        }
    }
    let last = streams.values().copied().max().unwrap_or(0);
    wr.write_all(&goaway(last)).await?;
    wr.flush().await?;
    let _ = wr.shutdown().await;
    Ok(())
}

fn reply(headers: &mut Headers, id: u32) -> Vec<u8> {
    let mut p = Vec::new();
    p.extend_from_slice(&(id & 0x7fff_ffff).to_be_bytes());
    p.extend_from_slice(&headers.encode(&[]));
    control(SYN_REPLY, 0, &p)
}

/// Handles a control frame while streams are being opened; returns what to send.
fn on_control(
    f: &Frame,
    headers: &mut Headers,
    streams: &mut HashMap<Channel, u32>,
) -> std::io::Result<Option<Vec<u8>>> {
    let Frame::Control { kind, payload, .. } = f else {
        return Ok(None);
    };
    match *kind {
        SYN_STREAM => {
            if payload.len() < 10 {
                return Err(std::io::Error::other("short SYN_STREAM"));
            }
            let id =
                u32::from_be_bytes([payload[0], payload[1], payload[2], payload[3]]) & 0x7fff_ffff;
            let pairs = headers
                .decode(&payload[10..])
                .map_err(std::io::Error::other)?;
            let kind = pairs
                .iter()
                .find(|(k, _)| k == "streamtype")
                .map(|(_, v)| v.as_str());
            let channel = match kind {
                Some("error") => Some(Channel::Error),
                Some("stdin") => Some(Channel::Stdin),
                Some("stdout") => Some(Channel::Stdout),
                Some("stderr") => Some(Channel::Stderr),
                Some("resize") => Some(Channel::Resize),
                _ => None,
            };
            if let Some(c) = channel {
                streams.insert(c, id);
            }
            Ok(Some(reply(headers, id)))
        }
        PING => Ok(Some(control(PING, 0, payload))),
        GOAWAY => Err(std::io::Error::other("the client went away")),
        _ => Ok(None),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn frames_round_trip() {
        let mut wire = control(PING, 0, &7u32.to_be_bytes());
        wire.extend(data(5, FLAG_FIN, b"hi"));
        let mut r = &wire[..];
        assert_eq!(
            read_frame(&mut r).await.expect("ping"),
            Frame::Control {
                kind: PING,
                flags: 0,
                payload: 7u32.to_be_bytes().to_vec()
            }
        );
        let mut wire = goaway(7);
        wire.extend(data(5, FLAG_FIN, b"hi"));
        let mut g = &wire[..];
        assert_eq!(
            read_frame(&mut g).await.expect("goaway"),
            Frame::Control {
                kind: GOAWAY,
                flags: 0,
                payload: [7u32.to_be_bytes(), 0u32.to_be_bytes()].concat()
            }
        );
        assert_eq!(
            read_frame(&mut r).await.expect("data"),
            Frame::Data {
                stream: 5,
                flags: FLAG_FIN,
                payload: b"hi".to_vec()
            }
        );
    }
}
