//! The window that holds the peak, at fine resolution.
//!
//! The run's curve has a few thousand points, so the iteration that peaked gets only the
//! handful of buckets its time covers. Which iteration that is becomes known only at the end,
//! so every window is recorded at fine resolution as it happens and kept only if it held the
//! peak: a window runs from one top-level span exit to the next (an iteration, in a training
//! loop), and its curve follows the device of the global peak with
//! [`PEAK_WINDOW_BUCKETS`] buckets, which hold every change of a window that has fewer and
//! each bucket's highest and lowest point of a longer one. Two curves are kept: the open
//! window, and the last closed window that held the peak; closing a window that does not hold
//! it clears it for reuse. So the cost is one more bounded curve per event on the peak's
//! device, and memory twice that curve's.

use super::super::downsample::{Downsampler, Sample};
use super::super::event::DeviceId;
use super::peaks::CurvePoint;
use super::ByCategory;

/// Time buckets of the peak window's curve (each keeps two points).
pub const PEAK_WINDOW_BUCKETS: usize = 2048;

/// The open window and the last closed window that held the peak.
#[derive(Debug, Clone)]
pub(super) struct PeakWindow {
    /// The device the windows follow: the global peak's.
    device: Option<DeviceId>,
    /// Changes since the last top-level span exit.
    open: Downsampler<CurvePoint>,
    /// Whether the global peak was set inside `open`.
    open_holds_peak: bool,
    /// The last closed window that held the peak; meaningful while `kept_holds_peak`.
    kept: Downsampler<CurvePoint>,
    /// Whether `kept` holds the peak (no newer peak since it closed).
    kept_holds_peak: bool,
}

impl Default for PeakWindow {
    fn default() -> Self {
        PeakWindow {
            device: None,
            open: Downsampler::new(PEAK_WINDOW_BUCKETS),
            open_holds_peak: false,
            kept: Downsampler::new(PEAK_WINDOW_BUCKETS),
            kept_holds_peak: false,
        }
    }
}

impl PeakWindow {
    /// Whether changes on `device` are recorded.
    #[inline]
    pub(super) fn follows(&self, device: DeviceId) -> bool {
        self.device == Some(device)
    }

    /// A change on the followed device: `live` bytes at `ts`, split as `by_category` (read
    /// only when the point is kept).
    #[inline]
    pub(super) fn offer(&mut self, ts: u64, live: u64, by_category: &ByCategory) {
        CurvePoint::offer_to(&mut self.open, ts, live, by_category);
    }

    /// The global peak rose on `device`: the open window holds it. A peak on another device
    /// starts the windows over on that one, from this moment.
    pub(super) fn peaked(&mut self, device: DeviceId) {
        if self.device != Some(device) {
            self.device = Some(device);
            self.open.clear();
        }
        self.open_holds_peak = true;
        self.kept_holds_peak = false;
    }

    /// A top-level span exited at `ts`: the open window closes (kept if it holds the peak) and
    /// a new one opens at the followed device's level then, `start`.
    pub(super) fn boundary(&mut self, ts: u64, start: Option<(u64, ByCategory)>) {
        if self.open_holds_peak {
            std::mem::swap(&mut self.open, &mut self.kept);
            self.open_holds_peak = false;
            self.kept_holds_peak = true;
        }
        self.open.clear();
        if let Some((live, by_category)) = start {
            self.open.push(CurvePoint {
                ts,
                live,
                by_category,
            });
        }
    }

    /// The points of the window that holds the peak, in time order, with its device; `None`
    /// before any peak.
    pub(super) fn points(&self) -> Option<(DeviceId, Vec<CurvePoint>)> {
        let curve = if self.open_holds_peak {
            &self.open
        } else if self.kept_holds_peak {
            &self.kept
        } else {
            return None;
        };
        let mut points: Vec<CurvePoint> = curve.points().collect();
        points.sort_by_key(Sample::ts);
        Some((self.device?, points))
    }
}
