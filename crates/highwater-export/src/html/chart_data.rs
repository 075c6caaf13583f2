//! What the report's script draws, as the JSON data island: per-device curves, pool curves,
//! the per-iteration changes and the iteration that holds the peak with its spans.
//!
//! Every collection is grouped in one pass over the profile (hash maps keyed by device name),
//! so a profile naming 100 k devices costs what its size says, and every curve and list is
//! bounded: [`MAX_CHART_POINTS`] points per curve, [`MAX_DEVICE_CHARTS`] charted devices,
//! [`MAX_PEAK_STEP_SPANS`] span bands.

use std::collections::HashMap;

use serde::Serialize;

use super::{MAX_CHART_POINTS, MAX_DEVICE_CHARTS, MAX_PEAK_STEP_SPANS};
use highwater_profile::model::Category;
use highwater_profile::Profile;
use highwater_profile::{PoolPoint, ReservedPoint, TimelinePoint};

/// One device's memory curve, column-wise: `series[c][i]` is category `c`'s bytes at `t[i]`.
#[derive(Debug, Serialize)]
pub(super) struct DeviceCurve {
    pub(super) device: String,
    pub(super) capacity: Option<u64>,
    pub(super) peak_bytes: u64,
    pub(super) peak_ns: u64,
    pub(super) t: Vec<u64>,
    pub(super) series: Vec<Vec<u64>>,
    /// What the device driver's pools held, drawn as a line over the allocated bytes.
    pub(super) reserved: Option<ReservedLine>,
}

/// A device driver's reserved bytes over time, on their own time axis.
#[derive(Debug, Serialize)]
pub(super) struct ReservedLine {
    pub(super) t: Vec<u64>,
    pub(super) bytes: Vec<u64>,
}

/// One device pool's state over time.
#[derive(Debug, Serialize)]
pub(super) struct PoolCurve {
    device: String,
    capacity: u64,
    t: Vec<u64>,
    reserved: Vec<u64>,
    fragmentation: Vec<f64>,
}

/// One span instance drawn as a band over the peak step's curve.
#[derive(Debug, Serialize)]
pub(super) struct SpanBand {
    name: String,
    path: String,
    thread: u32,
    depth: u32,
    start: u64,
    end: u64,
}

/// The iteration (or top-level span instance) that holds the run's peak, zoomed.
#[derive(Debug, Serialize)]
pub(super) struct PeakStep {
    /// What the range is, for the chart's title: `iteration 7 of step`.
    pub(super) label: String,
    pub(super) t0: u64,
    pub(super) t1: u64,
    /// The peak device's curve inside `[t0, t1]`, at the profile's full resolution.
    pub(super) curve: DeviceCurve,
    pub(super) spans: Vec<SpanBand>,
    /// Span instances in the range that were not drawn (beyond the band limit).
    pub(super) spans_not_drawn: usize,
}

/// What the script draws.
#[derive(Debug, Serialize)]
pub(super) struct ChartData {
    categories: Vec<&'static str>,
    duration_ns: u64,
    peak_bytes: u64,
    peak_ns: u64,
    peak_device: String,
    pub(super) devices: Vec<DeviceCurve>,
    /// Devices with a curve that has no chart (beyond [`MAX_DEVICE_CHARTS`]).
    pub(super) devices_not_charted: usize,
    pub(super) pools: Vec<PoolCurve>,
    pools_not_charted: usize,
    iterations: Vec<(u64, u64, i64)>,
    pub(super) peak_step: Option<PeakStep>,
    /// The icicle of bytes live at the peak by stack (`None` without call sites).
    pub(super) flame: Option<super::flame::Flame>,
    /// Refused allocations, marked on their device's memory and pool charts.
    pub(super) ooms: Vec<OomMark>,
}

/// A refused allocation as a mark on a chart.
#[derive(Debug, Serialize)]
pub(super) struct OomMark {
    pub(super) device: String,
    pub(super) t: u64,
    /// What the mark says: `OOM: 20.0 GiB refused`.
    pub(super) label: String,
}

/// Indices of at most `max` items of `values` (and `must`), in order, keeping each bucket's
/// highest and lowest, so the script can draw the curve's envelope.
pub(super) fn downsample(values: &[u64], max: usize, must: Option<usize>) -> Vec<usize> {
    if values.len() <= max || max < 4 {
        return (0..values.len()).collect();
    }
    let bucket = values.len().div_ceil(max / 2 - 1);
    let mut keep: Vec<usize> = (0..values.len())
        .step_by(bucket)
        .flat_map(|start| {
            let end = (start + bucket).min(values.len());
            let high = (start..end).max_by_key(|&i| values[i]).unwrap_or(start);
            let low = (start..end).min_by_key(|&i| values[i]).unwrap_or(start);
            [high.min(low), high.max(low)]
        })
        .collect();
    keep.dedup();
    if let Some(i) = must {
        if keep.binary_search(&i).is_err() {
            keep.push(i);
            keep.sort_unstable();
        }
    }
    keep
}

/// Device names in the order the report shows them: the devices table first, then any only
/// the curves mention; the device that peaked first of all.
pub(super) fn device_order(profile: &Profile) -> Vec<&str> {
    let mut seen: std::collections::HashSet<&str> = std::collections::HashSet::new();
    let mut names: Vec<&str> = Vec::new();
    let all = profile
        .devices
        .iter()
        .map(|d| d.device.as_str())
        .chain(profile.timeline.iter().map(|p| p.device.as_str()))
        .chain(profile.pool_timeline.iter().map(|p| p.device.as_str()))
        .chain(profile.reserved_timeline.iter().map(|p| p.device.as_str()));
    for name in all {
        if seen.insert(name) {
            names.push(name);
        }
    }
    if let Some(i) = names.iter().position(|d| *d == profile.summary.peak_device) {
        let peak = names.remove(i);
        names.insert(0, peak);
    }
    names
}

/// The curve of `points` (one device's, in time order), downsampled to `max` points that
/// keep the highest of each bucket and the peak.
fn device_curve(
    name: &str,
    points: &[&TimelinePoint],
    capacity: Option<u64>,
    peak: (u64, u64),
    max: usize,
) -> DeviceCurve {
    let live: Vec<u64> = points.iter().map(|p| p.live_bytes).collect();
    let peak_index = (0..live.len()).max_by_key(|&i| (live[i], usize::MAX - i));
    let keep = downsample(&live, max, peak_index);
    let mut series: Vec<Vec<u64>> = (0..Category::COUNT)
        .map(|_| Vec::with_capacity(keep.len()))
        .collect();
    for &i in &keep {
        let mut slots = [0u64; Category::COUNT];
        for (category, &bytes) in &points[i].by_category {
            let slot = &mut slots[category.index()];
            *slot = slot.saturating_add(bytes);
        }
        for (column, value) in series.iter_mut().zip(slots) {
            column.push(value);
        }
    }
    DeviceCurve {
        device: name.to_string(),
        capacity,
        peak_bytes: peak.0,
        peak_ns: peak.1,
        t: keep.iter().map(|&i| points[i].timestamp_ns).collect(),
        series,
        reserved: None,
    }
}

/// A driver's reserved curve (one device's points, in time order), downsampled to `max`
/// points keeping each bucket's highest and the last.
fn reserved_line(points: &[&ReservedPoint], max: usize) -> ReservedLine {
    let bytes: Vec<u64> = points.iter().map(|p| p.reserved_bytes).collect();
    let keep = downsample(&bytes, max, points.len().checked_sub(1));
    ReservedLine {
        t: keep.iter().map(|&i| points[i].timestamp_ns).collect(),
        bytes: keep.iter().map(|&i| bytes[i]).collect(),
    }
}

fn pool_curve(name: &str, pool: &[&PoolPoint]) -> PoolCurve {
    let reserved: Vec<u64> = pool.iter().map(|p| p.reserved_bytes).collect();
    let keep = downsample(&reserved, MAX_CHART_POINTS, None);
    PoolCurve {
        device: name.to_string(),
        capacity: pool.iter().map(|p| p.capacity_bytes).max().unwrap_or(0),
        t: keep.iter().map(|&i| pool[i].timestamp_ns).collect(),
        reserved: keep.iter().map(|&i| reserved[i]).collect(),
        fragmentation: keep
            .iter()
            .map(|&i| {
                let f = pool[i].fragmentation;
                if f.is_finite() {
                    f.clamp(0.0, 1.0)
                } else {
                    0.0
                }
            })
            .collect(),
    }
}

/// The time range of the iteration that holds the peak, and what to call it.
///
/// The recorded instance of the iteration span that covers the peak gives exact bounds; else
/// the iteration's end and the one before it; with no iterations, the top-level span instance
/// that covers the peak.
fn peak_range(profile: &Profile) -> Option<(String, u64, u64)> {
    let peak = profile.summary.peak_timestamp_ns;
    let name_of = |s: &highwater_profile::SpanEvent| {
        profile
            .spans
            .get(s.span as usize)
            .map_or("", |node| node.name.as_str())
    };
    let covering = |name: Option<&str>| {
        profile
            .span_events
            .iter()
            .filter(|s| name.is_none_or(|n| name_of(s) == n))
            .filter(|s| s.start_ns <= peak && peak <= s.start_ns.saturating_add(s.duration_ns))
            .min_by_key(|s| (s.depth, s.start_ns))
            .map(|s| (s.start_ns, s.start_ns.saturating_add(s.duration_ns)))
    };
    let mut ends: Vec<(u64, u64, &str)> = profile
        .iterations
        .iter()
        .map(|i| (i.end_timestamp_ns, i.index, i.span.as_str()))
        .collect();
    ends.sort_unstable();
    if let Some(k) = ends.iter().position(|&(end, _, _)| end >= peak) {
        let (end, index, span) = ends[k];
        let start = if k > 0 { ends[k - 1].0 } else { 0 };
        let (t0, t1) = covering(Some(span)).unwrap_or((start, end));
        return Some((format!("iteration {index} of {span}"), t0, t1));
    }
    let (t0, t1) = covering(None)?;
    let name = profile
        .span_events
        .iter()
        .find(|s| s.start_ns == t0 && s.start_ns.saturating_add(s.duration_ns) == t1)
        .map_or("span", name_of);
    Some((format!("the {name} span that holds the peak"), t0, t1))
}

/// The peak device's curve with the analysis's fine window around the peak in place of the
/// coarse points it covers.
fn with_peak_window<'p>(
    profile: &'p Profile,
    coarse: &[&'p TimelinePoint],
) -> Vec<&'p TimelinePoint> {
    let window: Vec<&TimelinePoint> = profile
        .peak_window
        .iter()
        .filter(|p| p.device == profile.summary.peak_device)
        .collect();
    let (Some(first), Some(last)) = (window.first(), window.last()) else {
        return coarse.to_vec();
    };
    let (w0, w1) = (first.timestamp_ns, last.timestamp_ns);
    let mut points: Vec<&TimelinePoint> = coarse
        .iter()
        .copied()
        .filter(|p| p.timestamp_ns < w0)
        .collect();
    points.extend(window);
    points.extend(coarse.iter().copied().filter(|p| p.timestamp_ns > w1));
    points
}

fn peak_step(profile: &Profile, coarse: &[&TimelinePoint]) -> Option<PeakStep> {
    let (label, t0, t1) = peak_range(profile)?;
    if t1 <= t0 {
        return None;
    }
    let peak_points = with_peak_window(profile, coarse);
    // The points inside the range, plus the one before it (the level the range opens at).
    let first = peak_points.partition_point(|p| p.timestamp_ns < t0);
    let last = peak_points.partition_point(|p| p.timestamp_ns <= t1);
    let inside = &peak_points[first.saturating_sub(1)..last];
    // The window at full resolution: every point the analysis kept for it.
    let max = MAX_CHART_POINTS.max(2 * highwater_profile::analysis::PEAK_WINDOW_BUCKETS + 2);
    if inside.is_empty() {
        return None;
    }
    let stats = profile
        .devices
        .iter()
        .find(|d| d.device == profile.summary.peak_device);
    let curve = device_curve(
        &profile.summary.peak_device,
        inside,
        stats.and_then(|s| s.capacity_bytes),
        (
            profile.summary.peak_bytes,
            profile.summary.peak_timestamp_ns,
        ),
        max,
    );
    let mut in_range: Vec<_> = profile
        .span_events
        .iter()
        .filter(|s| s.start_ns < t1 && s.start_ns.saturating_add(s.duration_ns) > t0)
        .collect();
    // The outermost and longest first: they say the most when not all fit.
    in_range.sort_by_key(|s| (s.depth, std::cmp::Reverse(s.duration_ns), s.start_ns));
    let spans_not_drawn = in_range.len().saturating_sub(MAX_PEAK_STEP_SPANS);
    let node = |s: &highwater_profile::SpanEvent| profile.spans.get(s.span as usize);
    let spans = in_range
        .into_iter()
        .take(MAX_PEAK_STEP_SPANS)
        .map(|s| SpanBand {
            name: node(s).map_or_else(String::new, |n| n.name.clone()),
            path: profile.span_path(s.span),
            thread: s.thread,
            depth: s.depth,
            start: s.start_ns.max(t0),
            end: s.start_ns.saturating_add(s.duration_ns).min(t1),
        })
        .collect();
    Some(PeakStep {
        label,
        t0,
        t1,
        curve,
        spans,
        spans_not_drawn,
    })
}

/// The data island of `profile`.
pub(super) fn chart_data(profile: &Profile) -> ChartData {
    let summary = &profile.summary;
    let mut timeline = group_points(&profile.timeline, |p| &p.device);
    let mut pool_timeline = group_points(&profile.pool_timeline, |p| &p.device);
    let mut reserved_timeline = group_points(&profile.reserved_timeline, |p| &p.device);
    for points in reserved_timeline.values_mut() {
        points.sort_by_key(|p| p.timestamp_ns);
    }
    for points in timeline.values_mut() {
        points.sort_by_key(|p| p.timestamp_ns);
    }
    for points in pool_timeline.values_mut() {
        points.sort_by_key(|p| p.timestamp_ns);
    }
    let stats: HashMap<&str, _> = profile
        .devices
        .iter()
        .map(|d| (d.device.as_str(), d))
        .collect();
    let order = device_order(profile);
    let mut devices = Vec::new();
    let mut devices_not_charted = 0;
    let mut pools = Vec::new();
    let mut pools_not_charted = 0;
    for name in &order {
        if let Some(points) = timeline.get(name) {
            if devices.len() < MAX_DEVICE_CHARTS {
                let stats = stats.get(name);
                let mut curve = device_curve(
                    name,
                    points,
                    stats.and_then(|s| s.capacity_bytes),
                    stats.map_or((0, 0), |s| (s.peak_bytes, s.peak_timestamp_ns)),
                    MAX_CHART_POINTS,
                );
                curve.reserved = reserved_timeline
                    .get(name)
                    .map(|points| reserved_line(points, MAX_CHART_POINTS));
                devices.push(curve);
            } else {
                devices_not_charted += 1;
            }
        }
        if let Some(pool) = pool_timeline.get(name) {
            if pools.len() < MAX_DEVICE_CHARTS {
                pools.push(pool_curve(name, pool));
            } else {
                pools_not_charted += 1;
            }
        }
    }
    let peak_points = timeline
        .get(summary.peak_device.as_str())
        .map_or(&[][..], Vec::as_slice);
    ChartData {
        categories: Category::ALL.iter().map(|c| c.as_str()).collect(),
        duration_ns: summary.duration_ns,
        peak_bytes: summary.peak_bytes,
        peak_ns: summary.peak_timestamp_ns,
        peak_device: summary.peak_device.clone(),
        peak_step: peak_step(profile, peak_points),
        flame: super::flame::flame(profile),
        devices,
        devices_not_charted,
        pools,
        pools_not_charted,
        iterations: profile
            .iterations
            .iter()
            .take(MAX_CHART_POINTS)
            .map(|i| (i.index, i.live_bytes, i.delta_bytes))
            .collect(),
        ooms: profile
            .oom_events
            .iter()
            .map(|oom| OomMark {
                device: oom.device.clone(),
                t: oom.timestamp_ns,
                label: format!(
                    "OOM: {} refused",
                    highwater_profile::units::format_bytes(oom.requested_bytes)
                ),
            })
            .collect(),
    }
}

/// `items` grouped by device name in one pass.
fn group_points<'p, T>(
    items: &'p [T],
    device: impl Fn(&'p T) -> &'p String,
) -> HashMap<&'p str, Vec<&'p T>> {
    let mut groups: HashMap<&'p str, Vec<&'p T>> = HashMap::new();
    for item in items {
        groups.entry(device(item).as_str()).or_default().push(item);
    }
    groups
}

#[cfg(test)]
mod tests {
    use super::*;
    use highwater_testkit::sample::sample_profile;

    #[test]
    fn downsample_keeps_each_buckets_highest_and_lowest() {
        let values = [1, 9, 2, 3, 8, 1, 0, 7, 5, 4];
        assert_eq!(downsample(&values, 100, None), (0..10).collect::<Vec<_>>());
        // Two buckets of five: lowest 1 and highest 9 of the first, 0 and 7 of the second.
        let kept = downsample(&values, 6, Some(9));
        assert_eq!(kept, vec![0, 1, 6, 7, 9], "{kept:?}");
    }

    /// Issue 34: the chart of the step that peaked had 8 flat steps; it draws the analysis's
    /// fine window there.
    #[test]
    fn the_peak_step_draws_the_fine_window() {
        let profile = sample_profile();
        let step = chart_data(&profile).peak_step.expect("a peak step");
        let fine = profile
            .peak_window
            .iter()
            .filter(|p| p.timestamp_ns >= step.t0 && p.timestamp_ns <= step.t1)
            .count();
        assert!(fine > 100, "{fine}");
        assert!(
            step.curve.t.len() >= fine,
            "{} < {fine}",
            step.curve.t.len()
        );
        let mut coarse_only = profile.clone();
        coarse_only.peak_window.clear();
        let coarse = chart_data(&coarse_only).peak_step.unwrap();
        assert!(step.curve.t.len() > 5 * coarse.curve.t.len());
    }

    #[test]
    fn long_curves_are_bounded_and_keep_the_peak() {
        let mut profile = sample_profile();
        let n = 50_000u64;
        profile.timeline = (0..n)
            .map(|i| {
                let mut timeline_point = TimelinePoint::default();
                timeline_point.timestamp_ns = i;
                timeline_point.device = "cpu".into();
                timeline_point.live_bytes = if i == 31_337 { 1 << 40 } else { i % 1000 };
                timeline_point.by_category = [(Category::Other, i % 1000)].into_iter().collect();
                timeline_point
            })
            .collect();
        let data = chart_data(&profile);
        let cpu = &data.devices[0];
        assert!(cpu.t.len() <= MAX_CHART_POINTS + 1);
        assert!(cpu.t.contains(&31_337));
    }

    #[test]
    fn the_peak_step_is_the_iteration_that_holds_the_peak() {
        let profile = sample_profile();
        let step = chart_data(&profile).peak_step.expect("a peak step");
        let peak = profile.summary.peak_timestamp_ns;
        assert!(step.t0 <= peak && peak <= step.t1, "{step:?}");
        let holding = profile
            .iterations
            .iter()
            .find(|i| i.end_timestamp_ns >= peak)
            .unwrap();
        assert!(step.label.contains(&format!("iteration {}", holding.index)));
        assert!(step.t1 - step.t0 < profile.summary.duration_ns / 2);
        assert!(!step.spans.is_empty());
        assert!(step
            .spans
            .iter()
            .all(|s| s.start >= step.t0 && s.end <= step.t1));
        assert_eq!(step.curve.device, profile.summary.peak_device);
        assert!(step.curve.t.len() > 10);
    }
}
