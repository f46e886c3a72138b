//! registry: pulling images from OCI distribution registries over the one HTTP stack
//! (ureq over the shared rustls connector). Anonymous, Basic and Bearer-token auth;
//! OCI and Docker schema 2 manifests and indexes with platform selection; blobs streamed
//! to the content store's temp area, resumed with `Range` after a cut, and verified by
//! sha256 and size before they are renamed into place; ordered mirrors before the
//! upstream. Blocking: runs on threads of its own, never on the async runtime.
//!
//! Owns no files but the partial downloads under `content/tmp/`; records finished
//! images through [`ImageStore`](super::ImageStore). Never logs a credential or token.

mod auth;
mod blob;
mod hosts;
mod http;
pub mod keyring;
mod manifest;
mod pull;
pub mod puller;
mod reachability;
mod redirect;

pub use hosts::{Capability, EndpointConfig, RegistryConfig, RegistryHosts};
pub use keyring::{Credential, Keyring};
pub use pull::{pull, PullOptions, PullResult, Registry};
pub use puller::{Job, PullDone, PullFailure, PullRequest, Puller};

use super::ImageError;

/// What a pull reports as it goes, for a progress display.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(tag = "kind", rename_all = "camelCase")]
pub enum Progress {
    /// The manifest is known: the layers to fetch, `(digest, size)`, base first.
    Resolved {
        reference: String,
        manifest: String,
        layers: Vec<(String, u64)>,
    },
    /// Bytes of a layer on disk so far (resumed bytes included).
    Layer {
        digest: String,
        done: u64,
        total: u64,
    },
    /// A layer is in the store, fetched now or `cached` from before.
    LayerDone { digest: String, cached: bool },
}

/// Where progress goes; called from the pull's threads.
pub type ProgressFn = dyn Fn(Progress) + Send + Sync;

#[derive(Debug, thiserror::Error)]
pub enum RegistryError {
    /// The registry could not be reached: refused, reset, timed out, TLS failed.
    #[error("{url}: {message}")]
    Transport {
        url: String,
        message: String,
        /// No connection was made (refused, no route, no such name, the connection or
        /// its TLS handshake failed or timed out): the host is out of reach, not one
        /// request. Otherwise the host was reached and this request failed.
        connect: bool,
    },
    /// The registry answered with an error.
    #[error("{method} {url}: {status}{}", describe_codes(.codes))]
    Status {
        method: &'static str,
        url: String,
        status: u16,
        /// The distribution API's error codes and messages (`MANIFEST_UNKNOWN: ...`).
        codes: Vec<String>,
    },
    /// Credentials were missing or refused.
    #[error("{registry}: {message}")]
    Unauthorized { registry: String, message: String },
    /// The token service did not give a token.
    #[error("token from {realm}: {message}")]
    Token { realm: String, message: String },
    #[error("{what}: unsupported media type {media_type:?}")]
    MediaType { what: String, media_type: String },
    #[error(
        "{reference}: image manifest schema 1 is not supported (deprecated since 2017); \
         push the image again with a current client"
    )]
    Schema1 { reference: String },
    #[error("{what}: {reason}")]
    Invalid { what: String, reason: String },
    #[error("mirror configuration: {reason}")]
    Config { reason: String },
    /// Every endpoint failed; each one's error, in the order tried.
    #[error("{}", errors.join("; "))]
    AllEndpoints {
        errors: Vec<String>,
        /// None of them was reached or answered but with a 5xx.
        unreachable: bool,
        /// No connection to any of them: their hosts and why, as [`Self::host_unreachable`].
        hosts_down: Option<String>,
    },
    #[error(transparent)]
    Image(#[from] ImageError),
}

fn describe_codes(codes: &[String]) -> String {
    if codes.is_empty() {
        String::new()
    } else {
        format!(" ({})", codes.join(", "))
    }
}

impl RegistryError {
    /// Worth trying again (the same endpoint, after a pause): the network or the
    /// registry's own trouble, never a refusal or bad content.
    pub fn is_retryable(&self) -> bool {
        match self {
            RegistryError::Transport { .. } => true,
            RegistryError::Status { status, .. } => *status == 429 || *status >= 500,
            RegistryError::Image(ImageError::Io { .. }) => false,
            _ => false,
        }
    }

    /// The registry was not reached at all (the uplink is down), as opposed to having
    /// answered no: the case where a present image may stand in.
    pub fn is_unreachable(&self) -> bool {
        match self {
            RegistryError::Transport { .. } => true,
            RegistryError::Status { status, .. } => *status >= 500,
            RegistryError::AllEndpoints { unreachable, .. } => *unreachable,
            _ => false,
        }
    }

    /// When no connection to the registry's host could be made, the host's URL and
    /// why, in words that hold for every repository there: the case where the whole
    /// host may be taken as down for a while. None when the host was reached and only
    /// this request (this repository) failed.
    pub fn host_unreachable(&self) -> Option<String> {
        match self {
            RegistryError::Transport {
                url,
                message,
                connect: true,
            } => Some(format!("{}: {message}", redirect::origin(url))),
            RegistryError::AllEndpoints { hosts_down, .. } => hosts_down.clone(),
            _ => None,
        }
    }

    /// Whether another endpoint (the next mirror, the upstream) might do better.
    fn try_next_endpoint(&self) -> bool {
        !matches!(
            self,
            RegistryError::Schema1 { .. } | RegistryError::Config { .. }
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retryable_and_unreachable_are_told_apart() {
        let t = RegistryError::Transport {
            url: "https://r/v2/a/manifests/1".into(),
            message: "connection refused".into(),
            connect: true,
        };
        assert!(t.is_retryable() && t.is_unreachable());
        // The host is down for every repository, in words that name none of them.
        assert_eq!(
            t.host_unreachable().as_deref(),
            Some("https://r:443: connection refused")
        );
        let timed_out = RegistryError::Transport {
            url: "https://r/v2/a/manifests/1".into(),
            message: "timed out (RecvResponse)".into(),
            connect: false,
        };
        assert!(timed_out.is_unreachable() && timed_out.host_unreachable().is_none());
        let not_found = RegistryError::Status {
            method: "GET",
            url: "https://r/v2/x/manifests/1".into(),
            status: 404,
            codes: vec!["MANIFEST_UNKNOWN: manifest unknown".into()],
        };
        assert!(!not_found.is_retryable() && !not_found.is_unreachable());
        assert_eq!(
            not_found.to_string(),
            "GET https://r/v2/x/manifests/1: 404 (MANIFEST_UNKNOWN: manifest unknown)"
        );
        let busy = RegistryError::Status {
            method: "GET",
            url: "u".into(),
            status: 503,
            codes: vec![],
        };
        assert!(busy.is_retryable());
    }
}
