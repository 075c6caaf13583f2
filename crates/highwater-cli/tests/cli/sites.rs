//! `highwater sites` and `highwater export --format pprof` through the binary: rankings,
//! filters, one site in full, JSON, the row links in `top`, and clear errors (exit 2) for a
//! site that does not exist, a bad option or a profile without call sites.

use std::path::{Path, PathBuf};
use std::process::Output;

use crate::{highwater, stdout};
use highwater_export::stacks::estimate;
use highwater_profile::Profile;
use highwater_testkit::sample::sample_profile;
use serde_json::Value;

/// The exit code and standard error of a run that must fail.
fn failure(output: &Output) -> (i32, String) {
    assert!(!output.status.success(), "expected a failure");
    (
        output.status.code().unwrap(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

fn write(dir: &Path, name: &str, profile: &Profile) -> String {
    let path: PathBuf = dir.join(name);
    profile.write(&path).unwrap();
    path.to_str().unwrap().to_string()
}

#[test]
fn sites_lists_the_largest_at_the_peak_first_with_errors_and_stacks() {
    let dir = tempfile::tempdir().unwrap();
    let profile = sample_profile();
    let path = write(dir.path(), "p.json", &profile);
    let text = stdout(&highwater(&["sites", &path, "-n", "3"]));
    // Issue 34: the header counts what it shows ("125 listed of 125 seen" over 20 shown).
    assert!(
        text.lines()
            .next()
            .is_some_and(|l| l.contains(": 3 shown of ") && l.contains("estimated from")),
        "{text}"
    );
    let headers: Vec<&str> = text.lines().filter(|l| l.starts_with('#')).collect();
    assert_eq!(headers.len(), 3, "{text}");
    for (line, site) in headers.iter().zip(&profile.sites) {
        assert!(line.starts_with(&format!("#{}  ", site.id)), "{line}");
        assert!(
            line.contains(&estimate(site.peak_bytes, site.peak_bytes_error)),
            "{line}"
        );
        assert!(
            line.contains(&estimate(site.alloc_bytes, site.alloc_bytes_error)),
            "{line}"
        );
    }
    assert!(text.contains(&format!("{} more sites", profile.sites.len() - 3)));
    assert!(text.contains("src/optim.rs:58"), "{text}");

    // By allocation, the largest allocator first, and the update temporaries (nothing live at
    // the peak, so last by peak) ahead of the sites that allocated less.
    let by_alloc = stdout(&highwater(&["sites", &path, "--sort", "allocated"]));
    let top = profile.sites.iter().max_by_key(|s| s.alloc_bytes).unwrap();
    let first = by_alloc.lines().find(|l| l.starts_with('#')).unwrap();
    assert!(first.starts_with(&format!("#{}  ", top.id)), "{by_alloc}");
    let temporaries = profile.sites.iter().find(|s| s.peak_bytes == 0).unwrap();
    assert_eq!(temporaries.id as usize, profile.sites.len() - 1);
    let smaller = profile
        .sites
        .iter()
        .find(|s| s.alloc_bytes < temporaries.alloc_bytes)
        .unwrap();
    let at = |id: u32| by_alloc.find(&format!("\n#{id}  ")).unwrap();
    assert!(at(temporaries.id) < at(smaller.id), "{by_alloc}");
    assert!(
        by_alloc.contains("train_gpt::optim::AdamW::step"),
        "{by_alloc}"
    );

    // One category, ranked by its bytes: the optimizer's sites are left out.
    let activations = stdout(&highwater(&["sites", &path, "--category", "activation"]));
    assert!(activations.contains("of which activation"), "{activations}");
    assert!(!activations.contains("\n#0  "), "{activations}");
    let none = stdout(&highwater(&["sites", &path, "--category", "gradient"]));
    assert!(none.contains("no call site has gradient bytes"), "{none}");
}

#[test]
fn one_site_shows_every_frame_and_json_keeps_the_profiles_fields() {
    let dir = tempfile::tempdir().unwrap();
    let profile = sample_profile();
    let path = write(dir.path(), "p.json", &profile);
    let site = &profile.sites[3];
    let text = stdout(&highwater(&["sites", &path, "--site", "3"]));
    for frame in &site.frames {
        if let Some(function) = &frame.function {
            assert!(
                text.contains(function.as_str()),
                "{function} missing:\n{text}"
            );
        }
    }
    let json: Value =
        serde_json::from_str(&stdout(&highwater(&["sites", &path, "--json", "-n", "2"]))).unwrap();
    assert_eq!(json["total_sites"], profile.sites.len());
    assert_eq!(json["order"], "peak");
    assert_eq!(json["sites"].as_array().unwrap().len(), 2);
    assert_eq!(json["sites"][0]["peak_bytes"], profile.sites[0].peak_bytes);
    assert_eq!(
        json["sites"][0]["frames"].as_array().unwrap().len(),
        profile.sites[0].frames.len()
    );
    let span = profile.sites[0].shares[0].span.unwrap();
    assert_eq!(
        json["span_paths"][span.to_string()],
        profile.span_paths()[span as usize]
    );
    assert_eq!(json["sampling"]["mean_bytes"], 512 << 10);
}

#[test]
fn the_temporary_part_and_the_blocks_at_the_peak_are_in_the_text_and_the_json() {
    let dir = tempfile::tempdir().unwrap();
    let mut profile = sample_profile();
    let site = &mut profile.sites[0];
    let share = &mut site.shares[0];
    let temporary = share.peak_bytes / 3;
    share.peak_temporary_bytes = temporary;
    let (blocks, id) = (share.peak_count, site.id);
    assert!(temporary > 0 && blocks > 0);
    let path = write(dir.path(), "p.json", &profile);

    let text = stdout(&highwater(&["sites", &path, "--site", &id.to_string()]));
    assert!(
        text.contains(&format!(
            "    temporary: {} of it",
            highwater_profile::units::format_bytes(temporary)
        )),
        "{text}"
    );
    let json: Value =
        serde_json::from_str(&stdout(&highwater(&["sites", &path, "--json", "-n", "1"]))).unwrap();
    let first = &json["sites"][0]["shares"][0];
    assert_eq!(first["peak_temporary_bytes"], temporary);
    assert_eq!(first["peak_count"], blocks);
}

#[test]
fn top_rows_name_their_sites() {
    let dir = tempfile::tempdir().unwrap();
    let profile = sample_profile();
    let path = write(dir.path(), "p.json", &profile);
    let text = stdout(&highwater(&["top", &path, "-n", "3"]));
    assert!(text.lines().nth(1).unwrap().contains("SITES"), "{text}");
    let mut rows = profile.peak_breakdown.clone();
    rows.sort_by_key(|r| std::cmp::Reverse(r.bytes));
    for (line, row) in text.lines().skip(2).take(3).zip(&rows) {
        assert!(line.contains(&format!(" #{} ", row.top_sites[0])), "{line}");
    }
    let summary = stdout(&highwater(&["summary", &path]));
    assert!(
        summary.contains("call sites:  10 listed; the largest at the peak is #0"),
        "{summary}"
    );
}

#[test]
fn bad_requests_exit_2_and_say_what_was_wrong() {
    let dir = tempfile::tempdir().unwrap();
    let path = write(dir.path(), "p.json", &sample_profile());
    let (code, error) = failure(&highwater(&["sites", &path, "--site", "99"]));
    assert_eq!(code, 2);
    assert!(
        error.contains("has 10 call sites (#0 to #9); there is no site #99"),
        "{error}"
    );
    assert!(error.contains("p.json"), "{error}");
    let (code, error) = failure(&highwater(&["sites", &path, "--category", "weights"]));
    assert_eq!(code, 2);
    assert!(error.contains("unknown category \"weights\""), "{error}");
    let (code, error) = failure(&highwater(&["sites", &path, "--sort", "size"]));
    assert_eq!(code, 2);
    assert!(
        error.contains("peak") && error.contains("allocated"),
        "{error}"
    );
    let (code, error) = failure(&highwater(&[
        "sites",
        &dir.path().join("none.json").to_string_lossy(),
    ]));
    assert_eq!(code, 2);
    assert!(error.contains("none.json"), "{error}");
}

#[test]
fn a_profile_without_sites_says_why_and_exports_no_pprof() {
    let dir = tempfile::tempdir().unwrap();
    let path = write(dir.path(), "off.json", &Profile::empty());
    let text = stdout(&highwater(&["sites", &path]));
    assert!(text.contains("no call sites in"), "{text}");
    assert!(text.contains("HIGHWATER_SAMPLE_BYTES=0"), "{text}");
    let target = dir.path().join("off.pb.gz");
    std::fs::write(&target, b"keep").unwrap();
    let (code, error) = failure(&highwater(&[
        "export",
        &path,
        "--format",
        "pprof",
        "-o",
        target.to_str().unwrap(),
    ]));
    assert_eq!(code, 2);
    assert!(
        error.contains("has no call sites to export as pprof"),
        "{error}"
    );
    assert_eq!(
        std::fs::read(&target).unwrap(),
        b"keep",
        "the old file stays"
    );
}

#[test]
fn pprof_goes_beside_the_profile_or_where_asked() {
    let dir = tempfile::tempdir().unwrap();
    let profile = sample_profile();
    let path = write(dir.path(), "run.json", &profile);
    let said = stdout(&highwater(&["export", &path, "--format", "pprof"]));
    let beside = dir.path().join("run.pb.gz");
    assert!(said.contains(beside.to_str().unwrap()), "{said}");
    assert!(said.contains("go tool pprof"), "{said}");
    let written = std::fs::read(&beside).unwrap();
    assert_eq!(written[..2], [0x1f, 0x8b], "gzip");
    assert_eq!(written, highwater_export::pprof::render(&profile));
    let piped = highwater(&["export", &path, "--format", "pprof", "-o", "-"]);
    assert!(piped.status.success());
    assert_eq!(piped.stdout, written);
    // An output that cannot be written fails with exit 1, naming it.
    let blocked = dir.path().join("dir.pb.gz");
    std::fs::create_dir(&blocked).unwrap();
    std::fs::write(blocked.join("x"), "x").unwrap();
    let (code, error) = failure(&highwater(&[
        "export",
        &path,
        "--format",
        "pprof",
        "-o",
        blocked.to_str().unwrap(),
    ]));
    assert_eq!(code, 1);
    assert!(error.contains("cannot write the pprof profile"), "{error}");
}

#[test]
fn hostile_but_loadable_sites_are_shown_without_panics_or_control_characters() {
    let dir = tempfile::tempdir().unwrap();
    let mut profile = sample_profile();
    let evil = "evil\u{1b}[2J\nname<script>";
    profile.sites[0].frames[2].function = Some(evil.into());
    profile.sites[0].frames[2].file = Some(format!("/src/{evil}.rs"));
    profile.sites[0].peak_bytes = u64::MAX;
    profile.sites[0].peak_bytes_error = u64::MAX;
    profile.sites[0].alloc_count = u64::MAX;
    profile.sites[0].shares[0].op = Some(evil.into());
    profile.sites[1].frames.clear();
    profile.sites[1].shares[0].span = Some(u32::MAX);
    profile.sites[2].shares.clear();
    profile.peak_breakdown[0].top_sites = vec![u32::MAX];
    let path = write(dir.path(), "hostile.json", &profile);
    let outputs = [
        vec!["sites", &path],
        vec!["sites", &path, "--all-frames", "--sort", "allocated"],
        vec!["sites", &path, "--site", "1"],
        vec!["top", &path],
        vec!["summary", &path],
    ];
    for args in &outputs {
        let text = stdout(&highwater(args));
        assert!(
            !text.contains('\u{1b}') && !text.contains("\nname"),
            "{args:?}: {text}"
        );
    }
    stdout(&highwater(&["sites", &path, "--json"]));
    for format in ["pprof", "html"] {
        let out = dir.path().join(format!("out.{format}"));
        stdout(&highwater(&[
            "export",
            &path,
            "--format",
            format,
            "-o",
            out.to_str().unwrap(),
        ]));
    }
    let page = std::fs::read_to_string(dir.path().join("out.html")).unwrap();
    assert!(
        !page.contains("name<script>"),
        "hostile frame names are escaped"
    );
}
