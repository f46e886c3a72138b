//! http2::hpack: HPACK (RFC 7541) as far as holdfast's gRPC clients need it: literal
//! fields without indexing for requests, and a full decoder for responses (static and
//! dynamic tables, size updates, Huffman strings). Every length and index comes from
//! the server and is checked.

use std::collections::VecDeque;
use std::sync::OnceLock;

/// A header field: name and value, as bytes.
pub type Field = (Vec<u8>, Vec<u8>);

/// What a header block broke, in words for an error message.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum HpackError {
    #[error("hpack: header block truncated")]
    Truncated,
    #[error("hpack: integer overflow")]
    Overflow,
    #[error("hpack: invalid table index {0}")]
    Index(usize),
    #[error("hpack: table size update to {size} over the limit of {limit}")]
    TableSize { size: usize, limit: usize },
    #[error("hpack: table size update after a header field")]
    LateTableSize,
    #[error("hpack: invalid huffman code")]
    Huffman,
    #[error("hpack: header list larger than {0} bytes")]
    TooLarge(usize),
}

/// RFC 7541 Appendix A.
const STATIC: [(&str, &str); 61] = [
    (":authority", ""),
    (":method", "GET"),
    (":method", "POST"),
    (":path", "/"),
    (":path", "/index.html"),
    (":scheme", "http"),
    (":scheme", "https"),
    (":status", "200"),
    (":status", "204"),
    (":status", "206"),
    (":status", "304"),
    (":status", "400"),
    (":status", "404"),
    (":status", "500"),
    ("accept-charset", ""),
    ("accept-encoding", "gzip, deflate"),
    ("accept-language", ""),
    ("accept-ranges", ""),
    ("accept", ""),
    ("access-control-allow-origin", ""),
    ("age", ""),
    ("allow", ""),
    ("authorization", ""),
    ("cache-control", ""),
    ("content-disposition", ""),
    ("content-encoding", ""),
    ("content-language", ""),
    ("content-length", ""),
    ("content-location", ""),
    ("content-range", ""),
    ("content-type", ""),
    ("cookie", ""),
    ("date", ""),
    ("etag", ""),
    ("expect", ""),
    ("expires", ""),
    ("from", ""),
    ("host", ""),
    ("if-match", ""),
    ("if-modified-since", ""),
    ("if-none-match", ""),
    ("if-range", ""),
    ("if-unmodified-since", ""),
    ("last-modified", ""),
    ("link", ""),
    ("location", ""),
    ("max-forwards", ""),
    ("proxy-authenticate", ""),
    ("proxy-authorization", ""),
    ("range", ""),
    ("referer", ""),
    ("refresh", ""),
    ("retry-after", ""),
    ("server", ""),
    ("set-cookie", ""),
    ("strict-transport-security", ""),
    ("transfer-encoding", ""),
    ("user-agent", ""),
    ("vary", ""),
    ("via", ""),
    ("www-authenticate", ""),
];

/// RFC 7541 Appendix B: (code, length in bits) of each symbol, EOS (256) last.
#[rustfmt::skip]
const HUFFMAN: [(u32, u8); 257] = [
    (0x1ff8, 13), (0x7fffd8, 23), (0xfffffe2, 28), (0xfffffe3, 28),
    (0xfffffe4, 28), (0xfffffe5, 28), (0xfffffe6, 28), (0xfffffe7, 28),
    (0xfffffe8, 28), (0xffffea, 24), (0x3ffffffc, 30), (0xfffffe9, 28),
    (0xfffffea, 28), (0x3ffffffd, 30), (0xfffffeb, 28), (0xfffffec, 28),
    (0xfffffed, 28), (0xfffffee, 28), (0xfffffef, 28), (0xffffff0, 28),
    (0xffffff1, 28), (0xffffff2, 28), (0x3ffffffe, 30), (0xffffff3, 28),
    (0xffffff4, 28), (0xffffff5, 28), (0xffffff6, 28), (0xffffff7, 28),
    (0xffffff8, 28), (0xffffff9, 28), (0xffffffa, 28), (0xffffffb, 28),
    (0x14, 6), (0x3f8, 10), (0x3f9, 10), (0xffa, 12),
    (0x1ff9, 13), (0x15, 6), (0xf8, 8), (0x7fa, 11),
    (0x3fa, 10), (0x3fb, 10), (0xf9, 8), (0x7fb, 11),
    (0xfa, 8), (0x16, 6), (0x17, 6), (0x18, 6),
    (0x0, 5), (0x1, 5), (0x2, 5), (0x19, 6),
    (0x1a, 6), (0x1b, 6), (0x1c, 6), (0x1d, 6),
    (0x1e, 6), (0x1f, 6), (0x5c, 7), (0xfb, 8),
    (0x7ffc, 15), (0x20, 6), (0xffb, 12), (0x3fc, 10),
    (0x1ffa, 13), (0x21, 6), (0x5d, 7), (0x5e, 7),
    (0x5f, 7), (0x60, 7), (0x61, 7), (0x62, 7),
    (0x63, 7), (0x64, 7), (0x65, 7), (0x66, 7),
    (0x67, 7), (0x68, 7), (0x69, 7), (0x6a, 7),
    (0x6b, 7), (0x6c, 7), (0x6d, 7), (0x6e, 7),
    (0x6f, 7), (0x70, 7), (0x71, 7), (0x72, 7),
    (0xfc, 8), (0x73, 7), (0xfd, 8), (0x1ffb, 13),
    (0x7fff0, 19), (0x1ffc, 13), (0x3ffc, 14), (0x22, 6),
    (0x7ffd, 15), (0x3, 5), (0x23, 6), (0x4, 5),
    (0x24, 6), (0x5, 5), (0x25, 6), (0x26, 6),
    (0x27, 6), (0x6, 5), (0x74, 7), (0x75, 7),
    (0x28, 6), (0x29, 6), (0x2a, 6), (0x7, 5),
    (0x2b, 6), (0x76, 7), (0x2c, 6), (0x8, 5),
    (0x9, 5), (0x2d, 6), (0x77, 7), (0x78, 7),
    (0x79, 7), (0x7a, 7), (0x7b, 7), (0x7ffe, 15),
    (0x7fc, 11), (0x3ffd, 14), (0x1ffd, 13), (0xffffffc, 28),
    (0xfffe6, 20), (0x3fffd2, 22), (0xfffe7, 20), (0xfffe8, 20),
    (0x3fffd3, 22), (0x3fffd4, 22), (0x3fffd5, 22), (0x7fffd9, 23),
    (0x3fffd6, 22), (0x7fffda, 23), (0x7fffdb, 23), (0x7fffdc, 23),
    (0x7fffdd, 23), (0x7fffde, 23), (0xffffeb, 24), (0x7fffdf, 23),
    (0xffffec, 24), (0xffffed, 24), (0x3fffd7, 22), (0x7fffe0, 23),
    (0xffffee, 24), (0x7fffe1, 23), (0x7fffe2, 23), (0x7fffe3, 23),
    (0x7fffe4, 23), (0x1fffdc, 21), (0x3fffd8, 22), (0x7fffe5, 23),
    (0x3fffd9, 22), (0x7fffe6, 23), (0x7fffe7, 23), (0xffffef, 24),
    (0x3fffda, 22), (0x1fffdd, 21), (0xfffe9, 20), (0x3fffdb, 22),
    (0x3fffdc, 22), (0x7fffe8, 23), (0x7fffe9, 23), (0x1fffde, 21),
    (0x7fffea, 23), (0x3fffdd, 22), (0x3fffde, 22), (0xfffff0, 24),
    (0x1fffdf, 21), (0x3fffdf, 22), (0x7fffeb, 23), (0x7fffec, 23),
    (0x1fffe0, 21), (0x1fffe1, 21), (0x3fffe0, 22), (0x1fffe2, 21),
    (0x7fffed, 23), (0x3fffe1, 22), (0x7fffee, 23), (0x7fffef, 23),
    (0xfffea, 20), (0x3fffe2, 22), (0x3fffe3, 22), (0x3fffe4, 22),
    (0x7ffff0, 23), (0x3fffe5, 22), (0x3fffe6, 22), (0x7ffff1, 23),
    (0x3ffffe0, 26), (0x3ffffe1, 26), (0xfffeb, 20), (0x7fff1, 19),
    (0x3fffe7, 22), (0x7ffff2, 23), (0x3fffe8, 22), (0x1ffffec, 25),
    (0x3ffffe2, 26), (0x3ffffe3, 26), (0x3ffffe4, 26), (0x7ffffde, 27),
    (0x7ffffdf, 27), (0x3ffffe5, 26), (0xfffff1, 24), (0x1ffffed, 25),
    (0x7fff2, 19), (0x1fffe3, 21), (0x3ffffe6, 26), (0x7ffffe0, 27),
    (0x7ffffe1, 27), (0x3ffffe7, 26), (0x7ffffe2, 27), (0xfffff2, 24),
    (0x1fffe4, 21), (0x1fffe5, 21), (0x3ffffe8, 26), (0x3ffffe9, 26),
    (0xffffffd, 28), (0x7ffffe3, 27), (0x7ffffe4, 27), (0x7ffffe5, 27),
    (0xfffec, 20), (0xfffff3, 24), (0xfffed, 20), (0x1fffe6, 21),
    (0x3fffe9, 22), (0x1fffe7, 21), (0x1fffe8, 21), (0x7ffff3, 23),
    (0x3fffea, 22), (0x3fffeb, 22), (0x1ffffee, 25), (0x1ffffef, 25),
    (0xfffff4, 24), (0xfffff5, 24), (0x3ffffea, 26), (0x7ffff4, 23),
    (0x3ffffeb, 26), (0x7ffffe6, 27), (0x3ffffec, 26), (0x3ffffed, 26),
    (0x7ffffe7, 27), (0x7ffffe8, 27), (0x7ffffe9, 27), (0x7ffffea, 27),
    (0x7ffffeb, 27), (0xffffffe, 28), (0x7ffffec, 27), (0x7ffffed, 27),
    (0x7ffffee, 27), (0x7ffffef, 27), (0x7fffff0, 27), (0x3ffffee, 26),
    (0x3fffffff, 30),
];

/// What an entry costs in the dynamic table besides its bytes (RFC 7541 section 4.1).
const ENTRY_OVERHEAD: usize = 32;

/// Appends a "literal header field without indexing, new name" with plain strings.
pub fn encode_literal(out: &mut Vec<u8>, name: &str, value: &str) {
    out.push(0);
    for s in [name, value] {
        encode_int(out, 0, 7, s.len());
        out.extend_from_slice(s.as_bytes());
    }
}

/// A literal field never to be indexed by any hop (RFC 7541 6.2.3): for credentials.
pub fn encode_never_indexed(out: &mut Vec<u8>, name: &str, value: &str) {
    out.push(0x10);
    for s in [name, value] {
        encode_int(out, 0, 7, s.len());
        out.extend_from_slice(s.as_bytes());
    }
}

/// Like `encode_literal` with both strings Huffman-coded, as servers send them.
#[cfg(test)]
pub fn encode_literal_huffman(out: &mut Vec<u8>, name: &str, value: &str) {
    out.push(0);
    for s in [name, value] {
        let coded = huffman_encode(s.as_bytes());
        encode_int(out, 0x80, 7, coded.len());
        out.extend_from_slice(&coded);
    }
}

#[cfg(test)]
fn huffman_encode(bytes: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    let mut acc = 0u64;
    let mut bits = 0u32;
    for &b in bytes {
        let (code, len) = HUFFMAN[usize::from(b)];
        acc = (acc << len) | u64::from(code);
        bits += u32::from(len);
        while bits >= 8 {
            bits -= 8;
            out.push((acc >> bits) as u8);
        }
    }
    if bits > 0 {
        // Padded with the most significant bits of EOS: ones.
        out.push(((acc << (8 - bits)) | ((1 << (8 - bits)) - 1)) as u8);
    }
    out
}

/// An integer with an `n`-bit prefix; `high` holds the bits above the prefix.
fn encode_int(out: &mut Vec<u8>, high: u8, n: u32, mut value: usize) {
    let max = (1usize << n) - 1;
    if value < max {
        out.push(high | value as u8);
        return;
    }
    out.push(high | max as u8);
    value -= max;
    while value >= 0x80 {
        out.push((value as u8 & 0x7f) | 0x80);
        value >>= 7;
    }
    out.push(value as u8);
}

/// The decoding side of one connection: its dynamic table lives as long as the
/// connection.
pub struct Decoder {
    table: VecDeque<Field>,
    size: usize,
    max_size: usize,
    /// What this side's SETTINGS_HEADER_TABLE_SIZE allows the server to ask for.
    limit: usize,
}

impl Decoder {
    pub fn new(limit: usize) -> Decoder {
        Decoder {
            table: VecDeque::new(),
            size: 0,
            max_size: limit,
            limit,
        }
    }

    /// The fields of one complete header block, refusing a list whose names and values
    /// (plus 32 bytes each, RFC 9113's measure) pass `max_list`: a few indexed bytes can
    /// stand for kilobytes.
    pub fn decode(&mut self, block: &[u8], max_list: usize) -> Result<Vec<Field>, HpackError> {
        let mut r = Cursor { buf: block, pos: 0 };
        let mut fields = Vec::new();
        let mut list = 0usize;
        while let Some(first) = r.peek() {
            let field = if first & 0x80 != 0 {
                let index = r.int(7)?;
                self.get(index)?
            } else if first & 0x40 != 0 {
                let field = self.literal(&mut r, 6)?;
                self.insert(field.clone());
                field
            } else if first & 0x20 != 0 {
                if !fields.is_empty() {
                    return Err(HpackError::LateTableSize);
                }
                let size = r.int(5)?;
                if size > self.limit {
                    return Err(HpackError::TableSize {
                        size,
                        limit: self.limit,
                    });
                }
                self.max_size = size;
                self.evict(0);
                continue;
            } else {
                // Without indexing (0000) and never indexed (0001) decode alike.
                self.literal(&mut r, 4)?
            };
            list = list
                .saturating_add(field.0.len() + field.1.len())
                .saturating_add(ENTRY_OVERHEAD);
            if list > max_list {
                return Err(HpackError::TooLarge(max_list));
            }
            fields.push(field);
        }
        Ok(fields)
    }

    /// A literal field whose name index has an `n`-bit prefix (0: a new name follows).
    fn literal(&self, r: &mut Cursor<'_>, n: u32) -> Result<Field, HpackError> {
        let index = r.int(n)?;
        let name = if index == 0 {
            r.string()?
        } else {
            self.get(index)?.0
        };
        Ok((name, r.string()?))
    }

    fn get(&self, index: usize) -> Result<Field, HpackError> {
        if index == 0 {
            return Err(HpackError::Index(0));
        }
        if let Some((name, value)) = STATIC.get(index - 1) {
            return Ok((name.as_bytes().to_vec(), value.as_bytes().to_vec()));
        }
        self.table
            .get(index - STATIC.len() - 1)
            .cloned()
            .ok_or(HpackError::Index(index))
    }

    fn insert(&mut self, field: Field) {
        let size = field.0.len() + field.1.len() + ENTRY_OVERHEAD;
        self.evict(size);
        // An entry larger than the whole table empties it and is not kept (4.4).
        if size <= self.max_size {
            self.size += size;
            self.table.push_front(field);
        }
    }

    /// Drops the oldest entries until `room` more bytes fit.
    fn evict(&mut self, room: usize) {
        while self.size + room > self.max_size {
            match self.table.pop_back() {
                Some((name, value)) => {
                    self.size -= name.len() + value.len() + ENTRY_OVERHEAD;
                }
                None => {
                    self.size = 0;
                    break;
                }
            }
        }
    }

    #[cfg(test)]
    fn table_size(&self) -> usize {
        self.size
    }
}

struct Cursor<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl Cursor<'_> {
    fn peek(&self) -> Option<u8> {
        self.buf.get(self.pos).copied()
    }

    fn byte(&mut self) -> Result<u8, HpackError> {
        let b = self.peek().ok_or(HpackError::Truncated)?;
        self.pos += 1;
        Ok(b)
    }

    /// An integer with an `n`-bit prefix (RFC 7541 section 5.1); at most 2^28 or so,
    /// far past any length a frame can hold.
    fn int(&mut self, n: u32) -> Result<usize, HpackError> {
        let max = (1usize << n) - 1;
        let mut value = usize::from(self.byte()?) & max;
        if value < max {
            return Ok(value);
        }
        for shift in (0..28).step_by(7) {
            let b = self.byte()?;
            value += usize::from(b & 0x7f) << shift;
            if b & 0x80 == 0 {
                return Ok(value);
            }
        }
        Err(HpackError::Overflow)
    }

    /// A string literal, Huffman-coded or not (section 5.2).
    fn string(&mut self) -> Result<Vec<u8>, HpackError> {
        let huffman = self.peek().ok_or(HpackError::Truncated)? & 0x80 != 0;
        let len = self.int(7)?;
        let end = self
            .pos
            .checked_add(len)
            .filter(|&end| end <= self.buf.len())
            .ok_or(HpackError::Truncated)?;
        let raw = &self.buf[self.pos..end];
        self.pos = end;
        if huffman {
            huffman_decode(raw)
        } else {
            Ok(raw.to_vec())
        }
    }
}

/// The Huffman code as a binary tree: each node holds its two children, either another
/// node's index or `LEAF | symbol`; 0 is no child (the root is never one).
fn tree() -> &'static [[u16; 2]] {
    const LEAF: u16 = 0x8000;
    static TREE: OnceLock<Vec<[u16; 2]>> = OnceLock::new();
    TREE.get_or_init(|| {
        let mut nodes = vec![[0u16; 2]];
        for (symbol, &(code, len)) in HUFFMAN.iter().enumerate() {
            let mut node = 0usize;
            for i in (0..len).rev() {
                let bit = ((code >> i) & 1) as usize;
                if i == 0 {
                    nodes[node][bit] = LEAF | symbol as u16;
                } else {
                    if nodes[node][bit] == 0 {
                        nodes.push([0; 2]);
                        nodes[node][bit] = (nodes.len() - 1) as u16;
                    }
                    node = usize::from(nodes[node][bit]);
                }
            }
        }
        nodes
    })
}

/// Decodes a Huffman-coded string (section 5.2): EOS inside, or padding that is longer
/// than 7 bits or not all ones, is an error.
pub fn huffman_decode(bytes: &[u8]) -> Result<Vec<u8>, HpackError> {
    const LEAF: u16 = 0x8000;
    let tree = tree();
    let mut out = Vec::with_capacity(bytes.len() * 8 / 5);
    let mut node = 0usize;
    // Bits read since the last symbol, and whether all were ones (a padding candidate).
    let mut pending = 0u32;
    let mut ones = true;
    for &byte in bytes {
        for i in (0..8).rev() {
            let bit = usize::from((byte >> i) & 1);
            let next = tree.get(node).ok_or(HpackError::Huffman)?[bit];
            pending += 1;
            ones &= bit == 1;
            if next & LEAF != 0 {
                let symbol = next & !LEAF;
                let symbol = u8::try_from(symbol).map_err(|_| HpackError::Huffman)?;
                out.push(symbol);
                node = 0;
                pending = 0;
                ones = true;
            } else if next == 0 {
                return Err(HpackError::Huffman);
            } else {
                node = usize::from(next);
            }
        }
    }
    if pending > 7 || !ones {
        return Err(HpackError::Huffman);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hex(s: &str) -> Vec<u8> {
        let digits: Vec<u8> = s.bytes().filter(u8::is_ascii_hexdigit).collect();
        digits
            .chunks(2)
            .map(|pair| {
                let text = std::str::from_utf8(pair).expect("ascii");
                u8::from_str_radix(text, 16).expect("hex")
            })
            .collect()
    }

    fn text(fields: &[Field]) -> Vec<(String, String)> {
        fields
            .iter()
            .map(|(n, v)| {
                (
                    String::from_utf8_lossy(n).into_owned(),
                    String::from_utf8_lossy(v).into_owned(),
                )
            })
            .collect()
    }

    fn pairs(list: &[(&str, &str)]) -> Vec<(String, String)> {
        list.iter()
            .map(|(n, v)| (n.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn huffman_decodes_the_rfc_7541_c4_strings() {
        for (coded, plain) in [
            ("f1e3 c2e5 f23a 6ba0 ab90 f4ff", "www.example.com"),
            ("a8eb 1064 9cbf", "no-cache"),
            ("25a8 49e9 5ba9 7d7f", "custom-key"),
            ("25a8 49e9 5bb8 e8b4 bf", "custom-value"),
        ] {
            assert_eq!(
                huffman_decode(&hex(coded)).as_deref(),
                Ok(plain.as_bytes()),
                "{plain}"
            );
        }
        assert_eq!(huffman_decode(&[]).as_deref(), Ok(&b""[..]));
    }

    #[test]
    fn huffman_round_trips_every_byte() {
        let all: Vec<u8> = (0..=255).collect();
        assert_eq!(huffman_decode(&huffman_encode(&all)), Ok(all.clone()));
        assert_eq!(
            huffman_encode(b"www.example.com"),
            hex("f1e3 c2e5 f23a 6ba0 ab90 f4ff")
        );
    }

    #[test]
    fn huffman_refuses_bad_padding_and_eos() {
        // '0' is 00000: three zero bits of padding.
        assert_eq!(huffman_decode(&[0x00]), Err(HpackError::Huffman));
        // Eight ones: padding longer than 7 bits.
        assert_eq!(huffman_decode(&[0xff]), Err(HpackError::Huffman));
        // Thirty ones are EOS, which may not appear.
        assert_eq!(
            huffman_decode(&[0xff, 0xff, 0xff, 0xff]),
            Err(HpackError::Huffman)
        );
    }

    #[test]
    fn huffman_table_is_a_complete_prefix_code() {
        // Kraft's sum of a complete prefix code is exactly 1.
        let sum: u64 = HUFFMAN.iter().map(|&(_, len)| 1u64 << (30 - len)).sum();
        assert_eq!(sum, 1 << 30);
        for &(code, len) in &HUFFMAN {
            assert!(u64::from(code) < 1u64 << len);
        }
    }

    #[test]
    fn decodes_the_rfc_7541_c4_requests_with_the_dynamic_table() {
        let mut d = Decoder::new(4096);
        let first = d
            .decode(&hex("8286 8441 8cf1 e3c2 e5f2 3a6b a0ab 90f4 ff"), 1 << 16)
            .expect("C.4.1");
        assert_eq!(
            text(&first),
            pairs(&[
                (":method", "GET"),
                (":scheme", "http"),
                (":path", "/"),
                (":authority", "www.example.com"),
            ])
        );
        assert_eq!(d.table_size(), 57);
        let second = d
            .decode(&hex("8286 84be 5886 a8eb 1064 9cbf"), 1 << 16)
            .expect("C.4.2");
        assert_eq!(
            text(&second),
            pairs(&[
                (":method", "GET"),
                (":scheme", "http"),
                (":path", "/"),
                (":authority", "www.example.com"),
                ("cache-control", "no-cache"),
            ])
        );
        assert_eq!(d.table_size(), 110);
        let third = d
            .decode(
                &hex("8287 85bf 4088 25a8 49e9 5ba9 7d7f 8925 a849 e95b b8e8 b4bf"),
                1 << 16,
            )
            .expect("C.4.3");
        assert_eq!(
            text(&third),
            pairs(&[
                (":method", "GET"),
                (":scheme", "https"),
                (":path", "/index.html"),
                (":authority", "www.example.com"),
                ("custom-key", "custom-value"),
            ])
        );
        assert_eq!(d.table_size(), 164);
    }

    #[test]
    fn decodes_the_rfc_7541_c6_responses_with_eviction() {
        let mut d = Decoder::new(256);
        let first = d
            .decode(
                &hex(
                    "4882 6402 5885 aec3 771a 4b61 96d0 7abe 9410 54d4 44a8 2005 9504 0b81 \
                     66e0 82a6 2d1b ff6e 919d 29ad 1718 63c7 8f0b 97c8 e9ae 82ae 43d3",
                ),
                1 << 16,
            )
            .expect("C.6.1");
        assert_eq!(
            text(&first),
            pairs(&[
                (":status", "302"),
                ("cache-control", "private"),
                ("date", "Mon, 21 Oct 2013 20:13:21 GMT"),
                ("location", "https://www.example.com"),
            ])
        );
        assert_eq!(d.table_size(), 222);
        let second = d
            .decode(&hex("4883 640e ffc1 c0bf"), 1 << 16)
            .expect("C.6.2");
        assert_eq!(
            text(&second),
            pairs(&[
                (":status", "307"),
                ("cache-control", "private"),
                ("date", "Mon, 21 Oct 2013 20:13:21 GMT"),
                ("location", "https://www.example.com"),
            ])
        );
        assert_eq!(d.table_size(), 222);
    }

    #[test]
    fn hostile_blocks_are_refused() {
        let mut d = Decoder::new(4096);
        assert_eq!(d.decode(&[0x80], 1 << 16), Err(HpackError::Index(0)));
        assert_eq!(d.decode(&[0xbe], 1 << 16), Err(HpackError::Index(62)));
        assert_eq!(
            d.decode(&[0x00, 0x05, b'a'], 1 << 16),
            Err(HpackError::Truncated)
        );
        assert_eq!(
            d.decode(&[0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01], 1 << 16),
            Err(HpackError::Overflow)
        );
        assert_eq!(
            d.decode(&[0x3f, 0xe1, 0x7f], 1 << 16),
            Err(HpackError::TableSize {
                size: 16_384,
                limit: 4096
            })
        );
        assert_eq!(
            d.decode(&[0x88, 0x20], 1 << 16),
            Err(HpackError::LateTableSize)
        );
        // One 4 KB entry, then many references to it.
        let mut block = vec![0x40, 0x01, b'x'];
        encode_int(&mut block, 0, 7, 4000);
        block.extend(std::iter::repeat_n(b'v', 4000));
        block.extend(std::iter::repeat_n(0xbe, 100));
        assert_eq!(
            d.decode(&block, 1 << 16),
            Err(HpackError::TooLarge(1 << 16))
        );
    }

    #[test]
    fn literals_round_trip_through_the_decoder() {
        let mut block = Vec::new();
        let long = "v".repeat(300);
        encode_literal(&mut block, ":path", "/grpc.health.v1.Health/Check");
        encode_literal(&mut block, "x-long", &long);
        encode_never_indexed(&mut block, "authorization", "Bearer t0k3n");
        assert_eq!(block[block.len() - 28], 0x10, "never indexed");
        let mut d = Decoder::new(4096);
        let fields = d.decode(&block, 1 << 16).expect("decodes");
        assert_eq!(
            text(&fields),
            pairs(&[
                (":path", "/grpc.health.v1.Health/Check"),
                ("x-long", &long),
                ("authorization", "Bearer t0k3n")
            ])
        );
        // Nothing went into the dynamic table: an index into it is refused.
        assert!(d.decode(&[0xbe], 1 << 16).is_err());
    }
}
