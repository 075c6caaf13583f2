//! Applying one event: live blocks, span instances, the op stacks and the counters it moves.

use crate::model::{Category, SpanLabel, Step};

use super::super::downsample::Downsampler;
use super::super::event::{DeviceId, Event, EventKind, NameId, ShapeId, SpanSeq};
use super::super::live::{Freed, LiveEntry, Origin, NONE};
use super::super::sites::ShareKey;
use super::super::span_sample::SpanCall;
use super::super::spans::{Closed, SpanStart};
use super::peaks::{DeviceMemory, PoolSample, PoolStats, ReservedSample, ReservedStats};
use super::Timeline;

/// The innermost-op stack of one thread.
#[derive(Debug, Default)]
pub(super) struct ThreadOps {
    /// Open ops, innermost last, as op ids of [`Timeline::op_keys`].
    pub(super) stack: Vec<u32>,
    /// `OpBegin`s beyond [`MAX_OP_DEPTH`] not pushed, so their `OpEnd`s pop nothing.
    pub(super) overflow: u64,
}

/// Deeper op nesting than this is garbage; it is counted, not stored.
pub(super) const MAX_OP_DEPTH: usize = 256;

/// A block an alloc or realloc makes live.
#[derive(Debug, Clone, Copy)]
pub(super) struct NewBlock {
    pub(super) device: DeviceId,
    pub(super) addr: u64,
    pub(super) size: u64,
    /// What the span's bytes-allocated and the total grow by (a realloc's growth).
    pub(super) counted: u64,
    pub(super) category: Category,
    /// An alloc (counted in alloc counts), not a realloc.
    pub(super) is_alloc: bool,
}

/// Whether a new block enters the live map.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kept {
    /// It does: later events can find it.
    InMap,
    /// It does not: its free is applied next, and nothing can look it up in between.
    Passing,
}

/// A completed heap realloc, for [`Timeline::apply_realloc`].
#[derive(Debug, Clone, Copy)]
pub struct Realloc {
    /// The block given up.
    pub old_addr: u64,
    /// The block that replaces it (may equal `old_addr`).
    pub new_addr: u64,
    /// Bytes of the new block.
    pub new_size: u64,
    /// Category of the new block.
    pub category: Category,
    /// When the old block was given up (the realloc's first half), ns; no later than `at`.
    pub released: u64,
}

/// When and where an event happened, as a block it makes live records it.
#[derive(Debug, Clone, Copy)]
pub struct At {
    /// Nanoseconds since the session started.
    pub ts: u64,
    /// The thread it happened on.
    pub thread: u32,
    /// The innermost span open on that thread (`0`: none).
    pub span: SpanSeq,
}

impl At {
    fn of(event: &Event) -> At {
        At {
            ts: event.ts_ns,
            thread: event.thread,
            span: event.span,
        }
    }
}

/// Counters of the summary.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct Counts {
    pub(super) allocs: u64,
    pub(super) frees: u64,
    pub(super) reallocs: u64,
    pub(super) total_alloc_bytes: u64,
    pub(super) unknown_frees: u64,
    pub(super) reorder_repairs: u64,
}

impl Timeline {
    /// Applies one event. Events should come in time order; late ones are tolerated.
    pub fn apply(&mut self, event: &Event) {
        if let EventKind::Sampled {
            addr,
            size,
            category,
            stack,
        } = event.kind
        {
            // Part of the allocation before it, not an event of its own.
            let (origin, _) = self.origin(event.thread, event.span);
            let key = ShareKey {
                node: origin.node,
                op: origin.op,
                category,
            };
            let alloc_seq = self.seq.saturating_sub(1);
            self.sites.sampled(addr, size, key, stack, alloc_seq);
            return;
        }
        if let EventKind::ReallocRelease { old_addr, .. } = event.kind {
            // Part of the realloc after it, not an event of its own.
            self.release_for_realloc(event.thread, old_addr, event.ts_ns);
            return;
        }
        match event.kind {
            EventKind::Alloc {
                device,
                addr,
                size,
                category,
            } => return self.apply_alloc(At::of(event), device, addr, size, category),
            EventKind::Free { device, addr, .. } => {
                return self.apply_free(At::of(event), device, addr)
            }
            _ => {}
        }
        let seq = self.next_seq();
        let ts = event.ts_ns;
        match event.kind {
            EventKind::Realloc {
                old_addr,
                new_addr,
                new_size,
                category,
                released_ns,
                ..
            } => {
                let realloc = Realloc {
                    old_addr,
                    new_addr,
                    new_size,
                    category,
                    released: released_ns.map_or(ts, |at| at.min(ts)),
                };
                self.apply_realloc_at(seq, At::of(event), realloc);
            }
            EventKind::SetCategory {
                device,
                addr,
                category,
            } => {
                self.device(device);
                if let Some(before) = self.live.set_category(device, addr, category) {
                    let sample = if device == DeviceId::CPU {
                        self.sites.recategorised(addr, category)
                    } else {
                        None
                    };
                    if let Some(carried) = self.split_changed(device, addr, &before, sample) {
                        self.temporaries.carry(device, addr, carried);
                    }
                    let state = self.device(device);
                    state.sub(before.category, before.size);
                    state.add(category, before.size);
                    self.changed(device, ts, seq);
                }
            }
            EventKind::SpanEnter { id, name, label } => {
                if label == SpanLabel::Step(Step::Backward) && self.autograd_retained.is_none() {
                    let activation = Category::Activation.index();
                    let retained = self
                        .devices
                        .iter()
                        .fold(0u64, |sum, d| sum.saturating_add(d.by_category[activation]));
                    self.autograd_retained = Some(retained);
                }
                let start = SpanStart {
                    thread: event.thread,
                    parent_id: event.span,
                    id,
                    name,
                    label,
                    ts,
                    seq,
                };
                let reopened = self.spans.enter(start, self.measure);
                if let Some(closed) = reopened {
                    self.closed(event.thread, closed, ts);
                }
            }
            EventKind::SpanExit { id } => {
                if let Some(closed) = self.spans.exit(event.thread, id, ts, self.measure) {
                    self.closed(event.thread, closed, ts);
                }
            }
            EventKind::OpBegin {
                name, shape, dtype, ..
            } => {
                let op = self.op_id(name, shape, dtype);
                let ops = self.threads.entry(event.thread).or_default();
                if ops.stack.len() < MAX_OP_DEPTH {
                    ops.stack.push(op);
                    self.open_ops += 1;
                } else {
                    ops.overflow += 1;
                }
            }
            EventKind::Annotate {
                device,
                addr,
                op,
                shape,
                dtype,
            } => {
                let op = self.op_id(op, shape, dtype);
                self.live.annotate(device, addr, op);
                if device == DeviceId::CPU {
                    self.sites.annotated(addr, op);
                }
            }
            EventKind::OpEnd => {
                if let Some(ops) = self.threads.get_mut(&event.thread) {
                    if ops.overflow > 0 {
                        ops.overflow -= 1;
                    } else if ops.stack.pop().is_some() {
                        self.open_ops = self.open_ops.saturating_sub(1);
                    }
                }
            }
            EventKind::PoolState {
                device,
                capacity,
                reserved,
                largest_free,
                fragmentation,
            } => {
                let buckets = self.curve_buckets();
                let fragmentation = if fragmentation.is_finite() {
                    fragmentation
                } else {
                    0.0
                };
                let sample = PoolSample {
                    ts,
                    capacity,
                    reserved,
                    largest_free,
                    fragmentation,
                };
                let state = self.device(device);
                let pool = state.pool.get_or_insert_with(|| PoolStats {
                    last: sample,
                    capacity,
                    reserved,
                    peak_reserved: 0,
                    max_fragmentation: 0.0,
                    curve: Downsampler::new(buckets),
                });
                pool.last = sample;
                pool.capacity = capacity;
                pool.reserved = reserved;
                pool.peak_reserved = pool.peak_reserved.max(reserved);
                pool.max_fragmentation = pool.max_fragmentation.max(fragmentation);
                pool.curve.push(sample);
            }
            EventKind::Reserved { device, bytes } => {
                let buckets = self.curve_buckets();
                let sample = ReservedSample { ts, bytes };
                let reserved = self
                    .device(device)
                    .reserved
                    .get_or_insert_with(|| ReservedStats {
                        last: sample,
                        peak: 0,
                        curve: Downsampler::new(buckets),
                    });
                reserved.last = sample;
                reserved.peak = reserved.peak.max(bytes);
                reserved.curve.push(sample);
            }
            EventKind::DeviceMemory {
                device,
                in_use,
                total,
            } => {
                let state = self.device(device);
                if state.memory.is_none() {
                    state.memory = Some(DeviceMemory { in_use, total });
                }
            }
            EventKind::Oom {
                device,
                source,
                requested,
                largest_free,
            } => self.refused(event, device, source, requested, largest_free),
            EventKind::Alloc { .. }
            | EventKind::Free { .. }
            | EventKind::Sampled { .. }
            | EventKind::ReallocRelease { .. } => {}
        }
    }

    /// The sequence number of the event being applied; every event but a sample or a
    /// realloc's first half takes one.
    fn next_seq(&mut self) -> u64 {
        let seq = self.seq;
        self.seq += 1;
        seq
    }

    /// Applies an [`EventKind::Alloc`] that happened `at`: what [`Timeline::apply`] does with
    /// one, called directly by the collector for the plain heap allocations that make most of
    /// a stream, with no [`Event`] built.
    pub fn apply_alloc(
        &mut self,
        at: At,
        device: DeviceId,
        addr: u64,
        size: u64,
        category: Category,
    ) {
        self.alloc_kept(at, device, addr, size, category, Kept::InMap);
    }

    /// An allocation, its block `kept` in the live map or not; returns the block's entry,
    /// `at_peak` when the allocation marked a peak.
    #[inline(always)]
    fn alloc_kept(
        &mut self,
        at: At,
        device: DeviceId,
        addr: u64,
        size: u64,
        category: Category,
        kept: Kept,
    ) -> LiveEntry {
        let seq = self.next_seq();
        self.counts.allocs += 1;
        self.counts.total_alloc_bytes = self.counts.total_alloc_bytes.saturating_add(size);
        self.device(device).allocs += 1;
        let block = NewBlock {
            device,
            addr,
            size,
            counted: size,
            category,
            is_alloc: true,
        };
        let mut entry = self.make_live(at, block, kept);
        let peaks = self.live.peaks_marked();
        self.changed(device, at.ts, seq);
        entry.at_peak = self.live.peaks_marked() != peaks;
        entry
    }

    /// Whether the live map holds more blocks than the caches do, so that asking for a block
    /// ahead ([`Timeline::prefetch_block`]) pays for the asking.
    #[inline]
    pub fn outgrows_caches(&self) -> bool {
        self.live.outgrows_caches()
    }

    /// Asks for the live block an event ending the block at `addr` on `device` will read:
    /// called a few events before that one, so that its wait for memory overlaps the events
    /// in between. A hint; it changes nothing.
    #[inline]
    pub fn prefetch_block(&self, device: DeviceId, addr: u64) {
        self.live.prefetch_block(device, addr);
    }

    /// Asks for the lines of the heap's index that finding the block at `addr` reads first:
    /// called a few events before [`Timeline::prefetch_block`] for the same address, so that
    /// its lookup finds them cached. A hint; it changes nothing.
    #[inline]
    pub fn prefetch_index(&self, addr: u64) {
        self.live.prefetch_index(addr);
    }

    /// Applies an [`EventKind::Free`] of the block at `addr` on `device` that happened `at`, as
    /// [`Timeline::apply_alloc`] does an alloc.
    pub fn apply_free(&mut self, at: At, device: DeviceId, addr: u64) {
        let seq = self.next_seq();
        self.device(device);
        match self.live.free(device, addr, at.ts) {
            Freed::Ended(entry) => self.ended(at, seq, device, addr, &entry),
            Freed::Straggler => self.counts.reorder_repairs += 1,
            Freed::Unknown => self.counts.unknown_frees += 1,
        }
    }

    /// The block `entry` at `addr` on `device` was freed `at`, the event numbered `seq`.
    #[inline(always)]
    fn ended(&mut self, at: At, seq: u64, device: DeviceId, addr: u64, entry: &LiveEntry) {
        let sample = self.sampled_ended(device, addr);
        self.device(device).frees += 1;
        self.counts.frees += 1;
        self.split_ended(device, addr, entry, sample);
        self.end(device, entry);
        self.changed(device, at.ts, seq);
    }

    /// Applies a completed heap realloc that happened `at`, as [`Timeline::apply`] does an
    /// [`EventKind::Realloc`]: the collector calls it for an unsampled realloc without
    /// building the event.
    pub fn apply_realloc(&mut self, at: At, realloc: Realloc) {
        let seq = self.next_seq();
        self.apply_realloc_at(seq, at, realloc);
    }

    fn apply_realloc_at(&mut self, seq: u64, at: At, realloc: Realloc) {
        let Realloc {
            old_addr,
            new_addr,
            new_size,
            category,
            released,
        } = realloc;
        let device = DeviceId::CPU;
        self.device(device);
        self.counts.reallocs += 1;
        let mut carried = None;
        let (old_key, freed) = self.end_realloced(at.thread, old_addr, released);
        let growth = match freed {
            Freed::Ended(entry) => {
                let sample = self.sites.ended(old_key);
                carried = self.split_changed(device, old_key, &entry, sample);
                self.end(device, &entry);
                new_size.saturating_sub(entry.size)
            }
            Freed::Straggler => {
                self.counts.reorder_repairs += 1;
                new_size
            }
            Freed::Unknown => {
                self.counts.unknown_frees += 1;
                new_size
            }
        };
        self.counts.total_alloc_bytes = self.counts.total_alloc_bytes.saturating_add(growth);
        let block = NewBlock {
            device,
            addr: new_addr,
            size: new_size,
            counted: growth,
            category,
            is_alloc: false,
        };
        self.make_live(at, block, Kept::InMap);
        // After `make_live`: a block it displaced at the new address has been settled.
        if let Some(carried) = carried {
            self.temporaries.carry(device, new_addr, carried);
        }
        self.changed(device, at.ts, seq);
    }

    /// Applies a plain heap allocation `alloc` and the free of the same block `freed` that
    /// comes right after it in the merged order: [`Timeline::apply_alloc`] then
    /// [`Timeline::apply_free`], but the block never enters the live map, since nothing can
    /// look it up between the two. A block the allocation made the peak with goes straight to
    /// the live map's rows of blocks live at the peak. When the address is live already (the
    /// allocation would end that block first) or the free is stamped before the allocation,
    /// both go through the map. The collector calls it for the short-lived blocks that make a
    /// large part of allocation-heavy streams.
    pub fn apply_alloc_then_free(
        &mut self,
        alloc: At,
        freed: At,
        addr: u64,
        size: u64,
        category: Category,
    ) {
        let device = DeviceId::CPU;
        if freed.ts < alloc.ts || self.live.contains(device, addr) {
            self.apply_alloc(alloc, device, addr, size, category);
            self.apply_free(freed, device, addr);
            return;
        }
        let entry = self.alloc_kept(alloc, device, addr, size, category, Kept::Passing);
        let seq = self.next_seq();
        if entry.at_peak {
            self.live.remember_ended(device, addr, &entry);
        }
        self.ended(freed, seq, device, addr, &entry);
    }

    /// The id of an (op name, shape, dtype) triple, interned on first sight.
    pub(super) fn op_id(
        &mut self,
        name: NameId,
        shape: Option<ShapeId>,
        dtype: Option<NameId>,
    ) -> u32 {
        let key = [
            name.0,
            shape.map_or(NONE, |s| s.0),
            dtype.map_or(NONE, |d| d.0),
        ];
        if let Some(&op) = self.op_ids.get(&key) {
            return op;
        }
        let op = u32::try_from(self.op_keys.len()).unwrap_or(NONE);
        self.op_keys.push(key);
        self.op_ids.insert(key, op);
        op
    }

    /// Where a block allocated on `thread` inside span `span` comes from: innermost op and
    /// span.
    #[inline]
    pub(super) fn origin(&self, thread: u32, span: SpanSeq) -> (Origin, u32) {
        // Outside every span and op (what most allocations of most streams are), no lookup.
        if span == 0 && self.open_ops == 0 {
            return (Origin::NOWHERE, NONE);
        }
        self.origin_in(thread, span)
    }

    fn origin_in(&self, thread: u32, span: SpanSeq) -> (Origin, u32) {
        let owner = self.spans.lookup(thread, span).unwrap_or(NONE);
        let mut origin = Origin::NOWHERE;
        origin.node = self.spans.node_of(owner);
        if self.open_ops > 0 {
            if let Some(&op) = self.threads.get(&thread).and_then(|ops| ops.stack.last()) {
                origin.op = op;
            }
        }
        (origin, owner)
    }

    /// Counts a new block of an alloc or the new side of a realloc and, `kept` in the map,
    /// inserts it; a block already live at the key is ended (as if freed now) and counted as a
    /// repair. Returns the block's entry.
    #[inline(always)]
    fn make_live(&mut self, at: At, block: NewBlock, kept: Kept) -> LiveEntry {
        let NewBlock {
            device,
            addr,
            size,
            counted,
            category,
            is_alloc,
        } = block;
        let (origin, owner) = self.origin(at.thread, at.span);
        let entry = LiveEntry {
            size,
            ts: at.ts,
            thread: at.thread,
            owner,
            origin,
            category,
            at_peak: false,
        };
        // Counters first: `changed` copies them right after, and a copy of values written
        // after the map insert would wait for the insert's store (often a cache miss).
        self.device(device).add(category, size);
        if kept == Kept::InMap {
            if let Some(old) = self.live.insert(device, addr, entry) {
                let sample = self.sampled_ended(device, addr);
                self.counts.reorder_repairs += 1;
                self.split_ended(device, addr, &old, sample);
                self.end(device, &old);
            }
        }
        self.spans.on_alloc(owner, size, counted, is_alloc);
        entry
    }

    /// Takes an ended block off the counters and its span's residual.
    pub(super) fn end(&mut self, device: DeviceId, entry: &LiveEntry) {
        self.device(device).sub(entry.category, entry.size);
        self.spans.on_end(entry.owner, entry.size);
    }

    /// A span instance closed at `ts` on `thread`: it is offered to the call sample, and
    /// top-level exits mark iterations.
    pub(super) fn closed(&mut self, thread: u32, closed: Closed, ts: u64) {
        let node = closed.node;
        self.span_calls.offer(SpanCall {
            thread,
            node,
            start_ns: closed.enter_ts,
            end_ns: ts,
        });
        let Some(n) = self.spans.nodes.get(node as usize) else {
            return;
        };
        if n.parent != NONE {
            return;
        }
        let name = n.name;
        self.window_boundary(ts);
        let live = self.total_live();
        self.top_level_exits.entry(name).or_default().push(ts, live);
    }
}
