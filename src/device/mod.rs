//! Device memory pools with all-or-nothing admission, and what-if replay of allocation streams.
//!
//! # What is a device pool?
//!
//! An accelerator's memory (a TPU core's HBM, a GPU's) is one address range that a runtime
//! hands out in blocks. A [`PoolManager`] keeps one pool per device in bookkeeping only — no
//! device memory is touched — so a training binary can ask "would these tensors fit on these
//! devices?" before it commits, and a profile can show how full and how fragmented each device
//! got. It works the way users of TensorFlow's BFC allocator or PyTorch's caching allocator
//! expect: blocks are kept in address order, a released block merges with free neighbours at
//! once, and every strategy places and releases in O(log n).
//!
//! - [`PoolManager`]: pools for `n` devices of a [`DeviceKind`] or an explicit byte limit;
//!   [`PoolManager::reserve`] is all-or-nothing across devices and returns a [`Reservation`]
//!   that [`PoolManager::release`] consumes.
//! - [`Strategy`]: first, best and worst fit, buddy system, size-class pools, adaptive; the
//!   table there gives each one's rounding.
//! - [`PoolError`] / [`AdmissionError`]: a refusal names every device that could not fit, with
//!   its figures and whether the cause was capacity or fragmentation.
//! - [`simulate`] / [`compare_strategies`]: replay a recorded allocation stream through a pool
//!   to see whether, when and why it would run out, under each strategy.
//!
//! # Examples
//!
//! ```
//! use highwater::device::{DeviceIndex, DeviceKind, PoolManager, Strategy};
//!
//! let pools = PoolManager::builder().kind(DeviceKind::TpuV4).devices(2).strategy(Strategy::BestFit).build();
//! let r = pools.reserve(&[(DeviceIndex(0), 1 << 30), (DeviceIndex(1), 1 << 30)])?;
//! let s = pools.stats(DeviceIndex(0))?;
//! assert_eq!((s.capacity_bytes, s.in_use_bytes), (32 << 30, 1 << 30));
//! assert_eq!(pools.release(r)?, 2 << 30);
//! # Ok::<(), highwater::device::PoolError>(())
//! ```

mod arena;
mod bfc;
mod blocks;
mod buddy;
mod error;
mod free_tree;
mod kind;
mod manager;
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
pub use error::{AdmissionError, PoolError, Shortfall, ShortfallCause};
pub use kind::{DeviceIndex, DeviceKind, ParseNameError};
pub(crate) use manager::{clear_pool_sink, set_pool_sink};
pub use manager::{
    PoolManager, PoolManagerBuilder, PoolObserver, PoolSnapshot, PoolStats, Reservation,
    ReservedBlock,
};
pub use simulate::{
    compare_strategies, simulate, SimComparison, SimFailure, SimOp, SimOpKind, SimReport,
    MAX_SAMPLES,
};
pub use strategy::Strategy;
pub use torch::{TorchOptionError, TorchOptions};
pub use trace::{blocks_at_least, Edits, Factor, ParseFactorError, Trace, MAX_BLOCK_BYTES};
pub use whatif::{
    figures, fit, replay, Allocator, AllocatorPeak, CurvePoint, Figures, FirstToFill, FitAnswer,
    FitQuery, Replay, UNLIMITED,
};
