//! The two apiserver calls the Service reflector makes, behind a trait so its decisions
//! are tested without HTTP, and their paths: those of client-go's reflector, which the
//! kubelet's Service informer runs.

use std::time::Duration;

use k8s_openapi::api::core::v1::Service;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::WatchEvent;

use crate::kube::{ApiError, Client};

/// One page of Services, as `GET /api/v1/services` returns it.
pub type ServiceList = k8s_openapi::List<Service>;

/// The events of one open watch, until the server ends the stream (`None`) or the
/// connection breaks. `Send`: a reader thread drains it.
pub type ServiceWatch = Box<dyn Iterator<Item = Result<WatchEvent<Service>, ApiError>> + Send>;

/// Page size of a LIST, as client-go's pager uses.
pub const LIST_LIMIT: u32 = 500;

/// How much longer than `timeoutSeconds` a watch body may take before the client gives
/// up on it: silence beyond that is a dead connection.
const WATCH_BODY_MARGIN: Duration = Duration::from_secs(30);

/// Lists and watches every Service of the cluster.
pub trait ServiceLister: Send + 'static {
    /// One page; `continue_token` from the previous page's `metadata.continue`.
    fn list(&self, continue_token: Option<&str>) -> Result<ServiceList, ApiError>;

    /// Opens a watch from `resource_version`, with bookmarks, that the server ends
    /// after `timeout_secs`.
    fn watch(&self, resource_version: &str, timeout_secs: u64) -> Result<ServiceWatch, ApiError>;
}

impl ServiceLister for Client {
    fn list(&self, continue_token: Option<&str>) -> Result<ServiceList, ApiError> {
        self.get(&list_path(LIST_LIMIT, continue_token))
    }

    fn watch(&self, resource_version: &str, timeout_secs: u64) -> Result<ServiceWatch, ApiError> {
        let path = watch_path(resource_version, timeout_secs);
        let body_timeout = Duration::from_secs(timeout_secs) + WATCH_BODY_MARGIN;
        let watch = Client::watch::<Service>(self, &path, body_timeout)?;
        Ok(Box::new(watch))
    }
}

/// `/api/v1/services?limit=<limit>[&continue=<token>]`.
pub fn list_path(limit: u32, continue_token: Option<&str>) -> String {
    let mut path = format!("/api/v1/services?limit={limit}");
    if let Some(token) = continue_token {
        path.push_str("&continue=");
        path.push_str(&crate::kube::escape(token));
    }
    path
}

/// `/api/v1/services?watch=true&allowWatchBookmarks=true&resourceVersion=<rv>&timeoutSeconds=<s>`.
pub fn watch_path(resource_version: &str, timeout_secs: u64) -> String {
    format!(
        "/api/v1/services?watch=true&allowWatchBookmarks=true&resourceVersion={}&timeoutSeconds={timeout_secs}",
        crate::kube::escape(resource_version)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths() {
        assert_eq!(list_path(500, None), "/api/v1/services?limit=500");
        assert_eq!(
            list_path(500, Some("a=b&c")),
            "/api/v1/services?limit=500&continue=a%3Db%26c"
        );
        assert_eq!(
            watch_path("231", 1800),
            "/api/v1/services?watch=true&allowWatchBookmarks=true&resourceVersion=231&timeoutSeconds=1800"
        );
    }

    #[test]
    fn a_watch_event_of_the_apiserver_decodes() {
        let line = r#"{"type":"ADDED","object":{"kind":"Service","apiVersion":"v1","metadata":{"name":"fooservice","namespace":"pods-1","uid":"9c2b","resourceVersion":"812","creationTimestamp":"2026-12-02T13:45:40Z"},"spec":{"ports":[{"protocol":"TCP","port":8765,"targetPort":8080}],"selector":{"name":"server"},"clusterIP":"10.0.0.171","clusterIPs":["10.0.0.171"],"type":"ClusterIP","sessionAffinity":"None","ipFamilies":["IPv4"],"ipFamilyPolicy":"SingleStack","internalTrafficPolicy":"Cluster"},"status":{"loadBalancer":{}}}}"#;
        match serde_json::from_str::<WatchEvent<Service>>(line).expect("event") {
            WatchEvent::Added(s) => {
                let spec = s.spec.expect("spec");
                assert_eq!(spec.cluster_ip.as_deref(), Some("10.0.0.171"));
                assert_eq!(spec.ports.expect("ports")[0].port, 8765);
            }
            _ => panic!("not ADDED"),
        }
    }
}
