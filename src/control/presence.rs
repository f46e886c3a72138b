//! Whether an agent runs on a root dir: it holds an exclusive `flock` on
//! `<root>/agent.lock` for as long as it lives (the kernel drops it when the process
//! dies, however it dies, so there is no stale pid to misread).

use std::fs::{File, OpenOptions};
use std::path::Path;
use std::time::{Duration, Instant};

use nix::errno::Errno;
use nix::fcntl::{Flock, FlockArg};

const LOCK_FILE: &str = "agent.lock";

/// Held by a running agent.
pub struct AgentLock {
    _lock: Flock<File>,
}

fn open(root_dir: &Path) -> std::io::Result<File> {
    OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(root_dir.join(LOCK_FILE))
}

/// Takes the agent lock. A CLI that checks for an agent holds it for an instant, so a
/// held lock is tried again for `within` before it counts as another agent.
pub fn lock(root_dir: &Path, within: Duration) -> std::io::Result<AgentLock> {
    let deadline = Instant::now() + within;
    loop {
        match Flock::lock(open(root_dir)?, FlockArg::LockExclusiveNonblock) {
            Ok(lock) => return Ok(AgentLock { _lock: lock }),
            Err((_, Errno::EWOULDBLOCK)) if Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(20))
            }
            Err((_, Errno::EWOULDBLOCK)) => {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::WouldBlock,
                    format!(
                        "another holdfast agent is running with root dir {}",
                        root_dir.display()
                    ),
                ))
            }
            Err((_, e)) => return Err(std::io::Error::from(e)),
        }
    }
}

/// Whether an agent (running or starting) holds the lock on `root_dir`.
pub fn agent_running(root_dir: &Path) -> bool {
    let Ok(file) = open(root_dir) else {
        return false;
    };
    matches!(
        Flock::lock(file, FlockArg::LockExclusiveNonblock),
        Err((_, Errno::EWOULDBLOCK))
    )
}
