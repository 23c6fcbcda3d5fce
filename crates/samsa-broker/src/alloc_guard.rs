//! The process allocator: the system allocator, except that reservations of
//! 1 GiB or more are served by lazily committed anonymous mappings.
//!
//! Why: `kafka-protocol` 0.18 reserves `Vec` capacity from array lengths read
//! off the wire before it has read a single element. A malformed request that
//! claims 4 billion topics makes it ask for hundreds of gigabytes up front;
//! the system allocator refuses, and a refused allocation aborts the whole
//! broker. No request samsa accepts (at most `max_request_bytes`, 100 MiB by
//! default) needs a single allocation of that size, so such a reservation is
//! mapped with `MAP_NORESERVE`: it costs address space, not memory, because
//! decoding touches at most as many elements as the frame holds and then
//! fails cleanly ("malformed request" → the connection is closed).
//!
//! The promise "nothing a peer sends can panic (or abort) the broker" holds
//! only in a process whose `#[global_allocator]` is [`LazyHugeAllocator`], so
//! every binary that runs a broker declares it: the `samsa` binary
//! (`crates/samsa/src/main.rs`) and this crate's unit tests (`lib.rs`, under
//! `cfg(test)`). A new binary or test target that constructs a broker must do
//! the same.
//!
//! The only `unsafe` code of the broker is here (the workspace denies it
//! elsewhere): the allocator interface and the libc calls it wraps.
#![allow(unsafe_code)]

use std::alloc::{GlobalAlloc, Layout, System};

/// Allocations at or above this size are mapped lazily.
const HUGE: usize = 1 << 30;
const PAGE: usize = 4096;

/// The system allocator, with reservations of [`HUGE`] bytes or more served
/// by lazily committed anonymous mappings (see the module docs).
pub struct LazyHugeAllocator;

fn is_huge(layout: &Layout) -> bool {
    layout.size() >= HUGE && layout.align() <= PAGE
}

unsafe fn map(size: usize) -> *mut u8 {
    // SAFETY: an anonymous private mapping has no preconditions; failure is
    // reported as MAP_FAILED and turned into a null pointer (allocation error).
    let ptr = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            size,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
            -1,
            0,
        )
    };
    if ptr == libc::MAP_FAILED {
        std::ptr::null_mut()
    } else {
        ptr.cast()
    }
}

// SAFETY: every pointer handed out is either the system allocator's (and goes
// back to it) or a fresh page-aligned mapping of at least `layout.size()`
// bytes (and is unmapped with the same size); `is_huge` decides which, from
// the layout alone, identically on allocation and release.
unsafe impl GlobalAlloc for LazyHugeAllocator {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if is_huge(&layout) {
            unsafe { map(layout.size()) }
        } else {
            unsafe { System.alloc(layout) }
        }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        if is_huge(&layout) {
            // Anonymous mappings are zero-filled.
            unsafe { map(layout.size()) }
        } else {
            unsafe { System.alloc_zeroed(layout) }
        }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        if is_huge(&layout) {
            unsafe {
                libc::munmap(ptr.cast(), layout.size());
            }
        } else {
            unsafe { System.dealloc(ptr, layout) }
        }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let new_layout = match Layout::from_size_align(new_size, layout.align()) {
            Ok(l) => l,
            Err(_) => return std::ptr::null_mut(),
        };
        if !is_huge(&layout) && !is_huge(&new_layout) {
            return unsafe { System.realloc(ptr, layout, new_size) };
        }
        let new_ptr = unsafe { self.alloc(new_layout) };
        if !new_ptr.is_null() {
            unsafe {
                std::ptr::copy_nonoverlapping(ptr, new_ptr, layout.size().min(new_size));
                self.dealloc(ptr, layout);
            }
        }
        new_ptr
    }
}

/// Keeps buffers up to 32 MiB in glibc's heap instead of fresh mappings.
///
/// Why: a broker moves megabyte-sized transient buffers all the time (a
/// produce request, a replica fetch answer, its encoding and decoding). By
/// default glibc maps each of those freshly and unmaps it on free, so every
/// use pays ~256 page faults plus zeroing per MiB; on the acks=all
/// replication path that was several milliseconds per 1 MB batch. Served
/// from the heap, freed buffers are reused warm. The trim threshold keeps
/// glibc from handing that memory straight back to the kernel.
pub fn keep_large_buffers_in_the_heap() {
    const MMAP_THRESHOLD: libc::c_int = 32 << 20; // glibc's 64-bit maximum
    const TRIM_THRESHOLD: libc::c_int = 128 << 20;
    // SAFETY: mallopt only sets allocator tunables; it is called before the
    // runtime starts any thread, and a refused value (return 0) leaves the
    // default in place, which is merely slower.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, MMAP_THRESHOLD);
        libc::mallopt(libc::M_TRIM_THRESHOLD, TRIM_THRESHOLD);
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn an_absurd_reservation_costs_address_space_not_an_abort() {
        // 300 GB, more than this machine's memory: the system allocator would
        // refuse and abort; the lazy mapping succeeds and is released.
        let v: Vec<[u8; 64]> = Vec::with_capacity(300_000_000_000 / 64);
        assert!(v.capacity() >= 300_000_000_000 / 64);
        let mut small: Vec<u8> = Vec::with_capacity(16);
        small.extend_from_slice(b"still allocates");
        assert_eq!(&small[..5], b"still");
    }
}
