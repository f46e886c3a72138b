//! The WebSocket stream protocols of the kubelet (RFC 6455 framing; subprotocols
//! `v5.channel.k8s.io` down to the unversioned `channel.k8s.io`, and their `base64.`
//! forms): every binary message starts with a channel byte (0 stdin, 1 stdout,
//! 2 stderr, 3 error, 4 resize from v3 on); v5 adds a close message (`255, channel`)
//! for the end of stdin. The base64 forms send text messages, the channel as an ASCII
//! digit and the data in base64. From v4 on the error channel carries the final status
//! as JSON; before, only a failure's message, as text. Then the connection closes.

use hyper::body::Incoming;
use hyper::{Request, StatusCode};
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

use super::http::{error, Body, Resp};
use super::streams::{sizes, Ends, In, Launch, Opts, Out, Upgraded};

/// What the kubelet speaks, newest first: the first the client offers is taken.
const PROTOCOLS: [&str; 9] = [
    "v5.channel.k8s.io",
    "v4.channel.k8s.io",
    "v4.base64.channel.k8s.io",
    "v3.channel.k8s.io",
    "v3.base64.channel.k8s.io",
    "v2.channel.k8s.io",
    "v2.base64.channel.k8s.io",
    "channel.k8s.io",
    "base64.channel.k8s.io",
];

/// How one of [`PROTOCOLS`] is spoken.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Dialect {
    version: u8,
    base64: bool,
}

impl Dialect {
    fn of(protocol: &str) -> Dialect {
        let base64 = protocol.contains("base64.");
        let version = protocol
            .strip_prefix('v')
            .and_then(|rest| rest.split('.').next())
            .and_then(|v| v.parse().ok())
            .unwrap_or(1);
        Dialect { version, base64 }
    }

    /// A message on `ch`.
    fn message(self, ch: u8, data: &[u8]) -> Vec<u8> {
        if self.base64 {
            let mut text = vec![b'0' + ch];
            text.extend_from_slice(crate::wire::base64_encode(data).as_bytes());
            frame(0x1, &text)
        } else {
            channel_frame(ch, data)
        }
    }

    /// A client's message: its channel and data (None if it is not one).
    fn read(self, opcode: u8, payload: &[u8]) -> Option<(u8, Vec<u8>)> {
        let (&ch, data) = payload.split_first()?;
        if !self.base64 {
            return Some((ch, data.to_vec()));
        }
        if opcode != 0x1 || !ch.is_ascii_digit() {
            return None;
        }
        let text = std::str::from_utf8(data).ok()?;
        Some((ch - b'0', crate::wire::base64_decode(text).ok()?))
    }

    /// What the error channel says at the end, if anything.
    fn status(
        self,
        st: &k8s_openapi::apimachinery::pkg::apis::meta::v1::Status,
    ) -> Option<Vec<u8>> {
        if self.version >= 4 {
            return Some(serde_json::to_vec(st).unwrap_or_default());
        }
        let failed = st.status.as_deref().is_some_and(|s| s != "Success");
        failed.then(|| st.message.clone().unwrap_or_default().into_bytes())
    }
}
/// RFC 6455's key suffix.
const GUID: &str = "258EAFA5-E914-47DA-95CA-C5AB0DC85B11";
/// The largest message a client may send (stdin chunks are far smaller).
const MAX_MESSAGE: u64 = 1 << 20;

pub fn is_upgrade(req: &Request<Incoming>) -> bool {
    req.headers()
        .get(hyper::header::UPGRADE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.eq_ignore_ascii_case("websocket"))
}

/// `Sec-WebSocket-Accept` for a client's key.
pub fn accept_key(key: &str) -> String {
    let digest = ring::digest::digest(
        &ring::digest::SHA1_FOR_LEGACY_USE_ONLY,
        format!("{key}{GUID}").as_bytes(),
    );
    crate::wire::base64_encode(digest.as_ref())
}

pub fn upgrade(req: Request<Incoming>, opts: Opts, start: Launch) -> Resp {
    accept(req, &PROTOCOLS, false, move |io, protocol| {
        session(io, opts, start, Dialect::of(protocol))
    })
}

/// Answers a WebSocket upgrade with the first of `protocols` the client offers in
/// `Sec-WebSocket-Protocol` (400 if none; with `allow_none` a client that offers none
/// gets the first), then runs `serve` on the connection.
pub fn accept<F, Fut>(
    req: Request<Incoming>,
    protocols: &'static [&'static str],
    allow_none: bool,
    serve: F,
) -> Resp
where
    F: FnOnce(Upgraded, &'static str) -> Fut + Send + 'static,
    Fut: std::future::Future<Output = std::io::Result<()>> + Send + 'static,
{
    let offered: Vec<String> = req
        .headers()
        .get_all(hyper::header::SEC_WEBSOCKET_PROTOCOL)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(',').map(|s| s.trim().to_owned()))
        .filter(|s| !s.is_empty())
        .collect();
    let chosen = protocols
        .iter()
        .copied()
        .find(|p| offered.iter().any(|o| o == p));
    let (protocol, echo) = match chosen {
        Some(p) => (p, true),
        None if allow_none && offered.is_empty() => (protocols[0], false),
        None => {
            return error(
                StatusCode::BAD_REQUEST,
                &format!(
                    "unable to negotiate a websocket protocol: client offers {offered:?}, holdfast supports {protocols:?}"
                ),
            )
        }
    };
    let Some(key) = req
        .headers()
        .get(hyper::header::SEC_WEBSOCKET_KEY)
        .and_then(|v| v.to_str().ok())
    else {
        return error(StatusCode::BAD_REQUEST, "missing Sec-WebSocket-Key");
    };
    let accept = accept_key(key);
    let mut resp = hyper::Response::new(Body::Full(None));
    *resp.status_mut() = StatusCode::SWITCHING_PROTOCOLS;
    let h = resp.headers_mut();
    h.insert(
        hyper::header::UPGRADE,
        hyper::header::HeaderValue::from_static("websocket"),
    );
    h.insert(
        hyper::header::CONNECTION,
        hyper::header::HeaderValue::from_static("Upgrade"),
    );
    if let Ok(v) = hyper::header::HeaderValue::from_str(&accept) {
        h.insert(hyper::header::SEC_WEBSOCKET_ACCEPT, v);
    }
    // A client that offered no protocol must not be answered one (RFC 6455 4.1).
    if echo {
        h.insert(
            hyper::header::SEC_WEBSOCKET_PROTOCOL,
            hyper::header::HeaderValue::from_static(protocol),
        );
    }
    tokio::spawn(async move {
        match hyper::upgrade::on(req).await {
            Ok(upgraded) => {
                if let Err(e) = serve(TokioIo::new(upgraded), protocol).await {
                    log::debug!("kubelet API: websocket stream: {e}");
                }
            }
            Err(e) => log::debug!("kubelet API: websocket upgrade: {e}"),
        }
    });
    resp
}

async fn session<IO>(io: IO, opts: Opts, start: Launch, dialect: Dialect) -> std::io::Result<()>
where
    IO: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let (mut rd, mut wr) = tokio::io::split(io);
    let ends = start(opts).await;
    let Ends {
        input,
        mut output,
        status,
    } = ends;
    // The reader runs on its own: it must keep answering pings and taking stdin
    // while output is written.
    let (ctl_tx, mut ctl_rx) = tokio::sync::mpsc::channel::<Vec<u8>>(4);
    let reader = tokio::spawn(async move {
        let mut resize_buf = Vec::new();
        let mut stdin_open = true;
        let mut partial = (None, Vec::new());
        loop {
            let (opcode, payload) = match read_message(&mut rd, &mut partial).await {
                Ok(m) => m,
                Err(_) => break,
            };
            match opcode {
                0x8 => break,
                0x9 => {
                    let _ = ctl_tx.send(frame(0xA, &payload)).await;
                }
                0x1 | 0x2 => {
                    let Some((ch, data)) = dialect.read(opcode, &payload) else {
                        continue;
                    };
                    if ch == 0 {
                        if stdin_open && input.send(In::Stdin(data)).await.is_err() {
                            break;
                        }
                        continue;
                    }
                    match ch {
                        4 if dialect.version >= 3 => {
                            resize_buf.extend_from_slice(&data);
                            for s in sizes(&mut resize_buf) {
                                let _ = input.send(In::Resize(s.width, s.height)).await;
                            }
                            if resize_buf.len() > 4096 {
                                resize_buf.clear();
                            }
                        }
                        255 if dialect.version >= 5 && data.first() == Some(&0) => {
                            stdin_open = false;
                            let _ = input.send(In::StdinEof).await;
                        }
                        _ => {}
                    }
                }
                _ => {}
            }
        }
        // The client hung up: its stdin ends with it.
        let _ = input.send(In::StdinEof).await;
    });
    loop {
        tokio::select! {
            msg = output.recv() => match msg {
                Some(Out::Stdout(d)) => wr.write_all(&dialect.message(1, &d)).await?,
                Some(Out::Stderr(d)) => wr.write_all(&dialect.message(2, &d)).await?,
                None => break,
            },
            Some(ctl) = ctl_rx.recv() => wr.write_all(&ctl).await?,
        }
    }
    let st = status.await.unwrap_or_default();
    if let Some(said) = dialect.status(&st) {
        wr.write_all(&dialect.message(3, &said)).await?;
    }
    // Normal closure.
    wr.write_all(&frame(0x8, &1000u16.to_be_bytes())).await?;
    wr.flush().await?;
    let _ = wr.shutdown().await;
    reader.abort();
    Ok(())
}

pub fn channel_frame(ch: u8, data: &[u8]) -> Vec<u8> {
    let mut p = Vec::with_capacity(data.len() + 1);
    p.push(ch);
    p.extend_from_slice(data);
    frame(0x2, &p)
}

/// One unmasked (server) frame with FIN set.
pub fn frame(opcode: u8, payload: &[u8]) -> Vec<u8> {
    let mut f = Vec::with_capacity(payload.len() + 10);
    f.push(0x80 | opcode);
    let n = payload.len();
    if n < 126 {
        f.push(n as u8);
    } else if n <= 0xffff {
        f.push(126);
        f.extend_from_slice(&(n as u16).to_be_bytes());
    } else {
        f.push(127);
        f.extend_from_slice(&(n as u64).to_be_bytes());
    }
    f.extend_from_slice(payload);
    f
}

/// One whole message (fragments joined), unmasked: (opcode, payload).
/// `partial` keeps a fragmented message across a control frame in its middle.
pub async fn read_message<R: AsyncRead + Unpin>(
    rd: &mut R,
    partial: &mut (Option<u8>, Vec<u8>),
) -> std::io::Result<(u8, Vec<u8>)> {
    loop {
        let (first_opcode, message) = (&mut partial.0, &mut partial.1);
        let mut h = [0u8; 2];
        rd.read_exact(&mut h).await?;
        let fin = h[0] & 0x80 != 0;
        let opcode = h[0] & 0x0f;
        let masked = h[1] & 0x80 != 0;
        let mut len = u64::from(h[1] & 0x7f);
        if len == 126 {
            len = u64::from(rd.read_u16().await?);
        } else if len == 127 {
            len = rd.read_u64().await?;
        }
        // A 64-bit length is the client's to choose: compared without adding to it.
        if len > MAX_MESSAGE.saturating_sub(message.len() as u64) {
            return Err(std::io::Error::other("websocket message too large"));
        }
        let mut mask = [0u8; 4];
        if masked {
            rd.read_exact(&mut mask).await?;
        }
        let mut payload = vec![0u8; len as usize];
        rd.read_exact(&mut payload).await?;
        if masked {
            for (i, b) in payload.iter_mut().enumerate() {
                *b ^= mask[i % 4];
            }
        }
        // Control frames may come between fragments; they stand alone.
        if opcode >= 0x8 {
            return Ok((opcode, payload));
        }
        if first_opcode.is_none() {
            *first_opcode = Some(opcode);
        }
        message.extend_from_slice(&payload);
        if fin {
            let op = first_opcode.take().unwrap_or(0x2);
            return Ok((op, std::mem::take(message)));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accept_key_of_rfc6455() {
        // The example of RFC 6455 section 1.3.
        assert_eq!(
            accept_key("dGhlIHNhbXBsZSBub25jZQ=="),
            "s3pPLMBiTxaQ9kYGzzhZRbK+xOo="
        );
    }

    #[tokio::test]
    async fn masked_fragments_are_joined() {
        let mask = [1u8, 2, 3, 4];
        let part = |fin: bool, op: u8, data: &[u8]| {
            let mut f = vec![if fin { 0x80 } else { 0 } | op, 0x80 | data.len() as u8];
            f.extend_from_slice(&mask);
            f.extend(data.iter().enumerate().map(|(i, b)| b ^ mask[i % 4]));
            f
        };
        let mut wire = part(false, 2, b"\x00hel");
        wire.extend(part(true, 9, b"p"));
        wire.extend(part(true, 0, b"lo"));
        let mut r = &wire[..];
        let mut partial = (None, Vec::new());
        let ping = read_message(&mut r, &mut partial).await.expect("ping");
        assert_eq!(ping, (9, b"p".to_vec()));
        let (op, m) = read_message(&mut r, &mut partial).await.expect("message");
        assert_eq!(op, 2);
        assert_eq!(m, b"\x00hello".to_vec());
        assert_eq!(frame(2, &[7; 200])[..4], [0x82, 126, 0, 200]);
    }

    #[tokio::test]
    async fn a_length_near_u64_max_after_a_fragment_is_refused() {
        let mut wire = vec![0x02, 0x01, b'a'];
        wire.extend_from_slice(&[0x80, 127]);
        wire.extend_from_slice(&u64::MAX.to_be_bytes());
        let mut r = &wire[..];
        let mut partial = (None, Vec::new());
        let err = read_message(&mut r, &mut partial)
            .await
            .expect_err("a message past the limit");
        assert!(err.to_string().contains("too large"), "{err}");
    }
}
