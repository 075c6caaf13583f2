//! One device's pool: a placement engine for the strategy plus usage counters.

use super::arena::{Arena, End, Fit};
use super::buddy::Buddy;
use super::slab::{self, Slabs};
use super::Strategy;

/// Allocation granularity of every strategy except the buddy system and small size classes.
pub(crate) const GRANULE: u64 = 256;

#[derive(Debug, Clone, PartialEq, Eq)]
enum Engine {
    Arena(Arena, Fit),
    Adaptive(Arena, Median),
    Buddy(Buddy),
    Slabs(Slabs),
}

/// Streaming median of request sizes over log2 buckets, for [`Strategy::Adaptive`].
#[derive(Debug, Clone, PartialEq, Eq)]
struct Median {
    counts: [u32; 64],
    total: u32,
    /// Current estimate: requests below `2^split` count as small.
    split: u32,
}

impl Median {
    const HALVE_AT: u32 = 1 << 16;
    const RECOMPUTE_EVERY: u32 = 64;

    fn new() -> Self {
        Self {
            counts: [0; 64],
            total: 0,
            split: 20,
        }
    }

    fn observe(&mut self, size: u64) {
        let bucket = 63 - size.max(1).leading_zeros();
        self.counts[bucket as usize] += 1;
        self.total += 1;
        if self.total >= Self::HALVE_AT {
            for c in &mut self.counts {
                *c /= 2;
            }
            self.total = self.counts.iter().sum();
        }
        if self.total % Self::RECOMPUTE_EVERY == 0 {
            let half = self.total / 2;
            let mut seen = 0;
            for (k, &c) in self.counts.iter().enumerate() {
                seen += c;
                if seen > half {
                    self.split = k as u32;
                    break;
                }
            }
        }
    }

    fn end_for(&self, size: u64) -> End {
        if size < (1u64 << self.split) {
            End::High
        } else {
            End::Low
        }
    }
}

/// Counters of one pool. `failures` is the only figure a failed admission changes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct Counters {
    pub(crate) in_use: u64,
    pub(crate) requested: u64,
    pub(crate) peak: u64,
    pub(crate) reservations: u64,
    pub(crate) failures: u64,
}

/// A device pool.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Pool {
    capacity: u64,
    engine: Engine,
    pub(crate) counters: Counters,
}

impl Pool {
    /// A pool of `limit` bytes, rounded down to a multiple of 256.
    pub(crate) fn new(limit: u64, strategy: Strategy) -> Self {
        let capacity = limit & !(GRANULE - 1);
        let engine = match strategy {
            Strategy::FirstFit => Engine::Arena(Arena::new(capacity, true), Fit::First),
            Strategy::BestFit => Engine::Arena(Arena::new(capacity, false), Fit::Best),
            Strategy::WorstFit => Engine::Arena(Arena::new(capacity, false), Fit::Worst),
            Strategy::BuddySystem => Engine::Buddy(Buddy::new(capacity)),
            Strategy::PoolBased => Engine::Slabs(Slabs::new(capacity)),
            Strategy::Adaptive => Engine::Adaptive(Arena::new(capacity, false), Median::new()),
        };
        Self {
            capacity,
            engine,
            counters: Counters::default(),
        }
    }

    pub(crate) fn capacity(&self) -> u64 {
        self.capacity
    }

    /// The bytes a request of `bytes` occupies, or `None` if rounding overflows `u64`.
    pub(crate) fn round(&self, bytes: u64) -> Option<u64> {
        match &self.engine {
            Engine::Buddy(_) => Buddy::order_for(bytes).map(|k| 1u64 << k),
            Engine::Slabs(_) => slab::class_size(bytes),
            _ => bytes
                .max(1)
                .checked_add(GRANULE - 1)
                .map(|b| b & !(GRANULE - 1)),
        }
    }

    /// Whether `rounded` (from [`Pool::round`]) can be placed now.
    pub(crate) fn fits(&self, rounded: u64) -> bool {
        match &self.engine {
            Engine::Arena(a, _) | Engine::Adaptive(a, _) => a.largest_free() >= rounded,
            Engine::Buddy(b) => b.fits(rounded.trailing_zeros()),
            Engine::Slabs(s) => s.fits(rounded),
        }
    }

    /// Places `rounded` bytes for a request of `requested`; changes nothing on failure.
    pub(crate) fn alloc(&mut self, rounded: u64, requested: u64) -> Option<u64> {
        let offset = match &mut self.engine {
            Engine::Arena(a, fit) => a.alloc(rounded, *fit, End::Low),
            Engine::Adaptive(a, median) => {
                let end = median.end_for(rounded);
                let at = a.alloc(rounded, Fit::Best, end);
                if at.is_some() {
                    median.observe(rounded);
                }
                at
            }
            Engine::Buddy(b) => b.alloc(rounded.trailing_zeros()),
            Engine::Slabs(s) => s.alloc(rounded),
        }?;
        let c = &mut self.counters;
        c.in_use += rounded;
        c.requested += requested;
        c.peak = c.peak.max(c.in_use);
        c.reservations += 1;
        Some(offset)
    }

    /// Size of the allocation at `offset`, if there is one (buddy pools are not asked).
    #[cfg(test)]
    pub(crate) fn allocated_size(&self, offset: u64) -> Option<u64> {
        match &self.engine {
            Engine::Arena(a, _) | Engine::Adaptive(a, _) => a.allocated_size(offset),
            Engine::Buddy(_) => None,
            Engine::Slabs(s) => s.allocated_size(offset),
        }
    }

    /// Frees the allocation at `offset` made for `requested` bytes; returns the bytes it held.
    pub(crate) fn free(&mut self, offset: u64, requested: u64) -> Option<u64> {
        let size = match &mut self.engine {
            Engine::Arena(a, _) | Engine::Adaptive(a, _) => a.free(offset),
            Engine::Buddy(b) => b.free(offset),
            Engine::Slabs(s) => s.free(offset),
        }?;
        let c = &mut self.counters;
        c.in_use = c.in_use.saturating_sub(size);
        c.requested = c.requested.saturating_sub(requested);
        Some(size)
    }

    pub(crate) fn free_bytes(&self) -> u64 {
        match &self.engine {
            Engine::Arena(a, _) | Engine::Adaptive(a, _) => a.free_bytes(),
            Engine::Buddy(b) => b.free_bytes(),
            Engine::Slabs(s) => s.free_bytes(),
        }
    }

    pub(crate) fn largest_free(&self) -> u64 {
        match &self.engine {
            Engine::Arena(a, _) | Engine::Adaptive(a, _) => a.largest_free(),
            Engine::Buddy(b) => b.largest_free(),
            Engine::Slabs(s) => s.largest_free(),
        }
    }

    pub(crate) fn free_blocks(&self) -> u64 {
        match &self.engine {
            Engine::Arena(a, _) | Engine::Adaptive(a, _) => a.free_blocks(),
            Engine::Buddy(b) => b.free_blocks(),
            Engine::Slabs(s) => s.free_blocks(),
        }
    }

    /// `1 - largest free block / free bytes`, 0 when nothing is free.
    pub(crate) fn fragmentation(&self) -> f64 {
        fragmentation(self.largest_free(), self.free_bytes())
    }
}

/// `1 - largest / free`, 0 when `free` is 0.
pub(crate) fn fragmentation(largest: u64, free: u64) -> f64 {
    if free == 0 {
        0.0
    } else {
        1.0 - largest as f64 / free as f64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rounding_is_documented_granularity_and_never_overflows() {
        let best = Pool::new(1 << 20, Strategy::BestFit);
        assert_eq!(best.round(1), Some(256));
        assert_eq!(best.round(256), Some(256));
        assert_eq!(best.round(257), Some(512));
        assert_eq!(best.round(u64::MAX - 254), None);
        let buddy = Pool::new(1 << 20, Strategy::BuddySystem);
        assert_eq!(buddy.round(300), Some(512));
        assert_eq!(buddy.round(u64::MAX), None);
        let pooled = Pool::new(1 << 20, Strategy::PoolBased);
        assert_eq!(pooled.round(300), Some(512));
        assert_eq!(pooled.round((512 << 10) + 1), Some((512 << 10) + 256));
    }

    #[test]
    fn capacity_rounds_down_to_whole_granules() {
        let p = Pool::new(1000, Strategy::BestFit);
        assert_eq!(p.capacity(), 768);
        assert_eq!(p.free_bytes(), 768);
        assert_eq!(Pool::new(0, Strategy::FirstFit).largest_free(), 0);
    }

    #[test]
    fn adaptive_puts_small_requests_at_the_top() {
        let mut p = Pool::new(1 << 30, Strategy::Adaptive);
        // Teach it that requests are mostly 1 MiB: 64 KiB is then small, 4 MiB large.
        for _ in 0..64 {
            let at = p.alloc(1 << 20, 1 << 20);
            assert!(at.is_some());
        }
        let small = p.alloc(64 << 10, 64 << 10);
        let large = p.alloc(4 << 20, 4 << 20);
        assert!(small > large, "{small:?} {large:?}");
        assert_eq!(small, Some((1 << 30) - (64 << 10)));
    }

    #[test]
    fn fragmentation_is_zero_when_nothing_is_free() {
        assert_eq!(fragmentation(0, 0), 0.0);
        assert_eq!(fragmentation(256, 1024), 0.75);
    }
}
