//! `highwater check`: memory budgets on a recorded profile, for CI.
//!
//! Budgets come from flags, from a TOML file kept next to the code (`--budgets`), or both (a
//! flag overrides the file's value for the same budget). Exit 0 when every budget holds; 1 with
//! one line per broken budget on standard output; 2 when the input is bad (a profile or the
//! file cannot be read, a value does not parse, a budget cannot be evaluated on this profile).
//!
//! The file's keys are the flags' names:
//!
//! ```toml
//! max-peak = "2 GiB"
//! max-growth-per-iteration = 0
//! warmup-iterations = 1
//! max-dropped = 0
//! baseline = "baseline-profile.json"   # relative to this file
//! max-regression = "5%"
//!
//! [max-peak-category]
//! optimizer = "512 MiB"
//! ```

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use highwater_profile::model::Category;
use highwater_profile::units::{format_bytes, format_bytes_per_iteration};
use highwater_profile::Profile;
use serde::Deserialize;

use super::parse::{parse_budget_bytes, parse_category, parse_percent};

/// The input cannot be checked: exit 2. The message names what was wrong and where.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub(crate) struct BadBudget(String);

/// Some budgets are broken (their lines are already printed): exit 1.
#[derive(Debug, thiserror::Error)]
#[error("{broken} of {checked} budgets broken")]
pub(crate) struct BudgetsBroken {
    broken: usize,
    checked: usize,
}

/// Budgets as the flags give them (all optional; see [`run`]).
#[derive(Debug, Default, Clone, PartialEq)]
pub(crate) struct Budgets {
    pub(crate) max_peak: Option<u64>,
    pub(crate) max_peak_category: BTreeMap<Category, u64>,
    pub(crate) max_growth_per_iteration: Option<u64>,
    pub(crate) warmup_iterations: Option<u64>,
    pub(crate) max_dropped: Option<u64>,
    pub(crate) baseline: Option<PathBuf>,
    pub(crate) max_regression: Option<f64>,
}

impl Budgets {
    /// `self` with every budget `over` sets replaced by `over`'s.
    fn overridden_by(mut self, over: Budgets) -> Budgets {
        self.max_peak = over.max_peak.or(self.max_peak);
        self.max_peak_category.extend(over.max_peak_category);
        self.max_growth_per_iteration = over
            .max_growth_per_iteration
            .or(self.max_growth_per_iteration);
        self.warmup_iterations = over.warmup_iterations.or(self.warmup_iterations);
        self.max_dropped = over.max_dropped.or(self.max_dropped);
        self.baseline = over.baseline.or(self.baseline);
        self.max_regression = over.max_regression.or(self.max_regression);
        self
    }

    fn is_empty(&self) -> bool {
        self.max_peak.is_none()
            && self.max_peak_category.is_empty()
            && self.max_growth_per_iteration.is_none()
            && self.max_dropped.is_none()
            && self.max_regression.is_none()
    }
}

/// Checks `profile` against the budgets of `file` (if any) overridden by `flags`.
pub(crate) fn run(profile: &Path, file: Option<&Path>, flags: Budgets) -> anyhow::Result<()> {
    let budgets = match file {
        Some(file) => read_file(file)?.overridden_by(flags),
        None => flags,
    };
    if budgets.is_empty() {
        return Err(BadBudget(
            "no budget to check: give --max-peak, --max-peak-category, \
             --max-growth-per-iteration, --max-dropped or --baseline with --max-regression, or \
             a --budgets file"
                .into(),
        )
        .into());
    }
    let baseline = match (&budgets.baseline, budgets.max_regression) {
        (Some(path), Some(_)) => Some((path.clone(), super::load(path)?)),
        (None, Some(_)) => {
            return Err(BadBudget("--max-regression needs --baseline OTHER.json".into()).into())
        }
        (Some(_), None) => {
            return Err(BadBudget("--baseline needs --max-regression (e.g. 5%)".into()).into())
        }
        (None, None) => None,
    };
    let profile = super::load(profile)?;
    let outcomes = evaluate(&profile, baseline.as_ref(), &budgets)?;
    let broken: Vec<&Outcome> = outcomes.iter().filter(|o| !o.held).collect();
    if broken.is_empty() {
        return super::emit(&format!("all {} budgets hold\n", outcomes.len()));
    }
    let mut text = String::new();
    for outcome in &broken {
        let _ = writeln!(text, "{}", outcome.line);
    }
    super::emit(&text)?;
    Err(BudgetsBroken {
        broken: broken.len(),
        checked: outcomes.len(),
    }
    .into())
}

/// One budget's result and its line.
#[derive(Debug, Clone, PartialEq)]
struct Outcome {
    held: bool,
    line: String,
}

/// Every budget of `budgets` against `profile` (and the baseline, when given). Pure.
fn evaluate(
    profile: &Profile,
    baseline: Option<&(PathBuf, Profile)>,
    budgets: &Budgets,
) -> Result<Vec<Outcome>, BadBudget> {
    let mut outcomes = Vec::new();
    let summary = &profile.summary;
    if let Some(limit) = budgets.max_peak {
        outcomes.push(Outcome {
            held: summary.peak_bytes <= limit,
            line: format!(
                "peak {} > max-peak {}",
                bytes(summary.peak_bytes),
                bytes(limit)
            ),
        });
    }
    for (&category, &limit) in &budgets.max_peak_category {
        let at_peak = at_peak(profile, category);
        outcomes.push(Outcome {
            held: at_peak <= limit,
            line: format!(
                "{} at the peak {} > max-peak-category {}={}",
                category.as_str(),
                bytes(at_peak),
                category.as_str(),
                bytes(limit)
            ),
        });
    }
    if let Some(limit) = budgets.max_growth_per_iteration {
        let warmups = budgets.warmup_iterations.unwrap_or(1);
        let (first, last, growth) = growth_per_iteration(profile, warmups)?;
        outcomes.push(Outcome {
            held: growth <= limit as f64,
            line: format!(
                "growth {} (iterations {first}..{last}, after {warmups} warm-up) > \
                 max-growth-per-iteration {}",
                format_bytes_per_iteration(growth),
                bytes(limit)
            ),
        });
    }
    if let Some(limit) = budgets.max_dropped {
        outcomes.push(Outcome {
            held: summary.dropped_events <= limit,
            line: format!(
                "dropped events {} > max-dropped {limit}",
                summary.dropped_events
            ),
        });
    }
    if let (Some((path, base)), Some(limit)) = (baseline, budgets.max_regression) {
        let (now, then) = (summary.peak_bytes, base.summary.peak_bytes);
        let regression = if then == 0 {
            if now == 0 {
                0.0
            } else {
                f64::INFINITY
            }
        } else {
            (now as f64 - then as f64) / then as f64 * 100.0
        };
        outcomes.push(Outcome {
            held: regression <= limit,
            line: format!(
                "peak {} is {regression:.1}% above the baseline's {} ({}) > max-regression \
                 {limit}%",
                bytes(now),
                bytes(then),
                path.display()
            ),
        });
    }
    Ok(outcomes)
}

/// Bytes of `category` live at the profile's peak.
fn at_peak(profile: &Profile, category: Category) -> u64 {
    profile
        .summary
        .peak_by_category
        .get(&category)
        .copied()
        .unwrap_or(0)
}

/// Mean growth of live bytes per iteration from the first iteration past the warm-ups to the
/// last (rows may be a sample of a long run: their indices say how many iterations lie
/// between). Returns the first and last index and the growth.
fn growth_per_iteration(profile: &Profile, warmups: u64) -> Result<(u64, u64, f64), BadBudget> {
    let rows: Vec<_> = profile
        .iterations
        .iter()
        .filter(|row| row.index >= warmups)
        .collect();
    let (Some(first), Some(last)) = (rows.first(), rows.last()) else {
        return Err(BadBudget(format!(
            "--max-growth-per-iteration needs iterations after {warmups} warm-up, and the \
             profile has {} (a top-level span entered at least twice marks them)",
            profile.iterations.len()
        )));
    };
    if last.index == first.index {
        return Err(BadBudget(format!(
            "--max-growth-per-iteration needs two iterations after {warmups} warm-up; the \
             profile has one (iteration {})",
            first.index
        )));
    }
    let growth =
        (last.live_bytes as f64 - first.live_bytes as f64) / (last.index - first.index) as f64;
    Ok((first.index, last.index, growth))
}

/// `1.5 MiB (1572864 bytes)`.
fn bytes(n: u64) -> String {
    if n < 1024 {
        format!("{n} bytes")
    } else {
        format!("{} ({n} bytes)", format_bytes(n))
    }
}

/// A byte budget in the file: a number of bytes or a string with a unit.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum FileBytes {
    Count(u64),
    Text(String),
}

/// A percentage in the file: a number or a string like `"5%"`.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum FilePercent {
    Number(f64),
    Text(String),
}

/// The budget file as written.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "kebab-case", deny_unknown_fields)]
struct BudgetFile {
    max_peak: Option<FileBytes>,
    #[serde(default)]
    max_peak_category: BTreeMap<String, FileBytes>,
    max_growth_per_iteration: Option<FileBytes>,
    warmup_iterations: Option<u64>,
    max_dropped: Option<u64>,
    baseline: Option<PathBuf>,
    max_regression: Option<FilePercent>,
}

/// Reads and checks a budget file; a relative `baseline` is taken from the file's directory.
fn read_file(path: &Path) -> Result<Budgets, BadBudget> {
    let bad = |what: String| BadBudget(format!("budget file {}: {what}", path.display()));
    let text =
        std::fs::read_to_string(path).map_err(|error| bad(format!("cannot read: {error}")))?;
    let file: BudgetFile =
        toml::from_str(&text).map_err(|error| bad(error.to_string().trim().replace('\n', " ")))?;
    let size = |key: &str, value: FileBytes| match value {
        FileBytes::Count(count) => Ok(count),
        FileBytes::Text(text) => {
            parse_budget_bytes(&text).map_err(|why| bad(format!("{key}: {why}")))
        }
    };
    let mut max_peak_category = BTreeMap::new();
    for (name, value) in file.max_peak_category {
        let category =
            parse_category(&name).map_err(|why| bad(format!("max-peak-category: {why}")))?;
        max_peak_category.insert(category, size(&format!("max-peak-category.{name}"), value)?);
    }
    let max_regression = match file.max_regression {
        None => None,
        Some(FilePercent::Number(value)) => Some(
            parse_percent(&value.to_string())
                .map_err(|why| bad(format!("max-regression: {why}")))?,
        ),
        Some(FilePercent::Text(text)) => {
            Some(parse_percent(&text).map_err(|why| bad(format!("max-regression: {why}")))?)
        }
    };
    let directory = path.parent().unwrap_or(Path::new(""));
    Ok(Budgets {
        max_peak: file.max_peak.map(|v| size("max-peak", v)).transpose()?,
        max_peak_category,
        max_growth_per_iteration: file
            .max_growth_per_iteration
            .map(|v| size("max-growth-per-iteration", v))
            .transpose()?,
        warmup_iterations: file.warmup_iterations,
        max_dropped: file.max_dropped,
        baseline: file.baseline.map(|baseline| directory.join(baseline)),
        max_regression,
    })
}

#[cfg(test)]
mod tests {
    use highwater_profile::IterationResidual;

    use super::*;

    const MIB: u64 = 1 << 20;

    fn profile(peak: u64, optimizer: u64, dropped: u64, live: &[u64]) -> Profile {
        let mut profile: Profile =
            serde_json::from_str(include_str!("../../tests/data/minimal.json"))
                .expect("the minimal profile loads");
        profile.summary.peak_bytes = peak;
        profile
            .summary
            .peak_by_category
            .insert(Category::Optimizer, optimizer);
        profile.summary.dropped_events = dropped;
        profile.iterations = live
            .iter()
            .enumerate()
            .map(|(index, &live_bytes)| {
                let mut iteration_residual = IterationResidual::default();
                iteration_residual.index = index as u64;
                iteration_residual.span = "train_step".into();
                iteration_residual.live_bytes = live_bytes;
                iteration_residual
            })
            .collect();
        profile
    }

    fn lines(outcomes: &[Outcome]) -> Vec<&str> {
        outcomes
            .iter()
            .filter(|o| !o.held)
            .map(|o| o.line.as_str())
            .collect()
    }

    #[test]
    fn each_broken_budget_is_one_line_with_the_figure_and_the_budget() {
        let p = profile(3 * MIB, 2 * MIB, 4, &[100, 500, 600, 700]);
        let budgets = Budgets {
            max_peak: Some(2 * MIB),
            max_peak_category: BTreeMap::from([(Category::Optimizer, MIB)]),
            max_growth_per_iteration: Some(50),
            max_dropped: Some(0),
            ..Budgets::default()
        };
        let outcomes = evaluate(&p, None, &budgets).unwrap();
        assert_eq!(outcomes.len(), 4);
        assert_eq!(
            lines(&outcomes),
            [
                "peak 3.0 MiB (3145728 bytes) > max-peak 2.0 MiB (2097152 bytes)",
                "optimizer at the peak 2.0 MiB (2097152 bytes) > max-peak-category \
                 optimizer=1.0 MiB (1048576 bytes)",
                "growth 100 B per iteration (iterations 1..3, after 1 warm-up) > \
                 max-growth-per-iteration 50 bytes",
                "dropped events 4 > max-dropped 0",
            ]
        );
    }

    #[test]
    fn budgets_equal_to_the_figures_hold() {
        let p = profile(3 * MIB, 2 * MIB, 4, &[100, 500, 600, 700]);
        let budgets = Budgets {
            max_peak: Some(3 * MIB),
            max_peak_category: BTreeMap::from([(Category::Optimizer, 2 * MIB)]),
            max_growth_per_iteration: Some(100),
            max_dropped: Some(4),
            ..Budgets::default()
        };
        assert!(lines(&evaluate(&p, None, &budgets).unwrap()).is_empty());
    }

    #[test]
    fn warm_up_iterations_are_left_out_of_the_growth() {
        // The first two iterations fill caches; after them live bytes are flat.
        let p = profile(MIB, 0, 0, &[100, 900, 1000, 1000, 1000]);
        let growth = |warmups| {
            let budgets = Budgets {
                max_growth_per_iteration: Some(0),
                warmup_iterations: Some(warmups),
                ..Budgets::default()
            };
            lines(&evaluate(&p, None, &budgets).unwrap()).len()
        };
        assert_eq!(growth(1), 1);
        assert_eq!(growth(2), 0);
        assert!(evaluate(
            &p,
            None,
            &Budgets {
                max_growth_per_iteration: Some(0),
                warmup_iterations: Some(4),
                ..Budgets::default()
            }
        )
        .is_err());
    }

    #[test]
    fn a_regression_is_a_percentage_of_the_baseline_peak() {
        let base = (PathBuf::from("base.json"), profile(100 * MIB, 0, 0, &[]));
        let budgets = Budgets {
            max_regression: Some(5.0),
            ..Budgets::default()
        };
        let held = |peak| {
            lines(&evaluate(&profile(peak, 0, 0, &[]), Some(&base), &budgets).unwrap()).is_empty()
        };
        assert!(held(105 * MIB));
        assert!(held(50 * MIB));
        assert!(!held(106 * MIB));
        let outcomes = evaluate(&profile(110 * MIB, 0, 0, &[]), Some(&base), &budgets).unwrap();
        assert_eq!(
            lines(&outcomes),
            [
                "peak 110.0 MiB (115343360 bytes) is 10.0% above the baseline's 100.0 MiB \
              (104857600 bytes) (base.json) > max-regression 5%"
            ]
        );
    }

    #[test]
    fn flags_override_the_file_budget_by_budget() {
        let file = Budgets {
            max_peak: Some(1),
            max_dropped: Some(2),
            max_peak_category: BTreeMap::from([(Category::Optimizer, 3)]),
            ..Budgets::default()
        };
        let flags = Budgets {
            max_peak: Some(10),
            max_peak_category: BTreeMap::from([(Category::Activation, 4)]),
            ..Budgets::default()
        };
        let merged = file.overridden_by(flags);
        assert_eq!(merged.max_peak, Some(10));
        assert_eq!(merged.max_dropped, Some(2));
        assert_eq!(merged.max_peak_category.len(), 2);
    }
}
