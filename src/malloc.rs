//! How the C allocator holds memory, and giving it back.
//!
//! glibc's malloc keeps up to 8 arenas per core on 64-bit hosts (16 on a 2-core
//! gateway) and raises its mmap and trim thresholds as large blocks come and go, so a
//! burst of work leaves memory in the process long after it ended. The agent and the
//! shims set fixed limits at start and hand free pages back after work with [`trim`].
//! Other C libraries (musl) have none of these knobs: there the functions do nothing.

/// Arenas for a process that runs a small async runtime and a few blocking threads:
/// contention between more threads than this costs little next to a 64 MiB heap
/// reservation and its fragmented pages per extra arena.
pub const AGENT_ARENAS: i32 = 2;

/// Blocks above this size come from their own mapping and go back at `free`; below it,
/// free memory at the top of the heap is returned once it exceeds the same size.
pub const THRESHOLD_BYTES: i32 = 128 * 1024;

/// Sets the arena limit and fixed mmap and trim thresholds. Call it before any thread
/// exists: arenas already made stay.
pub fn configure(arenas: i32) {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        // SAFETY: mallopt only records the parameters; it takes plain integers and
        // touches no memory of ours. A rejected value returns 0 and changes nothing.
        #[allow(unsafe_code)]
        unsafe {
            nix::libc::mallopt(nix::libc::M_ARENA_MAX, arenas);
            nix::libc::mallopt(nix::libc::M_MMAP_THRESHOLD, THRESHOLD_BYTES);
            nix::libc::mallopt(nix::libc::M_TRIM_THRESHOLD, THRESHOLD_BYTES);
        }
    }
    #[cfg(not(all(target_os = "linux", target_env = "gnu")))]
    let _ = arenas;
}

/// Returns the free pages of every arena to the kernel (`malloc_trim(0)`): not only the
/// top of each heap, but free pages in the middle too. It walks every arena under its
/// lock, so call it after work, not in a hot path. Returns whether memory was released.
pub fn trim() -> bool {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        // SAFETY: malloc_trim takes the allocator's own locks and only unmaps pages
        // that malloc holds free; no pointer of ours is involved.
        #[allow(unsafe_code)]
        let released = unsafe { nix::libc::malloc_trim(0) };
        released != 0
    }
    #[cfg(not(all(target_os = "linux", target_env = "gnu")))]
    false
}

/// The process's resident memory in bytes (`/proc/self/statm`), to tell what a trim
/// gave back; None where it cannot be read.
pub fn resident_bytes() -> Option<u64> {
    let statm = std::fs::read_to_string("/proc/self/statm").ok()?;
    let pages: u64 = statm.split_whitespace().nth(1)?.parse().ok()?;
    let page = nix::unistd::sysconf(nix::unistd::SysconfVar::PAGE_SIZE)
        .ok()
        .flatten()
        .and_then(|p| u64::try_from(p).ok())?;
    pages.checked_mul(page)
}

/// [`trim`], logging (at debug) how much resident memory it gave back `after` some work.
pub fn trim_and_log(after: &str) {
    let before = resident_bytes();
    let released = trim();
    match (before, resident_bytes()) {
        (Some(b), Some(a)) => log::debug!(
            "memory trimmed after {after}: resident {} -> {} KiB{}",
            b / 1024,
            a / 1024,
            if released {
                ""
            } else {
                " (nothing to release)"
            }
        ),
        _ => log::debug!("memory trimmed after {after}"),
    }
}
