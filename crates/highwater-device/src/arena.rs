//! A BFC-style arena: blocks tiling the pool in address order, immediate coalescing and a
//! size index.
//!
//! The blocks are a [`Blocks`] list, so a freed block finds its free neighbours by link and
//! merges with them at once (free blocks are therefore never adjacent). Free blocks are indexed
//! either by `(size, offset)` in the list, which gives best fit (the first entry at or after
//! `(n, 0)`) and worst fit (the last entry) in O(log n), or, for first fit, by the
//! [`FreeTree`]. Allocated blocks are found from their offset through one hash map, which is
//! all a release needs to validate its block; an owner that keeps each block's handle instead
//! (the what-if replay) frees by handle and the arena keeps no map for it. Free and allocated
//! blocks together tile the arena.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

use super::blocks::Blocks;
pub(crate) use super::blocks::End;
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

type OffsetMap = HashMap<u64, u32, BuildHasherDefault<OffsetHasher>>;

/// Equality compares the blocks (offsets, sizes, free or not), not the bookkeeping's layout,
/// which depends on history.
#[derive(Debug, Clone)]
pub(crate) struct Arena {
    capacity: u64,
    /// Every block; the free ones indexed by size unless the arena is for first fit.
    blocks: Blocks,
    /// Allocated blocks: offset to block, for an owner that frees by offset; `None` for one that
    /// keeps the handles [`Arena::place`] returns and frees by them ([`Arena::by_handle`]).
    allocated: Option<OffsetMap>,
    /// Free blocks by offset with subtree max size, for first fit (then the list keeps no
    /// size index).
    by_addr: Option<FreeTree>,
}

impl Arena {
    /// An arena of `capacity` bytes in one free block; `first_fit` maintains the address index.
    pub(crate) fn new(capacity: u64, first_fit: bool) -> Self {
        Self::with_offsets(capacity, first_fit, true)
    }

    /// As [`Arena::new`], for an owner that frees every block by the handle [`Arena::place`]
    /// gave it ([`Arena::release`]): no offset map is kept, so [`Arena::free`] finds nothing.
    /// A what-if replay holds its blocks' handles anyway and saves a hash insert and remove per
    /// block.
    pub(crate) fn by_handle(capacity: u64, first_fit: bool) -> Self {
        Self::with_offsets(capacity, first_fit, false)
    }

    fn with_offsets(capacity: u64, first_fit: bool, offsets: bool) -> Self {
        let mut arena = Self {
            capacity,
            blocks: Blocks::new(!first_fit),
            allocated: offsets.then(OffsetMap::default),
            by_addr: first_fit.then(FreeTree::new),
        };
        if capacity > 0 {
            let i = arena.blocks.add_range(0, capacity, 0);
            if let Some(tree) = &mut arena.by_addr {
                tree.insert(0, capacity, i);
            }
        }
        arena
    }

    pub(crate) fn free_bytes(&self) -> u64 {
        self.blocks.free_bytes()
    }

    pub(crate) fn largest_free(&self) -> u64 {
        match &self.by_addr {
            Some(tree) => tree.max_size(),
            None => self.blocks.largest().map_or(0, |i| self.blocks.get(i).size),
        }
    }

    pub(crate) fn free_blocks(&self) -> u64 {
        self.blocks.free_count()
    }

    /// The free block `fit` would carve `size` bytes from, without changing anything.
    fn find_block(&self, size: u64, fit: Fit) -> Option<u32> {
        // An arena has the index of the fits it was built for; asked for another, it answers
        // with the one it has rather than scanning.
        match (fit, &self.by_addr) {
            (_, Some(tree)) => tree.first_fit(size),
            (Fit::Worst, None) => self
                .blocks
                .largest()
                .filter(|&i| self.blocks.get(i).size >= size),
            (Fit::Best | Fit::First, None) => self.blocks.best_fit(size),
        }
    }

    /// The free block `fit` would carve `size` bytes from, as `(offset, block size)`, without
    /// changing anything.
    #[cfg(test)]
    pub(crate) fn find(&self, size: u64, fit: Fit) -> Option<(u64, u64)> {
        self.find_block(size, fit).map(|i| {
            let b = self.blocks.get(i);
            (b.addr, b.size)
        })
    }

    /// Finds a block by `fit`, then carves `size` bytes from `end` of it; returns the
    /// allocation's offset. Changes nothing on failure.
    pub(crate) fn alloc(&mut self, size: u64, fit: Fit, end: End) -> Option<u64> {
        self.place(size, fit, end).map(|(at, _)| at)
    }

    /// As [`Arena::alloc`], also returning the block's handle for [`Arena::release`].
    pub(crate) fn place(&mut self, size: u64, fit: Fit, end: End) -> Option<(u64, u32)> {
        if size == 0 {
            return None;
        }
        let i = self.find_block(size, fit)?;
        let (used, rest) = self.blocks.take(i, size, end);
        if let Some(tree) = &mut self.by_addr {
            match rest {
                Some(rest) => {
                    let r = self.blocks.get(rest);
                    tree.update(i, r.addr, r.size, rest);
                }
                None => {
                    tree.remove(i);
                }
            }
        }
        let at = self.blocks.get(used).addr;
        if let Some(map) = &mut self.allocated {
            map.insert(at, used);
        }
        Some((at, used))
    }

    /// Size of the allocated block at `offset`, if there is one.
    pub(crate) fn allocated_size(&self, offset: u64) -> Option<u64> {
        self.allocated
            .as_ref()?
            .get(&offset)
            .map(|&i| self.blocks.get(i).size)
    }

    /// Frees the allocated block at `offset`, merging it with free neighbours.
    ///
    /// Returns its size, or `None` (changing nothing) if no allocated block starts there.
    pub(crate) fn free(&mut self, offset: u64) -> Option<u64> {
        let i = self.allocated.as_mut()?.remove(&offset)?;
        Some(self.give_back(i))
    }

    /// Frees the allocated block with handle `handle` (from [`Arena::place`]), merging it with
    /// free neighbours; returns its size.
    pub(crate) fn release(&mut self, handle: u32) -> u64 {
        debug_assert!(!self.blocks.get(handle).free, "released a free block");
        if let Some(map) = &mut self.allocated {
            map.remove(&self.blocks.get(handle).addr);
        }
        self.give_back(handle)
    }

    /// Frees the allocated block `i`, already out of the offset map; returns its size.
    fn give_back(&mut self, i: u32) -> u64 {
        let size = self.blocks.get(i).size;
        let Some(tree) = &mut self.by_addr else {
            self.blocks.give_back(i);
            return size;
        };
        let (prev, next) = (self.blocks.free_prev(i), self.blocks.free_next(i));
        let merged = self.blocks.give_back(i);
        let m = *self.blocks.get(merged);
        // The tree names blocks by handle: the merged block keeps the previous neighbour's
        // handle, or the freed block's if that was not free.
        match (prev, next) {
            (Some(p), Some(n)) => {
                tree.remove(n);
                tree.update(p, m.addr, m.size, merged);
            }
            (Some(from), None) | (None, Some(from)) => {
                tree.update(from, m.addr, m.size, merged);
            }
            (None, None) => tree.insert(m.addr, m.size, merged),
        }
        size
    }

    /// Free blocks in address order.
    pub(crate) fn free_list(&self) -> Vec<(u64, u64)> {
        let mut list: Vec<(u64, u64)> = self
            .blocks
            .all()
            .filter(|b| b.free)
            .map(|b| (b.addr, b.size))
            .collect();
        list.sort_unstable();
        list
    }

    /// Allocated blocks in address order.
    fn allocated_list(&self) -> Vec<(u64, u64)> {
        let mut list: Vec<(u64, u64)> = self
            .blocks
            .all()
            .filter(|b| !b.free)
            .map(|b| (b.addr, b.size))
            .collect();
        list.sort_unstable();
        list
    }

    /// Checks the arena's invariants; for tests.
    #[cfg(test)]
    pub(crate) fn check(&self) {
        self.blocks.check();
        let mut all: Vec<(u64, u64, bool)> = self
            .blocks
            .all()
            .map(|b| (b.addr, b.size, b.free))
            .collect();
        all.sort_unstable();
        let mut next = 0;
        for &(off, size, _) in &all {
            assert_eq!(off, next, "blocks must tile the arena");
            next = off + size;
        }
        assert_eq!(next, self.capacity);
        let used: Vec<(u64, u64)> = all
            .iter()
            .filter(|b| !b.2)
            .map(|&(o, s, _)| (o, s))
            .collect();
        if let Some(map) = &self.allocated {
            let mut mapped: Vec<(u64, u64)> = map
                .iter()
                .map(|(&o, &i)| {
                    let b = self.blocks.get(i);
                    assert_eq!((b.addr, b.free), (o, false), "offset map entry {o}");
                    (o, b.size)
                })
                .collect();
            mapped.sort_unstable();
            assert_eq!(used, mapped);
        }
        assert_eq!(
            self.largest_free(),
            self.free_list().iter().map(|b| b.1).max().unwrap_or(0)
        );
        if let Some(tree) = &self.by_addr {
            tree.check();
            assert_eq!(tree.entries(), self.free_list());
            for (offset, size, i) in tree.entries_with_blocks() {
                let b = self.blocks.get(i);
                assert_eq!((b.addr, b.size, b.free), (offset, size, true));
            }
        }
    }
}

impl PartialEq for Arena {
    fn eq(&self, other: &Self) -> bool {
        self.capacity == other.capacity
            && self.by_addr.is_some() == other.by_addr.is_some()
            && self.free_list() == other.free_list()
            && self.allocated_list() == other.allocated_list()
    }
}

impl Eq for Arena {}

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
