//! Where a session's files go, decided once at start (hardening issue, rows 5, 6, 7, 14, 17):
//! a written-through output (`/dev/stdout`, a pipe) gets one document and no checkpoints; a
//! relative output stays where the program started; two outputs naming one file are refused;
//! an existing file that cannot be replaced is refused before recording; a device output gets
//! no HTML report beside it. Each test runs in its own child process.

use std::fs;
use std::io::Read;
use std::os::fd::FromRawFd;
use std::time::Duration;

use highwater::{Error, Session, Step};
use highwater_testkit::child::isolated;

/// Records for about `millis` ms, in steps.
fn record_for(millis: u64) {
    let mut kept = Vec::new();
    for step in 0..millis / 5 {
        let _forward = highwater::profile!("forward", Step::Forward);
        kept.push(vec![step as u8; 1024]);
        std::thread::sleep(Duration::from_millis(5));
    }
    std::hint::black_box(&kept);
}

#[test]
fn a_written_through_output_gets_one_document_and_no_checkpoints() {
    isolated(
        "a_written_through_output_gets_one_document_and_no_checkpoints",
        || {
            let mut fds = [0; 2];
            // SAFETY: `fds` has room for the two descriptors pipe(2) writes.
            assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0);
            // SAFETY: the read end is ours and open.
            let mut reader = unsafe { fs::File::from_raw_fd(fds[0]) };
            let reading = std::thread::spawn(move || {
                let mut text = String::new();
                reader.read_to_string(&mut text).unwrap();
                text
            });
            // As `/dev/stdout` leads to an open file of the process.
            let output = format!("/proc/self/fd/{}", fds[1]);
            let session = Session::builder()
                .output(&output)
                .checkpoint_every(Duration::from_millis(10))
                .start()
                .unwrap();
            record_for(200);
            session.finish().unwrap();
            // SAFETY: the write end is ours; closing it ends the reader's stream.
            drop(unsafe { fs::File::from_raw_fd(fds[1]) });
            let text = reading.join().unwrap();
            assert_eq!(
                text.matches("\"schema\"").count(),
                1,
                "the stream holds checkpoints and the profile back to back"
            );
            let profile: highwater::Profile = serde_json::from_str(&text).unwrap();
            assert!(!profile.meta.partial);
        },
    );
}

#[test]
fn a_relative_output_stays_where_the_program_started() {
    isolated("a_relative_output_stays_where_the_program_started", || {
        let start = tempfile::tempdir().unwrap();
        let elsewhere = tempfile::tempdir().unwrap();
        std::env::set_current_dir(start.path()).unwrap();
        let session = Session::builder()
            .output("run/profile.json")
            .checkpoint_every(Duration::from_millis(10))
            .start()
            .unwrap();
        record_for(50);
        std::env::set_current_dir(elsewhere.path()).unwrap();
        record_for(50);
        session.finish().unwrap();
        let written = start.path().join("run/profile.json");
        let profile = highwater::Profile::load(&written).unwrap();
        assert!(
            !profile.meta.partial,
            "the final profile replaced the checkpoint"
        );
        assert!(
            !elsewhere.path().join("run").exists(),
            "nothing lands in the directory the program moved to"
        );
    });
}

#[test]
fn the_profile_and_the_allocation_log_cannot_be_one_file() {
    isolated(
        "the_profile_and_the_allocation_log_cannot_be_one_file",
        || {
            let dir = tempfile::tempdir().unwrap();
            let path = dir.path().join("run.json");
            let link = dir.path().join("also-run.json");
            fs::write(&path, "{}").unwrap();
            std::os::unix::fs::symlink(&path, &link).unwrap();
            for log in [&path, &link] {
                match Session::builder().output(&path).alloc_log(log).start() {
                    Err(Error::Setting { setting, reason }) => {
                        assert_eq!(setting, "alloc_log");
                        assert!(reason.contains("overwrite"), "{reason}");
                    }
                    other => panic!("expected a refusal, got {other:?}"),
                }
            }
            assert_eq!(fs::read_to_string(&path).unwrap(), "{}");
        },
    );
}

#[test]
fn a_device_output_gets_no_html_report_beside_it() {
    isolated("a_device_output_gets_no_html_report_beside_it", || {
        let before = fs::metadata("/dev/null.html").is_ok();
        let session = Session::builder()
            .output("/dev/null")
            .html(true)
            .start()
            .unwrap();
        record_for(10);
        session.finish().unwrap();
        assert_eq!(fs::metadata("/dev/null.html").is_ok(), before);
    });
}

/// An existing file whose directory cannot take a new one (a read-only mount) cannot be
/// replaced: refused at start, not at the end. Needs permission to mount (root in CI).
#[test]
fn an_existing_file_that_cannot_be_replaced_is_refused_at_start() {
    isolated(
        "an_existing_file_that_cannot_be_replaced_is_refused_at_start",
        || {
            let dir = tempfile::tempdir().unwrap();
            let target = std::ffi::CString::new(dir.path().to_str().unwrap()).unwrap();
            // SAFETY: valid NUL-terminated strings; a fresh tmpfs on our temp directory.
            let mounted = unsafe {
                libc::mount(
                    c"tmpfs".as_ptr(),
                    target.as_ptr(),
                    c"tmpfs".as_ptr(),
                    0,
                    c"size=64k".as_ptr().cast(),
                )
            };
            if mounted != 0 {
                eprintln!("SKIPPED: cannot mount a tmpfs here");
                return;
            }
            let path = dir.path().join("profile.json");
            fs::write(&path, "old").unwrap();
            // SAFETY: remounting what we mounted, read-only.
            let readonly = unsafe {
                libc::mount(
                    std::ptr::null(),
                    target.as_ptr(),
                    std::ptr::null(),
                    libc::MS_REMOUNT | libc::MS_RDONLY,
                    std::ptr::null(),
                )
            };
            let result = Session::builder().output(&path).start();
            // SAFETY: unmounting what we mounted above.
            unsafe { libc::umount2(target.as_ptr(), libc::MNT_DETACH) };
            assert_eq!(readonly, 0, "{}", std::io::Error::last_os_error());
            match result {
                Err(Error::Setting { setting, reason }) => {
                    assert_eq!(setting, "output");
                    assert!(reason.contains("not writable"), "{reason}");
                }
                other => panic!("expected a refusal at start, got {other:?}"),
            }
        },
    );
}
