//! The body of `PATCH nodes/<name>/status` (strategic merge patch) as the kubelet
//! builds it: a two-way diff of the old and new status in which conditions merge by
//! `type` with a `$setElementOrder/conditions` list, removed fields become `null`, and
//! addresses are replaced whole (their `type` merge key is wrong: a node can have two
//! addresses of one type), as the kubelet's own node-status patch helper does. Only
//! what changed is sent: a heartbeat is just the condition times.

use k8s_openapi::api::core::v1::NodeStatus;
use serde_json::{json, Map, Value};

/// The strategic-merge-patch body that turns `old` into `new`; `{}` if nothing changed.
/// Without `old` (a node just created, or one never read) the whole status is sent.
pub fn status_patch(old: Option<&NodeStatus>, new: &NodeStatus) -> Value {
    let old = old.map(as_object).unwrap_or_default();
    let diff = diff_status(&old, &as_object(new));
    if diff.is_empty() {
        Value::Object(Map::new())
    } else {
        json!({ "status": diff })
    }
}

/// Whether `new` says anything `old` did not, heartbeat times aside: the caller sends
/// a status when this is true, and otherwise only every nodeStatusReportFrequency
/// (the lease is what says the node is alive).
pub fn needs_report(old: Option<&NodeStatus>, new: &NodeStatus) -> bool {
    let Some(old) = old else {
        return true;
    };
    without_heartbeats(old) != without_heartbeats(new)
}

fn without_heartbeats(status: &NodeStatus) -> NodeStatus {
    let mut s = status.clone();
    for c in s.conditions.iter_mut().flatten() {
        c.last_heartbeat_time = None;
    }
    s
}

/// A NodeStatus as a JSON object. Serialising these types into a `Value` cannot fail
/// (every Time is a valid timestamp); an empty object stands in if it ever did, which
/// makes the patch carry everything rather than nothing.
fn as_object(status: &NodeStatus) -> Map<String, Value> {
    match serde_json::to_value(status) {
        Ok(Value::Object(m)) => m,
        _ => Map::new(),
    }
}

fn diff_status(old: &Map<String, Value>, new: &Map<String, Value>) -> Map<String, Value> {
    let mut patch = Map::new();
    for (key, new_value) in new {
        let Some(old_value) = old.get(key) else {
            patch.insert(key.clone(), new_value.clone());
            continue;
        };
        if old_value == new_value {
            continue;
        }
        match (key.as_str(), old_value, new_value) {
            ("conditions", Value::Array(o), Value::Array(n)) => {
                keyed_list(key, o, n, "type", &mut patch);
            }
            ("addresses", Value::Array(o), Value::Array(n)) if o.is_empty() => {
                keyed_list(key, o, n, "type", &mut patch);
            }
            ("addresses", Value::Array(_), Value::Array(n)) => {
                patch.insert(key.clone(), replace_list(n));
            }
            _ => diff_value(key, old_value, new_value, &mut patch),
        }
    }
    for (key, old_value) in old {
        if !new.contains_key(key) {
            let gone = match (key.as_str(), old_value) {
                ("addresses", Value::Array(o)) if !o.is_empty() => replace_list(&[]),
                _ => Value::Null,
            };
            patch.insert(key.clone(), gone);
        }
    }
    patch
}

/// Nested objects diff field by field; anything else is replaced whole (lists inside
/// a status other than conditions and addresses are atomic).
fn diff_value(key: &str, old: &Value, new: &Value, patch: &mut Map<String, Value>) {
    match (old, new) {
        (Value::Object(o), Value::Object(n)) => {
            let d = diff_objects(o, n);
            if !d.is_empty() {
                patch.insert(key.to_string(), Value::Object(d));
            }
        }
        _ => {
            patch.insert(key.to_string(), new.clone());
        }
    }
}

fn diff_objects(old: &Map<String, Value>, new: &Map<String, Value>) -> Map<String, Value> {
    let mut patch = Map::new();
    for (key, new_value) in new {
        match old.get(key) {
            None => {
                patch.insert(key.clone(), new_value.clone());
            }
            Some(old_value) if old_value != new_value => {
                diff_value(key, old_value, new_value, &mut patch);
            }
            Some(_) => {}
        }
    }
    for key in old.keys() {
        if !new.contains_key(key) {
            patch.insert(key.clone(), Value::Null);
        }
    }
    patch
}

/// A list merged by `merge_key`: changed and new elements (changed ones as their diff
/// plus the key) in the new order, then `$patch: delete` for the removed ones, and the
/// new order in `$setElementOrder/<key>` when anything changed or moved.
fn keyed_list(
    key: &str,
    old: &[Value],
    new: &[Value],
    merge_key: &str,
    patch: &mut Map<String, Value>,
) {
    let id = |v: &Value| v.as_object().and_then(|o| o.get(merge_key)).cloned();
    if old.iter().chain(new).any(|v| id(v).is_none()) {
        // Not a keyed list after all: replace it.
        patch.insert(key.to_string(), Value::Array(new.to_vec()));
        return;
    }
    let mut changes = Vec::new();
    for n in new {
        let n_id = id(n);
        match old.iter().find(|o| id(o) == n_id) {
            None => changes.push(n.clone()),
            Some(o) => {
                if let (Some(o), Some(nm)) = (o.as_object(), n.as_object()) {
                    let mut d = diff_objects(o, nm);
                    if !d.is_empty() {
                        d.insert(merge_key.to_string(), n_id.unwrap_or(Value::Null));
                        changes.push(Value::Object(d));
                    }
                }
            }
        }
    }
    for o in old {
        let o_id = id(o);
        if !new.iter().any(|n| id(n) == o_id) {
            let mut gone = Map::new();
            gone.insert("$patch".into(), Value::from("delete"));
            gone.insert(merge_key.to_string(), o_id.unwrap_or(Value::Null));
            changes.push(Value::Object(gone));
        }
    }
    let same_order = old.len() == new.len() && old.iter().zip(new).all(|(o, n)| id(o) == id(n));
    if changes.is_empty() && same_order {
        return;
    }
    let order: Vec<Value> = new
        .iter()
        .map(|n| {
            let mut m = Map::new();
            m.insert(merge_key.to_string(), id(n).unwrap_or(Value::Null));
            Value::Object(m)
        })
        .collect();
    patch.insert(format!("$setElementOrder/{key}"), Value::Array(order));
    if !changes.is_empty() {
        patch.insert(key.to_string(), Value::Array(changes));
    }
}

/// The whole list followed by the directive that makes it replace the stored one.
fn replace_list(new: &[Value]) -> Value {
    let mut list = new.to_vec();
    list.push(json!({ "$patch": "replace" }));
    Value::Array(list)
}

#[cfg(test)]
mod tests {
    use super::super::fixtures;
    use super::*;

    fn status(json: &str) -> NodeStatus {
        serde_json::from_str(json).expect("status")
    }

    #[test]
    fn heartbeat_is_only_the_times() {
        // Fixture 08 as created, then 11's heartbeat a second later.
        let old = status(fixtures::STATUS_08);
        let mut new = old.clone();
        let t: crate::time::Timestamp = "2026-11-22T07:30:41Z".parse().expect("ts");
        for c in new.conditions.iter_mut().flatten() {
            c.last_heartbeat_time = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(t));
        }
        let want: Value = serde_json::from_str(fixtures::PATCH_11).expect("fixture");
        assert_eq!(status_patch(Some(&old), &new), want);
        assert!(!needs_report(Some(&old), &new));
    }

    #[test]
    fn restoring_conditions_sends_them_whole() {
        // Fixture 12 left only a NotReady condition; 13 restores all four.
        let old = status(fixtures::STATUS_12);
        let new = status(fixtures::STATUS_13);
        let want: Value = serde_json::from_str(fixtures::PATCH_13).expect("fixture");
        assert_eq!(status_patch(Some(&old), &new), want);
        assert!(needs_report(Some(&old), &new));
    }

    #[test]
    fn nothing_changed_is_an_empty_patch() {
        let s = status(fixtures::STATUS_08);
        assert_eq!(status_patch(Some(&s), &s), json!({}));
        assert!(!needs_report(Some(&s), &s));
        assert!(needs_report(None, &s));
    }

    #[test]
    fn without_old_everything_goes() {
        let s = status(fixtures::STATUS_08);
        let patch = status_patch(None, &s);
        assert_eq!(patch["status"], serde_json::to_value(&s).expect("json"));
        assert!(patch["status"].get("$setElementOrder/conditions").is_none());
    }

    #[test]
    fn maps_and_objects_diff_by_field() {
        let old = status(fixtures::STATUS_08);
        let mut new = old.clone();
        let cap = new.capacity.as_mut().expect("capacity");
        cap.insert(
            "cpu".into(),
            k8s_openapi::apimachinery::pkg::api::resource::Quantity("2".into()),
        );
        cap.remove("hugepages-2Mi");
        if let Some(info) = new.node_info.as_mut() {
            info.boot_id = "new-boot".into();
        }
        let patch = status_patch(Some(&old), &new);
        assert_eq!(
            patch,
            json!({"status": {
                "capacity": {"cpu": "2", "hugepages-2Mi": null},
                "nodeInfo": {"bootID": "new-boot"},
            }})
        );
        assert!(needs_report(Some(&old), &new));
    }

    #[test]
    fn addresses_are_replaced_whole() {
        let old = status(fixtures::STATUS_08);
        let mut new = old.clone();
        if let Some(a) = new.addresses.as_mut() {
            a[0].address = "192.168.50.11".into();
        }
        let patch = status_patch(Some(&old), &new);
        assert_eq!(
            patch,
            json!({"status": {"addresses": [
                {"type": "InternalIP", "address": "192.168.50.11"},
                {"type": "Hostname", "address": "edge-node-1"},
                {"$patch": "replace"},
            ]}})
        );
        // From none, they merge in like any keyed list.
        let mut bare = old.clone();
        bare.addresses = Some(Vec::new());
        let patch = status_patch(Some(&bare), &old);
        assert_eq!(
            patch["status"]["$setElementOrder/addresses"],
            json!([{"type": "InternalIP"}, {"type": "Hostname"}])
        );
    }

    #[test]
    fn removed_and_reordered_conditions() {
        let old = status(fixtures::STATUS_08);
        let mut new = old.clone();
        if let Some(c) = new.conditions.as_mut() {
            c.remove(2); // PIDPressure
            c.swap(0, 1);
        }
        let patch = status_patch(Some(&old), &new);
        assert_eq!(
            patch,
            json!({"status": {
                "$setElementOrder/conditions":
                    [{"type": "DiskPressure"}, {"type": "MemoryPressure"}, {"type": "Ready"}],
                "conditions": [{"$patch": "delete", "type": "PIDPressure"}],
            }})
        );
        // Only the order changed.
        let mut moved = old.clone();
        if let Some(c) = moved.conditions.as_mut() {
            c.swap(0, 3);
        }
        let patch = status_patch(Some(&old), &moved);
        assert!(patch["status"].get("conditions").is_none());
        assert_eq!(
            patch["status"]["$setElementOrder/conditions"][0],
            json!({"type": "Ready"})
        );
    }
}
