//! holdfast under systemd: the unit file passes `systemd-analyze verify`, and a real
//! `holdfast run` speaks the `sd_notify` protocol to a socket the test holds as systemd
//! would: `READY=1` once it serves, `WATCHDOG=1` within every `WATCHDOG_USEC`,
//! `STOPPING=1` on SIGTERM, and no child of the agent inherits `NOTIFY_SOCKET`.

use support::systemd;

use std::io;
use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr, UnixDatagram};
use std::path::Path;
use std::time::{Duration, Instant};

use support::agent::{bin, container_pid, need_root, sh_pod, Agent};
use support::tempdir::TempDir;

const MIN: Duration = Duration::from_secs(60);

/// The test's end of `NOTIFY_SOCKET`: every datagram the agent sent, with its arrival.
struct Manager {
    sock: UnixDatagram,
    got: Vec<(Instant, String)>,
}

impl Manager {
    fn new(sock: UnixDatagram) -> Self {
        Manager {
            sock,
            got: Vec::new(),
        }
    }

    /// Reads what arrives for up to `within`; stops early once `until` holds.
    fn read(&mut self, within: Duration, until: impl Fn(&[(Instant, String)]) -> bool) {
        let deadline = Instant::now() + within;
        let mut buf = [0u8; 4096];
        while !until(&self.got) {
            let Some(left) = deadline.checked_duration_since(Instant::now()) else {
                return;
            };
            if left.is_zero() {
                return;
            }
            self.sock
                .set_read_timeout(Some(left.min(Duration::from_millis(200))))
                .expect("read timeout");
            match self.sock.recv(&mut buf) {
                Ok(n) => self.got.push((
                    Instant::now(),
                    String::from_utf8_lossy(&buf[..n]).into_owned(),
                )),
                Err(e)
                    if matches!(
                        e.kind(),
                        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                    ) => {}
                Err(e) => panic!("receive from the agent: {e}"),
            }
        }
    }

    /// Like `read`, but fails (with the agent's log) when `until` does not come to hold.
    fn wait(
        &mut self,
        agent: &Agent,
        what: &str,
        within: Duration,
        until: impl Fn(&[(Instant, String)]) -> bool,
    ) {
        self.read(within, &until);
        assert!(
            until(&self.got),
            "no {what} within {within:?}; got {:?}\n--- agent log ---\n{}",
            self.messages(),
            agent.agent_log()
        );
    }

    fn messages(&self) -> Vec<&str> {
        self.got.iter().map(|(_, m)| m.as_str()).collect()
    }
}

/// When each datagram holding the line `line` arrived.
fn arrivals(got: &[(Instant, String)], line: &str) -> Vec<Instant> {
    got.iter()
        .filter(|(_, m)| m.lines().any(|l| l == line))
        .map(|(t, _)| *t)
        .collect()
}

/// The `NOTIFY_SOCKET` and `WATCHDOG_*` entries of a process's environment.
fn notify_vars(pid: u32) -> Vec<String> {
    let environ = std::fs::read(format!("/proc/{pid}/environ"))
        .unwrap_or_else(|e| panic!("read /proc/{pid}/environ: {e}"));
    environ
        .split(|b| *b == 0)
        .map(|v| String::from_utf8_lossy(v).into_owned())
        .filter(|v| v.starts_with("NOTIFY_SOCKET=") || v.starts_with("WATCHDOG_"))
        .collect()
}

/// The processes started from the agent's root dir (shims, namespace holders).
fn agent_children(root: &Path) -> Vec<u32> {
    let root = root.display().to_string();
    std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| e.file_name().to_string_lossy().parse::<u32>().ok())
        .filter(|pid| {
            let cmd = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
            String::from_utf8_lossy(&cmd).contains(&root)
        })
        .collect()
}

#[test]
fn agent_reports_ready_pings_the_watchdog_and_reports_stopping() {
    if !need_root() {
        return;
    }
    let dir = TempDir::new("sd-notify");
    let path = dir.0.join("notify.sock");
    let mut systemd = Manager::new(UnixDatagram::bind(&path).expect("bind the notify socket"));
    let watchdog = Duration::from_secs(2);

    let mut a = Agent::new("sdnotify");
    a.write_manifest(
        "sleeper.yaml",
        &sh_pod("sleeper", "", "main", "exec sleep 1000", ""),
    );
    a.extra_env = vec![
        ("NOTIFY_SOCKET".into(), path.display().to_string()),
        ("WATCHDOG_USEC".into(), watchdog.as_micros().to_string()),
    ];
    let spawned = Instant::now();
    a.spawn();

    systemd.wait(&a, "READY=1", MIN, |got| {
        !arrivals(got, "READY=1").is_empty()
    });
    let ready = arrivals(&systemd.got, "READY=1")[0];
    let first = &systemd.got[0].1;
    assert!(
        first.starts_with("READY=1\nSTATUS=") && first.contains("standalone"),
        "the first message is READY=1 with a status: {first:?}"
    );
    eprintln!("READY=1 {:?} after spawn", ready - spawned);

    systemd.wait(&a, "3 watchdog pings", 5 * watchdog, |got| {
        arrivals(got, "WATCHDOG=1").len() >= 3
    });
    let pings = arrivals(&systemd.got, "WATCHDOG=1");
    // systemd arms the watchdog at READY=1: the first ping is due within one interval.
    let mut gaps = vec![pings[0] - ready];
    gaps.extend(pings.windows(2).map(|w| w[1] - w[0]));
    eprintln!("watchdog {watchdog:?}: gaps after READY=1 {gaps:?}");
    for g in &gaps {
        assert!(*g < watchdog, "a gap of {g:?} between pings: {gaps:?}");
    }
    assert!(
        arrivals(&systemd.got, "READY=1").len() == 1,
        "READY=1 more than once: {:?}",
        systemd.messages()
    );

    // Nothing the agent starts speaks for it: no shim, holder or container has the
    // variables.
    let p = a.wait_pod("sleeper", "running", MIN, |p| {
        support::agent::container(p, "main")["state"]["running"].is_object()
    });
    // The agent's own /proc/PID/environ still shows what it was started with.
    let agent = a.pid().expect("the agent runs");
    let children: Vec<u32> = agent_children(&a.root)
        .into_iter()
        .filter(|p| *p != agent)
        .collect();
    assert!(!children.is_empty(), "no shim of the agent's found");
    let init = u32::try_from(container_pid(&a, &p, "main")).expect("pid");
    for pid in children.iter().copied().chain([init]) {
        assert_eq!(notify_vars(pid), Vec::<String>::new(), "process {pid}");
    }
    // The status counts the pod.
    systemd.wait(&a, "a status with the pod", 3 * watchdog, |got| {
        got.iter()
            .any(|(_, m)| m.contains("STATUS=1 pod; standalone"))
    });

    let stop = Instant::now();
    a.stop();
    systemd.read(Duration::from_millis(200), |_| false);
    let stopping = arrivals(&systemd.got, "STOPPING=1");
    assert_eq!(
        stopping.len(),
        1,
        "STOPPING=1 once on SIGTERM: {:?}\n{}",
        systemd.messages(),
        a.agent_log()
    );
    assert!(stopping[0] >= stop);
    // The pod outlives the agent, as ever.
    assert!(support::agent::pid_alive(init as i32));
}

#[test]
fn abstract_socket_and_a_watchdog_meant_for_another_process() {
    if !need_root() {
        return;
    }
    let name = format!("holdfast-it-notify-{}", std::process::id());
    let addr = SocketAddr::from_abstract_name(name.as_bytes()).expect("abstract address");
    let mut systemd = Manager::new(UnixDatagram::bind_addr(&addr).expect("bind"));
    let mut a = Agent::new("sdnotify-abstract");
    // WATCHDOG_PID names another process (as a shell wrapper started by systemd would
    // see): the agent must not ping, as sd_watchdog_enabled(3) says.
    a.extra_env = vec![
        ("NOTIFY_SOCKET".into(), format!("@{name}")),
        ("WATCHDOG_USEC".into(), "500000".into()),
        ("WATCHDOG_PID".into(), "1".into()),
    ];
    a.spawn();
    systemd.wait(&a, "READY=1", MIN, |got| {
        !arrivals(got, "READY=1").is_empty()
    });
    // Pings would come every 250 ms: a second shows there are none.
    systemd.read(Duration::from_secs(1), |_| false);
    assert_eq!(
        arrivals(&systemd.got, "WATCHDOG=1"),
        Vec::<Instant>::new(),
        "{:?}",
        systemd.messages()
    );
    a.stop();
    systemd.read(Duration::from_millis(200), |_| false);
    assert_eq!(
        arrivals(&systemd.got, "STOPPING=1").len(),
        1,
        "{:?}",
        systemd.messages()
    );
}

#[test]
fn garbage_from_the_service_manager_is_named_and_not_fatal() {
    if !need_root() {
        return;
    }
    let dir = TempDir::new("sd-notify-garbage");
    let path = dir.0.join("notify.sock");
    let mut systemd = Manager::new(UnixDatagram::bind(&path).expect("bind"));
    let mut a = Agent::new("sdnotify-garbage");
    a.extra_env = vec![
        ("NOTIFY_SOCKET".into(), path.display().to_string()),
        ("WATCHDOG_USEC".into(), "99999999999999999999999".into()),
    ];
    a.spawn();
    // The socket still works: the agent says it is ready, without a watchdog.
    systemd.wait(&a, "READY=1", MIN, |got| {
        !arrivals(got, "READY=1").is_empty()
    });
    let log = a.agent_log();
    assert!(
        log.contains("WATCHDOG_USEC \"99999999999999999999999\" is not a number of microseconds"),
        "{log}"
    );
    a.stop();
}

/// The repository's unit with its binary and config pointed at this build and a temp file.
fn unit_for_verify(dir: &Path) -> std::path::PathBuf {
    let repo = Path::new(env!("CARGO_MANIFEST_DIR"));
    let text = std::fs::read_to_string(repo.join(systemd::UNIT)).expect("read the unit");
    let config = dir.join("config.yaml");
    std::fs::write(
        &config,
        "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\n",
    )
    .expect("config");
    systemd::unit_at(dir, &text, bin(), &config)
}

#[test]
fn unit_passes_systemd_analyze_verify() {
    let dir = TempDir::new("unit-verify");
    systemd::assert_verifies(&unit_for_verify(&dir.0));
}

#[test]
fn verify_catches_a_broken_unit() {
    // The check above is only worth something if systemd-analyze speaks up.
    let dir = TempDir::new("unit-verify-broken");
    let unit = unit_for_verify(&dir.0);
    let text = std::fs::read_to_string(&unit).expect("read");
    std::fs::write(&unit, text.replace("WatchdogSec=60s", "WatchdogSec=sixty")).expect("write");
    let Some((_, said)) = systemd::verify(&unit) else {
        return;
    };
    assert!(said.contains("sixty"), "{said}");
}

/// A `systemd.time(7)` span of whole seconds or minutes, as the unit writes them.
fn seconds(span: &str) -> Option<u64> {
    let span = span.trim();
    if let Some(m) = span.strip_suffix("min") {
        return m.trim().parse::<u64>().ok()?.checked_mul(60);
    }
    span.strip_suffix('s').unwrap_or(span).trim().parse().ok()
}

#[test]
fn unit_stop_timeout_is_what_the_agent_promises() {
    let repo = Path::new(env!("CARGO_MANIFEST_DIR"));
    let text = std::fs::read_to_string(repo.join(systemd::UNIT)).expect("read the unit");
    let Some(value) = text.lines().find_map(|l| l.strip_prefix("TimeoutStopSec=")) else {
        panic!(
            "the unit sets no TimeoutStopSec=: systemd's default (90 s) is what a stop \
             waits for before it kills the agent"
        );
    };
    let timeout = seconds(value).unwrap_or_else(|| panic!("TimeoutStopSec={value}"));
    // tests/agent_stop.rs holds a real agent to an exit within 15 s of SIGTERM while
    // pods wait out grace periods of minutes to a year; the agent itself leaves its
    // workers after `STOP_WAIT`. The unit allows that with room for a slow flash.
    let promised = 15.max(2 * holdfast::sync::STOP_WAIT.as_secs());
    assert!(
        (promised..90).contains(&timeout),
        "TimeoutStopSec={value}: the agent promises an exit within {promised} s"
    );
}
