//! `/pods` and `/runningpods/`: the pods the sync loop holds, as the kubelet lists
//! them.

use k8s_openapi::api::core::v1::{Container, Pod, PodSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::List;

use super::deps::ApiDeps;
use super::http::{json, Resp};
use super::lookup;
use crate::sync::PodView;

pub async fn pods(deps: &ApiDeps) -> Resp {
    match lookup::all(deps).await {
        Ok(states) => json(&List::<Pod> {
            items: states.iter().map(PodView::with_status).collect(),
            ..Default::default()
        }),
        Err(r) => r,
    }
}

/// Pods with a container that runs, as the runtime sees them: names, UIDs, and their
/// running containers' names and images (the kubelet's `/runningpods/`).
pub async fn running_pods(deps: &ApiDeps) -> Resp {
    let states = match lookup::all(deps).await {
        Ok(s) => s,
        Err(r) => return r,
    };
    let mut items = Vec::new();
    for s in &states {
        let running: Vec<Container> = s
            .status()
            .container_statuses
            .iter()
            .flatten()
            .filter(|c| c.state.as_ref().is_some_and(|st| st.running.is_some()))
            .map(|c| Container {
                name: c.name.clone(),
                image: Some(c.image.clone()),
                ..Default::default()
            })
            .collect();
        if running.is_empty() {
            continue;
        }
        items.push(Pod {
            metadata: ObjectMeta {
                name: s.pod().metadata.name.clone(),
                namespace: s.pod().metadata.namespace.clone(),
                uid: s.pod().metadata.uid.clone(),
                ..Default::default()
            },
            spec: Some(PodSpec {
                containers: running,
                ..Default::default()
            }),
            status: None,
        });
    }
    json(&List::<Pod> {
        items,
        ..Default::default()
    })
}
