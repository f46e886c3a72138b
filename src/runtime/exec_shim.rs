//! `holdfast shim exec <state root> <id> <request json>`: the exec process (see
//! [`super::exec`]). Single-threaded, so it may call libcontainer. Joins the running
//! container with a tenant process, relays frames between its own stdin/stdout and
//! the command's pipes or terminal, and ends with an exit frame. Its own stderr is
//! the container's `exec.log`, for what goes wrong here.

use std::fs::File;
use std::io::{ErrorKind, Read, Write};
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::path::Path;
use std::time::{Duration, Instant};

use libcontainer::container::builder::ContainerBuilder;
use libcontainer::syscall::syscall::SyscallType;
use nix::fcntl::{fcntl, FcntlArg, OFlag};
use nix::poll::{PollFd, PollFlags, PollTimeout};
use nix::sys::wait::{waitpid, WaitPidFlag, WaitStatus};
use nix::unistd::Pid;

use super::exec::{ExecExit, ExecRequest, Frame};
use crate::error::chain;

/// After the command exits, output still in flight is read for at most this long.
const DRAIN: Duration = Duration::from_secs(1);

pub fn main(state_root: &Path, id: &str, request: &str) -> i32 {
    let mut out = std::io::stdout().lock();
    let exit = match serde_json::from_str::<ExecRequest>(request) {
        Ok(req) if !req.command.is_empty() => run(state_root, id, &req, &mut out),
        Ok(_) => ExecExit {
            exit_code: None,
            error: Some("no command given".into()),
        },
        Err(e) => ExecExit {
            exit_code: None,
            error: Some(format!("exec request: {e}")),
        },
    };
    if let Some(e) = &exit.error {
        eprintln!("exec in {id}: {e}");
    }
    let _ = out.write_all(&Frame::Exit(exit).encode());
    let _ = out.flush();
    0
}

/// The command's side of its stdio.
struct Stdio {
    /// What the relay writes input to (pipe or terminal), None without stdin.
    input: Option<File>,
    /// What the relay reads: (fd, is stderr).
    outputs: Vec<(File, bool)>,
    /// The terminal, for resizes.
    tty: Option<OwnedFd>,
}

fn run(state_root: &Path, id: &str, req: &ExecRequest, out: &mut impl Write) -> ExecExit {
    let fail = |error: String| ExecExit {
        exit_code: None,
        error: Some(error),
    };
    let (mine, theirs) = match stdio(req) {
        Ok(s) => s,
        Err(e) => return fail(e),
    };
    let [tin, tout, terr] = theirs;
    let built = ContainerBuilder::new(id.to_owned(), SyscallType::default())
        .with_root_path(state_root)
        .map(|b| {
            b.with_stdin(tin)
                .with_stdout(tout)
                .with_stderr(terr)
                .as_tenant()
                .with_container_args(req.command.clone())
                .with_detach(true)
        })
        .and_then(|b| b.build());
    let pid = match built {
        Ok(pid) => pid,
        Err(e) => return fail(chain(&e)),
    };
    relay(pid, mine, out)
}

fn stdio(req: &ExecRequest) -> Result<(Stdio, [OwnedFd; 3]), String> {
    let devnull = || {
        File::open("/dev/null")
            .map(OwnedFd::from)
            .map_err(|e| format!("open /dev/null: {e}"))
    };
    let dup = |fd: &OwnedFd| fd.try_clone().map_err(|e| format!("dup terminal: {e}"));
    if req.tty {
        let size = req.size.map(|(w, h)| nix::pty::Winsize {
            ws_col: w,
            ws_row: h,
            ws_xpixel: 0,
            ws_ypixel: 0,
        });
        let pty = nix::pty::openpty(size.as_ref(), None).map_err(|e| format!("openpty: {e}"))?;
        let master = pty.master;
        set_cloexec(&master)?;
        let input = if req.stdin {
            Some(File::from(dup(&master)?))
        } else {
            None
        };
        let tty = Some(dup(&master)?);
        let theirs = [dup(&pty.slave)?, dup(&pty.slave)?, pty.slave];
        return Ok((
            Stdio {
                input,
                outputs: vec![(File::from(master), false)],
                tty,
            },
            theirs,
        ));
    }
    let pipe = || nix::unistd::pipe2(OFlag::O_CLOEXEC).map_err(|e| format!("pipe: {e}"));
    let (input, tin) = if req.stdin {
        let (r, w) = pipe()?;
        (Some(File::from(w)), r)
    } else {
        (None, devnull()?)
    };
    let (out_r, out_w) = pipe()?;
    let (err_r, err_w) = pipe()?;
    Ok((
        Stdio {
            input,
            outputs: vec![(File::from(out_r), false), (File::from(err_r), true)],
            tty: None,
        },
        [tin, out_w, err_w],
    ))
}

fn set_cloexec(fd: &OwnedFd) -> Result<(), String> {
    fcntl(
        fd.as_raw_fd(),
        FcntlArg::F_SETFD(nix::fcntl::FdFlag::FD_CLOEXEC),
    )
    .map(|_| ())
    .map_err(|e| format!("fcntl: {e}"))
}

/// Relays until the command has exited and its output is read; returns its exit.
fn relay(pid: Pid, mut io: Stdio, out: &mut impl Write) -> ExecExit {
    let mut stdin = std::io::stdin().lock();
    let mut frames = Vec::new();
    let mut control_open = true;
    let mut status = None;
    let mut drain_until: Option<Instant> = None;
    let mut buf = vec![0u8; 32 * 1024];
    let mut open: Vec<bool> = io.outputs.iter().map(|_| true).collect();
    loop {
        if status.is_none() {
            match waitpid(pid, Some(WaitPidFlag::WNOHANG)) {
                Ok(WaitStatus::Exited(_, code)) => status = Some(code),
                Ok(WaitStatus::Signaled(_, sig, _)) => status = Some(128 + sig as i32),
                Ok(_) => {}
                Err(e) => {
                    return ExecExit {
                        exit_code: None,
                        error: Some(format!("wait for the command: {e}")),
                    }
                }
            }
            if status.is_some() {
                drain_until = Some(Instant::now() + DRAIN);
                // Nobody reads input any more.
                io.input = None;
            }
        }
        let outputs_open = open.iter().any(|o| *o);
        if status.is_some() && (!outputs_open || drain_until.is_some_and(|d| Instant::now() > d)) {
            return ExecExit {
                exit_code: status,
                error: None,
            };
        }
        let mut fds: Vec<PollFd<'_>> = Vec::new();
        let control_at = if control_open && status.is_none() {
            fds.push(PollFd::new(stdin.as_fd(), PollFlags::POLLIN));
            Some(0)
        } else {
            None
        };
        let first_output = fds.len();
        for (i, (f, _)) in io.outputs.iter().enumerate() {
            if open[i] {
                fds.push(PollFd::new(f.as_fd(), PollFlags::POLLIN));
            }
        }
        let ready = match nix::poll::poll(&mut fds, PollTimeout::from(100u16)) {
            Ok(0) | Err(nix::errno::Errno::EINTR) => continue,
            Ok(_) => fds
                .iter()
                .map(|f| f.revents().is_some_and(|r| !r.is_empty()))
                .collect::<Vec<bool>>(),
            Err(e) => {
                return ExecExit {
                    exit_code: status,
                    error: Some(format!("poll: {e}")),
                }
            }
        };
        drop(fds);
        let mut k = first_output;
        for (i, (f, is_err)) in io.outputs.iter_mut().enumerate() {
            if !open[i] {
                continue;
            }
            let r = ready.get(k).copied().unwrap_or(false);
            k += 1;
            if !r {
                continue;
            }
            match f.read(&mut buf) {
                // EIO: the terminal's other side is closed (the command exited).
                Ok(0) => open[i] = false,
                Ok(n) => {
                    let frame = if *is_err {
                        Frame::Stderr(buf[..n].to_vec())
                    } else {
                        Frame::Stdout(buf[..n].to_vec())
                    };
                    if out
                        .write_all(&frame.encode())
                        .and_then(|()| out.flush())
                        .is_err()
                    {
                        // The agent went away: end the command with it.
                        let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGKILL);
                        control_open = false;
                    }
                }
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(_) => open[i] = false,
            }
        }
        if control_at.is_some() && ready.first().copied().unwrap_or(false) {
            match stdin.read(&mut buf) {
                Ok(0) | Err(_) => {
                    control_open = false;
                    io.input = None;
                }
                Ok(n) => {
                    frames.extend_from_slice(&buf[..n]);
                    while let Ok(Some((frame, used))) = Frame::decode(&frames) {
                        frames.drain(..used);
                        match frame {
                            Frame::Stdin(d) => {
                                if let Some(i) = io.input.as_mut() {
                                    if i.write_all(&d).is_err() {
                                        io.input = None;
                                    }
                                }
                            }
                            Frame::StdinEof => {
                                if io.tty.is_some() {
                                    // A terminal has no end of input; ^D asks the
                                    // reader to see one.
                                    if let Some(i) = io.input.as_mut() {
                                        let _ = i.write_all(&[4]);
                                    }
                                }
                                io.input = None;
                            }
                            Frame::Resize(w, h) => {
                                if let Some(t) = &io.tty {
                                    resize(t, w, h);
                                }
                            }
                            _ => {}
                        }
                    }
                }
            }
        }
    }
}

nix::ioctl_write_ptr_bad!(set_winsize, nix::libc::TIOCSWINSZ, nix::pty::Winsize);

#[allow(unsafe_code)]
fn resize(tty: &OwnedFd, cols: u16, rows: u16) {
    let size = nix::pty::Winsize {
        ws_row: rows,
        ws_col: cols,
        ws_xpixel: 0,
        ws_ypixel: 0,
    };
    // SAFETY: TIOCSWINSZ reads one winsize from the pointer, which points at a live
    // local; the fd is an open terminal this process owns.
    if let Err(e) = unsafe { set_winsize(tty.as_raw_fd(), &size) } {
        eprintln!("resize terminal: {e}");
    }
}
