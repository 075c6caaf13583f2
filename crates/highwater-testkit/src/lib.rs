//! Test support shared by highwater's crates, benches and examples. Not published; a
//! dev-dependency only.
//!
//! - [`sample`]: a realistic hand-built profile the exporters', the report's and the command's
//!   tests all read.
//! - [`ranks`]: one profile made into the profiles of a multi-process run's ranks.
//! - [`workloads`]: allocation-heavy programs of other crates' code, run by the workload tests,
//!   the `workload` example and `scripts/compare_profilers.py`.
//! - [`cpu`]: CPU time of a thread, the process and the collector thread.
//! - [`browser`]: headless Chromium, for the tests that look at a page as a person would.
//! - `mlp`, `reentry`, `peak_sites`, `launch` (feature `session`): the model and data the candle
//!   examples and tests train; a global allocator that notices the hook allocating; the call
//!   sites behind a category's bytes at the peak; a torchrun-style launch of candle worker
//!   processes.
//! - `counting`, `child`, `exact` (feature `session`): allocators that count what highwater
//!   should have seen, independently of it; a test re-run in a child process with a watchdog;
//!   the exactness check of the workload tests.

pub mod browser;
#[cfg(all(feature = "session", not(highwater_loom)))]
pub mod child;
#[cfg(all(feature = "session", not(highwater_loom)))]
pub mod counting;
pub mod cpu;
#[cfg(all(feature = "session", not(highwater_loom)))]
pub mod exact;
// The loom build of the library has no session to record with.
#[cfg(all(feature = "session", not(highwater_loom)))]
pub mod launch;
#[cfg(all(feature = "session", not(highwater_loom)))]
pub mod mlp;
#[cfg(all(feature = "session", not(highwater_loom)))]
pub mod peak_sites;
pub mod ranks;
#[cfg(all(feature = "session", not(highwater_loom)))]
pub mod reentry;
pub mod sample;
pub mod workloads;
