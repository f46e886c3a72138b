//! Clocks, end to end: `holdfast run` under libfaketime (its wall clock, and its shims',
//! moved by a file the test rewrites; CLOCK_MONOTONIC and CLOCK_BOOTTIME left real),
//! running a static pod against the apiserver double through a TCP link the test can
//! cut. A board without an RTC boots in 1970 and NTP later sets its clock years forward:
//! nothing with a 1970 time may reach the cluster, times taken before the jump arrive
//! corrected, the lease is renewed with the new time, and no retry storm follows.

use support::apiserver;

use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use apiserver::{ApiServerDouble, Identity, KubeconfigOptions, Options};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::jiff::Timestamp;
use support::agent::{need_root, Agent};

const NODE: &str = "clock-node-1";
const WAIT: Duration = Duration::from_secs(60);

/// libfaketime as Debian installs it (package `libfaketime`), for this architecture.
fn libfaketime() -> Option<PathBuf> {
    let dirs = std::fs::read_dir("/usr/lib").ok()?;
    for d in dirs.flatten() {
        let lib = d.path().join("faketime/libfaketime.so.1");
        if lib.exists() {
            return Some(lib);
        }
    }
    None
}

/// Skips without root or libfaketime, with the reason; in CI (which installs it) a
/// missing libfaketime fails.
fn can_run() -> Option<PathBuf> {
    if !need_root() {
        return None;
    }
    match libfaketime() {
        Some(lib) => Some(lib),
        None if std::env::var_os("CI").is_some() => {
            panic!("libfaketime is missing: .ci/run installs the Debian package libfaketime")
        }
        None => {
            eprintln!("skipped: needs libfaketime (apt-get install libfaketime)");
            None
        }
    }
}

fn real_now() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0)
}

/// The agent's wall clock: an offset from the real one in a file libfaketime reads
/// again at most once a second.
struct FakeClock {
    file: PathBuf,
}

impl FakeClock {
    fn new(dir: &Path, offset_secs: i64) -> FakeClock {
        let c = FakeClock {
            file: dir.join("faketime"),
        };
        c.set(offset_secs);
        c
    }

    /// Moves the agent's clock to real time + `offset_secs`.
    fn set(&self, offset_secs: i64) {
        let tmp = self.file.with_extension("tmp");
        std::fs::write(&tmp, format!("{offset_secs:+}\n")).expect("write faketime file");
        std::fs::rename(&tmp, &self.file).expect("replace faketime file");
    }

    fn env(&self, lib: &Path) -> Vec<(String, String)> {
        vec![
            ("LD_PRELOAD".into(), lib.display().to_string()),
            (
                "FAKETIME_TIMESTAMP_FILE".into(),
                self.file.display().to_string(),
            ),
            ("FAKETIME_CACHE_DURATION".into(), "1".into()),
            ("FAKETIME_DONT_FAKE_MONOTONIC".into(), "1".into()),
        ]
    }
}

/// A TCP link between the agent and the double that the test can cut: while down, a
/// connection is accepted and closed at once (the agent sees a reset), and open ones
/// are shut. Every connection attempt is counted with its time.
struct Link {
    addr: SocketAddr,
    up: Arc<AtomicBool>,
    stop: Arc<AtomicBool>,
    attempts: Arc<Mutex<Vec<Instant>>>,
    open: Arc<Mutex<Vec<TcpStream>>>,
    accept: Option<std::thread::JoinHandle<()>>,
}

impl Link {
    fn start(to: SocketAddr) -> Link {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind link");
        listener.set_nonblocking(true).expect("nonblocking link");
        let addr = listener.local_addr().expect("link addr");
        let up = Arc::new(AtomicBool::new(false));
        let stop = Arc::new(AtomicBool::new(false));
        let attempts = Arc::new(Mutex::new(Vec::new()));
        let open = Arc::new(Mutex::new(Vec::new()));
        let (u, s, a, o) = (up.clone(), stop.clone(), attempts.clone(), open.clone());
        let accept = std::thread::spawn(move || {
            while !s.load(Ordering::Relaxed) {
                let client = match listener.accept() {
                    Ok((c, _)) => c,
                    Err(_) => {
                        std::thread::sleep(Duration::from_millis(10));
                        continue;
                    }
                };
                lock(&a).push(Instant::now());
                if !u.load(Ordering::Relaxed) {
                    let _ = client.shutdown(Shutdown::Both);
                    continue;
                }
                let _ = client.set_nonblocking(false);
                let Ok(server) = TcpStream::connect(to) else {
                    continue;
                };
                for stream in [&client, &server] {
                    if let Ok(c) = stream.try_clone() {
                        lock(&o).push(c);
                    }
                }
                pump(&client, &server);
                pump(&server, &client);
            }
        });
        Link {
            addr,
            up,
            stop,
            attempts,
            open,
            accept: Some(accept),
        }
    }

    fn url(&self) -> String {
        format!("https://{}", self.addr)
    }

    fn set_up(&self, up: bool) {
        self.up.store(up, Ordering::Relaxed);
        if !up {
            for s in lock(&self.open).drain(..) {
                let _ = s.shutdown(Shutdown::Both);
            }
        }
    }

    /// Connection attempts in `[from, to)`.
    fn attempts_between(&self, from: Instant, to: Instant) -> usize {
        lock(&self.attempts)
            .iter()
            .filter(|t| **t >= from && **t < to)
            .count()
    }
}

impl Drop for Link {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        self.set_up(false);
        if let Some(t) = self.accept.take() {
            let _ = t.join();
        }
    }
}

/// Copies `from` into `to` on its own thread until either side closes.
fn pump(from: &TcpStream, to: &TcpStream) {
    let (Ok(mut from), Ok(mut to)) = (from.try_clone(), to.try_clone()) else {
        return;
    };
    std::thread::spawn(move || {
        let mut buf = [0u8; 16 * 1024];
        loop {
            match from.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    if to.write_all(&buf[..n]).is_err() {
                        break;
                    }
                }
            }
        }
        let _ = to.shutdown(Shutdown::Both);
        let _ = from.shutdown(Shutdown::Both);
    });
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// A static pod with one container that runs and one that crash-loops, so there are
/// start and exit times, restarts and BackOff events to report.
const STATIC_POD: &str = "apiVersion: v1\nkind: Pod\nmetadata:\n  name: clocked\nspec:\n  \
    hostNetwork: true\n  terminationGracePeriodSeconds: 1\n  containers:\n    - name: web\n      \
    image: busybox:demo\n      command: [\"sleep\", \"3600\"]\n    - name: crash\n      \
    image: busybox:demo\n      command: [\"sh\", \"-c\", \"sleep 0.5; exit 3\"]\n";

fn mirror_name() -> String {
    format!("clocked-{NODE}")
}

struct Rig {
    api: ApiServerDouble,
    link: Link,
    clock: FakeClock,
    agent: Agent,
}

fn rig(name: &str, lib: &Path, offset_secs: i64) -> Rig {
    let api = apiserver::start(Options {
        bookmark_interval: Duration::from_secs(1),
        ..Options::default()
    });
    let link = Link::start(api.addr());
    let mut agent = Agent::new(name);
    agent.node_name = NODE.into();
    agent.write_config("nodeStatusUpdateFrequency: 1s\nnodeStatusReportFrequency: 3s\n");
    let kubeconfig = api.kubeconfig_with(
        &agent.dir,
        Identity::Node(NODE),
        &KubeconfigOptions {
            server: Some(link.url()),
            ..KubeconfigOptions::default()
        },
    );
    agent.extra_args = vec!["--kubeconfig".into(), kubeconfig.display().to_string()];
    let clock = FakeClock::new(&agent.dir, offset_secs);
    agent.extra_env = clock.env(lib);
    agent.write_manifest("clocked.yaml", STATIC_POD);
    Rig {
        api,
        link,
        clock,
        agent,
    }
}

impl Rig {
    fn wait(&self, what: &str, within: Duration, cond: impl FnMut(&ApiServerDouble) -> bool) {
        if !self.api.wait_for(within, cond) {
            panic!(
                "timed out waiting for {what}\n--- last requests (newest first) ---\n{}\n--- agent log ---\n{}",
                self.api.recent_requests(40),
                self.agent.agent_log()
            );
        }
    }

    /// The crash container's restarts as the agent itself shows them.
    fn local_restarts(&self) -> u64 {
        self.agent
            .pod("clocked")
            .map(|p| support::agent::container(&p, "crash")["restartCount"].as_u64())
            .and_then(|n| n)
            .unwrap_or(0)
    }

    fn mirror(&self) -> Option<Pod> {
        self.api.get_pod("default", &mirror_name())
    }

    fn lease_renewed(&self) -> Option<Timestamp> {
        self.api
            .get_lease(NODE)
            .and_then(|l| l.spec?.renew_time)
            .map(|t| t.0)
    }
}

/// When the running container `web` started, as the cluster sees it.
fn web_started(pod: &Pod) -> Option<Timestamp> {
    pod.status
        .as_ref()?
        .container_statuses
        .as_ref()?
        .iter()
        .find(|c| c.name == "web")?
        .state
        .as_ref()?
        .running
        .as_ref()?
        .started_at
        .clone()
        .map(|t| t.0)
}

fn restarts(pod: &Pod, container: &str) -> i32 {
    pod.status
        .as_ref()
        .and_then(|s| s.container_statuses.as_ref())
        .and_then(|cs| cs.iter().find(|c| c.name == container))
        .map_or(0, |c| c.restart_count)
}

/// Every time the double holds for this node, with where it was found.
fn reported_times(api: &ApiServerDouble) -> Vec<(String, Timestamp)> {
    let mut out = Vec::new();
    if let Some(p) = api.get_pod("default", &mirror_name()) {
        let v = serde_json::to_value(&p.status).expect("status json");
        collect_times("pod status", &v, &mut out);
    }
    if let Some(n) = api.get_node(NODE) {
        let v = serde_json::to_value(&n.status).expect("node status json");
        collect_times("node status", &v, &mut out);
    }
    if let Some(l) = api.get_lease(NODE) {
        let v = serde_json::to_value(&l.spec).expect("lease json");
        collect_times("lease", &v, &mut out);
    }
    for e in api.list_events() {
        let v = serde_json::to_value(&e).expect("event json");
        // The double's own metadata times are its clock's, not the agent's.
        for key in ["firstTimestamp", "lastTimestamp", "eventTime"] {
            if let Some(t) = v.get(key).and_then(|t| t.as_str()) {
                if let Ok(t) = t.parse() {
                    out.push((format!("event {key}"), t));
                }
            }
        }
    }
    out
}

fn collect_times(at: &str, v: &serde_json::Value, out: &mut Vec<(String, Timestamp)>) {
    match v {
        serde_json::Value::Object(m) => {
            for (k, val) in m {
                let here = format!("{at}.{k}");
                match val.as_str().and_then(|s| s.parse::<Timestamp>().ok()) {
                    Some(t) => out.push((here, t)),
                    None => collect_times(&here, val, out),
                }
            }
        }
        serde_json::Value::Array(items) => {
            for (i, item) in items.iter().enumerate() {
                collect_times(&format!("{at}[{i}]"), item, out);
            }
        }
        _ => {}
    }
}

/// Checks every reported time lies between `earliest` and now (+ `ahead`), in seconds.
fn assert_times_real(api: &ApiServerDouble, earliest: i64, ahead: i64) -> Vec<(String, i64)> {
    let times = reported_times(api);
    assert!(!times.is_empty(), "no times reported at all");
    let latest = real_now() + ahead + 2;
    let bad: Vec<_> = times
        .iter()
        .filter(|(_, t)| t.as_second() < earliest || t.as_second() > latest)
        .collect();
    assert!(
        bad.is_empty(),
        "times outside [{earliest}, {latest}] reached the cluster: {bad:?}"
    );
    times.into_iter().map(|(k, t)| (k, t.as_second())).collect()
}

#[test]
fn a_board_that_boots_in_1970_reports_real_times_once_ntp_sets_its_clock() {
    let Some(lib) = can_run() else { return };
    let real_start = real_now();
    // The agent's clock reads 1970-01-01T00:01:40Z.
    let mut r = rig("clock-1970", &lib, -(real_start - 100));
    r.link.set_up(false);
    let t0 = Instant::now();
    r.agent.start();

    // Offline in 1970: the pod runs, the crashing container is restarted with back-off.
    r.agent
        .wait_until("two restarts in 1970", WAIT, |_| r.local_restarts() >= 2);
    let web_started_before_jump = real_now();
    // Nothing even tried to reach the apiserver: the kubeconfig's certificates cannot be
    // valid in 1970, and the agent waits for its clock instead of backing off.
    assert_eq!(
        r.link.attempts_between(t0, Instant::now()),
        0,
        "connections from a 1970 agent"
    );
    assert!(r.agent.agent_log().contains("wall clock reads 1970-"));

    // The link comes back while the clock is still wrong: still nothing goes out.
    r.link.set_up(true);
    std::thread::sleep(Duration::from_secs(3)); // a span to observe nothing in, not a sync
    assert!(r.api.request_log().is_empty(), "requests from a 1970 agent");

    // NTP: the clock jumps 56 years forward to the real time.
    let jumped = real_now();
    r.clock.set(0);
    r.wait("the lease", WAIT, |api| api.get_lease(NODE).is_some());
    r.wait("the mirror pod with its restarts", WAIT, |api| {
        api.get_pod("default", &mirror_name())
            .is_some_and(|p| restarts(&p, "crash") >= 2)
    });
    // The lease is renewed with the new time, on its 1 s schedule.
    let first = r.lease_renewed().expect("renewTime");
    assert!(first.as_second() >= jumped - 1, "renewTime {first}");
    r.wait("a lease renewal", Duration::from_secs(10), |_| {
        r.lease_renewed().is_some_and(|t| t > first)
    });

    // No 1970 time anywhere, and the ones taken before the jump are the real ones: the
    // running container started before the jump, at a real time after the agent did.
    let times = assert_times_real(&r.api, real_start - 5, 0);
    let web = r
        .mirror()
        .and_then(|p| web_started(&p))
        .expect("web startedAt");
    assert!(
        web.as_second() >= real_start - 2 && web.as_second() <= web_started_before_jump,
        "web started at {web} (agent started {real_start}, jump at {jumped}): {times:?}"
    );
    let events = r.api.list_events();
    assert!(
        events.iter().any(|e| e
            .first_timestamp
            .as_ref()
            .is_some_and(|t| t.0.as_second() < jumped)),
        "events from before the jump keep their (corrected) times: {events:?}"
    );
    r.agent.reset();
}

#[test]
fn a_jump_during_back_off_with_the_link_down_makes_no_storm() {
    let Some(lib) = can_run() else { return };
    let real_start = real_now();
    let mut r = rig("clock-backoff", &lib, 0);
    r.link.set_up(false);
    r.agent.start();
    // Link down: every uplink loop backs off. Let the back-off settle, then compare the
    // connection attempts in equal windows before and after the jump.
    let window = Duration::from_secs(8);
    let t0 = Instant::now();
    r.agent.wait_until("the uplink to be trying", WAIT, |_| {
        r.link.attempts_between(t0, Instant::now()) > 0
    });
    std::thread::sleep(window); // let back-off grow: a span, not a sync
    let before_from = Instant::now();
    std::thread::sleep(window);
    let jump_at = Instant::now();
    // 200 days forward (the test certificates last a year).
    let jump = 200 * 86_400;
    r.clock.set(jump);
    std::thread::sleep(window + Duration::from_secs(1)); // the window to count in
    let before = r.link.attempts_between(before_from, jump_at);
    let after = r
        .link
        .attempts_between(jump_at + Duration::from_secs(1), Instant::now());
    eprintln!("connection attempts per {window:?}: {before} before the jump, {after} after");
    // The node controller retries at most once per nodeStatusUpdateFrequency (1 s) and
    // the other loops back off from 0.8 s: a window holds well under 30 attempts.
    assert!(
        after <= before + 6 && after < 30,
        "retry storm after the jump: {after} attempts in {window:?} (before: {before})"
    );

    r.link.set_up(true);
    r.wait("the lease", WAIT, |api| api.get_lease(NODE).is_some());
    r.wait("the mirror pod", WAIT, |api| {
        api.get_pod("default", &mirror_name()).is_some()
    });
    let renewed = r.lease_renewed().expect("renewTime");
    let expected = real_now() + jump;
    assert!(
        (renewed.as_second() - expected).abs() <= 5,
        "renewTime {renewed} is not the new time (~{expected})"
    );
    r.wait("a lease renewal", Duration::from_secs(10), |_| {
        r.lease_renewed().is_some_and(|t| t > renewed)
    });
    // Times taken before the jump are real times of the clock then; none is before
    // the agent started or beyond the new clock.
    assert_times_real(&r.api, real_start - 5, jump);
    r.agent.reset();
}

#[test]
fn an_agent_restarted_after_the_jump_still_corrects_what_it_stored_in_1970() {
    let Some(lib) = can_run() else { return };
    let real_start = real_now();
    let mut r = rig("clock-restart", &lib, -(real_start - 100));
    r.link.set_up(false);
    r.agent.start();
    r.agent
        .wait_until("a restart in 1970", WAIT, |_| r.local_restarts() >= 1);
    // The agent dies in 1970 with its store full of 1970 times; NTP sets the clock while
    // it is down; it starts again with a set clock and the link up.
    r.agent.kill9();
    let killed = real_now();
    r.clock.set(0);
    r.link.set_up(true);
    r.agent.start();
    r.wait("the mirror pod with web running", WAIT, |api| {
        api.get_pod("default", &mirror_name())
            .and_then(|p| p.status?.container_statuses)
            .is_some_and(|cs| {
                cs.iter().any(|c| {
                    c.name == "web" && c.state.as_ref().is_some_and(|s| s.running.is_some())
                })
            })
    });
    r.wait("the lease", WAIT, |api| api.get_lease(NODE).is_some());
    let times = assert_times_real(&r.api, real_start - 5, 0);
    // web has run since 1970: its start time is real because the first agent kept the
    // clock's offset for this boot under its root dir.
    let web = r
        .mirror()
        .and_then(|p| web_started(&p))
        .expect("web's startedAt was left out: the 1970 time was not corrected");
    assert!(
        web.as_second() >= real_start - 2 && web.as_second() <= killed,
        "web started at {web} (agent started {real_start}, killed {killed}): {times:?}"
    );
    r.agent.reset();
}
