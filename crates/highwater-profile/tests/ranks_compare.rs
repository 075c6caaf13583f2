//! `ranks::compare` (issue 33): one row per rank, exactly what that rank's profile says; the
//! run's figures; runs told apart; every kind of bad input refused naming the file.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use highwater_profile::model::Step;
use highwater_profile::ranks::{
    compare, CompareOptions, DeviceCheck, PeakWhen, RankFit, RankRow, RanksError,
};
use highwater_profile::{Profile, ProfileError};
use highwater_testkit::ranks::as_rank;
use highwater_testkit::sample::sample_profile;

const MIB: u64 = 1 << 20;

/// Writes rank profiles of one run into `dir`: rank `r` gets `extra[r]` MiB more activations.
fn write_run(dir: &Path, run: &str, world: u32, extra_mib: &[(u32, u64)]) -> Vec<PathBuf> {
    extra_mib
        .iter()
        .map(|&(rank, extra)| {
            let path = dir.join(format!("{run}.rank{rank}.json"));
            as_rank(sample_profile(), rank, world, run, extra * MIB)
                .write(&path)
                .unwrap();
            path
        })
        .collect()
}

#[test]
fn each_row_is_exactly_what_its_profile_says() {
    let dir = tempfile::tempdir().unwrap();
    let files = write_run(
        dir.path(),
        "job",
        4,
        &[(0, 0), (1, 300), (2, 900), (3, 100)],
    );
    for threads in [1, 3] {
        let options = CompareOptions::new().threads(threads).curves(50);
        let run = compare(&[dir.path().to_path_buf()], &options).unwrap();
        assert_eq!(run.rows.len(), 4);
        for (row, file) in run.rows.iter().zip(&files) {
            let profile = Profile::load(file).unwrap();
            assert_eq!(Some(row), RankRow::from_profile(&profile, file).as_ref());
        }
        assert_eq!(run.curves.len(), 4);
        assert!(run.curves.iter().all(|c| c.x.len() <= 50 && c.by_iteration));
    }
}

/// The sample as rank 0, with the span tree's own peaks set: `peak` on the spans at `paths`, a
/// byte less on every other.
fn with_span_peaks(paths: &[&str]) -> Profile {
    let mut profile = as_rank(sample_profile(), 0, 1, "job", 0);
    let peak = profile.summary.peak_bytes;
    let all = profile.span_paths();
    for (node, path) in profile.spans.iter_mut().zip(all) {
        node.peak_bytes = if paths.contains(&path.as_str()) {
            peak
        } else {
            peak - 1
        };
    }
    profile
}

fn row_of(profile: &Profile) -> RankRow {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("p.json");
    profile.write(&path).unwrap();
    let row = compare(std::slice::from_ref(&path), &CompareOptions::new())
        .unwrap()
        .rows
        .remove(0);
    assert_eq!(Some(&row), RankRow::from_profile(profile, &path).as_ref());
    row
}

#[test]
fn a_row_reads_the_peak_its_step_its_iteration_and_the_leak() {
    let profile = with_span_peaks(&["step", "step/forward"]);
    let row = row_of(&profile);
    assert_eq!(row.rank, 0);
    assert_eq!(row.peak_bytes, profile.summary.peak_bytes);
    assert_eq!(row.peak_device, "cuda:0");
    assert_eq!(row.capacity_bytes, Some(24 << 30));
    assert_eq!(row.peak_by_category, profile.summary.peak_by_category);
    // The sample peaks in iteration `peak / 500 ms`.
    let iteration = profile.summary.peak_timestamp_ns / 500_000_000;
    assert_eq!(
        row.peak_when,
        PeakWhen::Iteration {
            span: "step".into(),
            first: iteration,
            last: iteration
        }
    );
    assert_eq!(row.peak_span.as_deref(), Some("step/forward"));
    assert_eq!(row.peak_step, Some(Step::Forward));
    assert_eq!(row.iterations, 8);
    // Live bytes at the end of iterations 1..=7 over 6 iterations: the CPU's 4 MiB a step.
    let (first, last) = (&profile.iterations[1], &profile.iterations[7]);
    let growth = (last.live_bytes as f64 - first.live_bytes as f64) / 6.0;
    assert_eq!(row.growth_per_iteration, Some(growth));
    assert!((growth - 4.0 * MIB as f64).abs() < 1.0, "{growth}");
    // The span holding most on cuda:0 at the peak, from the live-at-peak rows.
    let mut by_path: BTreeMap<&str, u64> = BTreeMap::new();
    for r in profile
        .peak_breakdown
        .iter()
        .filter(|r| r.device == "cuda:0")
    {
        *by_path.entry(&r.span_path).or_default() += r.bytes;
    }
    let most = by_path.values().max().unwrap();
    let top = row.top_span.unwrap();
    assert_eq!(top.bytes, *most);
    assert_eq!(by_path[top.path.as_str()], *most);
}

#[test]
fn the_span_at_the_peak_is_the_innermost_that_reached_it_or_their_common_one() {
    // A layer inside forward: the innermost, and forward's step.
    let row = row_of(&with_span_peaks(&[
        "step",
        "step/forward",
        "step/forward/layer3",
    ]));
    assert_eq!(row.peak_span.as_deref(), Some("step/forward/layer3"));
    assert_eq!(row.peak_step, Some(Step::Forward));
    // Reached in forward and in backward (two steps peaking alike): their common span, no step.
    let row = row_of(&with_span_peaks(&["step", "step/forward", "step/backward"]));
    assert_eq!(row.peak_span.as_deref(), Some("step"));
    assert_eq!(row.peak_step, None);
    // Outside every span.
    let row = row_of(&with_span_peaks(&[]));
    assert_eq!((row.peak_span, row.peak_step), (None, None));
}

#[test]
fn a_peak_outside_the_iterations_is_said_to_be_before_between_or_after() {
    // The iteration span never held the peak: it came outside it.
    let outside = with_span_peaks(&["init"]);
    let ends: Vec<u64> = outside
        .iterations
        .iter()
        .map(|i| i.end_timestamp_ns)
        .collect();
    let at = |ns: u64| {
        let mut profile = outside.clone();
        profile.summary.peak_timestamp_ns = ns;
        row_of(&profile).peak_when
    };
    let span = || "step".to_string();
    assert_eq!(at(ends[0] / 2), PeakWhen::BeforeIterations { span: span() });
    assert_eq!(
        at(ends[3] + 1),
        PeakWhen::BetweenIterations {
            span: span(),
            after: 3
        }
    );
    assert_eq!(
        at(ends[7] + 1),
        PeakWhen::AfterIterations {
            span: span(),
            last: 7
        }
    );
    assert_eq!(
        row_of(&outside).peak_span.as_deref(),
        Some("init"),
        "init held it"
    );
}

#[test]
fn the_run_names_its_heaviest_rank_its_missing_and_its_partial_ones() {
    let dir = tempfile::tempdir().unwrap();
    write_run(
        dir.path(),
        "job",
        6,
        &[(0, 0), (1, 300), (3, 900), (5, 100)],
    );
    // Rank 5 died: its last checkpoint is what it left.
    let path = dir.path().join("job.rank5.json");
    let mut partial = Profile::load(&path).unwrap();
    partial.meta.partial = true;
    partial.meta.checkpoint_unix_ms = Some(partial.meta.started_unix_ms + 1_000);
    partial.write(&path).unwrap();
    let run = compare(&[dir.path().to_path_buf()], &CompareOptions::new()).unwrap();
    assert_eq!(run.missing_ranks, [2, 4]);
    assert_eq!(run.partial_ranks, [5]);
    let peaks: Vec<u64> = run.rows.iter().map(|r| r.peak_bytes).collect();
    let mean = peaks.iter().sum::<u64>() as f64 / 4.0;
    assert_eq!(run.imbalance.heaviest_rank, 3);
    assert_eq!(run.imbalance.lightest_rank, 0);
    assert_eq!(run.imbalance.max_peak_bytes, peaks[2]);
    assert_eq!(run.imbalance.max_over_mean, peaks[2] as f64 / mean);
    assert_eq!(run.run.label, "job");
    assert_eq!(run.run.world_size, Some(6));
}

#[test]
fn a_device_check_names_the_rank_that_runs_out_first() {
    let dir = tempfile::tempdir().unwrap();
    write_run(dir.path(), "job", 3, &[(0, 0), (1, 2048), (2, 512)]);
    let run = compare(&[dir.path().to_path_buf()], &CompareOptions::new()).unwrap();
    let capacity = run.rows[0].peak_bytes + 1024 * MIB;
    let mut check = DeviceCheck::new("l4", capacity, &run);
    assert_eq!(check.first_to_run_out, Some(1));
    assert_eq!(check.not_fitting(), [1]);
    let headroom: Vec<i64> = check.ranks.iter().map(|r| r.headroom_bytes).collect();
    assert_eq!(
        headroom,
        [1024 * MIB as i64, -1024 * MIB as i64, 512 * MIB as i64]
    );
    // Replays: the run's factor is its smallest; a replay that does not fit makes a rank fail.
    for (rank, factor, fits) in [(0, 2.5, true), (1, 0.5, false), (2, 1.5, true)] {
        assert_eq!(check.run_fit_factor, None, "not every rank replayed yet");
        let fit = RankFit::new(
            format!("r{rank}.alloc").into(),
            "pytorch".into(),
            vec!["activation".into()],
            fits,
            Some(factor),
        );
        check.set_fit(rank, fit);
    }
    assert_eq!(check.run_fit_factor, Some(0.5));
    assert_eq!(check.not_fitting(), [1]);
}

#[test]
fn two_runs_are_refused_naming_both_unless_one_is_chosen() {
    let dir = tempfile::tempdir().unwrap();
    write_run(dir.path(), "monday", 2, &[(0, 0), (1, 10)]);
    write_run(dir.path(), "tuesday", 2, &[(0, 0)]);
    let error = compare(&[dir.path().to_path_buf()], &CompareOptions::new()).unwrap_err();
    let message = error.to_string();
    assert!(
        matches!(error, RanksError::DifferentRuns { .. }),
        "{message}"
    );
    for needle in ["`monday`", "`tuesday`", "--run", "monday.rank0.json"] {
        assert!(message.contains(needle), "{needle}: {message}");
    }
    let run = compare(
        &[dir.path().to_path_buf()],
        &CompareOptions::new().run("tuesday"),
    )
    .unwrap();
    assert_eq!(run.rows.len(), 1);
    assert_eq!(run.missing_ranks, [1]);
    assert_eq!(run.other_runs.len(), 1);
    assert_eq!(run.other_runs[0].label, "monday");
    let error = compare(
        &[dir.path().to_path_buf()],
        &CompareOptions::new().run("friday"),
    )
    .unwrap_err();
    assert!(error.to_string().contains("no run `friday`"), "{error}");
}

#[test]
fn runs_without_an_id_are_told_apart_by_when_they_ran() {
    let dir = tempfile::tempdir().unwrap();
    let hour = 3_600_000;
    for (run, start) in [("a", 0), ("b", hour)] {
        for rank in 0..2 {
            let mut profile = as_rank(sample_profile(), rank, 2, "x", 0);
            profile.meta.run_id = None;
            profile.meta.started_unix_ms += start;
            profile
                .write(dir.path().join(format!("{run}{rank}.json")))
                .unwrap();
        }
    }
    let error = compare(&[dir.path().to_path_buf()], &CompareOptions::new()).unwrap_err();
    let RanksError::DifferentRuns { runs } = &error else {
        panic!("{error}")
    };
    assert_eq!(runs.len(), 2);
    assert!(runs.iter().all(|r| r.profiles == 2 && r.run_id.is_none()));
    let later = runs.iter().max_by_key(|r| r.started_unix_ms).unwrap();
    assert!(later.label.starts_with("train_gpt@"), "{}", later.label);
    let run = compare(
        &[dir.path().to_path_buf()],
        &CompareOptions::new().run(later.label.clone()),
    )
    .unwrap();
    assert_eq!(run.rows.len(), 2);
    assert!(run
        .rows
        .iter()
        .all(|r| r.file.to_string_lossy().contains("/b")));
}

#[test]
fn a_duplicate_rank_is_refused_naming_both_files() {
    let dir = tempfile::tempdir().unwrap();
    let files = write_run(dir.path(), "job", 2, &[(0, 0), (1, 0)]);
    let copy = dir.path().join("job.rank1.pid77.json");
    std::fs::copy(&files[1], &copy).unwrap();
    let error = compare(&[dir.path().to_path_buf()], &CompareOptions::new()).unwrap_err();
    let message = error.to_string();
    assert!(message.contains("rank 1 appears twice"), "{message}");
    assert!(message.contains("job.rank1.json") && message.contains("job.rank1.pid77.json"));
}

#[test]
fn bad_files_are_refused_naming_them_whatever_worker_reads_them() {
    let dir = tempfile::tempdir().unwrap();
    write_run(dir.path(), "job", 4, &[(0, 0), (1, 0), (3, 0)]);
    // Left alone in a directory: hidden files and Chrome traces.
    std::fs::write(dir.path().join(".job.rank0.json.lock"), "").unwrap();
    std::fs::write(dir.path().join("job.rank0.trace.json"), "[]").unwrap();
    std::fs::write(dir.path().join("notes.txt"), "x").unwrap();
    assert!(compare(&[dir.path().to_path_buf()], &CompareOptions::new()).is_ok());
    let mut no_rank = sample_profile();
    no_rank.meta.run_id = Some("job".into());
    let cases: Vec<(&str, Vec<u8>, &str)> = vec![
        (
            "config.json",
            br#"{"lr": 0.1}"#.to_vec(),
            "not a valid highwater profile",
        ),
        ("empty.json", Vec::new(), "is empty"),
        (
            "truncated.json",
            b"{\"schema\": \"highwater/2\", \"me".to_vec(),
            "not a valid",
        ),
        (
            "old.json",
            br#"{"schema": "highwater/1"}"#.to_vec(),
            "schema \"highwater/1\"",
        ),
        (
            "norank.json",
            no_rank.to_json().into_bytes(),
            "records no rank",
        ),
    ];
    for (name, bytes, want) in cases {
        let path = dir.path().join(name);
        std::fs::write(&path, &bytes).unwrap();
        for threads in [1, 4] {
            let options = CompareOptions::new().threads(threads);
            let error = compare(&[dir.path().to_path_buf()], &options).unwrap_err();
            let message = error.to_string();
            assert!(message.contains(want), "{name}: {message}");
            assert!(message.contains(name), "{name}: {message}");
            if want != "records no rank" {
                assert!(message.contains("name the profiles instead"), "{message}");
            }
            // Named by itself, the same refusal without the hint.
            let error = compare(std::slice::from_ref(&path), &options).unwrap_err();
            assert!(!error.to_string().contains("name the profiles"), "{error}");
        }
        std::fs::remove_file(&path).unwrap();
    }
    // Refused as `Profile::load` refuses it: an inconsistent one.
    let mut bad = as_rank(sample_profile(), 2, 4, "job", 0);
    bad.summary.peak_bytes = 1;
    let path = dir.path().join("job.rank2.json");
    std::fs::write(&path, bad.to_json()).unwrap();
    let error = compare(&[dir.path().to_path_buf()], &CompareOptions::new()).unwrap_err();
    assert!(
        matches!(
            &error,
            RanksError::Profile {
                source: ProfileError::Inconsistent { .. },
                ..
            }
        ),
        "{error}"
    );
    std::fs::remove_file(&path).unwrap();
    // A file that is not there, and an empty directory.
    let missing = dir.path().join("gone.json");
    let error = compare(&[missing], &CompareOptions::new()).unwrap_err();
    assert!(error.to_string().contains("gone.json"), "{error}");
    let empty = tempfile::tempdir().unwrap();
    let error = compare(&[empty.path().to_path_buf()], &CompareOptions::new()).unwrap_err();
    assert!(error.to_string().contains("holds no profiles"), "{error}");
}

#[test]
fn a_rank_at_or_past_its_world_size_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("p.json");
    as_rank(sample_profile(), 4, 4, "job", 0)
        .write(&path)
        .unwrap();
    let error = compare(&[path], &CompareOptions::new()).unwrap_err();
    assert!(
        error.to_string().contains("rank 4 of a world of 4"),
        "{error}"
    );
}

#[test]
fn ranks_told_different_world_sizes_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    write_run(dir.path(), "job", 4, &[(0, 0)]);
    as_rank(sample_profile(), 1, 8, "job", 0)
        .write(dir.path().join("job.rank1.json"))
        .unwrap();
    let error = compare(&[dir.path().to_path_buf()], &CompareOptions::new()).unwrap_err();
    assert!(
        error.to_string().contains("disagree on the world size"),
        "{error}"
    );
}
