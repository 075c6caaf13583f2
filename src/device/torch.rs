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

use std::collections::{BTreeMap, BTreeSet};

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
/// use highwater::device::TorchOptions;
/// let conf = TorchOptions::default().max_split_size_mb(128)?.expandable_segments(true);
/// assert_eq!(conf.to_string(), "expandable_segments:True,max_split_size_mb:128");
/// # Ok::<(), highwater::device::TorchOptionError>(())
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

const NONE: u32 = u32::MAX;

#[derive(Debug, Clone, Copy)]
struct Block {
    addr: u64,
    size: u64,
    prev: u32,
    next: u32,
    allocated: bool,
    small: bool,
}

/// The default allocator: segments from `cudaMalloc`, blocks split and merged inside them.
#[derive(Debug)]
pub(crate) struct Segments {
    options: TorchOptions,
    capacity: u64,
    reserved: u64,
    /// Segments never share addresses: each gets fresh ones, so merging stays inside one.
    next_addr: u64,
    blocks: Vec<Block>,
    vacant: Vec<u32>,
    /// Free blocks per pool (`[small, large]`) by `(size, address)`.
    free: [BTreeMap<(u64, u64), u32>; 2],
    /// The block each live slot holds.
    held: Vec<u32>,
}

impl Segments {
    fn new(options: TorchOptions, capacity: u64, slots: usize) -> Self {
        Self {
            options,
            capacity,
            reserved: 0,
            next_addr: 0,
            blocks: Vec::new(),
            vacant: Vec::new(),
            free: [BTreeMap::new(), BTreeMap::new()],
            held: vec![NONE; slots],
        }
    }

    fn new_block(&mut self, block: Block) -> u32 {
        match self.vacant.pop() {
            Some(i) => {
                self.blocks[i as usize] = block;
                i
            }
            None => {
                self.blocks.push(block);
                (self.blocks.len() - 1) as u32
            }
        }
    }

    fn cache(&mut self, i: u32) {
        let b = self.blocks[i as usize];
        self.free[usize::from(!b.small)].insert((b.size, b.addr), i);
    }

    fn uncache(&mut self, i: u32) {
        let b = self.blocks[i as usize];
        self.free[usize::from(!b.small)].remove(&(b.size, b.addr));
    }

    /// The cached block a rounded request takes, if any (removed from the cache).
    fn take_cached(&mut self, small: bool, rounded: u64) -> Option<u32> {
        let max_split = self.options.max_split();
        let (&(size, _), &i) = self.free[usize::from(!small)]
            .range((rounded, 0)..)
            .next()?;
        if rounded < max_split && size >= max_split {
            return None;
        }
        if rounded >= max_split && size >= rounded.saturating_add(LARGE_BUFFER) {
            return None;
        }
        self.uncache(i);
        Some(i)
    }

    /// A fresh segment of `bytes` as one block, if the device has room.
    fn new_segment(&mut self, small: bool, bytes: u64) -> Option<u32> {
        if bytes > self.capacity.saturating_sub(self.reserved) {
            return None;
        }
        self.reserved += bytes;
        let addr = self.next_addr;
        self.next_addr = self.next_addr.saturating_add(bytes);
        Some(self.new_block(Block {
            addr,
            size: bytes,
            prev: NONE,
            next: NONE,
            allocated: false,
            small,
        }))
    }

    fn release(&mut self, i: u32) {
        self.uncache(i);
        self.reserved -= self.blocks[i as usize].size;
        self.vacant.push(i);
    }

    /// Cached whole segments of at least `max_split_size` in the request's pool: the smallest
    /// that covers `want`, else the largest ones until `want` is covered.
    fn release_oversize(&mut self, small: bool, rounded: u64) -> bool {
        let max_split = self.options.max_split();
        if max_split == u64::MAX {
            return false;
        }
        let want = rounded.max(max_split);
        let whole = |b: &Block| b.prev == NONE && b.next == NONE;
        let pool = usize::from(!small);
        let single = self.free[pool]
            .range((want, 0)..)
            .map(|(_, &i)| i)
            .find(|&i| whole(&self.blocks[i as usize]));
        if let Some(i) = single {
            self.release(i);
            return true;
        }
        let candidates: Vec<u32> = self.free[pool]
            .iter()
            .rev()
            .take_while(|((size, _), _)| *size >= max_split)
            .map(|(_, &i)| i)
            .filter(|&i| whole(&self.blocks[i as usize]))
            .collect();
        let mut released = 0u64;
        for i in candidates {
            if released >= want {
                break;
            }
            released += self.blocks[i as usize].size;
            self.release(i);
        }
        released >= want
    }

    /// `empty_cache`: every cached block that is a whole segment goes back to the device.
    fn release_cached(&mut self) -> bool {
        let whole: Vec<u32> = self
            .free
            .iter()
            .flat_map(|pool| pool.values().copied())
            .filter(|&i| {
                let b = &self.blocks[i as usize];
                b.prev == NONE && b.next == NONE
            })
            .collect();
        for &i in &whole {
            self.release(i);
        }
        !whole.is_empty()
    }

    fn alloc(&mut self, slot: u32, size: u64) -> bool {
        let rounded = round(size);
        let small = rounded <= SMALL_SIZE;
        let segment = segment_size(rounded);
        let found = self.take_cached(small, rounded).or_else(|| {
            self.new_segment(small, segment)
                .or_else(|| {
                    self.release_oversize(small, rounded)
                        .then(|| self.new_segment(small, segment))
                        .flatten()
                })
                .or_else(|| {
                    self.release_cached()
                        .then(|| self.new_segment(small, segment))
                        .flatten()
                })
        });
        let Some(i) = found else {
            return false;
        };
        let b = self.blocks[i as usize];
        if should_split(small, b.size, rounded, self.options.max_split()) {
            let rest = self.new_block(Block {
                addr: b.addr + rounded,
                size: b.size - rounded,
                prev: i,
                next: b.next,
                allocated: false,
                small,
            });
            if b.next != NONE {
                self.blocks[b.next as usize].prev = rest;
            }
            let block = &mut self.blocks[i as usize];
            block.size = rounded;
            block.next = rest;
            self.cache(rest);
        }
        self.blocks[i as usize].allocated = true;
        self.held[slot as usize] = i;
        true
    }

    fn free(&mut self, slot: u32) {
        let mut i = std::mem::replace(&mut self.held[slot as usize], NONE);
        if i == NONE {
            return;
        }
        self.blocks[i as usize].allocated = false;
        let prev = self.blocks[i as usize].prev;
        if prev != NONE && !self.blocks[prev as usize].allocated {
            self.uncache(prev);
            self.absorb_next(prev);
            i = prev;
        }
        let next = self.blocks[i as usize].next;
        if next != NONE && !self.blocks[next as usize].allocated {
            self.uncache(next);
            self.absorb_next(i);
        }
        self.cache(i);
    }

    /// Merges block `i`'s next neighbour into it.
    fn absorb_next(&mut self, i: u32) {
        let next = self.blocks[i as usize].next;
        let gone = self.blocks[next as usize];
        let block = &mut self.blocks[i as usize];
        block.size += gone.size;
        block.next = gone.next;
        if gone.next != NONE {
            self.blocks[gone.next as usize].prev = i;
        }
        self.vacant.push(next);
    }
}

/// One pool's expandable segment: free ranges over one address space, pages mapped on demand.
#[derive(Debug)]
struct Expanse {
    page: u64,
    /// Free ranges by address and by `(size, address)`.
    by_addr: BTreeMap<u64, u64>,
    by_size: BTreeSet<(u64, u64)>,
    /// Per page: mapped, and how many allocated blocks touch it.
    mapped: Vec<bool>,
    users: Vec<u32>,
    mapped_pages: u64,
}

impl Expanse {
    fn new(page: u64) -> Self {
        let mut e = Self {
            page,
            by_addr: BTreeMap::new(),
            by_size: BTreeSet::new(),
            mapped: Vec::new(),
            users: Vec::new(),
            mapped_pages: 0,
        };
        e.insert_free(0, VIRTUAL_BYTES);
        e
    }

    fn insert_free(&mut self, addr: u64, size: u64) {
        self.by_addr.insert(addr, size);
        self.by_size.insert((size, addr));
    }

    fn remove_free(&mut self, addr: u64, size: u64) {
        self.by_addr.remove(&addr);
        self.by_size.remove(&(size, addr));
    }

    fn pages(&self, addr: u64, size: u64) -> std::ops::Range<usize> {
        (addr / self.page) as usize..(addr + size).div_ceil(self.page) as usize
    }

    /// Where a rounded request goes and how many bytes it takes: the smallest free range that
    /// holds it, split unless the remainder is too small to keep.
    fn place(&self, small: bool, rounded: u64) -> Option<(u64, u64, u64)> {
        let &(size, addr) = self.by_size.range((rounded, 0)..).next()?;
        let tail = addr + size == VIRTUAL_BYTES;
        let take = if tail || should_split(small, size, rounded, u64::MAX) {
            rounded
        } else {
            size
        };
        Some((addr, size, take))
    }

    /// Pages of `[addr, addr + take)` not mapped yet.
    fn unmapped_in(&self, addr: u64, take: u64) -> u64 {
        self.pages(addr, take)
            .filter(|&p| !self.mapped.get(p).copied().unwrap_or(false))
            .count() as u64
    }

    fn commit(&mut self, addr: u64, size: u64, take: u64) {
        self.remove_free(addr, size);
        if take < size {
            self.insert_free(addr + take, size - take);
        }
        let pages = self.pages(addr, take);
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
    }

    fn release(&mut self, addr: u64, size: u64) {
        for p in self.pages(addr, size) {
            self.users[p] -= 1;
        }
        let (mut start, mut len) = (addr, size);
        if let Some((&a, &s)) = self.by_addr.range(..addr).next_back() {
            if a + s == addr {
                self.remove_free(a, s);
                start = a;
                len += s;
            }
        }
        if let Some(&s) = self.by_addr.get(&(addr + size)) {
            self.remove_free(addr + size, s);
            len += s;
        }
        self.insert_free(start, len);
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
    /// Per slot: (pool, address, bytes taken); `bytes == 0` when not live.
    held: Vec<(u8, u64, u64)>,
}

impl Expandable {
    fn new(_options: TorchOptions, capacity: u64, slots: usize) -> Self {
        Self {
            capacity,
            pools: [Expanse::new(SMALL_BUFFER), Expanse::new(LARGE_BUFFER)],
            held: vec![(0, 0, 0); slots],
        }
    }

    fn reserved(&self) -> u64 {
        self.pools.iter().map(|p| p.mapped_pages * p.page).sum()
    }

    fn alloc(&mut self, slot: u32, size: u64) -> bool {
        let rounded = round(size);
        let small = rounded <= SMALL_SIZE;
        let pool = usize::from(!small);
        let Some((addr, free, take)) = self.pools[pool].place(small, rounded) else {
            return false;
        };
        let page = self.pools[pool].page;
        let room = self.capacity.saturating_sub(self.reserved());
        if self.pools[pool]
            .unmapped_in(addr, take)
            .saturating_mul(page)
            > room
        {
            let unmapped = self
                .pools
                .iter_mut()
                .fold(false, |any, p| p.unmap_unused() | any);
            let room = self.capacity.saturating_sub(self.reserved());
            if !unmapped
                || self.pools[pool]
                    .unmapped_in(addr, take)
                    .saturating_mul(page)
                    > room
            {
                return false;
            }
        }
        self.pools[pool].commit(addr, free, take);
        self.held[slot as usize] = (pool as u8, addr, take);
        true
    }

    fn free(&mut self, slot: u32) {
        let (pool, addr, take) = std::mem::take(&mut self.held[slot as usize]);
        if take > 0 {
            self.pools[usize::from(pool)].release(addr, take);
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
        assert_eq!(s.blocks[s.held[2] as usize].size, 12 * MIB);
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
        assert_eq!(s.blocks[s.held[2] as usize].addr, 0);
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
