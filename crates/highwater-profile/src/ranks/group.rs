//! Which profiles are one run, and that run's figures.

use std::collections::BTreeMap;

use super::load::Loaded;
use super::{CompareOptions, Imbalance, RanksError, RunComparison, RunSummary};

/// What keeps runs apart before time is looked at.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
enum Key {
    /// Profiles that share a run id.
    Id(String),
    /// Profiles without one: the program and the world size, then overlap in time.
    Unnamed(String, Option<u32>),
}

/// Groups `loaded` into runs, picks the one to compare, and compares it.
pub(crate) fn compare_runs(
    loaded: Vec<Loaded>,
    options: &CompareOptions,
) -> Result<RunComparison, RanksError> {
    let mut runs = split(loaded);
    let summaries: Vec<RunSummary> = runs.iter().map(|run| summary(run)).collect();
    let chosen = match &options.run {
        Some(wanted) => summaries
            .iter()
            .position(|s| s.label == *wanted || s.run_id.as_deref() == Some(wanted))
            .ok_or_else(|| RanksError::RunNotFound {
                wanted: wanted.clone(),
                runs: summaries.clone(),
            })?,
        None if runs.len() > 1 => return Err(RanksError::DifferentRuns { runs: summaries }),
        None => 0,
    };
    let run = runs.swap_remove(chosen);
    let mut other_runs = summaries;
    let this = other_runs.remove(chosen);
    compare_one(run, this, other_runs)
}

/// The profiles split into runs, the largest first (then by start).
fn split(loaded: Vec<Loaded>) -> Vec<Vec<Loaded>> {
    let mut by_key: BTreeMap<Key, Vec<Loaded>> = BTreeMap::new();
    for item in loaded {
        let key = match &item.meta.run_id {
            Some(id) => Key::Id(id.clone()),
            None => Key::Unnamed(item.meta.program.clone(), item.row.world_size),
        };
        by_key.entry(key).or_default().push(item);
    }
    let mut runs = Vec::new();
    for (key, mut items) in by_key {
        if let Key::Id(_) = key {
            runs.push(items);
            continue;
        }
        // Sessions that overlapped in time are one run; a gap starts the next.
        items.sort_by_key(|item| item.meta.started_unix_ms);
        let mut current: Vec<Loaded> = Vec::new();
        let mut current_end = 0u64;
        for item in items {
            let start = item.meta.started_unix_ms;
            let end = end_unix_ms(&item);
            if !current.is_empty() && start > current_end {
                runs.push(std::mem::take(&mut current));
            }
            current_end = if current.is_empty() {
                end
            } else {
                current_end.max(end)
            };
            current.push(item);
        }
        if !current.is_empty() {
            runs.push(current);
        }
    }
    runs.sort_by_key(|run| {
        (
            std::cmp::Reverse(run.len()),
            run.iter().map(|i| i.meta.started_unix_ms).min(),
        )
    });
    runs
}

/// When a rank's session ended (or its checkpoint was taken), ms since the Unix epoch.
fn end_unix_ms(item: &Loaded) -> u64 {
    let by_duration = item
        .meta
        .started_unix_ms
        .saturating_add(item.row.duration_ns / 1_000_000);
    item.meta
        .checkpoint_unix_ms
        .map_or(by_duration, |at| at.max(by_duration))
}

fn summary(run: &[Loaded]) -> RunSummary {
    let first = run
        .iter()
        .min_by_key(|i| (i.meta.started_unix_ms, i.row.rank))
        .map(|i| &i.meta);
    let started = first.map_or(0, |m| m.started_unix_ms);
    let program = first.map(|m| m.program.clone()).unwrap_or_default();
    let run_id = first.and_then(|m| m.run_id.clone());
    RunSummary {
        label: run_id
            .clone()
            .unwrap_or_else(|| format!("{program}@{started}")),
        run_id,
        program,
        world_size: run.iter().find_map(|i| i.row.world_size),
        launcher: first.and_then(|m| m.launcher.clone()),
        started_unix_ms: started,
        profiles: run.len(),
        example: run.first().map(|i| i.row.file.clone()).unwrap_or_default(),
    }
}

fn compare_one(
    run: Vec<Loaded>,
    this: RunSummary,
    other_runs: Vec<RunSummary>,
) -> Result<RunComparison, RanksError> {
    let mut items = run;
    items.sort_by_key(|i| i.row.rank);
    for pair in items.windows(2) {
        if pair[0].row.rank == pair[1].row.rank {
            return Err(RanksError::DuplicateRank {
                rank: pair[0].row.rank,
                run: this.label.clone(),
                first: pair[0].row.file.clone(),
                second: pair[1].row.file.clone(),
            });
        }
    }
    let sized = items
        .iter()
        .filter_map(|i| Some((&i.row.file, i.row.world_size?)));
    if let Some(((first, first_world), (second, second_world))) = sized
        .clone()
        .zip(sized.skip(1))
        .find(|((_, a), (_, b))| a != b)
    {
        return Err(RanksError::WorldSizeDisagrees {
            run: this.label.clone(),
            first: first.clone(),
            first_world,
            second: second.clone(),
            second_world,
        });
    }
    let mut rows = Vec::with_capacity(items.len());
    let mut curves = Vec::new();
    for item in items {
        rows.push(item.row);
        curves.extend(item.curve);
    }
    let world = this.world_size;
    let missing_ranks = match world {
        Some(world) => {
            let mut present = rows.iter().map(|r| r.rank).peekable();
            (0..world)
                .filter(|rank| {
                    while present.next_if(|p| p < rank).is_some() {}
                    present.next_if_eq(rank).is_none()
                })
                .collect()
        }
        None => Vec::new(),
    };
    let partial_ranks = rows.iter().filter(|r| r.partial).map(|r| r.rank).collect();
    let imbalance = imbalance(&rows);
    Ok(RunComparison {
        run: this,
        rows,
        missing_ranks,
        partial_ranks,
        imbalance,
        other_runs,
        curves,
    })
}

fn imbalance(rows: &[super::RankRow]) -> Imbalance {
    let heaviest = rows
        .iter()
        .max_by_key(|r| (r.peak_bytes, std::cmp::Reverse(r.rank)));
    let lightest = rows.iter().min_by_key(|r| (r.peak_bytes, r.rank));
    let mean = rows.iter().map(|r| r.peak_bytes as f64).sum::<f64>() / rows.len().max(1) as f64;
    let max = heaviest.map_or(0, |r| r.peak_bytes);
    Imbalance {
        max_over_mean: if mean > 0.0 { max as f64 / mean } else { 1.0 },
        heaviest_rank: heaviest.map_or(0, |r| r.rank),
        max_peak_bytes: max,
        mean_peak_bytes: mean,
        lightest_rank: lightest.map_or(0, |r| r.rank),
        min_peak_bytes: lightest.map_or(0, |r| r.peak_bytes),
    }
}
