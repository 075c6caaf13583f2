//! The iteration series of one top-level span: live bytes at each of its exits, bounded.
//!
//! A training run can have millions of iterations, and the profile lists them, so the series
//! keeps at most [`MAX_ITERATIONS`] rows: an even sample (every `stride`-th exit, the stride
//! doubling whenever the sample is full, so O(1) amortised per exit) and, exactly, the last
//! [`RECENT`] exits the leak signal reads. Each row keeps its real iteration number and the
//! change since the iteration just before it, sampled or not.

use std::collections::VecDeque;

use crate::profile::MAX_ITERATIONS;

/// Exits kept exactly at the end of the series: the leak signal's window plus the one before.
pub(crate) const RECENT: usize = 32;

/// One exit of the span.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Exit {
    /// Iteration number, from 0.
    pub(crate) index: u64,
    /// When the span exited.
    pub(crate) ts: u64,
    /// Live bytes on all devices then.
    pub(crate) live: u64,
    /// Change since the previous exit (0 for the first).
    pub(crate) delta: i64,
}

/// Exits of one top-level span.
#[derive(Debug, Clone)]
pub(crate) struct IterationSeries {
    /// Exits so far.
    count: u64,
    /// Live bytes at the previous exit.
    last_live: Option<u64>,
    /// Every `stride`-th exit, at most `MAX_ITERATIONS - RECENT` of them.
    sample: Vec<Exit>,
    stride: u64,
    /// The last `RECENT` exits.
    recent: VecDeque<Exit>,
}

impl Default for IterationSeries {
    fn default() -> Self {
        IterationSeries {
            count: 0,
            last_live: None,
            sample: Vec::new(),
            stride: 1,
            recent: VecDeque::new(),
        }
    }
}

impl IterationSeries {
    /// Records an exit at `ts` with `live` bytes live.
    pub(crate) fn push(&mut self, ts: u64, live: u64) {
        let delta = self
            .last_live
            .map_or(0, |before| signed_delta(before, live));
        let exit = Exit {
            index: self.count,
            ts,
            live,
            delta,
        };
        self.count += 1;
        self.last_live = Some(live);
        if exit.index.is_multiple_of(self.stride) {
            self.sample.push(exit);
            if self.sample.len() > MAX_ITERATIONS - RECENT {
                self.stride *= 2;
                let stride = self.stride;
                self.sample.retain(|kept| kept.index % stride == 0);
            }
        }
        if self.recent.len() == RECENT {
            self.recent.pop_front();
        }
        self.recent.push_back(exit);
    }

    /// The listed exits in order, each once: the sample, then the recent tail.
    pub(crate) fn exits(&self) -> Vec<Exit> {
        let tail = self.recent.front().map_or(u64::MAX, |first| first.index);
        self.sample
            .iter()
            .filter(|exit| exit.index < tail)
            .chain(self.recent.iter())
            .copied()
            .collect()
    }
}

/// `after - before` as a signed number of bytes, saturating.
pub(crate) fn signed_delta(before: u64, after: u64) -> i64 {
    if after >= before {
        i64::try_from(after - before).unwrap_or(i64::MAX)
    } else {
        i64::try_from(before - after).map_or(i64::MIN, |d| -d)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn short_series_are_listed_whole() {
        let mut series = IterationSeries::default();
        for i in 0..100u64 {
            series.push(i * 10, 1000 + i * (i % 3));
        }
        let exits = series.exits();
        assert_eq!(exits.len(), 100);
        assert!(exits.iter().enumerate().all(|(i, e)| e.index == i as u64));
        assert_eq!(exits[0].delta, 0);
        assert_eq!(exits[5].delta, (1000 + 5 * 2) - (1000 + 4));
    }

    #[test]
    fn long_series_are_bounded_evenly_spread_and_exact_at_the_end() {
        let mut series = IterationSeries::default();
        let total = 1_000_003u64;
        for i in 0..total {
            series.push(i, i * 2);
        }
        let exits = series.exits();
        assert!(exits.len() <= MAX_ITERATIONS, "{} rows", exits.len());
        assert!(exits.len() > MAX_ITERATIONS / 4, "{} rows", exits.len());
        assert_eq!(series.count, total);
        assert_eq!(exits[0].index, 0, "the first iteration is kept");
        assert!(exits.windows(2).all(|w| w[0].index < w[1].index));
        let tail: Vec<u64> = exits[exits.len() - RECENT..]
            .iter()
            .map(|e| e.index)
            .collect();
        let want: Vec<u64> = (total - RECENT as u64..total).collect();
        assert_eq!(tail, want, "the last exits are all listed");
        // Deltas are against the iteration just before, sampled or not.
        assert!(exits[1..]
            .iter()
            .all(|e| e.delta == 2 && e.live == e.index * 2));
        // Evenly spread: the sampled part has one stride.
        let sampled: Vec<u64> = exits[..exits.len() - RECENT]
            .iter()
            .map(|e| e.index)
            .collect();
        let stride = sampled[1] - sampled[0];
        assert!(sampled.windows(2).all(|w| w[1] - w[0] == stride));
    }
}
