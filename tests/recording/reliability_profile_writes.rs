//! A profile that cannot be written is an error that names the file, and leaves nothing behind:
//! no partial profile, no temporary file, and an older profile at the path untouched. The run is
//! not lost: the error hands back the profile, and a copy goes to the temporary directory. An
//! output that can be seen to be unwritable is refused when the session starts.
//!
//! Tests run as root in CI, where permissions do not stop writes, so the failures come from
//! things that stop root too: a parent that is a regular file, sysfs (which never lets anyone
//! create a file), a file-size limit (`RLIMIT_FSIZE`: the write fails with `EFBIG` after part of
//! the file was written, as on a full disk) and, where mounting is allowed, a tiny tmpfs that
//! really runs out of space (`ENOSPC`). Each test runs in its own child process
//! (`highwater_testkit::child::isolated`).

use std::fs;
use std::path::Path;

use highwater::profile::ProfileError;
use highwater::{Error, Session, Step};
use highwater_testkit::child::{is_child, isolated, run_child};

/// Allocates in many differently named spans, so the profile is tens of kilobytes.
fn record_a_big_profile() {
    const NAMES: [&str; 40] = [
        "s00", "s01", "s02", "s03", "s04", "s05", "s06", "s07", "s08", "s09", "s10", "s11", "s12",
        "s13", "s14", "s15", "s16", "s17", "s18", "s19", "s20", "s21", "s22", "s23", "s24", "s25",
        "s26", "s27", "s28", "s29", "s30", "s31", "s32", "s33", "s34", "s35", "s36", "s37", "s38",
        "s39",
    ];
    let mut kept = Vec::new();
    for (i, name) in NAMES.iter().enumerate() {
        let _outer = highwater::profile!("outer", Step::Forward);
        let _span = highwater::profile!(name);
        kept.push(vec![0u8; 1000 + i]);
    }
    std::hint::black_box(&kept);
}

/// Asserts `result` is a write error naming `path` that still carries the recorded profile,
/// and that the fallback copy it names holds the same profile (the copy is then removed).
fn assert_write_error<T: std::fmt::Debug>(result: Result<T, Error>, path: &Path) {
    assert_write_error_with(result, path, true);
}

/// As [`assert_write_error`]; with `fallback_possible` false (the limit that failed the write
/// applies to the temporary directory too), checks that no copy is claimed.
fn assert_write_error_with<T: std::fmt::Debug>(
    result: Result<T, Error>,
    path: &Path,
    fallback_possible: bool,
) {
    match result {
        Err(Error::Write {
            source: ProfileError::Write { path: named, .. },
            profile,
            fallback,
        }) if named == path => {
            assert!(
                profile.summary.alloc_count >= 40,
                "the error should carry the run's profile: {:?}",
                profile.summary
            );
            if !fallback_possible {
                assert_eq!(fallback, None, "no copy can have been written");
                return;
            }
            let fallback = fallback.expect("a fallback copy in the temporary directory");
            let copy = highwater::Profile::load(&fallback).unwrap();
            assert_eq!(copy, *profile, "the fallback copy is the profile");
            fs::remove_file(fallback).unwrap();
        }
        other => panic!(
            "expected a write error for {}, got {other:?}",
            path.display()
        ),
    }
}

/// The names in `dir`, sorted.
fn names(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

/// The output's parent is a regular file, so its directory cannot be created. Proves: `start`
/// refuses it with `Error::Setting` naming the path, before anything is recorded; nothing is
/// created and the file is unchanged; the refused start holds no session slot.
#[test]
fn an_output_under_a_regular_file_is_refused_at_start() {
    isolated("an_output_under_a_regular_file_is_refused_at_start", || {
        let dir = tempfile::tempdir().unwrap();
        fs::write(dir.path().join("file"), "not a directory").unwrap();
        let path = dir.path().join("file/sub/profile.json");
        let result = Session::builder().output(&path).start();
        match &result {
            Err(Error::Setting {
                setting: "output",
                reason,
            }) => assert!(
                reason.contains(&*path.to_string_lossy()) && reason.contains("not a directory"),
                "the error should name the file and the cause: {reason}"
            ),
            other => panic!("expected a refused start, got {other:?}"),
        }
        assert_eq!(names(dir.path()), vec!["file"], "something was created");
        assert_eq!(
            fs::read_to_string(dir.path().join("file")).unwrap(),
            "not a directory"
        );
        let again = Session::builder().write_profile(false).start();
        assert!(
            again.is_ok(),
            "a refused start must not keep the session slot: {again:?}"
        );
    });
}

/// The output's directory is fine at start and becomes a regular file before the end. Proves:
/// `finish` returns `Error::Write` naming the path, carrying the profile, with a fallback copy;
/// nothing is created at the output; the failed finish released the session (a new one starts).
#[test]
fn an_output_directory_that_cannot_be_created_is_an_error() {
    isolated(
        "an_output_directory_that_cannot_be_created_is_an_error",
        || {
            let dir = tempfile::tempdir().unwrap();
            let path = dir.path().join("file/sub/profile.json");
            let session = Session::builder().output(&path).start().unwrap();
            record_a_big_profile();
            // The session made the output's directories when it claimed the name at start.
            fs::remove_dir_all(dir.path().join("file")).unwrap();
            fs::write(dir.path().join("file"), "not a directory").unwrap();
            let result = session.finish();
            let message = result.as_ref().unwrap_err().to_string();
            assert!(
                message.contains(&*path.to_string_lossy()),
                "the error should name the file: {message}"
            );
            assert!(
                message.contains("a copy of the profile was written to"),
                "the error should say where the copy went: {message}"
            );
            assert_write_error(result, &path);
            assert_eq!(names(dir.path()), vec!["file"], "something was created");
            let again = Session::builder().write_profile(false).start();
            assert!(
                again.is_ok(),
                "a failed write must not keep the session slot: {again:?}"
            );
        },
    );
}

/// The output directory exists but no file can be created in it, even by root: sysfs. Proves:
/// `finish` returns `ProfileError::Write` naming the path, and no file appears there.
#[test]
fn a_directory_where_no_file_can_be_created_is_an_error() {
    isolated(
        "a_directory_where_no_file_can_be_created_is_an_error",
        || {
            let path = Path::new("/sys/highwater-profile-test.json");
            let session = Session::builder().output(path).start().unwrap();
            record_a_big_profile();
            assert_write_error(session.finish(), path);
            let leftovers: Vec<_> = fs::read_dir("/sys")
                .unwrap()
                .filter_map(|e| e.ok())
                .filter(|e| e.file_name().to_string_lossy().contains("highwater"))
                .collect();
            assert!(leftovers.is_empty(), "files left in /sys: {leftovers:?}");
        },
    );
}

/// Lowers the file-size limit of this process to `bytes`, with SIGXFSZ ignored so an oversized
/// write fails with `EFBIG` instead of killing the process.
fn limit_file_size(bytes: u64) {
    let limit = libc::rlimit {
        rlim_cur: bytes,
        rlim_max: libc::RLIM_INFINITY,
    };
    // SAFETY: ignoring a signal and setting a limit of our own process.
    unsafe {
        libc::signal(libc::SIGXFSZ, libc::SIG_IGN);
        assert_eq!(
            libc::setrlimit(libc::RLIMIT_FSIZE, &limit),
            0,
            "setrlimit failed"
        );
    }
}

/// The write fails after part of the profile was written (a 4 KiB file-size limit; the profile
/// is larger). Proves: `finish` returns `ProfileError::Write` naming the path; no temporary or
/// partial file is left; the profile already at the path is untouched.
#[test]
fn a_write_that_fails_midway_leaves_no_partial_file() {
    isolated("a_write_that_fails_midway_leaves_no_partial_file", || {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("profile.json");
        fs::write(&path, "the previous profile").unwrap();
        let session = Session::builder().output(&path).start().unwrap();
        record_a_big_profile();
        let size = session.snapshot().unwrap().to_json().len();
        assert!(
            size > 4 * 4096,
            "the profile should outgrow the limit: {size} bytes"
        );
        limit_file_size(4096);
        let result = session.finish();
        let message = result.as_ref().unwrap_err().to_string();
        assert!(
            message.contains("too large") || message.contains("File too large"),
            "expected EFBIG: {message}"
        );
        assert!(
            message.contains("no copy of the profile could be written"),
            "{message}"
        );
        // The file-size limit stops the fallback copy too.
        assert_write_error_with(result, &path, false);
        assert_eq!(
            names(dir.path()),
            vec!["profile.json"],
            "a file was left behind"
        );
        assert_eq!(
            fs::read_to_string(&path).unwrap(),
            "the previous profile",
            "the previous profile was damaged"
        );
    });
}

/// A tmpfs of 8 KiB really fills up (`ENOSPC`). Needs permission to mount (root in CI); where
/// mounting is refused the test says so on stderr and checks nothing else. Proves, where it
/// runs: `finish` returns `ProfileError::Write`, and the file system is empty afterwards.
#[test]
fn a_full_disk_is_an_error_and_leaves_no_partial_file() {
    isolated("a_full_disk_is_an_error_and_leaves_no_partial_file", || {
        let dir = tempfile::tempdir().unwrap();
        let target = std::ffi::CString::new(dir.path().to_str().unwrap()).unwrap();
        // SAFETY: valid NUL-terminated strings; mounting a fresh tmpfs on our temp directory.
        let mounted = unsafe {
            libc::mount(
                c"tmpfs".as_ptr(),
                target.as_ptr(),
                c"tmpfs".as_ptr(),
                0,
                c"size=8k".as_ptr().cast(),
            )
        };
        if mounted != 0 {
            eprintln!(
                "SKIPPED: cannot mount a tmpfs here ({}); the file-size-limit test covers a \
                 write failing midway",
                std::io::Error::last_os_error()
            );
            return;
        }
        let path = dir.path().join("profile.json");
        let session = Session::builder().output(&path).start().unwrap();
        record_a_big_profile();
        let result = session.finish();
        let listing = names(dir.path());
        // SAFETY: unmounting what we mounted above.
        unsafe { libc::umount2(target.as_ptr(), libc::MNT_DETACH) };
        let message = result.as_ref().unwrap_err().to_string();
        assert!(
            message.contains("No space left"),
            "expected ENOSPC: {message}"
        );
        assert_write_error(result, &path);
        assert!(
            listing.is_empty(),
            "files left on the full disk: {listing:?}"
        );
    });
}

/// When the session ends by being dropped, or at `exit`, a failed write cannot be returned: it
/// is reported on stderr. Proves: neither path panics or hangs, the process exits with its own
/// code, stderr names the file, and nothing is created.
#[test]
fn a_failed_write_at_drop_or_exit_is_reported_on_stderr() {
    let name = "a_failed_write_at_drop_or_exit_is_reported_on_stderr";
    if is_child(name) {
        let path = std::env::var("HW_OUT").unwrap();
        let blocker = Path::new(&path).parent().unwrap().to_path_buf();
        let session = Session::builder().output(&path).start().unwrap();
        record_a_big_profile();
        // The session made the output's directory when it claimed the name at start.
        fs::remove_dir_all(&blocker).unwrap();
        fs::write(&blocker, "x").unwrap();
        drop(session);
        fs::remove_file(&blocker).unwrap();
        let session = Session::builder().output(&path).start().unwrap();
        record_a_big_profile();
        fs::remove_dir_all(&blocker).unwrap();
        fs::write(&blocker, "x").unwrap();
        std::mem::forget(session);
        std::process::exit(5);
    }
    let dir = tempfile::tempdir().unwrap();
    let fallbacks = tempfile::tempdir().unwrap();
    let path = dir.path().join("file/profile.json");
    let output = run_child(
        name,
        &[
            ("HW_OUT", path.to_str().unwrap()),
            ("TMPDIR", fallbacks.path().to_str().unwrap()),
        ],
        highwater_testkit::child::WATCHDOG,
    );
    assert_eq!(output.status.code(), Some(5), "{output:?}");
    let reports = output
        .stderr
        .lines()
        .filter(|line| line.starts_with("highwater: cannot write profile"))
        .filter(|line| line.contains(path.to_str().unwrap()))
        .count();
    assert_eq!(
        reports, 2,
        "one report from drop, one from exit:\n{}",
        output.stderr
    );
    assert_eq!(names(dir.path()), vec!["file"]);
    let copies = names(fallbacks.path());
    assert_eq!(
        copies.len(),
        2,
        "one fallback copy per failed write: {copies:?}"
    );
    for copy in copies {
        let profile = highwater::Profile::load(fallbacks.path().join(&copy)).unwrap();
        assert!(
            profile.summary.alloc_count >= 40,
            "{copy}: {:?}",
            profile.summary
        );
    }
}
