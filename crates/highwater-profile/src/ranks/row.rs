//! One rank's row: what its profile says about its peak, read the same way for every rank.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::Serialize;

use crate::model::{Category, Step};
use crate::Profile;

/// Iterations left out at the start of the residual growth: the first one fills caches.
pub const GROWTH_WARMUPS: u64 = 1;

/// When in the run a rank peaked, in iterations of its top-level span.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[cfg_attr(feature = "read", derive(serde::Deserialize))]
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
    /// Between two iterations, outside the iteration span (an evaluation pass between training
    /// steps, say).
    BetweenIterations {
        /// The span that marks iterations.
        span: String,
        /// The iteration just before, when the profile lists it (else the peak lies after one of
        /// `after..`, a long run's listed iterations being a sample).
        after: u64,
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
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[cfg_attr(feature = "read", derive(serde::Deserialize))]
#[non_exhaustive]
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
#[derive(Debug, Clone, PartialEq, Serialize)]
#[cfg_attr(feature = "read", derive(serde::Deserialize))]
#[non_exhaustive]
pub struct RankRow {
    /// The profile file.
    #[serde(serialize_with = "super::lossy_path")]
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
    /// The training step of [`RankRow::peak_span`] (its own, or its nearest ancestor's).
    pub peak_step: Option<Step>,
    /// The innermost span open at the peak, its path: the deepest span whose own peak is the
    /// run's (when several reached it, their closest common span). `None` outside every span.
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

/// When the peak came, from the listed iterations' ends and whether the iteration span was open
/// at the peak (its own peak is the run's).
fn peak_when(profile: &Profile) -> PeakWhen {
    let peak = profile.summary.peak_timestamp_ns;
    let rows = &profile.iterations;
    let (Some(first), Some(last)) = (rows.first(), rows.last()) else {
        return PeakWhen::NoIterations;
    };
    let span = first.span.clone();
    let inside = profile.spans.iter().any(|n| {
        n.parent.is_none() && n.name == span && n.peak_bytes >= profile.summary.peak_bytes
    });
    let Some(k) = rows.iter().position(|row| row.end_timestamp_ns >= peak) else {
        return PeakWhen::AfterIterations {
            span,
            last: last.index,
        };
    };
    match (inside, k) {
        (false, 0) => PeakWhen::BeforeIterations { span },
        (false, k) => PeakWhen::BetweenIterations {
            span,
            after: rows[k - 1].index,
        },
        (true, 0) => PeakWhen::Iteration {
            span,
            first: 0,
            last: first.index,
        },
        (true, k) => PeakWhen::Iteration {
            span,
            first: rows[k - 1].index + 1,
            last: rows[k].index,
        },
    }
}

/// The innermost span open at the peak (its path) and its step (its own or its nearest
/// ancestor's), from the span tree's metrics alone: a span whose own peak is the run's was open
/// when the peak was reached. The deepest such span, or when the peak was reached in several
/// (spans neither of which holds the other: forward of one step and backward of another), their
/// closest common span.
fn span_at_peak(profile: &Profile) -> (Option<String>, Option<Step>) {
    let spans = &profile.spans;
    let peak = profile.summary.peak_bytes;
    let at_peak: Vec<bool> = spans
        .iter()
        .map(|n| peak > 0 && n.peak_bytes >= peak)
        .collect();
    // A span at the peak with no child at the peak is a place the peak was reached.
    let mut has_child = vec![false; spans.len()];
    for node in spans {
        if let Some(parent) = node.parent.map(|p| p as usize) {
            if at_peak[node.id as usize] && parent < spans.len() {
                has_child[parent] = true;
            }
        }
    }
    let mut places = (0..spans.len()).filter(|&i| at_peak[i] && !has_child[i]);
    let Some(first) = places.next() else {
        return (None, None);
    };
    let ancestors = |id: usize| -> Vec<usize> {
        let mut chain = vec![id];
        let mut at = spans[id].parent;
        while let Some(parent) = at.map(|p| p as usize).filter(|&p| p < id) {
            chain.push(parent);
            at = spans[parent].parent;
        }
        chain
    };
    // The closest span that holds every place: the longest common tail of their chains.
    let mut common = ancestors(first);
    for place in places {
        let other = ancestors(place);
        let shared = common
            .iter()
            .rev()
            .zip(other.iter().rev())
            .take_while(|(a, b)| a == b)
            .count();
        common.drain(..common.len() - shared);
    }
    match common.first() {
        Some(&id) => (
            Some(profile.span_path(id as u32)),
            step_of(profile, id as u32),
        ),
        None => (None, None),
    }
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
