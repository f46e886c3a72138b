//! Service-account tokens for pods' projected `serviceAccountToken` sources, as the
//! kubelet's token manager gets them: minted by the TokenRequest API (`POST
//! /api/v1/namespaces/<ns>/serviceaccounts/<sa>/token`, bound to the pod by name and
//! uid, which is what NodeRestriction lets a node ask for), kept until older than 80 %
//! of their TTL or 24 h, then minted again.
//!
//! Owns the store tree [`TREE_TOKENS`], keyed `<pod uid>/<namespace>/<service
//! account>/<audience>/<expirationSeconds>`, so that a pod that restarts, or a device
//! that reboots, with no uplink gets its last token back: the apiserver's
//! `--service-account-extend-token-expiration` makes kube-api-access tokens valid for a
//! year whatever `expirationTimestamp` says, so an old copy is worth more than no
//! token. Token values are in the store's database like Secrets (the store directory is
//! 0700) and are never logged: [`CachedToken`] has no `Debug`, log lines and errors name
//! the key only.
//!
//! Calls block (a request to the apiserver): the volume code calls [`TokenManager::get`]
//! on the blocking thread that sets a pod's volumes up, never on the sync loop.

use std::sync::{Arc, Mutex, PoisonError};

use k8s_openapi::api::authentication::v1::{BoundObjectReference, TokenRequest, TokenRequestSpec};
use serde::{Deserialize, Serialize};

use crate::kube::client::Client;
use crate::kube::error::ApiError;
use crate::kube::link::Link;
use crate::store::{Store, StoreError, Tree};

/// Store tree holding the pods' service-account tokens.
pub const TREE_TOKENS: &str = "serviceaccounttokens";

/// A token older than this is minted again, whatever its TTL (the kubelet's maxTTL).
const MAX_TTL_SECONDS: i64 = 24 * 3600;
/// Up to this much earlier, drawn per check, so pods started together do not refresh
/// together (the kubelet's maxJitter).
const MAX_JITTER_SECONDS: i64 = 10;
/// `expirationSeconds` when the source has none (the API's default).
pub const DEFAULT_EXPIRATION_SECONDS: i64 = 3600;

#[derive(Debug, thiserror::Error)]
pub enum TokenError {
    /// The kubelet's words: `failed to fetch token: <the apiserver's message>`.
    #[error("failed to fetch token: {0}")]
    Fetch(String),
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// What a token is asked for: one `serviceAccountToken` source of one pod.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TokenKey {
    pub namespace: String,
    pub service_account: String,
    /// Empty: the apiserver's own audiences.
    pub audience: String,
    pub expiration_seconds: i64,
    pub pod_name: String,
    pub pod_uid: String,
}

impl TokenKey {
    /// The key in the store tree; it names no secret, so it may be logged.
    pub fn store_key(&self) -> String {
        format!(
            "{}/{}/{}/{}/{}",
            self.pod_uid,
            self.namespace,
            self.service_account,
            self.audience,
            self.expiration_seconds
        )
    }

    /// The TokenRequest the kubelet sends for this source.
    pub fn request(&self) -> TokenRequest {
        TokenRequest {
            spec: TokenRequestSpec {
                audiences: if self.audience.is_empty() {
                    Vec::new()
                } else {
                    vec![self.audience.clone()]
                },
                expiration_seconds: Some(self.expiration_seconds),
                bound_object_ref: Some(BoundObjectReference {
                    api_version: Some("v1".into()),
                    kind: Some("Pod".into()),
                    name: Some(self.pod_name.clone()),
                    uid: Some(self.pod_uid.clone()),
                }),
            },
            ..TokenRequest::default()
        }
    }

    fn path(&self) -> String {
        format!(
            "/api/v1/namespaces/{}/serviceaccounts/{}/token",
            crate::kube::escape(&self.namespace),
            crate::kube::escape(&self.service_account)
        )
    }
}

/// A minted token as the store keeps it. No `Debug`: it holds the token.
#[derive(Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CachedToken {
    pub token: String,
    /// `status.expirationTimestamp`, Unix seconds.
    pub expiration: i64,
    /// `spec.expirationSeconds` of the answer: `expiration` minus this is when it was
    /// issued.
    pub expiration_seconds: i64,
}

impl CachedToken {
    /// Reads the apiserver's answer.
    pub fn from_response(tr: &TokenRequest, asked: i64) -> Result<CachedToken, String> {
        let status = tr.status.as_ref().ok_or("the answer has no status")?;
        if status.token.is_empty() {
            return Err("the answer has no token".into());
        }
        Ok(CachedToken {
            token: status.token.clone(),
            expiration: status.expiration_timestamp.0.as_second(),
            expiration_seconds: tr.spec.expiration_seconds.unwrap_or(asked),
        })
    }

    /// Whether the kubelet would mint it again at `now` (Unix seconds): older than
    /// 24 h, or within 20 % of its TTL of expiring, both less `jitter` seconds.
    pub fn requires_refresh(&self, now: i64, jitter: i64) -> bool {
        let issued = self.expiration - self.expiration_seconds;
        if now > issued + MAX_TTL_SECONDS - jitter {
            return true;
        }
        now > self.expiration - self.expiration_seconds * 20 / 100 - jitter
    }
}

/// Mints tokens; the apiserver client, or a double in tests.
pub trait Minter: Send + Sync {
    fn mint(&self, key: &TokenKey) -> Result<CachedToken, ApiError>;
}

impl Minter for Client {
    fn mint(&self, key: &TokenKey) -> Result<CachedToken, ApiError> {
        let path = key.path();
        let answer: TokenRequest = self.post(&path, &key.request())?;
        CachedToken::from_response(&answer, key.expiration_seconds).map_err(|message| {
            ApiError::Decode {
                method: "POST",
                path,
                message,
            }
        })
    }
}

struct Inner {
    minter: Mutex<Option<Arc<dyn Minter>>>,
    link: Option<Link>,
    /// The last failure logged per key, so a retry every few seconds logs once.
    said: Mutex<std::collections::BTreeMap<String, String>>,
}

/// The node's service-account tokens. Cheap to clone; clones share the store tree and
/// the apiserver client, and are safe to use from any thread.
#[derive(Clone)]
pub struct TokenManager {
    tree: Tree<CachedToken>,
    inner: Arc<Inner>,
}

impl TokenManager {
    /// A manager with no apiserver yet (standalone, or until the uplink has read its
    /// kubeconfig): it serves what the store holds. `link`: while it is down, a cached
    /// token is served without trying the apiserver.
    pub fn open(store: &Store, link: Option<Link>) -> Result<TokenManager, StoreError> {
        Ok(TokenManager {
            tree: store.tree(TREE_TOKENS)?,
            inner: Arc::new(Inner {
                minter: Mutex::new(None),
                link,
                said: Mutex::new(Default::default()),
            }),
        })
    }

    /// From now on tokens are minted by `minter`.
    pub fn set_minter(&self, minter: Arc<dyn Minter>) {
        *self
            .inner
            .minter
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = Some(minter);
    }

    /// The token for `key`, as the kubelet's GetServiceAccountToken: the cached one
    /// while it needs no refresh; else a new one; if that fails, the cached one
    /// (expired or not: offline it is all there is, and a kube-api-access token
    /// outlives its `expirationTimestamp`); with nothing cached, the error.
    pub fn get(&self, key: &TokenKey) -> Result<String, TokenError> {
        let jitter = (crate::backoff::random() % (MAX_JITTER_SECONDS as u64 + 1)) as i64;
        self.get_at(key, crate::time::now().as_second(), jitter)
    }

    /// [`get`](Self::get) at `now` (Unix seconds) with `jitter`.
    pub fn get_at(&self, key: &TokenKey, now: i64, jitter: i64) -> Result<String, TokenError> {
        let store_key = key.store_key();
        let cached = self.tree.get(&store_key)?;
        if let Some(c) = &cached {
            let down = self.inner.link.as_ref().is_some_and(Link::is_down);
            if down && c.expiration <= now {
                self.said(
                    &store_key,
                    Some(format!(
                        "service-account token {store_key}: {}; the apiserver is out of reach, so the pod keeps it",
                        expired_at(c.expiration)
                    )),
                );
                return Ok(c.token.clone());
            }
            if down || !c.requires_refresh(now, jitter) {
                return Ok(c.token.clone());
            }
        }
        let minter = self
            .inner
            .minter
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        let result = match minter {
            Some(m) => m.mint(key).map_err(|e| message(&e)),
            None => Err("the node has not reached the apiserver yet".to_string()),
        };
        match (result, cached) {
            (Ok(minted), _) => {
                self.tree.put(&store_key, &minted)?;
                self.said(&store_key, None);
                Ok(minted.token)
            }
            (Err(reason), Some(c)) => {
                let age = if c.expiration <= now {
                    format!(" ({})", expired_at(c.expiration))
                } else {
                    String::new()
                };
                self.said(
                    &store_key,
                    Some(format!(
                        "service-account token {store_key}: couldn't update token: {reason}; the pod keeps its last one{age}"
                    )),
                );
                Ok(c.token)
            }
            (Err(reason), None) => {
                self.said(
                    &store_key,
                    Some(format!(
                        "service-account token {store_key}: failed to fetch token: {reason}"
                    )),
                );
                Err(TokenError::Fetch(reason))
            }
        }
    }

    /// Drops the token for `key` (its user was refused it): the next `get` mints one.
    pub fn remove(&self, key: &TokenKey) -> Result<(), StoreError> {
        self.tree.remove(&key.store_key())?;
        Ok(())
    }

    /// Drops every token of pod `uid` (the pod is gone).
    pub fn forget(&self, uid: &str) -> Result<usize, StoreError> {
        let prefix = format!("{uid}/");
        let keys = self.tree.scan_prefix(&prefix)?;
        for (k, _) in &keys {
            self.tree.remove(k)?;
        }
        self.inner
            .said
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .retain(|k, _| !k.starts_with(&prefix));
        Ok(keys.len())
    }

    /// Drops the tokens of every pod whose uid `keep` refuses (pods removed while the
    /// agent was not running).
    pub fn retain(&self, keep: impl Fn(&str) -> bool) -> Result<(), StoreError> {
        for k in self.tree.keys()? {
            let uid = k.split('/').next().unwrap_or_default();
            if !keep(uid) {
                self.tree.remove(&k)?;
            }
        }
        Ok(())
    }

    /// Logs a failure once per distinct message; `None`: it works again.
    fn said(&self, key: &str, failure: Option<String>) {
        let mut said = self
            .inner
            .said
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        match failure {
            None => {
                said.remove(key);
            }
            Some(m) => {
                if said.get(key) != Some(&m) {
                    log::error!("{m}");
                    said.insert(key.to_string(), m);
                }
            }
        }
    }
}

/// `expired at <time>`: what a log line says of a token served past its
/// `expirationTimestamp` (the apiserver's `--service-account-extend-token-expiration`
/// still accepts a kube-api-access token for a year; a token with its own audience or
/// TTL it does not).
fn expired_at(expiration: i64) -> String {
    format!("expired at {}", crate::time::show_unix(expiration))
}

/// What was last said of `key`, for tests.
#[cfg(test)]
impl TokenManager {
    fn last_said(&self, key: &str) -> Option<String> {
        self.inner
            .said
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(key)
            .cloned()
    }
}

/// The apiserver's own message for a refusal (as client-go's error reads), else the
/// error.
fn message(e: &ApiError) -> String {
    match e {
        ApiError::Status { message, .. } if !message.is_empty() => message.clone(),
        other => other.to_string(),
    }
}

#[cfg(test)]
#[path = "tokens_tests.rs"]
mod tests;
