//! Size-class pools carved from the main arena (the [`Strategy::PoolBased`] strategy).
//!
//! Requests up to [`SMALL_MAX`] (512 KiB) are rounded up to a power-of-two size class (256 B,
//! 512 B, … 512 KiB: twelve classes) and served from 2 MiB slabs ([`SLAB_BYTES`]) — the way
//! PyTorch's caching allocator serves small tensors from 2 MiB segments. Each slab holds slots of
//! one class; a class keeps the slabs that have a free slot in a `BTreeSet` by address (the
//! lowest one is used first, so high slabs drain) and each slab keeps a stack of free slots.
//! A slab whose last slot is freed goes back to the arena at once and coalesces there. Larger
//! requests are rounded up to 256 bytes and taken from the arena by best fit; slabs are carved
//! from the high end of their best-fit block and large blocks from the low end, which keeps the
//! two apart.
//!
//! [`Strategy::PoolBased`]: super::Strategy::PoolBased

use std::collections::{BTreeMap, BTreeSet};

use super::arena::{Arena, End, Fit};
use super::buddy::MIN_ORDER;

/// Size of one slab.
pub(crate) const SLAB_BYTES: u64 = 2 << 20;
/// Largest request served from a slab.
pub(crate) const SMALL_MAX: u64 = 512 << 10;
/// Number of size classes (orders `MIN_ORDER..=19`).
const CLASSES: usize = (SMALL_MAX.trailing_zeros() - MIN_ORDER + 1) as usize;

#[derive(Debug, Clone, PartialEq, Eq)]
struct Slab {
    /// Class order: slots are `2^order` bytes.
    order: u32,
    /// Slots freed since the slab was carved; the next slot handed out is the last.
    free_slots: Vec<u32>,
    /// Slots from here on have never been handed out (so carving a slab costs O(1), not a
    /// push per slot).
    fresh: u32,
    /// Slots handed out and not yet freed.
    in_use: u32,
    /// One bit per slot, set while the slot is allocated.
    used: Vec<u64>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Slabs {
    arena: Arena,
    /// Every slab by its offset in the arena.
    slabs: BTreeMap<u64, Slab>,
    /// Per class, offsets of slabs with at least one free slot.
    partial: Vec<BTreeSet<u64>>,
    free_slot_count: u64,
    free_slot_bytes: u64,
    /// Requests up to this (a power of two, at most [`SMALL_MAX`]) are small.
    small_max: u64,
    /// Whether a small request that finds no slot and no room for a slab may take its class
    /// size from the arena directly (adaptive) or fails (pool-based).
    fallback: bool,
    /// Size of one slab: [`SLAB_BYTES`], or 0 for a pool smaller than that, which has no size
    /// classes (every request is rounded to 256 bytes and placed by best fit).
    slab_bytes: u64,
}

impl Slabs {
    /// Size-class pools over `capacity` bytes, small requests up to [`SMALL_MAX`], no fallback.
    pub(crate) fn new(capacity: u64) -> Self {
        Self::with_fallback(capacity, false)
    }

    /// As [`Slabs::new`]; with `fallback`, a small request that cannot get a slot takes its
    /// class size from the arena by best fit.
    pub(crate) fn with_fallback(capacity: u64, fallback: bool) -> Self {
        // A pool smaller than one slab could never carve one: it places everything by best fit.
        let slab_bytes = if capacity >= SLAB_BYTES {
            SLAB_BYTES
        } else {
            0
        };
        let mut slabs = Self {
            arena: Arena::new(capacity, false),
            slabs: BTreeMap::new(),
            partial: vec![BTreeSet::new(); CLASSES],
            free_slot_count: 0,
            free_slot_bytes: 0,
            small_max: 0,
            fallback,
            slab_bytes,
        };
        slabs.set_small_max(SMALL_MAX);
        slabs
    }

    /// Sets the small-request limit: `limit` rounded down to a power of two in 256 B..=512 KiB,
    /// and no larger than a slab. Existing allocations are unaffected.
    pub(crate) fn set_small_max(&mut self, limit: u64) {
        let most = SMALL_MAX.min(self.slab_bytes);
        if most < 1 << MIN_ORDER {
            // No slab fits the pool: every request is placed in the arena.
            self.small_max = 0;
            return;
        }
        let limit = limit.clamp(1 << MIN_ORDER, most);
        self.small_max = 1u64 << (63 - limit.leading_zeros());
    }

    /// The rounded size of a request: its class for small requests, else a multiple of 256.
    /// `None` if rounding overflows.
    pub(crate) fn round(&self, size: u64) -> Option<u64> {
        if size <= self.small_max {
            Some(size.max(1 << MIN_ORDER).next_power_of_two())
        } else {
            size.checked_add(255).map(|s| s & !255)
        }
    }

    fn class_index(&self, rounded: u64) -> Option<usize> {
        (rounded <= self.small_max).then(|| (rounded.trailing_zeros() - MIN_ORDER) as usize)
    }

    pub(crate) fn free_bytes(&self) -> u64 {
        self.arena.free_bytes() + self.free_slot_bytes
    }

    pub(crate) fn free_blocks(&self) -> u64 {
        self.arena.free_blocks() + self.free_slot_count
    }

    pub(crate) fn largest_free(&self) -> u64 {
        let slot = (0..CLASSES)
            .rev()
            .find(|&c| !self.partial[c].is_empty())
            .map_or(0, |c| 1u64 << (c as u32 + MIN_ORDER));
        self.arena.largest_free().max(slot)
    }

    /// Whether `rounded` (from [`Slabs::round`]) can be allocated now.
    pub(crate) fn fits(&self, rounded: u64) -> bool {
        let largest = self.arena.largest_free();
        match self.class_index(rounded) {
            Some(c) => {
                !self.partial[c].is_empty()
                    || largest >= self.slab_bytes
                    || (self.fallback && largest >= rounded)
            }
            None => largest >= rounded,
        }
    }

    /// Allocates `rounded` bytes (from [`Slabs::round`]); changes nothing on failure.
    pub(crate) fn alloc(&mut self, rounded: u64) -> Option<u64> {
        let Some(c) = self.class_index(rounded) else {
            return self.arena.alloc(rounded, Fit::Best, End::Low);
        };
        let slab_at = match self.partial[c].first() {
            Some(&at) => at,
            None => {
                let Some(at) = self.arena.alloc(self.slab_bytes, Fit::Best, End::High) else {
                    return if self.fallback {
                        self.arena.alloc(rounded, Fit::Best, End::High)
                    } else {
                        None
                    };
                };
                let order = c as u32 + MIN_ORDER;
                let slots = (self.slab_bytes >> order) as u32;
                let slab = Slab {
                    order,
                    free_slots: Vec::new(),
                    fresh: 0,
                    in_use: 0,
                    used: vec![0; (slots as usize).div_ceil(64)],
                };
                self.slabs.insert(at, slab);
                self.partial[c].insert(at);
                self.free_slot_count += u64::from(slots);
                self.free_slot_bytes += self.slab_bytes;
                at
            }
        };
        let slab = self.slabs.get_mut(&slab_at)?;
        let slots = (self.slab_bytes >> slab.order) as u32;
        let slot = match slab.free_slots.pop() {
            Some(slot) => slot,
            None if slab.fresh < slots => {
                slab.fresh += 1;
                slab.fresh - 1
            }
            None => return None,
        };
        slab.used[slot as usize / 64] |= 1 << (slot % 64);
        slab.in_use += 1;
        if slab.free_slots.is_empty() && slab.fresh == slots {
            self.partial[c].remove(&slab_at);
        }
        self.free_slot_count -= 1;
        self.free_slot_bytes -= rounded;
        Some(slab_at + (u64::from(slot) << slab.order))
    }

    /// Size of the allocation at `offset`, if there is one.
    pub(crate) fn allocated_size(&self, offset: u64) -> Option<u64> {
        match self.locate(offset) {
            Place::Arena => self.arena.allocated_size(offset),
            Place::Slot(at, slot) => {
                let slab = self.slabs.get(&at)?;
                let used = slab.used[slot as usize / 64] & (1 << (slot % 64)) != 0;
                used.then_some(1u64 << slab.order)
            }
            Place::Nowhere => None,
        }
    }

    /// Frees the allocation at `offset`; `None` (changing nothing) if there is none.
    pub(crate) fn free(&mut self, offset: u64) -> Option<u64> {
        let (slab_at, slot) = match self.locate(offset) {
            Place::Arena => return self.arena.free(offset),
            Place::Nowhere => return None,
            Place::Slot(at, slot) => (at, slot),
        };
        let size = self.allocated_size(offset)?;
        let slab = self.slabs.get_mut(&slab_at)?;
        slab.used[slot as usize / 64] &= !(1 << (slot % 64));
        slab.free_slots.push(slot);
        slab.in_use -= 1;
        let c = (slab.order - MIN_ORDER) as usize;
        let slots = (self.slab_bytes >> slab.order) as usize;
        let empty = slab.in_use == 0;
        self.free_slot_count += 1;
        self.free_slot_bytes += size;
        if empty {
            self.slabs.remove(&slab_at);
            self.partial[c].remove(&slab_at);
            self.free_slot_count -= slots as u64;
            self.free_slot_bytes -= self.slab_bytes;
            self.arena.free(slab_at);
        } else {
            self.partial[c].insert(slab_at);
        }
        Some(size)
    }

    /// Where an allocation starting at `offset` would live.
    fn locate(&self, offset: u64) -> Place {
        let Some((&at, slab)) = self.slabs.range(..=offset).next_back() else {
            return Place::Arena;
        };
        let rel = offset - at;
        if rel >= self.slab_bytes {
            Place::Arena
        } else if rel & ((1u64 << slab.order) - 1) != 0 {
            Place::Nowhere
        } else {
            Place::Slot(at, (rel >> slab.order) as u32)
        }
    }
}

/// Result of [`Slabs::locate`].
enum Place {
    /// Not inside any slab: an arena block, if anything.
    Arena,
    /// Slot `.1` of the slab at `.0`.
    Slot(u64, u32),
    /// Inside a slab but not at a slot boundary.
    Nowhere,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classes_are_powers_of_two_then_256_multiples() {
        let mut s = Slabs::new(1 << 30);
        assert_eq!(s.round(1), Some(256));
        assert_eq!(s.round(300), Some(512));
        assert_eq!(s.round(SMALL_MAX), Some(SMALL_MAX));
        assert_eq!(s.round(SMALL_MAX + 1), Some(SMALL_MAX + 256));
        assert_eq!(s.round(u64::MAX), None);
        s.set_small_max(100 << 10);
        assert_eq!(s.round(64 << 10), Some(64 << 10));
        assert_eq!(s.round((64 << 10) + 1), Some((64 << 10) + 256));
        s.set_small_max(0);
        assert_eq!(s.round(1), Some(256));
        assert_eq!(s.round(257), Some(512));
    }

    #[test]
    fn small_requests_share_a_slab_and_return_it_when_empty() {
        let mut s = Slabs::new(8 << 20);
        let fresh = s.clone();
        let a = s.alloc(256);
        let b = s.alloc(256);
        let slab = (8 << 20) - SLAB_BYTES; // carved from the high end
        assert_eq!((a, b), (Some(slab), Some(slab + 256)));
        assert_eq!(s.free_bytes(), (8 << 20) - 512);
        let big = s.alloc(1 << 20);
        assert_eq!(big, Some(0));
        assert_eq!(s.free(slab), Some(256));
        assert_eq!(s.free(slab), None);
        assert_eq!(s.free(slab + 17), None);
        assert_eq!(s.free(slab + 256), Some(256));
        assert_eq!(s.free(0), Some(1 << 20));
        assert_eq!(s, fresh);
    }

    #[test]
    fn small_request_needs_a_free_slot_or_a_whole_slab() {
        let mut s = Slabs::new(3 << 20);
        let big = s.alloc(2 << 20); // leaves 1 MiB: no room for a slab
        assert_eq!(big, Some(0));
        assert!(!s.fits(256));
        assert!(s.fits(1 << 20));
        assert_eq!(s.alloc(256), None);
    }
}
