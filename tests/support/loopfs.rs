//! A small ext4 filesystem on a loop device, made and mounted by a test (as root) and
//! unmounted and removed when dropped, even when the test fails; and a filler that
//! takes every free block of it, as runaway logs or images would.

#![allow(dead_code)]

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;

pub struct LoopFs {
    image: PathBuf,
    pub mount: PathBuf,
}

fn run(cmd: &mut Command) -> Result<(), String> {
    let out = cmd.output().map_err(|e| format!("{cmd:?}: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "{cmd:?}: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ))
    }
}

impl LoopFs {
    /// Makes a `mib` MiB ext4 image beside `mount` and mounts it there (the directory
    /// is created, and must be empty).
    pub fn mount(mount: &Path, mib: u64) -> Result<LoopFs, String> {
        LoopFs::mount_with(mount, mib, "")
    }

    /// [`LoopFs::mount`] with ext4 mount `options` besides `loop` (`commit=600`).
    pub fn mount_with(mount: &Path, mib: u64, options: &str) -> Result<LoopFs, String> {
        let image = mount.with_extension("img");
        let file = std::fs::File::create(&image).map_err(|e| format!("create image: {e}"))?;
        file.set_len(mib * 1024 * 1024)
            .map_err(|e| format!("size image: {e}"))?;
        drop(file);
        // 4 KiB blocks as on a device's flash, and no lazy init, which would write in
        // the background for a while after the mount.
        run(Command::new("mkfs.ext4")
            .args([
                "-q",
                "-F",
                "-b",
                "4096",
                "-E",
                "lazy_itable_init=0,lazy_journal_init=0",
            ])
            .arg(&image))?;
        LoopFs::attach(image, mount, options)
    }

    fn attach(image: PathBuf, mount: &Path, options: &str) -> Result<LoopFs, String> {
        let options = if options.is_empty() {
            "loop".to_string()
        } else {
            format!("loop,{options}")
        };
        let fs = LoopFs {
            image,
            mount: mount.to_path_buf(),
        };
        std::fs::create_dir_all(mount).map_err(|e| format!("create mount point: {e}"))?;
        // Dropped on failure too: the image goes with it.
        run(Command::new("mount")
            .args(["-o", &options])
            .arg(&fs.image)
            .arg(mount))?;
        Ok(fs)
    }

    /// The disk as a power cut would leave it now, mounted at `mount`: what the kernel
    /// has written to the loop device so far (its image file holds exactly that) and
    /// nothing of what is only in memory: dirty pages, and journal transactions not
    /// yet committed. ext4 replays the committed ones as it mounts the copy, as it
    /// would at the next boot. The filesystem here stays mounted and untouched.
    pub fn cut(&self, mount: &Path) -> Result<LoopFs, String> {
        let image = mount.with_extension("img");
        std::fs::copy(&self.image, &image).map_err(|e| format!("copy the image: {e}"))?;
        LoopFs::attach(image, mount, "")
    }

    /// Bytes free there, as `df` shows them.
    pub fn free(&self) -> u64 {
        let Ok(st) = nix::sys::statvfs::statvfs(&self.mount) else {
            return 0;
        };
        // statvfs counts blocks of the fragment size (the block size where that is 0).
        let fragment = match widen(st.fragment_size()) {
            0 => widen(st.block_size()),
            f => f,
        };
        widen(st.blocks_available()).saturating_mul(fragment)
    }

    /// Fills the filesystem: writes `name` until no block is left. Returns its path.
    pub fn fill(&self, name: &str) -> PathBuf {
        let path = self.mount.join(name);
        let mut f = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .expect("create the filler");
        // Big writes first, then small ones for the last blocks.
        for size in [1024 * 1024, 4096] {
            let chunk = vec![0u8; size];
            // Bounded: the filesystem is small.
            for _ in 0..100_000 {
                if f.write_all(&chunk).and_then(|()| f.sync_data()).is_err() {
                    break;
                }
            }
        }
        path
    }
}

impl Drop for LoopFs {
    fn drop(&mut self) {
        // Lazily, should something still hold it: the loop device goes once it is let go.
        let _ = nix::mount::umount2(&self.mount, nix::mount::MntFlags::MNT_DETACH);
        let _ = std::fs::remove_file(&self.image);
        let _ = std::fs::remove_dir(&self.mount);
        // The directory the mount point was made in, if that left it empty.
        if let Some(parent) = self.mount.parent() {
            let _ = std::fs::remove_dir(parent);
        }
    }
}

impl LoopFs {
    /// The loop device's name under `/sys/block` (`loop3`), found in the mount table.
    pub fn device(&self) -> Result<String, String> {
        let mounts = std::fs::read_to_string("/proc/self/mountinfo")
            .map_err(|e| format!("read mountinfo: {e}"))?;
        // Fields: id parent major:minor root mount-point options ... - fstype source ...
        mounts
            .lines()
            .filter(|l| l.split_whitespace().nth(4) == Some(&*self.mount.to_string_lossy()))
            .find_map(|l| {
                let after = l.split(" - ").nth(1)?;
                let source = after.split_whitespace().nth(1)?;
                source.strip_prefix("/dev/").map(str::to_string)
            })
            .ok_or_else(|| format!("no loop device mounted at {}", self.mount.display()))
    }

    /// Bytes the kernel has written to the device so far (field 7 of its `stat`, sectors
    /// of 512 bytes), journal included. Call `sync` first for what is still cached.
    pub fn bytes_written(&self) -> Result<u64, String> {
        let dev = self.device()?;
        let path = format!("/sys/block/{dev}/stat");
        let stat = std::fs::read_to_string(&path).map_err(|e| format!("read {path}: {e}"))?;
        let sectors: u64 = stat
            .split_whitespace()
            .nth(6)
            .and_then(|s| s.parse().ok())
            .ok_or_else(|| format!("{path}: no sectors-written field in {stat:?}"))?;
        sectors
            .checked_mul(512)
            .ok_or_else(|| format!("{path}: {sectors} sectors overflow"))
    }

    /// Bytes written to the device while `f` ran: everything dirty is synced before and
    /// after, so the figure holds what `f` caused, journal commits included (and
    /// anything else writing there meanwhile, such as a running agent's own timers).
    pub fn bytes_written_during<R>(&self, f: impl FnOnce() -> R) -> Result<(u64, R), String> {
        nix::unistd::sync();
        let before = self.bytes_written()?;
        let out = f();
        nix::unistd::sync();
        let after = self.bytes_written()?;
        Ok((after.saturating_sub(before), out))
    }
}

/// statvfs counts are 32 bits wide on some targets and 64 on others.
fn widen<T: Into<u64>>(n: T) -> u64 {
    n.into()
}
