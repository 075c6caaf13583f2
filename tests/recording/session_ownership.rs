//! Whose session a handle ends, and what survives `fork` and `exit`: a forked child's inherited
//! session is inert and the child can start its own; `process::exit` while another thread is
//! inside `snapshot()` or `finish()` still leaves the profile; an `OpGuard` from an earlier
//! session does not end the current session's op. Each case runs in its own child process,
//! under a watchdog: a hang fails the test.

use std::hint::black_box;
use std::path::Path;
use std::time::{Duration, Instant};

use highwater::ops;
use highwater::{Error, Profile, Session};
use highwater_testkit::child::{is_child, isolated, run_child};

const MIB: usize = 1 << 20;

/// Waits for process `pid` at most `limit`; its exit code, or `None` if it did not end.
fn wait_for(pid: libc::pid_t, limit: Duration) -> Option<i32> {
    let started = Instant::now();
    loop {
        let mut status = 0;
        // SAFETY: waiting for our own child with a writable status.
        let done = unsafe { libc::waitpid(pid, &mut status, libc::WNOHANG) };
        if done == pid {
            return libc::WIFEXITED(status).then(|| libc::WEXITSTATUS(status));
        }
        if started.elapsed() > limit {
            // SAFETY: killing our own child.
            unsafe { libc::kill(pid, libc::SIGKILL) };
            return None;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// In a forked child: the inherited session's `snapshot` and `finish` return `ForkedChild` at
/// once (they used to wait forever for the parent's collector), dropping it does nothing, and
/// `Session::start` works and records the child's own allocations. The parent's session is
/// untouched.
#[test]
fn a_forked_child_s_inherited_session_is_inert_and_it_can_start_its_own() {
    isolated(
        "a_forked_child_s_inherited_session_is_inert_and_it_can_start_its_own",
        || {
            let dir = tempfile::tempdir().unwrap();
            let parent_path = dir.path().join("parent.json");
            let child_path = dir.path().join("child.json");
            let session = Session::builder().output(&parent_path).start().unwrap();
            black_box(vec![0u8; MIB]);
            // SAFETY: the child only allocates, uses highwater and calls `_exit`.
            let pid = unsafe { libc::fork() };
            if pid == 0 {
                let code = (|| {
                    if !matches!(session.snapshot(), Err(Error::ForkedChild)) {
                        return 10;
                    }
                    if session.is_recording() {
                        return 11;
                    }
                    if !matches!(session.finish(), Err(Error::ForkedChild)) {
                        return 12;
                    }
                    let Ok(own) = Session::builder().output(&child_path).start() else {
                        return 13;
                    };
                    black_box(vec![1u8; 3 * MIB]);
                    match own.finish() {
                        Ok(profile) if profile.summary.peak_bytes >= 3 * MIB as u64 => 0,
                        _ => 14,
                    }
                })();
                // SAFETY: ending the forked child without running the parent's exit handlers.
                unsafe { libc::_exit(code) };
            }
            assert!(pid > 0, "fork failed");
            assert_eq!(
                wait_for(pid, Duration::from_secs(60)),
                Some(0),
                "the forked child failed or hung (exit code above names the step)"
            );
            let child = Profile::load(&child_path).unwrap();
            assert!(child.summary.peak_bytes >= 3 * MIB as u64);
            assert!(session.is_recording(), "the parent's session goes on");
            let parent = session.finish().unwrap();
            assert!(parent.summary.peak_bytes >= MIB as u64);
            assert!(
                parent.summary.peak_bytes < 3 * MIB as u64,
                "the child's bytes are not the parent's"
            );
        },
    );
}

/// A fork while a parent thread is inside `snapshot()`: the child can still start its own
/// session (it used to hang on the lock that thread held, or be told `AlreadyRunning`). Then a
/// child that only drops its inherited session returns at once and writes nothing over the
/// parent's output.
#[test]
fn a_fork_during_a_snapshot_and_a_dropped_inherited_session_do_not_hang() {
    isolated(
        "a_fork_during_a_snapshot_and_a_dropped_inherited_session_do_not_hang",
        || {
            use std::sync::atomic::{AtomicBool, Ordering};
            let dir = tempfile::tempdir().unwrap();
            let path = dir.path().join("parent.json");
            let session = Session::builder().output(&path).start().unwrap();
            let stop = AtomicBool::new(false);
            std::thread::scope(|scope| {
                scope.spawn(|| {
                    while !stop.load(Ordering::SeqCst) {
                        let _ = session.snapshot();
                    }
                });
                // Enough forks that some land while that thread is inside a push (its ring
                // busy), which used to make the child's own finish wait forever.
                for _ in 0..20 {
                    std::thread::sleep(Duration::from_millis(1));
                    // SAFETY: the child uses highwater and calls `_exit`.
                    let pid = unsafe { libc::fork() };
                    if pid == 0 {
                        let ok = matches!(session.snapshot(), Err(Error::ForkedChild))
                            && Session::builder()
                                .write_profile(false)
                                .start()
                                .and_then(Session::finish)
                                .is_ok();
                        // SAFETY: ending the forked child at once.
                        unsafe { libc::_exit(if ok { 0 } else { 1 }) };
                    }
                    assert_eq!(wait_for(pid, Duration::from_secs(60)), Some(0));
                }
                stop.store(true, Ordering::SeqCst);
            });
            // SAFETY: the child drops the session and calls `_exit`.
            let pid = unsafe { libc::fork() };
            if pid == 0 {
                drop(session);
                // SAFETY: as above.
                unsafe { libc::_exit(0) };
            }
            assert_eq!(wait_for(pid, Duration::from_secs(60)), Some(0));
            assert!(!path.exists(), "the child wrote the parent's profile");
            session.finish().unwrap();
            assert!(path.exists());
        },
    );
}

/// A fork while other threads keep taking the session's lock (one loops on `snapshot()`, two on
/// `start()`, refused while a session runs): each child's own `start` and `finish` return. The
/// threads queued for that lock at the fork used to stay on parking_lot's wait list in the child,
/// and unlocking it there could hand the lock to one of them, a thread that does not exist in the
/// child: the child's `start` waited forever (several children in 40 hung).
#[test]
fn a_fork_while_threads_queue_for_the_session_lock_does_not_hang_the_child() {
    isolated(
        "a_fork_while_threads_queue_for_the_session_lock_does_not_hang_the_child",
        || {
            use std::sync::atomic::{AtomicBool, Ordering};
            const FORKS: usize = 40;
            let session = Session::builder().write_profile(false).start().unwrap();
            // Touched memory makes each fork take long enough for the threads below to queue
            // for the lock while the fork handler holds it, and for parking_lot's fairness
            // timer (under 1 ms) to run out before the child unlocks.
            let ballast = black_box(vec![1u8; 256 * MIB]);
            let stop = AtomicBool::new(false);
            let mut hung = Vec::new();
            std::thread::scope(|scope| {
                scope.spawn(|| {
                    while !stop.load(Ordering::SeqCst) {
                        let _ = session.snapshot();
                    }
                });
                for _ in 0..2 {
                    scope.spawn(|| {
                        while !stop.load(Ordering::SeqCst) {
                            let refused = Session::builder().write_profile(false).start();
                            assert!(matches!(refused, Err(Error::AlreadyRunning)), "{refused:?}");
                        }
                    });
                }
                for fork in 0..FORKS {
                    std::thread::sleep(Duration::from_millis(1));
                    // SAFETY: the child uses highwater and calls `_exit`.
                    let pid = unsafe { libc::fork() };
                    if pid == 0 {
                        let ok = Session::builder()
                            .write_profile(false)
                            .start()
                            .and_then(Session::finish)
                            .is_ok();
                        // SAFETY: ending the forked child at once.
                        unsafe { libc::_exit(if ok { 0 } else { 1 }) };
                    }
                    assert!(pid > 0, "fork failed");
                    let code = wait_for(pid, Duration::from_secs(60));
                    if code != Some(0) {
                        hung.push((fork, code));
                        break;
                    }
                }
                stop.store(true, Ordering::SeqCst);
            });
            drop(ballast);
            assert!(
                hung.is_empty(),
                "a forked child failed or hung (fork, exit code; `None`: killed after 60 s): \
                 {hung:?}"
            );
            session.finish().unwrap();
        },
    );
}

/// A fork while a parent thread keeps interning op names (a new name per step, as a training
/// loop's `format!` does): the child's own session records its op and finishes. The child used
/// to inherit the names table locked by that thread, and its first op waited forever (2 children
/// in 16 hung).
#[test]
fn a_fork_while_a_thread_interns_op_names_does_not_hang_the_child() {
    isolated(
        "a_fork_while_a_thread_interns_op_names_does_not_hang_the_child",
        || {
            use std::sync::atomic::{AtomicBool, Ordering};
            const FORKS: usize = 40;
            let session = Session::builder().write_profile(false).start().unwrap();
            let stop = AtomicBool::new(false);
            let mut hung = Vec::new();
            std::thread::scope(|scope| {
                scope.spawn(|| {
                    let mut step = 0u64;
                    while !stop.load(Ordering::SeqCst) {
                        step += 1;
                        drop(ops::op(&format!("step{}", step % 50_000)));
                    }
                });
                for fork in 0..FORKS {
                    std::thread::sleep(Duration::from_millis(2));
                    // SAFETY: the child uses highwater and calls `_exit`.
                    let pid = unsafe { libc::fork() };
                    if pid == 0 {
                        let code = match Session::builder().write_profile(false).start() {
                            Ok(own) => {
                                let op = ops::op("in_the_child");
                                let block = black_box(vec![3u8; MIB]);
                                let profile = own.snapshot();
                                drop(block);
                                drop(op);
                                let named = profile.is_ok_and(|profile| {
                                    profile
                                        .peak_breakdown
                                        .iter()
                                        .any(|row| row.op.as_deref() == Some("in_the_child"))
                                });
                                match (named, own.finish()) {
                                    (true, Ok(_)) => 0,
                                    (false, _) => 2,
                                    (true, Err(_)) => 3,
                                }
                            }
                            Err(_) => 1,
                        };
                        // SAFETY: ending the forked child at once.
                        unsafe { libc::_exit(code) };
                    }
                    assert!(pid > 0, "fork failed");
                    let code = wait_for(pid, Duration::from_secs(60));
                    if code != Some(0) {
                        hung.push((fork, code));
                        break;
                    }
                }
                stop.store(true, Ordering::SeqCst);
            });
            assert!(
                hung.is_empty(),
                "a forked child failed or hung (fork, exit code; `None`: killed after 60 s): \
                 {hung:?}"
            );
            session.finish().unwrap();
        },
    );
}

/// `process::exit` on the main thread while another thread is inside `snapshot()` (in a loop)
/// or `finish()`: the exit handler waits for the finish in progress and the profile is always
/// written (it used to be missing in most runs, silently). Ten runs of each.
#[test]
fn exit_during_snapshot_or_finish_still_writes_the_profile() {
    let name = "exit_during_snapshot_or_finish_still_writes_the_profile";
    if is_child(name) {
        let path = std::env::var("HW_OUT").unwrap();
        let during_finish = std::env::var("HW_DURING").unwrap() == "finish";
        let session = Session::builder().output(&path).start().unwrap();
        let kept: Vec<Vec<u8>> = (0..200).map(|i| vec![0u8; 1000 + i]).collect();
        let (started, busy) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            if during_finish {
                let _ = started.send(());
                let _ = session.finish();
            } else {
                loop {
                    let _ = started.send(());
                    let _ = session.snapshot();
                }
            }
        });
        busy.recv().unwrap();
        std::mem::forget(kept);
        std::process::exit(7);
    }
    for during in ["snapshot", "finish"] {
        for run in 0..10 {
            let dir = tempfile::tempdir().unwrap();
            let path = dir.path().join("exit.json");
            let output = run_child(
                name,
                &[("HW_OUT", path.to_str().unwrap()), ("HW_DURING", during)],
                highwater_testkit::child::WATCHDOG,
            );
            assert_eq!(
                output.status.code(),
                Some(7),
                "{during} run {run}: {output:?}"
            );
            let profile = Profile::load(&path).unwrap_or_else(|error| {
                panic!(
                    "{during} run {run}: no profile ({error}); stderr:\n{}",
                    output.stderr
                )
            });
            assert!(profile.summary.alloc_count >= 200, "{during} run {run}");
        }
    }
}

/// An `OpGuard` begun in one session and dropped in the next does not end the op the next
/// session has open: the allocation made after the drop is still attributed to that op.
#[test]
fn an_op_guard_from_an_earlier_session_does_not_end_the_current_op() {
    isolated(
        "an_op_guard_from_an_earlier_session_does_not_end_the_current_op",
        || {
            let first = Session::builder().write_profile(false).start().unwrap();
            let stale = ops::op("from_the_first_session");
            first.finish().unwrap();
            let second = Session::builder().write_profile(false).start().unwrap();
            let current = ops::op("current");
            drop(stale);
            let block = black_box(vec![7u8; 2 * MIB]);
            let profile = second.snapshot().unwrap();
            drop(current);
            drop(block);
            second.finish().unwrap();
            let row = profile
                .peak_breakdown
                .iter()
                .find(|row| row.bytes >= 2 * MIB as u64)
                .expect("the 2 MiB block is live at the peak");
            assert_eq!(
                row.op.as_deref(),
                Some("current"),
                "{:#?}",
                profile.peak_breakdown
            );
        },
    );
}

/// `-o /dev/null`-style outputs: a session writing to `/dev/null` finishes without an error and
/// leaves the device in place; one writing to `/dev/stdout` prints the profile.
#[test]
fn special_file_outputs_are_written_through() {
    let name = "special_file_outputs_are_written_through";
    if is_child(name) {
        let session = Session::builder().output("/dev/null").start().unwrap();
        black_box(vec![0u8; 4096]);
        session.finish().unwrap();
        let session = Session::builder().output("/dev/stdout").start().unwrap();
        black_box(vec![0u8; 4096]);
        session.finish().unwrap();
        return;
    }
    let output = run_child(name, &[], highwater_testkit::child::WATCHDOG);
    assert!(output.status.success(), "{output:?}");
    assert!(
        output.stdout.contains("\"schema\": \"highwater/"),
        "the profile went to stdout: {}",
        output.stdout
    );
    use std::os::unix::fs::FileTypeExt;
    let null = std::fs::metadata("/dev/null").unwrap();
    assert!(null.file_type().is_char_device(), "/dev/null was replaced");
}

/// A non-UTF-8 `HIGHWATER_OUT` is used byte for byte (it used to be converted lossily and the
/// profile landed under another name).
#[test]
fn a_non_utf8_output_path_is_kept_exactly() {
    let name = "a_non_utf8_output_path_is_kept_exactly";
    if is_child(name) {
        let session = Session::start().unwrap();
        black_box(vec![0u8; 4096]);
        session.finish().unwrap();
        return;
    }
    use std::os::unix::ffi::OsStrExt;
    let dir = tempfile::tempdir().unwrap();
    let file = std::ffi::OsStr::from_bytes(b"profile-\xff\xfe.json");
    let path = dir.path().join(file);
    let output = highwater_testkit::child::command(name)
        .env("HIGHWATER_OUT", &path)
        .output()
        .unwrap();
    assert!(output.status.success(), "{output:?}");
    let mut names: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    names.sort();
    // The report beside it keeps the same bytes in its name.
    let report = std::ffi::OsStr::from_bytes(b"profile-\xff\xfe.html");
    assert_eq!(names, vec![report.to_os_string(), file.to_os_string()]);
    assert!(Profile::load(Path::new(&path)).is_ok());
}

/// An allocation log that is a FIFO nobody reads: `start` does not wait for a reader (it used to
/// block forever opening it); the profile says the log is incomplete.
#[test]
fn an_allocation_log_fifo_without_a_reader_does_not_hang_start() {
    isolated(
        "an_allocation_log_fifo_without_a_reader_does_not_hang_start",
        || {
            let dir = tempfile::tempdir().unwrap();
            let fifo = dir.path().join("run.alloc");
            let name = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
            // SAFETY: a valid NUL-terminated path.
            assert_eq!(unsafe { libc::mkfifo(name.as_ptr(), 0o600) }, 0);
            let session = Session::builder()
                .write_profile(false)
                .alloc_log(&fifo)
                .start()
                .unwrap();
            black_box(vec![0u8; 4096]);
            let profile = session.finish().unwrap();
            assert!(
                profile.warnings.iter().any(|w| matches!(
                    w,
                    highwater::profile::Warning::AllocLogIncomplete { error, .. }
                        if error.contains("FIFO")
                )),
                "{:?}",
                profile.warnings
            );
        },
    );
}
