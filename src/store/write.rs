//! The write path: every change goes to sled in one transaction, or, while sled cannot
//! take it (a full disk, a failed write), into memory; the store's thread flushes once
//! a second, keeps the headroom, and writes what is held once it can. The last handle
//! to go stops that thread, waits for it and flushes itself, so that once the store is
//! dropped nothing of it writes into its directory (another process may own it then).

use std::sync::atomic::Ordering;
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use sled::transaction::{ConflictableTransactionError, TransactionError, Transactional};

use super::generation;
use super::open::open_sled;
use super::pending::{Op, Pending};
use super::{space, Holding, Inner, Store, StoreError, FLUSH_EVERY, SYNC_EVERY};

impl Store {
    /// The one way anything is written. `ops` are changes (the callers left out what
    /// would change nothing); they go to sled in one transaction, or, while the disk has
    /// no room for sled, into memory to be written when it has.
    pub(super) fn write(&self, ops: Vec<Op>) -> Result<usize, StoreError> {
        if ops.is_empty() {
            return Ok(0);
        }
        let n = ops.len();
        let mut pending = self.pending();
        if pending.holding().is_none() {
            if !self.inner.space.writable() {
                self.inner.start_holding(
                    &mut pending,
                    "no space left on the store's filesystem".into(),
                    false,
                );
            } else {
                match self.with_db(|db| commit(db, &ops)) {
                    Ok(()) => {
                        pending.record(&ops);
                        return Ok(n);
                    }
                    Err(StoreError::Db { source, .. }) if matches!(source, sled::Error::Io(_)) => {
                        let reason = format!("sled could not write: {source}");
                        self.inner.start_holding(&mut pending, reason, true);
                    }
                    Err(e) => return Err(e),
                }
            }
        }
        pending.record(&ops);
        Ok(n)
    }

    /// Makes every write so far durable. While the disk is full the writes stay held
    /// in memory instead, to be written as soon as it has room ([`Store::holding`]
    /// says since when).
    pub fn flush(&self) -> Result<(), StoreError> {
        self.inner.flush()
    }

    /// Hands every write so far to the kernel now, sled's log written out without a
    /// sync: a crash of this process loses none of it, and the filesystem's next
    /// commit (ext4: within 5 s) makes it durable.
    pub fn write_out(&self) -> Result<(), StoreError> {
        self.inner.write_out()
    }

    /// Makes what was only written out durable now, as the store's thread would within
    /// [`SYNC_EVERY`] of the first such write; nothing when all of it is durable (or
    /// held in memory while the disk is full). After a burst, so that the thread has
    /// nothing left to sync once the burst's code has been unmapped: its flush ran
    /// sled's write path again some 15 s later, mapping back 0.6-0.7 MiB of code.
    pub fn make_durable(&self) -> Result<(), StoreError> {
        if self.is_holding() {
            return Ok(());
        }
        if !self.inner.needs_sync() {
            return Ok(());
        }
        self.inner.flush()
    }

    /// Closes sled and opens it again, so that what it holds in memory is made anew
    /// in one short run (after a burst of writes, see `Inner::reopen`).
    pub fn reopen(&self) -> Result<(), StoreError> {
        self.inner.reopen()
    }

    /// Since when and why writes are held in memory (the disk is full), and how many.
    pub fn holding(&self) -> Option<(Holding, usize)> {
        if !self.is_holding() {
            return None;
        }
        let pending = self.pending();
        pending.holding().map(|h| (h.clone(), pending.len()))
    }
}

impl Inner {
    fn start_holding(&self, pending: &mut Pending, reason: String, sled_failed: bool) {
        pending.sled_failed |= sled_failed;
        if pending.hold(reason.clone(), crate::time::now()) {
            self.holding.store(true, Ordering::Release);
            log::error!(
                "store: {reason}; keeping writes in memory until {} has room again (running pods are not affected)",
                self.path.display()
            );
        }
    }

    /// [`Store::flush`], as a group commit: callers that come while a flush runs wait
    /// for it to end, and then one of them flushes for all of them (100 pods stopping
    /// at once cost two or three flushes, not 100). A caller returns once a flush that
    /// began after it called has ended, so what it wrote before calling is durable.
    fn flush(&self) -> Result<(), StoreError> {
        let mut group = self.group.lock().unwrap_or_else(|p| p.into_inner());
        // The flush that covers this caller: the next one to begin.
        let mut wanted = group.begun + 1;
        loop {
            if group.ended >= wanted {
                if group.succeeded >= wanted {
                    return Ok(());
                }
                // The flush this caller waited for failed: try again, for itself.
                wanted = group.begun + 1;
                continue;
            }
            if !group.running {
                group.running = true;
                group.begun += 1;
                let this = group.begun;
                drop(group);
                let result = self.flush_once();
                let mut group = self.group.lock().unwrap_or_else(|p| p.into_inner());
                group.running = false;
                group.ended = this;
                if result.is_ok() {
                    group.succeeded = this;
                }
                self.group_done.notify_all();
                return result;
            }
            group = self
                .group_done
                .wait(group)
                .unwrap_or_else(|p| p.into_inner());
        }
    }

    /// What the store's thread writes each tick: sled's log, as far as the kernel
    /// takes it (`sync_file_range`). The filesystem's next journal commit (ext4: within
    /// 5 s) makes it durable, as it does any file written, at no cost of its own; a
    /// power cut before that loses it, which [`Store::flush`] is for. No generation is
    /// bumped: the last durable one stays a floor of what sled holds.
    fn write_out(&self) -> Result<(), StoreError> {
        if self.is_holding() {
            return Ok(());
        }
        // In order with the durable flushes, which take the same lock.
        let _order = self.generation.lock().unwrap_or_else(|p| p.into_inner());
        let mark = self.pending().mark();
        match self.with_db(flush_sled) {
            Ok(()) => {
                crate::metrics::STORE_FLUSHES.inc();
                self.pending().durable_below(mark);
                self.written_out.store(true, Ordering::Release);
                Ok(())
            }
            Err(e) => self.flush_failed(e),
        }
    }

    /// A flush that failed: sled's write errors hold what follows in memory (sled
    /// refuses writes until it is opened again), anything else is the caller's.
    fn flush_failed(&self, e: StoreError) -> Result<(), StoreError> {
        match e {
            StoreError::Db { source, .. } if matches!(source, sled::Error::Io(_)) => {
                let reason = format!("sled could not flush: {source}");
                let mut pending = self.pending();
                self.start_holding(&mut pending, reason, true);
                Ok(())
            }
            e => Err(e),
        }
    }

    /// One durable flush: sled's, its log file synced, then the generation file.
    fn flush_once(&self) -> Result<(), StoreError> {
        if self.is_holding() {
            return Ok(());
        }
        let mut flushed = self.generation.lock().unwrap_or_else(|p| p.into_inner());
        // Cleared first: a tick's write-out that lands after this flush's sync sets it
        // again.
        let written_out = self.written_out.swap(false, Ordering::AcqRel);
        let next = flushed.saturating_add(1);
        let mark = self.pending().mark();
        match self.with_db(|db| {
            let meta = db.open_tree("meta").map_err(|source| StoreError::Db {
                op: "open tree",
                tree: "meta",
                key: String::new(),
                source,
            })?;
            meta.insert(generation::META_GENERATION, &next.to_be_bytes())
                .map_err(|source| StoreError::Db {
                    op: "write",
                    tree: "meta",
                    key: generation::META_GENERATION.into(),
                    source,
                })?;
            flush_sled(db)?;
            // sled syncs its log with `sync_file_range`: the data only. The log's new
            // size and the blocks it took stay in the filesystem's journal until its
            // next commit (ext4: up to 5 s later), and a power cut before that ends
            // the log where the last commit left it. `fdatasync` commits them (and
            // costs no commit when sled wrote within blocks the log had).
            self.space.sync_log().map_err(|e| StoreError::Db {
                op: "sync the log",
                tree: "*",
                key: String::new(),
                source: sled::Error::Io(e),
            })
        }) {
            Ok(()) => {
                crate::metrics::STORE_FLUSHES.inc();
                self.pending().durable_below(mark);
                // Only once sled holds `next` durably may the file say so. A file that
                // could not be written lags behind sled, which is safe: it is only
                // ever compared as a floor.
                *flushed = next;
                if let Err(e) = generation::write_file(&self.path, next) {
                    log::warn!(
                        "store: record generation {next} in {}: {e}",
                        generation::file_path(&self.path).display()
                    );
                }
                Ok(())
            }
            Err(e) => {
                self.written_out.fetch_or(written_out, Ordering::AcqRel);
                self.flush_failed(e)
            }
        }
    }

    /// One tick of the store's thread: flush what sled holds only in memory, keep the
    /// headroom, and, while holding, write what is held once the disk has room.
    fn tick(&self) {
        if self.is_holding() {
            self.resume();
            return;
        }
        if !self.pending().is_empty() {
            if let Err(e) = self.write_out() {
                log::error!("store: flush: {e}");
            }
        }
        self.space.top_up();
    }

    /// Closes sled and opens it again on the same files. What sled holds in memory
    /// (its tree nodes, page table entries and cache queues, the log buffer it fills)
    /// was allocated while the writes that made it ran; after a burst those blocks lie
    /// scattered through a heap the burst grew, each keeping its page resident. Opened
    /// again once the burst is over, sled rebuilds them in one short run, and the
    /// burst's pages can go back. Does nothing while writes are held in memory; a
    /// failed open holds the writes that follow until sled opens (as a write error
    /// does).
    pub(super) fn reopen(&self) -> Result<(), StoreError> {
        // In order with the flushes, which take the same lock; then pending, then db.
        let _order = self.generation.lock().unwrap_or_else(|p| p.into_inner());
        let mut pending = self.pending();
        if pending.holding().is_some() {
            return Ok(());
        }
        let mut db = self.db.write().unwrap_or_else(|p| p.into_inner());
        // Dropping the last handle writes out what sled holds only in memory.
        drop(db.take());
        match open_sled(&self.path) {
            Ok(fresh) => {
                *db = Some(fresh);
                Ok(())
            }
            Err(e) => {
                drop(db);
                let reason = format!("sled could not be opened again: {e}");
                self.start_holding(&mut pending, reason, true);
                Err(e)
            }
        }
    }

    /// Writes what is held, if the disk has room again for it and for the headroom.
    fn resume(&self) {
        let free = space::free_bytes(&self.path).unwrap_or(0);
        if free < space::MIN_FREE + space::HEADROOM / 2 {
            return;
        }
        // Dropping sled to open it again is only worth it once it can write: if opening
        // failed, even reads would fail until it worked.
        if !self.space.probe() {
            return;
        }
        let mut pending = self.pending();
        if pending.sled_failed {
            // sled refuses every write after a failed one until it is opened again;
            // what it had not made durable is replayed from `pending` below.
            let mut db = self.db.write().unwrap_or_else(|p| p.into_inner());
            drop(db.take());
            match open_sled(&self.path) {
                Ok(fresh) => *db = Some(fresh),
                Err(e) => {
                    log::error!("store: open again after a write error: {e}");
                    return;
                }
            }
            pending.sled_failed = false;
        }
        if self.space.top_up() < space::MIN_TAIL {
            return;
        }
        let ops = pending.all();
        let n = ops.len();
        let written = self.with_db(|db| {
            commit(db, &ops)?;
            db.flush().map(|_| ()).map_err(|source| StoreError::Db {
                op: "flush",
                tree: "*",
                key: String::new(),
                source,
            })
        });
        match written {
            Ok(()) => {
                crate::metrics::STORE_FLUSHES.inc();
                let since = pending.holding().map(|h| h.since);
                pending.clear();
                self.holding.store(false, Ordering::Release);
                log::warn!(
                    "store: {} has room again; wrote the {n} record(s) held in memory{}",
                    self.path.display(),
                    since.map(|s| format!(" since {s}")).unwrap_or_default()
                );
            }
            Err(e) => {
                if let StoreError::Db {
                    source: sled::Error::Io(_),
                    ..
                } = &e
                {
                    pending.sled_failed = true;
                }
                log::warn!("store: writing what is held failed, trying again: {e}");
            }
        }
    }

    /// Whether something was written that no durable flush covers yet: still only in
    /// sled's memory, or written out to the kernel without a sync.
    fn needs_sync(&self) -> bool {
        !self.pending().is_empty() || self.written_out.load(Ordering::Acquire)
    }

    /// What the store's next tick would have written, written by whoever closes the
    /// store once its thread has ended.
    fn close(&self) {
        if self.is_holding() {
            self.resume();
        } else if self.needs_sync() {
            if let Err(e) = self.flush() {
                log::error!("store: flush at close: {e}");
            }
        }
    }
}

/// sled's flush: its log written out (`sync_file_range`).
fn flush_sled(db: &sled::Db) -> Result<(), StoreError> {
    db.flush().map(|_| ()).map_err(|source| StoreError::Db {
        op: "flush",
        tree: "*",
        key: String::new(),
        source,
    })
}

/// Applies `ops` to sled as one transaction (a single op needs none).
fn commit(db: &sled::Db, ops: &[Op]) -> Result<(), StoreError> {
    crate::metrics::STORE_BYTES_WRITTEN.add(
        ops.iter()
            .map(|o| (o.key.len() + o.value.as_ref().map_or(0, Vec::len)) as u64)
            .sum(),
    );
    let db_err = |op: &'static str, o: &Op| {
        let (tree, key) = (o.tree, o.key.clone());
        move |source| StoreError::Db {
            op,
            tree,
            key,
            source,
        }
    };
    if let [op] = ops {
        let tree = db.open_tree(op.tree).map_err(db_err("open tree", op))?;
        return match &op.value {
            Some(v) => tree.insert(&op.key, v.as_slice()).map(|_| ()),
            None => tree.remove(&op.key).map(|_| ()),
        }
        .map_err(db_err("write", op));
    }
    // One transactional view per distinct tree; ops point at their view.
    let mut names: Vec<&'static str> = Vec::new();
    let mut index = Vec::with_capacity(ops.len());
    for op in ops {
        let at = match names.iter().position(|n| *n == op.tree) {
            Some(at) => at,
            None => {
                names.push(op.tree);
                names.len() - 1
            }
        };
        index.push(at);
    }
    let mut trees = Vec::with_capacity(names.len());
    for (name, op) in names.iter().zip(ops) {
        trees.push(db.open_tree(name).map_err(db_err("open tree", op))?);
    }
    let refs: Vec<&sled::Tree> = trees.iter().collect();
    let result = refs.as_slice().transaction(|views| {
        for (op, &at) in ops.iter().zip(&index) {
            let view = &views[at];
            match &op.value {
                Some(v) => {
                    view.insert(op.key.as_bytes(), v.as_slice())?;
                }
                None => {
                    view.remove(op.key.as_bytes())?;
                }
            }
        }
        Ok::<(), ConflictableTransactionError<()>>(())
    });
    match result {
        Ok(()) => Ok(()),
        Err(TransactionError::Storage(source)) => Err(db_err("transaction", &ops[0])(source)),
        Err(TransactionError::Abort(())) => Err(db_err("transaction", &ops[0])(
            sled::Error::Unsupported("transaction aborted".into()),
        )),
    }
}

/// Flushes begun, ended and succeeded, numbered from 1; see [`Inner::flush`].
#[derive(Default)]
pub(super) struct Group {
    running: bool,
    begun: u64,
    ended: u64,
    succeeded: u64,
}

/// The store's thread, a tick every [`FLUSH_EVERY`] while the store is open. The
/// thread holds the store's insides only, never a handle, so the last handle (which
/// holds this) is never dropped on it: that drop stops the thread, waits for a tick
/// under way to end, and does the final flush on the caller's thread. No drop can
/// then leave the thread writing into a directory its owner believes closed.
pub(super) struct Flusher {
    inner: Arc<Inner>,
    stop: Arc<Stop>,
    thread: Option<JoinHandle<()>>,
}

impl Flusher {
    pub(super) fn start(inner: Arc<Inner>) -> Flusher {
        let stop = Arc::new(Stop::default());
        let spawned = std::thread::Builder::new()
            .name("store-flush".into())
            .spawn({
                let (inner, stop) = (inner.clone(), stop.clone());
                move || {
                    // Since when something written out is not yet durable.
                    let mut since = Instant::now();
                    while !stop.wait(FLUSH_EVERY) {
                        inner.tick();
                        if !inner.written_out.load(Ordering::Acquire) {
                            since = Instant::now();
                        } else if since.elapsed() >= SYNC_EVERY {
                            // Durable within this much whatever the filesystem's own
                            // commit interval (a mount with `commit=600`, f2fs).
                            if let Err(e) = inner.flush() {
                                log::error!("store: flush: {e}");
                            }
                            since = Instant::now();
                        }
                        // What this tick's flush replaced is freed by the next one.
                        crossbeam_epoch::pin().flush();
                    }
                }
            });
        let thread = match spawned {
            Ok(t) => Some(t),
            Err(e) => {
                // Writes still become durable at every explicit flush, and at close.
                log::error!("store: start the flush thread: {e}");
                None
            }
        };
        Flusher {
            inner,
            stop,
            thread,
        }
    }
}

impl Drop for Flusher {
    fn drop(&mut self) {
        self.stop.set();
        if let Some(thread) = self.thread.take() {
            // A tick under way ends first: it may be writing into the directory.
            if thread.join().is_err() {
                log::error!(
                    "store: the flush thread of {} panicked",
                    self.inner.path.display()
                );
            }
        }
        self.inner.close();
    }
}

/// Asks the store's thread to stop, waking it at once rather than at its next tick.
#[derive(Default)]
struct Stop {
    stopped: Mutex<bool>,
    wake: Condvar,
}

impl Stop {
    fn set(&self) {
        *self.stopped.lock().unwrap_or_else(|p| p.into_inner()) = true;
        self.wake.notify_all();
    }

    /// Waits `period`; true as soon as the thread is asked to stop.
    fn wait(&self, period: Duration) -> bool {
        let deadline = Instant::now() + period;
        let mut stopped = self.stopped.lock().unwrap_or_else(|p| p.into_inner());
        while !*stopped {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return false;
            }
            stopped = self
                .wake
                .wait_timeout(stopped, left)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::Tree;

    fn generation(store: &Store) -> u64 {
        *store
            .inner
            .generation
            .lock()
            .unwrap_or_else(|p| p.into_inner())
    }

    #[test]
    fn flushes_and_written_bytes_are_counted() {
        let tmp = crate::testutil::TempDir::new("store-metrics");
        let store = Store::open(&tmp.0.join("db")).expect("open");
        let t: Tree<u32> = store.tree("n").expect("tree");
        // The counters are the process's: other tests add to them at the same time.
        let (bytes, flushes) = (
            crate::metrics::STORE_BYTES_WRITTEN.get(),
            crate::metrics::STORE_FLUSHES.get(),
        );
        t.put("counted", &7).expect("put");
        assert!(crate::metrics::STORE_BYTES_WRITTEN.get() >= bytes + "counted".len() as u64);
        store.flush().expect("flush");
        assert!(crate::metrics::STORE_FLUSHES.get() > flushes);
    }

    #[test]
    fn making_durable_syncs_only_what_was_not_yet_durable() {
        let tmp = crate::testutil::TempDir::new("store-durable");
        let store = Store::open(&tmp.0.join("db")).expect("open");
        let t: Tree<u32> = store.tree("n").expect("tree");
        t.put("a", &1).expect("put");
        store.flush().expect("flush");
        // All durable: no flush, no generation bumped, nothing written.
        let g = generation(&store);
        store.make_durable().expect("make durable");
        assert_eq!(generation(&store), g);
        // Written, and written out as the store's tick does: one durable flush.
        t.put("b", &2).expect("put");
        store.write_out().expect("write out");
        store.make_durable().expect("make durable");
        assert_eq!(generation(&store), g + 1);
        store.make_durable().expect("make durable");
        assert_eq!(
            generation(&store),
            g + 1,
            "a second call finds nothing to sync"
        );
        // Written and not yet written out: synced too.
        t.put("c", &3).expect("put");
        store.make_durable().expect("make durable");
        assert_eq!(generation(&store), g + 2);
    }

    #[test]
    fn a_store_opened_again_keeps_every_write_and_takes_those_made_meanwhile() {
        let tmp = crate::testutil::TempDir::new("store-reopen");
        let dir = tmp.0.join("db");
        {
            let store = Store::open(&dir).expect("open");
            let t: Tree<u32> = store.tree("n").expect("tree");
            // Written, never flushed: only in sled's memory and its log buffer.
            for i in 0..200 {
                t.put(&format!("k{i:03}"), &i).expect("put");
            }
            // Another thread writes and reads all along; it waits while sled is closed.
            let writer = {
                let t = t.clone();
                std::thread::spawn(move || {
                    for i in 200..400 {
                        t.put(&format!("k{i:03}"), &i)
                            .expect("put during the reopen");
                        assert_eq!(t.get("k000").expect("get"), Some(0));
                    }
                })
            };
            store.reopen().expect("reopen");
            store.reopen().expect("reopen again");
            writer.join().expect("writer");
            t.put("after", &1).expect("put after");
            assert_eq!(t.keys().expect("keys").len(), 401);
            assert_eq!(t.get("k399").expect("get"), Some(399));
            store.flush().expect("flush");
        }
        // And from the files, as the next start reads them.
        let store = Store::open(&dir).expect("open from disk");
        let t: Tree<u32> = store.tree("n").expect("tree");
        assert_eq!(t.keys().expect("keys").len(), 401);
        assert_eq!(t.get("k123").expect("get"), Some(123));
        assert_eq!(t.get("after").expect("get"), Some(1));
    }

    #[test]
    fn concurrent_flushes_share_a_few_flushes_and_all_writes_survive() {
        const CALLERS: u32 = 32;
        let tmp = crate::testutil::TempDir::new("store-group");
        let dir = tmp.0.join("db");
        {
            let store = Store::open(&dir).expect("open");
            let before = generation(&store);
            let start = Arc::new(std::sync::Barrier::new(CALLERS as usize));
            let threads: Vec<_> = (0..CALLERS)
                .map(|i| {
                    let (store, start) = (store.clone(), start.clone());
                    std::thread::spawn(move || {
                        let t: Tree<u32> = store.tree("n").expect("tree");
                        t.put(&format!("k{i:02}"), &i).expect("put");
                        start.wait();
                        store.flush().expect("flush");
                    })
                })
                .collect();
            for t in threads {
                t.join().expect("caller");
            }
            let flushes = generation(&store) - before;
            assert!(
                flushes <= u64::from(CALLERS / 4),
                "{CALLERS} callers flushing at once cost {flushes} flushes"
            );
        }
        let store = Store::open(&dir).expect("reopen");
        let t: Tree<u32> = store.tree("n").expect("tree");
        for i in 0..CALLERS {
            assert_eq!(t.get(&format!("k{i:02}")).expect("get"), Some(i));
        }
    }
}
