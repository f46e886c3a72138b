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
    pages.checked_mul(u64::try_from(page_size()).ok()?)
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

/// Stack below the caller's frame left mapped by [`release_unused_stack`]: room for the
/// calls it makes and for a signal handler's frame, which would otherwise fault pages
/// straight back in.
const STACK_MARGIN: usize = 16 * 1024;

/// Gives back the main thread's stack pages below the caller's frame. A deep call made
/// once (creating a container, a burst's work on the agent's loop) leaves its pages
/// resident for the life of the process; nothing below the stack pointer is live, and
/// pages touched again come back zeroed. Call it from the main thread, shallow in its
/// stack; on any other thread it does nothing. Returns the bytes given back.
#[inline(never)]
pub fn release_unused_stack() -> usize {
    let marker = 0u8;
    let here = std::hint::black_box(std::ptr::addr_of!(marker)) as usize;
    let Some((low, high)) = main_stack() else {
        return 0;
    };
    if !(low..high).contains(&here) {
        return 0;
    }
    let page = page_size();
    let top = (here & !(page - 1)).saturating_sub(STACK_MARGIN);
    if top <= low {
        return 0;
    }
    let len = top - low;
    // SAFETY: [low, top) lies in this thread's own stack mapping, at least STACK_MARGIN
    // below the frame of this function: no frame, local or signal frame lives there
    // while this runs, and MADV_DONTNEED on private anonymous memory only drops pages,
    // which fault back in zeroed if the stack grows into them again.
    #[allow(unsafe_code)]
    let done =
        unsafe { nix::libc::madvise(low as *mut nix::libc::c_void, len, nix::libc::MADV_DONTNEED) };
    if done == 0 {
        len
    } else {
        0
    }
}

/// The `[stack]` mapping of `/proc/self/maps` (the main thread's), start and end.
fn main_stack() -> Option<(usize, usize)> {
    let maps = std::fs::read_to_string("/proc/self/maps").ok()?;
    let line = maps.lines().find(|l| l.ends_with("[stack]"))?;
    let range = line.split(' ').next()?;
    let (low, high) = range.split_once('-')?;
    let low = usize::from_str_radix(low, 16).ok()?;
    let high = usize::from_str_radix(high, 16).ok()?;
    (low < high).then_some((low, high))
}

fn page_size() -> usize {
    nix::unistd::sysconf(nix::unistd::SysconfVar::PAGE_SIZE)
        .ok()
        .flatten()
        .and_then(|p| usize::try_from(p).ok())
        .filter(|p| p.is_power_of_two())
        .unwrap_or(4096)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_main_stack_is_found_and_other_threads_stacks_are_left_alone() {
        let (low, high) = main_stack().expect("a [stack] mapping");
        assert!(low < high);
        // Tests run on threads of their own: their stacks are not the main one.
        let marker = 0u8;
        let here = std::ptr::addr_of!(marker) as usize;
        assert!(!(low..high).contains(&here));
        assert_eq!(release_unused_stack(), 0);
    }
}
