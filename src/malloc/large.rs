//! The global allocator: the C library's malloc for every block but large ones, which
//! get a mapping of their own.
//!
//! glibc maps a block of its own only when no free chunk of its heap can hold it: after
//! a burst has grown the heap and the trim has handed its free pages back, a large
//! block is carved out of the heap again, over pages that earlier blocks left resident
//! and that no trim can reach while the block lives. sled's log buffer (512 KiB, which
//! sled fills a little at a time and keeps until the next segment) stayed resident
//! whole after a burst that way, where a mapping of its own holds only the pages
//! written. A mapping also goes back to the kernel at once when the block is freed, and
//! leaves no hole in the heap between blocks that live on.

use std::alloc::{GlobalAlloc, Layout, System};

use nix::libc;

use super::page_size as page;

/// Blocks of this size and more get a mapping of their own: glibc's own default
/// threshold, and the one [`super::configure`] fixes.
pub const LARGE: usize = 128 * 1024;

/// glibc's malloc, with blocks of [`LARGE`] bytes and more in mappings of their own.
pub struct Allocator;

/// `n` rounded up to whole pages; None past the address space.
fn pages(n: usize) -> Option<usize> {
    let page = page();
    Some(n.checked_add(page - 1)? & !(page - 1))
}

/// A new mapping of `layout.size()` bytes, zeroed, aligned to `layout.align()`; null
/// when the kernel refuses it.
fn map(layout: Layout) -> *mut u8 {
    let Some(len) = pages(layout.size()) else {
        return std::ptr::null_mut();
    };
    // An alignment above the page's: map that much more, keep an aligned run of `len`
    // and unmap the rest on either side.
    let extra = if layout.align() > page() {
        layout.align()
    } else {
        0
    };
    let Some(total) = len.checked_add(extra) else {
        return std::ptr::null_mut();
    };
    // SAFETY: a new private anonymous mapping at an address of the kernel's choice; it
    // overlaps nothing of ours.
    #[allow(unsafe_code)]
    let at = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            total,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    if at == libc::MAP_FAILED {
        return std::ptr::null_mut();
    }
    let start = at as usize;
    // The mapping is page-aligned: only a larger alignment moves the block's start.
    let aligned = if extra == 0 {
        start
    } else {
        (start + extra - 1) & !(extra - 1)
    };
    let (head, tail) = (aligned - start, start + total - (aligned + len));
    // SAFETY: [start, aligned) and [aligned + len, start + total) are the parts of the
    // mapping just made that the block does not use; nothing refers to them.
    #[allow(unsafe_code)]
    unsafe {
        if head > 0 {
            libc::munmap(at, head);
        }
        if tail > 0 {
            libc::munmap((aligned + len) as *mut libc::c_void, tail);
        }
        // A huge page would make a block of a few written KiB hold 2 MiB. Refused where
        // the kernel has no transparent huge pages, which is as good.
        libc::madvise(aligned as *mut libc::c_void, len, libc::MADV_NOHUGEPAGE);
    }
    aligned as *mut u8
}

/// Unmaps a block [`map`] made for `layout`.
///
/// # Safety
/// `ptr` came from [`map`] with this `layout` and is not used again.
#[allow(unsafe_code)]
unsafe fn unmap(ptr: *mut u8, layout: Layout) {
    if let Some(len) = pages(layout.size()) {
        // SAFETY: the caller's promise: [ptr, ptr + len) is the block's mapping, whole.
        unsafe { libc::munmap(ptr.cast(), len) };
    }
}

// SAFETY: every block of LARGE bytes or more is made by `map` and given back by
// `unmap`, with the size of its layout deciding both, as Rust passes the same layout to
// alloc and dealloc; every other block is the C library's, through `System`. A block
// moves between the two only in `realloc`, by copy.
#[allow(unsafe_code)]
unsafe impl GlobalAlloc for Allocator {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if layout.size() >= LARGE {
            map(layout)
        } else {
            // SAFETY: the caller's layout, as System requires.
            unsafe { System.alloc(layout) }
        }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        if layout.size() >= LARGE {
            // A new mapping is zeroed, and writing zeroes would make it all resident.
            map(layout)
        } else {
            // SAFETY: as in alloc.
            unsafe { System.alloc_zeroed(layout) }
        }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        if layout.size() >= LARGE {
            // SAFETY: a block of this size was made by map (above).
            unsafe { unmap(ptr, layout) }
        } else {
            // SAFETY: a block of this size was made by System.
            unsafe { System.dealloc(ptr, layout) }
        }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let (was_large, is_large) = (layout.size() >= LARGE, new_size >= LARGE);
        if !was_large && !is_large {
            // SAFETY: the caller's block and layout, made by System.
            return unsafe { System.realloc(ptr, layout, new_size) };
        }
        if was_large && is_large && layout.align() <= page() {
            let (Some(old), Some(new)) = (pages(layout.size()), pages(new_size)) else {
                return std::ptr::null_mut();
            };
            if old == new {
                return ptr;
            }
            // SAFETY: [ptr, ptr + old) is the block's whole mapping; the kernel moves or
            // resizes it, keeping its content, and the old address is not used again.
            let moved = unsafe { libc::mremap(ptr.cast(), old, new, libc::MREMAP_MAYMOVE) };
            return if moved == libc::MAP_FAILED {
                std::ptr::null_mut()
            } else {
                moved.cast()
            };
        }
        // Across the threshold, or an alignment mremap would not keep: a new block and
        // a copy.
        let Ok(new_layout) = Layout::from_size_align(new_size, layout.align()) else {
            return std::ptr::null_mut();
        };
        // SAFETY: a valid layout of non-zero size (the caller's promise for new_size).
        let new = unsafe { self.alloc(new_layout) };
        if !new.is_null() {
            // SAFETY: both blocks hold at least the bytes copied and do not overlap; the
            // old one is freed with the layout it was made with.
            unsafe {
                std::ptr::copy_nonoverlapping(ptr, new, layout.size().min(new_size));
                self.dealloc(ptr, layout);
            }
        }
        new
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Which pages of [ptr, ptr + len) are resident, from mincore.
    fn resident(ptr: *mut u8, len: usize) -> Vec<bool> {
        let mut vec = vec![0u8; len.div_ceil(page())];
        // SAFETY: the range is one mapping of this test's; vec has a byte per page.
        #[allow(unsafe_code)]
        let r = unsafe { libc::mincore(ptr.cast(), len, vec.as_mut_ptr()) };
        assert_eq!(r, 0, "mincore: {}", std::io::Error::last_os_error());
        vec.into_iter().map(|b| b & 1 == 1).collect()
    }

    #[test]
    #[allow(unsafe_code)]
    fn a_large_block_holds_only_the_pages_written_and_keeps_its_alignment() {
        let a = Allocator;
        // sled's log buffer: 512 KiB aligned to 8 KiB.
        let layout = Layout::from_size_align(512 * 1024, 8192).expect("layout");
        // SAFETY: a valid layout; the block is written within its size, then freed.
        unsafe {
            let p = a.alloc(layout);
            assert!(!p.is_null());
            assert!((p as usize).is_multiple_of(8192), "aligned as asked");
            p.write_bytes(7, 100);
            let pages = resident(p, layout.size());
            assert!(pages[0], "the page written is resident");
            assert_eq!(
                pages.iter().filter(|r| **r).count(),
                1,
                "no page but the one written is: {pages:?}"
            );
            a.dealloc(p, layout);
        }
        // Zeroed blocks are zero without being written.
        let layout = Layout::from_size_align(256 * 1024, 8).expect("layout");
        // SAFETY: as above.
        unsafe {
            let p = a.alloc_zeroed(layout);
            assert!(!p.is_null());
            assert_eq!(resident(p, layout.size()).iter().filter(|r| **r).count(), 0);
            assert!(std::slice::from_raw_parts(p, layout.size())
                .iter()
                .all(|b| *b == 0));
            a.dealloc(p, layout);
        }
    }

    #[test]
    #[allow(unsafe_code)]
    fn reallocation_keeps_the_content_across_the_threshold_and_within_mappings() {
        let a = Allocator;
        let fill = |p: *mut u8, n: usize| {
            // SAFETY: p holds at least n bytes.
            unsafe { std::slice::from_raw_parts_mut(p, n) }
                .iter_mut()
                .enumerate()
                .for_each(|(i, b)| *b = (i % 251) as u8);
        };
        let check = |p: *mut u8, n: usize| {
            // SAFETY: p holds at least n bytes, written by fill.
            let s = unsafe { std::slice::from_raw_parts(p, n) };
            assert!(s.iter().enumerate().all(|(i, b)| *b == (i % 251) as u8));
        };
        for align in [8, 8192] {
            let small = Layout::from_size_align(1000, align).expect("layout");
            // SAFETY: each step reallocates the block the previous one returned, with
            // the layout it has then, and frees the last one.
            unsafe {
                let p = a.alloc(small);
                assert!(!p.is_null());
                fill(p, 1000);
                // Small to large, large to larger, larger to smaller but large, to small.
                let p = a.realloc(p, small, 300 * 1024);
                assert!(!p.is_null() && (p as usize).is_multiple_of(align));
                check(p, 1000);
                fill(p, 300 * 1024);
                let l = Layout::from_size_align(300 * 1024, align).expect("layout");
                let p = a.realloc(p, l, 3 * 1024 * 1024);
                assert!(!p.is_null() && (p as usize).is_multiple_of(align));
                check(p, 300 * 1024);
                fill(p, 3 * 1024 * 1024);
                let l = Layout::from_size_align(3 * 1024 * 1024, align).expect("layout");
                let p = a.realloc(p, l, 200 * 1024);
                assert!(!p.is_null() && (p as usize).is_multiple_of(align));
                check(p, 200 * 1024);
                let l = Layout::from_size_align(200 * 1024, align).expect("layout");
                let p = a.realloc(p, l, 500);
                assert!(!p.is_null() && (p as usize).is_multiple_of(align));
                check(p, 500);
                a.dealloc(p, Layout::from_size_align(500, align).expect("layout"));
            }
        }
    }

    #[test]
    #[allow(unsafe_code)]
    fn a_freed_large_block_goes_back_to_the_kernel() {
        let a = Allocator;
        let layout = Layout::from_size_align(1024 * 1024, 8).expect("layout");
        // SAFETY: the block is written within its size and freed once.
        let p = unsafe {
            let p = a.alloc(layout);
            assert!(!p.is_null());
            p.write_bytes(1, layout.size());
            a.dealloc(p, layout);
            p
        };
        // The range is no mapping any more (unless another test's thread has mapped
        // something there since, which would answer 0 for a part of it).
        let mut vec = vec![0u8; layout.size() / page()];
        // SAFETY: mincore only reports on the range; vec has a byte per page.
        let r = unsafe { libc::mincore(p.cast(), layout.size(), vec.as_mut_ptr()) };
        let unmapped =
            r == -1 && std::io::Error::last_os_error().raw_os_error() == Some(libc::ENOMEM);
        assert!(
            unmapped || vec.iter().any(|b| b & 1 == 0),
            "the pages stay mapped"
        );
    }
}
