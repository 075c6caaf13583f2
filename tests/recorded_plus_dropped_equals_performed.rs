//! Four threads allocate at once into deliberately small rings: for every thread, the events
//! the profile recorded plus the events it reports dropped equal the operations the thread
//! performed, as counted by the inner allocator, independently of highwater's event stream.
//! Dropping when full, the small rings drop; lossless (the default), they drop nothing and the
//! profile records exactly what was performed.

// Tests drive the operating system directly; the library goes through its `sys` module.
#![allow(clippy::disallowed_methods)]

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::sync::atomic::{AtomicU64, Ordering};

use highwater::profile::Warning;
use highwater::{Alloc, CaptureMode, Session, Step};

/// Per-thread operation counts kept by the inner allocator for every thread from its first
/// operation, in a fixed table keyed by OS thread id (no allocation, no lock).
struct Counts {
    tids: [AtomicU64; 64],
    allocs: [AtomicU64; 64],
    frees: [AtomicU64; 64],
    reallocs: [AtomicU64; 64],
}

static COUNTS: Counts = Counts {
    tids: [const { AtomicU64::new(0) }; 64],
    allocs: [const { AtomicU64::new(0) }; 64],
    frees: [const { AtomicU64::new(0) }; 64],
    reallocs: [const { AtomicU64::new(0) }; 64],
};

thread_local! {
    /// This thread's row in `COUNTS`, found on its first operation.
    static ROW: Cell<Option<usize>> = const { Cell::new(None) };
}

fn gettid() -> u64 {
    // SAFETY: gettid has no preconditions.
    unsafe { libc::gettid() as u64 }
}

/// The calling thread's row, claimed on first use.
fn row() -> Option<usize> {
    if let Some(row) = ROW.with(Cell::get) {
        return Some(row);
    }
    let tid = gettid();
    let row = (0..64).find(|&row| {
        COUNTS.tids[row].load(Ordering::SeqCst) == tid
            || COUNTS.tids[row]
                .compare_exchange(0, tid, Ordering::SeqCst, Ordering::SeqCst)
                .is_ok()
    })?;
    ROW.with(|cell| cell.set(Some(row)));
    Some(row)
}

fn count(table: &[AtomicU64; 64]) {
    if let Some(row) = row() {
        table[row].fetch_add(1, Ordering::Relaxed);
    }
}

/// The inner allocator: counts what every thread does.
struct Counting;

// SAFETY: forwards every call to System unchanged.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        count(&COUNTS.allocs);
        // SAFETY: caller's contract.
        unsafe { System.alloc(layout) }
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        count(&COUNTS.allocs);
        // SAFETY: caller's contract.
        unsafe { System.alloc_zeroed(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        count(&COUNTS.frees);
        // SAFETY: caller's contract.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        count(&COUNTS.reallocs);
        // SAFETY: caller's contract.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static ALLOC: Alloc<Counting> = Alloc::new(Counting);

const WORKERS: usize = 4;
const ROUNDS: usize = 50_000;

/// One session at a time: the tests of this file share the process.
static ONE_SESSION: std::sync::Mutex<()> = std::sync::Mutex::new(());

#[test]
fn recorded_plus_dropped_equals_performed_per_thread() {
    let (dropped, profile) = run(CaptureMode::DropWhenFull);
    assert!(
        dropped > 0,
        "1024-event rings under four busy threads should have dropped something"
    );
    assert_eq!(profile.capture.mode, CaptureMode::DropWhenFull);
    // Every drop is counted once, by kind and in the summary, and the profile says so once.
    let reported: u64 = profile.capture.dropped_by_kind.values().sum();
    assert_eq!(profile.summary.dropped_events, reported);
    let notices: Vec<_> = profile
        .warnings
        .iter()
        .filter(|w| matches!(w, Warning::DroppedEvents { .. }))
        .collect();
    assert_eq!(
        notices,
        [&Warning::DroppedEvents {
            events: reported,
            mode: CaptureMode::DropWhenFull
        }]
    );
}

#[test]
fn lossless_small_rings_record_everything_performed() {
    let (dropped, profile) = run(CaptureMode::Lossless);
    assert_eq!(profile.capture.mode, CaptureMode::Lossless);
    assert_eq!(dropped, 0, "{:?}", profile.capture);
    assert_eq!(profile.summary.dropped_events, 0);
    assert_eq!(profile.capture.unattributed_dropped, 0);
    assert!(
        profile.capture.producer_waits > 0,
        "1024-event rings under four busy threads should have made some thread wait"
    );
    assert!(!profile
        .warnings
        .iter()
        .any(|w| matches!(w, Warning::DroppedEvents { .. })));
}

/// Runs the workers in a session of `mode`, checks recorded + dropped = performed per thread
/// and kind, and returns the workers' drops and the profile.
fn run(mode: CaptureMode) -> (u64, highwater::Profile) {
    let _one = ONE_SESSION
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    let session = Session::builder()
        .ring_events(1024)
        .capture_mode(mode)
        .write_profile(false)
        .start()
        .unwrap();
    let workers: Vec<_> = (0..WORKERS)
        .map(|worker| {
            std::thread::spawn(move || {
                let _span = highwater::profile!("worker", Step::Forward);
                let mut kept = Vec::with_capacity(16);
                for round in 0..ROUNDS {
                    let mut buffer = vec![worker as u8; 16 + round % 512];
                    buffer.extend_from_slice(&[1, 2, 3]);
                    buffer.shrink_to_fit();
                    if round % 64 == 0 {
                        kept.push(buffer);
                    }
                }
                drop(kept);
                // The row stays set: the thread's exit-time frees count too.
                gettid()
            })
        })
        .collect();
    let tids: Vec<u64> = workers.into_iter().map(|w| w.join().unwrap()).collect();
    let profile = session.finish().unwrap();

    let mut dropped = 0;
    for tid in tids {
        let row = (0..64)
            .find(|&row| COUNTS.tids[row].load(Ordering::SeqCst) == tid)
            .unwrap();
        let performed = |table: &[AtomicU64; 64]| table[row].load(Ordering::SeqCst);
        let recorded: Vec<_> = profile
            .capture
            .threads
            .iter()
            .filter(|thread| thread.os_tid == tid)
            .collect();
        assert_eq!(recorded.len(), 1, "thread {tid} should appear once");
        let thread = recorded[0];
        let context = format!(
            "unattributed {} by kind {:?}; all threads {:#?}",
            profile.capture.unattributed_dropped,
            profile.capture.dropped_by_kind,
            profile.capture.threads
        );
        assert!(performed(&COUNTS.allocs) >= ROUNDS as u64);
        assert_eq!(
            thread.allocs + thread.dropped_allocs,
            performed(&COUNTS.allocs),
            "allocs of thread {tid}: {thread:?}; {context}"
        );
        assert_eq!(
            thread.frees + thread.dropped_frees,
            performed(&COUNTS.frees),
            "frees of thread {tid}: performed {} {thread:?}",
            performed(&COUNTS.frees)
        );
        assert_eq!(
            thread.reallocs + thread.dropped_reallocs,
            performed(&COUNTS.reallocs),
            "reallocs of thread {tid}: {thread:?}; {context}"
        );
        dropped += thread.dropped_allocs + thread.dropped_frees + thread.dropped_reallocs;
    }
    (dropped, profile)
}
