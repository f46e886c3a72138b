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
    /// The file behind it, or the region's name (`[heap]`, `[stack]`); empty if none.
    pub name: String,
}

impl Mapping {
    /// Neither a file nor a named region behind it.
    pub fn anonymous(&self) -> bool {
        self.name.is_empty()
    }

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
    let name = f.nth(3).unwrap_or_default().to_string();
    Some(Mapping {
        start: u64::from_str_radix(lo, 16).ok()?,
        end: u64::from_str_radix(hi, 16).ok()?,
        perms,
        name,
    })
}

/// Which pages of `[start, end)` in process `pid` are resident, one entry per page (from
/// `/proc/PID/pagemap`, which needs root to be read); None if it cannot be read.
pub fn resident(pid: u32, start: u64, end: u64) -> Option<Vec<bool>> {
    use std::io::{Read, Seek, SeekFrom};
    let page = page_size();
    let pages = usize::try_from(end.checked_sub(start)? / page).ok()?;
    let mut f = std::fs::File::open(format!("/proc/{pid}/pagemap")).ok()?;
    f.seek(SeekFrom::Start(start / page * 8)).ok()?;
    let mut raw = vec![0u8; pages * 8];
    f.read_exact(&mut raw).ok()?;
    Some(raw.chunks_exact(8).map(|e| e[7] & 0x80 != 0).collect())
}

/// The kernel's page size.
pub fn page_size() -> u64 {
    nix::unistd::sysconf(nix::unistd::SysconfVar::PAGE_SIZE)
        .ok()
        .flatten()
        .and_then(|n| u64::try_from(n).ok())
        .unwrap_or(4096)
}
