//! The profile document: what a run's memory did, as written to `highwater-profile.json`.
//!
//! Every figure in it comes from the [`Timeline`](crate::analysis::Timeline). It is bounded in
//! size whatever the run's length: the timeline is downsampled and the live-at-peak breakdown is
//! aggregated.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::model::{Category, OomSource, Step};

mod file;
mod invariants;
#[cfg(feature = "read")]
mod read;
mod sites;
#[cfg(test)]
mod tests;
mod tree;
mod warning;

pub use file::ProfileError;
#[cfg(feature = "read")]
pub(crate) use read::{check_schema, read_profile_bytes};
pub use sites::{CallSite, Frame, SiteSampling, SiteShare, MAX_CALL_SITES, MAX_SITE_SHARES};
pub use tree::{span_tree, TreeRow};
pub use warning::{NotRecordedReason, Warning};

/// The value of [`Profile::schema`] this version writes and reads.
///
/// # Compatibility rule
///
/// The schema is `highwater/N`; `N` changes exactly when a change breaks readers: a field
/// removed, renamed, retyped or given another meaning. A reader reads its own `N` only, and
/// names both versions when it refuses another. Within one `N`, a newer writer may *add*
/// fields: readers ignore fields they do not know (there is no `deny_unknown_fields`), and every
/// field added after the first release of an `N` is `#[serde(default)]`, so older documents
/// of the same `N` still read. `highwater/2` (span tree by id) replaced `highwater/1` (full
/// span paths on every span node and span event).
pub const SCHEMA: &str = "highwater/2";

/// Deepest span nesting a profile keeps ([`SpanMetrics`] depth 0 is top level). Spans nested
/// deeper are counted in one [`FOLDED_SPANS`] node under the deepest kept one, and the profile
/// says so in [`Profile::warnings`].
pub const MAX_SPAN_DEPTH: u32 = 64;

/// Most span-tree nodes a profile keeps; spans at new paths past it are counted in one
/// top-level [`FOLDED_SPANS`] node, and the profile says so.
pub const MAX_SPAN_NODES: usize = 8192;

/// The name of the span node that stands for spans nested deeper than [`MAX_SPAN_DEPTH`] or
/// past [`MAX_SPAN_NODES`].
pub const FOLDED_SPANS: &str = "(folded spans)";

/// Largest profile file `Profile::load` accepts; profiles are bounded far below this.
pub const MAX_PROFILE_BYTES: u64 = 256 << 20;

/// A run's memory profile.
///
/// Its size is bounded whatever the run did (well under 10 MiB with the default
/// [`TimelineConfig`](crate::analysis::TimelineConfig)): the curve is downsampled, tables are
/// capped, and the span tree is stored once, by id with parent links, at most
/// [`MAX_SPAN_DEPTH`] deep and [`MAX_SPAN_NODES`] wide; see [`SCHEMA`] for what readers of
/// other versions can expect.
///
/// New schema versions add fields, so it cannot be built by a struct literal outside this
/// crate: start from [`Profile::empty`] and set fields.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
#[cfg_attr(feature = "read", derive(serde::Deserialize))]
#[non_exhaustive]
pub struct Profile {
    /// Format identifier, always [`SCHEMA`].
    pub schema: String,
    /// About the run.
    pub meta: RunMeta,
    /// The headline figures.
    pub summary: Summary,
    /// Live bytes over time, per device, downsampled with the extremes kept.
    pub timeline: Vec<TimelinePoint>,
    /// The peak device's live bytes over the window that holds the peak, at fine resolution:
    /// from the top-level span exit before the peak to the one after it (in a training loop,
    /// the iteration that peaked), every change while the window has fewer than twice
    /// [`PEAK_WINDOW_BUCKETS`](crate::analysis::PEAK_WINDOW_BUCKETS), else each time bucket's
    /// highest and lowest point. The exact peak is one of them; a window that follows a
    /// top-level exit starts with the level at that exit. Empty in profiles written before this
    /// field existed.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub peak_window: Vec<TimelinePoint>,
    /// What was live at the peak, aggregated by (span path, op, category, device), largest first.
    pub peak_breakdown: Vec<PeakRow>,
    /// The largest single allocations live at the peak, largest first.
    pub largest_at_peak: Vec<LiveAllocation>,
    /// Span tree with memory metrics, parents before children; a node's
    /// [`SpanMetrics::id`] is its index here. [`Profile::span_path`] spells a node's path.
    pub spans: Vec<SpanMetrics>,
    /// Live bytes at the end of each top-level iteration (the leak signal). At most
    /// [`MAX_ITERATIONS`] rows: a longer run lists an even sample plus its last iterations,
    /// each row with its real [`IterationResidual::index`], and says so in
    /// [`Profile::warnings`].
    #[serde(default)]
    pub iterations: Vec<IterationResidual>,
    /// Per-device figures.
    pub devices: Vec<DeviceStats>,
    /// Device pool state over time (empty when no pool reported).
    #[serde(default)]
    pub pool_timeline: Vec<PoolPoint>,
    /// Bytes held by device drivers' memory pools over time, per device, downsampled with the
    /// extremes and the last point kept (empty when no driver was recorded).
    #[serde(default)]
    pub reserved_timeline: Vec<ReservedPoint>,
    /// How capture went: events per thread and what was dropped.
    #[serde(default)]
    pub capture: CaptureStats,
    /// Things the reader should know (dropped events, growing residuals, …), each once, as
    /// data; `Display` words them. Plain sentences in older profiles load as
    /// [`Warning::Note`].
    #[cfg_attr(
        feature = "read",
        serde(default, deserialize_with = "warning::deserialize_list")
    )]
    pub warnings: Vec<Warning>,
    /// Individual span instances with their times, for trace viewers, at most
    /// [`MAX_SPAN_EVENTS`]; when a run has more, the analysis keeps an even sample across the run
    /// (whole iterations, so a kept span's children are kept too) and says so in
    /// [`Profile::warnings`]. Empty in profiles written before this field existed.
    #[serde(default)]
    pub span_events: Vec<SpanEvent>,
    /// Where the sampled allocations came from, largest at the peak first, at most
    /// [`MAX_CALL_SITES`]. Empty when sampling was off and in profiles written before this
    /// field existed.
    #[serde(default)]
    pub sites: Vec<CallSite>,
    /// How [`Profile::sites`] were sampled.
    #[serde(default)]
    pub sampling: SiteSampling,
    /// Allocations that were refused (the heap allocator returned null, a device pool refused
    /// an admission), in time order, each with what was live at that moment; at most
    /// [`MAX_OOM_EVENTS`] ([`Summary::oom_count`] counts them all). Empty in profiles written
    /// before this field existed.
    #[serde(default)]
    pub oom_events: Vec<OomEvent>,
}

/// Most [`OomEvent`]s a profile lists: the first ones of a run, which are the ones that
/// matter (a run that goes on refusing allocations repeats itself).
pub const MAX_OOM_EVENTS: usize = 16;

/// Most rows of one [`OomEvent::live`] breakdown; the rest fold into one `(other)` row.
pub const MAX_OOM_ROWS: usize = 16;

/// One refused allocation, with what was live at that moment.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
#[cfg_attr(feature = "read", derive(serde::Deserialize))]
#[non_exhaustive]
pub struct OomEvent {
    /// When it was refused, ns since the session started.
    pub timestamp_ns: u64,
    /// Who refused it.
    pub source: OomSource,
    /// The device it was asked of (`"cpu"` for the heap).
    pub device: String,
    /// Bytes asked for.
    pub requested_bytes: u64,
    /// The pool's largest free block at that moment (pools only).
    pub largest_free_bytes: Option<u64>,
    /// The thread that asked.
    pub thread: u32,
    /// The span path open on that thread (empty outside every span).
    pub span_path: String,
    /// The innermost op open on that thread, when one was recorded.
    pub op: Option<String>,
    /// Bytes live on the device at that moment.
    pub live_bytes: u64,
    /// Of those, bytes by category (zero categories omitted).
    pub live_by_category: BTreeMap<Category, u64>,
    /// Bytes live on all devices at that moment.
    pub total_live_bytes: u64,
    /// The device pool's usable bytes, when the device has a pool that reported.
    #[serde(default)]
    pub pool_capacity_bytes: Option<u64>,
    /// The bytes the pool had reserved at that moment (its last report before the refusal).
    #[serde(default)]
    pub pool_reserved_bytes: Option<u64>,
    /// What was live on the device, aggregated by (span path, op, category), largest first,
    /// at most [`MAX_OOM_ROWS`].
    pub live: Vec<PeakRow>,
}

/// Most [`SpanEvent`]s a profile keeps, whatever the run's length.
pub const MAX_SPAN_EVENTS: usize = 20_000;

/// Most [`IterationResidual`]s a profile lists, whatever the run's length.
pub const MAX_ITERATIONS: usize = 4096;

/// One instance of a span: which thread ran it, when and for how long.
///
/// [`SpanMetrics`] aggregates all instances of a node; these keep the individual intervals so a
/// trace viewer can draw them.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
#[cfg_attr(feature = "read", derive(serde::Deserialize))]
#[non_exhaustive]
pub struct SpanEvent {
    /// The thread that entered the span (the same numbering as [`LiveAllocation::thread`]).
    pub thread: u32,
    /// The span-tree node it is an instance of: an index into [`Profile::spans`] (its name
    /// there, its path from [`Profile::span_path`]).
    pub span: u32,
    /// When the span was entered, ns since the session started.
    pub start_ns: u64,
    /// Time from enter to exit, ns.
    pub duration_ns: u64,
    /// Nesting depth on its thread, 0 for a top-level span.
    pub depth: u32,
}

/// About the run that produced a profile.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
#[cfg_attr(feature = "read", derive(serde::Deserialize))]
#[non_exhaustive]
pub struct RunMeta {
    /// The program's name (first command-line argument's file name).
    pub program: String,
    /// highwater version that wrote the profile.
    pub highwater_version: String,
    /// Wall-clock start, milliseconds since the Unix epoch.
    pub started_unix_ms: u64,
    /// The clock behind timestamps: `"tsc"` (calibrated cycle counter) or `"monotonic"`.
    pub clock: String,
    /// Threads that recorded at least one event.
    pub threads: u32,
    /// The allocation log written beside the profile, when one was asked for.
    #[serde(default)]
    pub alloc_log: Option<String>,
    /// The process that wrote the profile (0 in profiles written before this field existed).
    /// With [`RunMeta::partial`] it tells a reader whether the run is still going or died.
    #[serde(default)]
    pub pid: u32,
    /// `true` when the profile is a checkpoint of a session still recording (or one that never
    /// finished): the figures cover the run up to [`RunMeta::checkpoint_unix_ms`]. The final
    /// profile has `false`.
    #[serde(default)]
    pub partial: bool,
    /// When a checkpoint was taken, milliseconds since the Unix epoch; `None` in a final profile.
    #[serde(default)]
    pub checkpoint_unix_ms: Option<u64>,
    /// The host the process ran on (its host name; empty in profiles written before this
    /// field existed).
    #[serde(default)]
    pub host: String,
    /// This process's rank in a multi-process run (from a launcher's environment, or the
    /// `highwater` library's `SessionBuilder::rank`); `None` for a process launched alone.
    #[serde(default)]
    pub rank: Option<u32>,
    /// The rank among the run's processes on this host, when the launcher says.
    #[serde(default)]
    pub local_rank: Option<u32>,
    /// How many processes the run has, when known.
    #[serde(default)]
    pub world_size: Option<u32>,
    /// Where [`RunMeta::rank`] came from: `"torchrun"`, `"openmpi"`, `"pmi"`, `"slurm"` (the
    /// launchers' environments) or `"builder"` (the program said).
    #[serde(default)]
    pub launcher: Option<String>,
    /// What every process of one run shares and other runs do not: `HIGHWATER_RUN_ID`, else the
    /// launcher's (torchrun's `TORCHELASTIC_RUN_ID`, PMIx's namespace, Slurm's job and step).
    /// `None` when nothing says; `highwater ranks` then takes profiles of the same program and
    /// world size whose sessions overlapped in time as one run.
    #[serde(default)]
    pub run_id: Option<String>,
}

/// The headline figures of a profile. Like [`Profile`], it gains fields as the schema grows:
/// build one from `Summary::default()`.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
#[cfg_attr(feature = "read", derive(serde::Deserialize))]
#[non_exhaustive]
pub struct Summary {
    /// Highest live bytes reached on any one device.
    pub peak_bytes: u64,
    /// When the peak was reached, ns since the session started.
    pub peak_timestamp_ns: u64,
    /// Device on which the peak was reached (`"cpu"` for the heap).
    pub peak_device: String,
    /// Live bytes at the peak by category (zero categories omitted; written with lower-case
    /// category names as keys).
    pub peak_by_category: BTreeMap<Category, u64>,
    /// The part of [`Summary::peak_by_category`] that was temporary: bytes live at the peak that
    /// were freed before the span instance that allocated them exited (same keys; zero
    /// categories omitted). The rest outlived its span: state. An exact figure, not an
    /// estimate: every block is seen.
    ///
    /// "The span that allocated it" is the innermost span open on the allocating thread when
    /// the block was allocated (or made by a realloc), and the events are judged in the order
    /// the analysis applies them. So:
    ///
    /// - a block allocated outside every span is state (no span to be freed inside);
    /// - a block still live when the session ended is state, even if its span was still open;
    /// - a block whose span was still open at the end but that was freed before it is
    ///   temporary (the span never exited);
    /// - a block freed on another thread is temporary if the free came before the allocating
    ///   span exited;
    /// - a realloc moves a block, it does not free it: a block resized after the peak counts by
    ///   how the resized block ends, in its size, category and span at the peak; likewise a
    ///   block whose category was set after the peak counts in the category it had at it.
    ///
    /// Empty in profiles written before the split existed.
    #[serde(default)]
    pub peak_temporary_by_category: BTreeMap<Category, u64>,
    /// Allocations recorded (reallocs counted separately).
    pub alloc_count: u64,
    /// Frees recorded (reallocs counted separately).
    pub free_count: u64,
    /// Reallocs recorded.
    pub realloc_count: u64,
    /// Bytes handed out by allocations and by the growth of reallocs.
    pub total_alloc_bytes: u64,
    /// Activation bytes live when the first backward span started.
    pub autograd_retained_bytes: u64,
    /// Events lost because a ring was full, a thread had exited or no ring was free.
    pub dropped_events: u64,
    /// Frees (and realloc sources) of blocks the analysis never saw allocated.
    pub unknown_frees: u64,
    /// Cross-thread ordering repairs: frees that arrived after their address was reused.
    pub reorder_repairs: u64,
    /// Bytes live on all devices when the session ended.
    pub final_live_bytes: u64,
    /// Of those, bytes by category (zero categories omitted; empty in profiles written before
    /// this field existed).
    #[serde(default)]
    pub final_by_category: BTreeMap<Category, u64>,
    /// Session length in ns.
    pub duration_ns: u64,
    /// Events the analysis applied.
    pub event_count: u64,
    /// Allocations refused during the run (heap and device pools; see
    /// [`Profile::oom_events`]).
    #[serde(default)]
    pub oom_count: u64,
}

/// One point of the memory curve of one device.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
#[cfg_attr(feature = "read", derive(serde::Deserialize))]
#[non_exhaustive]
pub struct TimelinePoint {
    /// ns since the session started.
    pub timestamp_ns: u64,
    /// Device name.
    pub device: String,
    /// Live bytes on the device.
    pub live_bytes: u64,
    /// Live bytes by category (zero categories omitted).
    pub by_category: BTreeMap<Category, u64>,
}

/// Live-at-peak bytes of one (span path, op, category, device) group.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
#[cfg_attr(feature = "read", derive(serde::Deserialize))]
#[non_exhaustive]
pub struct PeakRow {
    /// Span names from the outermost, joined with `/`; empty outside every span.
    pub span_path: String,
    /// Op that made the allocations, when one was recorded.
    pub op: Option<String>,
    /// Output shape of that op, when known.
    pub shape: Option<Vec<u64>>,
    /// Output dtype of that op, when known.
    pub dtype: Option<String>,
    /// Category of the allocations.
    pub category: Category,
    /// Device name.
    pub device: String,
    /// Bytes live at the peak.
    pub bytes: u64,
    /// Allocations live at the peak.
    pub count: u64,
    /// The call sites behind this row's bytes, largest first (indices into
    /// [`Profile::sites`], at most three); empty when sampling was off.
    #[serde(default)]
    pub top_sites: Vec<u32>,
}

/// One allocation live at the peak.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
#[cfg_attr(feature = "read", derive(serde::Deserialize))]
#[non_exhaustive]
pub struct LiveAllocation {
    /// Bytes.
    pub bytes: u64,
    /// Device name.
    pub device: String,
    /// Category.
    pub category: Category,
    /// Span path it was allocated in.
    pub span_path: String,
    /// Op that made it, when recorded.
    pub op: Option<String>,
    /// Op output shape, when known.
    pub shape: Option<Vec<u64>>,
    /// When it was allocated, ns since the session started.
    pub timestamp_ns: u64,
    /// The thread that allocated it.
    pub thread: u32,
}

/// Memory metrics of one node of the span tree (all instances of a span at one path).
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
#[cfg_attr(feature = "read", derive(serde::Deserialize))]
#[non_exhaustive]
pub struct SpanMetrics {
    /// Index of this node in [`Profile::spans`].
    pub id: u32,
    /// Index of the parent node, `None` for top-level spans.
    pub parent: Option<u32>,
    /// Span name ([`FOLDED_SPANS`] for the node that counts folded spans).
    pub name: String,
    /// Step the span marks, if any.
    pub step: Option<Step>,
    /// Category the span names, if any.
    pub category: Option<Category>,
    /// Times the span was entered.
    pub calls: u64,
    /// Total time inside, ns (summed over calls).
    pub total_ns: u64,
    /// Bytes allocated inside, children included.
    pub bytes_allocated: u64,
    /// Allocations made inside, children included.
    pub alloc_count: u64,
    /// Highest live bytes (on the peak's device measure) while the span was open.
    pub peak_bytes: u64,
    /// Bytes allocated inside and still live at exit, summed over calls; every view shows it
    /// per call ([`SpanMetrics::residual_per_call`]).
    pub residual_bytes: u64,
}

impl SpanMetrics {
    /// The residual of one call: bytes a call allocated and still held when it exited,
    /// averaged over the span's calls (rounded to the nearest byte; 0 for a span never
    /// called). What every output shows as the span's residual.
    ///
    /// # Examples
    ///
    /// ```
    /// use highwater_profile::SpanMetrics;
    /// let mut step = SpanMetrics::default();
    /// (step.calls, step.residual_bytes) = (200, 800 << 20);
    /// assert_eq!(step.residual_per_call(), 4 << 20);
    /// ```
    pub fn residual_per_call(&self) -> u64 {
        if self.calls == 0 {
            return 0;
        }
        let calls = u128::from(self.calls);
        ((u128::from(self.residual_bytes) + calls / 2) / calls) as u64
    }
}

/// Live bytes at the end of one top-level iteration span.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
#[cfg_attr(feature = "read", derive(serde::Deserialize))]
#[non_exhaustive]
pub struct IterationResidual {
    /// Iteration number, from 0.
    pub index: u64,
    /// The top-level span that marks iterations.
    pub span: String,
    /// When the iteration ended, ns since the session started.
    pub end_timestamp_ns: u64,
    /// Live bytes (all devices) when it ended.
    pub live_bytes: u64,
    /// Change since the end of the iteration just before (listed or not).
    pub delta_bytes: i64,
}

/// Per-device figures.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
#[cfg_attr(feature = "read", derive(serde::Deserialize))]
#[non_exhaustive]
pub struct DeviceStats {
    /// Device name (`cpu`, `cuda:0`, `tpu:3`).
    pub device: String,
    /// Usable bytes: a pool's capacity when a pool reported it, else the device's total memory
    /// when its driver was recorded.
    pub capacity_bytes: Option<u64>,
    /// Highest live bytes.
    pub peak_bytes: u64,
    /// When that was reached.
    pub peak_timestamp_ns: u64,
    /// Live bytes by category at the device's own peak (zero categories omitted).
    pub peak_by_category: BTreeMap<Category, u64>,
    /// Allocations on the device.
    pub alloc_count: u64,
    /// Frees on the device.
    pub free_count: u64,
    /// Bytes live when the session ended.
    pub final_live_bytes: u64,
    /// Highest bytes reserved from the device's pool, when a pool reported.
    pub peak_reserved_bytes: Option<u64>,
    /// Highest pool fragmentation seen, when a pool reported.
    pub max_fragmentation: Option<f64>,
    /// Highest bytes the device driver's memory pools held (CUDA's stream-ordered allocation),
    /// when the driver was recorded: allocated bytes plus what the pools keep for reuse.
    #[serde(default)]
    pub reserved_peak_bytes: Option<u64>,
    /// Bytes the driver's memory pools held when the session ended.
    #[serde(default)]
    pub reserved_final_bytes: Option<u64>,
    /// Device memory already in use when recording first saw the device, before its first
    /// recorded allocation: the context's fixed overhead (and any other process's memory on
    /// the device). Allocated + reserved slack + this is what `nvidia-smi` shows.
    #[serde(default)]
    pub context_bytes: Option<u64>,
}

/// What a device driver's memory pools held at one moment.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
#[cfg_attr(feature = "read", derive(serde::Deserialize))]
#[non_exhaustive]
pub struct ReservedPoint {
    /// ns since the session started.
    pub timestamp_ns: u64,
    /// Device name.
    pub device: String,
    /// Bytes the pools held.
    pub reserved_bytes: u64,
}

/// A device pool's state at one moment.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
#[cfg_attr(feature = "read", derive(serde::Deserialize))]
#[non_exhaustive]
pub struct PoolPoint {
    /// ns since the session started.
    pub timestamp_ns: u64,
    /// Device name.
    pub device: String,
    /// Usable bytes.
    pub capacity_bytes: u64,
    /// Bytes reserved.
    pub reserved_bytes: u64,
    /// Largest free block.
    pub largest_free_bytes: u64,
    /// `1 - largest free / free`.
    pub fragmentation: f64,
}

/// What a thread does when its event ring is full.
///
/// Set with the `highwater` library's `SessionBuilder::capture_mode` or `HIGHWATER_CAPTURE`
/// (`lossless` or `drop`; the variable wins). The profile says which mode ran in
/// `capture.mode`.
///
/// # Examples
///
/// ```
/// use highwater_profile::CaptureMode;
/// assert_eq!("drop".parse(), Ok(CaptureMode::DropWhenFull));
/// assert_eq!("Lossless".parse(), Ok(CaptureMode::Lossless));
/// assert!("sometimes".parse::<CaptureMode>().is_err());
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum CaptureMode {
    /// The thread waits until the collector has drained its ring (spinning briefly, then
    /// sleeping), so no event is lost. The default. A thread only waits while the collector
    /// serves it: never on highwater's own threads, in a forked child, inside a signal handler
    /// that interrupted a record, or once the session has stopped.
    #[default]
    Lossless,
    /// The event is dropped and counted. The program is never slowed down, but the figures can
    /// be wrong both ways: a dropped allocation hides a block (the peak comes out low), and a
    /// dropped free leaves a block that looks live for ever (the peak can come out high).
    DropWhenFull,
}

impl CaptureMode {
    /// The mode of profiles written before the mode was recorded: they all dropped.
    pub(crate) fn before_modes() -> CaptureMode {
        CaptureMode::DropWhenFull
    }
}

impl std::str::FromStr for CaptureMode {
    type Err = ParseCaptureModeError;

    /// `lossless`, or `drop` / `drop_when_full`, in any case.
    fn from_str(value: &str) -> Result<CaptureMode, ParseCaptureModeError> {
        match value.trim().to_ascii_lowercase().as_str() {
            "lossless" => Ok(CaptureMode::Lossless),
            "drop" | "drop_when_full" => Ok(CaptureMode::DropWhenFull),
            _ => Err(ParseCaptureModeError),
        }
    }
}

/// A capture mode name was neither `lossless` nor `drop` (`drop_when_full`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("expected `lossless` or `drop`")]
pub struct ParseCaptureModeError;

/// How capture went: what each thread recorded and what was lost.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
#[cfg_attr(feature = "read", derive(serde::Deserialize))]
#[non_exhaustive]
pub struct CaptureStats {
    /// What a thread did when its ring was full: waited for the collector (`"lossless"`) or
    /// dropped the event (`"drop_when_full"`). Profiles written before this field existed were
    /// all captured dropping.
    #[serde(default = "CaptureMode::before_modes")]
    pub mode: CaptureMode,
    /// Events per thread ring.
    pub ring_events: u64,
    /// Events dropped, by kind (`alloc`, `free`, `realloc`, `span`, `other`).
    pub dropped_by_kind: BTreeMap<String, u64>,
    /// Of those, events dropped with no thread to charge them to (no free ring, thread exiting).
    pub unattributed_dropped: u64,
    /// Of those, records a thread tried to make while it was already inside a push (a signal
    /// handler that allocates while the interrupted code is recording): counted, not recorded,
    /// as recording them would interleave two writers on the thread's ring.
    #[serde(default)]
    pub reentrant_dropped: u64,
    /// Times a thread found its ring full and waited for the collector (lossless mode).
    #[serde(default)]
    pub producer_waits: u64,
    /// Events the collector merged after an event of another thread stamped later than them:
    /// published later than the merge's watermark allowed for (two cores' clocks that
    /// disagree, for one). Each is still applied at its own time, but a peak judged between
    /// may be off by its size. 0 in a sound capture.
    #[serde(default)]
    pub late_events: u64,
    /// Per recording thread, in order of first event: at most [`MAX_THREAD_ROWS`] rows, the
    /// last of which sums every thread past the others when a run had more.
    pub threads: Vec<ThreadCapture>,
}

/// Most [`CaptureStats::threads`] rows a profile lists: a run that starts threads by the
/// million lists its first threads one by one and sums the rest in the last row
/// ([`ThreadCapture::threads`] says how many), so the profile stays bounded.
pub const MAX_THREAD_ROWS: usize = 1024;

/// What one thread (or, in a last row, many threads) recorded and lost.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[cfg_attr(feature = "read", derive(serde::Deserialize))]
#[non_exhaustive]
pub struct ThreadCapture {
    /// The thread's number in this profile's events (of a row that sums many, the first's).
    pub thread: u32,
    /// Threads this row counts: 1, or in the last row of a run with more than
    /// [`MAX_THREAD_ROWS`] threads, every thread from [`ThreadCapture::thread`] on (their
    /// `os_tid` is the first's).
    #[cfg_attr(feature = "read", serde(default = "one"))]
    pub threads: u64,
    /// The operating system's id for it (`gettid` on Linux; 0 elsewhere).
    pub os_tid: u64,
    /// Allocations recorded.
    pub allocs: u64,
    /// Frees recorded.
    pub frees: u64,
    /// Reallocs recorded.
    pub reallocs: u64,
    /// Span entries and exits recorded.
    pub span_events: u64,
    /// Op, device-tensor, annotation and pool events recorded.
    #[serde(default)]
    pub other_events: u64,
    /// Allocations dropped (ring full).
    pub dropped_allocs: u64,
    /// Frees dropped.
    pub dropped_frees: u64,
    /// Reallocs dropped.
    pub dropped_reallocs: u64,
    /// Other events dropped (spans, ops).
    pub dropped_other: u64,
}

impl Default for ThreadCapture {
    fn default() -> ThreadCapture {
        ThreadCapture {
            thread: 0,
            threads: 1,
            os_tid: 0,
            allocs: 0,
            frees: 0,
            reallocs: 0,
            span_events: 0,
            other_events: 0,
            dropped_allocs: 0,
            dropped_frees: 0,
            dropped_reallocs: 0,
            dropped_other: 0,
        }
    }
}

impl ThreadCapture {
    /// The row of profile thread `thread`, OS thread `os_tid`, with nothing counted yet.
    pub fn new(thread: u32, os_tid: u64) -> ThreadCapture {
        ThreadCapture {
            thread,
            os_tid,
            ..ThreadCapture::default()
        }
    }
}

/// The serde default of a count that was always one before it was written.
#[cfg(feature = "read")]
fn one() -> u64 {
    1
}

impl Profile {
    /// An empty profile of the current schema.
    pub fn empty() -> Profile {
        Profile {
            schema: SCHEMA.to_string(),
            ..Profile::default()
        }
    }

    /// The path of span node `id`: names from the outermost span, joined with `/`. Empty for
    /// an id that is not in [`Profile::spans`]. Bounded by the tree's size even in a hand-made
    /// profile whose parents loop.
    pub fn span_path(&self, id: u32) -> String {
        let mut names = Vec::new();
        let mut at = Some(id);
        while let Some(node) = at.and_then(|id| self.spans.get(id as usize)) {
            if names.len() > self.spans.len() {
                break;
            }
            names.push(node.name.as_str());
            at = node.parent;
        }
        names.reverse();
        names.join("/")
    }

    /// Every span node's path, by id ([`Profile::span_path`] for all of them, in one pass:
    /// parents come before their children). A node whose parent does not come before it is
    /// shown as top level.
    pub fn span_paths(&self) -> Vec<String> {
        span_paths(&self.spans)
    }
}

/// Every node's path in `spans`, by index, in one pass (see [`Profile::span_paths`]).
pub(crate) fn span_paths(spans: &[SpanMetrics]) -> Vec<String> {
    let mut paths: Vec<String> = Vec::with_capacity(spans.len());
    for (index, span) in spans.iter().enumerate() {
        let path = match span.parent.map(|p| p as usize) {
            Some(parent) if parent < index => format!("{}/{}", paths[parent], span.name),
            _ => span.name.clone(),
        };
        paths.push(path);
    }
    paths
}
