//! The allocator hook makes no allocation through the global allocator while recording.
//!
//! The global allocator here is a detector wrapped around highwater's `Alloc`: it notes when it
//! is entered while already inside itself on the same thread. If recording an event allocated
//! through the global allocator, that nested call would come back through the detector. The
//! rings are small, so the lossless wait for room (spin, then futex) runs too. Call-site
//! sampling runs at its default mean and with every allocation sampled (each one walks its
//! stack; each new thread finds its stack mapping), by frame pointers and, with
//! `HIGHWATER_UNWINDER=eh-frame`, by call-frame information (issue 35: framehop's unwind, its
//! cache pool and its tables, read while the collector may rebuild them).

use std::alloc::System;
use std::sync::atomic::Ordering;

use highwater::{Alloc, Category, Session, Step};

use highwater_testkit::reentry::{Detector, CALLS, NESTED};

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

/// One session at a time.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

#[test]
fn recording_never_allocates_through_the_global_allocator() {
    let profile = record_busy_threads(None);
    assert!(profile.sampling.samples > 0, "{:?}", profile.sampling);
}

#[test]
fn sampling_every_allocation_never_allocates_through_the_global_allocator() {
    let profile = record_busy_threads(Some(1));
    // Every allocation of the four threads was sampled, each with its stack.
    assert!(profile.sampling.samples >= 80_000, "{:?}", profile.sampling);
    assert!(profile.sites.iter().all(|site| !site.frames.is_empty()));
}

/// Issue 35: every stack unwound by `.eh_frame` (as in a build without frame pointers), on four
/// threads with small rings, allocates nothing through the global allocator either.
#[test]
fn unwinding_by_eh_frame_never_allocates_through_the_global_allocator() {
    let profile = {
        let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
        std::env::set_var("HIGHWATER_UNWINDER", "eh-frame");
        let profile = record_busy_threads_locked(Some(1));
        std::env::remove_var("HIGHWATER_UNWINDER");
        profile
    };
    let sampling = &profile.sampling;
    assert!(sampling.samples >= 80_000, "{sampling:?}");
    assert_eq!(
        sampling.samples_by_unwinder.get("eh-frame"),
        Some(&sampling.samples),
        "{sampling:?}"
    );
    // The unwound stacks reach the code that allocated.
    let named = profile.sites.iter().any(|site| {
        site.frames
            .iter()
            .any(|frame| frame.function.as_deref() == Some("hook_never_allocates::busy_work"))
    });
    assert!(named, "{:#?}", &profile.sites[..profile.sites.len().min(3)]);
}

fn record_busy_threads(sample_bytes: Option<u64>) -> highwater::Profile {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    record_busy_threads_locked(sample_bytes)
}

/// [`record_busy_threads`], holding [`SERIAL`] already.
fn record_busy_threads_locked(sample_bytes: Option<u64>) -> highwater::Profile {
    let mut builder = Session::builder().ring_events(1 << 10).write_profile(false);
    if let Some(mean) = sample_bytes {
        builder = builder.sample_bytes(mean);
    }
    let session = builder.start().unwrap();
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
    profile
}
