//! A checkpoint (`meta.partial`, as a killed run leaves it) is read by every command and
//! export, and each says it is partial.

use highwater_profile::Warning;
use highwater_testkit::sample::sample_profile;

#[test]
fn every_command_reads_a_checkpoint_and_says_so() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("checkpoint.json");
    let mut profile = sample_profile();
    profile.meta.partial = true;
    profile.meta.pid = 4242;
    profile.meta.checkpoint_unix_ms = Some(1_764_489_604_000);
    profile.warnings.push(Warning::Partial {
        recorded_ns: profile.summary.duration_ns,
    });
    profile.write(&path).unwrap();
    let path = path.to_str().unwrap();
    let html = dir.path().join("report.html");
    let trace = dir.path().join("trace.json");
    let commands: [&[&str]; 8] = [
        &["summary", path],
        &["summary", "--json", path],
        &["top", path],
        &["spans", path],
        &["diff", path, path],
        &[
            "export",
            path,
            "--format",
            "html",
            "-o",
            html.to_str().unwrap(),
        ],
        &[
            "export",
            path,
            "--format",
            "chrome",
            "-o",
            trace.to_str().unwrap(),
        ],
        &["top", "--json", path],
    ];
    for args in commands {
        let output = crate::highwater(args);
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(output.status.success(), "{args:?}: {stderr}");
        assert!(
            stderr.contains("is a checkpoint of a run that had not finished"),
            "{args:?} does not say the profile is partial: {stderr}"
        );
    }
    let summary = crate::highwater(&["summary", path]);
    let text = String::from_utf8_lossy(&summary.stdout);
    assert!(
        text.contains("checkpoint taken 4.00 s into a run"),
        "{text}"
    );
    let page = std::fs::read_to_string(&html).unwrap();
    assert!(
        page.contains("checkpoint taken"),
        "the HTML report does not say it"
    );
}
