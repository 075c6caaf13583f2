//! Device memory events: tensors and driver allocations, pool states and refused reservations.

use super::{emit, SessionPolicy};
use crate::capture::raw::{DeviceMemoryKind, PoolReport, RawEvent, RawKind};
use crate::capture::ring::WhenFull;
use crate::model::{Category, OomSource};

/// Records a device tensor becoming live.
pub(crate) fn record_device_alloc(device: u16, tensor: u64, bytes: u64, category: u8) {
    let category = Category::from_index(category);
    emit([RawKind::DeviceAlloc], |current, ticks| {
        [RawEvent::device_alloc(
            ticks,
            current.span,
            device,
            category,
            tensor,
            bytes,
        )]
    });
}

/// Records a device block of `bytes` at `key` becoming live, in the category the thread's
/// open spans give it (as a heap allocation's): what a device driver's allocation is.
/// Remembered as the thread's latest device allocation (see [`super::recent`]).
// The CUDA callback is its only caller.
#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
pub(crate) fn record_device_alloc_in_scope(device: u16, key: u64, bytes: u64) {
    let recorded = emit([RawKind::DeviceAlloc], |current, ticks| {
        [RawEvent::device_alloc(
            ticks,
            current.span,
            device,
            current.scope.category(),
            key,
            bytes,
        )]
    });
    if recorded {
        crate::capture::recent::note(device, key, bytes);
    }
}

/// Records a device event with two plain words (see [`DeviceMemoryKind`]).
#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
pub(crate) fn record_device_memory(kind: DeviceMemoryKind, device: u16, a: u64, b: u64) {
    emit([kind.raw_kind()], |current, ticks| {
        [RawEvent::device_memory(
            kind,
            ticks,
            current.span,
            device,
            a,
            b,
        )]
    });
}

/// Records a device tensor dying.
pub(crate) fn record_device_free(device: u16, tensor: u64, bytes: u64) {
    emit([RawKind::DeviceFree], |current, ticks| {
        [RawEvent::device_free(
            ticks,
            current.span,
            device,
            tensor,
            bytes,
        )]
    });
}

/// Records that the live block `key` on `device` has category `category` from now on.
pub(crate) fn record_set_category(device: u16, key: u64, category: u8) {
    let category = Category::from_index(category);
    emit([RawKind::SetCategory], |current, ticks| {
        [RawEvent::set_category(
            ticks,
            current.span,
            device,
            key,
            category,
        )]
    });
}

/// Whether a collector drains this process's rings now (it has not stopped, and this is not a
/// forked child): what a thread waiting on it checks each time it wakes.
pub(crate) fn collector_serves() -> bool {
    SessionPolicy.collector_serves()
}

/// Records that `source` refused `requested` bytes on interned `device` (cold: a refusal).
/// Returns whether the event is in the ring, so that waiting for a checkpoint that includes it
/// can succeed.
#[cold]
pub(crate) fn record_oom(
    device: u16,
    source: OomSource,
    requested: u64,
    largest_free: Option<u64>,
) -> bool {
    emit([RawKind::Oom], |current, ticks| {
        [RawEvent::oom(
            ticks,
            current.span,
            device,
            source,
            requested,
            largest_free,
        )]
    })
}

/// Records a device pool's state.
pub(crate) fn record_pool_state(
    device: u16,
    capacity: u64,
    reserved: u64,
    largest_free: u64,
    fragmentation: f64,
) {
    let pool = PoolReport {
        capacity,
        reserved,
        largest_free,
        fragmentation,
    };
    emit([RawKind::PoolHead, RawKind::PoolTail], |current, ticks| {
        RawEvent::pool_state(ticks, current.span, device, pool)
    });
}
