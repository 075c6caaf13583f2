//! Many processes, one run, end to end (issue 33): the ranks example's launcher starts four
//! worker processes of this test binary as torchrun would (each with its rank in the
//! environment and one `HIGHWATER_OUT` for all), each trains a pipeline stage of real candle
//! layers (the middle rank's stage holds the most) and writes its own profile; then
//! `highwater ranks` on the directory gives each rank's row exactly as its profile has it and
//! names the heavy rank. A second launch in which rank 1 dies mid-run is reported with rank 1
//! missing.
//!
//! The binary is its own `main` (no test harness): started with `--worker`, it is a rank.

use std::path::Path;
use std::process::{Command, Output};

use highwater::profile::model::Category;
use highwater::profile::ranks::RankRow;
use highwater::Profile;
use serde_json::Value;

use highwater_testkit::launch as ranks;

#[global_allocator]
static ALLOC: highwater::Alloc = highwater::Alloc::system();

fn highwater(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_highwater"))
        .args(args)
        .output()
        .expect("run highwater")
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

fn launch(dir: &Path, fail_rank: Option<u32>) -> ranks::Launched {
    let mut plan = ranks::Plan::new(4, 4, dir.to_path_buf());
    plan.width = 128;
    plan.batch = 32;
    plan.fail_rank = fail_rank;
    let program = std::env::current_exe().unwrap();
    ranks::launch(&program, &[], &plan).expect("launch the ranks")
}

/// Four ranks, all finish: each row is its profile, rank 2 (four layers) is the heaviest.
fn every_rank_s_row_is_its_profile_and_the_heavy_rank_is_named() {
    let dir = tempfile::tempdir().unwrap();
    let launched = launch(dir.path(), None);
    for (rank, status) in &launched.statuses {
        assert!(status.success(), "rank {rank}: {status}");
    }
    let dir_arg = dir.path().to_str().unwrap();
    let output = highwater(&["ranks", dir_arg, "--format", "json"]);
    assert!(output.status.success(), "{}", text(&output.stderr));
    let json: Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(json["run"]["label"], launched.run.as_str());
    assert_eq!(json["run"]["world_size"], 4);
    assert_eq!(json["missing_ranks"], serde_json::json!([]));
    let rows = json["ranks"].as_array().unwrap();
    assert_eq!(rows.len(), 4);
    let mut parameters = Vec::new();
    for (rank, row) in rows.iter().enumerate() {
        let file = ranks::profile_of(dir.path(), rank as u32);
        let profile = Profile::load(&file).unwrap();
        assert_eq!(profile.meta.rank, Some(rank as u32));
        assert_eq!(profile.meta.world_size, Some(4));
        assert_eq!(profile.meta.launcher.as_deref(), Some("torchrun"));
        assert!(!profile.meta.partial);
        let expected = RankRow::from_profile(&profile, &file).unwrap();
        assert_eq!(
            *row,
            serde_json::to_value(&expected).unwrap(),
            "rank {rank}"
        );
        assert_eq!(
            row["peak_bytes"].as_u64(),
            Some(profile.summary.peak_bytes),
            "rank {rank}"
        );
        parameters.push(profile.summary.peak_by_category[&Category::Parameter]);
    }
    // Parameters follow the layers each stage holds: 1, 2, 4, 2 of 128 × 128 + 128 floats.
    let layer = (128 * 128 + 128) * 4;
    for (rank, bytes) in parameters.iter().enumerate() {
        let layers = ranks::layers_of(rank as u32, 2) as u64;
        assert!(*bytes >= layers * layer, "rank {rank}: {bytes}");
    }
    assert_eq!(json["imbalance"]["heaviest_rank"], 2);
    let output = highwater(&["ranks", dir_arg]);
    let out = text(&output.stdout);
    assert!(out.contains("imbalance: rank 2 peaks highest"), "{out}");
    // The ranks page marks it too.
    let output = highwater(&["export", "--format", "html", dir_arg]);
    assert!(output.status.success(), "{}", text(&output.stderr));
    let page = std::fs::read_to_string(dir.path().join("highwater-ranks.html")).unwrap();
    assert!(page.contains("<tr class=\"heavy\" data-rank=\"2\">"));
}

/// Rank 1 dies half way (no checkpoints, so it leaves nothing): it is reported missing.
fn a_rank_that_dies_is_reported_missing() {
    let dir = tempfile::tempdir().unwrap();
    let launched = launch(dir.path(), Some(1));
    for (rank, status) in &launched.statuses {
        assert_eq!(status.success(), *rank != 1, "rank {rank}: {status}");
    }
    assert!(!ranks::profile_of(dir.path(), 1).exists());
    let dir_arg = dir.path().to_str().unwrap();
    let output = highwater(&["ranks", dir_arg]);
    assert!(output.status.success(), "{}", text(&output.stderr));
    let out = text(&output.stdout);
    assert!(
        out.contains("MISSING: rank 1 of the world of 4 left no profile"),
        "{out}"
    );
    let output = highwater(&["ranks", dir_arg, "--format", "json"]);
    let json: Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(json["missing_ranks"], serde_json::json!([1]));
    assert_eq!(json["imbalance"]["heaviest_rank"], 2);
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().map(String::as_str) == Some("--worker") {
        if let Err(error) = ranks::worker(&args) {
            eprintln!("worker: {error:#}");
            std::process::exit(1);
        }
        return;
    }
    // `cargo test -- --list` asks what there is to run.
    if args.iter().any(|a| a == "--list") {
        println!("cli_ranks_end_to_end: test");
        return;
    }
    for (name, test) in [
        (
            "every_rank_s_row_is_its_profile_and_the_heavy_rank_is_named",
            every_rank_s_row_is_its_profile_and_the_heavy_rank_is_named as fn(),
        ),
        (
            "a_rank_that_dies_is_reported_missing",
            a_rank_that_dies_is_reported_missing,
        ),
    ] {
        test();
        println!("test {name} ... ok");
    }
}
