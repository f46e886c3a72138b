//! Room on disk for what the image store writes (staged archives, downloads, unpacked
//! layers). Sizes in an archive or manifest are claims and a compressed layer can
//! inflate a thousandfold, so writers charge every byte to a [`DiskBudget`] as they go:
//! it looks at the filesystem's free space (`statvfs`) every [`CHECK_EVERY`] bytes and
//! stops the write with [`ImageError::DiskFull`] while a reserve is still free, rather
//! than let an image take the blocks the state database, logs and running containers
//! need. A write that fails with ENOSPC anyway says so in the same words.

use std::io;
use std::path::{Path, PathBuf};

use super::ImageError;
use crate::store::space::{HEADROOM, MIN_FREE};

/// Bytes a writer may put down between two looks at the free space.
pub(crate) const CHECK_EVERY: u64 = 1024 * 1024;
/// Entries a writer may create between two looks at the free inodes.
const CHECK_INODES_EVERY: u64 = 256;
/// The least kept free: the state database's own headroom and the point where it
/// starts holding writes, twice over, so that it never has to.
const RESERVE_MIN: u64 = 2 * (HEADROOM + MIN_FREE);
/// Of a larger filesystem, 1/20 stays free: the room logs and containers' own writes
/// need, and well above the kubelet's default `imagefs.available` eviction signal
/// being the first to notice a full disk.
const RESERVE_DIVISOR: u64 = 20;
const INODE_RESERVE_MIN: u64 = 256;

/// Bytes of a filesystem of `capacity` bytes that image writes leave free.
pub(crate) fn reserve_bytes(capacity: u64) -> u64 {
    RESERVE_MIN.max(capacity / RESERVE_DIVISOR)
}

fn reserve_inodes(inodes: u64) -> u64 {
    INODE_RESERVE_MIN.max(inodes / RESERVE_DIVISOR)
}

/// Counts what one write (a layer, a download, a staged archive) puts on the
/// filesystem holding `dir`, and refuses to go on once only the reserve would be left.
pub(crate) struct DiskBudget {
    dir: PathBuf,
    what: String,
    written: u64,
    created: u64,
    /// Bytes that may still be written before the next look at the free space.
    allowance: u64,
    inode_allowance: u64,
}

impl DiskBudget {
    pub(crate) fn new(dir: &Path, what: impl Into<String>) -> DiskBudget {
        DiskBudget {
            dir: dir.to_path_buf(),
            what: what.into(),
            written: 0,
            created: 0,
            allowance: 0,
            inode_allowance: 0,
        }
    }

    /// Call before writing `n` bytes.
    pub(crate) fn charge(&mut self, n: u64) -> Result<(), ImageError> {
        if self.allowance < n {
            self.refill(n)?;
        }
        self.allowance -= n;
        self.written = self.written.saturating_add(n);
        Ok(())
    }

    /// Call before creating a file, directory, link or node: one inode, and a block
    /// for a directory's entries or a small file's tail.
    pub(crate) fn charge_entry(&mut self) -> Result<(), ImageError> {
        if self.inode_allowance == 0 {
            self.refill_inodes()?;
        }
        self.inode_allowance -= 1;
        self.created += 1;
        self.charge(4096)
    }

    /// Fails now, before anything is written, when `n` more bytes would not fit.
    pub(crate) fn expect(&mut self, n: u64) -> Result<(), ImageError> {
        if self.allowance >= n {
            return Ok(());
        }
        self.refill(n)
    }

    fn refill(&mut self, n: u64) -> Result<(), ImageError> {
        let stats = match crate::node::facts::statfs(&self.dir) {
            Ok(s) => s,
            Err(e) => {
                // Without numbers the write goes on; ENOSPC still ends it cleanly.
                log::debug!("free space of {}: {e}", self.dir.display());
                self.allowance = n.max(CHECK_EVERY);
                return Ok(());
            }
        };
        let reserve = reserve_bytes(stats.capacity);
        let usable = stats.available.saturating_sub(reserve);
        if usable < n {
            return Err(ImageError::DiskFull {
                what: self.what.clone(),
                detail: format!(
                    "{} has {} bytes free and keeps {reserve} of them in reserve; \
                     {n} more were needed after {} written",
                    self.dir.display(),
                    stats.available,
                    self.written
                ),
                source: None,
            });
        }
        self.allowance = usable.min(CHECK_EVERY.max(n));
        Ok(())
    }

    fn refill_inodes(&mut self) -> Result<(), ImageError> {
        let Ok(stats) = crate::node::facts::statfs(&self.dir) else {
            self.inode_allowance = CHECK_INODES_EVERY;
            return Ok(());
        };
        // Filesystems without an inode table (btrfs, some tmpfs) report none at all.
        if stats.inodes == 0 {
            self.inode_allowance = u64::MAX;
            return Ok(());
        }
        let reserve = reserve_inodes(stats.inodes);
        let usable = stats.inodes_free.saturating_sub(reserve);
        if usable == 0 {
            return Err(ImageError::DiskFull {
                what: self.what.clone(),
                detail: format!(
                    "{} has {} inodes free and keeps {reserve} of them in reserve; \
                     out of inodes after {} files",
                    self.dir.display(),
                    stats.inodes_free,
                    self.created
                ),
                source: None,
            });
        }
        self.inode_allowance = usable.min(CHECK_INODES_EVERY);
        Ok(())
    }

    /// The error for a failed write under this budget: a full disk named as such,
    /// with the numbers, anything else as it is.
    pub(crate) fn io_error(&self, context: String, source: io::Error) -> ImageError {
        if !is_no_space(&source) {
            return ImageError::Io { context, source };
        }
        let free = crate::node::facts::statfs(&self.dir)
            .map(|s| format!("; {} bytes free on {}", s.available, self.dir.display()))
            .unwrap_or_default();
        ImageError::DiskFull {
            what: context,
            detail: format!("{source}{free} after {} bytes written", self.written),
            source: Some(source),
        }
    }
}

/// ENOSPC, or EDQUOT (a quota is a full disk to whoever hits it).
pub(crate) fn is_no_space(e: &io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(nix::libc::ENOSPC) | Some(nix::libc::EDQUOT)
    ) || e.kind() == io::ErrorKind::StorageFull
}

/// An I/O error with what was being done; a full disk becomes [`ImageError::DiskFull`].
pub(crate) fn io_error(context: String, source: io::Error) -> ImageError {
    if is_no_space(&source) {
        return ImageError::DiskFull {
            what: context,
            detail: source.to_string(),
            source: Some(source),
        };
    }
    ImageError::Io { context, source }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_reserve_grows_with_the_filesystem() {
        assert_eq!(reserve_bytes(0), RESERVE_MIN);
        assert_eq!(reserve_bytes(64 << 20), RESERVE_MIN);
        assert_eq!(reserve_bytes(8 << 30), (8 << 30) / 20);
    }

    #[test]
    fn a_budget_refuses_what_the_free_space_cannot_hold() {
        let tmp = crate::testutil::TempDir::new("space-budget");
        let mut budget = DiskBudget::new(&tmp.0, "test write");
        budget.charge(4096).expect("4 KiB fit");
        budget.charge_entry().expect("an entry fits");
        let e = budget
            .expect(u64::MAX / 2)
            .expect_err("no disk is this large");
        let shown = e.to_string();
        assert!(shown.contains("disk is full"), "{shown}");
        assert!(shown.contains("test write"), "{shown}");
        assert!(shown.contains("in reserve"), "{shown}");
        assert_eq!(budget.written, 8192);
    }
}
