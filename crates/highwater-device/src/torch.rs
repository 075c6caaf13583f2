//! An emulation of PyTorch's CUDA caching allocator (`c10/cuda/CUDACachingAllocator.cpp`),
//! written from its documented rules, for what-if replay.
//!
//! # What it models
//!
//! - Requests are rounded up to a multiple of 512 bytes (at least 512).
//! - Rounded requests up to 1 MiB are *small* and come from a small pool whose segments are
//!   2 MiB; larger ones come from the large pool, whose segments are 20 MiB for requests below
//!   10 MiB and the request rounded up to 2 MiB above.
//! - A request takes the smallest cached free block of its pool that holds it (best fit,
//!   lowest address among equals). The block is split when the remainder is at least 512 bytes
//!   (small pool) or more than 1 MiB (large pool); otherwise the whole block is used.
//! - `max_split_size_mb`: blocks of that size or more are never split, a request below it never
//!   takes one, and a request at or above it does not take a block 20 MiB or more larger than
//!   itself. When a segment cannot be obtained, cached oversize blocks are released first.
//! - A freed block merges with free neighbours of its segment and stays cached: reserved memory
//!   only goes down when a segment cannot be obtained, at which point every fully free segment
//!   is released (`empty_cache`) and the request retried; the request fails (out of memory)
//!   only after that.
//! - `expandable_segments`: each pool is one segment that grows by mapping pages (2 MiB for the
//!   small pool, 20 MiB for the large) and on out-of-memory unmaps every page no block uses.
//!
//! # What it leaves out
//!
//! One stream and no CUDA graphs (no per-stream pools, no events delaying reuse);
//! `roundup_power2_divisions`; `garbage_collection_threshold`; the per-process memory
//! fraction; the driver's own overhead (context, cuBLAS workspaces). With expandable segments,
//! the mapped free bytes at the end of a segment are not told apart from its unmapped tail
//! (PyTorch prefers mapped free blocks elsewhere first), and a request does not span into the
//! next segment's address range because there is only one segment per pool.

use super::blocks::{Blocks, End};
use super::online::Online;

const MIB: u64 = 1 << 20;
/// Rounding of every request.
pub(crate) const MIN_BLOCK: u64 = 512;
/// Largest rounded request served from the small pool.
pub(crate) const SMALL_SIZE: u64 = MIB;
/// Segment size of the small pool.
pub(crate) const SMALL_BUFFER: u64 = 2 * MIB;
/// Segment size for large requests below [`MIN_LARGE_ALLOC`].
pub(crate) const LARGE_BUFFER: u64 = 20 * MIB;
/// Requests from here on get a segment of their own, rounded to [`ROUND_LARGE`].
pub(crate) const MIN_LARGE_ALLOC: u64 = 10 * MIB;
/// Rounding of a large request's own segment.
pub(crate) const ROUND_LARGE: u64 = 2 * MIB;
/// Address space of one expandable segment (far more than any device).
const VIRTUAL_BYTES: u64 = 1 << 56;

/// Settings of the emulated PyTorch caching allocator (`PYTORCH_CUDA_ALLOC_CONF`).
///
/// # Examples
///
/// ```
/// use highwater_device::TorchOptions;
/// let conf = TorchOptions::default().max_split_size_mb(128)?.expandable_segments(true);
/// assert_eq!(conf.to_string(), "expandable_segments:True,max_split_size_mb:128");
/// # Ok::<(), highwater_device::TorchOptionError>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct TorchOptions {
    max_split_size: Option<u64>,
    expandable: bool,
}

/// A `max_split_size_mb` PyTorch would reject.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("max_split_size_mb must be more than 20 (PyTorch's large segment), got {0}")]
pub struct TorchOptionError(pub u64);

impl TorchOptions {
    /// PyTorch's defaults: no `max_split_size_mb`, no expandable segments.
    pub const DEFAULT: TorchOptions = TorchOptions {
        max_split_size: None,
        expandable: false,
    };

    /// `max_split_size_mb:N`; PyTorch requires more than 20.
    ///
    /// # Errors
    ///
    /// [`TorchOptionError`] for 20 or less.
    pub fn max_split_size_mb(mut self, mb: u64) -> Result<Self, TorchOptionError> {
        if mb <= LARGE_BUFFER / MIB {
            return Err(TorchOptionError(mb));
        }
        self.max_split_size = Some(mb.saturating_mul(MIB));
        Ok(self)
    }

    /// `expandable_segments:True`.
    pub const fn expandable_segments(mut self, on: bool) -> Self {
        self.expandable = on;
        self
    }

    /// Whether `expandable_segments` is on.
    pub const fn is_expandable(&self) -> bool {
        self.expandable
    }

    fn max_split(&self) -> u64 {
        self.max_split_size.unwrap_or(u64::MAX)
    }
}

impl std::fmt::Display for TorchOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut parts = Vec::new();
        if self.expandable {
            parts.push("expandable_segments:True".to_owned());
        }
        if let Some(bytes) = self.max_split_size {
            parts.push(format!("max_split_size_mb:{}", bytes / MIB));
        }
        if parts.is_empty() {
            f.write_str("defaults")
        } else {
            f.write_str(&parts.join(","))
        }
    }
}

/// The request rounded as PyTorch rounds it.
pub(crate) fn round(size: u64) -> u64 {
    size.max(1).div_ceil(MIN_BLOCK).saturating_mul(MIN_BLOCK)
}

/// The segment `cudaMalloc`ed for a rounded request that found no cached block.
pub(crate) fn segment_size(rounded: u64) -> u64 {
    if rounded <= SMALL_SIZE {
        SMALL_BUFFER
    } else if rounded < MIN_LARGE_ALLOC {
        LARGE_BUFFER
    } else {
        rounded.div_ceil(ROUND_LARGE).saturating_mul(ROUND_LARGE)
    }
}

/// Whether a free block of `block` bytes is split for a rounded request of `rounded`.
fn should_split(small: bool, block: u64, rounded: u64, max_split: u64) -> bool {
    let remaining = block - rounded;
    if small {
        remaining >= MIN_BLOCK
    } else {
        rounded < max_split && remaining > SMALL_SIZE
    }
}

/// Either flavour of the caching allocator.
#[derive(Debug)]
pub(crate) enum Torch {
    Segments(Segments),
    Expandable(Expandable),
}

impl Torch {
    pub(crate) fn new(options: TorchOptions, capacity: u64, slots: usize) -> Self {
        if options.expandable {
            Torch::Expandable(Expandable::new(options, capacity, slots))
        } else {
            Torch::Segments(Segments::new(options, capacity, slots))
        }
    }
}

impl Online for Torch {
    fn alloc(&mut self, slot: u32, size: u64) -> bool {
        match self {
            Torch::Segments(s) => s.alloc(slot, size),
            Torch::Expandable(e) => e.alloc(slot, size),
        }
    }

    fn free(&mut self, slot: u32) {
        match self {
            Torch::Segments(s) => s.free(slot),
            Torch::Expandable(e) => e.free(slot),
        }
    }

    fn reserved(&self) -> u64 {
        match self {
            Torch::Segments(s) => s.reserved,
            Torch::Expandable(e) => e.reserved(),
        }
    }
}

/// A slot holding no block.
const NONE: u32 = u32::MAX;

/// The default allocator: segments from `cudaMalloc`, blocks split and merged inside them.
#[derive(Debug)]
pub(crate) struct Segments {
    options: TorchOptions,
    capacity: u64,
    reserved: u64,
    /// Segments never share addresses: each gets fresh ones, so merging stays inside one.
    next_addr: u64,
    /// Blocks of each pool's segments (`[small, large]`), the free ones by `(size, address)`.
    pools: [Blocks; 2],
    /// The pool (0 small, 1 large) and block each live slot holds.
    held: Vec<(u8, u32)>,
}

impl Segments {
    fn new(options: TorchOptions, capacity: u64, slots: usize) -> Self {
        Self {
            options,
            capacity,
            reserved: 0,
            next_addr: 0,
            pools: [Blocks::new(true), Blocks::new(true)],
            held: vec![(0, NONE); slots],
        }
    }

    /// The cached block a rounded request may take, if any.
    fn cached(&self, pool: usize, rounded: u64) -> Option<u32> {
        let max_split = self.options.max_split();
        let i = self.pools[pool].best_fit(rounded)?;
        let size = self.pools[pool].get(i).size;
        if rounded < max_split && size >= max_split {
            return None;
        }
        if rounded >= max_split && size >= rounded.saturating_add(LARGE_BUFFER) {
            return None;
        }
        Some(i)
    }

    /// A fresh segment of `bytes` as one free block, if the device has room.
    fn new_segment(&mut self, pool: usize, bytes: u64) -> Option<u32> {
        if bytes > self.capacity.saturating_sub(self.reserved) {
            return None;
        }
        self.reserved += bytes;
        let addr = self.next_addr;
        self.next_addr = self.next_addr.saturating_add(bytes);
        Some(self.pools[pool].add_range(addr, bytes, 0))
    }

    /// Gives the cached whole segment `i` of `pool` back to the device.
    fn release(&mut self, pool: usize, i: u32) {
        self.reserved -= self.pools[pool].get(i).size;
        self.pools[pool].remove_range(i);
    }

    /// Cached whole segments of at least `max_split_size` in the request's pool: the smallest
    /// that covers `want`, else the largest ones until `want` is covered.
    fn release_oversize(&mut self, pool: usize, rounded: u64) -> bool {
        let max_split = self.options.max_split();
        if max_split == u64::MAX {
            return false;
        }
        let want = rounded.max(max_split);
        let blocks = &self.pools[pool];
        let single = blocks.free_from(want).find(|&i| blocks.is_whole(i));
        if let Some(i) = single {
            self.release(pool, i);
            return true;
        }
        let candidates: Vec<u32> = blocks
            .free_from(max_split)
            .rev()
            .filter(|&i| blocks.is_whole(i))
            .collect();
        let mut released = 0u64;
        for i in candidates {
            if released >= want {
                break;
            }
            released += self.pools[pool].get(i).size;
            self.release(pool, i);
        }
        released >= want
    }

    /// `empty_cache`: every cached block that is a whole segment goes back to the device.
    fn release_cached(&mut self) -> bool {
        let mut any = false;
        for pool in 0..2 {
            let blocks = &self.pools[pool];
            let whole: Vec<u32> = blocks
                .free_from(0)
                .filter(|&i| blocks.is_whole(i))
                .collect();
            any |= !whole.is_empty();
            for i in whole {
                self.release(pool, i);
            }
        }
        any
    }

    fn alloc(&mut self, slot: u32, size: u64) -> bool {
        let rounded = round(size);
        let small = rounded <= SMALL_SIZE;
        let pool = usize::from(!small);
        let segment = segment_size(rounded);
        let found = self.cached(pool, rounded).or_else(|| {
            self.new_segment(pool, segment)
                .or_else(|| {
                    self.release_oversize(pool, rounded)
                        .then(|| self.new_segment(pool, segment))
                        .flatten()
                })
                .or_else(|| {
                    self.release_cached()
                        .then(|| self.new_segment(pool, segment))
                        .flatten()
                })
        });
        let Some(i) = found else {
            return false;
        };
        let block = self.pools[pool].get(i).size;
        let take = if should_split(small, block, rounded, self.options.max_split()) {
            rounded
        } else {
            block
        };
        let (used, _) = self.pools[pool].take(i, take, End::Low);
        self.held[slot as usize] = (pool as u8, used);
        true
    }

    fn free(&mut self, slot: u32) {
        let (pool, i) = std::mem::replace(&mut self.held[slot as usize], (0, NONE));
        if i != NONE {
            self.pools[usize::from(pool)].give_back(i);
        }
    }

    /// The block slot `slot` holds; for tests.
    #[cfg(test)]
    fn block_of(&self, slot: u32) -> super::blocks::Block {
        let (pool, i) = self.held[slot as usize];
        *self.pools[usize::from(pool)].get(i)
    }
}

/// One pool's expandable segment: blocks over one address space, pages mapped on demand.
#[derive(Debug)]
struct Expanse {
    page: u64,
    /// The segment's blocks: one range over the whole address space.
    blocks: Blocks,
    /// Per page: mapped, and how many allocated blocks touch it.
    mapped: Vec<bool>,
    users: Vec<u32>,
    mapped_pages: u64,
}

impl Expanse {
    fn new(page: u64) -> Self {
        let mut blocks = Blocks::new(true);
        blocks.add_range(0, VIRTUAL_BYTES, 0);
        Self {
            page,
            blocks,
            mapped: Vec::new(),
            users: Vec::new(),
            mapped_pages: 0,
        }
    }

    fn pages(&self, addr: u64, size: u64) -> std::ops::Range<usize> {
        (addr / self.page) as usize..(addr + size).div_ceil(self.page) as usize
    }

    /// Where a rounded request goes and how many bytes it takes: the smallest free block that
    /// holds it, split unless the remainder is too small to keep.
    fn place(&self, small: bool, rounded: u64) -> Option<(u32, u64)> {
        let i = self.blocks.best_fit(rounded)?;
        let b = self.blocks.get(i);
        let tail = b.addr + b.size == VIRTUAL_BYTES;
        let take = if tail || should_split(small, b.size, rounded, u64::MAX) {
            rounded
        } else {
            b.size
        };
        Some((i, take))
    }

    /// Pages of `take` bytes from the start of block `i` not mapped yet.
    fn unmapped_in(&self, i: u32, take: u64) -> u64 {
        self.pages(self.blocks.get(i).addr, take)
            .filter(|&p| !self.mapped.get(p).copied().unwrap_or(false))
            .count() as u64
    }

    /// Allocates `take` bytes from the start of free block `i`, mapping its pages; returns
    /// the allocated block.
    fn commit(&mut self, i: u32, take: u64) -> u32 {
        let pages = self.pages(self.blocks.get(i).addr, take);
        let (used, _) = self.blocks.take(i, take, End::Low);
        if self.mapped.len() < pages.end {
            self.mapped.resize(pages.end, false);
            self.users.resize(pages.end, 0);
        }
        for p in pages {
            if !self.mapped[p] {
                self.mapped[p] = true;
                self.mapped_pages += 1;
            }
            self.users[p] += 1;
        }
        used
    }

    fn release(&mut self, i: u32) {
        let b = *self.blocks.get(i);
        for p in self.pages(b.addr, b.size) {
            self.users[p] -= 1;
        }
        self.blocks.give_back(i);
    }

    /// Unmaps every page no block touches; whether any was.
    fn unmap_unused(&mut self) -> bool {
        let before = self.mapped_pages;
        for (p, mapped) in self.mapped.iter_mut().enumerate() {
            if *mapped && self.users[p] == 0 {
                *mapped = false;
                self.mapped_pages -= 1;
            }
        }
        self.mapped_pages < before
    }
}

/// `expandable_segments:True`: one growing segment per pool.
#[derive(Debug)]
pub(crate) struct Expandable {
    capacity: u64,
    /// `[small, large]`.
    pools: [Expanse; 2],
    /// The pool and block each live slot holds.
    held: Vec<(u8, u32)>,
}

impl Expandable {
    fn new(_options: TorchOptions, capacity: u64, slots: usize) -> Self {
        Self {
            capacity,
            pools: [Expanse::new(SMALL_BUFFER), Expanse::new(LARGE_BUFFER)],
            held: vec![(0, NONE); slots],
        }
    }

    fn reserved(&self) -> u64 {
        self.pools.iter().map(|p| p.mapped_pages * p.page).sum()
    }

    fn alloc(&mut self, slot: u32, size: u64) -> bool {
        let rounded = round(size);
        let small = rounded <= SMALL_SIZE;
        let pool = usize::from(!small);
        let Some((i, take)) = self.pools[pool].place(small, rounded) else {
            return false;
        };
        let page = self.pools[pool].page;
        let room = self.capacity.saturating_sub(self.reserved());
        if self.pools[pool].unmapped_in(i, take).saturating_mul(page) > room {
            let unmapped = self
                .pools
                .iter_mut()
                .fold(false, |any, p| p.unmap_unused() | any);
            let room = self.capacity.saturating_sub(self.reserved());
            if !unmapped || self.pools[pool].unmapped_in(i, take).saturating_mul(page) > room {
                return false;
            }
        }
        let used = self.pools[pool].commit(i, take);
        self.held[slot as usize] = (pool as u8, used);
        true
    }

    fn free(&mut self, slot: u32) {
        let (pool, i) = std::mem::replace(&mut self.held[slot as usize], (0, NONE));
        if i != NONE {
            self.pools[usize::from(pool)].release(i);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn torch(options: TorchOptions, capacity: u64) -> Torch {
        Torch::new(options, capacity, 16)
    }

    #[test]
    fn rounding_and_segment_sizes_follow_the_documented_rules() {
        assert_eq!((round(1), round(512), round(513)), (512, 512, 1024));
        assert_eq!(segment_size(512), 2 * MIB);
        assert_eq!(segment_size(MIB), 2 * MIB);
        assert_eq!(segment_size(MIB + 512), 20 * MIB);
        assert_eq!(segment_size(10 * MIB - 512), 20 * MIB);
        assert_eq!(segment_size(10 * MIB), 10 * MIB);
        assert_eq!(segment_size(11 * MIB), 12 * MIB);
    }

    #[test]
    fn small_requests_share_one_2_mib_segment_and_are_split_from_it() {
        let mut t = torch(TorchOptions::default(), 1 << 30);
        // 1000 B → 1024; 300 B → 512; both carved from one 2 MiB segment.
        assert!(t.alloc(0, 1000) && t.alloc(1, 300));
        assert_eq!(t.reserved(), 2 * MIB);
        // A 1 MiB request still fits the 2 MiB - 1.5 KiB left in the same segment.
        assert!(t.alloc(2, MIB));
        assert_eq!(t.reserved(), 2 * MIB);
        // Another 1 MiB does not: a second segment.
        assert!(t.alloc(3, MIB));
        assert_eq!(t.reserved(), 4 * MIB);
        // Frees cache; nothing is given back.
        for s in 0..4 {
            t.free(s);
        }
        assert_eq!(t.reserved(), 4 * MIB);
    }

    #[test]
    fn large_requests_get_20_mib_segments_below_10_mib_and_their_own_above() {
        let mut t = torch(TorchOptions::default(), 1 << 30);
        assert!(t.alloc(0, 3 * MIB)); // 20 MiB segment, 17 MiB left cached
        assert!(t.alloc(1, 5 * MIB)); // from the remainder: 12 MiB left
        assert_eq!(t.reserved(), 20 * MIB);
        // 11 MiB takes the cached 12 MiB; the 1 MiB remainder is not split off (only
        // remainders above 1 MiB are), so the block is the whole 12 MiB.
        assert!(t.alloc(2, 11 * MIB));
        assert_eq!(t.reserved(), 20 * MIB);
        let Torch::Segments(s) = &t else { panic!() };
        assert_eq!(s.block_of(2).size, 12 * MIB);
        // Nothing cached now: 11 MiB gets a segment of its own, rounded up to 12 MiB.
        assert!(t.alloc(3, 11 * MIB));
        assert_eq!(t.reserved(), 32 * MIB);
    }

    #[test]
    fn best_fit_picks_the_smallest_cached_block() {
        let mut t = torch(TorchOptions::default(), 1 << 30);
        // Two segments of their own (12 and 16 MiB), both cached whole after the frees.
        assert!(t.alloc(0, 12 * MIB) && t.alloc(1, 16 * MIB)); // segments 12 + 16
        t.free(0);
        t.free(1);
        assert!(t.alloc(2, 4 * MIB)); // smallest cached block that holds it: the 12 MiB one
        let Torch::Segments(s) = &t else { panic!() };
        assert_eq!(s.block_of(2).addr, 0);
        assert_eq!(t.reserved(), 28 * MIB);
    }

    #[test]
    fn out_of_memory_releases_cached_segments_and_retries_before_failing() {
        let mut t = torch(TorchOptions::default(), 40 * MIB);
        assert!(t.alloc(0, 30 * MIB)); // 30 MiB segment
        t.free(0); // cached
        assert!(t.alloc(1, 32 * MIB)); // does not fit the cache; empty_cache, then 32 MiB
        assert_eq!(t.reserved(), 32 * MIB);
        assert!(!t.alloc(2, 10 * MIB)); // 10 MiB segment would need 42 MiB
        assert_eq!(t.reserved(), 32 * MIB);
    }

    #[test]
    fn max_split_size_keeps_small_requests_out_of_oversize_blocks() {
        let conf = TorchOptions::default().max_split_size_mb(64).unwrap();
        let mut t = torch(conf, 1 << 30);
        assert!(t.alloc(0, 100 * MIB));
        t.free(0); // a cached 100 MiB oversize block
        assert!(t.alloc(1, 4 * MIB)); // may not use it: a new 20 MiB segment
        assert_eq!(t.reserved(), 120 * MIB);
        assert!(t.alloc(2, 90 * MIB)); // at least 64 MiB and within 20 MiB of it: reused
        assert_eq!(t.reserved(), 120 * MIB);
        t.free(2);
        assert!(t.alloc(3, 70 * MIB)); // 30 MiB of waste: not reused, a new segment
        assert_eq!(t.reserved(), 190 * MIB);
        assert!(TorchOptions::default().max_split_size_mb(20).is_err());
    }

    #[test]
    fn max_split_size_releases_oversize_blocks_before_emptying_the_cache() {
        let conf = TorchOptions::default().max_split_size_mb(64).unwrap();
        let mut t = torch(conf, 150 * MIB);
        assert!(t.alloc(0, 100 * MIB) && t.alloc(1, 4 * MIB)); // 100 + 20 reserved
        t.free(0);
        t.free(1);
        // 40 MiB: no cached block may serve it; no room for a 40 MiB segment (120 + 40 > 150):
        // the oversize 100 MiB block goes first, and the small segment stays cached.
        assert!(t.alloc(2, 40 * MIB));
        assert_eq!(t.reserved(), 60 * MIB);
    }

    #[test]
    fn expandable_segments_map_pages_and_unmap_unused_ones_on_out_of_memory() {
        let conf = TorchOptions::default().expandable_segments(true);
        let mut t = torch(conf, 100 * MIB);
        assert!(t.alloc(0, 3 * MIB)); // large pool: one 20 MiB page
        assert!(t.alloc(1, 30 * MIB)); // [3, 33) MiB: pages 0 and 1 → 40 MiB mapped
        assert_eq!(t.reserved(), 40 * MIB);
        assert!(t.alloc(2, 100)); // small pool: one 2 MiB page
        assert_eq!(t.reserved(), 42 * MIB);
        t.free(1); // cached: pages stay mapped
        assert_eq!(t.reserved(), 42 * MIB);
        // 70 MiB at 3 MiB covers pages 0..=3: two more pages, 82 MiB mapped in all.
        assert!(t.alloc(3, 70 * MIB));
        assert_eq!(t.reserved(), 82 * MIB);
        t.free(3);
        t.free(0);
        // 95 MiB needs five pages = 100 MiB, plus the small page: unmap the unused large pages
        // first (everything but the small pool's page), then 100 + 2 > 100 still fails.
        assert!(!t.alloc(4, 95 * MIB));
        assert_eq!(t.reserved(), 2 * MIB);
        t.free(2);
        assert!(t.alloc(5, 95 * MIB)); // the small page is released on this attempt
        assert_eq!(t.reserved(), 100 * MIB);
    }
}
