//! `highwater::measure` on workloads whose figures are known by construction: what counts as
//! born inside, what frees of older blocks and frees by other threads do, spawned threads,
//! spans, nesting, budgets and their failure messages, leaks across iterations, and that the
//! answer is the same on every run and with other threads measuring or allocating at once.

use std::collections::HashMap;
use std::hint::black_box;
use std::panic::{catch_unwind, AssertUnwindSafe};

use highwater::{Budget, Category, LeakCheck, Measurement, SpanFigures};

#[global_allocator]
static ALLOC: highwater::Alloc = highwater::Alloc::system();

fn span<'a>(m: &'a Measurement, path: &str) -> &'a SpanFigures {
    m.spans
        .iter()
        .find(|row| row.path == path)
        .unwrap_or_else(|| panic!("no span {path:?} in {:#?}", m.spans))
}

#[test]
fn a_scratch_vector_is_its_peak_and_leaves_nothing() {
    let (sum, m) = highwater::measure(|| {
        let scratch = black_box(vec![1u64; 1000]);
        scratch.iter().sum::<u64>()
    });
    assert_eq!(sum, 1000);
    assert_eq!(m.peak_bytes, 8000);
    assert_eq!(m.allocated_bytes, 8000);
    assert_eq!(m.allocations, 1);
    assert_eq!(m.frees, 1);
    assert_eq!((m.leaked_bytes, m.leaked_blocks), (0, 0));
    assert_eq!(m.net_bytes, 0);
    assert!(m.is_complete());
}

#[test]
fn a_returned_value_is_leaked_by_the_closure() {
    let (kept, m) = highwater::measure(|| black_box(vec![0u8; 4096]));
    assert_eq!((m.leaked_bytes, m.leaked_blocks), (4096, 1));
    assert_eq!(m.peak_bytes, 4096);
    drop(kept);
}

#[test]
fn the_peak_is_the_most_live_at_once_not_the_sum() {
    let ((), m) = highwater::measure(|| {
        for size in [1000usize, 3000, 2000] {
            drop(black_box(vec![0u8; size]));
        }
        let a = black_box(vec![0u8; 500]);
        let b = black_box(vec![0u8; 700]);
        drop((a, b));
    });
    assert_eq!(m.peak_bytes, 3000);
    assert_eq!(m.allocated_bytes, 7200);
    assert_eq!(m.allocations, 5);
    assert_eq!(m.leaked_bytes, 0);
}

#[test]
fn a_realloc_counts_its_growth_and_its_new_size_live() {
    let (v, m) = highwater::measure(|| {
        let mut v: Vec<u8> = Vec::with_capacity(100);
        v.reserve_exact(300);
        black_box(v)
    });
    assert_eq!(v.capacity(), 300);
    assert_eq!(m.allocations, 1);
    assert_eq!(m.reallocations, 1);
    assert_eq!(m.allocated_bytes, 300, "100 allocated, then 200 of growth");
    assert_eq!(m.peak_bytes, 300);
    assert_eq!((m.leaked_bytes, m.leaked_blocks), (300, 1));
}

#[test]
fn freeing_an_older_block_lowers_nothing_but_the_net() {
    let older = black_box(vec![0u8; 10_000]);
    let ((), m) = highwater::measure(|| {
        drop(older);
        drop(black_box(vec![0u8; 64]));
    });
    assert_eq!(m.peak_bytes, 64);
    assert_eq!(m.leaked_bytes, 0);
    assert_eq!(m.untracked_frees, 1);
    assert_eq!(m.frees, 1);
    assert_eq!(m.net_bytes, -10_000);
}

#[test]
fn growing_an_older_vector_counts_the_new_block_whole() {
    let mut older: Vec<u8> = black_box(Vec::with_capacity(100));
    let ((), m) = highwater::measure(|| older.reserve_exact(1000));
    assert_eq!(m.reallocations, 1);
    assert_eq!(m.untracked_frees, 1, "the old block was not born inside");
    assert_eq!(m.allocated_bytes, 1000);
    assert_eq!(m.leaked_bytes, 1000);
    assert_eq!(m.net_bytes, 900);
}

#[test]
fn a_block_freed_by_another_thread_stays_counted_as_leaked() {
    use std::sync::atomic::{AtomicUsize, Ordering};
    // A thread started before the measurement frees what it is handed; the hand-over is one
    // atomic word, so nothing else is allocated or freed on either side.
    static HANDED: AtomicUsize = AtomicUsize::new(0);
    static DONE: AtomicUsize = AtomicUsize::new(0);
    let freer = std::thread::spawn(|| {
        let block = loop {
            match HANDED.swap(0, Ordering::AcqRel) {
                0 => std::thread::yield_now(),
                block => break block,
            }
        };
        // SAFETY: the test handed over a `Box<[u8; 2048]>` made with `Box::into_raw`.
        drop(unsafe { Box::from_raw(block as *mut [u8; 2048]) });
        DONE.store(1, Ordering::Release);
    });
    let ((), m) = highwater::measure(|| {
        let block = Box::into_raw(black_box(Box::new([7u8; 2048])));
        HANDED.store(block as usize, Ordering::Release);
        while DONE.load(Ordering::Acquire) == 0 {
            std::thread::yield_now();
        }
    });
    freer.join().unwrap();
    assert_eq!(m.allocations, 1);
    assert_eq!(m.frees, 0);
    assert_eq!(
        (m.leaked_bytes, m.leaked_blocks),
        (2048, 1),
        "the free was not seen"
    );
    assert_eq!(m.net_bytes, 2048);
}

#[test]
fn threads_the_closure_spawns_are_not_measured() {
    let ((), m) = highwater::measure(|| {
        let handed_back = std::thread::scope(|scope| {
            scope
                .spawn(|| {
                    drop(black_box(vec![0u8; 1 << 20]));
                    black_box(vec![0u8; 1 << 19]) // made there, freed here
                })
                .join()
                .unwrap()
        });
        drop(handed_back);
    });
    // The calling thread allocated only the thread's bookkeeping, nothing near 1 MiB.
    assert!(m.allocated_bytes < 64 * 1024, "{m:#?}");
    assert!(m.peak_bytes < 64 * 1024, "{m:#?}");
    // The block the thread handed back is an older block to this measurement: its free is
    // untracked and lowers only the net.
    assert!(m.untracked_frees >= 1, "{m:#?}");
    assert!(m.net_bytes < -(1 << 19) + 64 * 1024, "{m:#?}");
    // Whichever thread drops the last reference to std's shared thread bookkeeping frees it;
    // when that is the spawned thread, this measurement never sees the free. So a closure that
    // spawns may show a few dozen bytes "leaked" (64 in 2 blocks here, usually), and the figure
    // is not guaranteed to be the same on every run.
    assert!(m.leaked_bytes < 1024, "{m:#?}");
    // Measuring inside the thread sees its work.
    let inner = std::thread::spawn(|| highwater::measure(|| drop(black_box(vec![0u8; 1 << 20]))).1)
        .join()
        .unwrap();
    assert_eq!(inner.peak_bytes, 1 << 20);
}

#[test]
fn spans_split_the_figures_and_say_what_was_live_at_the_peak() {
    let (kept, m) = highwater::measure(|| {
        let a = {
            let _a = highwater::profile!("load", Category::Parameter);
            black_box(vec![0u8; 1000])
        };
        {
            let _fwd = highwater::profile!("forward", highwater::Step::Forward);
            let _inner = highwater::profile!("matmul");
            drop(black_box(vec![0u8; 5000]));
        }
        let c = {
            let _c = highwater::profile!("cache");
            black_box(vec![0u8; 3000])
        };
        let d = black_box(vec![0u8; 10]);
        (a, c, d)
    });
    assert_eq!(m.peak_bytes, 6000);
    assert_eq!(m.leaked_bytes, 4010);
    let load = span(&m, "load");
    assert_eq!(
        (
            load.live_at_peak_bytes,
            load.leaked_bytes,
            load.allocated_bytes
        ),
        (1000, 1000, 1000)
    );
    let matmul = span(&m, "forward/matmul");
    assert_eq!((matmul.live_at_peak_bytes, matmul.leaked_bytes), (5000, 0));
    let cache = span(&m, "cache");
    assert_eq!((cache.live_at_peak_bytes, cache.leaked_bytes), (0, 3000));
    let root = span(&m, "");
    assert_eq!((root.live_at_peak_bytes, root.leaked_bytes), (0, 10));
    assert_eq!(
        m.spans[0].path, "forward/matmul",
        "largest at the peak first"
    );
    let at_peak: u64 = m.spans.iter().map(|row| row.live_at_peak_bytes).sum();
    assert_eq!(at_peak, m.peak_bytes);
    drop(kept);
}

#[test]
fn what_came_before_the_first_span_stays_outside_every_span() {
    // The meter keeps no per-span figures until a span opens inside; the root's figures up to
    // then (its peak included) must carry over unchanged.
    let (kept, m) = highwater::measure(|| {
        let early = black_box(vec![0u8; 1000]);
        drop(black_box(vec![0u8; 2000])); // the peak, 3000, all outside any span
        let late = {
            let _s = highwater::profile!("late");
            black_box(vec![0u8; 500])
        };
        drop(black_box(vec![0u8; 100]));
        (early, late)
    });
    assert_eq!(m.peak_bytes, 3000);
    let root = span(&m, "");
    assert_eq!(
        (
            root.allocations,
            root.allocated_bytes,
            root.live_at_peak_bytes,
            root.leaked_bytes
        ),
        (3, 3100, 3000, 1000)
    );
    let late = span(&m, "late");
    assert_eq!(
        (late.allocations, late.live_at_peak_bytes, late.leaked_bytes),
        (1, 0, 500)
    );
    assert_eq!((m.leaked_bytes, m.leaked_blocks), (1500, 2));
    drop(kept);
}

#[test]
fn a_span_opened_before_the_measurement_is_not_a_path_inside_it() {
    let _outer = highwater::profile!("outer");
    let ((), m) = highwater::measure(|| drop(black_box(vec![0u8; 100])));
    assert_eq!(m.spans.len(), 1);
    assert_eq!(m.spans[0].path, "");
}

#[test]
fn a_nested_measurement_is_counted_by_both() {
    let ((inner, kept), outer) = highwater::measure(|| {
        let before = black_box(vec![0u8; 100]);
        let ((), inner) = highwater::measure(|| drop(black_box(vec![0u8; 400])));
        drop(before);
        (inner, black_box(vec![0u8; 50]))
    });
    assert_eq!(inner.peak_bytes, 400);
    assert_eq!(inner.allocations, 1);
    assert_eq!(outer.peak_bytes, 500);
    assert_eq!(outer.leaked_bytes, 50);
    // The inner result's spans vector was built unmeasured, so only the three blocks count.
    assert_eq!(outer.allocations, 3);
    drop(kept);
}

#[test]
fn a_panicking_closure_leaves_the_thread_unmeasured() {
    let result = catch_unwind(AssertUnwindSafe(|| {
        highwater::measure(|| {
            let _held = black_box(vec![0u8; 100]);
            panic!("inside the closure");
        })
    }));
    assert!(result.is_err());
    let ((), m) = highwater::measure(|| drop(black_box(vec![0u8; 32])));
    assert_eq!(m.peak_bytes, 32);
    assert_eq!(m.allocations, 1);
}

/// Allocations, reallocs and frees in several spans, with a cache that keeps some.
fn mixed_work() -> usize {
    let mut cache: HashMap<u64, Vec<u8>> = HashMap::new();
    let mut total = 0;
    for i in 0..300u64 {
        let _step = highwater::profile!("step");
        let mut v = {
            let _fwd = highwater::profile!("forward", highwater::Step::Forward);
            black_box(vec![0u8; 16 + (i as usize * 37) % 500])
        };
        v.extend_from_slice(&[1, 2, 3]);
        if i % 7 == 0 {
            let _c = highwater::profile!("cache");
            cache.insert(i, v.clone());
        }
        total += v.len();
    }
    total + cache.len()
}

#[test]
fn two_hundred_runs_give_one_answer() {
    let (_, first) = highwater::measure(mixed_work);
    assert!(first.allocations > 300 && first.reallocations > 0);
    for run in 1..200 {
        let (_, again) = highwater::measure(mixed_work);
        assert_eq!(again, first, "run {run} differs");
    }
}

#[test]
fn threads_measuring_at_once_do_not_disturb_each_other() {
    let (_, alone) = highwater::measure(mixed_work);
    let stop = std::sync::atomic::AtomicBool::new(false);
    std::thread::scope(|scope| {
        // A thread that allocates all the time and never measures.
        scope.spawn(|| {
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                drop(black_box(vec![0u8; 4096]));
            }
        });
        let measurers: Vec<_> = (0..4)
            .map(|_| {
                scope.spawn(|| {
                    (0..20)
                        .map(|_| highwater::measure(mixed_work).1)
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        let measured: Vec<_> = measurers.into_iter().map(|m| m.join()).collect();
        // Stop the allocating thread before any assertion, or a failure would leave the scope
        // waiting for it for ever.
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        for m in measured.into_iter().flat_map(|m| m.unwrap()) {
            assert_eq!(m, alone);
        }
    });
}

#[test]
fn a_broken_peak_budget_names_the_figure_the_budget_and_the_span() {
    let ((), m) = highwater::measure(|| {
        let _fwd = highwater::profile!("forward");
        drop(black_box(vec![0u8; 3 << 20]));
    });
    let message = catch_unwind(|| highwater::assert_peak_below!(m, 2 << 20))
        .unwrap_err()
        .downcast::<String>()
        .unwrap();
    assert!(
        message.starts_with(
            "memory budget exceeded:\n  peak 3.0 MiB (3145728 bytes) > budget 2.0 MiB \
             (2097152 bytes) (over by 1.0 MiB (1048576 bytes))\nlargest contributors by span \
             (live at the peak):\n       3.0 MiB  forward (1 allocations)\n"
        ),
        "{message}"
    );
    highwater::assert_peak_below!(m, 3 << 20);
    highwater::assert_no_leak!(m);
}

#[test]
fn a_leak_budget_points_at_the_span_that_kept_the_bytes() {
    let (kept, m) = highwater::measure(|| {
        let _s = highwater::profile!("registry");
        black_box(vec![0u8; 24])
    });
    let error = Budget::new().max_leaked_bytes(0).check(&m).unwrap_err();
    let message = error.to_string();
    assert!(message.contains("  leaked 24 bytes > budget 0 bytes (over by 24 bytes)\n"));
    assert!(message.contains("(still live at the end):\n          24 B  registry"));
    assert_eq!(error.measurement(), &m);
    drop(kept);
}

#[test]
fn one_small_allocation_kept_per_iteration_is_caught() {
    let mut kept: Vec<Box<[u8; 16]>> = Vec::with_capacity(100);
    let report = LeakCheck::new().warmups(3).iterations(20).run(|| {
        let _s = highwater::profile!("remember");
        kept.push(Box::new([0; 16]));
    });
    assert_eq!(report.growth_bytes, 20 * 16);
    assert_eq!(report.growth_per_iteration(), 16.0);
    assert_eq!(
        report.net_after,
        (1..=20).map(|i| i * 16).collect::<Vec<i64>>()
    );
    let message = report.check().unwrap_err().to_string();
    assert!(
        message.starts_with(
            "memory grew across iterations: 16.0 bytes per iteration > budget 0 bytes per \
             iteration (320 bytes over 20 iterations after 3 warm-ups)\n"
        ),
        "{message}"
    );
    assert!(
        message.contains("still live):\n         320 B  remember (20 allocations)"),
        "{message}"
    );
    // The same growth fits an allowance of 16 bytes per iteration.
    let within = LeakCheck::new().iterations(5).max_growth_per_iteration(16);
    assert!(within.run(|| kept.push(Box::new([0; 16]))).check().is_ok());
}

#[test]
fn a_steady_loop_whose_cache_fills_during_warm_up_passes() {
    // A bounded cache: filled during the warm-ups, then every new entry replaces the oldest
    // (allocating the new one, freeing one made during the warm-ups).
    const CAPACITY: usize = 32;
    fn work(cache: &mut std::collections::VecDeque<Vec<u8>>, step: &mut usize) -> usize {
        *step += 1;
        let scratch = black_box(vec![0u8; 256 + *step % 64]);
        if cache.len() == CAPACITY {
            cache.pop_front();
        }
        cache.push_back(vec![*step as u8; 100]);
        scratch.len()
    }
    let mut cache = std::collections::VecDeque::with_capacity(CAPACITY);
    let mut step = 0usize;
    let report = LeakCheck::new()
        .warmups(CAPACITY)
        .iterations(50)
        .assert(|| work(&mut cache, &mut step));
    assert_eq!(report.growth_bytes, 0);
    assert!(report.net_after.iter().all(|&net| net == 0));
    // Its measured blocks still live are the cache entries made in the measured iterations:
    // a leak by `leaked_bytes`, which is why the check watches the net instead.
    assert_eq!(report.measurement.leaked_bytes, 32 * 100);
    // Without the warm-ups the cache fills while measured, and that is growth.
    let mut cold_cache = std::collections::VecDeque::new();
    let cold = LeakCheck::new()
        .warmups(0)
        .iterations(10)
        .run(|| work(&mut cold_cache, &mut step));
    assert!(cold.check().is_err());
}

/// A block born inside is freed unseen by another thread, which gets the same address back for
/// a block of another size (one malloc size class) and hands it over; the measuring thread's
/// free of it then matches the first block's entry with a foreign size. Regression: the live
/// bytes wrapped below zero there and the next allocation's addition overflowed, a panic inside
/// the allocator in a debug build. The figures stay what they were; the peak is the two blocks
/// live together.
#[test]
fn a_free_with_another_size_at_a_reused_address_does_not_panic() {
    use std::sync::atomic::{AtomicUsize, Ordering};
    static HANDED: AtomicUsize = AtomicUsize::new(0);
    static BACK: AtomicUsize = AtomicUsize::new(0);
    fn wait_for(slot: &AtomicUsize) -> usize {
        loop {
            match slot.swap(0, Ordering::AcqRel) {
                0 => std::thread::yield_now(),
                value => return value,
            }
        }
    }
    let other = std::thread::spawn(|| {
        let block = wait_for(&HANDED);
        // SAFETY: the measuring thread's `Box<[u8; 64]>`, made by `Box::into_raw`.
        drop(unsafe { Box::from_raw(block as *mut [u8; 64]) });
        let mut reused = std::mem::ManuallyDrop::new(Vec::<u8>::with_capacity(72));
        BACK.store(reused.as_mut_ptr() as usize, Ordering::Release);
    });
    let (reused_address, m) = highwater::measure(|| {
        let first = Box::into_raw(black_box(Box::new([1u8; 64])));
        let recent = black_box(Box::new([2u8; 24])); // `first` moves into the meter's table
        HANDED.store(first as usize, Ordering::Release);
        let back = wait_for(&BACK);
        // SAFETY: the other thread's `Vec<u8>` of capacity 72, never dropped there.
        drop(unsafe { Vec::from_raw_parts(back as *mut u8, 0, 72) });
        drop(black_box(Box::new([3u8; 8])));
        drop(recent);
        back == first as usize
    });
    other.join().unwrap();
    assert!(
        reused_address,
        "the allocator did not hand the address back: {m:?}"
    );
    assert_eq!(m.peak_bytes, 64 + 24, "{m:?}");
    assert_eq!(m.allocations, 3, "{m:?}");
}
