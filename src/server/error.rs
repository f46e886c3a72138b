//! The kubelet API's error: what can keep its listeners from starting.

use std::net::SocketAddr;
use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    #[error("listen on {addr}: {source}")]
    Listen {
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
    #[error("serving certificate {path}: {reason}")]
    Certificate { path: PathBuf, reason: String },
    #[error("client CA file {path}: {reason}")]
    ClientCa { path: PathBuf, reason: String },
    #[error("{context}: {source}")]
    Io {
        context: String,
        #[source]
        source: std::io::Error,
    },
    #[error("tls: {0}")]
    Tls(String),
}

impl ServerError {
    /// A port in use may free up (an old agent still stopping); a bad certificate will
    /// not fix itself.
    pub fn is_retryable(&self) -> bool {
        matches!(self, ServerError::Listen { .. })
    }
}
