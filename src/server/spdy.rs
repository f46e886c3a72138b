//! SPDY/3.1 as the kube-apiserver speaks it to the kubelet (`Upgrade: SPDY/3.1`,
//! `X-Stream-Protocol-Version: v4.channel.k8s.io`): the client opens one stream per
//! channel with a SYN_STREAM whose `streamtype` header says which (error, stdin,
//! stdout, stderr, resize); the server answers each with a SYN_REPLY, starts the
//! command once every expected stream is there, and ends by writing the status JSON
//! on the error stream and closing every stream.
//!
//! Header blocks are one zlib stream per direction, primed with the SPDY/3 dictionary
//! (`spdy3.dict`, 1423 bytes, from the SPDY/3 draft). Flow control is not enforced:
//! the peers Kubernetes uses (moby/spdystream) send no WINDOW_UPDATE either.

use std::collections::HashMap;
use std::time::Duration;

use flate2::{Decompress, FlushDecompress, Status};
use hyper::body::Incoming;
use hyper::{Request, StatusCode};
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

use super::http::{error, Body, Resp};
use super::streams::{sizes, In, Opts, Out, Start};

pub const DICTIONARY: &[u8] = include_bytes!("spdy3.dict");
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

pub fn upgrade(req: Request<Incoming>, opts: Opts, start: Start) -> Resp {
    accept(req, &[PROTOCOL], move |io, _| session(io, opts, start))
}

/// The upgraded connection a session gets.
pub type Upgraded = TokioIo<hyper::upgrade::Upgraded>;

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

/// The header blocks of one session: the client's decompressed, ours written.
///
/// Ours are zlib with stored (uncompressed) deflate blocks, written here: a
/// SPDY/3 peer inflates them like any other (with the dictionary's id in the zlib
/// header, as the spec asks), and the session keeps no deflate state, which zlib
/// would make 256 KiB per session for the few bytes of an empty SYN_REPLY.
pub struct Headers {
    inflate: Decompress,
    dictionary_set: bool,
    /// Whether our zlib header went out (it starts the session's one stream).
    header_sent: bool,
}

impl Default for Headers {
    fn default() -> Self {
        Headers {
            inflate: Decompress::new(true),
            dictionary_set: false,
            header_sent: false,
        }
    }
}

/// Adler-32 (RFC 1950), the dictionary's id in a zlib header.
fn adler32(data: &[u8]) -> u32 {
    let (mut a, mut b) = (1u32, 0u32);
    for chunk in data.chunks(5552) {
        for &x in chunk {
            a += u32::from(x);
            b += a;
        }
        a %= 65521;
        b %= 65521;
    }
    (b << 16) | a
}

impl Headers {
    /// Decodes a compressed header block into (name, value) pairs.
    pub fn decode(&mut self, block: &[u8]) -> Result<Vec<(String, String)>, String> {
        let mut out = Vec::with_capacity(block.len() * 4 + 64);
        let mut input = block;
        loop {
            let before_in = self.inflate.total_in();
            let before_out = self.inflate.total_out();
            if out.capacity() - out.len() < 256 {
                out.reserve(1024);
            }
            if out.len() > MAX_FRAME {
                return Err("header block too large".into());
            }
            match self
                .inflate
                .decompress_vec(input, &mut out, FlushDecompress::Sync)
            {
                Ok(Status::StreamEnd) => break,
                Ok(_) => {}
                Err(e) if e.needs_dictionary().is_some() && !self.dictionary_set => {
                    self.inflate
                        .set_dictionary(DICTIONARY)
                        .map_err(|e| format!("header dictionary: {e}"))?;
                    self.dictionary_set = true;
                }
                Err(e) => return Err(format!("header block: {e}")),
            }
            let used = (self.inflate.total_in() - before_in) as usize;
            input = &input[used..];
            let produced = self.inflate.total_out() - before_out;
            if input.is_empty() && out.len() < out.capacity() {
                break;
            }
            if used == 0 && produced == 0 && !input.is_empty() && out.len() < out.capacity() {
                return Err("header block does not decompress".into());
            }
        }
        parse_block(&out)
    }

    /// Encodes (name, value) pairs as a header block: the next piece of the session's
    /// zlib stream, stored blocks ended by a sync flush.
    pub fn encode(&mut self, pairs: &[(&str, &str)]) -> Vec<u8> {
        let mut raw = Vec::new();
        raw.extend_from_slice(&(pairs.len() as u32).to_be_bytes());
        for (k, v) in pairs {
            raw.extend_from_slice(&(k.len() as u32).to_be_bytes());
            raw.extend_from_slice(k.as_bytes());
            raw.extend_from_slice(&(v.len() as u32).to_be_bytes());
            raw.extend_from_slice(v.as_bytes());
        }
        let mut out = Vec::with_capacity(raw.len() + 16);
        if !self.header_sent {
            // CMF: deflate, 32 KiB window; FLG: FDICT, and a check making the pair a
            // multiple of 31; then the dictionary's id.
            let cmf: u16 = 0x78;
            let flg = 0x20u16;
            let check = 31 - ((cmf << 8) | flg) % 31;
            out.push(cmf as u8);
            out.push((flg | (check % 31)) as u8);
            out.extend_from_slice(&adler32(DICTIONARY).to_be_bytes());
            self.header_sent = true;
        }
        // Not the last block, stored: a 0 byte (BFINAL 0, BTYPE 00, padding), LEN, NLEN.
        for piece in raw.chunks(usize::from(u16::MAX)) {
            stored(&mut out, piece);
        }
        // The sync flush's empty stored block, as Go's zlib writer ends every block it
        // flushes. Go's inflater hands out what it has decoded only on reaching that
        // marker (or the final block): without it, it reads on past the frame's end,
        // takes that for a broken stream, and fails every later header block.
        stored(&mut out, &[]);
        out
    }
}

/// One non-final stored deflate block.
fn stored(out: &mut Vec<u8>, piece: &[u8]) {
    let len = piece.len() as u16;
    out.push(0);
    out.extend_from_slice(&len.to_le_bytes());
    out.extend_from_slice(&(!len).to_le_bytes());
    out.extend_from_slice(piece);
}

fn parse_block(b: &[u8]) -> Result<Vec<(String, String)>, String> {
    fn take<'a>(b: &'a [u8], at: &mut usize, n: usize) -> Result<&'a [u8], String> {
        let v = b
            .get(*at..at.saturating_add(n))
            .ok_or("short header block")?;
        *at += n;
        Ok(v)
    }
    fn len(b: &[u8], at: &mut usize) -> Result<usize, String> {
        let v = take(b, at, 4)?;
        Ok(u32::from_be_bytes([v[0], v[1], v[2], v[3]]) as usize)
    }
    let mut at = 0usize;
    let n = len(b, &mut at)?;
    let mut pairs = Vec::with_capacity(n.min(64));
    for _ in 0..n {
        let kl = len(b, &mut at)?;
        let k = take(b, &mut at, kl)?;
        let vl = len(b, &mut at)?;
        let v = take(b, &mut at, vl)?;
        pairs.push((
            String::from_utf8_lossy(k).to_lowercase(),
            String::from_utf8_lossy(v).into_owned(),
        ));
    }
    Ok(pairs)
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Channel {
    Error,
    Stdin,
    Stdout,
    Stderr,
    Resize,
}

async fn session<IO>(io: IO, opts: Opts, start: Start) -> std::io::Result<()>
where
    IO: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let (mut rd, mut wr) = tokio::io::split(io);
    let mut headers = Headers::default();
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
    let mut streams: HashMap<Channel, u32> = HashMap::new();
    let deadline = tokio::time::Instant::now() + STREAM_WAIT;
    // Streams first: the command starts once every expected one is open.
    while want.iter().any(|c| !streams.contains_key(c)) {
        let f = tokio::time::timeout_at(deadline, read_frame(&mut rd))
            .await
            .map_err(|_| std::io::Error::other("timed out waiting for the client's streams"))??;
        if let Some(reply) = on_control(&f, &mut headers, &mut streams)? {
            wr.write_all(&reply).await?;
        }
    }
    let ends = start.run(opts).await;
    let super::streams::Ends {
        input,
        mut output,
        status,
    } = ends;
    let stdin_id = streams.get(&Channel::Stdin).copied();
    let resize_id = streams.get(&Channel::Resize).copied();
    let (ctl_tx, mut ctl_rx) = tokio::sync::mpsc::channel::<Vec<u8>>(4);
    let reader = tokio::spawn(async move {
        let mut resize_buf = Vec::new();
        while let Ok(f) = read_frame(&mut rd).await {
            match &f {
                Frame::Data {
                    stream,
                    flags,
                    payload,
                } => {
                    if Some(*stream) == stdin_id {
                        if !payload.is_empty()
                            && input.send(In::Stdin(payload.clone())).await.is_err()
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
                        let _ = ctl_tx.send(control(PING, 0, payload)).await;
                    }
                    // A late SYN_STREAM (a stream not asked for) still gets its
                    // reply; the writer holds the compressor, so it is asked to.
                    if *kind == SYN_STREAM {
                        if let Some(id) = payload.get(..4) {
                            let id = u32::from_be_bytes([id[0], id[1], id[2], id[3]]) & 0x7fff_ffff;
                            let _ = ctl_tx.send(id.to_be_bytes().to_vec()).await;
                        }
                    }
                }
            }
        }
        let _ = input.send(In::StdinEof).await;
    });
    let out_id = streams.get(&Channel::Stdout).copied();
    let err_id = streams.get(&Channel::Stderr).copied();
    loop {
        tokio::select! {
            msg = output.recv() => match msg {
                Some(Out::Stdout(d)) => if let Some(id) = out_id {
                    wr.write_all(&data(id, 0, &d)).await?
                },
                Some(Out::Stderr(d)) => if let Some(id) = err_id {
                    wr.write_all(&data(id, 0, &d)).await?
                },
                None => break,
            },
            Some(ctl) = ctl_rx.recv() => {
                if ctl.len() == 4 {
                    // A SYN_STREAM that came late: reply to it.
                    let id = u32::from_be_bytes([ctl[0], ctl[1], ctl[2], ctl[3]]);
                    wr.write_all(&reply(&mut headers, id)).await?;
                } else {
                    wr.write_all(&ctl).await?;
                }
            }
        }
    }
    let st = status.await.unwrap_or_default();
    let json = serde_json::to_vec(&st).unwrap_or_default();
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
    reader.abort();
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
    use flate2::{Compress, Compression, FlushCompress};

    #[test]
    fn dictionary_is_the_spdy3_one() {
        assert_eq!(DICTIONARY.len(), 1423);
        assert!(DICTIONARY.starts_with(b"\x00\x00\x00\x07options"));
        assert!(DICTIONARY.ends_with(b"enq=0."));
    }

    #[test]
    fn header_blocks_round_trip_across_frames() {
        // Blocks a peer compresses with zlib and the dictionary, several on the same
        // stream as SPDY sends them, decode here; the blocks written here inflate
        // with zlib and the dictionary.
        let mut peer_deflate = Compress::new(Compression::default(), true);
        peer_deflate.set_dictionary(DICTIONARY).expect("dictionary");
        let mut peer_inflate = Decompress::new(true);
        let mut ours = Headers::default();
        for t in ["error", "stdin", "stdout"] {
            let raw = [
                &2u32.to_be_bytes()[..],
                &10u32.to_be_bytes(),
                b"streamtype",
                &(t.len() as u32).to_be_bytes(),
                t.as_bytes(),
                &4u32.to_be_bytes(),
                b"port",
                &4u32.to_be_bytes(),
                b"8080",
            ]
            .concat();
            let mut block = Vec::with_capacity(256);
            peer_deflate
                .compress_vec(&raw, &mut block, FlushCompress::Sync)
                .expect("deflate");
            let pairs = ours.decode(&block).expect("decode");
            assert_eq!(
                pairs,
                vec![
                    ("streamtype".to_string(), t.to_string()),
                    ("port".to_string(), "8080".to_string())
                ]
            );

            let block = ours.encode(&[("status", t)]);
            let mut out = Vec::with_capacity(256);
            let before = peer_inflate.total_in();
            if let Err(e) = peer_inflate.decompress_vec(&block, &mut out, FlushDecompress::Sync) {
                assert!(e.needs_dictionary().is_some(), "{e}");
                peer_inflate
                    .set_dictionary(DICTIONARY)
                    .expect("our dictionary id");
                let used = (peer_inflate.total_in() - before) as usize;
                peer_inflate
                    .decompress_vec(&block[used..], &mut out, FlushDecompress::Sync)
                    .expect("inflate");
            }
            assert_eq!(
                parse_block(&out),
                Ok(vec![("status".to_string(), t.to_string())])
            );
        }
        // RFC 1950's example.
        assert_eq!(adler32(b"Wikipedia"), 0x11E6_0398);
    }

    #[test]
    fn header_blocks_end_with_the_sync_flush_as_go_writes_them() {
        // Go's zlib writer ends each block it flushes with the empty stored block
        // 00 00 ff ff, and its inflater returns a block's bytes only on reaching it:
        // every block written here ends the same way, and is whole by itself.
        let mut peer_deflate = Compress::new(Compression::default(), true);
        peer_deflate.set_dictionary(DICTIONARY).expect("dictionary");
        let mut go_like = Vec::with_capacity(256);
        peer_deflate
            .compress_vec(b"\0\0\0\0", &mut go_like, FlushCompress::Sync)
            .expect("deflate");
        assert!(go_like.ends_with(&[0, 0, 0xff, 0xff]));
        let mut ours = Headers::default();
        for n in 0..3 {
            let block = ours.encode(&[]);
            assert!(
                block.ends_with(&[0, 0, 0, 0xff, 0xff]),
                "block {n}: {block:02x?}"
            );
            // A stored block of the 4 bytes of an empty header list, then the marker
            // (and the zlib header before the first).
            let body = if n == 0 { &block[6..] } else { &block[..] };
            assert_eq!(body, [0, 4, 0, 0xfb, 0xff, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff]);
        }
    }

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
