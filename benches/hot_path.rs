//! The cost of one 64-byte alloc + free pair through each allocator wrapper, on 1 and 2
//! threads, measured in one process so the figures compare as ratios.
//!
//! Contenders are called directly through `GlobalAlloc` (only one can be the global
//! allocator): the system allocator; highwater with no session (pure passthrough) and with a
//! session recording; `stats_alloc`'s counter-only wrapper; `tracking-allocator` with a
//! counting tracker; dhat's heap profiler.
//!
//! `tracking-allocator` needs no `#[global_allocator]` slot to work: it prefixes each block with
//! an 8-byte group header it allocates from its inner allocator and reads back on free, so a
//! block it hands out is only ever freed through it. Its tracker here does what the crate's
//! docs suggest for counting: two relaxed atomic adds per event (count and bytes), with the
//! allocation group left at the root.
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
use std::sync::atomic::{AtomicU64, Ordering};
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
static TRACKING: tracking_allocator::Allocator<System> = tracking_allocator::Allocator::system();

/// A `tracking-allocator` tracker that only counts, as its documentation suggests for
/// allocation frequency: events and live bytes, relaxed.
#[derive(Debug, Default)]
struct CountingTracker {
    events: AtomicU64,
    live_bytes: AtomicU64,
}

impl tracking_allocator::AllocationTracker for CountingTracker {
    fn allocated(
        &self,
        _addr: usize,
        object_size: usize,
        _wrapped_size: usize,
        _group_id: tracking_allocator::AllocationGroupId,
    ) {
        self.events.fetch_add(1, Ordering::Relaxed);
        self.live_bytes
            .fetch_add(object_size as u64, Ordering::Relaxed);
    }

    fn deallocated(
        &self,
        _addr: usize,
        object_size: usize,
        _wrapped_size: usize,
        _source_group_id: tracking_allocator::AllocationGroupId,
        _current_group_id: tracking_allocator::AllocationGroupId,
    ) {
        self.events.fetch_add(1, Ordering::Relaxed);
        self.live_bytes
            .fetch_sub(object_size as u64, Ordering::Relaxed);
    }
}

fn hot_path(c: &mut Criterion) {
    let mut group = c.benchmark_group("alloc_free_64B");
    group
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2))
        .sample_size(20);
    let cores = std::thread::available_parallelism().map_or(2, |n| n.get());
    let mut thread_counts = vec![1, 2, cores];
    thread_counts.dedup();

    tracking_allocator::AllocationRegistry::set_global_tracker(CountingTracker::default())
        .expect("no other tracking-allocator tracker is set in this process");
    tracking_allocator::AllocationRegistry::enable_tracking();

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
        group.bench_with_input(
            BenchmarkId::new("tracking_allocator", threads),
            &threads,
            |b, &t| b.iter_custom(|iters| pairs(&TRACKING, t, iters)),
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
