//! What recent pulls found out of reach, and for how long a pull is not tried again:
//! a registry's host no connection could be made to (with the uplink gone, or
//! blackholed, where every try waits for its timeouts, the pods of a site that boots
//! offline must not queue behind one pull each), or one repository whose requests
//! failed on a host that was there (timed out, 5xx), which says nothing of the host's
//! other repositories. Memory only; what has expired is dropped as new failures come.

use std::collections::HashMap;
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

use super::super::reference::Reference;
use super::RegistryError;

/// How long what could not be reached is taken as still out of reach.
const UNREACHABLE_FOR: Duration = Duration::from_secs(30);

/// Until when, and why: hosts by registry name, repositories by `name/path`.
#[derive(Default)]
pub(crate) struct Unreachable {
    down: Mutex<HashMap<String, (Instant, String)>>,
}

/// A repository's key: `name/path`, which no registry name (without a `/`) can be.
fn repository_key(parsed: &Reference) -> String {
    format!("{}/{}", parsed.domain, parsed.path)
}

impl Unreachable {
    /// The error of a recent pull that found the host of `parsed`, or its repository,
    /// out of reach, while that is recent enough to be believed.
    pub(crate) fn recently(&self, parsed: &Reference) -> Option<RegistryError> {
        let down = self.down.lock().unwrap_or_else(PoisonError::into_inner);
        let now = Instant::now();
        let still = |key: &str| {
            let (until, error) = down.get(key)?;
            let left = until.checked_duration_since(now)?;
            Some(format!(
                "{error} (not tried again for another {}s)",
                left.as_secs().max(1)
            ))
        };
        if let Some(host) = still(&parsed.domain) {
            return Some(RegistryError::AllEndpoints {
                errors: vec![host.clone()],
                unreachable: true,
                hosts_down: Some(host),
            });
        }
        let repository = still(&repository_key(parsed))?;
        Some(RegistryError::AllEndpoints {
            errors: vec![repository],
            unreachable: true,
            hosts_down: None,
        })
    }

    /// Remembers what a pull of `parsed` found out of reach: the host when no
    /// connection was made, else only the repository. What answered is reachable.
    pub(crate) fn note(&self, parsed: &Reference, failure: Option<&RegistryError>) {
        let mut down = self.down.lock().unwrap_or_else(PoisonError::into_inner);
        let now = Instant::now();
        down.retain(|_, (until, _)| *until > now);
        let until = now + UNREACHABLE_FOR;
        let repository = repository_key(parsed);
        match failure {
            Some(e) if e.is_unreachable() => match e.host_unreachable() {
                Some(host) => {
                    down.insert(parsed.domain.clone(), (until, host));
                }
                None => {
                    // The host answered: only this repository is in trouble.
                    down.remove(&parsed.domain);
                    down.insert(repository, (until, crate::error_chain(e)));
                }
            },
            _ => {
                down.remove(&parsed.domain);
                down.remove(&repository);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_repository_that_fails_on_a_host_that_answers_is_remembered_alone() {
        let memo = Unreachable::default();
        let parse = |r: &str| Reference::parse(r).expect("reference");
        let hang = parse("reg.example/edge/hang:1");
        let timed_out = RegistryError::Transport {
            url: "https://reg.example/v2/edge/hang/manifests/1".into(),
            message: "timed out (receive response)".into(),
            connect: false,
        };
        memo.note(&hang, Some(&timed_out));
        let again = memo
            .recently(&parse("reg.example/edge/hang:2"))
            .expect("the repository is remembered");
        assert!(again.is_unreachable() && again.host_unreachable().is_none());
        assert!(again.to_string().contains("/v2/edge/hang/"), "{again}");
        // The host's other repositories are asked as ever.
        assert!(memo.recently(&parse("reg.example/edge/app:1")).is_none());

        // No connection at all: the whole host, in words naming no repository.
        let refused = RegistryError::Transport {
            url: "https://reg.example/v2/edge/hang/manifests/1".into(),
            message: "connection refused".into(),
            connect: true,
        };
        memo.note(&hang, Some(&refused));
        let other = memo
            .recently(&parse("reg.example/edge/app:1"))
            .expect("the host is remembered");
        let words = other.to_string();
        assert!(
            words.starts_with("https://reg.example:443: connection refused (not tried again"),
            "{words}"
        );
        assert!(other.host_unreachable().is_some());

        // An answer clears both.
        memo.note(&hang, None);
        assert!(memo.recently(&parse("reg.example/edge/app:1")).is_none());
        assert!(memo.recently(&hang).is_none());
    }
}
