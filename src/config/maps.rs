//! The config keys whose values are maps: `systemReserved`, `kubeReserved`,
//! `evictionHard` and `holdfast.nodeLabels`. Each entry is checked when the config is
//! loaded, so a typo stops the agent at start rather than surfacing when the value is
//! first used. The checks are shared with the flags that set the same maps.

use std::collections::BTreeMap;

use serde_yaml::Value;

use super::names::check_dns1123_subdomain;
use super::reader::{short, type_name, Reader};
use super::ConfigError;
use crate::quantity::{parse_bytes, parse_millicpu};

/// Eviction signals the kubelet knows.
const EVICTION_SIGNALS: &[&str] = &[
    "memory.available",
    "allocatableMemory.available",
    "nodefs.available",
    "nodefs.inodesFree",
    "imagefs.available",
    "imagefs.inodesFree",
    "containerfs.available",
    "containerfs.inodesFree",
    "pid.available",
];

/// Labels under kubernetes.io and k8s.io that the apiserver's NodeRestriction admission
/// lets a node set on itself; it refuses the rest, so they are refused here first.
const ALLOWED_K8S_LABELS: &[&str] = &[
    "kubernetes.io/hostname",
    "kubernetes.io/arch",
    "kubernetes.io/os",
    "beta.kubernetes.io/arch",
    "beta.kubernetes.io/os",
    "beta.kubernetes.io/instance-type",
    "node.kubernetes.io/instance-type",
    "failure-domain.beta.kubernetes.io/region",
    "failure-domain.beta.kubernetes.io/zone",
    "topology.kubernetes.io/region",
    "topology.kubernetes.io/zone",
];

/// A `systemReserved` / `kubeReserved` entry.
pub fn check_reserved(resource: &str, quantity: &str) -> Result<(), String> {
    match resource {
        "cpu" => parse_millicpu(quantity).map(drop),
        "memory" | "ephemeral-storage" => parse_bytes(quantity).map(drop),
        "pid" => quantity
            .parse::<u64>()
            .map(drop)
            .map_err(|_| format!("expected a number of pids, got {quantity:?}")),
        other => Err(format!(
            "unknown resource {other:?} (cpu, memory, ephemeral-storage, pid)"
        )),
    }
}

/// An `evictionHard` entry: a quantity, or a percentage of capacity.
pub fn check_eviction(signal: &str, threshold: &str) -> Result<(), String> {
    if !EVICTION_SIGNALS.contains(&signal) {
        return Err(format!(
            "unknown eviction signal {signal:?} ({})",
            EVICTION_SIGNALS.join(", ")
        ));
    }
    match threshold.strip_suffix('%') {
        Some(p) => match p.parse::<f64>() {
            Ok(v) if (0.0..=100.0).contains(&v) => Ok(()),
            _ => Err(format!(
                "expected a percentage from 0% to 100%, got {threshold:?}"
            )),
        },
        // The kubelet refuses a zero quantity; "0%" is how a signal is turned off.
        None => match parse_bytes(threshold)? {
            0 => Err(format!(
                "a threshold must be greater than zero, got {threshold:?} (0% turns the signal off)"
            )),
            _ => Ok(()),
        },
    }
}

/// A node label, as the apiserver validates it.
pub fn check_label(key: &str, value: &str) -> Result<(), String> {
    let (prefix, name) = match key.rsplit_once('/') {
        Some((p, n)) => (Some(p), n),
        None => (None, key),
    };
    if let Some(p) = prefix {
        check_dns1123_subdomain(p).map_err(|e| format!("label key {key:?}: prefix {e}"))?;
    }
    check_label_part(name).map_err(|e| format!("label key {key:?}: name {e}"))?;
    if !value.is_empty() {
        check_label_part(value).map_err(|e| format!("label {key:?}: value {e}"))?;
    }
    if let Some(p) = prefix {
        let restricted = ["kubernetes.io", "k8s.io"]
            .iter()
            .any(|d| p == *d || p.ends_with(&format!(".{d}")));
        let node_owned = ["kubelet.kubernetes.io", "node.kubernetes.io"]
            .iter()
            .any(|d| p == *d || p.ends_with(&format!(".{d}")));
        if restricted && !node_owned && !ALLOWED_K8S_LABELS.contains(&key) {
            return Err(format!(
                "label {key:?}: a node may not set labels under {p} (NodeRestriction); \
                 use node.kubernetes.io/ or a prefix of your own"
            ));
        }
    }
    Ok(())
}

/// One part of a label or taint key (the name after the prefix) or a label value.
pub(super) fn check_label_part(s: &str) -> Result<(), String> {
    let ok = |b: u8| b.is_ascii_alphanumeric();
    let bytes = s.as_bytes();
    if s.is_empty() || s.len() > 63 {
        return Err("must be 1 to 63 characters".into());
    }
    let inner = bytes
        .iter()
        .all(|&b| ok(b) || b == b'-' || b == b'_' || b == b'.');
    let ends = bytes.first().copied().is_some_and(ok) && bytes.last().copied().is_some_and(ok);
    if inner && ends {
        Ok(())
    } else {
        Err(format!(
            "{s:?}: letters, digits, '-', '_' and '.', starting and ending with a letter or digit"
        ))
    }
}

impl Reader<'_> {
    /// A mapping of strings (numbers are taken as written) to strings, each entry checked.
    fn string_map(
        &self,
        key: &str,
        value: &Value,
        check: fn(&str, &str) -> Result<(), String>,
    ) -> Result<BTreeMap<String, String>, ConfigError> {
        let map = match value {
            Value::Mapping(m) => m,
            Value::Null => return Ok(BTreeMap::new()),
            other => {
                return Err(self.err(
                    key,
                    format!(
                        "expected a mapping, got {} {}",
                        type_name(other),
                        short(other)
                    ),
                ))
            }
        };
        let mut out = BTreeMap::new();
        for (k, v) in map {
            let name = match k {
                Value::String(s) => s.clone(),
                other => {
                    return Err(self.err(
                        key,
                        format!(
                            "expected string keys, got {} {}",
                            type_name(other),
                            short(other)
                        ),
                    ))
                }
            };
            let entry_key = format!("{key}.{name}");
            let text = match v {
                Value::String(s) => s.clone(),
                Value::Number(n) => n.to_string(),
                Value::Bool(b) => b.to_string(),
                other => {
                    return Err(self.err(
                        &entry_key,
                        format!(
                            "expected a string, got {} {}",
                            type_name(other),
                            short(other)
                        ),
                    ))
                }
            };
            check(&name, &text).map_err(|reason| self.err(&entry_key, reason))?;
            out.insert(name, text);
        }
        Ok(out)
    }

    pub(super) fn reserved(
        &self,
        key: &str,
        value: &Value,
    ) -> Result<BTreeMap<String, String>, ConfigError> {
        self.string_map(key, value, check_reserved)
    }

    pub(super) fn eviction(
        &self,
        key: &str,
        value: &Value,
    ) -> Result<BTreeMap<String, String>, ConfigError> {
        self.string_map(key, value, check_eviction)
    }

    pub(super) fn labels(
        &self,
        key: &str,
        value: &Value,
    ) -> Result<BTreeMap<String, String>, ConfigError> {
        self.string_map(key, value, check_label)
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::super::parse_config;
    use super::*;

    fn key_err(text: &str) -> (String, String) {
        match parse_config(Path::new("/etc/holdfast/config.yaml"), text) {
            Err(ConfigError::Key { key, reason, .. }) => (key, reason),
            other => panic!("expected a key error, got {other:?}"),
        }
    }

    #[test]
    fn map_keys_parse() {
        let (cfg, warnings) = parse_config(
            Path::new("/etc/holdfast/config.yaml"),
            "systemReserved: {cpu: 250m, memory: 256Mi}
kubeReserved: {cpu: 1, memory: 128Mi, pid: 100}
evictionHard: {memory.available: 100Mi, nodefs.available: 10%, imagefs.available: \"15%\"}
holdfast:
  nodeLabels:
    node.kubernetes.io/instance-type: rpi4
    site.example.com/zone: north
  board: rpi4
  boardDir: boards
",
        )
        .expect("parse");
        assert!(warnings.is_empty(), "{warnings:?}");
        assert_eq!(cfg.system_reserved["cpu"], "250m");
        assert_eq!(cfg.kube_reserved["cpu"], "1");
        assert_eq!(cfg.kube_reserved["pid"], "100");
        assert_eq!(cfg.eviction_hard["nodefs.available"], "10%");
        assert_eq!(cfg.eviction_hard["imagefs.available"], "15%");
        assert_eq!(cfg.node_labels["node.kubernetes.io/instance-type"], "rpi4");
        assert_eq!(cfg.board.as_deref(), Some("rpi4"));
        assert_eq!(
            cfg.board_dir.as_deref(),
            Some(Path::new("/etc/holdfast/boards"))
        );
    }

    #[test]
    fn map_errors_name_the_entry() {
        let (key, reason) = key_err("systemReserved: {memory: lots}\n");
        assert_eq!(key, "systemReserved.memory");
        assert!(reason.contains("\"lots\""), "{reason}");
        let (key, reason) = key_err("kubeReserved: {gpu: 1}\n");
        assert_eq!(key, "kubeReserved.gpu");
        assert!(reason.contains("unknown resource"), "{reason}");
        let (key, _) = key_err("kubeReserved: 1\n");
        assert_eq!(key, "kubeReserved");
        let (key, reason) = key_err("evictionHard: {nodefs.available: 120%}\n");
        assert_eq!(key, "evictionHard.nodefs.available");
        assert!(reason.contains("percentage"), "{reason}");
        let (key, reason) = key_err("evictionHard: {memory.available: 0}\n");
        assert_eq!(key, "evictionHard.memory.available");
        assert!(reason.contains("greater than zero"), "{reason}");
        assert!(check_eviction("memory.available", "0%").is_ok());
        let (key, _) = key_err("evictionHard: {disk.available: 1Gi}\n");
        assert_eq!(key, "evictionHard.disk.available");
        let (key, reason) = key_err("holdfast: {nodeLabels: {kubernetes.io/role: edge}}\n");
        assert_eq!(key, "holdfast.nodeLabels.kubernetes.io/role");
        assert!(reason.contains("NodeRestriction"), "{reason}");
        let (key, _) = key_err("holdfast: {nodeLabels: {\"a b\": c}}\n");
        assert_eq!(key, "holdfast.nodeLabels.a b");
        let (key, _) = key_err("holdfast: {board: \"\"}\n");
        assert_eq!(key, "holdfast.board");
    }

    #[test]
    fn label_rules() {
        assert!(check_label("node.kubernetes.io/instance-type", "rpi4").is_ok());
        assert!(check_label("kubelet.kubernetes.io/x", "").is_ok());
        assert!(check_label("example.com/site", "a.b_c-d").is_ok());
        assert!(check_label("site", "-bad").is_err());
        assert!(check_label("Example.com/site", "x").is_err());
        assert!(check_label("node-role.kubernetes.io/edge", "").is_err());
    }
}
