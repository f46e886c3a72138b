//! `holdfast shim exec <state root> <id> <request json>`: the exec process (see
//! [`super::exec`]). Single-threaded, so it may call libcontainer. Joins the running
//! container with a tenant process, relays frames between its own stdin/stdout and
//! the command's pipes or terminal, and ends with an exit frame. Its own stderr is
//! the container's `exec.log`, for what goes wrong here.
//!
//! The command runs as the container's own process spec says (user, groups,
//! environment, working directory, capabilities, rlimits), as containerd's exec does:
//! the spec is copied from the container's `config.json` with the command put in.
//! With a terminal, libcontainer makes it inside the container, makes it the
//! command's controlling terminal (a new session, TIOCSCTTY) and sends its master
//! over a console socket: a resize then reaches the command as SIGWINCH, and job
//! control works.

use std::fs::File;
use std::io::{ErrorKind, Read, Write};
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use libcontainer::container::builder::ContainerBuilder;
use libcontainer::syscall::syscall::SyscallType;
use nix::fcntl::OFlag;
use nix::poll::{PollFd, PollFlags, PollTimeout};
use nix::sys::wait::{waitpid, WaitPidFlag, WaitStatus};
use nix::unistd::Pid;

use super::exec::{ExecExit, ExecRequest, Frame};
use super::exec_seccomp::Filtered;
use crate::error::chain;

/// After the command exits, output still in flight is read for at most this long.
const DRAIN: Duration = Duration::from_secs(1);

#[inline(never)]
pub fn main(state_root: &Path, id: &str, request: &str) -> i32 {
    if let Err(e) = catch_sigterm() {
        eprintln!("exec in {id}: catch SIGTERM: {e}");
    }
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
    let state_dir = state_root.join(id);
    let me = std::process::id();
    let process_path = state_dir.join(format!("exec-{me}.json"));
    let filter = match write_process(&state_dir, &process_path, req) {
        Ok(filter) => filter,
        Err(e) => return fail(e),
    };
    let console_name = format!("exec-{me}.sock");
    let built = if req.tty {
        match super::unix_socket::bind_in(&state_dir, &console_name) {
            Ok(l) => build(
                state_root,
                id,
                &process_path,
                Stdio3::Console(state_dir.join(&console_name)),
                filter,
            )
            .map(|pid| (pid, Some(l), None)),
            Err(e) => Err(format!("console socket: {e}")),
        }
    } else {
        match pipes(req) {
            Ok((mine, theirs)) => build(state_root, id, &process_path, Stdio3::Fds(theirs), filter)
                .map(|pid| (pid, None, Some(mine))),
            Err(e) => Err(e),
        }
    };
    let _ = std::fs::remove_file(&process_path);
    let (pid, console, mine) = match built {
        Ok(b) => b,
        Err(e) => {
            let _ = std::fs::remove_file(state_dir.join(&console_name));
            return fail(e);
        }
    };
    let io = match (console, mine) {
        (_, Some(mine)) => mine,
        (Some(l), None) => {
            let master = super::unix_socket::receive_fd(&l, CONSOLE_TIMEOUT);
            let _ = std::fs::remove_file(state_dir.join(&console_name));
            match master
                .map_err(|e| format!("receive the terminal: {e}"))
                .and_then(|m| terminal(req, m))
            {
                Ok(io) => io,
                Err(e) => {
                    let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGKILL);
                    let _ = waitpid(pid, None);
                    return fail(e);
                }
            }
        }
        (None, None) => return fail("no stdio for the command".into()),
    };
    relay(pid, io, out)
}

/// How long libcontainer has to send the terminal it made.
const CONSOLE_TIMEOUT: Duration = Duration::from_secs(10);

/// The command's stdio as libcontainer gets it.
enum Stdio3 {
    Fds([OwnedFd; 3]),
    Console(std::path::PathBuf),
}

fn build(
    state_root: &Path,
    id: &str,
    process: &Path,
    stdio: Stdio3,
    filter: Option<Filtered>,
) -> Result<Pid, String> {
    ContainerBuilder::new(id.to_owned(), SyscallType::default())
        .with_root_path(state_root)
        .map(|b| {
            let b = match filter {
                Some(f) => b.with_executor(f),
                None => b,
            };
            let b = match stdio {
                Stdio3::Fds([tin, tout, terr]) => {
                    b.with_stdin(tin).with_stdout(tout).with_stderr(terr)
                }
                Stdio3::Console(path) => b.with_console_socket(Some(path)),
            };
            b.as_tenant().with_process(Some(process)).with_detach(true)
        })
        .and_then(|b| b.build())
        .map_err(|e| chain(&e))
}

/// Writes the command's process spec to `path` (0600: the environment may hold
/// Secret values): the container's own, with the command and terminal of `req`.
/// Returns the executor that puts the command under the container's seccomp filter,
/// if it has one (see [`super::exec_seccomp`]).
fn write_process(
    state_dir: &Path,
    path: &Path,
    req: &ExecRequest,
) -> Result<Option<Filtered>, String> {
    let container = libcontainer::container::Container::load(state_dir.to_owned())
        .map_err(|e| format!("load container: {}", chain(&e)))?;
    let config = container.bundle().join("config.json");
    let spec = oci_spec::runtime::Spec::load(&config)
        .map_err(|e| format!("read {}: {e}", config.display()))?;
    let mut process = spec
        .process()
        .clone()
        .ok_or_else(|| format!("{} has no process", config.display()))?;
    process.set_args(Some(req.command.clone()));
    process.set_terminal(Some(req.tty));
    process.set_console_size(None);
    let filter = super::exec_seccomp::lend(&spec, &mut process);
    let json = serde_json::to_vec(&process).map_err(|e| format!("process spec: {e}"))?;
    use std::os::unix::fs::OpenOptionsExt;
    let _ = std::fs::remove_file(path);
    std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
        .and_then(|mut f| f.write_all(&json))
        .map_err(|e| format!("write {}: {e}", path.display()))?;
    Ok(filter)
}

/// The relay's side of a terminal whose master libcontainer sent.
fn terminal(req: &ExecRequest, master: OwnedFd) -> Result<Stdio, String> {
    let dup = |fd: &OwnedFd| fd.try_clone().map_err(|e| format!("dup terminal: {e}"));
    if let Some((w, h)) = req.size {
        resize(&master, w, h);
    }
    let input = if req.stdin {
        Some(File::from(dup(&master)?))
    } else {
        None
    };
    let tty = Some(dup(&master)?);
    Ok(Stdio {
        input,
        outputs: vec![(File::from(master), false)],
        tty,
    })
}

fn pipes(req: &ExecRequest) -> Result<(Stdio, [OwnedFd; 3]), String> {
    let devnull = || {
        File::open("/dev/null")
            .map(OwnedFd::from)
            .map_err(|e| format!("open /dev/null: {e}"))
    };
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

/// Input not yet taken by the command; while this much waits, no more is read from
/// the agent (which then waits in its turn).
const PENDING_INPUT: usize = 64 * 1024;

/// The command's input side: written without blocking, so that a command that stops
/// reading its input while its output fills up cannot stall the relay (the relay
/// would stop reading that output, and both would wait for ever).
struct Input {
    file: Option<File>,
    pending: Vec<u8>,
    /// End the input once `pending` is written.
    end: bool,
    tty: bool,
}

impl Input {
    /// Drops the input once the command has exited: nobody reads it any more.
    fn close(&mut self) {
        self.file = None;
        self.pending.clear();
    }

    fn new(file: Option<File>, tty: bool) -> Input {
        if let Some(f) = &file {
            use nix::fcntl::{fcntl, FcntlArg};
            let flags = fcntl(f.as_raw_fd(), FcntlArg::F_GETFL)
                .map(OFlag::from_bits_truncate)
                .unwrap_or(OFlag::empty());
            let _ = fcntl(f.as_raw_fd(), FcntlArg::F_SETFL(flags | OFlag::O_NONBLOCK));
        }
        Input {
            file,
            pending: Vec::new(),
            end: false,
            tty,
        }
    }

    fn flush(&mut self) {
        let Some(f) = self.file.as_mut() else {
            self.pending.clear();
            return;
        };
        while !self.pending.is_empty() {
            match f.write(&self.pending) {
                Ok(n) => {
                    self.pending.drain(..n);
                }
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) if e.kind() == ErrorKind::WouldBlock => return,
                Err(_) => {
                    self.file = None;
                    self.pending.clear();
                    return;
                }
            }
        }
        if self.end {
            if let Some(mut f) = self.file.take() {
                // A terminal has no end of input; ^D asks the reader to see one.
                if self.tty {
                    let _ = f.write(&[4]);
                }
            }
        }
    }
}

/// Relays until the command has exited and its output is read; returns its exit.
fn relay(pid: Pid, io: Stdio, out: &mut impl Write) -> ExecExit {
    let Stdio {
        input,
        mut outputs,
        tty,
    } = io;
    let mut input = Input::new(input, tty.is_some());
    let mut stdin = std::io::stdin().lock();
    let mut frames = Vec::new();
    let mut control_open = true;
    let mut status = None;
    let mut drain_until: Option<Instant> = None;
    let mut buf = vec![0u8; 32 * 1024];
    let mut open: Vec<bool> = outputs.iter().map(|_| true).collect();
    let mut killed = false;
    loop {
        if !killed && status.is_none() && TERMINATED.load(Ordering::Relaxed) {
            // The client went away: the command goes with it, as containerd does.
            let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGKILL);
            killed = true;
        }
        if status.is_none() {
            status = match poll_exit(pid) {
                Ok(s) => s,
                Err(error) => {
                    return ExecExit {
                        exit_code: None,
                        error: Some(error),
                    }
                }
            };
            if status.is_some() {
                drain_until = Some(Instant::now() + DRAIN);
                input.close();
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
        let control_at = if control_open && status.is_none() && input.pending.len() < PENDING_INPUT
        {
            fds.push(PollFd::new(stdin.as_fd(), PollFlags::POLLIN));
            Some(0)
        } else {
            None
        };
        let input_at = match input.file.as_ref().filter(|_| !input.pending.is_empty()) {
            Some(f) => {
                fds.push(PollFd::new(f.as_fd(), PollFlags::POLLOUT));
                Some(fds.len() - 1)
            }
            None => None,
        };
        let first_output = fds.len();
        for (i, (f, _)) in outputs.iter().enumerate() {
            if open[i] {
                fds.push(PollFd::new(f.as_fd(), PollFlags::POLLIN));
            }
        }
        let ready = match poll_ready(&mut fds) {
            Ok(Some(ready)) => ready,
            Ok(None) => continue,
            Err(e) => {
                return ExecExit {
                    exit_code: status,
                    error: Some(format!("poll: {e}")),
                }
            }
        };
        drop(fds);
        if !read_outputs(
            &mut outputs,
            &mut open,
            &ready[first_output..],
            &mut buf,
            out,
        ) {
            // The agent went away: end the command with it.
            let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGKILL);
            control_open = false;
        }
        if input_at.is_some_and(|at| ready.get(at).copied().unwrap_or(false)) {
            input.flush();
        }
        if control_at.is_some()
            && ready.first().copied().unwrap_or(false)
            && !read_control(&mut stdin, &mut buf, &mut frames, &mut input, tty.as_ref())
        {
            control_open = false;
        }
    }
}

/// Which of `fds` are ready within the poll interval; None when none is, or a signal
/// came first.
fn poll_ready(fds: &mut [PollFd<'_>]) -> Result<Option<Vec<bool>>, nix::errno::Errno> {
    match nix::poll::poll(fds, PollTimeout::from(100u16)) {
        Ok(0) | Err(nix::errno::Errno::EINTR) => Ok(None),
        Ok(_) => Ok(Some(
            fds.iter()
                .map(|f| f.revents().is_some_and(|r| !r.is_empty()))
                .collect(),
        )),
        Err(e) => Err(e),
    }
}

/// The command's exit code once it has ended (128 + the signal that killed it).
fn poll_exit(pid: Pid) -> Result<Option<i32>, String> {
    match waitpid(pid, Some(WaitPidFlag::WNOHANG)) {
        Ok(WaitStatus::Exited(_, code)) => Ok(Some(code)),
        Ok(WaitStatus::Signaled(_, sig, _)) => Ok(Some(128 + sig as i32)),
        Ok(_) => Ok(None),
        Err(e) => Err(format!("wait for the command: {e}")),
    }
}

/// Reads the outputs that `ready` (one flag per open output, in order) says are
/// readable and sends what they hold to the agent; false if the agent is gone.
fn read_outputs(
    outputs: &mut [(File, bool)],
    open: &mut [bool],
    ready: &[bool],
    buf: &mut [u8],
    out: &mut impl Write,
) -> bool {
    let mut agent = true;
    let mut k = 0;
    for (i, (f, is_err)) in outputs.iter_mut().enumerate() {
        if !open[i] {
            continue;
        }
        let r = ready.get(k).copied().unwrap_or(false);
        k += 1;
        if !r {
            continue;
        }
        match f.read(buf) {
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
                    agent = false;
                }
            }
            // A terminal's master shares the input's non-blocking mode.
            Err(e) if e.kind() == ErrorKind::Interrupted || e.kind() == ErrorKind::WouldBlock => {}
            // EIO: the terminal's other side is closed (the command exited).
            Err(_) => open[i] = false,
        }
    }
    agent
}

/// Reads the agent's frames (input, its end, resizes) from the control stream and
/// passes them on; false once the stream has ended.
fn read_control(
    stdin: &mut impl Read,
    buf: &mut [u8],
    frames: &mut Vec<u8>,
    input: &mut Input,
    tty: Option<&OwnedFd>,
) -> bool {
    match stdin.read(buf) {
        Ok(0) | Err(_) => {
            input.end = true;
            input.flush();
            false
        }
        Ok(n) => {
            frames.extend_from_slice(&buf[..n]);
            while let Ok(Some((frame, used))) = Frame::decode(frames) {
                frames.drain(..used);
                match frame {
                    Frame::Stdin(d) if input.file.is_some() && !input.end => {
                        input.pending.extend_from_slice(&d);
                    }
                    Frame::StdinEof => input.end = true,
                    Frame::Resize(w, h) => {
                        if let Some(t) = tty {
                            resize(t, w, h);
                        }
                    }
                    _ => {}
                }
            }
            input.flush();
            true
        }
    }
}

/// Set by SIGTERM: the agent asks for the command to end (its client is gone).
static TERMINATED: AtomicBool = AtomicBool::new(false);

extern "C" fn on_sigterm(_: std::ffi::c_int) {
    TERMINATED.store(true, Ordering::Relaxed);
}

/// SIGTERM ends the command, through a handler (not SIG_IGN nor the default): the
/// relay loop sees the flag within its poll interval, kills the command and still
/// reports how it ended. A handler is reset when the command is executed.
#[allow(unsafe_code)]
fn catch_sigterm() -> nix::Result<()> {
    use nix::sys::signal::{sigaction, SaFlags, SigAction, SigHandler, SigSet, Signal};
    let action = SigAction::new(
        SigHandler::Handler(on_sigterm),
        SaFlags::SA_RESTART,
        SigSet::empty(),
    );
    // SAFETY: the handler only stores to an atomic, which is async-signal-safe; the
    // process is single-threaded.
    unsafe { sigaction(Signal::SIGTERM, &action) }.map(|_| ())
}

nix::ioctl_write_ptr_bad!(set_winsize, nix::libc::TIOCSWINSZ, nix::pty::Winsize);

/// Sets the terminal's size; the kernel sends SIGWINCH to its foreground process group.
#[allow(unsafe_code)]
pub(super) fn resize(tty: &OwnedFd, cols: u16, rows: u16) {
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
