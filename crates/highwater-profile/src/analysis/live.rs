//! The live map, and what was live at the peak without copying the live set at every new peak.
//!
//! # A compact live map
//!
//! A live block costs 32 bytes in a slab ([`Block`]: address, size, allocation time, a context
//! id and a peak epoch) plus one `u32` entry in its device's hash table (the slot index and
//! a fingerprint of the address: [`Packing`]), whose buckets are 5 bytes: about 42 bytes per
//! live block at a million blocks (the test
//! `a_million_live_blocks_cost_at_most_48_bytes_each` measures it). What the blocks of one
//! span instance, op and category share (device, thread, owner, span node, op, category) is
//! stored once, as a [`Context`] the blocks refer to by id, counted so that contexts no block
//! or peak row needs any more are swept and their ids reused.
//!
//! The newest heap blocks wait in a [`Nursery`] of sixteen before they enter the index: most
//! blocks of allocation-heavy code die that young and then never touch the index or the slab.
//! Every operation that finds a block by its key looks in the nursery first (one compare);
//! the rare ones that change a block in place move it to the index first.
//!
//! # Live at the peak, incrementally
//!
//! Every block carries the *epoch* it became what it is (allocated, or last recategorised):
//! the number of global peaks marked before. Marking a new peak bumps the epoch, so the blocks
//! live at the latest peak are exactly the live blocks with an older epoch than the current
//! one. (An epoch is a peak count, not an event index, so it fits in 32 bits; on the rare
//! wrap every live block is renumbered to 0 or 1, which keeps the comparison.) Later events can
//! only end such blocks or change them, so whenever one is ended or recategorised it is folded,
//! as it was, into the side rows: bytes and count per context, and the few largest blocks; a
//! newer peak clears them. At any time, live-at-peak is the live blocks of an older epoch plus
//! the side rows. The side rows are O(contexts + top allocations) in memory, whatever the
//! number of blocks live at the peak; each event costs O(1) amortised.

mod free_slots;
#[cfg(test)]
mod model_tests;
mod nursery;

use std::hash::Hash;

use hashbrown::hash_table::Entry;
use hashbrown::HashTable;
use rustc_hash::FxHashMap;

use crate::model::Category;

use super::event::DeviceId;
use free_slots::FreeSlots;
use nursery::{Nursery, EMPTY, NURSERY_BUCKETS};

/// "None" for the `u32` ids kept in live entries (span nodes, instances, interned names).
pub(crate) const NONE: u32 = u32::MAX;

/// Where a block was allocated: span node and innermost op, as ids ([`NONE`]: unknown).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct Origin {
    /// Span tree node, [`NONE`] outside every (known) span.
    pub(crate) node: u32,
    /// The timeline's id of the (op name, shape, dtype) of the innermost open op, [`NONE`]
    /// when no op was open.
    pub(crate) op: u32,
}

impl Origin {
    /// Outside every span and op.
    pub(crate) const NOWHERE: Origin = Origin {
        node: NONE,
        op: NONE,
    };
}

/// One live block, as the timeline sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct LiveEntry {
    /// Bytes.
    pub(crate) size: u64,
    /// Timestamp of the allocation, ns (decides whether a late free belongs to this life).
    pub(crate) ts: u64,
    /// Thread that allocated it.
    pub(crate) thread: u32,
    /// Span instance that owns it for residual accounting, [`NONE`] outside spans.
    pub(crate) owner: u32,
    /// Span node and op it was allocated in.
    pub(crate) origin: Origin,
    /// Its category now.
    pub(crate) category: Category,
    /// Whether it was live at the latest peak as it is now (set on the entries the set hands
    /// back when a block ends or changes; ignored on insert).
    pub(crate) at_peak: bool,
}

/// What blocks share: everything about a live block but its address, size and time.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
struct Context {
    device: DeviceId,
    category: Category,
    thread: u32,
    owner: u32,
    origin: Origin,
}

/// A live block in the slab. 32 bytes.
#[derive(Debug, Clone, Copy, Default)]
struct Block {
    /// Address or tensor id.
    addr: u64,
    size: u64,
    ts: u64,
    /// Its [`Context`] id.
    context: u32,
    /// Peaks marked before it became what it is.
    epoch: u32,
}

const _: () = assert!(std::mem::size_of::<Block>() == 32);

/// Blocks per slab page: the slab grows a page at a time, never by doubling.
const PAGE: usize = 4096;

/// Blocks in pages, addressed by `u32` index; a new block takes a free slot likely to be
/// cached ([`FreeSlots`]).
#[derive(Debug, Default)]
struct Slab {
    pages: Vec<Box<[Block; PAGE]>>,
    /// Slots ever handed out (the next fresh index).
    used: u32,
    free: FreeSlots,
}

impl Slab {
    #[inline]
    fn get(&self, index: u32) -> &Block {
        &self.pages[index as usize / PAGE][index as usize % PAGE]
    }

    #[inline]
    fn get_mut(&mut self, index: u32) -> &mut Block {
        &mut self.pages[index as usize / PAGE][index as usize % PAGE]
    }

    /// The index the next [`Slab::insert`] returns.
    #[inline]
    fn next_index(&self) -> u32 {
        self.free.next().unwrap_or(self.used)
    }

    fn insert(&mut self, block: Block) -> u32 {
        if let Some(index) = self.free.take() {
            *self.get_mut(index) = block;
            return index;
        }
        let index = self.used;
        if (index as usize).is_multiple_of(PAGE) {
            self.pages.push(Box::new([Block::default(); PAGE]));
            self.free.cover(self.pages.len() * PAGE);
        }
        self.used += 1;
        *self.get_mut(index) = block;
        index
    }

    fn remove(&mut self, index: u32) -> Block {
        self.free.insert(index);
        *self.get(index)
    }

    #[cfg(test)]
    fn heap_bytes(&self) -> usize {
        self.pages.capacity() * std::mem::size_of::<usize>()
            + self.pages.len() * std::mem::size_of::<[Block; PAGE]>()
            + self.free.heap_bytes()
    }
}

/// Threads whose last context is remembered.
const RECENT: usize = 8;

/// Interned contexts with reference counts (live blocks and side rows that use each).
#[derive(Debug, Default)]
struct Contexts {
    table: Vec<(Context, u32)>,
    ids: FxHashMap<Context, u32>,
    /// Ids of swept contexts, for reuse.
    free: Vec<u32>,
    /// Contexts with a non-zero count.
    in_use: usize,
    /// The last context interned per thread (by thread number modulo [`RECENT`]): a thread's
    /// consecutive blocks mostly share one, while threads interleave.
    recent: [Option<(Context, u32)>; RECENT],
}

impl Contexts {
    /// The id of `context`, with one more reference.
    #[inline]
    fn acquire(&mut self, context: Context) -> u32 {
        let slot = context.thread as usize % RECENT;
        let id = match self.recent[slot] {
            Some((recent, id)) if recent == context => id,
            _ => {
                let id = self.intern(context);
                self.recent[slot] = Some((context, id));
                id
            }
        };
        self.retain(id);
        id
    }

    /// Out of line: the recent contexts answer most acquisitions, which then stay small
    /// enough to inline.
    #[inline(never)]
    fn intern(&mut self, context: Context) -> u32 {
        if let Some(&id) = self.ids.get(&context) {
            return id;
        }
        // Sweep unused contexts once they outnumber the used ones (amortised O(1)): counts
        // that reach zero are not removed at once, since a context often comes right back.
        if self.free.is_empty() && self.table.len() >= 2 * self.in_use + 1024 {
            self.sweep();
        }
        let id = match self.free.pop() {
            Some(id) => {
                self.table[id as usize] = (context, 0);
                id
            }
            None => {
                self.table.push((context, 0));
                u32::try_from(self.table.len() - 1).unwrap_or(NONE)
            }
        };
        self.ids.insert(context, id);
        id
    }

    fn sweep(&mut self) {
        let Contexts {
            table, ids, free, ..
        } = self;
        ids.retain(|_, id| {
            let unused = table[*id as usize].1 == 0;
            if unused {
                free.push(*id);
            }
            !unused
        });
        self.recent = [None; RECENT];
    }

    #[inline]
    fn retain(&mut self, id: u32) {
        let count = &mut self.table[id as usize].1;
        *count += 1;
        if *count == 1 {
            self.in_use += 1;
        }
    }

    #[inline]
    fn release(&mut self, id: u32) {
        let count = &mut self.table[id as usize].1;
        *count -= 1;
        if *count == 0 {
            self.in_use -= 1;
        }
    }

    #[inline]
    fn get(&self, id: u32) -> Context {
        self.table[id as usize].0
    }

    #[cfg(test)]
    fn heap_bytes(&self) -> usize {
        self.table.capacity() * std::mem::size_of::<(Context, u32)>()
            + self.ids.capacity() * (std::mem::size_of::<(Context, u32)>() + 1)
            + self.free.capacity() * 4
    }
}

/// Bytes and blocks per context id, for the blocks live at the peak that ended since: a
/// table indexed by the id (ids are dense), and the ids that have a row, to list and clear
/// them. On a growing program about half the frees land here, and an index costs less than a
/// hash.
#[derive(Debug, Default)]
struct SideRows {
    /// `(bytes, blocks)` by context id; `blocks == 0`: no row.
    by_context: Vec<(u64, u64)>,
    /// The ids with a row.
    used: Vec<u32>,
}

impl SideRows {
    /// Adds a block of `size` bytes to `context`'s row; true when that made the row.
    #[inline]
    fn add(&mut self, context: u32, size: u64) -> bool {
        let at = context as usize;
        if at >= self.by_context.len() {
            self.by_context.resize(at + 1, (0, 0));
        }
        let row = &mut self.by_context[at];
        row.0 = row.0.saturating_add(size);
        row.1 += 1;
        let made = row.1 == 1;
        if made {
            self.used.push(context);
        }
        made
    }

    fn is_empty(&self) -> bool {
        self.used.is_empty()
    }

    /// The rows: `(context, (bytes, blocks))`.
    fn rows(&self) -> impl Iterator<Item = (u32, (u64, u64))> + '_ {
        self.used
            .iter()
            .map(|&context| (context, self.by_context[context as usize]))
    }

    /// Clears every row, calling `cleared` with the id of each.
    fn clear(&mut self, mut cleared: impl FnMut(u32)) {
        for context in self.used.drain(..) {
            self.by_context[context as usize] = (0, 0);
            cleared(context);
        }
    }

    #[cfg(test)]
    fn heap_bytes(&self) -> usize {
        self.by_context.capacity() * std::mem::size_of::<(u64, u64)>() + self.used.capacity() * 4
    }
}

/// What a free did to the live map.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Freed {
    /// The block was live and is not any more.
    Ended(LiveEntry),
    /// The block is live but was allocated after the free's timestamp: the free belongs to an
    /// earlier life of the address, and the block stays live.
    Straggler,
    /// Nothing was live at that key.
    Unknown,
}

/// What [`LiveSet::rekey`] did.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Rekeyed {
    /// The block moved; the one it displaced at the new key, ended, if any.
    Moved(Option<LiveEntry>),
    /// The block at the old key was allocated after the given time: it stays where it is.
    Straggler,
    /// Nothing was live at the old key.
    Unknown,
}

/// A block in the list of the largest at the peak.
#[derive(Debug, Clone, Copy)]
struct Ranked {
    device: DeviceId,
    addr: u64,
    block: Block,
}

/// The largest first, then allocated earlier, then by key.
fn rank_order(a: &Ranked, b: &Ranked) -> std::cmp::Ordering {
    b.block
        .size
        .cmp(&a.block.size)
        .then(a.block.ts.cmp(&b.block.ts))
        .then(a.device.cmp(&b.device))
        .then(a.addr.cmp(&b.addr))
}

/// Live blocks keyed by (device, address), with the live-at-peak bookkeeping.
#[derive(Debug)]
pub(crate) struct LiveSet {
    /// Per device (by id): each live block's slab index and address fingerprint (see
    /// [`Packing`]), hashed by address.
    index: Vec<HashTable<u32>>,
    /// Per device: the blocks its table held room for when [`LiveSet::make_room`] last built
    /// it (removals since may have left tombstones, which take room until the next build).
    index_room: Vec<usize>,
    packing: Packing,
    slab: Slab,
    /// The newest heap blocks, not in the index yet.
    nursery: Nursery,
    /// Heap addresses known not to be in the index, by nursery bucket ([`EMPTY`]: none).
    unindexed: Unindexed,
    contexts: Contexts,
    live: usize,
    /// Peaks marked so far (wrapping: see [`LiveSet::mark_peak`]).
    epoch: u32,
    /// Some peak was marked.
    peaked: bool,
    /// Blocks live at the peak that were ended or changed since, as they were at the peak:
    /// bytes and count per context...
    since_peak: SideRows,
    /// ...and the largest of them, at most `top` (sorted by [`rank_order`]).
    since_peak_top: Vec<Ranked>,
    top: usize,
}

/// Heap addresses known not to be in the index: one per nursery bucket, the last whose block
/// died in the nursery, was freed from the index or moved away by [`LiveSet::rekey`], until a
/// block enters the index there.
///
/// Every new heap block asks whether its address is indexed before it enters the nursery, and
/// every short-lived one handed over with its free asks too, for a block the program never
/// freed (a free highwater could not see) is ended when its address is reused. The answer is
/// nearly always no, and nearly always for an address just freed: allocators hand a freed
/// block out again first. Remembering those answers spares 72 % of those probes on syn (each a
/// hash and a table group compared), 3 % of the collector's instructions there.
#[derive(Debug)]
struct Unindexed([u64; NURSERY_BUCKETS]);

impl Default for Unindexed {
    fn default() -> Unindexed {
        Unindexed([EMPTY; NURSERY_BUCKETS])
    }
}

impl Unindexed {
    /// Whether `addr` is known not to be in the index. Never for [`EMPTY`], which marks a
    /// bucket that knows nothing (a block there goes to the index, not the nursery).
    #[inline]
    fn knows(&self, addr: u64) -> bool {
        addr != EMPTY && self.0[Nursery::bucket(addr)] == addr
    }

    /// `addr` is not in the index (any more).
    #[inline]
    fn note(&mut self, addr: u64) {
        self.0[Nursery::bucket(addr)] = addr;
    }

    /// `addr` enters the index.
    #[inline]
    fn forget(&mut self, addr: u64) {
        let known = &mut self.0[Nursery::bucket(addr)];
        if *known == addr {
            *known = EMPTY;
        }
    }
}

/// Address units (bytes) that share one window of neighbouring buckets: a 4 KiB page.
const WINDOW_SHIFT: u32 = 12;
/// Bytes per bucket inside a window: the allocator's 16-byte alignment.
const UNIT_SHIFT: u32 = 4;

/// Blocks from which the heap's table and slab outgrow the caches.
const PREFETCH_FROM: usize = 1 << 15;

/// Slab blocks whose reads are in flight while [`LiveSet::make_room`] inserts one.
const GROWTH_AHEAD: usize = 16;

/// Asks the processor to bring `block`'s line into the caches; a hint, never a fault.
#[inline(always)]
fn prefetch(block: &Block) {
    #[cfg(all(target_arch = "x86_64", not(miri)))]
    // SAFETY: `_mm_prefetch` needs the `sse` target feature, which every x86-64 processor has
    // (it is in the target's baseline); a prefetch only hints the cache and never faults, and
    // `block` is a live reference in any case.
    unsafe {
        use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
        _mm_prefetch::<_MM_HINT_T0>(std::ptr::from_ref(block).cast::<i8>());
    }
    #[cfg(not(all(target_arch = "x86_64", not(miri))))]
    let _ = block;
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
fn hash(addr: u64) -> u64 {
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

/// A 32-bit fingerprint of an address, independent of the bits [`hash`] uses.
#[inline]
fn fingerprint(addr: u64) -> u32 {
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
struct Packing {
    /// The bits that hold the slab index.
    slot_mask: u32,
}

impl Packing {
    /// The packing of an empty set: 2^16 slab slots, 16 fingerprint bits.
    const NARROWEST: Packing = Packing {
        slot_mask: (1 << 16) - 1,
    };

    #[inline]
    fn pack(self, slot: u32, addr: u64) -> u32 {
        debug_assert!(slot <= self.slot_mask);
        (fingerprint(addr) & !self.slot_mask) | slot
    }

    #[inline]
    fn slot(self, entry: u32) -> u32 {
        entry & self.slot_mask
    }

    /// Whether `entry` may be the block at `addr` (its fingerprint bits match).
    #[inline]
    fn may_be(self, entry: u32, addr: u64) -> bool {
        (entry ^ fingerprint(addr)) & !self.slot_mask == 0
    }

    /// The narrowest packing at least as wide as this one that holds slab index `slot`.
    fn to_hold(self, slot: u32) -> Packing {
        let mut wider = self;
        while slot > wider.slot_mask {
            wider.slot_mask = (wider.slot_mask << 4) | 0xf;
        }
        wider
    }

    /// Whether `entry` is the block at `addr`: its fingerprint bits first, the slab only
    /// when they match.
    #[inline]
    fn is(self, slab: &Slab, entry: u32, addr: u64) -> bool {
        self.may_be(entry, addr) && slab.get(self.slot(entry)).addr == addr
    }

    /// The index hash of the block `entry` points at, for the table's growth.
    #[inline]
    fn rehash(self, slab: &Slab, entry: u32) -> u64 {
        hash(slab.get(self.slot(entry)).addr)
    }

    /// `entry`, packed as `self` packed it, repacked for the wider `to`.
    #[inline]
    fn widen(self, to: Packing, entry: u32) -> u32 {
        entry & (!to.slot_mask | self.slot_mask)
    }
}

impl LiveSet {
    /// An empty set that can list the `top` largest blocks at the peak.
    pub(crate) fn new(top: usize) -> LiveSet {
        LiveSet {
            index: Vec::new(),
            index_room: Vec::new(),
            packing: Packing::NARROWEST,
            slab: Slab::default(),
            nursery: Nursery::default(),
            unindexed: Unindexed::default(),
            contexts: Contexts::default(),
            live: 0,
            epoch: 0,
            peaked: false,
            since_peak: SideRows::default(),
            since_peak_top: Vec::new(),
            top,
        }
    }

    #[inline]
    fn was_live_at_peak(&self, block: &Block) -> bool {
        self.peaked && block.epoch != self.epoch
    }

    fn entry(&self, block: &Block) -> LiveEntry {
        let context = self.contexts.get(block.context);
        LiveEntry {
            size: block.size,
            ts: block.ts,
            thread: context.thread,
            owner: context.owner,
            origin: context.origin,
            category: context.category,
            at_peak: self.was_live_at_peak(block),
        }
    }

    /// Folds a block that was live at the peak into the side rows; the rows take over the
    /// block's reference to its context.
    fn remember(&mut self, device: DeviceId, block: Block) {
        if !self.since_peak.add(block.context, block.size) {
            self.contexts.release(block.context);
        }
        if self.top == 0 {
            return;
        }
        let ranked = Ranked {
            device,
            addr: block.addr,
            block,
        };
        let kept = &mut self.since_peak_top;
        if kept.len() == self.top {
            match kept.last() {
                Some(worst) if rank_order(&ranked, worst).is_lt() => {
                    if let Some(dropped) = kept.pop() {
                        self.contexts.release(dropped.block.context);
                    }
                }
                _ => return,
            }
        }
        let at = kept.partition_point(|other| rank_order(other, &ranked).is_lt());
        kept.insert(at, ranked);
        self.contexts.retain(block.context);
    }

    /// Makes `entry` live at `(device, addr)`; returns the entry it displaced, if the key was
    /// already live (the caller ends it and counts a repair).
    pub(crate) fn insert(
        &mut self,
        device: DeviceId,
        addr: u64,
        entry: LiveEntry,
    ) -> Option<LiveEntry> {
        let context = self.contexts.acquire(Context {
            device,
            category: entry.category,
            thread: entry.thread,
            owner: entry.owner,
            origin: entry.origin,
        });
        let block = Block {
            addr,
            size: entry.size,
            ts: entry.ts,
            context,
            epoch: self.epoch,
        };
        if device == DeviceId::CPU && addr != EMPTY {
            if let Some(slot) = self.nursery.find(addr) {
                let old = std::mem::replace(&mut self.nursery.blocks[slot], block);
                return Some(self.displace(device, old));
            }
            if self.nursery.admits() && !self.heap_indexed(addr) {
                for out in self.nursery.push(block).into_iter().flatten() {
                    self.index_insert_new(device, out);
                }
                self.live += 1;
                return None;
            }
        }
        match self.index_insert(device, block) {
            Some(old) => Some(self.displace(device, old)),
            None => {
                self.live += 1;
                None
            }
        }
    }

    /// Ends `old`, which a new block at its key replaced; returns it as it was.
    fn displace(&mut self, device: DeviceId, old: Block) -> LiveEntry {
        let displaced = self.entry(&old);
        self.end_block(device, old);
        displaced
    }

    /// The index of `device`'s table, about to take a block at `addr`: a heap address is no
    /// longer known as not indexed, and the table has room for one more entry.
    #[inline]
    fn table_for(&mut self, device: DeviceId, addr: u64) -> usize {
        if device == DeviceId::CPU {
            self.unindexed.forget(addr);
        }
        let slot = usize::from(device.0);
        if slot >= self.index.len() {
            self.index.resize_with(slot + 1, HashTable::new);
            self.index_room.resize(slot + 1, 0);
        }
        let table = &self.index[slot];
        if table.len() == table.capacity() {
            self.make_room(slot);
        }
        slot
    }

    /// Builds table `slot` anew before it runs out of room, as the table would itself (twice
    /// the buckets unless one more block fits in half of its room, else as many, without the
    /// tombstones of removed ones), but fetching the slab blocks it rehashes ahead. Unlike
    /// the table's own rehash in place, a rebuild at the same size holds both tables for a
    /// moment, as growth does.
    ///
    /// The table's own growth reads each entry's slab block for its address, in bucket order:
    /// pages in hash order, so on a live set larger than the caches nearly every read waits
    /// for memory, and on syn that growth was about a twentieth of the collector's time. Here
    /// the reads of the next [`GROWTH_AHEAD`] entries are in flight while one is inserted.
    #[cold]
    #[inline(never)]
    fn make_room(&mut self, slot: usize) {
        let old = std::mem::take(&mut self.index[slot]);
        let room = self.index_room[slot];
        // hashbrown rehashes in place while one more block fits in half the room.
        let wanted = if old.len() + 1 > room / 2 {
            room + 1
        } else {
            room
        };
        let mut built = HashTable::with_capacity(wanted.max(1));
        let (slab, packing) = (&self.slab, self.packing);
        let rehash = |entry: &u32| packing.rehash(slab, *entry);
        let mut insert = |entry: u32| {
            built.insert_unique(rehash(&entry), entry, rehash);
        };
        // Entries wait in `ahead` while their slab blocks are fetched.
        let mut ahead = [0u32; GROWTH_AHEAD];
        for (n, &entry) in old.iter().enumerate() {
            let at = n % GROWTH_AHEAD;
            if n >= GROWTH_AHEAD {
                insert(ahead[at]);
            }
            prefetch(slab.get(packing.slot(entry)));
            ahead[at] = entry;
        }
        let held = old.len();
        for n in held.saturating_sub(GROWTH_AHEAD)..held {
            insert(ahead[n % GROWTH_AHEAD]);
        }
        self.index_room[slot] = built.capacity();
        self.index[slot] = built;
    }

    /// Puts `block` in the index and the slab at `(device, block.addr)`; returns the block it
    /// replaced there, if the key was indexed already. The live count is the caller's.
    fn index_insert(&mut self, device: DeviceId, block: Block) -> Option<Block> {
        let addr = block.addr;
        let slot = self.table_for(device, addr);
        // One probe: the slot index the block will get is known before it is stored.
        let next = self.slab.next_index();
        if next > self.packing.slot_mask {
            self.widen_packing(next);
        }
        let (index, slab, packing) = (&mut self.index, &mut self.slab, self.packing);
        let found = match index[slot].entry(
            hash(addr),
            |&v| packing.is(slab, v, addr),
            |&v| packing.rehash(slab, v),
        ) {
            Entry::Occupied(found) => packing.slot(*found.get()),
            Entry::Vacant(vacant) => {
                vacant.insert(packing.pack(next, addr));
                let at = slab.insert(block);
                debug_assert_eq!(at, next);
                return None;
            }
        };
        Some(std::mem::replace(self.slab.get_mut(found), block))
    }

    /// Puts a block that leaves the nursery in the index, without looking for its key there:
    /// nothing enters the index at an address the nursery holds (an insert finds the
    /// nursery's block first, and the index was probed when the block entered the nursery).
    fn index_insert_new(&mut self, device: DeviceId, block: Block) {
        debug_assert!(
            self.find_indexed(device, block.addr).is_none(),
            "a nursery block was indexed too"
        );
        let slot = self.table_for(device, block.addr);
        let next = self.slab.next_index();
        if next > self.packing.slot_mask {
            self.widen_packing(next);
        }
        let (index, slab, packing) = (&mut self.index, &mut self.slab, self.packing);
        index[slot].insert_unique(hash(block.addr), packing.pack(next, block.addr), |&v| {
            packing.rehash(slab, v)
        });
        let at = slab.insert(block);
        debug_assert_eq!(at, next);
    }

    /// Moves the nursery's block at `(device, addr)`, if it holds one, into the index, for
    /// an operation that works on indexed blocks only.
    fn settle(&mut self, device: DeviceId, addr: u64) {
        if device != DeviceId::CPU {
            return;
        }
        if let Some(slot) = self.nursery.find(addr) {
            let block = self.nursery.evict(slot);
            self.index_insert_new(device, block);
        }
    }

    /// A block stopped being what it was at the peak (ended, or about to change): side rows
    /// keep it if it counted there; otherwise its context reference is dropped.
    fn end_block(&mut self, device: DeviceId, block: Block) {
        if self.was_live_at_peak(&block) {
            self.remember(device, block);
        } else {
            self.contexts.release(block.context);
        }
    }

    /// Ends the block at `(device, addr)` for a free stamped `ts`.
    pub(crate) fn free(&mut self, device: DeviceId, addr: u64, ts: u64) -> Freed {
        if device == DeviceId::CPU {
            if let Some(slot) = self.nursery.find(addr) {
                if ts < self.nursery.blocks[slot].ts {
                    return Freed::Straggler;
                }
                let block = self.nursery.died(slot);
                self.unindexed.note(addr);
                self.live -= 1;
                let entry = self.entry(&block);
                self.end_block(device, block);
                return Freed::Ended(entry);
            }
        }
        let (index, slab, packing) = (&mut self.index, &mut self.slab, self.packing);
        let Some(table) = index.get_mut(usize::from(device.0)) else {
            return Freed::Unknown;
        };
        let Ok(found) = table.find_entry(hash(addr), |&v| packing.is(slab, v, addr)) else {
            return Freed::Unknown;
        };
        let at = packing.slot(*found.get());
        if ts < slab.get(at).ts {
            return Freed::Straggler;
        }
        found.remove();
        let block = slab.remove(at);
        if device == DeviceId::CPU {
            self.unindexed.note(addr);
        }
        self.live -= 1;
        let entry = self.entry(&block);
        self.end_block(device, block);
        Freed::Ended(entry)
    }

    /// Moves the block at `(device, from)` to the key `to`, unchanged (same size, time, context
    /// and peak epoch), for a given-up address that may be reused before the block ends; `ts`
    /// is judged as a free's would be. A block already at `to` is ended and handed back.
    pub(crate) fn rekey(&mut self, device: DeviceId, from: u64, to: u64, ts: u64) -> Rekeyed {
        self.settle(device, from);
        self.settle(device, to);
        let (index, slab, packing) = (&mut self.index, &mut self.slab, self.packing);
        let Some(table) = index.get_mut(usize::from(device.0)) else {
            return Rekeyed::Unknown;
        };
        let Ok(found) = table.find_entry(hash(from), |&v| packing.is(slab, v, from)) else {
            return Rekeyed::Unknown;
        };
        let at = packing.slot(*found.get());
        if ts < slab.get(at).ts {
            return Rekeyed::Straggler;
        }
        found.remove();
        // Noted before `to` is forgotten: a move to the same key leaves it indexed.
        if device == DeviceId::CPU {
            self.unindexed.note(from);
        }
        let slot = self.table_for(device, to);
        let (table, slab, packing) = (&mut self.index[slot], &mut self.slab, self.packing);
        let moved = packing.pack(at, to);
        let displaced = match table.entry(
            hash(to),
            |&v| packing.is(slab, v, to),
            |&v| packing.rehash(slab, v),
        ) {
            Entry::Occupied(mut taken) => {
                Some(packing.slot(std::mem::replace(taken.get_mut(), moved)))
            }
            Entry::Vacant(vacant) => {
                vacant.insert(moved);
                None
            }
        };
        slab.get_mut(at).addr = to;
        let Some(displaced) = displaced else {
            return Rekeyed::Moved(None);
        };
        let block = slab.remove(displaced);
        self.live -= 1;
        let entry = self.entry(&block);
        self.end_block(device, block);
        Rekeyed::Moved(Some(entry))
    }

    /// Repacks every index entry so that slab index `slot` fits (rare: the slab index gains
    /// four bits at a time).
    #[cold]
    fn widen_packing(&mut self, slot: u32) {
        let wider = self.packing.to_hold(slot);
        for table in &mut self.index {
            for entry in table.iter_mut() {
                *entry = self.packing.widen(wider, *entry);
            }
        }
        self.packing = wider;
    }

    /// A number that changes whenever a peak is marked ([`LiveSet::mark_peak`]).
    #[inline]
    pub(crate) fn peaks_marked(&self) -> u32 {
        self.epoch
    }

    /// Folds a block that was never in the map, live at the latest peak and ended since,
    /// into the rows of blocks live at the peak, as ending it in the map would have.
    pub(crate) fn remember_ended(&mut self, device: DeviceId, addr: u64, entry: &LiveEntry) {
        let context = self.contexts.acquire(Context {
            device,
            category: entry.category,
            thread: entry.thread,
            owner: entry.owner,
            origin: entry.origin,
        });
        let block = Block {
            addr,
            size: entry.size,
            ts: entry.ts,
            context,
            epoch: self.epoch.wrapping_sub(1),
        };
        self.remember(device, block);
    }

    /// Whether the heap's table holds more blocks than the caches do, so that asking for a
    /// block ahead ([`LiveSet::prefetch_block`]) pays for the asking.
    #[inline]
    pub(crate) fn outgrows_caches(&self) -> bool {
        self.index
            .get(usize::from(DeviceId::CPU.0))
            .is_some_and(|table| table.len() >= PREFETCH_FROM)
    }

    /// Asks for the slab block a lookup of `(device, addr)` will compare, a few events before
    /// the one that looks it up: the table's entries are compared by fingerprint only, so no
    /// slab line is waited for here, and the block's wait overlaps the events in between.
    #[inline]
    pub(crate) fn prefetch_block(&self, device: DeviceId, addr: u64) {
        if device == DeviceId::CPU && self.unindexed.knows(addr) {
            return;
        }
        let Some(table) = self.index.get(usize::from(device.0)) else {
            return;
        };
        let packing = self.packing;
        if let Some(&entry) = table.find(hash(addr), |&v| packing.may_be(v, addr)) {
            prefetch(self.slab.get(packing.slot(entry)));
        }
    }

    /// Whether a block is live at `(device, addr)`.
    #[inline]
    pub(crate) fn contains(&self, device: DeviceId, addr: u64) -> bool {
        if device == DeviceId::CPU {
            self.nursery.find(addr).is_some() || self.heap_indexed(addr)
        } else {
            self.find_indexed(device, addr).is_some()
        }
    }

    /// Whether a heap block at `addr` is in the index.
    #[inline]
    fn heap_indexed(&self, addr: u64) -> bool {
        !self.unindexed.knows(addr) && self.find_indexed(DeviceId::CPU, addr).is_some()
    }

    /// The slab slot of the indexed block at `(device, addr)` (not one in the nursery).
    fn find_indexed(&self, device: DeviceId, addr: u64) -> Option<u32> {
        let table = self.index.get(usize::from(device.0))?;
        let packing = self.packing;
        table
            .find(hash(addr), |&v| packing.is(&self.slab, v, addr))
            .map(|&v| packing.slot(v))
    }

    /// Changes the category of a live block; returns the block as it was when the block is
    /// live and its category changed.
    pub(crate) fn set_category(
        &mut self,
        device: DeviceId,
        addr: u64,
        category: Category,
    ) -> Option<LiveEntry> {
        self.settle(device, addr);
        let at = self.find_indexed(device, addr)?;
        let before = *self.slab.get(at);
        let old = self.contexts.get(before.context);
        if old.category == category {
            return None;
        }
        let was = self.entry(&before);
        let context = self.contexts.acquire(Context { category, ..old });
        // From the peak's point of view the block is now a new one: the side rows keep it as
        // it was, and the live one gets the current epoch.
        self.end_block(device, before);
        let block = self.slab.get_mut(at);
        block.context = context;
        block.epoch = self.epoch;
        Some(was)
    }

    /// Sets the op (name, shape, dtype id) of a live block; unknown blocks are ignored.
    pub(crate) fn annotate(&mut self, device: DeviceId, addr: u64, op: u32) {
        self.settle(device, addr);
        let Some(at) = self.find_indexed(device, addr) else {
            return;
        };
        let before = self.slab.get(at).context;
        let mut context = self.contexts.get(before);
        context.origin.op = op;
        let after = self.contexts.acquire(context);
        self.contexts.release(before);
        self.slab.get_mut(at).context = after;
    }

    /// Records that the latest event set a new global peak: every block live now counts at it.
    pub(crate) fn mark_peak(&mut self) {
        if self.epoch == u32::MAX {
            // Renumber before wrapping: once this peak is marked every live block is older than
            // the current epoch, whatever its number was.
            for table in &self.index {
                for &v in table {
                    self.slab.get_mut(self.packing.slot(v)).epoch = 0;
                }
            }
            for block in self.nursery.blocks_mut() {
                block.epoch = 0;
            }
            self.epoch = 0;
        }
        self.epoch += 1;
        self.peaked = true;
        if !self.since_peak.is_empty() || !self.since_peak_top.is_empty() {
            let contexts = &mut self.contexts;
            self.since_peak.clear(|context| contexts.release(context));
            for ranked in self.since_peak_top.drain(..) {
                self.contexts.release(ranked.block.context);
            }
        }
    }

    /// The blocks live now on `device`, indexed or in the nursery.
    fn blocks_on(&self, device: DeviceId) -> impl Iterator<Item = &Block> + '_ {
        let indexed = self
            .index
            .get(usize::from(device.0))
            .into_iter()
            .flat_map(move |table| {
                table
                    .iter()
                    .map(move |&v| self.slab.get(self.packing.slot(v)))
            });
        let young = self
            .nursery
            .blocks()
            .filter(move |_| device == DeviceId::CPU);
        indexed.chain(young)
    }

    /// Live blocks at the current peak: (device, address, block).
    fn still_live_at_peak(&self) -> impl Iterator<Item = (DeviceId, &Block)> + '_ {
        let indexed = self
            .index
            .iter()
            .enumerate()
            .flat_map(move |(device, table)| {
                let device = DeviceId(u16::try_from(device).unwrap_or(u16::MAX));
                table
                    .iter()
                    .map(move |&v| (device, self.slab.get(self.packing.slot(v))))
            });
        let young = self.nursery.blocks().map(|block| (DeviceId::CPU, block));
        indexed
            .chain(young)
            .filter(|(_, block)| self.was_live_at_peak(block))
    }

    /// Number of live blocks.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.live
    }

    /// Heap bytes the live map holds (tables, slab, contexts, side rows).
    #[cfg(test)]
    pub(crate) fn heap_bytes(&self) -> usize {
        let tables: usize = self.index.iter().map(HashTable::allocation_size).sum();
        tables
            + self.index.capacity() * std::mem::size_of::<HashTable<u32>>()
            + self.slab.heap_bytes()
            + self.contexts.heap_bytes()
            + self.since_peak.heap_bytes()
            + self.since_peak_top.capacity() * std::mem::size_of::<Ranked>()
    }
}

/// The key live-at-peak blocks are aggregated by.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct GroupKey {
    pub(crate) origin: Origin,
    pub(crate) category: Category,
    pub(crate) device: DeviceId,
}

/// Aggregates live-at-peak blocks by [`GroupKey`]: `(key, bytes, count)`, in no order.
pub(crate) fn group_at_peak(live: &LiveSet) -> Vec<(GroupKey, u64, u64)> {
    let mut by_context: FxHashMap<u32, (u64, u64)> = live.since_peak.rows().collect();
    for (_, block) in live.still_live_at_peak() {
        let row = by_context.entry(block.context).or_default();
        row.0 = row.0.saturating_add(block.size);
        row.1 += 1;
    }
    let mut groups: FxHashMap<GroupKey, (u64, u64)> = FxHashMap::default();
    for (context, (bytes, count)) in by_context {
        let context = live.contexts.get(context);
        let key = GroupKey {
            origin: context.origin,
            category: context.category,
            device: context.device,
        };
        let group = groups.entry(key).or_default();
        group.0 = group.0.saturating_add(bytes);
        group.1 += count;
    }
    groups
        .into_iter()
        .map(|(key, (bytes, count))| (key, bytes, count))
        .collect()
}

/// Aggregates the blocks live now on `device` by [`GroupKey`]: `(key, bytes, count)`, in no
/// order. O(live blocks on the device): for rare moments (a refused allocation), not per event.
pub(crate) fn group_live_now(live: &LiveSet, device: DeviceId) -> Vec<(GroupKey, u64, u64)> {
    let mut groups: FxHashMap<GroupKey, (u64, u64)> = FxHashMap::default();
    for block in live.blocks_on(device) {
        let context = live.contexts.get(block.context);
        let key = GroupKey {
            origin: context.origin,
            category: context.category,
            device: context.device,
        };
        let group = groups.entry(key).or_default();
        group.0 = group.0.saturating_add(block.size);
        group.1 += 1;
    }
    groups
        .into_iter()
        .map(|(key, (bytes, count))| (key, bytes, count))
        .collect()
}

/// The `n` largest blocks live at the peak, largest first (ties: allocated earlier first,
/// then by device and address). Keeps `n` candidates at a time (a heap whose top is the worst
/// kept), never a copy of every live block: a checkpoint of a run with tens of millions of live
/// blocks must not double its memory.
pub(crate) fn largest_at_peak(live: &LiveSet, n: usize) -> Vec<(DeviceId, LiveEntry)> {
    /// Orders a heap so that its top is the worst-ranked block kept.
    struct Kept(Ranked);
    impl PartialEq for Kept {
        fn eq(&self, other: &Kept) -> bool {
            rank_order(&self.0, &other.0).is_eq()
        }
    }
    impl Eq for Kept {}
    impl PartialOrd for Kept {
        fn partial_cmp(&self, other: &Kept) -> Option<std::cmp::Ordering> {
            Some(self.cmp(other))
        }
    }
    impl Ord for Kept {
        fn cmp(&self, other: &Kept) -> std::cmp::Ordering {
            rank_order(&self.0, &other.0)
        }
    }
    if n == 0 {
        return Vec::new();
    }
    let mut kept: std::collections::BinaryHeap<Kept> = std::collections::BinaryHeap::new();
    let candidates = live
        .still_live_at_peak()
        .map(|(device, block)| Ranked {
            device,
            addr: block.addr,
            block: *block,
        })
        .chain(live.since_peak_top.iter().copied());
    for ranked in candidates {
        if kept.len() < n {
            kept.push(Kept(ranked));
        } else if kept
            .peek()
            .is_some_and(|worst| rank_order(&ranked, &worst.0).is_lt())
        {
            kept.pop();
            kept.push(Kept(ranked));
        }
    }
    let mut all: Vec<Ranked> = kept.into_iter().map(|kept| kept.0).collect();
    all.sort_unstable_by(rank_order);
    all.into_iter()
        .map(|ranked| (ranked.device, live.entry(&ranked.block)))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::nursery::NURSERY_BLOCKS;
    use super::*;

    fn entry(size: u64, ts: u64) -> LiveEntry {
        LiveEntry {
            size,
            ts,
            thread: 0,
            owner: NONE,
            origin: Origin::NOWHERE,
            category: Category::Other,
            at_peak: false,
        }
    }

    fn sizes_at_peak(live: &LiveSet) -> Vec<u64> {
        let mut sizes: Vec<u64> = largest_at_peak(live, usize::MAX >> 1)
            .iter()
            .map(|(_, e)| e.size)
            .collect();
        sizes.sort_unstable();
        let grouped: u64 = group_at_peak(live).iter().map(|(_, bytes, _)| bytes).sum();
        assert_eq!(grouped, sizes.iter().sum::<u64>(), "rows and blocks agree");
        sizes
    }

    #[test]
    fn blocks_freed_after_the_peak_still_count_at_the_peak() {
        let cpu = DeviceId::CPU;
        let mut live = LiveSet::new(8);
        live.insert(cpu, 1, entry(10, 0));
        live.insert(cpu, 2, entry(20, 1));
        live.mark_peak();
        assert!(matches!(live.free(cpu, 1, 2), Freed::Ended(_)));
        live.insert(cpu, 3, entry(5, 3));
        assert_eq!(sizes_at_peak(&live), vec![10, 20]);
        // A higher peak forgets the side rows.
        live.insert(cpu, 4, entry(100, 4));
        live.mark_peak();
        assert_eq!(sizes_at_peak(&live), vec![5, 20, 100]);
    }

    #[test]
    fn ended_blocks_say_whether_they_were_live_at_the_peak() {
        let cpu = DeviceId::CPU;
        let mut live = LiveSet::new(8);
        live.insert(cpu, 1, entry(10, 0));
        let Freed::Ended(before_any_peak) = live.free(cpu, 1, 1) else {
            panic!("the block was live");
        };
        assert!(!before_any_peak.at_peak);
        live.insert(cpu, 2, entry(20, 2));
        live.mark_peak();
        live.insert(cpu, 3, entry(30, 3));
        let Freed::Ended(at_peak) = live.free(cpu, 2, 4) else {
            panic!("the block was live");
        };
        let Freed::Ended(after_peak) = live.free(cpu, 3, 4) else {
            panic!("the block was live");
        };
        assert!(at_peak.at_peak);
        assert!(!after_peak.at_peak);
    }

    #[test]
    fn a_free_older_than_the_block_is_a_straggler() {
        let mut live = LiveSet::new(8);
        live.insert(DeviceId::CPU, 1, entry(10, 50));
        assert!(matches!(live.free(DeviceId::CPU, 1, 49), Freed::Straggler));
        assert!(matches!(live.free(DeviceId(1), 1, 60), Freed::Unknown));
        assert_eq!(live.len(), 1);
        assert!(matches!(live.free(DeviceId::CPU, 1, 50), Freed::Ended(_)));
        assert_eq!(live.len(), 0);
    }

    #[test]
    fn the_same_address_on_two_devices_is_two_blocks() {
        let mut live = LiveSet::new(8);
        assert_eq!(live.insert(DeviceId::CPU, 7, entry(10, 0)), None);
        assert_eq!(live.insert(DeviceId(3), 7, entry(20, 1)), None);
        assert_eq!(
            live.insert(DeviceId(3), 7, entry(30, 2)),
            Some(entry(20, 1))
        );
        let Freed::Ended(ended) = live.free(DeviceId::CPU, 7, 5) else {
            panic!("the CPU block was live");
        };
        assert_eq!(ended, entry(10, 0));
        assert_eq!(live.len(), 1);
    }

    #[test]
    fn recategorised_blocks_count_at_the_peak_as_they_were() {
        let mut live = LiveSet::new(8);
        live.insert(DeviceId::CPU, 1, entry(10, 0));
        live.mark_peak();
        let changed = live.set_category(DeviceId::CPU, 1, Category::Parameter);
        assert_eq!(
            changed,
            Some(LiveEntry {
                at_peak: true,
                ..entry(10, 0)
            })
        );
        let at_peak: Vec<Category> = largest_at_peak(&live, 8)
            .iter()
            .map(|(_, e)| e.category)
            .collect();
        assert_eq!(at_peak, vec![Category::Other]);
        let rows: Vec<(Category, u64)> = group_at_peak(&live)
            .iter()
            .map(|(key, bytes, _)| (key.category, *bytes))
            .collect();
        assert_eq!(rows, vec![(Category::Other, 10)]);
        // After a new peak the block counts as it is now.
        live.mark_peak();
        assert_eq!(largest_at_peak(&live, 8)[0].1.category, Category::Parameter);
    }

    #[test]
    fn side_rows_keep_bytes_per_context_and_only_the_largest_blocks() {
        let cpu = DeviceId::CPU;
        let mut live = LiveSet::new(2);
        for addr in 0..100u64 {
            live.insert(cpu, addr, entry(addr + 1, addr));
        }
        live.mark_peak();
        for addr in 0..100u64 {
            assert!(matches!(live.free(cpu, addr, 200), Freed::Ended(_)));
        }
        assert_eq!(live.since_peak.rows().count(), 1);
        assert_eq!(live.since_peak_top.len(), 2);
        let rows = group_at_peak(&live);
        assert_eq!(rows.len(), 1);
        assert_eq!((rows[0].1, rows[0].2), ((1..=100).sum::<u64>(), 100));
        let top: Vec<u64> = largest_at_peak(&live, 2)
            .iter()
            .map(|(_, e)| e.size)
            .collect();
        assert_eq!(top, vec![100, 99]);
    }

    #[test]
    fn side_rows_are_made_once_per_context_and_cleared_together() {
        let mut rows = SideRows::default();
        assert!(rows.is_empty());
        assert!(rows.add(7, 10));
        assert!(!rows.add(7, 5));
        assert!(rows.add(2, 1));
        assert_eq!(
            rows.rows().collect::<Vec<_>>(),
            vec![(7, (15, 2)), (2, (1, 1))]
        );
        let mut cleared = Vec::new();
        rows.clear(|context| cleared.push(context));
        cleared.sort_unstable();
        assert_eq!(cleared, vec![2, 7]);
        assert!(rows.is_empty());
        assert_eq!(rows.rows().count(), 0);
        // A cleared context starts a new row.
        assert!(rows.add(7, 3));
        assert_eq!(rows.rows().collect::<Vec<_>>(), vec![(7, (3, 1))]);
    }

    #[test]
    fn contexts_no_block_uses_are_swept_and_reused() {
        let cpu = DeviceId::CPU;
        let mut live = LiveSet::new(4);
        for owner in 0..100_000u32 {
            let mut e = entry(8, u64::from(owner));
            e.owner = owner;
            live.insert(cpu, 1, e);
            assert!(matches!(live.free(cpu, 1, u64::MAX), Freed::Ended(_)));
        }
        assert!(
            live.contexts.table.len() < 4096,
            "{}",
            live.contexts.table.len()
        );
    }

    #[test]
    fn the_epoch_wraps_without_losing_who_was_live_at_the_peak() {
        let cpu = DeviceId::CPU;
        let mut live = LiveSet::new(8);
        live.insert(cpu, 1, entry(10, 0));
        live.epoch = u32::MAX - 1;
        live.mark_peak();
        live.insert(cpu, 2, entry(20, 1));
        live.mark_peak();
        assert_eq!(live.epoch, 1);
        live.insert(cpu, 3, entry(30, 2));
        assert_eq!(sizes_at_peak(&live), vec![10, 20]);
    }

    #[test]
    fn the_epoch_wrap_renumbers_the_blocks_in_the_nursery_too() {
        let cpu = DeviceId::CPU;
        let mut live = LiveSet::new(8);
        live.epoch = 1;
        // Young, so in the nursery, with the epoch the wrap comes back to.
        live.insert(cpu, 1, entry(10, 0));
        live.epoch = u32::MAX;
        live.mark_peak();
        assert_eq!(live.epoch, 1);
        assert_eq!(sizes_at_peak(&live), vec![10]);
    }

    #[test]
    fn largest_keeps_the_top_n_in_order() {
        let mut live = LiveSet::new(3);
        for (i, size) in [5u64, 50, 7, 50, 1].into_iter().enumerate() {
            live.insert(DeviceId::CPU, i as u64, entry(size, i as u64));
        }
        live.mark_peak();
        let top: Vec<(u64, u64)> = largest_at_peak(&live, 3)
            .iter()
            .map(|(_, e)| (e.size, e.ts))
            .collect();
        assert_eq!(top, vec![(50, 1), (50, 3), (7, 2)]);
    }

    #[test]
    fn neighbouring_addresses_get_neighbouring_buckets_with_different_tags() {
        const LOW: u64 = (1 << 57) - 1;
        let page = 0x7f12_3456_7000u64;
        let first = hash(page);
        for unit in 1..256u64 {
            let h = hash(page + unit * 16);
            assert_eq!(
                h & LOW,
                (first & LOW) + unit,
                "unit {unit}: the next bucket"
            );
            if unit < 128 {
                assert_ne!(h >> 57, first >> 57, "unit {unit}: its own tag");
            }
        }
        // Pages spread over the windows of a 2^26-bucket table.
        let windows: std::collections::HashSet<u64> = (0..4096u64)
            .map(|p| (hash(page + p * 4096) & LOW) >> 8)
            .collect();
        assert!(windows.len() > 4000, "{} windows", windows.len());
        // Small ids (device tensor ids) in one page still get a hash each.
        let ids: std::collections::HashSet<u64> = (0..4096u64).map(hash).collect();
        assert_eq!(ids.len(), 4096);
    }

    #[test]
    fn a_packed_entry_keeps_its_slot_and_tells_most_other_addresses_apart() {
        let packing = Packing::NARROWEST;
        let addr = 0x7f3a_1c00_0040;
        let entry = packing.pack(0xbeef, addr);
        assert_eq!(packing.slot(entry), 0xbeef);
        assert!(packing.may_be(entry, addr));
        // Neighbours, the addresses a probe meets, are told apart without the slab.
        let told_apart = (1..=1000u64)
            .filter(|i| !packing.may_be(entry, addr + i * 16))
            .count();
        assert!(
            told_apart >= 990,
            "{told_apart} of 1000 neighbours told apart"
        );
    }

    #[test]
    fn widening_a_packing_keeps_every_entry_matching_its_address() {
        let narrow = Packing::NARROWEST;
        let wide = narrow.to_hold(1 << 20);
        assert!(wide.slot_mask >= 1 << 20 && wide != narrow);
        assert_eq!(
            narrow.to_hold(5),
            narrow,
            "a slot that fits changes nothing"
        );
        assert_eq!(narrow.to_hold(u32::MAX).slot_mask, u32::MAX);
        for (slot, addr) in [
            (0, 0x1000),
            (0xffff, 0x7fff_ffff_fff0),
            (77, 0xdead_beef_0000),
        ] {
            let entry = narrow.widen(wide, narrow.pack(slot, addr));
            assert_eq!(wide.slot(entry), slot);
            assert!(wide.may_be(entry, addr));
            assert_eq!(
                entry,
                wide.pack(slot, addr),
                "as if packed wide from the start"
            );
        }
    }

    #[test]
    fn blocks_stay_findable_when_the_slab_outgrows_the_packing() {
        // 2^16 slots fit the narrowest packing; go past it with blocks freed and moved on
        // both sides of the widening.
        const BLOCKS: u64 = 70_000;
        let mut live = LiveSet::new(0);
        let addr = |i: u64| 0x5500_0000_0000 + i * 32;
        for i in 0..BLOCKS {
            live.insert(DeviceId::CPU, addr(i), entry(8 + i % 64, i));
            if i == 40_000 {
                assert!(matches!(
                    live.rekey(DeviceId::CPU, addr(7), addr(BLOCKS + 7), i),
                    Rekeyed::Moved(None)
                ));
            }
        }
        assert!(live.packing != Packing::NARROWEST, "the packing widened");
        assert!(matches!(
            live.rekey(DeviceId::CPU, addr(9), addr(BLOCKS + 9), BLOCKS),
            Rekeyed::Moved(None)
        ));
        for i in 0..BLOCKS {
            let key = if i == 7 || i == 9 {
                addr(BLOCKS + i)
            } else {
                addr(i)
            };
            match live.free(DeviceId::CPU, key, BLOCKS + 1) {
                Freed::Ended(ended) => assert_eq!(ended.size, 8 + i % 64, "block {i}"),
                other => panic!("block {i} not found: {other:?}"),
            }
        }
        assert_eq!(live.len(), 0);
        assert!(matches!(
            live.free(DeviceId::CPU, addr(3), BLOCKS + 2),
            Freed::Unknown
        ));
    }

    /// An address remembered as not indexed (its block died in the nursery) is forgotten
    /// when a block there enters the index: a new block at the address still ends that one,
    /// as a block never freed is ended when its address is reused.
    #[test]
    fn an_address_remembered_as_unindexed_is_forgotten_when_indexed_again() {
        let mut live = LiveSet::new(0);
        let reused = 0x4400_0000_0000;
        live.insert(DeviceId::CPU, reused, entry(16, 1));
        assert!(matches!(
            live.free(DeviceId::CPU, reused, 2),
            Freed::Ended(_)
        ));
        assert!(live.unindexed.knows(reused));
        assert!(live.insert(DeviceId::CPU, reused, entry(24, 3)).is_none());
        // Newer blocks push it out of the nursery into the index; its free never comes.
        for i in 0..NURSERY_BLOCKS as u64 {
            live.insert(DeviceId::CPU, 0x5500_0000_0000 + i * 64, entry(8, 4 + i));
        }
        assert!(live.find_indexed(DeviceId::CPU, reused).is_some());
        assert!(!live.unindexed.knows(reused));
        let displaced = live.insert(DeviceId::CPU, reused, entry(32, 100));
        assert_eq!(displaced.map(|old| old.size), Some(24));
        // Freed from the index, it is remembered again.
        for i in 0..NURSERY_BLOCKS as u64 {
            live.insert(DeviceId::CPU, 0x6600_0000_0000 + i * 64, entry(8, 200 + i));
        }
        assert!(matches!(live.free(DeviceId::CPU, reused, 300), Freed::Ended(e) if e.size == 32));
        assert!(live.unindexed.knows(reused));
    }

    /// A block at `addr` made at `ts`, with a context of its own set's.
    fn block_at(live: &mut LiveSet, addr: u64, ts: u64) -> Block {
        let context = live.contexts.acquire(Context {
            device: DeviceId::CPU,
            category: Category::Other,
            thread: 0,
            owner: NONE,
            origin: Origin::NOWHERE,
        });
        Block {
            addr,
            size: 16,
            ts,
            context,
            epoch: live.epoch,
        }
    }

    /// Tables are built anew by `make_room` as they fill, to the sizes the table's own growth
    /// gives (the same buckets and room after every insert, so neither a larger table nor one
    /// the table then grows itself), and keep every block.
    #[test]
    fn tables_built_anew_grow_as_their_own_growth_would_and_keep_every_block() {
        let mut live = LiveSet::new(0);
        let mut own_way = HashTable::<u32>::new();
        // Addresses spread over many pages, so the blocks land all over the table.
        let addr = |i: u64| 0x6600_0000_0000 + (i.wrapping_mul(0x9e37_79b9) % (1 << 30)) * 16;
        let mut inserted = std::collections::HashSet::new();
        for i in 0..50_000 {
            let key = addr(i);
            if !inserted.insert(key) {
                continue;
            }
            let block = block_at(&mut live, key, i);
            live.index_insert(DeviceId::CPU, block);
            own_way.insert_unique(key, i as u32, |&j| addr(u64::from(j)));
            assert_eq!(
                live.index[0].allocation_size(),
                own_way.allocation_size(),
                "after {} blocks",
                inserted.len()
            );
            // Grown by `make_room` alone: the room it recorded is the table's whole room.
            assert_eq!(live.index_room[0], own_way.capacity());
        }
        for &key in &inserted {
            assert!(live.contains(DeviceId::CPU, key), "{key:#x} lost");
        }
    }

    /// Blocks freed and made at a steady count leave tombstones; building the table anew
    /// clears them: the table doubles at most once past its size when filled (its room then
    /// holds the blocks with half to spare), however long the churn goes on.
    #[test]
    fn churn_at_a_steady_size_grows_the_table_at_most_once() {
        const LIVE: u64 = 6_000;
        let mut live = LiveSet::new(0);
        let addr = |i: u64| 0x7700_0000_0000 + (i.wrapping_mul(0x9e37_79b9) % (1 << 32)) * 16;
        for i in 0..LIVE {
            live.insert(DeviceId::CPU, addr(i), entry(16, i));
        }
        let filled = live.index[0].allocation_size();
        for i in LIVE..40 * LIVE {
            assert!(matches!(
                live.free(DeviceId::CPU, addr(i - LIVE), i),
                Freed::Ended(_)
            ));
            assert!(live.insert(DeviceId::CPU, addr(i), entry(16, i)).is_none());
        }
        assert!(
            live.index[0].allocation_size() <= 2 * filled,
            "{} bytes, {filled} when filled",
            live.index[0].allocation_size()
        );
        for i in 39 * LIVE..40 * LIVE {
            assert!(live.contains(DeviceId::CPU, addr(i)));
        }
    }

    #[test]
    fn the_slab_reuses_a_free_slot_before_a_fresh_one() {
        let block = |addr| Block {
            addr,
            ..Block::default()
        };
        let mut slab = Slab::default();
        let slots: Vec<u32> = (0..5000).map(|i| slab.insert(block(i))).collect();
        assert_eq!(slots, (0..5000).collect::<Vec<u32>>());
        for slot in [4999, 17, 4096, 3] {
            assert_eq!(slab.remove(slot).addr, u64::from(slot));
        }
        // The freed last first.
        assert_eq!(slab.next_index(), 3);
        let reused: Vec<u32> = (0..5).map(|i| slab.insert(block(10_000 + i))).collect();
        assert_eq!(reused, [3, 4096, 17, 4999, 5000]);
        assert_eq!(slab.get(17).addr, 10_002);
        assert_eq!(slab.next_index(), 5001);
    }

    /// The budget: recording adds at most 48 bytes per live allocation.
    #[test]
    fn a_million_live_blocks_cost_at_most_48_bytes_each() {
        const BLOCKS: u64 = 1_000_000;
        let mut live = LiveSet::new(32);
        for (i, addr) in (0..BLOCKS).map(|i| (i, 0x7f00_0000_0000 + i * 48)) {
            let mut e = entry(32 + i % 512, i);
            // A few thousand contexts: span instances and ops as a training step has them.
            e.owner = (i % 4096) as u32;
            e.category = Category::from_index((i % 5) as u8);
            live.insert(DeviceId::CPU, addr, e);
        }
        live.mark_peak();
        // Free and reallocate a tenth, so the free list is used as well.
        for i in (0..BLOCKS).step_by(10) {
            let addr = 0x7f00_0000_0000 + i * 48;
            assert!(matches!(
                live.free(DeviceId::CPU, addr, i + BLOCKS),
                Freed::Ended(_)
            ));
            live.insert(DeviceId::CPU, addr, entry(64, i + BLOCKS));
        }
        assert_eq!(live.len() as u64, BLOCKS);
        let per_block = live.heap_bytes() as f64 / BLOCKS as f64;
        assert!(per_block <= 48.0, "{per_block:.1} bytes per live block");
    }
}
