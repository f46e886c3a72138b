//! What the graceful shutdown asks of systemd-logind over the system bus, as the
//! kubelet asks it: `InhibitDelayMaxUSec`, a drop-in that raises `InhibitDelayMaxSec`
//! and a reload, a "delay" inhibitor lock for "shutdown" (a file descriptor: closing it
//! releases the lock), and the `PrepareForShutdown` signal.

use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::dbus::{Connection, DbusError, Method, Value};

const LOGIND: &str = "org.freedesktop.login1";
const LOGIND_PATH: &str = "/org/freedesktop/login1";
const MANAGER: &str = "org.freedesktop.login1.Manager";
/// The drop-in's name: after the distribution's own, as the kubelet's `99-kubelet.conf`.
pub const DROP_IN: &str = "99-holdfast.conf";
/// Who and why, as `systemd-inhibit --list` shows the lock.
pub const WHO: &str = "holdfast";
const WHY: &str = "holdfast needs time to stop the node's pods";

/// Why logind could not be asked.
#[derive(Debug, thiserror::Error)]
pub enum LogindError {
    #[error("system bus: {0}")]
    Bus(#[from] DbusError),
    #[error("logind answered {what} with {got}")]
    Answer { what: &'static str, got: String },
    #[error("write {path}: {source}")]
    DropIn {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("reload logind: {0}")]
    Reload(String),
}

/// A connection to the system bus, for logind.
pub struct Logind {
    bus: Connection,
}

fn manager(member: &str) -> Method<'_> {
    Method {
        destination: LOGIND,
        path: LOGIND_PATH,
        interface: MANAGER,
        member,
    }
}

impl Logind {
    pub fn connect(address: &str) -> Result<Logind, LogindError> {
        Ok(Logind {
            bus: Connection::open(address)?,
        })
    }

    /// The longest a delay inhibitor may hold a shutdown back: `InhibitDelayMaxUSec`.
    pub fn inhibit_delay_max(&mut self) -> Result<Duration, LogindError> {
        match self
            .bus
            .get_property(LOGIND, LOGIND_PATH, MANAGER, "InhibitDelayMaxUSec")?
        {
            Value::U64(us) => Ok(Duration::from_micros(us)),
            other => Err(LogindError::Answer {
                what: "InhibitDelayMaxUSec",
                got: format!("{other:?}"),
            }),
        }
    }

    /// Takes a delay inhibitor lock on shutdown; it holds while the descriptor is open.
    pub fn inhibit(&mut self) -> Result<OwnedFd, LogindError> {
        let body = ["shutdown", WHO, WHY, "delay"].map(|s| Value::Str(s.into()));
        let mut reply = self.bus.call(&manager("Inhibit"), &body)?;
        let first = reply.body.first().cloned().unwrap_or(Value::Byte(0));
        reply.take_fd(&first).ok_or_else(|| LogindError::Answer {
            what: "Inhibit",
            got: format!("{:?} with {} descriptor(s)", reply.body, reply.fds.len()),
        })
    }

    /// Asks for `PrepareForShutdown`.
    pub fn watch_shutdown(&mut self) -> Result<(), LogindError> {
        let rule = format!(
            "type='signal',sender='{LOGIND}',interface='{MANAGER}',\
             member='PrepareForShutdown',path='{LOGIND_PATH}'"
        );
        Ok(self.bus.add_match(&rule)?)
    }

    /// The next `PrepareForShutdown`: true when a shutdown begins, false when one was
    /// cancelled; `None` when `timeout` passes first.
    pub fn next_prepare(&mut self, timeout: Duration) -> Result<Option<bool>, LogindError> {
        let deadline = std::time::Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            let Some(msg) = self.bus.next(left)? else {
                return Ok(None);
            };
            if !msg.is_signal(MANAGER, "PrepareForShutdown") {
                continue;
            }
            match msg.body.first() {
                Some(Value::Bool(b)) => return Ok(Some(*b)),
                other => log::warn!("node shutdown: PrepareForShutdown with {other:?}: ignored"),
            }
        }
    }

    /// Makes logind read its configuration again, as the kubelet does: SIGHUP to
    /// `systemd-logind.service` through systemd; where systemd does not answer, SIGHUP
    /// to the process that holds logind's name on the bus.
    pub fn reload(&mut self) -> Result<(), LogindError> {
        let kill_unit = Method {
            destination: "org.freedesktop.systemd1",
            path: "/org/freedesktop/systemd1",
            interface: "org.freedesktop.systemd1.Manager",
            member: "KillUnit",
        };
        let body = [
            Value::Str("systemd-logind.service".into()),
            Value::Str("all".into()),
            Value::I32(nix::sys::signal::Signal::SIGHUP as i32),
        ];
        let Err(e) = self.bus.call(&kill_unit, &body) else {
            return Ok(());
        };
        log::debug!("node shutdown: systemd's KillUnit: {e}; signalling logind itself");
        let reply = self
            .bus
            .bus_call("GetConnectionUnixProcessID", &[Value::Str(LOGIND.into())])?;
        let pid = match reply.body.first() {
            Some(Value::U32(pid)) => *pid,
            other => {
                return Err(LogindError::Reload(format!(
                    "logind's process id: {other:?}"
                )))
            }
        };
        // Never 0 or 1 (the process group, or init): only a process of its own.
        let pid = i32::try_from(pid)
            .ok()
            .filter(|p| *p > 1)
            .ok_or_else(|| LogindError::Reload(format!("logind's process id {pid} refused")))?;
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(pid),
            nix::sys::signal::Signal::SIGHUP,
        )
        .map_err(|e| LogindError::Reload(format!("SIGHUP to {pid}: {e}")))
    }
}

/// Writes the drop-in that sets `InhibitDelayMaxSec` to `delay` (whole seconds,
/// rounded up), atomically; returns its path.
pub fn write_drop_in(dir: &Path, delay: Duration) -> Result<PathBuf, LogindError> {
    let path = dir.join(DROP_IN);
    let err = |source| LogindError::DropIn {
        path: path.clone(),
        source,
    };
    std::fs::create_dir_all(dir).map_err(err)?;
    let secs = delay.as_secs() + u64::from(delay.subsec_nanos() > 0);
    let text = format!(
        "# Written by holdfast: shutdownGracePeriod asks for this long to stop pods.\n\
         [Login]\nInhibitDelayMaxSec={secs}\n"
    );
    let tmp = dir.join(format!(".{DROP_IN}.tmp"));
    std::fs::write(&tmp, text).map_err(err)?;
    std::fs::rename(&tmp, &path).map_err(err)?;
    Ok(path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_drop_in_says_whole_seconds_and_replaces_the_last() {
        let dir = crate::testutil::TempDir::new("logind-drop-in");
        let conf = dir.0.join("logind.conf.d");
        let path = write_drop_in(&conf, Duration::from_millis(29_500)).expect("write");
        assert_eq!(path, conf.join("99-holdfast.conf"));
        let text = std::fs::read_to_string(&path).expect("read");
        assert!(text.contains("[Login]\nInhibitDelayMaxSec=30\n"), "{text}");
        write_drop_in(&conf, Duration::from_secs(45)).expect("again");
        let text = std::fs::read_to_string(&path).expect("read");
        assert!(text.ends_with("InhibitDelayMaxSec=45\n"), "{text}");
        assert_eq!(std::fs::read_dir(&conf).expect("dir").count(), 1);
    }
}
