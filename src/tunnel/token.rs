//! tunnel::token: the ServiceAccount token the node shows the proxy servers, when they
//! check tokens (`--agent-namespace`, `--agent-service-account`,
//! `--authentication-audience`) rather than client certificates.
//!
//! A node may ask the TokenRequest API only for a token bound to one of its own pods
//! (the NodeRestriction admission; the Node authorizer lets it ask for the ServiceAccounts
//! its pods use): the token is bound to a pod of that ServiceAccount running on this node,
//! such as the upstream agent's DaemonSet with a pause container. The pods' token
//! manager mints it, keeps it in the store and mints it again at 80 % of its hour, as it
//! does for the pods' projected tokens. A token the servers refuse is dropped, and the
//! pod looked up again, before the next dial.
//!
//! Calls block (requests to the apiserver): the dialler runs them on a blocking thread.

use std::sync::{Mutex, PoisonError};

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::List;

use crate::config::ServiceAccountToken;
use crate::kube::connect::SharedClient;
use crate::uplink::tokens::{TokenKey, TokenManager, DEFAULT_EXPIRATION_SECONDS};

/// What the tunnel needs of the cluster link to get a token.
#[derive(Clone)]
pub struct ClusterLink {
    pub client: SharedClient,
    pub tokens: TokenManager,
}

/// The tunnel's token: which ServiceAccount, and the pod it is bound to.
pub(super) struct TokenSource {
    link: Option<ClusterLink>,
    account: ServiceAccountToken,
    node: String,
    /// The token's key (with the pod it is bound to), once a pod is found.
    key: Mutex<Option<TokenKey>>,
}

impl TokenSource {
    pub(super) fn new(link: Option<ClusterLink>, account: ServiceAccountToken, node: &str) -> Self {
        TokenSource {
            link,
            account,
            node: node.to_string(),
            key: Mutex::new(None),
        }
    }

    /// The token, minted if the last one is old or there is none. An error says what
    /// the node lacks.
    pub(super) fn token(&self) -> Result<String, String> {
        let link = self.link.as_ref().ok_or_else(|| {
            "a ServiceAccount token comes from the apiserver, and this node has no kubeconfig"
                .to_string()
        })?;
        let cached = self.slot().clone();
        let key = match cached {
            Some(key) => key,
            None => {
                let key = self.key_for(self.holder(link)?);
                log::info!(
                    "tunnel: the token of ServiceAccount {}/{} for {} is bound to pod {}/{}",
                    key.namespace,
                    key.service_account,
                    key.audience,
                    key.namespace,
                    key.pod_name
                );
                *self.slot() = Some(key.clone());
                key
            }
        };
        link.tokens.get(&key).map_err(|e| {
            // The pod may be gone: look again next time.
            *self.slot() = None;
            format!("{} (bound to pod {}/{})", e, key.namespace, key.pod_name)
        })
    }

    /// The servers refused the token: the next dial mints another, bound to whatever pod
    /// of the ServiceAccount runs here then.
    pub(super) fn refused(&self) {
        if let (Some(link), Some(key)) = (self.link.as_ref(), self.slot().take()) {
            if let Err(e) = link.tokens.remove(&key) {
                log::warn!("tunnel: dropping the refused token: {e}");
            }
        }
    }

    fn slot(&self) -> std::sync::MutexGuard<'_, Option<TokenKey>> {
        self.key.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn key_for(&self, pod: (String, String)) -> TokenKey {
        TokenKey {
            namespace: self.account.namespace.clone(),
            service_account: self.account.name.clone(),
            audience: self.account.audience.clone(),
            expiration_seconds: DEFAULT_EXPIRATION_SECONDS,
            pod_name: pod.0,
            pod_uid: pod.1,
        }
    }

    /// A pod of the ServiceAccount on this node that is not on its way out: its name and
    /// uid.
    fn holder(&self, link: &ClusterLink) -> Result<(String, String), String> {
        let client = link
            .client
            .get()
            .ok_or("the node has not reached the apiserver yet")?;
        let selector = format!(
            "spec.nodeName={},spec.serviceAccountName={}",
            self.node, self.account.name
        );
        let path = format!(
            "/api/v1/pods?fieldSelector={}",
            crate::wire::escape(&selector)
        );
        let pods: List<Pod> = client.get(&path).map_err(|e| e.to_string())?;
        pick(&pods.items, &self.account.namespace).ok_or_else(|| {
            format!(
                "no pod of ServiceAccount {}/{} runs on node {}: a node may only ask for a \
                 token bound to one of its pods (NodeRestriction); run one there, such as the \
                 DaemonSet in the tunnel's documentation",
                self.account.namespace, self.account.name, self.node
            )
        })
    }
}

/// The first pod of `namespace` that is neither deleted nor finished.
fn pick(pods: &[Pod], namespace: &str) -> Option<(String, String)> {
    pods.iter().find_map(|p| {
        let m = &p.metadata;
        let phase = p.status.as_ref().and_then(|s| s.phase.as_deref());
        let live = m.deletion_timestamp.is_none() && !matches!(phase, Some("Succeeded" | "Failed"));
        (live && m.namespace.as_deref() == Some(namespace))
            .then(|| Some((m.name.clone()?, m.uid.clone()?)))
            .flatten()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(ns: &str, name: &str, phase: &str, deleted: bool) -> Pod {
        let mut p: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"namespace": ns, "name": name, "uid": format!("uid-{name}")},
            "status": {"phase": phase},
        }))
        .expect("pod");
        if deleted {
            p.metadata.deletion_timestamp = Some(
                k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(crate::time::now()),
            );
        }
        p
    }

    #[test]
    fn the_token_is_bound_to_a_live_pod_of_its_namespace() {
        let pods = [
            pod("default", "same-name-elsewhere", "Running", false),
            pod("kube-system", "finished", "Succeeded", false),
            pod("kube-system", "going", "Running", true),
            pod("kube-system", "agent-x7", "Running", false),
        ];
        assert_eq!(
            pick(&pods, "kube-system"),
            Some(("agent-x7".into(), "uid-agent-x7".into()))
        );
        assert_eq!(pick(&pods[..3], "kube-system"), None);
    }
}
