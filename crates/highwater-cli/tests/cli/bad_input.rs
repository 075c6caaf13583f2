//! Bad input never panics: every command over a corpus of broken and hostile profiles exits
//! with code 2 and one line on stderr that names the file.

use crate::highwater;
use std::fs;
use std::path::{Path, PathBuf};

fn data(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data")
        .join(name)
}

/// Runs every command with `bad` as its input and checks each is refused cleanly.
fn assert_refused_everywhere(bad: &Path) {
    let out = tempfile::tempdir().unwrap();
    let bad_str = bad.to_str().unwrap();
    let good = data("minimal.json");
    let good = good.to_str().unwrap();
    let html = out.path().join("out.html");
    let trace = out.path().join("out.trace.json");
    let runs: Vec<Vec<&str>> = vec![
        vec!["summary", bad_str],
        vec!["summary", bad_str, "--json"],
        vec!["top", bad_str],
        vec!["top", bad_str, "--json"],
        vec!["spans", bad_str],
        vec!["diff", bad_str, good],
        vec!["diff", good, bad_str, "--json"],
        vec![
            "export",
            bad_str,
            "-f",
            "html",
            "-o",
            html.to_str().unwrap(),
        ],
        vec![
            "export",
            bad_str,
            "-f",
            "chrome",
            "-o",
            trace.to_str().unwrap(),
        ],
    ];
    let name = bad.file_name().unwrap().to_string_lossy().into_owned();
    for args in runs {
        let output = highwater(&args);
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(
            output.status.code(),
            Some(2),
            "{name} {args:?}: exit {:?}, stderr {stderr}",
            output.status.code()
        );
        assert_eq!(stderr.lines().count(), 1, "{name} {args:?}: {stderr:?}");
        assert!(stderr.ends_with('\n'), "{name} {args:?}: {stderr:?}");
        assert!(
            stderr.starts_with("highwater: error: "),
            "{name} {args:?}: {stderr}"
        );
        assert!(
            stderr.contains(&name),
            "{name} {args:?}: error does not name the file: {stderr}"
        );
        let message = stderr.trim_end();
        let halves = message.split(": ").collect::<Vec<_>>();
        assert!(
            halves.windows(2).all(|w| w[0] != w[1]),
            "{name} {args:?}: repeats itself: {stderr}"
        );
        for forbidden in ["panicked", "RUST_BACKTRACE", "stack backtrace"] {
            assert!(!stderr.contains(forbidden), "{name} {args:?}: {stderr}");
        }
        assert!(output.stdout.is_empty(), "{name} {args:?}: wrote to stdout");
    }
    assert!(
        !html.exists() && !trace.exists(),
        "{name}: an output was written"
    );
}

#[test]
fn the_minimal_profile_the_corpus_is_built_from_is_valid() {
    let path = data("minimal.json");
    let output = highwater(&["summary", path.to_str().unwrap()]);
    assert_eq!(output.status.code(), Some(0), "{output:?}");
}

#[test]
fn every_file_of_the_bad_corpus_is_refused_with_one_line_and_code_2() {
    let mut files: Vec<PathBuf> = fs::read_dir(data("bad"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.file_name().is_some_and(|n| n != "README.md"))
        .collect();
    files.sort();
    assert!(files.len() >= 20, "corpus went missing: {files:?}");
    for file in files {
        assert_refused_everywhere(&file);
    }
}

#[test]
fn a_missing_file_and_a_directory_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    assert_refused_everywhere(&dir.path().join("no-such-profile.json"));
    let directory = dir.path().join("a-directory.json");
    fs::create_dir(&directory).unwrap();
    assert_refused_everywhere(&directory);
}

#[test]
fn deep_nesting_is_refused_not_a_stack_overflow() {
    let dir = tempfile::tempdir().unwrap();
    let arrays = dir.path().join("deep-arrays.json");
    fs::write(&arrays, "[".repeat(100_000)).unwrap();
    assert_refused_everywhere(&arrays);
    let objects = dir.path().join("deep-objects.json");
    let mut text = String::from("{\"schema\": \"highwater/2\", \"meta\": ");
    text.push_str(&"{\"a\": ".repeat(100_000));
    text.push_str(&"}".repeat(100_000));
    text.push('}');
    fs::write(&objects, text).unwrap();
    assert_refused_everywhere(&objects);
}

#[test]
fn a_huge_array_is_refused_quickly() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("huge-array.json");
    let mut text = String::from("{\"schema\": \"highwater/2\", \"timeline\": [");
    text.push_str(&"0,".repeat(5_000_000));
    text.push_str("0]}");
    fs::write(&path, text).unwrap();
    assert_refused_everywhere(&path);
}

#[test]
fn a_file_larger_than_any_profile_is_refused_before_reading() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("enormous.json");
    // Sparse: no disk used, but its size is over the limit.
    let file = fs::File::create(&path).unwrap();
    file.set_len(highwater_profile::MAX_PROFILE_BYTES + 1)
        .unwrap();
    assert_refused_everywhere(&path);
    let stderr = String::from_utf8_lossy(&highwater(&["summary", path.to_str().unwrap()]).stderr)
        .into_owned();
    assert!(stderr.contains("limit"), "{stderr}");
}

/// Hardening III, row 3: a 40,000-deep chain of spans (a 6 MB profile) made `spans`, `sites`
/// and the exports spell every node's full path, 1.7 GB of strings. Profiles never nest deeper
/// than `MAX_SPAN_DEPTH` nor hold more nodes than folding leaves: deeper or wider trees are
/// refused, quickly and in one line.
#[test]
fn a_span_chain_deeper_than_any_profile_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let text = fs::read_to_string(data("minimal.json")).unwrap();
    for (depth, says) in [(10_000u32, "nested"), (40_000, "nodes")] {
        let mut value: serde_json::Value = serde_json::from_str(&text).unwrap();
        let spans: Vec<highwater_profile::SpanMetrics> = (0..depth)
            .map(|id| {
                let mut span_metrics = highwater_profile::SpanMetrics::default();
                span_metrics.id = id;
                span_metrics.parent = id.checked_sub(1);
                span_metrics.name = format!("level{id}");
                span_metrics
            })
            .collect();
        value["spans"] = serde_json::to_value(spans).unwrap();
        let deep = dir.path().join(format!("deep-spans-{depth}.json"));
        fs::write(&deep, value.to_string()).unwrap();
        assert_refused_everywhere(&deep);
        let output = highwater(&["spans", deep.to_str().unwrap()]);
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(stderr.contains(says), "{stderr}");
    }
}

/// Hardening III, row 19: an error quoting a hostile file's text printed a 65 KB name whole,
/// and a right-to-left override raw. Messages are cut, and reordering characters spelled out.
#[test]
fn error_messages_are_cut_and_cannot_reorder_the_terminal() {
    let dir = tempfile::tempdir().unwrap();
    let text = fs::read_to_string(data("minimal.json")).unwrap();
    let mut value: serde_json::Value = serde_json::from_str(&text).unwrap();
    value["schema"] = format!("\u{202E}gnp.exe{}", "x".repeat(65_000)).into();
    let path = dir.path().join("hostile.json");
    fs::write(&path, value.to_string()).unwrap();
    let output = highwater(&["summary", path.to_str().unwrap()]);
    assert_eq!(output.status.code(), Some(2), "{output:?}");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.len() < 4_000, "{} bytes of error", stderr.len());
    assert!(!stderr.contains('\u{202E}'), "{stderr}");
    assert!(stderr.contains("more bytes"), "{stderr}");
}
