//! Unix sockets in a container's directory, and receiving a terminal over one.
//!
//! A socket address holds 108 bytes; a root dir under `/tmp` plus a 64-character
//! container id already passes that. So sockets are bound and reached through
//! `/proc/self/fd/<dir fd>/<name>`, which the kernel resolves as the directory itself
//! whatever its path's length. No chdir: the agent is multi-threaded.

use std::fs::File;
use std::io::{self, IoSliceMut};
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::Path;
use std::time::{Duration, Instant};

use nix::poll::{PollFd, PollFlags, PollTimeout};
use nix::sys::socket::{recvmsg, ControlMessageOwned, MsgFlags};

fn through_fd(dir: &File, name: &str) -> String {
    format!("/proc/self/fd/{}/{name}", dir.as_raw_fd())
}

/// Listens on `dir/name` (a stale socket file there is replaced). Close-on-exec.
pub fn bind_in(dir: &Path, name: &str) -> io::Result<UnixListener> {
    match std::fs::remove_file(dir.join(name)) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(e),
    }
    let d = File::open(dir)?;
    UnixListener::bind(through_fd(&d, name))
}

/// Connects to the socket `dir/name`.
pub fn connect_in(dir: &Path, name: &str) -> io::Result<UnixStream> {
    let d = File::open(dir)?;
    UnixStream::connect(through_fd(&d, name))
}

/// Waits up to `timeout` for `fd` to be readable.
fn wait_readable(fd: &impl AsFd, deadline: Instant, what: &str) -> io::Result<()> {
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(io::Error::new(
                io::ErrorKind::TimedOut,
                format!("timed out waiting for {what}"),
            ));
        }
        let ms = u16::try_from(left.as_millis()).unwrap_or(u16::MAX);
        let mut fds = [PollFd::new(fd.as_fd(), PollFlags::POLLIN)];
        match nix::poll::poll(&mut fds, PollTimeout::from(ms)) {
            Ok(0) | Err(nix::errno::Errno::EINTR) => continue,
            Ok(_) => return Ok(()),
            Err(e) => return Err(e.into()),
        }
    }
}

/// Accepts one connection on `listener` and receives the file descriptor its peer
/// sends (libcontainer's console socket: the terminal master it made in the container),
/// within `timeout`.
pub fn receive_fd(listener: &UnixListener, timeout: Duration) -> io::Result<OwnedFd> {
    let deadline = Instant::now() + timeout;
    wait_readable(listener, deadline, "the console socket's connection")?;
    let (stream, _) = listener.accept()?;
    wait_readable(&stream, deadline, "the terminal")?;
    let mut buf = [0u8; 256];
    let mut iov = [IoSliceMut::new(&mut buf)];
    let mut space = nix::cmsg_space!([RawFd; 4]);
    let msg = recvmsg::<()>(
        stream.as_raw_fd(),
        &mut iov,
        Some(&mut space),
        MsgFlags::MSG_CMSG_CLOEXEC,
    )?;
    let mut received: Vec<OwnedFd> = Vec::new();
    for c in msg.cmsgs()? {
        if let ControlMessageOwned::ScmRights(fds) = c {
            for fd in fds {
                #[allow(unsafe_code)]
                // SAFETY: SCM_RIGHTS installed this descriptor in our table just now;
                // nothing else in the process knows it, so this is its one owner.
                received.push(unsafe { OwnedFd::from_raw_fd(fd) });
            }
        }
    }
    // Any extra descriptor is closed as `received` drops.
    received
        .into_iter()
        .next()
        .ok_or_else(|| io::Error::other("the console socket sent no file descriptor"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};

    #[test]
    fn sockets_in_a_directory_too_deep_for_an_address() {
        let base = crate::testutil::TempDir::new("unix-socket");
        let dir = base.0.join("d".repeat(100)).join("e".repeat(64));
        std::fs::create_dir_all(&dir).expect("mkdir");
        let listener = bind_in(&dir, "s.sock").expect("bind");
        let mut c = connect_in(&dir, "s.sock").expect("connect");
        let (mut s, _) = listener.accept().expect("accept");
        c.write_all(b"hi").expect("write");
        let mut got = [0u8; 2];
        s.read_exact(&mut got).expect("read");
        assert_eq!(&got, b"hi");
        // A stale socket file is replaced.
        drop(listener);
        let again = bind_in(&dir, "s.sock");
        assert!(again.is_ok(), "{again:?}");
        assert!(connect_in(&dir, "nothing.sock").is_err());
    }

    #[test]
    fn a_descriptor_passed_over_the_socket() {
        use nix::sys::socket::{sendmsg, ControlMessage};
        let base = crate::testutil::TempDir::new("unix-socket-fd");
        let listener = bind_in(&base.0, "c.sock").expect("bind");
        let c = connect_in(&base.0, "c.sock").expect("connect");
        let (r, w) = nix::unistd::pipe().expect("pipe");
        let fds = [w.as_raw_fd()];
        let iov = [std::io::IoSlice::new(b"/dev/ptmx")];
        sendmsg::<()>(
            c.as_raw_fd(),
            &iov,
            &[ControlMessage::ScmRights(&fds)],
            MsgFlags::empty(),
            None,
        )
        .expect("sendmsg");
        drop(w);
        let got = receive_fd(&listener, Duration::from_secs(5)).expect("receive");
        let mut f = File::from(got);
        f.write_all(b"through").expect("write");
        drop(f);
        let mut text = String::new();
        File::from(r).read_to_string(&mut text).expect("read");
        assert_eq!(text, "through");
        // Nobody sends: a timeout, not a hang.
        let quiet = bind_in(&base.0, "q.sock").expect("bind");
        let e = receive_fd(&quiet, Duration::from_millis(100)).expect_err("timeout");
        assert_eq!(e.kind(), io::ErrorKind::TimedOut);
    }
}
