//! control: the local control socket, `<root-dir>/holdfast.sock` (mode 0600, root only).
//!
//! sled lets one process open the store, so while `holdfast run` holds it, the other
//! subcommands (`pods`, `image ...`) ask the running agent through this socket; when no
//! agent runs they open the store themselves. One request line, one JSON answer.

pub mod client;
pub mod presence;
mod pull;
pub mod server;
pub mod status;

use serde::{Deserialize, Serialize};

/// The socket's file name under the root dir.
pub const SOCKET: &str = "holdfast.sock";

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "camelCase")]
pub enum Request {
    Pods,
    ImageImport {
        path: String,
        /// `--pin`: GC and `image prune` keep the images imported.
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        pin: bool,
    },
    ImageList,
    ImageRemove {
        reference: String,
    },
    /// `holdfast image pull`: answered by the agent only, with progress lines first.
    ImagePull {
        reference: String,
        #[serde(default)]
        platform: Option<String>,
        /// A docker config file whose credentials come before the node's.
        #[serde(default)]
        creds: Option<String>,
    },
    /// `holdfast image prune`: every image no pod uses.
    ImagePrune,
    /// `holdfast status`: answered by the agent only.
    Status,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "result", rename_all = "camelCase")]
pub enum Response {
    Pods {
        pods: Vec<crate::sync::PodView>,
    },
    Images {
        images: Vec<crate::image::ImageRecord>,
    },
    Status {
        status: status::AgentStatus,
    },
    /// One step of a pull; more lines follow.
    Progress {
        progress: crate::image::registry::Progress,
    },
    Pulled {
        image: crate::image::ImageRecord,
        downloaded: u64,
        seconds: f64,
    },
    Done,
    Error {
        message: String,
    },
}

#[derive(Debug, thiserror::Error)]
pub enum ControlError {
    /// No agent listens: the caller may open the store itself.
    #[error("no holdfast agent is listening on {path}")]
    NotRunning { path: String },
    #[error("control socket {path}: {source}")]
    Io {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("control socket {path}: bad answer: {source}")]
    Decode {
        path: String,
        #[source]
        source: serde_json::Error,
    },
    #[error("{message}")]
    Remote { message: String },
}

/// Carries out a request against the store; shared by the agent (on behalf of a
/// client) and the CLI (when no agent runs).
pub fn execute(
    images: &crate::image::ImageStore,
    podstates: &crate::sync::PodStates,
    req: Request,
) -> Response {
    let fail = |message: String| Response::Error { message };
    match req {
        Request::Pods => match podstates.list() {
            Ok(pods) => Response::Pods { pods },
            Err(e) => fail(e.to_string()),
        },
        Request::ImageImport { path, pin } => {
            let path = std::path::Path::new(&path);
            let imported = if pin {
                images.import_pinned(path)
            } else {
                images.import(path)
            };
            // An import decompresses and hashes whole layers: give the buffers back.
            crate::malloc::trim_and_log("an image import");
            match imported {
                Ok(images) => Response::Images { images },
                Err(e) => fail(e.to_string()),
            }
        }
        Request::ImageList => match images.list().and_then(|l| Ok(images.pins()?.shown(l))) {
            Ok(images) => Response::Images { images },
            Err(e) => fail(e.to_string()),
        },
        // Without an agent the CLI reads the root dir itself (`status::from_root`).
        Request::Status => fail("status: no agent to ask".into()),
        // Without an agent the CLI pulls itself.
        Request::ImagePull { .. } => fail("pull: no agent to ask".into()),
        Request::ImagePrune => {
            // Without knowing what pods use, nothing may go.
            let pruned = pods_in_use(podstates)
                .map_err(|e| format!("prune: read the pods' images: {e}"))
                .and_then(|in_use| {
                    crate::image::gc::prune(images, &in_use).map_err(|e| e.to_string())
                });
            match pruned {
                Ok(images) => Response::Images { images },
                Err(e) => fail(e),
            }
        }
        Request::ImageRemove { reference } => {
            let in_use = images_in_use(podstates);
            match images.remove(&reference, &in_use) {
                Ok(()) => Response::Done,
                Err(e) => fail(e.to_string()),
            }
        }
    }
}

/// Images the pods the store knows of want or run (see [`crate::sync::NodeImages`]).
pub fn pods_in_use(
    podstates: &crate::sync::PodStates,
) -> Result<crate::image::gc::InUse, crate::store::StoreError> {
    use crate::image::gc::ImagesInUse;
    crate::sync::NodeImages::new(podstates)?.images_in_use()
}

/// Image ids of every container instance the store knows of.
fn images_in_use(podstates: &crate::sync::PodStates) -> Vec<String> {
    let mut out = Vec::new();
    if let Ok(pods) = podstates.list() {
        for s in pods {
            for cs in s.status().container_statuses.iter().flatten() {
                if !cs.image_id.is_empty() {
                    out.push(cs.image_id.clone());
                }
            }
        }
    }
    out
}
