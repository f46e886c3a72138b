//! dbus: a minimal client of a D-Bus message bus, enough to talk to systemd-logind on
//! the system bus: connect over a unix socket, authenticate (SASL EXTERNAL with unix
//! fd passing agreed), `Hello`, method calls and their replies, a property's `Get`,
//! `AddMatch` and the signals it brings, and file descriptors received with a message
//! (SCM_RIGHTS). Blocking: one connection belongs to one thread. A leaf: knows nothing
//! of the rest of holdfast.
//!
//! Why not a crate: the one D-Bus client crate that does all this brings an async
//! executor and a dozen dependencies into a binary that uses six calls.

pub mod wire;

use std::collections::VecDeque;
use std::io::{IoSliceMut, Read, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;
use std::time::{Duration, Instant};

use nix::sys::socket::{recvmsg, ControlMessageOwned, MsgFlags};

use wire::Header;
pub use wire::{Kind, Type, Value};

/// Where the system bus listens when `DBUS_SYSTEM_BUS_ADDRESS` is not set.
pub const DEFAULT_SYSTEM_BUS: &str = "unix:path=/run/dbus/system_bus_socket";
/// The environment variable that moves the system bus.
pub const SYSTEM_BUS_ENV: &str = "DBUS_SYSTEM_BUS_ADDRESS";
/// How long a method call waits for its reply (the bus's own default is 25 s).
pub const CALL_TIMEOUT: Duration = Duration::from_secs(25);
/// Signals kept while a reply is awaited; past it the oldest go (and are logged).
const PENDING_SIGNALS: usize = 64;
/// File descriptors one read may bring (the bus passes at most 16 per message).
const MAX_FDS: usize = 16;
/// What a SASL line from the bus may be at most.
const MAX_AUTH_LINE: usize = 512;

/// Why a D-Bus exchange failed.
#[derive(Debug, thiserror::Error)]
pub enum DbusError {
    #[error("bus address {0:?}: only unix:path= and unix:abstract= are supported")]
    Address(String),
    #[error("{context}: {source}")]
    Io {
        context: String,
        #[source]
        source: std::io::Error,
    },
    #[error("authentication with the bus: {0}")]
    Auth(String),
    #[error("bus protocol: {0}")]
    Protocol(String),
    #[error("{name}: {message}")]
    Remote { name: String, message: String },
    #[error("no reply to {0} within the timeout")]
    Timeout(String),
    #[error("the bus closed the connection")]
    Closed,
}

impl DbusError {
    fn io(context: &str) -> impl FnOnce(std::io::Error) -> DbusError + '_ {
        move |source| DbusError::Io {
            context: context.into(),
            source,
        }
    }

    /// The D-Bus error name of a remote error.
    pub fn remote_name(&self) -> Option<&str> {
        match self {
            DbusError::Remote { name, .. } => Some(name),
            _ => None,
        }
    }
}

/// A message received, with the file descriptors it carried.
#[derive(Debug)]
pub struct Message {
    pub header: Header,
    pub body: Vec<Value>,
    pub fds: Vec<OwnedFd>,
}

impl Message {
    /// Whether this is `interface.member` as a signal.
    pub fn is_signal(&self, interface: &str, member: &str) -> bool {
        self.header.kind == Some(Kind::Signal)
            && self.header.interface.as_deref() == Some(interface)
            && self.header.member.as_deref() == Some(member)
    }

    /// Takes the file descriptor a `h` value names.
    pub fn take_fd(&mut self, v: &Value) -> Option<OwnedFd> {
        let Value::Fd(i) = v else { return None };
        let i = usize::try_from(*i).ok().filter(|i| *i < self.fds.len())?;
        Some(self.fds.swap_remove(i))
    }
}

/// The name of a method, for errors.
pub struct Method<'a> {
    pub destination: &'a str,
    pub path: &'a str,
    pub interface: &'a str,
    pub member: &'a str,
}

/// One connection to a bus.
pub struct Connection {
    stream: UnixStream,
    buf: Vec<u8>,
    fds: VecDeque<OwnedFd>,
    serial: u32,
    pending: VecDeque<Message>,
    unique_name: String,
}

/// The socket an address names: `unix:path=/x` or `unix:abstract=x` (the first of
/// several `;`-separated addresses that is one of these).
fn socket_of(address: &str) -> Result<UnixStream, DbusError> {
    for one in address.split(';') {
        let Some(params) = one.strip_prefix("unix:") else {
            continue;
        };
        for kv in params.split(',') {
            let target = |v: &str| unescape(v).ok_or_else(|| DbusError::Address(address.into()));
            if let Some(p) = kv.strip_prefix("path=") {
                return UnixStream::connect(target(p)?)
                    .map_err(DbusError::io("connect to the bus"));
            }
            if let Some(name) = kv.strip_prefix("abstract=") {
                use std::os::linux::net::SocketAddrExt;
                let addr = std::os::unix::net::SocketAddr::from_abstract_name(target(name)?)
                    .map_err(DbusError::io("abstract bus address"))?;
                return UnixStream::connect_addr(&addr)
                    .map_err(DbusError::io("connect to the bus"));
            }
        }
    }
    Err(DbusError::Address(address.into()))
}

/// An address value's `%xx` escapes undone.
fn unescape(v: &str) -> Option<String> {
    let b = v.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' {
            let hex = std::str::from_utf8(b.get(i + 1..i + 3)?).ok()?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

impl Connection {
    /// Connects to the bus at `address`, authenticates and says `Hello`.
    pub fn open(address: &str) -> Result<Connection, DbusError> {
        let stream = socket_of(address)?;
        stream
            .set_read_timeout(Some(CALL_TIMEOUT))
            .map_err(DbusError::io("socket timeout"))?;
        let mut c = Connection {
            stream,
            buf: Vec::new(),
            fds: VecDeque::new(),
            serial: 0,
            pending: VecDeque::new(),
            unique_name: String::new(),
        };
        c.authenticate()?;
        let hello = Method {
            destination: "org.freedesktop.DBus",
            path: "/org/freedesktop/DBus",
            interface: "org.freedesktop.DBus",
            member: "Hello",
        };
        let reply = c.call(&hello, &[])?;
        c.unique_name = reply
            .body
            .first()
            .and_then(Value::as_str)
            .ok_or_else(|| DbusError::Protocol("Hello returned no name".into()))?
            .to_owned();
        Ok(c)
    }

    /// The name the bus gave this connection.
    pub fn unique_name(&self) -> &str {
        &self.unique_name
    }

    fn authenticate(&mut self) -> Result<(), DbusError> {
        let uid = nix::unistd::geteuid().as_raw().to_string();
        let hex: String = uid.bytes().map(|b| format!("{b:02x}")).collect();
        self.send_line(&format!("\0AUTH EXTERNAL {hex}\r\n"))?;
        let ok = self.read_line()?;
        if !ok.starts_with("OK ") {
            return Err(DbusError::Auth(format!("the bus answered {ok:?}")));
        }
        self.send_line("NEGOTIATE_UNIX_FD\r\n")?;
        let agree = self.read_line()?;
        if agree != "AGREE_UNIX_FD" {
            return Err(DbusError::Auth(format!(
                "the bus will not pass file descriptors: {agree:?}"
            )));
        }
        self.send_line("BEGIN\r\n")
    }

    fn send_line(&mut self, line: &str) -> Result<(), DbusError> {
        self.stream
            .write_all(line.as_bytes())
            .map_err(DbusError::io("write to the bus"))
    }

    /// One SASL line; the bus sends nothing after it before BEGIN, so reading byte by
    /// byte reads nothing of what follows.
    fn read_line(&mut self) -> Result<String, DbusError> {
        let mut line = Vec::new();
        let mut byte = [0u8; 1];
        while !line.ends_with(b"\r\n") {
            if line.len() > MAX_AUTH_LINE {
                return Err(DbusError::Auth("line too long".into()));
            }
            match self.stream.read(&mut byte) {
                Ok(0) => return Err(DbusError::Closed),
                Ok(_) => line.push(byte[0]),
                Err(e) => return Err(DbusError::io("read from the bus")(e)),
            }
        }
        line.truncate(line.len() - 2);
        String::from_utf8(line).map_err(|_| DbusError::Auth("line not UTF-8".into()))
    }

    fn next_serial(&mut self) -> u32 {
        self.serial = self.serial.wrapping_add(1).max(1);
        self.serial
    }

    /// Sends a message; its serial is set here and returned.
    pub fn send(&mut self, mut header: Header, body: &[Value]) -> Result<u32, DbusError> {
        header.serial = self.next_serial();
        let bytes = wire::encode(&header, body);
        self.stream
            .write_all(&bytes)
            .map_err(DbusError::io("write to the bus"))?;
        Ok(header.serial)
    }

    /// Calls a method and waits for its reply; an error reply is [`DbusError::Remote`].
    /// Signals that arrive meanwhile are kept for [`Connection::next`].
    pub fn call(&mut self, m: &Method, body: &[Value]) -> Result<Message, DbusError> {
        let header = Header {
            kind: Some(Kind::Call),
            path: Some(m.path.into()),
            interface: Some(m.interface.into()),
            member: Some(m.member.into()),
            destination: Some(m.destination.into()),
            ..Header::default()
        };
        let serial = self.send(header, body)?;
        let deadline = Instant::now() + CALL_TIMEOUT;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let Some(msg) = self.read_message(left)? else {
                return Err(DbusError::Timeout(format!("{}.{}", m.interface, m.member)));
            };
            if msg.header.reply_serial != Some(serial) {
                self.keep(msg);
                continue;
            }
            if msg.header.kind == Some(Kind::Error) {
                return Err(DbusError::Remote {
                    name: msg.header.error_name.clone().unwrap_or_default(),
                    message: msg
                        .body
                        .first()
                        .and_then(Value::as_str)
                        .unwrap_or_default()
                        .to_owned(),
                });
            }
            return Ok(msg);
        }
    }

    fn keep(&mut self, msg: Message) {
        if self.pending.len() == PENDING_SIGNALS {
            if let Some(old) = self.pending.pop_front() {
                log::warn!("dbus: dropped an unread {:?}", old.header.member);
            }
        }
        self.pending.push_back(msg);
    }

    /// A property's value (`org.freedesktop.DBus.Properties.Get`), out of its variant.
    pub fn get_property(
        &mut self,
        destination: &str,
        path: &str,
        interface: &str,
        name: &str,
    ) -> Result<Value, DbusError> {
        let get = Method {
            destination,
            path,
            interface: "org.freedesktop.DBus.Properties",
            member: "Get",
        };
        let body = [Value::Str(interface.into()), Value::Str(name.into())];
        let mut reply = self.call(&get, &body)?;
        match reply.body.pop() {
            Some(Value::Variant(v)) if reply.body.is_empty() => Ok(*v),
            _ => Err(DbusError::Protocol(format!(
                "Get {name} returned no variant"
            ))),
        }
    }

    /// Asks the bus for the messages a match rule selects.
    pub fn add_match(&mut self, rule: &str) -> Result<(), DbusError> {
        self.bus_call("AddMatch", &[Value::Str(rule.into())])
            .map(drop)
    }

    /// Calls a method of the bus itself.
    pub fn bus_call(&mut self, member: &str, body: &[Value]) -> Result<Message, DbusError> {
        let m = Method {
            destination: "org.freedesktop.DBus",
            path: "/org/freedesktop/DBus",
            interface: "org.freedesktop.DBus",
            member,
        };
        self.call(&m, body)
    }

    /// The next message other than a reply already handed out: a signal, or a call to
    /// this connection. `None` when `timeout` passes first.
    pub fn next(&mut self, timeout: Duration) -> Result<Option<Message>, DbusError> {
        if let Some(m) = self.pending.pop_front() {
            return Ok(Some(m));
        }
        self.read_message(timeout)
    }

    /// Answers a call with a return.
    pub fn reply(&mut self, to: &Message, body: &[Value]) -> Result<(), DbusError> {
        let header = Header {
            kind: Some(Kind::Return),
            reply_serial: Some(to.header.serial),
            destination: to.header.sender.clone(),
            ..Header::default()
        };
        self.send(header, body).map(drop)
    }

    /// Answers a call with an error.
    pub fn reply_error(&mut self, to: &Message, name: &str, text: &str) -> Result<(), DbusError> {
        let header = Header {
            kind: Some(Kind::Error),
            reply_serial: Some(to.header.serial),
            destination: to.header.sender.clone(),
            error_name: Some(name.into()),
            ..Header::default()
        };
        self.send(header, &[Value::Str(text.into())]).map(drop)
    }

    /// Reads one whole message, waiting up to `timeout` for it to begin.
    fn read_message(&mut self, timeout: Duration) -> Result<Option<Message>, DbusError> {
        let deadline = Instant::now() + timeout;
        while self.buf.len() < 16 {
            if !self.fill(deadline)? {
                return Ok(None);
            }
        }
        let mut fixed = [0u8; 16];
        fixed.copy_from_slice(&self.buf[..16]);
        let total = wire::message_len(&fixed)?;
        // Once a message has begun, the rest of it is waited for as long as a call.
        let rest = Instant::now() + CALL_TIMEOUT;
        while self.buf.len() < total {
            if !self.fill(rest)? {
                return Err(DbusError::Protocol("message cut short".into()));
            }
        }
        let bytes: Vec<u8> = self.buf.drain(..total).collect();
        let (header, body) = wire::decode(&bytes)?;
        let n = header.unix_fds as usize;
        if n > self.fds.len() {
            return Err(DbusError::Protocol(format!(
                "message says {n} file descriptors, {} arrived",
                self.fds.len()
            )));
        }
        let fds = self.fds.drain(..n).collect();
        Ok(Some(Message { header, body, fds }))
    }

    /// Reads what the socket has (and the file descriptors with it); false when the
    /// deadline passed first.
    fn fill(&mut self, deadline: Instant) -> Result<bool, DbusError> {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Ok(false);
        }
        self.stream
            .set_read_timeout(Some(left))
            .map_err(DbusError::io("socket timeout"))?;
        let mut chunk = [0u8; 4096];
        let (n, received) = loop {
            match self.receive(&mut chunk) {
                Err(nix::errno::Errno::EINTR) => continue,
                Err(nix::errno::Errno::EAGAIN) => return Ok(false),
                Err(nix::errno::Errno::ECONNRESET) => return Err(DbusError::Closed),
                Err(e) => return Err(DbusError::io("read from the bus")(e.into())),
                Ok((0, fds)) if fds.is_empty() => return Err(DbusError::Closed),
                Ok(got) => break got,
            }
        };
        for raw in received {
            // SAFETY: the kernel installed this descriptor in this process for this
            // message (SCM_RIGHTS); nothing else owns it.
            #[allow(unsafe_code)]
            self.fds.push_back(unsafe { OwnedFd::from_raw_fd(raw) });
        }
        if self.fds.len() > MAX_FDS * 4 {
            return Err(DbusError::Protocol(
                "file descriptors with no message".into(),
            ));
        }
        self.buf.extend_from_slice(&chunk[..n]);
        Ok(true)
    }

    /// One `recvmsg`: the bytes read into `chunk` and the descriptors that came along.
    fn receive(&self, chunk: &mut [u8]) -> nix::Result<(usize, Vec<RawFd>)> {
        let mut space = nix::cmsg_space!([RawFd; MAX_FDS]);
        let mut iov = [IoSliceMut::new(chunk)];
        let flags = MsgFlags::MSG_CMSG_CLOEXEC;
        let msg = recvmsg::<()>(self.stream.as_raw_fd(), &mut iov, Some(&mut space), flags)?;
        let mut fds = Vec::new();
        for c in msg.cmsgs()? {
            if let ControlMessageOwned::ScmRights(r) = c {
                fds.extend(r);
            }
        }
        Ok((msg.bytes, fds))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use nix::sys::socket::ControlMessage;
    use std::io::IoSlice;

    /// Sends raw bytes, as a peer that misbehaves would.
    fn send_raw(stream: &UnixStream, bytes: &[u8]) {
        let iov = [IoSlice::new(bytes)];
        nix::sys::socket::sendmsg::<()>(stream.as_raw_fd(), &iov, &[], MsgFlags::empty(), None)
            .expect("sendmsg");
    }

    fn pair() -> (Connection, UnixStream) {
        let (a, b) = UnixStream::pair().expect("pair");
        let c = Connection {
            stream: a,
            buf: Vec::new(),
            fds: VecDeque::new(),
            serial: 0,
            pending: VecDeque::new(),
            unique_name: ":1.1".into(),
        };
        (c, b)
    }

    #[test]
    fn a_reply_brings_its_file_descriptor() {
        let (mut c, peer) = pair();
        let reply = Header {
            kind: Some(Kind::Return),
            reply_serial: Some(1),
            unix_fds: 1,
            ..Header::default()
        };
        let bytes = wire::encode(&reply, &[Value::Fd(0)]);
        let (r, w) = nix::unistd::pipe().expect("pipe");
        let fds = [r.as_raw_fd()];
        let iov = [IoSlice::new(&bytes)];
        let cmsg = [ControlMessage::ScmRights(&fds)];
        nix::sys::socket::sendmsg::<()>(peer.as_raw_fd(), &iov, &cmsg, MsgFlags::empty(), None)
            .expect("sendmsg");
        drop(r);
        let mut msg = c
            .read_message(Duration::from_secs(5))
            .expect("read")
            .expect("msg");
        let body = msg.body.clone();
        let fd = msg.take_fd(&body[0]).expect("fd");
        // The received descriptor is the pipe's read end: what is written comes out.
        nix::unistd::write(&w, b"x").expect("write");
        let mut got = [0u8; 1];
        nix::unistd::read(fd.as_raw_fd(), &mut got).expect("read");
        assert_eq!(&got, b"x");
        assert!(msg.take_fd(&Value::Fd(3)).is_none());
    }

    #[test]
    fn a_reply_that_claims_fds_it_did_not_bring_is_refused() {
        let (mut c, peer) = pair();
        let reply = Header {
            kind: Some(Kind::Return),
            reply_serial: Some(1),
            unix_fds: 2,
            ..Header::default()
        };
        send_raw(&peer, &wire::encode(&reply, &[Value::Fd(1)]));
        assert!(c.read_message(Duration::from_secs(5)).is_err());
    }

    #[test]
    fn a_huge_message_is_refused_before_it_is_read() {
        let (mut c, peer) = pair();
        let mut fixed = *b"l\x04\x00\x01\x00\x00\x00\x00\x01\x00\x00\x00\x00\x00\x00\x00";
        fixed[4..8].copy_from_slice(&(512u32 << 20).to_le_bytes());
        send_raw(&peer, &fixed);
        let err = c.read_message(Duration::from_secs(5)).expect_err("refused");
        assert!(matches!(err, DbusError::Protocol(_)), "{err}");
    }

    #[test]
    fn signals_that_arrive_before_a_reply_are_kept_in_order() {
        let (mut c, peer) = pair();
        let signal = |n: u32| Header {
            kind: Some(Kind::Signal),
            serial: n,
            path: Some("/org/freedesktop/login1".into()),
            interface: Some("org.freedesktop.login1.Manager".into()),
            member: Some("PrepareForShutdown".into()),
            ..Header::default()
        };
        let reply = Header {
            kind: Some(Kind::Error),
            serial: 9,
            reply_serial: Some(1),
            error_name: Some("org.freedesktop.DBus.Error.AccessDenied".into()),
            ..Header::default()
        };
        let mut bytes = wire::encode(&signal(5), &[Value::Bool(true)]);
        bytes.extend(wire::encode(&signal(6), &[Value::Bool(false)]));
        bytes.extend(wire::encode(&reply, &[Value::Str("no".into())]));
        send_raw(&peer, &bytes);
        let m = Method {
            destination: "org.freedesktop.login1",
            path: "/org/freedesktop/login1",
            interface: "org.freedesktop.login1.Manager",
            member: "PowerOff",
        };
        let err = c.call(&m, &[Value::Bool(false)]).expect_err("error reply");
        assert_eq!(
            err.remote_name(),
            Some("org.freedesktop.DBus.Error.AccessDenied")
        );
        let wait = Duration::from_millis(10);
        for expect in [true, false] {
            let s = c.next(wait).expect("next").expect("signal");
            assert!(s.is_signal("org.freedesktop.login1.Manager", "PrepareForShutdown"));
            assert_eq!(s.body, vec![Value::Bool(expect)]);
        }
        assert!(c.next(wait).expect("next").is_none());
        drop(peer);
        assert!(matches!(c.next(wait), Err(DbusError::Closed)));
    }

    #[test]
    fn addresses() {
        assert_eq!(unescape("/run/a%2cb").as_deref(), Some("/run/a,b"));
        assert_eq!(unescape("%zz"), None);
        assert!(matches!(
            socket_of("tcp:host=x"),
            Err(DbusError::Address(_))
        ));
    }
}
