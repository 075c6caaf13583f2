//! The allocator hook makes no allocation through the global allocator while recording.
//!
//! The global allocator here is a detector wrapped around highwater's `Alloc`: it notes when it
//! is entered while already inside itself on the same thread. If recording an event allocated
//! through the global allocator, that nested call would come back through the detector. The
//! rings are small, so the lossless wait for room (spin, then futex) runs too.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::sync::atomic::{AtomicU64, Ordering};

use highwater::{Alloc, Category, Session, Step};

static NESTED: AtomicU64 = AtomicU64::new(0);
static CALLS: AtomicU64 = AtomicU64::new(0);

thread_local! {
    static DEPTH: Cell<u32> = const { Cell::new(0) };
}

struct Detector(Alloc<System>);

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

#[global_allocator]
static ALLOC: Detector = Detector(Alloc::new(System));

fn busy_work() {
    let _fwd = highwater::profile!("forward", Step::Forward);
    let mut kept = Vec::new();
    for i in 0..20_000usize {
        let _inner = highwater::profile!("inner", Category::Activation);
        let mut v = vec![0u8; 1 + i % 300];
        v.reserve(i % 700);
        if i % 10 == 0 {
            kept.push(v);
        }
    }
}

#[test]
fn recording_never_allocates_through_the_global_allocator() {
    let session = Session::builder()
        .ring_events(1 << 10)
        .write_profile(false)
        .start()
        .unwrap();
    let before = CALLS.load(Ordering::SeqCst);
    // New threads claim rings (the cold path) as well as recording into them.
    let threads: Vec<_> = (0..3).map(|_| std::thread::spawn(busy_work)).collect();
    busy_work();
    for thread in threads {
        thread.join().unwrap();
    }
    let calls = CALLS.load(Ordering::SeqCst) - before;
    let profile = session.finish().unwrap();
    assert!(
        calls > 100_000,
        "the workload should exercise the hook: {calls} calls"
    );
    assert!(profile.summary.alloc_count > 0);
    assert!(
        profile.capture.producer_waits > 0,
        "four busy threads on 1024-event rings should have waited for room: {:?}",
        profile.capture
    );
    assert_eq!(profile.summary.dropped_events, 0);
    assert_eq!(
        NESTED.load(Ordering::SeqCst),
        0,
        "the hook allocated through the global allocator"
    );
}
