//! The live set: live blocks by address (the [`map`]), what they share, and what was live at the
//! peak without copying the live set at every new peak.
//!
//! # A compact live set
//!
//! A live block costs 32 bytes in the [`map`]'s slab ([`Block`]: address, size, allocation
//! time, a context id and a peak epoch) plus one `u32` entry in its device's hash table, whose
//! buckets are 5 bytes: about 42 bytes per live block at a million blocks (the test
//! `a_million_live_blocks_cost_at_most_48_bytes_each` measures it). What the blocks of one
//! span instance, op and category share (device, thread, owner, span node, op, category) is
//! stored once, as a [`Context`] the blocks refer to by id, counted so that contexts no block
//! or peak row needs any more are swept and their ids reused.
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
mod map;
#[cfg(test)]
mod model_tests;
#[cfg(test)]
mod tests;

use crate::model::Category;

use super::event::DeviceId;
pub(crate) use at_peak::{group_at_peak, group_live_now, largest_at_peak, GroupKey};
use at_peak::{rank_order, Ranked, SideRows};
use contexts::{Context, Contexts};
use map::{Block, LiveMap, Missed};

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
    map: LiveMap,
    contexts: Contexts,
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
            map: LiveMap::default(),
            contexts: Contexts::default(),
            epoch: 0,
            peaked: false,
            since_peak: SideRows::default(),
            since_peak_top: Vec::new(),
            top,
        }
    }

    /// A live set whose map puts heap blocks under `small_below` bytes in leaves (see
    /// `map::regions`) once its heap table has held `from` blocks, the others in the table.
    #[cfg(test)]
    pub(crate) fn with_leaves(top: usize, small_below: u64, from: usize) -> LiveSet {
        LiveSet {
            map: LiveMap::with_leaves(small_below, from),
            ..LiveSet::new(top)
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
        let old = self.map.insert(device, block)?;
        Some(self.displace(device, old))
    }

    /// Ends `old`, which a new block at its key replaced; returns it as it was.
    fn displace(&mut self, device: DeviceId, old: Block) -> LiveEntry {
        let displaced = self.entry(&old);
        self.end_block(device, old);
        displaced
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
        match self.map.remove(device, addr, ts) {
            Ok(block) => {
                let entry = self.entry(&block);
                self.end_block(device, block);
                Freed::Ended(entry)
            }
            Err(Missed::Straggler) => Freed::Straggler,
            Err(Missed::Unknown) => Freed::Unknown,
        }
    }

    /// Moves the block at `(device, from)` to the key `to`, unchanged (same size, time, context
    /// and peak epoch), for a given-up address that may be reused before the block ends; `ts`
    /// is judged as a free's would be. A block already at `to` is ended and handed back.
    pub(crate) fn rekey(&mut self, device: DeviceId, from: u64, to: u64, ts: u64) -> Rekeyed {
        match self.map.rekey(device, from, to, ts) {
            Ok(None) => Rekeyed::Moved(None),
            Ok(Some(block)) => {
                let entry = self.entry(&block);
                self.end_block(device, block);
                Rekeyed::Moved(Some(entry))
            }
            Err(Missed::Straggler) => Rekeyed::Straggler,
            Err(Missed::Unknown) => Rekeyed::Unknown,
        }
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

    /// Whether the live map outgrows the caches (see [`LiveMap::prefetch_block`]).
    #[inline]
    pub(crate) fn outgrows_caches(&self) -> bool {
        self.map.outgrows_caches()
    }

    /// Asks for the block a lookup of `(device, addr)` will read, a few events before it.
    #[inline]
    pub(crate) fn prefetch_block(&self, device: DeviceId, addr: u64) {
        self.map.prefetch_block(device, addr);
    }

    /// Asks for the heap table's lines a lookup of `addr` reads, a few events before
    /// [`LiveSet::prefetch_block`] for it.
    #[inline]
    pub(crate) fn prefetch_index(&self, addr: u64) {
        self.map.prefetch_index(addr);
    }

    /// Whether a block is live at `(device, addr)`.
    #[inline]
    pub(crate) fn contains(&self, device: DeviceId, addr: u64) -> bool {
        self.map.find(device, addr).is_some()
    }

    /// Changes the category of a live block; returns the block as it was when the block is
    /// live and its category changed.
    pub(crate) fn set_category(
        &mut self,
        device: DeviceId,
        addr: u64,
        category: Category,
    ) -> Option<LiveEntry> {
        let at = self.map.find(device, addr)?;
        let before = *self.map.block(at);
        let old = self.contexts.get(before.context);
        if old.category == category {
            return None;
        }
        let was = self.entry(&before);
        let context = self.contexts.acquire(Context { category, ..old });
        // From the peak's point of view the block is now a new one: the side rows keep it as
        // it was, and the live one gets the current epoch.
        self.end_block(device, before);
        let block = self.map.block_mut(at);
        block.context = context;
        block.epoch = self.epoch;
        Some(was)
    }

    /// Sets the op (name, shape, dtype id) of a live block; unknown blocks are ignored.
    pub(crate) fn annotate(&mut self, device: DeviceId, addr: u64, op: u32) {
        let Some(at) = self.map.find(device, addr) else {
            return;
        };
        let before = self.map.block(at).context;
        let mut context = self.contexts.get(before);
        context.origin.op = op;
        let after = self.contexts.acquire(context);
        self.contexts.release(before);
        self.map.block_mut(at).context = after;
    }

    /// Records that the latest event set a new global peak: every block live now counts at it.
    pub(crate) fn mark_peak(&mut self) {
        if self.epoch == u32::MAX {
            // Renumber before wrapping: once this peak is marked every live block is older than
            // the current epoch, whatever its number was.
            self.map.for_each_block_mut(|block| block.epoch = 0);
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
        self.map.blocks_on(device)
    }

    /// Live blocks at the current peak: (device, block).
    fn still_live_at_peak(&self) -> impl Iterator<Item = (DeviceId, &Block)> + '_ {
        self.map
            .blocks()
            .filter(|(_, block)| self.was_live_at_peak(block))
    }

    /// Number of live blocks.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.map.len()
    }

    /// Heap bytes the live set holds (map, contexts, side rows).
    #[cfg(test)]
    pub(crate) fn heap_bytes(&self) -> usize {
        self.map.heap_bytes()
            + self.contexts.heap_bytes()
            + self.since_peak.heap_bytes()
            + self.since_peak_top.capacity() * std::mem::size_of::<Ranked>()
    }
}
