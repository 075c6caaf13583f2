//! The streaming state machine: [`Timeline::apply`] one event at a time, [`Timeline::profile`]
//! for a [`Profile`](crate::profile::Profile) at any moment.
//!
//! The work is split by stage: `apply` (events into live blocks, spans and ops), `peaks`
//! (per-device counters, the peaks, the curves and pool figures), `assemble` (the [`Profile`](crate::profile::Profile)
//! document) and `leak` (the growing-residual signal).
//!
//! # What each event does
//!
//! - `Alloc` makes a block live at (device, address) with the event's category, attributed to
//!   the innermost open op of its thread (any device) and to the span instance the event names.
//!   A key that is already live is ended first, as if freed now, and counted as a repair.
//! - `Free` ends the block. A key that is not live counts as an unknown free; a free stamped
//!   earlier than the live block's allocation belongs to an earlier life of the address and is
//!   ignored, counted as a repair. `free_count` counts only frees that ended a block.
//! - `ReallocRelease` moves the old heap block of the thread's next `Realloc` off its address
//!   (judged as a free stamped then would be), so that another thread may allocate there
//!   before the realloc completes; its bytes stay counted. It is not counted as an event.
//! - `Realloc` ends the old heap block (same rules; an unknown one counts as an unknown free;
//!   after a release, the block the release moved) and makes the new one live in the same step. It counts in `realloc_count` only; total
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
//! - `Oom` counts a refused allocation; the first ones are kept with what was live on their
//!   device at that moment (see `oom`). It changes no byte figure.
//!
//! After any event that changed a device's counters: that device's peak, the global peak (the
//! highest live bytes of any one device; ties keep the first time), the curve, the peak
//! window's curve (see `window`: the time from one top-level span exit to the next that holds
//! the peak, at fine resolution), and the span peak measure (highest live bytes over devices)
//! are updated.
//!
//! # Iterations and the leak signal
//!
//! The top-level span name entered most often (at least twice; ties go to the name seen first)
//! marks iterations. Each exit of it records live bytes on all devices and the change since the
//! previous exit (0 for the first). Instances still open at the end are not iterations. See
//! `leak::leak_warning` for when a growing residual becomes a warning.

mod apply;
mod assemble;
mod leak;
mod oom;
mod peaks;
mod realloc;
mod split;
mod window;

pub use apply::{At, Realloc};
pub use window::PEAK_WINDOW_BUCKETS;
#[cfg(test)]
mod tests;
#[cfg(test)]
mod tests_shortcuts;

use rustc_hash::FxHashMap;

use crate::model::Category;
use crate::profile::CaptureMode;

use super::event::{DeviceId, NameId, ShapeId, StackId};
use super::intern::Interner;
use super::iterations::IterationSeries;
use super::live::LiveSet;
use super::sites::{ResolveFrames, Sites};
use super::span_sample::SpanSample;
use super::spans::Spans;
use super::temporary::Temporaries;
use crate::model::StackWalk;

use apply::{Counts, ThreadOps};
use peaks::{DeviceState, GlobalPeak};

/// Bounds on what a [`Timeline`] keeps and reports.
///
/// # Examples
///
/// ```
/// use highwater_profile::analysis::TimelineConfig;
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

/// The streaming memory analysis: apply merged events in time order, take a [`Profile`](crate::profile::Profile) at
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
/// use highwater_profile::analysis::{DeviceId, Event, EventKind, Timeline, TimelineConfig};
/// use highwater_profile::model::Category;
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
/// let profile = timeline.profile(40);
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
    /// How the events were captured: decides what the drop warning says.
    capture_mode: CaptureMode,
    counts: Counts,
    /// Highest live bytes of any one device now (the span peak measure).
    measure: u64,
    peak: GlobalPeak,
    /// The window that holds the peak, at fine resolution.
    window: window::PeakWindow,
    /// Which bytes live at the peak were temporary.
    temporaries: Temporaries,
    /// Activation bytes live when the first backward span entered.
    autograd_retained: Option<u64>,
    /// Exits of top-level spans by name (bounded; see [`IterationSeries`]).
    top_level_exits: FxHashMap<NameId, IterationSeries>,
    /// A bounded sample of closed span instances, for per-call timelines.
    span_calls: SpanSample,
    /// The first refused allocations, with what was live then (at most `MAX_OOM_EVENTS`).
    ooms: Vec<oom::OomRecord>,
    /// Refused allocations, all of them.
    oom_count: u64,
    /// Call-site samples and the sampled blocks live now and at the peak.
    sites: Sites,
    /// Reallocs released and not completed yet, by thread.
    pending_reallocs: FxHashMap<u32, realloc::Pending>,
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
            capture_mode: CaptureMode::before_modes(),
            counts: Counts::default(),
            measure: 0,
            peak: GlobalPeak::default(),
            window: window::PeakWindow::default(),
            temporaries: Temporaries::default(),
            autograd_retained: None,
            top_level_exits: FxHashMap::default(),
            span_calls: SpanSample::default(),
            ooms: Vec::new(),
            oom_count: 0,
            sites: Sites::default(),
            pending_reallocs: FxHashMap::default(),
        }
    }

    /// The id of a call stack (return addresses, innermost first) for
    /// [`EventKind::Sampled`](super::EventKind::Sampled), and how it was walked (a `bool`:
    /// by frame pointers, cut or not). The same addresses walked the same way always get the
    /// same id.
    pub fn intern_stack(&mut self, pcs: &[u64], walk: impl Into<StackWalk>) -> StackId {
        self.sites.intern_stack(pcs, walk)
    }

    /// Says how the session sampled call sites: mean bytes `R` between samples (`0`: off) and
    /// how stacks were walked. Samples are weighted with this `R`.
    pub fn set_sampling(&mut self, mean_bytes: u64, unwinder: &str) {
        self.sites.set_sampling(mean_bytes, unwinder);
    }

    /// Resolves call stacks to frames whenever a profile is assembled.
    pub fn set_resolver(&mut self, resolver: Box<dyn ResolveFrames>) {
        self.sites.set_resolver(resolver);
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

    /// Says how the session captured the events, for the drop warning (without it the
    /// warning assumes drop mode).
    pub fn set_capture_mode(&mut self, mode: CaptureMode) {
        self.capture_mode = mode;
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
}
