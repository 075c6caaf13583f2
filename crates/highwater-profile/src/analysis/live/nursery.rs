//! The live set's nursery: the newest heap blocks, before they enter the index.

use super::Block;

/// Blocks the [`Nursery`] holds.
pub(super) const NURSERY_BLOCKS: usize = 16;

/// Buckets of the nursery's lookup table: a power of two, larger than [`NURSERY_BLOCKS`] so
/// that two blocks seldom want one.
pub(super) const NURSERY_BUCKETS: usize = 256;

/// Blocks whose fate (died in the nursery, or left it for the index) decides whether the
/// nursery keeps taking new blocks.
const JUDGED_EVERY: u32 = 4096;

/// New blocks that arrive at a closed nursery until it takes one again, on trial (the others
/// bypass it).
const CLOSED_FOR: u32 = 1 << 16;

/// A free nursery place's address: no heap block starts at the last byte of the address space.
pub(super) const EMPTY: u64 = u64::MAX;

/// The newest heap blocks, held out of the index until [`NURSERY_BLOCKS`] newer ones have
/// come. On allocation-heavy streams more than half the blocks that reach the live set die
/// that young (55 % on the syn workload; 63 % on maps, where a growing `Vec`'s realloc frees
/// the block the previous one made), and one that dies here costs no index insert, no slab
/// slot and no index removal. The survivors enter the index oldest first, in about the order
/// they were allocated, which keeps the index's neighbouring inserts neighbours.
///
/// A block that leaves for the index costs more than going there at once (one more probe of
/// the index), so the nursery takes new blocks only while at least a third of those it took
/// died there: on a stream of long-lived blocks (7 % die young on the json workload) it
/// closes, and reopens on trial now and then.
#[derive(Debug)]
pub(super) struct Nursery {
    /// The blocks in arrival order, round; a free place has address [`EMPTY`].
    pub(super) blocks: [Block; NURSERY_BLOCKS],
    /// The place the next block takes; a block still there is the oldest.
    next: usize,
    /// By the hash of a held block's address, its place plus one (`0`: none).
    buckets: [u8; NURSERY_BUCKETS],
    /// Of the blocks judged since the last judgement: died here, left for the index.
    died: u32,
    left: u32,
    /// While closed, new blocks still to bypass it before the next trial (`0`: open).
    closed_for: u32,
}

const _: () = assert!(NURSERY_BLOCKS < u8::MAX as usize);

impl Default for Nursery {
    fn default() -> Nursery {
        Nursery {
            blocks: [Block {
                addr: EMPTY,
                ..Block::default()
            }; NURSERY_BLOCKS],
            next: 0,
            buckets: [0; NURSERY_BUCKETS],
            died: 0,
            left: 0,
            closed_for: 0,
        }
    }
}

impl Nursery {
    /// The bucket of `addr`.
    #[inline]
    pub(super) fn bucket(addr: u64) -> usize {
        // Blocks are 16-byte aligned; Fibonacci hashing spreads strided addresses.
        let bits = NURSERY_BUCKETS.trailing_zeros();
        ((addr >> 4).wrapping_mul(0x9e37_79b9_7f4a_7c15) >> (64 - bits)) as usize
    }

    /// Whether a new block should go to the nursery: while it is open, or on trial.
    #[inline]
    pub(super) fn admits(&mut self) -> bool {
        if self.closed_for == 0 {
            return true;
        }
        self.closed_for -= 1;
        self.closed_for == 0
    }

    /// Closes it until `blocks` new blocks have bypassed it, as a judgement would.
    #[cfg(test)]
    pub(super) fn close_for(&mut self, blocks: u32) {
        self.closed_for = blocks;
    }

    /// The block at `place` died here: it is taken out.
    #[inline]
    pub(super) fn died(&mut self, place: usize) -> Block {
        self.died += 1;
        self.judge();
        self.take(place)
    }

    /// Blocks left for the index.
    #[inline]
    fn leave(&mut self, blocks: u32) {
        self.left += blocks;
        self.judge();
    }

    /// Every [`JUDGED_EVERY`] blocks, closes the nursery for a while if fewer than a third
    /// of them died here.
    #[inline]
    fn judge(&mut self) {
        let judged = self.died + self.left;
        if judged < JUDGED_EVERY {
            return;
        }
        if self.died * 3 < judged {
            self.closed_for = CLOSED_FOR;
        }
        self.died = 0;
        self.left = 0;
    }

    /// Takes the block at `place` out for the index.
    #[inline]
    pub(super) fn evict(&mut self, place: usize) -> Block {
        self.leave(1);
        self.take(place)
    }

    /// The place of the block at `addr`, if the nursery holds it.
    #[inline]
    pub(super) fn find(&self, addr: u64) -> Option<usize> {
        let place = usize::from(self.buckets[Nursery::bucket(addr)]).checked_sub(1)?;
        (self.blocks[place].addr == addr).then_some(place)
    }

    /// Empties `place`; returns its block.
    #[inline]
    fn take(&mut self, place: usize) -> Block {
        let block = self.blocks[place];
        self.blocks[place].addr = EMPTY;
        let bucket = &mut self.buckets[Nursery::bucket(block.addr)];
        if usize::from(*bucket) == place + 1 {
            *bucket = 0;
        }
        block
    }

    /// Adds `block`, which the nursery does not hold; returns the blocks it pushes out for
    /// the index: the oldest, and one whose bucket it takes.
    #[inline]
    pub(super) fn push(&mut self, block: Block) -> [Option<Block>; 2] {
        let bucket = Nursery::bucket(block.addr);
        let sharing = usize::from(self.buckets[bucket])
            .checked_sub(1)
            .filter(|&place| place != self.next && self.blocks[place].addr != EMPTY)
            .map(|place| self.take(place));
        let place = self.next;
        let oldest = (self.blocks[place].addr != EMPTY).then(|| self.take(place));
        self.blocks[place] = block;
        self.buckets[bucket] = place as u8 + 1;
        self.next = (place + 1) % NURSERY_BLOCKS;
        let out = [oldest, sharing];
        self.leave(out.iter().flatten().count() as u32);
        out
    }

    /// The blocks it holds.
    pub(super) fn blocks(&self) -> impl Iterator<Item = &Block> {
        self.blocks.iter().filter(|block| block.addr != EMPTY)
    }

    pub(super) fn blocks_mut(&mut self) -> impl Iterator<Item = &mut Block> {
        self.blocks.iter_mut().filter(|block| block.addr != EMPTY)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn block(addr: u64) -> Block {
        Block {
            addr,
            size: addr,
            ..Block::default()
        }
    }

    /// Addresses of distinct blocks (16-byte aligned) that share one bucket.
    fn sharing_a_bucket(count: usize) -> Vec<u64> {
        let first = 0x10_0000;
        let bucket = Nursery::bucket(first);
        (0..)
            .map(|unit| first + unit * 16)
            .filter(|&addr| Nursery::bucket(addr) == bucket)
            .take(count)
            .collect()
    }

    #[test]
    fn blocks_leave_oldest_first_once_newer_ones_fill_it() {
        let mut nursery = Nursery::default();
        let addrs: Vec<u64> = (1..=NURSERY_BLOCKS as u64 + 3).map(|i| i * 0x40).collect();
        let mut out = Vec::new();
        for &addr in &addrs {
            out.extend(
                nursery
                    .push(block(addr))
                    .into_iter()
                    .flatten()
                    .map(|b| b.addr),
            );
        }
        // Unless two of these shared a bucket, the first three left, in order.
        assert_eq!(out, addrs[..3]);
        for &addr in &addrs[3..] {
            let place = nursery.find(addr).expect("held");
            assert_eq!(nursery.blocks[place].size, addr);
        }
        assert_eq!(nursery.blocks().count(), NURSERY_BLOCKS);
    }

    #[test]
    fn it_closes_when_too_few_blocks_die_in_it_and_reopens_on_trial() {
        let mut nursery = Nursery::default();
        // Long-lived blocks only: past the first sixteen, each push sends one to the index.
        let mut pushed = 0;
        while nursery.admits() {
            nursery.push(block(0x1000 + u64::from(pushed) * 0x40));
            pushed += 1;
            assert!(pushed < 4 * JUDGED_EVERY, "never closed");
        }
        assert!(pushed <= NURSERY_BLOCKS as u32 + JUDGED_EVERY);
        let refused = 1 + (0..).take_while(|_| !nursery.admits()).count() as u32;
        assert_eq!(refused, CLOSED_FOR - 1);
        // On trial it takes blocks again.
        assert!(nursery.admits());
    }

    #[test]
    fn it_stays_open_while_its_blocks_die_young() {
        let mut nursery = Nursery::default();
        for round in 0..3 * u64::from(JUDGED_EVERY) {
            assert!(nursery.admits(), "closed at round {round}");
            // One in two dies at once; the others stay and are pushed out later.
            let addr = 0x1000 + round * 0x40;
            nursery.push(block(addr));
            if round % 2 == 0 {
                let place = nursery.find(addr).expect("just pushed");
                nursery.died(place);
            }
        }
    }

    #[test]
    fn a_block_taken_out_is_no_longer_found_and_its_place_is_reused() {
        let mut nursery = Nursery::default();
        nursery.push(block(0x100));
        nursery.push(block(0x200));
        let place = nursery.find(0x100).expect("held");
        assert_eq!(nursery.take(place).addr, 0x100);
        assert_eq!(nursery.find(0x100), None);
        assert!(nursery.find(0x200).is_some());
        assert_eq!(nursery.blocks().count(), 1);
        // The empty place's address is never found, nor is an address never pushed.
        assert_eq!(nursery.find(EMPTY), None);
        assert_eq!(nursery.find(0x300), None);
    }

    #[test]
    fn a_block_that_takes_a_held_blocks_bucket_pushes_that_one_out() {
        let mut nursery = Nursery::default();
        let shared = sharing_a_bucket(3);
        assert!(nursery.push(block(shared[0])).iter().all(Option::is_none));
        let out = nursery.push(block(shared[1]));
        assert_eq!(out[0].map(|b| b.addr), None);
        assert_eq!(out[1].map(|b| b.addr), Some(shared[0]));
        assert_eq!(nursery.find(shared[0]), None);
        assert!(nursery.find(shared[1]).is_some());
        // The pushed-out block's place is free again, not held twice.
        assert_eq!(nursery.blocks().count(), 1);
        nursery.push(block(shared[2]));
        assert_eq!(
            nursery.blocks().map(|b| b.addr).collect::<Vec<_>>(),
            [shared[2]]
        );
    }

    #[test]
    fn the_oldest_block_in_the_bucket_a_new_one_takes_leaves_once() {
        // Fill the nursery so that the next push both evicts the oldest and finds the oldest
        // in its bucket: it must leave once, not twice.
        let shared = sharing_a_bucket(2);
        let mut nursery = Nursery::default();
        nursery.push(block(shared[0]));
        let others: Vec<u64> = (1..NURSERY_BLOCKS as u64)
            .map(|i| 0x7000_0000 + i * 0x40)
            .filter(|&addr| Nursery::bucket(addr) != Nursery::bucket(shared[0]))
            .take(NURSERY_BLOCKS - 1)
            .collect();
        for &addr in &others {
            nursery.push(block(addr));
        }
        let out: Vec<u64> = nursery
            .push(block(shared[1]))
            .into_iter()
            .flatten()
            .map(|b| b.addr)
            .collect();
        assert_eq!(out, [shared[0]]);
        assert_eq!(nursery.blocks().count(), NURSERY_BLOCKS);
    }
}
