//! What can go wrong talking to the apiserver, sorted the way callers decide what to do.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Status;

/// An apiserver request that did not succeed.
#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    /// The server answered with an error `Status` (403, 404, 409, 410, 422, ...).
    #[error("{method} {path}: {code} {reason}: {message}")]
    Status {
        method: &'static str,
        path: String,
        code: u16,
        /// The `Status.reason` (`NotFound`, `AlreadyExists`, `Conflict`, `Expired`, ...).
        reason: String,
        message: String,
    },
    /// No answer: connection refused, DNS, timeout, TLS handshake (a CA mismatch lands
    /// here with rustls's words for it).
    #[error("{method} {path}: {message}")]
    Transport {
        method: &'static str,
        path: String,
        message: String,
    },
    /// An answer that is not what the API promises.
    #[error("{method} {path}: bad response: {message}")]
    Decode {
        method: &'static str,
        path: String,
        message: String,
    },
}

impl ApiError {
    /// Builds the `Status` variant from an error body, falling back to the HTTP status.
    pub fn from_status(method: &'static str, path: &str, http: u16, body: &[u8]) -> ApiError {
        let parsed: Option<Status> = serde_json::from_slice(body).ok();
        let (code, reason, message) = match parsed {
            Some(s) => (
                s.code.map(|c| c as u16).unwrap_or(http),
                s.reason.unwrap_or_default(),
                s.message.unwrap_or_default(),
            ),
            None => (
                http,
                String::new(),
                String::from_utf8_lossy(&body[..body.len().min(256)])
                    .trim()
                    .to_string(),
            ),
        };
        ApiError::Status {
            method,
            path: path.to_string(),
            code,
            reason,
            message,
        }
    }

    /// The HTTP status code of a `Status` error.
    pub fn code(&self) -> Option<u16> {
        match self {
            ApiError::Status { code, .. } => Some(*code),
            _ => None,
        }
    }

    pub fn is_not_found(&self) -> bool {
        self.code() == Some(404)
    }

    pub fn is_already_exists(&self) -> bool {
        matches!(self, ApiError::Status { code: 409, reason, .. } if reason == "AlreadyExists")
    }

    /// 409 Conflict: a stale resourceVersion or a failed precondition.
    pub fn is_conflict(&self) -> bool {
        matches!(self, ApiError::Status { code: 409, reason, .. } if reason != "AlreadyExists")
    }

    /// 410 Gone / Expired: relist.
    pub fn is_gone(&self) -> bool {
        self.code() == Some(410)
    }

    pub fn is_forbidden(&self) -> bool {
        self.code() == Some(403)
    }

    pub fn is_unauthorized(&self) -> bool {
        self.code() == Some(401)
    }

    /// Whether trying again later can help (transport trouble, 429, 5xx). 4xx answers
    /// other than 429 need something to change first.
    pub fn is_transient(&self) -> bool {
        match self {
            ApiError::Transport { .. } => true,
            ApiError::Status { code, .. } => *code == 429 || *code >= 500,
            ApiError::Decode { .. } => false,
        }
    }
}
