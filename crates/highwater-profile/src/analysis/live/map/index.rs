//! How the index finds a block by its address: the hash that keeps neighbouring addresses in
//! neighbouring buckets, the fingerprints packed beside the slab index, and the memo of heap
//! addresses known not to be indexed.

use hashbrown::HashTable;

use super::slab::{prefetch_line, Slab};

/// Buckets of [`Unindexed`]: a power of two.
const UNINDEXED_BUCKETS: usize = 256;

/// A bucket no address is known in: no heap block starts at the last byte of the address
/// space.
const NOTHING_KNOWN: u64 = u64::MAX;

/// Heap addresses known not to be in the index: per bucket, the last freed from the index or
/// moved away by [`LiveMap::rekey`](super::LiveMap::rekey), until a block enters the index there.
///
/// Every short-lived block handed over with its free asks whether its address is indexed,
/// for a block the program never freed (a free highwater could not see) is ended when its
/// address is reused. The answer is nearly always no, for an address just freed: allocators
/// hand a freed block out again first.
#[derive(Debug)]
pub(super) struct Unindexed([u64; UNINDEXED_BUCKETS]);

impl Default for Unindexed {
    fn default() -> Unindexed {
        Unindexed([NOTHING_KNOWN; UNINDEXED_BUCKETS])
    }
}

impl Unindexed {
    #[inline]
    fn bucket(addr: u64) -> usize {
        // Blocks are 16-byte aligned; Fibonacci hashing spreads strided addresses.
        let bits = UNINDEXED_BUCKETS.trailing_zeros();
        ((addr >> 4).wrapping_mul(0x9e37_79b9_7f4a_7c15) >> (64 - bits)) as usize
    }

    /// Whether `addr` is known not to be in the index.
    #[inline]
    pub(super) fn knows(&self, addr: u64) -> bool {
        addr != NOTHING_KNOWN && self.0[Self::bucket(addr)] == addr
    }

    /// `addr` is not in the index (any more).
    #[inline]
    pub(super) fn note(&mut self, addr: u64) {
        self.0[Self::bucket(addr)] = addr;
    }

    /// `addr` enters the index.
    #[inline]
    pub(super) fn forget(&mut self, addr: u64) {
        let known = &mut self.0[Self::bucket(addr)];
        if *known == addr {
            *known = NOTHING_KNOWN;
        }
    }
}

/// Address units (bytes) that share one window of neighbouring buckets: a 4 KiB page.
pub(super) const WINDOW_SHIFT: u32 = 12;
/// Bytes per bucket inside a window: the allocator's 16-byte alignment.
pub(super) const UNIT_SHIFT: u32 = 4;

/// Blocks from which the heap's table and slab outgrow the caches.
pub(super) const PREFETCH_FROM: usize = 1 << 15;

/// Slab blocks whose reads are in flight while [`LiveMap::make_room`](super::LiveMap::make_room) inserts one.
pub(super) const GROWTH_AHEAD: usize = 16;

/// Tables of at least this many blocks are checked for runs when rebuilt
/// ([`LiveMap::make_room`](super::LiveMap::make_room)): smaller ones stay in the caches.
pub(super) const RUNS_CHECKED_FROM: usize = PREFETCH_FROM;

/// The blocks a table of `buckets` buckets holds before
/// [`LiveMap::make_room`](super::LiveMap::make_room) builds it anew: as many as hashbrown's
/// own limit lets it, or, for a `sparse` table, two in three.
///
/// The index [`hash`] gives each page a window of buckets, so a window that several busy pages
/// share takes more blocks than it has buckets and spills into the next windows, which then
/// spill in turn. A lookup that starts in such a run reads on, group after group, past the
/// lines asked for ahead. Blocks allocated one after another, as a parser's or a sort's are,
/// fill a table at hashbrown's limit with such runs; a table that showed them is held
/// sparse from then on, as sparse as the budget of bytes per live block allows
/// (`a_million_live_blocks_cost_at_most_48_bytes_each`). One without them stays as full as
/// hashbrown's, since a larger table is a larger share of the caches.
pub(super) fn room_in(buckets: usize, sparse: bool) -> usize {
    if sparse {
        buckets * 2 / 3
    } else {
        capacity_for(buckets)
    }
}

/// The fewest buckets (a power of two, as hashbrown's tables have) whose [`room_in`] holds
/// `blocks`.
pub(super) fn buckets_for(blocks: usize, sparse: bool) -> usize {
    let mut buckets = 4;
    while room_in(buckets, sparse) < blocks {
        buckets *= 2;
    }
    buckets
}

/// The capacity hashbrown gives a table of `buckets` buckets (a power of two), and so the
/// capacity to ask for to get one.
pub(super) fn capacity_for(buckets: usize) -> usize {
    if buckets < 8 {
        buckets - 1
    } else {
        buckets / 8 * 7
    }
}

/// Buckets in a group of control bytes: a lookup reads the group where it starts first.
const GROUP: usize = 16;

/// Whether the entry in `bucket` of a table of `buckets` buckets, for `hash`, sits past the
/// first group its lookup reads.
#[inline]
pub(super) fn past_first_group(bucket: usize, hash: u64, buckets: usize) -> bool {
    (bucket.wrapping_sub(hash as usize) & (buckets - 1)) >= GROUP
}

/// Whether a rebuilt table of `blocks` blocks, `spilled` of which sat [`past_first_group`],
/// had runs.
pub(super) fn had_runs(blocks: usize, spilled: usize) -> bool {
    blocks >= RUNS_CHECKED_FROM && spilled * 16 > blocks
}

/// The index hash of an address: neighbouring addresses get neighbouring buckets.
///
/// Programs free blocks in about the order they allocated them, and allocators hand out
/// neighbouring addresses, so the collector's inserts and frees walk the address space. A
/// plain hash scatters each of those to a random bucket, one cache miss apiece on a large
/// live set; here the page (with the address's sub-alignment bits, so that small ids spread
/// too) is hashed to a random window and the 16-byte unit inside the page picks the bucket in
/// that window. The top seven bits, which the table keeps as each bucket's tag, mix the unit
/// and the window, so the neighbours a probe meets mostly have different tags.
#[inline]
pub(super) fn hash(addr: u64) -> u64 {
    const UNIT_BITS: u32 = WINDOW_SHIFT - UNIT_SHIFT;
    let unit = (addr >> UNIT_SHIFT) & ((1 << UNIT_BITS) - 1);
    // Page and sub-alignment bits, distinct for distinct windows; Fibonacci hashing keeps the
    // top bits, the well mixed ones, as the window number (enough for 2^34 buckets).
    let page = ((addr >> WINDOW_SHIFT) << UNIT_SHIFT) | (addr & ((1 << UNIT_SHIFT) - 1));
    let window = page.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> (64 - 26);
    // Neighbours in one page differ in the unit; pages that share a window of a table of up
    // to 2^27 buckets differ in the window hash's top bits, which the bucket number drops.
    let tag = (unit + (window >> 19)) & 0x7f;
    (tag << 57) | (window << UNIT_BITS) | unit
}

/// Where `table` keeps its control bytes (`None` while it holds no entry), from one entry's
/// address as hashbrown lays a table out: entry `i` ends `i` entries below control byte 0.
/// Only prefetches use it, which read nothing; were the layout to change, they would ask for
/// lines no lookup reads, and the `prefetch` layer's measurement would show its gain gone.
pub(super) fn control_bytes(table: &HashTable<u32>) -> Option<usize> {
    let first = table.iter_buckets().next()?;
    let entry = std::ptr::from_ref(table.get_bucket(first)?) as usize;
    Some(entry + (first + 1) * std::mem::size_of::<u32>())
}

/// Asks for the lines of `table` (control bytes at `control`) where a probe for `hash` starts,
/// at its low bits: that group of control bytes and the first bucket's entry.
#[inline]
pub(super) fn prefetch_lines(table: &HashTable<u32>, control: usize, hash: u64) {
    let start = hash as usize & (table.num_buckets() - 1);
    prefetch_line(control.wrapping_add(start));
    prefetch_line(control.wrapping_sub((start + 1) * std::mem::size_of::<u32>()));
}

/// A 32-bit fingerprint of an address, independent of the bits [`hash`] uses.
#[inline]
pub(super) fn fingerprint(addr: u64) -> u32 {
    (addr.wrapping_mul(0xd6e8_feb8_6659_fd93) >> 32) as u32
}

/// How an index entry is packed: the block's slab index in the low bits, and above them the
/// top bits of its address's [`fingerprint`].
///
/// A probe compares every entry whose seven-bit tag matches, and on a live set larger than
/// the caches each comparison that had to read the slab block was a miss of its own, nearly
/// always for a block at another address. The fingerprint bits settle most of those
/// comparisons inside the index. The slab index takes as few bits as the slab needs; when it
/// outgrows them, [`Packing::widen`] gives it more by clearing fingerprint bits, which needs
/// no slab read (the bits kept are the same bits of the same fingerprint).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Packing {
    /// The bits that hold the slab index.
    pub(super) slot_mask: u32,
}

impl Packing {
    /// The packing of an empty set: 2^16 slab slots, 16 fingerprint bits.
    pub(super) const NARROWEST: Packing = Packing {
        slot_mask: (1 << 16) - 1,
    };

    #[inline]
    pub(super) fn pack(self, slot: u32, addr: u64) -> u32 {
        debug_assert!(slot <= self.slot_mask);
        (fingerprint(addr) & !self.slot_mask) | slot
    }

    #[inline]
    pub(super) fn slot(self, entry: u32) -> u32 {
        entry & self.slot_mask
    }

    /// Whether `entry` may be the block at `addr` (its fingerprint bits match).
    #[inline]
    pub(super) fn may_be(self, entry: u32, addr: u64) -> bool {
        (entry ^ fingerprint(addr)) & !self.slot_mask == 0
    }

    /// The narrowest packing at least as wide as this one that holds slab index `slot`.
    pub(super) fn to_hold(self, slot: u32) -> Packing {
        let mut wider = self;
        while slot > wider.slot_mask {
            wider.slot_mask = (wider.slot_mask << 4) | 0xf;
        }
        wider
    }

    /// Whether `entry` is the block at `addr`: its fingerprint bits first, the slab only
    /// when they match.
    #[inline]
    pub(super) fn is(self, slab: &Slab, entry: u32, addr: u64) -> bool {
        self.may_be(entry, addr) && slab.get(self.slot(entry)).addr == addr
    }

    /// The index hash of the block `entry` points at, for the table's growth.
    #[inline]
    pub(super) fn rehash(self, slab: &Slab, entry: u32) -> u64 {
        hash(slab.get(self.slot(entry)).addr)
    }

    /// `entry`, packed as `self` packed it, repacked for the wider `to`.
    #[inline]
    pub(super) fn widen(self, to: Packing, entry: u32) -> u32 {
        entry & (!to.slot_mask | self.slot_mask)
    }
}
