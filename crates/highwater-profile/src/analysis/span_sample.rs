//! A bounded, even sample of closed span instances, for timelines that draw each call
//! (the Chrome trace's span tracks).
//!
//! Every instance is offered when it closes. The sample keeps one instance in `stride`, in
//! closing order; when it fills up, every other kept instance is dropped and the stride
//! doubles, so the kept instances stay spread evenly over the whole run whatever its length.

use crate::profile::MAX_SPAN_EVENTS;

/// One closed span instance.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct SpanCall {
    pub(crate) thread: u32,
    pub(crate) node: u32,
    pub(crate) start_ns: u64,
    pub(crate) end_ns: u64,
}

/// The sample.
#[derive(Debug)]
pub(crate) struct SpanSample {
    kept: Vec<SpanCall>,
    /// Keep one offered instance in `stride`.
    stride: u64,
    /// Instances offered so far.
    offered: u64,
    limit: usize,
}

impl Default for SpanSample {
    fn default() -> SpanSample {
        SpanSample::with_limit(MAX_SPAN_EVENTS)
    }
}

impl SpanSample {
    pub(crate) fn with_limit(limit: usize) -> SpanSample {
        SpanSample {
            kept: Vec::new(),
            stride: 1,
            offered: 0,
            limit: limit.max(2),
        }
    }

    /// Offers a closed instance.
    pub(crate) fn offer(&mut self, call: SpanCall) {
        if self.offered.is_multiple_of(self.stride) {
            self.kept.push(call);
            if self.kept.len() >= self.limit {
                // kept[i] is offer number i * stride: keep the multiples of 2 * stride.
                let mut index = 0;
                self.kept.retain(|_| {
                    index += 1;
                    index % 2 == 1
                });
                self.stride *= 2;
            }
        }
        self.offered += 1;
    }

    /// The kept instances, in closing order.
    pub(crate) fn calls(&self) -> &[SpanCall] {
        &self.kept
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn call(n: u64) -> SpanCall {
        SpanCall {
            thread: 0,
            node: 0,
            start_ns: n,
            end_ns: n + 1,
        }
    }

    #[test]
    fn short_runs_keep_every_call() {
        let mut sample = SpanSample::with_limit(8);
        (0..5).for_each(|n| sample.offer(call(n)));
        let starts: Vec<u64> = sample.calls().iter().map(|c| c.start_ns).collect();
        assert_eq!(starts, vec![0, 1, 2, 3, 4]);
    }

    #[test]
    fn long_runs_stay_bounded_and_evenly_spread() {
        let mut sample = SpanSample::with_limit(100);
        (0..100_000).for_each(|n| sample.offer(call(n)));
        let starts: Vec<u64> = sample.calls().iter().map(|c| c.start_ns).collect();
        assert!(starts.len() < 100 && starts.len() >= 50, "{}", starts.len());
        let gaps: Vec<u64> = starts.windows(2).map(|w| w[1] - w[0]).collect();
        assert!(gaps.iter().all(|gap| *gap == gaps[0]), "uneven: {gaps:?}");
        assert!(
            *starts.last().unwrap() > 90_000,
            "the end of the run is covered"
        );
    }
}
