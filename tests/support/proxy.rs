//! A TCP proxy on 127.0.0.1 that stands for a site's uplink: the agent's kubeconfig
//! points at it, it forwards to the apiserver double, and a test switches it at any
//! moment between
//!
//! - `Pass`: bytes flow both ways; connections held by a blackhole go on where they
//!   stopped (a short glitch the TCP stack rides out);
//! - `Blackhole`: new connections are accepted and held, nothing is forwarded in either
//!   direction, and open connections stall (a cable pulled, a radio link gone);
//! - `Reset`: every open connection and each new one is closed with a RST (a NAT or
//!   firewall that forgot the flows, or the end of an outage so long that every client
//!   and server timeout has fired).
//!
//! Switching to `Blackhole` or `Reset` takes effect before `set_mode` returns: no byte is
//! forwarded after it. Threads end by themselves once the proxy is dropped.
//!
//! `cut_after(n)` resets the first connection that carries more than `n` bytes from the
//! upstream, after exactly `n` of them: a download cut off midway.

#![allow(dead_code)]

use std::collections::HashSet;
use std::io::{ErrorKind, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, RwLock, Weak};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// How long a pump waits in one read before it looks at the mode again; also the
/// longest `set_mode` waits for a read in flight.
const POLL: Duration = Duration::from_millis(20);
/// A peer that takes no bytes for this long gets its connection reset: the stream
/// cannot be kept whole once a write is cut short.
const WRITE_TIMEOUT: Duration = Duration::from_secs(10);
/// How long `set_mode(Reset)` waits for open connections to be gone.
const RESET_WAIT: Duration = Duration::from_secs(5);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    Pass,
    Blackhole,
    Reset,
}

struct Shared {
    upstream: SocketAddr,
    /// Pumps forward under a read guard; `set_mode` takes the write guard, so it returns
    /// only once no forward that began under the old mode is in flight.
    mode: RwLock<Mode>,
    stop: AtomicBool,
    accepted: AtomicUsize,
    next_id: AtomicU64,
    /// Ids of connections not yet closed.
    open: Mutex<HashSet<u64>>,
    /// Armed by `cut_after`: the byte count after which a connection is cut, once.
    cut: Mutex<Option<u64>>,
    cuts: AtomicUsize,
    /// Bytes and reads carried, `[up, down]` (client → upstream, upstream → client).
    bytes: [AtomicU64; 2],
    reads: [AtomicU64; 2],
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Shared {
    fn mode(&self) -> Mode {
        *self.mode.read().unwrap_or_else(PoisonError::into_inner)
    }

    fn stopping(&self) -> bool {
        self.stop.load(Ordering::SeqCst)
    }
}

/// Bytes (TCP payload) the proxy carried each way, the reads that carried them (about
/// one TCP segment each for small messages) and the connections accepted.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Traffic {
    pub up: u64,
    pub down: u64,
    pub reads_up: u64,
    pub reads_down: u64,
    pub connections: u64,
}

impl Traffic {
    /// What was carried since `before`.
    pub fn since(&self, before: &Traffic) -> Traffic {
        Traffic {
            up: self.up - before.up,
            down: self.down - before.down,
            reads_up: self.reads_up - before.reads_up,
            reads_down: self.reads_down - before.reads_down,
            connections: self.connections - before.connections,
        }
    }
}

/// What [`Proxy::threads`] gives: whether every thread the proxy started has ended
/// (each holds the proxy's shared state until it returns).
pub struct Threads(Weak<Shared>);

impl Threads {
    pub fn ended(&self) -> bool {
        self.0.strong_count() == 0
    }
}

/// The running proxy. Dropping it stops accepting and ends every connection.
pub struct Proxy {
    shared: Arc<Shared>,
    addr: SocketAddr,
    accept: Option<JoinHandle<()>>,
}

impl Proxy {
    /// Listens on a free port of 127.0.0.1 and forwards to `upstream`, in `Pass` mode.
    pub fn start(upstream: SocketAddr) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind the proxy on 127.0.0.1");
        let addr = listener.local_addr().expect("proxy address");
        let shared = Arc::new(Shared {
            upstream,
            mode: RwLock::new(Mode::Pass),
            stop: AtomicBool::new(false),
            accepted: AtomicUsize::new(0),
            next_id: AtomicU64::new(0),
            open: Mutex::new(HashSet::new()),
            cut: Mutex::new(None),
            cuts: AtomicUsize::new(0),
            bytes: [AtomicU64::new(0), AtomicU64::new(0)],
            reads: [AtomicU64::new(0), AtomicU64::new(0)],
        });
        let s = shared.clone();
        let accept = std::thread::Builder::new()
            .name("proxy-accept".into())
            .spawn(move || accept_loop(s, listener))
            .expect("start the proxy's accept thread");
        Proxy {
            shared,
            addr,
            accept: Some(accept),
        }
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `https://127.0.0.1:<port>`: the server a kubeconfig names to go through the proxy.
    pub fn url(&self) -> String {
        format!("https://{}", self.addr)
    }

    pub fn mode(&self) -> Mode {
        self.shared.mode()
    }

    /// A watch on the proxy's threads that outlives the proxy.
    pub fn threads(&self) -> Threads {
        Threads(Arc::downgrade(&self.shared))
    }

    /// Switches the mode. `Reset` returns once every connection open before the call
    /// has been reset (or after a few seconds, with a panic if one is still open).
    pub fn set_mode(&self, mode: Mode) {
        let before: HashSet<u64> = lock(&self.shared.open).clone();
        *self
            .shared
            .mode
            .write()
            .unwrap_or_else(PoisonError::into_inner) = mode;
        if mode != Mode::Reset {
            return;
        }
        let deadline = Instant::now() + RESET_WAIT;
        loop {
            let left = lock(&self.shared.open).intersection(&before).count();
            if left == 0 {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "proxy: {left} connection(s) still open {RESET_WAIT:?} after a reset"
            );
            std::thread::sleep(POLL);
        }
    }

    /// A long outage ends: every connection from before is reset, then new ones pass.
    pub fn restore_after_outage(&self) {
        self.set_mode(Mode::Reset);
        self.set_mode(Mode::Pass);
    }

    /// The next connection to carry more than `bytes` from the upstream is reset after
    /// exactly `bytes` of them (once).
    pub fn cut_after(&self, bytes: u64) {
        *lock(&self.shared.cut) = Some(bytes);
    }

    /// Connections cut by `cut_after` so far.
    pub fn cuts(&self) -> usize {
        self.shared.cuts.load(Ordering::SeqCst)
    }

    /// Connections accepted so far, whatever became of them.
    pub fn connections(&self) -> usize {
        self.shared.accepted.load(Ordering::SeqCst)
    }

    /// What the proxy has carried so far.
    pub fn traffic(&self) -> Traffic {
        let get = |a: &[AtomicU64; 2], i: usize| a[i].load(Ordering::SeqCst);
        Traffic {
            up: get(&self.shared.bytes, 0),
            down: get(&self.shared.bytes, 1),
            reads_up: get(&self.shared.reads, 0),
            reads_down: get(&self.shared.reads, 1),
            connections: self.connections() as u64,
        }
    }

    /// Connections accepted and not yet closed.
    pub fn open_connections(&self) -> usize {
        lock(&self.shared.open).len()
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::SeqCst);
        // Wake the accept loop; it sees the stop flag and ends.
        let _ = TcpStream::connect_timeout(&self.addr, Duration::from_secs(1));
        if let Some(t) = self.accept.take() {
            let _ = t.join();
        }
    }
}

fn accept_loop(shared: Arc<Shared>, listener: TcpListener) {
    for conn in listener.incoming() {
        if shared.stopping() {
            return;
        }
        let Ok(client) = conn else { continue };
        shared.accepted.fetch_add(1, Ordering::SeqCst);
        let id = shared.next_id.fetch_add(1, Ordering::SeqCst);
        lock(&shared.open).insert(id);
        let s = shared.clone();
        let spawned = std::thread::Builder::new()
            .name(format!("proxy-conn-{id}"))
            .spawn(move || {
                serve(&s, client);
                lock(&s.open).remove(&id);
            });
        if spawned.is_err() {
            lock(&shared.open).remove(&id);
        }
    }
}

/// Closes with a RST rather than a FIN: SO_LINGER on with a zero timeout makes the
/// last close of the socket abortive.
fn abort(stream: TcpStream) {
    let linger = nix::libc::linger {
        l_onoff: 1,
        l_linger: 0,
    };
    let _ = nix::sys::socket::setsockopt(&stream, nix::sys::socket::sockopt::Linger, &linger);
    drop(stream);
}

fn serve(shared: &Shared, client: TcpStream) {
    // Held until the link lets the connection through.
    loop {
        if shared.stopping() {
            return;
        }
        match shared.mode() {
            Mode::Pass => break,
            Mode::Blackhole => std::thread::sleep(POLL),
            Mode::Reset => return abort(client),
        }
    }
    let Ok(upstream) = TcpStream::connect_timeout(&shared.upstream, Duration::from_secs(5)) else {
        return abort(client);
    };
    for s in [&client, &upstream] {
        let _ = s.set_nodelay(true);
        let _ = s.set_read_timeout(Some(POLL));
        let _ = s.set_write_timeout(Some(WRITE_TIMEOUT));
    }
    let dead = AtomicBool::new(false);
    std::thread::scope(|scope| {
        scope.spawn(|| pump(shared, &upstream, &client, &dead, true));
        pump(shared, &client, &upstream, &dead, false);
    });
    if dead.load(Ordering::SeqCst) {
        abort(client);
        abort(upstream);
    }
}

/// Forwards `from` to `to` while the mode lets it; sets `dead` when the connection is to
/// be reset (a reset, a write cut short, a broken side) and ends when the other
/// direction did so, at `from`'s end of stream, or when the proxy stops.
fn pump(shared: &Shared, from: &TcpStream, to: &TcpStream, dead: &AtomicBool, downstream: bool) {
    let mut buf = vec![0u8; 16 * 1024];
    let mut carried = 0u64;
    loop {
        if shared.stopping() || dead.load(Ordering::SeqCst) {
            return;
        }
        let mode = shared.mode.read().unwrap_or_else(PoisonError::into_inner);
        match *mode {
            Mode::Reset => {
                dead.store(true, Ordering::SeqCst);
                return;
            }
            Mode::Blackhole => {
                drop(mode);
                std::thread::sleep(POLL);
                continue;
            }
            Mode::Pass => {}
        }
        let mut reader = from;
        match reader.read(&mut buf) {
            Ok(0) => {
                let _ = to.shutdown(Shutdown::Write);
                return;
            }
            Ok(n) => {
                let mut writer = to;
                let mut n = n;
                let mut cut = false;
                if downstream {
                    let mut armed = lock(&shared.cut);
                    if let Some(limit) = *armed {
                        if carried + n as u64 > limit {
                            n = (limit - carried) as usize;
                            cut = true;
                            *armed = None;
                            shared.cuts.fetch_add(1, Ordering::SeqCst);
                        }
                    }
                }
                carried += n as u64;
                let dir = usize::from(downstream);
                shared.bytes[dir].fetch_add(n as u64, Ordering::SeqCst);
                shared.reads[dir].fetch_add(1, Ordering::SeqCst);
                if writer.write_all(&buf[..n]).is_err() || cut {
                    let _ = writer.flush();
                    dead.store(true, Ordering::SeqCst);
                    return;
                }
            }
            Err(e)
                if matches!(
                    e.kind(),
                    ErrorKind::WouldBlock | ErrorKind::TimedOut | ErrorKind::Interrupted
                ) => {}
            Err(_) => {
                dead.store(true, Ordering::SeqCst);
                return;
            }
        }
        drop(mode);
    }
}
