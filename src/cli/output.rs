//! What the subcommands print. A reader that went away (`holdfast pods | head`) ends
//! the command quietly instead of panicking, as coreutils and kubectl end: they die of
//! SIGPIPE, which a shell reports as status 141; `main` exits with 141 itself, since
//! Rust's runtime ignores SIGPIPE (the agent's sockets need it ignored).

use std::io::{self, Write};
use std::sync::atomic::{AtomicBool, Ordering};

use crate::Error;

/// Set once a write to standard output found its reader gone.
static STDOUT_CLOSED: AtomicBool = AtomicBool::new(false);

/// The status a command whose output was cut short exits with: 128 + SIGPIPE, what a
/// shell reports for `ls | head` and `kubectl get pods | head`.
pub const EXIT_BROKEN_PIPE: u8 = 141;

/// Writes `text` as it is to standard output and flushes it. Err when the write fails;
/// when it failed because the reader went away, [`stdout_closed`] says so and the
/// caller only has to return the error.
pub fn emit(text: &str) -> Result<(), Error> {
    let mut out = io::stdout().lock();
    match out.write_all(text.as_bytes()).and_then(|()| out.flush()) {
        Ok(()) => Ok(()),
        Err(source) => {
            if source.kind() == io::ErrorKind::BrokenPipe {
                STDOUT_CLOSED.store(true, Ordering::Relaxed);
            }
            Err(Error::Io {
                context: "write to standard output".into(),
                source,
            })
        }
    }
}

/// [`emit`] with a newline after `text`.
pub fn emit_line(text: &str) -> Result<(), Error> {
    emit(&format!("{text}\n"))
}

/// Whether standard output's reader went away: the command's error is then no news to
/// anyone and it should exit with [`EXIT_BROKEN_PIPE`] without a word.
pub fn stdout_closed() -> bool {
    STDOUT_CLOSED.load(Ordering::Relaxed)
}

/// A line to standard error. Write errors are ignored: there is nowhere left to report
/// them, and a progress line lost to a closed pipe must not stop a pull.
pub fn note(text: &str) {
    let _ = writeln!(io::stderr().lock(), "{text}");
}
