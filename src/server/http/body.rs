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
    Stream(mpsc::Receiver<Bytes>),
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
            Body::Stream(rx) => rx.poll_recv(cx).map(|o| o.map(|b| Ok(Frame::data(b)))),
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
