//! The leak signal: when a growing residual across iterations becomes a warning.

use crate::profile::{IterationResidual, Warning};

/// Iterations looked at by the leak rule, and the fewest it needs.
pub(super) const LEAK_WINDOW: usize = 16;
pub(super) const LEAK_MIN_ITERATIONS: usize = 8;

/// The leak signal: over the last [`LEAK_WINDOW`] iteration deltas (at least
/// [`LEAK_MIN_ITERATIONS`] of them; the first iteration has none), at least 80 % grew and the
/// total growth is positive.
pub(super) fn leak_warning(iterations: &[IterationResidual]) -> Option<Warning> {
    let deltas: Vec<i64> = iterations.iter().skip(1).map(|i| i.delta_bytes).collect();
    let window = &deltas[deltas.len().saturating_sub(LEAK_WINDOW)..];
    if window.len() < LEAK_MIN_ITERATIONS {
        return None;
    }
    let grew = window.iter().filter(|&&d| d > 0).count();
    let total: i64 = window.iter().fold(0i64, |sum, &d| sum.saturating_add(d));
    if grew * 5 < window.len() * 4 || total <= 0 {
        return None;
    }
    let span = iterations.first().map_or("", |i| i.span.as_str());
    // What the run kept in all: from the end of the first iteration to the end of the last.
    let (first, last) = (iterations.first()?, iterations.last()?);
    Some(Warning::GrowingResidual {
        span: span.to_string(),
        window: window.len() as u64,
        grew: grew as u64,
        total_bytes: total,
        per_iteration_bytes: total / window.len() as i64,
        // The list may be a sample; indices count every iteration.
        iterations: last.index.saturating_add(1),
        run_growth_bytes: super::super::iterations::signed_delta(first.live_bytes, last.live_bytes),
    })
}
