//! What the agent remembers of each container of a pod, across restarts (tree
//! `containers`, key `<pod uid>/<container name>`).

use serde::{Deserialize, Serialize};

use crate::runtime::{ContainerId, ExitInfo};
use crate::time::Timestamp;

/// One container of a pod: its current instance and what came before.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ContainerRecord {
    pub name: String,
    /// How many times the container was restarted; also the index of `current`.
    pub restart_count: u32,
    /// The newest instance, if one was ever created.
    pub current: Option<Instance>,
    /// How the previous instance ended (`lastState`).
    pub last: Option<Terminated>,
    /// Consecutive failed runs (shorter than the back-off reset): the back-off step.
    pub failures: u32,
    /// Why no instance runs now, when that is not a back-off (image missing, create error).
    pub waiting: Option<Waiting>,
}

impl ContainerRecord {
    pub fn new(name: &str) -> Self {
        ContainerRecord {
            name: name.to_string(),
            restart_count: 0,
            current: None,
            last: None,
            failures: 0,
            waiting: None,
        }
    }

    /// The store key of this record.
    pub fn key(pod_uid: &str, name: &str) -> String {
        format!("{pod_uid}/{name}")
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Instance {
    pub id: ContainerId,
    /// The image as the pod names it.
    pub image: String,
    /// `sha256:<config digest>`.
    pub image_id: String,
    pub state: InstanceState,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum InstanceState {
    Running { started_at: Timestamp },
    Terminated(Terminated),
}

/// A finished instance, as `state.terminated` / `lastState.terminated` report it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Terminated {
    pub container_id: Option<String>,
    pub exit_code: i32,
    pub signal: Option<i32>,
    pub reason: String,
    pub message: Option<String>,
    pub started_at: Option<Timestamp>,
    pub finished_at: Timestamp,
}

impl Terminated {
    /// From the runtime's exit record, with the kubelet's reasons.
    pub fn from_exit(id: &ContainerId, exit: &ExitInfo) -> Self {
        let reason = if exit.start_error.is_some() {
            "StartError"
        } else if exit.oom_killed {
            "OOMKilled"
        } else if exit.exit_code == 0 {
            "Completed"
        } else {
            "Error"
        };
        Terminated {
            container_id: Some(id.uri()),
            exit_code: exit.exit_code,
            signal: exit.signal,
            reason: reason.to_string(),
            message: exit.start_error.clone(),
            started_at: exit.started_at,
            finished_at: exit.finished_at,
        }
    }

    /// A container the runtime lost track of (its shim and process are gone with no
    /// exit record, for example after a reboot).
    pub fn lost(id: &ContainerId, started_at: Option<Timestamp>, now: Timestamp) -> Self {
        Terminated {
            container_id: Some(id.uri()),
            exit_code: 255,
            signal: None,
            reason: "Unknown".to_string(),
            message: Some("the container's process was gone when holdfast looked for it (was the device rebooted?)".to_string()),
            started_at,
            finished_at: now,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Waiting {
    pub reason: String,
    pub message: Option<String>,
}
