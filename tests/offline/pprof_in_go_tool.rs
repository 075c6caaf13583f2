//! The pprof export read by the real `go tool pprof`: its totals, each function's own bytes,
//! the category and span labels under `-tagfocus`, and inlined frames with their lines must be
//! the profile's call sites, to the byte.
//!
//! Needs Go (`apt-get install -y golang-go`; `.ci/run` installs it). Set `HIGHWATER_GO` to the
//! `go` binary to use another; `HIGHWATER_SKIP_GO_TESTS=1` skips on purpose, nothing else does.

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;

use highwater::{Category, Profile};
use highwater_export::{pprof, stacks};

/// The `go` command, or `None` when Go tests are explicitly skipped.
fn go() -> Option<String> {
    let go = std::env::var("HIGHWATER_GO").unwrap_or_else(|_| "go".to_string());
    if Command::new(&go)
        .arg("version")
        .output()
        .is_ok_and(|out| out.status.success())
    {
        return Some(go);
    }
    if std::env::var("HIGHWATER_SKIP_GO_TESTS").as_deref() == Ok("1") {
        eprintln!("skipping: HIGHWATER_SKIP_GO_TESTS=1 and no `go` found");
        return None;
    }
    panic!(
        "`go tool pprof` is needed to test the pprof export and `{go}` does not run: install Go \
         (`apt-get install -y golang-go`; .ci/run does this) or set HIGHWATER_GO to its path; set \
         HIGHWATER_SKIP_GO_TESTS=1 to skip on purpose"
    );
}

/// Runs `go tool pprof ARGS FILE` with figures in bytes; returns what it printed.
fn pprof(go: &str, dir: &Path, file: &Path, args: &[&str]) -> String {
    let out = Command::new(go)
        .args([
            "tool",
            "pprof",
            "-unit=B",
            "-nodefraction=0",
            "-nodecount=100000",
        ])
        .args(args)
        .arg(file)
        .env("PPROF_TMPDIR", dir)
        .env("HOME", dir)
        .output()
        .expect("run go tool pprof");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "go tool pprof {args:?} failed: {}\n{stdout}",
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

/// The bytes `-top` says its nodes account for (`Showing nodes accounting for 123B, …`).
fn shown_total(top: &str) -> i64 {
    let line = top
        .lines()
        .find(|l| l.starts_with("Showing nodes accounting for "))
        .unwrap_or_else(|| panic!("no total in\n{top}"));
    let figure = line["Showing nodes accounting for ".len()..]
        .split(['B', ','])
        .next()
        .unwrap();
    figure.parse().unwrap_or_else(|_| panic!("{line}"))
}

/// `-top`'s rows as function name → flat bytes.
fn flat_by_function(top: &str) -> BTreeMap<String, i64> {
    top.lines()
        .skip_while(|l| !l.trim_start().starts_with("flat"))
        .skip(1)
        .filter_map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            let flat = fields.first()?.trim_end_matches('B').parse::<i64>().ok()?;
            Some((fields[5..].join(" "), flat))
        })
        .collect()
}

fn write_sample(dir: &Path) -> (Profile, std::path::PathBuf) {
    let profile = highwater_testkit::sample::sample_profile();
    let file = dir.join("sample.pb.gz");
    pprof::write(&profile, &file).unwrap();
    (profile, file)
}

#[test]
fn top_shows_the_sites_total_and_each_allocating_functions_bytes() {
    let Some(go) = go() else { return };
    let dir = tempfile::tempdir().unwrap();
    let (profile, file) = write_sample(dir.path());
    let top = pprof(&go, dir.path(), &file, &["-top"]);
    assert!(top.contains("Type: inuse_space"), "{top}");
    let sites: u64 = profile.sites.iter().map(|s| s.peak_bytes).sum();
    let expected = sites + profile.sampling.unlisted_peak_bytes;
    assert_eq!(shown_total(&top), expected as i64, "{top}");
    assert_eq!(expected, profile.summary.peak_bytes);

    // Flat bytes land on each stack's innermost frame (pprof marks inlined ones).
    let mut want: BTreeMap<String, i64> = BTreeMap::new();
    for site in &profile.sites {
        let leaf = &site.frames[0];
        let mut name = stacks::function_name(leaf);
        if leaf.inlined {
            name.push_str(" (inline)");
        }
        *want.entry(name).or_default() += site.peak_bytes as i64;
    }
    want.insert(
        pprof::UNLISTED_SITES.to_string(),
        profile.sampling.unlisted_peak_bytes as i64,
    );
    let got: BTreeMap<String, i64> = flat_by_function(&top)
        .into_iter()
        .filter(|(_, flat)| *flat != 0)
        .collect();
    want.retain(|_, flat| *flat != 0);
    assert_eq!(got, want, "{top}");
    // Rust's qualified paths keep their `<…>`.
    assert!(
        top.contains("<candle_nn::linear::Linear as candle_core::Module>::forward"),
        "{top}"
    );

    // Allocated bytes: the other sample type.
    let alloc = pprof(
        &go,
        dir.path(),
        &file,
        &["-top", "-sample_index=alloc_space"],
    );
    let allocated: u64 = profile.sites.iter().map(|s| s.alloc_bytes).sum::<u64>()
        + profile.sampling.unlisted_alloc_bytes;
    assert_eq!(shown_total(&alloc), allocated as i64, "{alloc}");
}

#[test]
fn tagfocus_selects_a_category_or_a_span_to_the_byte() {
    let Some(go) = go() else { return };
    let dir = tempfile::tempdir().unwrap();
    let (profile, file) = write_sample(dir.path());
    let paths = profile.span_paths();
    let shares = || profile.sites.iter().flat_map(|s| &s.shares);
    for category in Category::ALL {
        let bytes: u64 = shares()
            .filter(|s| s.category == category)
            .map(|s| s.peak_bytes)
            .sum();
        if bytes == 0 {
            continue;
        }
        let focus = format!("-tagfocus=category={category}");
        let top = pprof(&go, dir.path(), &file, &["-top", &focus]);
        assert_eq!(shown_total(&top), bytes as i64, "{focus}\n{top}");
        // Each share's blocks at the peak are its own estimate, not a part of its site's.
        let blocks: u64 = shares()
            .filter(|s| s.category == category)
            .map(|s| s.peak_count)
            .sum();
        let objects = pprof(
            &go,
            dir.path(),
            &file,
            &["-top", "-sample_index=inuse_objects", &focus],
        );
        assert_eq!(shown_total(&objects), blocks as i64, "{focus}\n{objects}");
    }
    let span = "step/forward/layer3/attn";
    let bytes: u64 = shares()
        .filter(|s| s.span.is_some_and(|id| paths[id as usize] == span))
        .map(|s| s.alloc_bytes)
        .sum();
    assert!(bytes > 0);
    let focus = format!("-tagfocus=span={span}");
    let top = pprof(
        &go,
        dir.path(),
        &file,
        &["-top", "-sample_index=alloc_space", &focus],
    );
    assert_eq!(shown_total(&top), bytes as i64, "{top}");
    // Labels are listed with their values.
    let tags = pprof(&go, dir.path(), &file, &["-tags"]);
    for needle in [
        "category",
        "optimizer",
        "span",
        "step/optimizer/adam",
        "op",
        "exp_avg",
    ] {
        assert!(tags.contains(needle), "{needle} missing from\n{tags}");
    }
}

#[test]
fn inlined_frames_are_shown_with_their_files_and_lines() {
    let Some(go) = go() else { return };
    let dir = tempfile::tempdir().unwrap();
    let (profile, file) = write_sample(dir.path());
    let lines = pprof(&go, dir.path(), &file, &["-top", "-lines"]);
    let site = profile
        .sites
        .iter()
        .find(|s| {
            s.frames
                .iter()
                .any(|f| f.function.as_deref() == Some("train_gpt::model::Attention::qkv"))
        })
        .unwrap();
    let qkv = site
        .frames
        .iter()
        .find(|f| f.function.as_deref() == Some("train_gpt::model::Attention::qkv"))
        .unwrap();
    assert!(qkv.inlined);
    // `-lines` names each line as `function file:line`, inlined ones marked.
    let expected = format!(
        "train_gpt::model::Attention::qkv {}:{} (inline)",
        qkv.file.as_deref().unwrap(),
        qkv.line.unwrap()
    );
    assert!(
        lines.contains(&expected),
        "{expected} missing from\n{lines}"
    );
    let traces = pprof(&go, dir.path(), &file, &["-traces"]);
    // Every frame of the site, in order, innermost first, in one trace: a trace is its label
    // lines (`  category:  activation`), then the value and the first frame, then one frame a
    // line.
    let names: Vec<String> = site.frames.iter().map(stacks::function_name).collect();
    let found = traces.split("-----------+").any(|trace| {
        let listed: Vec<&str> = trace
            .lines()
            .skip(1)
            .map(str::trim_start)
            .filter(|l| !l.is_empty() && !l.contains(":  "))
            .map(|l| match l.split_once("   ") {
                Some((value, frame)) if value.starts_with(|c: char| c.is_ascii_digit()) => frame,
                _ => l,
            })
            .map(|l| l.trim_end_matches(" (inline)"))
            .collect();
        listed == names
    });
    assert!(found, "no trace lists {names:?}\n{traces}");
}
