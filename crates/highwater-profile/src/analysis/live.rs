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
//! Each layer beyond a plain table of slab indexes stays because the real workloads' work is
//! slower without it (BENCHMARKS.md, "What the live map's layers earn", measures each turned
//! off alone and the small ones together): the index [`hash`] that keeps neighbouring
//! addresses in neighbouring buckets, the fingerprints packed beside the slab index
//! ([`Packing`]), the choice of a likely-cached free slot (`free_slots`), the memo of
//! addresses known not to be indexed ([`Unindexed`]), the table rebuild that fetches its slab
//! reads ahead ([`LiveSet::make_room`]), and asking for a block a few events before its free
//! ([`LiveSet::prefetch_block`]). A nursery that held the newest blocks out of the index went.
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

mod at_peak;
mod contexts;
mod free_slots;
mod index;
#[cfg(test)]
mod model_tests;
mod slab;
#[cfg(test)]
mod tests;

use hashbrown::hash_table::Entry;
use hashbrown::HashTable;

use crate::model::Category;

use super::event::DeviceId;
pub(crate) use at_peak::{group_at_peak, group_live_now, largest_at_peak, GroupKey};
use at_peak::{rank_order, Ranked, SideRows};
use contexts::{Context, Contexts};
use index::{hash, Packing, Unindexed, GROWTH_AHEAD, PREFETCH_FROM};
use slab::{prefetch, Block, Slab};

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
    /// Heap addresses known not to be in the index.
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

impl LiveSet {
    /// An empty set that can list the `top` largest blocks at the peak.
    pub(crate) fn new(top: usize) -> LiveSet {
        LiveSet {
            index: Vec::new(),
            index_room: Vec::new(),
            packing: Packing::NARROWEST,
            slab: Slab::default(),
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
        if device == DeviceId::CPU && self.unindexed.knows(addr) {
            return false;
        }
        self.find_slot(device, addr).is_some()
    }

    /// The slab slot of the block at `(device, addr)`.
    fn find_slot(&self, device: DeviceId, addr: u64) -> Option<u32> {
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
        let at = self.find_slot(device, addr)?;
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
        let Some(at) = self.find_slot(device, addr) else {
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

    /// The blocks live now on `device`.
    fn blocks_on(&self, device: DeviceId) -> impl Iterator<Item = &Block> + '_ {
        self.index
            .get(usize::from(device.0))
            .into_iter()
            .flat_map(move |table| {
                table
                    .iter()
                    .map(move |&v| self.slab.get(self.packing.slot(v)))
            })
    }

    /// Live blocks at the current peak: (device, address, block).
    fn still_live_at_peak(&self) -> impl Iterator<Item = (DeviceId, &Block)> + '_ {
        self.index
            .iter()
            .enumerate()
            .flat_map(move |(device, table)| {
                let device = DeviceId(u16::try_from(device).unwrap_or(u16::MAX));
                table
                    .iter()
                    .map(move |&v| (device, self.slab.get(self.packing.slot(v))))
            })
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
