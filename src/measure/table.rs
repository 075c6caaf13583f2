//! The set of blocks a measurement made that are still live, keyed by address.
//!
//! An open-addressing table with linear probing and backward-shift deletion (no tombstones, so
//! probe chains stay as short as the live set allows). Its memory comes from `mmap`, never
//! from the global allocator: it is used inside the allocator hook. It grows by doubling into a
//! fresh mapping; when no mapping can be had, [`AddressTable::insert`] says so and the caller
//! counts the block as untracked.
//!
//! One thread owns a table (the measuring thread), so nothing here is atomic.

use crate::sys;
use std::ptr::NonNull;

/// One slot: a block's address (`0`: empty) and its value (the meter packs the span node it
/// was born in and its call-site tag).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(C)]
struct Slot {
    addr: usize,
    node: usize,
}

const EMPTY: Slot = Slot { addr: 0, node: 0 };

/// Slots of the first mapping (8 KiB): small enough to stay in the L1 cache while a closure
/// keeps a few hundred blocks live (a 64 KiB first table cost about 3 ns more per alloc + free
/// pair through it, hashed all over L2); it doubles from there.
const FIRST_CAPACITY: usize = 512;

/// What [`AddressTable::insert`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Inserted {
    /// A new entry.
    New,
    /// The address was there already (its earlier block was freed by another thread).
    Replaced,
    /// The table was full and no larger mapping could be had: nothing was recorded.
    Full,
}

/// An address set with a small value per address; see the module docs.
#[derive(Debug)]
pub(crate) struct AddressTable {
    /// `capacity` slots from `mmap`, or `None` before the first insert.
    slots: Option<NonNull<Slot>>,
    /// A power of two (or 0 before the first insert).
    capacity: usize,
    /// `capacity - 1`, or 0 before the first insert.
    mask: usize,
    /// Occupied slots.
    len: usize,
}

impl AddressTable {
    /// An empty table that has mapped nothing yet.
    pub(crate) const fn new() -> AddressTable {
        AddressTable {
            slots: None,
            capacity: 0,
            mask: 0,
            len: 0,
        }
    }

    /// Live entries.
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// Records that the block at `addr` (never 0) was born in span node `node`.
    ///
    /// An entry already at `addr` belongs to a block that another thread freed (the owner never
    /// saw that free); it is replaced, and the caller keeps counting its bytes as live.
    #[inline(always)]
    pub(crate) fn insert(&mut self, addr: usize, node: usize) -> Inserted {
        // Keep the load at most 1/2: short probes, and a free slot always exists.
        if (self.len + 1) * 2 > self.capacity && !self.grow() {
            return Inserted::Full;
        }
        let mut index = home(addr, self.mask);
        loop {
            let slot = self.slot(index);
            if slot.addr == addr {
                slot.node = node;
                return Inserted::Replaced;
            }
            if slot.addr == 0 {
                *slot = Slot { addr, node };
                self.len += 1;
                return Inserted::New;
            }
            index = (index + 1) & self.mask;
        }
    }

    /// Removes the block at `addr`; returns its node if it was there.
    #[inline(always)]
    pub(crate) fn remove(&mut self, addr: usize) -> Option<usize> {
        if self.len == 0 {
            return None;
        }
        let mask = self.mask;
        let mut index = home(addr, mask);
        loop {
            let slot = *self.slot(index);
            if slot.addr == addr {
                break;
            }
            if slot.addr == 0 {
                return None;
            }
            index = (index + 1) & mask;
        }
        let node = self.slot(index).node;
        // Backward shift: move later entries of the chain into the hole when the hole lies
        // between their home and where they sit, so every entry stays reachable from its home.
        let mut hole = index;
        let mut next = index;
        loop {
            next = (next + 1) & mask;
            let slot = *self.slot(next);
            if slot.addr == 0 {
                break;
            }
            let from_home = next.wrapping_sub(home(slot.addr, mask)) & mask;
            let from_hole = next.wrapping_sub(hole) & mask;
            if from_home >= from_hole {
                *self.slot(hole) = slot;
                hole = next;
            }
        }
        *self.slot(hole) = EMPTY;
        self.len -= 1;
        Some(node)
    }

    /// Slot `index` (`index <= mask`) of a table that has mapped its slots.
    #[inline(always)]
    fn slot(&mut self, index: usize) -> &mut Slot {
        debug_assert!(index <= self.mask && self.slots.is_some());
        match self.slots {
            // SAFETY: callers pass an index masked by `mask` (so below `capacity`), and only
            // once `len > 0` or after `grow` succeeded, i.e. with slots mapped; `&mut self`
            // makes this the only reference.
            Some(slots) => unsafe { &mut *slots.as_ptr().add(index) },
            // SAFETY: as above, a table reaching here has mapped slots.
            None => unsafe { std::hint::unreachable_unchecked() },
        }
    }

    /// Every live entry as (address, node).
    pub(crate) fn entries(&self) -> impl Iterator<Item = (usize, usize)> + '_ {
        self.slots()
            .iter()
            .filter(|slot| **slot != EMPTY)
            .map(|slot| (slot.addr, slot.node))
    }

    fn slots(&self) -> &[Slot] {
        match self.slots {
            // SAFETY: `slots` points at `capacity` initialised slots mapped by `grow` and owned
            // by this table until `drop`.
            Some(slots) => unsafe { std::slice::from_raw_parts(slots.as_ptr(), self.capacity) },
            None => &[],
        }
    }

    fn slots_mut(&mut self) -> &mut [Slot] {
        match self.slots {
            // SAFETY: as in `slots`; `&mut self` makes this the only reference.
            Some(slots) => unsafe { std::slice::from_raw_parts_mut(slots.as_ptr(), self.capacity) },
            None => &mut [],
        }
    }

    /// Moves every entry into a mapping twice the size. `false` if it cannot be mapped.
    #[cold]
    fn grow(&mut self) -> bool {
        let capacity = if self.capacity == 0 {
            FIRST_CAPACITY
        } else {
            match self.capacity.checked_mul(2) {
                Some(capacity) => capacity,
                None => return false,
            }
        };
        let Some(fresh) = map_slots(capacity) else {
            return false;
        };
        let old = std::mem::replace(
            self,
            AddressTable {
                slots: Some(fresh),
                capacity,
                mask: capacity - 1,
                len: 0,
            },
        );
        for (addr, node) in old.entries() {
            let slots = self.slots_mut();
            let mask = slots.len() - 1;
            let mut index = home(addr, mask);
            while slots[index] != EMPTY {
                index = (index + 1) & mask;
            }
            slots[index] = Slot { addr, node };
            self.len += 1;
        }
        true
    }
}

impl Drop for AddressTable {
    fn drop(&mut self) {
        if let Some(slots) = self.slots {
            // SAFETY: `slots` is the start of a mapping of exactly `capacity` slots made by
            // `map_slots` and not unmapped before; nothing refers to it after this.
            unsafe { sys::memory::unmap(slots.cast(), self.capacity * size_of::<Slot>()) };
        }
    }
}

/// Where the chain of `addr` starts: Fibonacci hashing of the address without its low bits
/// (blocks are at least 8-byte aligned, and often 16).
#[inline(always)]
fn home(addr: usize, mask: usize) -> usize {
    let hashed = (addr as u64 >> 3).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    (hashed >> 32) as usize & mask
}

/// Maps `capacity` zeroed slots (zero is [`EMPTY`]) straight from the kernel.
fn map_slots(capacity: usize) -> Option<NonNull<Slot>> {
    let bytes = capacity.checked_mul(size_of::<Slot>())?;
    sys::memory::map_zeroed(bytes).map(NonNull::cast)
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;

    #[test]
    fn inserted_addresses_are_found_once_and_then_gone() {
        let mut table = AddressTable::new();
        assert_eq!(table.remove(0x1000), None);
        assert_eq!(table.insert(0x1000, 3), Inserted::New);
        assert_eq!(table.insert(0x2000, 4), Inserted::New);
        assert_eq!(table.len(), 2);
        assert_eq!(table.remove(0x1000), Some(3));
        assert_eq!(table.remove(0x1000), None);
        assert_eq!(table.remove(0x2000), Some(4));
        assert_eq!(table.len(), 0);
    }

    #[test]
    fn an_address_inserted_again_replaces_its_entry() {
        let mut table = AddressTable::new();
        assert_eq!(table.insert(0x1000, 1), Inserted::New);
        assert_eq!(table.insert(0x1000, 2), Inserted::Replaced);
        assert_eq!(table.len(), 1);
        assert_eq!(table.remove(0x1000), Some(2));
        assert_eq!(table.remove(0x1000), None);
    }

    #[test]
    fn matches_a_hash_map_through_growth_and_colliding_deletes() {
        // Addresses 16 bytes apart with a deterministic shuffle of inserts and removes, well
        // past several doublings, checked against std's map after every operation batch.
        let mut table = AddressTable::new();
        let mut model = HashMap::new();
        let mut state = 0x1234_5678_9ABC_DEF1u64;
        for step in 0..200_000usize {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            let addr = 0x7f00_0000_0000 + (state % 50_000) as usize * 16;
            if let std::collections::hash_map::Entry::Vacant(entry) = model.entry(addr) {
                assert_eq!(table.insert(addr, step), Inserted::New);
                entry.insert(step);
            } else {
                assert_eq!(table.remove(addr), model.remove(&addr));
            }
            assert_eq!(table.len(), model.len());
        }
        let mut entries: Vec<_> = table.entries().collect();
        entries.sort_unstable();
        let mut expected: Vec<_> = model.into_iter().collect();
        expected.sort_unstable();
        assert_eq!(entries, expected);
        assert!(table.capacity >= 2 * table.len());
    }
}
