//! Pod status patches and the final delete, as the kubelet's status manager sends them.
//!
//! `PATCH pods/<name>/status` with a strategic merge patch: conditions merge by type, so
//! a condition the agent does not own (the scheduler's `PodScheduled` on a cluster pod)
//! is left as the server has it; `metadata.uid` makes a patch for a pod that was
//! replaced under the same name fail (422) instead of landing on the wrong pod.

use k8s_openapi::api::core::v1::{Pod, PodStatus};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{DeleteOptions, Preconditions};
use serde_json::{json, Value};

use super::client::{Client, Patch};
use super::error::ApiError;

/// Conditions the agent leaves to others on a pod that came from the cluster.
/// DisruptionTarget is shared, as the kubelet's `PodConditionSharedByKubelet`: the
/// agent sends it only when it set it (an eviction), and by type the merge leaves the
/// one others set alone otherwise.
const NOT_OURS: &[&str] = &["PodScheduled"];

/// The body of `PATCH pods/<name>/status` for the pod with API UID `uid`. `owns_all`
/// is true for mirror pods, whose every condition the agent reports.
pub fn status_patch(uid: &str, status: &PodStatus, owns_all: bool) -> Value {
    let mut status = status.clone();
    if !owns_all {
        if let Some(cs) = status.conditions.as_mut() {
            cs.retain(|c| !NOT_OURS.contains(&c.type_.as_str()));
        }
    }
    let mut body = serde_json::to_value(&status).unwrap_or_else(|_| json!({}));
    if let Some(obj) = body.as_object_mut() {
        if let Some(Value::Array(conditions)) = obj.get_mut("conditions") {
            // The kubelet sends `lastProbeTime: null` for every condition.
            for c in conditions.iter_mut() {
                if let Some(c) = c.as_object_mut() {
                    c.entry("lastProbeTime").or_insert(Value::Null);
                }
            }
            let order: Vec<Value> = conditions
                .iter()
                .filter_map(|c| c.get("type").cloned())
                .map(|t| json!({ "type": t }))
                .collect();
            obj.insert("$setElementOrder/conditions".into(), Value::Array(order));
        }
        // The patch carries the whole status, and a strategic merge keeps what it does
        // not mention: a container that went from waiting to running would show both.
        // Null what a state no longer holds, as the kubelet's two-way patch does.
        for list in ["containerStatuses", "initContainerStatuses"] {
            let Some(Value::Array(statuses)) = obj.get_mut(list) else {
                continue;
            };
            for status in statuses.iter_mut() {
                for field in ["state", "lastState"] {
                    if let Some(Value::Object(state)) = status.get_mut(field) {
                        for member in ["waiting", "running", "terminated"] {
                            state.entry(member).or_insert(Value::Null);
                        }
                    }
                }
            }
        }
    }
    json!({ "metadata": { "uid": uid }, "status": body })
}

/// The path of a pod, or of one of its subresources.
pub fn pod_path(namespace: &str, name: &str, sub: Option<&str>) -> String {
    let mut p = format!(
        "/api/v1/namespaces/{}/pods/{}",
        super::escape(namespace),
        super::escape(name)
    );
    if let Some(s) = sub {
        p.push('/');
        p.push_str(s);
    }
    p
}

/// Sends the status; the answer is the pod as the server now has it.
pub fn patch_status(
    client: &Client,
    namespace: &str,
    name: &str,
    uid: &str,
    status: &PodStatus,
    owns_all: bool,
) -> Result<Pod, ApiError> {
    client.patch(
        &pod_path(namespace, name, Some("status")),
        Patch::Strategic,
        &status_patch(uid, status, owns_all),
    )
}

/// The kubelet's final delete: grace 0, only the pod with this UID. A pod that is gone
/// already, or was replaced by another with the same name, counts as deleted.
pub fn delete_for_good(
    client: &Client,
    namespace: &str,
    name: &str,
    uid: &str,
) -> Result<(), ApiError> {
    let options = final_delete(uid);
    match client.delete::<Value>(&pod_path(namespace, name, None), &options) {
        Ok(_) => Ok(()),
        Err(e) if e.is_not_found() || e.is_conflict() => Ok(()),
        Err(e) => Err(e),
    }
}

pub fn final_delete(uid: &str) -> DeleteOptions {
    DeleteOptions {
        grace_period_seconds: Some(0),
        preconditions: Some(Preconditions {
            uid: Some(uid.to_string()),
            resource_version: None,
        }),
        ..DeleteOptions::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::PodCondition;

    fn cond(t: &str) -> PodCondition {
        PodCondition {
            type_: t.into(),
            status: "True".into(),
            ..PodCondition::default()
        }
    }

    fn status() -> PodStatus {
        PodStatus {
            phase: Some("Running".into()),
            conditions: Some(vec![
                cond("Initialized"),
                cond("Ready"),
                cond("PodScheduled"),
            ]),
            ..PodStatus::default()
        }
    }

    #[test]
    fn cluster_pods_leave_pod_scheduled_to_the_scheduler() {
        let body = status_patch("u1", &status(), false);
        assert_eq!(body["metadata"]["uid"], "u1");
        let types: Vec<&str> = body["status"]["conditions"]
            .as_array()
            .expect("conditions")
            .iter()
            .filter_map(|c| c["type"].as_str())
            .collect();
        assert_eq!(types, ["Initialized", "Ready"]);
        assert_eq!(
            body["status"]["$setElementOrder/conditions"],
            json!([{"type": "Initialized"}, {"type": "Ready"}])
        );
        assert_eq!(body["status"]["phase"], "Running");
        assert!(body["status"]["conditions"][0]
            .as_object()
            .expect("object")
            .contains_key("lastProbeTime"));
    }

    #[test]
    fn a_state_that_went_away_is_nulled() {
        let mut st = status();
        st.container_statuses = Some(vec![serde_json::from_value(json!({
            "name": "main", "image": "x", "imageID": "", "ready": true, "restartCount": 0,
            "state": {"running": {"startedAt": "2026-01-01T00:00:00Z"}},
            "lastState": {},
        }))
        .expect("container status")]);
        let body = status_patch("u1", &st, false);
        let cs = &body["status"]["containerStatuses"][0];
        assert_eq!(
            cs["state"],
            json!({"running": {"startedAt": "2026-01-01T00:00:00Z"},
                   "waiting": null, "terminated": null})
        );
        assert_eq!(
            cs["lastState"],
            json!({"running": null, "waiting": null, "terminated": null})
        );
    }

    #[test]
    fn mirror_pods_report_every_condition() {
        let body = status_patch("m1", &status(), true);
        assert_eq!(
            body["status"]["conditions"].as_array().map(Vec::len),
            Some(3)
        );
    }

    #[test]
    fn final_delete_is_grace_zero_with_the_uid() {
        let v = serde_json::to_value(final_delete("u9")).expect("json");
        assert_eq!(
            v,
            json!({"gracePeriodSeconds": 0, "preconditions": {"uid": "u9"}})
        );
    }

    #[test]
    fn paths_are_escaped() {
        assert_eq!(
            pod_path("default", "web", Some("status")),
            "/api/v1/namespaces/default/pods/web/status"
        );
    }
}
