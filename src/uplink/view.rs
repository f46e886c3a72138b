//! What `holdfast status` and the kubelet API's metrics read of a running uplink: the
//! link, the outbox, the client certificate and the apiserver endpoint in use.
//! Read-only; cheap to clone.

use crate::kube::cert_state::ClientCertState;
use crate::kube::connect::SharedClient;
use crate::kube::link::{Link, LinkReport};

use super::report::{Depth, Outbox};

/// What `holdfast status` reads from a running uplink. Cheap to clone.
#[derive(Clone)]
pub struct UplinkView {
    pub link: Link,
    pub outbox: Outbox,
    /// The client certificate: until when, and why there is no working one.
    pub credentials: ClientCertState,
    /// The apiserver client, once it is made: which endpoint it uses.
    pub client: SharedClient,
}

impl UplinkView {
    pub fn link(&self) -> LinkReport {
        self.link.report()
    }
    pub fn outbox(&self) -> Depth {
        self.outbox.depth_report()
    }
    /// The apiserver endpoint in use: its URL, its place in the list (0: the
    /// kubeconfig's server) and how many there are; `None` before the client is made.
    pub fn apiserver(&self) -> Option<(String, usize, usize)> {
        let client = self.client.get()?;
        let (place, count) = client.server_place();
        Some((client.server(), place, count))
    }
}
