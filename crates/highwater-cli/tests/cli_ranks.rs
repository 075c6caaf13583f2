//! `highwater ranks` and the ranks page of `highwater export` (issue 33): a row per rank equal
//! to that rank's profile, the heaviest and the missing ranks named, `--device` with exit 3,
//! allocation logs replayed per rank, and bad input refused with exit 2 and nothing printed.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use highwater::ops::{self, Tensor};
use highwater::profile::ranks::RankRow;
use highwater::{Alloc, Profile, Session};
use highwater_testkit::ranks::as_rank;
use highwater_testkit::sample::sample_profile;
use serde_json::Value;

#[global_allocator]
static ALLOC: Alloc = Alloc::system();

const MIB: u64 = 1 << 20;
const GIB: u64 = 1 << 30;

fn highwater(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_highwater"))
        .args(args)
        .env("RUST_BACKTRACE", "1")
        .output()
        .expect("run highwater")
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// Rank profiles of run `job` in `dir`: `(rank, extra MiB)` each, of a world of `world`.
fn write_ranks(dir: &Path, world: u32, ranks: &[(u32, u64)]) -> Vec<PathBuf> {
    ranks
        .iter()
        .map(|&(rank, extra)| {
            let path = dir.join(format!("p.rank{rank}.json"));
            as_rank(sample_profile(), rank, world, "torchrun:job", extra * MIB)
                .write(&path)
                .unwrap();
            path
        })
        .collect()
}

fn arg(path: &Path) -> &str {
    path.to_str().unwrap()
}

#[test]
fn a_row_per_rank_then_the_heaviest_and_the_missing_rank() {
    let dir = tempfile::tempdir().unwrap();
    write_ranks(dir.path(), 4, &[(0, 0), (1, 512), (3, 2048)]);
    let output = highwater(&["ranks", arg(dir.path())]);
    assert!(output.status.success(), "{}", text(&output.stderr));
    let out = text(&output.stdout);
    assert!(out.starts_with("run torchrun:job: train_gpt, 3 ranks read of a world of 4"));
    for rank in [0, 1, 3] {
        let peak = Profile::load(dir.path().join(format!("p.rank{rank}.json")))
            .unwrap()
            .summary
            .peak_bytes;
        let line = out
            .lines()
            .find(|l| l.trim_start().starts_with(&format!("{rank} ")))
            .unwrap_or_else(|| panic!("no row for rank {rank}: {out}"));
        assert!(
            line.contains(&highwater::profile::units::format_bytes(peak)),
            "{line}"
        );
        assert!(line.contains("cuda:0 (24.0 GiB)"), "{line}");
    }
    assert!(out.contains("imbalance: rank 3 peaks highest"), "{out}");
    assert!(out.contains("MISSING: rank 2 of the world of 4"), "{out}");
}

#[test]
fn json_rows_are_each_rank_s_own_profile() {
    let dir = tempfile::tempdir().unwrap();
    let files = write_ranks(dir.path(), 3, &[(0, 100), (1, 0), (2, 50)]);
    let output = highwater(&["ranks", "--format", "json", arg(dir.path())]);
    assert!(output.status.success(), "{}", text(&output.stderr));
    let json: Value = serde_json::from_slice(&output.stdout).unwrap();
    let rows = json["ranks"].as_array().unwrap();
    assert_eq!(rows.len(), 3);
    for (row, file) in rows.iter().zip(&files) {
        let profile = Profile::load(file).unwrap();
        let expected = RankRow::from_profile(&profile, file).unwrap();
        assert_eq!(*row, serde_json::to_value(&expected).unwrap());
    }
    assert_eq!(json["imbalance"]["heaviest_rank"], 0);
    assert_eq!(json["missing_ranks"], serde_json::json!([]));
    assert_eq!(json["run"]["label"], "torchrun:job");
    assert_eq!(json["device"], Value::Null);
}

#[test]
fn a_rank_that_does_not_fit_the_device_exits_3_after_the_table() {
    let dir = tempfile::tempdir().unwrap();
    write_ranks(dir.path(), 3, &[(0, 0), (1, 3072), (2, 1024)]);
    let peak0 = Profile::load(dir.path().join("p.rank0.json"))
        .unwrap()
        .summary
        .peak_bytes;
    // Room for rank 0 plus 2 GiB: rank 2 fits, rank 1 does not.
    let limit = (peak0 + 2 * GIB).to_string();
    let args = [
        "ranks",
        arg(dir.path()),
        "--device",
        "l4",
        "--limit",
        &limit,
    ];
    let output = highwater(&args);
    assert_eq!(output.status.code(), Some(3), "{}", text(&output.stderr));
    let out = text(&output.stdout);
    assert!(
        out.contains("rank 1 runs out first (-1.0 GiB headroom"),
        "{out}"
    );
    assert!(out.contains("DOES NOT FIT: rank 1 on l4"), "{out}");
    assert!(text(&output.stderr).contains("rank 1 of run torchrun:job does not fit l4"));
    let mut json_args = args.to_vec();
    json_args.extend(["--format", "json"]);
    let output = highwater(&json_args);
    assert_eq!(output.status.code(), Some(3));
    let json: Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(json["device"]["first_to_run_out"], 1);
    let headroom: Vec<i64> = json["device"]["ranks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["headroom_bytes"].as_i64().unwrap())
        .collect();
    assert_eq!(headroom, [2 * GIB as i64, -(GIB as i64), GIB as i64]);
    // Everything fits an H100.
    let output = highwater(&["ranks", arg(dir.path()), "--device", "h100"]);
    assert!(output.status.success(), "{}", text(&output.stderr));
}

/// One session at a time per process: the tests that record take turns.
static RECORDING: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// Records rank `rank` of a world of 3 with an allocation log: `gib` GiB of activations on
/// `cuda:0` held together, twice.
fn record_rank(dir: &Path, rank: u32, gib: u64) {
    let _turn = RECORDING.lock().unwrap_or_else(|p| p.into_inner());
    let session = Session::builder()
        .output(dir.join("r.json"))
        .alloc_log(dir.join("r.alloc"))
        .rank(rank, 3)
        .run_id("fit-test")
        .checkpoint_every(std::time::Duration::ZERO)
        .start()
        .unwrap();
    assert_eq!(
        session.output(),
        Some(dir.join(format!("r.rank{rank}.json")).as_path())
    );
    for round in 0..2u64 {
        let _fwd = highwater::profile!("step", highwater::Step::Forward);
        let ids: Vec<u64> = (0..gib).map(|i| round * 100 + i + 1).collect();
        for &id in &ids {
            ops::tensor_alloc(
                &Tensor {
                    id,
                    shape: &[1],
                    dtype: "f32",
                    device: "cuda:0",
                    bytes: GIB,
                },
                Some(highwater::Category::Activation),
            );
        }
        for &id in &ids {
            ops::tensor_free("cuda:0", id, GIB);
        }
    }
    session.finish().unwrap();
}

#[test]
fn allocation_logs_give_each_rank_s_fit_factor_and_the_run_s() {
    let dir = tempfile::tempdir().unwrap();
    for (rank, gib) in [(0, 2), (1, 6), (2, 4)] {
        record_rank(dir.path(), rank, gib);
    }
    // 8 GiB under a pool that holds exactly what is live: ×4, ×1.33 and ×2 of the activations.
    let args = [
        "ranks",
        arg(dir.path()),
        "--device",
        "l4",
        "--limit",
        "8GiB",
        "--allocator",
        "best-fit",
        "--format",
        "json",
    ];
    let output = highwater(&args);
    assert!(output.status.success(), "{}", text(&output.stderr));
    let json: Value = serde_json::from_slice(&output.stdout).unwrap();
    let factors: Vec<f64> = json["device"]["ranks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["fit"]["factor"].as_f64().unwrap())
        .collect();
    assert_eq!(factors, [4.0, 1.33, 2.0]);
    assert_eq!(json["device"]["run_fit_factor"], 1.33);
    assert_eq!(json["device"]["first_to_run_out"], 1);
    // Rank 1 on 4 GiB: it does not fit as recorded.
    let output = highwater(&[
        "ranks",
        arg(dir.path()),
        "--device",
        "l4",
        "--limit",
        "4GiB",
        "--allocator",
        "best-fit",
    ]);
    assert_eq!(output.status.code(), Some(3), "{}", text(&output.stderr));
    let out = text(&output.stdout);
    assert!(out.contains("DOES NOT FIT: rank 1"), "{out}");
    assert!(
        out.contains("replayed allocation logs under best-fit, growing activation: 3 of 3 ranks"),
        "{out}"
    );
}

#[test]
fn bad_input_exits_2_naming_the_problem_and_prints_nothing() {
    let dir = tempfile::tempdir().unwrap();
    write_ranks(dir.path(), 2, &[(0, 0), (1, 0)]);
    type Make = Box<dyn Fn(&Path)>;
    let cases: Vec<(&str, Make, &str)> = vec![
        (
            "two runs",
            Box::new(|d: &Path| {
                as_rank(sample_profile(), 0, 2, "torchrun:other", 0)
                    .write(d.join("q.rank0.json"))
                    .unwrap()
            }),
            "different runs: `torchrun:job`",
        ),
        (
            "a duplicate rank",
            Box::new(|d: &Path| {
                std::fs::copy(d.join("p.rank1.json"), d.join("p.rank1.pid9.json")).unwrap();
            }),
            "rank 1 appears twice",
        ),
        (
            "a file that is not a profile",
            Box::new(|d: &Path| std::fs::write(d.join("config.json"), "{\"lr\": 1}").unwrap()),
            "config.json is not a valid highwater profile",
        ),
        (
            "an unreadable file",
            Box::new(|d: &Path| {
                std::os::unix::fs::symlink(d.join("nowhere"), d.join("dangling.json")).unwrap()
            }),
            "cannot read profile",
        ),
    ];
    for (what, make, want) in cases {
        let case = tempfile::tempdir().unwrap();
        for entry in std::fs::read_dir(dir.path()).unwrap() {
            let entry = entry.unwrap();
            std::fs::copy(entry.path(), case.path().join(entry.file_name())).unwrap();
        }
        make(case.path());
        let html = case.path().join("page.html");
        let output = highwater(&["ranks", arg(case.path()), "--html", arg(&html)]);
        assert_eq!(output.status.code(), Some(2), "{what}");
        let stderr = text(&output.stderr);
        assert!(stderr.contains(want), "{what}: {stderr}");
        assert_eq!(stderr.lines().count(), 1, "{what}: one line: {stderr}");
        assert!(output.stdout.is_empty(), "{what}: nothing printed");
        assert!(!html.exists(), "{what}: no page written");
        let output = highwater(&["export", "--format", "html", arg(case.path())]);
        assert_eq!(output.status.code(), Some(2), "{what}");
        assert!(!case.path().join("highwater-ranks.html").exists(), "{what}");
    }
    // Picking a run among two is not bad input.
    let output = highwater(&["ranks", "--run", "torchrun:job", arg(dir.path())]);
    assert!(output.status.success(), "{}", text(&output.stderr));
    // Options that make no sense.
    let output = highwater(&["ranks", arg(dir.path()), "--limit", "1GiB"]);
    assert_eq!(output.status.code(), Some(2), "--limit needs --device");
    let output = highwater(&["export", "--format", "chrome", arg(dir.path())]);
    assert_eq!(output.status.code(), Some(2));
    let stderr = text(&output.stderr);
    assert!(
        stderr.contains("is a directory: --format chrome exports one profile"),
        "{stderr}"
    );
    let (a, b) = (
        dir.path().join("p.rank0.json"),
        dir.path().join("p.rank1.json"),
    );
    let output = highwater(&["export", "--format", "pprof", arg(&a), arg(&b)]);
    assert_eq!(output.status.code(), Some(2));
    let stderr = text(&output.stderr);
    assert!(
        stderr.contains("exports one profile, and 2 were given"),
        "{stderr}"
    );
}

#[test]
fn export_html_over_rank_profiles_writes_the_ranks_page() {
    let dir = tempfile::tempdir().unwrap();
    let files = write_ranks(dir.path(), 3, &[(0, 0), (1, 0), (2, 700)]);
    let output = highwater(&["export", "--format", "html", arg(dir.path())]);
    assert!(output.status.success(), "{}", text(&output.stderr));
    let page = std::fs::read_to_string(dir.path().join("highwater-ranks.html")).unwrap();
    assert!(page.contains("<tr class=\"heavy\" data-rank=\"2\">"));
    assert!(text(&output.stdout).contains("3 ranks of run torchrun:job"));
    // Named files, a chosen output; a single profile still makes the one-profile report.
    let out = dir.path().join("pair.html");
    let output = highwater(&[
        "export",
        "--format",
        "html",
        arg(&files[0]),
        arg(&files[1]),
        "-o",
        arg(&out),
    ]);
    assert!(output.status.success(), "{}", text(&output.stderr));
    assert!(std::fs::read_to_string(&out)
        .unwrap()
        .contains("id=\"rank-table\""));
    let output = highwater(&["export", "--format", "html", arg(&files[0])]);
    assert!(output.status.success());
    let single = std::fs::read_to_string(dir.path().join("p.rank0.html")).unwrap();
    assert!(!single.contains("rank-table") && single.contains("id=\"summary\""));
}
