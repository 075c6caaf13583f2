//! Comparing a run's ranks from their files (feature `read`): the options, the errors and
//! [`compare`], which finds the files, streams them ([`load`](super::load)) and groups them into
//! runs ([`group`](super::group)).

use std::path::PathBuf;

use super::{group, load, RunComparison, RunSummary};
use crate::ProfileError;

/// How [`compare`] reads.
#[derive(Debug, Clone, Default)]
#[non_exhaustive]
pub struct CompareOptions {
    /// The run to compare when the profiles hold several (a run id, or the label
    /// [`RunSummary::label`] gives a run without one).
    pub run: Option<String>,
    /// Most points per rank curve; `None`: no curves.
    pub curve_points: Option<usize>,
    /// Worker threads; 0 for as many as the machine has cores (at most 8).
    pub threads: usize,
}

impl CompareOptions {
    /// Default options: no run chosen, no curves, a worker per core.
    pub fn new() -> CompareOptions {
        CompareOptions::default()
    }

    /// Compare the run `label` when the profiles hold several.
    pub fn run(mut self, label: impl Into<String>) -> CompareOptions {
        self.run = Some(label.into());
        self
    }

    /// Also keep each rank's curve, at most `points` points.
    pub fn curves(mut self, points: usize) -> CompareOptions {
        self.curve_points = Some(points);
        self
    }

    /// Read with `threads` worker threads (0: a worker per core, at most 8).
    pub fn threads(mut self, threads: usize) -> CompareOptions {
        self.threads = threads;
        self
    }
}

/// Why the ranks could not be compared. Every variant names the file or the runs at fault.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RanksError {
    /// Nothing to compare.
    #[error("no profiles to compare")]
    NoInputs,
    /// A directory holds no profile files.
    #[error("{} holds no profiles (files named *.json)", .dir.display())]
    EmptyDirectory {
        /// The directory.
        dir: PathBuf,
    },
    /// A directory cannot be listed.
    #[error("cannot list {}: {source}", .dir.display())]
    ReadDirectory {
        /// The directory.
        dir: PathBuf,
        /// What the OS said.
        source: std::io::Error,
    },
    /// A file cannot be read, or is not a valid profile.
    #[error("{source}{}", directory_hint(.found_in))]
    Profile {
        /// What was wrong (it names the file).
        source: ProfileError,
        /// The directory it was found in, when it was not named itself.
        found_in: Option<PathBuf>,
    },
    /// A profile says nothing about its rank.
    #[error(
        "profile {} records no rank: it was recorded outside a launcher (torchrun, mpirun, \
         srun) and without SessionBuilder::rank, so it is no rank of a run",
        .path.display()
    )]
    NoRank {
        /// The profile.
        path: PathBuf,
    },
    /// A profile's rank is not below its world size.
    #[error("profile {} says rank {rank} of a world of {world_size}", .path.display())]
    RankOutsideWorld {
        /// The profile.
        path: PathBuf,
        /// Its rank.
        rank: u32,
        /// Its world size.
        world_size: u32,
    },
    /// Two profiles of one run say the same rank.
    #[error(
        "rank {rank} appears twice in run `{run}`: {} and {}",
        .first.display(),
        .second.display()
    )]
    DuplicateRank {
        /// The rank.
        rank: u32,
        /// The run's label.
        run: String,
        /// One profile.
        first: PathBuf,
        /// The other.
        second: PathBuf,
    },
    /// Two profiles of one run disagree on the world size.
    #[error(
        "profiles of run `{run}` disagree on the world size: {} says {first_world}, {} says \
         {second_world}",
        .first.display(),
        .second.display()
    )]
    WorldSizeDisagrees {
        /// The run's label.
        run: String,
        /// One profile.
        first: PathBuf,
        /// Its world size.
        first_world: u32,
        /// Another.
        second: PathBuf,
        /// Its world size.
        second_world: u32,
    },
    /// The profiles hold more than one run.
    #[error(
        "the profiles are of {} different runs: {}; compare one with --run LABEL",
        .runs.len(),
        list(.runs)
    )]
    DifferentRuns {
        /// The runs, largest first.
        runs: Vec<RunSummary>,
    },
    /// The run asked for is not among the profiles.
    #[error("no run `{wanted}` among the profiles; they hold {}", list(.runs))]
    RunNotFound {
        /// The label asked for.
        wanted: String,
        /// The runs there are.
        runs: Vec<RunSummary>,
    },
}

fn directory_hint(found_in: &Option<PathBuf>) -> String {
    match found_in {
        Some(dir) => format!(
            " (read because it is in {}, where every *.json is taken for a profile: name \
             the profiles instead to leave it out)",
            dir.display()
        ),
        None => String::new(),
    }
}

fn list(runs: &[RunSummary]) -> String {
    runs.iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join("; ")
}

/// Compares the ranks of one run, from profile files and directories of them (every `*.json`
/// file in a directory that is not hidden and not a Chrome trace, `*.trace.json`).
///
/// # Errors
///
/// [`RanksError`], naming the file or the runs: an unreadable file or one that is not a valid
/// profile, a profile without a rank, two profiles of one rank, profiles of several runs (unless
/// [`CompareOptions::run`] picks one), an empty directory.
pub fn compare(inputs: &[PathBuf], options: &CompareOptions) -> Result<RunComparison, RanksError> {
    let files = expand(inputs)?;
    let loaded = load::load_all(&files, options)?;
    group::compare_runs(loaded, options)
}

/// The profile files `inputs` name, each with the directory it was found in (if any), in
/// order, each once.
fn expand(inputs: &[PathBuf]) -> Result<Vec<(PathBuf, Option<PathBuf>)>, RanksError> {
    let mut files: Vec<(PathBuf, Option<PathBuf>)> = Vec::new();
    for input in inputs {
        if !input.is_dir() {
            files.push((input.clone(), None));
            continue;
        }
        let entries = std::fs::read_dir(input).map_err(|source| RanksError::ReadDirectory {
            dir: input.clone(),
            source,
        })?;
        let mut found: Vec<PathBuf> = Vec::new();
        for entry in entries {
            let entry = entry.map_err(|source| RanksError::ReadDirectory {
                dir: input.clone(),
                source,
            })?;
            let name = entry.file_name();
            let name = name.to_string_lossy();
            let lower = name.to_ascii_lowercase();
            let wanted = lower.ends_with(".json")
                && !lower.ends_with(".trace.json")
                && !name.starts_with('.');
            if wanted && !entry.path().is_dir() {
                found.push(entry.path());
            }
        }
        if found.is_empty() {
            return Err(RanksError::EmptyDirectory { dir: input.clone() });
        }
        found.sort();
        files.extend(found.into_iter().map(|f| (f, Some(input.clone()))));
    }
    if files.is_empty() {
        return Err(RanksError::NoInputs);
    }
    let mut seen = std::collections::HashSet::new();
    files.retain(|(path, _)| seen.insert(path.clone()));
    Ok(files)
}
