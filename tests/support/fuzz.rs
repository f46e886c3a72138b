//! A small deterministic mutation fuzzer that runs under plain `cargo test` on stable
//! Rust: a seeded xorshift PRNG, byte-level mutations of a checked-in corpus, each
//! input run in a worker thread with a time bound and panics caught, a global allocator
//! that notices a single allocation over 256 MiB, and every failing input written to
//! `target/fuzz-crashes/<target>/<hash>` so it can be replayed.
//!
//! `HOLDFAST_FUZZ_SECS` is each target's time budget (default 12 s), `HOLDFAST_FUZZ_SEED`
//! replaces the fixed per-target seed. The seed is printed; with the same seed the same
//! inputs come in the same order, so a failure repeats.
#![allow(dead_code)]

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::collections::BTreeMap;
use std::fs;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use sha2::{Digest, Sha256};

/// One allocation larger than this fails the input that asked for it.
pub const ALLOC_LIMIT: usize = 256 << 20;
/// One allocation larger than this is refused outright (the process aborts, naming the
/// size; the printed seed repeats it) rather than risk the machine's memory.
const ALLOC_REFUSE: usize = 1 << 30;
/// Default time budget per target.
const DEFAULT_SECS: u64 = 12;
/// Inputs that reach a new outcome join the corpus, up to this many entries.
const MAX_CORPUS: usize = 512;

thread_local! {
    /// The largest allocation over `ALLOC_LIMIT` this thread made since it was last
    /// taken; const-initialised and without a destructor, so the allocator may read it.
    static BIGGEST: Cell<usize> = const { Cell::new(0) };
}

fn note(size: usize) -> bool {
    if size > ALLOC_LIMIT {
        let _ = BIGGEST.try_with(|b| b.set(b.get().max(size)));
    }
    size <= ALLOC_REFUSE
}

/// The system allocator, noting allocations over `ALLOC_LIMIT` for the thread making
/// them. Installed with `#[global_allocator]` by the fuzz test binary.
pub struct Capped;

#[allow(unsafe_code)]
// SAFETY: every method forwards to `System` with the caller's own arguments, or returns
// null (a permitted answer meaning "out of memory") for a request over ALLOC_REFUSE.
unsafe impl GlobalAlloc for Capped {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if !note(layout.size()) {
            return std::ptr::null_mut();
        }
        // SAFETY: the caller's layout contract is passed on unchanged.
        unsafe { System.alloc(layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        if !note(layout.size()) {
            return std::ptr::null_mut();
        }
        // SAFETY: the caller's layout contract is passed on unchanged.
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` came from `System` through this allocator with this layout.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        if !note(new_size) {
            return std::ptr::null_mut();
        }
        // SAFETY: `ptr` came from `System` through this allocator with this layout.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

/// xorshift64: small, fast, and the same sequence everywhere for one seed.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed.max(1))
    }

    pub fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.0 = x;
        x
    }

    /// A number in `0..n` (0 when n is 0).
    pub fn below(&mut self, n: usize) -> usize {
        if n == 0 {
            0
        } else {
            (self.next() % n as u64) as usize
        }
    }

    pub fn one_in(&mut self, n: usize) -> bool {
        self.below(n) == 0
    }
}

/// Integers that sit on the edges parsers get wrong.
const INTERESTING: [i128; 22] = [
    0,
    1,
    -1,
    127,
    128,
    255,
    256,
    32767,
    65535,
    65536,
    i32::MAX as i128,
    1 << 31,
    u32::MAX as i128,
    1 << 32,
    1 << 53,
    i64::MAX as i128,
    1 << 63,
    u64::MAX as i128,
    i64::MIN as i128,
    -(1 << 31),
    16 * 1024 * 1024,
    99_999_999_999_999_999_999_999,
];

/// What a target is and how its inputs are bounded.
pub struct Target {
    pub name: &'static str,
    /// Tokens the format is made of, inserted and overwritten whole.
    pub dict: &'static [&'static [u8]],
    /// Mutated inputs are cut to this length.
    pub max_len: usize,
    /// An input taking longer than this is a hang.
    pub hang: Duration,
}

/// Runs one input; returns its outcome's kind (a short, normalised description), panics
/// for a defect.
pub type Exec = Box<dyn FnMut(&[u8]) -> String>;

/// The per-target time budget.
pub fn budget() -> Duration {
    let secs = std::env::var("HOLDFAST_FUZZ_SECS")
        .ok()
        .and_then(|s| s.trim().parse::<f64>().ok())
        .filter(|s| s.is_finite() && *s >= 0.0)
        .unwrap_or(DEFAULT_SECS as f64);
    Duration::from_secs_f64(secs)
}

fn seed_for(name: &str) -> u64 {
    if let Some(s) = std::env::var("HOLDFAST_FUZZ_SEED")
        .ok()
        .and_then(|s| s.trim().parse::<u64>().ok())
    {
        return s;
    }
    // FNV-1a of the name: a fixed seed per target.
    name.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3)
    })
}

pub fn repo_path(rel: &str) -> PathBuf {
    crate::repo_root().join(rel)
}

/// The files of a directory, sorted by name; empty when it does not exist.
pub fn files_in(dir: &Path) -> Vec<(String, Vec<u8>)> {
    let mut out = Vec::new();
    if let Ok(rd) = fs::read_dir(dir) {
        for e in rd.flatten() {
            let p = e.path();
            if p.is_file() {
                if let Ok(bytes) = fs::read(&p) {
                    out.push((e.file_name().to_string_lossy().into_owned(), bytes));
                }
            }
        }
    }
    out.sort();
    out
}

/// The checked-in corpus of a target.
pub fn corpus(name: &str) -> Vec<Vec<u8>> {
    let dir = repo_path(&format!("tests/fuzz/corpus/{name}"));
    let seeds: Vec<Vec<u8>> = files_in(&dir).into_iter().map(|(_, b)| b).collect();
    assert!(!seeds.is_empty(), "no corpus in {}", dir.display());
    seeds
}

pub fn hash_hex(data: &[u8]) -> String {
    Sha256::digest(data)
        .iter()
        .take(12)
        .map(|b| format!("{b:02x}"))
        .collect()
}

fn crash_dir(name: &str) -> PathBuf {
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| repo_path("target"));
    let target = if target.is_relative() {
        repo_path("").join(target)
    } else {
        target
    };
    target.join("fuzz-crashes").join(name)
}

fn save_crash(name: &str, input: &[u8]) -> PathBuf {
    let dir = crash_dir(name);
    let path = dir.join(hash_hex(input));
    if let Err(e) = fs::create_dir_all(&dir).and_then(|_| fs::write(&path, input)) {
        eprintln!(
            "fuzz {name}: could not save the input to {}: {e}",
            path.display()
        );
    }
    path
}

/// An error message with what varies between inputs taken out: digits, quoted text
/// and paths.
pub fn kind(msg: &str) -> String {
    let mut out = String::new();
    let mut quote: Option<char> = None;
    let mut in_path = false;
    let mut escaped = false;
    for c in msg.chars() {
        if let Some(q) = quote {
            if escaped {
                escaped = false;
            } else if c == '\\' {
                escaped = true;
            } else if c == q {
                quote = None;
            }
            continue;
        }
        if in_path {
            if c.is_whitespace() || c == ':' || c == ',' || c == ')' {
                in_path = false;
            } else {
                continue;
            }
        }
        match c {
            '"' | '`' => {
                quote = Some(c);
                out.push_str("<q>");
            }
            '/' if out.is_empty() || out.ends_with(' ') || out.ends_with('(') => {
                in_path = true;
                out.push_str("<path>");
            }
            '0'..='9' => {
                if !out.ends_with('#') {
                    out.push('#');
                }
            }
            c => out.push(c),
        }
        if out.len() > 72 {
            break;
        }
    }
    out
}

/// The message of a caught panic.
pub fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = payload.downcast_ref::<&str>() {
        (*s).to_string()
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else {
        "a panic without a message".to_string()
    }
}

enum Verdict {
    Kind(String),
    Panic(String),
    Alloc(usize),
}

thread_local! {
    /// Where the last panic of this thread happened.
    static PANIC_AT: Cell<Option<String>> = const { Cell::new(None) };
}

/// Panics in fuzz workers are expected and caught: they print nothing (a backtrace
/// takes long enough to look like a hang) and only note where they happened; every
/// other thread keeps the default report.
fn quiet_worker_panics() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let default = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            let worker = std::thread::current()
                .name()
                .is_some_and(|n| n.starts_with("fuzz-"));
            if worker {
                if let Some(l) = info.location() {
                    PANIC_AT.with(|p| p.set(Some(format!("{}:{}", l.file(), l.line()))));
                }
            } else {
                default(info);
            }
        }));
    });
}

/// CPU time this thread has used.
fn thread_cpu() -> Duration {
    use nix::time::{clock_gettime, ClockId};
    clock_gettime(ClockId::CLOCK_THREAD_CPUTIME_ID)
        .map(Duration::from)
        .unwrap_or_default()
}

/// A thread that runs inputs one at a time, so a hang can be timed from outside.
/// Dropping it ends the thread and waits until the `Exec` and all it holds (stores,
/// temporary directories) are gone, unless an input hung it.
struct Worker {
    tx: Option<mpsc::Sender<Vec<u8>>>,
    rx: mpsc::Receiver<(Verdict, Duration)>,
    hung: Cell<bool>,
}

/// How long a dropped worker is waited for to let go of what its `Exec` holds.
const WORKER_END: Duration = Duration::from_secs(30);

impl Worker {
    fn start(name: &str, make: impl FnOnce() -> Exec + Send + 'static) -> Worker {
        quiet_worker_panics();
        let (in_tx, in_rx) = mpsc::channel::<Vec<u8>>();
        let (out_tx, out_rx) = mpsc::channel();
        std::thread::Builder::new()
            .name(format!("fuzz-{name}"))
            .stack_size(8 << 20)
            .spawn(move || {
                let mut exec = make();
                for input in in_rx {
                    BIGGEST.with(|b| b.set(0));
                    let cpu_before = thread_cpu();
                    let result = catch_unwind(AssertUnwindSafe(|| exec(&input)));
                    let cpu = thread_cpu().saturating_sub(cpu_before);
                    let biggest = BIGGEST.with(|b| b.replace(0));
                    let verdict = match result {
                        Err(p) => {
                            let at = PANIC_AT
                                .with(|a| a.take())
                                .map(|l| format!(" at {l}"))
                                .unwrap_or_default();
                            Verdict::Panic(format!("{}{at}", panic_message(p.as_ref())))
                        }
                        Ok(_) if biggest > 0 => Verdict::Alloc(biggest),
                        Ok(k) => Verdict::Kind(k),
                    };
                    if out_tx.send((verdict, cpu)).is_err() {
                        break;
                    }
                }
                // The other end learns the thread is done (its receiver disconnects)
                // only once what the `Exec` holds is gone.
                drop(exec);
                drop(out_tx);
            })
            .expect("start the fuzz worker thread");
        Worker {
            tx: Some(in_tx),
            rx: out_rx,
            hung: Cell::new(false),
        }
    }

    /// The outcome's kind, or what is wrong with the input.
    /// The outcome's kind, or what is wrong with the input. An input is a hang when
    /// the worker spends more than `hang` of CPU time on it (CPU time, so that a busy
    /// machine does not make a slow input of a fast one), or gives no answer in ten
    /// times that (blocked for good).
    fn run(&self, input: &[u8], hang: Duration) -> Result<String, String> {
        self.tx
            .as_ref()
            .ok_or_else(|| "the worker thread is gone".to_string())?
            .send(input.to_vec())
            .map_err(|_| "the worker thread is gone".to_string())?;
        match self.rx.recv_timeout(hang * 10) {
            Ok((_, cpu)) if cpu > hang => Err(format!(
                "hang: {:.2} s of CPU time on one input (more than {hang:?})",
                cpu.as_secs_f64()
            )),
            Ok((Verdict::Kind(k), _)) => Ok(k),
            Ok((Verdict::Panic(m), _)) => Err(format!("panicked: {m}")),
            Ok((Verdict::Alloc(n), _)) => Err(format!(
                "allocated {n} bytes at once (more than {ALLOC_LIMIT})"
            )),
            Err(mpsc::RecvTimeoutError::Timeout) => {
                self.hung.set(true);
                Err(format!("hang: no answer within {:?}", hang * 10))
            }
            Err(mpsc::RecvTimeoutError::Disconnected) => Err("the worker thread died".to_string()),
        }
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        drop(self.tx.take());
        if self.hung.get() {
            return;
        }
        let deadline = Instant::now() + WORKER_END;
        loop {
            match self
                .rx
                .recv_timeout(deadline.saturating_duration_since(Instant::now()))
            {
                Ok(_) => continue,
                Err(mpsc::RecvTimeoutError::Disconnected) => return,
                Err(mpsc::RecvTimeoutError::Timeout) => {
                    eprintln!(
                        "fuzz: the worker thread did not end within {WORKER_END:?}; what it holds may be left behind"
                    );
                    return;
                }
            }
        }
    }
}

/// `exec`, with `last` dropped only after it and all it holds: a temporary directory
/// that a store (whose drop still flushes into it) or a runtime lives in.
pub fn then_drop<T: 'static>(exec: Exec, last: T) -> Exec {
    /// Fields are dropped in the order they are declared.
    struct Ordered<T> {
        exec: Exec,
        _last: T,
    }
    impl<T> Ordered<T> {
        fn call(&mut self, input: &[u8]) -> String {
            (self.exec)(input)
        }
    }
    let mut ordered = Ordered { exec, _last: last };
    // A method call captures `ordered` whole; `ordered.exec` alone would leave `_last`
    // to be dropped here.
    Box::new(move |input| ordered.call(input))
}

/// What one fuzzing run did.
pub struct Report {
    pub executions: u64,
    pub elapsed: Duration,
    /// Outcome kind → how many inputs had it.
    pub kinds: BTreeMap<String, u64>,
}

impl Report {
    pub fn print(&self, name: &str) {
        eprintln!(
            "fuzz {name}: {} executions in {:.1} s, {} distinct outcomes",
            self.executions,
            self.elapsed.as_secs_f64(),
            self.kinds.len()
        );
        for (k, n) in &self.kinds {
            eprintln!("fuzz {name}:   {n:>8}  {k}");
        }
    }
}

/// Fuzzes `target` for the budget: every seed as it is first, then mutants. Panics,
/// naming the saved input, at the first failure.
pub fn fuzz(
    target: &Target,
    seeds: Vec<Vec<u8>>,
    make: impl FnOnce() -> Exec + Send + 'static,
) -> Report {
    let seed = seed_for(target.name);
    let budget = budget();
    eprintln!(
        "fuzz {}: seed {seed} (HOLDFAST_FUZZ_SEED={seed} repeats it), budget {:.1} s, {} seeds",
        target.name,
        budget.as_secs_f64(),
        seeds.len()
    );
    let worker = Worker::start(target.name, make);
    let mut rng = Rng::new(seed);
    let mut kinds = BTreeMap::new();
    let mut corpus = seeds;
    let start = Instant::now();
    let mut executions = 0u64;
    let fail = |input: &[u8], why: String, executions: u64| {
        let path = save_crash(target.name, input);
        format!(
            "fuzz {}: {why}\n  input saved to {}\n  seed {seed}, after {executions} executions",
            target.name,
            path.display()
        )
    };
    for (i, input) in corpus.iter().enumerate() {
        match worker.run(input, target.hang) {
            Ok(k) => *kinds.entry(k).or_insert(0) += 1,
            Err(why) => panic!("{}", fail(input, format!("seed {i}: {why}"), executions)),
        }
        executions += 1;
    }
    while start.elapsed() < budget {
        let mut input = corpus[rng.below(corpus.len())].clone();
        for _ in 0..1 + rng.below(4) {
            mutate(&mut rng, &mut input, &corpus, target);
        }
        input.truncate(target.max_len);
        executions += 1;
        match worker.run(&input, target.hang) {
            Ok(k) => {
                let n = kinds.entry(k).or_insert(0);
                *n += 1;
                if *n == 1 && corpus.len() < MAX_CORPUS {
                    corpus.push(input);
                }
            }
            Err(why) => panic!("{}", fail(&input, why, executions)),
        }
    }
    let report = Report {
        executions,
        elapsed: start.elapsed(),
        kinds,
    };
    report.print(target.name);
    report
}

/// Runs every file under `dir` once; panics listing each that fails.
pub fn replay(target: &Target, dir: &Path, make: impl FnOnce() -> Exec + Send + 'static) {
    let inputs = files_in(dir);
    let worker = Worker::start(target.name, make);
    let mut failures = Vec::new();
    for (file, input) in &inputs {
        let start = Instant::now();
        let result = worker.run(input, target.hang);
        eprintln!(
            "fuzz {}: {file}: {:?} in {:.3} s",
            target.name,
            result,
            start.elapsed().as_secs_f64()
        );
        if let Err(why) = result {
            failures.push(format!("{}/{file}: {why}", dir.display()));
            // A hung worker answers nothing more.
            if why.contains("no answer") {
                break;
            }
        }
    }
    assert!(
        failures.is_empty(),
        "fuzz {}: {} of {} regression inputs fail:\n{}",
        target.name,
        failures.len(),
        inputs.len(),
        failures.join("\n")
    );
    eprintln!(
        "fuzz {}: {} regression inputs pass",
        target.name,
        inputs.len()
    );
}

fn range(rng: &mut Rng, len: usize) -> (usize, usize) {
    let start = rng.below(len + 1);
    let most = if rng.one_in(4) { 4096 } else { 32 };
    let max = (len - start).min(most);
    let n = rng.below(max + 1);
    (start, start + n)
}

/// One mutation, in place.
pub fn mutate(rng: &mut Rng, data: &mut Vec<u8>, corpus: &[Vec<u8>], target: &Target) {
    let len = data.len();
    match rng.below(14) {
        // Bit flip.
        0 if len > 0 => {
            let i = rng.below(len);
            data[i] ^= 1 << rng.below(8);
        }
        // A random byte.
        1 if len > 0 => {
            let i = rng.below(len);
            data[i] = rng.next() as u8;
        }
        // Insert random bytes.
        2 => {
            let at = rng.below(len + 1);
            let n = 1 + rng.below(8);
            let bytes: Vec<u8> = (0..n).map(|_| rng.next() as u8).collect();
            data.splice(at..at, bytes);
        }
        // Delete a range.
        3 if len > 0 => {
            let (a, b) = range(rng, len);
            data.drain(a..b);
        }
        // Duplicate a range somewhere else.
        4 if len > 0 => {
            let (a, b) = range(rng, len);
            let chunk = data[a..b].to_vec();
            let at = rng.below(len + 1);
            data.splice(at..at, chunk);
        }
        // Splice from another corpus entry: insert or overwrite.
        5 => {
            let other = &corpus[rng.below(corpus.len())];
            if other.is_empty() {
                return;
            }
            let (a, b) = range(rng, other.len());
            let at = rng.below(len + 1);
            if rng.one_in(2) {
                data.splice(at..at, other[a..b].iter().copied());
            } else {
                let end = (at + (b - a)).min(len);
                data.splice(at..end, other[a..b].iter().copied());
            }
        }
        // An interesting integer in text, replacing a run of digits if there is one.
        6 => {
            let v = INTERESTING[rng.below(INTERESTING.len())];
            let text = v.to_string().into_bytes();
            let digits: Vec<usize> = (0..len).filter(|&i| data[i].is_ascii_digit()).collect();
            if digits.is_empty() || rng.one_in(4) {
                let at = rng.below(len + 1);
                data.splice(at..at, text);
            } else {
                let mut a = digits[rng.below(digits.len())];
                while a > 0 && data[a - 1].is_ascii_digit() {
                    a -= 1;
                }
                let mut b = a;
                while b < len && data[b].is_ascii_digit() {
                    b += 1;
                }
                if a > 0 && data[a - 1] == b'-' {
                    a -= 1;
                }
                data.splice(a..b, text);
            }
        }
        // An interesting integer in binary, big or little endian, 1 to 8 bytes.
        7 if len > 0 => {
            let v = INTERESTING[rng.below(INTERESTING.len())] as u64;
            let width = [1, 2, 4, 8][rng.below(4)];
            let bytes = if rng.one_in(2) {
                v.to_be_bytes()[8 - width..].to_vec()
            } else {
                v.to_le_bytes()[..width].to_vec()
            };
            let at = rng.below(len);
            let end = (at + width).min(len);
            data.splice(at..end, bytes);
        }
        // Truncate.
        8 if len > 0 => {
            let at = rng.below(len);
            data.truncate(at);
        }
        // Repeat a chunk many times.
        9 if len > 0 => {
            let (a, b) = range(rng, len.min(64));
            let chunk = data[a..b].to_vec();
            if chunk.is_empty() {
                return;
            }
            let most = if rng.one_in(8) { 2000 } else { 32 };
            let times = 2 + rng.below(most);
            let mut rep = Vec::with_capacity(chunk.len() * times);
            for _ in 0..times {
                rep.extend_from_slice(&chunk);
            }
            data.splice(b..b, rep);
        }
        // Deep nesting.
        10 => {
            const OPEN: [&[u8]; 5] = [b"[", b"{\"a\":", b"{a: ", b"- ", b"!!map {x: "];
            let open = OPEN[rng.below(OPEN.len())];
            let most = if rng.one_in(4) { 4000 } else { 200 };
            let depth = 16 + rng.below(most);
            let at = rng.below(len + 1);
            let mut nest = Vec::with_capacity(open.len() * depth);
            for _ in 0..depth {
                nest.extend_from_slice(open);
            }
            data.splice(at..at, nest);
        }
        // A dictionary token, inserted or overwriting.
        11 | 12 if !target.dict.is_empty() => {
            let tok = target.dict[rng.below(target.dict.len())];
            let at = rng.below(len + 1);
            if rng.one_in(2) {
                data.splice(at..at, tok.iter().copied());
            } else {
                let end = (at + tok.len()).min(len);
                data.splice(at..end, tok.iter().copied());
            }
        }
        // Swap two bytes.
        _ if len > 1 => {
            let (i, j) = (rng.below(len), rng.below(len));
            data.swap(i, j);
        }
        _ => {
            data.push(rng.next() as u8);
        }
    }
}

/// Rewrites the header checksum of every tar header found by walking `data` block by
/// block, so a mutated archive reaches the code past the tar reader's own check.
pub fn fix_tar_checksums(data: &mut [u8]) {
    let mut at = 0usize;
    while at + 512 <= data.len() {
        let header = &mut data[at..at + 512];
        if header.iter().all(|&b| b == 0) {
            at += 512;
            continue;
        }
        // A size that is not a number would stop the tar reader at this header; zero
        // lets it go on to the entries after it.
        if octal(&header[124..136]).is_none() {
            header[124..136].copy_from_slice(b"00000000000\0");
        }
        header[148..156].fill(b' ');
        let sum: u32 = header.iter().map(|&b| u32::from(b)).sum();
        let text = format!("{sum:06o}\0 ");
        header[148..156].copy_from_slice(&text.as_bytes()[..8]);
        let size = octal(&header[124..136]).unwrap_or(0);
        let blocks = size.div_ceil(512);
        let Some(next) = blocks
            .checked_mul(512)
            .and_then(|n| n.checked_add(512))
            .and_then(|n| usize::try_from(n).ok())
            .and_then(|n| at.checked_add(n))
        else {
            return;
        };
        at = next;
    }
}

fn octal(field: &[u8]) -> Option<u64> {
    let text = std::str::from_utf8(field).ok()?;
    let text = text.trim_matches(|c: char| c == '\0' || c == ' ');
    u64::from_str_radix(text, 8).ok()
}
