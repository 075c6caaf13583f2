//! Measuring makes no allocation through the global allocator from inside the hook, also
//! when the address table grows (many live blocks), spans are new, call sites are sampled (stacks
//! walked and interned), measurements nest and a session records at the same time.
//!
//! The global allocator is a detector wrapped around highwater's `Alloc`: a call that enters
//! it while the same thread is already inside it is an allocation made by the hook.

use std::alloc::System;
use std::hint::black_box;
use std::sync::atomic::Ordering;

use highwater::{Alloc, Session, Step};

use highwater_testkit::reentry::{Detector, CALLS, NESTED};

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
    let samples: u64 = m.sites.iter().map(|site| site.samples).sum();
    assert!(
        samples > 5,
        "stacks were walked inside the hook: {samples} samples"
    );

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
