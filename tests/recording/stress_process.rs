//! Stress at the process level: `fork` in a recording process, and `process::exit` while other
//! threads allocate. Each test runs in its own child process under a watchdog (see
//! `highwater_testkit::child::run_child`): a deadlock fails the test instead of hanging CI.

use std::hint::black_box;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use highwater::{Profile, Session, Step};
use highwater_testkit::child::{is_child, isolated, run_child};
use highwater_testkit::counting::{check_workers, gettid, ALLOC, FREE, REALLOC};

/// Allocates a little inside a span: one round of a worker's loop.
fn work(round: usize) {
    let _span = highwater::profile!("work", Step::Forward);
    let mut grown = Vec::with_capacity(2);
    for i in 0..16 {
        grown.push(vec![round as u8; 16 + (round + i) % 200]);
    }
    black_box(&grown);
}

/// Waits for forked child `pid` for at most `limit`; kills it and fails on timeout.
fn wait_for_forked_child(pid: libc::pid_t, limit: Duration) -> libc::c_int {
    let started = Instant::now();
    loop {
        let mut status = 0;
        // SAFETY: `pid` is our child; `status` is writable.
        let waited = unsafe { libc::waitpid(pid, &mut status, libc::WNOHANG) };
        assert!(waited >= 0, "waitpid failed for forked child {pid}");
        if waited == pid {
            return status;
        }
        if started.elapsed() > limit {
            // SAFETY: `pid` is our child, not yet reaped.
            unsafe {
                libc::kill(pid, libc::SIGKILL);
                libc::waitpid(pid, &mut status, 0);
            }
            panic!("forked child {pid} hung for {limit:?} (deadlock after fork?) and was killed");
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// In a forked child: allocate, format, start and join a thread, then leave through `exit`
/// (running the `atexit` handlers, highwater's included) or `_exit`. Never returns.
fn forked_child(output: &std::path::Path, use_exit: bool) -> ! {
    let numbers: Vec<String> = (0..2_000).map(|i| i.to_string()).collect();
    black_box(&numbers);
    let joined = std::thread::spawn(|| black_box(vec![7u8; 4096]).len()).join();
    let code = match joined {
        Ok(4096) if !output.exists() => 0,
        Ok(_) => 3,
        Err(_) => 4,
    };
    if use_exit {
        std::process::exit(code);
    }
    // SAFETY: `_exit` ends the process at once; nothing after it runs.
    unsafe { libc::_exit(code) }
}

/// A thread forks six times while three others allocate inside spans. Each forked child
/// allocates, starts a thread and exits (three through `exit`, running highwater's `atexit`
/// handler, three through `_exit`); none may hang (watchdog per child) or write a profile.
/// Proves: every child exits 0; the parent's profile is written once, loads, equals the profile
/// `finish` returned; and per thread (workers and the forking thread) and per kind,
/// recorded + dropped = performed, exact, span entries + exits included.
#[test]
fn fork_in_a_recording_process() {
    isolated("fork_in_a_recording_process", || {
        static STOP: AtomicBool = AtomicBool::new(false);
        let dir = tempfile::tempdir().unwrap();
        let output = dir.path().join("fork.json");
        let session = Session::builder().output(&output).start().unwrap();
        let workers: Vec<_> = (0..3)
            .map(|_| {
                std::thread::spawn(|| {
                    let mut rounds = 0;
                    while !STOP.load(Ordering::Relaxed) {
                        work(rounds);
                        rounds += 1;
                    }
                    (gettid(), 2 * rounds as u64)
                })
            })
            .collect();
        let forker = {
            let output = output.clone();
            std::thread::spawn(move || {
                for fork in 0..6 {
                    work(fork);
                    // SAFETY: the child only allocates, spawns a thread and exits; see
                    // `forked_child`.
                    let pid = unsafe { libc::fork() };
                    assert!(pid >= 0, "fork failed");
                    if pid == 0 {
                        forked_child(&output, fork % 2 == 0);
                    }
                    let status = wait_for_forked_child(pid, Duration::from_secs(30));
                    assert!(
                        libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
                        "forked child {fork} did not exit cleanly (wait status {status:#x}; \
                         3 = it saw a profile file, 4 = its thread panicked)"
                    );
                    assert!(!output.exists(), "a forked child wrote the profile");
                }
                (gettid(), 12)
            })
        };
        let mut done = vec![forker.join().unwrap()];
        STOP.store(true, Ordering::Relaxed);
        done.extend(workers.into_iter().map(|w| w.join().unwrap()));
        let profile = session.finish().unwrap();
        let tids: Vec<u64> = done.iter().map(|(tid, _)| *tid).collect();
        check_workers(&profile, &tids, Some([0; 3]), Some(&done));
        let written = Profile::load(&output).expect("the parent's profile loads");
        assert_eq!(
            written, profile,
            "the written profile differs from `finish`'s"
        );
    });
}

/// Issue 35: a thread forks while three others allocate with every stack unwound by `.eh_frame`
/// (`HIGHWATER_UNWINDER=eh-frame`, every allocation sampled), so a fork often lands while
/// another thread holds an unwind cache, reads the tables, or the collector rebuilds them. Each
/// child starts its own session and records with the same unwinder on two threads: it must not
/// hang (watchdog), and every stack it walked is unwound by `.eh_frame`.
#[test]
fn fork_while_threads_unwind_by_eh_frame() {
    isolated("fork_while_threads_unwind_by_eh_frame", || {
        static STOP: AtomicBool = AtomicBool::new(false);
        std::env::set_var("HIGHWATER_UNWINDER", "eh-frame");
        let session = Session::builder()
            .write_profile(false)
            .sample_bytes(1)
            .start()
            .unwrap();
        let workers: Vec<_> = (0..3)
            .map(|_| {
                std::thread::spawn(|| {
                    let mut rounds = 0;
                    while !STOP.load(Ordering::Relaxed) {
                        work(rounds);
                        rounds += 1;
                    }
                })
            })
            .collect();
        for fork in 0..6 {
            work(fork);
            // SAFETY: the child only records a session of its own and exits; see below.
            let pid = unsafe { libc::fork() };
            assert!(pid >= 0, "fork failed");
            if pid == 0 {
                let code = std::panic::catch_unwind(|| {
                    let session = Session::builder()
                        .write_profile(false)
                        .sample_bytes(1)
                        .start()
                        .unwrap();
                    let helper = std::thread::spawn(|| (0..200).for_each(work));
                    (0..200).for_each(work);
                    helper.join().unwrap();
                    let profile = session.finish().unwrap();
                    // Every stack walked is unwound by eh-frame. (A child's session also drains
                    // what its parent's threads left in the rings it inherited, and a unit the
                    // parent's collector had half drained decodes as a sample with no stack:
                    // those are left out by asking for stacks.)
                    let walked: Vec<_> = profile
                        .sites
                        .iter()
                        .filter(|site| !site.frames.is_empty())
                        .collect();
                    let by_tables = walked
                        .iter()
                        .all(|site| site.samples_by_unwinder.keys().eq(["eh-frame"]));
                    if !walked.is_empty() && by_tables {
                        0
                    } else {
                        eprintln!("forked child {fork}: {:?}", profile.sampling);
                        5
                    }
                })
                .unwrap_or(4);
                // SAFETY: `_exit` ends the child at once; nothing after it runs.
                unsafe { libc::_exit(code) }
            }
            let status = wait_for_forked_child(pid, Duration::from_secs(30));
            assert!(
                libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
                "forked child {fork} did not exit cleanly (wait status {status:#x}; 4 = it \
                 panicked, 5 = its samples were not all unwound by eh-frame)"
            );
        }
        STOP.store(true, Ordering::Relaxed);
        for worker in workers {
            worker.join().unwrap();
        }
        let sampling = session.finish().unwrap().sampling;
        assert_eq!(
            sampling.samples_by_unwinder.get("eh-frame"),
            Some(&sampling.samples),
            "{sampling:?}"
        );
    });
}

/// Worker OS ids and, per worker and kind, operations completed just before `exit` was called.
static EXIT_TIDS: [AtomicU64; 4] = [const { AtomicU64::new(0) }; 4];
static EXIT_LOWER: [[AtomicU64; 3]; 4] = [const { [const { AtomicU64::new(0) }; 3] }; 4];

/// A fixed buffer for formatting without allocating.
struct Line {
    bytes: [u8; 256],
    len: usize,
}

impl std::fmt::Write for Line {
    fn write_str(&mut self, text: &str) -> std::fmt::Result {
        let end = self.len + text.len();
        let room = self.bytes.get_mut(self.len..end).ok_or(std::fmt::Error)?;
        room.copy_from_slice(text.as_bytes());
        self.len = end;
        Ok(())
    }
}

/// Runs at exit after highwater's handler (registered before the session, and `atexit`
/// handlers run last-registered first): prints, per worker and kind, the operations completed
/// before `exit` and those started by now, without allocating.
extern "C" fn report_bounds() {
    use std::fmt::Write;
    for (worker, tid) in EXIT_TIDS.iter().enumerate() {
        let tid = tid.load(Ordering::SeqCst);
        for kind in [ALLOC, FREE, REALLOC] {
            let started: u64 = highwater_testkit::counting::rows_of(tid)
                .map(|row| row.started[kind].load(Ordering::SeqCst))
                .sum();
            let lower = EXIT_LOWER[worker][kind].load(Ordering::SeqCst);
            let mut line = Line {
                bytes: [0; 256],
                len: 0,
            };
            let _ = writeln!(line, "bounds {tid} {kind} {lower} {started}");
            // SAFETY: writes `len` initialised bytes to stdout.
            unsafe { libc::write(1, line.bytes.as_ptr().cast(), line.len) };
        }
    }
}

/// The main thread calls `process::exit(7)` while four threads allocate inside spans. Proves:
/// the process exits with code 7 (no hang, no crash), the `atexit` path writes a profile that
/// loads, and per worker and per kind: (operations completed before `exit` was called) ≤
/// recorded + dropped ≤ (operations started by the time highwater's exit handler had finished),
/// the bounds reported by a non-allocating `atexit` handler that runs after highwater's.
#[test]
fn process_exit_while_other_threads_allocate() {
    let name = "process_exit_while_other_threads_allocate";
    if is_child(name) {
        // SAFETY: `report_bounds` does not unwind.
        unsafe { libc::atexit(report_bounds) };
        let output = std::env::var("HW_OUT").unwrap();
        let session = Session::builder().output(output).start().unwrap();
        for (worker, slot) in EXIT_TIDS.iter().enumerate() {
            std::thread::spawn(move || {
                slot.store(gettid(), Ordering::SeqCst);
                let mut round = worker;
                loop {
                    work(round);
                    round += 1;
                }
            });
        }
        let deadline = Instant::now() + Duration::from_secs(60);
        // Waits on the figure the parent checks, operations *completed*: one counted as
        // performed may still be inside the hook, and the bound read below would be one short.
        let completed_allocs = |tid: u64| -> u64 {
            highwater_testkit::counting::rows_of(tid)
                .map(|row| row.completed[ALLOC].load(Ordering::SeqCst))
                .sum()
        };
        while EXIT_TIDS.iter().any(|tid| {
            let tid = tid.load(Ordering::SeqCst);
            tid == 0 || completed_allocs(tid) < 2_000
        }) {
            assert!(Instant::now() < deadline, "workers did not get going");
            std::thread::sleep(Duration::from_millis(5));
        }
        for (worker, tid) in EXIT_TIDS.iter().enumerate() {
            for row in highwater_testkit::counting::rows_of(tid.load(Ordering::SeqCst)) {
                for kind in [ALLOC, FREE, REALLOC] {
                    EXIT_LOWER[worker][kind]
                        .fetch_add(row.completed[kind].load(Ordering::SeqCst), Ordering::SeqCst);
                }
            }
        }
        std::mem::forget(session);
        std::process::exit(7);
    }
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("exit.json");
    let output = run_child(
        name,
        &[("HW_OUT", path.to_str().unwrap())],
        highwater_testkit::child::WATCHDOG,
    );
    assert_eq!(
        output.status.code(),
        Some(7),
        "the child should exit with its own code:\n--- stdout\n{}\n--- stderr\n{}",
        output.stdout,
        output.stderr
    );
    let profile = Profile::load(&path).expect("the profile written at exit loads");
    let mut checked = 0;
    // The first line may follow libtest's "test … " prefix on the same line.
    for line in output
        .stdout
        .lines()
        .filter_map(|l| l.split("bounds ").nth(1))
    {
        let fields: Vec<u64> = line
            .split(' ')
            .map(|f| f.parse().expect("a number"))
            .collect();
        let [tid, kind, lower, upper] = fields[..] else {
            panic!("malformed bounds line {line:?}");
        };
        let (recorded, dropped, _, _) =
            highwater_testkit::counting::recorded_and_dropped(&profile, tid);
        let seen = recorded[kind as usize] + dropped[kind as usize];
        assert!(
            lower <= seen && seen <= upper,
            "{} events of thread {tid}: recorded + dropped {seen} is outside [{lower}, {upper}]",
            highwater_testkit::counting::KIND_NAMES[kind as usize]
        );
        if kind as usize == ALLOC {
            assert!(lower >= 2_000, "thread {tid} barely allocated: {line}");
        }
        checked += 1;
    }
    assert_eq!(
        checked, 12,
        "expected bounds for 4 workers x 3 kinds:\n{}",
        output.stdout
    );
    assert_eq!(
        profile.capture.unattributed_dropped, 0,
        "no worker lost its ring: {:?}",
        profile.capture
    );
}
