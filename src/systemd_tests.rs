//! systemd: the environment checks, the watchdog verdict, and the messages a socket
//! receives from a [`Notify`] and its ping thread.

use super::*;
use std::ffi::OsString;

const PID: u32 = 4242;
const S: Duration = Duration::from_secs(1);

fn env(socket: Option<&str>, usec: Option<&str>, pid: Option<&str>) -> Settings {
    let os = |v: Option<&str>| v.map(OsString::from);
    let (socket, usec, pid) = (os(socket), os(usec), os(pid));
    settings(socket.as_deref(), usec.as_deref(), pid.as_deref(), PID)
}

#[test]
fn nothing_set_is_a_no_op_without_complaint() {
    assert_eq!(env(None, None, None), Settings::default());
    let n = Notify::new(&Settings::default());
    assert!(!n.is_enabled());
    // Each call on a disabled link returns at once and does nothing.
    n.beat(3);
    n.stopping();
    assert!(n.start().is_none());
    assert!(n.beat_interval().is_none());
}

#[test]
fn socket_paths_and_abstract_names() {
    let s = env(Some("/run/systemd/notify"), None, None);
    assert_eq!(s.target, Some(Target::Path("/run/systemd/notify".into())));
    assert!(s.problems.is_empty());
    let s = env(Some("@/org/freedesktop/systemd1/notify/123"), None, None);
    assert_eq!(
        s.target,
        Some(Target::Abstract(
            b"/org/freedesktop/systemd1/notify/123".to_vec()
        ))
    );
    for bad in ["", "relative/path", "vsock:2:1234"] {
        let s = env(Some(bad), Some("1000000"), None);
        assert_eq!(s.target, None, "{bad:?}");
        assert_eq!(s.watchdog, None, "{bad:?}");
        assert!(
            matches!(s.problems[..], [NotifyError::Socket { .. }]),
            "{bad:?}: {:?}",
            s.problems
        );
    }
    // sun_path holds 108 bytes: a longer name is refused up front.
    let long = format!("/{}", "x".repeat(200));
    let s = env(Some(&long), None, None);
    assert_eq!(s.target, None);
    assert!(matches!(
        s.problems[..],
        [NotifyError::SocketAddress { .. }]
    ));
}

#[test]
fn watchdog_usec_is_checked() {
    let sock = Some("/run/systemd/notify");
    assert_eq!(env(sock, Some("60000000"), None).watchdog, Some(60 * S));
    assert_eq!(env(sock, Some(" 2000000\n"), None).watchdog, Some(2 * S));
    for (value, want) in [
        ("soon", "invalid digit"),
        ("-5", "invalid digit"),
        ("1.5", "invalid digit"),
        ("", "empty"),
        ("18446744073709551616", "too large"),
        ("99999999999999999999999", "too large"),
    ] {
        let s = env(sock, Some(value), None);
        assert_eq!(s.watchdog, None, "{value:?}");
        assert!(s.target.is_some(), "the socket still works for READY=1");
        match &s.problems[..] {
            [e @ NotifyError::WatchdogUsec { reason, .. }] => {
                assert!(reason.contains(want), "{value:?}: {reason}");
                assert!(e.to_string().contains("WatchdogSec="), "{e}");
            }
            other => panic!("{value:?}: {other:?}"),
        }
    }
    for usec in ["0", "18446744073709551615"] {
        let s = env(sock, Some(usec), None);
        assert_eq!(s.watchdog, None, "{usec}");
        assert!(matches!(
            s.problems[..],
            [NotifyError::WatchdogRange { .. }]
        ));
    }
}

#[test]
fn watchdog_pid_names_the_process_the_watchdog_is_for() {
    let sock = Some("/run/systemd/notify");
    let usec = Some("4000000");
    assert_eq!(env(sock, usec, Some("4242")).watchdog, Some(4 * S));
    // Another process's watchdog: not ours, and nothing wrong with that.
    let s = env(sock, usec, Some("1"));
    assert_eq!((s.watchdog, s.problems.len()), (None, 0));
    for bad in ["me", "0", "-1", "99999999999"] {
        let s = env(sock, usec, Some(bad));
        assert_eq!(s.watchdog, None, "{bad}");
        assert!(
            matches!(s.problems[..], [NotifyError::WatchdogPid { .. }]),
            "{bad}: {:?}",
            s.problems
        );
    }
    // WATCHDOG_PID alone means nothing (sd_watchdog_enabled looks at it only with
    // WATCHDOG_USEC).
    assert_eq!(env(sock, None, Some("me")).problems, vec![]);
}

#[test]
fn a_watchdog_without_a_socket_is_named() {
    let s = env(None, Some("1000000"), None);
    assert_eq!((s.target, s.watchdog), (None, None));
    assert_eq!(s.problems, vec![NotifyError::NoSocket]);
}

#[test]
fn health_follows_the_last_pass() {
    let limit = 60 * S;
    assert_eq!(health(10 * S, None, limit, false), Health::Starting);
    assert_eq!(
        health(70 * S, Some(10 * S), limit, false),
        Health::Stalled { since: 60 * S }
    );
    assert_eq!(health(69 * S, Some(10 * S), limit, false), Health::Passing);
    assert_eq!(health(10 * S, Some(10 * S), limit, false), Health::Passing);
    // A stamp from another thread newer than the clock read: fresh, not an underflow.
    assert_eq!(health(10 * S, Some(11 * S), limit, false), Health::Passing);
    assert_eq!(
        health(500 * S, Some(10 * S), limit, false),
        Health::Stalled { since: 490 * S }
    );
    // Stopping: the loop ended on purpose; the stop has its own timeout.
    assert_eq!(health(500 * S, Some(10 * S), limit, true), Health::Stopping);
    assert_eq!(health(500 * S, None, limit, true), Health::Stopping);
    assert!(Health::Passing.ping() && Health::Stopping.ping());
    assert!(!Health::Starting.ping());
    assert!(!Health::Stalled { since: S }.ping());
}

#[test]
fn periods_fit_the_watchdog() {
    assert_eq!(ping_period(60 * S), 30 * S);
    assert_eq!(beat_period(60 * S), 15 * S);
    assert_eq!(beat_period(2 * S), Duration::from_millis(500));
    assert_eq!(beat_period(3600 * S), MAX_BEAT);
    assert_eq!(ping_period(Duration::from_micros(1)), MIN_PERIOD);
    assert_eq!(beat_period(Duration::from_micros(1)), MIN_PERIOD);
    // The largest value the parser accepts does not overflow the arithmetic.
    let huge = Duration::from_micros(u64::MAX - 1);
    assert!(ping_period(huge) > beat_period(huge));
}

#[test]
fn status_is_one_short_line() {
    assert_eq!(status_text(0, None), "0 pods; standalone");
    assert_eq!(status_text(1, Some("uplink up")), "1 pod; uplink up");
    assert_eq!(status_text(7, Some("uplink down")), "7 pods; uplink down");
}

/// Messages that arrive on `sock` within `within`, one string per datagram.
fn receive(sock: &UnixDatagram, within: Duration) -> Vec<(Instant, String)> {
    let deadline = Instant::now() + within;
    let mut out = Vec::new();
    let mut buf = [0u8; 4096];
    while let Some(left) = deadline.checked_duration_since(Instant::now()) {
        if left.is_zero() {
            break;
        }
        sock.set_read_timeout(Some(left)).expect("timeout");
        match sock.recv(&mut buf) {
            Ok(n) => out.push((
                Instant::now(),
                String::from_utf8_lossy(&buf[..n]).into_owned(),
            )),
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                ) =>
            {
                break
            }
            Err(e) => panic!("recv: {e}"),
        }
    }
    out
}

fn pings(messages: &[(Instant, String)]) -> Vec<Instant> {
    messages
        .iter()
        .filter(|(_, m)| m.lines().any(|l| l == "WATCHDOG=1"))
        .map(|(t, _)| *t)
        .collect()
}

#[test]
fn ready_status_pings_and_a_stall_withholds_them() {
    let dir = crate::testutil::TempDir::new("sd-notify");
    let path = dir.0.join("notify.sock");
    let sock = UnixDatagram::bind(&path).expect("bind");
    // Long enough that a loaded machine (two cores, tests beside) does not delay a
    // thread by half of it.
    let watchdog = S;
    let n = Notify::new(&Settings {
        target: Some(Target::Path(path)),
        watchdog: Some(watchdog),
        problems: vec![],
    });
    assert_eq!(n.watchdog(), Some(watchdog));
    let pinger = n.start().expect("ping thread");
    // Before the first pass: no READY and no pings.
    let early = receive(&sock, watchdog);
    assert!(early.is_empty(), "{early:?}");

    n.set_uplink(|| "uplink down");
    n.beat(2);
    let first = receive(&sock, Duration::from_millis(50));
    assert_eq!(first[0].1, "READY=1\nSTATUS=2 pods; uplink down");

    // Beats every 100 ms for 3 s: a ping every half interval, about 6. The gaps between
    // them are the integration test's (tests/systemd_unit.rs): here a loaded machine
    // that delays this thread would look like a stall.
    let mut got = Vec::new();
    for _ in 0..30 {
        n.beat(2);
        got.extend(receive(&sock, Duration::from_millis(100)));
    }
    let p = pings(&got);
    assert!(p.len() >= 4, "{got:?}");
    // The status changes with the pod count, once.
    n.beat(3);
    let got = receive(&sock, watchdog);
    let statuses: Vec<&str> = got
        .iter()
        .flat_map(|(_, m)| m.lines())
        .filter(|l| l.starts_with("STATUS="))
        .collect();
    assert_eq!(statuses, ["STATUS=3 pods; uplink down"], "{got:?}");

    // The loop stalls: within one interval the pings stop, and stay stopped (half an
    // interval of slack for a ping decided just before and received late).
    let stalled_at = Instant::now();
    let got = receive(&sock, 3 * watchdog);
    let after: Vec<Instant> = pings(&got)
        .into_iter()
        .filter(|t| *t - stalled_at > watchdog + watchdog / 2)
        .collect();
    assert!(after.is_empty(), "pings after the stall: {got:?}");
    // It passes again: pings resume.
    n.beat(3);
    let mut got = Vec::new();
    for _ in 0..15 {
        n.beat(3);
        got.extend(receive(&sock, Duration::from_millis(100)));
    }
    assert!(!pings(&got).is_empty(), "no pings after recovery: {got:?}");

    n.stopping();
    let got = receive(&sock, Duration::from_millis(50));
    assert!(
        got.iter()
            .any(|(_, m)| m == "STOPPING=1\nSTATUS=stopping; pods keep running"),
        "{got:?}"
    );
    drop(pinger);
    // The thread is gone: what it sent is queued already, and nothing more comes.
    receive(&sock, Duration::from_millis(10));
    let got = receive(&sock, watchdog);
    assert!(got.is_empty(), "{got:?}");
}

#[test]
fn abstract_socket() {
    let name = format!("holdfast-test-notify-{}", std::process::id());
    let addr = SocketAddr::from_abstract_name(name.as_bytes()).expect("address");
    let sock = UnixDatagram::bind_addr(&addr).expect("bind");
    let s = env(Some(&format!("@{name}")), None, None);
    let n = Notify::new(&s);
    assert!(n.is_enabled());
    n.beat(0);
    n.beat(0);
    n.stopping();
    let got: Vec<String> = receive(&sock, Duration::from_millis(200))
        .into_iter()
        .map(|(_, m)| m)
        .collect();
    assert_eq!(
        got,
        [
            "READY=1\nSTATUS=0 pods; standalone",
            "STOPPING=1\nSTATUS=stopping; pods keep running"
        ]
    );
}

#[test]
fn a_missing_listener_costs_nothing_but_a_warning() {
    let dir = crate::testutil::TempDir::new("sd-notify-gone");
    let n = Notify::new(&Settings {
        target: Some(Target::Path(dir.0.join("nobody.sock"))),
        watchdog: None,
        problems: vec![],
    });
    assert!(n.is_enabled());
    n.beat(1);
    n.stopping();
}
