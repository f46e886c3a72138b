//! A SPDY/3.1 exec client written from the SPDY/3 draft and Kubernetes' stream
//! protocol (what the apiserver does when it reaches a kubelet): HTTP/1.1 upgrade over
//! TLS with a client certificate, one SYN_STREAM per channel with a `streamtype`
//! header, stdin as DATA with FIN, and output until the error stream ends.

#![allow(dead_code)]

use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::Arc;
use std::time::Duration;

use flate2::{Compress, Compression, Decompress, FlushCompress, FlushDecompress};
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls_pki_types::{CertificateDer, ServerName, UnixTime};

use super::pki::Issued;

/// The SPDY/3 header dictionary (draft 3, section 2.6.10.1).
const DICTIONARY: &[u8] = include_bytes!("../../src/server/spdy3.dict");

pub struct ExecResult {
    pub protocol: String,
    pub stdout: Vec<u8>,
    pub stderr: Vec<u8>,
    pub error: Vec<u8>,
}

/// The agent's serving certificate is self-signed; the test trusts whatever it shows
/// (as `curl -k` does) and checks only the handshake signatures.
#[derive(Debug)]
struct AnyServer(Arc<rustls::crypto::CryptoProvider>);

impl ServerCertVerifier for AnyServer {
    fn verify_server_cert(
        &self,
        _: &CertificateDer<'_>,
        _: &[CertificateDer<'_>],
        _: &ServerName<'_>,
        _: &[u8],
        _: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }
    fn verify_tls12_signature(
        &self,
        m: &[u8],
        c: &CertificateDer<'_>,
        d: &rustls::DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(m, c, d, &self.0.signature_verification_algorithms)
    }
    fn verify_tls13_signature(
        &self,
        m: &[u8],
        c: &CertificateDer<'_>,
        d: &rustls::DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(m, c, d, &self.0.signature_verification_algorithms)
    }
    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

fn tls(port: u16, client: &Issued) -> rustls::StreamOwned<rustls::ClientConnection, TcpStream> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .expect("versions")
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(AnyServer(provider)))
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

/// Runs the exec at `path_and_query`; sends `stdin` (then FIN) if given.
pub fn exec(port: u16, path_and_query: &str, client: &Issued, stdin: Option<&[u8]>) -> ExecResult {
    let mut s = tls(port, client);
    write!(
        s,
        "POST {path_and_query} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nConnection: Upgrade\r\n\
         Upgrade: SPDY/3.1\r\nX-Stream-Protocol-Version: v4.channel.k8s.io\r\n\
         X-Stream-Protocol-Version: v3.channel.k8s.io\r\nContent-Length: 0\r\n\r\n"
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

    let mut z = Compress::new(Compression::default(), true);
    z.set_dictionary(DICTIONARY).expect("dictionary");
    let mut kinds = vec![("error", 1u32)];
    let q = path_and_query;
    if stdin.is_some() {
        kinds.push(("stdin", 3));
    }
    if q.contains("stdout=1") || q.contains("stdout=true") {
        kinds.push(("stdout", 5));
    }
    if q.contains("stderr=1") || q.contains("stderr=true") {
        kinds.push(("stderr", 7));
    }
    for (kind, id) in &kinds {
        let mut p = id.to_be_bytes().to_vec();
        p.extend_from_slice(&0u32.to_be_bytes());
        p.extend_from_slice(&[0, 0]);
        p.extend(header_block(&mut z, &[("streamtype", kind)]));
        s.write_all(&control(1, 0, &p)).expect("syn_stream");
    }
    if let Some(input) = stdin {
        s.write_all(&data(3, 0, input)).expect("stdin");
        s.write_all(&data(3, 1, &[])).expect("stdin fin");
    }
    s.flush().expect("flush");

    let mut inflate = Decompress::new(true);
    let mut got: HashMap<u32, Vec<u8>> = HashMap::new();
    let mut replies = 0;
    loop {
        let mut h = [0u8; 8];
        if s.read_exact(&mut h).is_err() {
            break;
        }
        let len = u32::from_be_bytes([0, h[5], h[6], h[7]]) as usize;
        let mut p = vec![0u8; len];
        s.read_exact(&mut p).expect("frame");
        if h[0] & 0x80 != 0 {
            let kind = u16::from_be_bytes([h[2], h[3]]);
            if kind == 2 {
                // SYN_REPLY: its header block must inflate on the shared stream.
                let mut out = Vec::with_capacity(4096);
                let before = inflate.total_in();
                let r = inflate.decompress_vec(&p[4..], &mut out, FlushDecompress::Sync);
                if let Err(e) = r {
                    // The zlib header asks for the dictionary; the rest follows it.
                    assert!(e.needs_dictionary().is_some(), "reply headers: {e}");
                    inflate.set_dictionary(DICTIONARY).expect("dict");
                    let used = (inflate.total_in() - before) as usize;
                    inflate
                        .decompress_vec(&p[4 + used..], &mut out, FlushDecompress::Sync)
                        .expect("reply headers");
                }
                // An empty header block: a count of zero pairs.
                assert_eq!(out.get(..4), Some(&[0u8, 0, 0, 0][..]), "reply headers");
                replies += 1;
            } else if kind == 7 {
                break;
            }
            continue;
        }
        let id = u32::from_be_bytes([h[0], h[1], h[2], h[3]]);
        got.entry(id).or_default().extend_from_slice(&p);
        if id == 1 && h[4] & 1 != 0 {
            break;
        }
    }
    assert_eq!(replies, kinds.len(), "one SYN_REPLY per stream");
    ExecResult {
        protocol,
        stdout: got.remove(&5).unwrap_or_default(),
        stderr: got.remove(&7).unwrap_or_default(),
        error: got.remove(&1).unwrap_or_default(),
    }
}
