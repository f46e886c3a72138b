//! probe::grpc::h2: the HTTP/2 framing (RFC 9113) the gRPC action needs: frame
//! constants, writing a frame, and a connection that reads whole frames within the
//! probe's deadline and the response bounds.

use std::io::{self, Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use super::super::net::{is_timeout, set_deadline, words};
use super::{protocol, GrpcError, UNAVAILABLE};

pub(super) use crate::http2::frame::{
    frame, ACK, CONTINUATION, DATA, END_HEADERS, END_STREAM, GOAWAY, HEADERS, HEADER_TABLE_SIZE,
    MAX_FRAME, PADDED, PING, PREFACE, PRIORITY, PUSH_PROMISE, RST_STREAM, SETTINGS,
    SETTINGS_ENABLE_PUSH,
};

/// Every byte the server sends, frame headers included.
pub(super) const MAX_RESPONSE: usize = 64 * 1024;
/// The one stream this client opens.
pub(super) const STREAM: u32 = 1;

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

pub(super) use crate::http2::frame::{be_u32, error_name as h2_error_name};
