//! The live map: live blocks by (device, address), and nothing else. It knows no peaks and no
//! contexts; [`LiveSet`](super::LiveSet) builds those on it.
//!
//! Each device has a hash table of `u32` entries, each a block's slab index and a fingerprint
//! of its address ([`Packing`]); the blocks themselves sit in a [`Slab`]. Each layer beyond a
//! plain table of slab indexes stays because the real workloads' work is slower without it
//! (BENCHMARKS.md, "What the live map's layers earn", measures each turned off alone and the
//! small ones together): the index [`hash`] that keeps neighbouring addresses in neighbouring
//! buckets, the fingerprints packed beside the slab index, the choice of a likely-cached free
//! slot (`free_slots`), the memo of addresses known not to be indexed ([`Unindexed`]), the
//! table rebuild that fetches its slab reads ahead ([`LiveMap::make_room`]), asking for a
//! block a few events before its free ([`LiveMap::prefetch_block`]), and for the table's lines
//! that lookup reads a few events before that ([`LiveMap::prefetch_index`]), and, once the
//! live set is large, small heap blocks kept in leaves by address region instead of the
//! heap's table ([`regions`]).

mod free_slots;
mod index;
mod regions;
mod slab;
#[cfg(test)]
mod tests;

use std::cell::Cell;

use hashbrown::hash_table::Entry;
use hashbrown::HashTable;

use super::super::event::DeviceId;
use index::{
    buckets_for, capacity_for, control_bytes, had_runs, hash, past_first_group, prefetch_lines,
    room_in, Packing, Unindexed, GROWTH_AHEAD, PREFETCH_FROM,
};
use regions::{has_cell, Found, Place, Regions, REGIONS_FROM, SMALL};
use slab::{prefetch, prefetch_line, Slab};

/// A live block, as the map stores it in its slab: 32 bytes. The map reads its address and time;
/// the context and epoch are the live set's.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct Block {
    /// Address or tensor id.
    pub(super) addr: u64,
    pub(super) size: u64,
    pub(super) ts: u64,
    /// Its context id (see `contexts`).
    pub(super) context: u32,
    /// Peaks marked before it became what it is.
    pub(super) epoch: u32,
}

const _: () = assert!(std::mem::size_of::<Block>() == 32);

/// Where a live block sits in the map, valid until the map next changes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Slot(u32);

/// Why a block was not taken out of the map.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Missed {
    /// The block at the key was made after the given time: it belongs to a later life of the
    /// address, and stays.
    Straggler,
    /// Nothing is live at the key.
    Unknown,
}

/// Live blocks keyed by (device, address).
#[derive(Debug)]
pub(super) struct LiveMap {
    /// Per device (by id): each live block's slab index and address fingerprint, hashed by
    /// address.
    index: Vec<HashTable<u32>>,
    /// Per device: the blocks its table held room for ([`room_in`]) when
    /// [`LiveMap::make_room`] last built it (removals since may have left tombstones, which
    /// take hashbrown's room until the next build).
    index_room: Vec<usize>,
    /// Per device: whether its table is held sparse, having shown runs ([`room_in`]).
    index_sparse: Vec<bool>,
    packing: Packing,
    slab: Slab,
    /// Heap addresses known not to be in the index.
    unindexed: Unindexed,
    /// The heap's small blocks, held in leaves by region rather than in the heap's table.
    regions: Regions,
    /// Heap blocks under this many bytes go to leaves ([`SMALL`] but in tests).
    small_below: u64,
    /// Whether the regions keep account of the heap's blocks: from when the heap's table
    /// first holds `regions_from` blocks ([`REGIONS_FROM`] but in tests). Until then the
    /// table, small and in the caches, holds every block, and no lookup pays for the regions.
    regions_on: bool,
    regions_from: usize,
    len: usize,
    /// Where the heap's table keeps its control bytes, once a prefetch has looked (see
    /// [`control_bytes`]); forgotten whenever the table may move.
    heap_control: Cell<Option<usize>>,
}

impl Default for LiveMap {
    fn default() -> LiveMap {
        LiveMap {
            index: Vec::new(),
            index_room: Vec::new(),
            index_sparse: Vec::new(),
            packing: Packing::NARROWEST,
            slab: Slab::default(),
            unindexed: Unindexed::default(),
            regions: Regions::default(),
            small_below: SMALL,
            regions_on: false,
            regions_from: REGIONS_FROM,
            len: 0,
            heap_control: Cell::new(None),
        }
    }
}

impl LiveMap {
    /// Live blocks.
    #[cfg(test)]
    pub(super) fn len(&self) -> usize {
        self.len
    }

    /// A map whose heap blocks all go to the hash table, as large blocks do.
    #[cfg(test)]
    pub(super) fn without_leaves() -> LiveMap {
        LiveMap::with_leaves(0, usize::MAX)
    }

    /// A map whose heap blocks under `small_below` bytes go to leaves once the heap's table
    /// has held `from` blocks.
    #[cfg(test)]
    pub(super) fn with_leaves(small_below: u64, from: usize) -> LiveMap {
        LiveMap {
            small_below,
            regions_from: from,
            ..LiveMap::default()
        }
    }

    /// Turns the regions on: the heap table's small blocks move to leaves, the regions count
    /// the blocks it keeps, and it is built anew for those.
    #[cold]
    #[inline(never)]
    fn turn_regions_on(&mut self) {
        self.regions_on = true;
        let Some(table) = self.index.first_mut() else {
            return;
        };
        let (regions, slab, packing) = (&mut self.regions, &self.slab, self.packing);
        table.retain(|entry| {
            let at = packing.slot(*entry);
            let block = slab.get(at);
            let small = block.size < self.small_below;
            match regions.open(block.addr, small) {
                Some(place) if small => {
                    place.fill(at);
                    false
                }
                Some(place) => {
                    place.table_gained();
                    true
                }
                None => true,
            }
        });
        table.shrink_to(0, |entry| packing.rehash(slab, *entry));
        self.index_room[0] = room_in(table.num_buckets(), self.index_sparse[0]);
        self.heap_control.set(None);
    }

    /// Makes `block` live at `(device, block.addr)`; returns the block it replaced there, if
    /// the key was live already.
    #[inline]
    pub(super) fn insert(&mut self, device: DeviceId, block: Block) -> Option<Block> {
        if device == DeviceId::CPU && self.regions_on {
            return self.insert_with_regions(block);
        }
        self.insert_in_table(device, block)
    }

    /// Takes out the block at `(device, addr)` for a free stamped `ts`.
    #[inline]
    pub(super) fn remove(&mut self, device: DeviceId, addr: u64, ts: u64) -> Result<Block, Missed> {
        let at = self.take_out(device, addr, ts)?;
        self.len -= 1;
        Ok(self.slab.remove(at))
    }

    /// Moves the block at `(device, from)` to the key `to`, unchanged but for its address, for
    /// a given-up address that may be reused before the block ends; `ts` is judged as a free's
    /// would be. Returns the block that was live at `to`, taken out, if any.
    #[inline]
    pub(super) fn rekey(
        &mut self,
        device: DeviceId,
        from: u64,
        to: u64,
        ts: u64,
    ) -> Result<Option<Block>, Missed> {
        // Taken out before `to` is indexed: a move to the same key leaves it indexed.
        let at = self.take_out(device, from, ts)?;
        let displaced = self.put(device, to, at);
        self.slab.get_mut(at).addr = to;
        Ok(displaced.map(|displaced| {
            self.len -= 1;
            self.slab.remove(displaced)
        }))
    }

    /// [`LiveMap::insert`] of a heap block while the regions are on. Out of line, as the
    /// other ways of the regions are: a program with fewer blocks, which never turns them on,
    /// runs the table's ways as they are without them.
    #[inline(never)]
    fn insert_with_regions(&mut self, block: Block) -> Option<Block> {
        if let Some(inserted) = self.insert_in_region(block) {
            return inserted;
        }
        self.insert_in_table(DeviceId::CPU, block)
    }

    /// [`LiveMap::insert_with_regions`] where the block's region keeps it in a leaf (`None`:
    /// the table takes it, its region open).
    #[inline]
    fn insert_in_region(&mut self, block: Block) -> Option<Option<Block>> {
        let small = block.size < self.small_below;
        let place = leaf_place(
            &mut self.regions,
            &self.index,
            &self.slab,
            self.packing,
            block.addr,
            small,
        )?;
        if let Some(at) = place.in_cell() {
            return Some(Some(std::mem::replace(self.slab.get_mut(at), block)));
        }
        place.fill(self.slab.insert(block));
        self.len += 1;
        Some(None)
    }

    /// [`LiveMap::insert`] into `device`'s table (a heap block's region open, when the regions
    /// are on).
    #[inline]
    fn insert_in_table(&mut self, device: DeviceId, block: Block) -> Option<Block> {
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
                self.len += 1;
                self.entered_table(device, addr);
                return None;
            }
        };
        Some(std::mem::replace(self.slab.get_mut(found), block))
    }

    /// Takes the index entry of the block at `(device, addr)` out for a free stamped `ts`,
    /// leaving its slab slot as it is; returns the slot. The regions' ways are out of line:
    /// a program with fewer blocks, which never turns them on, runs the table's alone.
    #[inline]
    fn take_out(&mut self, device: DeviceId, addr: u64, ts: u64) -> Result<u32, Missed> {
        if device == DeviceId::CPU && self.regions_on {
            if let Some(taken) = self.take_out_of_region(addr, ts) {
                return taken;
            }
        }
        let (index, slab, packing) = (&mut self.index, &self.slab, self.packing);
        let table = index
            .get_mut(usize::from(device.0))
            .ok_or(Missed::Unknown)?;
        let found = table
            .find_entry(hash(addr), |&v| packing.is(slab, v, addr))
            .map_err(|_| Missed::Unknown)?;
        let at = packing.slot(*found.get());
        if ts < slab.get(at).ts {
            return Err(Missed::Straggler);
        }
        found.remove();
        if device == DeviceId::CPU {
            self.unindexed.note(addr);
            if self.regions_on {
                self.left_table(addr);
            }
        }
        Ok(at)
    }

    /// [`LiveMap::take_out`] of a heap block while the regions are on, where its region
    /// settles it: taken from its leaf, or known not live (`None`: ask the table). Out of line
    /// as [`LiveMap::insert_in_region`] is.
    #[inline(never)]
    fn take_out_of_region(&mut self, addr: u64, ts: u64) -> Option<Result<u32, Missed>> {
        if !has_cell(addr) {
            return None;
        }
        let Some(place) = self.regions.place(addr) else {
            return Some(Err(Missed::Unknown));
        };
        if let Some(at) = place.in_cell() {
            if ts < self.slab.get(at).ts {
                return Some(Err(Missed::Straggler));
            }
            if place.clear() {
                self.regions.forget_if_empty(addr);
            }
            return Some(Ok(at));
        }
        (!place.has_table_blocks()).then_some(Err(Missed::Unknown))
    }

    /// A block at `addr` entered `device`'s table: with the regions on, a heap block's region
    /// counts it; before, the regions turn on once the heap's table holds `regions_from`.
    #[inline]
    fn entered_table(&mut self, device: DeviceId, addr: u64) {
        if device != DeviceId::CPU {
            return;
        }
        if self.regions_on {
            if let Some(place) = self.regions.place(addr) {
                place.table_gained();
            }
        } else if self.index[0].len() >= self.regions_from {
            self.turn_regions_on();
        }
    }

    /// A heap block at `addr` left the table while the regions are on: its region counts it
    /// out.
    #[inline(never)]
    fn left_table(&mut self, addr: u64) {
        if self
            .regions
            .place(addr)
            .is_some_and(|place| place.table_lost())
        {
            self.regions.forget_if_empty(addr);
        }
    }

    /// Indexes slab slot `at`, taken out by [`LiveMap::take_out`], at `(device, to)`;
    /// returns the slot of the block that was live there, taken out of the index.
    #[inline]
    fn put(&mut self, device: DeviceId, to: u64, at: u32) -> Option<u32> {
        if device == DeviceId::CPU && self.regions_on {
            if let Some(put) = self.put_in_region(to, at) {
                return put;
            }
        }
        let slot = self.table_for(device, to);
        let (table, slab, packing) = (&mut self.index[slot], &mut self.slab, self.packing);
        let moved = packing.pack(at, to);
        match table.entry(
            hash(to),
            |&v| packing.is(slab, v, to),
            |&v| packing.rehash(slab, v),
        ) {
            Entry::Occupied(mut taken) => {
                Some(packing.slot(std::mem::replace(taken.get_mut(), moved)))
            }
            Entry::Vacant(vacant) => {
                vacant.insert(moved);
                self.entered_table(device, to);
                None
            }
        }
    }

    /// [`LiveMap::put`] of a heap block while the regions are on, where its region keeps it
    /// in a leaf (`None`: the table takes it, its region open). Out of line as
    /// [`LiveMap::insert_in_region`] is.
    #[inline(never)]
    fn put_in_region(&mut self, to: u64, at: u32) -> Option<Option<u32>> {
        let small = self.slab.get(at).size < self.small_below;
        let place = leaf_place(
            &mut self.regions,
            &self.index,
            &self.slab,
            self.packing,
            to,
            small,
        )?;
        if place.in_cell().is_some() {
            return Some(place.replace(at));
        }
        place.fill(at);
        Some(None)
    }

    /// Where the block at `(device, addr)` is, if one is live there.
    pub(super) fn find(&self, device: DeviceId, addr: u64) -> Option<Slot> {
        if device == DeviceId::CPU {
            match self.heap_found(addr) {
                Found::Leaf(at) => return Some(Slot(at)),
                Found::Nothing => return None,
                Found::Table => {}
            }
        }
        let table = self.index.get(usize::from(device.0))?;
        let packing = self.packing;
        table
            .find(hash(addr), |&v| packing.is(&self.slab, v, addr))
            .map(|&v| Slot(packing.slot(v)))
    }

    /// Where a heap block at `addr` is, as far as the regions (when on) and the memo of
    /// addresses not indexed say: [`Found::Table`] where only the table can tell.
    #[inline]
    fn heap_found(&self, addr: u64) -> Found {
        match self.regions_on.then(|| self.regions.find(addr)) {
            Some(found @ (Found::Leaf(_) | Found::Nothing)) => found,
            _ if self.unindexed.knows(addr) => Found::Nothing,
            _ => Found::Table,
        }
    }

    #[inline]
    pub(super) fn block(&self, slot: Slot) -> &Block {
        self.slab.get(slot.0)
    }

    #[inline]
    pub(super) fn block_mut(&mut self, slot: Slot) -> &mut Block {
        self.slab.get_mut(slot.0)
    }

    /// Whether the map holds more blocks than the caches do, so that asking for a block
    /// ahead ([`LiveMap::prefetch_block`]) pays for the asking.
    #[inline]
    pub(super) fn outgrows_caches(&self) -> bool {
        self.len >= PREFETCH_FROM
    }

    /// Asks for the slab block a lookup of `(device, addr)` will compare, a few events before
    /// the one that looks it up: a leaf's cell or the table's entries (compared by fingerprint
    /// only) say where it is, so no slab line is waited for here, and the block's wait
    /// overlaps the events in between.
    #[inline]
    pub(super) fn prefetch_block(&self, device: DeviceId, addr: u64) {
        if device == DeviceId::CPU {
            match self.heap_found(addr) {
                Found::Leaf(at) => {
                    prefetch(self.slab.get(at));
                    return;
                }
                Found::Nothing => return,
                Found::Table => {}
            }
        }
        let Some(table) = self.index.get(usize::from(device.0)) else {
            return;
        };
        let packing = self.packing;
        if let Some(&entry) = table.find(hash(addr), |&v| packing.may_be(v, addr)) {
            prefetch(self.slab.get(packing.slot(entry)));
        }
    }

    /// Asks for what a lookup of heap address `addr` reads first: its leaf's cell, or the
    /// heap table's control bytes and entries where the probe starts. Called a few events
    /// before [`LiveMap::prefetch_block`] for the same address, whose lookup then finds them
    /// cached: a program that frees in another order than it allocated (rayon's sorts) misses
    /// the index on every free, and otherwise waits for those misses one at a time.
    #[inline]
    pub(super) fn prefetch_index(&self, addr: u64) {
        if let Some(cell) = self
            .regions_on
            .then(|| self.regions.cell_address(addr))
            .flatten()
        {
            prefetch_line(cell);
            return;
        }
        let Some(table) = self.index.get(usize::from(DeviceId::CPU.0)) else {
            return;
        };
        let Some(control) = self.heap_control.get().or_else(|| control_bytes(table)) else {
            return;
        };
        self.heap_control.set(Some(control));
        prefetch_lines(table, control, hash(addr));
    }

    /// The slab slots of the blocks live on `device`.
    fn slots_on(&self, device: DeviceId) -> impl Iterator<Item = u32> + '_ {
        let in_table = self
            .index
            .get(usize::from(device.0))
            .into_iter()
            .flat_map(move |table| table.iter().map(move |&v| self.packing.slot(v)));
        let in_leaves = (device == DeviceId::CPU)
            .then(|| self.regions.slots())
            .into_iter()
            .flatten();
        in_table.chain(in_leaves)
    }

    /// The blocks live on `device`.
    pub(super) fn blocks_on(&self, device: DeviceId) -> impl Iterator<Item = &Block> + '_ {
        self.slots_on(device).map(move |slot| self.slab.get(slot))
    }

    /// Every live block, with its device.
    pub(super) fn blocks(&self) -> impl Iterator<Item = (DeviceId, &Block)> + '_ {
        // The heap's blocks may all be in leaves, with no table made for it.
        (0..self.index.len().max(1)).flat_map(move |device| {
            let device = DeviceId(u16::try_from(device).unwrap_or(u16::MAX));
            self.blocks_on(device).map(move |block| (device, block))
        })
    }

    /// Calls `change` on every live block.
    pub(super) fn for_each_block_mut(&mut self, mut change: impl FnMut(&mut Block)) {
        let (slab, packing) = (&mut self.slab, self.packing);
        let in_tables = self.index.iter().flatten().map(|&v| packing.slot(v));
        for slot in in_tables.chain(self.regions.slots()) {
            change(slab.get_mut(slot));
        }
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
            self.index_sparse.resize(slot + 1, false);
        }
        let table = &self.index[slot];
        if table.len() >= self.index_room[slot] || table.len() == table.capacity() {
            self.heap_control.set(None);
            self.make_room(slot);
        }
        slot
    }

    /// Builds table `slot` anew before it runs out of room ([`room_in`], or hashbrown's own
    /// when tombstones of removed blocks have taken it), as the table would itself (twice the
    /// room unless one more block fits in half of it, else as much, without the tombstones),
    /// but fetching the slab blocks it rehashes ahead. Unlike the table's own rehash in place,
    /// a rebuild at the same size holds both tables for a moment, as growth does.
    ///
    /// The table's own growth reads each entry's slab block for its address, in bucket order:
    /// pages in hash order, so on a live set larger than the caches nearly every read waits
    /// for memory. Here the reads of the next [`GROWTH_AHEAD`] entries are in flight while one
    /// is inserted.
    ///
    /// Each entry's bucket in the old table is checked against where its lookup starts: a
    /// table with runs is held sparse from then on ([`room_in`]), from the next build on.
    #[cold]
    #[inline(never)]
    fn make_room(&mut self, slot: usize) {
        let old = std::mem::take(&mut self.index[slot]);
        let room = self.index_room[slot];
        let wanted = if old.len() + 1 > room / 2 {
            room + 1
        } else {
            room
        };
        let sparse = self.index_sparse[slot];
        let mut built = HashTable::with_capacity(capacity_for(buckets_for(wanted.max(1), sparse)));
        let (slab, packing) = (&self.slab, self.packing);
        let rehash = |entry: &u32| packing.rehash(slab, *entry);
        let old_buckets = old.num_buckets();
        let mut spilled = 0;
        let mut insert = |(entry, bucket): (u32, usize)| {
            let hash = rehash(&entry);
            spilled += usize::from(past_first_group(bucket, hash, old_buckets));
            built.insert_unique(hash, entry, rehash);
        };
        // Entries wait in `ahead` while their slab blocks are fetched.
        let mut ahead = [(0u32, 0usize); GROWTH_AHEAD];
        let entries = old
            .iter_buckets()
            .filter_map(|bucket| Some((*old.get_bucket(bucket)?, bucket)));
        for (n, (entry, bucket)) in entries.enumerate() {
            let at = n % GROWTH_AHEAD;
            if n >= GROWTH_AHEAD {
                insert(ahead[at]);
            }
            prefetch(slab.get(packing.slot(entry)));
            ahead[at] = (entry, bucket);
        }
        let held = old.len();
        for n in held.saturating_sub(GROWTH_AHEAD)..held {
            insert(ahead[n % GROWTH_AHEAD]);
        }
        let sparse = sparse || had_runs(held, spilled);
        self.index_sparse[slot] = sparse;
        self.index_room[slot] = room_in(built.num_buckets(), sparse);
        self.index[slot] = built;
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

    /// Heap bytes the map holds (tables and slab).
    #[cfg(test)]
    pub(super) fn heap_bytes(&self) -> usize {
        let tables: usize = self.index.iter().map(HashTable::allocation_size).sum();
        tables
            + self.regions.heap_bytes()
            + self.index.capacity() * std::mem::size_of::<HashTable<u32>>()
            + self.slab.heap_bytes()
    }
}

/// The place in a leaf of a heap block (of a `small` one, or one whose address has a live
/// block in a leaf) at `addr` while the regions are on; `None` where the table takes it, its
/// region open.
fn leaf_place<'a>(
    regions: &'a mut Regions,
    index: &[HashTable<u32>],
    slab: &Slab,
    packing: Packing,
    addr: u64,
    small: bool,
) -> Option<Place<'a>> {
    let place = regions.open(addr, small)?;
    // A block its region has in the table may start at the same address.
    let in_leaf = place.in_cell().is_some()
        || (small && !(place.has_table_blocks() && in_table(index, slab, packing, addr)));
    in_leaf.then_some(place)
}

/// Whether the heap's table holds a block at `addr`.
fn in_table(index: &[HashTable<u32>], slab: &Slab, packing: Packing, addr: u64) -> bool {
    index
        .get(usize::from(DeviceId::CPU.0))
        .is_some_and(|table| {
            table
                .find(hash(addr), |&v| packing.is(slab, v, addr))
                .is_some()
        })
}
