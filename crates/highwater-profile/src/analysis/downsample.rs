//! Bounded curves: time buckets that double their width when full, each keeping two extremes.
//!
//! A run can produce billions of samples; a profile shows a few thousand points per device. The
//! [`Downsampler`] keeps at most `max_buckets` buckets of equal, power-of-two width (in ns).
//! When a sample opens a new bucket and all are in use, the width doubles and neighbouring
//! buckets merge pairwise, each merged bucket keeping the better of the two extremes in each of
//! its two slots. What a slot keeps (highest live bytes, lowest live bytes, highest
//! fragmentation, …) is the sample type's choice through [`Sample::beats`]; on a tie the earlier
//! sample stays, so the first time a maximum was reached is the one shown.
//!
//! Pushing is O(1) amortised and never allocates once the bucket vector has grown to its bound.

/// A point a [`Downsampler`] can keep.
pub(crate) trait Sample: Copy + PartialEq {
    /// When it was taken, ns.
    fn ts(&self) -> u64;
    /// Whether `self` should replace `kept` in slot `slot` (0 or 1). Must be strict: a tie
    /// keeps the earlier sample.
    fn beats(&self, kept: &Self, slot: usize) -> bool;
}

#[derive(Debug, Clone, Copy)]
struct Bucket<P> {
    /// `(ts - origin) >> shift` of the samples it holds.
    index: u64,
    slots: [P; 2],
}

impl<P: Sample> Bucket<P> {
    /// Keeps the sample `beats` describes in each slot it beats; `make` builds it only then.
    #[inline]
    fn offer_with(&mut self, beats: &impl Fn(&P, usize) -> bool, make: impl FnOnce() -> P) {
        let (first, second) = (beats(&self.slots[0], 0), beats(&self.slots[1], 1));
        if first || second {
            let sample = make();
            if first {
                self.slots[0] = sample;
            }
            if second {
                self.slots[1] = sample;
            }
        }
    }

    fn offer(&mut self, sample: &P) {
        for slot in 0..2 {
            if sample.beats(&self.slots[slot], slot) {
                self.slots[slot] = *sample;
            }
        }
    }
}

/// A bounded, extreme-preserving summary of a stream of samples in (mostly) time order.
#[derive(Debug, Clone)]
pub(crate) struct Downsampler<P> {
    /// Timestamp of the first sample; bucket indices count from here.
    origin: Option<u64>,
    /// Bucket width is `1 << shift` ns.
    shift: u32,
    max_buckets: usize,
    /// In increasing `index` order (gaps allowed).
    buckets: Vec<Bucket<P>>,
    /// Samples stamped before this go to the last bucket (`0`: no bucket yet): most samples
    /// do, and this one comparison finds them.
    open_until: u64,
}

impl<P: Sample> Downsampler<P> {
    /// A summary of at most `max_buckets` buckets (at least one), so at most twice that many
    /// points.
    pub(crate) fn new(max_buckets: usize) -> Downsampler<P> {
        Downsampler {
            origin: None,
            shift: 0,
            max_buckets: max_buckets.max(1),
            buckets: Vec::new(),
            open_until: 0,
        }
    }

    /// Empties the summary, keeping its bucket storage: it starts afresh at the next sample.
    pub(crate) fn clear(&mut self) {
        self.origin = None;
        self.shift = 0;
        self.buckets.clear();
        self.open_until = 0;
    }

    /// The first stamp past the last bucket.
    fn last_bucket_end(&self, origin: u64) -> u64 {
        self.buckets.last().map_or(0, |last| {
            last.index
                .saturating_add(1)
                .checked_shl(self.shift)
                .filter(|end| end >> self.shift == last.index.saturating_add(1))
                .map_or(u64::MAX, |end| origin.saturating_add(end))
        })
    }

    fn index_of(&self, ts: u64, origin: u64) -> u64 {
        ts.saturating_sub(origin)
            .checked_shr(self.shift)
            .unwrap_or(0)
    }

    /// Adds a sample. A sample older than the newest bucket (a late straggler) is offered to
    /// the newest bucket rather than reopening history.
    pub(crate) fn push(&mut self, sample: P) {
        self.offer(
            sample.ts(),
            |kept, slot| sample.beats(kept, slot),
            || sample,
        );
    }

    /// Like [`Downsampler::push`] for a sample that is costly to build: `beats` says whether
    /// the sample at `ts` would replace a kept one, and `make` builds it only when it is kept.
    #[inline]
    pub(crate) fn offer(
        &mut self,
        ts: u64,
        beats: impl Fn(&P, usize) -> bool,
        make: impl FnOnce() -> P,
    ) {
        if ts < self.open_until {
            if let Some(last) = self.buckets.last_mut() {
                last.offer_with(&beats, make);
                return;
            }
        }
        self.offer_past_the_last_bucket(ts, beats, make);
    }

    /// [`Downsampler::offer`] for a sample the last bucket may not take.
    #[cold]
    fn offer_past_the_last_bucket(
        &mut self,
        ts: u64,
        beats: impl Fn(&P, usize) -> bool,
        make: impl FnOnce() -> P,
    ) {
        let origin = *self.origin.get_or_insert(ts);
        self.offer_from(ts, origin, beats, make);
        self.open_until = self.last_bucket_end(origin);
    }

    fn offer_from(
        &mut self,
        ts: u64,
        origin: u64,
        beats: impl Fn(&P, usize) -> bool,
        make: impl FnOnce() -> P,
    ) {
        loop {
            let index = self.index_of(ts, origin);
            if let Some(last) = self.buckets.last_mut() {
                if index <= last.index {
                    last.offer_with(&beats, make);
                    return;
                }
            }
            if self.buckets.len() < self.max_buckets {
                let sample = make();
                self.buckets.push(Bucket {
                    index,
                    slots: [sample; 2],
                });
                return;
            }
            self.coarsen();
        }
    }

    /// Doubles the bucket width and merges buckets that now share an index.
    fn coarsen(&mut self) {
        self.shift = self.shift.saturating_add(1);
        let mut write = 0;
        for read in 0..self.buckets.len() {
            let mut bucket = self.buckets[read];
            bucket.index = bucket.index.checked_shr(1).unwrap_or(0);
            if write > 0 && self.buckets[write - 1].index == bucket.index {
                for sample in bucket.slots {
                    self.buckets[write - 1].offer(&sample);
                }
            } else {
                self.buckets[write] = bucket;
                write += 1;
            }
        }
        self.buckets.truncate(write);
    }

    /// The kept points in bucket order (each bucket's two slots by time, one when equal).
    pub(crate) fn points(&self) -> impl Iterator<Item = P> + '_ {
        self.buckets.iter().flat_map(|bucket| {
            let [a, b] = bucket.slots;
            let (first, second) = if b.ts() < a.ts() { (b, a) } else { (a, b) };
            std::iter::once(first).chain((first != second).then_some(second))
        })
    }

    /// Number of points [`Downsampler::points`] yields.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.points().count()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, Clone, Copy, PartialEq)]
    struct P {
        ts: u64,
        v: u64,
    }

    impl Sample for P {
        fn ts(&self) -> u64 {
            self.ts
        }
        fn beats(&self, kept: &Self, slot: usize) -> bool {
            if slot == 0 {
                self.v > kept.v
            } else {
                self.v < kept.v
            }
        }
    }

    #[test]
    fn keeps_global_max_and_min_within_bound() {
        let mut curve = Downsampler::new(16);
        let mut max = P { ts: 0, v: 0 };
        let mut min = P { ts: 0, v: u64::MAX };
        // A wobbly signal with one spike and one dip.
        for ts in 0..100_000u64 {
            let v = match ts {
                31_337 => 1_000_000,
                77_777 => 1,
                _ => 1_000 + (ts * 7919) % 500,
            };
            let p = P { ts: ts * 3, v };
            if v > max.v {
                max = p;
            }
            if v < min.v {
                min = p;
            }
            curve.push(p);
        }
        let points: Vec<P> = curve.points().collect();
        assert!(points.len() <= 32, "{} points", points.len());
        assert!(points.contains(&max));
        assert!(points.contains(&min));
        assert!(points.windows(2).all(|w| w[0].ts <= w[1].ts));
    }

    #[test]
    fn ties_keep_the_first_sample_even_across_merges() {
        let mut curve = Downsampler::new(2);
        for ts in 0..1_000u64 {
            curve.push(P { ts, v: 5 });
        }
        let first = curve.points().next();
        assert_eq!(first, Some(P { ts: 0, v: 5 }));
        assert!(curve.len() <= 4);
    }

    #[test]
    fn stragglers_and_huge_gaps_do_not_panic() {
        let mut curve = Downsampler::new(1);
        curve.push(P { ts: 10, v: 1 });
        curve.push(P { ts: 5, v: 2 });
        curve.push(P { ts: u64::MAX, v: 3 });
        curve.push(P { ts: 0, v: 0 });
        let points: Vec<P> = curve.points().collect();
        assert!(points.len() <= 2);
        assert!(points.contains(&P { ts: u64::MAX, v: 3 }));
    }

    /// The bucket rule spelled out: a sample goes to the bucket of index
    /// `(ts - origin) >> shift`, the last one when that index is not past it.
    fn by_the_rule(samples: &[P], max_buckets: usize) -> Vec<(u64, [P; 2])> {
        let mut curve: Downsampler<P> = Downsampler::new(max_buckets);
        for sample in samples {
            let origin = *curve.origin.get_or_insert(sample.ts);
            curve.offer_from(
                sample.ts,
                origin,
                |kept, slot| sample.beats(kept, slot),
                || *sample,
            );
        }
        buckets(&curve)
    }

    /// Each bucket's index and what its two slots keep.
    fn buckets(curve: &Downsampler<P>) -> Vec<(u64, [P; 2])> {
        curve
            .buckets
            .iter()
            .map(|bucket| (bucket.index, bucket.slots))
            .collect()
    }

    proptest::proptest! {
        /// The last bucket's bound finds the bucket the rule gives, stragglers and stamps
        /// near `u64::MAX` included.
        #[test]
        fn the_last_buckets_bound_follows_the_bucket_rule(
            steps in proptest::collection::vec((0u32..13, proptest::bool::weighted(0.05), 0u64..1000), 1..400),
            start in proptest::prop_oneof![proptest::strategy::Just(0u64), 0u64..1 << 40, (u64::MAX - (1 << 20))..u64::MAX],
            max_buckets in 1usize..8,
        ) {
            // Gaps of powers of two land samples on bucket bounds; a few gaps of a third of
            // the clock's range widen the buckets until their bounds overflow.
            let mut ts = start;
            let samples: Vec<P> = steps
                .iter()
                .map(|&(gap, late, v)| {
                    let gap = match gap {
                        0 => 0,
                        12 => u64::MAX / 3,
                        power => 1 << power,
                    };
                    ts = ts.saturating_add(gap);
                    P { ts: if late { ts.saturating_sub(gap.saturating_mul(3)) } else { ts }, v }
                })
                .collect();
            let mut curve = Downsampler::new(max_buckets);
            for &sample in &samples {
                curve.push(sample);
            }
            proptest::prop_assert_eq!(buckets(&curve), by_the_rule(&samples, max_buckets));
        }
    }
}
