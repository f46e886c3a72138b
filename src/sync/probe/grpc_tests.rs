//! Tests of the gRPC health prober, against servers on 127.0.0.1.

use super::h2::PADDED;
use super::*;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::thread;

/// Debian's python3, which python3-grpcio installs into.
const PYTHON: &str = "/usr/bin/python3";

/// A health service with raw-bytes (de)serializers: SERVING for "" and "ok",
/// NOT_SERVING for "down", NOT_FOUND for anything else. Exits when its stdin closes,
/// so a test process that dies does not leave it behind.
const SERVER: &str = r#"
import os, sys, threading
from concurrent import futures
import grpc

def check(request, context):
    service = ''
    if request[:1] == b'\x0a':
        n, i, shift = 0, 1, 0
        while True:
            b = request[i]; i += 1
            n |= (b & 0x7f) << shift; shift += 7
            if b < 0x80: break
        service = request[i:i + n].decode()
    if service in ('', 'ok'):
        return b'\x08\x01'
    if service == 'down':
        return b'\x08\x02'
    context.abort(grpc.StatusCode.NOT_FOUND, 'unknown service ' + service)

server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(
    'grpc.health.v1.Health',
    {'Check': grpc.unary_unary_rpc_method_handler(check)}),))
server.add_insecure_port('127.0.0.1:' + sys.argv[1])
server.start()
threading.Thread(target=lambda: (sys.stdin.read(), os._exit(0)), daemon=True).start()
server.wait_for_termination()
"#;

/// The python server, killed when the test ends however it ends.
struct PythonServer {
    child: Child,
    port: u16,
    log: PathBuf,
}

impl Drop for PythonServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_file(&self.log);
    }
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("free port")
        .port()
}

fn python_server() -> PythonServer {
    let port = free_port();
    let log = std::env::temp_dir().join(format!(
        "holdfast-grpc-probe-{}-{port}.log",
        std::process::id()
    ));
    let stderr = std::fs::File::create(&log).expect("server log");
    let child = Command::new(PYTHON)
        .args(["-c", SERVER, &port.to_string()])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(stderr)
        .spawn()
        .unwrap_or_else(|e| {
            panic!(
                "{PYTHON} is needed for the gRPC probe test (apt-get install python3-grpcio): {e}"
            )
        });
    let mut server = PythonServer { child, port, log };
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if TcpStream::connect(("127.0.0.1", port)).is_ok() {
            return server;
        }
        if let Ok(Some(status)) = server.child.try_wait() {
            let err = std::fs::read_to_string(&server.log).unwrap_or_default();
            panic!(
                "the python gRPC server exited ({status}); is python3-grpcio installed \
                     (apt-get install python3-grpcio)?\n{err}"
            );
        }
        assert!(
            Instant::now() < deadline,
            "the python gRPC server did not listen on port {port} within 30 s"
        );
        // A pause between polls, not a wait for the server: the connect decides.
        thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn health_checks_against_a_real_grpc_server() {
    let server = python_server();
    let port = server.port;
    let t = Duration::from_secs(10);
    assert_eq!(grpc("127.0.0.1", port, None, t), Outcome::Success);
    assert_eq!(grpc("127.0.0.1", port, Some(""), t), Outcome::Success);
    assert_eq!(grpc("127.0.0.1", port, Some("ok"), t), Outcome::Success);
    assert_eq!(
        grpc("127.0.0.1", port, Some("down"), t),
        Outcome::Failure("service unhealthy (responded with \"NOT_SERVING\")".to_string())
    );
    assert_eq!(
        grpc("127.0.0.1", port, Some("gone"), t),
        Outcome::Failure(
            "error: health rpc probe failed: rpc error: code = NotFound \
                 desc = unknown service gone"
                .to_string()
        )
    );
    // Long enough for multi-byte lengths in HPACK and protobuf.
    let long = "s".repeat(300);
    assert_eq!(
        grpc("127.0.0.1", port, Some(&long), t),
        Outcome::Failure(format!(
            "error: health rpc probe failed: rpc error: code = NotFound \
                 desc = unknown service {long}"
        ))
    );
    let err =
        check("127.0.0.1", port, "/grpc.health.v1.Nope/Check", "", t).expect_err("no such service");
    assert!(
        err.to_string().starts_with(
            "error: this server does not implement the grpc health protocol \
                 (grpc.health.v1.Health): "
        ),
        "{err}"
    );
}

#[test]
fn a_closed_port_fails_to_connect() {
    let port = free_port();
    let Outcome::Failure(message) = grpc("127.0.0.1", port, None, Duration::from_secs(1)) else {
        panic!("expected a failure");
    };
    assert!(
        message.starts_with(&format!(
            "timeout: failed to connect service \"127.0.0.1:{port}\" within 1s: "
        )),
        "{message}"
    );
    assert!(message.contains("connection refused"), "{message}");
}

fn read_frame(s: &mut TcpStream) -> (u8, u8, Vec<u8>) {
    let mut head = [0u8; 9];
    s.read_exact(&mut head).expect("frame header");
    let len = usize::from(head[0]) << 16 | usize::from(head[1]) << 8 | usize::from(head[2]);
    let mut payload = vec![0u8; len];
    s.read_exact(&mut payload).expect("frame payload");
    (head[3], head[4], payload)
}

/// A hand-driven HTTP/2 server for one connection: `script` runs after it has read
/// the client's preface and whole request; its result comes back on the channel.
fn fake<T: Send + 'static>(
    script: impl FnOnce(&mut TcpStream) -> T + Send + 'static,
) -> (u16, mpsc::Receiver<T>) {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = listener.local_addr().expect("addr").port();
    let (tx, rx) = mpsc::channel();
    thread::spawn(move || {
        let (mut s, _) = listener.accept().expect("accept");
        s.set_read_timeout(Some(Duration::from_secs(10)))
            .expect("timeout");
        let mut preface = [0u8; 24];
        s.read_exact(&mut preface).expect("preface");
        assert_eq!(&preface[..], PREFACE);
        loop {
            let (kind, flags, _) = read_frame(&mut s);
            if kind == DATA && flags & END_STREAM != 0 {
                break;
            }
        }
        let _ = tx.send(script(&mut s));
    });
    (port, rx)
}

#[test]
fn pings_are_answered_and_trailers_only_errors_read() {
    let (port, pong) = fake(|s| {
        let mut out = Vec::new();
        frame(&mut out, SETTINGS, 0, 0, &[]);
        frame(&mut out, PING, 0, 0, b"12345678");
        s.write_all(&out).expect("write");
        let pong = loop {
            let (kind, flags, payload) = read_frame(s);
            if kind == PING {
                break (flags, payload);
            }
        };
        let mut block = vec![0x88];
        hpack::encode_literal(&mut block, "content-type", "application/grpc");
        hpack::encode_literal(&mut block, "grpc-status", "14");
        // Huffman-coded, as Go's and other encoders send strings.
        hpack::encode_literal_huffman(&mut block, "grpc-message", "down%20for%20maintenance");
        let mut out = Vec::new();
        frame(&mut out, HEADERS, END_HEADERS | END_STREAM, STREAM, &block);
        s.write_all(&out).expect("write");
        pong
    });
    assert_eq!(
        grpc("127.0.0.1", port, None, Duration::from_secs(10)),
        Outcome::Failure(
            "error: health rpc probe failed: rpc error: code = Unavailable \
                 desc = down for maintenance"
                .to_string()
        )
    );
    assert_eq!(pong.recv().expect("pong"), (ACK, b"12345678".to_vec()));
}

#[test]
fn headers_split_over_continuation_and_padded_data_are_read() {
    let (port, _done) = fake(|s| {
        let mut headers = vec![0x88];
        hpack::encode_literal(&mut headers, "content-type", "application/grpc");
        let mut trailers = Vec::new();
        hpack::encode_literal(&mut trailers, "grpc-status", "0");
        let mut out = Vec::new();
        frame(&mut out, HEADERS, 0, STREAM, &headers[..3]);
        frame(&mut out, CONTINUATION, END_HEADERS, STREAM, &headers[3..]);
        // Padded DATA: pad length 2, a NOT_SERVING message, two bytes of padding.
        frame(
            &mut out,
            DATA,
            PADDED,
            STREAM,
            &[2, 0, 0, 0, 0, 2, 0x08, 0x02, 0, 0],
        );
        frame(
            &mut out,
            HEADERS,
            END_HEADERS | END_STREAM,
            STREAM,
            &trailers,
        );
        s.write_all(&out).expect("write");
    });
    assert_eq!(
        grpc("127.0.0.1", port, None, Duration::from_secs(10)),
        Outcome::Failure("service unhealthy (responded with \"NOT_SERVING\")".to_string())
    );
}

#[test]
fn oversized_frames_and_http1_answers_fail() {
    let (port, _done) = fake(|s| {
        let _ = s.write_all(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n");
    });
    let Outcome::Failure(message) = grpc("127.0.0.1", port, None, Duration::from_secs(10)) else {
        panic!("expected a failure");
    };
    assert!(message.contains("larger than 16384"), "{message}");
}

#[test]
fn a_silent_server_fails_by_the_timeout() {
    let (port, _done) = fake(|s| {
        // Silent until the client gives up and closes.
        let mut rest = Vec::new();
        let _ = s.read_to_end(&mut rest);
    });
    let timeout = Duration::from_millis(300);
    let start = Instant::now();
    assert_eq!(
        grpc("127.0.0.1", port, None, timeout),
        Outcome::Failure("timeout: health rpc did not complete within 300ms".to_string())
    );
    assert!(start.elapsed() < timeout + Duration::from_secs(2));
}

#[test]
fn the_request_carries_the_service_name() {
    let deadline = Instant::now() + Duration::from_secs(1);
    let with = request("h:1", HEALTH_CHECK, "ok", deadline).expect("request");
    assert!(with.ends_with(&[0, 0, 0, 0, 4, 0x0a, 2, b'o', b'k']));
    let without = request("h:1", HEALTH_CHECK, "", deadline).expect("request");
    assert!(without.ends_with(&[0, 0, 0, 0, 0]));
    assert!(request("h:1", HEALTH_CHECK, &"x".repeat(MAX_FRAME), deadline).is_err());
}

#[test]
fn health_responses_decode_as_protobuf_reads_them() {
    assert_eq!(health_status(&[0x08, 0x02]).ok(), Some(2));
    assert_eq!(health_status(&[]).ok(), Some(0));
    // An unknown length-delimited field first.
    assert_eq!(health_status(&[0x12, 0x01, b'x', 0x08, 0x01]).ok(), Some(1));
    assert!(health_status(&[0x08]).is_err());
    assert!(health_status(&[0x12, 0x05, b'x']).is_err());
    assert_eq!(status_name(7), "7");
}

#[test]
fn durations_and_messages_read_as_go_writes_them() {
    assert_eq!(go_duration(Duration::from_secs(1)), "1s");
    assert_eq!(go_duration(Duration::from_millis(1500)), "1.5s");
    assert_eq!(go_duration(Duration::from_millis(300)), "300ms");
    assert_eq!(go_duration(Duration::from_secs(90)), "1m30s");
    assert_eq!(go_duration(Duration::from_secs(3600)), "1h0m0s");
    assert_eq!(go_duration(Duration::ZERO), "0s");
    assert_eq!(percent_decode("a%20b%zz%"), "a b%zz%");
    assert_eq!(code_name(5), "NotFound");
    assert_eq!(code_name(99), "Code(99)");
}
