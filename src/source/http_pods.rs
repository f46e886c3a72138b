//! The static pod URL's answer as pods: one Pod or a PodList, YAML or JSON, read as the
//! kubelet reads it (a single pod first, then a list), each pod through the same checks
//! and defaulting as a manifest file's, made a static pod of source `http`. All or
//! nothing: a pod refused refuses the whole answer, and the source keeps what it had.

use std::collections::HashMap;

use k8s_openapi::api::core::v1::Pod;
use serde::Deserialize;
use serde_yaml::Value;

use super::manifest::{admit, MAX_DOCUMENTS};
use super::static_pod::Origin;

/// The pods an answer from `url` holds; an empty answer holds none. Err says why the
/// answer is refused, item by item where a list is at fault.
pub(super) fn pods_from_body(body: &[u8], url: &str, node_name: &str) -> Result<Vec<Pod>, String> {
    if body.is_empty() {
        return Ok(Vec::new());
    }
    let text = std::str::from_utf8(body).map_err(|e| format!("not UTF-8 text: {e}"))?;
    // Before serde_yaml sees it, as for a file: nesting and aliases that would cost it
    // minutes or gigabytes are refused by a look that costs one pass.
    crate::yaml::prescan(text)?;
    let doc: Value = serde_yaml::from_str(text).map_err(|e| format!("not valid YAML: {e}"))?;
    let items = match kind_of(&doc) {
        (Some("v1"), Some("Pod")) => vec![decode(doc, "")?],
        (Some("v1"), Some("PodList")) => list_items(doc)?,
        (api, kind) => {
            return Err(format!(
                "expected apiVersion v1 and kind Pod or PodList, got apiVersion {} and kind {}",
                api.unwrap_or("<missing>"),
                kind.unwrap_or("<missing>")
            ))
        }
    };
    let many = items.len() > 1;
    let mut pods = Vec::with_capacity(items.len());
    let mut names: HashMap<String, usize> = HashMap::new();
    for (index, pod) in items.into_iter().enumerate() {
        let at = if many {
            format!("items[{index}]: ")
        } else {
            String::new()
        };
        let pod = admit(pod, node_name, Origin::Url(url)).map_err(|e| format!("{at}{e}"))?;
        let name = format!(
            "{}/{}",
            pod.metadata.namespace.as_deref().unwrap_or_default(),
            pod.metadata.name.as_deref().unwrap_or_default()
        );
        if let Some(first) = names.insert(name.clone(), index) {
            return Err(format!("{at}pod {name} is already items[{first}]"));
        }
        pods.push(pod);
    }
    Ok(pods)
}

fn kind_of(doc: &Value) -> (Option<&str>, Option<&str>) {
    let field = |key: &str| match doc.get(key) {
        Some(Value::String(s)) => Some(s.as_str()),
        _ => None,
    };
    (field("apiVersion"), field("kind"))
}

/// A PodList's items, at most [`MAX_DOCUMENTS`] of them.
fn list_items(mut doc: Value) -> Result<Vec<Pod>, String> {
    let items = match doc.get_mut("items").map(std::mem::take) {
        None | Some(Value::Null) => return Ok(Vec::new()),
        Some(Value::Sequence(items)) => items,
        Some(_) => return Err("items: expected a list of pods".into()),
    };
    if items.len() > MAX_DOCUMENTS {
        return Err(format!(
            "{} pods in the list, more than the {MAX_DOCUMENTS} allowed",
            items.len()
        ));
    }
    items
        .into_iter()
        .enumerate()
        .map(|(i, item)| {
            let at = format!("items[{i}]: ");
            // Items may leave out apiVersion and kind, as the apiserver's lists do.
            match kind_of(&item) {
                (None | Some("v1"), None | Some("Pod")) => decode(item, &at),
                (api, kind) => Err(format!(
                    "{at}expected a pod, got apiVersion {} and kind {}",
                    api.unwrap_or("<missing>"),
                    kind.unwrap_or("<missing>")
                )),
            }
        })
        .collect()
}

fn decode(doc: Value, at: &str) -> Result<Pod, String> {
    Pod::deserialize(doc).map_err(|e| format!("{at}decode pod: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pod::annotations::{CONFIG_HASH, CONFIG_SOURCE};

    const URL: &str = "http://127.0.0.1:8080/pods";

    fn pod(name: &str) -> String {
        format!(
            "{{\"metadata\": {{\"name\": \"{name}\"}}, \"spec\": {{\"containers\": [{{\"name\": \"c\", \"image\": \"busybox\"}}]}}}}"
        )
    }

    fn names(body: &str) -> Result<Vec<String>, String> {
        pods_from_body(body.as_bytes(), URL, "gw-1").map(|pods| {
            pods.iter()
                .map(|p| p.metadata.name.clone().unwrap_or_default())
                .collect()
        })
    }

    #[test]
    fn one_pod_in_yaml_or_json() {
        let yaml = "apiVersion: v1\nkind: Pod\nmetadata: {name: web}\nspec:\n  containers: [{name: c, image: busybox}]\n";
        let pods = pods_from_body(yaml.as_bytes(), URL, "gw-1").expect("yaml");
        assert_eq!(pods.len(), 1);
        let ann = pods[0].metadata.annotations.as_ref().expect("annotations");
        assert_eq!(ann[CONFIG_SOURCE], "http");
        assert_eq!(Some(&ann[CONFIG_HASH]), pods[0].metadata.uid.as_ref());
        let json = format!(
            "{{\"apiVersion\": \"v1\", \"kind\": \"Pod\", {}",
            &pod("web")[1..]
        );
        assert_eq!(names(&json), Ok(vec!["web-gw-1".to_string()]));
    }

    #[test]
    fn a_pod_list_gives_each_pod_and_an_empty_body_none() {
        let list = format!(
            "{{\"apiVersion\": \"v1\", \"kind\": \"PodList\", \"items\": [{}, {}]}}",
            pod("a"),
            pod("b")
        );
        assert_eq!(
            names(&list),
            Ok(vec!["a-gw-1".to_string(), "b-gw-1".to_string()])
        );
        assert_eq!(
            names("apiVersion: v1\nkind: PodList\nitems: []\n"),
            Ok(vec![])
        );
        assert_eq!(names(""), Ok(vec![]));
    }

    #[test]
    fn one_bad_pod_refuses_the_whole_answer_naming_it() {
        let bad = "{\"metadata\": {\"name\": \"Bad_Name\"}, \"spec\": {\"containers\": [{\"name\": \"c\", \"image\": \"busybox\"}]}}";
        let list = format!(
            "{{\"apiVersion\": \"v1\", \"kind\": \"PodList\", \"items\": [{}, {bad}]}}",
            pod("a")
        );
        let err = names(&list).expect_err("refused");
        assert!(
            err.starts_with("items[1]: invalid pod: metadata.name: "),
            "{err}"
        );
        let twice = format!(
            "{{\"apiVersion\": \"v1\", \"kind\": \"PodList\", \"items\": [{}, {}]}}",
            pod("a"),
            pod("a")
        );
        let err = names(&twice).expect_err("refused");
        assert!(
            err.contains("pod default/a-gw-1 is already items[0]"),
            "{err}"
        );
        for (body, want) in [
            (
                "apiVersion: apps/v1\nkind: Deployment\n",
                "kind Pod or PodList",
            ),
            ("[1, 2]\n", "apiVersion <missing> and kind <missing>"),
            ("{a: [}\n", "not valid YAML"),
            (
                "apiVersion: v1\nkind: PodList\nitems: {a: 1}\n",
                "items: expected a list",
            ),
        ] {
            let err = names(body).expect_err(body);
            assert!(err.contains(want), "{body}: {err}");
        }
        let deep = format!("{}{}", "[".repeat(200), "]".repeat(200));
        let err = names(&deep).expect_err("deep");
        assert!(err.contains("nest"), "{err}");
        let err = pods_from_body(b"\xff\xfe", URL, "gw-1").expect_err("binary");
        assert!(err.contains("not UTF-8"), "{err}");
    }
}
