//! Finding pods and their containers (app, init or ephemeral) for the routes, from the
//! sync loop's pod states ([`crate::sync::PodStates`]): the one lookup every route that
//! names a pod or a container shares, with the kubelet's 404 and 400 when there is none.

use std::borrow::Cow;

use hyper::StatusCode;
use k8s_openapi::api::core::v1::{Container, ContainerStatus};

use super::deps::ApiDeps;
use super::http::{error, Resp};
use crate::pod::ephemeral;
use crate::runtime::ContainerId;
use crate::sync::PodView;

/// Every pod the sync loop holds, off the async threads.
pub async fn all(deps: &ApiDeps) -> Result<Vec<PodView>, Resp> {
    let states = deps.podstates.clone();
    read(move || states.list()).await
}

/// The pod `namespace/name` (with `uid` if the path named one), or the kubelet's 404.
pub async fn find(
    deps: &ApiDeps,
    namespace: &str,
    name: &str,
    uid: Option<&str>,
) -> Result<PodView, Resp> {
    let states = deps.podstates.clone();
    let (ns, n, u) = (
        namespace.to_owned(),
        name.to_owned(),
        uid.map(str::to_owned),
    );
    let found = read(move || states.find(&ns, &n, u.as_deref())).await?;
    found.ok_or_else(|| {
        error(
            StatusCode::NOT_FOUND,
            &format!("pod \"{name}\" does not exist"),
        )
    })
}

/// A read of the pod states on a blocking thread; a failure is the API's 500.
async fn read<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, crate::store::StoreError> + Send + 'static,
) -> Result<T, Resp> {
    match tokio::task::spawn_blocking(f).await {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(e)) => Err(error(
            StatusCode::INTERNAL_SERVER_ERROR,
            &format!("read pod states: {e}"),
        )),
        Err(e) => Err(error(StatusCode::INTERNAL_SERVER_ERROR, &e.to_string())),
    }
}

/// One of the pod's containers as the kubelet API reaches it: an app container, an
/// init container (a sidecar is an init container with `restartPolicy: Always`) or an
/// ephemeral container (as the container it runs as), with the status the sync loop
/// reported for it.
pub struct PodContainer<'a> {
    pub spec: Cow<'a, Container>,
    /// None until the sync loop reported the container.
    pub status: Option<&'a ContainerStatus>,
}

/// The container `name` of the pod, among its containers, init containers and
/// ephemeral containers; else the kubelet's 404. Every route that names a container
/// finds it here.
#[allow(clippy::result_large_err)] // the error is the response, built once per request
pub fn container<'a>(state: &'a PodView, name: &str) -> Result<PodContainer<'a>, Resp> {
    let pod = state.pod();
    let spec = pod
        .spec
        .iter()
        .flat_map(|s| {
            s.containers
                .iter()
                .chain(s.init_containers.iter().flatten())
        })
        .find(|c| c.name == name)
        .map(Cow::Borrowed)
        .or_else(|| ephemeral::find(pod, name).map(|ec| Cow::Owned(ephemeral::as_container(ec))))
        .ok_or_else(|| {
            error(
                StatusCode::NOT_FOUND,
                &format!("container \"{name}\" not found in pod \"{}\"", state.name()),
            )
        })?;
    let status = state.status();
    let status = status
        .container_statuses
        .iter()
        .flatten()
        .chain(status.init_container_statuses.iter().flatten())
        .chain(status.ephemeral_container_statuses.iter().flatten())
        .find(|c| c.name == name);
    Ok(PodContainer { spec, status })
}

impl PodContainer<'_> {
    /// The runtime id of its current instance (or the one before, with `previous`).
    pub fn id(&self, previous: bool) -> Option<ContainerId> {
        self.status.and_then(|cs| instance_id(cs, previous))
    }

    /// Its restart count, as its status says.
    pub fn restart_count(&self) -> Option<u32> {
        self.status
            .and_then(|c| u32::try_from(c.restart_count).ok())
    }

    /// The runtime id of its instance if it is running now; else the kubelet's 400 for
    /// exec, attach and run (`container c is not valid for pod p`).
    pub fn running_id(&self, pod: &str) -> Result<ContainerId, Box<Resp>> {
        self.status
            .filter(|c| c.state.as_ref().is_some_and(|s| s.running.is_some()))
            .and_then(|cs| instance_id(cs, false))
            .ok_or_else(|| {
                Box::new(error(
                    StatusCode::BAD_REQUEST,
                    &format!("container {} is not valid for pod {pod}", self.spec.name),
                ))
            })
    }

    /// Why it has no instance yet, for the kubelet's 400s: its waiting reason, or None
    /// if it runs or ran.
    pub fn waiting_reason(&self) -> Option<String> {
        match self.status {
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
}

/// The runtime id of a container's current instance (or the one before, with
/// `previous`), from the status the sync loop reported.
pub fn instance_id(cs: &ContainerStatus, previous: bool) -> Option<ContainerId> {
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

/// The name and runtime id of each of the pod's running app containers.
pub fn running_ids(s: &PodView) -> Vec<(String, ContainerId)> {
    s.status()
        .container_statuses
        .iter()
        .flatten()
        .filter(|c| c.state.as_ref().is_some_and(|st| st.running.is_some()))
        .filter_map(|c| Some((c.name.clone(), instance_id(c, false)?)))
        .collect()
}

/// The pod's log directory, `<root>/logs/pods/<ns>_<name>_<uid>`.
pub fn log_dir(deps: &ApiDeps, state: &PodView) -> std::path::PathBuf {
    crate::runtime::pod_log_dir(&deps.root_dir, state.namespace(), state.name(), state.uid())
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::Pod;

    /// A pod with an app container, a completed init container that ran twice, a
    /// running sidecar, a running ephemeral container with a terminal, and an ephemeral
    /// container in its spec only.
    fn state() -> PodView {
        let pod = serde_json::json!({
            "metadata": {"name": "p", "namespace": "default", "uid": "u"},
            "spec": {
                "initContainers": [
                    {"name": "setup", "image": "i"},
                    {"name": "sidecar", "image": "i", "restartPolicy": "Always"}
                ],
                "containers": [{"name": "main", "image": "i"}],
                "ephemeralContainers": [
                    {"name": "debug", "image": "i", "stdin": true, "tty": true,
                     "targetContainerName": "main"},
                    {"name": "later", "image": "i"}
                ]
            },
            "status": {
                "initContainerStatuses": [
                    {"name": "setup", "image": "i", "imageID": "", "ready": true,
                     "restartCount": 1, "containerID": "holdfast://setup-1",
                     "state": {"terminated": {"exitCode": 0}},
                     "lastState": {"terminated": {"exitCode": 1,
                                                  "containerID": "holdfast://setup-0"}}},
                    {"name": "sidecar", "image": "i", "imageID": "", "ready": true,
                     "restartCount": 0, "containerID": "holdfast://sidecar-0",
                     "state": {"running": {}}}
                ],
                "containerStatuses": [
                    {"name": "main", "image": "i", "imageID": "", "ready": false,
                     "restartCount": 0, "state": {"waiting": {"reason": "PodInitializing"}}}
                ],
                "ephemeralContainerStatuses": [
                    {"name": "debug", "image": "i", "imageID": "", "ready": false,
                     "restartCount": 0, "containerID": "holdfast://debug-0",
                     "state": {"running": {}}}
                ]
            }
        });
        let mut pod: Pod = serde_json::from_value(pod).expect("pod");
        let status = pod.status.take().expect("status");
        PodView::new(pod, status, crate::time::now())
    }

    #[test]
    fn init_containers_and_sidecars_are_found() {
        let s = state();
        let id = |c: &PodContainer<'_>, previous| c.id(previous).map(|i| i.0);
        let found = |name| match container(&s, name) {
            Ok(c) => c,
            Err(r) => panic!("{name}: {}", r.status()),
        };
        let setup = found("setup");
        assert_eq!(id(&setup, false).as_deref(), Some("setup-1"));
        assert_eq!(id(&setup, true).as_deref(), Some("setup-0"));
        assert_eq!(setup.restart_count(), Some(1));
        assert_eq!(setup.waiting_reason(), None);
        let ended = setup.running_id("p").map(|i| i.0).map_err(|r| r.status());
        assert_eq!(ended, Err(StatusCode::BAD_REQUEST));
        let sidecar = found("sidecar");
        assert_eq!(
            sidecar.running_id("p").ok().map(|i| i.0).as_deref(),
            Some("sidecar-0")
        );
        let main = found("main");
        assert_eq!(main.waiting_reason().as_deref(), Some("PodInitializing"));
        assert!(main.running_id("p").is_err());
    }

    #[test]
    fn ephemeral_containers_are_found_as_the_containers_they_run_as() {
        let s = state();
        let debug = container(&s, "debug").unwrap_or_else(|r| panic!("{}", r.status()));
        assert_eq!(debug.spec.name, "debug");
        assert_eq!(debug.spec.tty, Some(true), "attach takes its terminal");
        assert_eq!(
            debug.running_id("p").ok().map(|i| i.0).as_deref(),
            Some("debug-0")
        );
        assert_eq!(debug.waiting_reason(), None);
        // In the spec, not yet reported: there, but not running.
        let later = container(&s, "later").unwrap_or_else(|r| panic!("{}", r.status()));
        assert_eq!(later.waiting_reason().as_deref(), Some("ContainerCreating"));
        let refused = later.running_id("p").map_err(|r| r.status());
        assert_eq!(refused.map(|i| i.0), Err(StatusCode::BAD_REQUEST));
    }

    #[test]
    fn unknown_containers_are_not_found() {
        let s = state();
        let r = container(&s, "nosuch").map(|c| c.spec.name.clone());
        assert_eq!(r.map_err(|r| r.status()), Err(StatusCode::NOT_FOUND));
    }
}
