//! resources: what pods get for what they ask (their requests and limits, summed in
//! [`crate::pod::requests`]): QoS class, the kubelet's pod cgroup hierarchy under
//! `cgroupRoot` (cgroup v1 and v2), and admission of a new pod against the node's
//! allocatable, sysctls and privileges.
//!
//! Writes only cgroupfs files under `cgroupRoot`; containers' own cgroups are
//! libcontainer's (made by the shims), never touched here except to remove a pod's
//! emptied subtree. Knows nothing of the apiserver.

pub mod admission;
pub mod cgroups;
pub mod qos;

pub use cgroups::CgroupTree;
pub use qos::Qos;

#[derive(Debug, thiserror::Error)]
pub enum ResourcesError {
    #[error("{context}")]
    Cgroup {
        context: String,
        #[source]
        source: std::io::Error,
    },
    #[error("pod resources: {0}")]
    Invalid(String),
}

impl ResourcesError {
    /// A cgroup that cannot be written now (still busy, or the hierarchy is missing a
    /// controller) may be fine on the next sync; an invalid quantity will not be.
    pub fn is_retryable(&self) -> bool {
        matches!(self, ResourcesError::Cgroup { .. })
    }
}
