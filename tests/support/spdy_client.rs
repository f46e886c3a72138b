//! A SPDY/3.1 client written from the SPDY/3 draft and Kubernetes' stream protocols
//! (what the apiserver does when it reaches a kubelet): HTTP/1.1 upgrade over TLS with
//! a client certificate, then streams opened with SYN_STREAM and their headers. For
//! exec and attach, one stream per channel (`streamtype`), stdin as DATA with FIN, and
//! output until the error stream ends; for port-forward, a data and an error stream
//! per connection (`streamtype`, `port`, `requestid`).

#![allow(dead_code)]

use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::Arc;
use std::time::Duration;

use flate2::{Compress, Compression, Decompress, FlushCompress, FlushDecompress};

use rustls_pki_types::ServerName;

use super::pki::Issued;

/// The SPDY/3 header dictionary (draft 3, section 2.6.10.1).
const DICTIONARY: &[u8] = include_bytes!("../../src/server/spdy3.dict");

pub struct ExecResult {
    pub protocol: String,
    pub stdout: Vec<u8>,
    pub stderr: Vec<u8>,
    pub error: Vec<u8>,
}

fn tls(port: u16, client: &Issued) -> rustls::StreamOwned<rustls::ClientConnection, TcpStream> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .expect("versions")
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(super::pki::AnyServer(provider)))
        .with_client_auth_cert(vec![client.cert_der.clone()], client.key_der())
        .expect("client cert");
    let name = ServerName::try_from("127.0.0.1").expect("name").to_owned();
    let conn = rustls::ClientConnection::new(Arc::new(config), name).expect("tls");
    let sock = TcpStream::connect(("127.0.0.1", port)).expect("connect");
    sock.set_read_timeout(Some(Duration::from_secs(30)))
        .expect("timeout");
    rustls::StreamOwned::new(conn, sock)
}

fn header_block(z: &mut Compress, pairs: &[(&str, &str)]) -> Vec<u8> {
    let mut raw = (pairs.len() as u32).to_be_bytes().to_vec();
    for (k, v) in pairs {
        raw.extend_from_slice(&(k.len() as u32).to_be_bytes());
        raw.extend_from_slice(k.as_bytes());
        raw.extend_from_slice(&(v.len() as u32).to_be_bytes());
        raw.extend_from_slice(v.as_bytes());
    }
    let mut out = Vec::with_capacity(raw.len() + 128);
    z.compress_vec(&raw, &mut out, FlushCompress::Sync)
        .expect("deflate");
    out
}

fn control(kind: u16, flags: u8, payload: &[u8]) -> Vec<u8> {
    let mut f = vec![0x80, 3];
    f.extend_from_slice(&kind.to_be_bytes());
    f.push(flags);
    f.extend_from_slice(&(payload.len() as u32).to_be_bytes()[1..]);
    f.extend_from_slice(payload);
    f
}

fn data(stream: u32, flags: u8, payload: &[u8]) -> Vec<u8> {
    let mut f = stream.to_be_bytes().to_vec();
    f.push(flags);
    f.extend_from_slice(&(payload.len() as u32).to_be_bytes()[1..]);
    f.extend_from_slice(payload);
    f
}

/// What the server sent, frame by frame.
#[derive(Debug, PartialEq)]
pub enum Event {
    /// SYN_REPLY to one of our streams.
    Reply(u32),
    Data {
        stream: u32,
        data: Vec<u8>,
        fin: bool,
    },
    /// RST_STREAM: the server refused or ended a stream.
    Reset(u32),
    GoAway,
    Ping,
}

/// A SPDY/3.1 connection to the kubelet API after the upgrade.
pub struct Session {
    s: rustls::StreamOwned<rustls::ClientConnection, TcpStream>,
    deflate: Compress,
    inflate: Decompress,
    next_id: u32,
    /// The protocol the server chose (`X-Stream-Protocol-Version`).
    pub protocol: String,
}

impl Session {
    /// Upgrades a POST to `path_and_query`, offering `protocols`; panics unless 101.
    pub fn open(port: u16, path_and_query: &str, client: &Issued, protocols: &[&str]) -> Session {
        let mut s = tls(port, client);
        let offers: String = protocols
            .iter()
            .map(|p| format!("X-Stream-Protocol-Version: {p}\r\n"))
            .collect();
        write!(
            s,
            "POST {path_and_query} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nConnection: Upgrade\r\n\
             Upgrade: SPDY/3.1\r\n{offers}Content-Length: 0\r\n\r\n"
        )
        .expect("request");
        s.flush().expect("flush");
        // The response head, byte by byte so nothing of the SPDY stream is consumed.
        let mut head = Vec::new();
        while !head.ends_with(b"\r\n\r\n") {
            let mut b = [0u8; 1];
            s.read_exact(&mut b).expect("response head");
            head.push(b[0]);
        }
        let head = String::from_utf8_lossy(&head).into_owned();
        assert!(head.starts_with("HTTP/1.1 101"), "{head}");
        let protocol = head
            .lines()
            .find_map(|l| {
                let (k, v) = l.split_once(':')?;
                k.eq_ignore_ascii_case("x-stream-protocol-version")
                    .then(|| v.trim().to_owned())
            })
            .unwrap_or_default();
        let mut deflate = Compress::new(Compression::default(), true);
        deflate.set_dictionary(DICTIONARY).expect("dictionary");
        Session {
            s,
            deflate,
            inflate: Decompress::new(true),
            next_id: 1,
            protocol,
        }
    }

    /// Opens a stream (SYN_STREAM) with these headers; returns its id (odd, rising).
    pub fn stream(&mut self, headers: &[(&str, &str)]) -> u32 {
        let id = self.next_id;
        self.next_id += 2;
        let mut p = id.to_be_bytes().to_vec();
        p.extend_from_slice(&0u32.to_be_bytes());
        p.extend_from_slice(&[0, 0]);
        p.extend(header_block(&mut self.deflate, headers));
        self.s.write_all(&control(1, 0, &p)).expect("syn_stream");
        self.s.flush().expect("flush");
        id
    }

    /// Sends data on a stream; `fin` ends our side of it.
    pub fn send(&mut self, stream: u32, payload: &[u8], fin: bool) {
        self.s
            .write_all(&data(stream, u8::from(fin), payload))
            .expect("data");
        self.s.flush().expect("flush");
    }

    /// The next frame from the server; None when the connection ends.
    pub fn next(&mut self) -> Option<Event> {
        let mut h = [0u8; 8];
        self.s.read_exact(&mut h).ok()?;
        let len = u32::from_be_bytes([0, h[5], h[6], h[7]]) as usize;
        let mut p = vec![0u8; len];
        self.s.read_exact(&mut p).expect("frame");
        if h[0] & 0x80 == 0 {
            return Some(Event::Data {
                stream: u32::from_be_bytes([h[0], h[1], h[2], h[3]]),
                data: p,
                fin: h[4] & 1 != 0,
            });
        }
        let id = || u32::from_be_bytes([p[0], p[1], p[2], p[3]]) & 0x7fff_ffff;
        Some(match u16::from_be_bytes([h[2], h[3]]) {
            2 => {
                // SYN_REPLY: its header block must inflate on the shared stream, and
                // end with a sync flush's empty stored block as Go's zlib writer ends
                // it: Go's inflater gives out nothing before that marker, and reads on
                // past the frame (failing for good) when it is missing.
                assert!(
                    p.ends_with(&[0, 0, 0xff, 0xff]),
                    "reply header block without the sync flush: {p:02x?}"
                );
                let mut out = Vec::with_capacity(4096);
                let before = self.inflate.total_in();
                let r = self
                    .inflate
                    .decompress_vec(&p[4..], &mut out, FlushDecompress::Sync);
                if let Err(e) = r {
                    // The zlib header asks for the dictionary; the rest follows it.
                    assert!(e.needs_dictionary().is_some(), "reply headers: {e}");
                    self.inflate.set_dictionary(DICTIONARY).expect("dict");
                    let used = (self.inflate.total_in() - before) as usize;
                    self.inflate
                        .decompress_vec(&p[4 + used..], &mut out, FlushDecompress::Sync)
                        .expect("reply headers");
                }
                // An empty header block: a count of zero pairs.
                assert_eq!(out.get(..4), Some(&[0u8, 0, 0, 0][..]), "reply headers");
                Event::Reply(id())
            }
            3 => Event::Reset(id()),
            6 => Event::Ping,
            7 => Event::GoAway,
            k => panic!("unexpected control frame {k}"),
        })
    }
}

/// Opens the exec or attach streams (error, then stdin, stdout, stderr as `kinds`
/// says), sends `stdin` then FIN, and reads until the error stream ends.
pub fn exec_streams(
    port: u16,
    path_and_query: &str,
    client: &Issued,
    kinds: &[&str],
    stdin: Option<&[u8]>,
) -> ExecResult {
    let mut s = Session::open(
        port,
        path_and_query,
        client,
        &["v4.channel.k8s.io", "v3.channel.k8s.io"],
    );
    let mut ids = HashMap::new();
    for kind in kinds {
        ids.insert(*kind, s.stream(&[("streamtype", kind)]));
    }
    if let (Some(input), Some(&id)) = (stdin, ids.get("stdin")) {
        s.send(id, input, false);
        s.send(id, &[], true);
    }
    let mut got: HashMap<u32, Vec<u8>> = HashMap::new();
    let mut replies = 0;
    let error = ids.get("error").copied().unwrap_or(0);
    while let Some(e) = s.next() {
        match e {
            Event::Reply(_) => replies += 1,
            Event::Data { stream, data, fin } => {
                got.entry(stream).or_default().extend_from_slice(&data);
                if stream == error && fin {
                    break;
                }
            }
            Event::GoAway => break,
            _ => {}
        }
    }
    assert_eq!(replies, kinds.len(), "one SYN_REPLY per stream");
    let mut take = |k: &str| ids.get(k).and_then(|id| got.remove(id)).unwrap_or_default();
    ExecResult {
        protocol: s.protocol.clone(),
        stdout: take("stdout"),
        stderr: take("stderr"),
        error: take("error"),
    }
}

/// Runs the exec at `path_and_query`; sends `stdin` (then FIN) if given.
pub fn exec(port: u16, path_and_query: &str, client: &Issued, stdin: Option<&[u8]>) -> ExecResult {
    let q = path_and_query;
    let mut kinds = vec!["error"];
    if stdin.is_some() {
        kinds.push("stdin");
    }
    if q.contains("stdout=1") || q.contains("stdout=true") {
        kinds.push("stdout");
    }
    if q.contains("stderr=1") || q.contains("stderr=true") {
        kinds.push("stderr");
    }
    exec_streams(port, path_and_query, client, &kinds, stdin)
}
