//! tunnel::packet: konnectivity's `Packet` (konnectivity-client/proto/client/client.proto)
//! in protobuf's wire format, by hand: the few messages the agent sends and receives,
//! varints and length-delimited fields. Every length from the wire is checked against
//! the bytes that are there before it is used; nothing is allocated from a length.

use bytes::Bytes;

/// `PacketType` and the `oneof payload` field that goes with each.
const DIAL_REQ: u64 = 0;
const DIAL_RSP: u64 = 1;
const CLOSE_REQ: u64 = 2;
const CLOSE_RSP: u64 = 3;
const DATA: u64 = 4;
const DIAL_CLS: u64 = 5;
const DRAIN: u64 = 6;

/// One packet of the tunnel protocol.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Packet {
    /// The server asks for a connection to `address` (`host:port`).
    DialReq {
        protocol: String,
        address: String,
        random: i64,
    },
    /// The answer: `connect_id` on success, `error` otherwise.
    DialRsp {
        error: String,
        connect_id: i64,
        random: i64,
    },
    CloseReq {
        connect_id: i64,
    },
    CloseRsp {
        error: String,
        connect_id: i64,
    },
    Data {
        connect_id: i64,
        error: String,
        data: Bytes,
    },
    /// The server gives up on a dial it asked for.
    DialCls {
        random: i64,
    },
    /// The agent is stopping: route no new connections to it.
    Drain,
}

/// Why bytes are not a packet.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum PacketError {
    #[error("protobuf: message truncated")]
    Truncated,
    #[error("protobuf: varint longer than 10 bytes")]
    Varint,
    #[error("protobuf: unsupported wire type {0}")]
    WireType(u64),
    #[error("protobuf: field {0} is not valid utf-8")]
    Utf8(u64),
    #[error("unknown packet type {0}")]
    Type(u64),
}

impl Packet {
    /// The packet's type name, as the protocol spells it.
    pub fn kind(&self) -> &'static str {
        match self {
            Packet::DialReq { .. } => "DIAL_REQ",
            Packet::DialRsp { .. } => "DIAL_RSP",
            Packet::CloseReq { .. } => "CLOSE_REQ",
            Packet::CloseRsp { .. } => "CLOSE_RSP",
            Packet::Data { .. } => "DATA",
            Packet::DialCls { .. } => "DIAL_CLS",
            Packet::Drain => "DRAIN",
        }
    }

    /// Appends the packet as one gRPC message: the uncompressed flag, its length
    /// (big-endian u32), then the protobuf bytes.
    pub fn encode_grpc(&self, out: &mut Vec<u8>) {
        let mut len = Count(0);
        self.write(&mut len);
        out.reserve(5 + len.0);
        out.push(0);
        out.extend_from_slice(&u32::try_from(len.0).unwrap_or(u32::MAX).to_be_bytes());
        self.write(out);
    }

    /// Appends the protobuf encoding (proto3: fields at their default are left out).
    pub fn encode(&self, out: &mut Vec<u8>) {
        self.write(out);
    }

    /// Writes the encoding to `out`: once to a [`Count`] for the length, once for the
    /// bytes, so that the payload (a DATA packet's data) is copied once.
    fn write(&self, out: &mut impl Sink) {
        let mut body = Count(0);
        let (kind, field) = self.body(&mut body);
        if kind != 0 {
            put_varint(out, 1 << 3);
            put_varint(out, kind);
        }
        // The oneof's message is present even when empty (Drain).
        put_key(out, field, 2);
        put_varint(out, body.0 as u64);
        self.body(out);
    }

    /// Writes the payload message's fields; returns the packet type and the payload's
    /// field number.
    fn body(&self, body: &mut impl Sink) -> (u64, u64) {
        match self {
            Packet::DialReq {
                protocol,
                address,
                random,
            } => {
                put_str(body, 1, protocol);
                put_str(body, 2, address);
                put_int(body, 3, *random);
                (DIAL_REQ, 2)
            }
            Packet::DialRsp {
                error,
                connect_id,
                random,
            } => {
                put_str(body, 1, error);
                put_int(body, 2, *connect_id);
                put_int(body, 3, *random);
                (DIAL_RSP, 3)
            }
            Packet::Data {
                connect_id,
                error,
                data,
            } => {
                put_int(body, 1, *connect_id);
                put_str(body, 2, error);
                put_bytes(body, 3, data);
                (DATA, 4)
            }
            Packet::CloseReq { connect_id } => {
                put_int(body, 1, *connect_id);
                (CLOSE_REQ, 5)
            }
            Packet::CloseRsp { error, connect_id } => {
                put_str(body, 1, error);
                put_int(body, 2, *connect_id);
                (CLOSE_RSP, 6)
            }
            Packet::DialCls { random } => {
                put_int(body, 1, *random);
                (DIAL_CLS, 7)
            }
            Packet::Drain => (DRAIN, 8),
        }
    }

    /// Decodes one packet; `data` is shared with `msg`, not copied.
    pub fn decode(msg: &Bytes) -> Result<Packet, PacketError> {
        let mut kind = 0;
        let mut payload = None;
        for field in Fields::new(msg) {
            let (number, value) = field?;
            match (number, value) {
                (1, Value::Varint(v)) => kind = v,
                (2..=8, Value::Bytes(start, end)) => payload = Some((number, start, end)),
                _ => {}
            }
        }
        let body = payload.map_or_else(Bytes::new, |(_, s, e)| msg.slice(s..e));
        let fields = Body::read(&body)?;
        Ok(match kind {
            DIAL_REQ => Packet::DialReq {
                protocol: fields.string(&body, 1)?,
                address: fields.string(&body, 2)?,
                random: fields.int(3),
            },
            DIAL_RSP => Packet::DialRsp {
                error: fields.string(&body, 1)?,
                connect_id: fields.int(2),
                random: fields.int(3),
            },
            CLOSE_REQ => Packet::CloseReq {
                connect_id: fields.int(1),
            },
            CLOSE_RSP => Packet::CloseRsp {
                error: fields.string(&body, 1)?,
                connect_id: fields.int(2),
            },
            DATA => Packet::Data {
                connect_id: fields.int(1),
                error: fields.string(&body, 2)?,
                data: fields.bytes(&body, 3),
            },
            DIAL_CLS => Packet::DialCls {
                random: fields.int(1),
            },
            DRAIN => Packet::Drain,
            other => return Err(PacketError::Type(other)),
        })
    }
}

/// Where an encoding goes: bytes, or only their count.
trait Sink {
    fn put(&mut self, bytes: &[u8]);
}

impl Sink for Vec<u8> {
    fn put(&mut self, bytes: &[u8]) {
        self.extend_from_slice(bytes);
    }
}

/// The length an encoding would have.
struct Count(usize);

impl Sink for Count {
    fn put(&mut self, bytes: &[u8]) {
        self.0 += bytes.len();
    }
}

fn put_varint(out: &mut impl Sink, mut v: u64) {
    let mut b = [0u8; 10];
    let mut n = 0;
    while v >= 0x80 {
        b[n] = (v as u8) | 0x80;
        v >>= 7;
        n += 1;
    }
    b[n] = v as u8;
    out.put(&b[..=n]);
}

fn put_key(out: &mut impl Sink, field: u64, wire: u64) {
    put_varint(out, field << 3 | wire);
}

/// An int64 field: a negative value is its two's complement, ten bytes long.
fn put_int(out: &mut impl Sink, field: u64, v: i64) {
    if v != 0 {
        put_key(out, field, 0);
        put_varint(out, v as u64);
    }
}

fn put_bytes(out: &mut impl Sink, field: u64, v: &[u8]) {
    if !v.is_empty() {
        put_key(out, field, 2);
        put_varint(out, v.len() as u64);
        out.put(v);
    }
}

fn put_str(out: &mut impl Sink, field: u64, v: &str) {
    put_bytes(out, field, v.as_bytes());
}

/// A field's value: a varint, or the range of a length-delimited field's bytes.
enum Value {
    Varint(u64),
    Bytes(usize, usize),
    Skipped,
}

/// The fields of a message, in order; an error ends the walk.
struct Fields<'a> {
    buf: &'a [u8],
    at: usize,
    failed: bool,
}

impl<'a> Fields<'a> {
    fn new(buf: &'a [u8]) -> Self {
        Fields {
            buf,
            at: 0,
            failed: false,
        }
    }

    fn varint(&mut self) -> Result<u64, PacketError> {
        let mut v = 0u64;
        for i in 0..10 {
            let b = *self.buf.get(self.at).ok_or(PacketError::Truncated)?;
            self.at += 1;
            v |= u64::from(b & 0x7f) << (7 * i);
            if b & 0x80 == 0 {
                return Ok(v);
            }
        }
        Err(PacketError::Varint)
    }

    fn skip(&mut self, n: usize) -> Result<(usize, usize), PacketError> {
        let start = self.at;
        let end = start
            .checked_add(n)
            .filter(|e| *e <= self.buf.len())
            .ok_or(PacketError::Truncated)?;
        self.at = end;
        Ok((start, end))
    }

    fn field(&mut self) -> Result<(u64, Value), PacketError> {
        let key = self.varint()?;
        let value = match key & 7 {
            0 => Value::Varint(self.varint()?),
            1 => self.skip(8).map(|_| Value::Skipped)?,
            2 => {
                let len = usize::try_from(self.varint()?).map_err(|_| PacketError::Truncated)?;
                let (s, e) = self.skip(len)?;
                Value::Bytes(s, e)
            }
            5 => self.skip(4).map(|_| Value::Skipped)?,
            other => return Err(PacketError::WireType(other)),
        };
        Ok((key >> 3, value))
    }
}

impl Iterator for Fields<'_> {
    type Item = Result<(u64, Value), PacketError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.failed || self.at >= self.buf.len() {
            return None;
        }
        let r = self.field();
        self.failed = r.is_err();
        Some(r)
    }
}

/// A payload message's fields 1 to 4 (all any payload has); the last of a repeated
/// field wins, as protobuf says.
#[derive(Default)]
struct Body {
    ints: [u64; 5],
    ranges: [Option<(usize, usize)>; 5],
}

impl Body {
    fn read(body: &[u8]) -> Result<Body, PacketError> {
        let mut b = Body::default();
        for field in Fields::new(body) {
            let (number, value) = field?;
            let Some(i) = usize::try_from(number).ok().filter(|i| *i < 5) else {
                continue;
            };
            match value {
                Value::Varint(v) => b.ints[i] = v,
                Value::Bytes(s, e) => b.ranges[i] = Some((s, e)),
                Value::Skipped => {}
            }
        }
        Ok(b)
    }

    fn int(&self, field: usize) -> i64 {
        self.ints[field] as i64
    }

    fn bytes(&self, body: &Bytes, field: usize) -> Bytes {
        self.ranges[field].map_or_else(Bytes::new, |(s, e)| body.slice(s..e))
    }

    fn string(&self, body: &Bytes, field: usize) -> Result<String, PacketError> {
        let b = self.bytes(body, field);
        String::from_utf8(b.to_vec()).map_err(|_| PacketError::Utf8(field as u64))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bytes(p: &Packet) -> Vec<u8> {
        let mut out = Vec::new();
        p.encode(&mut out);
        out
    }

    // The expected bytes follow client.proto's field numbers: Packet.type = 1,
    // dialResponse = 3, data = 4, closeResponse = 6, drain = 8.
    #[test]
    fn encodes_as_the_proto_says() {
        let rsp = Packet::DialRsp {
            error: String::new(),
            connect_id: 7,
            random: 42,
        };
        assert_eq!(
            bytes(&rsp),
            [0x08, 0x01, 0x1a, 0x04, 0x10, 0x07, 0x18, 0x2a]
        );
        let data = Packet::Data {
            connect_id: 1,
            error: String::new(),
            data: Bytes::from_static(b"hi"),
        };
        assert_eq!(
            bytes(&data),
            [0x08, 0x04, 0x22, 0x06, 0x08, 0x01, 0x1a, 0x02, b'h', b'i']
        );
        let close = Packet::CloseRsp {
            error: String::new(),
            connect_id: 300,
        };
        assert_eq!(bytes(&close), [0x08, 0x03, 0x32, 0x03, 0x10, 0xac, 0x02]);
        assert_eq!(bytes(&Packet::Drain), [0x08, 0x06, 0x42, 0x00]);
        let refused = Packet::DialRsp {
            error: "no".into(),
            connect_id: 0,
            random: -1,
        };
        let mut want = vec![0x08, 0x01, 0x1a, 0x0f, 0x0a, 0x02, b'n', b'o', 0x18];
        want.extend_from_slice(&[0xff; 9]);
        want.push(0x01);
        assert_eq!(bytes(&refused), want);
    }

    #[test]
    fn grpc_prefix_carries_the_length() {
        let mut out = Vec::new();
        Packet::Drain.encode_grpc(&mut out);
        assert_eq!(out, [0, 0, 0, 0, 4, 0x08, 0x06, 0x42, 0x00]);
    }

    #[test]
    fn decodes_what_the_server_sends() {
        // DIAL_REQ is type 0, which proto3 leaves out: only dialRequest (field 2).
        let mut req = vec![0x12, 0x17, 0x0a, 0x03];
        req.extend_from_slice(b"tcp");
        req.extend_from_slice(&[0x12, 0x0e]);
        req.extend_from_slice(b"10.0.0.1:10250");
        req.extend_from_slice(&[0x18, 0x05]);
        let p = Packet::decode(&Bytes::from(req)).expect("decode");
        assert_eq!(
            p,
            Packet::DialReq {
                protocol: "tcp".into(),
                address: "10.0.0.1:10250".into(),
                random: 5
            }
        );
        for p in [
            Packet::CloseReq { connect_id: 9 },
            Packet::DialCls { random: -77 },
            Packet::Data {
                connect_id: 3,
                error: String::new(),
                data: Bytes::from_static(&[0, 1, 2, 255]),
            },
        ] {
            assert_eq!(Packet::decode(&Bytes::from(bytes(&p))), Ok(p));
        }
    }

    #[test]
    fn hostile_lengths_are_refused() {
        // dialRequest claims 100 bytes; 2 are there.
        let p = Packet::decode(&Bytes::from_static(&[0x12, 0x64, 0x0a, 0x00]));
        assert_eq!(p, Err(PacketError::Truncated));
        // A length of u64::MAX.
        let mut huge = vec![0x12];
        huge.extend_from_slice(&[0xff; 9]);
        huge.push(0x01);
        assert_eq!(
            Packet::decode(&Bytes::from(huge)),
            Err(PacketError::Truncated)
        );
        // A varint that never ends.
        assert_eq!(
            Packet::decode(&Bytes::from_static(&[
                0x08, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff
            ])),
            Err(PacketError::Varint)
        );
        assert_eq!(
            Packet::decode(&Bytes::from_static(&[0x08, 0x63])),
            Err(PacketError::Type(99))
        );
        assert_eq!(
            Packet::decode(&Bytes::from_static(&[0x0b])),
            Err(PacketError::WireType(3))
        );
    }
}
