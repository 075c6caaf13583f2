//! Measuring makes no allocation through the global allocator from inside the hook, also
//! when the address table grows (many live blocks), spans are new, measurements nest and a
//! session records at the same time.
//!
//! The global allocator is a detector wrapped around highwater's `Alloc`: a call that enters
//! it while the same thread is already inside it is an allocation made by the hook.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::hint::black_box;
use std::sync::atomic::{AtomicU64, Ordering};

use highwater::{Alloc, Session, Step};

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

/// One small block per element, each its own allocation.
type Held = Vec<Box<u64>>;

/// 100 000 small blocks live at once (the table doubles several times), in 200 distinct spans.
#[allow(clippy::vec_box)] // the boxes are the point: 100 000 live blocks
fn many_live_blocks() -> Held {
    const NAMES: [&str; 20] = [
        "s0", "s1", "s2", "s3", "s4", "s5", "s6", "s7", "s8", "s9", "s10", "s11", "s12", "s13",
        "s14", "s15", "s16", "s17", "s18", "s19",
    ];
    let _fwd = highwater::profile!("forward", Step::Forward);
    let mut held: Held = Vec::new();
    for i in 0..100_000u64 {
        let _outer = highwater::profile!(NAMES[(i % 20) as usize]);
        let _inner = highwater::profile!(NAMES[(i / 20 % 10) as usize]);
        held.push(black_box(Box::new(i)));
    }
    let ((), inner) = highwater::measure(|| drop(black_box(vec![0u8; 1000])));
    assert_eq!(inner.peak_bytes, 1000);
    held
}

#[test]
fn measuring_never_allocates_through_the_global_allocator() {
    let before = CALLS.load(Ordering::SeqCst);
    let (held, m) = highwater::measure(many_live_blocks);
    assert_eq!(held.len(), 100_000);
    drop(held);
    assert_eq!(
        m.leaked_blocks,
        100_000 + 1,
        "the boxes and the vector holding them"
    );
    assert!(m.is_complete());
    assert!(m.spans.len() > 100, "{} span paths", m.spans.len());

    let session = Session::builder().write_profile(false).start().unwrap();
    let (held, during) = highwater::measure(many_live_blocks);
    drop(held);
    session.finish().unwrap();
    assert_eq!(during.leaked_blocks, m.leaked_blocks);

    let calls = CALLS.load(Ordering::SeqCst) - before;
    assert!(
        calls > 400_000,
        "the workload should exercise the hook: {calls} calls"
    );
    assert_eq!(
        NESTED.load(Ordering::SeqCst),
        0,
        "the hook allocated through the global allocator"
    );
}
