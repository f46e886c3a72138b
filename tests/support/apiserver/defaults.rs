//! What the server adds on create (README semantics 9) and the little validation the
//! fixtures show (`55`): pod defaults and QoS class, the node's not-ready taint, secret
//! `stringData`, the events.k8s.io deprecated fields.

use serde_json::{json, Map, Value};

use super::status::Cause;

fn set_default(o: &mut Value, k: &str, v: Value) {
    if let Value::Object(m) = o {
        m.entry(k.to_string()).or_insert(v);
    }
}

fn containers_mut(spec: &mut Value) -> impl Iterator<Item = &mut Value> {
    let mut out = Vec::new();
    if let Value::Object(m) = spec {
        for (k, v) in m.iter_mut() {
            if matches!(
                k.as_str(),
                "containers" | "initContainers" | "ephemeralContainers"
            ) {
                if let Value::Array(a) = v {
                    out.extend(a.iter_mut());
                }
            }
        }
    }
    out.into_iter()
}

fn pull_policy(image: &str) -> &'static str {
    let last = image.rsplit('/').next().unwrap_or(image);
    let tagged = last.contains(':') && !image.contains('@');
    if image.contains('@') || (tagged && !last.ends_with(":latest")) {
        "IfNotPresent"
    } else {
        "Always"
    }
}

fn has_noexecute_toleration(tols: &[Value], key: &str) -> bool {
    tols.iter().any(|t| {
        let effect = t["effect"].as_str().unwrap_or("");
        let k = t["key"].as_str().unwrap_or("");
        let op = t["operator"].as_str().unwrap_or("Equal");
        (effect.is_empty() || effect == "NoExecute")
            && (k == key || (k.is_empty() && op == "Exists"))
    })
}

/// The QoS class from container resources.
pub fn qos_class(spec: &Value) -> &'static str {
    let mut any = false;
    let mut guaranteed = true;
    let containers: Vec<&Value> = ["containers", "initContainers"]
        .iter()
        .filter_map(|k| spec[*k].as_array())
        .flatten()
        .collect();
    for c in &containers {
        let r = &c["resources"];
        for res in ["cpu", "memory"] {
            let limit = r["limits"][res].as_str();
            let request = r["requests"][res].as_str().or(limit);
            if limit.is_some() || request.is_some() {
                any = true;
            }
            if limit.is_none() || request != limit {
                guaranteed = false;
            }
        }
    }
    if !any {
        "BestEffort"
    } else if guaranteed {
        "Guaranteed"
    } else {
        "Burstable"
    }
}

/// Pod defaults and the create-time status.
pub fn pod(o: &mut Value) {
    let spec = &mut o["spec"];
    if !spec.is_object() {
        *spec = json!({});
    }
    for c in containers_mut(spec) {
        let image = c["image"].as_str().unwrap_or("").to_string();
        set_default(c, "resources", json!({}));
        set_default(c, "terminationMessagePath", json!("/dev/termination-log"));
        set_default(c, "terminationMessagePolicy", json!("File"));
        set_default(c, "imagePullPolicy", json!(pull_policy(&image)));
        if let Some(ports) = c.get_mut("ports").and_then(Value::as_array_mut) {
            for p in ports {
                set_default(p, "protocol", json!("TCP"));
            }
        }
    }
    set_default(spec, "restartPolicy", json!("Always"));
    set_default(spec, "terminationGracePeriodSeconds", json!(30));
    set_default(spec, "dnsPolicy", json!("ClusterFirst"));
    if let Some(sa) = spec["serviceAccountName"].as_str().map(str::to_string) {
        set_default(spec, "serviceAccount", json!(sa));
    }
    set_default(spec, "securityContext", json!({}));
    set_default(spec, "schedulerName", json!("default-scheduler"));
    let mut tols = spec["tolerations"].as_array().cloned().unwrap_or_default();
    for key in [
        "node.kubernetes.io/not-ready",
        "node.kubernetes.io/unreachable",
    ] {
        if !has_noexecute_toleration(&tols, key) {
            tols.push(json!({"key": key, "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 300}));
        }
    }
    spec["tolerations"] = Value::Array(tols);
    set_default(spec, "priority", json!(0));
    set_default(spec, "enableServiceLinks", json!(true));
    set_default(spec, "preemptionPolicy", json!("PreemptLowerPriority"));
    if let Some(vols) = spec.get_mut("volumes").and_then(Value::as_array_mut) {
        for v in vols {
            for src in ["secret", "configMap", "projected", "downwardAPI"] {
                if v[src].is_object() {
                    set_default(&mut v[src], "defaultMode", json!(420));
                }
            }
            if v["hostPath"].is_object() {
                set_default(&mut v["hostPath"], "type", json!(""));
            }
        }
    }
    let qos = qos_class(&o["spec"]);
    o["status"] = json!({"phase": "Pending", "qosClass": qos});
}

fn is_dns1123_subdomain(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 253
        && s.split('.').all(|l| {
            !l.is_empty()
                && l.bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
                && !l.starts_with('-')
                && !l.ends_with('-')
        })
}

const DNS1123_MSG: &str = "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character (e.g. 'example.com', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')";

fn invalid_value(field: &str, value: &str, detail: &str) -> Cause {
    Cause {
        reason: "FieldValueInvalid",
        message: format!("Invalid value: {}: {detail}", json!(value)),
        field: field.to_string(),
    }
}

fn required(field: &str) -> Cause {
    Cause {
        reason: "FieldValueRequired",
        message: "Required value".into(),
        field: field.to_string(),
    }
}

/// Name validation for any object.
pub fn validate_name(o: &Value) -> Vec<Cause> {
    let name = o["metadata"]["name"].as_str().unwrap_or("");
    if name.is_empty() {
        vec![required("metadata.name")]
    } else if !is_dns1123_subdomain(name) {
        vec![invalid_value("metadata.name", name, DNS1123_MSG)]
    } else {
        Vec::new()
    }
}

/// The pod checks the fixtures show: name, containers, container name and image.
pub fn validate_pod(o: &Value) -> Vec<Cause> {
    let mut causes = validate_name(o);
    match o["spec"]["containers"].as_array() {
        Some(cs) if !cs.is_empty() => {
            for (i, c) in cs.iter().enumerate() {
                if c["name"].as_str().unwrap_or("").is_empty() {
                    causes.push(required(&format!("spec.containers[{i}].name")));
                }
                if c["image"].as_str().unwrap_or("").is_empty() {
                    causes.push(required(&format!("spec.containers[{i}].image")));
                }
            }
        }
        _ => causes.push(required("spec.containers")),
    }
    causes
}

/// The immutable-uid error of an update (`52`).
pub fn uid_changed(new_uid: &str) -> Cause {
    invalid_value("metadata.uid", new_uid, "field is immutable")
}

/// The NodeTaint admission taint and the kube-proxy version field.
pub fn node(o: &mut Value) {
    if !o["spec"].is_object() {
        o["spec"] = json!({});
    }
    let mut taints = o["spec"]["taints"].as_array().cloned().unwrap_or_default();
    if !taints
        .iter()
        .any(|t| t["key"] == "node.kubernetes.io/not-ready" && t["effect"] == "NoSchedule")
    {
        taints.push(json!({"key": "node.kubernetes.io/not-ready", "effect": "NoSchedule"}));
    }
    o["spec"]["taints"] = Value::Array(taints);
    if o["status"]["nodeInfo"].is_object() {
        set_default(&mut o["status"]["nodeInfo"], "kubeProxyVersion", json!(""));
    }
}

/// `stringData` folded into base64 `data`; `type` defaults to Opaque.
pub fn secret(o: &mut Value) {
    if let Some(Value::Object(sd)) = o.as_object_mut().and_then(|m| m.remove("stringData")) {
        if !o["data"].is_object() {
            o["data"] = Value::Object(Map::new());
        }
        for (k, v) in sd {
            let b = super::http::base64(v.as_str().unwrap_or("").as_bytes());
            o["data"][k] = json!(b);
        }
    }
    set_default(o, "type", json!("Opaque"));
}

/// events.k8s.io/v1 fills in the deprecated core fields.
pub fn event_v1(o: &mut Value) {
    set_default(o, "deprecatedSource", json!({}));
    set_default(o, "deprecatedFirstTimestamp", Value::Null);
    set_default(o, "deprecatedLastTimestamp", Value::Null);
}
