//! Measuring a closure's heap use on the calling thread, for tests and budgets.
//!
//! [`measure`] runs a closure and counts, exactly, what the calling thread allocated and freed
//! inside it. No [`Session`](crate::Session) is needed, and a running session changes nothing:
//! the figures are the same with one, without one, and on every run. Each measuring thread has
//! its own meter, reached through its own thread-local, so tests that `cargo test` runs in
//! parallel threads never see each other's allocations; a thread that is not measuring pays
//! one Relaxed load per allocator call.
//!
//! What a measurement sees, how spans split it and how call sites are estimated is written on
//! [`measure`], the public entry point.

mod budget;
mod iterations;
pub(crate) mod meter;
mod sites;
mod table;

use std::cell::UnsafeCell;

pub use budget::{Budget, BudgetExceeded};
pub use iterations::{IterationReport, LeakCheck, LeakDetected};
pub(crate) use meter::{on_alloc, on_free, on_realloc};

/// What [`measure`] counted: exact figures for the blocks the calling thread allocated while
/// the closure ran.
///
/// The four figures issue budgets are written against are `peak_bytes`, `allocated_bytes`,
/// `allocations` and `leaked_bytes`; the others say what else the thread did and whether the
/// figures are complete.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Measurement {
    /// The highest number of bytes live at once in blocks born inside the closure (above the
    /// starting point: blocks that existed before do not count).
    pub peak_bytes: u64,
    /// Bytes allocated: every allocation's size, plus each realloc's growth over the block it
    /// replaced (its whole new size when the old block was not born inside).
    pub allocated_bytes: u64,
    /// Allocations (`alloc` and `alloc_zeroed` calls); reallocs are counted apart.
    pub allocations: u64,
    /// Bytes of blocks born inside that were still live when the closure returned.
    pub leaked_bytes: u64,
    /// How many blocks `leaked_bytes` is.
    pub leaked_blocks: u64,
    /// `realloc` calls.
    pub reallocations: u64,
    /// Frees of blocks born inside.
    pub frees: u64,
    /// Frees (and reallocs) of blocks not born inside: made before the closure ran, or by
    /// another thread.
    pub untracked_frees: u64,
    /// Blocks that could not be put in the address table (no memory could be mapped for it).
    /// Always 0 unless the machine is out of memory; otherwise the figures are lower bounds.
    pub untracked_blocks: u64,
    /// Allocator calls made while this thread was already inside the meter (a signal handler
    /// that allocates), which were not counted. Normally 0.
    pub missed_events: u64,
    /// Bytes the thread's heap grew by, net of every free it made, including frees of older
    /// blocks: what [`LeakCheck`] watches across iterations.
    pub net_bytes: i64,
    /// Figures by span path, largest first (live at the peak, then leaked, then allocated).
    /// Path `""` holds what was allocated outside every span opened inside the closure. A
    /// measurement follows 127 distinct paths and 64 levels of nesting; a span beyond either
    /// is counted in the path that encloses it.
    pub spans: Vec<SpanFigures>,
    /// Estimated figures by call stack, from allocations sampled by bytes (one per
    /// [`site_sample_bytes`](Self::site_sample_bytes) on average, every block of 4 times that
    /// or more), largest at the peak first. Unlike every other figure these are estimates, but
    /// they come out the same on every run of the same closure. Budget failures name the
    /// largest sites by function, file and line.
    pub sites: Vec<SiteFigures>,
    /// The mean bytes between call-site samples.
    pub site_sample_bytes: u64,
}

impl Measurement {
    /// Whether every allocator call of the closure was counted (no block untracked, no event
    /// missed). Budgets fail on an incomplete measurement.
    pub fn is_complete(&self) -> bool {
        self.untracked_blocks == 0 && self.missed_events == 0
    }
}

/// One span path's share of a [`Measurement`].
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct SpanFigures {
    /// Span names from the outermost span opened inside the closure, joined by `/`; `""` for
    /// allocations outside every such span.
    pub path: String,
    /// Allocations made with this path innermost.
    pub allocations: u64,
    /// Bytes allocated with this path innermost (as [`Measurement::allocated_bytes`]).
    pub allocated_bytes: u64,
    /// Bytes of this path's blocks live at the measurement's peak.
    pub live_at_peak_bytes: u64,
    /// Bytes of this path's blocks still live at the end.
    pub leaked_bytes: u64,
}

impl SpanFigures {
    /// The path for people: `(outside any span)` for the root.
    pub fn display_path(&self) -> &str {
        if self.path.is_empty() {
            "(outside any span)"
        } else {
            &self.path
        }
    }
}

/// One sampled call stack's share of a [`Measurement`], estimated: each sampled block of `s`
/// bytes stands for `s / p` bytes, `p` the chance that a block of its size is sampled.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct SiteFigures {
    /// Return addresses, innermost first, as walked inside the allocator: highwater's and the
    /// allocator's frames come first; the frames outside [`measure`] are left out, so the same
    /// closure has the same stacks wherever it is measured from. Empty for the row that sums
    /// the samples of stacks past the 64 a measurement keeps.
    pub stack: Vec<u64>,
    /// The walk stopped early (depth limit, or a frame without a frame pointer).
    pub truncated: bool,
    /// Sampled blocks behind the estimates.
    pub samples: u64,
    /// Estimated bytes allocated here.
    pub allocated_bytes: u64,
    /// Estimated bytes of this site's blocks live at the measurement's peak.
    pub live_at_peak_bytes: u64,
    /// Estimated bytes of this site's blocks still live at the end.
    pub leaked_bytes: u64,
}

/// Runs `f` and returns its value with an exact [`Measurement`] of the heap blocks the calling
/// thread allocated inside it.
///
/// It needs no [`Session`](crate::Session) and does not disturb one, and it counts only when
/// [`Alloc`](crate::Alloc) is the global allocator.
///
/// # What a measurement sees
///
/// - **Blocks born inside**: every `alloc`, `alloc_zeroed` and `realloc` the calling thread
///   makes while the closure runs, kept until the same thread frees them: the latest one in
///   the meter itself (so an allocation freed before the next one, the commonest pattern,
///   costs no table work), the others in an address table (mapped with `mmap`, never from the
///   global allocator). `peak_bytes` is the highest total
///   of those blocks live at once, `leaked_bytes` what is still live when the closure returns.
/// - **Frees of older blocks** (made before the closure, or by another thread): not blocks of
///   the measurement, so they lower neither its live bytes nor its peak; counted in
///   [`Measurement::untracked_frees`], and in [`Measurement::net_bytes`], the thread's heap
///   change net of every free.
/// - **A block born inside and freed by another thread**: that thread is not measuring and
///   pays nothing, so the free is not seen; the block stays live in the figures and is counted
///   in `leaked_bytes` and `leaked_blocks`, even if the same address is later handed to the
///   measuring thread again.
/// - **Threads the closure spawns**: not measured. Their allocations are their own; what they
///   hand back and the measuring thread frees is an older block. Measure inside the thread to
///   measure its work. Spawning itself allocates std's thread bookkeeping on the calling
///   thread, and whichever thread drops the last reference frees it, so a closure that spawns
///   may show a few dozen bytes leaked, not always the same.
/// - **highwater's own allocations** on the thread (interning a span or op name while a
///   session records, starting or finishing a session inside the closure): not counted. The
///   [`Profile`](crate::Profile) a session inside the closure returns is highwater's too: its
///   frees are of an older block.
///
/// Measurements nest: an inner [`measure`] counts its closure, and the outer one counts it too.
///
/// # Spans
///
/// [`profile!`](crate::profile!) spans opened inside the closure split the figures by span path
/// ([`Measurement::spans`]): bytes allocated, bytes live at the measurement's peak and bytes
/// leaked, per path. Budget failures print the largest of them.
///
/// # Call sites
///
/// Which code allocated is estimated from stacks sampled by bytes, as a session samples them
/// (one sample per 64 KiB allocated on average, every block of 256 KiB or more), with the same
/// seed in every measurement so that the estimates, like the exact figures, are the same on
/// every run ([`Measurement::sites`]). Only a sampled allocation walks the stack; symbols are
/// resolved only when a budget fails, whose message then names the largest sites by function,
/// file and line.
///
/// # Examples
///
/// ```
/// #[global_allocator]
/// static ALLOC: highwater::Alloc = highwater::Alloc::system();
///
/// # fn main() {
/// let (sum, m) = highwater::measure(|| {
///     let scratch = vec![1u64; 1000]; // 8000 bytes, freed before the end
///     scratch.iter().sum::<u64>()
/// });
/// assert_eq!(sum, 1000);
/// assert_eq!(m.peak_bytes, 8000);
/// assert_eq!(m.allocations, 1);
/// assert_eq!(m.leaked_bytes, 0);
/// # }
/// ```
pub fn measure<R>(f: impl FnOnce() -> R) -> (R, Measurement) {
    // Sampled stacks may need the unwind tables (a build without frame pointers); this is
    // highwater's work, not the closure's: neither a session nor an enclosing meter counts it.
    crate::capture::with_recording_paused(crate::capture::stack::prepare);
    let meter = UnsafeCell::new(meter::Meter::new());
    let value = {
        // SAFETY: `meter` outlives the activation (dropped at the end of this block, before
        // `meter` is read again), and only the hook touches it while the closure runs.
        let _active = unsafe { meter::Activation::start(meter.get()) };
        f()
    };
    let meter = meter.into_inner();
    let measurement = crate::capture::with_recording_paused(|| meter.finish());
    crate::capture::with_recording_paused(|| drop(meter));
    (value, measurement)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_root_path_reads_as_outside_any_span() {
        let row = |path: &str| SpanFigures {
            path: path.to_owned(),
            allocations: 1,
            allocated_bytes: 1,
            live_at_peak_bytes: 1,
            leaked_bytes: 0,
        };
        assert_eq!(row("").display_path(), "(outside any span)");
        assert_eq!(row("forward").display_path(), "forward");
    }
}
