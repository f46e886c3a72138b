//! The static pod file source: every manifest in one folder, watched with inotify and
//! rescanned every period, sent as a full snapshot whenever the set of pods changes.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::io;
use std::os::fd::AsFd;
use std::path::{Path, PathBuf};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Pod;
use nix::errno::Errno;
use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
use nix::sys::inotify::{AddWatchFlags, InitFlags, Inotify, WatchDescriptor};
use tokio::sync::mpsc::Sender;

use super::manifest::{read_manifest_file, FileRead};
use super::static_pod::set_seen;
use super::{SourceError, SourceSnapshot};
use crate::pod::annotations::{CONFIG_SEEN, MANIFEST_FILE, SOURCE_FILE};
use crate::time::Timestamp;

/// Editors write a file in several steps; a rescan waits for this much quiet.
const QUIET: Duration = Duration::from_millis(20);
/// ...but no longer than this, so a file rewritten without pause still gets read.
const MAX_COALESCE: Duration = Duration::from_secs(1);
/// How often the thread looks up from its wait to see whether anyone still listens.
const MAX_WAIT: Duration = Duration::from_secs(1);

/// Reads every manifest in `dir` once: the pods this node should run from them, and an
/// error for each file or document refused. A missing `dir` gives no pods and no error.
pub fn read_manifests(dir: &Path, node_name: &str) -> (Vec<Pod>, Vec<SourceError>) {
    let mut source = FileSource::new(dir.to_path_buf(), node_name.to_string());
    match source.scan() {
        Ok(found) => found,
        Err(e) => (Vec::new(), vec![e]),
    }
}

/// Starts the file source: its first scan here, returned so the agent starts from what
/// the folder holds now (a pod whose manifest went while the agent was down, or was lost
/// in a power cut, is never started again), then its own thread, which sends a snapshot
/// at once and whenever the pods change, and ends when the receiver is dropped. None for the first
/// scan when the folder cannot be listed (the store's pods stand until it can).
///
/// `known` are the file pods the store holds from before a restart: a manifest that
/// cannot be read at the first scan (a power cut in the middle of a save) keeps them,
/// as a file that breaks while the agent runs keeps its pods.
pub fn spawn_file_source(
    dir: PathBuf,
    node_name: String,
    period: Duration,
    known: Vec<Pod>,
    tx: Sender<SourceSnapshot>,
) -> io::Result<(JoinHandle<()>, Option<SourceSnapshot>)> {
    let inotify = Inotify::init(InitFlags::IN_NONBLOCK | InitFlags::IN_CLOEXEC)?;
    let mut source = FileSource::new(dir, node_name);
    source.remember(known);
    let mut state = ScanState::default();
    let first = scan_once(&mut source, &mut state);
    // The thread sends its first snapshot too (the same pods: no change for the mux), so
    // a receiver that did not take this one misses nothing.
    state.last_sent = None;
    let handle = std::thread::Builder::new()
        .name("source-file".into())
        .spawn(move || run(source, state, inotify, period, tx))?;
    Ok((handle, first))
}

/// What the source thread remembers between scans: the pods it last sent and the
/// errors it last said.
#[derive(Default)]
struct ScanState {
    last_sent: Option<Vec<Pod>>,
    last_errors: HashSet<String>,
}

/// One scan: the snapshot to send when the pods changed since the last one sent. Each
/// error is logged once while it lasts.
fn scan_once(source: &mut FileSource, state: &mut ScanState) -> Option<SourceSnapshot> {
    match source.scan() {
        Ok((pods, errors)) => {
            // A broken file stays broken between rescans; say so once.
            let errors: HashSet<String> = errors.iter().map(|e| e.to_string()).collect();
            for e in errors.difference(&state.last_errors) {
                log::error!("{e}");
            }
            state.last_errors = errors;
            if state.last_sent.as_ref() == Some(&pods) {
                return None;
            }
            state.last_sent = Some(pods.clone());
            Some(SourceSnapshot {
                source: SOURCE_FILE,
                pods,
                resource_version: None,
            })
        }
        Err(e) => {
            log::error!("{e}");
            None
        }
    }
}

/// What the source remembers between scans.
struct FileSource {
    dir: PathBuf,
    node_name: String,
    /// Each file's pods as last read successfully, kept while the file is unreadable.
    last_good: BTreeMap<PathBuf, Vec<Pod>>,
    /// When each pod UID was first seen, so `config.seen` stays put and an unchanged
    /// folder gives an identical snapshot.
    first_seen: HashMap<String, Timestamp>,
}

impl FileSource {
    fn new(dir: PathBuf, node_name: String) -> Self {
        FileSource {
            dir,
            node_name,
            last_good: BTreeMap::new(),
            first_seen: HashMap::new(),
        }
    }

    /// Seeds what was last read from each file, and when each pod was first seen, from
    /// pods this source gave before.
    fn remember(&mut self, known: Vec<Pod>) {
        for pod in known {
            let annotations = pod.metadata.annotations.as_ref();
            let Some(file) = annotations.and_then(|a| a.get(MANIFEST_FILE)) else {
                continue;
            };
            let seen = annotations
                .and_then(|a| a.get(CONFIG_SEEN))
                .and_then(|s| s.parse::<Timestamp>().ok());
            if let (Some(uid), Some(seen)) = (pod.metadata.uid.clone(), seen) {
                self.first_seen.insert(uid, seen);
            }
            self.last_good
                .entry(PathBuf::from(file))
                .or_default()
                .push(pod);
        }
    }

    /// Err only when the folder exists but cannot be listed: then nothing is known and
    /// the caller keeps what it had.
    fn scan(&mut self) -> Result<(Vec<Pod>, Vec<SourceError>), SourceError> {
        let files = match list_manifest_files(&self.dir) {
            Ok(files) => files,
            Err(e) if e.kind() == io::ErrorKind::NotFound => Vec::new(),
            Err(source) => {
                return Err(SourceError::Io {
                    context: format!("list manifest folder {}", self.dir.display()),
                    source,
                })
            }
        };
        let mut errors = Vec::new();
        let mut by_file = BTreeMap::new();
        for path in files {
            let pods = match read_manifest_file(&path, &self.node_name) {
                FileRead::Read {
                    pods,
                    errors: refused,
                } => {
                    errors.extend(refused);
                    pods
                }
                FileRead::Unreadable(e) => {
                    let kept = self.last_good.get(&path).cloned().unwrap_or_default();
                    errors.push(if kept.is_empty() {
                        e
                    } else {
                        keeping(e, kept.len())
                    });
                    kept
                }
            };
            by_file.insert(path, pods);
        }

        let mut pods = Vec::new();
        let mut names: HashMap<String, &Path> = HashMap::new();
        let mut uids: HashMap<String, &Path> = HashMap::new();
        for (path, file_pods) in &by_file {
            for pod in file_pods {
                let meta = &pod.metadata;
                let name = format!(
                    "{}/{}",
                    meta.namespace.as_deref().unwrap_or_default(),
                    meta.name.as_deref().unwrap_or_default()
                );
                let uid = meta.uid.clone().unwrap_or_default();
                let clash = names
                    .get(&name)
                    .map(|first| format!("pod {name} is already defined in {}", first.display()))
                    .or_else(|| {
                        uids.get(&uid).map(|first| {
                            format!("pod uid {uid} is already used in {}", first.display())
                        })
                    });
                if let Some(reason) = clash {
                    errors.push(SourceError::Manifest {
                        file: path.display().to_string(),
                        reason: format!("{reason}; this one is ignored"),
                    });
                    continue;
                }
                names.insert(name, path);
                uids.insert(uid, path);
                pods.push(pod.clone());
            }
        }

        let now = crate::time::now();
        self.first_seen.retain(|uid, _| uids.contains_key(uid));
        for pod in &mut pods {
            let uid = pod.metadata.uid.clone().unwrap_or_default();
            let seen = *self.first_seen.entry(uid).or_insert(now);
            set_seen(pod, seen);
        }
        // The table kept the room of the most pods the folder ever held; pods that went
        // give theirs back (no work when nothing went).
        self.first_seen.shrink_to_fit();
        self.last_good = by_file;
        Ok((pods, errors))
    }
}

fn keeping(e: SourceError, count: usize) -> SourceError {
    let note = format!("; keeping the {count} pod(s) it gave before until it reads cleanly");
    match e {
        SourceError::Manifest { file, reason } => SourceError::Manifest {
            file,
            reason: reason + &note,
        },
        SourceError::Io { context, source } => SourceError::Io {
            context: context + &note,
            source,
        },
        other => other,
    }
}

/// Manifest files in `dir`, by file name. Hidden files are skipped: editors and
/// atomic writers keep their temporary files there.
fn list_manifest_files(dir: &Path) -> io::Result<Vec<PathBuf>> {
    let mut files = Vec::new();
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        let name = entry.file_name();
        let Some(name) = name.to_str() else { continue };
        if !is_manifest_name(name) {
            continue;
        }
        let path = entry.path();
        // Follows symlinks: a link to a manifest counts, a dangling one does not, and
        // neither does a folder. Anything else with a manifest's name is the reader's
        // to refuse, with a reason, rather than silently left out.
        if std::fs::metadata(&path).is_ok_and(|m| !m.is_dir()) {
            files.push(path);
        }
    }
    files.sort();
    Ok(files)
}

fn is_manifest_name(name: &str) -> bool {
    !name.starts_with('.')
        && [".yaml", ".yml", ".json"]
            .iter()
            .any(|ext| name.len() > ext.len() && name.ends_with(ext))
}

fn run(
    mut source: FileSource,
    mut state: ScanState,
    inotify: Inotify,
    period: Duration,
    tx: Sender<SourceSnapshot>,
) {
    let mut watch: Option<WatchDescriptor> = None;
    let mut next_resync = Instant::now();
    let mut dirty = true;
    loop {
        if tx.is_closed() {
            return;
        }
        if watch.is_none() {
            watch = add_watch(&inotify, &source.dir);
            dirty |= watch.is_some();
        }
        let now = Instant::now();
        if now >= next_resync {
            dirty = true;
            next_resync = now + period;
        }
        if dirty {
            dirty = false;
            let sent = scan_once(&mut source, &mut state);
            // Parsing a folder of manifests goes tens of KiB deep; between scans this
            // thread holds only the frames of its wait.
            crate::malloc::release_unused_stack();
            if let Some(snapshot) = sent {
                if tx.blocking_send(snapshot).is_err() {
                    return;
                }
            }
        }
        let wait = next_resync
            .saturating_duration_since(Instant::now())
            .min(MAX_WAIT);
        if !readable(&inotify, wait) {
            continue;
        }
        let mut changed = drain(&inotify, &mut watch);
        let burst_start = Instant::now();
        while burst_start.elapsed() < MAX_COALESCE && readable(&inotify, QUIET) {
            changed |= drain(&inotify, &mut watch);
        }
        dirty |= changed;
    }
}

fn add_watch(inotify: &Inotify, dir: &Path) -> Option<WatchDescriptor> {
    if !dir.is_dir() {
        return None;
    }
    let mask = AddWatchFlags::IN_CREATE
        | AddWatchFlags::IN_MODIFY
        | AddWatchFlags::IN_CLOSE_WRITE
        | AddWatchFlags::IN_MOVED_TO
        | AddWatchFlags::IN_MOVED_FROM
        | AddWatchFlags::IN_DELETE
        | AddWatchFlags::IN_DELETE_SELF
        | AddWatchFlags::IN_MOVE_SELF;
    match inotify.add_watch(dir, mask) {
        Ok(wd) => Some(wd),
        Err(e) => {
            log::warn!(
                "watch manifest folder {}: {e}; falling back to the periodic rescan",
                dir.display()
            );
            None
        }
    }
}

fn readable(inotify: &Inotify, timeout: Duration) -> bool {
    let timeout = PollTimeout::try_from(timeout).unwrap_or(PollTimeout::MAX);
    let mut fds = [PollFd::new(inotify.as_fd(), PollFlags::POLLIN)];
    matches!(poll(&mut fds, timeout), Ok(n) if n > 0)
}

/// Reads every pending event; true when one of them can change the set of pods.
fn drain(inotify: &Inotify, watch: &mut Option<WatchDescriptor>) -> bool {
    let mut changed = false;
    loop {
        let events = match inotify.read_events() {
            Ok(events) => events,
            Err(Errno::EAGAIN) => return changed,
            Err(Errno::EINTR) => continue,
            Err(e) => {
                log::warn!("read inotify events: {e}");
                return true;
            }
        };
        for ev in events {
            let m = ev.mask;
            if m.intersects(AddWatchFlags::IN_Q_OVERFLOW) {
                changed = true;
            }
            if m.intersects(
                AddWatchFlags::IN_IGNORED
                    | AddWatchFlags::IN_DELETE_SELF
                    | AddWatchFlags::IN_MOVE_SELF,
            ) {
                // The folder went away or moved: watch whatever next appears at the
                // path instead. Events of a watch already dropped change nothing.
                if *watch == Some(ev.wd) {
                    if m.contains(AddWatchFlags::IN_MOVE_SELF) {
                        let _ = inotify.rm_watch(ev.wd);
                    }
                    *watch = None;
                    changed = true;
                }
                continue;
            }
            if m.contains(AddWatchFlags::IN_ISDIR) {
                continue;
            }
            if ev
                .name
                .as_deref()
                .and_then(|n| n.to_str())
                .is_some_and(is_manifest_name)
            {
                changed = true;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kube::testpki::Scratch;

    fn manifest(name: &str) -> String {
        format!(
            "apiVersion: v1\nkind: Pod\nmetadata:\n  name: {name}\nspec:\n  containers:\n  - name: c\n    image: busybox\n"
        )
    }

    /// A folder that held many pods and then one: what the source keeps between scans
    /// holds room for the one.
    #[test]
    fn pods_that_went_give_their_room_back() {
        let dir = Scratch::new("file-source-shrink");
        for i in 0..64 {
            dir.write(&format!("p{i}.yaml"), &manifest(&format!("p{i}")));
        }
        let mut source = FileSource::new(dir.path().to_path_buf(), "node".into());
        let (pods, errors) = source.scan().expect("scan");
        assert_eq!((pods.len(), errors.len()), (64, 0), "{errors:?}");
        for i in 1..64 {
            std::fs::remove_file(dir.path().join(format!("p{i}.yaml"))).expect("rm");
        }
        let (pods, errors) = source.scan().expect("scan");
        assert_eq!((pods.len(), errors.len()), (1, 0), "{errors:?}");
        assert_eq!(source.first_seen.len(), 1);
        assert!(
            source.first_seen.capacity() < 8,
            "room for {} pods kept",
            source.first_seen.capacity()
        );
    }
}
