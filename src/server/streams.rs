//! What the stream protocols ([`super::spdy`], [`super::websocket`]) and the routes
//! that use them share: which streams a client asked for, what goes each way between
//! a protocol session and the command or connection behind it, and the upgraded
//! connection a session runs on. Knows no route and no protocol.

use std::future::Future;
use std::pin::Pin;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Status;
use tokio::sync::{mpsc, oneshot};

/// Starts what the streams join (a command, or a container's stdio) once the protocol
/// session has its streams open, and gives the session its ends.
pub type Launch = Box<dyn FnOnce(Opts) -> Pin<Box<dyn Future<Output = Ends> + Send>> + Send>;

/// The upgraded connection a protocol session runs on.
pub type Upgraded = hyper_util::rt::TokioIo<hyper::upgrade::Upgraded>;

/// Which of the command's streams the client wants.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Opts {
    pub stdin: bool,
    pub stdout: bool,
    pub stderr: bool,
    pub tty: bool,
}

/// From the client to the command.
#[derive(Debug)]
pub enum In {
    Stdin(Vec<u8>),
    StdinEof,
    Resize(u16, u16),
}

/// From the command to the client.
#[derive(Debug)]
pub enum Out {
    Stdout(Vec<u8>),
    Stderr(Vec<u8>),
}

/// The two ends the protocol side holds.
pub struct Ends {
    pub input: mpsc::Sender<In>,
    pub output: mpsc::Receiver<Out>,
    pub status: oneshot::Receiver<Status>,
}

/// A terminal size as clients send it on the resize stream.
#[derive(Debug, serde::Deserialize)]
pub struct Size {
    #[serde(rename = "Width")]
    pub width: u16,
    #[serde(rename = "Height")]
    pub height: u16,
}

/// Every whole JSON size at the front of `buf` (removed from it).
pub fn sizes(buf: &mut Vec<u8>) -> Vec<Size> {
    let mut out = Vec::new();
    let mut used = 0;
    {
        let mut it = serde_json::Deserializer::from_slice(buf).into_iter::<Size>();
        while let Some(Ok(s)) = it.next() {
            out.push(s);
            used = it.byte_offset();
        }
    }
    buf.drain(..used);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resize_messages_split_anywhere() {
        let mut buf = br#"{"Width":80,"Height":24}{"Width":100,"#.to_vec();
        let s = sizes(&mut buf);
        assert_eq!(s.len(), 1);
        assert_eq!((s[0].width, s[0].height), (80, 24));
        buf.extend_from_slice(br#""Height":30}"#);
        let s = sizes(&mut buf);
        assert_eq!((s[0].width, s[0].height), (100, 30));
        assert!(buf.is_empty());
    }
}
