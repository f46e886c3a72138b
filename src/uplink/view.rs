//! What `holdfast status` and the kubelet API's metrics read of a running uplink: the
//! link, the outbox and the client certificate. Read-only; cheap to clone.

use crate::kube::cert_state::ClientCertState;
use crate::kube::link::{Link, LinkReport};

use super::report::{Depth, Outbox};

/// What `holdfast status` reads from a running uplink. Cheap to clone.
#[derive(Clone)]
pub struct UplinkView {
    pub link: Link,
    pub outbox: Outbox,
    /// The client certificate: until when, and why there is no working one.
    pub credentials: ClientCertState,
}

impl UplinkView {
    pub fn link(&self) -> LinkReport {
        self.link.report()
    }
    pub fn outbox(&self) -> Depth {
        self.outbox.depth_report()
    }
}
