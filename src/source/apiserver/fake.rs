//! A scripted lister, a clock that does not sleep, and a harness that runs the real
//! source thread against them and watches what it calls and sends.

use std::collections::VecDeque;
use std::sync::{mpsc as std_mpsc, Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Container, Pod, PodSpec, PodStatus};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{
    ListMeta, ManagedFieldsEntry, ObjectMeta, Status, WatchEvent,
};
use tokio::sync::mpsc;

use super::*;
use crate::pod::annotations::SOURCE_API;

pub(super) type Item = Result<WatchEvent<Pod>, ApiError>;

pub(super) enum ListStep {
    Page(PodList),
    Fail(ApiError),
}

pub(super) enum WatchStep {
    /// A stream of these items; it ends after the last.
    Stream(Vec<Item>),
    Fail(ApiError),
    /// A stream the test feeds; it ends when the sender is dropped.
    Live(std_mpsc::Receiver<Item>),
}

#[derive(Debug, Clone, PartialEq)]
pub(super) enum Call {
    List(Option<String>),
    Watch(String),
}

#[derive(Default)]
pub(super) struct Script {
    lists: VecDeque<ListStep>,
    watches: VecDeque<WatchStep>,
    calls: Vec<Call>,
    timeouts: Vec<u64>,
    finished: bool,
}

/// A lister that plays a script and records the calls it saw. Once the script is
/// played out, a call blocks until the test finishes, so the calls seen stay put.
#[derive(Clone, Default)]
pub(super) struct Fake(Arc<(Mutex<Script>, Condvar)>);

impl Fake {
    fn new(lists: Vec<ListStep>, watches: Vec<WatchStep>) -> Fake {
        let fake = Fake::default();
        {
            let mut s = fake.0 .0.lock().expect("lock");
            s.lists = lists.into();
            s.watches = watches.into();
        }
        fake
    }

    pub(super) fn calls(&self) -> Vec<Call> {
        self.0 .0.lock().expect("lock").calls.clone()
    }

    pub(super) fn timeouts(&self) -> Vec<u64> {
        self.0 .0.lock().expect("lock").timeouts.clone()
    }

    pub(super) fn finish(&self) {
        self.0 .0.lock().expect("lock").finished = true;
        self.0 .1.notify_all();
    }

    fn played_out(&self, mut s: std::sync::MutexGuard<'_, Script>) -> ApiError {
        while !s.finished {
            s = self.0 .1.wait(s).expect("wait");
        }
        transport("script over")
    }
}

impl PodLister for Fake {
    fn list(&self, node_name: &str, continue_token: Option<&str>) -> Result<PodList, ApiError> {
        assert_eq!(node_name, NODE);
        let mut s = self.0 .0.lock().expect("lock");
        s.calls.push(Call::List(continue_token.map(str::to_string)));
        match s.lists.pop_front() {
            Some(ListStep::Page(page)) => Ok(page),
            Some(ListStep::Fail(e)) => Err(e),
            None => Err(self.played_out(s)),
        }
    }

    fn watch(
        &self,
        node_name: &str,
        resource_version: &str,
        timeout_secs: u64,
    ) -> Result<PodWatch, ApiError> {
        assert_eq!(node_name, NODE);
        let mut s = self.0 .0.lock().expect("lock");
        s.calls.push(Call::Watch(resource_version.to_string()));
        s.timeouts.push(timeout_secs);
        match s.watches.pop_front() {
            Some(WatchStep::Stream(items)) => Ok(Box::new(items.into_iter())),
            Some(WatchStep::Fail(e)) => Err(e),
            Some(WatchStep::Live(rx)) => Ok(Box::new(std::iter::from_fn(move || rx.recv().ok()))),
            None => Err(self.played_out(s)),
        }
    }
}

/// Back-off that only records how long it would have waited.
pub(super) struct FakeClock {
    sleeps: Arc<Mutex<Vec<Duration>>>,
}

pub(super) const RANDOM: u64 = 0x9E37_79B9_7F4A_7C15;

impl Clock for FakeClock {
    fn sleep(&mut self, duration: Duration, _stop: &dyn Fn() -> bool) {
        self.sleeps.lock().expect("lock").push(duration);
    }

    fn random(&mut self) -> u64 {
        RANDOM
    }
}

pub(super) const NODE: &str = "edge-node-1";
pub(super) const DEADLINE: Duration = Duration::from_secs(10);

pub(super) struct Harness {
    pub(super) fake: Fake,
    sleeps: Arc<Mutex<Vec<Duration>>>,
    rx: mpsc::Receiver<SourceSnapshot>,
    handle: JoinHandle<()>,
}

pub(super) fn options() -> ApiSourceOptions {
    ApiSourceOptions {
        backoff: Backoff {
            initial: Duration::from_secs(1),
            max: Duration::from_secs(4),
        },
        coalesce: Duration::ZERO,
        known_pods: 0,
    }
}

pub(super) fn start(lists: Vec<ListStep>, watches: Vec<WatchStep>) -> Harness {
    start_with(lists, watches, options())
}

pub(super) fn start_with(
    lists: Vec<ListStep>,
    watches: Vec<WatchStep>,
    opts: ApiSourceOptions,
) -> Harness {
    start_resumed(lists, watches, opts, ApiSourceResume::default())
}

pub(super) fn start_resumed(
    lists: Vec<ListStep>,
    watches: Vec<WatchStep>,
    opts: ApiSourceOptions,
    resume: ApiSourceResume,
) -> Harness {
    let fake = Fake::new(lists, watches);
    let sleeps = Arc::new(Mutex::new(Vec::new()));
    let clock = FakeClock {
        sleeps: sleeps.clone(),
    };
    let (tx, rx) = mpsc::channel(256);
    let handle =
        spawn_with_clock(fake.clone(), NODE.into(), opts, resume, clock, tx).expect("spawn source");
    Harness {
        fake,
        sleeps,
        rx,
        handle,
    }
}

impl Harness {
    /// The calls, once there are `n` of them.
    pub(super) fn calls_once(&self, n: usize) -> Vec<Call> {
        let deadline = Instant::now() + DEADLINE;
        loop {
            let calls = self.fake.calls();
            if calls.len() >= n {
                return calls;
            }
            assert!(Instant::now() < deadline, "only these calls: {calls:?}");
            std::thread::sleep(Duration::from_millis(2));
        }
    }

    /// Every snapshot sent so far.
    pub(super) fn sent(&mut self) -> Vec<SourceSnapshot> {
        let mut out = Vec::new();
        while let Ok(s) = self.rx.try_recv() {
            out.push(s);
        }
        out
    }

    /// Snapshots until one has exactly `names` (sorted); returns how many came.
    pub(super) fn until(&mut self, want: &[&str]) -> usize {
        let deadline = Instant::now() + DEADLINE;
        let mut count = 0;
        let mut last = None;
        loop {
            match self.rx.try_recv() {
                Ok(s) => {
                    count += 1;
                    if names(&s) == want {
                        return count;
                    }
                    last = Some(names(&s));
                }
                Err(_) => {
                    assert!(Instant::now() < deadline, "last snapshot: {last:?}");
                    std::thread::sleep(Duration::from_millis(2));
                }
            }
        }
    }

    pub(super) fn sleeps(&self) -> Vec<Duration> {
        self.sleeps.lock().expect("lock").clone()
    }

    /// Drops the receiver and checks the thread ends.
    pub(super) fn stop(self) {
        let Harness {
            fake, rx, handle, ..
        } = self;
        drop(rx);
        fake.finish();
        let deadline = Instant::now() + DEADLINE;
        while !handle.is_finished() {
            assert!(Instant::now() < deadline, "source thread did not stop");
            std::thread::sleep(Duration::from_millis(5));
        }
        handle.join().expect("source thread");
    }
}

pub(super) fn names(s: &SourceSnapshot) -> Vec<String> {
    assert_eq!(s.source, SOURCE_API);
    let mut names: Vec<String> = s
        .pods
        .iter()
        .map(|p| p.metadata.name.clone().unwrap_or_default())
        .collect();
    names.sort();
    names
}

pub(super) fn pod(name: &str, rv: u64, image: &str) -> Pod {
    Pod {
        metadata: ObjectMeta {
            name: Some(name.into()),
            namespace: Some("default".into()),
            uid: Some(format!("uid-{name}")),
            resource_version: Some(rv.to_string()),
            generation: Some(1),
            managed_fields: Some(vec![ManagedFieldsEntry {
                manager: Some("kubectl".into()),
                ..ManagedFieldsEntry::default()
            }]),
            ..ObjectMeta::default()
        },
        spec: Some(PodSpec {
            node_name: Some(NODE.into()),
            containers: vec![Container {
                name: "main".into(),
                image: Some(image.into()),
                ..Container::default()
            }],
            ..PodSpec::default()
        }),
        status: Some(PodStatus {
            phase: Some("Pending".into()),
            ..PodStatus::default()
        }),
    }
}

pub(super) fn with_phase(mut p: Pod, phase: &str) -> Pod {
    p.status = Some(PodStatus {
        phase: Some(phase.into()),
        ..PodStatus::default()
    });
    p
}

pub(super) fn page(rv: u64, items: Vec<Pod>, next: Option<&str>) -> ListStep {
    ListStep::Page(PodList {
        items,
        metadata: ListMeta {
            resource_version: Some(rv.to_string()),
            continue_: next.map(str::to_string),
            ..ListMeta::default()
        },
    })
}

pub(super) fn transport(message: &str) -> ApiError {
    ApiError::Transport {
        method: "GET",
        path: "/api/v1/pods".into(),
        message: message.into(),
    }
}

pub(super) fn status(code: u16, reason: &str) -> ApiError {
    ApiError::Status {
        method: "GET",
        path: "/api/v1/pods".into(),
        code,
        reason: reason.into(),
        message: format!("{reason} here"),
    }
}

pub(super) fn expired_event() -> Item {
    Ok(WatchEvent::ErrorStatus(Status {
        code: Some(410),
        reason: Some("Expired".into()),
        message: Some("too old resource version: 10 (40)".into()),
        ..Status::default()
    }))
}

pub(super) fn bookmark(rv: u64) -> Item {
    Ok(WatchEvent::Bookmark {
        annotations: Default::default(),
        resource_version: rv.to_string(),
    })
}

pub(super) fn list_call() -> Call {
    Call::List(None)
}

pub(super) fn watch_call(rv: &str) -> Call {
    Call::Watch(rv.into())
}

pub(super) fn jitter(failures: &[u32]) -> Vec<Duration> {
    failures
        .iter()
        .map(|n| options().backoff.jittered(*n, RANDOM))
        .collect()
}

pub(super) fn fixture_list(body: &str) -> ListStep {
    ListStep::Page(serde_json::from_str(body).expect("recorded PodList"))
}

pub(super) fn fixture_events(body: &str) -> WatchStep {
    WatchStep::Stream(
        body.lines()
            .map(|l| Ok(serde_json::from_str(l).expect("recorded watch event")))
            .collect(),
    )
}
