//! The shim's life while its container runs: copy the container's stdout and stderr
//! (or its terminal) into the CRI log and to attached clients ([`super::attach`]),
//! feed their input to its stdin, reap the init when it exits, and record how it
//! ended. One thread, one `poll` over every descriptor.
//!
//! No SIGCHLD handling: blocking it (for a signalfd) would be inherited by the
//! container's processes. Instead `poll` waits on a pidfd of the init too, which wakes
//! it the moment the init exits, so an idle container's shim never wakes (with
//! twenty of them on a gateway, timer wakeups add up). The output pipes' EOF comes
//! when the init dies as well (the kernel kills the rest of its PID namespace with
//! it); once both pipes are closed a blocking `waitpid` is all that is left. On a
//! kernel without pidfds (before 5.3) a slow timeout bounds the wait for an init that
//! closed its output early, or whose children (a host PID namespace) keep it open.

use std::fs::File;
use std::io::{ErrorKind, Read};
use std::os::fd::{AsFd, BorrowedFd, FromRawFd, OwnedFd};
use std::time::{Duration, Instant};

use nix::poll::{PollFd, PollFlags, PollTimeout};
use nix::sys::wait::{waitpid, WaitPidFlag, WaitStatus};
use nix::unistd::Pid;

use super::attach::Attach;
use super::exec::ExecExit;
use super::logs::{CriLog, LineBuffer, Stream};
use super::records;
use super::records::ShimConfig;
use super::running::{cleanup, exit_taken, notify_exit, ContainerOutput, Running};
use super::ExitInfo;
use crate::time;

/// How long a shim without a pidfd of its init waits before it looks for the exit.
const POLL_INTERVAL_MS: u16 = 2000;
/// Output read per call: the pipe's default capacity is 64 KiB, but a busy container
/// only costs more calls with less, while a quiet one keeps fewer pages touched.
const READ_BUFFER: usize = 16 * 1024;
/// How long output may still arrive after the init is gone.
const DRAIN_LIMIT: Duration = Duration::from_secs(5);

struct Pipe {
    file: File,
    buffer: LineBuffer,
    open: bool,
}

pub fn run(running: Running) {
    let Running {
        config,
        init,
        started_at,
        output: container_output,
        stdin,
        attach: listener,
    } = running;
    // The exit record must be written even if the disk is full by then.
    if let Err(e) = records::reserve(&config.container_dir, records::EXIT) {
        log::warn!("shim {}: {e}", config.id);
    }
    let mut output = open_log(&config);
    let (mut pipes, tty, stdin) = output_pipes(container_output, stdin, config.stdin);
    let mut attach = Attach::new(
        &config.id,
        config.state_dir(),
        listener,
        stdin,
        config.stdin_once,
        tty,
    );
    let mut scratch = Scratch {
        buf: Vec::new(),
        events: Vec::new(),
    };
    let status = wait_for_exit(
        init,
        &mut pipes,
        &mut output,
        &mut attach,
        &mut scratch,
        &config.id,
    );
    let finished_at = time::now();
    drain(
        &mut pipes,
        &mut output,
        &mut attach,
        &mut scratch,
        &config.id,
    );
    let info = exit_info(status, &config, started_at, finished_at);
    hand_over_exit(&config, &info, &mut attach);
}

/// The CRI log, or none if it cannot be opened (output is then only relayed).
fn open_log(config: &ShimConfig) -> Output {
    let log = match CriLog::open(&config.log_path, config.log_max_size, config.log_max_files) {
        Ok(l) => Some(l),
        Err(e) => {
            log::error!(
                "shim {}: open log {}: {e}",
                config.id,
                config.log_path.display()
            );
            None
        }
    };
    Output {
        log,
        failing: false,
    }
}

/// The pipes to read the container's output from, its terminal (if any) and where its
/// input goes: the stdin pipe, or the terminal when the spec asks for stdin.
fn output_pipes(
    output: ContainerOutput,
    stdin: Option<OwnedFd>,
    wants_stdin: bool,
) -> (Vec<Pipe>, Option<OwnedFd>, Option<OwnedFd>) {
    let pipe = |fd: OwnedFd, stream| Pipe {
        file: File::from(fd),
        buffer: LineBuffer::new(stream),
        open: true,
    };
    match output {
        ContainerOutput::Pipes { stdout, stderr } => (
            vec![pipe(stdout, Stream::Stdout), pipe(stderr, Stream::Stderr)],
            None,
            stdin,
        ),
        ContainerOutput::Tty(master) => {
            let tty = master.try_clone().ok();
            // A terminal takes input only if the spec asks for stdin.
            let input = if wants_stdin {
                master.try_clone().ok()
            } else {
                None
            };
            (vec![pipe(master, Stream::Stdout)], tty, input)
        }
    }
}

/// Relays output until the init exits (or is lost track of), and reaps it.
fn wait_for_exit(
    init: Pid,
    pipes: &mut [Pipe],
    output: &mut Output,
    attach: &mut Attach,
    scratch: &mut Scratch,
    id: &str,
) -> Option<WaitStatus> {
    let exited = pidfd_open(init);
    if exited.is_none() {
        log::debug!(
            "shim {id}: no pidfd for {init}: looking for its exit every {POLL_INTERVAL_MS} ms"
        );
    }
    let timeout = match exited {
        Some(_) => PollTimeout::NONE,
        None => PollTimeout::from(POLL_INTERVAL_MS),
    };
    loop {
        if pipes.iter().all(|p| !p.open) {
            return wait_blocking(init);
        }
        pump(
            pipes,
            output,
            attach,
            (timeout, exited.as_ref().map(|fd| fd.as_fd())),
            scratch,
            id,
        );
        match waitpid(init, Some(WaitPidFlag::WNOHANG)) {
            Ok(WaitStatus::StillAlive) => {}
            Ok(s @ (WaitStatus::Exited(..) | WaitStatus::Signaled(..))) => return Some(s),
            Ok(_) => {}
            Err(e) => {
                log::error!("shim {id}: waitpid {init}: {e}");
                return None;
            }
        }
    }
}

/// Relays what output is left once the init is gone, for at most [`DRAIN_LIMIT`], and
/// ends the log's partial lines.
fn drain(
    pipes: &mut [Pipe],
    output: &mut Output,
    attach: &mut Attach,
    scratch: &mut Scratch,
    id: &str,
) {
    let deadline = Instant::now() + DRAIN_LIMIT;
    while pipes.iter().any(|p| p.open) && Instant::now() < deadline {
        pump(
            pipes,
            output,
            attach,
            (PollTimeout::from(100u16), None),
            scratch,
            id,
        );
    }
    if let Some(log) = output.log.as_mut() {
        for p in pipes.iter_mut() {
            let _ = p.buffer.finish(log);
        }
    }
}

/// How the container ended. Read before cleanup: deleting the container deletes its
/// cgroup and the OOM counter.
fn exit_info(
    status: Option<WaitStatus>,
    config: &ShimConfig,
    started_at: time::Timestamp,
    finished_at: time::Timestamp,
) -> ExitInfo {
    let (exit_code, signal) = match status {
        Some(WaitStatus::Exited(_, code)) => (code, None),
        Some(WaitStatus::Signaled(_, sig, _)) => (128 + sig as i32, Some(sig as i32)),
        // Lost track of the init: say so rather than invent a success.
        _ => (255, None),
    };
    ExitInfo {
        exit_code,
        signal,
        oom_killed: super::cgroup::oom_killed(&config.cgroups_path),
        started_at: Some(started_at),
        finished_at,
        start_error: None,
        termination_message: None,
    }
}

/// Records the exit, wakes the agent and attached clients, cleans up, and makes the
/// record durable: in the agent's store, or synced here if no agent took it.
fn hand_over_exit(config: &ShimConfig, info: &ExitInfo, attach: &mut Attach) {
    let written = records::write_unsynced(&config.container_dir, records::EXIT, info);
    if let Err(e) = &written {
        log::error!("shim {}: {e}", config.id);
    }
    notify_exit(config);
    attach.finish(ExecExit {
        exit_code: Some(info.exit_code),
        error: None,
    });
    cleanup(config);
    if written.is_ok() && !exit_taken(config) {
        if let Err(e) = records::sync(&config.container_dir, records::EXIT) {
            log::error!("shim {}: {e}", config.id);
        }
    }
}

fn wait_blocking(init: nix::unistd::Pid) -> Option<WaitStatus> {
    loop {
        match waitpid(init, None) {
            Ok(s @ (WaitStatus::Exited(..) | WaitStatus::Signaled(..))) => return Some(s),
            Ok(_) | Err(nix::errno::Errno::EINTR) => continue,
            Err(_) => return None,
        }
    }
}

/// The CRI log and whether writing it fails (a full disk): said once when it starts
/// failing and once when it works again, not once per line.
struct Output {
    log: Option<CriLog>,
    failing: bool,
}

/// What `pump` reuses from one call to the next, so that a running shim does not
/// allocate per wakeup: the read buffer and the poll results. The buffer is made at the
/// first output: zeroed at once, its pages would be resident in the shim of a container
/// that never writes a line.
struct Scratch {
    buf: Vec<u8>,
    events: Vec<PollFlags>,
}

/// A pidfd of `pid` (a child of ours, so its pid stays ours until it is reaped):
/// readable once it exits. None before Linux 5.3.
#[allow(unsafe_code)]
fn pidfd_open(pid: nix::unistd::Pid) -> Option<OwnedFd> {
    // SAFETY: pidfd_open takes two integers and returns a new descriptor (close-on-exec)
    // or -1; it touches no memory of ours.
    let fd = unsafe { nix::libc::syscall(nix::libc::SYS_pidfd_open, pid.as_raw(), 0) };
    let fd = std::os::fd::RawFd::try_from(fd)
        .ok()
        .filter(|fd| *fd >= 0)?;
    // SAFETY: the kernel just made this descriptor for us, and nothing else owns it.
    Some(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Waits up to the timeout for output, attached clients or the end of the init (its
/// pidfd, if given) and deals with whatever is there.
fn pump(
    pipes: &mut [Pipe],
    out: &mut Output,
    attach: &mut Attach,
    (timeout, exited): (PollTimeout, Option<BorrowedFd<'_>>),
    scratch: &mut Scratch,
    id: &str,
) {
    attach.sweep();
    let (n, slots) = {
        let mut fds: Vec<PollFd<'_>> = Vec::with_capacity(8);
        fds.extend(
            pipes
                .iter()
                .filter(|p| p.open)
                .map(|p| PollFd::new(p.file.as_fd(), PollFlags::POLLIN)),
        );
        let n = fds.len();
        // Only wakes the poll: the caller's waitpid finds the exit.
        if let Some(fd) = exited {
            fds.push(PollFd::new(fd, PollFlags::POLLIN));
        }
        let first_attach = fds.len();
        let slots = attach.poll_fds(&mut fds);
        match nix::poll::poll(&mut fds, timeout) {
            Ok(0) | Err(nix::errno::Errno::EINTR) => return,
            Ok(_) => {
                scratch.events.clear();
                scratch.events.extend(
                    fds[..n]
                        .iter()
                        .chain(&fds[first_attach..])
                        .map(|f| f.revents().unwrap_or(PollFlags::empty())),
                );
                (n, slots)
            }
            Err(e) => {
                log::error!("shim {id}: poll: {e}");
                return;
            }
        }
    };
    let (ready, attach_events) = scratch.events.split_at(n);
    attach.on_ready(&slots, attach_events);
    let mut ready = ready.iter().map(|r| !r.is_empty());
    let buf = &mut scratch.buf;
    for p in pipes.iter_mut().filter(|p| p.open) {
        if !ready.next().unwrap_or(false) {
            continue;
        }
        if buf.is_empty() {
            buf.resize(READ_BUFFER, 0);
        }
        match p.file.read(buf) {
            Ok(0) => p.open = false,
            Ok(n) => {
                attach.output(p.buffer.stream(), &buf[..n]);
                if let Some(log) = out.log.as_mut() {
                    // Keep reading even when writing fails: a full pipe would block
                    // the container.
                    match p.buffer.feed(log, &buf[..n]) {
                        Err(e) if !out.failing => {
                            out.failing = true;
                            log::error!("shim {id}: write log: {e}; output is dropped until writing works again");
                        }
                        Ok(()) if out.failing => {
                            out.failing = false;
                            log::warn!("shim {id}: writing the log works again");
                        }
                        _ => {}
                    }
                }
            }
            Err(e) if e.kind() == ErrorKind::Interrupted || e.kind() == ErrorKind::WouldBlock => {}
            // A terminal's master reads EIO once the container's side is closed.
            Err(e) if e.raw_os_error() == Some(nix::libc::EIO) => p.open = false,
            Err(e) => {
                log::error!("shim {id}: read output: {e}");
                p.open = false;
            }
        }
    }
}
