//! The CRI container log a shim writes: one record per line,
//! `<RFC 3339 nano timestamp> <stdout|stderr> <F|P> <bytes>`, F ending a line and P a
//! piece of one longer than 16 KiB. When the file passes its size limit it is renamed
//! `<name>.<YYYYmmdd-HHMMSS>` and the oldest rotated files are deleted so that at most
//! `max_files` remain, the live one included.
//!
//! Where a pod's logs live: `<root>/logs/pods/<ns>_<name>_<uid>/<container>/`, as the
//! kubelet lays out `/var/log/pods`, with the pod's folder name shortened when it would
//! not fit in one directory entry ([`pod_log_dir`]). Every reader and writer of logs
//! goes through that function. Logs may hold secrets a container printed: folders are
//! 0700 and files 0640, below a 0700 root.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use crate::time::{self, Timestamp};

/// The longest record content; longer lines become several P records (containerd's size).
pub const MAX_RECORD: usize = 16 * 1024;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stream {
    Stdout,
    Stderr,
}

impl Stream {
    fn name(self) -> &'static str {
        match self {
            Stream::Stdout => "stdout",
            Stream::Stderr => "stderr",
        }
    }
}

/// The longest name of one directory entry (Linux's NAME_MAX).
const NAME_MAX: usize = 255;
/// Hex digits of the hash that stands for the part of a pod's name cut off.
const NAME_HASH: usize = 16;
/// A log file's mode: root reads and writes it, its group (root's) reads it.
const LOG_MODE: u32 = 0o640;
/// A log folder's mode.
const DIR_MODE: u32 = 0o700;

/// The folder of the pod's logs, `<root>/logs/pods/<ns>_<name>_<uid>`. A valid pod can
/// have a 63-byte namespace and a 253-byte name, which with its uid pass the 255 bytes a
/// folder's name may have: then the name is cut and a hash of the whole folder name
/// follows it (`<ns>_<name prefix>-<hash>_<uid>`), the same for the same pod every time.
pub fn pod_log_dir(root: &Path, namespace: &str, name: &str, uid: &str) -> PathBuf {
    root.join("logs")
        .join("pods")
        .join(pod_log_dir_name(namespace, name, uid))
}

fn pod_log_dir_name(namespace: &str, name: &str, uid: &str) -> String {
    let full = format!("{namespace}_{name}_{uid}");
    if full.len() <= NAME_MAX {
        return full;
    }
    let hash = {
        use sha2::{Digest, Sha256};
        let digest = Sha256::digest(full.as_bytes());
        let mut hex = String::with_capacity(64);
        for b in digest {
            hex.push_str(&format!("{b:02x}"));
        }
        hex
    };
    // `<ns>_` + `-<hash>` + `_<uid>` around what is kept of the name.
    let fixed = namespace.len() + 1 + 1 + NAME_HASH + 1 + uid.len();
    let Some(room) = NAME_MAX.checked_sub(fixed) else {
        // Only a uid far longer than any the apiserver gives: the hash alone.
        return hash;
    };
    let mut keep = room.min(name.len());
    while !name.is_char_boundary(keep) {
        keep -= 1;
    }
    format!("{namespace}_{}-{}_{uid}", &name[..keep], &hash[..NAME_HASH])
}

/// Makes `dir` and its missing parents 0700, and narrows `dir` (a container's log
/// folder) if an older holdfast left it wider. Its parents are left as they are: they
/// are below the root dir, which is kept 0700, or they are not holdfast's to change
/// (a log opened directly under `/tmp` must not narrow `/tmp`).
fn private_dirs(dir: &Path) -> std::io::Result<()> {
    super::root_dir::create_private(dir)?;
    let mode = std::fs::metadata(dir)?.permissions().mode();
    if mode & 0o077 != 0 {
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(DIR_MODE))?;
    }
    Ok(())
}

/// Opens `path` for appending, created 0640 (and narrowed to it when it was wider).
fn open_append(path: &Path) -> std::io::Result<File> {
    let file = OpenOptions::new()
        .create(true)
        .append(true)
        .mode(LOG_MODE)
        .open(path)?;
    let mode = file.metadata()?.permissions().mode() & 0o7777;
    if mode & !LOG_MODE != 0 {
        file.set_permissions(std::fs::Permissions::from_mode(LOG_MODE))?;
    }
    Ok(file)
}

pub struct CriLog {
    path: PathBuf,
    max_size: u64,
    max_files: u32,
    file: File,
    size: u64,
}

impl CriLog {
    /// Opens (appending to) the log at `path`. `max_size` 0 means never rotate.
    pub fn open(path: &Path, max_size: u64, max_files: u32) -> std::io::Result<Self> {
        if let Some(parent) = path.parent() {
            private_dirs(parent)?;
        }
        let file = open_append(path)?;
        let size = file.metadata()?.len();
        if let Err(e) = prune_older_restarts(path) {
            log::warn!("prune old logs beside {}: {e}", path.display());
        }
        Ok(CriLog {
            path: path.to_owned(),
            max_size,
            max_files: max_files.max(1),
            file,
            size,
        })
    }

    /// Writes one record; `full` says whether it ends a line.
    pub fn record(
        &mut self,
        at: Timestamp,
        stream: Stream,
        full: bool,
        content: &[u8],
    ) -> std::io::Result<()> {
        let ts = time::rfc3339_nano(at);
        let mut line = Vec::with_capacity(ts.len() + content.len() + 12);
        line.extend_from_slice(ts.as_bytes());
        line.push(b' ');
        line.extend_from_slice(stream.name().as_bytes());
        line.extend_from_slice(if full { b" F " } else { b" P " });
        line.extend_from_slice(content);
        line.push(b'\n');
        if self.max_size > 0 && self.size > 0 && self.size + line.len() as u64 > self.max_size {
            self.rotate(at)?;
        }
        // One write per record, so a reader following the file never sees a torn line.
        self.file.write_all(&line)?;
        self.size += line.len() as u64;
        Ok(())
    }

    fn rotate(&mut self, at: Timestamp) -> std::io::Result<()> {
        let name = file_name(&self.path);
        let stamp = at.strftime("%Y%m%d-%H%M%S").to_string();
        let mut target = self.path.with_file_name(format!("{name}.{stamp}"));
        let mut n = 1;
        while target.exists() {
            target = self.path.with_file_name(format!("{name}.{stamp}.{n:03}"));
            n += 1;
        }
        std::fs::rename(&self.path, &target)?;
        self.file = open_append(&self.path)?;
        self.size = 0;
        self.prune()
    }

    /// Deletes the oldest rotated files beyond `max_files - 1`.
    fn prune(&self) -> std::io::Result<()> {
        let mut rotated = rotated_files(&self.path)?;
        // Timestamps in the names sort as the files' ages do.
        rotated.sort();
        let keep = (self.max_files as usize).saturating_sub(1);
        let excess = rotated.len().saturating_sub(keep);
        for old in rotated.into_iter().take(excess) {
            std::fs::remove_file(old)?;
        }
        Ok(())
    }
}

fn file_name(path: &Path) -> String {
    path.file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default()
}

/// How many earlier restarts keep their logs beside the current one. The kubelet keeps
/// one (`kubectl logs --previous`); a gateway keeps a few more, since nobody may look
/// until the site is visited, but a crash loop must not fill the disk.
pub const KEPT_RESTARTS: u64 = 5;

/// Removes the logs of restarts older than [`KEPT_RESTARTS`] before `<n>.log`.
pub fn prune_older_restarts(path: &Path) -> std::io::Result<()> {
    let Some(n) = file_name(path)
        .strip_suffix(".log")
        .and_then(|s| s.parse::<u64>().ok())
    else {
        return Ok(());
    };
    let dir = path.parent().unwrap_or(Path::new("."));
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        let name = entry.file_name().to_string_lossy().into_owned();
        let restart = name
            .split_once(".log")
            .and_then(|(k, _)| k.parse::<u64>().ok());
        if restart.is_some_and(|k| k + KEPT_RESTARTS < n) {
            std::fs::remove_file(entry.path())?;
        }
    }
    Ok(())
}

/// Rotated siblings of the live log `path`.
pub fn rotated_files(path: &Path) -> std::io::Result<Vec<PathBuf>> {
    let prefix = format!("{}.", file_name(path));
    let dir = path.parent().unwrap_or(Path::new("."));
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        if entry.file_name().to_string_lossy().starts_with(&prefix) {
            out.push(entry.path());
        }
    }
    Ok(out)
}

/// One stream's bytes not yet written as a record (a line still being written).
pub struct LineBuffer {
    stream: Stream,
    pending: Vec<u8>,
}

impl LineBuffer {
    pub fn new(stream: Stream) -> Self {
        LineBuffer {
            stream,
            pending: Vec::new(),
        }
    }

    pub fn stream(&self) -> Stream {
        self.stream
    }

    /// Writes every complete line in `pending + data`; keeps the rest unless it
    /// reaches [`MAX_RECORD`].
    pub fn feed(&mut self, log: &mut CriLog, data: &[u8]) -> std::io::Result<()> {
        let at = time::now();
        self.pending.extend_from_slice(data);
        let mut start = 0;
        while let Some(nl) = self.pending[start..].iter().position(|&b| b == b'\n') {
            let end = start + nl;
            let mut line = &self.pending[start..end];
            while line.len() > MAX_RECORD {
                log.record(at, self.stream, false, &line[..MAX_RECORD])?;
                line = &line[MAX_RECORD..];
            }
            log.record(at, self.stream, true, line)?;
            start = end + 1;
        }
        while self.pending.len() - start >= MAX_RECORD {
            log.record(
                at,
                self.stream,
                false,
                &self.pending[start..start + MAX_RECORD],
            )?;
            start += MAX_RECORD;
        }
        self.pending.drain(..start);
        Ok(())
    }

    /// At end of stream, a last line without a newline is written as a partial
    /// record, as containerd writes it: readers show it without a newline (`echo -n
    /// DONE` is `DONE` in `kubectl logs` and a termination message from the log).
    pub fn finish(&mut self, log: &mut CriLog) -> std::io::Result<()> {
        if !self.pending.is_empty() {
            log.record(time::now(), self.stream, false, &self.pending)?;
            self.pending.clear();
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tmp(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("holdfast-logs-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("mkdir");
        dir
    }

    fn records(path: &Path) -> Vec<(String, String, String)> {
        let text = std::fs::read_to_string(path).expect("read log");
        text.lines()
            .map(|l| {
                let mut it = l.splitn(4, ' ');
                let ts = it.next().expect("ts");
                assert!(ts.parse::<Timestamp>().is_ok(), "timestamp {ts}");
                let s = it.next().expect("stream").to_owned();
                let t = it.next().expect("tag").to_owned();
                (s, t, it.next().unwrap_or("").to_owned())
            })
            .collect()
    }

    #[test]
    fn full_partial_and_long_lines() {
        let dir = tmp("lines");
        let path = dir.join("0.log");
        let mut log = CriLog::open(&path, 0, 5).expect("open");
        let mut out = LineBuffer::new(Stream::Stdout);
        let mut err = LineBuffer::new(Stream::Stderr);
        out.feed(&mut log, b"hel").expect("feed");
        out.feed(&mut log, b"lo\nwor").expect("feed");
        err.feed(&mut log, b"oops\n").expect("feed");
        let long = vec![b'x'; MAX_RECORD * 2 + 10];
        out.feed(&mut log, b"ld\n").expect("feed");
        out.feed(&mut log, &long).expect("feed");
        out.feed(&mut log, b"\ntail").expect("feed");
        out.finish(&mut log).expect("finish");
        let r = records(&path);
        let short: Vec<(&str, &str, usize)> = r
            .iter()
            .map(|(s, t, c)| (s.as_str(), t.as_str(), c.len()))
            .collect();
        assert_eq!(
            short,
            vec![
                ("stdout", "F", 5),
                ("stderr", "F", 4),
                ("stdout", "F", 5),
                ("stdout", "P", MAX_RECORD),
                ("stdout", "P", MAX_RECORD),
                ("stdout", "F", 10),
                ("stdout", "P", 4),
            ]
        );
        assert_eq!(r[0].2, "hello");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn the_longest_valid_names_fit_in_one_folder_name() {
        let root = Path::new("/r");
        let short = pod_log_dir(root, "default", "web", "0c5e");
        assert_eq!(short, Path::new("/r/logs/pods/default_web_0c5e"));
        let ns = "n".repeat(63);
        let uid = "8d1f3a2e-6b1c-4f3e-9a57-0d2c1b3e4f5a";
        let name = format!("{}x", "p".repeat(252));
        let dir = pod_log_dir(root, &ns, &name, uid);
        let leaf = dir.file_name().and_then(|n| n.to_str()).expect("leaf");
        assert!(leaf.len() <= NAME_MAX, "{} bytes", leaf.len());
        assert!(leaf.starts_with(&format!("{ns}_ppp")) && leaf.ends_with(&format!("_{uid}")));
        // Stable, and two names that differ only past the cut get two folders.
        assert_eq!(pod_log_dir(root, &ns, &name, uid), dir);
        let other = format!("{}y", "p".repeat(252));
        assert_ne!(pod_log_dir(root, &ns, &other, uid), dir);
        let absurd = "u".repeat(300);
        let leaf = pod_log_dir_name("ns", "pod", &absurd);
        assert_eq!(leaf.len(), 64);
    }

    #[test]
    fn logs_are_private() {
        let dir = tmp("private");
        let path = dir.join("pods/ns_p_u/c/0.log");
        std::fs::create_dir_all(dir.join("pods")).expect("mkdir");
        std::fs::set_permissions(dir.join("pods"), std::fs::Permissions::from_mode(0o755))
            .expect("chmod");
        let mut log = CriLog::open(&path, 100, 2).expect("open");
        let mode = |p: &Path| std::fs::metadata(p).expect("stat").permissions().mode() & 0o7777;
        assert_eq!(mode(&path), LOG_MODE);
        assert_eq!(mode(&dir.join("pods/ns_p_u/c")), DIR_MODE);
        assert_eq!(mode(&dir.join("pods/ns_p_u")), DIR_MODE);
        // A folder it did not make is not its to narrow (were it `/tmp`...).
        assert_eq!(mode(&dir.join("pods")), 0o755);
        let mut out = LineBuffer::new(Stream::Stdout);
        for i in 0..20 {
            out.feed(&mut log, format!("line {i}\n").as_bytes())
                .expect("feed");
        }
        for f in rotated_files(&path).expect("rotated") {
            assert_eq!(mode(&f), LOG_MODE, "{}", f.display());
        }
        assert_eq!(mode(&path), LOG_MODE);
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn rotation_keeps_at_most_max_files() {
        let dir = tmp("rotate");
        let path = dir.join("2.log");
        // Another restart's log in the same folder must survive pruning.
        std::fs::write(dir.join("1.log"), b"older restart\n").expect("write");
        let mut log = CriLog::open(&path, 200, 3).expect("open");
        let mut out = LineBuffer::new(Stream::Stdout);
        for i in 0..100 {
            out.feed(
                &mut log,
                format!("line {i} of the test output\n").as_bytes(),
            )
            .expect("feed");
        }
        let rotated = rotated_files(&path).expect("list");
        assert_eq!(rotated.len(), 2, "{rotated:?}");
        assert!(std::fs::metadata(&path).expect("live").len() <= 200);
        assert!(dir.join("1.log").exists());
        // Restarts later, only the last few restarts before the live one are kept.
        std::fs::write(dir.join("0.log"), b"oldest\n").expect("write");
        let n = 2 + KEPT_RESTARTS;
        CriLog::open(&dir.join(format!("{n}.log")), 200, 3).expect("open");
        assert!(!dir.join("0.log").exists() && !dir.join("1.log").exists());
        assert!(dir.join("2.log").exists());
        let last = records(&path);
        assert_eq!(
            last.last().map(|r| r.2.as_str()),
            Some("line 99 of the test output")
        );
        let _ = std::fs::remove_dir_all(&dir);
    }
}
