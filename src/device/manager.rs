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
    blocks: Blocks,
}

/// A reservation's blocks; most reservations name one device, and keep it inline.
#[derive(Debug, PartialEq, Eq)]
enum Blocks {
    One(ReservedBlock),
    Many(Vec<ReservedBlock>),
}

impl Blocks {
    fn as_slice(&self) -> &[ReservedBlock] {
        match self {
            Blocks::One(b) => std::slice::from_ref(b),
            Blocks::Many(v) => v,
        }
    }
}

impl Reservation {
    /// The blocks held, one per device, in ascending device order.
    pub fn blocks(&self) -> &[ReservedBlock] {
        self.blocks.as_slice()
    }

    /// Bytes held across devices, after rounding.
    pub fn reserved_bytes(&self) -> u64 {
        self.blocks().iter().map(|b| b.reserved).sum()
    }

    /// Bytes asked for across devices.
    pub fn requested_bytes(&self) -> u64 {
        self.blocks().iter().map(|b| b.requested).sum()
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
        if let [(device, bytes)] = *needs {
            return self.reserve_one(device, bytes);
        }
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
            blocks: Blocks::Many(blocks),
        })
    }

    /// [`PoolManager::reserve`] for a single device: one lock, and `alloc` (which changes
    /// nothing when it fails) stands in for the separate admission check.
    fn reserve_one(&self, device: DeviceId, bytes: u64) -> Result<Reservation, PoolError> {
        self.check_device(device)?;
        if bytes == 0 {
            return Err(PoolError::ZeroBytes { device });
        }
        let mut pool = self.pools[device.0 as usize].lock();
        let rounded = pool
            .round(bytes)
            .ok_or(PoolError::Overflow { device, bytes })?;
        let Some(offset) = pool.alloc(rounded, bytes) else {
            let shortfall = self.shortfall(device, bytes, rounded, &pool);
            pool.counters.failures += 1;
            return Err(AdmissionError {
                shortfalls: vec![shortfall],
            }
            .into());
        };
        let total = self.total_in_use.fetch_add(rounded, Ordering::Relaxed) + rounded;
        self.total_peak.fetch_max(total, Ordering::Relaxed);
        let observed = self.observe(std::iter::once((device, &*pool)));
        drop(pool);
        report(observed);
        let block = ReservedBlock {
            device,
            offset,
            requested: bytes,
            reserved: rounded,
        };
        Ok(Reservation {
            manager: self.id,
            blocks: Blocks::One(block),
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
        if let Blocks::One(block) = reservation.blocks {
            let mut pool = self.pools[block.device.0 as usize].lock();
            let freed =
                pool.free(block.offset, block.requested)
                    .ok_or(PoolError::UnknownBlock {
                        device: block.device,
                        offset: block.offset,
                    })?;
            self.total_in_use.fetch_sub(freed, Ordering::Relaxed);
            let observed = self.observe(std::iter::once((block.device, &*pool)));
            drop(pool);
            report(observed);
            return Ok(freed);
        }
        let mut held: Vec<(DeviceId, MutexGuard<'_, Pool>)> =
            Vec::with_capacity(reservation.blocks().len());
        for block in reservation.blocks() {
            held.push((block.device, self.pools[block.device.0 as usize].lock()));
        }
        let mut freed = 0u64;
        let mut missing = None;
        for (block, (_, pool)) in reservation.blocks().iter().zip(held.iter_mut()) {
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

    /// Snapshots of the touched pools, taken under their locks, if an observer is set or a
    /// session is recording (which receives them as pool events).
    fn observe<'a>(
        &self,
        touched: impl Iterator<Item = (DeviceId, &'a Pool)>,
    ) -> Option<(Option<Arc<PoolObserver>>, Vec<PoolSnapshot>)> {
        let observer = self.observer.read().clone();
        if observer.is_none() && !crate::capture::recording() {
            return None;
        }
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

/// Records each snapshot into a running session and calls the observer with it; the pools
/// are unlocked by now.
fn report(observed: Option<(Option<Arc<PoolObserver>>, Vec<PoolSnapshot>)>) {
    let Some((observer, snapshots)) = observed else {
        return;
    };
    for s in &snapshots {
        if crate::capture::recording() {
            crate::capture::record_pool_state(
                crate::capture::names::device(&s.name),
                s.capacity_bytes,
                s.reserved_bytes,
                s.largest_free_block,
                s.fragmentation,
            );
        }
        if let Some(observer) = &observer {
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::pool::Counters;

    const MIB: u64 = 1 << 20;

    /// Every pool's state with the failure counters zeroed: what a refused call must not change.
    fn state(m: &PoolManager) -> Vec<Pool> {
        m.pools
            .iter()
            .map(|p| {
                let mut pool = p.lock().clone();
                pool.counters = Counters {
                    failures: 0,
                    ..pool.counters
                };
                pool
            })
            .collect()
    }

    fn admission(err: PoolError) -> AdmissionError {
        match err {
            PoolError::Admission(a) => a,
            other => panic!("expected an admission error, got {other}"),
        }
    }

    #[test]
    fn refused_reservation_leaves_every_pool_identical() {
        for strategy in Strategy::ALL {
            let m = PoolManager::with_limit(64 * MIB, 3, strategy);
            // Some history so the pools are not trivially fresh.
            let a = m
                .reserve(&[(DeviceId(0), 5 * MIB), (DeviceId(1), 7 * MIB)])
                .unwrap();
            let b = m
                .reserve(&[(DeviceId(0), 3000), (DeviceId(2), 9 * MIB)])
                .unwrap();
            let _keep = m.reserve(&[(DeviceId(1), MIB)]).unwrap();
            m.release(a).unwrap();
            let before = state(&m);
            let stats_before: Vec<_> = (0..3).map(|d| m.stats(DeviceId(d)).unwrap()).collect();
            let err = m
                .reserve(&[
                    (DeviceId(0), MIB),
                    (DeviceId(1), 80 * MIB),
                    (DeviceId(2), 2 * MIB),
                ])
                .unwrap_err();
            assert_eq!(admission(err).shortfalls().len(), 1, "{strategy}");
            assert_eq!(state(&m), before, "{strategy}");
            // The single-device path, too.
            assert!(m.reserve(&[(DeviceId(2), 60 * MIB)]).is_err(), "{strategy}");
            assert_eq!(state(&m), before, "{strategy}");
            let stats_after: Vec<_> = (0..3).map(|d| m.stats(DeviceId(d)).unwrap()).collect();
            assert_eq!(stats_after[1].failures, stats_before[1].failures + 1);
            assert_eq!(stats_after[0], stats_before[0], "{strategy}");
            let mut before_2 = stats_before[2].clone();
            before_2.failures += 1;
            before_2.success_rate = stats_after[2].success_rate;
            assert_eq!(stats_after[2], before_2, "{strategy}");
            m.release(b).unwrap();
        }
    }

    #[test]
    fn capacity_error_names_every_failed_device_with_its_figures() {
        let m = PoolManager::with_kind_limit(DeviceKind::TpuV4, 8 * MIB, 3, Strategy::BestFit);
        let _held = m.reserve(&[(DeviceId(2), 3 * MIB)]).unwrap();
        let err = m
            .reserve(&[
                (DeviceId(0), 9 * MIB),
                (DeviceId(1), MIB),
                (DeviceId(2), 6 * MIB),
            ])
            .unwrap_err();
        let text = err.to_string();
        let a = admission(err);
        let failed: Vec<_> = a.shortfalls().iter().map(|s| s.device).collect();
        assert_eq!(failed, [DeviceId(0), DeviceId(2)]);
        let s = &a.shortfalls()[1];
        assert_eq!(s.name, "tpu:2");
        assert_eq!(
            (s.requested, s.rounded, s.capacity),
            (6 * MIB, 6 * MIB, 8 * MIB)
        );
        assert_eq!(
            (s.in_use, s.free, s.largest_free),
            (3 * MIB, 5 * MIB, 5 * MIB)
        );
        assert_eq!(s.cause, ShortfallCause::Capacity);
        assert!(!a.is_fragmentation());
        for needle in [
            "tpu:0",
            "tpu:2",
            "requested 6 MiB",
            "capacity 8 MiB",
            "in use 3 MiB",
        ] {
            assert!(text.contains(needle), "{needle:?} missing from {text}");
        }
        assert!(text.contains("free 5 MiB") && text.contains("largest free block 5 MiB"));
        assert!(!text.contains("tpu:1"), "{text}");
        assert!(!text.contains("fragmentation"), "{text}");
    }

    #[test]
    fn fragmentation_error_says_so_when_free_bytes_would_cover_the_request() {
        let m = PoolManager::with_limit(4 * MIB, 1, Strategy::BestFit);
        let blocks: Vec<_> = (0..4)
            .map(|_| m.reserve(&[(DeviceId(0), MIB)]).unwrap())
            .collect();
        let mut blocks = blocks.into_iter();
        let first = blocks.next().unwrap();
        let _second = blocks.next().unwrap();
        let third = blocks.next().unwrap();
        m.release(first).unwrap();
        m.release(third).unwrap();
        let s = m.stats(DeviceId(0)).unwrap();
        assert_eq!(
            (s.free_bytes, s.largest_free_block, s.free_blocks),
            (2 * MIB, MIB, 2)
        );
        assert_eq!(s.fragmentation, 0.5);
        let err = m.reserve(&[(DeviceId(0), 2 * MIB)]).unwrap_err();
        let text = err.to_string();
        let a = admission(err);
        assert!(a.is_fragmentation());
        assert_eq!(a.shortfalls()[0].cause, ShortfallCause::Fragmentation);
        assert!(
            text.contains("fragmentation") && text.contains("device:0"),
            "{text}"
        );
        assert_eq!(m.stats(DeviceId(0)).unwrap().failures, 1);
    }

    #[test]
    fn bad_inputs_are_errors_not_panics() {
        let m = PoolManager::with_limit(MIB, 2, Strategy::BuddySystem);
        assert!(matches!(m.reserve(&[]), Err(PoolError::EmptyRequest)));
        assert!(matches!(
            m.reserve_even(5, &[]),
            Err(PoolError::EmptyRequest)
        ));
        assert!(matches!(
            m.reserve(&[(DeviceId(0), 1), (DeviceId(1), 0)]),
            Err(PoolError::ZeroBytes {
                device: DeviceId(1)
            })
        ));
        assert!(matches!(
            m.reserve(&[(DeviceId(2), 1)]),
            Err(PoolError::UnknownDevice {
                device: DeviceId(2),
                devices: 2
            })
        ));
        assert!(matches!(
            m.reserve(&[(DeviceId(0), u64::MAX)]),
            Err(PoolError::Overflow { .. })
        ));
        assert!(matches!(
            m.reserve(&[
                (DeviceId(1), u64::MAX / 2 + 1),
                (DeviceId(1), u64::MAX / 2 + 1)
            ]),
            Err(PoolError::Overflow {
                device: DeviceId(1),
                ..
            })
        ));
        let best = PoolManager::with_limit(MIB, 1, Strategy::BestFit);
        assert!(matches!(
            best.reserve(&[(DeviceId(0), u64::MAX - 10)]),
            Err(PoolError::Overflow { .. })
        ));
        assert!(matches!(
            best.stats(DeviceId(1)),
            Err(PoolError::UnknownDevice { .. })
        ));
        assert!(matches!(
            best.snapshot(DeviceId(9)),
            Err(PoolError::UnknownDevice { .. })
        ));
        // A request larger than the pool is a capacity refusal, not an overflow.
        assert!(matches!(
            best.reserve(&[(DeviceId(0), u64::MAX - 300)]),
            Err(PoolError::Admission(_))
        ));
        let empty = PoolManager::with_limit(0, 1, Strategy::FirstFit);
        assert!(matches!(
            empty.reserve(&[(DeviceId(0), 1)]),
            Err(PoolError::Admission(_))
        ));
        assert_eq!(m.total_stats().in_use_bytes, 0);
    }

    #[test]
    fn duplicate_devices_are_summed_into_one_block() {
        let m = PoolManager::with_limit(MIB, 2, Strategy::BestFit);
        let r = m
            .reserve(&[(DeviceId(1), 1000), (DeviceId(0), 10), (DeviceId(1), 24)])
            .unwrap();
        let got: Vec<_> = r
            .blocks()
            .iter()
            .map(|b| (b.device, b.requested, b.reserved))
            .collect();
        assert_eq!(got, [(DeviceId(0), 10, 256), (DeviceId(1), 1024, 1024)]);
        assert_eq!(m.release(r).unwrap(), 1280);
    }

    #[test]
    fn even_split_gives_the_remainder_to_the_last_device_and_skips_zero_shares() {
        let m = PoolManager::with_limit(MIB, 4, Strategy::BestFit);
        let r = m
            .reserve_even(10, &[DeviceId(0), DeviceId(1), DeviceId(2), DeviceId(3)])
            .unwrap();
        let got: Vec<_> = r.blocks().iter().map(|b| (b.device, b.requested)).collect();
        assert_eq!(
            got,
            [
                (DeviceId(0), 2),
                (DeviceId(1), 2),
                (DeviceId(2), 2),
                (DeviceId(3), 4)
            ]
        );
        m.release(r).unwrap();
        let r = m
            .reserve_even(3, &[DeviceId(0), DeviceId(1), DeviceId(2), DeviceId(3)])
            .unwrap();
        let got: Vec<_> = r.blocks().iter().map(|b| (b.device, b.requested)).collect();
        assert_eq!(got, [(DeviceId(3), 3)]);
        m.release(r).unwrap();
        assert!(matches!(
            m.reserve_even(0, &[DeviceId(0)]),
            Err(PoolError::ZeroBytes { .. })
        ));
    }

    #[test]
    fn stats_track_peak_requests_and_success_rate_and_reset_peak_rebases() {
        let m = PoolManager::with_limit(8 * MIB, 2, Strategy::FirstFit);
        let a = m
            .reserve(&[(DeviceId(0), 3 * MIB), (DeviceId(1), 100)])
            .unwrap();
        let b = m.reserve(&[(DeviceId(0), 2 * MIB)]).unwrap();
        assert!(m.reserve(&[(DeviceId(0), 4 * MIB)]).is_err());
        m.release(b).unwrap();
        let s = m.stats(DeviceId(0)).unwrap();
        assert_eq!(
            (s.in_use_bytes, s.peak_bytes, s.reservations, s.failures),
            (3 * MIB, 5 * MIB, 2, 1)
        );
        assert!((s.success_rate - 2.0 / 3.0).abs() < 1e-12);
        let s1 = m.stats(DeviceId(1)).unwrap();
        assert_eq!((s1.in_use_bytes, s1.requested_bytes), (256, 100));
        let t = m.total_stats();
        assert_eq!(
            (t.capacity_bytes, t.in_use_bytes, t.peak_bytes),
            (16 * MIB, 3 * MIB + 256, 5 * MIB + 256)
        );
        assert_eq!(
            (t.reservations, t.failures, t.requested_bytes),
            (3, 1, 3 * MIB + 100)
        );
        assert_eq!(t.largest_free_block, 8 * MIB - 256);
        m.reset_peak();
        assert_eq!(m.stats(DeviceId(0)).unwrap().peak_bytes, 3 * MIB);
        assert_eq!(m.total_stats().peak_bytes, 3 * MIB + 256);
        m.release(a).unwrap();
        assert_eq!(m.total_stats().in_use_bytes, 0);
        assert_eq!(m.total_stats().fragmentation, 0.0);
    }

    #[test]
    fn observer_sees_each_touched_device_after_reserve_and_release() {
        let m = PoolManager::new(DeviceKind::A100_80GB, 3, Strategy::BestFit);
        let seen = Arc::new(Mutex::new(Vec::new()));
        let sink = Arc::clone(&seen);
        m.set_observer(Box::new(move |s: &PoolSnapshot| {
            sink.lock().push((s.name.clone(), s.reserved_bytes));
        }));
        let r = m
            .reserve(&[(DeviceId(2), MIB), (DeviceId(0), 2 * MIB)])
            .unwrap();
        assert!(m.reserve(&[(DeviceId(1), 1 << 40)]).is_err());
        m.release(r).unwrap();
        m.clear_observer();
        let _r = m.reserve(&[(DeviceId(1), MIB)]).unwrap();
        let seen = seen.lock().clone();
        let want = [
            ("cuda:0", 2 * MIB),
            ("cuda:2", MIB),
            ("cuda:0", 0),
            ("cuda:2", 0),
        ];
        let want: Vec<_> = want.iter().map(|&(n, b)| (n.to_string(), b)).collect();
        assert_eq!(seen, want);
    }

    #[test]
    fn observer_may_call_back_into_the_manager() {
        let m = Arc::new(PoolManager::with_limit(MIB, 1, Strategy::BestFit));
        let inner = Arc::downgrade(&m);
        let frags = Arc::new(Mutex::new(Vec::new()));
        let sink = Arc::clone(&frags);
        m.set_observer(Box::new(move |s: &PoolSnapshot| {
            if let Some(m) = inner.upgrade() {
                sink.lock()
                    .push(m.stats(s.device).map(|st| st.in_use_bytes).ok());
            }
        }));
        let r = m.reserve(&[(DeviceId(0), 512)]).unwrap();
        m.release(r).unwrap();
        assert_eq!(*frags.lock(), [Some(512), Some(0)]);
    }

    #[test]
    fn releasing_into_another_manager_hands_the_reservation_back() {
        let a = PoolManager::with_limit(MIB, 1, Strategy::BestFit);
        let b = PoolManager::with_limit(MIB, 1, Strategy::BestFit);
        let r = a.reserve(&[(DeviceId(0), 4096)]).unwrap();
        let err = b.release(r).unwrap_err();
        assert!(
            err.to_string().contains("released into pool manager"),
            "{err}"
        );
        let PoolError::WrongManager { reservation, .. } = err else {
            panic!("{err}")
        };
        assert_eq!(b.total_stats().in_use_bytes, 0);
        assert_eq!(a.release(reservation).unwrap(), 4096);
    }

    #[test]
    fn manager_is_send_and_sync() {
        fn check<T: Send + Sync>() {}
        check::<PoolManager>();
        check::<Reservation>();
        check::<PoolError>();
    }
}
