//! Blocks that tile address ranges, kept in address order, the free ones indexed by size: the
//! split-and-coalesce bookkeeping that PyTorch's caching allocator, TensorFlow's BFC allocator
//! and highwater's arena share.
//!
//! A block is a slot of one vector, linked to its neighbours in the same range (a PyTorch
//! segment, a BFC region, a whole arena), so a freed block finds the free neighbours it merges
//! with in O(1), and whoever holds a block refers to it by index instead of looking its address
//! up in a map. Free blocks are also kept, when the owner asks for it, in an ordered map by
//! `(size, address)`: the smallest block that holds a request, lowest address among equals
//! (best fit), is one range query, and the largest is the last entry.

use std::collections::BTreeMap;

/// An absent neighbour.
const NONE: u32 = u32::MAX;

/// One block: free or in use, `[addr, addr + size)` inside its range.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Block {
    pub(crate) addr: u64,
    pub(crate) size: u64,
    /// The range the block lies in; blocks of different ranges never merge.
    pub(crate) range: u32,
    pub(crate) free: bool,
    prev: u32,
    next: u32,
}

/// `(size, addr)` as one integer with the same order: size in the high half.
fn size_key(size: u64, addr: u64) -> u128 {
    (u128::from(size) << 64) | u128::from(addr)
}

/// Which end of a free block an allocation takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum End {
    /// The allocation takes the block's low addresses; the remainder stays above it.
    Low,
    /// The allocation takes the block's high addresses; the remainder stays below it.
    High,
}

/// Blocks tiling any number of ranges.
#[derive(Debug, Clone)]
pub(crate) struct Blocks {
    slots: Vec<Block>,
    vacant: Vec<u32>,
    /// Free blocks by `(size, address)` (as one [`size_key`], which compares faster than a
    /// pair), when `indexed`.
    by_size: BTreeMap<u128, u32>,
    indexed: bool,
    free_count: u64,
    free_bytes: u64,
}

impl Blocks {
    /// No range yet. `indexed` keeps the free blocks ordered by size for [`Blocks::best_fit`]
    /// and [`Blocks::largest`]; an owner with its own index (first fit's tree) leaves it off.
    pub(crate) fn new(indexed: bool) -> Self {
        Self {
            slots: Vec::new(),
            vacant: Vec::new(),
            by_size: BTreeMap::new(),
            indexed,
            free_count: 0,
            free_bytes: 0,
        }
    }

    pub(crate) fn get(&self, i: u32) -> &Block {
        &self.slots[i as usize]
    }

    /// Free blocks now.
    pub(crate) fn free_count(&self) -> u64 {
        self.free_count
    }

    /// Bytes in free blocks now.
    pub(crate) fn free_bytes(&self) -> u64 {
        self.free_bytes
    }

    /// A new range `[addr, addr + size)` of range id `range`, as one free block.
    pub(crate) fn add_range(&mut self, addr: u64, size: u64, range: u32) -> u32 {
        let i = self.new_slot(Block {
            addr,
            size,
            range,
            free: true,
            prev: NONE,
            next: NONE,
        });
        self.index(i);
        i
    }

    /// Removes the range whose only block is the free block `i`.
    pub(crate) fn remove_range(&mut self, i: u32) {
        debug_assert!(self.is_whole(i) && self.get(i).free);
        self.unindex(i);
        self.vacant(i);
    }

    /// Whether block `i` is the only block of its range.
    pub(crate) fn is_whole(&self, i: u32) -> bool {
        let b = self.get(i);
        b.prev == NONE && b.next == NONE
    }

    /// The free neighbour before `i` in its range, if any.
    pub(crate) fn free_prev(&self, i: u32) -> Option<u32> {
        let prev = self.get(i).prev;
        (prev != NONE && self.get(prev).free).then_some(prev)
    }

    /// The free neighbour after `i` in its range, if any.
    pub(crate) fn free_next(&self, i: u32) -> Option<u32> {
        let next = self.get(i).next;
        (next != NONE && self.get(next).free).then_some(next)
    }

    /// The smallest free block of at least `size` bytes, lowest address among equals.
    pub(crate) fn best_fit(&self, size: u64) -> Option<u32> {
        debug_assert!(self.indexed);
        self.by_size
            .range(size_key(size, 0)..)
            .next()
            .map(|(_, &i)| i)
    }

    /// The largest free block, highest address among equals.
    pub(crate) fn largest(&self) -> Option<u32> {
        debug_assert!(self.indexed);
        self.by_size.last_key_value().map(|(_, &i)| i)
    }

    /// Free blocks of at least `size` bytes, smallest first.
    pub(crate) fn free_from(&self, size: u64) -> impl DoubleEndedIterator<Item = u32> + '_ {
        self.by_size.range(size_key(size, 0)..).map(|(_, &i)| i)
    }

    /// Takes `size` bytes from `end` of the free block `i` for an allocation; returns the
    /// allocated block and what is left of the free one, if anything (a free block beside it).
    /// `size` equal to the block's size takes it whole.
    pub(crate) fn take(&mut self, i: u32, size: u64, end: End) -> (u32, Option<u32>) {
        let b = *self.get(i);
        debug_assert!(b.free && size > 0 && size <= b.size);
        self.unindex(i);
        if size == b.size {
            self.slots[i as usize].free = false;
            return (i, None);
        }
        let (used, rest) = match end {
            End::Low => (i, self.split(i, size)),
            End::High => (self.split(i, b.size - size), i),
        };
        self.slots[used as usize].free = false;
        self.index(rest);
        (used, Some(rest))
    }

    /// Frees the allocated block `i`, merging it with free neighbours of its range; returns
    /// the free block it is part of now.
    pub(crate) fn give_back(&mut self, i: u32) -> u32 {
        debug_assert!(!self.get(i).free);
        let mut i = i;
        if let Some(next) = self.free_next(i) {
            self.unindex(next);
            self.absorb_next(i);
        }
        if let Some(prev) = self.free_prev(i) {
            self.unindex(prev);
            self.absorb_next(prev);
            i = prev;
        }
        self.slots[i as usize].free = true;
        self.index(i);
        i
    }

    /// Splits block `i` at `at` bytes into itself and a new block after it (same state).
    fn split(&mut self, i: u32, at: u64) -> u32 {
        let b = *self.get(i);
        let rest = self.new_slot(Block {
            addr: b.addr + at,
            size: b.size - at,
            prev: i,
            ..b
        });
        if b.next != NONE {
            self.slots[b.next as usize].prev = rest;
        }
        let block = &mut self.slots[i as usize];
        block.size = at;
        block.next = rest;
        rest
    }

    /// Merges block `i`'s next neighbour (not indexed) into it.
    fn absorb_next(&mut self, i: u32) {
        let next = self.get(i).next;
        let gone = *self.get(next);
        let block = &mut self.slots[i as usize];
        block.size += gone.size;
        block.next = gone.next;
        if gone.next != NONE {
            self.slots[gone.next as usize].prev = i;
        }
        self.vacant(next);
    }

    /// Puts slot `i` on the vacant list; a vacant slot has size 0, which no block has.
    fn vacant(&mut self, i: u32) {
        self.slots[i as usize].size = 0;
        self.vacant.push(i);
    }

    /// Every block of every range, in no particular order.
    pub(crate) fn all(&self) -> impl Iterator<Item = &Block> + '_ {
        self.slots.iter().filter(|b| b.size > 0)
    }

    fn new_slot(&mut self, block: Block) -> u32 {
        match self.vacant.pop() {
            Some(i) => {
                self.slots[i as usize] = block;
                i
            }
            None => {
                self.slots.push(block);
                (self.slots.len() - 1) as u32
            }
        }
    }

    /// Counts free block `i` (and indexes it).
    fn index(&mut self, i: u32) {
        let b = self.slots[i as usize];
        self.free_count += 1;
        self.free_bytes += b.size;
        if self.indexed {
            self.by_size.insert(size_key(b.size, b.addr), i);
        }
    }

    /// Stops counting free block `i` (before it changes or is taken).
    fn unindex(&mut self, i: u32) {
        let b = self.slots[i as usize];
        self.free_count -= 1;
        self.free_bytes -= b.size;
        if self.indexed {
            self.by_size.remove(&size_key(b.size, b.addr));
        }
    }

    /// Every block of the range starting at block `first`, in address order; for tests.
    #[cfg(test)]
    pub(crate) fn walk(&self, first: u32) -> Vec<Block> {
        let mut out = Vec::new();
        let mut i = first;
        while i != NONE {
            out.push(*self.get(i));
            i = self.get(i).next;
        }
        out
    }

    /// Checks that the links, counters and index agree; for tests.
    #[cfg(test)]
    pub(crate) fn check(&self) {
        let live = (0..self.slots.len() as u32).filter(|&i| self.get(i).size > 0);
        assert_eq!(live.clone().count() + self.vacant.len(), self.slots.len());
        let (mut count, mut bytes) = (0, 0);
        for i in live {
            let b = self.get(i);
            if b.prev != NONE {
                let p = self.get(b.prev);
                assert_eq!((p.next, p.addr + p.size, p.range), (i, b.addr, b.range));
                assert!(!(p.free && b.free), "adjacent free blocks at {}", b.addr);
            }
            if b.free {
                count += 1;
                bytes += b.size;
                if self.indexed {
                    assert_eq!(self.by_size.get(&size_key(b.size, b.addr)), Some(&i));
                }
            }
        }
        assert_eq!((count, bytes), (self.free_count, self.free_bytes));
        if self.indexed {
            assert_eq!(self.by_size.len() as u64, count);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shape(blocks: &Blocks, first: u32) -> Vec<(u64, u64, bool)> {
        blocks
            .walk(first)
            .iter()
            .map(|b| (b.addr, b.size, b.free))
            .collect()
    }

    #[test]
    fn take_splits_from_either_end_and_give_back_merges_both_neighbours() {
        let mut b = Blocks::new(true);
        let first = b.add_range(0, 1000, 0);
        let (x, _) = b.take(first, 100, End::Low);
        let (y, rest) = b.take(b.best_fit(1).unwrap(), 200, End::High);
        assert_eq!(
            rest.map(|r| (b.get(r).addr, b.get(r).size)),
            Some((100, 700))
        );
        let (z, _) = b.take(b.best_fit(1).unwrap(), 300, End::Low);
        assert_eq!((x, b.get(y).addr, b.get(z).addr), (first, 800, 100));
        assert_eq!(
            shape(&b, first),
            [
                (0, 100, false),
                (100, 300, false),
                (400, 400, true),
                (800, 200, false)
            ]
        );
        b.check();
        b.give_back(x);
        b.give_back(y);
        assert_eq!((b.free_count(), b.free_bytes()), (2, 700));
        let whole = b.give_back(z);
        assert_eq!(shape(&b, whole), [(0, 1000, true)]);
        assert!(b.is_whole(whole));
        b.check();
        b.remove_range(whole);
        assert_eq!(
            (b.free_count(), b.free_bytes(), b.best_fit(1)),
            (0, 0, None)
        );
    }

    #[test]
    fn best_fit_is_the_smallest_then_lowest_and_ranges_never_merge() {
        let mut b = Blocks::new(true);
        let r0 = b.add_range(0, 500, 0);
        let r1 = b.add_range(500, 300, 1);
        let r2 = b.add_range(800, 300, 2);
        assert_eq!(b.best_fit(301), Some(r0));
        assert_eq!(b.best_fit(300), Some(r1));
        assert_eq!(b.largest(), Some(r0));
        assert_eq!(b.free_from(300).collect::<Vec<_>>(), [r1, r2, r0]);
        // Freeing a whole range's block touches no other range, although the addresses meet.
        let (used, rest) = b.take(r1, 300, End::Low);
        assert_eq!(rest, None);
        let back = b.give_back(used);
        assert!(b.is_whole(back));
        assert_eq!(b.free_count(), 3);
        b.check();
    }
}
