//! What a container's OCI spec says about whom it belongs to, so that an agent whose
//! store was lost can adopt its running containers instead of killing them as orphans.
//!
//! Keys follow the CRI runtimes' (`io.kubernetes.*`) where they have one; the rest are
//! `io.holdfast.*`. The pod itself (without status) rides along, so the desired pod
//! can be restored before its source speaks again.

use std::collections::HashMap;

use k8s_openapi::api::core::v1::Pod;

use super::StartRequest;

pub const POD_UID: &str = "io.kubernetes.pod.uid";
pub const POD_NAME: &str = "io.kubernetes.pod.name";
pub const POD_NAMESPACE: &str = "io.kubernetes.pod.namespace";
pub const CONTAINER_NAME: &str = "io.kubernetes.container.name";
pub const RESTART_COUNT: &str = "io.kubernetes.container.restartCount";
/// The pod source (`file`, `api`) the pod came from.
pub const POD_SOURCE: &str = "io.holdfast.pod.source";
/// The image as the pod names it.
pub const IMAGE: &str = "io.holdfast.image";
/// `sha256:<config digest>`.
pub const IMAGE_ID: &str = "io.holdfast.image-id";
/// The pod (spec and metadata) as JSON, when it was started.
pub const POD: &str = "io.holdfast.pod";

/// Who a container belongs to, read back from its annotations.
#[derive(Debug, Clone, PartialEq)]
pub struct Owner {
    pub pod_uid: String,
    pub pod_name: String,
    pub namespace: String,
    pub container: String,
    pub restart_count: u32,
    pub source: Option<String>,
    pub image: String,
    pub image_id: String,
    /// None when the annotation is missing or does not decode.
    pub pod: Option<Pod>,
}

/// The annotations for a container about to be created.
pub fn annotations(req: &StartRequest<'_>) -> HashMap<String, String> {
    let meta = &req.pod.metadata;
    let mut out = HashMap::new();
    out.insert(POD_UID.into(), meta.uid.clone().unwrap_or_default());
    out.insert(POD_NAME.into(), meta.name.clone().unwrap_or_default());
    out.insert(
        POD_NAMESPACE.into(),
        meta.namespace.clone().unwrap_or_else(|| "default".into()),
    );
    out.insert(CONTAINER_NAME.into(), req.container.name.clone());
    out.insert(RESTART_COUNT.into(), req.restart_count.to_string());
    if let Some(source) = meta
        .annotations
        .as_ref()
        .and_then(|a| a.get(crate::pod::annotations::CONFIG_SOURCE))
    {
        out.insert(POD_SOURCE.into(), source.clone());
    }
    out.insert(
        IMAGE.into(),
        req.container.image.clone().unwrap_or_default(),
    );
    out.insert(IMAGE_ID.into(), req.image.image_id.clone());
    let pod = Pod {
        metadata: req.pod.metadata.clone(),
        spec: req.pod.spec.clone(),
        status: None,
    };
    match serde_json::to_string(&pod) {
        Ok(json) => {
            out.insert(POD.into(), json);
        }
        Err(e) => log::warn!("container {}: pod annotation: {e}", req.id),
    }
    out
}

/// Reads the owner back; None when the annotations do not name one (a container
/// from a holdfast that did not write them, or a damaged spec).
pub fn owner(annotations: &HashMap<String, String>) -> Option<Owner> {
    let get = |k: &str| annotations.get(k).filter(|v| !v.is_empty()).cloned();
    Some(Owner {
        pod_uid: get(POD_UID)?,
        pod_name: get(POD_NAME)?,
        namespace: get(POD_NAMESPACE).unwrap_or_else(|| "default".into()),
        container: get(CONTAINER_NAME)?,
        restart_count: get(RESTART_COUNT)?.parse().ok()?,
        source: get(POD_SOURCE),
        image: get(IMAGE).unwrap_or_default(),
        image_id: get(IMAGE_ID).unwrap_or_default(),
        pod: get(POD).and_then(|json| serde_json::from_str(&json).ok()),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn owner_needs_uid_name_container_and_count() {
        let mut a = HashMap::new();
        a.insert(POD_UID.to_string(), "u1".to_string());
        a.insert(POD_NAME.to_string(), "web".to_string());
        a.insert(CONTAINER_NAME.to_string(), "c".to_string());
        assert_eq!(owner(&a), None, "no restart count");
        a.insert(RESTART_COUNT.to_string(), "3".to_string());
        let o = owner(&a).expect("owner");
        assert_eq!(
            (o.pod_uid.as_str(), o.namespace.as_str(), o.restart_count),
            ("u1", "default", 3)
        );
        assert!(o.pod.is_none());
        a.insert(RESTART_COUNT.to_string(), "x".to_string());
        assert_eq!(owner(&a), None, "a count that is not a number");
    }
}
