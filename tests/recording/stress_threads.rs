//! Stress: many threads, short-lived threads, thread-exit destructors, threads that outlive the
//! session, and panics inside spans. Each test runs in its own child process under a watchdog
//! (see `highwater_testkit::child::isolated`): a deadlock fails the test instead of hanging CI.
//!
//! In every test the counts highwater reports are checked against counts kept by the inner
//! allocator, independently of the event stream (see `common`).

use std::hint::black_box;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Barrier};

use highwater::{Category, Profile, Session, Step};
use highwater_testkit::child::isolated;
use highwater_testkit::counting::{check_workers, gettid, ALLOC, FREE, REALLOC};

/// Alloc/free pairs per thread in the eight-thread test.
const PAIRS: usize = 1_000_000;
/// Pairs per `batch` span.
const BATCH: usize = 1_000;

/// Eight threads each make a million alloc/free pairs inside nested spans, into rings small
/// enough to overflow. Proves, per thread and per kind (alloc, free, realloc) and for span
/// entries + exits: recorded + dropped = performed, exact, over every operation of the thread's
/// life (each thread starts after the session and is joined before it finishes). Nothing is
/// lost without a ring here, so the unattributed count must be zero.
#[test]
fn eight_threads_a_million_alloc_free_pairs_each_with_spans() {
    isolated(
        "eight_threads_a_million_alloc_free_pairs_each_with_spans",
        || {
            let session = Session::builder()
                .ring_events(1 << 14)
                .write_profile(false)
                .start()
                .unwrap();
            let workers: Vec<_> = (0..8)
                .map(|worker| {
                    std::thread::spawn(move || {
                        let mut span_events = 0;
                        {
                            let _worker = highwater::profile!("worker", Step::Forward);
                            span_events += 2;
                            for batch in 0..PAIRS / BATCH {
                                let _batch = highwater::profile!("batch", Category::Activation);
                                span_events += 2;
                                for i in 0..BATCH {
                                    let block =
                                        Vec::<u8>::with_capacity(8 + (i + worker + batch) % 200);
                                    black_box(&block);
                                }
                            }
                        }
                        (gettid(), span_events)
                    })
                })
                .collect();
            let done: Vec<(u64, u64)> = workers.into_iter().map(|w| w.join().unwrap()).collect();
            let profile = session.finish().unwrap();
            let tids: Vec<u64> = done.iter().map(|(tid, _)| *tid).collect();
            check_workers(&profile, &tids, Some([0; 3]), Some(&done));
            assert_eq!(
                profile.capture.unattributed_dropped, 0,
                "no event should be lost without a ring: {:?}",
                profile.capture
            );
            for &tid in &tids {
                assert!(
                    highwater_testkit::counting::performed(&[tid])[ALLOC] >= PAIRS as u64,
                    "worker {tid} did not make its {PAIRS} allocations"
                );
            }
            println!(
                "dropped {:?} of {} events",
                profile.capture.dropped_by_kind, profile.summary.event_count
            );
        },
    );
}

/// Threads in the first wave, all alive at once: more than the 1024 rings of the table.
const WIDE: usize = 1_104;
/// Threads in all.
const SHORT_LIVED: usize = 2_000;

/// 2,000 short-lived threads: 1,104 alive at once (more than the ring table holds, so some find
/// it full and lose events without a ring), then 896 more, eight at a time, reusing the rings
/// the first wave handed back. Proves, summed over the 2,000 threads, per kind and for span
/// entries + exits: recorded + dropped + unattributed = performed, exact; per thread:
/// recorded + dropped ≤ performed; and that the table-full path really ran.
#[test]
fn two_thousand_short_lived_threads() {
    isolated("two_thousand_short_lived_threads", || {
        let session = Session::builder()
            .ring_events(1024)
            .write_profile(false)
            .start()
            .unwrap();
        let work = |i: usize| {
            let _span = highwater::profile!("short", Step::Forward);
            let block = vec![i as u8; 64 + i % 64];
            black_box(&block);
            let mut grown = Vec::<u32>::with_capacity(1);
            grown.extend(0..20);
            black_box(&grown);
        };
        let spawn = |body: Box<dyn FnOnce() + Send>| {
            std::thread::Builder::new()
                .stack_size(256 << 10)
                .spawn(move || {
                    body();
                    (gettid(), 2)
                })
                .expect("spawn a short-lived thread")
        };
        let barrier = Arc::new(Barrier::new(WIDE));
        let wide: Vec<_> = (0..WIDE)
            .map(|i| {
                let barrier = Arc::clone(&barrier);
                spawn(Box::new(move || {
                    work(i);
                    barrier.wait();
                    work(i + 1);
                }))
            })
            .collect();
        let mut done: Vec<(u64, u64)> = wide.into_iter().map(|t| t.join().unwrap()).collect();
        for wave in 0..(SHORT_LIVED - WIDE) / 8 {
            let threads: Vec<_> = (0..8)
                .map(|i| spawn(Box::new(move || work(wave * 8 + i))))
                .collect();
            done.extend(threads.into_iter().map(|t| t.join().unwrap()));
        }
        let profile = session.finish().unwrap();
        assert_eq!(done.len(), SHORT_LIVED);
        // Each of the first wave made two spans (one per `work`).
        for entry in done.iter_mut().take(WIDE) {
            entry.1 = 4;
        }
        let tids: Vec<u64> = done.iter().map(|(tid, _)| *tid).collect();
        check_workers(&profile, &tids, None, Some(&done));
        let (loose, _) = highwater_testkit::counting::unattributed(&profile);
        assert!(
            loose[ALLOC] > 0,
            "{WIDE} threads alive at once should have found the ring table full: {:?}",
            profile.capture.dropped_by_kind
        );
        assert!(
            profile.meta.threads > 1024,
            "rings handed back should have been reused by later threads: {} threads recorded",
            profile.meta.threads
        );
        assert!(profile.capture.threads.len() <= highwater::profile::MAX_THREAD_ROWS);
    });
}

/// A thread-local whose destructor allocates, frees and opens a span at thread exit.
struct AllocatesOnDrop;

impl Drop for AllocatesOnDrop {
    fn drop(&mut self) {
        let _span = highwater::profile!("tls_destructor", Category::Other);
        let numbers: Vec<u64> = (0..100).collect();
        black_box(format!("{numbers:?}"));
    }
}

thread_local! {
    static ALLOCATES_ON_DROP: AllocatesOnDrop = const { AllocatesOnDrop };
}

/// A pthread key destructor that allocates twice and frees twice. Its key is created after
/// highwater's, so it runs after the thread handed its ring back.
extern "C" fn key_destructor(_: *mut libc::c_void) {
    let block = vec![1u8; 256];
    black_box(&block);
    let boxed = Box::new(5u64);
    black_box(&boxed);
}

/// Threads whose Rust thread-local destructors allocate (and open spans) at exit, and whose
/// pthread-key destructor allocates after highwater handed the ring back. Proves, per thread and
/// per kind: recorded + dropped + 2 = performed for allocs and frees (the 2 being the key
/// destructor's, counted as unattributed drops), recorded + dropped = performed for reallocs and
/// span events; summed: recorded + dropped + unattributed = performed.
#[test]
fn allocations_inside_thread_local_destructors_at_thread_exit() {
    isolated(
        "allocations_inside_thread_local_destructors_at_thread_exit",
        || {
            let session = Session::builder().write_profile(false).start().unwrap();
            let mut key: libc::pthread_key_t = 0;
            // SAFETY: `key` is writable; the destructor has the right signature.
            let created = unsafe { libc::pthread_key_create(&mut key, Some(key_destructor)) };
            assert_eq!(created, 0, "pthread_key_create failed");
            let workers: Vec<_> = (0..16)
                .map(|i| {
                    std::thread::spawn(move || {
                        ALLOCATES_ON_DROP.with(|_| ());
                        // SAFETY: `key` is a live key; the value is never dereferenced.
                        unsafe {
                            libc::pthread_setspecific(key, std::ptr::dangling::<libc::c_void>())
                        };
                        let _span = highwater::profile!("body", Step::Forward);
                        black_box(vec![i as u8; 100]);
                        gettid()
                    })
                })
                .collect();
            let tids: Vec<u64> = workers.into_iter().map(|w| w.join().unwrap()).collect();
            let profile = session.finish().unwrap();
            let spans: Vec<(u64, u64)> = tids.iter().map(|&tid| (tid, 4)).collect();
            let mut after_retire = [0; 3];
            after_retire[ALLOC] = 2;
            after_retire[FREE] = 2;
            check_workers(&profile, &tids, Some(after_retire), Some(&spans));
            assert!(
                profile.spans.iter().any(|s| s.name == "tls_destructor"),
                "the thread-local destructors' spans are missing: {:?}",
                profile.spans
            );
        },
    );
}

/// Per kind, the counters of [`highwater_testkit::counting::Row`] summed over the rows of `tid`.
fn counters(
    tid: u64,
    pick: fn(&highwater_testkit::counting::Row) -> &[std::sync::atomic::AtomicU64; 3],
) -> [u64; 3] {
    let mut total = [0; 3];
    for row in highwater_testkit::counting::rows_of(tid) {
        for (kind, sum) in total.iter_mut().enumerate() {
            *sum += pick(row)[kind].load(Ordering::SeqCst);
        }
    }
    total
}

/// Checks `lower ≤ recorded + dropped ≤ upper` for `tid`, per kind.
fn check_between(profile: &Profile, tid: u64, lower: [u64; 3], upper: [u64; 3], what: &str) {
    let (recorded, dropped, _, _) = highwater_testkit::counting::recorded_and_dropped(profile, tid);
    for kind in [ALLOC, FREE, REALLOC] {
        let seen = recorded[kind] + dropped[kind];
        assert!(
            lower[kind] <= seen && seen <= upper[kind],
            "{what}: {} events of thread {tid}: recorded {} + dropped {} is outside [{}, {}]",
            highwater_testkit::counting::KIND_NAMES[kind],
            recorded[kind],
            dropped[kind],
            lower[kind],
            upper[kind]
        );
    }
}

/// Four threads keep allocating while the session finishes, and while a second session starts
/// and finishes. Which of the operations in flight at a boundary were recorded cannot be seen
/// from outside, so this proves a sandwich, per thread and per kind:
///
/// - first session: (operations completed before `finish` was called) ≤ recorded + dropped ≤
///   (operations started before `finish` returned);
/// - second session: (completed before its `finish` − started before its `start` returned) ≤
///   recorded + dropped ≤ (started before its `finish` returned − completed before its `start`
///   was called).
///
/// A lost event breaks the left side, a doubly counted one or one recorded outside the session
/// the right side. Also: nothing is lost without a ring, and neither finish hangs.
#[test]
fn threads_still_allocating_when_the_session_finishes() {
    isolated("threads_still_allocating_when_the_session_finishes", || {
        static STOP: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
        let started = |tid| counters(tid, |row| &row.started);
        let completed = |tid| counters(tid, |row| &row.completed);
        let sub = |a: [u64; 3], b: [u64; 3]| std::array::from_fn(|k| a[k].saturating_sub(b[k]));

        let session = Session::builder()
            .ring_events(1 << 12)
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
                        let _span = highwater::profile!("spin", Step::Forward);
                        let mut grown = Vec::with_capacity(4);
                        for i in 0..64 {
                            grown.push(vec![worker as u8; 16 + (round + i) % 100]);
                        }
                        black_box(&grown);
                        round += 1;
                    }
                })
            })
            .collect();
        drop(send);
        let tids: Vec<u64> = receive.iter().collect();
        std::thread::sleep(std::time::Duration::from_millis(100));

        let lower: Vec<_> = tids.iter().map(|&tid| completed(tid)).collect();
        let first = session.finish().unwrap();
        let upper: Vec<_> = tids.iter().map(|&tid| started(tid)).collect();
        for (i, &tid) in tids.iter().enumerate() {
            check_between(&first, tid, lower[i], upper[i], "first session");
            assert!(lower[i][ALLOC] > 0, "thread {tid} made no allocation");
        }

        let before_start: Vec<_> = tids.iter().map(|&tid| completed(tid)).collect();
        let session = Session::builder()
            .ring_events(1 << 12)
            .write_profile(false)
            .start()
            .unwrap();
        let after_start: Vec<_> = tids.iter().map(|&tid| started(tid)).collect();
        std::thread::sleep(std::time::Duration::from_millis(100));
        let before_finish: Vec<_> = tids.iter().map(|&tid| completed(tid)).collect();
        let second = session.finish().unwrap();
        let after_finish: Vec<_> = tids.iter().map(|&tid| started(tid)).collect();
        STOP.store(true, Ordering::Relaxed);
        for worker in workers {
            worker.join().unwrap();
        }
        for (i, &tid) in tids.iter().enumerate() {
            check_between(
                &second,
                tid,
                sub(before_finish[i], after_start[i]),
                sub(after_finish[i], before_start[i]),
                "second session",
            );
        }
        for profile in [&first, &second] {
            assert_eq!(
                profile.capture.unattributed_dropped, 0,
                "no worker lost its ring: {:?}",
                profile.capture
            );
        }
    });
}

/// Threads that panic inside nested spans, and a panic caught inside a span on the test thread.
/// Proves, per panicking thread and per kind and for span entries + exits: recorded + dropped =
/// performed, exact (the unwinding closes both spans, and the panic machinery's allocations are
/// recorded); and the test thread's span state is restored by unwinding: a span opened after the
/// caught panic is top-level, not a child of the span that panicked.
#[test]
fn a_panic_inside_a_span() {
    isolated("a_panic_inside_a_span", || {
        let session = Session::builder().write_profile(false).start().unwrap();
        let (send, receive) = std::sync::mpsc::channel();
        let workers: Vec<_> = (0..4)
            .map(|_| {
                let send = send.clone();
                std::thread::spawn(move || {
                    send.send(gettid()).unwrap();
                    let _step = highwater::profile!("train_step");
                    let _forward = highwater::profile!("forward", Step::Forward);
                    black_box(vec![0u8; 4096]);
                    panic!("deliberate panic inside a span");
                })
            })
            .collect();
        drop(send);
        for worker in workers {
            assert!(worker.join().is_err(), "the worker should have panicked");
        }
        let tids: Vec<u64> = receive.iter().collect();
        let caught = std::panic::catch_unwind(|| {
            let _outer = highwater::profile!("caught", Step::Backward);
            black_box(vec![1u8; 1024]);
            panic!("deliberate panic caught on the test thread");
        });
        assert!(caught.is_err());
        {
            let _after = highwater::profile!("after_the_panic", Step::Optimizer);
            black_box(vec![2u8; 2048]);
        }
        let profile = session.finish().unwrap();
        let spans: Vec<(u64, u64)> = tids.iter().map(|&tid| (tid, 4)).collect();
        check_workers(&profile, &tids, Some([0; 3]), Some(&spans));
        let forward = profile
            .spans
            .iter()
            .find(|s| profile.span_path(s.id) == "train_step/forward")
            .expect("the panicking span is in the profile");
        assert_eq!(forward.calls, 4, "each panicking thread entered it once");
        let after = profile
            .spans
            .iter()
            .find(|s| s.name == "after_the_panic")
            .expect("the span after the panic is in the profile");
        assert_eq!(
            (after.parent, profile.span_path(after.id).as_str()),
            (None, "after_the_panic"),
            "unwinding should have closed `caught`: {:?}",
            profile.spans
        );
    });
}

/// Regression: drops made before the collector thread first runs were absorbed into its
/// baseline of the rings' drop counters (read when the collector started, after the gate had
/// opened) and so were neither recorded nor counted. On one CPU with threads already allocating
/// when each session starts, the collector starts late every time. Proves, per thread and per
/// kind over twenty sessions: (completed before `finish` − started before `start` returned) ≤
/// recorded + dropped ≤ (started before `finish` returned − completed before `start` was called).
#[test]
fn drops_made_before_the_collector_first_runs_are_counted() {
    isolated(
        "drops_made_before_the_collector_first_runs_are_counted",
        || {
            static STOP: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
            // SAFETY: a zeroed cpu_set_t is valid; CPU_SET writes inside it; 0 = this process.
            unsafe {
                let mut one_cpu: libc::cpu_set_t = std::mem::zeroed();
                libc::CPU_SET(0, &mut one_cpu);
                let pinned =
                    libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &one_cpu);
                assert_eq!(pinned, 0, "sched_setaffinity failed");
            }
            let started = |tid| counters(tid, |row| &row.started);
            let completed = |tid| counters(tid, |row| &row.completed);
            let sub = |a: [u64; 3], b: [u64; 3]| std::array::from_fn(|k| a[k].saturating_sub(b[k]));
            let (send, receive) = std::sync::mpsc::channel();
            let workers: Vec<_> = (0..3)
                .map(|_| {
                    let send = send.clone();
                    std::thread::spawn(move || {
                        send.send(gettid()).unwrap();
                        drop(send);
                        while !STOP.load(Ordering::Relaxed) {
                            black_box(vec![0u8; 32]);
                        }
                    })
                })
                .collect();
            drop(send);
            let tids: Vec<u64> = receive.iter().collect();
            for round in 0..20 {
                let before_start: Vec<_> = tids.iter().map(|&tid| completed(tid)).collect();
                // Dropping, so the drops this regression is about happen.
                let session = Session::builder()
                    .ring_events(1024)
                    .capture_mode(highwater::CaptureMode::DropWhenFull)
                    .write_profile(false)
                    .start()
                    .unwrap();
                let after_start: Vec<_> = tids.iter().map(|&tid| started(tid)).collect();
                std::thread::sleep(std::time::Duration::from_millis(30));
                let before_finish: Vec<_> = tids.iter().map(|&tid| completed(tid)).collect();
                let profile = session.finish().unwrap();
                let after_finish: Vec<_> = tids.iter().map(|&tid| started(tid)).collect();
                for (i, &tid) in tids.iter().enumerate() {
                    check_between(
                        &profile,
                        tid,
                        sub(before_finish[i], after_start[i]),
                        sub(after_finish[i], before_start[i]),
                        &format!("session {round}"),
                    );
                }
            }
            STOP.store(true, Ordering::Relaxed);
            for worker in workers {
                worker.join().unwrap();
            }
        },
    );
}
