//! `registerWithTaints` / `--register-with-taints`: the taints the node carries from its
//! first registration. Checked as the apiserver checks node taints, so a bad taint
//! stops the agent at start instead of failing every registration attempt.

use k8s_openapi::api::core::v1::Taint;
use serde_yaml::Value;

use super::maps::check_label_part;
use super::names::check_dns1123_subdomain;
use super::reader::{short, type_name, Reader};
use super::ConfigError;

/// The effects a node taint can have.
const EFFECTS: &[&str] = &["NoSchedule", "PreferNoSchedule", "NoExecute"];

/// One taint: a qualified key, an optional label-shaped value and an effect.
pub fn check_taint(key: &str, value: &str, effect: &str) -> Result<(), String> {
    let (prefix, name) = match key.rsplit_once('/') {
        Some((p, n)) => (Some(p), n),
        None => (None, key),
    };
    if let Some(p) = prefix {
        check_dns1123_subdomain(p).map_err(|e| format!("taint key {key:?}: prefix {e}"))?;
    }
    check_label_part(name).map_err(|e| format!("taint key {key:?}: name {e}"))?;
    if !value.is_empty() {
        check_label_part(value).map_err(|e| format!("taint {key:?}: value {e}"))?;
    }
    if !EFFECTS.contains(&effect) {
        return Err(format!(
            "taint {key:?}: effect must be one of {}, got {effect:?}",
            EFFECTS.join(", ")
        ));
    }
    Ok(())
}

/// `key=value:Effect` or `key:Effect`, as the kubelet's flag spells a taint.
pub fn parse_taint(spec: &str) -> Result<Taint, String> {
    let (kv, effect) = spec
        .split_once(':')
        .ok_or_else(|| format!("expected KEY[=VALUE]:EFFECT, got {spec:?}"))?;
    let (key, value) = match kv.split_once('=') {
        Some((k, v)) => (k, v),
        None => (kv, ""),
    };
    if effect.contains(':') || value.contains('=') {
        return Err(format!("expected KEY[=VALUE]:EFFECT, got {spec:?}"));
    }
    check_taint(key, value, effect)?;
    Ok(taint(key, value, effect))
}

/// Taints must be unique by key and effect, as the apiserver requires.
pub fn check_unique(taints: &[Taint]) -> Result<(), String> {
    for (i, t) in taints.iter().enumerate() {
        if taints[..i]
            .iter()
            .any(|u| u.key == t.key && u.effect == t.effect)
        {
            return Err(format!(
                "taint {:?} with effect {} is given twice",
                t.key, t.effect
            ));
        }
    }
    Ok(())
}

fn taint(key: &str, value: &str, effect: &str) -> Taint {
    Taint {
        key: key.to_string(),
        value: (!value.is_empty()).then(|| value.to_string()),
        effect: effect.to_string(),
        time_added: None,
    }
}

impl Reader<'_> {
    /// A list of `{key, value, effect}` mappings, as KubeletConfiguration writes them.
    pub(super) fn taints(&self, key: &str, value: &Value) -> Result<Vec<Taint>, ConfigError> {
        let list = match value {
            Value::Sequence(l) => l,
            Value::Null => return Ok(Vec::new()),
            other => {
                return Err(self.err(
                    key,
                    format!("expected a list, got {} {}", type_name(other), short(other)),
                ))
            }
        };
        let mut out = Vec::with_capacity(list.len());
        for (i, item) in list.iter().enumerate() {
            let entry_key = format!("{key}[{i}]");
            let Value::Mapping(m) = item else {
                return Err(self.err(
                    &entry_key,
                    format!(
                        "expected a mapping with key, value and effect, got {} {}",
                        type_name(item),
                        short(item)
                    ),
                ));
            };
            let mut fields: [(&str, Option<String>); 3] =
                [("key", None), ("value", None), ("effect", None)];
            for (k, v) in m {
                let name = match k {
                    Value::String(s) => s.as_str(),
                    other => {
                        return Err(self.err(
                            &entry_key,
                            format!("expected string keys, got {}", short(other)),
                        ))
                    }
                };
                let Some(slot) = fields.iter_mut().find(|(n, _)| *n == name) else {
                    return Err(self.err(
                        &format!("{entry_key}.{name}"),
                        "unknown field (key, value, effect)".into(),
                    ));
                };
                slot.1 = Some(self.string(&format!("{entry_key}.{name}"), v)?);
            }
            let [(_, k), (_, v), (_, e)] = fields;
            let k = k.ok_or_else(|| self.err(&format!("{entry_key}.key"), "missing".into()))?;
            let e = e.ok_or_else(|| self.err(&format!("{entry_key}.effect"), "missing".into()))?;
            let v = v.unwrap_or_default();
            check_taint(&k, &v, &e).map_err(|reason| self.err(&entry_key, reason))?;
            out.push(taint(&k, &v, &e));
        }
        check_unique(&out).map_err(|reason| self.err(key, reason))?;
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::super::parse_config;
    use super::*;

    #[test]
    fn flag_spelling() {
        let t = parse_taint("example.com/site=north:NoSchedule").expect("parse");
        assert_eq!(t.key, "example.com/site");
        assert_eq!(t.value.as_deref(), Some("north"));
        assert_eq!(t.effect, "NoSchedule");
        let t = parse_taint("dedicated:NoExecute").expect("parse");
        assert_eq!((t.key.as_str(), t.value), ("dedicated", None));
        for bad in [
            "dedicated",
            "dedicated=x",
            "dedicated=x:Sometimes",
            "dedicated=x:noschedule",
            "a=b=c:NoSchedule",
            "a:NoSchedule:x",
            "Bad_Prefix.com/k:NoSchedule",
            "k=-x:NoSchedule",
            ":NoSchedule",
        ] {
            assert!(parse_taint(bad).is_err(), "{bad:?} should not parse");
        }
        let msg = parse_taint("k=v:Never").err().unwrap_or_default();
        assert!(
            msg.contains("NoSchedule, PreferNoSchedule, NoExecute"),
            "{msg}"
        );
    }

    #[test]
    fn file_list() {
        let (cfg, warnings) = parse_config(
            Path::new("/etc/holdfast/config.yaml"),
            "registerWithTaints:
- {key: example.com/edge, value: \"true\", effect: NoSchedule}
- key: dedicated
  effect: PreferNoSchedule
",
        )
        .expect("parse");
        assert!(warnings.is_empty(), "{warnings:?}");
        let taints = cfg.register_with_taints.expect("set");
        assert_eq!(taints.len(), 2);
        assert_eq!(taints[0].value.as_deref(), Some("true"));
        assert_eq!(taints[1].key, "dedicated");
        assert_eq!(taints[1].value, None);
        assert_eq!(taints[1].effect, "PreferNoSchedule");
    }

    #[test]
    fn file_errors_name_the_entry() {
        let cases = [
            ("registerWithTaints: {key: a}\n", "registerWithTaints"),
            ("registerWithTaints: [a]\n", "registerWithTaints[0]"),
            (
                "registerWithTaints: [{key: a}]\n",
                "registerWithTaints[0].effect",
            ),
            (
                "registerWithTaints: [{effect: NoSchedule}]\n",
                "registerWithTaints[0].key",
            ),
            (
                "registerWithTaints: [{key: a, effect: Soon}]\n",
                "registerWithTaints[0]",
            ),
            (
                "registerWithTaints: [{key: a, effect: NoSchedule, colour: red}]\n",
                "registerWithTaints[0].colour",
            ),
            (
                "registerWithTaints: [{key: a, effect: NoSchedule, value: 3}]\n",
                "registerWithTaints[0].value",
            ),
            (
                "registerWithTaints: [{key: a, effect: NoSchedule}, {key: a, value: b, effect: NoSchedule}]\n",
                "registerWithTaints",
            ),
        ];
        for (text, want) in cases {
            match parse_config(Path::new("/c.yaml"), text) {
                Err(ConfigError::Key { key, .. }) => assert_eq!(key, want, "{text}"),
                other => panic!("{text}: {other:?}"),
            }
        }
        // The same key with another effect is a different taint.
        let (cfg, _) = parse_config(
            Path::new("/c.yaml"),
            "registerWithTaints: [{key: a, effect: NoSchedule}, {key: a, effect: NoExecute}]\n",
        )
        .expect("parse");
        assert_eq!(cfg.register_with_taints.map(|t| t.len()), Some(2));
    }
}
