//! Rank profiles made from one profile: the same run seen as rank `r` of a world, with extra
//! activation bytes so ranks differ (a pipeline stage holding more layers).

use highwater_profile::model::Category;
use highwater_profile::{PeakRow, Profile};

/// `profile` as rank `rank` of `world` in run `run_id` (torchrun's), with `extra` more bytes of
/// activations on the peak device, spread over its curve in proportion to the activations
/// already there (so the peak stays where it was, `extra` higher). The spans whose recorded
/// instances are open at the peak (enter included, exit excluded) get it as their own peak, as
/// a recorded profile has it. Every invariant a profile keeps still holds.
pub fn as_rank(mut profile: Profile, rank: u32, world: u32, run_id: &str, extra: u64) -> Profile {
    let meta = &mut profile.meta;
    meta.rank = Some(rank);
    meta.world_size = Some(world);
    meta.local_rank = Some(rank % 8);
    meta.host = format!("node{}", rank / 8);
    meta.launcher = Some("torchrun".into());
    meta.run_id = Some(run_id.into());
    meta.pid = 10_000 + rank;
    meta.started_unix_ms += u64::from(rank);
    let device = profile.summary.peak_device.clone();
    let activation_at_peak = profile
        .summary
        .peak_by_category
        .get(&Category::Activation)
        .copied()
        .unwrap_or(0);
    let peak_ts = profile.summary.peak_timestamp_ns;
    for point in profile.timeline.iter_mut().filter(|p| p.device == device) {
        let here = point
            .by_category
            .get(&Category::Activation)
            .copied()
            .unwrap_or(0);
        let add = if activation_at_peak == 0 {
            if point.timestamp_ns == peak_ts && point.live_bytes == profile.summary.peak_bytes {
                extra
            } else {
                0
            }
        } else {
            (extra as u128 * u128::from(here) / u128::from(activation_at_peak)) as u64
        };
        point.live_bytes += add;
        if add > 0 {
            *point.by_category.entry(Category::Activation).or_default() += add;
        }
    }
    profile.summary.peak_bytes += extra;
    let (peak, peak_ts) = (
        profile.summary.peak_bytes,
        profile.summary.peak_timestamp_ns,
    );
    let open: Vec<u32> = profile
        .span_events
        .iter()
        .filter(|e| e.start_ns <= peak_ts && peak_ts < e.start_ns + e.duration_ns)
        .map(|e| e.span)
        .collect();
    for id in open {
        if let Some(node) = profile.spans.get_mut(id as usize) {
            node.peak_bytes = node.peak_bytes.max(peak);
        }
    }
    *profile
        .summary
        .peak_by_category
        .entry(Category::Activation)
        .or_default() += extra;
    if let Some(stats) = profile.devices.iter_mut().find(|d| d.device == device) {
        stats.peak_bytes += extra;
        *stats
            .peak_by_category
            .entry(Category::Activation)
            .or_default() += extra;
    }
    if extra == 0 {
        return profile;
    }
    profile.peak_breakdown.insert(0, {
        let mut peak_row = PeakRow::default();
        peak_row.span_path = format!("stage{rank}/extra_layers");
        peak_row.op = Some("matmul".into());
        peak_row.category = Category::Activation;
        peak_row.device = device;
        peak_row.bytes = extra;
        peak_row.count = 1;
        peak_row
    });
    profile
}
