//! Attach: how `kubectl attach` reaches a running container's stdio, which its shim
//! owns. Shim side: [`Attach`], a listener on `<container dir>/attach.sock` and the
//! clients attached to it, served from the shim's single-threaded poll loop (see
//! [`super::supervise`]). Agent side: [`LibcontainerRuntime::attach`] connects to it.
//! Nothing here calls libcontainer.
//!
//! The socket carries the exec process's frames ([`Frame`]): a client sends `Stdin`,
//! `StdinEof` and `Resize`; the shim sends `Stdout` and `Stderr` as the container
//! writes them, and a last `Exit` once it has exited. A client sees what is written
//! after it attached, as with the kubelet (no history).
//!
//! Bounds, so that the container and its CRI log never wait for a client: at most
//! [`MAX_CLIENTS`] clients (one more gets an `Exit` with an error); each client's
//! queued output is capped at [`CLIENT_BUFFER`], and a client that falls further
//! behind is detached; input waits in one [`STDIN_BUFFER`], and while it is full no
//! client is read. The container has a stdin only if its spec says `stdin: true`
//! (input is dropped otherwise, as containerd does); with `stdinOnce` the end of a
//! client's input closes it.

use std::fs::File;
use std::io::{ErrorKind, Read, Write};
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use nix::poll::{PollFd, PollFlags, PollTimeout};
use nix::sys::socket::{send, MsgFlags};

use super::exec::{ExecExit, Frame};
use super::logs::Stream;
use super::{ContainerId, LibcontainerRuntime, RuntimeError};

/// The socket's name in the container's directory.
pub const SOCKET: &str = "attach.sock";
/// Clients attached to one container at once.
pub const MAX_CLIENTS: usize = 8;
/// Output queued for one client before it is detached as too slow.
pub const CLIENT_BUFFER: usize = 256 * 1024;
/// Input queued for the container's stdin.
pub const STDIN_BUFFER: usize = 64 * 1024;
/// What one read from a client may add to its input.
const READ_CHUNK: usize = 16 * 1024;
/// The largest frame a client may send; the agent cuts input into pieces this size.
pub const MAX_INPUT: usize = 32 * 1024;
/// How long an exited container's clients get to read their last output.
const FLUSH: Duration = Duration::from_secs(1);

struct Client {
    sock: UnixStream,
    /// Encoded frames not yet sent.
    out: Vec<u8>,
    /// Bytes received that do not make a whole frame yet.
    input: Vec<u8>,
    gone: bool,
}

/// What one entry of the poll set stands for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Slot {
    Listener,
    Stdin,
    Client(usize),
}

/// The shim's side of attach. All descriptors are non-blocking.
pub struct Attach {
    id: String,
    socket: PathBuf,
    listener: Option<UnixListener>,
    clients: heapless::Vec<Client, MAX_CLIENTS>,
    /// The container's stdin (pipe write end, or the terminal's master).
    stdin: Option<File>,
    pending: Vec<u8>,
    stdin_once: bool,
    /// Close stdin once `pending` is written (`stdinOnce` and a client's input ended).
    close_stdin: bool,
    /// The container's terminal, for resizes.
    tty: Option<OwnedFd>,
}

fn nonblocking(fd: &impl AsRawFd) {
    use nix::fcntl::{fcntl, FcntlArg, OFlag};
    let flags = fcntl(fd.as_raw_fd(), FcntlArg::F_GETFL)
        .map(OFlag::from_bits_truncate)
        .unwrap_or(OFlag::empty());
    let _ = fcntl(fd.as_raw_fd(), FcntlArg::F_SETFL(flags | OFlag::O_NONBLOCK));
}

impl Attach {
    /// `listener`: bound on `<dir>/attach.sock` (None if that failed: attach is then
    /// refused, the container runs all the same). `stdin`: the container's stdin
    /// writer, if its spec has one. `tty`: its terminal's master, if it has one.
    pub fn new(
        id: &str,
        dir: &Path,
        listener: Option<UnixListener>,
        stdin: Option<OwnedFd>,
        stdin_once: bool,
        tty: Option<OwnedFd>,
    ) -> Attach {
        if let Some(l) = &listener {
            let _ = l.set_nonblocking(true);
        }
        if let Some(s) = &stdin {
            nonblocking(s);
        }
        Attach {
            id: id.to_owned(),
            socket: dir.join(SOCKET),
            listener,
            clients: heapless::Vec::new(),
            stdin: stdin.map(File::from),
            pending: Vec::new(),
            stdin_once,
            close_stdin: false,
            tty,
        }
    }

    /// How many clients are attached.
    #[cfg(test)]
    fn clients(&self) -> usize {
        self.clients.iter().filter(|c| !c.gone).count()
    }

    /// Lets go of the clients that are gone; call before [`Attach::poll_fds`].
    pub fn sweep(&mut self) {
        self.clients.retain(|c| !c.gone);
    }

    /// Adds what to wait for to `fds`; returns what each added entry stands for.
    pub fn poll_fds<'a>(&'a self, fds: &mut Vec<PollFd<'a>>) -> Vec<Slot> {
        let mut slots = Vec::new();
        if let Some(l) = &self.listener {
            fds.push(PollFd::new(l.as_fd(), PollFlags::POLLIN));
            slots.push(Slot::Listener);
        }
        if let Some(s) = self.stdin.as_ref().filter(|_| !self.pending.is_empty()) {
            fds.push(PollFd::new(s.as_fd(), PollFlags::POLLOUT));
            slots.push(Slot::Stdin);
        }
        let room = self.stdin.is_none() || self.pending.len() < STDIN_BUFFER;
        for (i, c) in self.clients.iter().enumerate() {
            let mut want = PollFlags::empty();
            if room {
                want |= PollFlags::POLLIN;
            }
            if !c.out.is_empty() {
                want |= PollFlags::POLLOUT;
            }
            // Hang-ups and errors are reported whatever is asked for.
            fds.push(PollFd::new(c.sock.as_fd(), want));
            slots.push(Slot::Client(i));
        }
        slots
    }

    /// Acts on what `poll` reported for the entries [`Attach::poll_fds`] added.
    pub fn on_ready(&mut self, slots: &[Slot], revents: &[PollFlags]) {
        for (slot, ev) in slots.iter().zip(revents) {
            if ev.is_empty() {
                continue;
            }
            match *slot {
                Slot::Listener => self.accept(),
                Slot::Stdin => self.write_stdin(),
                Slot::Client(i) => {
                    if ev.intersects(PollFlags::POLLOUT) {
                        self.flush_client(i);
                    }
                    if ev.intersects(PollFlags::POLLIN | PollFlags::POLLHUP | PollFlags::POLLERR) {
                        self.read_client(i);
                    }
                }
            }
        }
    }

    fn accept(&mut self) {
        let Some(l) = &self.listener else { return };
        loop {
            let sock = match l.accept() {
                Ok((s, _)) => s,
                Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                Err(e) if e.kind() == ErrorKind::WouldBlock => return,
                // EMFILE and the like: the listener would stay readable and the loop
                // spin; attach is refused from now on, the container runs on.
                Err(e) => {
                    log::error!(
                        "shim {}: accept on {}: {e}; attach is refused",
                        self.id,
                        SOCKET
                    );
                    self.listener = None;
                    let _ = std::fs::remove_file(&self.socket);
                    return;
                }
            };
            let _ = sock.set_nonblocking(true);
            let client = Client {
                sock,
                out: Vec::new(),
                input: Vec::new(),
                gone: false,
            };
            if self.clients.len() >= MAX_CLIENTS {
                let refusal = Frame::Exit(ExecExit {
                    exit_code: None,
                    error: Some(format!(
                        "{MAX_CLIENTS} clients are attached to this container already"
                    )),
                })
                .encode();
                // A fresh socket's buffer takes these few bytes at once.
                let _ = send(client.sock.as_raw_fd(), &refusal, MsgFlags::MSG_NOSIGNAL);
                continue;
            }
            let _ = self.clients.push(client);
        }
    }

    fn write_stdin(&mut self) {
        let Some(s) = self.stdin.as_mut() else { return };
        while !self.pending.is_empty() {
            match s.write(&self.pending) {
                Ok(n) => {
                    self.pending.drain(..n);
                }
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) if e.kind() == ErrorKind::WouldBlock => return,
                // The container closed its stdin: nobody will read the rest.
                Err(_) => {
                    self.stdin = None;
                    self.pending.clear();
                    return;
                }
            }
        }
        if self.close_stdin {
            self.end_stdin();
        }
    }

    /// The end of the container's input: a pipe is closed; a terminal has no end of
    /// input, so it gets ^D (what a user would type) and stays open for resizes.
    fn end_stdin(&mut self) {
        if let Some(mut s) = self.stdin.take() {
            if self.tty.is_some() {
                let _ = s.write(&[4]);
            }
        }
        self.close_stdin = false;
    }

    fn read_client(&mut self, i: usize) {
        let mut frames = Vec::new();
        {
            let Some(c) = self.clients.get_mut(i) else {
                return;
            };
            // Read straight into the client's input: a buffer on the stack would be
            // part of the shim's frames while it waits, its pages resident for good.
            while c.input.len() < STDIN_BUFFER {
                let had = c.input.len();
                c.input.resize(had + READ_CHUNK.min(STDIN_BUFFER - had), 0);
                let read = c.sock.read(&mut c.input[had..]);
                c.input.truncate(had + *read.as_ref().unwrap_or(&0));
                match read {
                    Ok(0) => {
                        c.gone = true;
                        break;
                    }
                    Ok(_) => {}
                    Err(e) if e.kind() == ErrorKind::Interrupted => {}
                    Err(e) if e.kind() == ErrorKind::WouldBlock => break,
                    Err(_) => {
                        c.gone = true;
                        break;
                    }
                }
            }
            loop {
                match Frame::decode(&c.input) {
                    Ok(Some((f, used))) => {
                        c.input.drain(..used);
                        frames.push(f);
                    }
                    Ok(None) if c.input.len() <= MAX_INPUT + 5 => break,
                    // A frame larger than any client sends: not one of ours.
                    Ok(None) | Err(_) => {
                        c.gone = true;
                        c.input.clear();
                        break;
                    }
                }
            }
        }
        for f in frames {
            match f {
                Frame::Stdin(d) if self.stdin.is_some() && !self.close_stdin => {
                    self.pending.extend_from_slice(&d);
                }
                Frame::StdinEof if self.stdin_once && self.stdin.is_some() => {
                    self.close_stdin = true;
                    if self.pending.is_empty() {
                        self.end_stdin();
                    }
                }
                Frame::Resize(w, h) => {
                    if let Some(t) = &self.tty {
                        super::exec_shim::resize(t, w, h);
                    }
                }
                _ => {}
            }
        }
    }

    fn flush_client(&mut self, i: usize) {
        let Some(c) = self.clients.get_mut(i) else {
            return;
        };
        while !c.out.is_empty() {
            match send(c.sock.as_raw_fd(), &c.out, MsgFlags::MSG_NOSIGNAL) {
                Ok(n) => {
                    c.out.drain(..n);
                }
                Err(nix::errno::Errno::EINTR) => {}
                Err(nix::errno::Errno::EAGAIN) => return,
                Err(_) => {
                    c.gone = true;
                    c.out.clear();
                    return;
                }
            }
        }
    }

    /// Queues what the container wrote for every client; detaches any client that
    /// would go past [`CLIENT_BUFFER`].
    pub fn output(&mut self, stream: Stream, data: &[u8]) {
        if self.clients.is_empty() || data.is_empty() {
            return;
        }
        let frame = match stream {
            Stream::Stdout => Frame::Stdout(data.to_vec()),
            Stream::Stderr => Frame::Stderr(data.to_vec()),
        }
        .encode();
        for c in self.clients.iter_mut().filter(|c| !c.gone) {
            if c.out.len() + frame.len() > CLIENT_BUFFER {
                log::warn!(
                    "shim {}: an attached client fell {} KiB behind; detached it",
                    self.id,
                    c.out.len() / 1024
                );
                c.gone = true;
                c.out.clear();
                continue;
            }
            c.out.extend_from_slice(&frame);
        }
    }

    /// The container has exited: no new clients; every client gets `exit` after its
    /// queued output, for at most [`FLUSH`], and is then let go.
    pub fn finish(&mut self, exit: ExecExit) {
        self.listener = None;
        let _ = std::fs::remove_file(&self.socket);
        self.stdin = None;
        let frame = Frame::Exit(exit).encode();
        for c in self.clients.iter_mut().filter(|c| !c.gone) {
            c.out.extend_from_slice(&frame);
        }
        let deadline = Instant::now() + FLUSH;
        while Instant::now() < deadline {
            for i in 0..self.clients.len() {
                self.flush_client(i);
            }
            let waiting: Vec<PollFd<'_>> = self
                .clients
                .iter()
                .filter(|c| !c.gone && !c.out.is_empty())
                .map(|c| PollFd::new(c.sock.as_fd(), PollFlags::POLLOUT))
                .collect();
            if waiting.is_empty() {
                break;
            }
            let mut waiting = waiting;
            let _ = nix::poll::poll(&mut waiting, PollTimeout::from(50u16));
        }
        self.clients.clear();
    }
}

impl LibcontainerRuntime {
    /// Connects to the shim of running container `id` (see the module doc). Blocking.
    pub fn attach(&self, id: &ContainerId) -> Result<UnixStream, RuntimeError> {
        Self::check_exec_id(id)?;
        let dir = self.state_dir(id);
        super::unix_socket::connect_in(&dir, SOCKET).map_err(|e| match e.kind() {
            ErrorKind::NotFound | ErrorKind::ConnectionRefused => {
                RuntimeError::NotRunning { id: id.0.clone() }
            }
            _ => RuntimeError::Io {
                context: format!("attach to container {id}"),
                source: e,
            },
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;

    /// Runs the shim side's poll loop until `done` holds or 5 s pass.
    fn pump_until(a: &mut Attach, mut done: impl FnMut(&Attach) -> bool) {
        let deadline = Instant::now() + Duration::from_secs(5);
        while !done(a) {
            assert!(Instant::now() < deadline, "attach loop did not get there");
            a.sweep();
            let mut fds = Vec::new();
            let slots = a.poll_fds(&mut fds);
            let _ = nix::poll::poll(&mut fds, PollTimeout::from(50u16));
            let revents: Vec<PollFlags> = fds
                .iter()
                .map(|f| f.revents().unwrap_or(PollFlags::empty()))
                .collect();
            drop(fds);
            a.on_ready(&slots, &revents);
        }
    }

    fn read_frames(sock: &mut UnixStream, buf: &mut Vec<u8>, want: usize) -> Vec<Frame> {
        sock.set_read_timeout(Some(Duration::from_secs(5)))
            .expect("timeout");
        let mut out = Vec::new();
        let mut chunk = [0u8; 4096];
        while out.len() < want {
            while let Ok(Some((f, used))) = Frame::decode(buf) {
                buf.drain(..used);
                out.push(f);
            }
            if out.len() >= want {
                break;
            }
            let n = sock.read(&mut chunk).expect("read");
            if n == 0 {
                break;
            }
            buf.extend_from_slice(&chunk[..n]);
        }
        out
    }

    #[test]
    fn clients_share_output_and_feed_stdin_once() {
        let dir = crate::testutil::TempDir::new("attach");
        let listener = super::super::unix_socket::bind_in(&dir.0, SOCKET).expect("bind");
        let (stdin_r, stdin_w) = nix::unistd::pipe().expect("pipe");
        let mut a = Attach::new("c", &dir.0, Some(listener), Some(stdin_w), true, None);
        let mut one = super::super::unix_socket::connect_in(&dir.0, SOCKET).expect("one");
        let mut two = super::super::unix_socket::connect_in(&dir.0, SOCKET).expect("two");
        pump_until(&mut a, |a| a.clients() == 2);

        a.output(Stream::Stdout, b"hello\n");
        a.output(Stream::Stderr, b"oops\n");
        pump_until(&mut a, |a| a.clients.iter().all(|c| c.out.is_empty()));
        let (mut b1, mut b2) = (Vec::new(), Vec::new());
        assert_eq!(
            read_frames(&mut one, &mut b1, 2),
            vec![
                Frame::Stdout(b"hello\n".to_vec()),
                Frame::Stderr(b"oops\n".to_vec())
            ]
        );
        assert_eq!(read_frames(&mut two, &mut b2, 2).len(), 2);

        // Input from a client reaches the container; with stdinOnce its end closes
        // the container's stdin.
        one.write_all(&Frame::Stdin(b"typed\n".to_vec()).encode())
            .expect("send");
        one.write_all(&Frame::StdinEof.encode()).expect("send");
        pump_until(&mut a, |a| a.stdin.is_none());
        let mut got = String::new();
        File::from(stdin_r)
            .read_to_string(&mut got)
            .expect("container stdin");
        assert_eq!(got, "typed\n");

        // The exit reaches every client, then the socket is gone.
        a.finish(ExecExit {
            exit_code: Some(3),
            error: None,
        });
        let last = read_frames(&mut two, &mut b2, 1);
        assert_eq!(
            last,
            vec![Frame::Exit(ExecExit {
                exit_code: Some(3),
                error: None
            })]
        );
        assert!(!dir.0.join(SOCKET).exists());
    }

    #[test]
    fn a_slow_client_is_detached_and_extra_clients_refused() {
        let dir = crate::testutil::TempDir::new("attach-slow");
        let listener = super::super::unix_socket::bind_in(&dir.0, SOCKET).expect("bind");
        let mut a = Attach::new("c", &dir.0, Some(listener), None, false, None);
        let mut socks = Vec::new();
        for _ in 0..MAX_CLIENTS {
            socks.push(super::super::unix_socket::connect_in(&dir.0, SOCKET).expect("connect"));
        }
        pump_until(&mut a, |a| a.clients() == MAX_CLIENTS);
        let mut extra = super::super::unix_socket::connect_in(&dir.0, SOCKET).expect("extra");
        let mut buf = Vec::new();
        pump_until(&mut a, |_| {
            extra.set_nonblocking(true).expect("nonblocking");
            let mut chunk = [0u8; 512];
            if let Ok(n) = extra.read(&mut chunk) {
                buf.extend_from_slice(&chunk[..n]);
            }
            matches!(Frame::decode(&buf), Ok(Some(_)))
        });
        match Frame::decode(&buf) {
            Ok(Some((Frame::Exit(e), _))) => assert!(e.error.is_some(), "{e:?}"),
            other => panic!("extra client got {other:?}"),
        }

        // Nobody reads: output far past the bound detaches the clients instead of
        // growing (the socket buffers take some, the rest must be dropped).
        let chunk = vec![b'x'; 64 * 1024];
        for _ in 0..64 {
            a.output(Stream::Stdout, &chunk);
            a.sweep();
            let mut fds = Vec::new();
            let slots = a.poll_fds(&mut fds);
            let _ = nix::poll::poll(&mut fds, PollTimeout::from(1u16));
            let revents: Vec<PollFlags> = fds
                .iter()
                .map(|f| f.revents().unwrap_or(PollFlags::empty()))
                .collect();
            drop(fds);
            a.on_ready(&slots, &revents);
            assert!(a.clients.iter().all(|c| c.out.len() <= CLIENT_BUFFER));
        }
        assert_eq!(a.clients(), 0, "slow clients still attached");
        drop(socks);
    }
}
