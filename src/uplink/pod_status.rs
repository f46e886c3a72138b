//! Pod status patches and the final delete, as the kubelet's status manager sends them.
//!
//! `PATCH pods/<name>/status` with a strategic merge patch: conditions merge by type, so
//! a condition the agent does not own (the scheduler's `PodScheduled` on a cluster pod)
//! is left as the server has it; `podIPs` and `hostIPs` (merged by `ip` otherwise) are
//! replaced whole, so an address the API holds from before cannot join the new ones;
//! `metadata.uid` makes a patch for a pod that was replaced under the same name fail
//! instead of landing on the wrong pod. A patch the apiserver refuses is said with its
//! message, and the status goes again whole: a PUT of `/status` on the pod as the API
//! holds it (its resourceVersion), which nothing merged before can spoil.

use k8s_openapi::api::core::v1::{Pod, PodCondition, PodStatus};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{DeleteOptions, Preconditions};
use serde_json::{json, Value};

use crate::kube::client::{Client, Patch};
use crate::kube::error::ApiError;

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
            // The kubelet sends `lastProbeTime: null` for every condition; and as its
            // two-way patch does, nulls a reason and message a condition no longer
            // has, which the merge would keep otherwise (a Ready True still saying
            // why it was not).
            for c in conditions.iter_mut() {
                if let Some(c) = c.as_object_mut() {
                    for field in ["lastProbeTime", "reason", "message"] {
                        c.entry(field).or_insert(Value::Null);
                    }
                }
            }
            let order: Vec<Value> = conditions
                .iter()
                .filter_map(|c| c.get("type").cloned())
                .map(|t| json!({ "type": t }))
                .collect();
            obj.insert("$setElementOrder/conditions".into(), Value::Array(order));
        }
        // Lists merged by `ip` in the API: an address from an earlier status (a wrong
        // one, or the sandbox's before a reboot) would stay beside the new ones, and
        // two of one family are refused. Replace them whole; no address, no field.
        for (list, single) in [("podIPs", "podIP"), ("hostIPs", "hostIP")] {
            match obj.get_mut(list) {
                Some(Value::Array(ips)) => ips.push(json!({ "$patch": "replace" })),
                _ if list == "podIPs" => {
                    obj.insert(list.into(), Value::Null);
                    obj.insert(single.into(), Value::Null);
                }
                _ => {}
            }
        }
        // The patch carries the whole status, and a strategic merge keeps what it does
        // not mention: a container that went from waiting to running would show both.
        // Null what a state no longer holds, as the kubelet's two-way patch does.
        for list in [
            "containerStatuses",
            "initContainerStatuses",
            "ephemeralContainerStatuses",
        ] {
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
        crate::kube::escape(namespace),
        crate::kube::escape(name)
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

/// How often a whole status is sent again when the pod changed between GET and PUT.
const PUT_ATTEMPTS: u32 = 3;

/// What became of a status [`send_status`] sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Sent {
    /// The API holds it.
    Reported,
    /// The pod is gone from the API, or another pod has its name now.
    Gone,
}

/// Sends the status of the pod with API UID `uid`: the patch, and when the apiserver
/// refuses it (a 4xx other than 404, said with the apiserver's message) the whole
/// status by PUT on the pod as the API holds it. Only a pod that is not there, or
/// another pod under its name, counts as gone. An error is what the PUT could not cure
/// (or transport trouble, for the caller to retry).
pub fn send_status(
    client: &Client,
    namespace: &str,
    name: &str,
    uid: &str,
    status: &PodStatus,
    owns_all: bool,
) -> Result<Sent, ApiError> {
    let refused = match patch_status(client, namespace, name, uid, status, owns_all) {
        Ok(_) => return Ok(Sent::Reported),
        Err(e) if e.is_not_found() => return Ok(Sent::Gone),
        Err(e) if e.is_transient() || e.code().is_none() => return Err(e),
        Err(e) => e,
    };
    log::warn!(
        "pod {namespace}/{name}: status patch refused: {refused}; sending the whole status \
         on the pod as the API holds it"
    );
    let mut attempt = 0;
    loop {
        attempt += 1;
        let current = match client.get::<Pod>(&pod_path(namespace, name, None)) {
            Ok(p) => p,
            Err(e) if e.is_not_found() => return Ok(Sent::Gone),
            Err(e) => return Err(e),
        };
        if current.metadata.uid.as_deref() != Some(uid) {
            log::info!(
                "pod {namespace}/{name}: the API has another pod of that name (UID {}); \
                 the status of {uid} is not sent",
                current.metadata.uid.as_deref().unwrap_or("none")
            );
            return Ok(Sent::Gone);
        }
        let body = with_status(current, status, owns_all);
        match client.put::<_, Pod>(&pod_path(namespace, name, Some("status")), &body) {
            Ok(_) => {
                log::info!("pod {namespace}/{name}: whole status sent");
                return Ok(Sent::Reported);
            }
            Err(e) if e.is_not_found() => return Ok(Sent::Gone),
            // Changed since the GET: read it again.
            Err(e) if e.is_conflict() && attempt < PUT_ATTEMPTS => continue,
            Err(e) => return Err(e),
        }
    }
}

/// `pod` (as the API holds it, with its resourceVersion) carrying `ours`: every field
/// the agent reports is ours, conditions merge by type (the ones the agent does not
/// own stay as the API has them), and what others write (a nominated node, resource
/// claims) is kept.
pub fn with_status(mut pod: Pod, ours: &PodStatus, owns_all: bool) -> Pod {
    let api = pod.status.take().unwrap_or_default();
    let mut s = ours.clone();
    let mine: Vec<PodCondition> = s
        .conditions
        .take()
        .unwrap_or_default()
        .into_iter()
        .filter(|c| owns_all || !NOT_OURS.contains(&c.type_.as_str()))
        .collect();
    let mut conditions: Vec<PodCondition> = api
        .conditions
        .unwrap_or_default()
        .into_iter()
        .filter(|c| !mine.iter().any(|m| m.type_ == c.type_))
        .collect();
    conditions.extend(mine);
    s.conditions = Some(conditions);
    s.nominated_node_name = s.nominated_node_name.or(api.nominated_node_name);
    s.resource_claim_statuses = s.resource_claim_statuses.or(api.resource_claim_statuses);
    s.extended_resource_claim_status = s
        .extended_resource_claim_status
        .or(api.extended_resource_claim_status);
    s.ephemeral_container_statuses = s
        .ephemeral_container_statuses
        .or(api.ephemeral_container_statuses);
    s.resize = s.resize.or(api.resize);
    pod.status = Some(s);
    pod
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
        Err(e) if e.is_not_found() => Ok(()),
        // The UID precondition failed: another pod has the name now.
        Err(e) if e.is_conflict() => {
            log::info!(
                "pod {namespace}/{name}: not deleted, the API has another pod of that name: {e}"
            );
            Ok(())
        }
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
        let first = body["status"]["conditions"][0].as_object().expect("object");
        for field in ["lastProbeTime", "reason", "message"] {
            assert_eq!(first.get(field), Some(&Value::Null), "{field}");
        }
    }

    #[test]
    fn a_state_that_went_away_is_nulled() {
        let mut st = status();
        let running = || -> k8s_openapi::api::core::v1::ContainerStatus {
            serde_json::from_value(json!({
                "name": "main", "image": "x", "imageID": "", "ready": true, "restartCount": 0,
                "state": {"running": {"startedAt": "2026-01-01T00:00:00Z"}},
                "lastState": {},
            }))
            .expect("container status")
        };
        st.container_statuses = Some(vec![running()]);
        st.ephemeral_container_statuses = Some(vec![running()]);
        let body = status_patch("u1", &st, false);
        for list in ["containerStatuses", "ephemeralContainerStatuses"] {
            let cs = &body["status"][list][0];
            assert_eq!(
                cs["state"],
                json!({"running": {"startedAt": "2026-01-01T00:00:00Z"},
                       "waiting": null, "terminated": null}),
                "{list}"
            );
            assert_eq!(
                cs["lastState"],
                json!({"running": null, "waiting": null, "terminated": null}),
                "{list}"
            );
        }
    }

    #[test]
    fn addresses_replace_what_the_api_holds() {
        let mut st = status();
        st.pod_ip = Some("10.77.0.5".into());
        st.pod_ips = Some(vec![k8s_openapi::api::core::v1::PodIP {
            ip: "10.77.0.5".into(),
        }]);
        st.host_ip = Some("192.0.2.2".into());
        st.host_ips = Some(vec![k8s_openapi::api::core::v1::HostIP {
            ip: "192.0.2.2".into(),
        }]);
        let body = status_patch("u1", &st, false);
        assert_eq!(
            body["status"]["podIPs"],
            json!([{"ip": "10.77.0.5"}, {"$patch": "replace"}])
        );
        assert_eq!(
            body["status"]["hostIPs"],
            json!([{"ip": "192.0.2.2"}, {"$patch": "replace"}])
        );
        // No address yet: whatever the API holds goes.
        let body = status_patch("u1", &status(), false);
        let s = body["status"].as_object().expect("status");
        assert_eq!(s.get("podIP"), Some(&Value::Null));
        assert_eq!(s.get("podIPs"), Some(&Value::Null));
        assert_eq!(
            s.get("hostIPs"),
            None,
            "an unknown host address is left alone"
        );
    }

    #[test]
    fn a_whole_status_keeps_what_others_wrote() {
        let api: Pod = serde_json::from_value(json!({
            "metadata": {"name": "web", "uid": "u1", "resourceVersion": "42"},
            "status": {
                "phase": "Pending",
                "nominatedNodeName": "n2",
                "podIP": "192.0.2.2",
                "podIPs": [{"ip": "10.77.0.5"}, {"ip": "192.0.2.2"}],
                "conditions": [
                    {"type": "PodScheduled", "status": "True"},
                    {"type": "example.com/gate", "status": "False"},
                    {"type": "Ready", "status": "False"},
                ],
            },
        }))
        .expect("pod");
        let mut ours = status();
        ours.pod_ip = Some("10.77.0.5".into());
        ours.pod_ips = Some(vec![k8s_openapi::api::core::v1::PodIP {
            ip: "10.77.0.5".into(),
        }]);
        let pod = with_status(api, &ours, false);
        assert_eq!(pod.metadata.resource_version.as_deref(), Some("42"));
        let s = pod.status.expect("status");
        assert_eq!(s.phase.as_deref(), Some("Running"));
        assert_eq!(s.nominated_node_name.as_deref(), Some("n2"));
        assert_eq!(s.pod_ips.map(|v| v.len()), Some(1));
        let types: Vec<String> = s
            .conditions
            .unwrap_or_default()
            .into_iter()
            .map(|c| format!("{}={}", c.type_, c.status))
            .collect();
        assert_eq!(
            types,
            [
                "PodScheduled=True",
                "example.com/gate=False",
                "Initialized=True",
                "Ready=True"
            ]
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
