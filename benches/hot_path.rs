//! The cost of one 64-byte alloc + free pair through each allocator wrapper, on 1 and 2
//! threads, measured in one process so the figures compare as ratios.
//!
//! Contenders are called directly through `GlobalAlloc` (only one can be the global
//! allocator): the system allocator; highwater with no session (pure passthrough) and with a
//! session recording; `stats_alloc`'s counter-only wrapper; dhat's heap profiler.
//!
//! A recording session cannot analyse events as fast as a tight loop makes them (two events
//! per pair, tens of millions a second), so its rings fill and some events are dropped and
//! counted; the share dropped is printed with the results.
//!
//! ```text
//! cargo bench --bench hot_path
//! ```

// criterion_group! generates an undocumented function.
#![allow(missing_docs)]

use std::alloc::{GlobalAlloc, Layout, System};
use std::hint::black_box;
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion};

#[global_allocator]
static GLOBAL: highwater::Alloc = highwater::Alloc::system();

/// Another handle on highwater's hook (its state is global, so this behaves as `GLOBAL`).
static HIGHWATER: highwater::Alloc = highwater::Alloc::system();

const PAIR: Layout = match Layout::from_size_align(64, 8) {
    Ok(layout) => layout,
    Err(_) => panic!("64-byte layout"),
};

/// Times `iters` alloc + free pairs on each of `threads` threads started together; returns
/// the slowest thread's time, i.e. the wall time per pair per thread.
fn pairs<A: GlobalAlloc + Sync>(allocator: &'static A, threads: usize, iters: u64) -> Duration {
    let start = Arc::new(Barrier::new(threads));
    let workers: Vec<_> = (0..threads)
        .map(|_| {
            let start = start.clone();
            std::thread::spawn(move || {
                start.wait();
                let began = Instant::now();
                for _ in 0..iters {
                    // SAFETY: PAIR has a non-zero size; each block is freed with its layout.
                    unsafe {
                        let block = allocator.alloc(PAIR);
                        black_box(block);
                        allocator.dealloc(block, PAIR);
                    }
                }
                began.elapsed()
            })
        })
        .collect();
    workers
        .into_iter()
        .map(|worker| worker.join().unwrap())
        .max()
        .unwrap_or_default()
}

static STATS_ALLOC: stats_alloc::StatsAlloc<System> = stats_alloc::StatsAlloc::system();
static DHAT: dhat::Alloc = dhat::Alloc;

fn hot_path(c: &mut Criterion) {
    let mut group = c.benchmark_group("alloc_free_64B");
    group
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2))
        .sample_size(20);
    let cores = std::thread::available_parallelism().map_or(2, |n| n.get());
    let mut thread_counts = vec![1, 2, cores];
    thread_counts.dedup();

    for &threads in &thread_counts {
        group.bench_with_input(BenchmarkId::new("system", threads), &threads, |b, &t| {
            b.iter_custom(|iters| pairs(&System, t, iters))
        });
        group.bench_with_input(
            BenchmarkId::new("highwater_passthrough", threads),
            &threads,
            |b, &t| b.iter_custom(|iters| pairs(&HIGHWATER, t, iters)),
        );
        group.bench_with_input(
            BenchmarkId::new("stats_alloc", threads),
            &threads,
            |b, &t| b.iter_custom(|iters| pairs(&STATS_ALLOC, t, iters)),
        );

        let session = highwater::Session::builder()
            .write_profile(false)
            .start()
            .expect("start a highwater session");
        group.bench_with_input(
            BenchmarkId::new("highwater_recording", threads),
            &threads,
            |b, &t| b.iter_custom(|iters| pairs(&HIGHWATER, t, iters)),
        );
        let profile = session.finish().expect("finish the highwater session");
        let recorded = profile.summary.alloc_count + profile.summary.free_count;
        let dropped = profile.summary.dropped_events;
        println!(
            "highwater_recording/{threads}: {recorded} events recorded, {dropped} dropped ({:.1}% dropped)",
            100.0 * dropped as f64 / (recorded + dropped).max(1) as f64
        );

        let dhat_file = std::env::temp_dir().join("highwater-bench-dhat.json");
        let profiler = dhat::Profiler::builder().file_name(&dhat_file).build();
        group.bench_with_input(BenchmarkId::new("dhat", threads), &threads, |b, &t| {
            b.iter_custom(|iters| pairs(&DHAT, t, iters))
        });
        drop(profiler);
        let _ = std::fs::remove_file(dhat_file);
    }
    group.finish();
}

criterion_group!(benches, hot_path);
criterion_main!(benches);
