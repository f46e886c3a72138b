//! pod: what every layer says about a pod, in one place low in the layers: its
//! annotations (where it came from, its config hash, the mirror's mark), the downward
//! API's references into it, its requests and limits summed as the kubelet sums them,
//! and its ephemeral containers as the containers they run as. Pure functions of a pod
//! spec that import only the small leaves (quantities), so the sources, volumes,
//! resources, eviction, the uplink and the sync loop read a pod here, and the runtime
//! too (it labels a container with the pod's source). No I/O, no store, no apiserver.

pub mod annotations;
pub mod downward;
pub mod ephemeral;
pub mod requests;

pub use annotations::{is_mirror, is_static_pod};
