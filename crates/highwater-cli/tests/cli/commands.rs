//! The `highwater` binary on good profiles: each command's text and `--json` output, exports,
//! exit codes and a closed stdout.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use crate::{highwater, stdout};
use highwater::{Category, Profile};
use highwater_profile::units::format_bytes;
use highwater_profile::Warning;
use highwater_testkit::sample::{sample_profile, sample_profile_with_drops};
use serde_json::Value;

fn write_profile(dir: &Path, name: &str, profile: &Profile) -> PathBuf {
    let path = dir.join(name);
    profile.write(&path).unwrap();
    path
}

fn sample_file(dir: &Path) -> (PathBuf, String) {
    let path = write_profile(dir, "highwater-profile.json", &sample_profile());
    let text = path.to_str().unwrap().to_string();
    (path, text)
}

#[test]
fn summary_shows_peak_device_and_binary_units() {
    let dir = tempfile::tempdir().unwrap();
    let (_, path) = sample_file(dir.path());
    let text = stdout(&highwater(&["summary", &path]));
    let peak = sample_profile().summary.peak_bytes;
    assert!(text.contains(&format_bytes(peak)), "{text}");
    assert!(text.contains("GiB") && text.contains("cuda:0"), "{text}");
    assert!(!text.contains(" GB") && !text.contains(" MB"), "{text}");
    assert!(!text.contains("WARNING"), "{text}");
}

#[test]
fn summary_warns_about_dropped_events() {
    let dir = tempfile::tempdir().unwrap();
    let path = write_profile(dir.path(), "p.json", &sample_profile_with_drops());
    let text = stdout(&highwater(&["summary", path.to_str().unwrap()]));
    assert!(text.contains("WARNING: 1234 events were dropped"), "{text}");
    let json: Value = serde_json::from_str(&stdout(&highwater(&[
        "summary",
        path.to_str().unwrap(),
        "--json",
    ])))
    .unwrap();
    assert_eq!(json["summary"]["dropped_events"], 1234);
    assert_eq!(json["warnings"][0]["code"], "dropped_events");
    assert_eq!(json["warnings"][0]["events"], 1234);
    assert_eq!(
        json["warnings"][0]["message"],
        Warning::DroppedEvents {
            events: 1234,
            mode: highwater_profile::CaptureMode::DropWhenFull,
        }
        .to_string()
    );
    assert_eq!(json["warnings"][1]["code"], "growing_residual");
    assert_eq!(json["warnings"].as_array().unwrap().len(), 2);
}

#[test]
fn summary_json_carries_the_exact_figures() {
    let dir = tempfile::tempdir().unwrap();
    let (_, path) = sample_file(dir.path());
    let json: Value =
        serde_json::from_str(&stdout(&highwater(&["summary", &path, "--json"]))).unwrap();
    let profile = sample_profile();
    assert_eq!(json["summary"]["peak_bytes"], profile.summary.peak_bytes);
    assert_eq!(json["summary"]["peak_device"], "cuda:0");
    assert_eq!(json["devices"].as_array().unwrap().len(), 3);
    let temporary =
        profile.summary.peak_temporary_by_category[&highwater_profile::model::Category::Activation];
    assert_eq!(
        json["summary"]["peak_temporary_by_category"]["activation"],
        temporary
    );
}

#[test]
fn top_lists_the_largest_rows_first() {
    let dir = tempfile::tempdir().unwrap();
    let (_, path) = sample_file(dir.path());
    let text = stdout(&highwater(&["top", &path, "-n", "3"]));
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(
        lines.len(),
        6,
        "title, header, three rows and the line on SITES: {text}"
    );
    assert!(lines[1].contains("BYTES") && lines[1].contains("SPAN PATH"));
    let profile = sample_profile();
    let mut rows = profile.peak_breakdown.clone();
    rows.sort_by_key(|row| std::cmp::Reverse(row.bytes));
    assert!(lines[2].contains(&format_bytes(rows[0].bytes)), "{text}");
    assert!(lines[2].contains(&rows[0].span_path), "{text}");

    let json: Value = serde_json::from_str(&stdout(&highwater(&[
        "top", &path, "--limit", "4", "--json",
    ])))
    .unwrap();
    let rows_json = json["rows"].as_array().unwrap();
    assert_eq!(rows_json.len(), 4);
    assert_eq!(rows_json[0]["bytes"], rows[0].bytes);
    assert_eq!(json["total_rows"], profile.peak_breakdown.len());
}

#[test]
fn spans_prints_the_tree_indented_under_its_parents() {
    let dir = tempfile::tempdir().unwrap();
    let (_, path) = sample_file(dir.path());
    let text = stdout(&highwater(&["spans", &path]));
    let forward = text
        .lines()
        .find(|l| l.trim_start().starts_with("forward"))
        .unwrap();
    let step = text.lines().find(|l| l.starts_with("step")).unwrap();
    assert!(forward.starts_with("  forward"), "{text}");
    assert!(step.contains("GiB"), "{step}");

    let json: Value =
        serde_json::from_str(&stdout(&highwater(&["spans", &path, "--json"]))).unwrap();
    let nodes = json.as_array().unwrap();
    assert_eq!(nodes.len(), sample_profile().spans.len());
    let attn = nodes
        .iter()
        .find(|n| n["path"] == "step/forward/layer0/attn")
        .unwrap();
    assert_eq!(attn["depth"], 3);
}

#[test]
fn diff_reports_what_grew_and_what_shrank() {
    let dir = tempfile::tempdir().unwrap();
    let (_, before) = sample_file(dir.path());
    let mut bigger = sample_profile();
    bigger.summary.peak_bytes += 512 << 20;
    *bigger
        .summary
        .peak_by_category
        .get_mut(&Category::Activation)
        .unwrap() += 512 << 20;
    let forward_id = (0..bigger.spans.len() as u32)
        .find(|&id| bigger.span_path(id) == "step/forward")
        .unwrap();
    let forward = &mut bigger.spans[forward_id as usize];
    forward.peak_bytes += 512 << 20;
    let after = write_profile(dir.path(), "after.json", &bigger);
    let after = after.to_str().unwrap();

    let text = stdout(&highwater(&["diff", &before, after]));
    assert!(text.contains("+512.0 MiB"), "{text}");
    let first_span = text
        .lines()
        .skip_while(|l| !l.starts_with("spans that changed"))
        .nth(2)
        .unwrap();
    assert!(first_span.contains("step/forward"), "{text}");

    let json: Value =
        serde_json::from_str(&stdout(&highwater(&["diff", &before, after, "--json"]))).unwrap();
    assert_eq!(json["peak_bytes"]["delta"], 512 << 20);
    assert_eq!(json["categories"][0]["category"], "activation");
    assert_eq!(json["spans"][0]["path"], "step/forward");

    let same = stdout(&highwater(&["diff", &before, &before]));
    assert!(same.contains("spans: no changes"), "{same}");
}

#[test]
fn export_writes_next_to_the_profile_by_default() {
    let dir = tempfile::tempdir().unwrap();
    let (profile, path) = sample_file(dir.path());
    let said = stdout(&highwater(&["export", &path, "--format", "html"]));
    let html = profile.with_file_name("highwater-profile.html");
    assert!(said.contains("highwater-profile.html"), "{said}");
    let page = std::fs::read_to_string(&html).unwrap();
    assert!(page.starts_with("<!DOCTYPE html>"));

    stdout(&highwater(&["export", &path, "-f", "chrome"]));
    let trace = profile.with_file_name("highwater-profile.trace.json");
    let trace: Value = serde_json::from_str(&std::fs::read_to_string(trace).unwrap()).unwrap();
    assert!(!trace["traceEvents"].as_array().unwrap().is_empty());
}

#[test]
fn export_honours_output_and_dash_for_stdout() {
    let dir = tempfile::tempdir().unwrap();
    let (_, path) = sample_file(dir.path());
    let out = dir.path().join("elsewhere/report.html");
    stdout(&highwater(&[
        "export",
        &path,
        "-f",
        "html",
        "-o",
        out.to_str().unwrap(),
    ]));
    assert!(out.exists());
    let trace = stdout(&highwater(&["export", &path, "-f", "chrome", "-o", "-"]));
    assert!(serde_json::from_str::<Value>(&trace).is_ok());
}

#[test]
fn an_unwritable_output_is_exit_code_1_with_one_line() {
    let dir = tempfile::tempdir().unwrap();
    let (_, path) = sample_file(dir.path());
    // A directory where the file should go.
    let taken = dir.path().join("taken");
    std::fs::create_dir(&taken).unwrap();
    std::fs::write(taken.join("x"), "x").unwrap();
    let output = highwater(&["export", &path, "-f", "html", "-o", taken.to_str().unwrap()]);
    assert_eq!(output.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(stderr.contains("cannot write"), "{stderr}");
}

#[test]
fn a_closed_stdout_is_not_a_panic() {
    let dir = tempfile::tempdir().unwrap();
    // Big enough output that the pipe fills after the reader has gone.
    let mut profile = sample_profile();
    let row = profile.peak_breakdown[0].clone();
    profile.peak_breakdown = vec![row; 20_000];
    let path = write_profile(dir.path(), "big.json", &profile);
    for args in [
        vec!["top", path.to_str().unwrap(), "-n", "20000"],
        vec!["export", path.to_str().unwrap(), "-f", "html", "-o", "-"],
    ] {
        let mut child = Command::new(env!("CARGO_BIN_EXE_highwater"))
            .args(&args)
            .env("RUST_BACKTRACE", "1")
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        // Read one line, then hang up, like `| head -1`.
        {
            use std::io::BufRead;
            let mut reader = std::io::BufReader::new(child.stdout.take().unwrap());
            let mut line = String::new();
            reader.read_line(&mut line).unwrap();
            assert!(!line.is_empty());
        }
        let output = child.wait_with_output().unwrap();
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(!stderr.contains("panicked"), "{args:?}: {stderr}");
        assert_eq!(output.status.code(), Some(0), "{args:?}: {stderr}");
    }
}

#[test]
fn a_hostile_but_valid_profile_is_shown_without_panics() {
    let dir = tempfile::tempdir().unwrap();
    let mut profile = sample_profile();
    profile.summary.peak_bytes = u64::MAX;
    profile.summary.duration_ns = u64::MAX;
    // Extreme but consistent: the categories still add up to at most the peak.
    for v in profile.summary.peak_by_category.values_mut() {
        *v = 0;
    }
    // (A category this version does not know cannot be in a profile it loads:
    // `tests/data/bad/unknown_category.json` is refused with exit code 2.)
    profile
        .summary
        .peak_by_category
        .insert(Category::Other, u64::MAX);
    // All of it temporary: still no more than its category at the peak.
    profile.summary.peak_temporary_by_category = [(Category::Other, u64::MAX)].into();
    profile.spans[4].name = "evil\u{1b}[2J\nname".into();
    profile.iterations[0].delta_bytes = i64::MIN;
    profile.timeline[0].timestamp_ns = u64::MAX;
    profile.timeline[1].live_bytes = u64::MAX;
    profile.timeline[1].by_category = [(Category::Other, u64::MAX); 1].into_iter().collect();
    profile.pool_timeline[0].fragmentation = -7.5;
    let a = write_profile(dir.path(), "a.json", &profile);
    let a = a.to_str().unwrap();
    let mut small = Profile::empty();
    small.spans = profile.spans.clone();
    let b = write_profile(dir.path(), "b.json", &small);
    let b = b.to_str().unwrap();
    // A parent cycle, a self-parent and an out-of-range parent: not a tree highwater writes,
    // so every command refuses it (exit 2) naming the file and the rule.
    let mut cyclic = profile.clone();
    cyclic.spans[0].parent = Some(0);
    cyclic.spans[1].parent = Some(2);
    cyclic.spans[2].parent = Some(1);
    cyclic.spans[3].parent = Some(u32::MAX);
    let c = write_profile(dir.path(), "cyclic.json", &cyclic);
    let output = highwater(&["spans", c.to_str().unwrap()]);
    assert_eq!(output.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("cyclic.json") && stderr.contains("parents come before"),
        "{stderr}"
    );
    for args in [
        vec!["summary", a],
        vec!["summary", a, "--json"],
        vec!["top", a],
        vec!["spans", a],
        vec!["spans", a, "--json"],
        vec!["diff", a, b],
        vec!["diff", b, a, "--json"],
        vec!["export", a, "-f", "html"],
        vec!["export", a, "-f", "chrome"],
        vec!["summary", b],
        vec!["export", b, "-f", "html"],
    ] {
        let text = stdout(&highwater(&args));
        assert!(!text.contains('\u{1b}'), "{args:?} let an escape through");
    }
}

#[test]
fn help_and_version_succeed_and_usage_errors_are_code_2() {
    assert!(stdout(&highwater(&["--help"])).contains("summary"));
    assert!(stdout(&highwater(&["--version"])).contains("highwater"));
    let output = highwater(&["export", "x.json", "--format", "pdf"]);
    assert_eq!(output.status.code(), Some(2));
    let output = highwater(&["frobnicate"]);
    assert_eq!(output.status.code(), Some(2));
}

/// Writes the sample profiles to the test target directory for trying the binary by hand:
/// `cargo test --test cli -- --ignored --nocapture commands::`.
#[test]
#[ignore]
fn write_sample_profiles_for_manual_checks() {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR"));
    for (name, profile) in [
        ("sample-profile.json", sample_profile()),
        ("sample-profile-dropped.json", sample_profile_with_drops()),
    ] {
        let path = write_profile(dir, name, &profile);
        println!("{}", path.display());
    }
}

#[test]
fn help_explains_residual_and_lists_every_export_format() {
    let spans = stdout(&highwater(&["spans", "--help"]));
    assert!(
        spans.contains("RESIDUAL/CALL: bytes one call of the span allocated and still held"),
        "{spans}"
    );
    let export = stdout(&highwater(&["export", "--help"]));
    for format in ["html", "chrome", "torch"] {
        assert!(
            export.contains(format),
            "{format} missing from export --help:\n{export}"
        );
    }
    let top = stdout(&highwater(&["--help"]));
    assert!(top.contains("PyTorch's memory snapshot"), "{top}");
}

#[test]
fn spans_explains_peak_and_residual_under_the_table() {
    let dir = tempfile::tempdir().unwrap();
    let (path, _) = sample_file(dir.path());
    let text = stdout(&highwater(&["spans", path.to_str().unwrap()]));
    assert!(
        text.contains(highwater_export::vocabulary::RESIDUAL_EXPLAINED),
        "{text}"
    );
    assert!(text.contains(highwater_export::vocabulary::SPAN_PEAK_EXPLAINED));
}
