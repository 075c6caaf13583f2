//! Many processes, one run: the profiles of a run's ranks, compared.
//!
//! A multi-process run (data-parallel ranks, pipeline stages, tensor-parallel shards) leaves one
//! profile per process, each naming its rank, the world size and the run
//! ([`RunMeta`](crate::RunMeta)). `compare` (feature `read`) reads them, from files or a
//! directory, and gives one [`RankRow`] per rank — its peak and when, the categories and the
//! span that held most at the peak, its residual growth per iteration, its device and capacity —
//! and the run's figures: which ranks are missing or partial, and the imbalance (the heaviest
//! rank's peak against the mean). [`DeviceCheck`] says which rank runs out first on a device of
//! a given size. Optionally each rank's memory curve comes too, on an axis the ranks share
//! ([`RankCurve`]: iterations).
//!
//! # Scale
//!
//! Profiles are streamed: each is read, reduced to its row (and its curve, at most a few
//! hundred points) and dropped before the next, by a few worker threads, so memory is one
//! profile per worker plus a row per rank, whatever the number of ranks. A profile is parsed
//! into only the parts a row needs (the call sites and the bulk of the curve are skipped
//! without being built), and those parts are checked as `Profile::load` checks them.
//! BENCHMARKS.md has the figures for 1,024 ranks.
//!
//! # Runs
//!
//! Profiles belong to one run when they share a run id; profiles without one (no launcher said)
//! belong together when they are of the same program and world size and their sessions
//! overlapped in time. A set of profiles holding several runs is refused, naming them, unless
//! the options pick one (`CompareOptions::run`).

#[cfg(feature = "read")]
mod curve;
#[cfg(feature = "read")]
mod group;
#[cfg(feature = "read")]
mod load;
#[cfg(feature = "read")]
mod read;
mod row;

use std::fmt;
use std::path::PathBuf;

use serde::Serialize;

#[cfg(feature = "read")]
#[cfg_attr(docsrs, doc(cfg(feature = "read")))]
pub use read::{compare, CompareOptions, RanksError};
pub use row::{PeakWhen, RankRow, SpanBytes, GROWTH_WARMUPS};

/// Most points a curve keeps by default (enough to zoom into a few iterations of a long run);
/// each bucket keeps its highest point, and the peak is always kept.
pub const CURVE_POINTS: usize = 2_000;

/// One rank's live bytes on its peak device, on a shared axis.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[cfg_attr(feature = "read", derive(serde::Deserialize))]
#[non_exhaustive]
pub struct RankCurve {
    /// The rank.
    pub rank: u32,
    /// The axis: iterations, or the fraction of the run (for a rank without iterations).
    pub by_iteration: bool,
    /// Each point's position on the axis, ascending.
    pub x: Vec<f32>,
    /// Each point's live bytes.
    pub bytes: Vec<u64>,
}

/// Writes a path as a string, its non-UTF-8 bytes replaced, so a row of a file with such a
/// name still prints as JSON.
pub(crate) fn lossy_path<S: serde::Serializer>(
    path: &std::path::Path,
    serializer: S,
) -> Result<S::Ok, S::Error> {
    serializer.serialize_str(&path.to_string_lossy())
}

/// One run found among the profiles.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[cfg_attr(feature = "read", derive(serde::Deserialize))]
#[non_exhaustive]
pub struct RunSummary {
    /// What names the run for `CompareOptions::run`: its run id, else
    /// `PROGRAM@START` (the program and its first rank's start, ms since the Unix epoch).
    pub label: String,
    /// The run id, when the profiles have one.
    pub run_id: Option<String>,
    /// The program's name.
    pub program: String,
    /// How many processes the run had, when the profiles say.
    pub world_size: Option<u32>,
    /// Who gave the ranks (`torchrun`, `slurm`, …), as the first profile says.
    pub launcher: Option<String>,
    /// When its first rank started, ms since the Unix epoch.
    pub started_unix_ms: u64,
    /// Its profiles read.
    pub profiles: usize,
    /// One of them, to point at.
    #[serde(serialize_with = "lossy_path")]
    pub example: PathBuf,
}

impl fmt::Display for RunSummary {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "`{}` ({}, {} profile{}",
            self.label,
            if self.program.is_empty() {
                "unnamed program"
            } else {
                &self.program
            },
            self.profiles,
            if self.profiles == 1 { "" } else { "s" }
        )?;
        if let Some(world) = self.world_size {
            write!(f, " of a world of {world}")?;
        }
        write!(f, ", such as {})", self.example.display())
    }
}

/// The heaviest rank against the rest.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[cfg_attr(feature = "read", derive(serde::Deserialize))]
#[non_exhaustive]
pub struct Imbalance {
    /// The heaviest rank's peak over the mean peak: 1.0 when balanced.
    pub max_over_mean: f64,
    /// The rank with the highest peak (the lowest such rank on a tie).
    pub heaviest_rank: u32,
    /// Its peak.
    pub max_peak_bytes: u64,
    /// The mean peak over the ranks read.
    pub mean_peak_bytes: f64,
    /// The rank with the lowest peak.
    pub lightest_rank: u32,
    /// Its peak.
    pub min_peak_bytes: u64,
}

/// One run's ranks compared.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[cfg_attr(feature = "read", derive(serde::Deserialize))]
#[non_exhaustive]
pub struct RunComparison {
    /// The run.
    pub run: RunSummary,
    /// One row per rank read, by rank.
    pub rows: Vec<RankRow>,
    /// Ranks below the world size with no profile (a rank that crashed before writing one,
    /// or a file left out); empty when the world size is unknown.
    pub missing_ranks: Vec<u32>,
    /// Ranks whose profile is a checkpoint: they had not finished (still running, or died).
    pub partial_ranks: Vec<u32>,
    /// The heaviest rank against the mean.
    pub imbalance: Imbalance,
    /// Other runs among the profiles, left out because `CompareOptions::run` chose this one.
    pub other_runs: Vec<RunSummary>,
    /// Each rank's memory curve, by rank, when asked for.
    pub curves: Vec<RankCurve>,
}

/// Each rank against one device's capacity.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[cfg_attr(feature = "read", derive(serde::Deserialize))]
#[non_exhaustive]
pub struct DeviceCheck {
    /// The device kind (`h100`, `tpu-v5e`).
    pub device: String,
    /// Its usable bytes.
    pub capacity_bytes: u64,
    /// Per rank, by rank.
    pub ranks: Vec<RankHeadroom>,
    /// The rank with the least headroom: the first to run out as the run grows.
    pub first_to_run_out: Option<u32>,
    /// The run's largest factor that fits (the smallest of the ranks'; 0 when a rank does not
    /// fit at any factor), when every rank's allocation log was replayed.
    pub run_fit_factor: Option<f64>,
}

/// One rank against a device.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[cfg_attr(feature = "read", derive(serde::Deserialize))]
#[non_exhaustive]
pub struct RankHeadroom {
    /// The rank.
    pub rank: u32,
    /// Capacity minus the rank's peak (negative: it does not fit).
    pub headroom_bytes: i64,
    /// Whether the rank fits: its peak is within the capacity, and with a replayed allocation
    /// log, the allocator's replay fits as recorded.
    pub fits: bool,
    /// The allocation log's replay, when there was one.
    pub fit: Option<RankFit>,
}

/// A rank's allocation log replayed through an allocator on the device (the `fit` search).
#[derive(Debug, Clone, PartialEq, Serialize)]
#[cfg_attr(feature = "read", derive(serde::Deserialize))]
#[non_exhaustive]
pub struct RankFit {
    /// The log replayed.
    #[serde(serialize_with = "lossy_path")]
    pub log: PathBuf,
    /// The allocator emulated.
    pub allocator: String,
    /// The categories grown.
    pub grow: Vec<String>,
    /// Whether the run as recorded fits under the allocator.
    pub fits_as_recorded: bool,
    /// The largest factor on the grown categories that still fits; `None` when none does.
    pub factor: Option<f64>,
}

impl RankFit {
    /// A replay's outcome.
    pub fn new(
        log: PathBuf,
        allocator: String,
        grow: Vec<String>,
        fits_as_recorded: bool,
        factor: Option<f64>,
    ) -> RankFit {
        RankFit {
            log,
            allocator,
            grow,
            fits_as_recorded,
            factor,
        }
    }
}

impl DeviceCheck {
    /// Each of `comparison`'s ranks against a device of `capacity_bytes`, by its peak.
    pub fn new(device: &str, capacity_bytes: u64, comparison: &RunComparison) -> DeviceCheck {
        let ranks: Vec<RankHeadroom> = comparison
            .rows
            .iter()
            .map(|row| RankHeadroom {
                rank: row.rank,
                headroom_bytes: (i128::from(capacity_bytes) - i128::from(row.peak_bytes))
                    .clamp(i128::from(i64::MIN), i128::from(i64::MAX))
                    as i64,
                fits: row.peak_bytes <= capacity_bytes,
                fit: None,
            })
            .collect();
        let first_to_run_out = ranks
            .iter()
            .min_by_key(|r| (r.headroom_bytes, r.rank))
            .map(|r| r.rank);
        DeviceCheck {
            device: device.to_string(),
            capacity_bytes,
            ranks,
            first_to_run_out,
            run_fit_factor: None,
        }
    }

    /// Adds rank `rank`'s replay: it fits only if its replay fits as recorded too. Once every
    /// rank has one, the run's factor is the smallest.
    pub fn set_fit(&mut self, rank: u32, fit: RankFit) {
        if let Some(r) = self.ranks.iter_mut().find(|r| r.rank == rank) {
            r.fits &= fit.fits_as_recorded;
            r.fit = Some(fit);
        }
        self.run_fit_factor = if self.ranks.iter().all(|r| r.fit.is_some()) {
            self.ranks
                .iter()
                .map(|r| r.fit.as_ref().and_then(|f| f.factor).unwrap_or(0.0))
                .reduce(f64::min)
        } else {
            None
        };
    }

    /// The ranks that do not fit.
    pub fn not_fitting(&self) -> Vec<u32> {
        self.ranks
            .iter()
            .filter(|r| !r.fits)
            .map(|r| r.rank)
            .collect()
    }
}
