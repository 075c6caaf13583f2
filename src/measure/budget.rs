//! Budgets on a [`Measurement`], and failure messages a person can act on.

use std::fmt;

use super::sites::{name_sites, NamedSite};
use super::{Measurement, SpanFigures};
use crate::units::format_bytes;

/// Span rows a failure message shows; the rest are summed in one line, so it fits a screen.
const CONTRIBUTOR_ROWS: usize = 8;
/// Call-site rows a failure message shows, the rest summed in one line.
const SITE_ROWS: usize = 5;

/// Limits on a [`Measurement`]; every limit is inclusive (a figure equal to it passes).
///
/// # Examples
///
/// ```
/// #[global_allocator]
/// static ALLOC: highwater::Alloc = highwater::Alloc::system();
///
/// # fn main() {
/// let (_, m) = highwater::measure(|| vec![0u8; 4096]);
/// let budget = highwater::Budget::new().max_peak_bytes(1 << 20);
/// assert!(budget.check(&m).is_ok());
/// // The vector is returned, so its bytes are still live at the end: a leak of the closure.
/// let strict = highwater::Budget::new().max_leaked_bytes(0);
/// let failure = strict.check(&m).unwrap_err();
/// assert!(failure.to_string().contains("leaked 4.0 KiB (4096 bytes)"));
/// # }
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Budget {
    max_peak_bytes: Option<u64>,
    max_leaked_bytes: Option<u64>,
    max_allocated_bytes: Option<u64>,
    max_allocations: Option<u64>,
}

impl Budget {
    /// A budget with no limits yet.
    pub fn new() -> Budget {
        Budget::default()
    }

    /// At most `bytes` live at once ([`Measurement::peak_bytes`]).
    pub fn max_peak_bytes(mut self, bytes: u64) -> Budget {
        self.max_peak_bytes = Some(bytes);
        self
    }

    /// At most `bytes` still live at the end ([`Measurement::leaked_bytes`]).
    pub fn max_leaked_bytes(mut self, bytes: u64) -> Budget {
        self.max_leaked_bytes = Some(bytes);
        self
    }

    /// At most `bytes` allocated in all ([`Measurement::allocated_bytes`]).
    pub fn max_allocated_bytes(mut self, bytes: u64) -> Budget {
        self.max_allocated_bytes = Some(bytes);
        self
    }

    /// At most `count` allocations ([`Measurement::allocations`]).
    pub fn max_allocations(mut self, count: u64) -> Budget {
        self.max_allocations = Some(count);
        self
    }

    /// Checks `measurement` against every limit.
    ///
    /// # Errors
    ///
    /// [`BudgetExceeded`] naming each broken limit (and an incomplete measurement, which no
    /// budget can vouch for); its `Display` is the whole failure message.
    pub fn check(&self, measurement: &Measurement) -> Result<(), BudgetExceeded> {
        let limits = [
            (Figure::Peak, self.max_peak_bytes, measurement.peak_bytes),
            (
                Figure::Leaked,
                self.max_leaked_bytes,
                measurement.leaked_bytes,
            ),
            (
                Figure::Allocated,
                self.max_allocated_bytes,
                measurement.allocated_bytes,
            ),
            (
                Figure::Allocations,
                self.max_allocations,
                measurement.allocations,
            ),
        ];
        let broken: Vec<Broken> = limits
            .into_iter()
            .filter_map(|(figure, limit, actual)| {
                let limit = limit?;
                (actual > limit).then_some(Broken {
                    figure,
                    actual,
                    limit,
                })
            })
            .collect();
        if broken.is_empty() && measurement.is_complete() {
            return Ok(());
        }
        Err(BudgetExceeded {
            broken,
            sites: name_sites(&measurement.sites),
            measurement: Box::new(measurement.clone()),
        })
    }

    /// Panics with the failure message of [`check`](Self::check) if a limit is broken.
    ///
    /// # Panics
    ///
    /// When `check` fails; the message is its error's `Display`.
    #[track_caller]
    pub fn assert(&self, measurement: &Measurement) {
        if let Err(exceeded) = self.check(measurement) {
            panic!("{exceeded}");
        }
    }
}

/// A figure a [`Budget`] limits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Figure {
    Peak,
    Leaked,
    Allocated,
    Allocations,
}

impl Figure {
    fn name(self) -> &'static str {
        match self {
            Figure::Peak => "peak",
            Figure::Leaked => "leaked",
            Figure::Allocated => "allocated",
            Figure::Allocations => "allocations",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct Broken {
    figure: Figure,
    actual: u64,
    limit: u64,
}

/// A [`Budget`] that a [`Measurement`] broke. `Display` shows each broken limit with the
/// figure and the budget, then the largest contributors by span and by call site (function,
/// file and line, resolved when the budget failed), in one screenful.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BudgetExceeded {
    broken: Vec<Broken>,
    /// The measurement's call sites, named.
    sites: Vec<NamedSite>,
    measurement: Box<Measurement>,
}

impl BudgetExceeded {
    /// The measurement that broke the budget.
    pub fn measurement(&self) -> &Measurement {
        &self.measurement
    }
}

impl fmt::Display for BudgetExceeded {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let m = &self.measurement;
        writeln!(f, "memory budget exceeded:")?;
        for broken in &self.broken {
            let over = broken.actual - broken.limit;
            let (actual, limit, over) = if broken.figure == Figure::Allocations {
                let count = |n: u64| n.to_string();
                (count(broken.actual), count(broken.limit), count(over))
            } else {
                (bytes(broken.actual), bytes(broken.limit), bytes(over))
            };
            writeln!(
                f,
                "  {} {actual} > budget {limit} (over by {over})",
                broken.figure.name()
            )?;
        }
        if m.untracked_blocks > 0 || m.missed_events > 0 {
            writeln!(
                f,
                "  incomplete measurement: {} blocks untracked (no memory for the address \
                 table), {} allocator calls missed (re-entry): the figures are lower bounds",
                m.untracked_blocks, m.missed_events
            )?;
        }
        let leak_only = !self.broken.is_empty()
            && self
                .broken
                .iter()
                .all(|broken| broken.figure == Figure::Leaked);
        let peak = self
            .broken
            .iter()
            .any(|broken| broken.figure == Figure::Peak);
        let (title, figure, site_figure): (&str, fn(&SpanFigures) -> u64, SiteFigure) = if leak_only
        {
            (
                "still live at the end",
                |row| row.leaked_bytes,
                |row| row.leaked_bytes,
            )
        } else if peak {
            (
                "live at the peak",
                |row| row.live_at_peak_bytes,
                |row| row.live_at_peak_bytes,
            )
        } else {
            (
                "allocated",
                |row| row.allocated_bytes,
                |row| row.allocated_bytes,
            )
        };
        contributors(f, title, figure, &m.spans)?;
        site_contributors(f, title, site_figure, &self.sites, m.site_sample_bytes)?;
        write!(
            f,
            "measured: peak {}, {} allocated in {} allocations and {} reallocations, leaked {} \
             in {} blocks",
            bytes(m.peak_bytes),
            bytes(m.allocated_bytes),
            m.allocations,
            m.reallocations,
            bytes(m.leaked_bytes),
            m.leaked_blocks
        )
    }
}

impl std::error::Error for BudgetExceeded {}

/// The largest span rows by `figure`, at most [`CONTRIBUTOR_ROWS`] and a line for the rest.
pub(crate) fn contributors(
    f: &mut fmt::Formatter<'_>,
    title: &str,
    figure: fn(&SpanFigures) -> u64,
    spans: &[SpanFigures],
) -> fmt::Result {
    let mut rows: Vec<&SpanFigures> = spans.iter().filter(|row| figure(row) > 0).collect();
    rows.sort_by(|a, b| figure(b).cmp(&figure(a)).then(a.path.cmp(&b.path)));
    if rows.is_empty() {
        return writeln!(f, "largest contributors by span ({title}): none");
    }
    writeln!(f, "largest contributors by span ({title}):")?;
    for row in rows.iter().take(CONTRIBUTOR_ROWS) {
        writeln!(
            f,
            "  {:>12}  {} ({} allocations)",
            format_bytes(figure(row)),
            row.display_path(),
            row.allocations
        )?;
    }
    if rows.len() > CONTRIBUTOR_ROWS {
        let rest = &rows[CONTRIBUTOR_ROWS..];
        let sum: u64 = rest.iter().map(|row| figure(row)).sum();
        writeln!(f, "  {:>12}  {} more spans", format_bytes(sum), rest.len())?;
    }
    Ok(())
}

/// Which estimate of a named site a message ranks by.
pub(crate) type SiteFigure = fn(&NamedSite) -> u64;

/// The largest call sites by `figure`, at most [`SITE_ROWS`] and a line for the rest.
pub(crate) fn site_contributors(
    f: &mut fmt::Formatter<'_>,
    title: &str,
    figure: SiteFigure,
    sites: &[NamedSite],
    sample_bytes: u64,
) -> fmt::Result {
    let mut rows: Vec<&NamedSite> = sites.iter().filter(|row| figure(row) > 0).collect();
    rows.sort_by(|a, b| figure(b).cmp(&figure(a)).then(a.name.cmp(&b.name)));
    let sampled = format!(
        "estimated, one sample per {} allocated",
        format_bytes(sample_bytes)
    );
    if rows.is_empty() {
        return writeln!(
            f,
            "largest contributors by call site ({title}; {sampled}): none sampled"
        );
    }
    writeln!(f, "largest contributors by call site ({title}; {sampled}):")?;
    for row in rows.iter().take(SITE_ROWS) {
        let samples = if row.samples == 1 {
            "sample"
        } else {
            "samples"
        };
        writeln!(
            f,
            "  {:>12}  {} ({} {samples})",
            format!("~{}", format_bytes(figure(row))),
            row.name,
            row.samples
        )?;
    }
    if rows.len() > SITE_ROWS {
        let rest = &rows[SITE_ROWS..];
        let sum: u64 = rest.iter().map(|row| figure(row)).sum();
        writeln!(
            f,
            "  {:>12}  {} more sites",
            format!("~{}", format_bytes(sum)),
            rest.len()
        )?;
    }
    Ok(())
}

/// `1.5 MiB (1572864 bytes)`; plain `512 bytes` below a KiB.
pub(crate) fn bytes(n: u64) -> String {
    if n < 1024 {
        format!("{n} bytes")
    } else {
        format!("{} ({n} bytes)", format_bytes(n))
    }
}

/// Fails the test unless `measurement`'s peak is at most `limit` bytes; the message shows the
/// peak, the budget and the spans that held the most at the peak.
///
/// # Examples
///
/// ```
/// #[global_allocator]
/// static ALLOC: highwater::Alloc = highwater::Alloc::system();
///
/// # fn main() {
/// let (_, m) = highwater::measure(|| drop(vec![0u8; 1000]));
/// highwater::assert_peak_below!(m, 1024);
/// # }
/// ```
#[macro_export]
macro_rules! assert_peak_below {
    ($measurement:expr, $limit:expr $(,)?) => {
        $crate::Budget::new()
            .max_peak_bytes($limit)
            .assert(&$measurement)
    };
}

/// Fails the test unless nothing `measurement` saw born is still live; the message shows the
/// leaked bytes and the spans they were allocated in.
///
/// # Examples
///
/// ```
/// #[global_allocator]
/// static ALLOC: highwater::Alloc = highwater::Alloc::system();
///
/// # fn main() {
/// let (_, m) = highwater::measure(|| drop(vec![0u8; 1000]));
/// highwater::assert_no_leak!(m);
/// # }
/// ```
#[macro_export]
macro_rules! assert_no_leak {
    ($measurement:expr $(,)?) => {
        $crate::Budget::new()
            .max_leaked_bytes(0)
            .assert(&$measurement)
    };
}

#[cfg(test)]
mod tests {
    use super::*;

    fn measurement(peak: u64, leaked: u64, spans: &[(&str, u64, u64)]) -> Measurement {
        Measurement {
            peak_bytes: peak,
            allocated_bytes: peak + 100,
            allocations: 7,
            leaked_bytes: leaked,
            leaked_blocks: u64::from(leaked > 0),
            reallocations: 1,
            frees: 6,
            untracked_frees: 0,
            untracked_blocks: 0,
            missed_events: 0,
            net_bytes: leaked as i64,
            sites: Vec::new(),
            site_sample_bytes: crate::measure::sites::SAMPLE_BYTES,
            spans: spans
                .iter()
                .map(|&(path, at_peak, leaked)| SpanFigures {
                    path: path.to_owned(),
                    allocations: 2,
                    allocated_bytes: at_peak.max(leaked),
                    live_at_peak_bytes: at_peak,
                    leaked_bytes: leaked,
                })
                .collect(),
        }
    }

    #[test]
    fn a_figure_equal_to_its_limit_passes() {
        let m = measurement(1000, 0, &[]);
        assert!(Budget::new().max_peak_bytes(1000).check(&m).is_ok());
        assert!(Budget::new().max_peak_bytes(999).check(&m).is_err());
        assert!(Budget::new().max_allocations(7).check(&m).is_ok());
        assert!(Budget::new().max_allocations(6).check(&m).is_err());
    }

    #[test]
    fn a_peak_failure_names_the_figure_the_budget_and_the_spans_at_the_peak() {
        let m = measurement(
            3 << 20,
            0,
            &[("forward/matmul", 2 << 20, 0), ("", 1 << 20, 0)],
        );
        let message = Budget::new()
            .max_peak_bytes(2 << 20)
            .check(&m)
            .unwrap_err()
            .to_string();
        let lines: Vec<&str> = message.lines().collect();
        assert_eq!(lines[0], "memory budget exceeded:");
        assert_eq!(
            lines[1],
            "  peak 3.0 MiB (3145728 bytes) > budget 2.0 MiB (2097152 bytes) \
             (over by 1.0 MiB (1048576 bytes))"
        );
        assert_eq!(lines[2], "largest contributors by span (live at the peak):");
        assert_eq!(lines[3], "       2.0 MiB  forward/matmul (2 allocations)");
        assert_eq!(
            lines[4],
            "       1.0 MiB  (outside any span) (2 allocations)"
        );
        assert_eq!(
            lines[5],
            "largest contributors by call site (live at the peak; estimated, one sample per \
             64.0 KiB allocated): none sampled"
        );
        assert!(lines[6].starts_with("measured: peak 3.0 MiB"), "{message}");
    }

    #[test]
    fn a_leak_failure_ranks_spans_by_what_they_left_live() {
        let m = measurement(5000, 48, &[("warm", 5000, 0), ("step/cache", 10, 48)]);
        let message = Budget::new()
            .max_leaked_bytes(0)
            .check(&m)
            .unwrap_err()
            .to_string();
        assert!(message.contains("  leaked 48 bytes > budget 0 bytes (over by 48 bytes)"));
        assert!(message.contains("largest contributors by span (still live at the end):\n          48 B  step/cache (2 allocations)\nlargest contributors by call site (still live at the end;"), "{message}");
    }

    #[test]
    fn many_spans_fit_one_screen() {
        let names: Vec<String> = (0..40).map(|i| format!("span{i:02}")).collect();
        let spans: Vec<(&str, u64, u64)> = names
            .iter()
            .enumerate()
            .map(|(i, name)| (name.as_str(), 1000 + i as u64, 0))
            .collect();
        let mut exceeded = Budget::new()
            .max_peak_bytes(1)
            .check(&measurement(100_000, 0, &spans))
            .unwrap_err();
        exceeded.sites = (0..30)
            .map(|i| NamedSite {
                name: format!("crate::site{i:02} at src/lib.rs:{i}"),
                samples: 2,
                allocated_bytes: 3000,
                live_at_peak_bytes: 2000 + i,
                leaked_bytes: 0,
            })
            .collect();
        let message = exceeded.to_string();
        assert!(message.lines().count() <= 24, "{message}");
        assert!(
            message.contains("~2.0 KiB  crate::site29 at src/lib.rs:29 (2 samples)\n"),
            "largest site first: {message}"
        );
        let rest: u64 = (0..25).map(|i| 2000 + i).sum();
        assert!(
            message.contains(&format!("~{}  25 more sites\n", format_bytes(rest))),
            "{message}"
        );
        assert!(message.contains("span39"), "largest first: {message}");
        let rest: u64 = (0..32).map(|i| 1000 + i).sum();
        assert!(
            message.contains(&format!("{}  32 more spans", format_bytes(rest))),
            "{message}"
        );
    }

    #[test]
    fn an_incomplete_measurement_fails_every_budget() {
        let mut m = measurement(10, 0, &[]);
        m.untracked_blocks = 1;
        let message = Budget::new().check(&m).unwrap_err().to_string();
        assert!(message.contains("incomplete measurement: 1 blocks untracked"));
    }

    #[test]
    fn byte_figures_read_in_binary_units() {
        assert_eq!(bytes(0), "0 bytes");
        assert_eq!(bytes(1023), "1023 bytes");
        assert_eq!(bytes(1536), "1.5 KiB (1536 bytes)");
    }
}
