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
//! with probability 1 ([`crate::model::sample_probability`] keeps the same rule). The
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

/// Allocations of at least `ALWAYS_SAMPLED_MEANS * R` bytes are always sampled (the rule the
/// analysis weighs samples by).
pub(crate) use crate::model::ALWAYS_SAMPLED_MEANS;

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

/// What the slow path decided for one allocation: whether it is sampled, and the countdown
/// that follows, split at the cap the fast path compares with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Step {
    pub(crate) sampled: bool,
    /// Bytes left, capped at [`always_sampled_from`]: what the fast path subtracts from.
    pub(crate) left: u64,
    /// The rest of the distance, beyond the cap.
    pub(crate) beyond: u64,
}

/// The slow path for an allocation of `size` bytes, with `left` bytes of the distance left
/// (the capped countdown and what is beyond it), or `None` to draw afresh (a new gate
/// opening, with its own mean).
pub(crate) fn step(state: &mut u64, mean: u64, left: Option<u64>, size: u64) -> Step {
    let left = left.unwrap_or_else(|| next_distance(state, mean));
    let always = always_sampled_from(mean);
    let sampled = size >= left || size >= always;
    // A sample drawn by the countdown starts a new distance; an allocation sampled for its
    // size alone uses up its bytes of the distance like any other (what is left is still
    // exponential, so later allocations are sampled independently of it).
    let left = if size >= left {
        next_distance(state, mean)
    } else {
        left - size
    };
    let capped = left.min(always);
    Step {
        sampled,
        left: capped,
        beyond: left - capped,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The hook's countdown: the fast path's subtraction, and [`step`] when it runs out.
    struct Countdown {
        state: u64,
        mean: u64,
        left: u64,
        beyond: u64,
        drawn: bool,
    }

    impl Countdown {
        fn new(state: u64, mean: u64) -> Countdown {
            Countdown {
                state,
                mean,
                left: 0,
                beyond: 0,
                drawn: false,
            }
        }

        /// A new gate opening: the next allocation draws afresh.
        fn reopen(&mut self) {
            self.drawn = false;
        }

        fn sampled(&mut self, size: u64) -> bool {
            if self.drawn && size < self.left {
                self.left -= size;
                return false;
            }
            let left = self.drawn.then_some(self.left + self.beyond);
            let step = step(&mut self.state, self.mean, left, size);
            self.drawn = true;
            self.left = step.left;
            self.beyond = step.beyond;
            step.sampled
        }
    }

    /// Issue 12's estimate test, run through the countdown alone: 6 blocks of 3 MiB, 100,000
    /// of 96 bytes and 1,500 of 12 KiB per gate opening. Each allocation of `s` bytes must be
    /// sampled with probability `1 - e^(-s/R)` whatever came before it (the cap at `4R` and
    /// the distance kept beyond it included), and those of `4R` or more always: the counts are
    /// binomial, in total and run by run (their variance is their mean, not more).
    #[test]
    fn the_countdown_samples_each_allocation_with_its_probability() {
        let r = 512 * 1024;
        let runs = 300;
        let mut countdown = Countdown::new(seed(3, 5), r);
        let classes = [(6u64, 3u64 << 20), (100_000, 96), (1_500, 12 << 10)];
        let mut per_run = vec![[0u64; 3]; runs];
        for counts in &mut per_run {
            countdown.reopen();
            for (class, &(count, size)) in classes.iter().enumerate() {
                for _ in 0..count {
                    counts[class] += u64::from(countdown.sampled(size));
                }
            }
        }
        let total = |class: usize| per_run.iter().map(|c| c[class]).sum::<u64>();
        assert_eq!(total(0), 6 * runs as u64, "every 3 MiB block is sampled");
        for (class, &(count, size)) in classes.iter().enumerate().skip(1) {
            let p = -(-(size as f64) / r as f64).exp_m1();
            let n = (count * runs as u64) as f64;
            let (mean, sd) = (n * p, (n * p * (1.0 - p)).sqrt());
            let got = total(class) as f64;
            // Five standard deviations of a binomial count of 5,500 or 10,400: 6e-7.
            assert!(
                (got - mean).abs() < 5.0 * sd,
                "{size} B: {got} samples, expected {mean} ± {sd}"
            );
            // Over-dispersion (samples lost or doubled run by run) would show in the spread of
            // the runs' counts: the sample variance of 300 runs (299 degrees of freedom, a
            // relative error of √(2/299) = 8 %) is 45 % above its expected value in 6e-7 of
            // cases (Wilson–Hilferty), 45 % below far more rarely.
            let run_mean = got / runs as f64;
            let variance = per_run
                .iter()
                .map(|c| (c[class] as f64 - run_mean).powi(2))
                .sum::<f64>()
                / (runs - 1) as f64;
            let expected = count as f64 * p * (1.0 - p);
            assert!(
                (variance / expected - 1.0).abs() < 0.45,
                "{size} B: run counts vary by {variance}, expected {expected}"
            );
        }
    }

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
