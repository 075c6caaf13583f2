//! Reservations: reserve on several devices all or nothing, split evenly, release.

use std::panic::{catch_unwind, resume_unwind, AssertUnwindSafe};
use std::sync::Arc;

use parking_lot::MutexGuard;

use super::observer::{report, report_refusal};
use super::Device;
use super::{PoolManager, PoolObserver, PoolSnapshot};
use crate::device::DeviceIndex;
use crate::device::{AdmissionError, PoolError};

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

    /// Bytes held across devices, after rounding (a `u128`, so the sum cannot wrap).
    pub fn reserved_bytes(&self) -> u128 {
        self.blocks().iter().map(|b| u128::from(b.reserved)).sum()
    }

    /// Bytes asked for across devices (a `u128`, so the sum cannot wrap).
    pub fn requested_bytes(&self) -> u128 {
        self.blocks().iter().map(|b| u128::from(b.requested)).sum()
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
    pub device: DeviceIndex,
    /// Offset of the block in the device's pool.
    pub offset: u64,
    /// Bytes asked for (duplicates in one call summed).
    pub requested: u64,
    /// Bytes the block occupies after rounding.
    pub reserved: u64,
}

impl PoolManager {
    /// Reserves `bytes` on each listed device, all or nothing.
    ///
    /// Each request is rounded up as the strategy documents ([`Strategy`](crate::device::Strategy)). A device listed more
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
    /// # Panics
    ///
    /// When the [observer](PoolManager::set_observer) panics, the reservation is released (its
    /// blocks are not lost with the panic) and the panic goes on.
    ///
    /// # Examples
    ///
    /// ```
    /// use highwater::device::{DeviceIndex, PoolManager, Strategy};
    /// let pools = PoolManager::builder().limit(1 << 30).devices(2).strategy(Strategy::BestFit).build();
    /// let r = pools.reserve(&[(DeviceIndex(0), 1000), (DeviceIndex(1), 300 << 20)])?;
    /// assert_eq!(r.reserved_bytes(), 1024 + (300 << 20)); // rounded to 256 bytes
    /// assert!(pools.reserve(&[(DeviceIndex(0), 1 << 20), (DeviceIndex(1), 800 << 20)]).is_err());
    /// assert_eq!(pools.stats(DeviceIndex(0))?.in_use_bytes, 1024); // the failed call left nothing
    /// # pools.release(r)?;
    /// # Ok::<(), highwater::device::PoolError>(())
    /// ```
    pub fn reserve(&self, needs: &[(DeviceIndex, u64)]) -> Result<Reservation, PoolError> {
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
        let mut wanted: Vec<(DeviceIndex, u64)> = needs.to_vec();
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
        let mut held: Vec<(DeviceIndex, u64, u64, MutexGuard<'_, Device>)> =
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
                pool.refusals += 1;
            }
        }
        if !shortfalls.is_empty() {
            drop(held);
            report_refusal(&shortfalls);
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
                    pool.refusals += 1;
                    for (block, (_, _, _, pool)) in blocks.iter().zip(held.iter_mut()) {
                        pool.undo(block.offset, block.requested);
                    }
                    drop(held);
                    let shortfalls = vec![shortfall];
                    report_refusal(&shortfalls);
                    return Err(AdmissionError { shortfalls }.into());
                }
            }
        }
        let added: u128 = blocks.iter().map(|b| u128::from(b.reserved)).sum();
        self.totals.lock().add(added);
        let observed = self.observe(held.iter().map(|(device, _, _, pool)| (*device, &**pool)));
        drop(held);
        let reservation = Reservation {
            manager: self.id,
            blocks: Blocks::Many(blocks),
        };
        Ok(self.report_then_hand_over(observed, reservation))
    }

    /// Reports a reservation's snapshots and hands it over. If the observer panics, the
    /// reservation is released first, so that its blocks do not stay held for good with nobody
    /// holding their handle, and the panic goes on.
    fn report_then_hand_over(
        &self,
        observed: Option<(Option<Arc<PoolObserver>>, Vec<PoolSnapshot>)>,
        reservation: Reservation,
    ) -> Reservation {
        match catch_unwind(AssertUnwindSafe(|| report(observed))) {
            Ok(()) => reservation,
            Err(panic) => {
                // Releasing reports too; a second panic there changes nothing more.
                let _ = catch_unwind(AssertUnwindSafe(|| self.release(reservation)));
                resume_unwind(panic)
            }
        }
    }

    /// [`PoolManager::reserve`] for a single device: one lock, and `alloc` (which changes
    /// nothing when it fails) stands in for the separate admission check.
    fn reserve_one(&self, device: DeviceIndex, bytes: u64) -> Result<Reservation, PoolError> {
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
            pool.refusals += 1;
            drop(pool);
            let shortfalls = vec![shortfall];
            report_refusal(&shortfalls);
            return Err(AdmissionError { shortfalls }.into());
        };
        self.totals.lock().add(u128::from(rounded));
        let observed = self.observe(std::iter::once((device, &*pool)));
        drop(pool);
        let block = ReservedBlock {
            device,
            offset,
            requested: bytes,
            reserved: rounded,
        };
        let reservation = Reservation {
            manager: self.id,
            blocks: Blocks::One(block),
        };
        Ok(self.report_then_hand_over(observed, reservation))
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
    /// use highwater::device::{DeviceIndex, PoolManager, Strategy};
    /// let pools = PoolManager::builder().limit(1 << 30).devices(3).strategy(Strategy::BestFit).build();
    /// let r = pools.reserve_even(3 * 1024 + 2, &[DeviceIndex(0), DeviceIndex(1), DeviceIndex(2)])?;
    /// let asked: Vec<u64> = r.blocks().iter().map(|b| b.requested).collect();
    /// assert_eq!(asked, [1024, 1024, 1026]);
    /// # pools.release(r)?;
    /// # Ok::<(), highwater::device::PoolError>(())
    /// ```
    pub fn reserve_even(
        &self,
        total: u64,
        devices: &[DeviceIndex],
    ) -> Result<Reservation, PoolError> {
        let (&last, _) = devices.split_last().ok_or(PoolError::EmptyRequest)?;
        if total == 0 {
            return Err(PoolError::ZeroBytes { device: last });
        }
        let n = devices.len() as u64;
        let (share, remainder) = (total / n, total % n);
        let needs: Vec<(DeviceIndex, u64)> = devices
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

    /// Returns a reservation's blocks to their pools and the bytes they held (a `u128`: blocks
    /// on several devices can hold more than `u64::MAX` bytes in all).
    ///
    /// # Errors
    ///
    /// [`PoolError::WrongManager`] (with the reservation handed back) if another manager made it.
    ///
    /// # Examples
    ///
    /// ```
    /// use highwater::device::{DeviceIndex, PoolError, PoolManager, Strategy};
    /// let a = PoolManager::builder().limit(1 << 20).devices(1).strategy(Strategy::BestFit).build();
    /// let b = PoolManager::builder().limit(1 << 20).devices(1).strategy(Strategy::BestFit).build();
    /// let r = a.reserve(&[(DeviceIndex(0), 4096)])?;
    /// let Err(PoolError::WrongManager { reservation, .. }) = b.release(r) else { panic!() };
    /// assert_eq!(a.release(reservation)?, 4096);
    /// # Ok::<(), PoolError>(())
    /// ```
    pub fn release(&self, reservation: Reservation) -> Result<u128, PoolError> {
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
            self.totals.lock().sub(u128::from(freed));
            let observed = self.observe(std::iter::once((block.device, &*pool)));
            drop(pool);
            report(observed);
            return Ok(u128::from(freed));
        }
        let mut held: Vec<(DeviceIndex, MutexGuard<'_, Device>)> =
            Vec::with_capacity(reservation.blocks().len());
        for block in reservation.blocks() {
            held.push((block.device, self.pools[block.device.0 as usize].lock()));
        }
        let mut freed = 0u128;
        let mut missing = None;
        for (block, (_, pool)) in reservation.blocks().iter().zip(held.iter_mut()) {
            match pool.free(block.offset, block.requested) {
                Some(size) => freed += u128::from(size),
                None => missing = Some((block.device, block.offset)),
            }
        }
        self.totals.lock().sub(freed);
        if let Some((device, offset)) = missing {
            return Err(PoolError::UnknownBlock { device, offset });
        }
        let observed = self.observe(held.iter().map(|(device, pool)| (*device, &**pool)));
        drop(held);
        report(observed);
        Ok(freed)
    }
}
