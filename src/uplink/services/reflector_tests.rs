use std::collections::VecDeque;
use std::sync::Mutex;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ListMeta, Status, WatchEvent};

use super::super::lister::ServiceWatch;
use super::super::{ListState, ServiceList};
use super::*;
use crate::store::Store;
use crate::testutil::TempDir;

type Events = Vec<Result<WatchEvent<Service>, ApiError>>;

/// A scripted apiserver: each LIST and WATCH takes the next answer; once the script is
/// used up it sets `stop` and answers with an empty watch.
struct Fake {
    lists: Mutex<VecDeque<Result<ServiceList, ApiError>>>,
    watches: Mutex<VecDeque<Result<Events, ApiError>>>,
    calls: Arc<Mutex<Vec<String>>>,
    stop: Arc<AtomicBool>,
}

impl ServiceLister for Fake {
    fn list(&self, continue_token: Option<&str>) -> Result<ServiceList, ApiError> {
        let call = format!("LIST {}", continue_token.unwrap_or("-"));
        self.calls.lock().expect("calls").push(call);
        match self.lists.lock().expect("lists").pop_front() {
            Some(answer) => answer,
            None => {
                self.stop.store(true, Ordering::Relaxed);
                Err(gone())
            }
        }
    }

    fn watch(&self, resource_version: &str, _timeout_secs: u64) -> Result<ServiceWatch, ApiError> {
        let call = format!("WATCH {resource_version}");
        self.calls.lock().expect("calls").push(call);
        match self.watches.lock().expect("watches").pop_front() {
            Some(answer) => answer.map(|events| Box::new(events.into_iter()) as ServiceWatch),
            None => {
                self.stop.store(true, Ordering::Relaxed);
                Ok(Box::new(Vec::new().into_iter()))
            }
        }
    }
}

fn service(ns: &str, name: &str, ip: &str, rv: &str) -> Service {
    serde_json::from_value(serde_json::json!({
        "metadata": {"name": name, "namespace": ns, "resourceVersion": rv},
        "spec": {"clusterIP": ip, "ports": [{"port": 80, "protocol": "TCP"}]},
    }))
    .expect("service")
}

fn page(items: Vec<Service>, rv: &str, next: Option<&str>) -> Result<ServiceList, ApiError> {
    Ok(ServiceList {
        items,
        metadata: ListMeta {
            resource_version: Some(rv.into()),
            continue_: next.map(str::to_string),
            ..ListMeta::default()
        },
    })
}

fn gone() -> ApiError {
    ApiError::Status {
        method: "GET",
        path: "/api/v1/services".into(),
        code: 410,
        reason: "Expired".into(),
        message: "too old resource version".into(),
    }
}

struct Rig {
    _tmp: TempDir,
    _store: Store,
    cache: ServiceCache,
    calls: Arc<Mutex<Vec<String>>>,
}

/// Runs a reflector over `lists` and `watches` until the script is used up.
fn run(
    lists: Vec<Result<ServiceList, ApiError>>,
    watches: Vec<Result<Events, ApiError>>,
    link: Option<Link>,
) -> (Rig, mpsc::Receiver<()>) {
    let tmp = TempDir::new("services-reflector");
    let store = Store::open(&tmp.0.join("db")).expect("store");
    let cache = ServiceCache::open(&store).expect("cache");
    let stop = Arc::new(AtomicBool::new(false));
    let calls = Arc::new(Mutex::new(Vec::new()));
    let (read_tx, read_rx) = mpsc::channel(1);
    let fake = Fake {
        lists: Mutex::new(lists.into()),
        watches: Mutex::new(watches.into()),
        calls: calls.clone(),
        stop: stop.clone(),
    };
    let reflector = ServiceReflector {
        lister: fake,
        cache: cache.clone(),
        link,
        stop,
        read: Some(read_tx),
        options: ServiceReflectorOptions {
            backoff: Backoff {
                initial: Duration::from_millis(1),
                max: Duration::from_millis(5),
            },
            watch_timeout: Duration::from_secs(60),
        },
    };
    reflector.spawn().expect("spawn").join().expect("join");
    let rig = Rig {
        _tmp: tmp,
        _store: store,
        cache,
        calls,
    };
    (rig, read_rx)
}

fn names(cache: &ServiceCache, ns: &str) -> Vec<String> {
    cache
        .visible(ns, true)
        .expect("visible")
        .services
        .iter()
        .map(|s| s.metadata.name.clone().unwrap_or_default())
        .collect()
}

#[test]
fn lists_every_page_then_follows_the_watch_and_relists_on_410() {
    let watch = vec![
        Ok(WatchEvent::Added(service("apps", "new", "10.0.0.3", "12"))),
        Ok(WatchEvent::Deleted(service("apps", "a", "10.0.0.1", "13"))),
        Ok(WatchEvent::Bookmark {
            resource_version: "20".into(),
            annotations: Default::default(),
        }),
    ];
    let expired = vec![Ok(WatchEvent::ErrorStatus(Status {
        code: Some(410),
        reason: Some("Expired".into()),
        ..Status::default()
    }))];
    let (rig, mut read) = run(
        vec![
            page(
                vec![service("apps", "a", "10.0.0.1", "5")],
                "10",
                Some("tok"),
            ),
            page(
                vec![
                    service("apps", "b", "10.0.0.2", "6"),
                    service("apps", "headless", "None", "7"),
                ],
                "10",
                None,
            ),
            // After the 410: only b is left in the cluster.
            page(vec![service("apps", "b", "10.0.0.2", "6")], "30", None),
        ],
        vec![Ok(watch), Ok(expired)],
        None,
    );
    assert_eq!(
        *rig.calls.lock().expect("calls"),
        ["LIST -", "LIST tok", "WATCH 10", "WATCH 20", "LIST -", "WATCH 30"],
        "the second watch resumes at the bookmark; the 410 relists"
    );
    assert_eq!(names(&rig.cache, "apps"), ["b"]);
    assert_eq!(
        rig.cache.list_state().expect("state"),
        ListState::Read,
        "read"
    );
    assert!(read.try_recv().is_ok(), "told once the list was read");
    assert!(read.try_recv().is_err(), "and only once");
}

#[test]
fn a_410_on_a_continue_page_lists_again_from_the_start() {
    let (rig, _read) = run(
        vec![
            page(
                vec![service("apps", "a", "10.0.0.1", "5")],
                "10",
                Some("tok"),
            ),
            Err(gone()),
            page(vec![service("apps", "c", "10.0.0.4", "5")], "11", None),
        ],
        vec![],
        None,
    );
    assert_eq!(
        rig.calls.lock().expect("calls")[..4],
        ["LIST -", "LIST tok", "LIST -", "WATCH 11"]
    );
    assert_eq!(
        names(&rig.cache, "apps"),
        ["c"],
        "nothing of the broken list"
    );
}

#[test]
fn waits_on_a_link_that_is_down_and_reports_a_link_failure() {
    let link = Link::new(Duration::from_secs(10));
    let unreachable = ApiError::Transport {
        method: "GET",
        path: "/api/v1/services".into(),
        message: "connection refused".into(),
    };
    let tmp = TempDir::new("services-reflector-link");
    let store = Store::open(&tmp.0.join("db")).expect("store");
    let cache = ServiceCache::open(&store).expect("cache");
    let stop = Arc::new(AtomicBool::new(false));
    let calls = Arc::new(Mutex::new(Vec::new()));
    let fake = Fake {
        lists: Mutex::new(
            vec![
                Err(unreachable),
                page(vec![service("apps", "a", "10.0.0.1", "5")], "10", None),
            ]
            .into(),
        ),
        watches: Mutex::new(VecDeque::new()),
        calls: calls.clone(),
        stop: stop.clone(),
    };
    let handle = ServiceReflector {
        lister: fake,
        cache: cache.clone(),
        link: Some(link.clone()),
        stop: stop.clone(),
        read: None,
        options: ServiceReflectorOptions::default(),
    }
    .spawn()
    .expect("spawn");
    // Down since the start: no request.
    std::thread::sleep(Duration::from_millis(300)); // nothing to poll: the absence of calls
    assert!(calls.lock().expect("calls").is_empty());
    link.node_ready(Instant::now(), crate::time::now());
    link.drained();
    // The refused LIST puts the link down (no back-off of its own); it lists again once
    // the link is back.
    assert!(
        wait_until(|| link.is_down()),
        "the failure was not reported"
    );
    link.node_ready(Instant::now(), crate::time::now());
    link.drained();
    handle.join().expect("join");
    assert_eq!(
        calls.lock().expect("calls")[..3],
        ["LIST -", "LIST -", "WATCH 10"]
    );
    assert_eq!(names(&cache, "apps"), ["a"]);
}

/// Polls `cond` for up to ten seconds.
fn wait_until(cond: impl Fn() -> bool) -> bool {
    let deadline = Instant::now() + Duration::from_secs(10);
    while Instant::now() < deadline {
        if cond() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    false
}
