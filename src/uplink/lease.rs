//! The Lease renewal as it goes on the wire: a JSON merge patch of what changed in the
//! Lease's spec and owners since the Lease we hold (at a renewal, its `renewTime` alone),
//! naming the resourceVersion it was computed against (the apiserver answers 409 when
//! another writer came between, as it does a PUT), rather than a PUT of the whole
//! object with its managedFields. The renewal sent every 10 s is most of an idle node's
//! uplink (benches/uplink_bytes.rs).

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use serde_json::{json, Map, Value};

/// The merge patch that makes the Lease in the cluster `wanted`'s spec and owners, if it
/// is still `held` (at `held`'s resourceVersion).
pub fn renewal_patch(held: &Lease, wanted: &Lease) -> Value {
    let mut metadata = Map::new();
    if let Some(rv) = &held.metadata.resource_version {
        metadata.insert("resourceVersion".into(), json!(rv));
    }
    if let Some(owners) = &wanted.metadata.owner_references {
        if held.metadata.owner_references.as_ref() != Some(owners) {
            metadata.insert("ownerReferences".into(), json!(owners));
        }
    }
    let spec = changed(held.spec.as_ref(), wanted.spec.as_ref());
    json!({ "metadata": metadata, "spec": spec })
}

/// The fields `new` sets that differ from `old`'s. What `new` does not set stays as it is
/// in the cluster (`leaseTransitions`, say), as the kubelet sets only its own fields.
fn changed(old: Option<&LeaseSpec>, new: Option<&LeaseSpec>) -> Map<String, Value> {
    let fields = |spec: Option<&LeaseSpec>| match spec.map(serde_json::to_value) {
        Some(Ok(Value::Object(map))) => map,
        _ => Map::new(),
    };
    let old = fields(old);
    fields(new)
        .into_iter()
        .filter(|(k, v)| old.get(k) != Some(v))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{
        ManagedFieldsEntry, MicroTime, ObjectMeta, OwnerReference,
    };

    fn lease(renew: &str, owner_uid: &str) -> Lease {
        Lease {
            metadata: ObjectMeta {
                name: Some("n1".into()),
                namespace: Some("kube-node-lease".into()),
                resource_version: Some("42".into()),
                owner_references: Some(vec![OwnerReference {
                    api_version: "v1".into(),
                    kind: "Node".into(),
                    name: "n1".into(),
                    uid: owner_uid.into(),
                    ..Default::default()
                }]),
                managed_fields: Some(vec![ManagedFieldsEntry {
                    manager: Some("holdfast".into()),
                    ..Default::default()
                }]),
                ..Default::default()
            },
            spec: Some(LeaseSpec {
                holder_identity: Some("n1".into()),
                lease_duration_seconds: Some(40),
                renew_time: Some(MicroTime(renew.parse().expect("time"))),
                ..Default::default()
            }),
        }
    }

    #[test]
    fn a_renewal_carries_the_version_and_the_new_renew_time_alone() {
        let held = lease("2026-01-02T03:03:55.000001Z", "u1");
        let wanted = lease("2026-01-02T03:04:05.123456Z", "u1");
        assert_eq!(
            renewal_patch(&held, &wanted),
            json!({
                "metadata": {"resourceVersion": "42"},
                "spec": {"renewTime": "2026-01-02T03:04:05.123456Z"},
            })
        );
    }

    #[test]
    fn what_else_changed_goes_too_and_what_is_not_ours_stays() {
        let mut held = lease("2026-01-02T03:03:55.000001Z", "u1");
        held.spec.as_mut().expect("spec").holder_identity = Some("someone-else".into());
        held.spec.as_mut().expect("spec").lease_transitions = Some(3);
        // The Node was made again: the new one owns the Lease.
        let wanted = lease("2026-01-02T03:04:05.123456Z", "u2");
        assert_eq!(
            renewal_patch(&held, &wanted),
            json!({
                "metadata": {
                    "resourceVersion": "42",
                    "ownerReferences": [
                        {"apiVersion": "v1", "kind": "Node", "name": "n1", "uid": "u2"}
                    ],
                },
                "spec": {
                    "holderIdentity": "n1",
                    "renewTime": "2026-01-02T03:04:05.123456Z",
                },
            })
        );
    }
}
