//! One rank's row: what its profile says about its peak, read the same way for every rank.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::model::{Category, Step};
use crate::{Profile, SpanEvent, SpanMetrics};

/// Iterations left out at the start of the residual growth: the first one fills caches.
pub const GROWTH_WARMUPS: u64 = 1;

/// When in the run a rank peaked, in iterations of its top-level span.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "at", rename_all = "snake_case")]
#[non_exhaustive]
pub enum PeakWhen {
    /// During an iteration: `first` = `last` when the profile lists the iterations around the
    /// peak, else the peak lies in one of `first..=last` (a long run's listed iterations are a
    /// sample).
    Iteration {
        /// The span that marks iterations.
        span: String,
        /// The first iteration it may be.
        first: u64,
        /// The last iteration it may be.
        last: u64,
    },
    /// Before the first iteration started (loading, building the model).
    BeforeIterations {
        /// The span that marks iterations.
        span: String,
    },
    /// After the last iteration ended.
    AfterIterations {
        /// The span that marks iterations.
        span: String,
        /// The last iteration.
        last: u64,
    },
    /// The profile has no iterations (no top-level span entered more than once).
    NoIterations,
}

/// A span path and bytes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SpanBytes {
    /// Span names from the outermost, joined with `/`; empty outside every span.
    pub path: String,
    /// Bytes.
    pub bytes: u64,
}

/// One rank of a run, as its profile has it.
///
/// Every field is read from that rank's profile alone ([`RankRow::from_profile`]), so a row
/// equals what the profile says whichever way it was loaded.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct RankRow {
    /// The profile file.
    pub file: PathBuf,
    /// The rank ([`RunMeta::rank`](crate::RunMeta::rank)).
    pub rank: u32,
    /// The world size the rank was told.
    pub world_size: Option<u32>,
    /// The rank on its host, when known.
    pub local_rank: Option<u32>,
    /// The host it ran on.
    pub host: String,
    /// Its process id.
    pub pid: u32,
    /// `true` when the profile is a checkpoint: the rank had not finished when it was written
    /// (still running, or it died).
    pub partial: bool,
    /// Run time the profile covers, ns.
    pub duration_ns: u64,
    /// Highest live bytes on any one device.
    pub peak_bytes: u64,
    /// The device of the peak.
    pub peak_device: String,
    /// When the peak was reached, ns since the rank's session started.
    pub peak_timestamp_ns: u64,
    /// The iteration the peak fell in.
    pub peak_when: PeakWhen,
    /// The training step open at the peak (the innermost recorded span instance covering it
    /// that has one, or whose ancestor has one), when one is recorded.
    pub peak_step: Option<Step>,
    /// The innermost recorded span covering the peak, its path.
    pub peak_span: Option<String>,
    /// Live bytes at the peak by category.
    pub peak_by_category: BTreeMap<Category, u64>,
    /// The span path that held the most bytes on the peak's device at the peak.
    pub top_span: Option<SpanBytes>,
    /// Iterations the run had (the last listed index plus one; 0 without iterations).
    pub iterations: u64,
    /// Mean growth of live bytes per iteration from the first iteration after
    /// [`GROWTH_WARMUPS`] to the last: the leak signal. `None` with fewer than two such
    /// iterations.
    pub growth_per_iteration: Option<f64>,
    /// The peak device's capacity, when the profile recorded one (a pool's, or the device's
    /// total memory from its driver).
    pub capacity_bytes: Option<u64>,
    /// The allocation log the rank wrote, as its profile names it.
    pub alloc_log: Option<String>,
}

impl RankRow {
    /// The row of `profile`, read from `file`; `None` when the profile records no rank.
    pub fn from_profile(profile: &Profile, file: &Path) -> Option<RankRow> {
        let meta = &profile.meta;
        let summary = &profile.summary;
        let (peak_span, peak_step) = span_at_peak(profile);
        Some(RankRow {
            file: file.to_path_buf(),
            rank: meta.rank?,
            world_size: meta.world_size,
            local_rank: meta.local_rank,
            host: meta.host.clone(),
            pid: meta.pid,
            partial: meta.partial,
            duration_ns: summary.duration_ns,
            peak_bytes: summary.peak_bytes,
            peak_device: summary.peak_device.clone(),
            peak_timestamp_ns: summary.peak_timestamp_ns,
            peak_when: peak_when(profile),
            peak_step,
            peak_span,
            peak_by_category: summary.peak_by_category.clone(),
            top_span: top_span(profile),
            iterations: profile.iterations.last().map_or(0, |i| i.index + 1),
            growth_per_iteration: growth_per_iteration(profile),
            capacity_bytes: profile
                .devices
                .iter()
                .find(|d| d.device == summary.peak_device)
                .and_then(|d| d.capacity_bytes),
            alloc_log: meta.alloc_log.clone(),
        })
    }
}

/// Where the iteration ending at `end` started: the latest top-level instance of `span` that
/// started by then, when the profile recorded one.
pub(crate) fn iteration_start(
    spans: &[SpanMetrics],
    events: &[SpanEvent],
    span: &str,
    end: u64,
) -> Option<u64> {
    events
        .iter()
        .filter(|e| e.depth == 0 && e.start_ns <= end)
        .filter(|e| spans.get(e.span as usize).is_some_and(|n| n.name == span))
        .map(|e| e.start_ns)
        .max()
}

fn peak_when(profile: &Profile) -> PeakWhen {
    let peak = profile.summary.peak_timestamp_ns;
    let rows = &profile.iterations;
    let (Some(first), Some(last)) = (rows.first(), rows.last()) else {
        return PeakWhen::NoIterations;
    };
    let span = first.span.clone();
    let Some(k) = rows.iter().position(|row| row.end_timestamp_ns >= peak) else {
        return PeakWhen::AfterIterations {
            span,
            last: last.index,
        };
    };
    if k == 0 {
        let started = iteration_start(
            &profile.spans,
            &profile.span_events,
            &span,
            first.end_timestamp_ns,
        );
        if started.is_some_and(|start| peak < start) {
            return PeakWhen::BeforeIterations { span };
        }
        return PeakWhen::Iteration {
            span,
            first: 0,
            last: first.index,
        };
    }
    PeakWhen::Iteration {
        span,
        first: rows[k - 1].index + 1,
        last: rows[k].index,
    }
}

/// The innermost recorded span instance open at the peak (its path), and the step of the
/// innermost one that has a step (its own or an ancestor's). An instance is open from its
/// enter until its exit, the exit excluded.
fn span_at_peak(profile: &Profile) -> (Option<String>, Option<Step>) {
    let peak = profile.summary.peak_timestamp_ns;
    let mut covering: Vec<_> = profile
        .span_events
        .iter()
        .filter(|e| e.start_ns <= peak && peak < e.start_ns.saturating_add(e.duration_ns))
        .collect();
    // Innermost first; among equals, the latest started (nested spans start later).
    covering.sort_by_key(|e| (std::cmp::Reverse(e.depth), std::cmp::Reverse(e.start_ns)));
    let path = covering.first().map(|e| profile.span_path(e.span));
    let step = covering.iter().find_map(|e| step_of(profile, e.span));
    (path, step)
}

/// The step of span node `id` or of its nearest ancestor that has one.
fn step_of(profile: &Profile, id: u32) -> Option<Step> {
    let mut at = Some(id);
    for _ in 0..=profile.spans.len() {
        let node = profile.spans.get(at? as usize)?;
        if node.step.is_some() {
            return node.step;
        }
        at = node.parent;
    }
    None
}

/// The span path holding the most of the peak device's bytes at the peak.
fn top_span(profile: &Profile) -> Option<SpanBytes> {
    let mut by_path: BTreeMap<&str, u64> = BTreeMap::new();
    for row in &profile.peak_breakdown {
        if row.device == profile.summary.peak_device {
            *by_path.entry(row.span_path.as_str()).or_default() += row.bytes;
        }
    }
    // The largest; the first path in order among equals.
    let (path, bytes) = by_path
        .into_iter()
        .fold(None::<(&str, u64)>, |best, (path, bytes)| match best {
            Some((_, most)) if most >= bytes => best,
            _ => Some((path, bytes)),
        })?;
    Some(SpanBytes {
        path: path.to_string(),
        bytes,
    })
}

/// Mean growth of live bytes per iteration after the warm-ups (rows may be a sample: their
/// indices say how many iterations lie between).
fn growth_per_iteration(profile: &Profile) -> Option<f64> {
    let mut rows = profile
        .iterations
        .iter()
        .filter(|row| row.index >= GROWTH_WARMUPS);
    let first = rows.next()?;
    let last = rows.next_back()?;
    (last.index > first.index).then(|| {
        (last.live_bytes as f64 - first.live_bytes as f64) / (last.index - first.index) as f64
    })
}
