//! What unit and integration tests share: a temporary directory removed when dropped,
//! with what was mounted below it, even when the test fails.

#![allow(dead_code)]

use std::path::PathBuf;
use std::sync::atomic::{AtomicU32, Ordering};

pub struct TempDir(pub PathBuf);

impl TempDir {
    /// A new, empty directory unique to this process and call.
    pub fn new(tag: &str) -> Self {
        static SEQ: AtomicU32 = AtomicU32::new(0);
        let seq = SEQ.fetch_add(1, Ordering::Relaxed);
        let path =
            std::env::temp_dir().join(format!("holdfast-test-{tag}-{}-{seq}", std::process::id()));
        let _ = std::fs::remove_dir_all(&path);
        std::fs::create_dir_all(&path).expect("create temp dir");
        TempDir(path)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        // What was mounted below it first (a runtime made in it mounts its tmpfs for
        // what lasts one boot), deepest first: remove_dir_all stops at a mount point.
        let mut mounts: Vec<String> = std::fs::read_to_string("/proc/self/mountinfo")
            .unwrap_or_default()
            .lines()
            .filter_map(|l| l.split(' ').nth(4))
            .filter(|mp| std::path::Path::new(mp).starts_with(&self.0))
            .map(str::to_owned)
            .collect();
        mounts.sort_by_key(|m| std::cmp::Reverse(m.len()));
        for mp in mounts {
            let _ = nix::mount::umount2(mp.as_str(), nix::mount::MntFlags::MNT_DETACH);
        }
        let _ = std::fs::remove_dir_all(&self.0);
    }
}
