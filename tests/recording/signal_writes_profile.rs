//! Ctrl+C: with `write_on_signal` (or `HIGHWATER_SIGNALS=1`), SIGINT and SIGTERM write the
//! profile and the process still dies by the signal; without it nothing changes; the handlers
//! chain to the program's own and go away when the session finishes.
//!
//! Each case runs this test binary as a child (`HW_CHILD`), which allocates on several threads
//! until the parent signals it. Every wait has a timeout: a hang fails the test.

use std::hint::black_box;
use std::io::{BufRead, BufReader};
use std::os::unix::process::ExitStatusExt;
use std::path::Path;
use std::process::{ExitStatus, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use highwater::{Profile, Session, Step};
use highwater_testkit::child::is_child;

/// Allocates in spans on three threads forever; prints `ready` once all three are going.
fn allocate_until_killed() -> ! {
    let (send, receive) = std::sync::mpsc::channel();
    for worker in 0..2u8 {
        let send = send.clone();
        std::thread::spawn(move || {
            let _ = send.send(());
            let mut round = 0usize;
            loop {
                let _span = highwater::profile!("worker_step", Step::Forward);
                black_box(vec![worker; 64 + round % 512]);
                round += 1;
            }
        });
    }
    receive.recv().unwrap();
    receive.recv().unwrap();
    {
        let _span = highwater::profile!("main_step", Step::Backward);
        black_box(vec![0u8; 1 << 16]);
    }
    println!("ready");
    // Far past the parent's own waits: the parent signals as soon as it reads `ready`.
    let deadline = Instant::now() + 5 * highwater_testkit::child::WATCHDOG;
    while Instant::now() < deadline {
        let _span = highwater::profile!("main_step", Step::Backward);
        black_box(vec![1u8; 4096]);
        std::thread::sleep(Duration::from_millis(1));
    }
    eprintln!("no signal arrived");
    std::process::exit(99);
}

/// Runs child `name`, waits for `ready`, sends `signal`, and returns how it ended and what it
/// printed.
fn signal_child(name: &str, env: &[(&str, &str)], signal: libc::c_int) -> (ExitStatus, String) {
    let mut command = highwater_testkit::child::command(name);
    command.stdout(Stdio::piped()).stderr(Stdio::piped());
    for (key, value) in env {
        command.env(key, value);
    }
    let mut child = command.spawn().expect("spawn the child");
    let stdout = child.stdout.take().unwrap();
    let (lines, receive) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            if lines.send(line).is_err() {
                break;
            }
        }
    });
    let started = Instant::now();
    loop {
        match receive.recv_timeout(Duration::from_millis(100)) {
            Ok(line) if line.contains("ready") => break,
            Ok(_) | Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {}
            Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => {
                let output = child.wait_with_output().unwrap();
                panic!(
                    "{name}: the child ended before it was ready: {:?}\n{}",
                    output.status,
                    String::from_utf8_lossy(&output.stderr)
                );
            }
        }
        if started.elapsed() > highwater_testkit::child::WATCHDOG {
            let _ = child.kill();
            panic!("watchdog: {name} never became ready");
        }
    }
    // Let the collector see some events first.
    std::thread::sleep(Duration::from_millis(50));
    // SAFETY: kill with our child's pid and a valid signal number.
    let sent = unsafe { libc::kill(child.id() as libc::pid_t, signal) };
    assert_eq!(sent, 0, "kill failed");
    let signalled = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if signalled.elapsed() > highwater_testkit::child::WATCHDOG {
            let _ = child.kill();
            panic!("watchdog: {name} did not end within {:?} of the signal (hang while writing the profile?)", highwater_testkit::child::WATCHDOG);
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    let mut stderr = String::new();
    if let Some(mut pipe) = child.stderr.take() {
        let _ = std::io::Read::read_to_string(&mut pipe, &mut stderr);
    }
    (status, stderr)
}

/// Checks that `dir` holds exactly the profile `path` and its report (no temporary file) and that it loads with
/// events from the worker threads and the main thread.
fn check_profile(dir: &Path, path: &Path, stderr: &str) {
    let profile = Profile::load(path).unwrap_or_else(|error| {
        panic!("the profile written on the signal does not load: {error}\n{stderr}")
    });
    assert!(
        profile.summary.alloc_count > 0,
        "the profile has no allocation"
    );
    for name in ["worker_step", "main_step"] {
        assert!(
            profile.spans.iter().any(|s| s.name == name && s.calls > 0),
            "span {name} missing from {:?}",
            profile.spans
        );
    }
    let mut names: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    names.sort();
    let report = highwater_export::html::path_beside(path);
    let mut expected = vec![
        path.file_name().unwrap().to_os_string(),
        report.file_name().unwrap().to_os_string(),
    ];
    expected.sort();
    assert_eq!(
        names, expected,
        "only the profile and its report should be left"
    );
}

#[test]
fn sigint_writes_the_profile_and_the_process_still_dies_by_sigint() {
    let name = "sigint_writes_the_profile_and_the_process_still_dies_by_sigint";
    if is_child(name) {
        let _session = Session::builder()
            .output(std::env::var("HW_OUT").unwrap())
            .ring_events(1 << 12)
            .write_on_signal(true)
            .start()
            .unwrap();
        allocate_until_killed();
    }
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("sigint.json");
    let (status, stderr) = signal_child(name, &[("HW_OUT", path.to_str().unwrap())], libc::SIGINT);
    assert_eq!(
        status.signal(),
        Some(libc::SIGINT),
        "the child should die by SIGINT, not {status:?}\n{stderr}"
    );
    check_profile(dir.path(), &path, &stderr);
}

#[test]
fn sigterm_with_highwater_signals_set_writes_the_profile() {
    let name = "sigterm_with_highwater_signals_set_writes_the_profile";
    if is_child(name) {
        let _session = Session::start().unwrap();
        allocate_until_killed();
    }
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("sigterm.json");
    let (status, stderr) = signal_child(
        name,
        &[
            ("HIGHWATER_OUT", path.to_str().unwrap()),
            ("HIGHWATER_SIGNALS", "1"),
            ("HIGHWATER_RING_EVENTS", "4096"),
        ],
        libc::SIGTERM,
    );
    assert_eq!(
        status.signal(),
        Some(libc::SIGTERM),
        "the child should die by SIGTERM, not {status:?}\n{stderr}"
    );
    check_profile(dir.path(), &path, &stderr);
}

#[test]
fn without_opting_in_a_signal_kills_the_process_and_writes_nothing() {
    let name = "without_opting_in_a_signal_kills_the_process_and_writes_nothing";
    if is_child(name) {
        let _session = Session::start().unwrap();
        allocate_until_killed();
    }
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("default.json");
    let (status, stderr) = signal_child(
        name,
        &[("HIGHWATER_OUT", path.to_str().unwrap())],
        libc::SIGINT,
    );
    assert_eq!(status.signal(), Some(libc::SIGINT), "{status:?}\n{stderr}");
    assert!(
        !path.exists(),
        "no profile should be written without opting in"
    );
}

static OWN_HANDLER_RAN: AtomicBool = AtomicBool::new(false);

extern "C" fn own_handler(_: libc::c_int) {
    OWN_HANDLER_RAN.store(true, Ordering::SeqCst);
}

/// The handler currently installed for `signal`.
fn disposition(signal: libc::c_int) -> libc::sighandler_t {
    // SAFETY: all-zero is a valid sigaction; a null new action only queries.
    unsafe {
        let mut current: libc::sigaction = std::mem::zeroed();
        libc::sigaction(signal, std::ptr::null(), &mut current);
        current.sa_sigaction
    }
}

/// The program has its own SIGINT handler and ignores SIGTERM. Proves: a session with signals
/// on replaces the SIGINT handler but leaves ignored SIGTERM alone; `finish` puts the program's
/// handler back; and a SIGINT during a second session runs the program's handler and keeps
/// recording: a checkpoint profile is written, the 50 MiB the program allocates after the
/// signal (its "checkpoint save") is the run's peak, and the program's own `finish` succeeds
/// and writes the whole run.
#[test]
fn handlers_chain_to_the_programs_own_and_recording_goes_on() {
    highwater_testkit::child::isolated(
        "handlers_chain_to_the_programs_own_and_recording_goes_on",
        || {
            let own = own_handler as extern "C" fn(libc::c_int) as libc::sighandler_t;
            // SAFETY: `own_handler` only stores to an atomic.
            unsafe {
                libc::signal(libc::SIGINT, own);
                libc::signal(libc::SIGTERM, libc::SIG_IGN);
            }
            let dir = tempfile::tempdir().unwrap();
            let path = dir.path().join("chained.json");

            let session = Session::builder()
                .output(&path)
                .write_on_signal(true)
                .start()
                .unwrap();
            assert_ne!(
                disposition(libc::SIGINT),
                own,
                "highwater's handler is installed"
            );
            assert_eq!(
                disposition(libc::SIGTERM),
                libc::SIG_IGN,
                "an ignored signal stays ignored"
            );
            session.finish().unwrap();
            assert_eq!(
                disposition(libc::SIGINT),
                own,
                "finish puts the program's handler back"
            );
            std::fs::remove_file(&path).unwrap();

            let session = Session::builder()
                .output(&path)
                .write_on_signal(true)
                .start()
                .unwrap();
            black_box(vec![0u8; 1 << 16]);
            // SAFETY: raising a handled signal in our own process.
            unsafe { libc::raise(libc::SIGINT) };
            assert!(
                OWN_HANDLER_RAN.load(Ordering::SeqCst),
                "the program's handler runs at once, inside the signal"
            );
            let deadline = Instant::now() + highwater_testkit::child::WATCHDOG;
            let checkpoint = loop {
                if let Ok(profile) = Profile::load(&path) {
                    break profile;
                }
                assert!(Instant::now() < deadline, "no checkpoint was written");
                std::thread::sleep(Duration::from_millis(5));
            };
            assert!(checkpoint.summary.alloc_count > 0);
            assert!(
                session.is_recording(),
                "the session goes on after the signal"
            );
            let save = {
                let _save = highwater::profile!("checkpoint_save");
                black_box(vec![1u8; 50 << 20])
            };
            drop(save);
            let profile = session
                .finish()
                .expect("the program's own finish works after the signal");
            assert!(
                profile.summary.peak_bytes >= 50 << 20,
                "the save after the signal is the peak: {}",
                profile.summary.peak_bytes
            );
            let written = Profile::load(&path).unwrap();
            assert_eq!(written.summary.peak_bytes, profile.summary.peak_bytes);
            assert!(written.spans.iter().any(|s| s.name == "checkpoint_save"));
            assert_eq!(disposition(libc::SIGINT), own);
        },
    );
}

extern "C" fn later_handler(_: libc::c_int) {}

/// A handler the program installs while the session runs is the program's choice: finishing
/// the session leaves it in place instead of putting back the one from before.
#[test]
fn a_handler_installed_during_the_session_survives_finish() {
    highwater_testkit::child::isolated(
        "a_handler_installed_during_the_session_survives_finish",
        || {
            let session = Session::builder()
                .write_profile(false)
                .write_on_signal(true)
                .start()
                .unwrap();
            let later = later_handler as extern "C" fn(libc::c_int) as libc::sighandler_t;
            // SAFETY: `later_handler` does nothing.
            unsafe { libc::signal(libc::SIGINT, later) };
            session.finish().unwrap();
            assert_eq!(disposition(libc::SIGINT), later);
        },
    );
}
