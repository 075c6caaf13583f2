//! Making a [`PoolManager`].

use super::PoolManager;
use crate::device::{DeviceKind, Strategy};

/// Builds a [`PoolManager`]: from [`PoolManager::builder`].
///
/// The capacity of each device is the [`limit`](Self::limit) when one is set (the memory the
/// runtime reports, rather than the spec sheet's), else the [`kind`](Self::kind)'s memory; a
/// builder given neither makes pools of 0 bytes, which refuse every request for capacity.
/// Defaults: one device, [`Strategy::BestFit`].
///
/// # Examples
///
/// ```
/// use highwater::device::{DeviceIndex, DeviceKind, PoolManager, Strategy};
/// // Named like H100s, sized as the runtime reports them.
/// let pools = PoolManager::builder()
///     .kind(DeviceKind::H100)
///     .limit(79 << 30)
///     .devices(2)
///     .strategy(Strategy::Adaptive)
///     .build();
/// let s = pools.snapshot(DeviceIndex(1))?;
/// assert_eq!((s.name.as_str(), s.capacity_bytes), ("cuda:1", 79 << 30));
/// # Ok::<(), highwater::device::PoolError>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[must_use = "a builder does nothing until .build()"]
pub struct PoolManagerBuilder {
    kind: Option<DeviceKind>,
    limit: Option<u64>,
    devices: u32,
    strategy: Strategy,
}

impl PoolManagerBuilder {
    pub(super) fn new() -> Self {
        Self {
            kind: None,
            limit: None,
            devices: 1,
            strategy: Strategy::BestFit,
        }
    }

    /// Devices of `kind`: named after it (`cuda:0`) and, without a limit, sized from it.
    pub fn kind(mut self, kind: DeviceKind) -> Self {
        self.kind = Some(kind);
        self
    }

    /// Usable bytes per device (rounded down to 256), whatever the kind says.
    pub fn limit(mut self, bytes: u64) -> Self {
        self.limit = Some(bytes);
        self
    }

    /// Number of devices.
    pub fn devices(mut self, devices: u32) -> Self {
        self.devices = devices;
        self
    }

    /// The placement strategy of every pool.
    pub fn strategy(mut self, strategy: Strategy) -> Self {
        self.strategy = strategy;
        self
    }

    /// The manager.
    pub fn build(self) -> PoolManager {
        let bytes = self
            .limit
            .or(self.kind.map(DeviceKind::capacity_bytes))
            .unwrap_or(0);
        PoolManager::from_parts(self.kind, bytes, self.devices, self.strategy)
    }
}
