//! systemd: what `holdfast run` tells the service manager under `Type=notify` (the
//! `sd_notify` protocol, one datagram to `$NOTIFY_SOCKET`): `READY=1` once the sync loop
//! has made its first pass, `STOPPING=1` when a graceful stop begins, a one-line
//! `STATUS=`, and `WATCHDOG=1` every half `WatchdogSec=` while the sync loop keeps
//! completing passes. Without `$NOTIFY_SOCKET` every call does nothing. Knows nothing of
//! pods or the uplink beyond the count and the words it is handed.
//!
//! Why the pings follow the sync loop and not a timer of their own: a ping that only
//! proves the process exists restarts nothing when the loop that starts, restarts and
//! stops pods is wedged (a deadlock, a syscall stuck on a failing SD card). The loop
//! stamps a monotonic time at every pass ([`Notify::beat`]); a thread of its own pings
//! only while the last stamp is younger than the watchdog interval ([`health`]). A thread
//! and not a task: the runtime is current-thread, and a task would stall with the loop
//! without ever saying why. When the pings stop, systemd restarts the agent; the pods
//! keep running (`KillMode=process`) and the new agent adopts them.

use std::ffi::OsStr;
use std::io;
use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr, UnixDatagram};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc::{self, RecvTimeoutError};
use std::sync::{Arc, OnceLock};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Where the service manager listens: a path, or an abstract name when it starts with `@`.
pub const NOTIFY_SOCKET: &str = "NOTIFY_SOCKET";
/// `WatchdogSec=` in microseconds.
pub const WATCHDOG_USEC: &str = "WATCHDOG_USEC";
/// The process the watchdog is meant for; unset means this one.
pub const WATCHDOG_PID: &str = "WATCHDOG_PID";

/// The shortest ping or beat period: a tiny `WatchdogSec=` must not make a thread spin.
const MIN_PERIOD: Duration = Duration::from_millis(10);
/// The longest beat period: a pass at least this often, however long the watchdog.
const MAX_BEAT: Duration = Duration::from_secs(60);
/// How often `STATUS=` is brought up to date when there is no watchdog to ping.
const STATUS_PERIOD: Duration = Duration::from_secs(10);

/// Why an environment variable from the service manager is not used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NotifyError {
    #[error(
        "NOTIFY_SOCKET {value:?} is neither an absolute path nor an abstract name (@...): \
         systemd is told nothing (Type=notify then times out: check the unit)"
    )]
    Socket { value: String },
    #[error("NOTIFY_SOCKET {value:?}: {reason}: systemd is told nothing")]
    SocketAddress { value: String, reason: String },
    #[error(
        "WATCHDOG_USEC {value:?} is not a number of microseconds ({reason}): no watchdog \
         pings (check WatchdogSec= in the unit)"
    )]
    WatchdogUsec { value: String, reason: String },
    #[error(
        "WATCHDOG_USEC {usec} is not a usable interval: no watchdog pings (check \
         WatchdogSec= in the unit)"
    )]
    WatchdogRange { usec: u64 },
    #[error("WATCHDOG_PID {value:?} is not a process id ({reason}): no watchdog pings")]
    WatchdogPid { value: String, reason: String },
    #[error("WATCHDOG_USEC is set but NOTIFY_SOCKET is not: no watchdog pings can be sent")]
    NoSocket,
}

/// The service manager's socket.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    Path(PathBuf),
    /// An abstract-namespace name, without the leading `@`.
    Abstract(Vec<u8>),
}

impl Target {
    fn address(&self) -> io::Result<SocketAddr> {
        match self {
            Target::Path(p) => SocketAddr::from_pathname(p),
            Target::Abstract(name) => SocketAddr::from_abstract_name(name),
        }
    }
}

/// What the environment asks for, checked.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Settings {
    /// `None`: no service manager listens, or its address is unusable.
    pub target: Option<Target>,
    /// The watchdog interval, when it is meant for this process.
    pub watchdog: Option<Duration>,
    /// What was set but cannot be used, for the log.
    pub problems: Vec<NotifyError>,
}

/// Reads the service manager's variables as `sd_notify` and `sd_watchdog_enabled` do:
/// the socket is a path (`/...`) or an abstract name (`@...`); the watchdog applies when
/// `WATCHDOG_USEC` is a positive number below infinity and `WATCHDOG_PID`, if set, is
/// `own_pid`. Nothing here is fatal: what cannot be used is left out and named in
/// `problems`.
pub fn settings(
    socket: Option<&OsStr>,
    usec: Option<&OsStr>,
    pid: Option<&OsStr>,
    own_pid: u32,
) -> Settings {
    let mut out = Settings::default();
    if let Some(value) = socket {
        match socket_target(value) {
            Ok(t) => out.target = Some(t),
            Err(e) => out.problems.push(e),
        }
    }
    let Some(usec) = usec else { return out };
    let text = usec.to_string_lossy();
    let usec = match text.trim().parse::<u64>() {
        Ok(u) => u,
        Err(e) => {
            out.problems.push(NotifyError::WatchdogUsec {
                value: text.into_owned(),
                reason: e.to_string(),
            });
            return out;
        }
    };
    // systemd's USEC_INFINITY is u64::MAX: "no timeout", not a period to ping at.
    if usec == 0 || usec == u64::MAX {
        out.problems.push(NotifyError::WatchdogRange { usec });
        return out;
    }
    if let Some(pid) = pid {
        let text = pid.to_string_lossy();
        match text.trim().parse::<u32>() {
            Ok(0) => {
                out.problems.push(NotifyError::WatchdogPid {
                    value: text.into_owned(),
                    reason: "0 is no process".into(),
                });
                return out;
            }
            Ok(p) if p != own_pid => return out,
            Ok(_) => {}
            Err(e) => {
                out.problems.push(NotifyError::WatchdogPid {
                    value: text.into_owned(),
                    reason: e.to_string(),
                });
                return out;
            }
        }
    }
    if out.target.is_none() {
        if socket.is_none() {
            out.problems.push(NotifyError::NoSocket);
        }
        return out;
    }
    out.watchdog = Some(Duration::from_micros(usec));
    out
}

fn socket_target(value: &OsStr) -> Result<Target, NotifyError> {
    use std::os::unix::ffi::OsStrExt;
    let bytes = value.as_bytes();
    let target = match bytes.first() {
        Some(b'/') => Target::Path(PathBuf::from(value)),
        Some(b'@') => Target::Abstract(bytes[1..].to_vec()),
        _ => {
            return Err(NotifyError::Socket {
                value: value.to_string_lossy().into_owned(),
            })
        }
    };
    // The same check the kernel makes (a name must fit in sun_path), made up front.
    match target.address() {
        Ok(_) => Ok(target),
        Err(e) => Err(NotifyError::SocketAddress {
            value: value.to_string_lossy().into_owned(),
            reason: e.to_string(),
        }),
    }
}

/// The sync loop as the watchdog sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Health {
    /// No pass yet: the agent is starting (systemd arms the watchdog at `READY=1`).
    Starting,
    /// The last pass ended within the limit.
    Passing,
    /// The last pass ended `since` ago, at or past the limit.
    Stalled { since: Duration },
    /// A graceful stop is under way: the loop ended on purpose (`TimeoutStopSec=`
    /// bounds the rest).
    Stopping,
}

impl Health {
    /// Whether systemd gets a `WATCHDOG=1`.
    pub fn ping(self) -> bool {
        matches!(self, Health::Passing | Health::Stopping)
    }
}

/// The watchdog's verdict at `now`, with the last pass ended at `last_pass` (both
/// measured from one monotonic origin) and `limit` the watchdog interval: the loop must
/// have completed a pass within the interval.
pub fn health(
    now: Duration,
    last_pass: Option<Duration>,
    limit: Duration,
    stopping: bool,
) -> Health {
    if stopping {
        return Health::Stopping;
    }
    let Some(last) = last_pass else {
        return Health::Starting;
    };
    // A stamp taken after `now` was read (another thread) is as fresh as can be.
    let since = now.saturating_sub(last);
    if since < limit {
        Health::Passing
    } else {
        Health::Stalled { since }
    }
}

/// How often to ping for a watchdog interval: half of it, as `sd_watchdog_enabled(3)`
/// recommends.
pub fn ping_period(watchdog: Duration) -> Duration {
    (watchdog / 2).max(MIN_PERIOD)
}

/// How often the sync loop must at least complete a pass: a quarter of the watchdog
/// interval, so one late wake-up (a slow tick, a busy core) never costs a ping.
pub fn beat_period(watchdog: Duration) -> Duration {
    (watchdog / 4).clamp(MIN_PERIOD, MAX_BEAT)
}

/// `STATUS=`: what `systemctl status holdfast` shows under "Status:".
pub fn status_text(pods: usize, uplink: Option<&str>) -> String {
    let pods = if pods == 1 {
        "1 pod".to_string()
    } else {
        format!("{pods} pods")
    };
    format!("{pods}; {}", uplink.unwrap_or("standalone"))
}

type UplinkWords = Box<dyn Fn() -> &'static str + Send + Sync>;

struct Inner {
    socket: UnixDatagram,
    address: SocketAddr,
    watchdog: Option<Duration>,
    origin: Instant,
    /// Microseconds from `origin` to the last pass, plus one; 0 before the first.
    last_pass: AtomicU64,
    pods: AtomicUsize,
    ready: AtomicBool,
    stopping: AtomicBool,
    /// A send failed already: later failures go to the debug log only.
    send_failed: AtomicBool,
    uplink: OnceLock<UplinkWords>,
}

/// The link to the service manager; does nothing when there is none. Cheap to clone.
#[derive(Clone, Default)]
pub struct Notify {
    inner: Option<Arc<Inner>>,
}

impl Notify {
    /// Reads `NOTIFY_SOCKET`, `WATCHDOG_USEC` and `WATCHDOG_PID` and removes them from the
    /// environment, so that no shim, container, CNI plugin or hook inherits them (a child
    /// that found them would speak for the agent). Call before any child is started and
    /// before a second thread exists: changing the environment races with readers.
    pub fn from_env() -> Notify {
        let names = [NOTIFY_SOCKET, WATCHDOG_USEC, WATCHDOG_PID];
        let [socket, usec, pid] = names.map(std::env::var_os);
        for name in names {
            if std::env::var_os(name).is_some() {
                std::env::remove_var(name);
            }
        }
        let s = settings(
            socket.as_deref(),
            usec.as_deref(),
            pid.as_deref(),
            std::process::id(),
        );
        for p in &s.problems {
            log::warn!("systemd: {p}");
        }
        Notify::new(&s)
    }

    /// A link to `settings.target`, or one that does nothing.
    pub fn new(settings: &Settings) -> Notify {
        let Some(target) = &settings.target else {
            return Notify::default();
        };
        match open(target) {
            Ok((socket, address)) => Notify {
                inner: Some(Arc::new(Inner {
                    socket,
                    address,
                    watchdog: settings.watchdog,
                    origin: Instant::now(),
                    last_pass: AtomicU64::new(0),
                    pods: AtomicUsize::new(0),
                    ready: AtomicBool::new(false),
                    stopping: AtomicBool::new(false),
                    send_failed: AtomicBool::new(false),
                    uplink: OnceLock::new(),
                })),
            },
            Err(e) => {
                log::warn!("systemd: open a socket to {target:?}: {e}: systemd is told nothing");
                Notify::default()
            }
        }
    }

    pub fn is_enabled(&self) -> bool {
        self.inner.is_some()
    }

    /// The watchdog interval systemd expects pings within, if any.
    pub fn watchdog(&self) -> Option<Duration> {
        self.inner.as_ref().and_then(|i| i.watchdog)
    }

    /// The sync loop's extra wake-up, so that an idle loop still completes a pass every
    /// [`beat_period`]; `None` without a watchdog.
    pub fn beat_interval(&self) -> Option<tokio::time::Interval> {
        let mut i = tokio::time::interval(beat_period(self.watchdog()?));
        i.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        Some(i)
    }

    /// The sync loop completed a pass with `pods` pod workers. The first one tells
    /// systemd the agent is ready.
    pub fn beat(&self, pods: usize) {
        let Some(inner) = &self.inner else { return };
        let micros = u64::try_from(inner.origin.elapsed().as_micros()).unwrap_or(u64::MAX - 1);
        inner.last_pass.store(micros + 1, Ordering::Release);
        inner.pods.store(pods, Ordering::Relaxed);
        if !inner.ready.swap(true, Ordering::AcqRel) {
            let status = inner.status();
            log::info!("systemd: ready ({status})");
            inner.send(&format!("READY=1\nSTATUS={status}"));
        }
    }

    /// A graceful stop begins: pods keep running.
    pub fn stopping(&self) {
        let Some(inner) = &self.inner else { return };
        if !inner.stopping.swap(true, Ordering::AcqRel) {
            inner.send("STOPPING=1\nSTATUS=stopping; pods keep running");
        }
    }

    /// The uplink's state in a few words (`uplink down`), for `STATUS=`; a standalone
    /// agent never sets it.
    pub fn set_uplink(&self, words: impl Fn() -> &'static str + Send + Sync + 'static) {
        if let Some(inner) = &self.inner {
            let _ = inner.uplink.set(Box::new(words));
        }
    }

    /// Starts the thread that pings the watchdog while the sync loop is healthy and keeps
    /// `STATUS=` up to date; it ends when the returned handle is dropped.
    pub fn start(&self) -> Option<Pinger> {
        let inner = self.inner.clone()?;
        let (stop, stopped) = mpsc::channel();
        let watchdog = inner.watchdog;
        match std::thread::Builder::new()
            .name("sd-notify".into())
            .spawn(move || inner.run(&stopped))
        {
            Ok(thread) => Some(Pinger {
                stop: Some(stop),
                thread: Some(thread),
            }),
            Err(e) => {
                if watchdog.is_some() {
                    log::error!(
                        "systemd: start the watchdog thread: {e}: no pings, systemd will \
                         restart the agent"
                    );
                } else {
                    log::warn!("systemd: start the status thread: {e}");
                }
                None
            }
        }
    }
}

fn open(target: &Target) -> io::Result<(UnixDatagram, SocketAddr)> {
    let address = target.address()?;
    let socket = UnixDatagram::unbound()?;
    // A full queue at the manager must never block the sync loop's thread.
    socket.set_nonblocking(true)?;
    Ok((socket, address))
}

impl Inner {
    fn status(&self) -> String {
        let uplink = self.uplink.get().map(|f| f());
        status_text(self.pods.load(Ordering::Relaxed), uplink)
    }

    fn last_pass(&self) -> Option<Duration> {
        match self.last_pass.load(Ordering::Acquire) {
            0 => None,
            m => Some(Duration::from_micros(m - 1)),
        }
    }

    fn send(&self, message: &str) {
        match self.socket.send_to_addr(message.as_bytes(), &self.address) {
            Ok(_) => {}
            Err(e) if self.send_failed.swap(true, Ordering::Relaxed) => {
                log::debug!("systemd: send {message:?}: {e}")
            }
            Err(e) => log::warn!("systemd: send {message:?}: {e} (later failures: debug log)"),
        }
    }

    /// The thread's loop: each period, a ping if the sync loop is healthy and the status
    /// if it changed, in one datagram.
    fn run(&self, stop: &mpsc::Receiver<()>) {
        let period = self.watchdog.map(ping_period).unwrap_or(STATUS_PERIOD);
        let mut sent_status = String::new();
        let mut withheld = false;
        loop {
            match stop.recv_timeout(period) {
                Err(RecvTimeoutError::Timeout) => {}
                Ok(()) | Err(RecvTimeoutError::Disconnected) => return,
            }
            let mut message = String::new();
            let stopping = self.stopping.load(Ordering::Acquire);
            if self.ready.load(Ordering::Acquire) && !stopping {
                let status = self.status();
                if status != sent_status {
                    message.push_str(&format!("STATUS={status}\n"));
                    sent_status = status;
                }
            }
            if let Some(limit) = self.watchdog {
                let verdict = health(self.origin.elapsed(), self.last_pass(), limit, stopping);
                match verdict {
                    Health::Stalled { since } if !withheld => {
                        withheld = true;
                        log::error!(
                            "systemd: the sync loop has completed no pass for {:.1} s (watchdog \
                             {:.1} s): watchdog pings withheld, systemd will restart the agent; \
                             pods keep running",
                            since.as_secs_f64(),
                            limit.as_secs_f64()
                        );
                    }
                    v if v.ping() => {
                        if withheld {
                            withheld = false;
                            log::warn!(
                                "systemd: the sync loop completes passes again: pings resume"
                            );
                        }
                        message.push_str("WATCHDOG=1\n");
                    }
                    _ => {}
                }
            }
            if !message.is_empty() {
                self.send(message.trim_end());
            }
        }
    }
}

/// The running ping thread; dropping it stops the thread.
pub struct Pinger {
    stop: Option<mpsc::Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

impl Drop for Pinger {
    fn drop(&mut self) {
        drop(self.stop.take());
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Completes at each tick of `interval`, or never without one (the sync loop's select).
pub async fn tick(interval: &mut Option<tokio::time::Interval>) {
    match interval {
        Some(i) => {
            i.tick().await;
        }
        None => std::future::pending().await,
    }
}

#[cfg(test)]
#[path = "systemd_tests.rs"]
mod tests;
