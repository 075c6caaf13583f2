//! Building a rank's memory curve ([`RankCurve`]) on an axis every rank shares: iterations.
//!
//! Ranks start at different moments and run at different speeds, so their clocks do not line
//! up; their iterations do. Each point's time is mapped to an iteration coordinate: iteration
//! `i` spans `[i, i + 1)`, each stretch between two listed iteration ends maps linearly onto
//! the iterations it holds, the time before the first iteration is squeezed into `[-1, 0)` and
//! the time after the last into one unit after it. A rank without iterations is drawn over the
//! run's length instead (`[0, 1)`).

use super::RankCurve;
use crate::{IterationResidual, SpanEvent, SpanMetrics};

/// What the mapping from time to the iteration axis is built from.
pub(crate) struct Axis {
    /// `(time, x)` knots, ascending in both; linear between them.
    knots: Vec<(u64, f64)>,
    by_iteration: bool,
}

impl Axis {
    /// The axis of a rank with `iterations` (its listed rows), its span instances (to find
    /// where the first listed iteration started) and the run's length.
    pub(crate) fn new(
        iterations: &[IterationResidual],
        spans: &[SpanMetrics],
        events: &[SpanEvent],
        duration_ns: u64,
    ) -> Axis {
        let (Some(first), Some(last)) = (iterations.first(), iterations.last()) else {
            return Axis {
                knots: vec![(0, 0.0), (duration_ns.max(1), 1.0)],
                by_iteration: false,
            };
        };
        // A typical iteration's length, for the first one's start when no instance says.
        let mut lengths: Vec<u64> = iterations
            .windows(2)
            .filter_map(|w| {
                let iterations = w[1].index.checked_sub(w[0].index)?.max(1);
                let time = w[1].end_timestamp_ns.checked_sub(w[0].end_timestamp_ns)?;
                Some(time / iterations)
            })
            .collect();
        lengths.sort_unstable();
        let typical = lengths.get(lengths.len() / 2).copied().unwrap_or(0);
        let recorded_start = iteration_start(spans, events, &first.span, first.end_timestamp_ns);
        let start = recorded_start
            .unwrap_or_else(|| first.end_timestamp_ns.saturating_sub(typical))
            .min(first.end_timestamp_ns);
        let index = first.index as f64;
        let mut knots = Vec::with_capacity(iterations.len() + 3);
        if start > 0 {
            knots.push((0, index - 1.0));
        }
        knots.push((start, index));
        for row in iterations {
            knots.push((row.end_timestamp_ns, row.index as f64 + 1.0));
        }
        if duration_ns > last.end_timestamp_ns {
            knots.push((duration_ns, last.index as f64 + 2.0));
        }
        // Strictly increasing in time (a hand-made profile may repeat an end): the first wins.
        knots.dedup_by(|later, earlier| later.0 <= earlier.0 || later.1 <= earlier.1);
        Axis {
            knots,
            by_iteration: true,
        }
    }

    /// Where time `t` lies on the axis.
    pub(crate) fn x(&self, t: u64) -> f64 {
        let k = self.knots.partition_point(|&(time, _)| time <= t);
        match (k.checked_sub(1).map(|i| self.knots[i]), self.knots.get(k)) {
            (Some((t0, x0)), Some(&(t1, x1))) => {
                x0 + (x1 - x0) * (t - t0) as f64 / (t1 - t0) as f64
            }
            (Some((_, x0)), None) => x0,
            (None, Some(&(_, x1))) => x1,
            (None, None) => 0.0,
        }
    }
}

/// Where the iteration ending at `end` started: the latest top-level instance of `span` that
/// started by then, when the profile recorded one (for the curves' axis).
fn iteration_start(
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

/// The curve of `(time, bytes)` points, at most `max_points` (each bucket's highest, the
/// peak `peak_at` always kept).
pub(crate) fn curve(
    rank: u32,
    axis: &Axis,
    points: &[(u64, u64)],
    peak_at: Option<usize>,
    max_points: usize,
) -> RankCurve {
    let keep = downsample(points, max_points.max(2), peak_at);
    RankCurve {
        rank,
        by_iteration: axis.by_iteration,
        x: keep.iter().map(|&i| axis.x(points[i].0) as f32).collect(),
        bytes: keep.iter().map(|&i| points[i].1).collect(),
    }
}

/// Indices of at most `max` points: the highest of each of `max - 1` equal buckets, and
/// `must` (if given) in place of its bucket's.
fn downsample(points: &[(u64, u64)], max: usize, must: Option<usize>) -> Vec<usize> {
    if points.len() <= max {
        return (0..points.len()).collect();
    }
    let buckets = max - 1;
    let mut keep = Vec::with_capacity(max);
    for b in 0..buckets {
        let lo = b * points.len() / buckets;
        let hi = ((b + 1) * points.len() / buckets).max(lo + 1);
        let chosen = match must {
            Some(m) if (lo..hi).contains(&m) => m,
            _ => (lo..hi)
                .max_by_key(|&i| (points[i].1, std::cmp::Reverse(i)))
                .unwrap_or(lo),
        };
        keep.push(chosen);
    }
    if keep.last() != Some(&(points.len() - 1)) {
        keep.push(points.len() - 1);
    }
    keep
}

#[cfg(test)]
mod tests {
    use super::*;

    fn iteration(index: u64, end: u64) -> IterationResidual {
        IterationResidual {
            index,
            span: "step".into(),
            end_timestamp_ns: end,
            live_bytes: 0,
            delta_bytes: 0,
        }
    }

    #[test]
    fn iterations_of_different_lengths_line_up() {
        // Two ranks: one takes 10 per iteration after a setup of 50, the other 30 after 5.
        let fast = Axis::new(
            &[iteration(0, 60), iteration(1, 70), iteration(2, 80)],
            &[],
            &[],
            100,
        );
        let slow = Axis::new(
            &[iteration(0, 35), iteration(1, 65), iteration(2, 95)],
            &[],
            &[],
            100,
        );
        for (axis, mid_1) in [(&fast, 65), (&slow, 50)] {
            assert!((axis.x(mid_1) - 1.5).abs() < 1e-9, "{}", axis.x(mid_1));
        }
        // The setup is squeezed before iteration 0, the tail after the last.
        assert!((fast.x(0) - -1.0).abs() < 1e-9);
        assert!((fast.x(50) - 0.0).abs() < 1e-9, "{}", fast.x(50));
        assert!((fast.x(100) - 4.0).abs() < 1e-9);
        assert!(fast.by_iteration);
    }

    #[test]
    fn a_sampled_gap_spreads_over_the_iterations_it_holds() {
        let axis = Axis::new(&[iteration(0, 10), iteration(10, 110)], &[], &[], 110);
        assert!((axis.x(60) - 6.0).abs() < 1e-9, "{}", axis.x(60));
    }

    #[test]
    fn without_iterations_the_axis_is_the_run() {
        let axis = Axis::new(&[], &[], &[], 200);
        assert!(!axis.by_iteration);
        assert!((axis.x(100) - 0.5).abs() < 1e-9);
    }

    #[test]
    fn a_long_curve_keeps_its_peak_and_stays_bounded() {
        let points: Vec<(u64, u64)> = (0..10_000u64).map(|i| (i, i % 97)).collect();
        let axis = Axis::new(&[], &[], &[], 10_000);
        let mut with_peak = points.clone();
        with_peak[4321].1 = 1_000;
        let c = curve(3, &axis, &with_peak, Some(4321), 100);
        assert!(c.x.len() <= 100);
        assert_eq!(c.bytes.iter().max(), Some(&1_000));
        assert!(c.x.windows(2).all(|w| w[0] <= w[1]));
    }
}
