//! Comparing two profiles: what grew and what shrank.

use std::collections::{BTreeMap, BTreeSet};

use serde::Serialize;

use highwater_profile::model::Category;
use highwater_profile::Profile;
#[cfg(test)]
use highwater_profile::SpanMetrics;

/// The difference `after - before` as an `i64`, saturating at the ends of its range.
fn signed_delta(before: u64, after: u64) -> i64 {
    let delta = i128::from(after) - i128::from(before);
    delta.clamp(i128::from(i64::MIN), i128::from(i64::MAX)) as i64
}

/// A figure in the two profiles and its change.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Delta {
    /// Value in the first (baseline) profile.
    pub before: u64,
    /// Value in the second profile.
    pub after: u64,
    /// `after - before`, saturating.
    pub delta: i64,
}

impl Delta {
    /// The change from `before` to `after`.
    pub fn new(before: u64, after: u64) -> Delta {
        Delta {
            before,
            after,
            delta: signed_delta(before, after),
        }
    }
}

/// How live-at-peak bytes of one category changed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct CategoryDelta {
    /// The category (written as its lower-case name).
    pub category: Category,
    /// Bytes of the category live at each profile's peak.
    pub bytes: Delta,
}

/// How one node of the span tree changed, matched by path.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct SpanDelta {
    /// Span path (names joined with `/`).
    pub path: String,
    /// Whether the path exists in the baseline.
    pub in_before: bool,
    /// Whether the path exists in the second profile.
    pub in_after: bool,
    /// Highest live bytes while the span was open.
    pub peak_bytes: Delta,
    /// Bytes allocated inside and still live at exit, all calls added up.
    pub residual_bytes: Delta,
    /// The residual of one call, averaged over the span's calls (what the text shows).
    pub residual_per_call: Delta,
    /// Bytes allocated inside.
    pub bytes_allocated: Delta,
}

impl SpanDelta {
    /// The largest absolute change among the span's figures; what [`diff`] sorts by.
    pub fn magnitude(&self) -> u64 {
        [
            self.peak_bytes,
            self.residual_per_call,
            self.bytes_allocated,
        ]
        .iter()
        .map(|d| d.delta.unsigned_abs())
        .max()
        .unwrap_or(0)
    }
}

/// The difference between two profiles, from a baseline to a second run.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ProfileDiff {
    /// The global peak.
    pub peak_bytes: Delta,
    /// Device of the baseline's peak.
    pub peak_device_before: String,
    /// Device of the second profile's peak.
    pub peak_device_after: String,
    /// Bytes live when each session ended.
    pub final_live_bytes: Delta,
    /// Bytes allocated over each session.
    pub total_alloc_bytes: Delta,
    /// Live-at-peak bytes per category, largest absolute change first.
    pub categories: Vec<CategoryDelta>,
    /// Spans that changed, matched by path, largest absolute change first; unchanged spans are
    /// left out.
    pub spans: Vec<SpanDelta>,
}

/// Compares `before` (the baseline) with `after`.
///
/// Categories present in either profile are compared (missing counts as zero). Spans are matched
/// by path; a span in only one profile compares with zeros and says which side it is on. When a
/// damaged profile repeats a path, its first node counts.
pub fn diff(before: &Profile, after: &Profile) -> ProfileDiff {
    let names: BTreeSet<Category> = before
        .summary
        .peak_by_category
        .keys()
        .chain(after.summary.peak_by_category.keys())
        .copied()
        .collect();
    let mut categories: Vec<CategoryDelta> = names
        .into_iter()
        .map(|name| CategoryDelta {
            category: name,
            bytes: Delta::new(
                before
                    .summary
                    .peak_by_category
                    .get(&name)
                    .copied()
                    .unwrap_or(0),
                after
                    .summary
                    .peak_by_category
                    .get(&name)
                    .copied()
                    .unwrap_or(0),
            ),
        })
        .collect();
    categories.sort_by(|a, b| {
        b.bytes
            .delta
            .unsigned_abs()
            .cmp(&a.bytes.delta.unsigned_abs())
            .then_with(|| a.category.as_str().cmp(b.category.as_str()))
    });

    let by_path = |profile: &Profile| {
        let mut map: BTreeMap<String, (u64, u64, u64, u64)> = BTreeMap::new();
        for (span, path) in profile.spans.iter().zip(profile.span_paths()) {
            map.entry(path).or_insert((
                span.peak_bytes,
                span.residual_bytes,
                span.bytes_allocated,
                span.residual_per_call(),
            ));
        }
        map
    };
    let old = by_path(before);
    let new = by_path(after);
    let paths: BTreeSet<&String> = old.keys().chain(new.keys()).collect();
    let mut spans: Vec<SpanDelta> = paths
        .into_iter()
        .map(|path| {
            let a = old.get(path).copied();
            let b = new.get(path).copied();
            let (pa, ra, aa, ca) = a.unwrap_or_default();
            let (pb, rb, ab, cb) = b.unwrap_or_default();
            SpanDelta {
                path: path.clone(),
                in_before: a.is_some(),
                in_after: b.is_some(),
                peak_bytes: Delta::new(pa, pb),
                residual_bytes: Delta::new(ra, rb),
                residual_per_call: Delta::new(ca, cb),
                bytes_allocated: Delta::new(aa, ab),
            }
        })
        .filter(|span| span.magnitude() > 0 || span.in_before != span.in_after)
        .collect();
    spans.sort_by(|a, b| {
        b.magnitude()
            .cmp(&a.magnitude())
            .then_with(|| a.path.cmp(&b.path))
    });

    ProfileDiff {
        peak_bytes: Delta::new(before.summary.peak_bytes, after.summary.peak_bytes),
        peak_device_before: before.summary.peak_device.clone(),
        peak_device_after: after.summary.peak_device.clone(),
        final_live_bytes: Delta::new(
            before.summary.final_live_bytes,
            after.summary.final_live_bytes,
        ),
        total_alloc_bytes: Delta::new(
            before.summary.total_alloc_bytes,
            after.summary.total_alloc_bytes,
        ),
        categories,
        spans,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Span node `id` at `path`; its parent is node 0 unless it is top level.
    fn span(id: u32, path: &str, peak: u64, residual: u64, allocated: u64) -> SpanMetrics {
        let mut span_metrics = SpanMetrics::default();
        span_metrics.id = id;
        span_metrics.parent = path.contains('/').then_some(0);
        span_metrics.name = path.rsplit('/').next().unwrap_or(path).to_string();
        span_metrics.peak_bytes = peak;
        span_metrics.residual_bytes = residual;
        span_metrics.bytes_allocated = allocated;
        span_metrics
    }

    #[test]
    fn spans_are_matched_by_path_and_sorted_by_largest_change() {
        let mut a = Profile::empty();
        a.summary.peak_bytes = 100;
        a.summary.peak_by_category.insert(Category::Activation, 60);
        a.summary.peak_by_category.insert(Category::Parameter, 40);
        a.spans = vec![
            span(0, "step", 100, 0, 500),
            span(1, "step/forward", 80, 10, 300),
            span(2, "step/gone", 5, 0, 5),
        ];
        let mut b = a.clone();
        b.summary.peak_bytes = 70;
        b.summary.peak_by_category.insert(Category::Activation, 30);
        b.summary.peak_by_category.insert(Category::Gradient, 5);
        b.spans = vec![
            span(0, "step", 100, 0, 500),
            span(1, "step/forward", 50, 10, 300),
            span(2, "step/new", 0, 7, 7),
        ];
        let d = diff(&a, &b);
        assert_eq!(d.peak_bytes.delta, -30);
        let cats: Vec<_> = d
            .categories
            .iter()
            .map(|c| (c.category.as_str(), c.bytes.delta))
            .collect();
        assert_eq!(
            cats,
            [("activation", -30), ("gradient", 5), ("parameter", 0)]
        );
        let paths: Vec<_> = d.spans.iter().map(|s| s.path.as_str()).collect();
        assert_eq!(paths, ["step/forward", "step/new", "step/gone"]);
        assert!(!d.spans[1].in_before && d.spans[1].in_after);
        assert!(d.spans[2].in_before && !d.spans[2].in_after);
    }

    #[test]
    fn identical_profiles_have_no_span_changes() {
        let mut a = Profile::empty();
        a.spans = vec![span(0, "step", 1, 2, 3)];
        let d = diff(&a, &a);
        assert!(d.spans.is_empty());
        assert_eq!(d.peak_bytes.delta, 0);
    }
}
