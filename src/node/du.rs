//! How much disk a directory holds, as `du -x` counts it: allocated blocks of every
//! entry below it, symbolic links not followed, other filesystems (a tmpfs, any mount
//! of another device) not entered, a file with several hard links counted once. What
//! it walks belongs to containers, so the walk is bounded: at most [`MAX_ENTRIES`]
//! entries and [`MAX_DEPTH`] levels; a walk cut short says so and gives what it
//! counted, which is a lower bound. Reads only.

use std::collections::HashSet;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

/// The most entries one walk looks at.
pub const MAX_ENTRIES: u32 = 100_000;
/// The deepest directory one walk enters, below the one it starts at.
pub const MAX_DEPTH: u32 = 128;

/// What a walk found.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Usage {
    /// Bytes allocated (blocks of 512 bytes, as `st_blocks` counts them).
    pub bytes: u64,
    /// Entries counted, the directory itself included.
    pub inodes: u64,
    /// False when the walk stopped at a bound: more is there than was counted.
    pub complete: bool,
}

/// The usage of `dir` on its own filesystem. A `dir` that is missing holds nothing.
pub fn usage(dir: &Path) -> Usage {
    let Ok(top) = std::fs::symlink_metadata(dir) else {
        return Usage {
            complete: true,
            ..Usage::default()
        };
    };
    let dev = top.dev();
    let mut walk = Walk {
        usage: Usage {
            bytes: 0,
            inodes: 0,
            complete: true,
        },
        budget: MAX_ENTRIES,
        linked: HashSet::new(),
    };
    walk.count(&top);
    if !top.is_dir() {
        return walk.usage;
    }
    let mut stack: Vec<(PathBuf, u32)> = vec![(dir.to_owned(), 0)];
    while let Some((d, depth)) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in entries.flatten() {
            if walk.budget == 0 {
                walk.usage.complete = false;
                return walk.usage;
            }
            walk.budget -= 1;
            // DirEntry::metadata does not follow a symbolic link.
            let Ok(m) = e.metadata() else { continue };
            if m.dev() != dev {
                continue;
            }
            walk.count(&m);
            if m.is_dir() {
                if depth >= MAX_DEPTH {
                    walk.usage.complete = false;
                } else {
                    stack.push((e.path(), depth + 1));
                }
            }
        }
    }
    walk.usage
}

struct Walk {
    usage: Usage,
    budget: u32,
    /// Files with more than one link already counted, by inode.
    linked: HashSet<u64>,
}

impl Walk {
    fn count(&mut self, m: &std::fs::Metadata) {
        if !m.is_dir() && m.nlink() > 1 && !self.linked.insert(m.ino()) {
            return;
        }
        // st_blocks comes from the filesystem: checked before it is scaled.
        let bytes = m.blocks().saturating_mul(512);
        self.usage.bytes = self.usage.bytes.saturating_add(bytes);
        self.usage.inodes = self.usage.inodes.saturating_add(1);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tempdir(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("holdfast-du-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).expect("tempdir");
        d
    }

    #[test]
    fn counts_blocks_once_per_file_and_never_follows_links() {
        let d = tempdir("links");
        let data = vec![1u8; 256 * 1024];
        std::fs::create_dir_all(d.join("a/b")).expect("dirs");
        std::fs::write(d.join("a/b/file"), &data).expect("file");
        std::fs::hard_link(d.join("a/b/file"), d.join("a/again")).expect("hard link");
        let outside = tempdir("outside");
        std::fs::write(outside.join("big"), vec![1u8; 1024 * 1024]).expect("outside");
        std::os::unix::fs::symlink(&outside, d.join("out")).expect("symlink");
        let u = usage(&d);
        assert!(u.complete);
        // The file once (its blocks at least its size), the dirs and the link small.
        assert!(u.bytes >= 256 * 1024 && u.bytes < 512 * 1024, "{u:?}");
        assert_eq!(u.inodes, 5, "{u:?}");
        assert_eq!(
            usage(&d.join("missing")),
            Usage {
                complete: true,
                ..Usage::default()
            }
        );
        std::fs::remove_dir_all(&d).expect("clean");
        std::fs::remove_dir_all(&outside).expect("clean");
    }

    #[test]
    fn a_deep_tree_is_cut_short_and_said_so() {
        let d = tempdir("deep");
        let mut p = d.clone();
        for _ in 0..MAX_DEPTH + 2 {
            p.push("d");
        }
        std::fs::create_dir_all(&p).expect("deep dirs");
        let u = usage(&d);
        assert!(!u.complete, "{u:?}");
        assert_eq!(u.inodes, u64::from(MAX_DEPTH) + 2, "{u:?}");
        std::fs::remove_dir_all(&d).expect("clean");
    }
}
