//! PATCH bodies: JSON merge patch (RFC 7386: lists replaced whole) and strategic merge
//! patch for the fields holdfast touches (lists merged by their Kubernetes patch merge
//! key, `$setElementOrder/<list>`, `$patch: delete|replace`, `$deleteFromPrimitiveList`).

use serde_json::{Map, Value};

/// RFC 7386.
pub fn merge_patch(target: &mut Value, patch: &Value) {
    let Value::Object(p) = patch else {
        *target = patch.clone();
        return;
    };
    if !target.is_object() {
        *target = Value::Object(Map::new());
    }
    let Value::Object(t) = target else { return };
    for (k, v) in p {
        if v.is_null() {
            t.remove(k);
        } else {
            merge_patch(t.entry(k.clone()).or_insert(Value::Null), v);
        }
    }
}

/// The patch merge key of a list field, from the Kubernetes API types.
fn merge_key(field: &str) -> Option<&'static str> {
    Some(match field {
        "conditions" | "addresses" => "type",
        "containerStatuses"
        | "initContainerStatuses"
        | "ephemeralContainerStatuses"
        | "containers"
        | "initContainers"
        | "ephemeralContainers"
        | "volumes"
        | "env"
        | "imagePullSecrets"
        | "resourceClaimStatuses"
        | "resourceClaims" => "name",
        "volumeMounts" => "mountPath",
        "podIPs" | "hostIPs" => "ip",
        "ownerReferences" => "uid",
        "ports" => "containerPort",
        _ => return None,
    })
}

/// Lists of scalars merged as sets.
fn primitive_merge(field: &str) -> bool {
    field == "finalizers"
}

/// Drops `$`-directives from a value that is being inserted whole.
fn strip(v: &Value) -> Value {
    match v {
        Value::Object(m) => Value::Object(
            m.iter()
                .filter(|(k, _)| !k.starts_with('$'))
                .map(|(k, v)| (k.clone(), strip(v)))
                .collect(),
        ),
        Value::Array(a) => Value::Array(a.iter().map(strip).collect()),
        other => other.clone(),
    }
}

fn same_key(a: &Value, b: &Value, key: &str) -> bool {
    !a[key].is_null() && a[key] == b[key]
}

/// Whether a patch list holds the `{"$patch": "replace"}` element: the list is replaced
/// by the patch's other elements.
fn replaces(patch: &[Value]) -> bool {
    patch
        .iter()
        .any(|p| p["$patch"].as_str() == Some("replace"))
}

fn directive_free(patch: &[Value]) -> Vec<Value> {
    patch
        .iter()
        .filter(|i| !matches!(i["$patch"].as_str(), Some("delete" | "replace")))
        .map(strip)
        .collect()
}

fn merge_list(orig: &mut Vec<Value>, patch: &[Value], key: &str) {
    if replaces(patch) {
        *orig = directive_free(patch);
        return;
    }
    for p in patch {
        let delete = p["$patch"].as_str() == Some("delete");
        let pos = orig.iter().position(|o| same_key(o, p, key));
        match (pos, delete) {
            (Some(i), true) => {
                orig.remove(i);
            }
            (None, true) => {}
            (Some(i), false) => strategic_merge(&mut orig[i], p),
            (None, false) => orig.push(strip(p)),
        }
    }
}

fn set_order(list: &mut Vec<Value>, order: &[Value], key: &str) {
    let mut rest = std::mem::take(list);
    for o in order {
        if let Some(i) = rest.iter().position(|v| same_key(v, o, key)) {
            list.push(rest.remove(i));
        }
    }
    list.extend(rest);
}

/// Applies a strategic merge patch to `target`.
pub fn strategic_merge(target: &mut Value, patch: &Value) {
    let Value::Object(p) = patch else {
        *target = strip(patch);
        return;
    };
    if p.get("$patch").and_then(Value::as_str) == Some("replace") || !target.is_object() {
        *target = strip(patch);
        return;
    }
    let Value::Object(t) = target else { return };
    let mut orders = Vec::new();
    for (k, v) in p {
        if let Some(field) = k.strip_prefix("$setElementOrder/") {
            orders.push((field.to_string(), v.clone()));
            continue;
        }
        if let Some(field) = k.strip_prefix("$deleteFromPrimitiveList/") {
            if let (Some(Value::Array(list)), Value::Array(del)) = (t.get_mut(field), v) {
                list.retain(|x| !del.contains(x));
            }
            continue;
        }
        if k.starts_with('$') {
            continue;
        }
        if v.is_null() {
            t.remove(k);
            continue;
        }
        let cur = t.entry(k.clone()).or_insert(Value::Null);
        match (merge_key(k), cur, v) {
            (Some(key), Value::Array(orig), Value::Array(items)) => merge_list(orig, items, key),
            (None, Value::Array(orig), Value::Array(items)) if primitive_merge(k) => {
                for i in items {
                    if !orig.contains(i) {
                        orig.push(i.clone());
                    }
                }
            }
            (_, cur @ Value::Object(_), Value::Object(_)) => strategic_merge(cur, v),
            (_, cur, _) => {
                *cur = match v {
                    Value::Array(items) => Value::Array(directive_free(items)),
                    other => strip(other),
                }
            }
        }
    }
    for (field, order) in orders {
        if let (Some(key), Some(Value::Array(list)), Value::Array(order)) =
            (merge_key(&field), t.get_mut(&field), &order)
        {
            set_order(list, order, key);
        }
    }
}

/// How a PATCH body is to be read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Strategic,
    Merge,
}

impl Kind {
    pub fn from_content_type(ct: &str) -> Option<Kind> {
        match ct.split(';').next().unwrap_or("").trim() {
            "application/strategic-merge-patch+json" => Some(Kind::Strategic),
            "application/merge-patch+json" => Some(Kind::Merge),
            _ => None,
        }
    }

    pub fn apply(self, target: &mut Value, patch: &Value) {
        match self {
            Kind::Strategic => strategic_merge(target, patch),
            Kind::Merge => merge_patch(target, patch),
        }
    }
}
