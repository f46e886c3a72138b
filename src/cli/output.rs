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

/// Rows as a table: each column as wide as its widest cell (in characters), two spaces
/// between columns, no trailing blanks. The first row is the header.
pub fn table<R: AsRef<[String]>>(rows: &[R]) -> String {
    let mut widths: Vec<usize> = Vec::new();
    for row in rows {
        for (i, cell) in row.as_ref().iter().enumerate() {
            let w = cell.chars().count();
            match widths.get_mut(i) {
                Some(max) => *max = (*max).max(w),
                None => widths.push(w),
            }
        }
    }
    let mut out = String::new();
    for row in rows {
        let mut line = String::new();
        for (i, cell) in row.as_ref().iter().enumerate() {
            if i > 0 {
                line.push_str("  ");
            }
            line.push_str(cell);
            let pad = widths
                .get(i)
                .copied()
                .unwrap_or(0)
                .saturating_sub(cell.chars().count());
            line.extend(std::iter::repeat_n(' ', pad));
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::table;

    #[test]
    fn table_columns_line_up_under_their_header() {
        let rows = vec![
            vec!["NAME".to_string(), "STATUS".into(), "DETAIL".into()],
            vec!["demo-node".into(), "Running".into(), String::new()],
            vec![
                "└ ticker".into(),
                "Waiting".into(),
                "CrashLoopBackOff".into(),
            ],
        ];
        let out = table(&rows);
        let lines: Vec<&str> = out.lines().collect();
        assert_eq!(lines.len(), 3);
        // Each column starts at the same character in every line.
        // The character (not byte: "└" is three) at which `word` starts in `line`.
        let col = |line: &str, word: &str| {
            let byte = line.find(word).expect("word in line");
            line[..byte].chars().count()
        };
        assert_eq!(col(lines[0], "STATUS"), col(lines[1], "Running"));
        assert_eq!(col(lines[0], "STATUS"), col(lines[2], "Waiting"));
        assert_eq!(col(lines[0], "DETAIL"), col(lines[2], "CrashLoop"));
        assert!(!out.lines().any(|l| l.ends_with(' ')), "{out}");
    }
}
