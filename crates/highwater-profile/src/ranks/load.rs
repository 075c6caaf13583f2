//! Reading rank profiles one at a time, on a few worker threads, each reduced to its row (and
//! curve) before the next is read.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

use serde::de::IgnoredAny;
use serde::Deserialize;

use super::curve::{curve, Axis};
use super::row::RankRow;
use super::{CompareOptions, RankCurve, RanksError};
use crate::profile::{check_schema, read_profile_bytes};
use crate::{
    DeviceStats, IterationResidual, PeakRow, Profile, ProfileError, RunMeta, SpanEvent,
    SpanMetrics, Summary, SCHEMA,
};

/// Most worker threads: past this, reading is bound by the disk, not the parse.
const MAX_THREADS: usize = 8;

/// What a rank's profile gave.
#[derive(Debug)]
pub(crate) struct Loaded {
    pub(crate) row: RankRow,
    pub(crate) meta: RunMeta,
    pub(crate) curve: Option<RankCurve>,
}

/// The parts of a profile a row and a curve need. Fields of [`Profile`] left out here are
/// skipped by the parser without being built (serde ignores unknown fields); the ones a
/// profile must have are still required (`IgnoredAny`), so a file missing them is refused as
/// [`Profile::load`] refuses it. A row needs neither the timeline nor the span instances (half
/// of a long run's profile), so they are skipped too unless a curve is drawn.
#[derive(Deserialize)]
struct Digest<Timeline, Events: Default> {
    schema: String,
    meta: RunMeta,
    summary: Summary,
    timeline: Timeline,
    peak_breakdown: Vec<PeakRow>,
    #[allow(dead_code)] // required, never read
    largest_at_peak: IgnoredAny,
    spans: Vec<SpanMetrics>,
    #[serde(default)]
    iterations: Vec<IterationResidual>,
    devices: Vec<DeviceStats>,
    #[serde(default)]
    span_events: Events,
}

/// The span instances a digest kept: none, or all of them.
trait Instances {
    fn into_events(self) -> Vec<SpanEvent>;
}

impl Instances for IgnoredAny {
    fn into_events(self) -> Vec<SpanEvent> {
        Vec::new()
    }
}

impl Instances for Vec<SpanEvent> {
    fn into_events(self) -> Vec<SpanEvent> {
        self
    }
}

/// A curve point without its breakdown by category.
#[derive(Deserialize)]
struct Point {
    timestamp_ns: u64,
    device: String,
    live_bytes: u64,
}

/// Reads every file, on up to [`CompareOptions::threads`] workers. The first file in order
/// that fails is the error, whichever worker read it.
pub(crate) fn load_all(
    files: &[(PathBuf, Option<PathBuf>)],
    options: &CompareOptions,
) -> Result<Vec<Loaded>, RanksError> {
    let threads = match options.threads {
        0 => std::thread::available_parallelism().map_or(1, |n| n.get()),
        n => n,
    }
    .clamp(1, MAX_THREADS)
    .min(files.len().max(1));
    let next = AtomicUsize::new(0);
    // Files from this index on are not started: one before it failed.
    let stop_at = AtomicUsize::new(usize::MAX);
    let done: Mutex<Vec<(usize, Result<Loaded, RanksError>)>> =
        Mutex::new(Vec::with_capacity(files.len()));
    let work = || loop {
        let index = next.fetch_add(1, Ordering::Relaxed);
        if index >= files.len() || index >= stop_at.load(Ordering::Relaxed) {
            break;
        }
        let (path, found_in) = &files[index];
        let result = load_one(path, options.curve_points).map_err(|error| match error {
            RanksError::Profile { source, .. } => RanksError::Profile {
                source,
                found_in: found_in.clone(),
            },
            other => other,
        });
        if result.is_err() {
            stop_at.fetch_min(index, Ordering::Relaxed);
        }
        if let Ok(mut done) = done.lock() {
            done.push((index, result));
        }
    };
    if threads == 1 {
        work();
    } else {
        std::thread::scope(|scope| {
            for _ in 0..threads {
                scope.spawn(work);
            }
        });
    }
    let mut done = done
        .into_inner()
        .unwrap_or_else(|poison| poison.into_inner());
    done.sort_by_key(|(index, _)| *index);
    done.into_iter().map(|(_, result)| result).collect()
}

/// Reads one profile into its row (and curve, at most `curve_points` points).
pub(crate) fn load_one(path: &Path, curve_points: Option<usize>) -> Result<Loaded, RanksError> {
    let bytes = read_profile_bytes(path).map_err(profile_error)?;
    match curve_points {
        Some(points) => {
            let (profile, timeline) = parse::<Vec<Point>, Vec<SpanEvent>>(&bytes, path)?;
            let curve = rank_curve(&profile, &timeline, points);
            drop(timeline);
            reduce(profile, path, curve)
        }
        None => {
            let (profile, _) = parse::<IgnoredAny, IgnoredAny>(&bytes, path)?;
            reduce(profile, path, None)
        }
    }
}

fn profile_error(source: ProfileError) -> RanksError {
    RanksError::Profile {
        source,
        found_in: None,
    }
}

/// The profile's parts (as a [`Profile`] with the rest left empty, checked as a loaded one is)
/// and its timeline as `T` parses it.
fn parse<'de, T, E>(bytes: &'de [u8], path: &Path) -> Result<(Profile, T), RanksError>
where
    T: Deserialize<'de>,
    E: Deserialize<'de> + Default + Instances,
{
    let fail = |error: ProfileError| Err(profile_error(error));
    if bytes.iter().all(u8::is_ascii_whitespace) {
        return fail(ProfileError::Empty {
            path: path.to_path_buf(),
        });
    }
    let digest: Digest<T, E> = match serde_json::from_slice(bytes) {
        Ok(digest) => digest,
        Err(error) => {
            // Another schema gets the clearer error, as `Profile::load` gives it.
            check_schema(bytes, path).map_err(profile_error)?;
            return fail(ProfileError::Parse {
                path: path.to_path_buf(),
                detail: error.to_string(),
            });
        }
    };
    if digest.schema != SCHEMA {
        return fail(ProfileError::Schema {
            path: path.to_path_buf(),
            found: digest.schema,
            expected: SCHEMA,
        });
    }
    let profile = Profile {
        schema: digest.schema,
        meta: digest.meta,
        summary: digest.summary,
        peak_breakdown: digest.peak_breakdown,
        spans: digest.spans,
        iterations: digest.iterations,
        devices: digest.devices,
        span_events: digest.span_events.into_events(),
        ..Profile::default()
    };
    if let Err(detail) = profile.check_invariants() {
        return fail(ProfileError::Inconsistent {
            path: path.to_path_buf(),
            detail,
        });
    }
    Ok((profile, digest.timeline))
}

/// The rank's curve on its peak device.
fn rank_curve(profile: &Profile, timeline: &[Point], max_points: usize) -> Option<RankCurve> {
    let rank = profile.meta.rank?;
    let device = &profile.summary.peak_device;
    let mut points: Vec<(u64, u64)> = timeline
        .iter()
        .filter(|p| p.device == *device)
        .map(|p| (p.timestamp_ns, p.live_bytes))
        .collect();
    points.sort_by_key(|&(t, _)| t);
    let peak_at = points.iter().position(|&(t, bytes)| {
        t == profile.summary.peak_timestamp_ns && bytes == profile.summary.peak_bytes
    });
    let axis = Axis::new(
        &profile.iterations,
        &profile.spans,
        &profile.span_events,
        profile.summary.duration_ns,
    );
    Some(curve(rank, &axis, &points, peak_at, max_points))
}

fn reduce(profile: Profile, path: &Path, curve: Option<RankCurve>) -> Result<Loaded, RanksError> {
    let row = RankRow::from_profile(&profile, path).ok_or_else(|| RanksError::NoRank {
        path: path.to_path_buf(),
    })?;
    if let Some(world_size) = row.world_size.filter(|&world| row.rank >= world) {
        return Err(RanksError::RankOutsideWorld {
            path: path.to_path_buf(),
            rank: row.rank,
            world_size,
        });
    }
    Ok(Loaded {
        row,
        meta: profile.meta,
        curve,
    })
}
