//! The mappings of a process, as `/proc/PID/maps` lists them, for tests and benches that
//! look at where its memory lies (thread stacks, malloc heaps).

#![allow(dead_code)]

/// One line of `/proc/PID/maps`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mapping {
    pub start: u64,
    pub end: u64,
    /// `rw-p`, `r-xp`, `---p` and so on.
    pub perms: String,
    /// Neither a file nor a named region (`[heap]`, `[stack]`) behind it.
    pub anonymous: bool,
}

impl Mapping {
    pub fn len(&self) -> u64 {
        self.end.saturating_sub(self.start)
    }
}

/// The mappings of process `pid` in address order; none if it is gone. Lines that do not
/// parse are skipped.
pub fn mappings(pid: u32) -> Vec<Mapping> {
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).unwrap_or_default();
    maps.lines().filter_map(parse).collect()
}

fn parse(line: &str) -> Option<Mapping> {
    let mut f = line.split_whitespace();
    let (lo, hi) = f.next()?.split_once('-')?;
    let perms = f.next()?.to_string();
    // offset, device, inode; a path (or a name such as `[heap]`) follows unless anonymous.
    let anonymous = f.nth(3).is_none();
    Some(Mapping {
        start: u64::from_str_radix(lo, 16).ok()?,
        end: u64::from_str_radix(hi, 16).ok()?,
        perms,
        anonymous,
    })
}
