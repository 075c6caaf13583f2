//! Device memory pools with all-or-nothing admission.
//!
//! An accelerator's memory (a TPU core's HBM, a GPU's) is one address range that a runtime
//! hands out in blocks. A [`PoolManager`] keeps one pool per device in bookkeeping only — no
//! device memory is touched — so a training binary can ask "would these tensors fit on these
//! devices?" before it commits, and a profile can show how full and how fragmented each device
//! got. While a session records, every reservation and release reaches its profile as the
//! device's pool state, and a refused admission is checkpointed with what was live.
//!
//! - [`PoolManager`]: pools for `n` devices of a [`DeviceKind`] or an explicit byte limit;
//!   [`PoolManager::reserve`] is all-or-nothing across devices and returns a [`Reservation`]
//!   that [`PoolManager::release`] consumes.
//! - [`Strategy`]: first, best and worst fit, buddy system, size-class pools, adaptive.
//! - [`PoolError`] / [`AdmissionError`]: a refusal names every device that could not fit, with
//!   its figures and whether the cause was capacity or fragmentation.
//!
//! The pools themselves, and the replay of a recorded run through them and through emulations
//! of other allocators, are the `highwater-device` crate's.
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

mod error;
mod manager;

pub use error::{AdmissionError, PoolError, Shortfall};
pub use highwater_device::{DeviceIndex, DeviceKind, ParseNameError, ShortfallCause, Strategy};
pub(crate) use manager::{clear_pool_sink, set_pool_sink, set_refusal_sink};
pub use manager::{
    PoolManager, PoolManagerBuilder, PoolObserver, PoolSnapshot, PoolStats, Reservation,
    ReservedBlock,
};
