//! Sampling by bytes: how far a thread counts down before its next call-site sample.
//!
//! Each thread keeps a countdown of bytes. An allocation smaller than what is left subtracts
//! its size (the fast path: a subtraction and a branch); the one that reaches it is sampled,
//! and a new distance is drawn from an exponential distribution with mean `R`. Allocations are
//! thus the points of a Poisson process over allocated bytes: one of `s` bytes is sampled with
//! probability `1 - e^(-s/R)`, whatever came before it, which the analysis undoes by weighting.
//!
//! An allocation of at least `4R` bytes is always sampled (it would be 98 % of the time
//! anyway), so the blocks that make a peak always have their stacks; the analysis weighs them
//! with probability 1 ([`crate::analysis`]'s `sample_probability` keeps the same rule). The
//! countdown the fast path compares with is capped at `4R` so that such an allocation always
//! takes the slow path; the rest of the drawn distance is kept beside it.

use std::sync::atomic::{AtomicU64, Ordering};

/// Default mean bytes between samples (`R`): 512 KiB, as jemalloc's and tcmalloc's profilers.
pub(crate) const DEFAULT_SAMPLE_BYTES: u64 = 512 * 1024;

/// The session's `R`: `0` off, `1` every allocation. Set before the gate opens.
static MEAN_BYTES: AtomicU64 = AtomicU64::new(DEFAULT_SAMPLE_BYTES);

/// Sets the mean for countdowns drawn from the next gate opening on.
pub(crate) fn set_mean_bytes(mean: u64) {
    MEAN_BYTES.store(mean, Ordering::Relaxed);
}

/// The session's mean bytes between samples.
pub(crate) fn mean_bytes() -> u64 {
    MEAN_BYTES.load(Ordering::Relaxed)
}

/// Seeds a thread's generator: distinct per thread and per call (never zero).
pub(crate) fn seed(thread_word: usize, ticks: u64) -> u64 {
    static SEQUENCE: AtomicU64 = AtomicU64::new(0);
    let n = SEQUENCE.fetch_add(1, Ordering::Relaxed);
    let mixed = splitmix(ticks ^ splitmix(thread_word as u64 ^ n.wrapping_mul(0x9E37_79B9)));
    mixed | 1
}

fn splitmix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^ (x >> 31)
}

/// A uniform draw in `(0, 1]` from a xorshift64* generator (`state` never zero).
fn uniform(state: &mut u64) -> f64 {
    let mut x = *state;
    x ^= x >> 12;
    x ^= x << 25;
    x ^= x >> 27;
    *state = x;
    let bits = x.wrapping_mul(0x2545_F491_4F6C_DD1D) >> 11;
    (bits as f64 + 1.0) / (1u64 << 53) as f64
}

/// Allocations of at least `ALWAYS_SAMPLED_MEANS * R` bytes are always sampled.
pub(crate) const ALWAYS_SAMPLED_MEANS: u64 = 4;

// The analysis weighs samples by the same rule.
const _: () = assert!(ALWAYS_SAMPLED_MEANS == crate::analysis::ALWAYS_SAMPLED_MEANS);

/// The size from which every allocation is sampled: `4R`, `0` for `R = 1` (everything),
/// `u64::MAX` when sampling is off.
pub(crate) fn always_sampled_from(mean: u64) -> u64 {
    match mean {
        0 => u64::MAX,
        1 => 0,
        _ => mean.saturating_mul(ALWAYS_SAMPLED_MEANS),
    }
}

/// The next countdown for mean `mean`: `left` such that the allocation of `s` bytes that
/// finds `s >= left` is sampled. `0` (off) never samples, `1` samples every allocation.
pub(crate) fn next_distance(state: &mut u64, mean: u64) -> u64 {
    match mean {
        0 => u64::MAX,
        1 => 0,
        _ => {
            // An exponential draw X; `s > X` exactly when `s >= floor(X) + 1`.
            let x = -uniform(state).ln() * mean as f64;
            (x as u64).saturating_add(1)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn off_never_samples_and_one_samples_everything() {
        let mut state = seed(1, 2);
        assert_eq!(next_distance(&mut state, 0), u64::MAX);
        assert_eq!(next_distance(&mut state, 1), 0);
    }

    /// The countdown is exponential with mean `R`: its mean and the chance that an allocation
    /// of `R` bytes reaches it (`1 - 1/e`) match.
    #[test]
    fn distances_are_exponential_with_mean_r() {
        let mut state = seed(7, 11);
        let r = 512 * 1024;
        let n = 200_000;
        let draws: Vec<u64> = (0..n).map(|_| next_distance(&mut state, r)).collect();
        let mean = draws.iter().map(|&d| d as f64).sum::<f64>() / n as f64;
        // Standard error of the mean is R / sqrt(n) ≈ 0.22 % of R.
        assert!((mean / r as f64 - 1.0).abs() < 0.01, "mean {mean}");
        let reached = draws.iter().filter(|&&d| r >= d).count() as f64 / n as f64;
        let expected = 1.0 - (-1.0f64).exp();
        assert!(
            (reached - expected).abs() < 0.005,
            "{reached} vs {expected}"
        );
    }

    #[test]
    fn four_means_and_above_are_always_sampled() {
        assert_eq!(always_sampled_from(0), u64::MAX);
        assert_eq!(always_sampled_from(1), 0);
        assert_eq!(always_sampled_from(1000), 4000);
        assert_eq!(always_sampled_from(u64::MAX), u64::MAX);
    }

    #[test]
    fn seeds_differ_between_calls() {
        assert_ne!(seed(1, 1), seed(1, 1));
    }
}
