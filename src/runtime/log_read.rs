//! runtime::log_read: a container's CRI log files as `kubectl logs` shows them: the shim's
//! `<restart>.log` and its rotated siblings `<restart>.log.<stamp>`, read oldest first
//! so that rotation loses nothing, records turned into output as [`LogOptions`] asks,
//! and with `follow` the live file watched (and the next one after a rotation) until
//! the container has exited and everything it wrote is out. Blocking: runs on a
//! thread of its own. Knows nothing of HTTP: output goes to a [`Sink`].

use std::fs::File;
use std::io::{BufRead, BufReader, Read, Seek, SeekFrom};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::runtime::ContainerId;
use crate::time::Timestamp;

/// Output is sent in chunks of about this size.
pub const CHUNK: usize = 32 * 1024;
/// How often a follower looks for new output at the end of the live file.
pub const FOLLOW_POLL: Duration = Duration::from_millis(50);
/// How often a follower asks whether the container still runs while it is quiet.
const ALIVE_CHECK: Duration = Duration::from_millis(500);

/// The kubelet's log options, checked.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct LogOptions {
    pub follow: bool,
    pub previous: bool,
    pub timestamps: bool,
    pub tail_lines: Option<u64>,
    pub limit_bytes: Option<u64>,
    pub since: Option<Timestamp>,
}

/// The output side of [`stream`], so that it can be tested without a channel.
pub trait Sink {
    /// Takes output; false when nobody wants more.
    fn push(&mut self, data: &[u8]) -> bool;
    /// Output so far should reach the client now (the reader is about to wait).
    fn flush(&mut self) -> bool;
}

impl Sink for Vec<u8> {
    fn push(&mut self, data: &[u8]) -> bool {
        self.extend_from_slice(data);
        true
    }
    fn flush(&mut self) -> bool {
        true
    }
}

/// The live log and its rotated files, oldest first, live last.
fn files(live: &Path) -> Vec<PathBuf> {
    let mut rotated = crate::runtime::rotated_log_files(live).unwrap_or_default();
    // Rotation stamps sort as the files' ages do.
    rotated.sort();
    rotated.push(live.to_owned());
    rotated
}

/// Writes the log at `live` (with its rotated files) to `out` as `opts` asks; with
/// `follow`, goes on until `alive(watched)` says the container ended.
pub fn stream(
    live: &Path,
    opts: &LogOptions,
    watched: Option<&ContainerId>,
    alive: &dyn Fn(&ContainerId) -> bool,
    out: &mut dyn Sink,
) -> std::io::Result<()> {
    let list = files(live);
    let (mut index, mut offset) = match opts.tail_lines {
        Some(n) => tail_start(&list, n)?,
        None => (0, 0),
    };
    let mut fmt = Formatter {
        opts,
        written: 0,
        done: false,
    };
    // The files before the live one are complete.
    while index + 1 < list.len() {
        if let Ok(f) = File::open(&list[index]) {
            fmt.copy(f, offset, out)?;
        }
        if fmt.done {
            return Ok(());
        }
        index += 1;
        offset = 0;
    }
    let mut file = match File::open(live) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound && opts.follow => {
            // Not written yet: wait for it while the container runs.
            loop {
                if let Ok(f) = File::open(live) {
                    break f;
                }
                if !watched.is_some_and(alive) || !out.flush() {
                    return Ok(());
                }
                std::thread::sleep(FOLLOW_POLL);
            }
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(e),
    };
    file.seek(SeekFrom::Start(offset))?;
    let mut reader = BufReader::with_capacity(CHUNK, file);
    let Some(id) = watched.filter(|_| opts.follow) else {
        fmt.lines(&mut reader, out)?;
        return Ok(());
    };
    let mut last_check = Instant::now();
    let mut ending = false;
    loop {
        fmt.lines(&mut reader, out)?;
        if fmt.done || !out.flush() {
            return Ok(());
        }
        // Rotated: what is left of the old file was just read; go on in the new one.
        let rotated = match (std::fs::metadata(live), reader.get_ref().metadata()) {
            (Ok(now), Ok(open)) => now.ino() != open.ino(),
            _ => false,
        };
        if rotated {
            if let Ok(f) = File::open(live) {
                reader = BufReader::with_capacity(CHUNK, f);
                continue;
            }
        }
        if ending {
            return Ok(());
        }
        if last_check.elapsed() >= ALIVE_CHECK {
            last_check = Instant::now();
            if !alive(id) {
                // The shim writes everything before it records the exit: one more
                // read gets the rest.
                ending = true;
                continue;
            }
        }
        std::thread::sleep(FOLLOW_POLL);
    }
}

struct Formatter<'a> {
    opts: &'a LogOptions,
    written: u64,
    done: bool,
}

impl Formatter<'_> {
    fn copy(&mut self, mut f: File, offset: u64, out: &mut dyn Sink) -> std::io::Result<()> {
        f.seek(SeekFrom::Start(offset))?;
        self.lines(&mut BufReader::with_capacity(CHUNK, f), out)
    }

    /// Every whole record `reader` has now; a record still being written (no newline
    /// yet) is left for the next call.
    fn lines(&mut self, reader: &mut BufReader<File>, out: &mut dyn Sink) -> std::io::Result<()> {
        let mut line = Vec::with_capacity(1024);
        while !self.done {
            line.clear();
            let n = reader.read_until(b'\n', &mut line)?;
            if n == 0 {
                return Ok(());
            }
            if line.last() != Some(&b'\n') {
                // Torn: step back and wait for the rest.
                reader.seek_relative(-(n as i64))?;
                return Ok(());
            }
            line.pop();
            self.record(&line, out);
        }
        Ok(())
    }

    fn record(&mut self, line: &[u8], out: &mut dyn Sink) {
        let Some(rec) = parse_record(line) else {
            return;
        };
        if let Some(since) = self.opts.since {
            if rec.time.is_some_and(|t| t < since) {
                return;
            }
        }
        let mut text = Vec::with_capacity(rec.content.len() + 40);
        if self.opts.timestamps {
            text.extend_from_slice(rec.raw_time);
            text.push(b' ');
        }
        text.extend_from_slice(rec.content);
        if rec.full {
            text.push(b'\n');
        }
        if let Some(limit) = self.opts.limit_bytes {
            let left = limit.saturating_sub(self.written) as usize;
            if text.len() >= left {
                text.truncate(left);
                self.done = true;
            }
        }
        self.written += text.len() as u64;
        if !out.push(&text) {
            self.done = true;
        }
    }
}

struct Record<'a> {
    raw_time: &'a [u8],
    time: Option<Timestamp>,
    full: bool,
    content: &'a [u8],
}

/// `<time> <stream> <F|P> <content>`; None for a line that is not a record.
fn parse_record(line: &[u8]) -> Option<Record<'_>> {
    let mut parts = line.splitn(4, |&b| b == b' ');
    let raw_time = parts.next()?;
    let _stream = parts.next()?;
    let tag = parts.next()?;
    let content = parts.next().unwrap_or(b"");
    let time = std::str::from_utf8(raw_time).ok()?.parse().ok();
    Some(Record {
        raw_time,
        time,
        full: tag != b"P",
        content,
    })
}

/// Where the last `n` records start: (file index, offset), counting back from the
/// end of the live file through the rotated ones. Reads backwards in chunks, so the
/// cost is the tail's size, not the log's.
fn tail_start(files: &[PathBuf], n: u64) -> std::io::Result<(usize, u64)> {
    if n == 0 {
        let last = files.len().saturating_sub(1);
        let len = files
            .get(last)
            .and_then(|p| std::fs::metadata(p).ok())
            .map(|m| m.len())
            .unwrap_or(0);
        return Ok((last, len));
    }
    let mut seen = 0u64;
    let mut buf = vec![0u8; CHUNK];
    for (i, path) in files.iter().enumerate().rev() {
        let Ok(mut f) = File::open(path) else {
            continue;
        };
        let len = f.metadata()?.len();
        let mut end = len;
        // The newline ending the file's last record does not start a record.
        let mut skip_last = true;
        while end > 0 {
            let start = end.saturating_sub(CHUNK as u64);
            let size = (end - start) as usize;
            f.seek(SeekFrom::Start(start))?;
            f.read_exact(&mut buf[..size])?;
            for j in (0..size).rev() {
                if buf[j] != b'\n' {
                    continue;
                }
                if skip_last && start + j as u64 == len - 1 {
                    skip_last = false;
                    continue;
                }
                seen += 1;
                if seen == n {
                    return Ok((i, start + j as u64 + 1));
                }
            }
            skip_last = false;
            end = start;
        }
        // The whole file counts: its first record is one more.
        seen += u64::from(len > 0);
        if seen >= n {
            return Ok((i, 0));
        }
    }
    Ok((0, 0))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dir(name: &str) -> PathBuf {
        let d =
            std::env::temp_dir().join(format!("holdfast-apilogs-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).expect("mkdir");
        d
    }

    fn rec(t: &str, s: &str, tag: &str, c: &str) -> String {
        format!("{t} {s} {tag} {c}\n")
    }

    fn read(live: &Path, opts: &LogOptions) -> String {
        let mut out = Vec::new();
        stream(live, opts, None, &|_| false, &mut out).expect("stream");
        String::from_utf8(out).expect("utf8")
    }

    #[test]
    fn options_across_rotated_files() {
        let d = dir("rot");
        let live = d.join("0.log");
        std::fs::write(
            d.join("0.log.20261201-000001"),
            rec("2026-12-01T00:00:01Z", "stdout", "F", "one")
                + &rec("2026-12-01T00:00:02Z", "stderr", "F", "two"),
        )
        .expect("write");
        std::fs::write(
            &live,
            rec("2026-12-01T00:00:03Z", "stdout", "P", "thr")
                + &rec("2026-12-01T00:00:03.5Z", "stdout", "F", "ee")
                + &rec("2026-12-01T00:00:04Z", "stdout", "F", "four"),
        )
        .expect("write");
        let all = LogOptions::default();
        assert_eq!(read(&live, &all), "one\ntwo\nthree\nfour\n");
        let tail = |n| LogOptions {
            tail_lines: Some(n),
            ..LogOptions::default()
        };
        assert_eq!(read(&live, &tail(1)), "four\n");
        assert_eq!(read(&live, &tail(3)), "three\nfour\n");
        assert_eq!(read(&live, &tail(4)), "two\nthree\nfour\n");
        assert_eq!(read(&live, &tail(99)), "one\ntwo\nthree\nfour\n");
        assert_eq!(read(&live, &tail(0)), "");
        let since = LogOptions {
            since: "2026-12-01T00:00:02Z".parse().ok(),
            ..LogOptions::default()
        };
        assert_eq!(read(&live, &since), "two\nthree\nfour\n");
        let limit = LogOptions {
            limit_bytes: Some(6),
            ..LogOptions::default()
        };
        assert_eq!(read(&live, &limit), "one\ntw");
        let ts = LogOptions {
            timestamps: true,
            tail_lines: Some(1),
            ..LogOptions::default()
        };
        assert_eq!(read(&live, &ts), "2026-12-01T00:00:04Z four\n");
        let _ = std::fs::remove_dir_all(&d);
    }
}
