//! Per-device counters and what follows them: the device peaks, the global peak, the bounded
//! curves, the pool figures, and the per-device statistics of the profile.

use crate::model::Category;
use crate::profile::{DeviceStats, PoolPoint, ReservedPoint, TimelinePoint};

use super::super::downsample::{Downsampler, Sample};
use super::super::event::DeviceId;
use super::assemble::category_map;
use super::{ByCategory, Timeline};

/// One point of a device's memory curve, before names are attached.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) struct CurvePoint {
    pub(super) ts: u64,
    pub(super) live: u64,
    pub(super) by_category: ByCategory,
}

impl CurvePoint {
    /// Offers `curve` the point of `live` bytes at `ts`. The category split is copied only
    /// when the point is kept: a copy right after the counters were written would wait for
    /// every pending store, including the live map's.
    #[inline]
    pub(super) fn offer_to(
        curve: &mut Downsampler<CurvePoint>,
        ts: u64,
        live: u64,
        by_category: &ByCategory,
    ) {
        curve.offer(
            ts,
            |kept, slot| live_beats(live, kept.live, slot),
            || CurvePoint {
                ts,
                live,
                by_category: *by_category,
            },
        );
    }
}

/// Whether `live` bytes replace `kept` in a curve bucket's slot: slot 0 keeps the highest,
/// slot 1 the lowest.
#[inline]
fn live_beats(live: u64, kept: u64, slot: usize) -> bool {
    if slot == 0 {
        live > kept
    } else {
        live < kept
    }
}

impl Sample for CurvePoint {
    fn ts(&self) -> u64 {
        self.ts
    }
    fn beats(&self, kept: &Self, slot: usize) -> bool {
        live_beats(self.live, kept.live, slot)
    }
}

/// One pool report, before names are attached.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) struct PoolSample {
    pub(super) ts: u64,
    pub(super) capacity: u64,
    pub(super) reserved: u64,
    pub(super) largest_free: u64,
    pub(super) fragmentation: f64,
}

impl Sample for PoolSample {
    fn ts(&self) -> u64 {
        self.ts
    }
    /// Slot 0 keeps the most reserved bytes, slot 1 the highest fragmentation.
    fn beats(&self, kept: &Self, slot: usize) -> bool {
        if slot == 0 {
            self.reserved > kept.reserved
        } else {
            self.fragmentation > kept.fragmentation
        }
    }
}

/// What a pool reported about one device.
#[derive(Debug, Clone)]
pub(super) struct PoolStats {
    /// The last report, which the curve ends at whatever the downsampling kept.
    pub(super) last: PoolSample,
    pub(super) capacity: u64,
    /// Reserved bytes as of the pool's last report.
    pub(super) reserved: u64,
    pub(super) peak_reserved: u64,
    pub(super) max_fragmentation: f64,
    pub(super) curve: Downsampler<PoolSample>,
}

/// One reading of what a device driver's pools hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct ReservedSample {
    pub(super) ts: u64,
    pub(super) bytes: u64,
}

impl Sample for ReservedSample {
    fn ts(&self) -> u64 {
        self.ts
    }
    /// Slot 0 keeps the most bytes, slot 1 the fewest.
    fn beats(&self, kept: &Self, slot: usize) -> bool {
        if slot == 0 {
            self.bytes > kept.bytes
        } else {
            self.bytes < kept.bytes
        }
    }
}

/// What a device driver's pools held.
#[derive(Debug, Clone)]
pub(super) struct ReservedStats {
    pub(super) last: ReservedSample,
    pub(super) peak: u64,
    pub(super) curve: Downsampler<ReservedSample>,
}

/// What the driver said the device held before its first recorded allocation, and its total.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct DeviceMemory {
    pub(super) in_use: u64,
    pub(super) total: u64,
}

/// Everything kept per device.
#[derive(Debug, Clone)]
pub(super) struct DeviceState {
    /// Some event named this device.
    pub(super) touched: bool,
    pub(super) live: u64,
    pub(super) by_category: ByCategory,
    pub(super) allocs: u64,
    pub(super) frees: u64,
    pub(super) peak: u64,
    pub(super) peak_ts: u64,
    pub(super) peak_by_category: ByCategory,
    pub(super) curve: Downsampler<CurvePoint>,
    pub(super) pool: Option<PoolStats>,
    pub(super) reserved: Option<ReservedStats>,
    pub(super) memory: Option<DeviceMemory>,
}

impl DeviceState {
    pub(super) fn new(max_buckets: usize) -> DeviceState {
        DeviceState {
            touched: false,
            live: 0,
            by_category: [0; Category::COUNT],
            allocs: 0,
            frees: 0,
            peak: 0,
            peak_ts: 0,
            peak_by_category: [0; Category::COUNT],
            curve: Downsampler::new(max_buckets),
            pool: None,
            reserved: None,
            memory: None,
        }
    }

    pub(super) fn add(&mut self, category: Category, size: u64) {
        self.live = self.live.saturating_add(size);
        let slot = &mut self.by_category[category.index()];
        *slot = slot.saturating_add(size);
    }

    pub(super) fn sub(&mut self, category: Category, size: u64) {
        self.live = self.live.saturating_sub(size);
        let slot = &mut self.by_category[category.index()];
        *slot = slot.saturating_sub(size);
    }
}

/// The highest live bytes any one device reached.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct GlobalPeak {
    pub(super) bytes: u64,
    pub(super) ts: u64,
    pub(super) device: Option<DeviceId>,
    pub(super) by_category: ByCategory,
}

impl Timeline {
    pub(super) fn curve_buckets(&self) -> usize {
        // Two points per bucket, and room for the exact peak.
        (self.config.max_points_per_device.saturating_sub(1) / 2).max(1)
    }

    pub(super) fn device(&mut self, device: DeviceId) -> &mut DeviceState {
        let index = usize::from(device.0);
        if index >= self.devices.len() {
            let buckets = self.curve_buckets();
            self.devices
                .resize_with(index + 1, || DeviceState::new(buckets));
        }
        let state = &mut self.devices[index];
        state.touched = true;
        state
    }

    /// `device`'s `live` bytes at event `seq`, stamped `ts`, are the highest of the run so far.
    /// Out of line, so that [`Timeline::changed`], called for every event, stays small.
    #[inline(never)]
    fn new_peak(&mut self, device: DeviceId, live: u64, ts: u64, seq: u64) {
        let by_category = self.devices[usize::from(device.0)].by_category;
        self.peak = GlobalPeak {
            bytes: live,
            ts,
            device: Some(device),
            by_category,
        };
        self.window.peaked(device);
        self.live.mark_peak();
        self.temporaries.mark_peak();
        self.sites.mark_peak(seq);
    }

    /// The counters of `device` changed at event `seq`: peaks, measure and curve follow.
    #[inline(always)]
    pub(super) fn changed(&mut self, device: DeviceId, ts: u64, seq: u64) {
        let state = self.device(device);
        let live = state.live;
        if live > state.peak {
            state.peak = live;
            state.peak_ts = ts;
            state.peak_by_category = state.by_category;
        }
        CurvePoint::offer_to(&mut state.curve, ts, live, &state.by_category);
        if live > self.peak.bytes {
            self.new_peak(device, live, ts, seq);
        }
        if self.window.follows(device) {
            let state = &self.devices[usize::from(device.0)];
            self.window.offer(ts, live, &state.by_category);
        }
        let measure = if live >= self.measure || self.devices.len() == 1 {
            live
        } else {
            self.devices.iter().map(|d| d.live).max().unwrap_or(0)
        };
        if measure != self.measure {
            self.measure = measure;
            self.spans.record_measure(seq, measure);
        }
    }

    pub(super) fn total_live(&self) -> u64 {
        self.devices
            .iter()
            .fold(0u64, |sum, d| sum.saturating_add(d.live))
    }

    /// Live bytes by category, summed over devices.
    pub(super) fn total_by_category(&self) -> ByCategory {
        let mut total = [0u64; Category::COUNT];
        for device in &self.devices {
            for (sum, bytes) in total.iter_mut().zip(device.by_category) {
                *sum = sum.saturating_add(bytes);
            }
        }
        total
    }

    pub(super) fn curve(&self) -> Vec<TimelinePoint> {
        let mut out = Vec::new();
        for (index, state) in self.devices.iter().enumerate() {
            let device = DeviceId(u16::try_from(index).unwrap_or(u16::MAX));
            let mut points: Vec<CurvePoint> = state.curve.points().collect();
            if self.peak.device == Some(device) {
                let peak = CurvePoint {
                    ts: self.peak.ts,
                    live: self.peak.bytes,
                    by_category: self.peak.by_category,
                };
                if !points.contains(&peak) {
                    points.push(peak);
                }
            }
            points.sort_by_key(|p| p.ts);
            let name = self.names.device_str(device);
            out.extend(points.into_iter().map(|p| TimelinePoint {
                timestamp_ns: p.ts,
                device: name.clone(),
                live_bytes: p.live,
                by_category: category_map(&p.by_category),
            }));
        }
        out
    }

    /// The peak window's curve (see `window`), named.
    pub(super) fn peak_window(&self) -> Vec<TimelinePoint> {
        let Some((device, points)) = self.window.points() else {
            return Vec::new();
        };
        let name = self.names.device_str(device);
        points
            .into_iter()
            .map(|p| TimelinePoint {
                timestamp_ns: p.ts,
                device: name.clone(),
                live_bytes: p.live,
                by_category: category_map(&p.by_category),
            })
            .collect()
    }

    /// A top-level span exited at `ts`: the peak window's boundary.
    pub(super) fn window_boundary(&mut self, ts: u64) {
        let start = self
            .peak
            .device
            .and_then(|device| self.devices.get(usize::from(device.0)))
            .map(|state| (state.live, state.by_category));
        self.window.boundary(ts, start);
    }

    pub(super) fn device_stats(&self) -> Vec<DeviceStats> {
        self.devices
            .iter()
            .enumerate()
            .filter(|(_, state)| state.touched)
            .map(|(index, state)| DeviceStats {
                device: self
                    .names
                    .device_str(DeviceId(u16::try_from(index).unwrap_or(u16::MAX))),
                capacity_bytes: state
                    .pool
                    .as_ref()
                    .map(|p| p.capacity)
                    .or(state.memory.map(|m| m.total)),
                peak_bytes: state.peak,
                peak_timestamp_ns: state.peak_ts,
                peak_by_category: category_map(&state.peak_by_category),
                alloc_count: state.allocs,
                free_count: state.frees,
                final_live_bytes: state.live,
                peak_reserved_bytes: state.pool.as_ref().map(|p| p.peak_reserved),
                max_fragmentation: state.pool.as_ref().map(|p| p.max_fragmentation),
                reserved_peak_bytes: state.reserved.as_ref().map(|r| r.peak),
                reserved_final_bytes: state.reserved.as_ref().map(|r| r.last.bytes),
                context_bytes: state.memory.map(|m| m.in_use),
            })
            .collect()
    }

    pub(super) fn pool_timeline(&self) -> Vec<PoolPoint> {
        let mut out = Vec::new();
        for (index, state) in self.devices.iter().enumerate() {
            let Some(pool) = &state.pool else {
                continue;
            };
            let name = self
                .names
                .device_str(DeviceId(u16::try_from(index).unwrap_or(u16::MAX)));
            let mut points: Vec<PoolSample> = pool.curve.points().collect();
            if !points.contains(&pool.last) {
                points.push(pool.last);
            }
            points.sort_by_key(|p| p.ts);
            out.extend(points.into_iter().map(|p| PoolPoint {
                timestamp_ns: p.ts,
                device: name.clone(),
                capacity_bytes: p.capacity,
                reserved_bytes: p.reserved,
                largest_free_bytes: p.largest_free,
                fragmentation: p.fragmentation,
            }));
        }
        out
    }

    /// Each device's driver-pool curve, ending at its last reading.
    pub(super) fn reserved_timeline(&self) -> Vec<ReservedPoint> {
        let mut out = Vec::new();
        for (index, state) in self.devices.iter().enumerate() {
            let Some(reserved) = &state.reserved else {
                continue;
            };
            let name = self
                .names
                .device_str(DeviceId(u16::try_from(index).unwrap_or(u16::MAX)));
            let mut points: Vec<ReservedSample> = reserved.curve.points().collect();
            if !points.contains(&reserved.last) {
                points.push(reserved.last);
            }
            points.sort_by_key(|p| p.ts);
            out.extend(points.into_iter().map(|p| ReservedPoint {
                timestamp_ns: p.ts,
                device: name.clone(),
                reserved_bytes: p.bytes,
            }));
        }
        out
    }
}
