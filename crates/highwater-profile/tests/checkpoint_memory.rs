//! Hardening III, row 11: with 20 M live blocks, one checkpoint raised the process's high-water
//! mark from 1.59 GB to 2.53 GB: assembling the profile copied every block live at the peak to
//! rank the largest. Assembling a profile now needs memory for the profile, not per block.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicI64, Ordering};

use highwater_profile::analysis::{DeviceId, Event, EventKind, Timeline, TimelineConfig};
use highwater_profile::model::Category;

/// Counts bytes held and their high-water mark since the last reset.
struct Counting;

static HELD: AtomicI64 = AtomicI64::new(0);
static PEAK: AtomicI64 = AtomicI64::new(0);

// SAFETY: forwards to `System` under the caller's contract, counting sizes.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let now = HELD.fetch_add(layout.size() as i64, Ordering::Relaxed) + layout.size() as i64;
        PEAK.fetch_max(now, Ordering::Relaxed);
        // SAFETY: the caller's contract.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, block: *mut u8, layout: Layout) {
        HELD.fetch_sub(layout.size() as i64, Ordering::Relaxed);
        // SAFETY: the caller's contract.
        unsafe { System.dealloc(block, layout) }
    }
}

#[global_allocator]
static ALLOC: Counting = Counting;

#[test]
fn assembling_a_profile_copies_no_live_block() {
    const BLOCKS: u64 = 1_000_000;
    let mut timeline = Timeline::new(TimelineConfig::default());
    for i in 0..BLOCKS {
        timeline.apply(&Event {
            ts_ns: i,
            thread: 1,
            span: 0,
            kind: EventKind::Alloc {
                device: DeviceId::CPU,
                addr: 0x1000 + 64 * i,
                size: 48,
                category: Category::Other,
            },
        });
    }
    let before = HELD.load(Ordering::SeqCst);
    PEAK.store(before, Ordering::SeqCst);
    let profile = timeline.profile(BLOCKS);
    let extra = PEAK.load(Ordering::SeqCst) - before;
    assert_eq!(profile.summary.peak_bytes, 48 * BLOCKS);
    assert!(
        extra < (BLOCKS as i64) * 8,
        "assembling took {extra} bytes for {BLOCKS} live blocks"
    );
}
