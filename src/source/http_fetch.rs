//! One fetch of the static pod URL: a GET with the configured headers, redirects
//! followed here (not by ureq) so that the headers, which often carry a bearer token, go
//! only to the URL's own origin and to no hop after one that left it; https verified
//! against the system's CA bundle and never redirected down to plain http; the whole
//! fetch bounded in time, and the body in size before it is read.

use std::io::Read;
use std::sync::Arc;
use std::time::{Duration, Instant};

use rustls::ClientConfig;
use ureq::http::Request;
use ureq::Agent;

use super::manifest::MAX_MANIFEST_BYTES;
use crate::redirect::{follow, host_of, origin};

/// The whole fetch, redirects included: the kubelet's client gives up after 10 s, so
/// that a server that hangs costs one period, not the source.
const FETCH_TIMEOUT: Duration = Duration::from_secs(10);
/// Redirects followed for one fetch.
const MAX_REDIRECTS: usize = 5;
/// Bytes ureq reads responses into (its default is 128 KiB): the headers must fit.
const INPUT_BUFFER: usize = 16 * 1024;
/// Bytes ureq writes requests out of: the headers with a token fit many times.
const OUTPUT_BUFFER: usize = 8 * 1024;

/// The client of one URL, keeping its connection between fetches.
pub(super) struct Fetcher {
    url: String,
    headers: Vec<(String, String)>,
    agent: Agent,
    timeout: Duration,
}

impl Fetcher {
    pub(super) fn new(url: String, headers: Vec<(String, String)>) -> Result<Fetcher, String> {
        let tls = ClientConfig::builder_with_provider(crate::tls::provider())
            .with_protocol_versions(rustls::ALL_VERSIONS)
            .map_err(|e| e.to_string())?
            .with_root_certificates(crate::tls::system_roots())
            .with_no_client_auth();
        let config = crate::proxy::agent_config()
            .input_buffer_size(INPUT_BUFFER)
            .output_buffer_size(OUTPUT_BUFFER)
            .build();
        // Through the node's proxy where its rules say so, as the kubelet's Go client
        // reads HTTP_PROXY, HTTPS_PROXY and NO_PROXY for the manifest URL.
        let tls = crate::tls::TlsConnector::new(Arc::new(tls), None);
        let agent = crate::proxy::agent(config, crate::proxy::Route::Rules, tls);
        Ok(Fetcher {
            url,
            headers,
            agent,
            timeout: FETCH_TIMEOUT,
        })
    }

    /// The body of a 200 answer, following redirects; Err says what went wrong,
    /// naming the URL (never a header's value).
    pub(super) fn fetch(&self) -> Result<Vec<u8>, String> {
        let deadline = Instant::now() + self.timeout;
        let home = origin(&self.url);
        let mut url = self.url.clone();
        let mut at_home = true;
        // A hop's failure names the hop; the URL itself the caller names.
        let at = |hop: &str| {
            if hop == self.url {
                String::new()
            } else {
                format!("redirected to {hop}: ")
            }
        };
        for _ in 0..=MAX_REDIRECTS {
            at_home = at_home && origin(&url) == home;
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(format!("{}no answer within {:?}", at(&url), self.timeout));
            }
            let request = self.request(&url, at_home)?;
            let request = self
                .agent
                .configure_request(request)
                .timeout_global(Some(left))
                .build();
            let response = self.agent.run(request).map_err(|e| {
                format!(
                    "{}{}",
                    at(&url),
                    crate::tls::describe_ureq(e, host_of(&url))
                )
            })?;
            let status = response.status();
            if matches!(status.as_u16(), 301 | 302 | 303 | 307 | 308) {
                let location = response
                    .headers()
                    .get("location")
                    .and_then(|v| v.to_str().ok())
                    .ok_or_else(|| format!("{}redirect {status} without a Location", at(&url)))?;
                let next = follow(&url, location).map_err(|e| format!("{}{e}", at(&url)))?;
                log::debug!(
                    "static pod URL {url}: redirected to host {}",
                    host_of(&next)
                );
                url = next;
                continue;
            }
            if status.as_u16() != 200 {
                return Err(format!("{}answered {status}", at(&url)));
            }
            return read_body(response.into_body()).map_err(|e| format!("{}{e}", at(&url)));
        }
        Err(format!("more than {MAX_REDIRECTS} redirects"))
    }

    /// A GET of `url`, with the configured headers only `at_home`.
    fn request(&self, url: &str, at_home: bool) -> Result<Request<()>, String> {
        let mut builder = Request::builder().method("GET").uri(url);
        if at_home {
            for (name, value) in &self.headers {
                builder = builder.header(name, value);
            }
        }
        builder
            .body(())
            .map_err(|e| format!("invalid request to {url}: {e}"))
    }
}

/// The body, refused unread when its announced length is past the bound, and read no
/// further than one byte past it otherwise.
fn read_body(body: ureq::Body) -> Result<Vec<u8>, String> {
    let too_large = |len: u64| {
        format!(
            "the answer is {len} bytes or more, larger than the {MAX_MANIFEST_BYTES} bytes allowed"
        )
    };
    if let Some(len) = body.content_length() {
        if len > MAX_MANIFEST_BYTES {
            return Err(too_large(len));
        }
    }
    let mut bytes = Vec::new();
    body.into_reader()
        .take(MAX_MANIFEST_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| format!("read the answer: {e}"))?;
    if bytes.len() as u64 > MAX_MANIFEST_BYTES {
        return Err(too_large(bytes.len() as u64));
    }
    Ok(bytes)
}

#[cfg(test)]
mod tests {
    use std::io::{BufRead, BufReader, Write};
    use std::net::TcpListener;
    use std::sync::mpsc;

    use super::*;

    /// A server on 127.0.0.1 answering each of `answers` on a connection of its own,
    /// handing back each request's head (lower-cased); `None` answers nothing and holds
    /// the connection open.
    fn serve(answers: Vec<Option<String>>) -> (String, mpsc::Receiver<String>) {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
        let base = format!("http://{}", listener.local_addr().expect("addr"));
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            for answer in answers {
                let Ok((conn, _)) = listener.accept() else {
                    return;
                };
                let mut reader = BufReader::new(conn.try_clone().expect("clone"));
                let mut head = String::new();
                let mut line = String::new();
                while reader.read_line(&mut line).is_ok_and(|n| n > 2) {
                    head.push_str(&line.to_ascii_lowercase());
                    line.clear();
                }
                let _ = tx.send(head);
                let mut conn = conn;
                match answer {
                    Some(a) => {
                        let _ = conn.write_all(a.as_bytes());
                    }
                    None => std::thread::sleep(Duration::from_secs(5)),
                }
            }
        });
        (base, rx)
    }

    fn ok(body: &str) -> Option<String> {
        Some(format!(
            "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        ))
    }

    fn fetcher(url: String) -> Fetcher {
        let headers = vec![("Authorization".to_string(), "Bearer s3cret".to_string())];
        Fetcher::new(url, headers).expect("fetcher")
    }

    #[test]
    fn the_headers_go_home_and_not_where_a_redirect_leads() {
        let (other, other_heads) = serve(vec![ok("pods")]);
        let moved = format!(
            "HTTP/1.1 302 Found\r\nLocation: {other}/elsewhere\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
        );
        let (home, home_heads) = serve(vec![Some(moved)]);
        let body = fetcher(format!("{home}/pods")).fetch().expect("fetch");
        assert_eq!(body, b"pods");
        let head = home_heads.recv().expect("home request");
        assert!(head.contains("authorization: bearer s3cret"), "{head}");
        let head = other_heads.recv().expect("redirected request");
        assert!(head.starts_with("get /elsewhere "), "{head}");
        assert!(!head.contains("authorization"), "{head}");
    }

    #[test]
    fn a_server_that_hangs_costs_the_timeout_only() {
        let (home, _heads) = serve(vec![None]);
        let mut f = fetcher(format!("{home}/pods"));
        f.timeout = Duration::from_millis(300);
        let started = Instant::now();
        let err = f.fetch().expect_err("timed out");
        assert!(started.elapsed() < Duration::from_secs(3), "{err}");
        assert!(err.contains("timed out"), "{err}");
    }

    #[test]
    fn a_body_too_large_is_refused_before_it_is_read() {
        // Announced: refused at once, though not one byte of it comes.
        let announced = format!(
            "HTTP/1.1 200 OK\r\nContent-Length: {}\r\n\r\n",
            MAX_MANIFEST_BYTES + 1
        );
        // Not announced: read up to one byte past the bound.
        let chunk = "#".repeat(64 * 1024);
        let mut chunked = "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n".to_string();
        for _ in 0..17 {
            chunked.push_str(&format!("{:x}\r\n{chunk}\r\n", chunk.len()));
        }
        chunked.push_str("0\r\n\r\n");
        let (home, _heads) = serve(vec![Some(announced), Some(chunked)]);
        let f = fetcher(format!("{home}/pods"));
        for _ in 0..2 {
            let err = f.fetch().expect_err("too large");
            assert!(
                err.contains("larger than the 1048576 bytes allowed"),
                "{err}"
            );
        }
    }

    #[test]
    fn an_answer_other_than_200_is_an_error() {
        let (home, _heads) = serve(vec![Some(
            "HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\n\r\n".into(),
        )]);
        let err = fetcher(format!("{home}/pods")).fetch().expect_err("503");
        assert_eq!(err, "answered 503 Service Unavailable");
    }
}
