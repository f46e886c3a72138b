//! Authorization as the recorded server does it (`--authorization-mode=Node,RBAC` with
//! no RBAC bindings beyond `system:masters`): the Node authorizer for `system:node:*`,
//! everything for admins, nothing for anyone else. Then NodeRestriction admission, which
//! limits what a node may write (`admit_*`, run by the handlers with the objects).

use serde_json::Value;

use super::auth::User;
use super::status::{forbidden, forbidden_authz, ApiErr};
use super::store::{Op, Requirement, Res, State};

/// What a request is about, as the authorizers see it.
#[derive(Debug, Clone)]
pub struct Attrs<'a> {
    pub res: Res,
    pub namespace: &'a str,
    /// The object name; for list/watch, from a `metadata.name=` field selector.
    pub name: &'a str,
    pub subresource: &'a str,
    pub verb: &'a str,
    pub fields: &'a [Requirement],
}

const NODE_LEASE_NS: &str = "kube-node-lease";

/// Names of the ConfigMaps (`secrets == false`) or Secrets a pod references.
pub fn pod_references(pod: &Value, secrets: bool) -> Vec<String> {
    let mut out = Vec::new();
    let spec = &pod["spec"];
    let mut push = |v: &Value| {
        if let Some(n) = v.as_str() {
            out.push(n.to_string());
        }
    };
    for v in spec["volumes"].as_array().into_iter().flatten() {
        if secrets {
            push(&v["secret"]["secretName"]);
        } else {
            push(&v["configMap"]["name"]);
        }
        for s in v["projected"]["sources"].as_array().into_iter().flatten() {
            push(&s[if secrets { "secret" } else { "configMap" }]["name"]);
        }
    }
    for list in ["containers", "initContainers", "ephemeralContainers"] {
        for c in spec[list].as_array().into_iter().flatten() {
            for e in c["env"].as_array().into_iter().flatten() {
                let r = if secrets {
                    "secretKeyRef"
                } else {
                    "configMapKeyRef"
                };
                push(&e["valueFrom"][r]["name"]);
            }
            for e in c["envFrom"].as_array().into_iter().flatten() {
                push(&e[if secrets { "secretRef" } else { "configMapRef" }]["name"]);
            }
        }
    }
    if secrets {
        for s in spec["imagePullSecrets"].as_array().into_iter().flatten() {
            push(&s["name"]);
        }
    }
    out
}

fn bound_to(pod: &Value, node: &str) -> bool {
    pod["spec"]["nodeName"].as_str() == Some(node)
}

/// Whether the Node authorizer's graph has a path from the object to `node`.
fn related(state: &State, node: &str, res: Res, ns: &str, name: &str) -> bool {
    match res {
        Res::Pods => state
            .get(Res::Pods, ns, name)
            .is_some_and(|p| bound_to(p, node)),
        Res::ConfigMaps | Res::Secrets => state.current(Res::Pods).iter().any(|(_, p)| {
            bound_to(p, node)
                && p["metadata"]["namespace"].as_str() == Some(ns)
                && pod_references(p, res == Res::Secrets)
                    .iter()
                    .any(|r| r == name)
        }),
        _ => false,
    }
}

/// The Node authorizer's decision: `Err(reason)` is a denial ("" when it has no words).
fn node_decision(state: &State, node: &str, a: &Attrs) -> Result<(), String> {
    let no_rel = || format!("no relationship found between node '{node}' and this object");
    match (a.res, a.subresource) {
        (Res::Pods, "") => match a.verb {
            "get" if related(state, node, Res::Pods, a.namespace, a.name) => Ok(()),
            "get" => Err(no_rel()),
            "list" | "watch" => {
                let scoped = a
                    .fields
                    .iter()
                    .any(|r| r.key == "spec.nodeName" && r.op == Op::Equals && r.value == node);
                if scoped {
                    Ok(())
                } else if !a.name.is_empty() {
                    if related(state, node, Res::Pods, a.namespace, a.name) {
                        Ok(())
                    } else {
                        Err(no_rel())
                    }
                } else {
                    Err("can only list/watch pods with spec.nodeName field selector".into())
                }
            }
            "create" | "delete" => Ok(()),
            _ => Err(String::new()),
        },
        (Res::Pods, "status") if matches!(a.verb, "update" | "patch") => Ok(()),
        (Res::Nodes, "") => match a.verb {
            "create" | "update" | "patch" => Ok(()),
            "get" | "list" | "watch" if a.name == node => Ok(()),
            "get" | "list" | "watch" if a.name.is_empty() => Err(format!(
                "node '{node}' cannot read all nodes, only its own Node object"
            )),
            "get" | "list" | "watch" => Err(format!(
                "node '{node}' cannot read '{}', only its own Node object",
                a.name
            )),
            _ => Err(String::new()),
        },
        (Res::Nodes, "status") if matches!(a.verb, "update" | "patch") => Ok(()),
        (Res::Leases, _) => {
            if !matches!(a.verb, "get" | "create" | "update" | "patch" | "delete") {
                Err("can only get, create, update, patch, or delete a node lease".into())
            } else if a.namespace != NODE_LEASE_NS {
                Err(format!(
                    "can only access leases in the {NODE_LEASE_NS:?} system namespace"
                ))
            } else if a.verb != "create" && a.name != node {
                Err("can only access node lease with the same name as the requesting node".into())
            } else {
                Ok(())
            }
        }
        (Res::ConfigMaps | Res::Secrets, sub) => {
            if !matches!(a.verb, "get" | "list" | "watch") {
                Err("can only read resources of this type".into())
            } else if !sub.is_empty() {
                Err("cannot read subresource".into())
            } else if a.namespace.is_empty() {
                Err("can only read namespaced object of this type".into())
            } else if a.name.is_empty() {
                Err("No Object name found".into())
            } else if related(state, node, a.res, a.namespace, a.name) {
                Ok(())
            } else {
                Err(no_rel())
            }
        }
        // Not the Node authorizer's: RBAC's ClusterRole system:node lets every node read
        // every Service (the kubelet makes containers' environments from them).
        (Res::Services, "") if matches!(a.verb, "get" | "list" | "watch") => Ok(()),
        (Res::Events | Res::EventsV1, "") if matches!(a.verb, "create" | "update" | "patch") => {
            Ok(())
        }
        _ => Err(String::new()),
    }
}

/// Authorizes a resource request.
pub fn authorize(state: &State, user: &User, a: &Attrs) -> Result<(), ApiErr> {
    if user.is_admin() {
        return Ok(());
    }
    let reason = match user.node_name() {
        Some(node) => match node_decision(state, node, a) {
            Ok(()) => return Ok(()),
            Err(r) => r,
        },
        None => String::new(),
    };
    Err(forbidden_authz(
        a.res,
        a.name,
        &user.name,
        a.verb,
        a.subresource,
        a.namespace,
        &reason,
    ))
}

fn kubelet_label(key: &str) -> bool {
    const ALLOWED: [&str; 11] = [
        "kubernetes.io/hostname",
        "topology.kubernetes.io/zone",
        "topology.kubernetes.io/region",
        "failure-domain.beta.kubernetes.io/zone",
        "failure-domain.beta.kubernetes.io/region",
        "beta.kubernetes.io/instance-type",
        "node.kubernetes.io/instance-type",
        "kubernetes.io/os",
        "kubernetes.io/arch",
        "beta.kubernetes.io/os",
        "beta.kubernetes.io/arch",
    ];
    if ALLOWED.contains(&key) {
        return true;
    }
    let ns = key.split_once('/').map_or("", |(n, _)| n);
    ["kubelet.kubernetes.io", "node.kubernetes.io"]
        .iter()
        .any(|a| ns == *a || ns.ends_with(&format!(".{a}")))
}

fn forbidden_labels(new: &Value, old: &Value) -> Vec<String> {
    let empty = serde_json::Map::new();
    let n = new["metadata"]["labels"].as_object().unwrap_or(&empty);
    let o = old["metadata"]["labels"].as_object().unwrap_or(&empty);
    let mut modified: Vec<String> = n
        .iter()
        .filter(|(k, v)| o.get(*k) != Some(*v))
        .chain(o.iter().filter(|(k, v)| n.get(*k) != Some(*v)))
        .map(|(k, _)| k.clone())
        .collect();
    modified.sort();
    modified.dedup();
    modified
        .into_iter()
        .filter(|l| {
            let ns = l.split_once('/').map_or("", |(n, _)| n);
            let restricted = ns == "node-restriction.kubernetes.io"
                || ns.ends_with(".node-restriction.kubernetes.io");
            let k8s = ns == "kubernetes.io"
                || ns.ends_with(".kubernetes.io")
                || ns == "k8s.io"
                || ns.ends_with(".k8s.io");
            restricted || (k8s && !kubelet_label(l))
        })
        .collect()
}

/// NodeRestriction for pod creation: mirror pods bound to, and owned by, the node.
pub fn admit_pod_create(state: &State, node: &str, pod: &Value) -> Result<(), ApiErr> {
    let name = pod["metadata"]["name"].as_str().unwrap_or("");
    let deny = |why: String| Err(forbidden(Res::Pods, name, &why));
    if pod["metadata"]["annotations"]["kubernetes.io/config.mirror"].is_null() {
        return deny(format!(
            "pod does not have \"kubernetes.io/config.mirror\" annotation, node {node:?} can only create mirror pods"
        ));
    }
    if !bound_to(pod, node) {
        return deny(format!(
            "node {node:?} can only create pods with spec.nodeName set to itself"
        ));
    }
    let owners = pod["metadata"]["ownerReferences"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    if owners.len() > 1 {
        return deny(format!(
            "node {node:?} can only create pods with a single owner reference set to itself"
        ));
    }
    let Some(owner) = owners.first() else {
        return deny(format!(
            "node {node:?} can only create pods with an owner reference set to itself"
        ));
    };
    if owner["apiVersion"] != "v1" || owner["kind"] != "Node" || owner["name"] != node {
        return deny(format!(
            "node {node:?} can only create pods with an owner reference set to itself"
        ));
    }
    if owner["controller"] != true {
        return deny(format!(
            "node {node:?} can only create pods with a controller owner reference set to itself"
        ));
    }
    if owner["blockOwnerDeletion"] == true {
        return deny(format!(
            "node {node:?} must not set blockOwnerDeletion on an owner reference"
        ));
    }
    let Some(n) = state.get(Res::Nodes, "", node) else {
        return Err(super::status::not_found(Res::Nodes, node));
    };
    let uid = n["metadata"]["uid"].as_str().unwrap_or("");
    let owner_uid = owner["uid"].as_str().unwrap_or("");
    if owner_uid != uid {
        return deny(format!(
            "node {node} UID mismatch: expected {owner_uid} got {uid}"
        ));
    }
    if !pod["spec"]["serviceAccountName"]
        .as_str()
        .unwrap_or("")
        .is_empty()
    {
        return deny(format!(
            "node {node:?} can not create pods that reference a service account"
        ));
    }
    if !pod_references(pod, true).is_empty() {
        return deny(format!(
            "node {node:?} can not create pods that reference secrets"
        ));
    }
    if !pod_references(pod, false).is_empty() {
        return deny(format!(
            "node {node:?} can not create pods that reference configmaps"
        ));
    }
    Ok(())
}

/// NodeRestriction for pod deletion: only pods bound to the node.
pub fn admit_pod_delete(node: &str, pod: &Value) -> Result<(), ApiErr> {
    if bound_to(pod, node) {
        return Ok(());
    }
    let name = pod["metadata"]["name"].as_str().unwrap_or("");
    Err(forbidden(
        Res::Pods,
        name,
        &format!("node {node:?} can only delete pods with spec.nodeName set to itself"),
    ))
}

/// NodeRestriction for pod status updates (`51`).
pub fn admit_pod_status(node: &str, old: &Value, new: &Value) -> Result<(), ApiErr> {
    let name = old["metadata"]["name"].as_str().unwrap_or("");
    if !bound_to(old, node) {
        return Err(forbidden(
            Res::Pods,
            name,
            &format!(
                "node {node:?} can only update pod status for pods with spec.nodeName set to itself"
            ),
        ));
    }
    if old["metadata"]["labels"] != new["metadata"]["labels"] {
        return Err(forbidden(
            Res::Pods,
            name,
            &format!("node {node:?} cannot update labels through pod status"),
        ));
    }
    Ok(())
}

/// NodeRestriction for Node writes: only its own, no restricted labels, no taints.
pub fn admit_node(node: &str, name: &str, new: &Value, old: Option<&Value>) -> Result<(), ApiErr> {
    if name != node {
        return Err(forbidden(
            Res::Nodes,
            name,
            &format!("node {node:?} is not allowed to modify node {name:?}"),
        ));
    }
    match old {
        None => {
            let bad = forbidden_labels(new, &Value::Null);
            if !bad.is_empty() {
                return Err(forbidden(
                    Res::Nodes,
                    name,
                    &format!(
                        "node {node:?} is not allowed to set the following labels: {}",
                        bad.join(", ")
                    ),
                ));
            }
        }
        Some(old) => {
            if new["spec"]["taints"] != old["spec"]["taints"] {
                return Err(forbidden(
                    Res::Nodes,
                    name,
                    &format!("node {node:?} is not allowed to modify taints"),
                ));
            }
            let bad = forbidden_labels(new, old);
            if !bad.is_empty() {
                return Err(forbidden(
                    Res::Nodes,
                    name,
                    &format!("is not allowed to modify labels: {}", bad.join(", ")),
                ));
            }
        }
    }
    Ok(())
}

/// NodeRestriction for Lease creation: only the node's own.
pub fn admit_lease_create(node: &str, lease: &Value) -> Result<(), ApiErr> {
    let name = lease["metadata"]["name"].as_str().unwrap_or("");
    if name == node {
        return Ok(());
    }
    Err(forbidden(
        Res::Leases,
        "",
        "can only access node lease with the same name as the requesting node",
    ))
}
