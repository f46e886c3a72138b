//! tunnel::frames: the HTTP/2 connection's reading side, whole frames each within the
//! size this client allows, handed to the stream through a bounded channel; the gRPC
//! messages in the stream's DATA; and the keepalive clock that decides when to ping and
//! when a stream is dead.

use std::time::Duration;

use bytes::{Buf, Bytes};
use tokio::io::{AsyncRead, AsyncReadExt, ReadHalf};
use tokio::sync::mpsc;
use tokio::time::Instant;

use super::TunnelError;
use crate::http2::frame::MAX_FRAME;

/// How long an unanswered ping may wait before the stream counts as dead.
pub(super) const PING_TIMEOUT: Duration = Duration::from_secs(15);

/// One frame as read, its stream id without the reserved bit.
pub(super) struct Frame {
    pub kind: u8,
    pub flags: u8,
    pub stream: u32,
    pub payload: Bytes,
}

/// Reads whole frames, each at most `MAX_FRAME` (the size this client allows).
pub(super) async fn read_frames<R: AsyncRead>(
    mut rd: ReadHalf<R>,
    addr: String,
    tx: mpsc::Sender<Result<Frame, TunnelError>>,
) {
    loop {
        let mut head = [0u8; 9];
        let r = match rd.read_exact(&mut head).await {
            Ok(_) => {
                let len =
                    usize::from(head[0]) << 16 | usize::from(head[1]) << 8 | usize::from(head[2]);
                if len > MAX_FRAME {
                    Err(TunnelError::Protocol {
                        addr: addr.clone(),
                        reason: format!("frame of {len} bytes is larger than {MAX_FRAME}"),
                    })
                } else {
                    let mut payload = vec![0u8; len];
                    rd.read_exact(&mut payload)
                        .await
                        .map(|_| Frame {
                            kind: head[3],
                            flags: head[4],
                            stream: u32::from_be_bytes([head[5], head[6], head[7], head[8]])
                                & 0x7fff_ffff,
                            payload: Bytes::from(payload),
                        })
                        .map_err(|source| TunnelError::Io {
                            addr: addr.clone(),
                            source,
                        })
                }
            }
            Err(source) => Err(TunnelError::Io {
                addr: addr.clone(),
                source,
            }),
        };
        let failed = r.is_err();
        if tx.send(r).await.is_err() || failed {
            return;
        }
    }
}

/// gRPC messages out of the payloads of the stream's DATA frames, in order: each a
/// 5-byte prefix (not compressed, the length) and the message. A message within one
/// payload is a slice of it, not a copy; one spread over several is gathered in a buffer
/// of its own length.
#[derive(Default)]
pub(super) struct Messages {
    prefix: [u8; 5],
    /// Bytes of `prefix` read.
    have: usize,
    /// The length of the message being gathered, once its prefix is read.
    len: Option<usize>,
    body: Vec<u8>,
}

impl Messages {
    /// The next whole message, taking bytes from the front of `data`; None once `data`
    /// is used up with no message whole. A message over `max` bytes is refused.
    pub(super) fn next(&mut self, data: &mut Bytes, max: usize) -> Result<Option<Bytes>, String> {
        loop {
            if let Some(len) = self.len {
                let take = (len - self.body.len()).min(data.len());
                if self.body.is_empty() && take == len {
                    self.len = None;
                    return Ok(Some(data.split_to(len)));
                }
                self.body.extend_from_slice(&data[..take]);
                data.advance(take);
                if self.body.len() < len {
                    return Ok(None);
                }
                self.len = None;
                return Ok(Some(Bytes::from(std::mem::take(&mut self.body))));
            }
            if data.is_empty() {
                return Ok(None);
            }
            let take = (5 - self.have).min(data.len());
            self.prefix[self.have..self.have + take].copy_from_slice(&data[..take]);
            data.advance(take);
            self.have += take;
            if self.have < 5 {
                return Ok(None);
            }
            self.have = 0;
            if self.prefix[0] != 0 {
                return Err("compressed message, none was asked for".into());
            }
            let [_, a, b, c, d] = self.prefix;
            let len = usize::try_from(u32::from_be_bytes([a, b, c, d])).unwrap_or(usize::MAX);
            if len > max {
                return Err(format!("message of {len} bytes, over {max}"));
            }
            // Gathered only when it spans payloads (`data` holds less than all of it).
            if data.len() < len {
                self.body = Vec::with_capacity(len);
            }
            self.len = Some(len);
        }
    }

    /// Bytes of a message received and not yet whole.
    pub(super) fn partial(&self) -> usize {
        self.have + self.body.len()
    }
}

/// Pings every `interval` (the server's policy allows no less than 30 s); a ping
/// unanswered for `PING_TIMEOUT` means the stream is dead.
pub(super) struct Keepalive {
    interval: Duration,
    next: Instant,
    deadline: Option<Instant>,
}

impl Keepalive {
    pub(super) fn new(interval: Duration) -> Self {
        Keepalive {
            interval,
            next: Instant::now() + interval,
            deadline: None,
        }
    }

    pub(super) fn wake(&self) -> Instant {
        self.deadline.map_or(self.next, |d| d.min(self.next))
    }

    pub(super) fn dead(&self) -> bool {
        self.deadline.is_some_and(|d| Instant::now() >= d)
    }

    pub(super) fn sent(&mut self) {
        let now = Instant::now();
        self.next = now + self.interval;
        if self.deadline.is_none() {
            self.deadline = Some(now + PING_TIMEOUT);
        }
    }

    pub(super) fn answered(&mut self) {
        self.deadline = None;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn grpc(msg: &[u8]) -> Vec<u8> {
        let mut out = vec![0];
        out.extend_from_slice(&u32::try_from(msg.len()).expect("len").to_be_bytes());
        out.extend_from_slice(msg);
        out
    }

    /// Every whole message in `payloads`, fed one payload after another.
    fn all(m: &mut Messages, payloads: &[&[u8]], max: usize) -> Result<Vec<Bytes>, String> {
        let mut got = Vec::new();
        for p in payloads {
            let mut data = Bytes::copy_from_slice(p);
            while let Some(msg) = m.next(&mut data, max)? {
                got.push(msg);
            }
            assert!(data.is_empty());
        }
        Ok(got)
    }

    #[test]
    fn messages_whole_split_and_several_in_one_payload() {
        let (a, b, c) = (grpc(b"first"), grpc(&[7u8; 40]), grpc(b""));
        let mut wire = a.clone();
        wire.extend_from_slice(&b);
        wire.extend_from_slice(&c);
        wire.extend_from_slice(&a);
        let want: Vec<Bytes> = vec![
            Bytes::from_static(b"first"),
            Bytes::from(vec![7u8; 40]),
            Bytes::new(),
            Bytes::from_static(b"first"),
        ];
        // All in one payload, then cut at every byte (prefixes split too).
        let mut m = Messages::default();
        assert_eq!(all(&mut m, &[&wire], 64), Ok(want.clone()));
        for cut in 1..wire.len() {
            let mut m = Messages::default();
            let (x, y) = wire.split_at(cut);
            assert_eq!(all(&mut m, &[x, y], 64), Ok(want.clone()), "cut at {cut}");
            assert_eq!(m.partial(), 0);
        }
        // One byte at a time.
        let mut m = Messages::default();
        let bytes: Vec<&[u8]> = wire.chunks(1).collect();
        assert_eq!(all(&mut m, &bytes, 64), Ok(want));
    }

    #[test]
    fn a_message_within_one_payload_is_not_copied() {
        let wire = Bytes::from(grpc(b"shared"));
        let mut data = wire.clone();
        let msg = Messages::default()
            .next(&mut data, 64)
            .expect("ok")
            .expect("a message");
        assert_eq!(msg.as_ptr(), wire[5..].as_ptr());
    }

    #[test]
    fn compressed_and_oversized_messages_are_refused() {
        let mut m = Messages::default();
        let mut compressed = Bytes::from_static(&[1, 0, 0, 0, 1, 0]);
        assert!(m.next(&mut compressed, 64).is_err());
        let mut m = Messages::default();
        // A length of 4 GiB is refused before anything is allocated for it.
        let mut huge = Bytes::from_static(&[0, 0xff, 0xff, 0xff, 0xff]);
        assert!(m.next(&mut huge, 64).is_err());
        let mut m = Messages::default();
        let mut partial = Bytes::from(grpc(&[1u8; 65])[..8].to_vec());
        assert!(m.next(&mut partial, 64).is_err());
        let mut m = Messages::default();
        let mut partial = Bytes::from(grpc(&[1u8; 64])[..8].to_vec());
        assert_eq!(m.next(&mut partial, 64), Ok(None));
        assert_eq!(m.partial(), 3);
    }
}
