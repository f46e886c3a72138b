//! The Lease renewal as it goes on the wire: a JSON merge patch of the Lease's spec and
//! the ownerReferences, naming the resourceVersion it was computed against (the
//! apiserver answers 409 when another writer came between, as it does a PUT), rather
//! than a PUT of the whole object with its managedFields. The renewal sent every 10 s is
//! most of an idle node's uplink (benches/uplink_bytes.rs).

use k8s_openapi::api::coordination::v1::Lease;
use serde_json::{json, Map, Value};

/// The merge patch that makes the Lease in the cluster `lease`'s spec and owners, if it
/// is still at `lease`'s resourceVersion.
pub fn renewal_patch(lease: &Lease) -> Value {
    let mut metadata = Map::new();
    if let Some(rv) = &lease.metadata.resource_version {
        metadata.insert("resourceVersion".into(), json!(rv));
    }
    if let Some(owners) = &lease.metadata.owner_references {
        metadata.insert("ownerReferences".into(), json!(owners));
    }
    json!({ "metadata": metadata, "spec": lease.spec })
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::coordination::v1::LeaseSpec;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{
        ManagedFieldsEntry, MicroTime, ObjectMeta,
    };

    #[test]
    fn the_patch_names_the_version_and_carries_the_spec_but_not_the_managed_fields() {
        let renew = MicroTime("2026-01-02T03:04:05.123456Z".parse().expect("time"));
        let lease = Lease {
            metadata: ObjectMeta {
                name: Some("n1".into()),
                namespace: Some("kube-node-lease".into()),
                resource_version: Some("42".into()),
                managed_fields: Some(vec![ManagedFieldsEntry {
                    manager: Some("holdfast".into()),
                    ..Default::default()
                }]),
                ..Default::default()
            },
            spec: Some(LeaseSpec {
                holder_identity: Some("n1".into()),
                lease_duration_seconds: Some(40),
                renew_time: Some(renew),
                ..Default::default()
            }),
        };
        let p = renewal_patch(&lease);
        assert_eq!(
            p,
            json!({
                "metadata": {"resourceVersion": "42"},
                "spec": {
                    "holderIdentity": "n1",
                    "leaseDurationSeconds": 40,
                    "renewTime": "2026-01-02T03:04:05.123456Z",
                },
            })
        );
    }
}
