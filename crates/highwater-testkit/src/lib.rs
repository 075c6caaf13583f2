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

pub mod browser;
pub mod cpu;
pub mod ranks;
pub mod sample;
pub mod workloads;
