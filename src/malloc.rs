//! How the process holds memory, and giving it back.
//!
//! glibc's malloc keeps up to 8 arenas per core on 64-bit hosts (16 on a 2-core
//! gateway) and raises its mmap and trim thresholds as large blocks come and go, so a
//! burst of work leaves memory in the process long after it ended. The agent and the
//! shims set fixed limits at start and hand free pages back after work with [`trim`].
//! Other C libraries (musl) have none of these knobs: there the functions do nothing.

mod large;
pub use large::Allocator;

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

/// glibc's tunables for holdfast's processes, each `name=value`, joined with `:`.
///
/// - No per-thread cache of freed small blocks. Each thread keeps up to 7 freed blocks
///   of each of 64 sizes to itself, counted as in use, so `malloc_trim` cannot give
///   back a page one of them lies on. After a burst of 100 pods those few hundred KiB
///   were spread over 1.7 MiB of the agent's heap pages, two thirds of what the burst
///   left; without the caches the arenas take the blocks back and the trim returns
///   their pages. The cost, a lock per small allocation, does not show next to what a
///   pod start does (`benches/footprint.rs`).
/// - No cache of the stacks of threads that ended. glibc keeps up to 40 MiB of them for
///   threads to come, each with the pages its thread touched still resident (16-24 KiB
///   of a 2 MiB stack): after a burst, the blocking threads that served it and ended
///   left some 20 of them, about 0.4 MiB. A thread started later maps a new stack.
pub const TUNABLES: &str = "glibc.malloc.tcache_count=0:glibc.pthread.stack_cache_size=0";

/// What `GLIBC_TUNABLES` must become for [`TUNABLES`] to apply, given its value now;
/// None when nothing is to be added. A tunable the environment sets already keeps its
/// value there (the user's choice wins); each of ours it lacks is joined to it.
pub fn tunables_to_set(now: Option<&str>) -> Option<String> {
    let now = now.unwrap_or("");
    let set = |name: &str| now.split(':').any(|t| t.split('=').next() == Some(name));
    let missing: Vec<&str> = TUNABLES
        .split(':')
        .filter(|t| !set(t.split('=').next().unwrap_or(t)))
        .collect();
    if missing.is_empty() {
        return None;
    }
    let missing = missing.join(":");
    Some(if now.is_empty() {
        missing
    } else {
        format!("{now}:{missing}")
    })
}

/// Set in the environment of the process [`exec_with_tunables`] starts.
const TUNED_MARK: &str = "HOLDFAST_GLIBC_TUNED";

/// glibc reads its tunables once, as a program starts: so that they apply to the agent
/// (and to the shims and helpers it starts, which inherit its environment), it runs its
/// own executable again in place with `GLIBC_TUNABLES` set, before any thread exists.
/// Returns without exec when they apply already, when this process is that exec already
/// (a glibc that drops a tunable it does not know from the environment must not make it
/// run itself again and again), or when the C library is not glibc; returns the reason
/// when the exec failed, and the process goes on with glibc's defaults.
pub fn exec_with_tunables() -> Result<(), String> {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        use std::os::unix::process::CommandExt;
        if std::env::var_os(TUNED_MARK).is_some() {
            return Ok(());
        }
        let now = std::env::var("GLIBC_TUNABLES").ok();
        let Some(value) = tunables_to_set(now.as_deref()) else {
            return Ok(());
        };
        let mut args = std::env::args_os();
        let arg0 = args.next().unwrap_or_else(|| "holdfast".into());
        let err = std::process::Command::new("/proc/self/exe")
            .arg0(arg0)
            .args(args)
            .env("GLIBC_TUNABLES", value)
            .env(TUNED_MARK, "1")
            .exec();
        Err(format!(
            "run again with GLIBC_TUNABLES={TUNABLES} (so that freed memory goes back \
             after a burst): {err}"
        ))
    }
    #[cfg(not(all(target_os = "linux", target_env = "gnu")))]
    Ok(())
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

/// The process's resident anonymous memory in bytes (`RssAnon` of `/proc/self/status`:
/// heap, stacks and private mappings, no file pages); None where it cannot be read.
pub fn anonymous_bytes() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let kib: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("RssAnon:"))?
        .trim()
        .strip_suffix("kB")?
        .trim()
        .parse()
        .ok()?;
    kib.checked_mul(1024)
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

/// Stack below the caller's page left mapped by [`release_unused_stack`]: room for the
/// calls it makes (the `madvise` itself) without faulting a page straight back in. More
/// would keep pages that a deep call touched once: a shim's wait, the deepest thing it
/// does for the rest of its life, goes a few KiB below where it releases.
const STACK_MARGIN: usize = 4 * 1024;

/// Gives back the calling thread's stack pages below the caller's frame. A deep call
/// made once (creating a container, a burst's work on the agent's loop, parsing a
/// folder of manifests) leaves its pages resident for the life of the thread; nothing
/// below the stack pointer is live, and pages touched again come back zeroed. Call it
/// shallow in the thread's stack, after the deep work. Returns the bytes given back.
#[inline(never)]
pub fn release_unused_stack() -> usize {
    let marker = 0u8;
    let here = std::hint::black_box(std::ptr::addr_of!(marker)) as usize;
    // The mapping a local of ours lies in is this thread's stack: `[stack]` for the main
    // thread, the part of its own mapping above the guard page for another.
    let Some((low, _)) = mapping_of(here) else {
        return 0;
    };
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

/// Unmaps the pages of this program's own file that are read-only and were never
/// written (its code and read-only data), so that only what runs from now on maps them
/// again. Start-up and a burst's work run code once (configuration, TLS set-up,
/// recovery, a container's creation) whose pages, and the 64 KiB the kernel maps around
/// each page touched, would otherwise stay in the process for its life. The pages stay
/// in the page cache, shared with every other process of the binary: the next call of
/// a function dropped here maps its page back from there, not from the disk unless the
/// kernel reclaimed it meanwhile. Returns the bytes unmapped.
pub fn release_clean_code() -> usize {
    let Ok(exe) = std::fs::read_link("/proc/self/exe") else {
        return 0;
    };
    let Ok(smaps) = std::fs::read_to_string("/proc/self/smaps") else {
        return 0;
    };
    clean_file_mappings(&smaps, &exe)
        .into_iter()
        .map(|(low, high)| {
            let len = high - low;
            // SAFETY: [low, high) is a whole mapping of this program's file that is
            // neither writable nor holds a private page (its `Anonymous` is 0): every
            // page in it is the file's own content, which MADV_DONTNEED unmaps and the
            // next access maps back unchanged. Relocated read-only data (RELRO) holds
            // private pages and is never passed here; a read-only mapping cannot gain
            // one afterwards, as nothing can write to it.
            #[allow(unsafe_code)]
            let done = unsafe {
                nix::libc::madvise(low as *mut nix::libc::c_void, len, nix::libc::MADV_DONTNEED)
            };
            if done == 0 {
                len
            } else {
                0
            }
        })
        .sum()
}

/// The mappings of `file` in an smaps text that are not writable and hold no private
/// (anonymous) page: start and end of each.
fn clean_file_mappings(smaps: &str, file: &std::path::Path) -> Vec<(usize, usize)> {
    let file = file.to_string_lossy();
    let mut found = Vec::new();
    // The mapping whose fields are being read, while it may still qualify.
    let mut current: Option<(usize, usize)> = None;
    for line in smaps.lines() {
        let mut words = line.split_whitespace();
        let Some(first) = words.next() else { continue };
        if let Some(range) = address_range(first) {
            // A mapping's header: range, perms, offset, device, inode, path.
            let perms = words.next().unwrap_or("");
            let path = words.skip(3).collect::<Vec<_>>().join(" ");
            let clean = perms.starts_with('r') && !perms.contains('w');
            current = (clean && path == file).then_some(range);
        } else if first == "Anonymous:" {
            if let Some(range) = current.take() {
                if words.next() == Some("0") {
                    found.push(range);
                }
            }
        }
    }
    found
}

/// The `[stack]` mapping of `/proc/self/maps` (the main thread's), start and end.
fn mapping_of(addr: usize) -> Option<(usize, usize)> {
    let maps = std::fs::read_to_string("/proc/self/maps").ok()?;
    maps.lines()
        .filter_map(|l| address_range(l.split(' ').next()?))
        .find(|(low, high)| (*low..*high).contains(&addr))
}

/// A mapping's `low-high` address range of `/proc/<pid>/maps` or `smaps`, when it is one
/// and not empty.
fn address_range(field: &str) -> Option<(usize, usize)> {
    let (low, high) = field.split_once('-')?;
    let low = usize::from_str_radix(low, 16).ok()?;
    let high = usize::from_str_radix(high, 16).ok()?;
    (low < high).then_some((low, high))
}

/// The page size, read once (the allocator asks it for every large block); 4096 where
/// it cannot be read.
fn page_size() -> usize {
    use std::sync::atomic::{AtomicUsize, Ordering};
    static PAGE: AtomicUsize = AtomicUsize::new(0);
    match PAGE.load(Ordering::Relaxed) {
        0 => {
            let p = nix::unistd::sysconf(nix::unistd::SysconfVar::PAGE_SIZE)
                .ok()
                .flatten()
                .and_then(|p| usize::try_from(p).ok())
                .filter(|p| p.is_power_of_two())
                .unwrap_or(4096);
            PAGE.store(p, Ordering::Relaxed);
            p
        }
        p => p,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_read_only_mappings_of_the_file_without_private_pages_are_released() {
        let smaps = "\
55d0a0000000-55d0a0100000 r--p 00000000 fe:01 1234   /usr/bin/holdfast agent
Rss:                 400 kB
Anonymous:             0 kB
55d0a0100000-55d0a0900000 r-xp 00100000 fe:01 1234   /usr/bin/holdfast agent
Rss:                2400 kB
Anonymous:             0 kB
55d0a0900000-55d0a0a00000 r--p 00900000 fe:01 1234   /usr/bin/holdfast agent
Rss:                 900 kB
Anonymous:           320 kB
55d0a0a00000-55d0a0a10000 rw-p 00a00000 fe:01 1234   /usr/bin/holdfast agent
Anonymous:             0 kB
7f0000000000-7f0000100000 r-xp 00000000 fe:01 99     /usr/lib/libc.so.6
Anonymous:             0 kB
";
        let found = clean_file_mappings(smaps, std::path::Path::new("/usr/bin/holdfast agent"));
        // Read-only data and code; not the relocated data (RELRO, private pages), not
        // the writable data, not another file's code.
        assert_eq!(
            found,
            vec![
                (0x55d0a0000000, 0x55d0a0100000),
                (0x55d0a0100000, 0x55d0a0900000)
            ]
        );
    }

    #[test]
    fn tunables_join_what_the_environment_sets_and_yield_to_its_own_settings() {
        assert_eq!(tunables_to_set(None).as_deref(), Some(TUNABLES));
        assert_eq!(tunables_to_set(Some("")).as_deref(), Some(TUNABLES));
        assert_eq!(
            tunables_to_set(Some("glibc.malloc.arena_max=1")),
            Some(format!("glibc.malloc.arena_max=1:{TUNABLES}"))
        );
        assert_eq!(tunables_to_set(Some(TUNABLES)), None);
        // The user's own setting of one of ours stays, and the others join it.
        assert_eq!(
            tunables_to_set(Some("glibc.malloc.arena_max=1:glibc.malloc.tcache_count=3"))
                .as_deref(),
            Some("glibc.malloc.arena_max=1:glibc.malloc.tcache_count=3:glibc.pthread.stack_cache_size=0")
        );
        assert_eq!(
            tunables_to_set(Some(
                "glibc.pthread.stack_cache_size=4194304:glibc.malloc.tcache_count=3"
            )),
            None
        );
        // A name that only starts like one of ours is another tunable.
        assert_eq!(
            tunables_to_set(Some("glibc.malloc.tcache_count_x=1")),
            Some(format!("glibc.malloc.tcache_count_x=1:{TUNABLES}"))
        );
    }

    #[test]
    fn anonymous_memory_is_read_and_grows_with_what_is_written() {
        let before = anonymous_bytes().expect("RssAnon");
        assert!(before > 0);
        // 8 MiB written in a mapping of its own (above the mmap threshold): resident
        // and anonymous while it lives. Other tests' threads allocate meanwhile, so only
        // a growth of most of it is asserted.
        let block = std::hint::black_box(vec![1u8; 8 << 20]);
        let during = anonymous_bytes().expect("RssAnon");
        assert!(during >= before + (6 << 20), "{before} -> {during}");
        drop(block);
    }

    #[test]
    fn released_code_runs_again() {
        assert!(
            release_clean_code() > 0,
            "this test binary's code is a clean mapping"
        );
        // The code just unmapped maps back as it runs, and is found clean again.
        assert!(release_clean_code() > 0);
    }

    /// Calls itself `depth` times with a 4 KiB frame each, writing every frame.
    #[inline(never)]
    fn deep(depth: usize) -> u8 {
        let mut frame = [0u8; 4096];
        std::hint::black_box(&mut frame);
        if depth == 0 {
            return frame[0];
        }
        frame[100].wrapping_add(deep(depth - 1))
    }

    #[test]
    fn a_threads_stack_below_the_caller_goes_back() {
        // A thread of its own, so that the depth reached is known.
        let (released, resident) = std::thread::Builder::new()
            .stack_size(1 << 20)
            .spawn(|| {
                std::hint::black_box(deep(32));
                let released = release_unused_stack();
                let marker = 0u8;
                let here = std::hint::black_box(std::ptr::addr_of!(marker)) as usize;
                let page = page_size();
                // The 28 pages from 16 KiB to 128 KiB below this frame, which `deep` wrote.
                let low = (here & !(page - 1)) - 128 * 1024;
                let mut vec = vec![0u8; 112 * 1024 / page];
                // SAFETY: mincore only reports on the range, which lies in this thread's
                // stack mapping; vec has a byte per page.
                #[allow(unsafe_code)]
                let r = unsafe {
                    nix::libc::mincore(low as *mut nix::libc::c_void, 112 * 1024, vec.as_mut_ptr())
                };
                assert_eq!(r, 0, "mincore: {}", std::io::Error::last_os_error());
                (released, vec.iter().filter(|&&b| b & 1 != 0).count())
            })
            .expect("spawn")
            .join()
            .expect("join");
        assert_eq!(resident, 0, "pages written by the deep call still resident");
        assert!(released >= 128 * 1024, "released {released} bytes");
    }
}
