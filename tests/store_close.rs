//! Closing the store: once the last handle is dropped, no thread of the store touches
//! its directory again (another process may own it by then, or a test removes it).
//! Threads are counted by name, so the tests in this file run one at a time.

use support::tempdir;

use std::fs::OpenOptions;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;
use std::sync::{mpsc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use holdfast::store::{generation, Store, Tree};
use tempdir::TempDir;

/// The name the store gives its thread.
const THREAD: &str = "store-flush";

static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|p| p.into_inner())
}

/// Ids of this process's threads named `name`.
fn threads_named(name: &str) -> Vec<String> {
    let mut out = Vec::new();
    for e in std::fs::read_dir("/proc/self/task")
        .expect("read /proc/self/task")
        .flatten()
    {
        let comm = std::fs::read_to_string(e.path().join("comm")).unwrap_or_default();
        if comm.trim_end() == name {
            out.push(e.file_name().to_string_lossy().into_owned());
        }
    }
    out
}

/// Polls `f` until it is true or `within` has passed; whether it became true.
fn wait_for(within: Duration, mut f: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + within;
    loop {
        if f() {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// An open store under `dir` with one write not yet flushed, and its thread's id.
fn open_with_a_write(dir: &Path) -> (Store, String) {
    let before = threads_named(THREAD);
    let store = Store::open(dir).expect("open the store");
    let t: Tree<u32> = store.tree("n").expect("tree");
    t.put("a", &1).expect("put");
    let mut tid = None;
    assert!(
        wait_for(Duration::from_secs(5), || {
            tid = threads_named(THREAD)
                .into_iter()
                .find(|t| !before.contains(t));
            tid.is_some()
        }),
        "the store started no thread named {THREAD}"
    );
    (store, tid.unwrap_or_default())
}

#[test]
fn dropping_the_last_handle_ends_the_stores_thread_before_it_returns() {
    let _serial = serial();
    let tmp = TempDir::new("store-close-thread");
    let dir = tmp.0.join("db");
    let (store, tid) = open_with_a_write(&dir);
    let tree: Tree<u32> = store.tree("n").expect("tree");
    let clone = store.clone();
    drop(store);
    drop(clone);
    assert!(
        threads_named(THREAD).contains(&tid),
        "a tree still holds the store: its thread runs"
    );
    let started = Instant::now();
    drop(tree);
    let took = started.elapsed();
    eprintln!("drop with a write to flush took {took:?}");
    assert!(
        !threads_named(THREAD).contains(&tid),
        "the store's thread ({THREAD}, {tid}) still runs after the last handle was dropped"
    );
    // What was written and not flushed by hand was flushed by the drop.
    let store = Store::open(&dir).expect("reopen");
    let t: Tree<u32> = store.tree("n").expect("tree");
    assert_eq!(t.get("a").expect("get"), Some(1));
    drop(t);
    let started = Instant::now();
    drop(store);
    eprintln!("drop with nothing to flush took {:?}", started.elapsed());
}

/// The store's thread is held inside a flush by a FIFO in place of the generation
/// file (opening it for writing blocks until a reader comes): the
/// drop of the last handle must wait for that flush rather than leave it to run on.
/// The thread writes that file when it syncs what it wrote out, 30 s after the write
/// at the latest.
#[test]
fn a_drop_during_a_flush_waits_for_the_flush() {
    let _serial = serial();
    let tmp = TempDir::new("store-close-fifo");
    let dir = tmp.0.join("db");
    let (store, tid) = open_with_a_write(&dir);
    let fifo = dir.join(generation::FILE);
    std::fs::remove_file(&fifo).expect("remove the generation file");
    nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o600))
        .expect("make the FIFO");
    let syscall = Path::new("/proc/self/task").join(&tid).join("syscall");
    let openat = nix::libc::SYS_openat.to_string();
    let held = wait_for(Duration::from_secs(45), || {
        std::fs::read_to_string(&syscall)
            .map(|s| s.split_whitespace().next() == Some(openat.as_str()))
            .unwrap_or(false)
    });

    let (done_tx, done_rx) = mpsc::channel();
    let dropper = std::thread::spawn(move || {
        drop(store);
        let _ = done_tx.send(Instant::now());
    });
    let returned_while_held = held && done_rx.recv_timeout(Duration::from_millis(500)).is_ok();
    // Let the flush go on whatever happened, so that nothing is left blocked.
    let reader = OpenOptions::new()
        .read(true)
        .custom_flags(nix::libc::O_NONBLOCK)
        .open(&fifo)
        .expect("open the FIFO for reading");
    let finished = returned_while_held || done_rx.recv_timeout(Duration::from_secs(10)).is_ok();
    let _ = dropper.join();
    drop(reader);

    assert!(held, "the store's thread never began its flush");
    assert!(
        !returned_while_held,
        "drop returned while the store's thread was still writing into {}",
        dir.display()
    );
    assert!(finished, "drop did not return once the flush could go on");
    // The flush, let go, found no file of its own there and wrote one in its place.
    assert!(
        std::fs::symlink_metadata(&fifo).is_ok_and(|m| m.is_file()),
        "the flush under way when the store was dropped did not finish before the drop returned"
    );
    assert!(!threads_named(THREAD).contains(&tid));
}
