//! Statistics and snapshots of the pools.

use parking_lot::MutexGuard;

use super::Device;
use super::PoolManager;
use crate::device::DeviceIndex;
use crate::device::PoolError;

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
    /// In totals ([`PoolManager::total_stats`]): a sum exceeded `u64::MAX` and is shown as
    /// `u64::MAX`. Always false for one device.
    pub saturated: bool,
}

/// A device pool's state, as reported to a session.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct PoolSnapshot {
    /// The device.
    pub device: DeviceIndex,
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
    /// Usage statistics of one device's pool.
    ///
    /// # Errors
    ///
    /// [`PoolError::UnknownDevice`].
    pub fn stats(&self, device: DeviceIndex) -> Result<PoolStats, PoolError> {
        self.check_device(device)?;
        Ok(stats_of(&self.pools[device.0 as usize].lock()))
    }

    /// Statistics summed over devices (largest free block: the largest of any device; peak: the
    /// highest total ever reserved at once, not the sum of device peaks).
    ///
    /// Sums are taken in `u128`; a total above `u64::MAX` is reported as `u64::MAX` with
    /// [`PoolStats::saturated`] set, never wrapped.
    pub fn total_stats(&self) -> PoolStats {
        #[derive(Default)]
        struct Sums {
            capacity: u128,
            in_use: u128,
            requested: u128,
            free: u128,
            largest: u64,
            sum_largest: u128,
            free_blocks: u128,
            reservations: u128,
            failures: u128,
        }
        let mut sums = Sums::default();
        for pool in &self.pools {
            let s = stats_of(&pool.lock());
            sums.capacity += u128::from(s.capacity_bytes);
            sums.in_use += u128::from(s.in_use_bytes);
            sums.requested += u128::from(s.requested_bytes);
            sums.free += u128::from(s.free_bytes);
            sums.largest = sums.largest.max(s.largest_free_block);
            sums.sum_largest += u128::from(s.largest_free_block);
            sums.free_blocks += u128::from(s.free_blocks);
            sums.reservations += u128::from(s.reservations);
            sums.failures += u128::from(s.failures);
        }
        let peak = self.totals.lock().peak.max(sums.in_use);
        let mut saturated = false;
        let mut clamp = |v: u128| {
            u64::try_from(v).unwrap_or_else(|_| {
                saturated = true;
                u64::MAX
            })
        };
        let mut t = PoolStats {
            capacity_bytes: clamp(sums.capacity),
            in_use_bytes: clamp(sums.in_use),
            requested_bytes: clamp(sums.requested),
            peak_bytes: clamp(peak),
            free_bytes: clamp(sums.free),
            largest_free_block: sums.largest,
            free_blocks: clamp(sums.free_blocks),
            fragmentation: 0.0,
            reservations: clamp(sums.reservations),
            failures: clamp(sums.failures),
            success_rate: 1.0,
            saturated: false,
        };
        t.saturated = saturated;
        t.fragmentation = if sums.free == 0 {
            0.0
        } else {
            1.0 - sums.sum_largest as f64 / sums.free as f64
        };
        t.success_rate = success_rate(t.reservations, t.failures);
        t
    }

    /// Rebases every peak (per device and total) to the bytes reserved now.
    pub fn reset_peak(&self) {
        let held: Vec<MutexGuard<'_, Device>> = self.pools.iter().map(|p| p.lock()).collect();
        let mut total = 0u128;
        for mut pool in held {
            pool.reset_peak();
            total += u128::from(pool.counters().in_use);
        }
        self.totals.lock().peak = total;
    }

    /// The device pool's current state, named for a session's device events.
    ///
    /// # Errors
    ///
    /// [`PoolError::UnknownDevice`].
    pub fn snapshot(&self, device: DeviceIndex) -> Result<PoolSnapshot, PoolError> {
        self.check_device(device)?;
        Ok(self.snapshot_of(device, &self.pools[device.0 as usize].lock()))
    }
}

fn stats_of(pool: &Device) -> PoolStats {
    let c = pool.counters();
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
        failures: pool.refusals,
        success_rate: success_rate(c.reservations, pool.refusals),
        saturated: false,
    }
}

fn success_rate(ok: u64, failed: u64) -> f64 {
    if ok == 0 && failed == 0 {
        1.0
    } else {
        ok as f64 / (ok as f64 + failed as f64)
    }
}
