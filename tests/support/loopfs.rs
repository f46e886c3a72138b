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
        std::fs::create_dir_all(mount).map_err(|e| format!("create mount point: {e}"))?;
        run(Command::new("mount")
            .args(["-o", "loop"])
            .arg(&image)
            .arg(mount))?;
        Ok(LoopFs {
            image,
            mount: mount.to_path_buf(),
        })
    }

    /// Bytes free there, as `df` shows them.
    pub fn free(&self) -> u64 {
        holdfast::node::facts::statfs(&self.mount)
            .map(|s| s.available)
            .unwrap_or(0)
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
