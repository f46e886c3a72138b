//! `/pods` and `/runningpods/`, and finding a pod and its container for the other
//! routes: all from the sync loop's pod states in the store.

use hyper::StatusCode;
use k8s_openapi::api::core::v1::{Container, Pod, PodSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::List;

use super::http::{error, json, Resp};
use super::ApiDeps;
use crate::runtime::ContainerId;
use crate::sync::PodState;

/// Every pod state the store holds, off the async threads.
pub async fn all(deps: &ApiDeps) -> Result<Vec<PodState>, Resp> {
    let tree = deps.podstates.clone();
    match tokio::task::spawn_blocking(move || tree.entries()).await {
        Ok(Ok(entries)) => Ok(entries.into_iter().map(|(_, s)| s).collect()),
        Ok(Err(e)) => Err(error(
            StatusCode::INTERNAL_SERVER_ERROR,
            &format!("read pod states: {e}"),
        )),
        Err(e) => Err(error(StatusCode::INTERNAL_SERVER_ERROR, &e.to_string())),
    }
}

/// The pod as the kubelet's `/pods` shows it: its spec with the status it computed.
pub fn with_status(s: &PodState) -> Pod {
    let mut pod = s.pod.clone();
    pod.status = Some(s.status.clone());
    pod
}

pub async fn pods(deps: &ApiDeps) -> Resp {
    match all(deps).await {
        Ok(states) => json(&List::<Pod> {
            items: states.iter().map(with_status).collect(),
            ..Default::default()
        }),
        Err(r) => r,
    }
}

/// Pods with a container that runs, as the runtime sees them: names, UIDs, and their
/// running containers' names and images (the kubelet's `/runningpods/`).
pub async fn running_pods(deps: &ApiDeps) -> Resp {
    let states = match all(deps).await {
        Ok(s) => s,
        Err(r) => return r,
    };
    let mut items = Vec::new();
    for s in &states {
        let running: Vec<Container> = s
            .status
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
                name: s.pod.metadata.name.clone(),
                namespace: s.pod.metadata.namespace.clone(),
                uid: s.pod.metadata.uid.clone(),
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

/// The pod `namespace/name` (with `uid` if the path named one), or the kubelet's 404.
pub async fn find(
    deps: &ApiDeps,
    namespace: &str,
    name: &str,
    uid: Option<&str>,
) -> Result<PodState, Resp> {
    let states = all(deps).await?;
    states
        .into_iter()
        .find(|s| {
            s.pod.metadata.namespace.as_deref().unwrap_or("default") == namespace
                && s.pod.metadata.name.as_deref() == Some(name)
                && uid.is_none_or(|u| s.pod.metadata.uid.as_deref() == Some(u))
        })
        .ok_or_else(|| {
            error(
                StatusCode::NOT_FOUND,
                &format!("pod \"{name}\" does not exist"),
            )
        })
}

/// The container `name` of the pod, or the kubelet's 404.
#[allow(clippy::result_large_err)] // the error is the response, built once per request
pub fn container<'a>(state: &'a PodState, name: &str) -> Result<&'a Container, Resp> {
    state
        .pod
        .spec
        .iter()
        .flat_map(|s| s.containers.iter())
        .find(|c| c.name == name)
        .ok_or_else(|| {
            error(
                StatusCode::NOT_FOUND,
                &format!(
                    "container \"{name}\" not found in pod \"{}\"",
                    state.pod.metadata.name.as_deref().unwrap_or("")
                ),
            )
        })
}

/// The runtime id of `container` of `pod` if it is running now; else the kubelet's 400
/// for exec, attach and run (`container c is not valid for pod p`).
pub fn running_container(
    state: &PodState,
    pod: &str,
    container: &str,
) -> Result<ContainerId, Box<Resp>> {
    let running = state
        .status
        .container_statuses
        .iter()
        .flatten()
        .any(|c| c.name == container && c.state.as_ref().is_some_and(|s| s.running.is_some()));
    container_id(state, container, false)
        .filter(|_| running)
        .ok_or_else(|| {
            Box::new(error(
                StatusCode::BAD_REQUEST,
                &format!("container {container} is not valid for pod {pod}"),
            ))
        })
}

/// The runtime id of the container's current instance (or the one before, with
/// `previous`), from the status the sync loop reported.
pub fn container_id(state: &PodState, name: &str, previous: bool) -> Option<ContainerId> {
    let cs = state
        .status
        .container_statuses
        .iter()
        .flatten()
        .find(|c| c.name == name)?;
    let uri = if previous {
        cs.last_state
            .as_ref()?
            .terminated
            .as_ref()?
            .container_id
            .clone()?
    } else {
        cs.container_id.clone()?
    };
    let id = uri.rsplit("://").next()?.to_owned();
    Some(ContainerId(id))
}

/// The pod's restart count of a container, as its status says.
pub fn restart_count(state: &PodState, name: &str) -> Option<u32> {
    state
        .status
        .container_statuses
        .iter()
        .flatten()
        .find(|c| c.name == name)
        .and_then(|c| u32::try_from(c.restart_count).ok())
}

/// Why a container has no running instance, for the kubelet's 400s: its waiting
/// reason, or None if it runs or ran.
pub fn waiting_reason(state: &PodState, name: &str) -> Option<String> {
    let cs = state
        .status
        .container_statuses
        .iter()
        .flatten()
        .find(|c| c.name == name);
    match cs {
        None => Some("ContainerCreating".into()),
        Some(c) => c
            .state
            .as_ref()
            .and_then(|s| s.waiting.as_ref())
            .filter(|_| c.container_id.is_none())
            .map(|w| {
                w.reason
                    .clone()
                    .unwrap_or_else(|| "ContainerCreating".into())
            }),
    }
}

/// The pod's log directory, `<root>/logs/pods/<ns>_<name>_<uid>`.
pub fn log_dir(deps: &ApiDeps, state: &PodState) -> std::path::PathBuf {
    let m = &state.pod.metadata;
    crate::runtime::pod_log_dir(
        &deps.root_dir,
        m.namespace.as_deref().unwrap_or("default"),
        m.name.as_deref().unwrap_or(""),
        m.uid.as_deref().unwrap_or(""),
    )
}
