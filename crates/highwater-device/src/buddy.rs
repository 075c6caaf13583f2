//! Binary buddy allocator over an arena whose size need not be a power of two.
//!
//! Blocks have power-of-two sizes (order `k` means `2^k` bytes) and start at a multiple of their
//! size. The arena is first cut into its maximal aligned power-of-two pieces (30 GiB becomes 16 +
//! 8 + 4 + 2 GiB); every aligned power-of-two interval inside the arena lies inside one of them,
//! so a block may merge with its buddy (`offset ^ 2^k`) exactly when the merged interval still
//! lies inside the arena. Each order keeps its free blocks in a `BTreeSet` of offsets; allocation
//! takes the lowest address of the smallest non-empty order that fits and splits it down.

use std::collections::{BTreeMap, BTreeSet};

/// Smallest block: 256 bytes.
pub(crate) const MIN_ORDER: u32 = 8;
const ORDERS: usize = 64;

#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Buddy {
    capacity: u64,
    /// Free block offsets by order.
    free: Vec<BTreeSet<u64>>,
    /// Allocated blocks: offset to order.
    allocated: BTreeMap<u64, u32>,
    free_bytes: u64,
    free_count: u64,
}

impl Buddy {
    /// A buddy arena over `capacity` bytes (only whole 256-byte units are used).
    pub(crate) fn new(capacity: u64) -> Self {
        let capacity = capacity & !((1 << MIN_ORDER) - 1);
        let mut buddy = Self {
            capacity,
            free: vec![BTreeSet::new(); ORDERS],
            allocated: BTreeMap::new(),
            free_bytes: 0,
            free_count: 0,
        };
        let mut offset = 0u64;
        for order in (MIN_ORDER..64).rev() {
            if capacity & (1u64 << order) != 0 {
                buddy.push_free(order, offset);
                offset += 1u64 << order;
            }
        }
        buddy
    }

    /// The order serving a request of `size` bytes, or `None` if the size overflows.
    pub(crate) fn order_for(size: u64) -> Option<u32> {
        let block = size.max(1 << MIN_ORDER).checked_next_power_of_two()?;
        Some(block.trailing_zeros())
    }

    pub(crate) fn free_bytes(&self) -> u64 {
        self.free_bytes
    }

    pub(crate) fn free_blocks(&self) -> u64 {
        self.free_count
    }

    pub(crate) fn largest_free(&self) -> u64 {
        (0..ORDERS)
            .rev()
            .find(|&k| !self.free[k].is_empty())
            .map_or(0, |k| 1u64 << k)
    }

    /// Whether a block of `order` could be allocated now.
    pub(crate) fn fits(&self, order: u32) -> bool {
        (order as usize..ORDERS).any(|k| !self.free[k].is_empty())
    }

    /// Allocates a block of `order`, returning its offset; changes nothing on failure.
    pub(crate) fn alloc(&mut self, order: u32) -> Option<u64> {
        let mut k = (order as usize..ORDERS).find(|&k| !self.free[k].is_empty())? as u32;
        let offset = *self.free[k as usize].first()?;
        self.pop_free(k, offset);
        while k > order {
            k -= 1;
            self.push_free(k, offset + (1u64 << k));
        }
        self.allocated.insert(offset, order);
        Some(offset)
    }

    /// Frees the block at `offset`, merging with free buddies; `None` if it was not allocated.
    pub(crate) fn free(&mut self, offset: u64) -> Option<u64> {
        let order = self.allocated.remove(&offset)?;
        let size = 1u64 << order;
        let (mut at, mut k) = (offset, order);
        while k + 1 < 64 {
            let buddy = at ^ (1u64 << k);
            let merged = at & !(1u64 << k);
            let inside = merged
                .checked_add(2u64 << k)
                .is_some_and(|end| end <= self.capacity);
            if !inside || !self.free[k as usize].contains(&buddy) {
                break;
            }
            self.pop_free(k, buddy);
            at = merged;
            k += 1;
        }
        self.push_free(k, at);
        Some(size)
    }

    fn push_free(&mut self, order: u32, offset: u64) {
        self.free[order as usize].insert(offset);
        self.free_bytes += 1u64 << order;
        self.free_count += 1;
    }

    fn pop_free(&mut self, order: u32, offset: u64) {
        if self.free[order as usize].remove(&offset) {
            self.free_bytes -= 1u64 << order;
            self.free_count -= 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn orders_round_to_powers_of_two_of_at_least_256() {
        assert_eq!(Buddy::order_for(1), Some(8));
        assert_eq!(Buddy::order_for(256), Some(8));
        assert_eq!(Buddy::order_for(257), Some(9));
        assert_eq!(Buddy::order_for(1 << 40), Some(40));
        assert_eq!(Buddy::order_for(u64::MAX), None);
    }

    #[test]
    fn non_power_of_two_arena_splits_into_aligned_roots() {
        let b = Buddy::new(3 * 1024 + 100);
        // 3 KiB = 2 KiB + 1 KiB; the 100 stray bytes are below one 256-byte unit.
        assert_eq!(b.free_bytes(), 3072);
        assert_eq!(b.free_blocks(), 2);
        assert_eq!(b.largest_free(), 2048);
    }

    #[test]
    fn splits_and_merges_back_with_buddies() {
        let mut b = Buddy::new(4096);
        let fresh = b.clone();
        let x = b.alloc(8);
        let y = b.alloc(8);
        let z = b.alloc(10);
        assert_eq!((x, y, z), (Some(0), Some(256), Some(1024)));
        assert_eq!(b.free_blocks(), 2); // 512 at 512, 2048 at 2048
        assert_eq!(b.free(0), Some(256));
        assert_eq!(b.free(0), None);
        assert_eq!(b.free(256), Some(256));
        assert_eq!(b.largest_free(), 2048);
        assert_eq!(b.free(1024), Some(1024));
        assert_eq!(b, fresh);
    }

    #[test]
    fn blocks_never_merge_across_roots() {
        // 3 KiB: roots 2 KiB at 0 and 1 KiB at 2048. The 1 KiB root's "buddy" would be 3072.
        let mut b = Buddy::new(3072);
        let a = b.alloc(10);
        assert_eq!(a, Some(2048));
        assert_eq!(b.free(2048), Some(1024));
        assert_eq!(b.free_blocks(), 2);
        assert!(!b.fits(12));
        assert!(b.fits(11));
    }
}
