//! A global allocator that notices re-entry: wrapped around highwater's `Alloc`, it counts the
//! calls that enter it while the same thread is already inside it, which is what an allocation
//! made by the hook itself would look like. Shared by the tests that prove the hook (recording,
//! measuring) never allocates through the global allocator.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::sync::atomic::{AtomicU64, Ordering};

use highwater::Alloc;

/// Calls that entered the detector while the same thread was already inside it.
pub static NESTED: AtomicU64 = AtomicU64::new(0);
/// Every call through the detector.
pub static CALLS: AtomicU64 = AtomicU64::new(0);

thread_local! {
    static DEPTH: Cell<u32> = const { Cell::new(0) };
}

/// The detector around `Alloc<System>`.
#[derive(Debug)]
pub struct Detector(pub Alloc<System>);

impl Detector {
    fn around<R>(&self, call: impl FnOnce(&Alloc<System>) -> R) -> R {
        let depth = DEPTH.with(|d| {
            let depth = d.get();
            d.set(depth + 1);
            depth
        });
        if depth > 0 {
            NESTED.fetch_add(1, Ordering::SeqCst);
        }
        CALLS.fetch_add(1, Ordering::Relaxed);
        let result = call(&self.0);
        DEPTH.with(|d| d.set(depth));
        result
    }
}

// SAFETY: forwards every call unchanged.
unsafe impl GlobalAlloc for Detector {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: caller's contract.
        self.around(|inner| unsafe { inner.alloc(layout) })
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: caller's contract.
        self.around(|inner| unsafe { inner.alloc_zeroed(layout) })
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: caller's contract.
        self.around(|inner| unsafe { inner.dealloc(ptr, layout) })
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: caller's contract.
        self.around(|inner| unsafe { inner.realloc(ptr, layout, new_size) })
    }
}
