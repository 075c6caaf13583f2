//! One device's pool: a placement engine for the strategy plus usage counters.

use super::arena::{Arena, End, Fit};
use super::buddy::Buddy;
use super::slab::Slabs;
use super::Strategy;

/// Allocation granularity of every strategy except the buddy system and small size classes.
pub(crate) const GRANULE: u64 = 256;

#[derive(Debug, Clone, PartialEq, Eq)]
enum Engine {
    Arena(Arena, Fit),
    Adaptive(Slabs, Box<Median>),
    Buddy(Buddy),
    Slabs(Slabs),
}

/// Streaming median of request sizes over log2 buckets, for [`Strategy::Adaptive`].
#[derive(Debug, Clone, PartialEq, Eq)]
struct Median {
    counts: [u32; 64],
    total: u32,
    /// Current estimate: the median request lies in `[2^log2, 2^(log2 + 1))`.
    log2: u32,
}

impl Median {
    /// Counts are halved when they reach this many, so old requests fade out.
    const HALVE_AT: u32 = 1 << 16;
    /// The estimate is recomputed every this many requests.
    const EVERY: u32 = 64;

    fn new() -> Self {
        // Until it has seen requests, assume everything up to 512 KiB is small.
        Self {
            counts: [0; 64],
            total: 0,
            log2: 19,
        }
    }

    /// Counts a request; returns whether the estimate was recomputed.
    fn observe(&mut self, size: u64) -> bool {
        let bucket = 63 - size.max(1).leading_zeros();
        self.counts[bucket as usize] += 1;
        self.total += 1;
        if self.total >= Self::HALVE_AT {
            for c in &mut self.counts {
                *c /= 2;
            }
            self.total = self.counts.iter().sum();
        }
        if !self.total.is_multiple_of(Self::EVERY) {
            return false;
        }
        let half = self.total / 2;
        let mut seen = 0;
        for (k, &c) in self.counts.iter().enumerate() {
            seen += c;
            if seen > half {
                self.log2 = k as u32;
                break;
            }
        }
        true
    }

    /// The estimate, rounded down to a power of two.
    fn value(&self) -> u64 {
        1u64 << self.log2
    }
}

/// What a pool has handed out. A request that does not fit changes none of them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct Counters {
    /// Bytes in placed blocks, after rounding.
    pub in_use: u64,
    /// Bytes asked for by the placed blocks' requests, before rounding.
    pub requested: u64,
    /// Most bytes in placed blocks at once (since [`Pool::reset_peak`]).
    pub peak: u64,
    /// Placements made.
    pub reservations: u64,
}

/// How the owner of a pool built by [`Pool::by_handle`] names a block it was given: the
/// arena's block index for the arena strategies, the offset for the others.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct Handle(u64);

/// One device's memory in bookkeeping only: blocks placed by a [`Strategy`], kept in address
/// order, a freed block merged with its free neighbours at once.
///
/// # Examples
///
/// ```
/// use highwater_device::{Pool, Strategy};
/// let mut pool = Pool::new(1 << 20, Strategy::BestFit);
/// let rounded = pool.round(1000).unwrap();
/// assert_eq!(rounded, 1024);
/// let offset = pool.alloc(rounded, 1000).unwrap();
/// assert_eq!(pool.counters().in_use, 1024);
/// assert_eq!(pool.free(offset, 1000), Some(1024));
/// assert_eq!(pool.largest_free(), 1 << 20);
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pool {
    capacity: u64,
    engine: Engine,
    counters: Counters,
}

impl Pool {
    /// A pool of `limit` bytes, rounded down to a multiple of 256.
    pub fn new(limit: u64, strategy: Strategy) -> Self {
        Self::with_arena(limit, strategy, Arena::new)
    }

    /// As [`Pool::new`], for an owner that frees every block by the [`Handle`] that
    /// [`Pool::place`] returned ([`Pool::free_placed`]), never by offset: the arena strategies
    /// then keep no offset map. Placements are the same as [`Pool::new`]'s.
    pub(crate) fn by_handle(limit: u64, strategy: Strategy) -> Self {
        Self::with_arena(limit, strategy, Arena::by_handle)
    }

    fn with_arena(limit: u64, strategy: Strategy, arena: fn(u64, bool) -> Arena) -> Self {
        let capacity = limit & !(GRANULE - 1);
        let engine = match strategy {
            Strategy::FirstFit => Engine::Arena(arena(capacity, true), Fit::First),
            Strategy::BestFit => Engine::Arena(arena(capacity, false), Fit::Best),
            Strategy::WorstFit => Engine::Arena(arena(capacity, false), Fit::Worst),
            Strategy::BuddySystem => Engine::Buddy(Buddy::new(capacity)),
            Strategy::PoolBased => Engine::Slabs(Slabs::new(capacity)),
            Strategy::Adaptive => Engine::Adaptive(
                Slabs::with_fallback(capacity, true),
                Box::new(Median::new()),
            ),
        };
        Self {
            capacity,
            engine,
            counters: Counters::default(),
        }
    }

    /// Usable bytes.
    pub fn capacity(&self) -> u64 {
        self.capacity
    }

    /// What the pool has handed out.
    pub fn counters(&self) -> Counters {
        self.counters
    }

    /// Rebases the peak to the bytes in use now.
    pub fn reset_peak(&mut self) {
        self.counters.peak = self.counters.in_use;
    }

    /// The bytes a request of `bytes` occupies, or `None` if rounding overflows `u64`.
    pub fn round(&self, bytes: u64) -> Option<u64> {
        match &self.engine {
            Engine::Buddy(_) => Buddy::order_for(bytes).map(|k| 1u64 << k),
            Engine::Slabs(s) | Engine::Adaptive(s, _) => s.round(bytes),
            _ => bytes
                .max(1)
                .checked_add(GRANULE - 1)
                .map(|b| b & !(GRANULE - 1)),
        }
    }

    /// Whether `rounded` (from [`Pool::round`]) can be placed now.
    pub fn fits(&self, rounded: u64) -> bool {
        match &self.engine {
            Engine::Arena(a, _) => a.largest_free() >= rounded,
            Engine::Buddy(b) => b.fits(rounded.trailing_zeros()),
            Engine::Slabs(s) | Engine::Adaptive(s, _) => s.fits(rounded),
        }
    }

    /// Places `rounded` bytes for a request of `requested`; changes nothing on failure.
    pub fn alloc(&mut self, rounded: u64, requested: u64) -> Option<u64> {
        self.place(rounded, requested).map(|(offset, _)| offset)
    }

    /// As [`Pool::alloc`], also returning the block's [`Handle`] for [`Pool::free_placed`].
    pub(crate) fn place(&mut self, rounded: u64, requested: u64) -> Option<(u64, Handle)> {
        let (offset, handle) = match &mut self.engine {
            Engine::Arena(a, fit) => a
                .place(rounded, *fit, End::Low)
                .map(|(at, block)| (at, u64::from(block))),
            Engine::Adaptive(s, median) => {
                let at = s.alloc(rounded);
                if at.is_some() && median.observe(requested) {
                    s.set_small_max(median.value());
                }
                at.map(|at| (at, at))
            }
            Engine::Buddy(b) => b.alloc(rounded.trailing_zeros()).map(|at| (at, at)),
            Engine::Slabs(s) => s.alloc(rounded).map(|at| (at, at)),
        }?;
        let c = &mut self.counters;
        c.in_use += rounded;
        c.requested += requested;
        c.peak = c.peak.max(c.in_use);
        c.reservations += 1;
        Some((offset, Handle(handle)))
    }

    /// Size of the allocation at `offset`, if there is one (buddy pools are not asked).
    #[cfg(test)]
    pub(crate) fn allocated_size(&self, offset: u64) -> Option<u64> {
        match &self.engine {
            Engine::Arena(a, _) => a.allocated_size(offset),
            Engine::Buddy(_) => None,
            Engine::Slabs(s) | Engine::Adaptive(s, _) => s.allocated_size(offset),
        }
    }

    /// Frees the allocation at `offset` made for `requested` bytes; returns the bytes it held.
    pub fn free(&mut self, offset: u64, requested: u64) -> Option<u64> {
        let size = match &mut self.engine {
            Engine::Arena(a, _) => a.free(offset),
            Engine::Buddy(b) => b.free(offset),
            Engine::Slabs(s) | Engine::Adaptive(s, _) => s.free(offset),
        }?;
        Some(self.count_free(size, requested))
    }

    /// Takes back the allocation at `offset` made for `requested` bytes as if it had never been
    /// made (an all-or-nothing admission rolled back): freed, and not counted as a reservation.
    pub fn undo(&mut self, offset: u64, requested: u64) -> Option<u64> {
        let size = self.free(offset, requested)?;
        self.counters.reservations = self.counters.reservations.saturating_sub(1);
        Some(size)
    }

    /// Frees the allocation [`Pool::place`] returned `handle` for, made for `requested` bytes;
    /// returns the bytes it held. The handle must name a block still allocated.
    pub(crate) fn free_placed(&mut self, handle: Handle, requested: u64) -> Option<u64> {
        let size = match &mut self.engine {
            Engine::Arena(a, _) => Some(a.release(handle.0 as u32)),
            Engine::Buddy(b) => b.free(handle.0),
            Engine::Slabs(s) | Engine::Adaptive(s, _) => s.free(handle.0),
        }?;
        Some(self.count_free(size, requested))
    }

    fn count_free(&mut self, size: u64, requested: u64) -> u64 {
        let c = &mut self.counters;
        c.in_use = c.in_use.saturating_sub(size);
        c.requested = c.requested.saturating_sub(requested);
        size
    }

    /// Bytes in free blocks.
    pub fn free_bytes(&self) -> u64 {
        match &self.engine {
            Engine::Arena(a, _) => a.free_bytes(),
            Engine::Buddy(b) => b.free_bytes(),
            Engine::Slabs(s) | Engine::Adaptive(s, _) => s.free_bytes(),
        }
    }

    /// The largest free block.
    pub fn largest_free(&self) -> u64 {
        match &self.engine {
            Engine::Arena(a, _) => a.largest_free(),
            Engine::Buddy(b) => b.largest_free(),
            Engine::Slabs(s) | Engine::Adaptive(s, _) => s.largest_free(),
        }
    }

    /// Free blocks.
    pub fn free_blocks(&self) -> u64 {
        match &self.engine {
            Engine::Arena(a, _) => a.free_blocks(),
            Engine::Buddy(b) => b.free_blocks(),
            Engine::Slabs(s) | Engine::Adaptive(s, _) => s.free_blocks(),
        }
    }

    /// `1 - largest free block / free bytes`, 0 when nothing is free.
    pub fn fragmentation(&self) -> f64 {
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
    fn adaptive_learns_the_small_request_limit_from_the_median() {
        let mut p = Pool::new(1 << 30, Strategy::Adaptive);
        // Before learning, everything up to 512 KiB is small (power-of-two classes).
        assert_eq!(p.round(300 << 10), Some(512 << 10));
        for _ in 0..Median::EVERY {
            assert!(p.alloc(8 << 10, 6000).is_some());
        }
        // The median request is 6000 B, in [4 KiB, 8 KiB): requests above 4 KiB are large now.
        assert_eq!(p.round(300 << 10), Some(300 << 10));
        assert_eq!(p.round(5000), Some(5120));
        assert_eq!(p.round(3000), Some(4096));
    }

    #[test]
    fn adaptive_falls_back_to_the_arena_when_no_slab_fits_but_pool_based_fails() {
        for (strategy, small_fits) in [(Strategy::Adaptive, true), (Strategy::PoolBased, false)] {
            let mut p = Pool::new(3 << 20, strategy);
            assert!(p.alloc(2 << 20, 2 << 20).is_some()); // 1 MiB left: no room for a 2 MiB slab
            assert_eq!(p.fits(4096), small_fits, "{strategy}");
            assert_eq!(p.alloc(4096, 4000).is_some(), small_fits, "{strategy}");
        }
    }

    #[test]
    fn size_class_pools_smaller_than_a_slab_serve_small_requests_by_best_fit() {
        for strategy in [Strategy::PoolBased, Strategy::Adaptive] {
            let mut p = Pool::new(1 << 20, strategy);
            assert_eq!(p.round(300), Some(512), "{strategy}: 256-byte rounding");
            assert!(p.fits(512), "{strategy}");
            let a = p
                .alloc(512, 300)
                .expect("a small request fits a 1 MiB pool");
            let b = p.alloc(4096, 4000).expect("and another");
            assert_eq!((a, b), (0, 512), "{strategy}: best fit from the low end");
            assert_eq!(p.free_bytes(), (1 << 20) - 4608);
            assert_eq!(p.free(a, 300), Some(512));
            assert_eq!(p.free(b, 4000), Some(4096));
            assert_eq!(p.largest_free(), 1 << 20);
        }
    }

    #[test]
    fn fragmentation_is_zero_when_nothing_is_free() {
        assert_eq!(fragmentation(0, 0), 0.0);
        assert_eq!(fragmentation(256, 1024), 0.75);
    }

    mod model {
        use super::super::{fragmentation, Engine, Pool};
        use crate::Strategy as Placement;
        use proptest::prelude::*;

        // Larger than a 2 MiB slab, so the size-class strategies use slabs; small enough that
        // requests of up to 4 MiB fill it and fail.
        const CAPACITY: u64 = 8 << 20;

        /// Free intervals `(offset, size)` left between the live blocks, in address order.
        fn holes(live: &[(u64, u64, u64)]) -> Vec<(u64, u64)> {
            let mut blocks: Vec<(u64, u64)> = live.iter().map(|&(o, s, _)| (o, s)).collect();
            blocks.sort_unstable();
            let mut out = Vec::new();
            let mut at = 0;
            for (o, s) in blocks.into_iter().chain([(CAPACITY, 0)]) {
                if o > at {
                    out.push((at, o - at));
                }
                at = o + s;
            }
            out
        }

        /// Where a strategy without size classes must place `size`, by brute force.
        fn expected(strategy: Placement, holes: &[(u64, u64)], size: u64) -> Option<u64> {
            let fitting = holes.iter().filter(|h| h.1 >= size);
            match strategy {
                Placement::FirstFit => fitting.map(|h| h.0).next(),
                Placement::BestFit => fitting.min_by_key(|h| (h.1, h.0)).map(|h| h.0),
                Placement::WorstFit => fitting.max_by_key(|h| (h.1, h.0)).map(|h| h.0),
                _ => None,
            }
        }

        /// Sizes up to 4 MiB: half log-uniform, half from a few popular sizes, so slabs of a
        /// class fill up (a 512 KiB class slab holds four) and exact fits happen.
        fn op() -> impl Strategy<Value = (bool, u64, prop::sample::Index)> {
            let size = prop_oneof![
                (0u32..23, any::<u64>()).prop_map(|(bits, x)| 1 + x % (1u64 << bits)),
                prop::sample::select(vec![256u64, 4096, 300 << 10, 512 << 10, 1 << 20, 3 << 20]),
            ];
            (any::<bool>(), size, any::<prop::sample::Index>())
        }

        proptest! {
            #![proptest_config(ProptestConfig::with_cases(256))]

            #[test]
            fn random_reserve_release_matches_a_brute_force_model(
                which in 0..6usize,
                ops in prop::collection::vec(op(), 1..400),
            ) {
                let strategy = Placement::ALL[which];
                let exact = matches!(
                    strategy,
                    Placement::FirstFit
                        | Placement::BestFit
                        | Placement::WorstFit
                );
                let mut pool = Pool::new(CAPACITY, strategy);
                let mut live: Vec<(u64, u64, u64)> = Vec::new(); // offset, reserved, requested
                let mut peak = 0;
                for (alloc, size, index) in ops {
                    if alloc || live.is_empty() {
                        let rounded = pool.round(size).unwrap();
                        prop_assert!(rounded >= size && rounded.is_multiple_of(256));
                        let fits = pool.fits(rounded);
                        let got = pool.alloc(rounded, size);
                        prop_assert_eq!(got.is_some(), fits);
                        if exact {
                            prop_assert_eq!(got, expected(strategy, &holes(&live), rounded));
                        }
                        if let Some(offset) = got {
                            live.push((offset, rounded, size));
                        }
                    } else {
                        let (offset, reserved, requested) = live.swap_remove(index.index(live.len()));
                        prop_assert_eq!(pool.allocated_size(offset).unwrap_or(reserved), reserved);
                        prop_assert_eq!(pool.free(offset, requested), Some(reserved));
                        let before = pool.clone();
                        prop_assert_eq!(pool.free(offset, requested), None, "double free");
                        prop_assert_eq!(&pool, &before);
                    }
                    // No overlap, inside the pool.
                    let mut sorted = live.clone();
                    sorted.sort_unstable();
                    for w in sorted.windows(2) {
                        prop_assert!(w[0].0 + w[0].1 <= w[1].0, "overlap {:?}", w);
                    }
                    if let Some(last) = sorted.last() {
                        prop_assert!(last.0 + last.1 <= CAPACITY);
                    }
                    if strategy == Placement::BuddySystem {
                        for b in &live {
                            prop_assert_eq!(b.0 % b.1, 0, "buddy block not aligned to its size");
                        }
                    }
                    // Bytes conserved and statistics equal to the model's.
                    let in_use: u64 = live.iter().map(|b| b.1).sum();
                    peak = peak.max(in_use);
                    prop_assert_eq!(pool.counters.in_use, in_use);
                    prop_assert_eq!(pool.counters.requested, live.iter().map(|b| b.2).sum::<u64>());
                    prop_assert_eq!(pool.counters.peak, peak);
                    prop_assert_eq!(pool.free_bytes(), CAPACITY - in_use);
                    prop_assert_eq!(pool.fragmentation(), fragmentation(pool.largest_free(), pool.free_bytes()));
                    if exact {
                        let h = holes(&live);
                        prop_assert_eq!(pool.largest_free(), h.iter().map(|h| h.1).max().unwrap_or(0));
                        prop_assert_eq!(pool.free_blocks(), h.len() as u64);
                        if let Engine::Arena(a, _) = &pool.engine {
                            a.check();
                            prop_assert_eq!(a.free_list(), h);
                        }
                    } else {
                        prop_assert!(pool.largest_free() <= pool.free_bytes());
                    }
                }
                // Releasing everything restores a fresh pool.
                for (offset, reserved, requested) in live.drain(..) {
                    prop_assert_eq!(pool.free(offset, requested), Some(reserved));
                }
                let fresh = Pool::new(CAPACITY, strategy);
                prop_assert_eq!(pool.free_bytes(), CAPACITY);
                prop_assert_eq!(pool.largest_free(), fresh.largest_free());
                prop_assert_eq!(pool.free_blocks(), fresh.free_blocks());
            }

            #[test]
            fn a_pool_freed_by_handle_places_exactly_as_one_freed_by_offset(
                which in 0..6usize,
                ops in prop::collection::vec(op(), 1..400),
            ) {
                let strategy = Placement::ALL[which];
                let mut by_offset = Pool::new(CAPACITY, strategy);
                let mut by_handle = Pool::by_handle(CAPACITY, strategy);
                let mut live = Vec::new(); // offset, handle, requested
                for (alloc, size, index) in ops {
                    if alloc || live.is_empty() {
                        let rounded = by_offset.round(size).unwrap();
                        prop_assert_eq!(by_handle.round(size), Some(rounded));
                        let want = by_offset.alloc(rounded, size);
                        let got = by_handle.place(rounded, size);
                        prop_assert_eq!(got.map(|(offset, _)| offset), want);
                        if let Some((offset, handle)) = got {
                            live.push((offset, handle, size));
                        }
                    } else {
                        let (offset, handle, requested) = live.swap_remove(index.index(live.len()));
                        let want = by_offset.free(offset, requested);
                        prop_assert!(want.is_some());
                        prop_assert_eq!(by_handle.free_placed(handle, requested), want);
                    }
                    prop_assert_eq!(by_handle.counters, by_offset.counters);
                    prop_assert_eq!(by_handle.free_bytes(), by_offset.free_bytes());
                    prop_assert_eq!(by_handle.largest_free(), by_offset.largest_free());
                    prop_assert_eq!(by_handle.free_blocks(), by_offset.free_blocks());
                    if let (Engine::Arena(a, _), Engine::Arena(b, _)) = (&by_handle.engine, &by_offset.engine) {
                        a.check();
                        prop_assert_eq!(a, b);
                        // Nothing to find by offset: the handle is the only way back.
                        if let Some(&(offset, _, _)) = live.first() {
                            prop_assert_eq!(a.allocated_size(offset), None);
                        }
                    }
                }
            }
        }
    }
}
