//! A BFC-style arena: address-ordered blocks with immediate coalescing and a size index.
//!
//! Every byte of the arena belongs to exactly one block in `blocks`, keyed by offset, so a
//! block's neighbours are one `range` lookup away and a freed block merges with free neighbours at
//! once (free blocks are therefore never adjacent). Free blocks are also indexed by
//! `(size, offset)`, which gives best fit (the first entry at or after `(n, 0)`) and worst fit
//! (the last entry) in O(log n), and optionally by the [`FreeTree`] for first fit.

use std::collections::{BTreeMap, BTreeSet};

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

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Block {
    pub(crate) size: u64,
    pub(crate) free: bool,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Arena {
    capacity: u64,
    /// Every block, free or not, by offset; the blocks tile `0..capacity`.
    blocks: BTreeMap<u64, Block>,
    /// Free blocks as `(size, offset)`.
    by_size: BTreeSet<(u64, u64)>,
    /// Free blocks by offset with subtree max size; present only when first fit is used.
    by_addr: Option<FreeTree>,
    /// Sum of free block sizes.
    free_bytes: u64,
}

impl Arena {
    /// An arena of `capacity` bytes in one free block; `first_fit` maintains the address index.
    pub(crate) fn new(capacity: u64, first_fit: bool) -> Self {
        let mut arena = Self {
            capacity,
            blocks: BTreeMap::new(),
            by_size: BTreeSet::new(),
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
        self.by_size.last().map_or(0, |&(size, _)| size)
    }

    pub(crate) fn free_blocks(&self) -> u64 {
        self.by_size.len() as u64
    }

    /// Offset of the free block `fit` would carve `size` bytes from, without changing anything.
    pub(crate) fn find(&self, size: u64, fit: Fit) -> Option<u64> {
        match fit {
            Fit::Best => self.by_size.range((size, 0)..).next().map(|&(_, off)| off),
            Fit::Worst => self
                .by_size
                .last()
                .filter(|&&(s, _)| s >= size)
                .map(|&(_, off)| off),
            Fit::First => match &self.by_addr {
                Some(tree) => tree.first_fit(size),
                // Constructed without the index: fall back to best fit rather than scanning.
                None => self.by_size.range((size, 0)..).next().map(|&(_, off)| off),
            },
        }
    }

    /// Carves `size` bytes out of the free block at `block`, returning the allocation's offset.
    ///
    /// Returns `None` (changing nothing) when `block` is not a free block of at least `size`.
    pub(crate) fn carve(&mut self, block: u64, size: u64, end: End) -> Option<u64> {
        let b = *self.blocks.get(&block)?;
        if !b.free || b.size < size || size == 0 {
            return None;
        }
        self.remove_free(block, b.size);
        let rest = b.size - size;
        let at = match end {
            End::Low => {
                if rest > 0 {
                    self.insert_free(block + size, rest);
                }
                block
            }
            End::High => {
                if rest > 0 {
                    self.insert_free(block, rest);
                }
                block + rest
            }
        };
        self.blocks.insert(at, Block { size, free: false });
        Some(at)
    }

    /// `find` then `carve`.
    pub(crate) fn alloc(&mut self, size: u64, fit: Fit, end: End) -> Option<u64> {
        let block = self.find(size, fit)?;
        self.carve(block, size, end)
    }

    /// Size of the allocated block at `offset`, if there is one.
    pub(crate) fn allocated_size(&self, offset: u64) -> Option<u64> {
        self.blocks.get(&offset).filter(|b| !b.free).map(|b| b.size)
    }

    /// Frees the allocated block at `offset`, merging it with free neighbours.
    ///
    /// Returns its size, or `None` (changing nothing) if no allocated block starts there.
    pub(crate) fn free(&mut self, offset: u64) -> Option<u64> {
        let size = self.allocated_size(offset)?;
        self.blocks.remove(&offset);
        let mut start = offset;
        let mut len = size;
        if let Some((&prev, &p)) = self.blocks.range(..offset).next_back() {
            if p.free && prev + p.size == offset {
                self.remove_free(prev, p.size);
                start = prev;
                len += p.size;
            }
        }
        let end = offset + size;
        if let Some(&n) = self.blocks.get(&end) {
            if n.free {
                self.remove_free(end, n.size);
                len += n.size;
            }
        }
        self.insert_free(start, len);
        Some(size)
    }

    fn insert_free(&mut self, offset: u64, size: u64) {
        self.blocks.insert(offset, Block { size, free: true });
        self.by_size.insert((size, offset));
        if let Some(tree) = &mut self.by_addr {
            tree.insert(offset, size);
        }
        self.free_bytes += size;
    }

    fn remove_free(&mut self, offset: u64, size: u64) {
        self.blocks.remove(&offset);
        self.by_size.remove(&(size, offset));
        if let Some(tree) = &mut self.by_addr {
            tree.remove(offset);
        }
        self.free_bytes -= size;
    }

    /// Checks the arena's invariants; for tests.
    #[cfg(test)]
    pub(crate) fn check(&self) {
        let mut next = 0;
        let mut prev_free = false;
        let mut free = 0;
        let mut free_set = BTreeSet::new();
        for (&off, b) in &self.blocks {
            assert_eq!(off, next, "blocks must tile the arena");
            assert!(b.size > 0);
            assert!(!(prev_free && b.free), "adjacent free blocks at {off}");
            prev_free = b.free;
            next = off + b.size;
            if b.free {
                free += b.size;
                free_set.insert((b.size, off));
            }
        }
        assert_eq!(next, self.capacity);
        assert_eq!(free, self.free_bytes);
        assert_eq!(free_set, self.by_size);
        if let Some(tree) = &self.by_addr {
            let mut want: Vec<_> = free_set.iter().map(|&(s, o)| (o, s)).collect();
            want.sort_unstable();
            assert_eq!(tree.entries(), want);
        }
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
        let mut a = Arena::new(4096, true);
        let x = a.alloc(1024, Fit::First, End::Low); // [0,1024)
        let _keep = a.alloc(256, Fit::First, End::Low); // [1024,1280)
        let y = a.alloc(256, Fit::First, End::Low); // [1280,1536)
        let _keep2 = a.alloc(256, Fit::First, End::Low); // [1536,1792)
        assert_eq!((x, y), (Some(0), Some(1280)));
        a.free(0);
        a.free(1280);
        // Free: 1024 at 0, 256 at 1280, 2304 at 1792. Best fit takes 1280, first fit takes 0.
        assert_eq!(a.find(256, Fit::Best), Some(1280));
        assert_eq!(a.find(256, Fit::First), Some(0));
        assert_eq!(a.find(2048, Fit::First), Some(1792));
        a.check();
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
