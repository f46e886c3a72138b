//! `ephemeralContainerStatuses`: the kubelet converts an ephemeral container's status
//! as an app container's, under a policy that never restarts it; its prober sets
//! neither `ready` nor `started` of one (it has no probes and counts for no
//! condition), so it is never ready and says nothing of having started.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Container, ContainerStatus, Pod};

use super::super::record::ContainerRecord;
use super::{container_status, creating, who, StatusInputs};
use crate::pod::ephemeral;

/// The statuses of the pod's ephemeral containers, in the spec's order; None for a pod
/// that has none.
pub(super) fn ephemeral_statuses(
    pod: &Pod,
    records: &BTreeMap<String, ContainerRecord>,
    i: &StatusInputs<'_>,
) -> Option<Vec<ContainerStatus>> {
    let all = ephemeral::ephemeral_containers(pod);
    if all.is_empty() {
        return None;
    }
    let inits: &[Container] = pod
        .spec
        .as_ref()
        .and_then(|s| s.init_containers.as_deref())
        .unwrap_or(&[]);
    let (who, creating) = (who(pod), creating(inits));
    let statuses = all
        .iter()
        .map(|ec| {
            let c = ephemeral::as_container(ec);
            let fresh = ContainerRecord::new(&c.name);
            let rec = records.get(&c.name).unwrap_or(&fresh);
            let mut s = container_status(&c, rec, "Never", &who, i.now, i.backoff, None, creating);
            s.ready = false;
            s.started = None;
            s
        })
        .collect();
    Some(statuses)
}
