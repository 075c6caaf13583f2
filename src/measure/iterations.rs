//! Leaks across iterations: does the thread's heap keep growing once warm?

use std::fmt;

use super::budget::{bytes, contributors, site_contributors};
use super::sites::{name_sites, NamedSite};
use super::{measure, meter, Measurement};

/// Runs a closure `warmups` times unmeasured, then `iterations` times measured, and checks
/// that the thread's heap did not grow over the measured iterations by more than
/// `max_growth_per_iteration` bytes per iteration (0 by default).
///
/// Growth is [`Measurement::net_bytes`]: bytes allocated minus bytes freed by the thread,
/// frees of blocks made during the warm-ups included. So a cache that fills during the warm-ups
/// and then replaces entries (freeing an old one for each new one) does not grow, while one
/// small allocation kept per iteration does. This is the shape of pytest-memray's
/// `limit_leaks` with `warmups`, exact and per thread.
///
/// # Examples
///
/// ```
/// #[global_allocator]
/// static ALLOC: highwater::Alloc = highwater::Alloc::system();
///
/// # fn main() {
/// let mut kept = Vec::with_capacity(64);
/// let report = highwater::LeakCheck::new()
///     .warmups(2)
///     .iterations(10)
///     .run(|| kept.push(Box::new(7u64))); // one 8-byte box kept per iteration
/// assert_eq!(report.growth_bytes, 80);
/// assert!(report.check().is_err());
/// # }
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeakCheck {
    warmups: usize,
    iterations: usize,
    max_growth_per_iteration: u64,
}

impl Default for LeakCheck {
    fn default() -> LeakCheck {
        LeakCheck {
            warmups: 1,
            iterations: 10,
            max_growth_per_iteration: 0,
        }
    }
}

impl LeakCheck {
    /// One warm-up, ten measured iterations, no growth allowed.
    pub fn new() -> LeakCheck {
        LeakCheck::default()
    }

    /// Unmeasured runs first, to fill caches and pools (default 1).
    pub fn warmups(mut self, warmups: usize) -> LeakCheck {
        self.warmups = warmups;
        self
    }

    /// Measured runs (default 10; at least 1 is run).
    pub fn iterations(mut self, iterations: usize) -> LeakCheck {
        self.iterations = iterations.max(1);
        self
    }

    /// Growth allowed per measured iteration, in bytes (default 0).
    pub fn max_growth_per_iteration(mut self, bytes: u64) -> LeakCheck {
        self.max_growth_per_iteration = bytes;
        self
    }

    /// Runs `f` for the warm-ups and the measured iterations; what it returns is dropped at
    /// the end of each run (inside the measurement).
    pub fn run<R>(&self, mut f: impl FnMut() -> R) -> IterationReport {
        for _ in 0..self.warmups {
            drop(f());
        }
        // Reserved before measuring, so recording the curve allocates nothing measured.
        let mut net_after = Vec::with_capacity(self.iterations);
        let ((), measurement) = measure(|| {
            for _ in 0..self.iterations {
                drop(f());
                net_after.push(meter::net_bytes_now().unwrap_or(0));
            }
        });
        IterationReport {
            warmups: self.warmups,
            iterations: self.iterations,
            max_growth_per_iteration: self.max_growth_per_iteration,
            growth_bytes: measurement.net_bytes,
            net_after,
            measurement,
        }
    }

    /// [`run`](Self::run)s `f` and panics with the report if the heap grew too much.
    ///
    /// # Panics
    ///
    /// When [`IterationReport::check`] fails; the message is its error's `Display`.
    #[track_caller]
    pub fn assert<R>(&self, f: impl FnMut() -> R) -> IterationReport {
        let report = self.run(f);
        if let Err(leak) = report.check() {
            panic!("{leak}");
        }
        report
    }
}

/// What [`LeakCheck::run`] saw.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct IterationReport {
    /// Unmeasured runs before.
    pub warmups: usize,
    /// Measured runs.
    pub iterations: usize,
    /// The allowed growth per iteration, in bytes.
    pub max_growth_per_iteration: u64,
    /// Net heap growth over all measured iterations ([`Measurement::net_bytes`]).
    pub growth_bytes: i64,
    /// Net growth since the measured runs began, after each of them.
    pub net_after: Vec<i64>,
    /// The measured iterations as one measurement (spans, blocks still live).
    pub measurement: Measurement,
}

impl IterationReport {
    /// Mean growth per measured iteration, in bytes.
    pub fn growth_per_iteration(&self) -> f64 {
        self.growth_bytes as f64 / self.iterations as f64
    }

    /// Checks the growth against the allowance (and that the measurement is complete).
    ///
    /// # Errors
    ///
    /// [`LeakDetected`] when the heap grew by more than `max_growth_per_iteration` ×
    /// `iterations` bytes; its `Display` is the whole failure message.
    pub fn check(&self) -> Result<(), LeakDetected> {
        let allowed = self
            .max_growth_per_iteration
            .saturating_mul(self.iterations as u64);
        let grew = u64::try_from(self.growth_bytes).unwrap_or(0);
        if grew <= allowed && self.measurement.is_complete() {
            return Ok(());
        }
        Err(LeakDetected {
            report: Box::new(self.clone()),
            sites: name_sites(&self.measurement.sites),
        })
    }
}

/// The heap grew across iterations more than a [`LeakCheck`] allows. `Display` shows the
/// growth, the allowance, the growth curve and what is still live by span and by call site.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeakDetected {
    report: Box<IterationReport>,
    /// The measured iterations' call sites, named.
    sites: Vec<NamedSite>,
}

impl LeakDetected {
    /// What was measured.
    pub fn report(&self) -> &IterationReport {
        &self.report
    }
}

impl fmt::Display for LeakDetected {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let r = &self.report;
        writeln!(
            f,
            "memory grew across iterations: {:.1} bytes per iteration > budget {} per \
             iteration ({} over {} iterations after {} warm-ups)",
            r.growth_per_iteration(),
            bytes(r.max_growth_per_iteration),
            signed_bytes(r.growth_bytes),
            r.iterations,
            r.warmups
        )?;
        if !r.measurement.is_complete() {
            writeln!(
                f,
                "  incomplete measurement: {} blocks untracked, {} allocator calls missed",
                r.measurement.untracked_blocks, r.measurement.missed_events
            )?;
        }
        let shown = r.net_after.len().min(12);
        let curve: Vec<String> = r.net_after[..shown].iter().map(i64::to_string).collect();
        writeln!(
            f,
            "net bytes after each iteration: {}{}",
            curve.join(" "),
            if r.net_after.len() > shown {
                " …"
            } else {
                ""
            }
        )?;
        contributors(
            f,
            "born in the measured iterations, still live",
            |row| row.leaked_bytes,
            &r.measurement.spans,
        )?;
        site_contributors(
            f,
            "still live",
            |row| row.leaked_bytes,
            &self.sites,
            r.measurement.site_sample_bytes,
        )?;
        write!(
            f,
            "measured: {} allocated in {} allocations, {} leaked in {} blocks",
            bytes(r.measurement.allocated_bytes),
            r.measurement.allocations,
            bytes(r.measurement.leaked_bytes),
            r.measurement.leaked_blocks
        )
    }
}

impl std::error::Error for LeakDetected {}

fn signed_bytes(n: i64) -> String {
    if n < 0 {
        format!("-{}", bytes(n.unsigned_abs()))
    } else {
        bytes(n as u64)
    }
}
