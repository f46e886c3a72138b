//! probe::grpc::h2: the HTTP/2 framing (RFC 9113) the gRPC action needs: frame
//! constants, writing a frame, and a connection that reads whole frames within the
//! probe's deadline and the response bounds.

use std::io::{self, Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use super::super::net::{is_timeout, set_deadline, words};
use super::{protocol, GrpcError, UNAVAILABLE};

/// What a client sends first on an HTTP/2 connection (RFC 9113 section 3.4).
pub(super) const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
/// SETTINGS_MAX_FRAME_SIZE's default, which this client never raises.
pub(super) const MAX_FRAME: usize = 16 * 1024;
/// Every byte the server sends, frame headers included.
pub(super) const MAX_RESPONSE: usize = 64 * 1024;
/// SETTINGS_HEADER_TABLE_SIZE's default, which this client keeps.
pub(super) const HEADER_TABLE_SIZE: usize = 4096;
/// The one stream this client opens.
pub(super) const STREAM: u32 = 1;

pub(super) const DATA: u8 = 0;
pub(super) const HEADERS: u8 = 1;
pub(super) const RST_STREAM: u8 = 3;
pub(super) const SETTINGS: u8 = 4;
pub(super) const PUSH_PROMISE: u8 = 5;
pub(super) const PING: u8 = 6;
pub(super) const GOAWAY: u8 = 7;
pub(super) const CONTINUATION: u8 = 9;

pub(super) const END_STREAM: u8 = 0x1;
pub(super) const ACK: u8 = 0x1;
pub(super) const END_HEADERS: u8 = 0x4;
pub(super) const PADDED: u8 = 0x8;
pub(super) const PRIORITY: u8 = 0x20;

pub(super) const SETTINGS_ENABLE_PUSH: u16 = 2;

/// Appends one frame; `payload` is at most `MAX_FRAME` bytes.
pub(super) fn frame(out: &mut Vec<u8>, kind: u8, flags: u8, stream: u32, payload: &[u8]) {
    let len = payload.len().to_be_bytes();
    out.extend_from_slice(&len[len.len() - 3..]);
    out.push(kind);
    out.push(flags);
    out.extend_from_slice(&stream.to_be_bytes());
    out.extend_from_slice(payload);
}

/// One frame as read, its stream id without the reserved bit.
pub(super) struct Frame {
    pub(super) kind: u8,
    pub(super) flags: u8,
    pub(super) stream: u32,
    pub(super) payload: Vec<u8>,
}

/// The connection, every read and write bounded by the probe's deadline and the reads
/// by `MAX_RESPONSE`.
pub(super) struct Conn {
    pub(super) stream: TcpStream,
    pub(super) deadline: Instant,
    pub(super) timeout: Duration,
    pub(super) read: usize,
}

impl Conn {
    pub(super) fn send(&mut self, mut bytes: &[u8]) -> Result<(), GrpcError> {
        while !bytes.is_empty() {
            let written = set_deadline(&self.stream, self.deadline)
                .and_then(|()| self.stream.write(bytes))
                .map_err(|e| self.io_error(&e, "writing to"))?;
            if written == 0 {
                return Err(self.io_error(&io::Error::from(io::ErrorKind::WriteZero), "writing to"));
            }
            bytes = &bytes[written..];
        }
        Ok(())
    }

    fn read_exact(&mut self, mut buf: &mut [u8]) -> Result<(), GrpcError> {
        while !buf.is_empty() {
            let got = set_deadline(&self.stream, self.deadline)
                .and_then(|()| self.stream.read(buf))
                .map_err(|e| self.io_error(&e, "reading from"))?;
            if got == 0 {
                return Err(GrpcError::Rpc {
                    code: UNAVAILABLE,
                    message: "error reading from server: EOF".to_string(),
                });
            }
            buf = &mut buf[got..];
        }
        Ok(())
    }

    fn io_error(&self, e: &io::Error, doing: &str) -> GrpcError {
        if is_timeout(e) {
            GrpcError::Deadline {
                timeout: self.timeout,
            }
        } else {
            GrpcError::Rpc {
                code: UNAVAILABLE,
                message: format!("error {doing} server: {}", words(e)),
            }
        }
    }

    pub(super) fn frame(&mut self) -> Result<Frame, GrpcError> {
        let mut head = [0u8; 9];
        self.read_exact(&mut head)?;
        let len = usize::from(head[0]) << 16 | usize::from(head[1]) << 8 | usize::from(head[2]);
        if len > MAX_FRAME {
            return Err(protocol(format!(
                "frame of {len} bytes is larger than {MAX_FRAME} (is this an HTTP/2 server?)"
            )));
        }
        self.read += head.len() + len;
        if self.read > MAX_RESPONSE {
            return Err(protocol(format!(
                "the server sent more than {MAX_RESPONSE} bytes"
            )));
        }
        let mut payload = vec![0u8; len];
        self.read_exact(&mut payload)?;
        Ok(Frame {
            kind: head[3],
            flags: head[4],
            stream: u32::from_be_bytes([head[5], head[6], head[7], head[8]]) & 0x7fff_ffff,
            payload,
        })
    }
}

/// A DATA or HEADERS payload without its padding.
pub(super) fn unpad(f: &Frame) -> Result<&[u8], GrpcError> {
    if f.flags & PADDED == 0 {
        return Ok(&f.payload);
    }
    let (&pad, rest) = f
        .payload
        .split_first()
        .ok_or_else(|| protocol("padded frame without a pad length".to_string()))?;
    rest.len()
        .checked_sub(usize::from(pad))
        .map(|end| &rest[..end])
        .ok_or_else(|| protocol("padding longer than its frame".to_string()))
}

pub(super) fn be_u32(bytes: &[u8], at: usize) -> Option<u32> {
    let b = bytes.get(at..at + 4)?;
    Some(u32::from_be_bytes([b[0], b[1], b[2], b[3]]))
}

/// RFC 9113 section 7's name of an error code.
pub(super) fn h2_error_name(code: u32) -> String {
    const NAMES: [&str; 14] = [
        "NO_ERROR",
        "PROTOCOL_ERROR",
        "INTERNAL_ERROR",
        "FLOW_CONTROL_ERROR",
        "SETTINGS_TIMEOUT",
        "STREAM_CLOSED",
        "FRAME_SIZE_ERROR",
        "REFUSED_STREAM",
        "CANCEL",
        "COMPRESSION_ERROR",
        "CONNECT_ERROR",
        "ENHANCE_YOUR_CALM",
        "INADEQUATE_SECURITY",
        "HTTP_1_1_REQUIRED",
    ];
    usize::try_from(code)
        .ok()
        .and_then(|i| NAMES.get(i))
        .map_or_else(
            || format!("unknown error code 0x{code:x}"),
            |n| n.to_string(),
        )
}
