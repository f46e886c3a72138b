//! tunnel::frames: the HTTP/2 connection's reading side, whole frames each within the
//! size this client allows, handed to the stream through a bounded channel; and the
//! keepalive clock that decides when to ping and when a stream is dead.

use std::time::Duration;

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
    pub payload: Vec<u8>,
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
                            payload,
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
