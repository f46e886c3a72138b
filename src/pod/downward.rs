//! pod::downward: the downward API's references into a pod, as the kubelet resolves
//! them for both an env var's `valueFrom` and a `downwardAPI` volume's files: `fieldRef`
//! (metadata, node and addresses) and `resourceFieldRef` (a container's requests and
//! limits, an unset limit being the node's allocatable). Pure: what is not in the pod
//! comes in [`DownwardInputs`].

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Container, ObjectFieldSelector, Pod, ResourceFieldSelector};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

use crate::quantity;

/// What the downward API reads besides the pod: where it runs.
#[derive(Clone, Copy)]
pub struct DownwardInputs<'a> {
    /// The node's name, for `spec.nodeName` of a pod that does not carry it.
    pub node_name: &'a str,
    /// The node's address: `status.hostIP`, and `status.podIP` of a host-network pod.
    pub host_ip: Option<&'a str>,
    /// The pod's own addresses (IPv4 first), empty for a host-network pod.
    pub pod_ips: &'a [String],
    /// The node's allocatable resources: the limit `resourceFieldRef` reports for a
    /// container that sets none, as the kubelet does.
    pub allocatable: &'a BTreeMap<String, Quantity>,
}

/// A reference the kubelet does not support, or one that cannot be read; the message is
/// the kubelet's.
#[derive(Debug, thiserror::Error)]
pub enum DownwardError {
    /// A `fieldRef` the kubelet does not support, or with a bad subscript.
    #[error("{0}")]
    FieldRef(String),
    /// A `resourceFieldRef` the kubelet does not support, or with a bad quantity.
    #[error("{0}")]
    ResourceFieldRef(String),
}

/// `valueFrom.fieldRef`: the kubelet's `podFieldSelectorRuntimeValue`. Also the
/// downward API volume's `fieldRef`.
pub fn field_ref(
    pod: &Pod,
    sel: &ObjectFieldSelector,
    inputs: &DownwardInputs<'_>,
) -> Result<String, DownwardError> {
    let version = sel.api_version.as_deref().unwrap_or("");
    if !version.is_empty() && version != "v1" {
        return Err(DownwardError::FieldRef(format!(
            "unsupported pod version: {version}"
        )));
    }
    let path = sel.field_path.as_str();
    let meta = &pod.metadata;
    if let Some((field, key)) = subscripted(path) {
        let map = match field {
            "metadata.annotations" => &meta.annotations,
            "metadata.labels" => &meta.labels,
            _ => {
                return Err(DownwardError::FieldRef(format!(
                    "field label does not support subscript: {path}"
                )))
            }
        };
        let checked = if field == "metadata.annotations" {
            key.to_ascii_lowercase()
        } else {
            key.to_string()
        };
        if !is_qualified_name(&checked) {
            return Err(DownwardError::FieldRef(format!(
                "invalid key subscript in {path}: not a qualified name"
            )));
        }
        return Ok(map
            .as_ref()
            .and_then(|m| m.get(key))
            .cloned()
            .unwrap_or_default());
    }
    let spec = pod.spec.as_ref();
    let ip = inputs.host_ip.unwrap_or("").to_string();
    let pod_ips = if inputs.pod_ips.is_empty() {
        vec![ip.clone()]
    } else {
        inputs.pod_ips.to_vec()
    };
    Ok(match path {
        "metadata.name" => meta.name.clone().unwrap_or_default(),
        "metadata.namespace" => namespace(pod),
        "metadata.uid" => meta.uid.clone().unwrap_or_default(),
        "metadata.labels" => format_map(meta.labels.as_ref()),
        "metadata.annotations" => format_map(meta.annotations.as_ref()),
        "spec.nodeName" | "spec.host" => spec
            .and_then(|s| s.node_name.clone())
            .filter(|n| !n.is_empty())
            .unwrap_or_else(|| inputs.node_name.to_string()),
        "spec.serviceAccountName" => spec
            .and_then(|s| s.service_account_name.clone())
            .unwrap_or_default(),
        "status.hostIP" | "status.hostIPs" => ip,
        // A host-network pod's address is the node's.
        "status.podIP" => pod_ips.first().cloned().unwrap_or_default(),
        "status.podIPs" => pod_ips.join(","),
        "spec.restartPolicy" | "spec.schedulerName" | "status.phase" => {
            return Err(DownwardError::FieldRef(format!(
                "unsupported fieldPath: {path}"
            )))
        }
        _ => {
            return Err(DownwardError::FieldRef(format!(
                "field label not supported: {path}"
            )))
        }
    })
}

/// `metadata.labels['key']` as `("metadata.labels", "key")`.
fn subscripted(path: &str) -> Option<(&str, &str)> {
    let inner = path.strip_suffix("']")?;
    let (field, key) = inner.split_once("['")?;
    Some((field, key))
}

/// Labels or annotations as the downward API prints a whole map: `k="v"` lines in key
/// order, values quoted as Go's `%q` does.
fn format_map(map: Option<&BTreeMap<String, String>>) -> String {
    let lines: Vec<String> = map
        .into_iter()
        .flatten()
        .map(|(k, v)| format!("{k}={}", go_quote(v)))
        .collect();
    lines.join("\n")
}

fn go_quote(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\t' => out.push_str("\\t"),
            '\r' => out.push_str("\\r"),
            c if (c as u32) < 0x20 || c as u32 == 0x7f => {
                out.push_str(&format!("\\x{:02x}", c as u32))
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// Kubernetes' `IsQualifiedName`: `[prefix/]name`, the name at most 63 alphanumerics,
/// `-`, `_` and `.` that starts and ends alphanumeric, the prefix a DNS subdomain.
fn is_qualified_name(s: &str) -> bool {
    let (prefix, name) = match s.split_once('/') {
        Some((p, n)) => (Some(p), n),
        None => (None, s),
    };
    let name_ok = !name.is_empty()
        && name.len() <= 63
        && name.starts_with(|c: char| c.is_ascii_alphanumeric())
        && name.ends_with(|c: char| c.is_ascii_alphanumeric())
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'));
    let prefix_ok = prefix.is_none_or(|p| {
        !p.is_empty()
            && p.len() <= 253
            && p.split('.').all(|label| {
                !label.is_empty()
                    && label.len() <= 63
                    && label.starts_with(|c: char| c.is_ascii_lowercase() || c.is_ascii_digit())
                    && label.ends_with(|c: char| c.is_ascii_lowercase() || c.is_ascii_digit())
                    && label
                        .chars()
                        .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
            })
    });
    name_ok && prefix_ok
}

/// `valueFrom.resourceFieldRef`: the kubelet's `containerResourceRuntimeValue` on the
/// pod as `defaultPodLimitsForDownwardAPI` leaves it (an unset limit is the node's
/// allocatable amount), with requests defaulted to limits as the API does. Also the
/// downward API volume's `resourceFieldRef`.
pub fn resource_field_ref(
    pod: &Pod,
    container: &Container,
    sel: &ResourceFieldSelector,
    allocatable: &BTreeMap<String, Quantity>,
) -> Result<String, DownwardError> {
    let target = match sel.container_name.as_deref() {
        None | Some("") => container,
        Some(name) => pod
            .spec
            .iter()
            .flat_map(|s| {
                s.containers
                    .iter()
                    .chain(s.init_containers.iter().flatten())
            })
            .find(|c| c.name == name)
            .ok_or_else(|| {
                DownwardError::ResourceFieldRef(format!("container {name} not found"))
            })?,
    };
    let (kind, resource) = sel
        .resource
        .split_once('.')
        .filter(|(k, _)| *k == "limits" || *k == "requests")
        .ok_or_else(|| unsupported(&sel.resource))?;
    let cpu = match resource {
        "cpu" => true,
        "memory" | "ephemeral-storage" => false,
        _ => return Err(unsupported(&sel.resource)),
    };
    let resources = target.resources.as_ref();
    let limit = resources
        .and_then(|r| r.limits.as_ref())
        .and_then(|m| m.get(resource));
    let request = resources
        .and_then(|r| r.requests.as_ref())
        .and_then(|m| m.get(resource));
    let amount = if kind == "limits" {
        limit.or_else(|| allocatable.get(resource))
    } else {
        request.or(limit)
    };
    let parse = |q: &str| {
        if cpu {
            quantity::parse_millicpu(q)
        } else {
            quantity::parse_bytes(q)
        }
    };
    let value = match amount {
        Some(q) => parse(&q.0).map_err(|e| {
            DownwardError::ResourceFieldRef(format!(
                "{} of container {}: {e}",
                sel.resource, target.name
            ))
        })?,
        None => 0,
    };
    // A divisor of zero (or none) is 1; CPU divides in millicores.
    let one = if cpu { 1000 } else { 1 };
    let divisor = match sel.divisor.as_ref().filter(|d| !d.0.is_empty()) {
        Some(d) => parse(&d.0).map_err(|e| {
            DownwardError::ResourceFieldRef(format!("divisor of {}: {e}", sel.resource))
        })?,
        None => one,
    };
    let divisor = if divisor == 0 { one } else { divisor };
    Ok(value.div_ceil(divisor).to_string())
}

fn unsupported(resource: &str) -> DownwardError {
    DownwardError::ResourceFieldRef(format!("unsupported container resource : {resource}"))
}

/// The pod's namespace, `default` when it names none.
pub fn namespace(pod: &Pod) -> String {
    match pod.metadata.namespace.as_deref() {
        None | Some("") => "default".to_string(),
        Some(ns) => ns.to_string(),
    }
}
