//! The pool manager: one pool per device and all-or-nothing admission across them.
//!
//! - [`builder`](self::builder): how a manager is made ([`PoolManagerBuilder`]);
//! - `reserve`: reservations — reserve, split evenly, release;
//! - `stats`: statistics and snapshots of the pools;
//! - `observer`: who hears about changes — the user's observer and the session's sink.

mod builder;
mod observer;
mod reserve;
mod stats;
#[cfg(test)]
mod tests;

use std::fmt;
use std::sync::atomic::AtomicU64;
use std::sync::Arc;

use parking_lot::{Mutex, RwLock};

use super::error::{PoolError, Shortfall};
use super::ShortfallCause;
use super::{DeviceIndex, DeviceKind, Strategy};
use highwater_device::Pool;

pub use builder::PoolManagerBuilder;
pub use observer::PoolObserver;
pub(crate) use observer::{clear_pool_sink, set_pool_sink, set_refusal_sink};
pub use reserve::{Reservation, ReservedBlock};
pub use stats::{PoolSnapshot, PoolStats};

/// One device's pool, and the admissions refused on it: a manager's figure, since the pool
/// only knows what it placed.
#[derive(Debug, Clone, PartialEq)]
struct Device {
    pool: Pool,
    refusals: u64,
}

impl std::ops::Deref for Device {
    type Target = Pool;

    fn deref(&self) -> &Pool {
        &self.pool
    }
}

impl std::ops::DerefMut for Device {
    fn deref_mut(&mut self) -> &mut Pool {
        &mut self.pool
    }
}

/// Source of manager ids, so a reservation can tell which manager made it.
static NEXT_MANAGER_ID: AtomicU64 = AtomicU64::new(1);

/// Device memory pools, one per device, with all-or-nothing admission.
///
/// Each device has its own lock; a call locks the devices it touches in ascending order, so
/// calls on disjoint devices run in parallel and no two calls deadlock. The manager is `Sync`:
/// share it with an `Arc` or a reference.
///
/// # Examples
///
/// ```
/// use highwater::device::{DeviceIndex, DeviceKind, PoolManager, Strategy};
///
/// let pools = PoolManager::builder() // 2 × 32 GiB
///     .kind(DeviceKind::TpuV4)
///     .devices(2)
///     .strategy(Strategy::BestFit)
///     .build();
/// let r = pools.reserve(&[(DeviceIndex(0), 1 << 30), (DeviceIndex(1), 1 << 30)])?;
/// assert_eq!(pools.stats(DeviceIndex(1))?.in_use_bytes, 1 << 30);
/// let freed = pools.release(r)?;
/// assert_eq!(freed, 2 << 30);
/// assert_eq!(pools.stats(DeviceIndex(0))?.peak_bytes, 1 << 30);
/// # Ok::<(), highwater::device::PoolError>(())
/// ```
pub struct PoolManager {
    /// Unique per manager in this process; stamped on every reservation.
    id: u64,
    /// Names devices (`tpu:0`); `None` for pools sized only by a limit (`device:0`).
    kind: Option<DeviceKind>,
    strategy: Strategy,
    /// Pool of device `i` at index `i`. Lock in ascending index order only.
    pools: Vec<Mutex<Device>>,
    /// Bytes reserved over every pool and their peak, in `u128` so they cannot wrap; changed
    /// while the touched pools are locked.
    totals: Mutex<Totals>,
    observer: RwLock<Option<Arc<PoolObserver>>>,
}

impl fmt::Debug for PoolManager {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PoolManager")
            .field("id", &self.id)
            .field("kind", &self.kind)
            .field("strategy", &self.strategy)
            .field("devices", &self.pools.len())
            .field("total_in_use", &self.totals.lock().in_use)
            .field("observer", &self.observer.read().is_some())
            .finish()
    }
}

/// Bytes reserved across every pool, and the highest that total has been.
#[derive(Debug, Default, Clone, Copy)]
struct Totals {
    in_use: u128,
    peak: u128,
}

impl Totals {
    fn add(&mut self, bytes: u128) {
        self.in_use += bytes;
        self.peak = self.peak.max(self.in_use);
    }

    fn sub(&mut self, bytes: u128) {
        self.in_use = self.in_use.saturating_sub(bytes);
    }
}

impl PoolManager {
    /// A builder: device kind or byte limit, number of devices, strategy.
    ///
    /// # Examples
    ///
    /// ```
    /// use highwater::device::{DeviceIndex, DeviceKind, PoolManager, Strategy};
    /// let pools = PoolManager::builder().kind(DeviceKind::H100).devices(8).build();
    /// assert_eq!(pools.snapshot(DeviceIndex(7))?.name, "cuda:7");
    /// assert_eq!(pools.strategy(), Strategy::BestFit);
    /// let small = PoolManager::builder().limit(30 << 30).devices(2).build();
    /// assert_eq!(small.stats(DeviceIndex(1))?.capacity_bytes, 30 << 30);
    /// # Ok::<(), highwater::device::PoolError>(())
    /// ```
    pub fn builder() -> PoolManagerBuilder {
        PoolManagerBuilder::new()
    }

    fn from_parts(kind: Option<DeviceKind>, bytes: u64, devices: u32, strategy: Strategy) -> Self {
        Self {
            id: NEXT_MANAGER_ID.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
            kind,
            strategy,
            pools: (0..devices)
                .map(|_| {
                    Mutex::new(Device {
                        pool: Pool::new(bytes, strategy),
                        refusals: 0,
                    })
                })
                .collect(),
            totals: Mutex::new(Totals::default()),
            observer: RwLock::new(None),
        }
    }

    /// Number of devices.
    pub fn devices(&self) -> u32 {
        self.pools.len() as u32
    }

    /// The placement strategy of every pool.
    pub fn strategy(&self) -> Strategy {
        self.strategy
    }

    /// The device kind, if the manager was built from one.
    pub fn kind(&self) -> Option<DeviceKind> {
        self.kind
    }

    /// The device's name: `"tpu:0"`, `"cuda:1"`, or `"device:0"` without a kind.
    pub fn device_name(&self, device: DeviceIndex) -> String {
        match self.kind {
            Some(kind) => kind.device_name(device.0),
            None => format!("device:{}", device.0),
        }
    }

    pub(super) fn snapshot_of(&self, device: DeviceIndex, pool: &Pool) -> PoolSnapshot {
        PoolSnapshot {
            device,
            name: self.device_name(device),
            capacity_bytes: pool.capacity(),
            reserved_bytes: pool.counters().in_use,
            requested_bytes: pool.counters().requested,
            largest_free_block: pool.largest_free(),
            free_blocks: pool.free_blocks(),
            fragmentation: pool.fragmentation(),
        }
    }

    pub(super) fn shortfall(
        &self,
        device: DeviceIndex,
        requested: u64,
        rounded: u64,
        pool: &Pool,
    ) -> Shortfall {
        let free = pool.free_bytes();
        Shortfall {
            device,
            name: self.device_name(device),
            requested,
            rounded,
            capacity: pool.capacity(),
            in_use: pool.counters().in_use,
            free,
            largest_free: pool.largest_free(),
            cause: ShortfallCause::of(rounded, free),
        }
    }

    pub(super) fn check_device(&self, device: DeviceIndex) -> Result<(), PoolError> {
        if (device.0 as usize) < self.pools.len() {
            Ok(())
        } else {
            Err(PoolError::UnknownDevice {
                device,
                devices: self.devices(),
            })
        }
    }
}
