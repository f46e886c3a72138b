//! Room on disk for the store when the filesystem fills up.
//!
//! sled 0.34 treats the first failed write of its log as fatal until the database is
//! opened again, and it writes a snapshot file while opening. So the store keeps
//! [`HEADROOM`] bytes allocated past the end of sled's log file (`fallocate` with
//! `KEEP_SIZE`: real blocks, invisible in the file's size). sled's writes land there
//! even when something else (container logs, images) has taken every free block, and a
//! store opened on a full disk releases that room so sled can write its snapshot.
//! Writes are given to sled only while it has room ([`Space::writable`]); otherwise the
//! store holds them in memory until the disk has room again.

use std::fs::{File, OpenOptions};
use std::os::fd::AsRawFd;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use nix::fcntl::{fallocate, FallocateFlags};

/// Bytes kept allocated past the end of sled's log file.
pub const HEADROOM: u64 = 2 * 1024 * 1024;
/// With less free space than this on the filesystem, sled is given a write only when
/// its file still has [`MIN_TAIL`] bytes of headroom.
pub const MIN_FREE: u64 = 1024 * 1024;
/// Headroom below which a write is held rather than risked on a full disk.
pub const MIN_TAIL: u64 = 256 * 1024;

/// sled's log file inside the store dir.
const LOG_FILE: &str = "db";

/// Bytes still free for ordinary writes on the filesystem holding `dir`, as `df` and
/// the kubelet's nodefs.available count them. Root may write a little past that (the
/// blocks ext4 keeps for root), but not all of what `f_bfree` counts: ext4 keeps part of
/// it for its own metadata, and says how much nowhere but in its superblock.
pub fn free_bytes(dir: &Path) -> Option<u64> {
    crate::node::facts::statfs(dir).ok().map(|s| s.available)
}

/// A file offset or length as `fallocate` takes it: 32 bits wide on armv7, where a log
/// past 2 GiB cannot be grown this way (EFBIG, as the kernel would say).
fn off_t(n: u64) -> nix::Result<nix::libc::off_t> {
    n.try_into().map_err(|_| nix::errno::Errno::EFBIG)
}

pub(super) struct Space {
    dir: PathBuf,
    /// sled's log file, opened once for `fallocate`; `None` where it cannot be.
    log: Mutex<Option<File>>,
}

impl Space {
    pub fn new(dir: &Path) -> Space {
        Space {
            dir: dir.to_path_buf(),
            log: Mutex::new(None),
        }
    }

    fn with_log<R>(&self, f: impl FnOnce(&File) -> R) -> Option<R> {
        let mut log = self.log.lock().unwrap_or_else(|p| p.into_inner());
        if log.is_none() {
            *log = OpenOptions::new()
                .write(true)
                .open(self.dir.join(LOG_FILE))
                .ok();
        }
        log.as_ref().map(f)
    }

    /// Makes what sled wrote to its log durable, with the file's size and blocks.
    pub fn sync_log(&self) -> std::io::Result<()> {
        self.with_log(File::sync_data).unwrap_or_else(|| {
            Err(std::io::Error::new(
                std::io::ErrorKind::NotFound,
                format!("cannot open {}", self.dir.join(LOG_FILE).display()),
            ))
        })
    }

    /// Bytes allocated past the end of sled's log file.
    pub fn tail(&self) -> u64 {
        self.with_log(|f| {
            f.metadata()
                .map(|m| (m.blocks() * 512).saturating_sub(m.size()))
                .unwrap_or(0)
        })
        .unwrap_or(0)
    }

    /// Whether sled can take a write now without needing blocks the filesystem may no
    /// longer have.
    pub fn writable(&self) -> bool {
        free_bytes(&self.dir).is_none_or(|free| free >= MIN_FREE) || self.tail() >= MIN_TAIL
    }

    /// Brings the headroom back to [`HEADROOM`] when it has fallen below half of it and
    /// the filesystem has the blocks. Returns the headroom there is afterwards.
    pub fn top_up(&self) -> u64 {
        let tail = self.tail();
        if tail >= HEADROOM / 2 {
            return tail;
        }
        let grown = self.with_log(|f| {
            let size = f.metadata().map(|m| m.size()).unwrap_or(0);
            fallocate(
                f.as_raw_fd(),
                FallocateFlags::FALLOC_FL_KEEP_SIZE,
                off_t(size)?,
                off_t(HEADROOM)?,
            )
        });
        match grown {
            Some(Ok(())) => self.tail(),
            // ENOSPC, or a filesystem without fallocate: the guard still holds writes.
            _ => tail,
        }
    }

    /// Whether sled's log file takes writes again: `fallocate` on it fails as a write
    /// would (no space, a file made immutable, a filesystem gone read-only).
    pub fn probe(&self) -> bool {
        self.forget();
        self.with_log(|f| {
            let size = f.metadata().map(|m| m.size()).unwrap_or(0);
            off_t(size)
                .and_then(|at| {
                    fallocate(
                        f.as_raw_fd(),
                        FallocateFlags::FALLOC_FL_KEEP_SIZE,
                        at,
                        off_t(MIN_TAIL)?,
                    )
                })
                .is_ok()
        })
        .unwrap_or(false)
    }

    /// Gives the headroom back to the filesystem, so that sled, opening on a full disk,
    /// can write its snapshot. Returns the bytes released. Only while sled has the
    /// store closed: it cuts the file at the size it has now.
    pub fn release(&self) -> u64 {
        let tail = self.tail();
        if tail == 0 {
            return 0;
        }
        // Cutting a file at its own size frees the blocks allocated past its end
        // (ext4, xfs, f2fs); punching a hole would not reach past the end.
        let freed = self.with_log(|f| f.metadata().and_then(|m| f.set_len(m.size())));
        match freed {
            Some(Ok(())) => tail.saturating_sub(self.tail()),
            _ => 0,
        }
    }

    /// Forgets the open log file (sled is about to open the store again, or it was
    /// replaced by a compaction).
    pub fn forget(&self) {
        *self.log.lock().unwrap_or_else(|p| p.into_inner()) = None;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn headroom_is_allocated_past_the_end_and_released_again() {
        let tmp = crate::testutil::TempDir::new("space");
        std::fs::write(tmp.0.join(LOG_FILE), vec![7u8; 8192]).expect("log file");
        let space = Space::new(&tmp.0);
        let tail = space.top_up();
        // A filesystem without fallocate (rare) leaves nothing to check.
        if tail == 0 {
            eprintln!("skipped: this filesystem does not preallocate");
            return;
        }
        assert!(tail >= HEADROOM, "headroom {tail}");
        let meta = std::fs::metadata(tmp.0.join(LOG_FILE)).expect("meta");
        assert_eq!(meta.len(), 8192, "the file's size does not change");
        assert_eq!(space.top_up(), tail, "a full headroom is left alone");
        assert!(space.release() >= HEADROOM);
        assert!(space.tail() < MIN_TAIL);
        assert_eq!(
            std::fs::read(tmp.0.join(LOG_FILE)).expect("read"),
            vec![7u8; 8192],
            "the data stays"
        );
    }
}
