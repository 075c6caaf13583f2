//! Replaying a [`Trace`] through an online allocator: one that sees each request only when it
//! comes, as every real allocator does.

use super::pool::{Handle, Pool};
use super::trace::{Event, Trace};
use super::Strategy;

/// An allocator the what-if replay can drive. Slots come from the trace; a refused allocation's
/// slot is never freed.
pub(crate) trait Online {
    /// Places `size` bytes for `slot`; false when the device cannot hold it (out of memory).
    fn alloc(&mut self, slot: u32, size: u64) -> bool;
    /// Frees `slot`'s block.
    fn free(&mut self, slot: u32);
    /// Bytes the allocator holds from the device now (segments, regions, or a pool's blocks).
    fn reserved(&self) -> u64;
}

/// What one replay showed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Outcome {
    /// Most bytes held from the device at once.
    pub(crate) peak: u64,
    /// Index of the first event that could not be served.
    pub(crate) first_failure: Option<usize>,
    /// Allocations refused (skipped; the replay goes on).
    pub(crate) failures: u64,
}

/// Replays every event of `trace` through `allocator`.
pub(crate) fn drive(trace: &Trace, allocator: &mut dyn Online) -> Outcome {
    let mut refused = vec![false; trace.slots];
    let mut outcome = Outcome {
        peak: 0,
        first_failure: None,
        failures: 0,
    };
    for (i, event) in trace.events.iter().enumerate() {
        match *event {
            Event::Alloc { slot, size, .. } => {
                if allocator.alloc(slot, size) {
                    refused[slot as usize] = false;
                    outcome.peak = outcome.peak.max(allocator.reserved());
                } else {
                    refused[slot as usize] = true;
                    outcome.failures += 1;
                    outcome.first_failure.get_or_insert(i);
                    // A refusal may have released cached memory before giving up.
                    outcome.peak = outcome.peak.max(allocator.reserved());
                }
            }
            Event::Free { slot } => {
                if !refused[slot as usize] {
                    allocator.free(slot);
                }
            }
        }
    }
    outcome
}

/// One of highwater's own pools: a fixed pool of the device's size that holds its blocks, so
/// what it "reserves" is the bytes of its live blocks after rounding.
#[derive(Debug)]
pub(crate) struct FixedPool {
    /// Freed by handle: the replay knows each slot's block, so the pool need not look it up.
    pool: Pool,
    /// Each live slot's block and the bytes it asked for.
    held: Vec<(Handle, u64)>,
}

impl FixedPool {
    pub(crate) fn new(strategy: Strategy, capacity: u64, slots: usize) -> Self {
        Self {
            pool: Pool::by_handle(capacity, strategy),
            held: vec![(Handle::default(), 0); slots],
        }
    }
}

impl Online for FixedPool {
    fn alloc(&mut self, slot: u32, size: u64) -> bool {
        let Some(rounded) = self.pool.round(size) else {
            return false;
        };
        // No `fits` check first: a placement that fails changes nothing, and the pool's model
        // test holds `alloc` to succeed exactly when `fits` says it would.
        match self.pool.place(rounded, size) {
            Some((_, handle)) => {
                self.held[slot as usize] = (handle, size);
                true
            }
            None => false,
        }
    }

    fn free(&mut self, slot: u32) {
        let (handle, size) = self.held[slot as usize];
        self.pool.free_placed(handle, size);
    }

    fn reserved(&self) -> u64 {
        self.pool.counters().in_use
    }
}
