//! The pool manager: one pool per device and all-or-nothing admission across them.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use parking_lot::{Mutex, MutexGuard, RwLock};

use super::error::{AdmissionError, PoolError, Shortfall, ShortfallCause};
use super::pool::{fragmentation, Pool};
use super::{DeviceId, DeviceKind, Strategy};

/// Source of manager ids, so a reservation can tell which manager made it.
static NEXT_MANAGER_ID: AtomicU64 = AtomicU64::new(1);

/// A callback told about every touched device after each successful reserve or release.
pub type PoolObserver = dyn Fn(&PoolSnapshot) + Send + Sync;

/// Device memory pools, one per device, with all-or-nothing admission.
///
/// Each device has its own lock; a call locks the devices it touches in ascending order, so
/// calls on disjoint devices run in parallel and no two calls deadlock. The manager is `Sync`:
/// share it with an `Arc` or a reference.
///
/// # Examples
///
/// ```
/// use highwater::device::{DeviceId, DeviceKind, PoolManager, Strategy};
///
/// let pools = PoolManager::new(DeviceKind::TpuV4, 2, Strategy::BestFit); // 2 × 32 GiB
/// let r = pools.reserve(&[(DeviceId(0), 1 << 30), (DeviceId(1), 1 << 30)])?;
/// assert_eq!(pools.stats(DeviceId(1))?.in_use_bytes, 1 << 30);
/// let freed = pools.release(r)?;
/// assert_eq!(freed, 2 << 30);
/// assert_eq!(pools.stats(DeviceId(0))?.peak_bytes, 1 << 30);
/// # Ok::<(), highwater::device::PoolError>(())
/// ```
pub struct PoolManager {
    /// Unique per manager in this process; stamped on every reservation.
    id: u64,
    /// Names devices (`tpu:0`); `None` for pools sized only by a limit (`device:0`).
    kind: Option<DeviceKind>,
    strategy: Strategy,
    /// Pool of device `i` at index `i`. Lock in ascending index order only.
    pools: Vec<Mutex<Pool>>,
    /// Sum of every pool's reserved bytes; changed while the touched pools are locked.
    total_in_use: AtomicU64,
    /// Highest `total_in_use` since creation or the last [`PoolManager::reset_peak`].
    total_peak: AtomicU64,
    observer: RwLock<Option<Arc<PoolObserver>>>,
}

impl fmt::Debug for PoolManager {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PoolManager")
            .field("id", &self.id)
            .field("kind", &self.kind)
            .field("strategy", &self.strategy)
            .field("devices", &self.pools.len())
            .field("total_in_use", &self.total_in_use.load(Ordering::Relaxed))
            .field("observer", &self.observer.read().is_some())
            .finish()
    }
}

/// Device memory held by a successful [`PoolManager::reserve`], until passed to
/// [`PoolManager::release`].
///
/// It is neither `Clone` nor `Copy` and `release` consumes it, so it cannot be released twice.
/// Dropping it without releasing keeps its blocks reserved, like leaking an allocation.
#[must_use = "a reservation holds device memory until it is passed to PoolManager::release"]
#[derive(Debug, PartialEq, Eq)]
pub struct Reservation {
    manager: u64,
    /// One block per device, in ascending device order.
    blocks: Vec<ReservedBlock>,
}

impl Reservation {
    /// The blocks held, one per device, in ascending device order.
    pub fn blocks(&self) -> &[ReservedBlock] {
        &self.blocks
    }

    /// Bytes held across devices, after rounding.
    pub fn reserved_bytes(&self) -> u64 {
        self.blocks.iter().map(|b| b.reserved).sum()
    }

    /// Bytes asked for across devices.
    pub fn requested_bytes(&self) -> u64 {
        self.blocks.iter().map(|b| b.requested).sum()
    }

    pub(crate) fn manager_id(&self) -> u64 {
        self.manager
    }
}

/// One device's block within a [`Reservation`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct ReservedBlock {
    /// The device.
    pub device: DeviceId,
    /// Offset of the block in the device's pool.
    pub offset: u64,
    /// Bytes asked for (duplicates in one call summed).
    pub requested: u64,
    /// Bytes the block occupies after rounding.
    pub reserved: u64,
}

/// Usage statistics of one device's pool, or of all of them ([`PoolManager::total_stats`]).
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct PoolStats {
    /// Usable bytes (the device's memory or limit, rounded down to 256 bytes).
    pub capacity_bytes: u64,
    /// Bytes reserved, after rounding.
    pub in_use_bytes: u64,
    /// Bytes asked for by the live reservations, before rounding.
    pub requested_bytes: u64,
    /// Highest `in_use_bytes` since creation or [`PoolManager::reset_peak`].
    pub peak_bytes: u64,
    /// Free bytes.
    pub free_bytes: u64,
    /// Largest free block: the largest request that would fit now. In totals, the largest of
    /// any device.
    pub largest_free_block: u64,
    /// Number of free blocks (for the pool-based strategy, free slab slots count too).
    pub free_blocks: u64,
    /// `1 - largest free block / free bytes`, 0 when nothing is free. In totals,
    /// `1 - Σ largest / Σ free` over devices: each device's ratio weighted by its free bytes.
    pub fragmentation: f64,
    /// Successful device reservations (a call on three devices counts one on each).
    pub reservations: u64,
    /// Refused device reservations (only the devices that could not fit count).
    pub failures: u64,
    /// `reservations / (reservations + failures)`, 1 when there were none.
    pub success_rate: f64,
}

/// A device pool's state, as reported to a session.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct PoolSnapshot {
    /// The device.
    pub device: DeviceId,
    /// Its name: `"tpu:0"`, `"cuda:1"`, or `"device:0"` for a manager without a kind.
    pub name: String,
    /// Usable bytes.
    pub capacity_bytes: u64,
    /// Bytes reserved, after rounding.
    pub reserved_bytes: u64,
    /// Bytes asked for, before rounding.
    pub requested_bytes: u64,
    /// Largest free block.
    pub largest_free_block: u64,
    /// Number of free blocks.
    pub free_blocks: u64,
    /// `1 - largest free / free`, 0 when nothing is free.
    pub fragmentation: f64,
}

impl PoolManager {
    /// `devices` pools sized from `kind`'s memory (see [`DeviceKind`]'s table).
    ///
    /// # Examples
    ///
    /// ```
    /// use highwater::device::{DeviceId, DeviceKind, PoolManager, Strategy};
    /// let pools = PoolManager::new(DeviceKind::H100, 8, Strategy::BestFit);
    /// assert_eq!(pools.snapshot(DeviceId(7))?.name, "cuda:7");
    /// # Ok::<(), highwater::device::PoolError>(())
    /// ```
    pub fn new(kind: DeviceKind, devices: u32, strategy: Strategy) -> Self {
        Self::build(Some(kind), kind.capacity_bytes(), devices, strategy)
    }

    /// `devices` pools of `bytes` usable bytes each (rounded down to 256), named `device:N`.
    ///
    /// # Examples
    ///
    /// ```
    /// use highwater::device::{DeviceId, PoolManager, Strategy};
    /// let pools = PoolManager::with_limit(30 << 30, 2, Strategy::BestFit);
    /// assert_eq!(pools.stats(DeviceId(1))?.capacity_bytes, 30 << 30);
    /// # Ok::<(), highwater::device::PoolError>(())
    /// ```
    pub fn with_limit(bytes: u64, devices: u32, strategy: Strategy) -> Self {
        Self::build(None, bytes, devices, strategy)
    }

    /// `devices` pools of `kind`, named after it, but of `bytes` usable bytes each — the memory
    /// the runtime reports rather than the spec sheet's.
    pub fn with_kind_limit(kind: DeviceKind, bytes: u64, devices: u32, strategy: Strategy) -> Self {
        Self::build(Some(kind), bytes, devices, strategy)
    }

    fn build(kind: Option<DeviceKind>, bytes: u64, devices: u32, strategy: Strategy) -> Self {
        Self {
            id: NEXT_MANAGER_ID.fetch_add(1, Ordering::Relaxed),
            kind,
            strategy,
            pools: (0..devices)
                .map(|_| Mutex::new(Pool::new(bytes, strategy)))
                .collect(),
            total_in_use: AtomicU64::new(0),
            total_peak: AtomicU64::new(0),
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
    pub fn device_name(&self, device: DeviceId) -> String {
        match self.kind {
            Some(kind) => kind.device_name(device.0),
            None => format!("device:{}", device.0),
        }
    }

    /// Reserves `bytes` on each listed device, all or nothing.
    ///
    /// Each request is rounded up as the strategy documents ([`Strategy`]). A device listed more
    /// than once gets one block holding the sum of its requests. Either every device gets its
    /// block, or none does and every pool is left exactly as it was (only the failure counters
    /// of the devices that could not fit move).
    ///
    /// # Errors
    ///
    /// [`PoolError::EmptyRequest`] for an empty list, [`PoolError::UnknownDevice`],
    /// [`PoolError::ZeroBytes`] for a zero entry, [`PoolError::Overflow`] when summing or
    /// rounding overflows, and [`PoolError::Admission`] naming every device that cannot fit.
    ///
    /// # Examples
    ///
    /// ```
    /// use highwater::device::{DeviceId, PoolManager, Strategy};
    /// let pools = PoolManager::with_limit(1 << 30, 2, Strategy::BestFit);
    /// let r = pools.reserve(&[(DeviceId(0), 1000), (DeviceId(1), 300 << 20)])?;
    /// assert_eq!(r.reserved_bytes(), 1024 + (300 << 20)); // rounded to 256 bytes
    /// assert!(pools.reserve(&[(DeviceId(0), 1 << 20), (DeviceId(1), 800 << 20)]).is_err());
    /// assert_eq!(pools.stats(DeviceId(0))?.in_use_bytes, 1024); // the failed call left nothing
    /// # pools.release(r)?;
    /// # Ok::<(), highwater::device::PoolError>(())
    /// ```
    pub fn reserve(&self, needs: &[(DeviceId, u64)]) -> Result<Reservation, PoolError> {
        if needs.is_empty() {
            return Err(PoolError::EmptyRequest);
        }
        for &(device, bytes) in needs {
            self.check_device(device)?;
            if bytes == 0 {
                return Err(PoolError::ZeroBytes { device });
            }
        }
        // One entry per device, in ascending device order: the lock order every call follows.
        let mut wanted: Vec<(DeviceId, u64)> = needs.to_vec();
        wanted.sort_by_key(|&(device, _)| device);
        let mut overflow = None;
        wanted.dedup_by(|later, kept| {
            if later.0 != kept.0 {
                return false;
            }
            match kept.1.checked_add(later.1) {
                Some(sum) => kept.1 = sum,
                None => {
                    overflow = Some(PoolError::Overflow {
                        device: kept.0,
                        bytes: kept.1,
                    })
                }
            }
            true
        });
        if let Some(e) = overflow {
            return Err(e);
        }
        let mut held: Vec<(DeviceId, u64, u64, MutexGuard<'_, Pool>)> =
            Vec::with_capacity(wanted.len());
        for (device, bytes) in wanted {
            let pool = self.pools[device.0 as usize].lock();
            let rounded = pool
                .round(bytes)
                .ok_or(PoolError::Overflow { device, bytes })?;
            held.push((device, bytes, rounded, pool));
        }

        let mut shortfalls = Vec::new();
        for (device, bytes, rounded, pool) in &mut held {
            if !pool.fits(*rounded) {
                shortfalls.push(self.shortfall(*device, *bytes, *rounded, pool));
                pool.counters.failures += 1;
            }
        }
        if !shortfalls.is_empty() {
            return Err(AdmissionError { shortfalls }.into());
        }

        let mut blocks = Vec::with_capacity(held.len());
        for i in 0..held.len() {
            let (device, bytes, rounded, pool) = &mut held[i];
            match pool.alloc(*rounded, *bytes) {
                Some(offset) => blocks.push(ReservedBlock {
                    device: *device,
                    offset,
                    requested: *bytes,
                    reserved: *rounded,
                }),
                None => {
                    // `fits` said yes, so this is a bug; still leave the pools consistent.
                    let shortfall = self.shortfall(*device, *bytes, *rounded, pool);
                    pool.counters.failures += 1;
                    for (block, (_, _, _, pool)) in blocks.iter().zip(held.iter_mut()) {
                        pool.free(block.offset, block.requested);
                        pool.counters.reservations -= 1;
                    }
                    return Err(AdmissionError {
                        shortfalls: vec![shortfall],
                    }
                    .into());
                }
            }
        }
        let added: u64 = blocks.iter().map(|b| b.reserved).sum();
        let total = self.total_in_use.fetch_add(added, Ordering::Relaxed) + added;
        self.total_peak.fetch_max(total, Ordering::Relaxed);
        let observed = self.observe(held.iter().map(|(device, _, _, pool)| (*device, &**pool)));
        drop(held);
        report(observed);
        Ok(Reservation {
            manager: self.id,
            blocks,
        })
    }

    /// Reserves `total` bytes split evenly over `devices`, the last device taking the remainder.
    ///
    /// Devices whose share is zero (fewer bytes than devices) are left out.
    ///
    /// # Errors
    ///
    /// As [`PoolManager::reserve`]; [`PoolError::ZeroBytes`] when `total` is 0.
    ///
    /// # Examples
    ///
    /// ```
    /// use highwater::device::{DeviceId, PoolManager, Strategy};
    /// let pools = PoolManager::with_limit(1 << 30, 3, Strategy::BestFit);
    /// let r = pools.reserve_even(3 * 1024 + 2, &[DeviceId(0), DeviceId(1), DeviceId(2)])?;
    /// let asked: Vec<u64> = r.blocks().iter().map(|b| b.requested).collect();
    /// assert_eq!(asked, [1024, 1024, 1026]);
    /// # pools.release(r)?;
    /// # Ok::<(), highwater::device::PoolError>(())
    /// ```
    pub fn reserve_even(&self, total: u64, devices: &[DeviceId]) -> Result<Reservation, PoolError> {
        let (&last, _) = devices.split_last().ok_or(PoolError::EmptyRequest)?;
        if total == 0 {
            return Err(PoolError::ZeroBytes { device: last });
        }
        let n = devices.len() as u64;
        let (share, remainder) = (total / n, total % n);
        let needs: Vec<(DeviceId, u64)> = devices
            .iter()
            .enumerate()
            .map(|(i, &d)| {
                (
                    d,
                    if i + 1 == devices.len() {
                        share + remainder
                    } else {
                        share
                    },
                )
            })
            .filter(|&(_, bytes)| bytes > 0)
            .collect();
        self.reserve(&needs)
    }

    /// Returns a reservation's blocks to their pools and the bytes they held.
    ///
    /// # Errors
    ///
    /// [`PoolError::WrongManager`] (with the reservation handed back) if another manager made it.
    ///
    /// # Examples
    ///
    /// ```
    /// use highwater::device::{DeviceId, PoolError, PoolManager, Strategy};
    /// let a = PoolManager::with_limit(1 << 20, 1, Strategy::BestFit);
    /// let b = PoolManager::with_limit(1 << 20, 1, Strategy::BestFit);
    /// let r = a.reserve(&[(DeviceId(0), 4096)])?;
    /// let Err(PoolError::WrongManager { reservation, .. }) = b.release(r) else { panic!() };
    /// assert_eq!(a.release(reservation)?, 4096);
    /// # Ok::<(), PoolError>(())
    /// ```
    pub fn release(&self, reservation: Reservation) -> Result<u64, PoolError> {
        if reservation.manager != self.id {
            return Err(PoolError::WrongManager {
                manager: self.id,
                reservation,
            });
        }
        let mut held: Vec<(DeviceId, MutexGuard<'_, Pool>)> =
            Vec::with_capacity(reservation.blocks.len());
        for block in &reservation.blocks {
            held.push((block.device, self.pools[block.device.0 as usize].lock()));
        }
        let mut freed = 0u64;
        let mut missing = None;
        for (block, (_, pool)) in reservation.blocks.iter().zip(held.iter_mut()) {
            match pool.free(block.offset, block.requested) {
                Some(size) => freed += size,
                None => missing = Some((block.device, block.offset)),
            }
        }
        self.total_in_use.fetch_sub(freed, Ordering::Relaxed);
        if let Some((device, offset)) = missing {
            return Err(PoolError::UnknownBlock { device, offset });
        }
        let observed = self.observe(held.iter().map(|(device, pool)| (*device, &**pool)));
        drop(held);
        report(observed);
        Ok(freed)
    }

    /// Usage statistics of one device's pool.
    ///
    /// # Errors
    ///
    /// [`PoolError::UnknownDevice`].
    pub fn stats(&self, device: DeviceId) -> Result<PoolStats, PoolError> {
        self.check_device(device)?;
        Ok(stats_of(&self.pools[device.0 as usize].lock()))
    }

    /// Statistics summed over devices (largest free block: the largest of any device; peak: the
    /// highest total ever reserved at once, not the sum of device peaks).
    pub fn total_stats(&self) -> PoolStats {
        let mut t = PoolStats {
            capacity_bytes: 0,
            in_use_bytes: 0,
            requested_bytes: 0,
            peak_bytes: 0,
            free_bytes: 0,
            largest_free_block: 0,
            free_blocks: 0,
            fragmentation: 0.0,
            reservations: 0,
            failures: 0,
            success_rate: 1.0,
        };
        let mut sum_largest = 0u64;
        for pool in &self.pools {
            let s = stats_of(&pool.lock());
            t.capacity_bytes += s.capacity_bytes;
            t.in_use_bytes += s.in_use_bytes;
            t.requested_bytes += s.requested_bytes;
            t.free_bytes += s.free_bytes;
            t.largest_free_block = t.largest_free_block.max(s.largest_free_block);
            sum_largest += s.largest_free_block;
            t.free_blocks += s.free_blocks;
            t.reservations += s.reservations;
            t.failures += s.failures;
        }
        t.peak_bytes = self.total_peak.load(Ordering::Relaxed).max(t.in_use_bytes);
        t.fragmentation = fragmentation(sum_largest, t.free_bytes);
        t.success_rate = success_rate(t.reservations, t.failures);
        t
    }

    /// Rebases every peak (per device and total) to the bytes reserved now.
    pub fn reset_peak(&self) {
        let held: Vec<MutexGuard<'_, Pool>> = self.pools.iter().map(|p| p.lock()).collect();
        let mut total = 0;
        for mut pool in held {
            pool.counters.peak = pool.counters.in_use;
            total += pool.counters.in_use;
        }
        self.total_peak.store(total, Ordering::Relaxed);
    }

    /// The device pool's current state, named for a session's device events.
    ///
    /// # Errors
    ///
    /// [`PoolError::UnknownDevice`].
    pub fn snapshot(&self, device: DeviceId) -> Result<PoolSnapshot, PoolError> {
        self.check_device(device)?;
        Ok(self.snapshot_of(device, &self.pools[device.0 as usize].lock()))
    }

    /// Calls `observer` after every successful reserve or release, once per touched device,
    /// with its snapshot taken inside the call. Replaces any previous observer.
    ///
    /// The observer runs after the pools are unlocked, on the calling thread; it may call back
    /// into the manager. Concurrent calls may report in a different order than they happened.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::sync::{Arc, Mutex};
    /// use highwater::device::{DeviceId, DeviceKind, PoolManager, Strategy};
    /// let pools = PoolManager::new(DeviceKind::TpuV3, 1, Strategy::BestFit);
    /// let seen = Arc::new(Mutex::new(Vec::new()));
    /// let sink = Arc::clone(&seen);
    /// pools.set_observer(Box::new(move |s| sink.lock().unwrap().push((s.name.clone(), s.reserved_bytes))));
    /// let r = pools.reserve(&[(DeviceId(0), 1 << 20)])?;
    /// pools.release(r)?;
    /// assert_eq!(*seen.lock().unwrap(), [("tpu:0".to_string(), 1 << 20), ("tpu:0".to_string(), 0)]);
    /// # Ok::<(), highwater::device::PoolError>(())
    /// ```
    pub fn set_observer(&self, observer: Box<PoolObserver>) {
        *self.observer.write() = Some(Arc::from(observer));
    }

    /// Removes the observer.
    pub fn clear_observer(&self) {
        *self.observer.write() = None;
    }

    /// Snapshots of the touched pools, taken under their locks, if an observer is set.
    fn observe<'a>(
        &self,
        touched: impl Iterator<Item = (DeviceId, &'a Pool)>,
    ) -> Option<(Arc<PoolObserver>, Vec<PoolSnapshot>)> {
        let observer = self.observer.read().clone()?;
        Some((
            observer,
            touched.map(|(d, pool)| self.snapshot_of(d, pool)).collect(),
        ))
    }

    fn snapshot_of(&self, device: DeviceId, pool: &Pool) -> PoolSnapshot {
        PoolSnapshot {
            device,
            name: self.device_name(device),
            capacity_bytes: pool.capacity(),
            reserved_bytes: pool.counters.in_use,
            requested_bytes: pool.counters.requested,
            largest_free_block: pool.largest_free(),
            free_blocks: pool.free_blocks(),
            fragmentation: pool.fragmentation(),
        }
    }

    fn shortfall(&self, device: DeviceId, requested: u64, rounded: u64, pool: &Pool) -> Shortfall {
        let free = pool.free_bytes();
        Shortfall {
            device,
            name: self.device_name(device),
            requested,
            rounded,
            capacity: pool.capacity(),
            in_use: pool.counters.in_use,
            free,
            largest_free: pool.largest_free(),
            cause: ShortfallCause::of(rounded, free),
        }
    }

    fn check_device(&self, device: DeviceId) -> Result<(), PoolError> {
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

/// Calls the observer with each snapshot; the pools are unlocked by now.
fn report(observed: Option<(Arc<PoolObserver>, Vec<PoolSnapshot>)>) {
    if let Some((observer, snapshots)) = observed {
        for s in &snapshots {
            observer(s);
        }
    }
}

fn stats_of(pool: &Pool) -> PoolStats {
    let c = pool.counters;
    PoolStats {
        capacity_bytes: pool.capacity(),
        in_use_bytes: c.in_use,
        requested_bytes: c.requested,
        peak_bytes: c.peak,
        free_bytes: pool.free_bytes(),
        largest_free_block: pool.largest_free(),
        free_blocks: pool.free_blocks(),
        fragmentation: pool.fragmentation(),
        reservations: c.reservations,
        failures: c.failures,
        success_rate: success_rate(c.reservations, c.failures),
    }
}

fn success_rate(ok: u64, failed: u64) -> f64 {
    if ok + failed == 0 {
        1.0
    } else {
        ok as f64 / (ok + failed) as f64
    }
}
