//! The slab's free slots: the few freed last first, then the lowest.
//!
//! Which free slot a new block takes decides whether storing it waits for memory. A free list
//! hands back every slot in the reverse order it was freed, and on a large live set most of
//! those were freed long enough ago to be out of the caches: a reuse then stores into a cold
//! line (on the 4-thread maps workload, which frees whole maps at a time, a fifth of the
//! collector's time). Only the slots freed last are still cached, so those are reused first
//! (on syn, where many blocks die soon after they reach the slab, that matters); beyond them
//! the lowest free slot is taken, which fills a run of freed slots in address order that the
//! processor's prefetcher streams, and keeps the blocks in use packed at the front.
//!
//! A bit per slot says it is free; above that, levels of one bit per word of the level below
//! say the word has a free slot, up to a single word, so the lowest free slot is found with
//! one bit scan per level (four levels for 16 M slots), and costs 1/8 byte a slot.

/// Bits per word.
const BITS: usize = 64;

/// Slots freed last, reused before the lowest: 2 KiB of blocks, sure to be cached.
const RECENT: usize = 64;

/// Free slot indexes: the freed last first, then the lowest.
#[derive(Debug, Default)]
pub(super) struct FreeSlots {
    /// The most recently freed slots, the newest last; when full, the older half moves to the
    /// levels.
    recent: Recent,
    /// `levels[0]`: a bit per slot, set when it is free. `levels[k + 1]`: a bit per word of
    /// `levels[k]`, set when that word is not zero. The last level is one word.
    levels: Vec<Vec<u64>>,
    /// Free slots.
    count: usize,
}

impl FreeSlots {
    /// Free slots held.
    #[cfg(test)]
    fn len(&self) -> usize {
        self.recent.len + self.count
    }

    /// Makes room for slot indexes below `slots`.
    pub(super) fn cover(&mut self, slots: usize) {
        let mut words = slots.div_ceil(BITS).max(1);
        let mut level = 0;
        loop {
            if level == self.levels.len() {
                // A new top level: one bit for each word of the old top.
                let below = self.levels.last().map_or(&[][..], Vec::as_slice);
                let mut top = vec![0; words];
                for (at, &word) in below.iter().enumerate() {
                    if word != 0 {
                        top[at / BITS] |= 1 << (at % BITS);
                    }
                }
                self.levels.push(top);
            } else if self.levels[level].len() < words {
                self.levels[level].resize(words, 0);
            }
            if words == 1 && level + 1 >= self.levels.len() {
                return;
            }
            words = words.div_ceil(BITS);
            level += 1;
        }
    }

    /// Marks `slot` free. It must be covered ([`FreeSlots::cover`]) and not free already.
    #[inline]
    pub(super) fn insert(&mut self, slot: u32) {
        if self.recent.len == RECENT {
            self.spill_older_half();
        }
        self.recent.slots[self.recent.len] = slot;
        self.recent.len += 1;
    }

    /// Moves the older half of the recent stack to the levels.
    #[cold]
    fn spill_older_half(&mut self) {
        for at in 0..RECENT / 2 {
            let older = self.recent.slots[at];
            self.set(older);
        }
        self.recent.slots.copy_within(RECENT / 2.., 0);
        self.recent.len -= RECENT / 2;
    }

    /// Sets `slot`'s bit, and its words' bits above.
    fn set(&mut self, slot: u32) {
        let mut at = slot as usize;
        for level in &mut self.levels {
            let word = &mut level[at / BITS];
            let was_empty = *word == 0;
            *word |= 1 << (at % BITS);
            if !was_empty {
                break;
            }
            at /= BITS;
        }
        self.count += 1;
    }

    /// The free slot [`FreeSlots::take`] would take, left free.
    #[inline]
    pub(super) fn next(&self) -> Option<u32> {
        self.recent.last().or_else(|| self.lowest())
    }

    /// Takes the most recently freed slot while it is likely cached, else the lowest.
    #[inline]
    pub(super) fn take(&mut self) -> Option<u32> {
        self.recent.pop().or_else(|| self.take_lowest())
    }

    /// The lowest slot in the levels.
    #[inline]
    fn lowest(&self) -> Option<u32> {
        if self.count == 0 {
            return None;
        }
        let mut at = 0;
        for level in self.levels.iter().rev() {
            at = at * BITS + level[at].trailing_zeros() as usize;
        }
        Some(at as u32)
    }

    /// Takes the lowest slot in the levels.
    fn take_lowest(&mut self) -> Option<u32> {
        let slot = self.lowest()?;
        let mut at = slot as usize;
        for level in &mut self.levels {
            let word = &mut level[at / BITS];
            *word &= !(1 << (at % BITS));
            if *word != 0 {
                break;
            }
            at /= BITS;
        }
        self.count -= 1;
        Some(slot)
    }

    /// Heap bytes held.
    #[cfg(test)]
    pub(super) fn heap_bytes(&self) -> usize {
        self.levels.capacity() * std::mem::size_of::<Vec<u64>>()
            + self
                .levels
                .iter()
                .map(|level| level.capacity() * std::mem::size_of::<u64>())
                .sum::<usize>()
    }
}

/// A stack of at most [`RECENT`] slots, kept inline: pushed and popped once per block.
#[derive(Debug)]
struct Recent {
    slots: [u32; RECENT],
    len: usize,
}

impl Default for Recent {
    fn default() -> Recent {
        Recent {
            slots: [0; RECENT],
            len: 0,
        }
    }
}

impl Recent {
    #[inline]
    fn last(&self) -> Option<u32> {
        self.len.checked_sub(1).map(|at| self.slots[at])
    }

    #[inline]
    fn pop(&mut self) -> Option<u32> {
        let slot = self.last()?;
        self.len -= 1;
        Some(slot)
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use proptest::prelude::*;

    use super::*;

    /// `slots` freed in order, with nothing recent left: all in the levels.
    fn freed_long_ago(free: &mut FreeSlots, slots: &[u32]) {
        for &slot in slots {
            free.insert(slot);
        }
        for at in 0..free.recent.len {
            let slot = free.recent.slots[at];
            free.set(slot);
        }
        free.recent.len = 0;
    }

    #[test]
    fn the_lowest_free_slot_comes_first_across_words_and_levels() {
        let mut free = FreeSlots::default();
        free.cover(300_000);
        assert_eq!(free.levels.len(), 4);
        assert_eq!(free.next(), None);
        freed_long_ago(&mut free, &[299_999, 4_096, 64, 63, 262_144]);
        let taken: Vec<u32> = std::iter::from_fn(|| free.take()).collect();
        assert_eq!(taken, [63, 64, 4_096, 262_144, 299_999]);
        assert_eq!(free.len(), 0);
    }

    #[test]
    fn the_slots_freed_last_come_first_then_the_lowest_of_the_older_ones() {
        let mut free = FreeSlots::default();
        free.cover(1_000);
        let slots: Vec<u32> = (0..RECENT as u32 + 1).map(|i| 900 - 10 * i).collect();
        for &slot in &slots {
            free.insert(slot);
        }
        // The recent stack was full at the last insert: its older half moved to the levels.
        assert_eq!(free.recent.len, RECENT / 2 + 1);
        let taken: Vec<u32> = std::iter::from_fn(|| free.take()).collect();
        let mut expected: Vec<u32> = slots[RECENT / 2..].iter().rev().copied().collect();
        let mut older = slots[..RECENT / 2].to_vec();
        older.sort_unstable();
        expected.extend(older);
        assert_eq!(taken, expected);
    }

    #[test]
    fn growing_keeps_the_free_slots_and_adds_levels_above_them() {
        let mut free = FreeSlots::default();
        free.cover(64);
        assert_eq!(free.levels.len(), 1);
        freed_long_ago(&mut free, &[5]);
        free.cover(64 * 64 + 1);
        assert_eq!(free.levels.len(), 3);
        freed_long_ago(&mut free, &[64 * 64]);
        assert_eq!(free.take(), Some(5));
        assert_eq!(free.take(), Some(64 * 64));
        assert_eq!(free.take(), None);
    }

    #[test]
    fn a_slot_costs_about_an_eighth_of_a_byte() {
        let mut free = FreeSlots::default();
        free.cover(1 << 20);
        free.insert(1);
        assert!(free.heap_bytes() < (1 << 20) / 8 + 4096);
    }

    proptest! {
        /// Against a plain stack and a sorted set: the same slots, in the same order, through
        /// growth and spills.
        #[test]
        fn free_slots_hand_out_what_a_stack_and_a_sorted_set_would(
            steps in prop::collection::vec((any::<bool>(), 0u32..20_000), 1..600),
        ) {
            let mut free = FreeSlots::default();
            let (mut recent, mut older) = (Vec::new(), BTreeSet::new());
            let mut covered = 0;
            for (take, slot) in steps {
                if take {
                    let expected = recent.pop().or_else(|| older.pop_first());
                    prop_assert_eq!(free.take(), expected);
                } else {
                    if slot as usize >= covered {
                        covered = slot as usize + 1;
                        free.cover(covered);
                    }
                    if recent.contains(&slot) || older.contains(&slot) {
                        continue;
                    }
                    if recent.len() == RECENT {
                        older.extend(recent.drain(..RECENT / 2));
                    }
                    recent.push(slot);
                    free.insert(slot);
                }
                let next = recent.last().or_else(|| older.first()).copied();
                prop_assert_eq!(free.next(), next);
                prop_assert_eq!(free.len(), recent.len() + older.len());
            }
        }
    }
}
