//! Tests of the httpGet prober, against servers on 127.0.0.1.

use super::*;
use std::net::TcpListener;
use std::sync::mpsc;
use std::thread;

/// A response for a request head, given the server's port.
type Handler = Box<dyn Fn(&str, u16) -> Vec<u8> + Send>;

/// Answers `connections` connections on 127.0.0.1 with `handler`; each request head
/// goes to the returned channel.
fn serve(connections: usize, handler: Handler) -> (u16, mpsc::Receiver<String>) {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = listener.local_addr().expect("addr").port();
    let (tx, rx) = mpsc::channel();
    thread::spawn(move || {
        for _ in 0..connections {
            let Ok((mut stream, _)) = listener.accept() else {
                return;
            };
            let head = read_request(&mut stream);
            let response = handler(&head, port);
            let _ = tx.send(head);
            let _ = stream.write_all(&response);
        }
    });
    (port, rx)
}

fn read_request(stream: &mut impl Read) -> String {
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        match stream.read(&mut byte) {
            Ok(1) => head.push(byte[0]),
            _ => break,
        }
    }
    String::from_utf8_lossy(&head).into_owned()
}

fn get(port: u16, path: &str) -> HttpGet {
    HttpGet {
        https: false,
        host: "127.0.0.1".to_string(),
        port,
        path: path.to_string(),
        headers: Vec::new(),
    }
}

fn fixed(response: &'static str) -> Handler {
    Box::new(move |_, _| response.as_bytes().to_vec())
}

const SECOND: Duration = Duration::from_secs(5);

#[test]
fn status_200_passes_with_the_kubelet_headers() {
    let (port, seen) = serve(1, fixed("HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"));
    assert_eq!(http_get(&get(port, "/healthz"), SECOND), Outcome::Success);
    let head = seen.recv().expect("request");
    assert!(head.starts_with("GET /healthz HTTP/1.1\r\n"), "{head}");
    assert!(
        head.contains(&format!("\r\nHost: 127.0.0.1:{port}\r\n")),
        "{head}"
    );
    assert!(
        head.contains("\r\nUser-Agent: kube-probe/1.34\r\n"),
        "{head}"
    );
    assert!(head.contains("\r\nAccept: */*\r\n"), "{head}");
    assert!(head.contains("\r\nConnection: close\r\n"), "{head}");
}

#[test]
fn status_500_fails_with_the_status_code() {
    let (port, _seen) = serve(
        1,
        fixed("HTTP/1.1 500 Internal Server Error\r\nContent-Length: 4\r\n\r\nboom"),
    );
    assert_eq!(
        http_get(&get(port, "/"), SECOND),
        Outcome::Failure("HTTP probe failed with statuscode: 500".to_string())
    );
}

#[test]
fn a_redirect_to_the_same_host_is_followed() {
    let (port, seen) = serve(
        3,
        Box::new(|head, port| {
            let response = if head.starts_with("GET /start ") {
                "HTTP/1.1 302 Found\r\nLocation: next?x=1\r\nContent-Length: 0\r\n\r\n".to_string()
            } else if head.starts_with("GET /next?x=1 ") {
                format!("HTTP/1.1 301 Moved\r\nLocation: http://127.0.0.1:{port}/done\r\n\r\n")
            } else if head.starts_with("GET /done ") {
                "HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n".to_string()
            } else {
                "HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n".to_string()
            };
            response.into_bytes()
        }),
    );
    assert_eq!(http_get(&get(port, "/start"), SECOND), Outcome::Success);
    let paths: Vec<String> = seen
        .try_iter()
        .map(|h| h.lines().next().unwrap_or_default().to_string())
        .collect();
    assert_eq!(
        paths,
        [
            "GET /start HTTP/1.1",
            "GET /next?x=1 HTTP/1.1",
            "GET /done HTTP/1.1"
        ]
    );
}

#[test]
fn a_redirect_to_another_host_passes_with_a_warning() {
    let (port, seen) = serve(
        1,
        fixed("HTTP/1.1 302 Found\r\nLocation: http://elsewhere.invalid/x\r\nContent-Length: 5\r\n\r\nmoved"),
    );
    assert_eq!(
        http_get(&get(port, "/"), SECOND),
        Outcome::Warning("Probe terminated redirects, Response body: moved".to_string())
    );
    assert_eq!(seen.try_iter().count(), 1);
}

#[test]
fn endless_redirects_stop_after_ten_requests() {
    let (port, seen) = serve(
        MAX_REQUESTS,
        fixed("HTTP/1.1 307 Temporary Redirect\r\nLocation: /loop\r\nContent-Length: 0\r\n\r\n"),
    );
    assert_eq!(
        http_get(&get(port, "/loop"), SECOND),
        Outcome::Failure(format!(
            "Get \"http://127.0.0.1:{port}/loop\": stopped after 10 redirects"
        ))
    );
    assert_eq!(seen.try_iter().count(), MAX_REQUESTS);
}

#[test]
fn spec_headers_and_host_reach_the_server() {
    let (port, seen) = serve(
        2,
        Box::new(|head, _| {
            if head.starts_with("GET /first ") {
                b"HTTP/1.1 302 Found\r\nLocation: /ok\r\nContent-Length: 0\r\n\r\n".to_vec()
            } else {
                b"HTTP/1.1 204 No Content\r\n\r\n".to_vec()
            }
        }),
    );
    let mut req = get(port, "/first");
    req.headers = vec![
        ("Host".to_string(), "probe.example".to_string()),
        ("x-custom".to_string(), "1".to_string()),
        ("User-Agent".to_string(), "mine/1".to_string()),
        ("Accept".to_string(), String::new()),
    ];
    assert_eq!(http_get(&req, SECOND), Outcome::Success);
    let heads: Vec<String> = seen.try_iter().collect();
    // The Host set in the spec stays through a redirect that names no host.
    assert_eq!(heads.len(), 2);
    for head in heads {
        assert!(head.contains("\r\nHost: probe.example\r\n"), "{head}");
        assert!(head.contains("\r\nX-Custom: 1\r\n"), "{head}");
        assert!(head.contains("\r\nUser-Agent: mine/1\r\n"), "{head}");
        assert!(!head.contains("kube-probe"), "{head}");
        assert!(!head.contains("Accept:"), "{head}");
        assert_eq!(head.matches("Host:").count(), 1, "{head}");
    }
}

#[test]
fn a_header_that_would_split_the_request_fails() {
    let mut req = get(1, "/");
    req.headers = vec![("X-Evil".to_string(), "a\r\nInjected: 1".to_string())];
    assert_eq!(
        http_get(&req, SECOND),
        Outcome::Failure(
            "Get \"http://127.0.0.1:1/\": net/http: invalid header field value for \"X-Evil\""
                .to_string()
        )
    );
}

#[test]
fn bodies_are_read_chunked_by_length_or_to_the_close() {
    let chunked = "HTTP/1.1 302 Found\r\nLocation: http://other.invalid/\r\n\
                   Transfer-Encoding: chunked\r\n\r\n2;ext=1\r\nhe\r\n3\r\nllo\r\n0\r\n\r\n";
    let (port, _seen) = serve(1, fixed(chunked));
    assert_eq!(
        http_get(&get(port, "/"), SECOND),
        Outcome::Warning("Probe terminated redirects, Response body: hello".to_string())
    );
    let (port, _seen) = serve(
        1,
        fixed("HTTP/1.0 302 Found\r\nLocation: //other.invalid/\r\n\r\nuntil close"),
    );
    assert_eq!(
        http_get(&get(port, "/"), SECOND),
        Outcome::Warning("Probe terminated redirects, Response body: until close".to_string())
    );
    // A large body: 10 KiB read, the rest never.
    let (port, _seen) = serve(
        1,
        Box::new(|_, _| {
            let mut r = b"HTTP/1.1 303 See Other\r\nLocation: http://other.invalid/\r\n\
                          Content-Length: 1000000\r\n\r\n"
                .to_vec();
            r.extend(std::iter::repeat_n(b'a', 20 * 1024));
            r
        }),
    );
    let Outcome::Warning(message) = http_get(&get(port, "/"), SECOND) else {
        panic!("expected a warning");
    };
    assert_eq!(
        message.len(),
        "Probe terminated redirects, Response body: ".len() + MAX_BODY
    );
}

#[test]
fn a_short_chunked_body_fails() {
    let (port, _seen) = serve(
        1,
        fixed("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n10\r\nshort"),
    );
    assert_eq!(
        http_get(&get(port, "/"), SECOND),
        Outcome::Failure("unexpected EOF".to_string())
    );
}

#[test]
fn a_server_that_never_answers_fails_by_the_timeout() {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = listener.local_addr().expect("addr").port();
    let (done_tx, done_rx) = mpsc::channel::<()>();
    let server = thread::spawn(move || {
        let accepted = listener.accept();
        // Holds the connection open, silent, until the probe has given up.
        let _ = done_rx.recv();
        drop(accepted);
    });
    let timeout = Duration::from_millis(300);
    let start = Instant::now();
    let outcome = http_get(&get(port, "/"), timeout);
    let took = start.elapsed();
    drop(done_tx);
    let _ = server.join();
    assert_eq!(
        outcome,
        Outcome::Failure(format!(
            "Get \"http://127.0.0.1:{port}/\": context deadline exceeded \
             (Client.Timeout exceeded while awaiting headers)"
        ))
    );
    assert!(
        took >= timeout && took < timeout + Duration::from_secs(2),
        "{took:?}"
    );
}

#[test]
fn a_closed_port_fails_with_the_dial_error() {
    let port = TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("addr")
        .port();
    assert_eq!(
        http_get(&get(port, "/x"), SECOND),
        Outcome::Failure(format!(
            "Get \"http://127.0.0.1:{port}/x\": dial tcp 127.0.0.1:{port}: connect: connection refused"
        ))
    );
}

/// Serves one HTTPS request with a self-signed certificate for `localhost`; sends
/// back the SNI the client gave.
fn serve_tls() -> (u16, mpsc::Receiver<Option<String>>) {
    let cert =
        rcgen::generate_simple_self_signed(vec!["localhost".to_string()]).expect("certificate");
    let chain = vec![cert.cert.der().clone()];
    let key = rustls::pki_types::PrivateKeyDer::Pkcs8(cert.signing_key.serialize_der().into());
    let config = rustls::ServerConfig::builder_with_provider(crate::tls::provider())
        .with_safe_default_protocol_versions()
        .expect("versions")
        .with_no_client_auth()
        .with_single_cert(chain, key)
        .expect("server config");
    let config = Arc::new(config);
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = listener.local_addr().expect("addr").port();
    let (tx, rx) = mpsc::channel();
    thread::spawn(move || {
        let Ok((tcp, _)) = listener.accept() else {
            return;
        };
        let conn = rustls::ServerConnection::new(config).expect("server connection");
        let mut tls = StreamOwned::new(conn, tcp);
        let head = read_request(&mut tls);
        let _ = tx.send(tls.conn.server_name().map(str::to_string));
        if head.starts_with("GET /secure ") {
            let _ = tls.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok");
        }
        tls.conn.send_close_notify();
        let _ = tls.flush();
    });
    (port, rx)
}

#[test]
fn https_passes_with_a_certificate_nobody_issued() {
    let (port, sni) = serve_tls();
    let mut req = get(port, "/secure");
    req.https = true;
    assert_eq!(http_get(&req, SECOND), Outcome::Success);
    assert_eq!(sni.recv().expect("sni"), None, "no SNI for an IP literal");

    let (port, sni) = serve_tls();
    let mut req = get(port, "/secure");
    req.https = true;
    req.host = "localhost".to_string();
    assert_eq!(http_get(&req, SECOND), Outcome::Success);
    assert_eq!(sni.recv().expect("sni").as_deref(), Some("localhost"));
}

#[test]
fn header_names_are_sent_in_go_canonical_form() {
    assert_eq!(canonical_name("x-custom-header"), "X-Custom-Header");
    assert_eq!(canonical_name("HOST"), "Host");
    assert!(!is_token("bad name"));
    assert!(is_token("X-Ok_1"));
}
