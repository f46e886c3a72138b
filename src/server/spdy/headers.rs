//! SPDY/3 header blocks: one zlib stream per direction and per session, primed with
//! the SPDY/3 dictionary (`spdy3.dict`, 1423 bytes, from the SPDY/3 draft). The
//! client's blocks are inflated on its stream; ours are written as stored deflate
//! blocks, each ended by a sync flush as Go's zlib writer ends them.

use flate2::{Decompress, FlushDecompress, Status};

use super::MAX_FRAME;

pub const DICTIONARY: &[u8] = include_bytes!("../spdy3.dict");

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
}
