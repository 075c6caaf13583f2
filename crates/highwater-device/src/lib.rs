//! Device memory models: pools and placement strategies, emulations of other allocators, and
//! what-if replay of a recorded run through them.
//!
//! An accelerator's memory (a TPU core's HBM, a GPU's) is one address range that a runtime
//! hands out in blocks. A [`Pool`] keeps one device's blocks in bookkeeping only, placed by a
//! [`Strategy`] and kept in address order, a freed block merged with its free neighbours at once;
//! every strategy places and frees in O(log n). The `highwater` library's pool manager is built
//! on it.
//!
//! The rest answers "would this run fit?" from a recorded allocation stream (a profile's
//! allocation log, [`ops_from_log`]):
//!
//! - [`simulate`] / [`compare_strategies`]: replay a stream through a pool to see whether, when
//!   and why it would run out, under each strategy.
//! - [`figures`] / [`replay`]: the lower bound (most bytes live at once), an offline packing of
//!   the recorded lifetimes, and the peak under emulations of PyTorch's caching allocator (with
//!   and without expandable segments), TensorFlow's BFC allocator and the pool strategies
//!   ([`Allocator`]).
//! - [`fit`]: the largest factor on a category (a batch size, say) that still fits a device,
//!   after [`Edits`] such as bf16 parameters or a sharded optimizer.
//!
//! # Examples
//!
//! ```
//! use highwater_device::{simulate, SimOp, Strategy};
//!
//! let ops = [SimOp::alloc(0, 1, 600 << 20), SimOp::alloc(1, 2, 600 << 20), SimOp::free(2, 1)];
//! let report = simulate(&ops, 1 << 30, Strategy::BestFit);
//! assert!(!report.fits);
//! assert_eq!(report.failures, 1);
//! ```

mod arena;
mod bfc;
mod blocks;
mod buddy;
mod cause;
mod free_tree;
mod kind;
mod offline;
mod online;
mod pool;
mod simulate;
mod slab;
mod strategy;
mod torch;
mod trace;
mod whatif;

pub use bfc::BfcOptions;
pub use cause::ShortfallCause;
pub use kind::{DeviceIndex, DeviceKind, ParseNameError};
pub use pool::{Counters, Pool};
pub use simulate::{
    compare_strategies, ops_from_log, simulate, SimComparison, SimFailure, SimOp, SimOpKind,
    SimReport, MAX_SAMPLES,
};
pub use strategy::Strategy;
pub use torch::{TorchOptionError, TorchOptions};
pub use trace::{blocks_at_least, Edits, Factor, ParseFactorError, Trace, MAX_BLOCK_BYTES};
pub use whatif::{
    figures, fit, replay, Allocator, AllocatorPeak, CurvePoint, Figures, FirstToFill, FitAnswer,
    FitQuery, Replay, UNLIMITED,
};
