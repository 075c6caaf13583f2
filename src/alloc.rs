//! [`Alloc`]: the `#[global_allocator]` wrapper that records every heap allocation.

use std::alloc::{GlobalAlloc, Layout, System};

use crate::{capture, measure};

/// A global allocator that records every allocation, reallocation and free of the allocator it
/// wraps while a [`Session`](crate::Session) runs, and passes straight through otherwise.
///
/// Recording writes a 32-byte event into a per-thread ring: no lock, no allocation through the
/// global allocator, no panic. When the wrapped allocator returns null, the refusal is recorded
/// as an out-of-memory event and the thread waits (at most 5 s) for the session to write a
/// checkpoint that includes it, before null is returned: Rust aborts the process next. The wrapped allocator is called first for allocations and last
/// for frees, so a block freed on one thread is recorded as freed before another thread can be
/// handed the same address.
///
/// # Examples
///
/// ```
/// #[global_allocator]
/// static ALLOC: highwater::Alloc = highwater::Alloc::system();
/// # fn main() {}
/// ```
///
/// Wrapping another allocator:
///
/// ```
/// use std::alloc::System;
/// static ALLOC: highwater::Alloc<System> = highwater::Alloc::new(System);
/// ```
#[derive(Debug, Default)]
pub struct Alloc<A = System> {
    inner: A,
}

impl Alloc<System> {
    /// Records allocations made by the system allocator.
    pub const fn system() -> Alloc<System> {
        Alloc { inner: System }
    }
}

impl<A> Alloc<A> {
    /// Records allocations made by `inner`.
    pub const fn new(inner: A) -> Alloc<A> {
        Alloc { inner }
    }

    /// The wrapped allocator.
    pub const fn inner(&self) -> &A {
        &self.inner
    }
}

// SAFETY: every method forwards to the inner allocator with the caller's arguments unchanged
// and returns its result unchanged; recording only reads the pointers and sizes.
unsafe impl<A: GlobalAlloc> GlobalAlloc for Alloc<A> {
    #[inline]
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: forwarded under the caller's contract for `GlobalAlloc::alloc`.
        let block = unsafe { self.inner.alloc(layout) };
        if !block.is_null() {
            capture::record_alloc(block as usize, layout.size());
            measure::on_alloc(block as usize, layout.size());
        } else {
            capture::oom::heap_refused(layout.size());
        }
        block
    }

    #[inline]
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: forwarded under the caller's contract for `GlobalAlloc::alloc_zeroed`.
        let block = unsafe { self.inner.alloc_zeroed(layout) };
        if !block.is_null() {
            capture::record_alloc(block as usize, layout.size());
            measure::on_alloc(block as usize, layout.size());
        } else {
            capture::oom::heap_refused(layout.size());
        }
        block
    }

    #[inline]
    unsafe fn dealloc(&self, block: *mut u8, layout: Layout) {
        capture::record_free(block as usize, layout.size());
        measure::on_free(block as usize, layout.size());
        // SAFETY: forwarded under the caller's contract for `GlobalAlloc::dealloc`.
        unsafe { self.inner.dealloc(block, layout) }
    }

    #[inline]
    unsafe fn realloc(&self, block: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        if !capture::recording() {
            // SAFETY: forwarded under the caller's contract for `GlobalAlloc::realloc`.
            let moved = unsafe { self.inner.realloc(block, layout, new_size) };
            if !moved.is_null() {
                measure::on_realloc(block as usize, layout.size(), moved as usize, new_size);
            }
            return moved;
        }
        // Recorded around the inner call: its old half must be stamped before the old block
        // can be freed and handed to another thread (see `capture::record_realloc`).
        let moved = capture::record_realloc(block as usize, layout.size(), new_size, || {
            // SAFETY: forwarded under the caller's contract for `GlobalAlloc::realloc`.
            unsafe { self.inner.realloc(block, layout, new_size) }
        });
        if !moved.is_null() {
            measure::on_realloc(block as usize, layout.size(), moved as usize, new_size);
        } else {
            // The old block stays live, as the caller still owns it.
            capture::oom::heap_refused(new_size);
        }
        moved
    }
}
