//! The two apiserver calls the object manager makes: LIST one object by name, and WATCH
//! it from a resourceVersion. A trait so the manager's logic is tested against a fake.

use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::WatchEvent;

use super::Object;
use crate::kube::{ApiError, Client};

/// How much longer than `timeoutSeconds` the client waits for a watch body to end.
const WATCH_SLACK: Duration = Duration::from_secs(15);

/// A LIST by name: the object if it exists, and the list's resourceVersion to watch from.
pub struct Listed<T> {
    pub item: Option<T>,
    pub resource_version: String,
}

/// Lists and watches single ConfigMaps and Secrets by name. Implemented by
/// [`Client`]; shared by the manager's threads.
pub trait ObjectFetcher: Send + Sync + 'static {
    /// `GET /api/v1/namespaces/<ns>/<resource>?fieldSelector=metadata.name%3D<name>`.
    fn list<T: Object>(&self, namespace: &str, name: &str) -> Result<Listed<T>, ApiError>;

    /// The same with `watch=true`, from `resource_version`, bookmarks on, ended by the
    /// server after `timeout_seconds`.
    fn watch<T: Object>(
        &self,
        namespace: &str,
        name: &str,
        resource_version: &str,
        timeout_seconds: u64,
    ) -> Result<impl Iterator<Item = Result<WatchEvent<T>, ApiError>> + use<Self, T>, ApiError>;
}

/// The LIST path (fixture 44). Names and namespaces are checked DNS-1123 names before
/// they get here, so they need no escaping.
pub(super) fn list_path<T: Object>(namespace: &str, name: &str) -> String {
    format!(
        "/api/v1/namespaces/{namespace}/{}?fieldSelector=metadata.name%3D{name}",
        T::OBJECT_KIND.resource()
    )
}

/// The WATCH path (fixture 45).
pub(super) fn watch_path<T: Object>(
    namespace: &str,
    name: &str,
    resource_version: &str,
    timeout_seconds: u64,
) -> String {
    format!(
        "{}&watch=true&allowWatchBookmarks=true&resourceVersion={resource_version}&timeoutSeconds={timeout_seconds}",
        list_path::<T>(namespace, name)
    )
}

/// The object named `name` in a LIST answer, and the list's resourceVersion.
pub(super) fn listed<T: Object>(
    path: &str,
    list: k8s_openapi::List<T>,
    name: &str,
) -> Result<Listed<T>, ApiError> {
    let Some(resource_version) = list.metadata.resource_version.filter(|rv| !rv.is_empty()) else {
        return Err(ApiError::Decode {
            method: "GET",
            path: path.to_string(),
            message: "list without metadata.resourceVersion".into(),
        });
    };
    let item = list
        .items
        .into_iter()
        .find(|o| o.metadata().name.as_deref() == Some(name));
    Ok(Listed {
        item,
        resource_version,
    })
}

impl ObjectFetcher for Client {
    fn list<T: Object>(&self, namespace: &str, name: &str) -> Result<Listed<T>, ApiError> {
        let path = list_path::<T>(namespace, name);
        let list: k8s_openapi::List<T> = self.get(&path)?;
        listed(&path, list, name)
    }

    fn watch<T: Object>(
        &self,
        namespace: &str,
        name: &str,
        resource_version: &str,
        timeout_seconds: u64,
    ) -> Result<impl Iterator<Item = Result<WatchEvent<T>, ApiError>> + use<T>, ApiError> {
        let path = watch_path::<T>(namespace, name, resource_version, timeout_seconds);
        Client::watch::<T>(
            self,
            &path,
            Duration::from_secs(timeout_seconds) + WATCH_SLACK,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{ConfigMap, Secret};

    /// The body of fixture 44.
    const LIST_44: &str = r#"{"kind":"ConfigMapList","apiVersion":"v1","metadata":{"resourceVersion":"273"},"items":[{"metadata":{"name":"app-config","namespace":"default","uid":"e18f45dc-af1b-454a-9b73-4a7ff7f77023","resourceVersion":"220","creationTimestamp":"2026-11-22T07:30:48Z","managedFields":[{"manager":"edge-node-agent-fixtures","operation":"Update","apiVersion":"v1","time":"2026-11-22T07:30:48Z","fieldsType":"FieldsV1","fieldsV1":{"f:data":{".":{},"f:greeting":{},"f:log.level":{}}}}]},"data":{"greeting":"hello from app-config","log.level":"info"}}]}"#;

    /// The events of fixture 45.
    const WATCH_45: [&str; 2] = [
        r#"{"type":"MODIFIED","object":{"kind":"ConfigMap","apiVersion":"v1","metadata":{"name":"app-config","namespace":"default","uid":"e18f45dc-af1b-454a-9b73-4a7ff7f77023","resourceVersion":"274","creationTimestamp":"2026-11-22T07:30:48Z","managedFields":[{"manager":"edge-node-agent-fixtures","operation":"Update","apiVersion":"v1","time":"2026-11-22T07:33:33Z","fieldsType":"FieldsV1","fieldsV1":{"f:data":{".":{},"f:greeting":{},"f:log.level":{}}}}]},"data":{"greeting":"hello from app-config","log.level":"debug"}}}"#,
        r#"{"type":"BOOKMARK","object":{"kind":"ConfigMap","apiVersion":"v1","metadata":{"resourceVersion":"275"}}}"#,
    ];

    #[test]
    fn paths_are_the_kubelets() {
        assert_eq!(
            list_path::<ConfigMap>("default", "app-config"),
            "/api/v1/namespaces/default/configmaps?fieldSelector=metadata.name%3Dapp-config"
        );
        assert_eq!(
            watch_path::<ConfigMap>("default", "app-config", "273", 10),
            "/api/v1/namespaces/default/configmaps?fieldSelector=metadata.name%3Dapp-config\
             &watch=true&allowWatchBookmarks=true&resourceVersion=273&timeoutSeconds=10"
        );
        assert_eq!(
            list_path::<Secret>("apps", "s"),
            "/api/v1/namespaces/apps/secrets?fieldSelector=metadata.name%3Ds"
        );
    }

    #[test]
    fn fixture_list_gives_the_object_and_the_list_rv() {
        let list: k8s_openapi::List<ConfigMap> = serde_json::from_str(LIST_44).expect("decode 44");
        let got = listed("/p", list, "app-config").expect("listed");
        assert_eq!(got.resource_version, "273");
        let cm = got.item.expect("item");
        assert_eq!(cm.metadata.resource_version.as_deref(), Some("220"));
        let data = cm.data.expect("data");
        assert_eq!(data.get("log.level").map(String::as_str), Some("info"));

        let list: k8s_openapi::List<ConfigMap> = serde_json::from_str(LIST_44).expect("decode 44");
        let other = listed("/p", list, "other").expect("listed");
        assert!(other.item.is_none());
        assert_eq!(other.resource_version, "273");
    }

    #[test]
    fn list_without_rv_is_a_decode_error() {
        let list: k8s_openapi::List<ConfigMap> = serde_json::from_str(
            r#"{"kind":"ConfigMapList","apiVersion":"v1","metadata":{},"items":[]}"#,
        )
        .expect("decode");
        match listed("/p", list, "x") {
            Err(ApiError::Decode { .. }) => {}
            Err(e) => panic!("wrong error: {e}"),
            Ok(_) => panic!("a list without a resourceVersion was accepted"),
        }
    }

    #[test]
    fn fixture_watch_events_decode() {
        let modified: WatchEvent<ConfigMap> = serde_json::from_str(WATCH_45[0]).expect("event");
        match modified {
            WatchEvent::Modified(cm) => {
                assert_eq!(cm.metadata.resource_version.as_deref(), Some("274"));
            }
            _ => panic!("not MODIFIED"),
        }
        let bookmark: WatchEvent<ConfigMap> = serde_json::from_str(WATCH_45[1]).expect("bookmark");
        match bookmark {
            WatchEvent::Bookmark {
                resource_version, ..
            } => assert_eq!(resource_version, "275"),
            _ => panic!("not BOOKMARK"),
        }
    }
}
