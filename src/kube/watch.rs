//! One watch's event stream: the chunked body read line by line (the apiserver flushes
//! one JSON event per line), each line bounded so a hostile server cannot grow it.

use std::io::{BufRead, BufReader, Read};
use std::marker::PhantomData;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::WatchEvent;
use serde::de::DeserializeOwned;

use super::error::ApiError;
use super::tls::describe_transport;

/// The largest response body read, and the longest watch event: a hostile or broken
/// server must not exhaust a gateway's memory. The largest real objects (a node with
/// many images, a long pod list) stay far below it.
pub const MAX_BODY: usize = 16 << 20;

/// The events of one watch, one JSON object per line, until the server ends the stream
/// (`None`) or the connection breaks (`Some(Err(..))`, then `None`).
pub struct Watch<T> {
    reader: BufReader<Box<dyn Read + Send>>,
    path: String,
    server: String,
    line: Vec<u8>,
    done: bool,
    _event: PhantomData<fn() -> T>,
}

impl<T> Watch<T> {
    pub(super) fn new(body: Box<dyn Read + Send>, path: &str, server: &str) -> Watch<T> {
        Watch {
            reader: BufReader::new(body),
            path: path.to_string(),
            server: server.to_string(),
            line: Vec::new(),
            done: false,
            _event: PhantomData,
        }
    }

    fn fail(&mut self, error: ApiError) -> Option<Result<WatchEvent<T>, ApiError>> {
        self.done = true;
        Some(Err(error))
    }
}

impl<T: DeserializeOwned> Iterator for Watch<T> {
    type Item = Result<WatchEvent<T>, ApiError>;

    fn next(&mut self) -> Option<Self::Item> {
        while !self.done {
            self.line.clear();
            let limit = MAX_BODY as u64 + 1;
            let read = (&mut self.reader)
                .take(limit)
                .read_until(b'\n', &mut self.line);
            match read {
                Ok(0) => self.done = true,
                Ok(_) if self.line.len() > MAX_BODY => {
                    let error = ApiError::Decode {
                        method: "GET",
                        path: self.path.clone(),
                        message: format!("watch event longer than {MAX_BODY} bytes"),
                    };
                    return self.fail(error);
                }
                Ok(_) => {
                    let text = self.line.trim_ascii();
                    if text.is_empty() {
                        continue;
                    }
                    return match serde_json::from_slice(text) {
                        Ok(event) => Some(Ok(event)),
                        Err(e) => {
                            let shown = String::from_utf8_lossy(&text[..text.len().min(200)]);
                            let error = ApiError::Decode {
                                method: "GET",
                                path: self.path.clone(),
                                message: format!("watch event {shown:?}: {e}"),
                            };
                            self.fail(error)
                        }
                    };
                }
                Err(e) => {
                    let error = ApiError::Transport {
                        method: "GET",
                        path: self.path.clone(),
                        message: describe_transport(&self.server, ureq::Error::from(e)),
                    };
                    return self.fail(error);
                }
            }
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use std::io::{self, Cursor};

    use k8s_openapi::api::core::v1::Pod;

    use super::*;

    fn watch(body: impl Read + Send + 'static) -> Watch<Pod> {
        Watch::new(
            Box::new(body),
            "/api/v1/pods?watch=true",
            "https://10.0.0.1:6443",
        )
    }

    const ADDED: &str = r#"{"type":"ADDED","object":{"kind":"Pod","apiVersion":"v1","metadata":{"name":"a","resourceVersion":"5"}}}"#;
    const BOOKMARK: &str = r#"{"type":"BOOKMARK","object":{"kind":"Pod","apiVersion":"v1","metadata":{"resourceVersion":"9"},"spec":{"containers":null},"status":{}}}"#;
    const EXPIRED: &str = r#"{"type":"ERROR","object":{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":"too old resource version: 1 (326)","reason":"Expired","code":410}}"#;

    #[test]
    fn yields_one_event_per_line_then_ends() {
        let body = format!("{ADDED}\n\r\n{BOOKMARK}\n{EXPIRED}");
        let events: Vec<_> = watch(Cursor::new(body)).collect();
        assert_eq!(events.len(), 3);
        match &events[0] {
            Ok(WatchEvent::Added(pod)) => assert_eq!(pod.metadata.name.as_deref(), Some("a")),
            other => panic!("expected ADDED, got {other:?}"),
        }
        match &events[1] {
            Ok(WatchEvent::Bookmark {
                resource_version, ..
            }) => assert_eq!(resource_version, "9"),
            other => panic!("expected BOOKMARK, got {other:?}"),
        }
        match &events[2] {
            Ok(WatchEvent::ErrorStatus(status)) => assert_eq!(status.code, Some(410)),
            other => panic!("expected ERROR, got {other:?}"),
        }
    }

    #[test]
    fn a_line_that_is_not_an_event_ends_the_watch_with_a_decode_error() {
        let body = format!("{ADDED}\nnot json\n{ADDED}\n");
        let mut w = watch(Cursor::new(body));
        assert!(matches!(w.next(), Some(Ok(WatchEvent::Added(_)))));
        match w.next() {
            Some(Err(ApiError::Decode { message, .. })) => {
                assert!(message.contains("not json"), "{message}")
            }
            other => panic!("expected a decode error, got {other:?}"),
        }
        assert!(w.next().is_none());
    }

    #[test]
    fn an_overlong_event_is_refused_without_holding_more_than_the_bound() {
        let body = io::repeat(b'a').take(MAX_BODY as u64 * 2);
        let mut w = watch(body);
        match w.next() {
            Some(Err(ApiError::Decode { message, .. })) => {
                assert!(message.contains("longer than"), "{message}")
            }
            other => panic!("expected a decode error, got {other:?}"),
        }
        assert!(w.line.capacity() <= 2 * (MAX_BODY + 1), "buffer bounded");
        assert!(w.next().is_none());
    }

    struct Broken(Option<String>);

    impl Read for Broken {
        fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
            match self.0.take() {
                Some(s) => {
                    buf[..s.len()].copy_from_slice(s.as_bytes());
                    Ok(s.len())
                }
                None => Err(io::Error::new(io::ErrorKind::ConnectionReset, "peer reset")),
            }
        }
    }

    #[test]
    fn a_broken_connection_is_a_transport_error_then_the_end() {
        let mut w = watch(Broken(Some(format!("{ADDED}\n"))));
        assert!(matches!(w.next(), Some(Ok(WatchEvent::Added(_)))));
        match w.next() {
            Some(Err(e @ ApiError::Transport { .. })) => {
                assert!(e.is_transient());
                assert!(e.to_string().contains("peer reset"), "{e}");
            }
            other => panic!("expected a transport error, got {other:?}"),
        }
        assert!(w.next().is_none());
    }
}
