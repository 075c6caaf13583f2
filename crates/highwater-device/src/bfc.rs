//! An emulation of TensorFlow's BFC ("best-fit with coalescing") allocator
//! (`tensorflow/core/common_runtime/bfc_allocator.cc`, now in `xla/tsl`), written from its
//! documented rules, for what-if replay.
//!
//! # What it models
//!
//! - Requests are rounded up to a multiple of 256 bytes.
//! - Free chunks sit in 21 bins by size, doubling from 256 bytes (bin `i` holds
//!   `[256·2^i, 256·2^(i+1))`, the last bin everything larger), each ordered by size then
//!   address. A request searches its bin and the larger ones for the first chunk that holds it,
//!   which is the smallest such chunk overall, lowest address among equals.
//! - The chunk is split when it is at least twice the request or would waste 128 MiB or more
//!   (`max_internal_fragmentation_bytes`); otherwise the whole chunk is used.
//! - A freed chunk merges at once with free neighbours of its region.
//! - When no chunk fits, a region is obtained from the device (`Extend`): with `allow_growth`,
//!   regions start at 2 MiB and double (the next region doubles again unless this one already
//!   had to grow to hold the request), capped by the memory left; without it, the first region
//!   is the whole memory. Regions are never merged with each other.
//! - Garbage collection (`TF_ENABLE_GPU_GARBAGE_COLLECTION`, on by default): when even a new
//!   region cannot be had, regions with no chunk in use are returned and `Extend` is retried.
//!
//! # What it leaves out
//!
//! Streams and timestamped frees (`timing_counter`, safe frees), the backpedal retry at 90 % of
//! a region when the sub-allocator itself fails (the emulated device never fails below its
//! limit), alignments above 256, per-chunk bookkeeping overhead, and the memory TensorFlow
//! reserves for the runtime outside the allocator.

use super::blocks::{Blocks, End};
use super::online::Online;

/// A slot holding no chunk.
const NONE: u32 = u32::MAX;

/// Rounding of every request and of region sizes.
pub(crate) const MIN_ALLOCATION: u64 = 256;
/// First region size with `allow_growth`.
const INITIAL_REGION: u64 = 2 << 20;
/// A chunk is split when the waste would be at least this (`max_internal_fragmentation_bytes`).
const MAX_INTERNAL_FRAGMENTATION: u64 = 128 << 20;

/// Settings of the emulated BFC allocator.
///
/// # Examples
///
/// ```
/// use highwater_device::BfcOptions;
/// let grow = BfcOptions::default();
/// assert!(grow.allow_growth && grow.garbage_collection);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct BfcOptions {
    /// `allow_growth` (`TF_FORCE_GPU_ALLOW_GROWTH=true`): regions grow from 2 MiB instead of
    /// one region of the whole memory. On by default here, since a whole-memory region says
    /// nothing about how much a run needs.
    pub allow_growth: bool,
    /// Return wholly free regions when the device is full, then retry.
    pub garbage_collection: bool,
}

impl BfcOptions {
    /// `allow_growth` and garbage collection on.
    pub const DEFAULT: BfcOptions = BfcOptions {
        allow_growth: true,
        garbage_collection: true,
    };
}

impl Default for BfcOptions {
    fn default() -> Self {
        Self::DEFAULT
    }
}

#[derive(Debug, Clone, Copy)]
struct Region {
    size: u64,
    /// Chunks in use; 0 means the region is one free chunk.
    in_use: u32,
    /// Whether the region is still held (garbage collection returns idle ones).
    live: bool,
}

/// The emulated BFC allocator.
#[derive(Debug)]
pub(crate) struct Bfc {
    options: BfcOptions,
    limit: u64,
    total_region_bytes: u64,
    next_region_bytes: u64,
    next_addr: u64,
    /// Chunks of every region; the free ones by `(size, address)`: the bins' combined order.
    chunks: Blocks,
    regions: Vec<Region>,
    /// The chunk each live slot holds.
    held: Vec<u32>,
}

/// The request rounded as BFC rounds it.
pub(crate) fn round(size: u64) -> u64 {
    size.max(1)
        .div_ceil(MIN_ALLOCATION)
        .saturating_mul(MIN_ALLOCATION)
}

impl Bfc {
    pub(crate) fn new(options: BfcOptions, limit: u64, slots: usize) -> Self {
        let limit = limit / MIN_ALLOCATION * MIN_ALLOCATION;
        let first = if options.allow_growth {
            INITIAL_REGION.min(limit)
        } else {
            limit
        };
        Self {
            options,
            limit,
            total_region_bytes: 0,
            next_region_bytes: round(first),
            next_addr: 0,
            chunks: Blocks::new(true),
            regions: Vec::new(),
            held: vec![NONE; slots],
        }
    }

    /// `FindChunkPtr`: the smallest free chunk that holds `rounded`, split if worth it; returns
    /// the chunk now in use.
    fn find(&mut self, rounded: u64) -> Option<u32> {
        let i = self.chunks.best_fit(rounded)?;
        let size = self.chunks.get(i).size;
        let split =
            size >= rounded.saturating_mul(2) || size - rounded >= MAX_INTERNAL_FRAGMENTATION;
        let take = if split { rounded } else { size };
        Some(self.chunks.take(i, take, End::Low).0)
    }

    /// `Extend`: a new region large enough for `rounded`, if the device has room.
    fn extend(&mut self, rounded: u64) -> bool {
        let available = (self.limit - self.total_region_bytes) / MIN_ALLOCATION * MIN_ALLOCATION;
        if rounded > available {
            return false;
        }
        let mut grew = false;
        while rounded > self.next_region_bytes {
            self.next_region_bytes = self.next_region_bytes.saturating_mul(2);
            grew = true;
        }
        let bytes = self.next_region_bytes.min(available);
        if !grew {
            self.next_region_bytes = self.next_region_bytes.saturating_mul(2);
        }
        self.total_region_bytes += bytes;
        let region = self.regions.len() as u32;
        self.regions.push(Region {
            size: bytes,
            in_use: 0,
            live: true,
        });
        self.chunks.add_range(self.next_addr, bytes, region);
        self.next_addr = self.next_addr.saturating_add(bytes);
        true
    }

    /// `DeallocateFreeRegions`: returns regions with nothing in use, if that could help.
    fn deallocate_free_regions(&mut self, rounded: u64) -> bool {
        if !self.options.garbage_collection {
            return false;
        }
        let idle: u64 = self
            .regions
            .iter()
            .filter(|r| r.live && r.in_use == 0)
            .map(|r| r.size)
            .sum();
        if idle == 0 || rounded > self.limit - self.total_region_bytes + idle {
            return false;
        }
        let gone: Vec<u32> = self
            .chunks
            .free_from(0)
            .filter(|&i| self.chunks.is_whole(i))
            .collect();
        for i in gone {
            let region = &mut self.regions[self.chunks.get(i).range as usize];
            region.live = false;
            self.total_region_bytes -= region.size;
            self.chunks.remove_range(i);
        }
        true
    }
}

impl Online for Bfc {
    fn alloc(&mut self, slot: u32, size: u64) -> bool {
        let rounded = round(size);
        let found = self
            .find(rounded)
            .or_else(|| self.extend(rounded).then(|| self.find(rounded)).flatten())
            .or_else(|| {
                (self.deallocate_free_regions(rounded) && self.extend(rounded))
                    .then(|| self.find(rounded))
                    .flatten()
            });
        let Some(i) = found else {
            return false;
        };
        self.regions[self.chunks.get(i).range as usize].in_use += 1;
        self.held[slot as usize] = i;
        true
    }

    fn free(&mut self, slot: u32) {
        let i = std::mem::replace(&mut self.held[slot as usize], NONE);
        if i == NONE {
            return;
        }
        self.regions[self.chunks.get(i).range as usize].in_use -= 1;
        self.chunks.give_back(i);
    }

    fn reserved(&self) -> u64 {
        self.total_region_bytes
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    fn bfc(limit: u64) -> Bfc {
        Bfc::new(BfcOptions::default(), limit, 16)
    }

    #[test]
    fn regions_start_at_2_mib_and_double() {
        let mut b = bfc(1 << 30);
        assert!(b.alloc(0, 1000)); // 1024 B from a 2 MiB region, split (2 MiB ≥ 2 × 1 KiB)
        assert_eq!(b.reserved(), 2 * MIB);
        assert!(b.alloc(1, 2 * MIB)); // no chunk holds it: a 4 MiB region
        assert_eq!(b.reserved(), 6 * MIB);
        // 4 MiB - 2 MiB = 2 MiB left there; 3 MiB needs an 8 MiB region.
        assert!(b.alloc(2, 3 * MIB));
        assert_eq!(b.reserved(), 14 * MIB);
        // A request above the next size (16 MiB) grows it to 32 MiB, and the one after stays
        // 32 MiB because this region already had to grow.
        assert!(b.alloc(3, 20 * MIB));
        assert_eq!(b.reserved(), 46 * MIB);
        assert_eq!(b.next_region_bytes, 32 * MIB);
    }

    #[test]
    fn chunks_split_only_when_twice_the_request_and_coalesce_on_free() {
        let mut b = bfc(1 << 30);
        assert!(b.alloc(0, 1200 << 10)); // 2 MiB region: 2 MiB < 2 × 1.17 MiB, no split
        assert_eq!(b.chunks.get(b.held[0]).size, 2 * MIB);
        b.free(0);
        assert!(b.alloc(1, 256 << 10)); // 2 MiB chunk split: 256 KiB + 1.75 MiB
        assert!(b.alloc(2, 256 << 10)); // 1.75 MiB split again
        assert_eq!(b.chunks.free_count(), 1);
        b.free(1);
        b.free(2); // merges with both neighbours: one 2 MiB chunk again
        let free: Vec<_> = b.chunks.free_from(0).map(|i| *b.chunks.get(i)).collect();
        assert_eq!((free.len(), free[0].addr, free[0].size), (1, 0, 2 * MIB));
        b.chunks.check();
        assert_eq!(b.reserved(), 2 * MIB);
    }

    #[test]
    fn best_fit_takes_the_smallest_chunk_that_holds_the_request() {
        let mut b = bfc(1 << 30);
        // Three 512 KiB chunks from the first 2 MiB region, each split off what was left.
        for slot in 0..3 {
            assert!(b.alloc(slot, 512 << 10));
        }
        b.free(0);
        b.free(1); // [0, 1 MiB) free, and [1.5 MiB, 2 MiB) left over from the splits
                   // 300 KiB: the smaller chunk wins although its address is higher.
        assert!(b.alloc(3, 300 << 10));
        assert_eq!(b.chunks.get(b.held[3]).addr, 1536 << 10);
        assert_eq!(b.reserved(), 2 * MIB);
    }

    #[test]
    fn full_device_returns_idle_regions_before_failing() {
        let mut b = bfc(10 * MIB);
        assert!(b.alloc(0, 2 * MIB)); // 2 MiB region
        assert!(b.alloc(1, 4 * MIB)); // 4 MiB region
        b.free(0);
        // 5 MiB: the next region would be 8 MiB, capped by the 4 MiB left — too small. The
        // idle 2 MiB region is returned, leaving 6 MiB: a 6 MiB region holds it.
        assert!(b.alloc(2, 5 * MIB));
        assert_eq!(b.reserved(), 10 * MIB);
        assert!(!b.alloc(3, MIB));
        let no_gc = BfcOptions {
            garbage_collection: false,
            ..BfcOptions::default()
        };
        let mut b = Bfc::new(no_gc, 10 * MIB, 4);
        assert!(b.alloc(0, 2 * MIB) && b.alloc(1, 4 * MIB));
        b.free(0);
        assert!(!b.alloc(2, 5 * MIB));
    }
}
