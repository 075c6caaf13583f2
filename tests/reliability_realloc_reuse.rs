//! A realloc that moves frees its old block inside the inner allocator's call, and another
//! thread may be handed that address before the reallocating thread publishes its record. The
//! record's old half is stamped before the inner call (so it sorts before the reuse), and the
//! profile must apply the reuse after the realloc, or it needs ordering repairs (issue 10, the
//! maps workload's flake under load).
//!
//! Here the inner allocator holds the reallocating thread inside its realloc, after it freed the
//! old block, while another thread is handed that block and the test thread takes a snapshot:
//! the interleaving a descheduled thread produces under heavy load, made deterministic. The
//! test runs in a child process under a watchdog (`highwater_testkit::child::isolated`).

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use highwater::{Alloc, Session};
use highwater_testkit::child::isolated;
use highwater_testkit::counting::gettid;

/// Size of the block that is reallocated, and of the allocation that reuses its address: a
/// size nothing else in the test asks for.
const OLD_SIZE: usize = 3001;
/// Size the block is grown to (the inner realloc always moves it).
const NEW_SIZE: usize = 6001;
/// Longest the inner realloc holds its thread: long enough for a snapshot that does not wait
/// for the reallocating thread to finish first, far longer than the merge's lag.
const HOLD: Duration = Duration::from_secs(1);

/// The thread whose realloc of an `OLD_SIZE` block is held (`0`: none).
static HELD_TID: AtomicU64 = AtomicU64::new(0);
/// The thread that is handed the freed old block by its next `OLD_SIZE` allocation.
static REUSER_TID: AtomicU64 = AtomicU64::new(0);
/// The old block, once the held realloc freed it and until it is handed out again.
static FREED: AtomicUsize = AtomicUsize::new(0);
/// Set once the old block was freed.
static OLD_FREED: AtomicBool = AtomicBool::new(false);
/// Lets the held realloc return.
static RELEASE: AtomicBool = AtomicBool::new(false);

/// The system allocator, except that the held thread's realloc of an `OLD_SIZE` block moves it,
/// keeps the old block for the reusing thread and waits (boundedly) for the test to release it.
struct HandOver;

// SAFETY: every block is a system block of the layout it is used with: the kept old block is
// handed out only for an `OLD_SIZE` request with the same alignment and freed as one.
unsafe impl GlobalAlloc for HandOver {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if layout.size() == OLD_SIZE && gettid() == REUSER_TID.load(Ordering::SeqCst) {
            let block = FREED.swap(0, Ordering::SeqCst);
            if block != 0 {
                return block as *mut u8;
            }
        }
        // SAFETY: caller's contract.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, block: *mut u8, layout: Layout) {
        // SAFETY: caller's contract.
        unsafe { System.dealloc(block, layout) }
    }

    unsafe fn realloc(&self, block: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        if layout.size() != OLD_SIZE || gettid() != HELD_TID.load(Ordering::SeqCst) {
            // SAFETY: caller's contract.
            return unsafe { System.realloc(block, layout, new_size) };
        }
        // SAFETY: `new_size` with the old alignment is a valid layout (caller's contract).
        let moved =
            unsafe { System.alloc(Layout::from_size_align_unchecked(new_size, layout.align())) };
        if moved.is_null() {
            return moved;
        }
        // SAFETY: both blocks hold at least `OLD_SIZE` bytes and do not overlap.
        unsafe { std::ptr::copy_nonoverlapping(block, moved, OLD_SIZE) };
        // The old block is free from here on: another thread may be given it.
        FREED.store(block as usize, Ordering::SeqCst);
        OLD_FREED.store(true, Ordering::SeqCst);
        // Nothing here allocates: this runs inside the hook.
        let since = Instant::now();
        while !RELEASE.load(Ordering::SeqCst) && since.elapsed() < HOLD {
            std::thread::sleep(Duration::from_millis(1));
        }
        moved
    }
}

#[global_allocator]
static GLOBAL: Alloc<HandOver> = Alloc::new(HandOver);

fn old_layout() -> Layout {
    Layout::from_size_align(OLD_SIZE, 8).unwrap()
}

/// Thread A allocates a block and reallocates it; the inner realloc frees the old block and
/// holds A there. Thread B is then handed the old address by its own allocation, and the test
/// thread takes a snapshot before it lets A return (the snapshot waits for A: its ring is busy).
/// The profile must need no ordering repair, see no unknown free and drop nothing: B's
/// allocation of the address must be applied after A's realloc released it.
///
///
/// Two things make it pass: A's ring is busy from before its first clock reading to its publish,
/// so nothing B stamped later is merged before A's realloc, and the analysis gives the old
/// address up at the realloc's first half, so B's allocation, stamped between the halves, is
/// a new block.
#[test]
fn a_reused_old_block_waits_for_the_realloc_that_freed_it() {
    isolated(
        "a_reused_old_block_waits_for_the_realloc_that_freed_it",
        || {
            highwater_testkit::counting::wait_for_other_threads_to_sleep();
            let session = Session::builder().write_profile(false).start().unwrap();
            let reallocating = std::thread::spawn(|| {
                // SAFETY: a non-zero size; the block is reallocated with its own layout and
                // the new block freed with the layout realloc gives it.
                unsafe {
                    let block = std::alloc::alloc(old_layout());
                    assert!(!block.is_null());
                    HELD_TID.store(gettid(), Ordering::SeqCst);
                    let moved = std::alloc::realloc(block, old_layout(), NEW_SIZE);
                    assert!(!moved.is_null());
                    std::alloc::dealloc(moved, Layout::from_size_align(NEW_SIZE, 8).unwrap());
                    block as usize
                }
            });
            while !OLD_FREED.load(Ordering::SeqCst) {
                std::thread::sleep(Duration::from_millis(1));
            }
            let reusing = std::thread::spawn(|| {
                REUSER_TID.store(gettid(), Ordering::SeqCst);
                // SAFETY: a non-zero size; the block is freed below by the test thread with
                // the same layout.
                unsafe { std::alloc::alloc(old_layout()) as usize }
            });
            let reused = reusing.join().unwrap();
            // Without the busy hold this merges B's allocation while A is still inside its realloc.
            let during = session.snapshot().unwrap();
            RELEASE.store(true, Ordering::SeqCst);
            let old = reallocating.join().unwrap();
            assert_eq!(
                reused, old,
                "the test did not hand the old block to the other thread"
            );
            // SAFETY: allocated above with this layout.
            unsafe { std::alloc::dealloc(reused as *mut u8, old_layout()) };
            let profile = session.finish().unwrap();
            let summary = &profile.summary;
            assert_eq!(
                during.summary.reorder_repairs, 0,
                "the snapshot applied the reuse before the realloc: {:?}",
                during.summary
            );
            assert_eq!(summary.reorder_repairs, 0, "{summary:?}");
            assert_eq!(during.capture.late_events, 0, "{:?}", during.capture);
            assert_eq!(profile.capture.late_events, 0, "{:?}", profile.capture);
            assert_eq!(summary.unknown_frees, 0, "{summary:?}");
            assert_eq!(summary.dropped_events, 0, "{summary:?}");
            assert!(summary.realloc_count >= 1, "{summary:?}");
        },
    );
}
