//! The images this node's pods use, as image GC, reclaim under disk pressure and
//! `holdfast image prune` must spare them: every image the spec of a pod the sync loop
//! runs names and every image its containers run or ran, and every image the spec of
//! each desired pod of every source in the store names. The desired pods count whether
//! or not the sync loop has taken them up: a static pod refused at admission, failed, or
//! not yet started keeps its image, so that the agent can start it again with no
//! registry in reach (standalone, or with the uplink down).

use k8s_openapi::api::core::v1::Pod;

use super::view::PodStates;
use crate::image::gc::{ImagesInUse, InUse};
use crate::source::DesiredPod;
use crate::store::{StoreError, Tree};

/// The pods' images, read from the store at each ask. Cheap to clone (handles).
#[derive(Clone)]
pub struct NodeImages {
    podstates: PodStates,
    desired: Tree<DesiredPod>,
}

impl NodeImages {
    /// The images of the pods in `podstates` and of the desired pods in its store.
    pub fn new(podstates: &PodStates) -> Result<NodeImages, StoreError> {
        Ok(NodeImages {
            podstates: podstates.clone(),
            desired: podstates.store().tree(crate::source::PODS_TREE)?,
        })
    }
}

impl ImagesInUse for NodeImages {
    fn images_in_use(&self) -> Result<InUse, StoreError> {
        let running = self.podstates.list()?;
        let desired: Vec<Pod> = self
            .desired
            .entries()?
            .into_iter()
            .map(|(_, d)| d.pod)
            .collect();
        Ok(InUse::from_pods(
            running
                .iter()
                .map(|p| (p.pod(), Some(p.status())))
                .chain(desired.iter().map(|p| (p, None))),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::Store;

    fn pod(name: &str, image: &str) -> Pod {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": name, "namespace": "default", "uid": name},
            "spec": {"containers": [{"name": "c", "image": image}]}
        }))
        .expect("pod")
    }

    fn record(reference: &str) -> crate::image::ImageRecord {
        crate::image::ImageRecord {
            references: vec![reference.into()],
            manifest_digest: format!("sha256:m-{reference}"),
            config_digest: format!("sha256:c-{reference}"),
            layers: Vec::new(),
            size: 0,
            imported_at: crate::time::now(),
            last_used: None,
            pinned: false,
        }
    }

    #[test]
    fn a_desired_pod_not_taken_up_keeps_its_image() {
        let dir = crate::testutil::TempDir::new("node-images");
        let store = Store::open(&dir.0.join("db")).expect("store");
        let states = PodStates::open(&store).expect("tree");
        let state = super::super::worker::PodState {
            pod: pod("running", "busybox:1"),
            status: Default::default(),
            start_time: crate::time::now(),
            stop_deadline: None,
        };
        states.tree().put("running", &state).expect("put");
        // A static pod the mux keeps, with no state of the sync loop (refused, or not
        // taken up yet).
        let desired: Tree<DesiredPod> = store.tree(crate::source::PODS_TREE).expect("tree");
        let static_pod = DesiredPod {
            source: crate::pod::annotations::SOURCE_FILE.into(),
            pod: pod("static", "registry.local/site/app:2"),
        };
        desired.put("static", &static_pod).expect("put");
        let in_use = NodeImages::new(&states)
            .expect("node images")
            .images_in_use()
            .expect("in use");
        assert!(in_use.uses(&record("docker.io/library/busybox:1")));
        assert!(in_use.uses(&record("registry.local/site/app:2")));
        assert!(!in_use.uses(&record("registry.local/site/app:1")));
    }
}
