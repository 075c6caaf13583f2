//! Will it fit? A recorded run replayed against the allocators people run, with the three
//! figures that explain its memory, and the search for the largest scale that still fits.
//!
//! - **Lower bound**: the most bytes live at once ([`Trace::lower_bound`]); no allocator needs
//!   less.
//! - **Offline packing**: the height of a packing of the recorded lifetimes made with the
//!   whole run known in advance (decreasing size, best fit over overlapping lifetimes, as XLA's
//!   heap simulator plans). A planner that knows the run can also choose any online layout, so
//!   the figure is the lowest of the greedy plans and of the layouts the emulated PyTorch and
//!   BFC allocators reach with unlimited room (they never give memory back then, so each
//!   block keeps one address range and the layout is a valid packing of the run).
//! - **Online peaks**: the most memory each [`Allocator`] holds from the device while serving
//!   the run one request at a time. Its excess over the lower bound is its **fragmentation
//!   tax**.
//!
//! [`fit`] then scales chosen categories ([`Edits`]) and searches the largest factor that
//! still fits a device under one allocator.

use std::fmt;
use std::str::FromStr;

use super::bfc::{Bfc, BfcOptions};
use super::kind::ParseNameError;
use super::offline;
use super::online::{drive, FixedPool, Online, Outcome};
use super::torch::{Torch, TorchOptions};
use super::trace::{Edits, Event, Factor, Trace};
use super::Strategy;
use highwater_profile::model::Category;

/// Capacity of the "device with no limit" the unconstrained peaks are measured on.
pub const UNLIMITED: u64 = 1 << 62;

/// An allocator a run can be replayed through.
///
/// # Examples
///
/// ```
/// use highwater_device::{Allocator, Strategy};
/// assert_eq!("pytorch".parse::<Allocator>()?, Allocator::pytorch());
/// assert_eq!("best-fit".parse::<Allocator>()?, Allocator::Pool(Strategy::BestFit));
/// assert_eq!(Allocator::tf_bfc().to_string(), "tf-bfc");
/// # Ok::<(), highwater_device::ParseNameError>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Allocator {
    /// PyTorch's CUDA caching allocator, emulated (see [`TorchOptions`] and the module docs of
    /// its emulation in `device/torch.rs` for what is modelled and what is left out).
    PyTorch(TorchOptions),
    /// TensorFlow's BFC allocator, emulated (see [`BfcOptions`]).
    TfBfc(BfcOptions),
    /// One of highwater's own pools, sized to the device: it holds its blocks' rounded bytes.
    Pool(Strategy),
}

impl Allocator {
    /// PyTorch's caching allocator with its default settings.
    pub const fn pytorch() -> Self {
        Allocator::PyTorch(TorchOptions::DEFAULT)
    }

    /// TensorFlow's BFC allocator with `allow_growth` and garbage collection.
    pub const fn tf_bfc() -> Self {
        Allocator::TfBfc(BfcOptions::DEFAULT)
    }

    /// The allocators a report compares: PyTorch (default and expandable segments), BFC, then
    /// every [`Strategy`].
    pub fn standard() -> Vec<Allocator> {
        let mut all = vec![
            Allocator::pytorch(),
            Allocator::PyTorch(TorchOptions::DEFAULT.expandable_segments(true)),
            Allocator::tf_bfc(),
        ];
        all.extend(Strategy::ALL.map(Allocator::Pool));
        all
    }

    /// The names [`FromStr`] accepts.
    pub const NAMES: [&'static str; 9] = [
        "pytorch",
        "pytorch-expandable",
        "tf-bfc",
        "first-fit",
        "best-fit",
        "worst-fit",
        "buddy",
        "pool-based",
        "adaptive",
    ];

    /// Whether the allocator obtains memory from the device as it goes (PyTorch, BFC), rather
    /// than being a fixed pool whose figure is the bytes of its live blocks.
    pub fn reserves_from_device(&self) -> bool {
        !matches!(self, Allocator::Pool(_))
    }

    fn start(&self, capacity: u64, slots: usize) -> Box<dyn Online> {
        match *self {
            Allocator::PyTorch(options) => Box::new(Torch::new(options, capacity, slots)),
            Allocator::TfBfc(options) => Box::new(Bfc::new(options, capacity, slots)),
            Allocator::Pool(strategy) => Box::new(FixedPool::new(strategy, capacity, slots)),
        }
    }

    /// Replays `trace` on a device of `capacity` bytes.
    fn run(&self, trace: &Trace, capacity: u64) -> Outcome {
        let mut allocator = self.start(capacity, trace.slots);
        drive(trace, allocator.as_mut())
    }
}

impl fmt::Display for Allocator {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Allocator::PyTorch(o) if *o == TorchOptions::DEFAULT => f.write_str("pytorch"),
            Allocator::PyTorch(o) if *o == TorchOptions::DEFAULT.expandable_segments(true) => {
                f.write_str("pytorch-expandable")
            }
            Allocator::PyTorch(o) => write!(f, "pytorch ({o})"),
            Allocator::TfBfc(o) if *o == BfcOptions::DEFAULT => f.write_str("tf-bfc"),
            Allocator::TfBfc(o) => write!(
                f,
                "tf-bfc (allow_growth {}, garbage collection {})",
                o.allow_growth, o.garbage_collection
            ),
            Allocator::Pool(s) => f.write_str(s.name()),
        }
    }
}

impl FromStr for Allocator {
    type Err = ParseNameError;

    /// Parses one of [`Allocator::NAMES`], ignoring ASCII case.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let name = s.trim().to_ascii_lowercase();
        match name.as_str() {
            "pytorch" => Ok(Allocator::pytorch()),
            "pytorch-expandable" => Ok(Allocator::PyTorch(
                TorchOptions::DEFAULT.expandable_segments(true),
            )),
            "tf-bfc" | "bfc" => Ok(Allocator::tf_bfc()),
            _ => name
                .parse::<Strategy>()
                .map(Allocator::Pool)
                .map_err(|_| ParseNameError::new("allocator", s, Allocator::NAMES.to_vec())),
        }
    }
}

/// One allocator's figures for a run.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct AllocatorPeak {
    /// The allocator.
    pub allocator: Allocator,
    /// Most bytes it holds at once on a device with no limit: what the run costs under it.
    pub peak_bytes: u64,
    /// `peak_bytes - lower bound`: what its rounding, caching and fragmentation cost.
    pub tax_bytes: u64,
    /// The tax as a percentage of the lower bound (0 when the lower bound is 0).
    pub tax_percent: f64,
    /// Whether the run fits the device under it (refusing nothing).
    pub fits: bool,
    /// Allocations it refused on the device (the replay skips them and goes on).
    pub failures: u64,
    /// Most bytes it held on the device (at most the capacity).
    pub peak_on_device: u64,
}

/// What one replay of a trace through an allocator showed ([`replay`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct Replay {
    /// Most bytes the allocator held from the device at once.
    pub peak_bytes: u64,
    /// Whether every allocation was served.
    pub fits: bool,
    /// Allocations refused (skipped; the replay goes on).
    pub refused: u64,
}

/// Replays `trace` through `allocator` on a device of `capacity` bytes ([`UNLIMITED`] for no
/// limit).
///
/// # Examples
///
/// ```
/// use highwater_device::{replay, Allocator, SimOp, Trace};
/// let trace = Trace::new(&[SimOp::alloc(0, 1, 3 << 20), SimOp::alloc(1, 2, 30 << 20)]);
/// let r = replay(&trace, Allocator::pytorch(), 40 << 20);
/// // A 20 MiB segment for the 3 MiB block, then 30 MiB does not fit beside it.
/// assert_eq!((r.fits, r.refused, r.peak_bytes), (false, 1, 20 << 20));
/// ```
pub fn replay(trace: &Trace, allocator: Allocator, capacity: u64) -> Replay {
    let outcome = allocator.run(trace, capacity);
    Replay {
        peak_bytes: outcome.peak,
        fits: outcome.first_failure.is_none(),
        refused: outcome.failures,
    }
}

/// The three figures for one device's stream.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct Figures {
    /// The device's usable bytes.
    pub capacity: u64,
    /// Allocations in the stream.
    pub allocations: usize,
    /// Most bytes live at once.
    pub lower_bound: u64,
    /// Height of the offline packing.
    pub offline: u64,
    /// The offline packing's excess over the lower bound, in percent.
    pub offline_tax_percent: f64,
    /// Each allocator's peak and tax, in the order asked for.
    pub allocators: Vec<AllocatorPeak>,
}

/// `part` over `whole` in percent; 0 for an empty whole.
fn percent(part: u64, whole: u64) -> f64 {
    if whole == 0 {
        0.0
    } else {
        part as f64 * 100.0 / whole as f64
    }
}

/// The three figures for `trace` on a device of `capacity` bytes, under each of `allocators`.
///
/// # Examples
///
/// ```
/// use highwater_device::{figures, Allocator, SimOp, Trace};
/// // 1000 B: PyTorch reserves a 2 MiB small-pool segment for it.
/// let trace = Trace::new(&[SimOp::alloc(0, 1, 1000)]);
/// let f = figures(&trace, 16 << 30, &[Allocator::pytorch()]);
/// assert_eq!((f.lower_bound, f.offline), (1000, 1000));
/// assert_eq!(f.allocators[0].peak_bytes, 2 << 20);
/// assert_eq!(f.allocators[0].tax_bytes, (2 << 20) - 1000);
/// ```
pub fn figures(trace: &Trace, capacity: u64, allocators: &[Allocator]) -> Figures {
    let lower_bound = trace.lower_bound();
    let offline = offline_height(trace);
    let allocators = allocators
        .iter()
        .map(|allocator| {
            let free_run = allocator.run(trace, UNLIMITED);
            let on_device = allocator.run(trace, capacity);
            let tax = free_run.peak.saturating_sub(lower_bound);
            AllocatorPeak {
                allocator: *allocator,
                peak_bytes: free_run.peak,
                tax_bytes: tax,
                tax_percent: percent(tax, lower_bound),
                fits: on_device.first_failure.is_none(),
                failures: on_device.failures,
                peak_on_device: on_device.peak,
            }
        })
        .collect();
    Figures {
        capacity,
        allocations: trace.allocations(),
        lower_bound,
        offline,
        offline_tax_percent: percent(offline.saturating_sub(lower_bound), lower_bound),
        allocators,
    }
}

/// The offline figure: the lowest of the greedy plans and the emulated allocators' layouts
/// with unlimited room.
fn offline_height(trace: &Trace) -> u64 {
    let (planned, _) = offline::pack(trace);
    Allocator::standard()
        .iter()
        .filter(|a| a.reserves_from_device())
        .map(|a| a.run(trace, UNLIMITED).peak)
        .fold(planned, u64::min)
}

/// What [`fit`] searches: which categories grow, on what device, under which allocator.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct FitQuery {
    /// The allocator the run must fit under.
    pub allocator: Allocator,
    /// The device's usable bytes.
    pub capacity: u64,
    /// The categories scaled by the searched factor.
    pub grow: Vec<Category>,
    /// Edits applied before (and besides) the growth: a bf16 cast, a sharded optimizer.
    pub edits: Edits,
}

impl FitQuery {
    /// Grow `grow` under `allocator` on a device of `capacity` bytes, no other edit.
    pub fn new(allocator: Allocator, capacity: u64, grow: Vec<Category>) -> Self {
        Self {
            allocator,
            capacity,
            grow,
            edits: Edits::new(),
        }
    }

    /// With `edits` applied besides the growth.
    pub fn with_edits(mut self, edits: Edits) -> Self {
        self.edits = edits;
        self
    }

    fn edits_at(&self, hundredths: u64) -> Edits {
        let factor = Factor::ratio(hundredths, 100).unwrap_or(Factor::ONE);
        self.grow
            .iter()
            .fold(self.edits, |edits, &category| edits.scale(category, factor))
    }
}

/// The search resolution: factors are tried in hundredths.
const STEPS_PER_UNIT: u64 = 100;
/// The largest factor searched (×1,048,576).
const MAX_STEPS: u64 = STEPS_PER_UNIT << 20;
/// Points on the fit curve.
const CURVE_POINTS: u64 = 24;

/// Where the device first runs out at the smallest factor that does not fit.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct FirstToFill {
    /// The factor.
    pub factor: Factor,
    /// The category holding the most bytes when the first allocation is refused, counting the
    /// refused request: the one that fills the device.
    pub category: Category,
    /// The refused allocation's category and size.
    pub refused: (Category, u64),
    /// Live bytes per category at that moment ([`Category::ALL`] order).
    pub live: [u64; Category::COUNT],
}

/// One point of the fit curve.
#[derive(Debug, Clone, Copy, PartialEq)]
#[non_exhaustive]
pub struct CurvePoint {
    /// The factor on the grown categories.
    pub factor: f64,
    /// The allocator's peak on a device with no limit.
    pub peak_bytes: u64,
    /// The lower bound at this factor.
    pub lower_bound: u64,
    /// Whether it fits the device.
    pub fits: bool,
}

/// The answer of [`fit`].
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct FitAnswer {
    /// The query.
    pub query: FitQuery,
    /// The largest factor (in hundredths) that fits; `None` when even ×0 does not.
    pub factor: Option<Factor>,
    /// Whether the search stopped at its ×1,048,576 ceiling while still fitting.
    pub ceiling: bool,
    /// The allocator's peak on the device at that factor.
    pub peak_bytes: u64,
    /// The lower bound at that factor.
    pub lower_bound: u64,
    /// `peak - lower bound` at that factor.
    pub tax_bytes: u64,
    /// The tax in percent of the lower bound.
    pub tax_percent: f64,
    /// Whether the run as recorded (with only [`FitQuery::edits`]) fits.
    pub fits_as_recorded: bool,
    /// What fills the device first, one step past the answer.
    pub first_to_fill: Option<FirstToFill>,
    /// Peak against factor, with the device's capacity to draw across it.
    pub curve: Vec<CurvePoint>,
}

/// Searches the largest factor, in hundredths, on `query.grow` that still fits.
///
/// Doubling from ×1 until the run no longer fits (or down from ×1 when it does not fit as
/// recorded), then bisection. The search takes "fits" as monotone in the factor, which online
/// allocators only approximately are; every answer it gives was replayed and fits.
///
/// # Examples
///
/// ```
/// use highwater_device::{fit, Allocator, FitQuery, SimOp, Strategy, Trace};
/// use highwater_profile::model::Category;
/// // A 1 MiB activation next to a 2 MiB parameter, on a 10 MiB device: ×8 fits (8 + 2 = 10).
/// let trace = Trace::new(&[
///     SimOp::alloc_in(0, 1, 2 << 20, Some(Category::Parameter)),
///     SimOp::alloc_in(1, 2, 1 << 20, Some(Category::Activation)),
/// ]);
/// let query = FitQuery::new(Allocator::Pool(Strategy::BestFit), 10 << 20, vec![Category::Activation]);
/// let answer = fit(&trace, &query);
/// assert_eq!(answer.factor.map(|f| f.to_string()).as_deref(), Some("×8"));
/// assert_eq!(answer.first_to_fill.unwrap().category, Category::Activation);
/// ```
pub fn fit(trace: &Trace, query: &FitQuery) -> FitAnswer {
    let run = |steps: u64| {
        let edited = trace.edited(&query.edits_at(steps));
        let outcome = query.allocator.run(&edited, query.capacity);
        (outcome, edited)
    };
    let fits = |steps: u64| run(steps).0.first_failure.is_none();
    let fits_as_recorded = fits(STEPS_PER_UNIT);
    let mut ceiling = false;
    let (lo, hi) = if fits_as_recorded {
        let (mut lo, mut hi) = (STEPS_PER_UNIT, 2 * STEPS_PER_UNIT);
        loop {
            if !fits(hi) {
                break (Some(lo), hi);
            }
            lo = hi;
            if hi >= MAX_STEPS {
                ceiling = true;
                break (Some(lo), hi);
            }
            hi = (hi * 2).min(MAX_STEPS);
        }
    } else if fits(0) {
        (Some(0), STEPS_PER_UNIT)
    } else {
        (None, 0)
    };
    let answer = lo.map(|mut lo| {
        let mut hi = hi;
        while !ceiling && hi - lo > 1 {
            let mid = lo + (hi - lo) / 2;
            if fits(mid) {
                lo = mid;
            } else {
                hi = mid;
            }
        }
        lo
    });
    let (peak, lower_bound) = match answer {
        Some(steps) => {
            let (outcome, edited) = run(steps);
            (outcome.peak, edited.lower_bound())
        }
        None => (0, 0),
    };
    let first_fail_steps = match answer {
        None => Some(0),
        Some(_) if ceiling => None,
        Some(steps) => Some(steps + 1),
    };
    let first_to_fill = first_fail_steps.and_then(|steps| {
        let (outcome, edited) = run(steps);
        let index = outcome.first_failure?;
        let live = edited.live_by_category(index);
        let Event::Alloc { size, category, .. } = edited.events[index] else {
            return None;
        };
        let mut demand = live;
        demand[category.index()] = demand[category.index()].saturating_add(size);
        let fullest = Category::ALL
            .into_iter()
            .max_by_key(|c| demand[c.index()])
            .unwrap_or(Category::Other);
        Some(FirstToFill {
            factor: Factor::ratio(steps, STEPS_PER_UNIT).unwrap_or(Factor::ONE),
            category: fullest,
            refused: (category, size),
            live,
        })
    });
    let span = first_fail_steps
        .unwrap_or(answer.unwrap_or(0))
        .max(STEPS_PER_UNIT);
    let top = span + span / 4;
    let curve = (0..=CURVE_POINTS)
        .map(|i| {
            let steps = top * i / CURVE_POINTS;
            let edited = trace.edited(&query.edits_at(steps));
            CurvePoint {
                factor: steps as f64 / STEPS_PER_UNIT as f64,
                peak_bytes: query.allocator.run(&edited, UNLIMITED).peak,
                lower_bound: edited.lower_bound(),
                fits: query
                    .allocator
                    .run(&edited, query.capacity)
                    .first_failure
                    .is_none(),
            }
        })
        .collect();
    let tax = peak.saturating_sub(lower_bound);
    FitAnswer {
        query: query.clone(),
        factor: answer.and_then(|steps| Factor::ratio(steps, STEPS_PER_UNIT)),
        ceiling,
        peak_bytes: peak,
        lower_bound,
        tax_bytes: tax,
        tax_percent: percent(tax, lower_bound),
        fits_as_recorded,
        first_to_fill,
        curve,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::SimOp;
    use proptest::prelude::{any, prop, prop_assert, prop_assert_eq, prop_oneof, proptest};
    use proptest::prelude::{ProptestConfig, Strategy as _};

    const MIB: u64 = 1 << 20;

    #[test]
    fn every_name_parses_and_prints_back() {
        for name in Allocator::NAMES {
            let a: Allocator = name.parse().unwrap();
            assert_eq!(a.to_string(), name);
        }
        let err = "jemalloc".parse::<Allocator>().unwrap_err().to_string();
        assert!(err.contains("pytorch") && err.contains("tf-bfc"), "{err}");
        assert_eq!(Allocator::standard().len(), Allocator::NAMES.len());
    }

    #[test]
    fn figures_of_a_hand_worked_run() {
        // Two 3 MiB activations, the first freed before a 6 MiB one: lower bound 6 MiB + 3 MiB.
        let ops = [
            SimOp::alloc(0, 1, 3 * MIB),
            SimOp::alloc(1, 2, 3 * MIB),
            SimOp::free(2, 1),
            SimOp::alloc(3, 3, 6 * MIB),
        ];
        let trace = Trace::new(&ops);
        let f = figures(&trace, 64 * MIB, &Allocator::standard());
        assert_eq!(f.lower_bound, 9 * MIB);
        // Offline: the 6 MiB block at 0 (live with the second 3 MiB), the first 3 MiB at 0
        // too (it died before), the second above: 9 MiB.
        assert_eq!(f.offline, 9 * MIB);
        let peak = |name: &str| {
            let a: Allocator = name.parse().unwrap();
            f.allocators
                .iter()
                .find(|p| p.allocator == a)
                .unwrap()
                .clone()
        };
        // PyTorch: one 20 MiB segment holds all three (3 + 3, then 6 in the 14 MiB left).
        assert_eq!(peak("pytorch").peak_bytes, 20 * MIB);
        assert_eq!(peak("pytorch").tax_bytes, 11 * MIB);
        // BFC: the first 3 MiB grows the 2 MiB region size to 4 MiB (used whole: 4 < 2 × 3),
        // the second gets another 4 MiB region (the size doubles only after a region that did
        // not have to grow), and 6 MiB, with only a 4 MiB chunk free, an 8 MiB region: 16 MiB.
        assert_eq!(peak("tf-bfc").peak_bytes, 16 * MIB);
        assert_eq!(peak("best-fit").peak_bytes, 9 * MIB);
        assert!(f.allocators.iter().all(|p| p.fits));
        assert!((peak("pytorch").tax_percent - 11.0 / 9.0 * 100.0).abs() < 1e-9);
    }

    #[test]
    fn the_three_emulations_meet_at_64_mib_from_different_segment_sizes() {
        // The shape of the candle MLP's CPU proxy stream (where all three land on 64 MiB): one
        // 3 MiB block, 1.5 MiB ones, and many of 1 MiB or less, 45 MiB live in all.
        let mut ops = vec![SimOp::alloc(0, 0, 3 * MIB)];
        ops.extend((1..=12).map(|id| SimOp::alloc(id, id, 3 * MIB / 2)));
        ops.extend((13..=36).map(|id| SimOp::alloc(id, id, MIB)));
        let f = figures(&Trace::new(&ops), UNLIMITED, &Allocator::standard()[..3]);
        assert_eq!(f.lower_bound, 45 * MIB);
        let peaks: Vec<u64> = f.allocators.iter().map(|a| a.peak_bytes).collect();
        // PyTorch: 1 MiB is a small request, so the 24 of them fill 12 segments of 2 MiB; the
        // 21 MiB of large ones need two 20 MiB segments: 24 + 40.
        // Expandable segments: the same pools, mapped in pages: 12 × 2 MiB + 2 × 20 MiB.
        // BFC: regions of 4 MiB (grown for the 3 MiB block), 4, 8, 16 hold 32 MiB; the next
        // doubles to 32 MiB: 64, for any run that needs more than 32 MiB and fits in these.
        assert_eq!(peaks, [64 * MIB, 64 * MIB, 64 * MIB]);
    }

    #[test]
    fn fit_reports_a_run_that_does_not_fit_at_any_factor() {
        let trace = Trace::new(&[
            SimOp::alloc_in(0, 1, 20 * MIB, Some(Category::Parameter)),
            SimOp::alloc_in(1, 2, MIB, Some(Category::Activation)),
        ]);
        let query = FitQuery::new(
            Allocator::Pool(Strategy::BestFit),
            10 * MIB,
            vec![Category::Activation],
        );
        let answer = fit(&trace, &query);
        assert_eq!(answer.factor, None);
        assert!(!answer.fits_as_recorded);
        let first = answer.first_to_fill.unwrap();
        assert_eq!(first.category, Category::Parameter);
        assert_eq!(first.refused, (Category::Parameter, 20 * MIB));
    }

    #[test]
    fn fit_below_one_when_the_recorded_run_does_not_fit() {
        // 2 MiB parameter + 8 MiB activation on a 6 MiB device: activation ×0.5 fits exactly.
        let trace = Trace::new(&[
            SimOp::alloc_in(0, 1, 2 * MIB, Some(Category::Parameter)),
            SimOp::alloc_in(1, 2, 8 * MIB, Some(Category::Activation)),
        ]);
        let query = FitQuery::new(
            Allocator::Pool(Strategy::FirstFit),
            6 * MIB,
            vec![Category::Activation],
        );
        let answer = fit(&trace, &query);
        assert!(!answer.fits_as_recorded);
        assert_eq!(answer.factor, Factor::ratio(50, 100));
        assert_eq!((answer.peak_bytes, answer.tax_bytes), (6 * MIB, 0));
        assert!(answer.curve.iter().any(|p| !p.fits) && answer.curve.iter().any(|p| p.fits));
    }

    /// Random streams: sizes from bytes to tens of MiB, frees of random live blocks.
    fn stream() -> impl proptest::strategy::Strategy<Value = Vec<SimOp>> {
        let step = (
            any::<bool>(),
            prop_oneof![1u64..4096, 4096u64..(4 * MIB), (4 * MIB)..(48 * MIB)],
            any::<prop::sample::Index>(),
            0usize..Category::COUNT,
        );
        prop::collection::vec(step, 1..160).prop_map(|steps| {
            let mut live: Vec<u64> = Vec::new();
            let mut ops = Vec::new();
            for (i, (free, size, pick, cat)) in steps.into_iter().enumerate() {
                let ts = i as u64;
                if free && !live.is_empty() {
                    let id = live.swap_remove(pick.index(live.len()));
                    ops.push(SimOp::free(ts, id));
                } else {
                    ops.push(SimOp::alloc_in(ts, ts, size, Some(Category::ALL[cat])));
                    live.push(ts);
                }
            }
            ops
        })
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(200))]

        #[test]
        fn every_allocator_peak_is_at_least_offline_which_is_at_least_the_lower_bound(
            ops in stream()
        ) {
            let trace = Trace::new(&ops);
            let f = figures(&trace, UNLIMITED, &Allocator::standard());
            prop_assert!(f.offline >= f.lower_bound);
            for a in &f.allocators {
                if a.allocator.reserves_from_device() {
                    prop_assert!(a.peak_bytes >= f.offline, "{} {} < {}", a.allocator, a.peak_bytes, f.offline);
                } else {
                    prop_assert!(a.peak_bytes >= f.lower_bound, "{}", a.allocator);
                }
            }
        }

        #[test]
        fn scale_one_reproduces_the_plain_replay_exactly(ops in stream(), which in 0usize..9) {
            let trace = Trace::new(&ops);
            let allocator = Allocator::standard()[which];
            let ones = Category::ALL
                .into_iter()
                .fold(Edits::new(), |e, c| e.scale(c, Factor::ONE));
            let edited = trace.edited(&ones);
            prop_assert_eq!(&edited, &trace);
            for capacity in [UNLIMITED, 64 * MIB] {
                prop_assert_eq!(allocator.run(&edited, capacity), allocator.run(&trace, capacity));
            }
            // And the pools' replay matches `simulate` on the same stream.
            if let Allocator::Pool(strategy) = allocator {
                let plain = crate::simulate(&ops, 64 * MIB, strategy);
                let ours = allocator.run(&trace, 64 * MIB);
                prop_assert_eq!(plain.peak_reserved, ours.peak);
                prop_assert_eq!(plain.failures, ours.failures);
            }
        }
    }
}
