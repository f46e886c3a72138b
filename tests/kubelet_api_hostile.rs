//! The kubelet API of a real agent under clients that misbehave: thousands of
//! connections that start TLS and never finish it, and client certificates that the
//! client CA check refuses for reasons other than their issuer (no v3 extensions,
//! expired). Runs as root (the agent is real).

use support::{agent, kubelet_api};

use std::io::{ErrorKind, Read, Write};
use std::net::{Ipv4Addr, SocketAddrV4, TcpStream};
use std::os::fd::AsRawFd;
use std::path::Path;
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use agent::need_root;
use kubelet_api::{curl, parse_prometheus, sample, Api};

/// The caps the server documents (`server::MAX_CONNECTIONS`, `..._PER_SOURCE`).
const TOTAL: usize = holdfast::server::MAX_CONNECTIONS;
const PER_SOURCE: usize = holdfast::server::MAX_CONNECTIONS_PER_SOURCE;
/// How long a client may take over its TLS handshake, and over a request's headers.
const HANDSHAKE: Duration = holdfast::server::HANDSHAKE_TIMEOUT;
const HEADERS: Duration = holdfast::server::HEADER_READ_TIMEOUT;

fn rss_kib(pid: u32) -> u64 {
    agent::proc_status(pid, "VmRSS").unwrap_or(0)
}

/// Room for thousands of sockets in this process (and the agent it starts).
fn raise_fd_limit(want: u64) {
    use nix::sys::resource::{getrlimit, setrlimit, Resource};
    let (soft, hard) = getrlimit(Resource::RLIMIT_NOFILE).expect("getrlimit");
    if soft < want {
        setrlimit(Resource::RLIMIT_NOFILE, want.max(soft), hard.max(want))
            .expect("raise RLIMIT_NOFILE (as root)");
    }
}

/// A TCP connection to `127.0.0.1:port` from `source` (any address of 127/8 is local).
fn connect_from(source: Ipv4Addr, port: u16) -> TcpStream {
    use nix::sys::socket::{bind, connect, socket, AddressFamily, SockFlag, SockType, SockaddrIn};
    let fd = socket(
        AddressFamily::Inet,
        SockType::Stream,
        SockFlag::SOCK_CLOEXEC,
        None,
    )
    .expect("socket");
    bind(
        fd.as_raw_fd(),
        &SockaddrIn::from(SocketAddrV4::new(source, 0)),
    )
    .expect("bind");
    connect(
        fd.as_raw_fd(),
        &SockaddrIn::from(SocketAddrV4::new(Ipv4Addr::LOCALHOST, port)),
    )
    .expect("connect");
    TcpStream::from(fd)
}

/// A real ClientHello (from rustls), to start handshakes that are never finished.
fn client_hello() -> Vec<u8> {
    let provider = holdfast::tls::provider();
    let config = rustls::ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .expect("protocol versions")
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(holdfast::tls::AnyServerCertificate(provider)))
        .with_no_client_auth();
    let name = rustls_pki_types::ServerName::try_from("localhost").expect("name");
    let mut conn = rustls::ClientConnection::new(Arc::new(config), name).expect("client");
    let mut hello = Vec::new();
    conn.write_tls(&mut hello).expect("client hello");
    hello
}

/// How a held connection looks from the client's side now.
fn closed(s: &mut TcpStream) -> bool {
    let mut buf = [0u8; 4096];
    loop {
        match s.read(&mut buf) {
            Ok(0) => return true,
            // The server's half of a handshake: read it and look again.
            Ok(_) => continue,
            Err(e) if e.kind() == ErrorKind::WouldBlock => return false,
            Err(e) if e.kind() == ErrorKind::Interrupted => continue,
            // Reset: closed with our ClientHello unread.
            Err(_) => return true,
        }
    }
}

fn open_count(conns: &mut [(TcpStream, bool)]) -> usize {
    for (s, done) in conns.iter_mut() {
        if !*done && closed(s) {
            *done = true;
        }
    }
    conns.iter().filter(|(_, done)| !done).count()
}

/// Opens `n` connections from each source; each third sends nothing, a third a
/// partial TLS record, a third a whole ClientHello.
fn flood(port: u16, sources: &[Ipv4Addr], n: usize, hello: &[u8]) -> Vec<(TcpStream, bool)> {
    let mut conns = Vec::with_capacity(sources.len() * n);
    for &src in sources {
        for i in 0..n {
            let mut s = connect_from(src, port);
            let sent = match i % 3 {
                0 => Ok(()),
                1 => s.write_all(&hello[..5.min(hello.len())]),
                _ => s.write_all(hello),
            };
            // The server may already have closed it (over the cap): that is the point.
            let _ = sent;
            s.set_nonblocking(true).expect("nonblocking");
            conns.push((s, false));
        }
    }
    conns
}

fn evicted(api: &Api) -> f64 {
    let (code, body) = api.get("/metrics");
    assert_eq!(code, 200, "{body}");
    sample(
        &parse_prometheus(&body),
        "holdfast_kubelet_api_connections_evicted_total",
        &[],
    )
    .unwrap_or_else(|| panic!("no eviction count in /metrics:\n{body}"))
}

fn refused(api: &Api, reason: &str) -> f64 {
    let (code, body) = api.get("/metrics");
    assert_eq!(code, 200, "{body}");
    let samples = parse_prometheus(&body);
    sample(
        &samples,
        "holdfast_kubelet_api_connections_refused_total",
        &[("reason", reason)],
    )
    .unwrap_or_else(|| panic!("no refused count for {reason} in /metrics:\n{body}"))
}

#[test]
fn unfinished_handshakes_are_bounded_and_do_not_lock_out_clients() {
    if !need_root() {
        return;
    }
    raise_fd_limit(16384);
    let api = Api::start("api-hostile-conns");
    let pid = api.agent.pid().expect("agent pid");
    let hello = client_hello();
    let rss_before = rss_kib(pid);

    // 2000 handshakes that never finish, from three sources: each source gets its cap,
    // the rest are closed at once, and the real client still gets its answers.
    let sources = [
        Ipv4Addr::new(127, 0, 0, 2),
        Ipv4Addr::new(127, 0, 0, 3),
        Ipv4Addr::new(127, 0, 0, 4),
    ];
    let per = 2000 / sources.len();
    let started = Instant::now();
    let mut conns = flood(api.port, &sources, per, &hello);
    let opened_in = started.elapsed();
    // And on the plain read-only port, request headers that never end.
    let trickle = b"GET /pods HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ";
    let slow_start = Instant::now();
    let mut slow = flood(
        api.read_only_port,
        &[Ipv4Addr::new(127, 0, 0, 5)],
        PER_SOURCE + 36,
        trickle,
    );
    let allowed = sources.len() * PER_SOURCE;
    let deadline = Instant::now() + Duration::from_secs(3);
    let mut open = open_count(&mut conns);
    while open > allowed && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
        open = open_count(&mut conns);
    }
    assert!(
        open <= allowed,
        "{open} of {} unfinished connections still open 3 s after they were made \
         ({PER_SOURCE} a source allowed)",
        conns.len()
    );
    let rss_during = rss_kib(pid);
    let (code, body) = api.get("/pods");
    assert_eq!(
        code, 200,
        "a client with a certificate while the flood is held: {body}"
    );
    assert_eq!(
        curl(&api.url("/healthz"), None, &[]),
        (200, "ok".into()),
        "/healthz while the flood is held"
    );
    assert!(
        refused(&api, "per_source") >= (conns.len() - allowed + 36) as f64,
        "refused connections are counted"
    );
    let ro_open = open_count(&mut slow);
    assert!(
        ro_open <= PER_SOURCE,
        "{ro_open} unfinished requests open on the read-only port, {PER_SOURCE} allowed"
    );
    let ro = format!("http://127.0.0.1:{}/healthz", api.read_only_port);
    assert_eq!(curl(&ro, None, &[]), (200, "ok".into()), "{ro} meanwhile");

    // The held ones are closed once the handshake bound has passed.
    let deadline = started + opened_in + HANDSHAKE + Duration::from_secs(5);
    while open_count(&mut conns) > 0 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(200));
    }
    let left = open_count(&mut conns);
    assert_eq!(
        left, 0,
        "connections that never finished their handshake are closed within {HANDSHAKE:?}"
    );
    drop(conns);
    let deadline = slow_start + HEADERS + Duration::from_secs(5);
    while open_count(&mut slow) > 0 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(200));
    }
    assert_eq!(
        open_count(&mut slow),
        0,
        "requests whose headers never end are closed within {HEADERS:?}"
    );
    drop(slow);

    // Many sources, more than the total: the total holds, the oldest unfinished
    // connections give their places to the newer ones, and a client that completes
    // its handshake is served while the flood goes on.
    let many: Vec<Ipv4Addr> = (10..10 + (TOTAL / PER_SOURCE + 2) as u8)
        .map(|i| Ipv4Addr::new(127, 0, 1, i))
        .collect();
    let evicted_before = evicted(&api);
    let mut conns = flood(api.port, &many, PER_SOURCE, &hello);
    let deadline = Instant::now() + Duration::from_secs(3);
    let mut open = open_count(&mut conns);
    while open > TOTAL && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
        open = open_count(&mut conns);
    }
    assert!(open <= TOTAL, "{open} connections open, {TOTAL} allowed");
    let rss_full = rss_kib(pid);
    let (code, body) = api.get("/pods");
    assert_eq!(
        code, 200,
        "a client with a certificate while {TOTAL} are held: {body}"
    );
    assert!(
        evicted(&api) >= evicted_before + (many.len() * PER_SOURCE - TOTAL) as f64,
        "evictions are counted"
    );
    drop(conns);
    assert_eq!(api.get("/pods").0, 200, "served once the flood is gone");
    let rss_after = rss_kib(pid);
    println!(
        "agent RSS: before {rss_before} KiB, {allowed} unfinished handshakes held \
         {rss_during} KiB, {TOTAL} held {rss_full} KiB, after {rss_after} KiB"
    );
}

/// Makes a v1 certificate (no extensions) signed by the CA in `ca_dir`.
fn v1_client(ca_dir: &Path, dir: &Path) -> (String, String) {
    std::fs::create_dir_all(dir).expect("create dir");
    let (key, csr, crt) = (dir.join("v1.key"), dir.join("v1.csr"), dir.join("v1.crt"));
    let ok = |c: &mut Command| {
        let out = c.output().expect("run openssl");
        assert!(
            out.status.success(),
            "{c:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    ok(Command::new("openssl")
        .args(["req", "-new", "-nodes", "-newkey", "ec"])
        .args(["-pkeyopt", "ec_paramgen_curve:prime256v1"])
        .args(["-subj", "/CN=old-client/O=system:masters", "-keyout"])
        .arg(&key)
        .arg("-out")
        .arg(&csr));
    ok(Command::new("openssl")
        .args(["x509", "-req", "-days", "2", "-in"])
        .arg(&csr)
        .arg("-CA")
        .arg(ca_dir.join("ca.crt"))
        .arg("-CAkey")
        .arg(ca_dir.join("ca.key"))
        .arg("-CAcreateserial")
        .arg("-out")
        .arg(&crt));
    let text = ok(Command::new("openssl")
        .args(["x509", "-noout", "-text", "-in"])
        .arg(&crt));
    assert!(
        text.contains("Version: 1 "),
        "not a v1 certificate:\n{text}"
    );
    (
        crt.to_string_lossy().into_owned(),
        key.to_string_lossy().into_owned(),
    )
}

#[test]
fn refused_client_certificates_get_401_saying_why() {
    if !need_root() {
        return;
    }
    let api = Api::start("api-hostile-certs");
    let (crt, key) = v1_client(&api.ca.dir, &api.agent.dir.join("v1"));
    let (code, body) = curl(&api.url("/pods"), None, &["--cert", &crt, "--key", &key]);
    assert_eq!(code, 401, "a v1 client certificate: {body}");
    assert!(
        body.starts_with("Unauthorized") && body.contains("version"),
        "the 401 says why: {body:?}"
    );
    // Over TLS 1.2 as well (its signature check is another path).
    let (code, body) = curl(
        &api.url("/pods"),
        None,
        &[
            "--cert",
            &crt,
            "--key",
            &key,
            "--tlsv1.2",
            "--tls-max",
            "1.2",
        ],
    );
    assert_eq!(code, 401, "a v1 client certificate over TLS 1.2: {body}");
    // /healthz needs no certificate, so a bad one does not matter there.
    assert_eq!(
        curl(&api.url("/healthz"), None, &["--cert", &crt, "--key", &key]),
        (200, "ok".into())
    );

    let expired = api
        .ca
        .expired_client("expired", "old-apiserver", &["system:masters"]);
    let (code, body) = curl(&api.url("/pods"), Some(&expired), &[]);
    assert_eq!(code, 401, "an expired client certificate: {body}");
    assert!(body.contains("expired"), "the 401 says why: {body:?}");

    let (code, body) = curl(&api.url("/pods"), Some(&api.stranger), &[]);
    assert_eq!(code, 401, "a certificate from another CA: {body}");
    assert!(
        body.contains("not signed by the client CA"),
        "the 401 says why: {body:?}"
    );
    let (code, body) = curl(&api.url("/pods"), None, &[]);
    assert_eq!(code, 401, "no certificate: {body}");
    assert!(body.contains("no client certificate"), "{body:?}");
    assert_eq!(api.get("/pods").0, 200, "the CA's client is served");
}
