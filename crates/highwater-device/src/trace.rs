//! A stream ready for what-if replay: allocations and frees on dense slots, each allocation with
//! its category, and the counterfactual edits that rescale a category's blocks.

use std::fmt;
use std::str::FromStr;

use super::simulate::{SimOp, SimOpKind};
use highwater_profile::model::Category;

/// Largest block a trace holds: sizes stay representable as `i64`, as every reader expects.
pub const MAX_BLOCK_BYTES: u64 = i64::MAX as u64;

/// One event of a [`Trace`]. Slots are small integers reused once freed, so replayers keep
/// their live blocks in a vector instead of a hash map.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Event {
    Alloc {
        slot: u32,
        size: u64,
        category: Category,
    },
    Free {
        slot: u32,
    },
}

/// An allocation stream prepared for replay through the what-if allocators
/// ([`Allocator`](super::Allocator)).
///
/// Built from [`SimOp`]s with the same rules as [`simulate`](super::simulate): zero-byte
/// allocations, allocations over an id that is still live and frees of unknown ids are left
/// out. An allocation without a category counts as [`Category::Other`].
///
/// # Examples
///
/// ```
/// use highwater_device::{SimOp, Trace};
/// let trace = Trace::new(&[SimOp::alloc(0, 1, 100), SimOp::alloc(1, 2, 50), SimOp::free(2, 1)]);
/// assert_eq!((trace.allocations(), trace.lower_bound()), (2, 150));
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Trace {
    pub(crate) events: Vec<Event>,
    /// One more than the highest slot used.
    pub(crate) slots: usize,
}

impl Trace {
    /// The replayable part of `ops`, in order.
    pub fn new(ops: &[SimOp]) -> Trace {
        let mut slot_of: rustc_hash::FxHashMap<u64, u32> = rustc_hash::FxHashMap::default();
        let mut vacant: Vec<u32> = Vec::new();
        let mut slots = 0u32;
        let mut events = Vec::with_capacity(ops.len());
        for op in ops {
            match op.kind {
                SimOpKind::Alloc { id, size, category } => {
                    if size == 0 || slot_of.contains_key(&id) {
                        continue;
                    }
                    let slot = vacant.pop().unwrap_or_else(|| {
                        slots += 1;
                        slots - 1
                    });
                    slot_of.insert(id, slot);
                    events.push(Event::Alloc {
                        slot,
                        size: size.min(MAX_BLOCK_BYTES),
                        category: category.unwrap_or(Category::Other),
                    });
                }
                SimOpKind::Free { id } => {
                    if let Some(slot) = slot_of.remove(&id) {
                        vacant.push(slot);
                        events.push(Event::Free { slot });
                    }
                }
            }
        }
        Trace {
            events,
            slots: slots as usize,
        }
    }

    /// The replayable part of `ops` restricted to blocks of at least `min_bytes`: how a CPU
    /// run's heap stands in for a device stream (its tensors are the large blocks; the small
    /// ones are the framework's bookkeeping, which a device would keep in host memory).
    ///
    /// # Examples
    ///
    /// ```
    /// use highwater_device::{SimOp, Trace};
    /// let ops = [SimOp::alloc(0, 1, 64), SimOp::alloc(1, 2, 8192), SimOp::free(2, 1)];
    /// let proxy = Trace::with_min_block(&ops, 4096);
    /// assert_eq!((proxy.allocations(), proxy.len(), proxy.lower_bound()), (1, 1, 8192));
    /// ```
    pub fn with_min_block(ops: &[SimOp], min_bytes: u64) -> Trace {
        Trace::new(&blocks_at_least(ops, min_bytes))
    }

    /// The same stream with every block's size changed as `edits` says. Edits that change
    /// nothing (every factor ×1) give back an identical trace.
    ///
    /// # Examples
    ///
    /// ```
    /// use highwater_device::{Edits, SimOp, Trace};
    /// use highwater_profile::model::Category;
    /// let trace = Trace::new(&[SimOp::alloc_in(0, 1, 1000, Some(Category::Activation))]);
    /// let edits = Edits::new().scale(Category::Activation, "2".parse()?);
    /// assert_eq!(trace.edited(&edits).lower_bound(), 2000);
    /// assert_eq!(trace.edited(&Edits::new()), trace);
    /// # Ok::<(), highwater_device::ParseFactorError>(())
    /// ```
    pub fn edited(&self, edits: &Edits) -> Trace {
        let events = self
            .events
            .iter()
            .map(|&e| match e {
                Event::Alloc {
                    slot,
                    size,
                    category,
                } => Event::Alloc {
                    slot,
                    size: edits.factor(category).apply(size),
                    category,
                },
                free => free,
            })
            .collect();
        Trace {
            events,
            slots: self.slots,
        }
    }

    /// Number of allocations.
    pub fn allocations(&self) -> usize {
        self.events
            .iter()
            .filter(|e| matches!(e, Event::Alloc { .. }))
            .count()
    }

    /// Number of events (allocations and frees).
    pub fn len(&self) -> usize {
        self.events.len()
    }

    /// Whether the trace has no event.
    pub fn is_empty(&self) -> bool {
        self.events.is_empty()
    }

    /// The lower bound: the most bytes live at once, as requested (no rounding, no
    /// fragmentation). No allocator can do with less.
    pub fn lower_bound(&self) -> u64 {
        let mut sizes = vec![0u64; self.slots];
        let (mut live, mut peak) = (0u64, 0u64);
        for e in &self.events {
            match *e {
                Event::Alloc { slot, size, .. } => {
                    sizes[slot as usize] = size;
                    live = live.saturating_add(size);
                    peak = peak.max(live);
                }
                Event::Free { slot } => live -= sizes[slot as usize].min(live),
            }
        }
        peak
    }

    /// Live bytes per category just before event `index` (`Category::ALL` order).
    pub(crate) fn live_by_category(&self, index: usize) -> [u64; Category::COUNT] {
        let mut of = vec![(0u64, Category::Other); self.slots];
        let mut live = [0u64; Category::COUNT];
        for e in &self.events[..index.min(self.events.len())] {
            match *e {
                Event::Alloc {
                    slot,
                    size,
                    category,
                } => {
                    of[slot as usize] = (size, category);
                    live[category.index()] = live[category.index()].saturating_add(size);
                }
                Event::Free { slot } => {
                    let (size, category) = of[slot as usize];
                    live[category.index()] -= size.min(live[category.index()]);
                }
            }
        }
        live
    }

    /// Every block as `(size, first event, end event)`: live from the event of its allocation
    /// up to (not including) the event of its free, or to the end of the trace.
    pub(crate) fn lifetimes(&self) -> Vec<(u64, u32, u32)> {
        let end = self.events.len() as u32;
        let mut open: Vec<usize> = vec![usize::MAX; self.slots];
        let mut out = Vec::new();
        for (i, e) in self.events.iter().enumerate() {
            match *e {
                Event::Alloc { slot, size, .. } => {
                    open[slot as usize] = out.len();
                    out.push((size, i as u32, end));
                }
                Event::Free { slot } => out[open[slot as usize]].2 = i as u32,
            }
        }
        out
    }
}

/// The allocations of at least `min_bytes` in `ops`, with their frees (the filter of
/// [`Trace::with_min_block`], for replays through [`simulate`](super::simulate)).
pub fn blocks_at_least(ops: &[SimOp], min_bytes: u64) -> Vec<SimOp> {
    let mut small = rustc_hash::FxHashSet::default();
    ops.iter()
        .filter(|op| match op.kind {
            SimOpKind::Alloc { id, size, .. } if size < min_bytes => {
                small.insert(id);
                false
            }
            SimOpKind::Alloc { id, .. } => {
                small.remove(&id);
                true
            }
            SimOpKind::Free { id } => !small.remove(&id),
        })
        .copied()
        .collect()
}

/// A non-negative scale factor kept as an exact fraction, so ×1 changes nothing and ×0.5 halves
/// exactly. Parsed from `2`, `0.5`, `1.25` or `1/8`.
///
/// # Examples
///
/// ```
/// use highwater_device::Factor;
/// let half: Factor = "0.5".parse()?;
/// assert_eq!(half.apply(1001), 501); // rounded up: a block never shrinks to nothing
/// assert_eq!("1/8".parse::<Factor>()?.apply(64), 8);
/// assert_eq!(Factor::ONE.apply(12345), 12345);
/// # Ok::<(), highwater_device::ParseFactorError>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Factor {
    num: u64,
    den: u64,
}

impl Factor {
    /// ×1.
    pub const ONE: Factor = Factor { num: 1, den: 1 };

    /// `num / den`; `None` when `den` is 0.
    pub const fn ratio(num: u64, den: u64) -> Option<Factor> {
        if den == 0 {
            None
        } else {
            Some(Factor { num, den })
        }
    }

    /// The factor as a float, for display and curves.
    pub fn as_f64(self) -> f64 {
        self.num as f64 / self.den as f64
    }

    /// `size × factor`, rounded up, at most [`MAX_BLOCK_BYTES`].
    pub fn apply(self, size: u64) -> u64 {
        if self.num == self.den {
            return size;
        }
        let scaled = (u128::from(size) * u128::from(self.num)).div_ceil(u128::from(self.den));
        scaled.min(u128::from(MAX_BLOCK_BYTES)) as u64
    }

    /// This factor times `other`, or `None` if the fraction no longer fits in `u64`s.
    pub fn times(self, other: Factor) -> Option<Factor> {
        Some(Factor {
            num: self.num.checked_mul(other.num)?,
            den: self.den.checked_mul(other.den)?,
        })
    }
}

impl fmt::Display for Factor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.num.is_multiple_of(self.den) {
            write!(f, "×{}", self.num / self.den)
        } else {
            write!(f, "×{:.2}", self.as_f64())
        }
    }
}

/// A scale factor that could not be parsed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid factor {given:?}: expected a non-negative number such as 2, 0.5 or 1/8")]
pub struct ParseFactorError {
    given: String,
}

impl FromStr for Factor {
    type Err = ParseFactorError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let err = || ParseFactorError {
            given: s.to_owned(),
        };
        let text = s.trim();
        let digits = |t: &str| !t.is_empty() && t.bytes().all(|b| b.is_ascii_digit());
        if let Some((num, den)) = text.split_once('/') {
            if !digits(num) || !digits(den) {
                return Err(err());
            }
            let (num, den) = (
                num.parse().map_err(|_| err())?,
                den.parse().map_err(|_| err())?,
            );
            return Factor::ratio(num, den).ok_or_else(err);
        }
        let (whole, frac) = text.split_once('.').unwrap_or((text, ""));
        // `2`, `2.5`, `.5`; the fraction at most 9 digits, so 10^digits fits a u64.
        let whole_ok = digits(whole) || (whole.is_empty() && digits(frac));
        let frac_ok = (frac.is_empty() || digits(frac)) && frac.len() <= 9;
        if !whole_ok || !frac_ok || text.ends_with('.') {
            return Err(err());
        }
        let den = 10u64.pow(frac.len() as u32);
        let whole: u64 = if whole.is_empty() {
            0
        } else {
            whole.parse().map_err(|_| err())?
        };
        let frac: u64 = if frac.is_empty() {
            0
        } else {
            frac.parse().map_err(|_| err())?
        };
        let num = whole
            .checked_mul(den)
            .and_then(|n| n.checked_add(frac))
            .ok_or_else(err)?;
        Ok(Factor { num, den })
    }
}

/// Counterfactual edits of a run: a size factor per category.
///
/// - scale: `activation ×2` for a doubled batch, `parameter ×0.5` for bf16 weights;
/// - shard: `optimizer /8` spreads the optimizer state over 8 ranks (ZeRO stage 1), which is a
///   factor of 1/8 on this rank.
///
/// Edits of the same category multiply.
///
/// # Examples
///
/// ```
/// use highwater_device::{Edits, Factor};
/// use highwater_profile::model::Category;
/// let edits = Edits::new()
///     .scale(Category::Parameter, "0.5".parse()?)
///     .shard(Category::Optimizer, 8);
/// assert_eq!(edits.factor(Category::Optimizer), Factor::ratio(1, 8).unwrap());
/// assert_eq!(edits.factor(Category::Activation), Factor::ONE);
/// # Ok::<(), highwater_device::ParseFactorError>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Edits {
    factors: [Factor; Category::COUNT],
}

impl Default for Edits {
    fn default() -> Self {
        Self::new()
    }
}

impl Edits {
    /// No edit: every factor ×1.
    pub const fn new() -> Self {
        Self {
            factors: [Factor::ONE; Category::COUNT],
        }
    }

    /// Multiplies `category`'s blocks by `factor` (saturating at ×`u64::MAX`).
    pub fn scale(mut self, category: Category, factor: Factor) -> Self {
        let slot = &mut self.factors[category.index()];
        *slot = slot.times(factor).unwrap_or(Factor {
            num: u64::MAX,
            den: 1,
        });
        self
    }

    /// Spreads `category` over `ranks` ranks: a factor of `1 / ranks` (0 ranks is taken as 1).
    pub fn shard(self, category: Category, ranks: u64) -> Self {
        self.scale(
            category,
            Factor::ratio(1, ranks.max(1)).unwrap_or(Factor::ONE),
        )
    }

    /// The factor applied to `category`.
    pub fn factor(&self, category: Category) -> Factor {
        self.factors[category.index()]
    }

    /// Whether every factor is ×1.
    pub fn is_identity(&self) -> bool {
        self.factors.iter().all(|f| f.num == f.den)
    }
}

impl fmt::Display for Edits {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut first = true;
        for category in Category::ALL {
            let factor = self.factor(category);
            if factor.num != factor.den {
                if !first {
                    f.write_str(", ")?;
                }
                write!(f, "{} {factor}", category.as_str())?;
                first = false;
            }
        }
        if first {
            f.write_str("as recorded")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn factors_parse_exactly_and_reject_garbage() {
        for (text, num, den) in [("2", 2, 1), ("0.5", 5, 10), ("1/8", 1, 8), (".25", 25, 100)] {
            assert_eq!(text.parse(), Ok(Factor { num, den }), "{text}");
        }
        for bad in ["", "-1", "x", "1/0", "1.2.3", "1/", "0.1234567891", "1e3"] {
            assert!(bad.parse::<Factor>().is_err(), "{bad:?}");
        }
        assert_eq!(
            Factor::ratio(3, 1).unwrap().apply(u64::MAX),
            MAX_BLOCK_BYTES
        );
        assert_eq!(Factor::ratio(0, 1).unwrap().apply(100), 0);
    }

    #[test]
    fn trace_drops_what_simulate_ignores_and_reuses_slots() {
        let ops = [
            SimOp::alloc(0, 7, 0),
            SimOp::alloc(1, 1, 10),
            SimOp::alloc(2, 1, 99),
            SimOp::free(3, 42),
            SimOp::free(4, 1),
            SimOp::alloc(5, 2, 20),
        ];
        let t = Trace::new(&ops);
        assert_eq!(t.slots, 1);
        assert_eq!(t.events.len(), 3);
        assert_eq!(t.lifetimes(), [(10, 0, 1), (20, 2, 3)]);
        assert_eq!(t.lower_bound(), 20);
    }

    #[test]
    fn live_by_category_counts_before_the_event() {
        let ops = [
            SimOp::alloc_in(0, 1, 10, Some(Category::Parameter)),
            SimOp::alloc_in(1, 2, 30, Some(Category::Activation)),
            SimOp::free(2, 2),
        ];
        let t = Trace::new(&ops);
        assert_eq!(t.live_by_category(2), [10, 30, 0, 0, 0]);
        assert_eq!(t.live_by_category(3), [10, 0, 0, 0, 0]);
    }
}
