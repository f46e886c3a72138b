//! Responses: the body (whole, or streamed from a bounded channel) and the kubelet's
//! plain-text errors.

use std::convert::Infallible;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body::Frame;
use hyper::{Response, StatusCode};
use tokio::sync::mpsc;

/// A response body: whole, or chunks from a producer (a log reader) through a bounded
/// channel, so that a client that reads slowly holds the producer back instead of
/// growing a buffer.
pub enum Body {
    Full(Option<Bytes>),
    Stream(Chunks),
}

/// The chunks of a streamed body, and whether its end has been held back once.
///
/// The end of a chunked body goes out after what came before it has been written
/// (a TLS record of its own): a Go client that finds the last chunk and the end in
/// one read returns the data together with `io.EOF`, and the kube-apiserver's
/// WebSocket copier (`wsstream`, behind `GET .../log` over a WebSocket) drops data
/// that comes with `io.EOF`, so the log would arrive empty.
pub struct Chunks {
    rx: mpsc::Receiver<Bytes>,
    end_held: bool,
}

impl Body {
    pub fn stream(rx: mpsc::Receiver<Bytes>) -> Body {
        Body::Stream(Chunks {
            rx,
            end_held: false,
        })
    }
}

impl http_body::Body for Body {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        match self.get_mut() {
            Body::Full(b) => Poll::Ready(b.take().map(|b| Ok(Frame::data(b)))),
            Body::Stream(c) => match c.rx.poll_recv(cx) {
                Poll::Ready(Some(b)) => Poll::Ready(Some(Ok(Frame::data(b)))),
                // Pending once, woken at once: the connection writes out and flushes
                // what it holds before it asks again and writes the end.
                Poll::Ready(None) if !c.end_held => {
                    c.end_held = true;
                    cx.waker().wake_by_ref();
                    Poll::Pending
                }
                Poll::Ready(None) => Poll::Ready(None),
                Poll::Pending => Poll::Pending,
            },
        }
    }

    fn is_end_stream(&self) -> bool {
        matches!(self, Body::Full(None))
    }

    fn size_hint(&self) -> http_body::SizeHint {
        match self {
            Body::Full(Some(b)) => http_body::SizeHint::with_exact(b.len() as u64),
            Body::Full(None) => http_body::SizeHint::with_exact(0),
            Body::Stream(_) => http_body::SizeHint::default(),
        }
    }
}

pub type Resp = Response<Body>;

/// A whole response.
pub fn respond(status: StatusCode, content_type: &str, body: impl Into<Bytes>) -> Resp {
    let mut r = Response::new(Body::Full(Some(body.into())));
    *r.status_mut() = status;
    if let Ok(v) = hyper::header::HeaderValue::from_str(content_type) {
        r.headers_mut().insert(hyper::header::CONTENT_TYPE, v);
    }
    r
}

pub fn json(value: &impl serde::Serialize) -> Resp {
    match serde_json::to_vec(value) {
        Ok(b) => respond(StatusCode::OK, "application/json", b),
        Err(e) => error(StatusCode::INTERNAL_SERVER_ERROR, &format!("encode: {e}")),
    }
}

/// An error as the kubelet writes it (go-restful's `WriteError`): the message as
/// plain text.
pub fn error(status: StatusCode, message: &str) -> Resp {
    respond(status, "text/plain; charset=utf-8", format!("{message}\n"))
}
