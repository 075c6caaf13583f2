//! `highwater check` on profiles recorded here: budgets from flags and from a TOML file, a
//! baseline, and the exit codes 0 (all hold), 1 (one line per broken budget), 2 (bad input).
//!
//! A session records every thread of the process, so the checks run one after another in a
//! single test: no other test of this file allocates while a profile is being recorded.

use std::hint::black_box;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use highwater::{Profile, Session, Step};

#[global_allocator]
static ALLOC: highwater::Alloc = highwater::Alloc::system();

const KEPT: usize = 4096;
const ITERATIONS: usize = 12;

/// A small training-shaped run: optimizer state made once, then iterations of `train_step`
/// that use scratch memory and, when `leak`, keep 4 KiB each.
fn record(leak: bool) -> Profile {
    record_with_state(leak, 256 * 1024)
}

/// [`record`] with `state_bytes` of optimizer state: a smaller one is a real, consistent
/// baseline with a lower peak (a profile edited by hand no longer loads: its categories would
/// add up to more than its peak).
fn record_with_state(leak: bool, state_bytes: usize) -> Profile {
    let session = Session::builder().write_profile(false).start().unwrap();
    let state = {
        let _init = highwater::profile!("optimizer_init", Step::Optimizer);
        black_box(vec![0u8; state_bytes])
    };
    let mut kept: Vec<Vec<u8>> = Vec::with_capacity(ITERATIONS);
    for _ in 0..ITERATIONS {
        let _step = highwater::profile!("train_step");
        let _fwd = highwater::profile!("forward", Step::Forward);
        let scratch = black_box(vec![1u8; 64 * 1024]);
        if leak {
            kept.push(black_box(vec![2u8; KEPT]));
        }
        drop(scratch);
    }
    let profile = session.finish().unwrap();
    drop((state, kept));
    profile
}

fn write(dir: &Path, name: &str, profile: &Profile) -> String {
    let path = dir.join(name);
    profile.write(&path).unwrap();
    path.to_str().unwrap().to_owned()
}

fn check(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_highwater"))
        .arg("check")
        .args(args)
        .output()
        .expect("run highwater")
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8(bytes.to_vec()).expect("utf-8 output")
}

/// Asserts exit `code` and returns stdout's lines.
fn expect(output: &Output, code: i32) -> Vec<String> {
    assert_eq!(
        output.status.code(),
        Some(code),
        "stdout: {}\nstderr: {}",
        text(&output.stdout),
        text(&output.stderr)
    );
    text(&output.stdout).lines().map(str::to_owned).collect()
}

/// Asserts exit 2, nothing on stdout and one stderr line containing `needle`.
fn bad_input(output: &Output, needle: &str) {
    let stderr = text(&output.stderr);
    assert_eq!(output.status.code(), Some(2), "stderr: {stderr}");
    assert!(output.stdout.is_empty(), "stdout: {}", text(&output.stdout));
    assert!(stderr.contains(needle), "{needle:?} not in: {stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
}

fn budgets_that_hold_exit_0() {
    let dir = tempfile::tempdir().unwrap();
    let profile = record(false);
    let path = write(dir.path(), "p.json", &profile);
    let lines = expect(
        &check(&[
            &path,
            "--max-peak",
            "1GiB",
            "--max-peak-category",
            "optimizer=256KiB",
            "--max-growth-per-iteration",
            "0",
            "--max-dropped",
            "0",
        ]),
        0,
    );
    assert_eq!(lines, ["all 4 budgets hold"]);
}

fn each_broken_budget_is_one_line_and_exit_1() {
    let dir = tempfile::tempdir().unwrap();
    let profile = record(false);
    let path = write(dir.path(), "p.json", &profile);
    let output = check(&[
        &path,
        "--max-peak",
        "100KiB",
        "--max-peak-category",
        "optimizer=1KiB",
        "--max-peak-category",
        "activation=1GiB",
        "--max-dropped",
        "0",
    ]);
    let lines = expect(&output, 1);
    let peak = profile.summary.peak_bytes;
    assert!(
        peak > 256 * 1024 + 64 * 1024,
        "the scratch and the state: {peak}"
    );
    assert_eq!(lines.len(), 2, "{lines:?}");
    assert!(
        lines[0].starts_with("peak ")
            && lines[0].contains(&format!(
                "({peak} bytes) > max-peak 100.0 KiB (102400 bytes)"
            )),
        "{lines:?}"
    );
    assert_eq!(
        lines[1],
        "optimizer at the peak 256.0 KiB (262144 bytes) > max-peak-category optimizer=1.0 KiB \
         (1024 bytes)"
    );
    assert!(text(&output.stderr).contains("2 of 4 budgets broken"));
}

fn growth_per_iteration_catches_a_kept_allocation_and_spares_a_steady_loop() {
    let dir = tempfile::tempdir().unwrap();
    let leaky = write(dir.path(), "leaky.json", &record(true));
    let steady = write(dir.path(), "steady.json", &record(false));
    let lines = expect(&check(&[&leaky, "--max-growth-per-iteration", "0"]), 1);
    assert_eq!(
        lines,
        [format!(
            "growth {} (iterations 1..{}, after 1 warm-up) > \
             max-growth-per-iteration 0 bytes",
            highwater_profile::units::format_bytes_per_iteration(KEPT as f64),
            ITERATIONS - 1
        )]
    );
    expect(&check(&[&leaky, "--max-growth-per-iteration", "4KiB"]), 0);
    expect(&check(&[&steady, "--max-growth-per-iteration", "0"]), 0);
}

fn a_baseline_bounds_the_regression_of_the_peak() {
    let dir = tempfile::tempdir().unwrap();
    let profile = record(false);
    let path = write(dir.path(), "p.json", &profile);
    let smaller = record_with_state(false, 64 * 1024);
    assert!(smaller.summary.peak_bytes * 2 < profile.summary.peak_bytes);
    let baseline = write(dir.path(), "baseline.json", &smaller);
    expect(
        &check(&[&path, "--baseline", &path, "--max-regression", "0%"]),
        0,
    );
    let lines = expect(
        &check(&[&path, "--baseline", &baseline, "--max-regression", "5%"]),
        1,
    );
    assert_eq!(lines.len(), 1);
    assert!(
        lines[0].contains("above the baseline's") && lines[0].ends_with("> max-regression 5%"),
        "{lines:?}"
    );
    assert!(lines[0].contains("baseline.json"), "{lines:?}");
}

fn budgets_come_from_a_toml_file_and_flags_override_them() {
    let dir = tempfile::tempdir().unwrap();
    let profile = record(true);
    let path = write(dir.path(), "p.json", &profile);
    let smaller = record_with_state(true, 64 * 1024);
    assert!(smaller.summary.peak_bytes * 2 < profile.summary.peak_bytes);
    std::fs::create_dir(dir.path().join("ci")).unwrap();
    write(&dir.path().join("ci"), "baseline.json", &smaller);
    let file: PathBuf = dir.path().join("ci/highwater-budgets.toml");
    std::fs::write(
        &file,
        r#"
# Budgets for the training step, next to the code.
max-peak = "100 KiB"
max-growth-per-iteration = 0
warmup-iterations = 2
max-dropped = 0
baseline = "baseline.json"   # beside this file
max-regression = "5%"

[max-peak-category]
optimizer = "1 MiB"
"#,
    )
    .unwrap();
    let file = file.to_str().unwrap();
    let lines = expect(&check(&[&path, "--budgets", file]), 1);
    assert_eq!(lines.len(), 3, "peak, growth and regression: {lines:?}");
    assert!(lines[0].starts_with("peak ") && lines[0].contains("> max-peak 100.0 KiB"));
    assert!(
        lines[1].contains("(iterations 2..11, after 2 warm-up)"),
        "{lines:?}"
    );
    assert!(lines[2].contains("> max-regression 5%"), "{lines:?}");
    // A flag replaces the file's value for its budget only.
    let lines = expect(
        &check(&[
            &path,
            "--budgets",
            file,
            "--max-peak",
            "1GiB",
            "--max-growth-per-iteration",
            "4KiB",
        ]),
        1,
    );
    assert_eq!(lines.len(), 1, "{lines:?}");
    assert!(lines[0].contains("max-regression"), "{lines:?}");
    expect(
        &check(&[
            &path,
            "--budgets",
            file,
            "--max-peak",
            "1GiB",
            "--max-growth-per-iteration",
            "4KiB",
            "--max-regression",
            "150%",
        ]),
        0,
    );
}

fn bad_input_exits_2_with_a_clear_line() {
    let dir = tempfile::tempdir().unwrap();
    let path = write(dir.path(), "p.json", &record(false));
    let toml = |name: &str, body: &str| {
        let file = dir.path().join(name);
        std::fs::write(&file, body).unwrap();
        file.to_str().unwrap().to_owned()
    };
    bad_input(&check(&[&path]), "no budget to check");
    bad_input(
        &check(&["does-not-exist.json", "--max-peak", "1GiB"]),
        "does-not-exist.json",
    );
    bad_input(&check(&[&path, "--max-peak", "lots"]), "--max-peak");
    bad_input(
        &check(&[&path, "--max-peak-category", "optimiser=1MiB"]),
        "unknown category \"optimiser\"",
    );
    bad_input(
        &check(&[&path, "--max-regression", "5%"]),
        "--max-regression needs --baseline",
    );
    bad_input(
        &check(&[
            &path,
            "--baseline",
            "missing.json",
            "--max-regression",
            "5%",
        ]),
        "missing.json",
    );
    let syntax = toml("syntax.toml", "max-peak = \n");
    bad_input(&check(&[&path, "--budgets", &syntax]), "syntax.toml");
    let unknown = toml("unknown.toml", "max-peek = \"1 GiB\"\n");
    bad_input(&check(&[&path, "--budgets", &unknown]), "max-peek");
    let unit = toml("unit.toml", "max-peak = \"1 GB\"\n");
    bad_input(
        &check(&[&path, "--budgets", &unit]),
        "max-peak: unknown unit",
    );
    let category = toml("category.toml", "[max-peak-category]\nweights = 1\n");
    bad_input(
        &check(&[&path, "--budgets", &category]),
        "unknown category \"weights\"",
    );
    bad_input(
        &check(&[&path, "--budgets", "no-such-budgets.toml"]),
        "no-such-budgets.toml: cannot read",
    );
    // A growth budget on a profile without iterations cannot be evaluated.
    let mut flat = record(false);
    flat.iterations.clear();
    let flat = write(dir.path(), "flat.json", &flat);
    bad_input(
        &check(&[&flat, "--max-growth-per-iteration", "0"]),
        "needs iterations",
    );
}

#[test]
fn check_exits_0_1_or_2_as_budgets_hold_break_or_cannot_be_read() {
    budgets_that_hold_exit_0();
    each_broken_budget_is_one_line_and_exit_1();
    growth_per_iteration_catches_a_kept_allocation_and_spares_a_steady_loop();
    a_baseline_bounds_the_regression_of_the_peak();
    budgets_come_from_a_toml_file_and_flags_override_them();
    bad_input_exits_2_with_a_clear_line();
}
