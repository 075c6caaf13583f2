//! What can go wrong with a reservation.

use std::fmt;

use super::{DeviceIndex, Reservation, ShortfallCause};

/// Why [`PoolManager`](super::PoolManager) refused or could not complete a call.
///
/// # Examples
///
/// ```
/// use highwater::device::{DeviceIndex, PoolError, PoolManager, Strategy};
/// let pools = PoolManager::builder().limit(1 << 20).devices(1).strategy(Strategy::BestFit).build();
/// match pools.reserve(&[(DeviceIndex(0), 2 << 20)]) {
///     Err(PoolError::Admission(e)) => assert_eq!(e.shortfalls()[0].device, DeviceIndex(0)),
///     other => panic!("expected an admission error, got {other:?}"),
/// }
/// ```
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum PoolError {
    /// The device index is not below the manager's device count.
    #[error("{device} does not exist: the manager has {devices} device(s)")]
    UnknownDevice {
        /// The device asked for.
        device: DeviceIndex,
        /// How many devices the manager has.
        devices: u32,
    },
    /// A request of zero bytes.
    #[error("zero-byte reservation requested on {device}")]
    ZeroBytes {
        /// The device it named.
        device: DeviceIndex,
    },
    /// A reservation call with no device in it.
    #[error("a reservation needs at least one device")]
    EmptyRequest,
    /// Summing a device's requests or rounding them to the granularity overflows `u64`.
    #[error("request of {bytes} bytes on {device} overflows u64 once summed or rounded")]
    Overflow {
        /// The device.
        device: DeviceIndex,
        /// The request (or the partial sum of duplicate requests) that overflowed.
        bytes: u64,
    },
    /// At least one device cannot fit its share; nothing was reserved.
    #[error(transparent)]
    Admission(#[from] AdmissionError),
    /// The reservation was made by another manager. It is handed back unchanged.
    #[error(
        "reservation made by pool manager #{} was released into pool manager #{manager}",
        reservation.manager_id()
    )]
    WrongManager {
        /// The manager that was asked to release it.
        manager: u64,
        /// The reservation, still owning its blocks in the manager that made it.
        reservation: Reservation,
    },
    /// A released block is not live in its pool. Reservations cannot be duplicated, so this
    /// indicates a bug in highwater; the pool is left as it was for that block.
    #[error("internal error: no live block at offset {offset} on {device}")]
    UnknownBlock {
        /// The device.
        device: DeviceIndex,
        /// The block's offset.
        offset: u64,
    },
}

/// An all-or-nothing reservation that did not fit: every device that could not take its share.
///
/// When it is returned, every pool is exactly as it was before the call apart from its failure
/// counter.
///
/// # Examples
///
/// ```
/// use highwater::device::{DeviceIndex, PoolError, PoolManager, ShortfallCause, Strategy};
/// let pools = PoolManager::builder().limit(4 << 20).devices(2).strategy(Strategy::BestFit).build();
/// let err = pools
///     .reserve(&[(DeviceIndex(0), 1 << 20), (DeviceIndex(1), 5 << 20)])
///     .unwrap_err();
/// let PoolError::Admission(admission) = err else { panic!("{err}") };
/// assert_eq!(admission.shortfalls().len(), 1);
/// assert_eq!(admission.shortfalls()[0].cause, ShortfallCause::Capacity);
/// assert!(admission.to_string().contains("device:1"));
/// assert_eq!(pools.stats(DeviceIndex(0))?.in_use_bytes, 0); // rolled back
/// # Ok::<(), PoolError>(())
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct AdmissionError {
    pub(crate) shortfalls: Vec<Shortfall>,
}

impl AdmissionError {
    /// The devices that could not fit their share, in device order.
    pub fn shortfalls(&self) -> &[Shortfall] {
        &self.shortfalls
    }

    /// Whether any device failed for fragmentation (enough free bytes, no block large enough).
    pub fn is_fragmentation(&self) -> bool {
        self.shortfalls
            .iter()
            .any(|s| s.cause == ShortfallCause::Fragmentation)
    }
}

impl std::error::Error for AdmissionError {}

impl fmt::Display for AdmissionError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "reservation refused on {} device(s); nothing was reserved",
            self.shortfalls.len()
        )?;
        for s in &self.shortfalls {
            write!(f, "\n  {s}")?;
        }
        Ok(())
    }
}

/// One device's part of an [`AdmissionError`], with the pool's figures at the time.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct Shortfall {
    /// The device.
    pub device: DeviceIndex,
    /// Its name (`"tpu:0"`).
    pub name: String,
    /// Bytes asked for on this device (duplicates in one call summed).
    pub requested: u64,
    /// The request after the strategy's rounding.
    pub rounded: u64,
    /// Usable bytes of the pool.
    pub capacity: u64,
    /// Bytes reserved before the call.
    pub in_use: u64,
    /// Free bytes before the call.
    pub free: u64,
    /// Largest free block before the call.
    pub largest_free: u64,
    /// Whether free bytes would have sufficed.
    pub cause: ShortfallCause,
}

impl fmt::Display for Shortfall {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}: requested {} (rounded to {}); capacity {}, in use {}, free {}, largest free block {}: ",
            self.name,
            Bytes(self.requested),
            Bytes(self.rounded),
            Bytes(self.capacity),
            Bytes(self.in_use),
            Bytes(self.free),
            Bytes(self.largest_free),
        )?;
        match self.cause {
            ShortfallCause::Capacity => f.write_str("not enough free memory (capacity)"),
            ShortfallCause::Fragmentation => f.write_str(
                "enough bytes are free but no free block is large enough (fragmentation)",
            ),
        }
    }
}

/// Formats a byte count for people: exact below 1 KiB, else two decimals and the exact count.
pub(crate) struct Bytes(pub(crate) u64);

impl fmt::Display for Bytes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        const UNITS: [&str; 5] = ["KiB", "MiB", "GiB", "TiB", "PiB"];
        let b = self.0;
        if b < 1024 {
            return write!(f, "{b} B");
        }
        let mut value = b as f64 / 1024.0;
        let mut unit = 0;
        while value >= 1024.0 && unit + 1 < UNITS.len() {
            value /= 1024.0;
            unit += 1;
        }
        if value.fract() == 0.0 {
            write!(f, "{value} {}", UNITS[unit])
        } else {
            write!(f, "{value:.2} {} ({b} B)", UNITS[unit])
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bytes_are_readable_and_exact() {
        assert_eq!(Bytes(0).to_string(), "0 B");
        assert_eq!(Bytes(1023).to_string(), "1023 B");
        assert_eq!(Bytes(32 << 30).to_string(), "32 GiB");
        assert_eq!(Bytes(1536).to_string(), "1.50 KiB (1536 B)");
    }
}
