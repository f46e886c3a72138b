//! The `holdfast` binary: parses the subcommand, starts logging, builds the runtime and
//! maps errors to exit codes. Everything else lives in the library.

use std::process::ExitCode;

use holdfast::cli::{emit_line, note, stdout_closed, EXIT_BROKEN_PIPE};

/// Large blocks in mappings of their own, so that they hold only the pages written and
/// go back when freed (`holdfast::malloc::Allocator`).
#[cfg(target_os = "linux")]
#[global_allocator]
static ALLOCATOR: holdfast::malloc::Allocator = holdfast::malloc::Allocator;

const USAGE: &str = "usage: holdfast <command> [flags]

commands:
  run      run the node agent (--config FILE, --root-dir DIR, --pod-manifest-path DIR,
           --hostname-override NAME, --board NAME, --board-dir DIR, --v N; run --help)
  check    report what the kernel and system provide and what is missing
           (--root-dir DIR, --kernel-config FILE, --board NAME, --board-dir DIR);
           exit 0 when every required item is there, 1 when not
  pods     list pods and their containers (--root-dir DIR, -o json)
  status   uplink state, outbox, last sync, store size, pods (--root-dir DIR, --json)
  image    import [--pin] FILE|DIR, pull REF [--platform OS/ARCH[/VARIANT]] [--creds FILE],
           ls, rm REF, prune (--root-dir DIR)
  store    compact: rewrite the store without the space sled keeps (agent stopped)
  reset    stop and remove every container, mount and cgroup, then the root dir
           (--root-dir DIR, --cgroup-root PATH); refused while an agent runs
  version  print the version";

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().collect();
    // The shim must be dispatched before anything starts a thread: it forks containers.
    if args.get(1).map(String::as_str) == Some("shim") {
        let code = holdfast::runtime::shim_main(&args[2..]);
        return ExitCode::from(u8::try_from(code).unwrap_or(1));
    }
    // So must the pod namespace holder: `unshare` in a threaded process is wrong.
    if args.get(1).map(String::as_str) == Some("sandbox") {
        let code = holdfast::network::netns::holder_main(&args[2..]);
        return ExitCode::from(u8::try_from(code).unwrap_or(1));
    }
    command(&args)
}

/// Everything but the shim and the namespace holder, out of line: `main`'s frame stays
/// below the long waits of those two, one each per container and pod, and a frame
/// sized for the agent and the CLI would keep its pages resident in every one of them.
#[inline(never)]
fn command(args: &[String]) -> ExitCode {
    let Some(cmd) = args.get(1).map(String::as_str) else {
        note(USAGE);
        return ExitCode::from(2);
    };
    let rest = &args[2..];
    let result = match cmd {
        "check" => return check(rest),
        "run" => run(rest),
        "pods" => {
            init_logging(None);
            holdfast::cli::pods(rest)
        }
        "status" => {
            init_logging(None);
            holdfast::cli::status(rest)
        }
        "image" => {
            init_logging(None);
            holdfast::cli::image(rest)
        }
        "store" => {
            init_logging(None);
            holdfast::cli::store(rest)
        }
        "reset" => {
            init_logging(None);
            holdfast::cli::reset(rest)
        }
        "version" | "--version" => emit_line(&format!(
            "holdfast {} (libcontainer 0.7.0)",
            holdfast::VERSION
        )),
        "help" | "--help" | "-h" => emit_line(USAGE),
        other => {
            note(&format!("holdfast: unknown command {other:?}\n\n{USAGE}"));
            return ExitCode::from(2);
        }
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        // The reader of our output went away (`holdfast pods | head`): nothing to say.
        Err(_) if stdout_closed() => ExitCode::from(EXIT_BROKEN_PIPE),
        Err(e) => {
            note(&format!("holdfast: {}", holdfast::error_chain(&e)));
            ExitCode::from(u8::try_from(e.exit_code()).unwrap_or(1))
        }
    }
}

/// Blocking threads at most: pod workers' runtime, image and store calls wait for a
/// free one rather than each starting a thread (tokio's default allows 512). Starting
/// 100 pods takes as long with 4 as with 512 (nothing in a start sleeps on a blocking
/// thread); the room above that is for work that holds one for long: exec and
/// port-forward sessions, hooks up to the grace period.
const BLOCKING_THREADS: usize = 32;

/// An idle blocking thread exits after this long, so a burst's threads do not outlive it.
const BLOCKING_KEEP_ALIVE: std::time::Duration = std::time::Duration::from_secs(2);

fn run(args: &[String]) -> Result<(), holdfast::Error> {
    // Before any thread exists: glibc's tunables apply from a program's start only, and
    // the arena limits to arenas made after the call.
    let tunables = holdfast::malloc::exec_with_tunables();
    holdfast::malloc::configure(holdfast::malloc::AGENT_ARENAS);
    let (config, warnings) = holdfast::config::load_run_args(args)?;
    init_logging(config.verbosity);
    for w in warnings {
        log::warn!("{w}");
    }
    if let Err(why) = tunables {
        log::warn!("{why}");
    }
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .max_blocking_threads(BLOCKING_THREADS)
        .thread_keep_alive(BLOCKING_KEEP_ALIVE)
        .build()
        .map_err(|source| holdfast::Error::Io {
            context: "start the async runtime".into(),
            source,
        })?;
    let result = rt.block_on(holdfast::agent::run(config, shutdown_signal()));
    // Blocking work still under way (an exec session, a hook, a pull) does not hold
    // the exit: the runtime would wait for it without end.
    rt.shutdown_timeout(RUNTIME_STOP_WAIT);
    result
}

/// How long a stopping agent waits for its blocking threads once `run` has returned.
const RUNTIME_STOP_WAIT: std::time::Duration = std::time::Duration::from_secs(2);

/// `holdfast check` has its own exit codes: 1 means an item is missing, not a failure
/// of the command.
fn check(args: &[String]) -> ExitCode {
    init_logging(None);
    if args.iter().any(|a| a == "--help" || a == "-h") {
        return match emit_line(holdfast::check::USAGE) {
            Ok(()) => ExitCode::SUCCESS,
            Err(_) => ExitCode::from(EXIT_BROKEN_PIPE),
        };
    }
    match holdfast::check::run(args) {
        Ok(_) if stdout_closed() => ExitCode::from(EXIT_BROKEN_PIPE),
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::from(1),
        Err(holdfast::check::CheckError::Usage(text)) => {
            note(&text);
            ExitCode::from(2)
        }
        Err(e) => {
            note(&format!("holdfast check: {}", holdfast::error_chain(&e)));
            ExitCode::from(u8::try_from(e.exit_code()).unwrap_or(2))
        }
    }
}

async fn shutdown_signal() {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = match signal(SignalKind::terminate()) {
        Ok(s) => s,
        Err(e) => {
            log::warn!("cannot watch SIGTERM: {e}");
            let _ = tokio::signal::ctrl_c().await;
            return;
        }
    };
    tokio::select! {
        _ = term.recv() => log::info!("SIGTERM: stopping"),
        _ = tokio::signal::ctrl_c() => log::info!("SIGINT: stopping"),
    }
}

fn init_logging(verbosity: Option<u8>) {
    let level = match verbosity.unwrap_or(0) {
        0 | 1 => "info",
        2 | 3 => "debug",
        _ => "trace",
    };
    // Quiet the libraries' chatter (libcontainer, sled, the HTTP and TLS stack) until
    // the highest level; holdfast's own lines follow `--v`.
    let libs = if level == "trace" { "debug" } else { "warn" };
    let default = format!(
        "{level},libcontainer={libs},libcgroups={libs},sled={libs},ureq={libs},ureq_proto={libs},rustls={libs}"
    );
    let env = env_logger::Env::default().default_filter_or(default);
    // env_logger's own line, `[2026-11-26T16:18:22Z INFO  target] message` with later
    // lines of a message indented, written here so that the build needs neither its
    // colour crates nor its timestamp feature; journald and the log file take plain text.
    let _ = env_logger::Builder::from_env(env)
        .format(|buf, record| {
            use std::io::Write;
            let now = holdfast::time::Timestamp::now();
            let now = holdfast::time::Timestamp::from_second(now.as_second()).unwrap_or(now);
            let message = record.args().to_string().replace('\n', "\n    ");
            let (level, target) = (record.level(), record.target());
            writeln!(buf, "[{now} {level:<5} {target}] {message}")
        })
        .try_init();
}
