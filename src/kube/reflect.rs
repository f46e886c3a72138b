//! What the list-and-watch loops (the api pod source, the Service cache) share, as
//! client-go's reflector does it: every page of a LIST, restarted once when its
//! continue token outlives etcd's compaction; a watch stream read ahead on a thread of
//! its own; each watch item sorted into a change or the reason the watch ends; and the
//! count of consecutive failures, each kind logged once while it repeats.

use std::fmt::Display;
use std::io;
use std::sync::mpsc::{sync_channel, Receiver};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::WatchEvent;

use super::ApiError;

/// Events read ahead of a loop; the reader waits when it is full.
const EVENT_QUEUE: usize = 64;

/// One watch item.
pub type Item<T> = Result<WatchEvent<T>, ApiError>;

/// What a LIST gave: the items kept, and the list's resourceVersion (`None` when the
/// server sent none, which the caller refuses in its own words).
pub struct Listed<U> {
    pub items: Vec<U>,
    pub resource_version: Option<String>,
}

/// Why a LIST did not complete.
#[derive(Debug)]
pub enum ListError {
    Api(ApiError),
    /// More pages than a node agent keeps.
    TooManyPages(usize),
}

/// Every page, `page(continue_token)` after `page(None)`, with what `keep` keeps of
/// each item (so that only that is held while the pages come). A 410 on a continue
/// page starts again from the first, once; `label` names the loop in that log line.
pub fn list_pages<T, U>(
    label: &str,
    max_pages: usize,
    mut page: impl FnMut(Option<&str>) -> Result<k8s_openapi::List<T>, ApiError>,
    mut keep: impl FnMut(T) -> Option<U>,
) -> Result<Listed<U>, ListError>
where
    T: k8s_openapi::ListableResource,
{
    let mut restarted = false;
    'list: loop {
        let mut items = Vec::new();
        let mut resource_version: Option<String> = None;
        let mut token: Option<String> = None;
        for _ in 0..max_pages {
            let list = match page(token.as_deref()) {
                Ok(list) => list,
                Err(e) if e.is_gone() && token.is_some() && !restarted => {
                    log::info!("{label}: {e}; listing again from the start");
                    restarted = true;
                    continue 'list;
                }
                Err(e) => return Err(ListError::Api(e)),
            };
            if resource_version.is_none() {
                resource_version = list.metadata.resource_version.clone();
            }
            items.extend(list.items.into_iter().filter_map(&mut keep));
            token = list.metadata.continue_.filter(|t| !t.is_empty());
            if token.is_none() {
                return Ok(Listed {
                    items,
                    resource_version: resource_version.filter(|rv| !rv.is_empty()),
                });
            }
        }
        return Err(ListError::TooManyPages(max_pages));
    }
}

/// Drains `stream` on a thread named `name` into a bounded queue, so that a loop can
/// wait for events with a timeout (to notice it should stop, that the link fell, or
/// that held-back changes are due). The queue disconnects when the stream ends; the
/// thread ends with the stream or when the loop drops the queue.
pub fn read_ahead<T: Send + 'static>(
    stream: impl Iterator<Item = Item<T>> + Send + 'static,
    name: &str,
) -> io::Result<Receiver<Item<T>>> {
    let (tx, rx) = sync_channel(EVENT_QUEUE);
    std::thread::Builder::new()
        .name(name.into())
        .spawn(move || {
            for item in stream {
                if tx.send(item).is_err() {
                    return;
                }
            }
        })?;
    Ok(rx)
}

/// A watch item sorted.
pub enum Change<T> {
    /// ADDED or MODIFIED.
    Upsert(T),
    Delete(T),
    /// A BOOKMARK: the stream is at this resourceVersion.
    Bookmark(String),
}

/// Why a watch item ends the watch.
pub enum Ended {
    /// An ERROR event with a Status.
    Status {
        code: u16,
        reason: String,
        message: String,
    },
    /// An ERROR event whose object is no Status.
    Other(String),
    /// The stream broke.
    Broken(ApiError),
}

impl Ended {
    /// 410 Gone: the resourceVersion is too old, only a new LIST helps.
    pub fn is_gone(&self) -> bool {
        match self {
            Ended::Status { code, .. } => *code == 410,
            Ended::Other(_) => false,
            Ended::Broken(e) => e.is_gone(),
        }
    }
}

/// Sorts one watch item.
pub fn sort<T>(item: Item<T>) -> Result<Change<T>, Ended> {
    match item {
        Ok(WatchEvent::Added(o)) | Ok(WatchEvent::Modified(o)) => Ok(Change::Upsert(o)),
        Ok(WatchEvent::Deleted(o)) => Ok(Change::Delete(o)),
        Ok(WatchEvent::Bookmark {
            resource_version, ..
        }) => Ok(Change::Bookmark(resource_version)),
        Ok(WatchEvent::ErrorStatus(status)) => Err(Ended::Status {
            code: status.code.and_then(|c| u16::try_from(c).ok()).unwrap_or(0),
            reason: status.reason.unwrap_or_default(),
            message: status.message.unwrap_or_default(),
        }),
        Ok(WatchEvent::ErrorOther(raw)) => Err(Ended::Other(raw.0.to_string())),
        Err(e) => Err(Ended::Broken(e)),
    }
}

/// Consecutive failures of a loop, for its back-off, and the trouble last logged, so
/// that a repeating failure is logged once; and whether a 410 sent the loop back to
/// LIST since a watch last proved healthy (a second 410 before then waits out a
/// back-off instead of relisting at once, so a server that expires every watch does
/// not cause a LIST storm).
pub struct Failures {
    label: &'static str,
    count: u32,
    reported: Option<String>,
    pub relisted_for_gone: bool,
}

impl Failures {
    pub fn new(label: &'static str) -> Failures {
        Failures {
            label,
            count: 0,
            reported: None,
            relisted_for_gone: false,
        }
    }

    /// Consecutive failures so far.
    pub fn count(&self) -> u32 {
        self.count
    }

    /// A watch delivered an event or ran its course: the apiserver works.
    pub fn healthy(&mut self) {
        self.relisted_for_gone = false;
        self.succeeded();
    }

    pub fn succeeded(&mut self) {
        if self.count > 0 {
            log::info!(
                "{}: the apiserver answers again after {} failure(s)",
                self.label,
                self.count
            );
        }
        self.count = 0;
        self.reported = None;
    }

    /// Counts one failure and logs it: at warning level the first time this `key`
    /// comes (or at error level with `refused`, what the apiserver's refusal means),
    /// at debug level while it repeats. The count, for the back-off.
    pub fn failed(&mut self, key: String, e: &dyn Display, refused: Option<String>) -> u32 {
        self.count = self.count.saturating_add(1);
        if self.reported.as_ref() != Some(&key) {
            match refused {
                Some(meaning) => log::error!("{}: {e}; {meaning}", self.label),
                None => log::warn!("{}: {e}; retrying with back-off", self.label),
            }
            self.reported = Some(key);
        } else {
            log::debug!("{}: {e} (failure {})", self.label, self.count);
        }
        self.count
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::ConfigMap;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ListMeta;

    fn page(names: &[&str], rv: &str, next: Option<&str>) -> k8s_openapi::List<ConfigMap> {
        k8s_openapi::List {
            items: names
                .iter()
                .map(|n| {
                    let mut c = ConfigMap::default();
                    c.metadata.name = Some((*n).to_owned());
                    c
                })
                .collect(),
            metadata: ListMeta {
                resource_version: Some(rv.to_owned()),
                continue_: next.map(str::to_owned),
                ..ListMeta::default()
            },
        }
    }

    fn gone() -> ApiError {
        ApiError::Status {
            method: "GET",
            path: "/x".into(),
            code: 410,
            reason: "Expired".into(),
            message: "too old".into(),
        }
    }

    #[test]
    fn every_page_kept_and_the_first_resource_version() {
        let mut calls = Vec::new();
        let listed = list_pages(
            "t",
            8,
            |token| {
                calls.push(token.map(str::to_owned));
                Ok(match token {
                    None => page(&["a", "skip"], "7", Some("t1")),
                    Some(_) => page(&["b"], "9", None),
                })
            },
            |c: ConfigMap| c.metadata.name.filter(|n| n != "skip"),
        )
        .map_err(|e| format!("{e:?}"))
        .expect("listed");
        assert_eq!(listed.items, ["a", "b"]);
        assert_eq!(listed.resource_version.as_deref(), Some("7"));
        assert_eq!(calls, [None, Some("t1".to_owned())]);
    }

    #[test]
    fn an_expired_continue_token_restarts_the_list_once() {
        let mut calls = 0;
        let listed = list_pages(
            "t",
            8,
            |token| {
                calls += 1;
                match (calls, token) {
                    (1, None) | (3, None) => Ok(page(&["a"], "5", Some("t"))),
                    (2, Some(_)) => Err(gone()),
                    (_, Some(_)) => Ok(page(&["b"], "5", None)),
                    _ => panic!("call {calls} {token:?}"),
                }
            },
            Some,
        );
        let listed = listed.map_err(|e| format!("{e:?}")).expect("listed");
        assert_eq!(listed.items.len(), 2);
        // A second 410 is the caller's to handle.
        let again = list_pages(
            "t",
            8,
            |token| match token {
                None => Ok(page(&["a"], "5", Some("t"))),
                Some(_) => Err(gone()),
            },
            Some,
        );
        assert!(matches!(again, Err(ListError::Api(e)) if e.is_gone()));
    }

    #[test]
    fn a_list_that_never_ends_is_refused() {
        let listed = list_pages("t", 3, |_| Ok(page(&["a"], "5", Some("t"))), Some);
        assert!(matches!(listed, Err(ListError::TooManyPages(3))));
    }

    #[test]
    fn error_events_end_the_watch_and_say_whether_to_list_again() {
        let status = k8s_openapi::apimachinery::pkg::apis::meta::v1::Status {
            code: Some(410),
            reason: Some("Expired".into()),
            ..Default::default()
        };
        let ended = sort::<ConfigMap>(Ok(WatchEvent::ErrorStatus(status)));
        assert!(matches!(&ended, Err(e) if e.is_gone()));
        let broken = sort::<ConfigMap>(Err(ApiError::Transport {
            method: "GET",
            path: "/x".into(),
            message: "reset".into(),
        }));
        assert!(matches!(&broken, Err(e) if !e.is_gone()));
        let bookmark = sort::<ConfigMap>(Ok(WatchEvent::Bookmark {
            resource_version: "12".into(),
            annotations: Default::default(),
        }));
        assert!(matches!(bookmark, Ok(Change::Bookmark(rv)) if rv == "12"));
    }

    #[test]
    fn a_repeating_failure_counts_and_a_success_resets() {
        let mut f = Failures::new("t");
        assert_eq!(f.failed("k".into(), &"down", None), 1);
        assert_eq!(f.failed("k".into(), &"down", None), 2);
        f.relisted_for_gone = true;
        f.healthy();
        assert_eq!(f.count(), 0);
        assert!(!f.relisted_for_gone);
    }
}
