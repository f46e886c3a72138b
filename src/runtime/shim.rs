//! The shim: `holdfast shim ...`, one process per container, single-threaded, so it may
//! call libcontainer (which forks with raw clone3).
//!
//! - `shim start <container dir> [--ready-on-stdout]`: started by the agent, which waits
//!   for it. It leaves the agent's session, forks the shim and exits at once, so the
//!   agent reaps it and the shim is orphaned: nothing the agent does, even dying to
//!   SIGKILL, reaches it. The fork runs what `shim run` runs, without a second exec of
//!   this binary. With `--ready-on-stdout` its stdout is the readiness pipe: the shim
//!   writes one byte to it once `started.json` or `failed.json` is in place, so the
//!   agent waits on the pipe, not on a timer (its end without a byte: the shim died).
//! - `shim run <container dir> [--ready-on-stdout]`: mounts the rootfs, creates and starts the container
//!   (its init is this process's child; with `tty` its terminal's master comes over a
//!   console socket), writes `started.json`, copies its output into the CRI log and to
//!   clients attached on `attach.sock` ([`super::attach`]), reaps it, writes
//!   `exit.json`, notifies `exits/<id>` and cleans up.
//! - `shim delete <state root> <id>`: libcontainer's delete of a container whose shim
//!   died, run for the agent, which must never call libcontainer itself.
//! - `shim exec <state root> <id> <request>`: a command run in the container (see
//!   [`super::exec`]).
//!
//! A shim never panics on bad input: every failure ends in `failed.json` or `shim.log`.

use std::ffi::c_int;
use std::os::fd::OwnedFd;
use std::os::unix::net::UnixListener;
use std::path::{Path, PathBuf};

use libcontainer::container::builder::ContainerBuilder;
use libcontainer::container::Container;
use libcontainer::syscall::syscall::SyscallType;
use nix::fcntl::OFlag;
use nix::sys::signal::{self, SaFlags, SigAction, SigHandler, SigSet, Signal};
use nix::sys::wait::{waitpid, WaitPidFlag};
use nix::unistd::Pid;

use super::records::{
    self, FailedRecord, FailureKind, ProcessRef, ShimConfig, ShimPid, StartedRecord,
};
use super::running::{cleanup, notify_exit, ContainerOutput, Running};
use super::{attach, rootfs, supervise, unix_socket};
use crate::error::chain;
use crate::time;

/// The flag of `shim start` and `shim run` that makes their stdout the readiness pipe.
pub const READY_ON_STDOUT: &str = "--ready-on-stdout";

/// Entry point of `holdfast shim <args>`; returns the process exit code. Must run before
/// any thread or async runtime exists.
pub fn shim_main(args: &[String]) -> i32 {
    // One arena: the shim is single-threaded, and a container's monitor lives long.
    crate::malloc::configure(1);
    init_logging();
    let arg = |i: usize| args.get(i).map(String::as_str);
    if let (Some("exec"), Some(root), Some(id), Some(request)) = (arg(0), arg(1), arg(2), arg(3)) {
        return super::exec_shim::main(Path::new(root), id, request);
    }
    // Only a known flag after the dir; the pipe is taken once the command is known.
    let ready = |flag: Option<&str>| match flag {
        None => Ready(None),
        Some(_) => Ready::from_stdout(),
    };
    let known = |flag: Option<&str>| flag.is_none() || flag == Some(READY_ON_STDOUT);
    match (arg(0), arg(1), arg(2), arg(3)) {
        (Some("start"), Some(dir), flag, None) if known(flag) => {
            detach(Path::new(dir), ready(flag))
        }
        (Some("run"), Some(dir), flag, None) if known(flag) => run(Path::new(dir), ready(flag)),
        (Some("delete"), Some(root), Some(id), None) => delete(Path::new(root), id),
        _ => {
            eprintln!("usage: holdfast shim start|run <container dir> [{READY_ON_STDOUT}] | holdfast shim delete <state root> <id>");
            2
        }
    }
}

/// The write end of the readiness pipe, if the agent gave one.
struct Ready(Option<std::fs::File>);

impl Ready {
    /// Takes stdout as the readiness pipe and puts the log (stderr) in its place.
    /// The copy kept is closed on exec: the container's command never holds it.
    fn from_stdout() -> Ready {
        use std::os::fd::AsFd;
        let pipe = match std::io::stdout().as_fd().try_clone_to_owned() {
            Ok(fd) => fd,
            Err(e) => {
                eprintln!("shim: copy the readiness pipe: {e}; the agent waits on its timer");
                return Ready(None);
            }
        };
        if let Err(e) = nix::unistd::dup2(2, 1) {
            eprintln!("shim: put the log on stdout: {e}");
        }
        Ready(Some(std::fs::File::from(pipe)))
    }

    /// Says the record is in place, and lets go of the pipe.
    fn signal(&mut self) {
        use std::io::Write;
        if let Some(mut pipe) = self.0.take() {
            // The agent gone or no longer waiting: the record says it all the same.
            let _ = pipe.write_all(&[1]);
        }
    }

    /// Takes the pipe out, to hand it to a `shim run`.
    fn take(&mut self) -> Option<std::fs::File> {
        self.0.take()
    }
}

/// Logs go to the shim's stderr as the agent opened it (`shim.log`, or `exec.log` for
/// an exec), through a copy of it on an fd of its own that is closed on exec.
/// libcontainer logs from the container's init too, after the init has put the
/// container's stdio on fds 0-2: written to fd 2, its lines (at debug, every step of
/// the init) would land in the container's log or in an exec's stderr. The container's
/// streams carry only what its command writes.
#[inline(never)]
fn init_logging() {
    // The seccomp and cgroup warnings come with every container and tell nothing new.
    let filter = "warn,libcontainer::process::init=error,libcgroups=error";
    let mut builder =
        env_logger::Builder::from_env(env_logger::Env::default().default_filter_or(filter));
    match own_log_fd() {
        Ok(log) => {
            builder.target(env_logger::Target::Pipe(Box::new(log)));
        }
        // Without a copy, no log at all rather than lines in the container's streams.
        Err(e) => {
            eprintln!("shim: copy the log fd: {e}; the shim does not log");
            builder.filter_level(log::LevelFilter::Off);
        }
    }
    let _ = builder.try_init();
}

/// A copy of fd 2 at fd 3 or above with FD_CLOEXEC (F_DUPFD_CLOEXEC): a container's
/// init sets its stdio on 0-2 only, and the copy does not survive its exec.
fn own_log_fd() -> std::io::Result<std::fs::File> {
    use std::os::fd::AsFd;
    let fd = std::io::stderr().as_fd().try_clone_to_owned()?;
    Ok(std::fs::File::from(fd))
}

fn detach(dir: &Path, mut ready: Ready) -> i32 {
    // Fails only for a process group leader, which `Command` never makes us.
    if let Err(e) = nix::unistd::setsid() {
        eprintln!("shim start: setsid: {e}");
        return 1;
    }
    if single_threaded() {
        return match fork() {
            // Not waited for: exiting now orphans it, which is the point.
            Ok(nix::unistd::ForkResult::Parent { .. }) => 0,
            Ok(nix::unistd::ForkResult::Child) => run(dir, ready),
            Err(e) => {
                eprintln!("shim start: fork: {e}");
                1
            }
        };
    }
    // Something made a thread (it should not have): a fork would copy only this one,
    // and with it whatever locks the others held. A fresh exec is safe.
    let exe = match std::env::current_exe() {
        Ok(exe) => exe,
        Err(e) => {
            eprintln!("shim start: find own executable: {e}");
            return 1;
        }
    };
    let mut cmd = std::process::Command::new(exe);
    cmd.arg("shim").arg("run").arg(dir);
    if let Some(pipe) = ready.take() {
        cmd.arg(READY_ON_STDOUT).stdout(pipe);
    }
    match cmd.spawn() {
        Ok(_child) => 0,
        Err(e) => {
            eprintln!("shim start: spawn shim run: {e}");
            1
        }
    }
}

/// Whether this process has one thread (`Threads:` in `/proc/self/status`).
fn single_threaded() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("Threads:"))
                .map(|n| n.trim() == "1")
        })
        .unwrap_or(false)
}

#[allow(unsafe_code)]
fn fork() -> nix::Result<nix::unistd::ForkResult> {
    // SAFETY: the caller checked that this process has a single thread, so no lock of
    // another thread is copied held into the child, which may then allocate freely.
    unsafe { nix::unistd::fork() }
}

/// libcontainer's console socket in the container dir: the container's init sends the
/// master of the terminal it makes over it.
const CONSOLE_SOCKET: &str = "console.sock";
/// How long the init has to send its terminal.
const CONSOLE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

fn run(dir: &Path, mut ready: Ready) -> i32 {
    let config: ShimConfig = match records::read(dir, records::SHIM_CONFIG) {
        Ok(Some(c)) => c,
        Ok(None) => return fail_early(dir, "shim.json is missing".to_owned(), &mut ready),
        Err(e) => return fail_early(dir, e.to_string(), &mut ready),
    };
    if let Err(e) = set_signal_dispositions() {
        log::warn!("shim {}: set signal dispositions: {e}", config.id);
    }
    let me = ProcessRef::of(std::process::id() as i32);
    if let Some(process) = me {
        let rec = ShimPid {
            process,
            boot_id: config.boot_id.clone(),
        };
        if let Err(e) = records::write_boot_scoped(dir, records::SHIM_PID, &rec) {
            log::warn!("shim {}: {e}", config.id);
        }
    }
    match create_and_start(&config) {
        Ok(running) => {
            ready.signal();
            // The code creating the container ran is not run again by the wait: it is
            // unmapped. What the creation left in the heap (libcontainer's builder, the
            // spec, the seccomp filter, and the smaps text just read) goes back to the
            // kernel before the long wait, and so do the stack pages it reached down to.
            crate::malloc::release_clean_code();
            crate::malloc::trim();
            crate::malloc::release_unused_stack();
            supervise::run(running);
            0
        }
        Err((kind, message)) => {
            log::error!("shim {}: {message}", config.id);
            let rec = FailedRecord {
                kind,
                message,
                at: time::now(),
            };
            if let Err(e) = records::write_boot_scoped(config.state_dir(), records::FAILED, &rec) {
                log::error!("shim {}: {e}", config.id);
            }
            ready.signal();
            notify_exit(&config);
            cleanup(&config);
            // Reap whatever libcontainer left (an init that failed before exec).
            while let Ok(status) = waitpid(None::<Pid>, Some(WaitPidFlag::WNOHANG)) {
                if status == nix::sys::wait::WaitStatus::StillAlive {
                    break;
                }
            }
            1
        }
    }
}

fn fail_early(dir: &Path, message: String, ready: &mut Ready) -> i32 {
    eprintln!("shim run {}: {message}", dir.display());
    let rec = FailedRecord {
        kind: FailureKind::Create,
        message,
        at: time::now(),
    };
    if let Err(e) = records::write_boot_scoped(dir, records::FAILED, &rec) {
        eprintln!("shim run {}: {e}", dir.display());
    }
    ready.signal();
    1
}

type Failure = (FailureKind, String);

/// Out of line, like every step before the wait: the frames of libcontainer's builder
/// and of the spec are gone from the stack by the time the shim waits on its container.
#[inline(never)]
fn create_and_start(config: &ShimConfig) -> Result<Running, Failure> {
    let create = |message: String| (FailureKind::Create, message);
    let upper = config.container_dir.join("upper");
    let work = config.container_dir.join("work");
    let rootfs_dir = config.bundle.join("rootfs");
    rootfs::mount(&config.layers, &upper, &work, &rootfs_dir).map_err(create)?;
    let attach = bind_attach(config);
    let (theirs, ours) = output_stdio(config)?;
    let (stdin_r, stdin_w) = stdin_pipe(config)?;
    let mut container = build_container(config, stdin_r, theirs)?;
    let Some(init) = container.pid() else {
        return Err(create("libcontainer reported no init pid".to_owned()));
    };
    set_oom_score_adj(config, init);
    let output = receive_output(config, ours, init)?;
    if let Err(e) = container.start() {
        let message = chain(&e);
        let _ = signal::kill(init, Signal::SIGKILL);
        let _ = waitpid(init, None);
        return Err((FailureKind::Start, message));
    }
    let started_at = record_started(config, init);
    Ok(Running {
        config: config.clone(),
        init,
        started_at,
        output,
        stdin: stdin_w,
        attach,
    })
}

/// `attach.sock`, bound before the container exists, so that once the agent sees it
/// running an attach finds the socket. None if it cannot be made: attach is refused.
fn bind_attach(config: &ShimConfig) -> Option<UnixListener> {
    match unix_socket::bind_in(config.state_dir(), attach::SOCKET) {
        Ok(l) => Some(l),
        Err(e) => {
            log::warn!("shim {}: attach socket: {e}; attach is refused", config.id);
            None
        }
    }
}

/// The container's output, both sides: pipes, or with a terminal the console socket
/// (libcontainer makes the terminal inside the container and sends us its master).
fn output_stdio(config: &ShimConfig) -> Result<(Stdio, Ours), Failure> {
    let create = |message: String| (FailureKind::Create, message);
    let pipe = || nix::unistd::pipe2(OFlag::O_CLOEXEC);
    if config.tty {
        let l = unix_socket::bind_in(config.state_dir(), CONSOLE_SOCKET)
            .map_err(|e| create(format!("console socket: {e}")))?;
        Ok((
            Stdio::Console(config.state_dir().join(CONSOLE_SOCKET)),
            Ours::Console(l),
        ))
    } else {
        let (out_r, out_w) = pipe().map_err(|e| create(format!("create stdout pipe: {e}")))?;
        let (err_r, err_w) = pipe().map_err(|e| create(format!("create stderr pipe: {e}")))?;
        Ok((Stdio::Pipes(out_w, err_w), Ours::Pipes(out_r, err_r)))
    }
}

/// The stdin pipe (read end, write end) for `stdin: true` without a terminal.
fn stdin_pipe(config: &ShimConfig) -> Result<(Option<OwnedFd>, Option<OwnedFd>), Failure> {
    if config.stdin && !config.tty {
        let (r, w) = nix::unistd::pipe2(OFlag::O_CLOEXEC)
            .map_err(|e| (FailureKind::Create, format!("create stdin pipe: {e}")))?;
        Ok((Some(r), Some(w)))
    } else {
        Ok((None, None))
    }
}

/// libcontainer's create: the container exists, its init waits to be started.
fn build_container(
    config: &ShimConfig,
    stdin_r: Option<OwnedFd>,
    theirs: Stdio,
) -> Result<Container, Failure> {
    // The init must be our child, so not `as_sibling`: with it, libcontainer's
    // intermediate process (and so the init, cloned with CLONE_PARENT) would become
    // children of our parent.
    let built = ContainerBuilder::new(config.id.clone(), SyscallType::default())
        .with_root_path(&config.state_root)
        .map(|b| {
            let b = match stdin_r {
                Some(r) => b.with_stdin(r),
                None => b,
            };
            let b = match theirs {
                Stdio::Pipes(out_w, err_w) => b.with_stdout(out_w).with_stderr(err_w),
                Stdio::Console(path) => b.with_console_socket(Some(path)),
            };
            b.as_init(&config.bundle)
                .with_systemd(false)
                .with_detach(true)
                .as_sibling(false)
        })
        .and_then(|b| b.build());
    built.map_err(|e| {
        let message = chain(&e);
        // libcontainer reports the init's own failures, the missing executable
        // among them, as "error in executing process".
        let kind = if is_exec_failure(&message) {
            FailureKind::Start
        } else {
            FailureKind::Create
        };
        (kind, message)
    })
}

fn set_oom_score_adj(config: &ShimConfig, init: Pid) {
    if let Some(adj) = config.oom_score_adj {
        // Raising a score needs no privilege; the kernel refuses only lowering it.
        if let Err(e) = std::fs::write(format!("/proc/{init}/oom_score_adj"), adj.to_string()) {
            log::warn!("shim {}: set oom_score_adj of {init}: {e}", config.id);
        }
    }
}

/// Our side of the container's output; with a terminal, its master as the init sends
/// it (the init is killed if it does not).
fn receive_output(config: &ShimConfig, ours: Ours, init: Pid) -> Result<ContainerOutput, Failure> {
    match ours {
        Ours::Pipes(stdout, stderr) => Ok(ContainerOutput::Pipes { stdout, stderr }),
        Ours::Console(l) => {
            let master = unix_socket::receive_fd(&l, CONSOLE_TIMEOUT);
            let _ = std::fs::remove_file(config.state_dir().join(CONSOLE_SOCKET));
            match master {
                Ok(m) => Ok(ContainerOutput::Tty(m)),
                Err(e) => {
                    let _ = signal::kill(init, Signal::SIGKILL);
                    let _ = waitpid(init, None);
                    Err((
                        FailureKind::Create,
                        format!("receive the container's terminal: {e}"),
                    ))
                }
            }
        }
    }
}

/// Writes `started.json` for the started init; returns when it started.
fn record_started(config: &ShimConfig, init: Pid) -> time::Timestamp {
    let started_at = time::now();
    // Gone already (it exited at once): start time 0 matches no live process, and the
    // exit is still ours to reap and record.
    let init_ref = ProcessRef::of(init.as_raw()).unwrap_or(ProcessRef {
        pid: init.as_raw(),
        start_time: 0,
    });
    let rec = StartedRecord {
        init: init_ref,
        started_at,
        boot_id: config.boot_id.clone(),
    };
    if let Err(e) = records::write_boot_scoped(config.state_dir(), records::STARTED, &rec) {
        log::error!("shim {}: {e}", config.id);
    }
    started_at
}

/// The container's side of its stdio, handed to libcontainer.
enum Stdio {
    Pipes(OwnedFd, OwnedFd),
    Console(PathBuf),
}

/// The shim's side.
enum Ours {
    Pipes(OwnedFd, OwnedFd),
    Console(UnixListener),
}

fn is_exec_failure(message: &str) -> bool {
    message.contains("error in executing process")
        && (message.contains("not found")
            || message.contains("permission")
            || message.contains("invalid executable"))
}

fn delete(state_root: &Path, id: &str) -> i32 {
    let state: PathBuf = state_root.join(id);
    if !state.exists() {
        return 0;
    }
    match Container::load(state).and_then(|mut c| c.delete(true)) {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("shim delete {id}: {}", chain(&e));
            1
        }
    }
}

extern "C" fn ignore_signal(_: c_int) {}

/// The shim is detached, but a stray SIGTERM/SIGINT/SIGHUP (a session teardown, a
/// careless `kill`) must not cost a container its exit record: catch them with a
/// handler that does nothing. Not SIG_IGN: that survives execve into the container's
/// process, a handler does not. SIGPIPE gets the same handler (Rust's runtime ignores
/// it, which the container would inherit): writing to a container's stdin it has
/// closed must fail with EPIPE, not kill the shim. SIGCHLD goes back to its default
/// (the agent may have touched it).
#[allow(unsafe_code)]
fn set_signal_dispositions() -> nix::Result<()> {
    let noop = SigAction::new(
        SigHandler::Handler(ignore_signal),
        SaFlags::SA_RESTART,
        SigSet::empty(),
    );
    let default = SigAction::new(SigHandler::SigDfl, SaFlags::empty(), SigSet::empty());
    for sig in [
        Signal::SIGTERM,
        Signal::SIGINT,
        Signal::SIGHUP,
        Signal::SIGPIPE,
    ] {
        // SAFETY: the handler does nothing, so it is async-signal-safe, and the process
        // is single-threaded here.
        unsafe { signal::sigaction(sig, &noop) }?;
    }
    // SAFETY: restoring a default disposition installs no code at all.
    unsafe { signal::sigaction(Signal::SIGCHLD, &default) }?;
    Ok(())
}
