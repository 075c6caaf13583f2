//! Lossless capture: a thread whose ring is full waits for the collector, and the waiting never
//! deadlocks or loses what it decided to record — when the session stops while threads wait,
//! in a forked child, in thread-exit destructors, and when a signal handler allocates while the
//! interrupted code is inside a push (re-entry: counted, never written into the ring).
//!
//! Every test runs in its own child process under the watchdog of `highwater_testkit::child::isolated`, so a hang
//! fails the test instead of CI. Counts come from the counting harness, outside highwater.

// Tests drive the operating system directly; the library goes through its `sys` module.
#![allow(clippy::disallowed_methods)]

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::hint::black_box;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use highwater::{Alloc, CaptureMode, Session};
use highwater_testkit::child::isolated;
use highwater_testkit::counting::{gettid, Counting, Watched, ALLOC, FREE, KIND_NAMES, REALLOC};

/// The inner allocator: the system's, except inside this file's signal handler, which takes
/// blocks from a bump arena (the system allocator is not async-signal-safe: a handler that
/// interrupted `malloc` would deadlock in it). Arena blocks are never reused.
struct SignalSafe;

const ARENA_BYTES: usize = 256 << 20;
static ARENA: AtomicUsize = AtomicUsize::new(0);
static ARENA_USED: AtomicUsize = AtomicUsize::new(0);

thread_local! {
    /// Set while this thread runs the signal handler.
    static IN_HANDLER: Cell<bool> = const { Cell::new(false) };
}

fn arena() -> usize {
    let base = ARENA.load(Ordering::Acquire);
    if base != 0 {
        return base;
    }
    // SAFETY: an anonymous private mapping with no address hint; checked against MAP_FAILED.
    let mapped = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            ARENA_BYTES,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
            -1,
            0,
        )
    };
    assert_ne!(mapped, libc::MAP_FAILED, "mmap of the handler's arena");
    ARENA.store(mapped as usize, Ordering::Release);
    mapped as usize
}

fn in_arena(block: *mut u8) -> bool {
    let base = ARENA.load(Ordering::Acquire);
    base != 0 && (base..base + ARENA_BYTES).contains(&(block as usize))
}

// SAFETY: system blocks are the system allocator's, forwarded unchanged; arena blocks are
// distinct, aligned ranges of one mapping that lives for the whole process, never reused.
unsafe impl GlobalAlloc for SignalSafe {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if !IN_HANDLER.with(Cell::get) {
            // SAFETY: caller's contract.
            return unsafe { System.alloc(layout) };
        }
        let size = layout.size().next_multiple_of(layout.align().max(16)) + layout.align();
        let offset = ARENA_USED.fetch_add(size, Ordering::Relaxed);
        if offset + size > ARENA_BYTES {
            return std::ptr::null_mut();
        }
        let start = ARENA.load(Ordering::Acquire) + offset;
        start.next_multiple_of(layout.align()) as *mut u8
    }

    unsafe fn dealloc(&self, block: *mut u8, layout: Layout) {
        if !in_arena(block) {
            // SAFETY: a system block (caller's contract).
            unsafe { System.dealloc(block, layout) }
        }
    }

    unsafe fn realloc(&self, block: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        if !in_arena(block) && !IN_HANDLER.with(Cell::get) {
            // SAFETY: a system block (caller's contract).
            return unsafe { System.realloc(block, layout, new_size) };
        }
        // SAFETY: caller's contract; `new_size` with the old alignment is a valid layout.
        let moved =
            unsafe { self.alloc(Layout::from_size_align_unchecked(new_size, layout.align())) };
        if !moved.is_null() {
            // SAFETY: both blocks hold at least the smaller size; they do not overlap.
            unsafe {
                std::ptr::copy_nonoverlapping(block, moved, layout.size().min(new_size));
                self.dealloc(block, layout);
            }
        }
        moved
    }
}

#[global_allocator]
static GLOBAL: Watched<Alloc<Counting<SignalSafe>>> = Watched(Alloc::new(Counting(SignalSafe)));

/// Signals handled, and allocations the handler made.
static HANDLED: AtomicU64 = AtomicU64::new(0);

extern "C" fn allocate_in_handler(_: libc::c_int) {
    IN_HANDLER.with(|flag| flag.set(true));
    let boxed = black_box(Box::new([7u8; 40]));
    drop(boxed);
    let mut grown: Vec<u8> = black_box(Vec::with_capacity(8));
    grown.extend_from_slice(&[1; 8]);
    grown.reserve(64);
    drop(black_box(grown));
    IN_HANDLER.with(|flag| flag.set(false));
    HANDLED.fetch_add(1, Ordering::Relaxed);
    rearm();
}

/// The timer [`alarm_every`] created (a `timer_t`, which may be 0), and its interval in ns
/// (0 while no timer runs).
static TIMER: AtomicUsize = AtomicUsize::new(0);
static INTERVAL_NS: AtomicI64 = AtomicI64::new(0);

/// Sets SIGALRM's disposition and a timer that sends SIGALRM to the calling thread alone,
/// `micros` after this call and after each handler that calls [`rearm`] (`0`: deletes it).
///
/// Aimed at the thread, not the process: a process-wide timer's signal goes to any thread
/// that does not block it, and the test harness's main thread, which does not, took about
/// half of them, never inside a push; scheduled differently, it could take all of them.
/// Armed again by each handler rather than periodic: a handler that outlasts the interval (an
/// unwind in a debug build, a loaded machine) would otherwise leave the thread nothing but
/// handlers to run.
fn alarm_every(micros: i64, handler: libc::sighandler_t) {
    // SAFETY: a zeroed sigaction with a handler of the right signature (or SIG_IGN); the
    // timer is created for this live thread, and only the timer this function created is
    // deleted, after its signal is blocked or ignored by the callers.
    unsafe {
        let mut action: libc::sigaction = std::mem::zeroed();
        action.sa_sigaction = handler;
        action.sa_flags = libc::SA_RESTART;
        libc::sigemptyset(&mut action.sa_mask);
        assert_eq!(
            libc::sigaction(libc::SIGALRM, &action, std::ptr::null_mut()),
            0
        );
        if INTERVAL_NS.swap(0, Ordering::SeqCst) != 0 {
            let running = TIMER.load(Ordering::SeqCst) as libc::timer_t;
            assert_eq!(libc::timer_delete(running), 0);
        }
        if micros == 0 {
            return;
        }
        let mut event: libc::sigevent = std::mem::zeroed();
        event.sigev_notify = libc::SIGEV_THREAD_ID;
        event.sigev_signo = libc::SIGALRM;
        event.sigev_notify_thread_id = gettid() as libc::c_int;
        let mut timer: libc::timer_t = std::ptr::null_mut();
        assert_eq!(
            libc::timer_create(libc::CLOCK_MONOTONIC, &mut event, &mut timer),
            0,
            "timer_create: {}",
            std::io::Error::last_os_error()
        );
        TIMER.store(timer as usize, Ordering::SeqCst);
        INTERVAL_NS.store(micros * 1_000, Ordering::SeqCst);
    }
    rearm();
}

/// Arms [`alarm_every`]'s timer to fire once, its interval from now; called by the handlers as
/// they return (`timer_settime` is async-signal-safe).
fn rearm() {
    let interval = INTERVAL_NS.load(Ordering::SeqCst);
    if interval == 0 {
        return;
    }
    let timer = TIMER.load(Ordering::SeqCst);
    let once = libc::itimerspec {
        it_interval: libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        },
        it_value: libc::timespec {
            tv_sec: 0,
            tv_nsec: interval,
        },
    };
    // SAFETY: a timer `alarm_every` created and has not deleted (it deletes it only while the
    // signal is blocked on this thread, the only one it goes to); a valid interval.
    unsafe { libc::timer_settime(timer as libc::timer_t, 0, &once, std::ptr::null_mut()) };
}

/// Blocks or unblocks SIGALRM on the calling thread (threads it spawns inherit the mask).
/// Allocates, keeping one block in 256, while a timer fires `allocate_in_handler` every
/// `micros`: until the handler ran `handled` times and at least `min_rounds` rounds were made,
/// at most `max_rounds`. The timer is off and the kept blocks freed when it returns the rounds
/// made.
fn allocate_under_alarm(micros: i64, handled: u64, min_rounds: usize, max_rounds: usize) -> usize {
    alarm_every(
        micros,
        allocate_in_handler as *const () as libc::sighandler_t,
    );
    mask_alarm(false);
    let mut kept = Vec::new();
    let mut round = 0usize;
    while (HANDLED.load(Ordering::Relaxed) < handled || round < min_rounds) && round < max_rounds {
        let mut block = black_box(vec![round as u8; 16 + round % 48]);
        block.push(1);
        if round.is_multiple_of(256) {
            kept.push(block);
        }
        round += 1;
    }
    mask_alarm(true);
    alarm_every(0, libc::SIG_IGN);
    drop(kept);
    round
}

fn mask_alarm(block: bool) {
    // SAFETY: a valid signal set holding SIGALRM; pthread_sigmask only changes this thread.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGALRM);
        let how = if block {
            libc::SIG_BLOCK
        } else {
            libc::SIG_UNBLOCK
        };
        assert_eq!(libc::pthread_sigmask(how, &set, std::ptr::null_mut()), 0);
    }
}

/// Regression (issue 10): a handler that allocated while the interrupted code was inside a
/// push acted as a second producer on the thread's ring and lost events without counting them.
/// With a 20 µs SIGALRM whose handler allocates, reallocates and frees while the thread
/// allocates in a loop: recorded + counted = performed, exactly, per kind; some re-entries
/// happened and were counted as such; no ordering repair was needed (a corrupted ring would
/// show as lost, duplicated or garbled events).
#[test]
fn a_signal_handler_allocating_mid_push_is_counted_exactly() {
    isolated(
        "a_signal_handler_allocating_mid_push_is_counted_exactly",
        || {
            arena();
            let tid = gettid();
            black_box(vec![0u8; 1]); // this thread's counting row, before the session
                                     // Blocked until the loop: the collector, which inherits the mask, and the
                                     // harness's reading of the counters run without the handler.
            mask_alarm(true);
            let session = Session::builder().write_profile(false).start().unwrap();
            // What this thread performs between here and `finish` (which runs paused) is in the
            // session; the thread's counters also hold its whole life before.
            let before = highwater_testkit::counting::performed(&[tid]);
            allocate_under_alarm(20, 20_000, 0, 20_000_000);
            let after = highwater_testkit::counting::performed(&[tid]);
            let profile = session.finish().unwrap();

            let performed: [u64; 3] = std::array::from_fn(|kind| after[kind] - before[kind]);
            let (recorded, dropped, _, _) =
                highwater_testkit::counting::recorded_and_dropped(&profile, tid);
            let (loose, _) = highwater_testkit::counting::unattributed(&profile);
            let capture = &profile.capture;
            assert_eq!(capture.mode, CaptureMode::Lossless);
            assert_eq!(capture.unattributed_dropped, 0, "{capture:?}");
            assert_eq!(dropped, [0; 3], "a lossless ring dropped: {capture:?}");
            // Only re-entries are counted without a ring here.
            assert_eq!(
                loose.iter().sum::<u64>(),
                capture.reentrant_dropped,
                "{capture:?}"
            );
            for kind in [ALLOC, FREE, REALLOC] {
                assert_eq!(
                    recorded[kind] + loose[kind],
                    performed[kind],
                    "{} events: recorded {} + counted as re-entrant {} != performed {}",
                    KIND_NAMES[kind],
                    recorded[kind],
                    loose[kind],
                    performed[kind]
                );
            }
            assert!(
                capture.reentrant_dropped > 0,
                "{} signals and no re-entry: the test did not interrupt a push",
                HANDLED.load(Ordering::Relaxed)
            );
            assert_eq!(profile.summary.reorder_repairs, 0);
            assert_eq!(capture.late_events, 0, "{capture:?}");
            assert!(profile.summary.unknown_frees <= loose[ALLOC] + loose[REALLOC]);
            println!(
                "FIGURES {} signals, {} of {} records counted as re-entrant",
                HANDLED.load(Ordering::Relaxed),
                capture.reentrant_dropped,
                performed.iter().sum::<u64>()
            );
        },
    );
}

/// Issue 35: the same SIGALRM handler (every 100 µs), while every allocation's stack is unwound by
/// `.eh_frame` (`HIGHWATER_UNWINDER=eh-frame`, every allocation sampled): the handler's own
/// samples interrupt the thread's unwinds and unwind on top of them (another cache from the
/// pool, another reader of the same tables). Nothing hangs or is lost: recorded + counted =
/// performed, exactly, per kind, and every stack recorded says it was unwound by `.eh_frame`.
#[test]
fn a_signal_handler_allocating_mid_unwind_is_counted_exactly() {
    isolated(
        "a_signal_handler_allocating_mid_unwind_is_counted_exactly",
        || {
            arena();
            let tid = gettid();
            black_box(vec![0u8; 1]); // this thread's counting row, before the session
            std::env::set_var("HIGHWATER_UNWINDER", "eh-frame");
            mask_alarm(true);
            let session = Session::builder()
                .write_profile(false)
                .sample_bytes(1)
                .start()
                .unwrap();
            let before = highwater_testkit::counting::performed(&[tid]);
            // 100 µs after each handler: an unwind takes microseconds (tens in a debug build),
            // so a tighter timer would leave the loop little time between handlers.
            let round = allocate_under_alarm(100, 2_000, 20_000, 5_000_000);
            let after = highwater_testkit::counting::performed(&[tid]);
            let profile = session.finish().unwrap();

            let performed: [u64; 3] = std::array::from_fn(|kind| after[kind] - before[kind]);
            let (recorded, dropped, _, _) =
                highwater_testkit::counting::recorded_and_dropped(&profile, tid);
            let (loose, _) = highwater_testkit::counting::unattributed(&profile);
            let capture = &profile.capture;
            assert_eq!(capture.unattributed_dropped, 0, "{capture:?}");
            assert_eq!(dropped, [0; 3], "a lossless ring dropped: {capture:?}");
            for kind in [ALLOC, FREE, REALLOC] {
                assert_eq!(
                    recorded[kind] + loose[kind],
                    performed[kind],
                    "{} events: recorded {} + counted as re-entrant {} != performed {}",
                    KIND_NAMES[kind],
                    recorded[kind],
                    loose[kind],
                    performed[kind]
                );
            }
            let sampling = &profile.sampling;
            assert!(sampling.samples > 10_000, "{sampling:?}");
            assert_eq!(
                sampling.samples_by_unwinder.get("eh-frame"),
                Some(&sampling.samples),
                "{sampling:?}"
            );
            assert!(HANDLED.load(Ordering::Relaxed) >= 2_000, "{round} rounds");
            println!(
                "FIGURES {} signals over {} rounds, {} samples unwound by eh-frame",
                HANDLED.load(Ordering::Relaxed),
                round,
                sampling.samples
            );
        },
    );
}

/// A handler that only allocates and frees (no realloc), for the measurement test below.
extern "C" fn box_in_handler(_: libc::c_int) {
    IN_HANDLER.with(|flag| flag.set(true));
    drop(black_box(Box::new([7u8; 40])));
    drop(black_box(Box::new([9u8; 100])));
    IN_HANDLER.with(|flag| flag.set(false));
    HANDLED.fetch_add(1, Ordering::Relaxed);
    rearm();
}

/// The same re-entry inside `highwater::measure` (issue 15): an event that arrives while the
/// interrupted code is inside a meter update is not applied but counted in `missed_events`,
/// and every other one is applied. With a 20 µs SIGALRM whose handler allocates and frees
/// while a measured loop does the same (a window of 64 blocks, so frees go both to the latest
/// block and to the meter's table): applied allocations + frees of blocks born inside + frees
/// of other blocks + missed = what the counting harness saw the thread perform inside the
/// closure, exactly; some events were missed.
#[test]
fn a_signal_handler_allocating_mid_measurement_is_counted_as_missed() {
    isolated(
        "a_signal_handler_allocating_mid_measurement_is_counted_as_missed",
        || {
            arena();
            let tid = gettid();
            black_box(vec![0u8; 1]); // this thread's counting row
            mask_alarm(true);
            alarm_every(20, box_in_handler as *const () as libc::sighandler_t);
            let mut window: [Option<Box<[u8; 24]>>; 64] = std::array::from_fn(|_| None);
            let (performed, m) = highwater::measure(|| {
                // The signal is blocked while the harness's counters are read, so the handler
                // runs only between the two readings.
                let before = highwater_testkit::counting::performed(&[tid]);
                mask_alarm(false);
                let mut round = 0usize;
                while HANDLED.load(Ordering::Relaxed) < 20_000 && round < 50_000_000 {
                    window[round % 64] = Some(black_box(Box::new([round as u8; 24])));
                    round += 1;
                }
                mask_alarm(true);
                let after = highwater_testkit::counting::performed(&[tid]);
                let performed: [u64; 3] = std::array::from_fn(|kind| after[kind] - before[kind]);
                performed
            });
            alarm_every(0, libc::SIG_IGN);
            drop(window);

            assert_eq!(performed[REALLOC], 0, "the loop and handler do not realloc");
            assert_eq!(m.reallocations, 0, "{m:?}");
            assert_eq!(
                m.allocations + m.frees + m.untracked_frees + m.missed_events,
                performed[ALLOC] + performed[FREE],
                "applied {} allocs, {} frees of blocks born inside, {} of others, missed {}; \
                 performed {} allocs and {} frees",
                m.allocations,
                m.frees,
                m.untracked_frees,
                m.missed_events,
                performed[ALLOC],
                performed[FREE]
            );
            assert!(
                m.missed_events > 0,
                "{} signals and no re-entry: the test did not interrupt a meter update",
                HANDLED.load(Ordering::Relaxed)
            );
            assert!(m.allocations <= performed[ALLOC]);
            println!(
                "FIGURES {} signals, {} of {} events missed",
                HANDLED.load(Ordering::Relaxed),
                m.missed_events,
                performed[ALLOC] + performed[FREE]
            );
        },
    );
}

/// Counters of `tid`, summed over its rows.
fn counters(tid: u64, pick: fn(&highwater_testkit::counting::Row) -> &[AtomicU64; 3]) -> [u64; 3] {
    let mut total = [0; 3];
    for row in highwater_testkit::counting::rows_of(tid) {
        for (kind, sum) in total.iter_mut().enumerate() {
            *sum += pick(row)[kind].load(Ordering::SeqCst);
        }
    }
    total
}

/// Four threads allocate flat out into 1024-event rings, so they keep waiting for the
/// collector, and the session stops while they do. The stop ends, and loses nothing: every
/// operation completed before `finish` was called is recorded, none is dropped, and nothing is
/// recorded that was not started.
#[test]
fn stopping_while_producers_wait_ends_and_loses_nothing() {
    isolated(
        "stopping_while_producers_wait_ends_and_loses_nothing",
        || {
            static STOP: AtomicBool = AtomicBool::new(false);
            let session = Session::builder()
                .ring_events(1024)
                .write_profile(false)
                .start()
                .unwrap();
            let (send, receive) = std::sync::mpsc::channel();
            let workers: Vec<_> = (0..4)
                .map(|worker| {
                    let send = send.clone();
                    std::thread::spawn(move || {
                        send.send(gettid()).unwrap();
                        drop(send);
                        let mut round = 0usize;
                        while !STOP.load(Ordering::Relaxed) {
                            let mut block = black_box(vec![worker as u8; 8 + round % 64]);
                            block.reserve(round % 128);
                            round += 1;
                        }
                    })
                })
                .collect();
            drop(send);
            let tids: Vec<u64> = receive.iter().collect();
            std::thread::sleep(Duration::from_millis(100));
            let completed: Vec<_> = tids
                .iter()
                .map(|&t| counters(t, |r| &r.completed))
                .collect();
            let profile = session.finish().unwrap();
            let started: Vec<_> = tids.iter().map(|&t| counters(t, |r| &r.started)).collect();
            STOP.store(true, Ordering::Relaxed);
            for worker in workers {
                worker.join().unwrap();
            }
            assert!(
                profile.capture.producer_waits > 0,
                "four flat-out threads on 1024-event rings never waited: {:?}",
                profile.capture
            );
            assert_eq!(profile.summary.dropped_events, 0, "{:?}", profile.capture);
            for (i, &tid) in tids.iter().enumerate() {
                let (recorded, dropped, _, _) =
                    highwater_testkit::counting::recorded_and_dropped(&profile, tid);
                assert_eq!(dropped, [0; 3]);
                for kind in [ALLOC, FREE, REALLOC] {
                    assert!(
                        completed[i][kind] <= recorded[kind] && recorded[kind] <= started[i][kind],
                        "{} events of thread {tid}: recorded {} outside [{}, {}]",
                        KIND_NAMES[kind],
                        recorded[kind],
                        completed[i][kind],
                        started[i][kind]
                    );
                }
            }
        },
    );
}

/// A forked child of a process whose threads wait for room (1024-event rings) allocates far
/// more than a ring holds, from two threads, and exits 0 without hanging: no collector serves
/// it, so nothing in it waits.
#[test]
fn a_forked_child_never_waits_for_a_collector() {
    isolated("a_forked_child_never_waits_for_a_collector", || {
        static STOP: AtomicBool = AtomicBool::new(false);
        let session = Session::builder()
            .ring_events(1024)
            .write_profile(false)
            .start()
            .unwrap();
        let busy: Vec<_> = (0..2)
            .map(|_| {
                std::thread::spawn(|| {
                    while !STOP.load(Ordering::Relaxed) {
                        black_box(vec![0u8; 24]);
                    }
                })
            })
            .collect();
        for _ in 0..3 {
            for round in 0..5_000 {
                black_box(vec![0u8; 8 + round % 32]);
            }
            // SAFETY: the child only allocates, runs one thread and leaves with `_exit`.
            let pid = unsafe { libc::fork() };
            assert!(pid >= 0, "fork failed");
            if pid == 0 {
                let work = || {
                    for round in 0..50_000usize {
                        black_box(vec![1u8; 8 + round % 64]);
                    }
                };
                let helper = std::thread::spawn(work);
                work();
                let code = if helper.join().is_ok() { 0 } else { 4 };
                // SAFETY: ends the child without running the parent's exit handlers.
                unsafe { libc::_exit(code) };
            }
            let mut status = 0;
            let mut waited = Duration::ZERO;
            loop {
                // SAFETY: `pid` is our child; `status` is writable.
                let done = unsafe { libc::waitpid(pid, &mut status, libc::WNOHANG) };
                if done == pid {
                    break;
                }
                assert!(waited < Duration::from_secs(60), "the forked child hung");
                std::thread::sleep(Duration::from_millis(10));
                waited += Duration::from_millis(10);
            }
            assert!(
                libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
                "the forked child did not exit cleanly (wait status {status:#x})"
            );
        }
        STOP.store(true, Ordering::Relaxed);
        for thread in busy {
            thread.join().unwrap();
        }
        let profile = session.finish().unwrap();
        assert_eq!(profile.summary.dropped_events, 0, "{:?}", profile.capture);
    });
}

thread_local! {
    /// Allocates a burst far larger than a ring when its thread exits.
    static BURST_AT_EXIT: BurstAtExit = const { BurstAtExit };
}

struct BurstAtExit;

impl Drop for BurstAtExit {
    fn drop(&mut self) {
        for round in 0..20_000usize {
            black_box(vec![2u8; 8 + round % 64]);
        }
    }
}

/// Threads with 1024-event rings allocate twenty rings' worth in a thread-local destructor at
/// exit, while they still own their ring (std's destructors run before the ring is handed
/// back): they wait for room instead of dropping, every exit ends, and recorded +
/// unattributed (after the hand-back) = performed, exactly, with no ring-full drop.
#[test]
fn thread_exit_destructors_wait_and_end() {
    isolated("thread_exit_destructors_wait_and_end", || {
        let session = Session::builder()
            .ring_events(1024)
            .write_profile(false)
            .start()
            .unwrap();
        let workers: Vec<_> = (0..4)
            .map(|_| {
                std::thread::spawn(|| {
                    BURST_AT_EXIT.with(|_| {});
                    black_box(vec![0u8; 16]);
                    gettid()
                })
            })
            .collect();
        let tids: Vec<u64> = workers.into_iter().map(|w| w.join().unwrap()).collect();
        let profile = session.finish().unwrap();
        let dropped = highwater_testkit::counting::check_workers(&profile, &tids, None, None);
        let attributed: u64 = profile
            .capture
            .threads
            .iter()
            .map(|t| t.dropped_allocs + t.dropped_frees + t.dropped_reallocs)
            .sum();
        assert_eq!(attributed, 0, "{:?}", profile.capture);
        assert_eq!(dropped, profile.capture.unattributed_dropped);
        assert!(profile.capture.producer_waits > 0, "{:?}", profile.capture);
    });
}
