//! A BFC-style arena: address-ordered free blocks with immediate coalescing and a size index.
//!
//! Free blocks are kept by offset in a `BTreeMap`, so a freed block finds its free neighbours
//! with one range lookup each side and merges with them at once (free blocks are therefore never
//! adjacent). They are also indexed either by `(size, offset)`, which gives best fit (the first
//! entry at or after `(n, 0)`) and worst fit (the last entry) in O(log n), or, for first fit, by
//! the [`FreeTree`]. Allocated blocks live in a hash map from offset to size, which is
//! all a release needs to validate its block. Free and allocated blocks together tile the arena.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::hash::{BuildHasherDefault, Hasher};

use super::free_tree::FreeTree;

/// How a free block is chosen among those large enough.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Fit {
    /// Lowest address.
    First,
    /// Smallest block, lowest address among equals.
    Best,
    /// Largest block, highest address among equals.
    Worst,
}

/// Which end of the chosen free block the allocation is carved from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum End {
    /// The allocation takes the block's low addresses; the remainder stays above it.
    Low,
    /// The allocation takes the block's high addresses; the remainder stays below it.
    High,
}

/// Hashes block offsets (multiples of 256) for the allocated-block map.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct OffsetHasher(u64);

impl Hasher for OffsetHasher {
    fn finish(&self) -> u64 {
        let h = self.0.wrapping_mul(0x9e37_79b9_7f4a_7c15);
        h ^ (h >> 29)
    }

    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0 << 8) | u64::from(b);
        }
    }

    fn write_u64(&mut self, n: u64) {
        self.0 = n;
    }
}

type OffsetMap = HashMap<u64, u64, BuildHasherDefault<OffsetHasher>>;

#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Arena {
    capacity: u64,
    /// Free blocks: offset to size. Never two adjacent ones.
    free: BTreeMap<u64, u64>,
    /// Allocated blocks: offset to size.
    allocated: OffsetMap,
    /// Free blocks as `(size, offset)`, for best and worst fit. Exactly one of `by_size` and
    /// `by_addr` is present.
    by_size: Option<BTreeSet<(u64, u64)>>,
    /// Free blocks by offset with subtree max size, for first fit.
    by_addr: Option<FreeTree>,
    /// Sum of free block sizes.
    free_bytes: u64,
}

impl Arena {
    /// An arena of `capacity` bytes in one free block; `first_fit` maintains the address index.
    pub(crate) fn new(capacity: u64, first_fit: bool) -> Self {
        let mut arena = Self {
            capacity,
            free: BTreeMap::new(),
            allocated: OffsetMap::default(),
            by_size: (!first_fit).then(BTreeSet::new),
            by_addr: first_fit.then(FreeTree::new),
            free_bytes: 0,
        };
        if capacity > 0 {
            arena.insert_free(0, capacity);
        }
        arena
    }

    pub(crate) fn free_bytes(&self) -> u64 {
        self.free_bytes
    }

    pub(crate) fn largest_free(&self) -> u64 {
        match (&self.by_size, &self.by_addr) {
            (Some(by_size), _) => by_size.last().map_or(0, |&(size, _)| size),
            (None, Some(tree)) => tree.max_size(),
            (None, None) => 0,
        }
    }

    pub(crate) fn free_blocks(&self) -> u64 {
        self.free.len() as u64
    }

    /// The free block `fit` would carve `size` bytes from, as `(offset, block size)`, without
    /// changing anything.
    pub(crate) fn find(&self, size: u64, fit: Fit) -> Option<(u64, u64)> {
        // An arena has the index of the fits it was built for; asked for another, it answers
        // with the one it has rather than scanning.
        match (fit, &self.by_size, &self.by_addr) {
            (Fit::Best, Some(by_size), _) | (Fit::First, Some(by_size), None) => {
                by_size.range((size, 0)..).next().map(|&(s, off)| (off, s))
            }
            (Fit::Worst, Some(by_size), _) => by_size
                .last()
                .filter(|&&(s, _)| s >= size)
                .map(|&(s, off)| (off, s)),
            (_, _, Some(tree)) => tree.first_fit(size),
            (_, None, None) => None,
        }
    }

    /// `find` then carve `size` bytes from `end` of the block; returns the allocation's offset.
    /// Changes nothing on failure.
    pub(crate) fn alloc(&mut self, size: u64, fit: Fit, end: End) -> Option<u64> {
        if size == 0 {
            return None;
        }
        let (block, block_size) = self.find(size, fit)?;
        let rest = block_size - size;
        let at = match end {
            End::Low if rest > 0 => {
                self.move_free(block, block_size, block + size, rest);
                block
            }
            End::High if rest > 0 => {
                // The block keeps its offset and shrinks.
                self.resize_free(block, block_size, rest);
                block + rest
            }
            End::Low | End::High => {
                self.remove_free(block, block_size);
                block
            }
        };
        self.allocated.insert(at, size);
        Some(at)
    }

    /// Size of the allocated block at `offset`, if there is one.
    pub(crate) fn allocated_size(&self, offset: u64) -> Option<u64> {
        self.allocated.get(&offset).copied()
    }

    /// Frees the allocated block at `offset`, merging it with free neighbours.
    ///
    /// Returns its size, or `None` (changing nothing) if no allocated block starts there.
    pub(crate) fn free(&mut self, offset: u64) -> Option<u64> {
        let size = self.allocated.remove(&offset)?;
        let end = offset + size;
        let next = self.free.get(&end).copied();
        let prev = self.free.range(..offset).next_back().map(|(&o, &s)| (o, s));
        let prev = prev.filter(|&(p, p_size)| p + p_size == offset);
        match (prev, next) {
            (Some((p, p_size)), Some(n_size)) => {
                self.remove_free(end, n_size);
                self.resize_free(p, p_size, p_size + size + n_size);
            }
            (Some((p, p_size)), None) => self.resize_free(p, p_size, p_size + size),
            (None, Some(n_size)) => self.move_free(end, n_size, offset, size + n_size),
            (None, None) => self.insert_free(offset, size),
        }
        Some(size)
    }

    fn insert_free(&mut self, offset: u64, size: u64) {
        self.free.insert(offset, size);
        if let Some(by_size) = &mut self.by_size {
            by_size.insert((size, offset));
        }
        if let Some(tree) = &mut self.by_addr {
            tree.insert(offset, size);
        }
        self.free_bytes += size;
    }

    fn remove_free(&mut self, offset: u64, size: u64) {
        self.free.remove(&offset);
        if let Some(by_size) = &mut self.by_size {
            by_size.remove(&(size, offset));
        }
        if let Some(tree) = &mut self.by_addr {
            tree.remove(offset);
        }
        self.free_bytes -= size;
    }

    /// Changes the size of the free block at `offset` from `old` to `new`.
    fn resize_free(&mut self, offset: u64, old: u64, new: u64) {
        if let Some(s) = self.free.get_mut(&offset) {
            *s = new;
        }
        if let Some(by_size) = &mut self.by_size {
            by_size.remove(&(old, offset));
            by_size.insert((new, offset));
        }
        if let Some(tree) = &mut self.by_addr {
            tree.update(offset, offset, new);
        }
        self.free_bytes = self.free_bytes - old + new;
    }

    /// Replaces the free block `(from, old)` by `(to, new)`, where no other free block lies
    /// between `from` and `to`.
    fn move_free(&mut self, from: u64, old: u64, to: u64, new: u64) {
        self.free.remove(&from);
        self.free.insert(to, new);
        if let Some(by_size) = &mut self.by_size {
            by_size.remove(&(old, from));
            by_size.insert((new, to));
        }
        if let Some(tree) = &mut self.by_addr {
            tree.update(from, to, new);
        }
        self.free_bytes = self.free_bytes - old + new;
    }

    /// Checks the arena's invariants; for tests.
    #[cfg(test)]
    pub(crate) fn check(&self) {
        let mut blocks: Vec<(u64, u64, bool)> =
            self.free.iter().map(|(&o, &s)| (o, s, true)).collect();
        blocks.extend(self.allocated.iter().map(|(&o, &s)| (o, s, false)));
        blocks.sort_unstable();
        let mut next = 0;
        let mut prev_free = false;
        for &(off, size, free) in &blocks {
            assert_eq!(off, next, "blocks must tile the arena");
            assert!(size > 0);
            assert!(!(prev_free && free), "adjacent free blocks at {off}");
            prev_free = free;
            next = off + size;
        }
        assert_eq!(next, self.capacity);
        assert_eq!(self.free.values().sum::<u64>(), self.free_bytes);
        if let Some(by_size) = &self.by_size {
            let want: BTreeSet<(u64, u64)> = self.free.iter().map(|(&o, &s)| (s, o)).collect();
            assert_eq!(&want, by_size);
        }
        assert_eq!(
            self.largest_free(),
            self.free.values().copied().max().unwrap_or(0)
        );
        if let Some(tree) = &self.by_addr {
            let want: Vec<(u64, u64)> = self.free.iter().map(|(&o, &s)| (o, s)).collect();
            assert_eq!(tree.entries(), want);
        }
    }

    /// Free blocks in address order; for tests.
    #[cfg(test)]
    pub(crate) fn free_list(&self) -> Vec<(u64, u64)> {
        self.free.iter().map(|(&o, &s)| (o, s)).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Arena of 2560 bytes holding allocations of 256, 512, 256 and 768 bytes, 768 left free.
    fn holes(first_fit: bool) -> (Arena, [u64; 4]) {
        let mut a = Arena::new(2560, first_fit);
        let offs =
            [256, 512, 256, 768].map(|s| a.alloc(s, Fit::Best, End::Low).unwrap_or(u64::MAX));
        (a, offs)
    }

    #[test]
    fn best_first_and_worst_fit_choose_different_holes() {
        for fit in [Fit::First, Fit::Best, Fit::Worst] {
            let (mut a, offs) = holes(fit == Fit::First);
            assert_eq!(offs, [0, 256, 768, 1024]);
            a.free(256);
            a.free(1024);
            a.check();
            // Free now: 512 bytes at 256, and 1536 at 1024 (the freed 768 merged with the tail).
            let got = a.alloc(256, fit, End::Low);
            let want = match fit {
                Fit::First => 256,  // lowest address
                Fit::Best => 256,   // the 512 hole is the smallest fitting
                Fit::Worst => 1024, // the 1536-byte run at 1024 (768 freed + 768 tail merged)
            };
            assert_eq!(got, Some(want), "{fit:?}");
            a.check();
        }
    }

    #[test]
    fn first_fit_prefers_address_over_size() {
        for first_fit in [true, false] {
            let mut a = Arena::new(4096, first_fit);
            let fit = if first_fit { Fit::First } else { Fit::Best };
            let x = a.alloc(1024, fit, End::Low); // [0,1024)
            let _keep = a.alloc(256, fit, End::Low); // [1024,1280)
            let y = a.alloc(256, fit, End::Low); // [1280,1536)
            let _keep2 = a.alloc(256, fit, End::Low); // [1536,1792)
            assert_eq!((x, y), (Some(0), Some(1280)));
            a.free(0);
            a.free(1280);
            // Free: 1024 at 0, 256 at 1280, 2304 at 1792. Best fit takes 1280, first fit 0.
            let want = if first_fit { (0, 1024) } else { (1280, 256) };
            assert_eq!(a.find(256, fit), Some(want));
            assert_eq!(a.find(2048, fit), Some((1792, 2304)));
            assert_eq!(a.largest_free(), 2304);
            assert_eq!(a.free_blocks(), 3);
            a.check();
        }
    }

    #[test]
    fn freeing_coalesces_both_neighbours_immediately() {
        let mut a = Arena::new(1024, true);
        let offs: Vec<_> = (0..4)
            .filter_map(|_| a.alloc(256, Fit::First, End::Low))
            .collect();
        assert_eq!(offs, vec![0, 256, 512, 768]);
        a.free(0);
        a.free(512);
        assert_eq!(a.free_blocks(), 2);
        assert_eq!(a.free(256), Some(256));
        assert_eq!(a.free_blocks(), 1);
        assert_eq!(a.largest_free(), 768);
        assert_eq!(a.free(768), Some(256));
        assert_eq!(a.largest_free(), 1024);
        assert_eq!(a, Arena::new(1024, true).tap_check());
    }

    #[test]
    fn high_end_carving_keeps_remainder_below() {
        let mut a = Arena::new(1024, false);
        assert_eq!(a.alloc(256, Fit::Best, End::High), Some(768));
        assert_eq!(a.alloc(256, Fit::Best, End::Low), Some(0));
        a.check();
    }

    #[test]
    fn freeing_unknown_or_free_offsets_changes_nothing() {
        let mut a = Arena::new(1024, false);
        let before = a.clone();
        assert_eq!(a.free(0), None);
        assert_eq!(a.free(17), None);
        assert_eq!(a, before);
    }

    impl Arena {
        fn tap_check(self) -> Self {
            self.check();
            self
        }
    }
}
