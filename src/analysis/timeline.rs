//! The streaming state machine: [`Timeline::apply`] one event at a time, [`Timeline::finish`]
//! for a [`Profile`] at any moment.
//!
//! # What each event does
//!
//! - `Alloc` makes a block live at (device, address) with the event's category, attributed to
//!   the innermost open op of its thread (any device) and to the span instance the event names.
//!   A key that is already live is ended first, as if freed now, and counted as a repair.
//! - `Free` ends the block. A key that is not live counts as an unknown free; a free stamped
//!   earlier than the live block's allocation belongs to an earlier life of the address and is
//!   ignored, counted as a repair. `free_count` counts only frees that ended a block.
//! - `Realloc` ends the old heap block (same rules; an unknown one counts as an unknown free)
//!   and makes the new one live in the same step. It counts in `realloc_count` only; total
//!   bytes and the span's bytes grow by the growth over the ended block's size, or by the new
//!   size when no block was ended.
//! - `SetCategory` moves a live block's bytes between category counters. A key that is not
//!   live is ignored and not counted: it changes no byte figure, and a hook racing a free is
//!   expected.
//! - `SpanEnter`/`SpanExit` open and close instances (see [`super::spans`]); an exit of an
//!   instance that is not open is ignored. The first span labelled backward fixes the
//!   autograd-retained bytes: activation bytes live on all devices at that moment.
//! - `OpBegin`/`OpEnd` push and pop the thread's op stack; an `OpEnd` with nothing open is
//!   ignored.
//! - `PoolState` updates the device's pool figures and its bounded pool curve.
//!
//! After any event that changed a device's counters: that device's peak, the global peak (the
//! highest live bytes of any one device; ties keep the first time), the curve, and the span
//! peak measure (highest live bytes over devices) are updated.
//!
//! # Iterations and the leak signal
//!
//! The top-level span name entered most often (at least twice; ties go to the name seen first)
//! marks iterations. Each exit of it records live bytes on all devices and the change since the
//! previous exit (0 for the first). Instances still open at the end are not iterations. See
//! [`leak_warning`] for when a growing residual becomes a warning.

use std::collections::BTreeMap;

use rustc_hash::FxHashMap;

use crate::model::{Category, SpanLabel, Step};
use crate::profile::{
    DeviceStats, IterationResidual, LiveAllocation, PeakRow, PoolPoint, Profile, SpanEvent,
    SpanMetrics, Summary, TimelinePoint, Warning, FOLDED_SPANS, MAX_SPAN_DEPTH, MAX_SPAN_NODES,
    SCHEMA,
};

use super::downsample::{Downsampler, Sample};
use super::event::{DeviceId, Event, EventKind, NameId, ShapeId};
use super::intern::Interner;
use super::iterations::IterationSeries;
use super::live::{self, Freed, LiveEntry, LiveSet, Origin, NONE};
use super::span_sample::{SpanCall, SpanSample};
use super::spans::{Closed, SpanStart, Spans, FOLDED_SPAN};

/// Bounds on what a [`Timeline`] keeps and reports.
///
/// # Examples
///
/// ```
/// use highwater::analysis::TimelineConfig;
///
/// let config = TimelineConfig { top_allocations: 8, ..TimelineConfig::default() };
/// assert_eq!(config.max_points_per_device, 2048);
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TimelineConfig {
    /// Most points of the memory curve kept per device (the exact peak is always one of them).
    /// Also bounds each device's pool timeline.
    pub max_points_per_device: usize,
    /// How many of the largest allocations live at the peak to list individually.
    pub top_allocations: usize,
    /// Most rows of the aggregated live-at-peak breakdown; the rest fold into one `(other)` row.
    pub max_breakdown_rows: usize,
}

impl Default for TimelineConfig {
    fn default() -> Self {
        TimelineConfig {
            max_points_per_device: 2048,
            top_allocations: 32,
            max_breakdown_rows: 256,
        }
    }
}

/// Category counters of one device: live bytes per [`Category::index`].
type ByCategory = [u64; Category::COUNT];

/// One point of a device's memory curve, before names are attached.
#[derive(Debug, Clone, Copy, PartialEq)]
struct CurvePoint {
    ts: u64,
    live: u64,
    by_category: ByCategory,
}

impl Sample for CurvePoint {
    fn ts(&self) -> u64 {
        self.ts
    }
    /// Slot 0 keeps the highest live bytes, slot 1 the lowest.
    fn beats(&self, kept: &Self, slot: usize) -> bool {
        if slot == 0 {
            self.live > kept.live
        } else {
            self.live < kept.live
        }
    }
}

/// One pool report, before names are attached.
#[derive(Debug, Clone, Copy, PartialEq)]
struct PoolSample {
    ts: u64,
    capacity: u64,
    reserved: u64,
    largest_free: u64,
    fragmentation: f64,
}

impl Sample for PoolSample {
    fn ts(&self) -> u64 {
        self.ts
    }
    /// Slot 0 keeps the most reserved bytes, slot 1 the highest fragmentation.
    fn beats(&self, kept: &Self, slot: usize) -> bool {
        if slot == 0 {
            self.reserved > kept.reserved
        } else {
            self.fragmentation > kept.fragmentation
        }
    }
}

/// What a pool reported about one device.
#[derive(Debug, Clone)]
struct PoolStats {
    capacity: u64,
    peak_reserved: u64,
    max_fragmentation: f64,
    curve: Downsampler<PoolSample>,
}

/// Everything kept per device.
#[derive(Debug, Clone)]
struct DeviceState {
    /// Some event named this device.
    touched: bool,
    live: u64,
    by_category: ByCategory,
    allocs: u64,
    frees: u64,
    peak: u64,
    peak_ts: u64,
    peak_by_category: ByCategory,
    curve: Downsampler<CurvePoint>,
    pool: Option<PoolStats>,
}

impl DeviceState {
    fn new(max_buckets: usize) -> DeviceState {
        DeviceState {
            touched: false,
            live: 0,
            by_category: [0; Category::COUNT],
            allocs: 0,
            frees: 0,
            peak: 0,
            peak_ts: 0,
            peak_by_category: [0; Category::COUNT],
            curve: Downsampler::new(max_buckets),
            pool: None,
        }
    }

    fn add(&mut self, category: Category, size: u64) {
        self.live = self.live.saturating_add(size);
        let slot = &mut self.by_category[category.index()];
        *slot = slot.saturating_add(size);
    }

    fn sub(&mut self, category: Category, size: u64) {
        self.live = self.live.saturating_sub(size);
        let slot = &mut self.by_category[category.index()];
        *slot = slot.saturating_sub(size);
    }
}

/// The highest live bytes any one device reached.
#[derive(Debug, Clone, Copy, Default)]
struct GlobalPeak {
    bytes: u64,
    ts: u64,
    device: Option<DeviceId>,
    by_category: ByCategory,
}

/// The innermost-op stack of one thread.
#[derive(Debug, Default)]
struct ThreadOps {
    /// Open ops, innermost last, as op ids of [`Timeline::op_keys`].
    stack: Vec<u32>,
    /// `OpBegin`s beyond [`MAX_OP_DEPTH`] not pushed, so their `OpEnd`s pop nothing.
    overflow: u64,
}

/// Deeper op nesting than this is garbage; it is counted, not stored.
const MAX_OP_DEPTH: usize = 256;

/// A block an alloc or realloc makes live.
#[derive(Debug, Clone, Copy)]
struct NewBlock {
    device: DeviceId,
    addr: u64,
    size: u64,
    /// What the span's bytes-allocated and the total grow by (a realloc's growth).
    counted: u64,
    category: Category,
    /// An alloc (counted in alloc counts), not a realloc.
    is_alloc: bool,
}

/// Counters of the summary.
#[derive(Debug, Clone, Copy, Default)]
struct Counts {
    allocs: u64,
    frees: u64,
    reallocs: u64,
    total_alloc_bytes: u64,
    unknown_frees: u64,
    reorder_repairs: u64,
}

/// The streaming memory analysis: apply merged events in time order, take a [`Profile`] at
/// any time.
///
/// Each [`Timeline::apply`] is O(1) amortised (a span exit is O(log n) in the open spans), does
/// not allocate once tables have grown, and never panics, whatever the events say: frees of
/// blocks never seen, duplicate allocations, late frees of reused addresses and exits of spans
/// never entered are tolerated and counted in the summary. Memory is O(live blocks + open spans
/// + span tree nodes + iterations), plus the bounded curves.
///
/// # Examples
///
/// ```
/// use highwater::analysis::{DeviceId, Event, EventKind, Timeline, TimelineConfig};
/// use highwater::Category;
///
/// let mut timeline = Timeline::new(TimelineConfig::default());
/// let alloc = |ts, addr, size| Event {
///     ts_ns: ts,
///     thread: 1,
///     span: 0,
///     kind: EventKind::Alloc { device: DeviceId::CPU, addr, size, category: Category::Other },
/// };
/// timeline.apply(&alloc(10, 0x1000, 4096));
/// timeline.apply(&alloc(20, 0x2000, 1024));
/// timeline.apply(&Event {
///     ts_ns: 30,
///     thread: 1,
///     span: 0,
///     kind: EventKind::Free { device: DeviceId::CPU, addr: 0x1000, size: 4096 },
/// });
/// assert_eq!(timeline.live_bytes(DeviceId::CPU), 1024);
/// let profile = timeline.finish(40);
/// assert_eq!(profile.summary.peak_bytes, 5120);
/// assert_eq!(profile.summary.peak_timestamp_ns, 20);
/// ```
#[derive(Debug)]
pub struct Timeline {
    config: TimelineConfig,
    names: Interner,
    live: LiveSet,
    devices: Vec<DeviceState>,
    spans: Spans,
    threads: FxHashMap<u32, ThreadOps>,
    /// Open ops on all threads (skips the per-thread lookup when zero).
    open_ops: u64,
    /// (op name, shape, dtype) of each op id, [`NONE`] for unknown parts.
    op_keys: Vec<[u32; 3]>,
    op_ids: FxHashMap<[u32; 3], u32>,
    /// Events applied; the next event's sequence number.
    seq: u64,
    dropped: u64,
    counts: Counts,
    /// Highest live bytes of any one device now (the span peak measure).
    measure: u64,
    peak: GlobalPeak,
    /// Activation bytes live when the first backward span entered.
    autograd_retained: Option<u64>,
    /// Exits of top-level spans by name (bounded; see [`IterationSeries`]).
    top_level_exits: FxHashMap<NameId, IterationSeries>,
    /// A bounded sample of closed span instances, for per-call timelines.
    span_calls: SpanSample,
}

impl Timeline {
    /// An empty timeline that knows only the `cpu` device.
    pub fn new(config: TimelineConfig) -> Timeline {
        Timeline {
            live: LiveSet::new(config.top_allocations),
            config,
            names: Interner::new(),
            devices: Vec::new(),
            spans: Spans::default(),
            threads: FxHashMap::default(),
            open_ops: 0,
            op_keys: Vec::new(),
            op_ids: FxHashMap::default(),
            seq: 0,
            dropped: 0,
            counts: Counts::default(),
            measure: 0,
            peak: GlobalPeak::default(),
            autograd_retained: None,
            top_level_exits: FxHashMap::default(),
            span_calls: SpanSample::default(),
        }
    }

    /// The id of a span, op or dtype name; the same string always gets the same id.
    pub fn intern_name(&mut self, name: &str) -> NameId {
        self.names.name(name)
    }

    /// The id of a device name; `"cpu"` is always [`DeviceId::CPU`].
    pub fn intern_device(&mut self, name: &str) -> DeviceId {
        self.names.device(name)
    }

    /// The id of a tensor shape; the same dims always get the same id.
    pub fn intern_shape(&mut self, dims: &[u64]) -> ShapeId {
        self.names.shape(dims)
    }

    /// Records that `count` events were lost before reaching the analysis.
    pub fn note_dropped(&mut self, count: u64) {
        self.dropped = self.dropped.saturating_add(count);
    }

    /// Bytes live on `device` now.
    pub fn live_bytes(&self, device: DeviceId) -> u64 {
        self.devices
            .get(usize::from(device.0))
            .map_or(0, |state| state.live)
    }

    /// Events applied so far.
    pub fn event_count(&self) -> u64 {
        self.seq
    }

    fn curve_buckets(&self) -> usize {
        // Two points per bucket, and room for the exact peak.
        (self.config.max_points_per_device.saturating_sub(1) / 2).max(1)
    }

    fn device(&mut self, device: DeviceId) -> &mut DeviceState {
        let index = usize::from(device.0);
        if index >= self.devices.len() {
            let buckets = self.curve_buckets();
            self.devices
                .resize_with(index + 1, || DeviceState::new(buckets));
        }
        let state = &mut self.devices[index];
        state.touched = true;
        state
    }

    /// Applies one event. Events should come in time order; late ones are tolerated.
    pub fn apply(&mut self, event: &Event) {
        let seq = self.seq;
        self.seq += 1;
        let ts = event.ts_ns;
        match event.kind {
            EventKind::Alloc {
                device,
                addr,
                size,
                category,
            } => {
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
                self.make_live(event, block);
                self.changed(device, ts, seq);
            }
            EventKind::Free { device, addr, .. } => {
                self.device(device);
                match self.live.free(device, addr, ts) {
                    Freed::Ended(entry) => {
                        self.device(device).frees += 1;
                        self.counts.frees += 1;
                        self.end(device, &entry);
                        self.changed(device, ts, seq);
                    }
                    Freed::Straggler => self.counts.reorder_repairs += 1,
                    Freed::Unknown => self.counts.unknown_frees += 1,
                }
            }
            EventKind::Realloc {
                old_addr,
                new_addr,
                new_size,
                category,
                released_ns,
                ..
            } => {
                let device = DeviceId::CPU;
                self.device(device);
                self.counts.reallocs += 1;
                let released = released_ns.map_or(ts, |at| at.min(ts));
                let growth = match self.live.free(device, old_addr, released) {
                    Freed::Ended(entry) => {
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
                self.counts.total_alloc_bytes =
                    self.counts.total_alloc_bytes.saturating_add(growth);
                let block = NewBlock {
                    device,
                    addr: new_addr,
                    size: new_size,
                    counted: growth,
                    category,
                    is_alloc: false,
                };
                self.make_live(event, block);
                self.changed(device, ts, seq);
            }
            EventKind::SetCategory {
                device,
                addr,
                category,
            } => {
                self.device(device);
                if let Some((size, old)) = self.live.set_category(device, addr, category) {
                    let state = self.device(device);
                    state.sub(old, size);
                    state.add(category, size);
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
                let state = self.device(device);
                let pool = state.pool.get_or_insert_with(|| PoolStats {
                    capacity,
                    peak_reserved: 0,
                    max_fragmentation: 0.0,
                    curve: Downsampler::new(buckets),
                });
                pool.capacity = capacity;
                pool.peak_reserved = pool.peak_reserved.max(reserved);
                pool.max_fragmentation = pool.max_fragmentation.max(fragmentation);
                pool.curve.push(PoolSample {
                    ts,
                    capacity,
                    reserved,
                    largest_free,
                    fragmentation,
                });
            }
        }
    }

    /// The id of an (op name, shape, dtype) triple, interned on first sight.
    fn op_id(&mut self, name: NameId, shape: Option<ShapeId>, dtype: Option<NameId>) -> u32 {
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

    /// Where a block allocated by `event` comes from: innermost op and span.
    fn origin(&self, event: &Event) -> (Origin, u32) {
        let owner = self.spans.lookup(event.thread, event.span).unwrap_or(NONE);
        let mut origin = Origin::NOWHERE;
        origin.node = self.spans.node_of(owner);
        if self.open_ops > 0 {
            if let Some(&op) = self
                .threads
                .get(&event.thread)
                .and_then(|ops| ops.stack.last())
            {
                origin.op = op;
            }
        }
        (origin, owner)
    }

    /// Inserts a live block for an alloc or the new side of a realloc; a block already live at
    /// the key is ended (as if freed now) and counted as a repair.
    fn make_live(&mut self, event: &Event, block: NewBlock) {
        let NewBlock {
            device,
            addr,
            size,
            counted,
            category,
            is_alloc,
        } = block;
        let (origin, owner) = self.origin(event);
        let entry = LiveEntry {
            size,
            ts: event.ts_ns,
            thread: event.thread,
            owner,
            origin,
            category,
        };
        // Counters first: `changed` copies them right after, and a copy of values written
        // after the map insert would wait for the insert's store (often a cache miss).
        self.device(device).add(category, size);
        if let Some(old) = self.live.insert(device, addr, entry) {
            self.counts.reorder_repairs += 1;
            self.end(device, &old);
        }
        self.spans.on_alloc(owner, size, counted, is_alloc);
    }

    /// Takes an ended block off the counters and its span's residual.
    fn end(&mut self, device: DeviceId, entry: &LiveEntry) {
        self.device(device).sub(entry.category, entry.size);
        self.spans.on_end(entry.owner, entry.size);
    }

    /// The counters of `device` changed at event `seq`: peaks, measure and curve follow.
    fn changed(&mut self, device: DeviceId, ts: u64, seq: u64) {
        let state = self.device(device);
        let live = state.live;
        if live > state.peak {
            state.peak = live;
            state.peak_ts = ts;
            state.peak_by_category = state.by_category;
        }
        // The category array is copied only when the point is kept: a copy right after the
        // counters were written would wait for every pending store, including the live map's.
        let by_category = &state.by_category;
        state.curve.offer(
            ts,
            |kept, slot| {
                if slot == 0 {
                    live > kept.live
                } else {
                    live < kept.live
                }
            },
            || CurvePoint {
                ts,
                live,
                by_category: *by_category,
            },
        );
        if live > self.peak.bytes {
            let by_category = self.devices[usize::from(device.0)].by_category;
            self.peak = GlobalPeak {
                bytes: live,
                ts,
                device: Some(device),
                by_category,
            };
            self.live.mark_peak();
        }
        let measure = if live >= self.measure || self.devices.len() == 1 {
            live
        } else {
            self.devices.iter().map(|d| d.live).max().unwrap_or(0)
        };
        if measure != self.measure {
            self.measure = measure;
            self.spans.record_measure(seq, measure);
        }
    }

    /// A span instance closed at `ts` on `thread`: it is offered to the call sample, and
    /// top-level exits mark iterations.
    fn closed(&mut self, thread: u32, closed: Closed, ts: u64) {
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
        let live = self.total_live();
        self.top_level_exits
            .entry(n.name)
            .or_default()
            .push(ts, live);
    }

    fn total_live(&self) -> u64 {
        self.devices
            .iter()
            .fold(0u64, |sum, d| sum.saturating_add(d.live))
    }

    /// Live bytes by category, summed over devices.
    fn total_by_category(&self) -> ByCategory {
        let mut total = [0u64; Category::COUNT];
        for device in &self.devices {
            for (sum, bytes) in total.iter_mut().zip(device.by_category) {
                *sum = sum.saturating_add(bytes);
            }
        }
        total
    }

    /// The profile as of now, with spans still open closed at `end_ns` (the timeline itself is
    /// not changed, so this can be called mid-run). `meta` is left for the session to fill.
    pub fn finish(&self, end_ns: u64) -> Profile {
        let paths = self.span_paths();
        let iterations = self.iterations();
        let mut warnings = Vec::new();
        if self.dropped > 0 {
            warnings.push(Warning::DroppedEvents {
                events: self.dropped,
            });
        }
        warnings.extend(leak_warning(&iterations));
        if self.spans.folded_deep > 0 {
            warnings.push(Warning::SpansTooDeep {
                instances: self.spans.folded_deep,
                max_depth: MAX_SPAN_DEPTH,
            });
        }
        if self.spans.folded_nodes > 0 {
            warnings.push(Warning::SpansTooMany {
                instances: self.spans.folded_nodes,
                max_nodes: MAX_SPAN_NODES as u64,
            });
        }
        if let Some(last) = iterations
            .last()
            .filter(|l| l.index + 1 > iterations.len() as u64)
        {
            warnings.push(Warning::IterationsSampled {
                span: last.span.clone(),
                iterations: last.index + 1,
                listed: iterations.len() as u64,
            });
        }
        Profile {
            schema: SCHEMA.to_string(),
            meta: Default::default(),
            summary: self.summary(end_ns),
            timeline: self.curve(),
            peak_breakdown: self.breakdown(&paths),
            largest_at_peak: self.largest(&paths),
            spans: self.span_metrics(end_ns),
            iterations,
            devices: self.device_stats(),
            pool_timeline: self.pool_timeline(),
            span_events: self.span_events(),
            capture: Default::default(),
            warnings,
        }
    }

    /// The sampled span calls, by node id, with their depths.
    fn span_events(&self) -> Vec<SpanEvent> {
        self.span_calls
            .calls()
            .iter()
            .map(|call| SpanEvent {
                thread: call.thread,
                span: call.node,
                start_ns: call.start_ns,
                duration_ns: call.end_ns.saturating_sub(call.start_ns),
                depth: self
                    .spans
                    .nodes
                    .get(call.node as usize)
                    .map_or(0, |n| n.depth),
            })
            .collect()
    }

    /// A span node's name; the folded node's is [`FOLDED_SPANS`].
    fn span_name(&self, name: NameId) -> String {
        if name == FOLDED_SPAN {
            FOLDED_SPANS.to_string()
        } else {
            self.names.name_str(name)
        }
    }

    fn summary(&self, end_ns: u64) -> Summary {
        Summary {
            peak_bytes: self.peak.bytes,
            peak_timestamp_ns: self.peak.ts,
            peak_device: self
                .peak
                .device
                .map(|d| self.names.device_str(d))
                .unwrap_or_default(),
            peak_by_category: category_map(&self.peak.by_category),
            alloc_count: self.counts.allocs,
            free_count: self.counts.frees,
            realloc_count: self.counts.reallocs,
            total_alloc_bytes: self.counts.total_alloc_bytes,
            autograd_retained_bytes: self.autograd_retained.unwrap_or(0),
            dropped_events: self.dropped,
            unknown_frees: self.counts.unknown_frees,
            reorder_repairs: self.counts.reorder_repairs,
            final_live_bytes: self.total_live(),
            final_by_category: category_map(&self.total_by_category()),
            duration_ns: end_ns,
            event_count: self.seq,
        }
    }

    /// Each node's path, by node id (parents come before children).
    fn span_paths(&self) -> Vec<String> {
        let mut paths: Vec<String> = Vec::with_capacity(self.spans.nodes.len());
        for node in &self.spans.nodes {
            let name = self.span_name(node.name);
            let path = match paths.get(node.parent as usize) {
                Some(parent) => format!("{parent}/{name}"),
                None => name,
            };
            paths.push(path);
        }
        paths
    }

    fn path_of<'a>(&self, paths: &'a [String], node: u32) -> &'a str {
        paths.get(node as usize).map_or("", String::as_str)
    }

    /// (op name, shape, dtype) of an op id.
    fn op_parts(&self, op: u32) -> (Option<String>, Option<Vec<u64>>, Option<String>) {
        match self.op_keys.get(op as usize) {
            Some(&[name, shape, dtype]) => (
                self.name_opt(name),
                self.shape_opt(shape),
                self.name_opt(dtype),
            ),
            None => (None, None, None),
        }
    }

    fn name_opt(&self, id: u32) -> Option<String> {
        (id != NONE).then(|| self.names.name_str(NameId(id)))
    }

    fn shape_opt(&self, id: u32) -> Option<Vec<u64>> {
        if id == NONE {
            return None;
        }
        self.names.shape_dims(ShapeId(id))
    }

    fn curve(&self) -> Vec<TimelinePoint> {
        let mut out = Vec::new();
        for (index, state) in self.devices.iter().enumerate() {
            let device = DeviceId(u16::try_from(index).unwrap_or(u16::MAX));
            let mut points: Vec<CurvePoint> = state.curve.points().collect();
            if self.peak.device == Some(device) {
                let peak = CurvePoint {
                    ts: self.peak.ts,
                    live: self.peak.bytes,
                    by_category: self.peak.by_category,
                };
                if !points.contains(&peak) {
                    points.push(peak);
                }
            }
            points.sort_by_key(|p| p.ts);
            let name = self.names.device_str(device);
            out.extend(points.into_iter().map(|p| TimelinePoint {
                timestamp_ns: p.ts,
                device: name.clone(),
                live_bytes: p.live,
                by_category: category_map(&p.by_category),
            }));
        }
        out
    }

    fn breakdown(&self, paths: &[String]) -> Vec<PeakRow> {
        let mut rows: Vec<PeakRow> = live::group_at_peak(&self.live)
            .into_iter()
            .map(|(key, bytes, count)| {
                let (op, shape, dtype) = self.op_parts(key.origin.op);
                PeakRow {
                    span_path: self.path_of(paths, key.origin.node).to_string(),
                    op,
                    shape,
                    dtype,
                    category: key.category,
                    device: self.names.device_str(key.device),
                    bytes,
                    count,
                }
            })
            .collect();
        rows.sort_by(|a, b| {
            b.bytes
                .cmp(&a.bytes)
                .then(b.count.cmp(&a.count))
                .then_with(|| a.span_path.cmp(&b.span_path))
                .then_with(|| a.op.cmp(&b.op))
                .then_with(|| a.shape.cmp(&b.shape))
                .then_with(|| a.dtype.cmp(&b.dtype))
                .then(a.category.cmp(&b.category))
                .then_with(|| a.device.cmp(&b.device))
        });
        let max = self.config.max_breakdown_rows;
        if rows.len() > max {
            let rest = rows.split_off(max.saturating_sub(1));
            if max > 0 {
                rows.push(fold_rows(rest));
            }
        }
        rows
    }

    fn largest(&self, paths: &[String]) -> Vec<LiveAllocation> {
        live::largest_at_peak(&self.live, self.config.top_allocations)
            .into_iter()
            .map(|(device, entry)| {
                let (op, shape, _) = self.op_parts(entry.origin.op);
                LiveAllocation {
                    bytes: entry.size,
                    device: self.names.device_str(device),
                    category: entry.category,
                    span_path: self.path_of(paths, entry.origin.node).to_string(),
                    op,
                    shape,
                    timestamp_ns: entry.ts,
                    thread: entry.thread,
                }
            })
            .collect()
    }

    fn span_metrics(&self, end_ns: u64) -> Vec<SpanMetrics> {
        let nodes = &self.spans.nodes;
        let mut bytes: Vec<u64> = nodes.iter().map(|n| n.own_bytes).collect();
        let mut allocs: Vec<u64> = nodes.iter().map(|n| n.own_allocs).collect();
        // Children have higher ids than their parents: one reverse pass rolls everything up.
        for index in (0..nodes.len()).rev() {
            let parent = nodes[index].parent as usize;
            if parent < index {
                bytes[parent] = bytes[parent].saturating_add(bytes[index]);
                allocs[parent] = allocs[parent].saturating_add(allocs[index]);
            }
        }
        let mut metrics: Vec<SpanMetrics> = nodes
            .iter()
            .enumerate()
            .map(|(index, node)| {
                let (step, category) = match node.label {
                    SpanLabel::Plain => (None, None),
                    SpanLabel::Step(step) => (Some(step), None),
                    SpanLabel::Category(category) => (None, Some(category)),
                };
                SpanMetrics {
                    id: u32::try_from(index).unwrap_or(NONE),
                    parent: (node.parent != NONE).then_some(node.parent),
                    name: self.span_name(node.name),
                    step,
                    category,
                    calls: node.calls,
                    total_ns: node.total_ns,
                    bytes_allocated: bytes[index],
                    alloc_count: allocs[index],
                    peak_bytes: node.peak,
                    residual_bytes: node.residual,
                }
            })
            .collect();
        for (node, enter_ts, peak, residual) in self.spans.open_at_end(self.measure) {
            if let Some(m) = metrics.get_mut(node as usize) {
                m.total_ns = m.total_ns.saturating_add(end_ns.saturating_sub(enter_ts));
                m.peak_bytes = m.peak_bytes.max(peak);
                m.residual_bytes = m.residual_bytes.saturating_add(residual);
            }
        }
        metrics
    }

    /// Residuals at the exits of the top-level span entered most often (at least twice).
    fn iterations(&self) -> Vec<IterationResidual> {
        let mut calls: Vec<(NameId, u64, usize)> = Vec::new();
        for (index, node) in self.spans.nodes.iter().enumerate() {
            if node.parent != NONE {
                continue;
            }
            match calls.iter_mut().find(|(name, _, _)| *name == node.name) {
                Some(entry) => entry.1 += node.calls,
                None => calls.push((node.name, node.calls, index)),
            }
        }
        // Most calls; on a tie, the name that appeared first.
        let chosen = calls
            .iter()
            .filter(|(_, calls, _)| *calls >= 2)
            .min_by_key(|(_, calls, first)| (std::cmp::Reverse(*calls), *first));
        let Some(&(name, _, _)) = chosen else {
            return Vec::new();
        };
        let span = self.span_name(name);
        let exits = self
            .top_level_exits
            .get(&name)
            .map(IterationSeries::exits)
            .unwrap_or_default();
        exits
            .iter()
            .map(|exit| IterationResidual {
                index: exit.index,
                span: span.clone(),
                end_timestamp_ns: exit.ts,
                live_bytes: exit.live,
                delta_bytes: exit.delta,
            })
            .collect()
    }

    fn device_stats(&self) -> Vec<DeviceStats> {
        self.devices
            .iter()
            .enumerate()
            .filter(|(_, state)| state.touched)
            .map(|(index, state)| DeviceStats {
                device: self
                    .names
                    .device_str(DeviceId(u16::try_from(index).unwrap_or(u16::MAX))),
                capacity_bytes: state.pool.as_ref().map(|p| p.capacity),
                peak_bytes: state.peak,
                peak_timestamp_ns: state.peak_ts,
                peak_by_category: category_map(&state.peak_by_category),
                alloc_count: state.allocs,
                free_count: state.frees,
                final_live_bytes: state.live,
                peak_reserved_bytes: state.pool.as_ref().map(|p| p.peak_reserved),
                max_fragmentation: state.pool.as_ref().map(|p| p.max_fragmentation),
            })
            .collect()
    }

    fn pool_timeline(&self) -> Vec<PoolPoint> {
        let mut out = Vec::new();
        for (index, state) in self.devices.iter().enumerate() {
            let Some(pool) = &state.pool else {
                continue;
            };
            let name = self
                .names
                .device_str(DeviceId(u16::try_from(index).unwrap_or(u16::MAX)));
            let mut points: Vec<PoolSample> = pool.curve.points().collect();
            points.sort_by_key(|p| p.ts);
            out.extend(points.into_iter().map(|p| PoolPoint {
                timestamp_ns: p.ts,
                device: name.clone(),
                capacity_bytes: p.capacity,
                reserved_bytes: p.reserved,
                largest_free_bytes: p.largest_free,
                fragmentation: p.fragmentation,
            }));
        }
        out
    }
}

/// Live bytes by category, zero categories left out.
fn category_map(by_category: &ByCategory) -> BTreeMap<Category, u64> {
    Category::ALL
        .into_iter()
        .filter(|c| by_category[c.index()] > 0)
        .map(|c| (c, by_category[c.index()]))
        .collect()
}

/// One row standing for every breakdown row past the limit.
fn fold_rows(rest: Vec<PeakRow>) -> PeakRow {
    let mut devices = rest.iter().map(|r| r.device.as_str());
    let first = devices.next().unwrap_or_default().to_string();
    let device = if devices.all(|d| d == first) {
        first
    } else {
        "(mixed)".to_string()
    };
    PeakRow {
        span_path: "(other)".to_string(),
        op: None,
        shape: None,
        dtype: None,
        category: Category::Other,
        device,
        bytes: rest.iter().fold(0u64, |sum, r| sum.saturating_add(r.bytes)),
        count: rest.iter().map(|r| r.count).sum(),
    }
}

/// Iterations looked at by the leak rule, and the fewest it needs.
const LEAK_WINDOW: usize = 16;
const LEAK_MIN_ITERATIONS: usize = 8;

/// The leak signal: over the last [`LEAK_WINDOW`] iteration deltas (at least
/// [`LEAK_MIN_ITERATIONS`] of them; the first iteration has none), at least 80 % grew and the
/// total growth is positive.
fn leak_warning(iterations: &[IterationResidual]) -> Option<Warning> {
    let deltas: Vec<i64> = iterations.iter().skip(1).map(|i| i.delta_bytes).collect();
    let window = &deltas[deltas.len().saturating_sub(LEAK_WINDOW)..];
    if window.len() < LEAK_MIN_ITERATIONS {
        return None;
    }
    let grew = window.iter().filter(|&&d| d > 0).count();
    let total: i64 = window.iter().fold(0i64, |sum, &d| sum.saturating_add(d));
    if grew * 5 < window.len() * 4 || total <= 0 {
        return None;
    }
    let span = iterations.first().map_or("", |i| i.span.as_str());
    // What the run kept in all: from the end of the first iteration to the end of the last.
    let (first, last) = (iterations.first()?, iterations.last()?);
    Some(Warning::GrowingResidual {
        span: span.to_string(),
        window: window.len() as u64,
        grew: grew as u64,
        total_bytes: total,
        per_iteration_bytes: total / window.len() as i64,
        // The list may be a sample; indices count every iteration.
        iterations: last.index.saturating_add(1),
        run_growth_bytes: super::iterations::signed_delta(first.live_bytes, last.live_bytes),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::analysis::SpanSeq;

    const MIB: u64 = 1 << 20;

    /// Writes events for one thread with increasing timestamps and a span stack.
    struct Script {
        timeline: Timeline,
        ts: u64,
        thread: u32,
        stack: Vec<SpanSeq>,
        next_id: SpanSeq,
    }

    impl Script {
        fn new() -> Script {
            Script::with(TimelineConfig::default())
        }

        fn with(config: TimelineConfig) -> Script {
            Script {
                timeline: Timeline::new(config),
                ts: 0,
                thread: 1,
                stack: Vec::new(),
                next_id: 1,
            }
        }

        fn push(&mut self, kind: EventKind) {
            self.ts += 10;
            let span = self.stack.last().copied().unwrap_or(0);
            self.at(self.ts, span, kind);
        }

        fn at(&mut self, ts: u64, span: SpanSeq, kind: EventKind) {
            let event = Event {
                ts_ns: ts,
                thread: self.thread,
                span,
                kind,
            };
            self.timeline.apply(&event);
        }

        fn enter(&mut self, name: &str, label: SpanLabel) {
            let name = self.timeline.intern_name(name);
            let id = self.next_id;
            self.next_id += 1;
            self.push(EventKind::SpanEnter { id, name, label });
            self.stack.push(id);
        }

        fn exit(&mut self) {
            if let Some(id) = self.stack.pop() {
                self.ts += 10;
                self.at(self.ts, id, EventKind::SpanExit { id });
            }
        }

        fn alloc_on(&mut self, device: DeviceId, addr: u64, size: u64, category: Category) {
            self.push(EventKind::Alloc {
                device,
                addr,
                size,
                category,
            });
        }

        fn alloc(&mut self, addr: u64, size: u64, category: Category) {
            self.alloc_on(DeviceId::CPU, addr, size, category);
        }

        fn free(&mut self, addr: u64) {
            self.push(EventKind::Free {
                device: DeviceId::CPU,
                addr,
                size: 0,
            });
        }

        fn finish(&mut self) -> Profile {
            self.timeline.finish(self.ts + 10)
        }
    }

    fn span<'a>(profile: &'a Profile, path: &str) -> &'a SpanMetrics {
        profile
            .spans
            .iter()
            .find(|s| profile.span_path(s.id) == path)
            .unwrap_or_else(|| panic!("no span {path} in {:#?}", profile.spans))
    }

    fn cats(pairs: &[(Category, u64)]) -> BTreeMap<Category, u64> {
        pairs.iter().copied().collect()
    }

    #[test]
    fn forward_then_backward_peaks_at_twelve_mib_with_categories_and_span_rows() {
        let mut s = Script::new();
        s.enter("step", SpanLabel::Plain);
        s.enter("forward", SpanLabel::Step(Step::Forward));
        s.alloc(0x10, 6 * MIB, Category::Activation);
        s.alloc(0x20, MIB, Category::Activation);
        s.push(EventKind::Realloc {
            old_addr: 0x20,
            old_size: MIB,
            new_addr: 0x30,
            new_size: 2 * MIB,
            category: Category::Activation,
            released_ns: None,
        });
        s.exit();
        s.enter("backward", SpanLabel::Step(Step::Backward));
        s.alloc(0x40, 4 * MIB, Category::Gradient);
        let peak_ts = s.ts;
        s.free(0x40);
        s.exit();
        s.free(0x10);
        s.free(0x30);
        s.exit();
        let profile = s.finish();

        let summary = &profile.summary;
        assert_eq!(profile.schema, SCHEMA);
        assert_eq!(summary.peak_bytes, 12 * MIB);
        assert_eq!(summary.peak_timestamp_ns, peak_ts);
        assert_eq!(summary.peak_device, "cpu");
        let expected = cats(&[
            (Category::Activation, 8 * MIB),
            (Category::Gradient, 4 * MIB),
        ]);
        assert_eq!(summary.peak_by_category, expected);
        assert_eq!(summary.autograd_retained_bytes, 8 * MIB);
        assert_eq!(
            (
                summary.alloc_count,
                summary.free_count,
                summary.realloc_count
            ),
            (3, 3, 1)
        );
        assert_eq!(summary.total_alloc_bytes, 12 * MIB);
        assert_eq!(summary.final_live_bytes, 0);
        assert_eq!(summary.event_count, 13);

        let rows: Vec<(&str, Category, u64, u64)> = profile
            .peak_breakdown
            .iter()
            .map(|r| (r.span_path.as_str(), r.category, r.bytes, r.count))
            .collect();
        assert_eq!(
            rows,
            vec![
                ("step/forward", Category::Activation, 8 * MIB, 2),
                ("step/backward", Category::Gradient, 4 * MIB, 1),
            ]
        );
        let largest: Vec<(u64, &str)> = profile
            .largest_at_peak
            .iter()
            .map(|a| (a.bytes, a.span_path.as_str()))
            .collect();
        assert_eq!(
            largest,
            vec![
                (6 * MIB, "step/forward"),
                (4 * MIB, "step/backward"),
                (2 * MIB, "step/forward")
            ]
        );
        let forward = span(&profile, "step/forward");
        assert_eq!(forward.step, Some(Step::Forward));
        assert_eq!((forward.bytes_allocated, forward.alloc_count), (8 * MIB, 2));
        assert_eq!(forward.residual_bytes, 8 * MIB);
        assert_eq!(span(&profile, "step/backward").peak_bytes, 12 * MIB);
        assert_eq!(span(&profile, "step").bytes_allocated, 12 * MIB);

        let cpu = &profile.devices[0];
        assert_eq!((cpu.device.as_str(), cpu.peak_bytes), ("cpu", 12 * MIB));
        assert_eq!(cpu.peak_by_category, expected);
        assert_eq!((cpu.alloc_count, cpu.free_count), (3, 3));
        let peak_point = profile
            .timeline
            .iter()
            .find(|p| p.timestamp_ns == peak_ts)
            .expect("the peak is a point of the curve");
        assert_eq!(peak_point.live_bytes, 12 * MIB);
        assert_eq!(peak_point.by_category, expected);
        assert!(profile.warnings.is_empty(), "{:?}", profile.warnings);
    }

    #[test]
    fn unknown_frees_duplicate_allocs_and_straggler_frees_are_counted_and_tolerated() {
        let mut s = Script::new();
        s.free(0x99); // never allocated
        s.alloc(0x10, 100, Category::Other);
        s.alloc(0x10, 40, Category::Other); // the free of the first life was lost
        let born = s.ts;
        s.at(
            born - 5,
            0,
            EventKind::Free {
                device: DeviceId::CPU,
                addr: 0x10,
                size: 100,
            },
        ); // the lost free, arriving late: older than the live block
        s.push(EventKind::Realloc {
            old_addr: 0x77,
            old_size: 8,
            new_addr: 0x80,
            new_size: 16,
            category: Category::Other,
            released_ns: None,
        }); // realloc of an unknown block
        s.push(EventKind::SpanExit { id: 42 });
        s.push(EventKind::OpEnd);
        s.push(EventKind::SetCategory {
            device: DeviceId(9),
            addr: 1,
            category: Category::Gradient,
        });
        let profile = s.finish();
        let summary = &profile.summary;
        assert_eq!(summary.unknown_frees, 2);
        assert_eq!(summary.reorder_repairs, 2);
        assert_eq!(summary.free_count, 0);
        assert_eq!(summary.alloc_count, 2);
        assert_eq!(summary.total_alloc_bytes, 156);
        assert_eq!(s.timeline.live_bytes(DeviceId::CPU), 56);
        assert_eq!(summary.final_live_bytes, 56);
        assert_eq!(summary.peak_bytes, 100);
    }

    #[test]
    fn allocations_inside_an_op_name_the_op_shape_and_dtype_in_peak_rows() {
        let mut s = Script::new();
        let matmul = s.timeline.intern_name("matmul");
        let f32 = s.timeline.intern_name("f32");
        let shape = s.timeline.intern_shape(&[128, 64]);
        s.enter("forward", SpanLabel::Step(Step::Forward));
        s.push(EventKind::OpBegin {
            name: matmul,
            output: 7,
            shape: Some(shape),
            dtype: Some(f32),
        });
        s.alloc(0x10, 32 * 1024, Category::Activation);
        s.push(EventKind::OpEnd);
        s.alloc(0x20, 16, Category::Activation);
        let profile = s.finish();
        let row = &profile.peak_breakdown[0];
        assert_eq!(row.op.as_deref(), Some("matmul"));
        assert_eq!(row.shape, Some(vec![128, 64]));
        assert_eq!(row.dtype.as_deref(), Some("f32"));
        assert_eq!((row.span_path.as_str(), row.bytes), ("forward", 32 * 1024));
        let plain = &profile.peak_breakdown[1];
        assert_eq!((plain.op.as_ref(), plain.bytes), (None, 16));
        assert_eq!(profile.largest_at_peak[0].op.as_deref(), Some("matmul"));
    }

    #[test]
    fn residual_and_roll_up_follow_the_span_tree() {
        let mut s = Script::new();
        s.enter("step", SpanLabel::Plain);
        s.alloc(0x1, 1, Category::Other);
        s.enter("fwd", SpanLabel::Step(Step::Forward));
        s.alloc(0x10, 100, Category::Activation);
        s.alloc(0x20, 50, Category::Activation);
        s.free(0x20);
        s.exit();
        s.enter("bwd", SpanLabel::Step(Step::Backward));
        s.alloc(0x30, 30, Category::Gradient);
        s.free(0x10);
        s.exit();
        s.exit();
        s.alloc(0x40, 1000, Category::Other); // outside every span
        let profile = s.finish();
        let step = span(&profile, "step");
        let fwd = span(&profile, "step/fwd");
        let bwd = span(&profile, "step/bwd");
        assert_eq!((fwd.bytes_allocated, fwd.alloc_count), (150, 2));
        assert_eq!((bwd.bytes_allocated, bwd.alloc_count), (30, 1));
        assert_eq!((step.bytes_allocated, step.alloc_count), (181, 4));
        assert_eq!(fwd.residual_bytes, 100);
        assert_eq!(bwd.residual_bytes, 30);
        assert_eq!(step.residual_bytes, 31);
        assert_eq!(fwd.peak_bytes, 151);
        assert_eq!(bwd.peak_bytes, 131);
        assert_eq!(step.peak_bytes, 151);
        assert_eq!(fwd.parent, Some(step.id));
        assert_eq!(step.parent, None);
        assert_eq!((step.calls, step.total_ns), (1, 110));
        // Spans come parents first.
        assert!(profile
            .spans
            .iter()
            .all(|m| m.parent.is_none_or(|p| p < m.id)));
    }

    #[test]
    fn spans_open_at_finish_are_closed_at_end_and_a_snapshot_changes_nothing() {
        let mut s = Script::new();
        s.enter("train", SpanLabel::Plain);
        s.enter("inner", SpanLabel::Plain);
        s.alloc(0x10, 64, Category::Other);
        let mid = s.timeline.finish(1_000);
        let train = span(&mid, "train");
        assert_eq!((train.calls, train.total_ns), (1, 990));
        assert_eq!((train.residual_bytes, train.peak_bytes), (64, 64));
        assert_eq!(span(&mid, "train/inner").residual_bytes, 64);
        assert!(mid.iterations.is_empty());
        // The snapshot left the timeline as it was.
        s.free(0x10);
        s.exit();
        s.exit();
        let end = s.finish();
        assert_eq!(span(&end, "train").residual_bytes, 0);
        assert_eq!(span(&end, "train").calls, 1);
    }

    #[test]
    fn out_of_order_exits_are_tolerated_and_forget_their_instances() {
        let mut s = Script::new();
        s.enter("outer", SpanLabel::Plain);
        s.enter("inner", SpanLabel::Plain);
        s.alloc(0x10, 8, Category::Other);
        let (outer, inner) = (s.stack[0], s.stack[1]);
        s.at(s.ts + 1, inner, EventKind::SpanExit { id: outer });
        s.at(s.ts + 2, inner, EventKind::SpanExit { id: outer }); // twice
        s.at(s.ts + 3, 0, EventKind::SpanExit { id: 777 }); // never entered
        s.ts += 10;
        s.alloc(0x20, 4, Category::Other); // still inside `inner`
        s.at(s.ts + 1, inner, EventKind::SpanExit { id: inner });
        s.stack.clear();
        s.free(0x10);
        s.free(0x20);
        assert_eq!(s.timeline.spans.instances_in_use(), 0);
        let profile = s.finish();
        assert_eq!(span(&profile, "outer").calls, 1);
        assert_eq!(span(&profile, "outer/inner").calls, 1);
        assert_eq!(span(&profile, "outer/inner").residual_bytes, 12);
        assert_eq!(span(&profile, "outer").bytes_allocated, 12);
        assert_eq!(profile.summary.final_live_bytes, 0);
    }

    #[test]
    fn set_category_moves_live_bytes_between_categories() {
        let mut s = Script::new();
        s.alloc(0x10, 100, Category::Other);
        s.push(EventKind::SetCategory {
            device: DeviceId::CPU,
            addr: 0x10,
            category: Category::Parameter,
        });
        s.alloc(0x20, 10, Category::Other);
        let profile = s.finish();
        assert_eq!(
            profile.summary.peak_by_category,
            cats(&[(Category::Parameter, 100), (Category::Other, 10)])
        );
        let last = profile.timeline.last().expect("points");
        assert_eq!(
            last.by_category,
            cats(&[(Category::Parameter, 100), (Category::Other, 10)])
        );
    }

    #[test]
    fn peak_is_the_highest_single_device_and_rows_cover_every_device() {
        let mut s = Script::new();
        let gpu = s.timeline.intern_device("cuda:0");
        s.alloc(0x10, 300, Category::Other);
        s.alloc_on(gpu, 1, 500, Category::Parameter);
        s.alloc_on(gpu, 2, 100, Category::Activation);
        s.push(EventKind::Free {
            device: gpu,
            addr: 2,
            size: 100,
        });
        s.alloc(0x20, 400, Category::Other); // cpu reaches 700, above the gpu's 600
        let profile = s.finish();
        assert_eq!(profile.summary.peak_bytes, 700);
        assert_eq!(profile.summary.peak_device, "cpu");
        assert_eq!(
            profile.summary.peak_by_category,
            cats(&[(Category::Other, 700)])
        );
        let rows: u64 = profile.peak_breakdown.iter().map(|r| r.bytes).sum();
        assert_eq!(rows, 1200, "cpu 700 and the gpu's 500 live at that instant");
        let gpu_stats = &profile.devices[1];
        assert_eq!(
            (gpu_stats.peak_bytes, gpu_stats.final_live_bytes),
            (600, 500)
        );
        assert_eq!(s.timeline.live_bytes(gpu), 500);
    }

    #[test]
    fn breakdown_folds_rows_beyond_the_limit_into_other() {
        let mut s = Script::with(TimelineConfig {
            max_breakdown_rows: 3,
            top_allocations: 2,
            ..TimelineConfig::default()
        });
        for i in 0..6u64 {
            s.enter(&format!("s{i}"), SpanLabel::Plain);
            s.alloc(0x10 * (i + 1), 100 * (i + 1), Category::Other);
            s.exit();
        }
        let profile = s.finish();
        let rows: Vec<(&str, u64, u64)> = profile
            .peak_breakdown
            .iter()
            .map(|r| (r.span_path.as_str(), r.bytes, r.count))
            .collect();
        assert_eq!(
            rows,
            vec![("s5", 600, 1), ("s4", 500, 1), ("(other)", 1000, 4)]
        );
        assert_eq!(profile.largest_at_peak.len(), 2);
    }

    #[test]
    fn pool_reports_fill_device_stats_even_without_allocations() {
        let mut s = Script::new();
        let tpu = s.timeline.intern_device("tpu:0");
        for (reserved, frag) in [(100u64, 0.1f64), (700, 0.5), (300, 0.2)] {
            s.push(EventKind::PoolState {
                device: tpu,
                capacity: 1000,
                reserved,
                largest_free: 1000 - reserved,
                fragmentation: frag,
            });
        }
        let profile = s.finish();
        let stats = profile
            .devices
            .iter()
            .find(|d| d.device == "tpu:0")
            .expect("pool device row");
        assert_eq!(stats.capacity_bytes, Some(1000));
        assert_eq!(stats.peak_reserved_bytes, Some(700));
        assert_eq!(stats.max_fragmentation, Some(0.5));
        assert_eq!(stats.alloc_count, 0);
        assert!(profile
            .pool_timeline
            .iter()
            .any(|p| p.reserved_bytes == 700));
        assert!(profile.pool_timeline.iter().all(|p| p.device == "tpu:0"));
        assert!(profile.timeline.is_empty());
    }

    #[test]
    fn a_timeline_can_move_to_the_collector_thread() {
        fn assert_send<T: Send + 'static>() {}
        assert_send::<Timeline>();
    }

    #[test]
    fn dropped_events_are_reported_with_a_warning() {
        let mut s = Script::new();
        s.timeline.note_dropped(5);
        s.timeline.note_dropped(2);
        let profile = s.finish();
        assert_eq!(profile.summary.dropped_events, 7);
        assert_eq!(profile.warnings, [Warning::DroppedEvents { events: 7 }]);
    }

    #[test]
    fn iterations_track_residual_and_warn_when_it_grows_steadily() {
        let mut leaking = Script::new();
        let mut steady = Script::new();
        for i in 0..10u64 {
            for (s, keep) in [(&mut leaking, true), (&mut steady, false)] {
                s.enter("step", SpanLabel::Plain);
                s.alloc(0x1000 + i, 1024, Category::Other);
                s.alloc(0x9000, 4096, Category::Activation);
                s.free(0x9000);
                if !keep {
                    s.free(0x1000 + i);
                }
                s.exit();
                // A one-off top-level span does not mark iterations.
                if i == 3 {
                    s.enter("eval", SpanLabel::Plain);
                    s.exit();
                }
            }
        }
        let leak = leaking.finish();
        assert_eq!(leak.iterations.len(), 10);
        assert_eq!(leak.iterations[0].delta_bytes, 0);
        assert!(leak
            .iterations
            .iter()
            .skip(1)
            .all(|i| i.delta_bytes == 1024));
        assert_eq!(leak.iterations[9].live_bytes, 10 * 1024);
        assert_eq!(leak.iterations[9].span, "step");
        assert_eq!(
            leak.warnings,
            [Warning::GrowingResidual {
                span: "step".into(),
                window: 9,
                grew: 9,
                total_bytes: 9 * 1024,
                per_iteration_bytes: 1024,
                iterations: 10,
                run_growth_bytes: 9 * 1024,
            }]
        );
        let fine = steady.finish();
        assert_eq!(fine.iterations.len(), 10);
        assert!(fine.warnings.is_empty(), "{:?}", fine.warnings);
    }

    #[test]
    fn a_million_events_keep_the_exact_peak_within_the_point_bound() {
        let config = TimelineConfig {
            max_points_per_device: 256,
            ..TimelineConfig::default()
        };
        let mut timeline = Timeline::new(config);
        let mut peak_ts = 0;
        for i in 0..500_000u64 {
            let ts = i * 2;
            let size = if i == 333_333 { 1 << 30 } else { 64 + i % 4096 };
            if i == 333_333 {
                peak_ts = ts;
            }
            let alloc = EventKind::Alloc {
                device: DeviceId::CPU,
                addr: 0x1000 + (i % 64) * 16,
                size,
                category: Category::Activation,
            };
            let free = EventKind::Free {
                device: DeviceId::CPU,
                addr: 0x1000 + (i % 64) * 16,
                size,
            };
            for (offset, kind) in [(0, alloc), (1, free)] {
                timeline.apply(&Event {
                    ts_ns: ts + offset,
                    thread: 1,
                    span: 0,
                    kind,
                });
            }
        }
        assert_eq!(timeline.event_count(), 1_000_000);
        let profile = timeline.finish(1_000_000);
        assert!(
            profile.timeline.len() <= 256,
            "{} points",
            profile.timeline.len()
        );
        assert!(
            profile.timeline.len() >= 64,
            "{} points",
            profile.timeline.len()
        );
        assert_eq!(profile.summary.peak_timestamp_ns, peak_ts);
        assert!(profile
            .timeline
            .iter()
            .any(|p| p.timestamp_ns == peak_ts && p.live_bytes == profile.summary.peak_bytes));
        assert!(profile
            .timeline
            .windows(2)
            .all(|w| w[0].timestamp_ns <= w[1].timestamp_ns));
    }

    #[test]
    fn memory_stays_bounded_by_open_spans_and_live_blocks() {
        // One span open for the whole run, many short spans inside it while memory declines,
        // and blocks that outlive the spans that made them.
        let mut s = Script::new();
        s.enter("train", SpanLabel::Plain);
        for i in 0..2_000u64 {
            s.alloc(0x100_0000 + i, 10, Category::Other);
        }
        for i in 0..2_000u64 {
            s.enter("step", SpanLabel::Plain);
            s.alloc(0x10 + i, 3, Category::Other);
            s.free(0x100_0000 + i);
            s.free(0x10 + i);
            s.exit();
        }
        assert!(
            s.timeline.spans.peaks.len() <= 4,
            "{}",
            s.timeline.spans.peaks.len()
        );
        // Closed spans whose blocks are all gone are forgotten.
        assert!(s.timeline.spans.instances_in_use() <= 2);
        s.exit();
        assert_eq!(s.timeline.spans.peaks.len(), 0);
        assert_eq!(s.timeline.spans.instances_in_use(), 0);
        let profile = s.finish();
        assert_eq!(span(&profile, "train/step").calls, 2_000);
        assert_eq!(span(&profile, "train/step").peak_bytes, 20_003);
    }

    #[test]
    fn two_hundred_thousand_iterations_list_a_bounded_sample() {
        // Regression: every top-level exit was kept and listed, so a long training run's
        // profile grew without bound (about 140 bytes of JSON per iteration).
        let mut s = Script::new();
        for i in 0..200_000u64 {
            s.enter("step", SpanLabel::Plain);
            s.alloc(0x1000 + i, 16, Category::Other);
            s.exit();
        }
        let profile = s.timeline.finish(s.ts + 1);
        assert!(profile.iterations.len() <= crate::profile::MAX_ITERATIONS);
        let last = profile.iterations.last().unwrap();
        assert_eq!(last.index, 199_999);
        assert_eq!(last.delta_bytes, 16);
        assert_eq!(last.live_bytes, 3_200_000);
        assert!(profile.warnings.contains(&Warning::IterationsSampled {
            span: "step".into(),
            iterations: 200_000,
            listed: profile.iterations.len() as u64,
        }));
        assert!(profile.warnings.contains(&Warning::GrowingResidual {
            span: "step".into(),
            window: 16,
            grew: 16,
            total_bytes: 16 * 16,
            per_iteration_bytes: 16,
            iterations: 200_000,
            run_growth_bytes: 3_200_000 - profile.iterations[0].live_bytes as i64,
        }));
    }
}
