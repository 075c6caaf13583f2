//! How a session ends: `process::exit` still writes the profile, `HIGHWATER=off` records
//! nothing, a bad `HIGHWATER_*` value is a clear error, a second session is refused, and
//! dropping the session writes the profile. Cases that need a fresh process re-run this test
//! binary as a child with `HW_CHILD` naming the case.

use std::path::Path;
use std::process::Output;

use highwater::profile::Warning;
use highwater::{Error, Profile, Session, Step};
use highwater_testkit::child::is_child;

/// Runs test `name` of this binary in a child process with `HW_CHILD=name` and extra `env`.
fn child(name: &str, env: &[(&str, &str)]) -> Output {
    let mut command = highwater_testkit::child::command(name);
    for (key, value) in env {
        command.env(key, value);
    }
    command.output().unwrap()
}

fn allocate_a_little() -> Vec<Vec<u8>> {
    let _fwd = highwater::profile!("forward", Step::Forward);
    (0..100).map(|i| vec![0u8; 1000 + i]).collect()
}

#[test]
fn process_exit_during_a_session_still_writes_the_profile() {
    let name = "process_exit_during_a_session_still_writes_the_profile";
    if is_child(name) {
        let path = std::env::var("HW_OUT").unwrap();
        let session = Session::builder().output(path).start().unwrap();
        let kept = allocate_a_little();
        std::mem::forget(session);
        std::mem::forget(kept);
        std::process::exit(3);
    }
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("exit.json");
    let output = child(name, &[("HW_OUT", path.to_str().unwrap())]);
    assert_eq!(output.status.code(), Some(3), "{output:?}");
    let profile = Profile::load(&path).unwrap();
    assert!(profile.summary.alloc_count >= 100);
    assert!(profile.summary.peak_bytes >= 100 * 1000);
}

/// Hardening III, row 18: a program's own `atexit` handler, registered before highwater's (so
/// run after it), starts a session and keeps it: that session is written too.
#[test]
fn a_session_started_in_a_late_exit_handler_is_written() {
    let name = "a_session_started_in_a_late_exit_handler_is_written";
    extern "C" fn late() {
        let path = std::env::var("HW_OUT").unwrap();
        let session = Session::builder().output(path).start().unwrap();
        std::mem::forget(allocate_a_little());
        std::mem::forget(session);
    }
    if is_child(name) {
        // SAFETY: `late` is an `extern "C" fn()` that does not unwind on this path.
        unsafe { libc::atexit(late) };
        // A first session registers highwater's own handler, which runs before `late`.
        let first = Session::builder().write_profile(false).start().unwrap();
        first.finish().unwrap();
        std::process::exit(0);
    }
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("late.json");
    let output = child(name, &[("HW_OUT", path.to_str().unwrap())]);
    assert!(output.status.success(), "{output:?}");
    let profile = Profile::load(&path).unwrap();
    assert!(
        profile.summary.peak_bytes >= 100 * 1000,
        "{:?}",
        profile.summary
    );
}

#[test]
fn highwater_off_records_nothing_and_writes_nothing() {
    let name = "highwater_off_records_nothing_and_writes_nothing";
    if is_child(name) {
        let path = std::env::var("HW_OUT").unwrap();
        let session = Session::builder().output(&path).start().unwrap();
        assert!(!session.is_recording());
        let _kept = allocate_a_little();
        let profile = session.finish().unwrap();
        assert_eq!(profile.summary.alloc_count, 0);
        assert_eq!(profile.warnings, [Warning::RecordingDisabled]);
        assert!(!Path::new(&path).exists());
        println!("child-ok");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("off.json");
    let output = child(
        name,
        &[("HIGHWATER", "off"), ("HW_OUT", path.to_str().unwrap())],
    );
    assert!(output.status.success(), "{output:?}");
    assert!(String::from_utf8_lossy(&output.stdout).contains("child-ok"));
    assert!(!path.exists());
}

#[test]
fn invalid_environment_value_is_a_clear_error() {
    let name = "invalid_environment_value_is_a_clear_error";
    if is_child(name) {
        match Session::builder().write_profile(false).start() {
            Err(error @ Error::Config { .. }) => println!("child-error: {error}"),
            other => panic!("expected a config error, got {other:?}"),
        }
        return;
    }
    let output = child(name, &[("HIGHWATER_RING_EVENTS", "lots")]);
    assert!(output.status.success(), "{output:?}");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        stdout.contains("child-error: invalid HIGHWATER_RING_EVENTS=\"lots\""),
        "{stdout}"
    );
}

#[test]
fn environment_output_path_is_used_and_drop_writes_the_profile() {
    let name = "environment_output_path_is_used_and_drop_writes_the_profile";
    if is_child(name) {
        let session = Session::start().unwrap();
        let _kept = allocate_a_little();
        drop(session);
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("nested/from-env.json");
    let output = child(name, &[("HIGHWATER_OUT", path.to_str().unwrap())]);
    assert!(output.status.success(), "{output:?}");
    let profile = Profile::load(&path).unwrap();
    assert!(profile.summary.alloc_count >= 100);
    assert_eq!(profile.meta.highwater_version, env!("CARGO_PKG_VERSION"));
}

#[test]
fn html_report_is_written_next_to_the_profile_by_default() {
    let name = "html_report_is_written_next_to_the_profile_by_default";
    if is_child(name) {
        let session = Session::builder()
            .output(std::env::var("HW_OUT").unwrap())
            .start()
            .unwrap();
        let _kept = allocate_a_little();
        session.finish().unwrap();
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("run.json");
    // Nothing asked for it: the library writes the report by default, as the README says.
    let output = child(name, &[("HW_OUT", path.to_str().unwrap())]);
    assert!(output.status.success(), "{output:?}");
    let html = std::fs::read_to_string(dir.path().join("run.html")).unwrap();
    assert!(
        html.starts_with("<!DOCTYPE html>"),
        "{}",
        &html[..60.min(html.len())]
    );
    assert!(html.contains("forward"), "the report names the span");
    assert!(Profile::load(&path).is_ok());

    // HIGHWATER_HTML=0 leaves it out.
    let quiet = dir.path().join("quiet.json");
    let output = child(
        name,
        &[("HW_OUT", quiet.to_str().unwrap()), ("HIGHWATER_HTML", "0")],
    );
    assert!(output.status.success(), "{output:?}");
    assert!(Profile::load(&quiet).is_ok());
    assert!(!dir.path().join("quiet.html").exists());

    // A profile written to a device gets no report beside it: no `/dev/null.html`.
    let stray = std::path::Path::new("/dev/null.html");
    assert!(
        !stray.exists(),
        "left by an earlier run: {}",
        stray.display()
    );
    let output = child(name, &[("HW_OUT", "/dev/null")]);
    assert!(output.status.success(), "{output:?}");
    assert!(!stray.exists(), "a report was written beside /dev/null");
}

#[test]
fn allocation_log_records_every_allocation_the_profile_counts() {
    let name = "allocation_log_records_every_allocation_the_profile_counts";
    if is_child(name) {
        let session = Session::builder()
            .output(std::env::var("HW_OUT").unwrap())
            .start()
            .unwrap();
        let mut grown = Vec::new();
        for i in 0..1000u32 {
            grown.push(i);
        }
        let _kept = allocate_a_little();
        session.finish().unwrap();
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("run.json");
    let log_path = dir.path().join("run.alloc");
    let output = child(
        name,
        &[
            ("HW_OUT", path.to_str().unwrap()),
            ("HIGHWATER_ALLOC_LOG", log_path.to_str().unwrap()),
        ],
    );
    assert!(output.status.success(), "{output:?}");
    let profile = Profile::load(&path).unwrap();
    assert_eq!(
        profile.meta.alloc_log.as_deref(),
        Some(log_path.to_str().unwrap())
    );
    let log = highwater::profile::alloc_log::AllocLog::read(&log_path).unwrap();
    assert_eq!(log.devices, vec!["cpu".to_string()]);
    let allocs = log.records.iter().filter(|r| r.alloc).count() as u64;
    assert!(profile.summary.realloc_count > 0, "the Vec grew by realloc");
    assert_eq!(
        allocs,
        profile.summary.alloc_count + profile.summary.realloc_count,
        "one alloc record per allocation and per realloc"
    );
    let stamps: Vec<u64> = log.records.iter().map(|r| r.ts_ns).collect();
    assert!(
        stamps.windows(2).all(|w| w[0] <= w[1]),
        "records in merged order"
    );
}

#[test]
fn a_second_session_is_refused_while_one_runs() {
    let name = "a_second_session_is_refused_while_one_runs";
    if is_child(name) {
        let first = Session::builder().write_profile(false).start().unwrap();
        assert!(matches!(
            Session::builder().write_profile(false).start(),
            Err(Error::AlreadyRunning)
        ));
        first.finish().unwrap();
        // Once finished, a new session may start and records afresh.
        let second = Session::builder().write_profile(false).start().unwrap();
        let _kept = allocate_a_little();
        let profile = second.finish().unwrap();
        assert!(profile.summary.alloc_count >= 100);
        println!("child-ok");
        return;
    }
    let output = child(name, &[]);
    assert!(output.status.success(), "{output:?}");
    assert!(String::from_utf8_lossy(&output.stdout).contains("child-ok"));
}
