//! probe::net: the outcome every probe action gives, the TCP dial the actions share (with
//! Go's words for its failures, which the kubelet passes on), and the tcpSocket action.
//! Blocking; resolves names with the system resolver.

use std::io;
use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
use std::time::{Duration, Instant};

/// What a probe action found, as the kubelet's prober reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    Success,
    /// With the kubelet's message.
    Failure(String),
    /// Success with a warning (kubelet: redirect to another host).
    Warning(String),
}

impl Outcome {
    /// Whether the probe passed: a warning passes, as in the kubelet.
    pub fn passed(&self) -> bool {
        !matches!(self, Outcome::Failure(_))
    }
}

/// The least time one address of several gets, as Go's dialer gives (its
/// `partialDeadline`), so a name with a dead first address still reaches the second.
const MIN_ADDRESS_TIMEOUT: Duration = Duration::from_secs(2);

/// A failed dial, in Go's words (`dial tcp 10.0.0.5:80: connect: connection refused`).
#[derive(Debug, thiserror::Error)]
pub(super) enum DialError {
    #[error("dial tcp: lookup {host}: {reason}")]
    Lookup { host: String, reason: String },
    #[error("dial tcp: lookup {host}: no such host")]
    NoAddress { host: String },
    #[error("dial tcp {addr}: i/o timeout")]
    Timeout { addr: String },
    #[error("dial tcp {addr}: connect: {reason}")]
    Connect { addr: SocketAddr, reason: String },
}

/// The tcpSocket action: a connection opened within `timeout` passes, and is closed at
/// once.
pub fn tcp(host: &str, port: u16, timeout: Duration) -> Outcome {
    match dial(host, port, deadline(timeout)) {
        Ok(_) => Outcome::Success,
        Err(e) => Outcome::Failure(e.to_string()),
    }
}

/// Connects to `host` (an IP literal, bracketed or not, or a name) by TCP before
/// `deadline`, trying each address of a name in turn and reporting the first failure,
/// as Go's dialer does. The name lookup itself cannot be bounded (getaddrinfo).
pub(super) fn dial(host: &str, port: u16, deadline: Instant) -> Result<TcpStream, DialError> {
    let bare = unbracket(host);
    let addrs: Vec<SocketAddr> = (bare, port)
        .to_socket_addrs()
        .map_err(|e| DialError::Lookup {
            host: bare.to_string(),
            reason: words(&e),
        })?
        .collect();
    let Some(&first_addr) = addrs.first() else {
        return Err(DialError::NoAddress {
            host: bare.to_string(),
        });
    };
    let mut first_error = None;
    for (i, addr) in addrs.iter().enumerate() {
        let Some(left) = remaining(deadline) else {
            break;
        };
        let others = u32::try_from(addrs.len() - i).unwrap_or(u32::MAX);
        let share = (left / others).max(MIN_ADDRESS_TIMEOUT.min(left));
        match TcpStream::connect_timeout(addr, share) {
            Ok(stream) => {
                linger(&stream);
                return Ok(stream);
            }
            Err(e) => {
                first_error.get_or_insert_with(|| connect_error(*addr, &e));
            }
        }
    }
    Err(first_error.unwrap_or(DialError::Timeout {
        addr: first_addr.to_string(),
    }))
}

/// SO_LINGER of one second, as the kubelet's probe dialer sets it (kubernetes issue
/// 89898): probes every few seconds should not pile up sockets in TIME-WAIT, and a zero
/// linger would throw away data not yet sent. Best effort: a probe works without it.
fn linger(stream: &TcpStream) {
    let linger = nix::libc::linger {
        l_onoff: 1,
        l_linger: 1,
    };
    let _ = nix::sys::socket::setsockopt(stream, nix::sys::socket::sockopt::Linger, &linger);
}

fn connect_error(addr: SocketAddr, e: &io::Error) -> DialError {
    if is_timeout(e) {
        DialError::Timeout {
            addr: addr.to_string(),
        }
    } else {
        DialError::Connect {
            addr,
            reason: words(e),
        }
    }
}

/// When a probe of `timeout` must be done; a timeout too large for the clock (nothing
/// a pod spec can say) is cut to a day rather than overflow.
pub(super) fn deadline(timeout: Duration) -> Instant {
    let now = Instant::now();
    now.checked_add(timeout)
        .or_else(|| now.checked_add(Duration::from_secs(24 * 3600)))
        .unwrap_or(now)
}

/// The time left before `deadline`; `None` once it has passed.
pub(super) fn remaining(deadline: Instant) -> Option<Duration> {
    deadline
        .checked_duration_since(Instant::now())
        .filter(|d| !d.is_zero())
}

/// Bounds the next read and write on `stream` by `deadline`; a timeout error once it has
/// passed (a zero timeout would mean none to std).
pub(super) fn set_deadline(stream: &TcpStream, deadline: Instant) -> io::Result<()> {
    let left = remaining(deadline).ok_or_else(|| io::Error::from(io::ErrorKind::TimedOut))?;
    stream.set_read_timeout(Some(left))?;
    stream.set_write_timeout(Some(left))
}

/// Whether `e` is a timeout: socket timeouts come back as `WouldBlock` (EAGAIN) on Linux.
pub(super) fn is_timeout(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::TimedOut | io::ErrorKind::WouldBlock
    )
}

/// An I/O error as Go says it: `connection refused`, `i/o timeout`; no `(os error N)`.
pub(super) fn words(e: &io::Error) -> String {
    if is_timeout(e) {
        return "i/o timeout".to_string();
    }
    let text = e.to_string();
    let text = match text.find(" (os error ") {
        Some(i) => &text[..i],
        None => &text,
    };
    let mut chars = text.chars();
    match chars.next() {
        Some(c) => c.to_lowercase().chain(chars).collect(),
        None => String::new(),
    }
}

/// `host:port`, with an IPv6 literal bracketed (Go's `net.JoinHostPort`).
pub(super) fn join_host_port(host: &str, port: u16) -> String {
    let bare = unbracket(host);
    if bare.contains(':') {
        format!("[{bare}]:{port}")
    } else {
        format!("{bare}:{port}")
    }
}

/// An IPv6 literal without its URL brackets; anything else as it is.
pub(super) fn unbracket(host: &str) -> &str {
    host.strip_prefix('[')
        .and_then(|h| h.strip_suffix(']'))
        .unwrap_or(host)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::TcpListener;

    fn closed_port() -> u16 {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
        listener.local_addr().expect("addr").port()
    }

    #[test]
    fn tcp_to_an_open_listener_succeeds() {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
        let port = listener.local_addr().expect("addr").port();
        assert_eq!(
            tcp("127.0.0.1", port, Duration::from_secs(2)),
            Outcome::Success
        );
    }

    #[test]
    fn tcp_to_a_name_tries_each_address() {
        // localhost may resolve to ::1 first, where nothing listens.
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
        let port = listener.local_addr().expect("addr").port();
        assert_eq!(
            tcp("localhost", port, Duration::from_secs(5)),
            Outcome::Success
        );
    }

    #[test]
    fn tcp_to_a_closed_port_fails_as_the_kubelet_says() {
        let port = closed_port();
        let outcome = tcp("127.0.0.1", port, Duration::from_secs(2));
        assert_eq!(
            outcome,
            Outcome::Failure(format!(
                "dial tcp 127.0.0.1:{port}: connect: connection refused"
            ))
        );
        assert!(!outcome.passed());
    }

    #[test]
    fn tcp_to_an_unknown_name_fails() {
        let outcome = tcp("name.invalid", 80, Duration::from_secs(5));
        let Outcome::Failure(message) = outcome else {
            panic!("expected a failure, got {outcome:?}");
        };
        assert!(
            message.starts_with("dial tcp: lookup name.invalid"),
            "{message}"
        );
    }

    #[test]
    fn dialled_sockets_linger_one_second() {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
        let port = listener.local_addr().expect("addr").port();
        let stream =
            dial("127.0.0.1", port, Instant::now() + Duration::from_secs(2)).expect("dial");
        let linger = nix::sys::socket::getsockopt(&stream, nix::sys::socket::sockopt::Linger)
            .expect("SO_LINGER");
        assert_eq!((linger.l_onoff, linger.l_linger), (1, 1));
    }

    #[test]
    fn a_huge_timeout_does_not_overflow() {
        assert!(deadline(Duration::MAX) > Instant::now());
    }

    #[test]
    fn ipv6_literals_are_bracketed() {
        assert_eq!(join_host_port("::1", 80), "[::1]:80");
        assert_eq!(join_host_port("[::1]", 80), "[::1]:80");
        assert_eq!(join_host_port("10.0.0.5", 8080), "10.0.0.5:8080");
        assert_eq!(join_host_port("pod.local", 1), "pod.local:1");
    }

    #[test]
    fn io_errors_read_as_go_says_them() {
        let refused = io::Error::from_raw_os_error(111);
        assert_eq!(words(&refused), "connection refused");
        assert_eq!(
            words(&io::Error::from(io::ErrorKind::WouldBlock)),
            "i/o timeout"
        );
    }
}
