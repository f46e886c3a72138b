//! The two apiserver calls the api pod source makes, behind a trait so the reflector's
//! decisions can be tested without HTTP, and their real paths (checked against the
//! recorded fixtures 27, 28, 30 and 36).

use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::WatchEvent;

use crate::kube::{ApiError, Client};

/// One page of pods, as `GET /api/v1/pods` returns it.
pub type PodList = k8s_openapi::List<Pod>;

/// The events of one open watch, until the server ends the stream (`None`) or the
/// connection breaks (`Some(Err(..))`). `Send`: a reader thread drains it so the source
/// can wait for events with a timeout.
pub type PodWatch = Box<dyn Iterator<Item = Result<WatchEvent<Pod>, ApiError>> + Send>;

/// Page size of a LIST, as client-go's pager uses.
pub const LIST_LIMIT: u32 = 500;

/// How much longer than `timeoutSeconds` a watch body may take before the client gives
/// up on it: the server ends it at `timeoutSeconds`, so silence beyond that is a dead
/// connection (an uplink that dropped without a reset).
const WATCH_BODY_MARGIN: Duration = Duration::from_secs(30);

/// Lists and watches the pods bound to one node.
pub trait PodLister {
    /// One page of the node's pods; `continue_token` from the previous page's
    /// `metadata.continue`, `None` for the first.
    fn list(&self, node_name: &str, continue_token: Option<&str>) -> Result<PodList, ApiError>;

    /// Opens a watch of the node's pods from `resource_version`, with bookmarks, that
    /// the server ends after `timeout_secs`.
    fn watch(
        &self,
        node_name: &str,
        resource_version: &str,
        timeout_secs: u64,
    ) -> Result<PodWatch, ApiError>;
}

impl PodLister for Client {
    fn list(&self, node_name: &str, continue_token: Option<&str>) -> Result<PodList, ApiError> {
        self.get(&list_path(node_name, LIST_LIMIT, continue_token))
    }

    fn watch(
        &self,
        node_name: &str,
        resource_version: &str,
        timeout_secs: u64,
    ) -> Result<PodWatch, ApiError> {
        let path = watch_path(node_name, resource_version, timeout_secs);
        let body_timeout = Duration::from_secs(timeout_secs) + WATCH_BODY_MARGIN;
        let watch = Client::watch::<Pod>(self, &path, body_timeout)?;
        Ok(Box::new(watch))
    }
}

/// `/api/v1/pods?fieldSelector=spec.nodeName%3D<node>&limit=<limit>[&continue=<token>]`:
/// the Node authorizer lets a node list pods only with this field selector (fixture 29).
pub fn list_path(node_name: &str, limit: u32, continue_token: Option<&str>) -> String {
    let mut path = format!("{}&limit={limit}", selected(node_name));
    if let Some(token) = continue_token {
        path.push_str("&continue=");
        path.push_str(&crate::kube::escape(token));
    }
    path
}

/// `/api/v1/pods?fieldSelector=…&watch=true&allowWatchBookmarks=true&resourceVersion=<rv>&timeoutSeconds=<s>`.
pub fn watch_path(node_name: &str, resource_version: &str, timeout_secs: u64) -> String {
    format!(
        "{}&watch=true&allowWatchBookmarks=true&resourceVersion={}&timeoutSeconds={timeout_secs}",
        selected(node_name),
        crate::kube::escape(resource_version)
    )
}

fn selected(node_name: &str) -> String {
    format!(
        "/api/v1/pods?fieldSelector={}",
        crate::kube::escape(&format!("spec.nodeName={node_name}"))
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The request target of a recorded request (its first non-comment line).
    fn recorded_target(request: &str) -> &str {
        let line = request
            .lines()
            .find(|l| l.starts_with("GET "))
            .expect("request line");
        line.trim_start_matches("GET ")
            .trim_end_matches(" HTTP/1.1")
    }

    #[test]
    fn paths_match_the_recorded_requests() {
        // Request lines of fixtures 27, 28, 30 and 36, as sent on the wire.
        let token = "eyJ2IjoibWV0YS5rOHMuaW8vdjEiLCJydiI6MjMxLCJzdGFydCI6Ii9kZWZhdWx0L3NsZWVwLTFcdTAwMDAifQ";
        let f27 = "GET /api/v1/pods?fieldSelector=spec.nodeName%3Dedge-node-1&limit=2 HTTP/1.1";
        let f28 = format!(
            "GET /api/v1/pods?fieldSelector=spec.nodeName%3Dedge-node-1&limit=2&continue={token} HTTP/1.1"
        );
        let f30 = "GET /api/v1/pods?fieldSelector=spec.nodeName%3Dedge-node-1&watch=true&allowWatchBookmarks=true&resourceVersion=231&timeoutSeconds=30 HTTP/1.1";
        let f36 = "GET /api/v1/pods?fieldSelector=spec.nodeName%3Dedge-node-1&watch=true&allowWatchBookmarks=true&resourceVersion=253&timeoutSeconds=70 HTTP/1.1";
        assert_eq!(list_path("edge-node-1", 2, None), recorded_target(f27));
        assert_eq!(
            list_path("edge-node-1", 2, Some(token)),
            recorded_target(&f28)
        );
        assert_eq!(watch_path("edge-node-1", "231", 30), recorded_target(f30));
        assert_eq!(watch_path("edge-node-1", "253", 70), recorded_target(f36));
        assert_eq!(
            list_path("edge-node-1", LIST_LIMIT, None),
            "/api/v1/pods?fieldSelector=spec.nodeName%3Dedge-node-1&limit=500"
        );
    }

    #[test]
    fn query_values_are_escaped() {
        assert_eq!(crate::kube::escape("a=b&c d/+"), "a%3Db%26c%20d%2F%2B");
        assert_eq!(crate::kube::escape("tok-_.~9"), "tok-_.~9");
        assert!(list_path("n1", 500, Some("x=&y")).ends_with("&continue=x%3D%26y"));
    }
}
