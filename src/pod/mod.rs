//! pod: what every layer says about a pod, in one place low in the layers (above the
//! runtime and the store, below the sources, volumes, resources and the sync loop): its
//! annotations (where it came from, its config hash, the mirror's mark) and the
//! downward API's references into it. Pure functions of a pod spec: no I/O, no store,
//! no apiserver.

pub mod annotations;
pub mod downward;
pub mod requests;

pub use annotations::{is_mirror, is_static_pod};
