//! The apiserver side of delegated auth: a TokenReview or SubjectAccessReview posted
//! with the node's own credentials (the agent's one client), on a blocking thread, each call
//! bounded by [`CALL_TIMEOUT`]. Says whether the apiserver answered, refused (a 4xx:
//! its message), or could not be asked (and why). After a call that could not reach
//! it, the next [`RETRY_AFTER`] answer "could not be asked" at once, so that requests
//! while the link is down do not each wait out a timeout.

use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use tokio::sync::Semaphore;

use crate::kube::connect::SharedClient;
use crate::kube::error::ApiError;

/// The longest one review may take, a wait for a free slot included.
pub const CALL_TIMEOUT: Duration = Duration::from_secs(10);
/// How long after a failed call the apiserver is taken to be unreachable.
pub const RETRY_AFTER: Duration = Duration::from_secs(3);
/// Reviews in flight at once; more wait (within the timeout).
const SLOTS: usize = 4;

pub const TOKEN_REVIEWS: &str = "/apis/authentication.k8s.io/v1/tokenreviews";
pub const ACCESS_REVIEWS: &str = "/apis/authorization.k8s.io/v1/subjectaccessreviews";

/// What became of one review.
#[derive(Debug, Clone, PartialEq)]
pub enum Answer {
    /// The apiserver's review, with its `status`.
    Got(serde_json::Value),
    /// The apiserver refused the review (4xx): its words.
    Refused(String),
    /// The apiserver could not be asked: why.
    Unreachable(String),
}

/// The apiserver as delegated auth reaches it.
pub struct Apiserver {
    /// The agent's client; its certificate is rotated in place, never here.
    client: Option<SharedClient>,
    /// Since when, and why, the apiserver could not be reached.
    down: Mutex<Option<(Instant, String)>>,
    slots: Semaphore,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Apiserver {
    /// `None`: a node with no kubeconfig, which has nobody to ask.
    pub fn new(client: Option<SharedClient>) -> Self {
        Apiserver {
            client,
            down: Mutex::new(None),
            slots: Semaphore::new(SLOTS),
        }
    }

    /// Posts `body` to `path` (one of the review paths). Never logs the body: a
    /// TokenReview carries the client's token.
    pub async fn post(&self, path: &'static str, body: serde_json::Value) -> Answer {
        let Some(shared) = &self.client else {
            return Answer::Unreachable("this node has no kubeconfig".into());
        };
        let Some(client) = shared.get() else {
            return Answer::Unreachable("the node's kubeconfig cannot be used yet".into());
        };
        if let Some((since, why)) = lock(&self.down).clone() {
            if since.elapsed() < RETRY_AFTER {
                return Answer::Unreachable(why);
            }
        }
        let call = async {
            let Ok(_slot) = self.slots.acquire().await else {
                return Answer::Unreachable("shutting down".into());
            };
            let task = tokio::task::spawn_blocking(move || {
                client.post::<_, serde_json::Value>(path, &body)
            });
            match task.await {
                Ok(Ok(v)) => Answer::Got(v),
                // The node's own credentials refused: the review was never made.
                Ok(Err(ApiError::Status {
                    code: 401,
                    reason,
                    message,
                    ..
                })) => Answer::Unreachable(format!(
                    "it refused this node's credentials (401 {reason}: {message})"
                )),
                Ok(Err(ApiError::Status {
                    code,
                    reason,
                    message,
                    ..
                })) if (400..500).contains(&code) => {
                    Answer::Refused(format!("{code} {reason}: {message}"))
                }
                Ok(Err(ApiError::Status {
                    code,
                    reason,
                    message,
                    ..
                })) => Answer::Unreachable(format!("it answered {code} {reason}: {message}")),
                Ok(Err(e)) => Answer::Unreachable(e.to_string()),
                Err(e) => Answer::Unreachable(format!("review thread: {e}")),
            }
        };
        let answer = match tokio::time::timeout(CALL_TIMEOUT, call).await {
            Ok(a) => a,
            Err(_) => Answer::Unreachable(format!("no answer within {CALL_TIMEOUT:?}")),
        };
        match &answer {
            Answer::Unreachable(why) => *lock(&self.down) = Some((Instant::now(), why.clone())),
            _ => *lock(&self.down) = None,
        }
        answer
    }
}
