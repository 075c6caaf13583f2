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
//! A second pass after criterion's runs the same contenders in short interleaved batches and
//! reports the fastest and median batch of each: on a shared machine criterion measures each
//! contender during a different few seconds of other people's load, which the ratios then
//! inherit; taking turns spreads that load evenly (see `interleaved`).
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

use criterion::{criterion_group, BenchmarkId, Criterion};

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

/// 1, 2 and all cores (without repeats).
fn thread_counts() -> Vec<usize> {
    let cores = std::thread::available_parallelism().map_or(2, |n| n.get());
    let mut counts = vec![1, 2, cores];
    counts.sort_unstable();
    counts.dedup();
    counts
}

fn hot_path(c: &mut Criterion) {
    let mut group = c.benchmark_group("alloc_free_64B");
    group
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2))
        .sample_size(20);
    for threads in thread_counts() {
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

/// The contenders of the interleaved pass, named as in the criterion group.
const CONTENDERS: [&str; 6] = [
    "system",
    "highwater_passthrough",
    "stats_alloc",
    "tracking_allocator",
    "highwater_recording",
    "dhat",
];

/// One batch of `iters` pairs on `threads` threads through contender `index`, with the session
/// or profiler it needs running only around the batch. Returns the wall time per thread and,
/// for highwater recording, (events recorded, events dropped).
fn batch(index: usize, threads: usize, iters: u64) -> (Duration, Option<(u64, u64)>) {
    match CONTENDERS[index] {
        "system" => (pairs(&System, threads, iters), None),
        "highwater_passthrough" => (pairs(&HIGHWATER, threads, iters), None),
        "stats_alloc" => (pairs(&STATS_ALLOC, threads, iters), None),
        "tracking_allocator" => (pairs(&TRACKING, threads, iters), None),
        "highwater_recording" => {
            let session = highwater::Session::builder()
                .write_profile(false)
                .start()
                .expect("start a highwater session");
            let time = pairs(&HIGHWATER, threads, iters);
            let profile = session.finish().expect("finish the highwater session");
            let recorded = profile.summary.alloc_count + profile.summary.free_count;
            (time, Some((recorded, profile.summary.dropped_events)))
        }
        _ => {
            let file = std::env::temp_dir().join("highwater-bench-dhat-interleaved.json");
            let profiler = dhat::Profiler::builder().file_name(&file).build();
            let time = pairs(&DHAT, threads, iters);
            drop(profiler);
            let _ = std::fs::remove_file(file);
            (time, None)
        }
    }
}

/// A second measurement that a busy machine disturbs less than criterion's one-contender-
/// after-another order: many short batches (about 2 ms each), the contenders taking turns in
/// a rotating order, so each sees the same mix of quiet and busy moments. Reports the fastest
/// and the median batch per contender, as JSON in `HIGHWATER_BENCH_HOT_OUT` (default
/// `target/highwater-bench/hot_path.json`) and on stdout.
fn interleaved() {
    const ROUNDS: usize = 60;
    const CALIBRATION: u64 = 2_000;
    let target = Duration::from_millis(2);
    let mut results = Vec::new();
    for threads in thread_counts() {
        let iters: Vec<u64> = (0..CONTENDERS.len())
            .map(|index| {
                let (time, _) = batch(index, threads, CALIBRATION);
                let scaled = CALIBRATION as f64 * target.as_secs_f64() / time.as_secs_f64();
                (scaled as u64).clamp(200, 5_000_000)
            })
            .collect();
        let mut per_pair: Vec<Vec<f64>> = vec![Vec::with_capacity(ROUNDS); CONTENDERS.len()];
        let (mut recorded, mut dropped) = (0u64, 0u64);
        for round in 0..ROUNDS {
            for turn in 0..CONTENDERS.len() {
                let index = (round + turn) % CONTENDERS.len();
                let (time, counts) = batch(index, threads, iters[index]);
                per_pair[index].push(time.as_nanos() as f64 / iters[index] as f64);
                if let Some((r, d)) = counts {
                    recorded += r;
                    dropped += d;
                }
            }
        }
        for (index, name) in CONTENDERS.iter().enumerate() {
            let samples = &mut per_pair[index];
            samples.sort_by(f64::total_cmp);
            let (fastest, median) = (samples[0], samples[samples.len() / 2]);
            println!(
                "interleaved {name}/{threads}: fastest {fastest:.1} ns/pair, median {median:.1} \
                 ({ROUNDS} batches of {} pairs)",
                iters[index]
            );
            results.push(format!(
                "{{\"name\":\"{name}\",\"threads\":{threads},\"fastest_ns\":{fastest:.3},\
                 \"median_ns\":{median:.3},\"batches\":{ROUNDS},\"pairs_per_batch\":{}}}",
                iters[index]
            ));
        }
        println!(
            "interleaved highwater_recording/{threads}: {recorded} events recorded, {dropped} \
             dropped ({:.1}% dropped)",
            100.0 * dropped as f64 / (recorded + dropped).max(1) as f64
        );
        results.push(format!(
            "{{\"name\":\"highwater_recording_drops\",\"threads\":{threads},\
             \"recorded\":{recorded},\"dropped\":{dropped}}}"
        ));
    }
    let out = std::env::var_os("HIGHWATER_BENCH_HOT_OUT").map_or_else(
        || std::path::PathBuf::from("target/highwater-bench/hot_path.json"),
        std::path::PathBuf::from,
    );
    if let Some(parent) = out.parent() {
        std::fs::create_dir_all(parent).expect("create the results directory");
    }
    std::fs::write(&out, format!("[{}]\n", results.join(",\n"))).expect("write the results");
    println!("results: {}", out.display());
}

criterion_group!(benches, hot_path);

// ---------------------------------------------------------------------------------------------
// Measurement (`highwater::measure`, issue 15): what a closure's meter costs the thread that
// measures, and what it costs a thread that does not. Kept apart from the recording rows above.
// ---------------------------------------------------------------------------------------------

/// Times `iters` alloc + free pairs of 64 bytes through highwater's hook on the calling thread
/// (a measurement follows the calling thread only, so these are not spawned).
fn pairs_here(iters: u64) -> Duration {
    let began = Instant::now();
    for _ in 0..iters {
        // SAFETY: PAIR has a non-zero size; each block is freed with its layout.
        unsafe {
            let block = HIGHWATER.alloc(PAIR);
            black_box(block);
            HIGHWATER.dealloc(block, PAIR);
        }
    }
    began.elapsed()
}

/// The same pairs inside `highwater::measure`, checked to have been counted.
fn pairs_measured(iters: u64) -> Duration {
    let (time, m) = highwater::measure(|| pairs_here(iters));
    assert_eq!(m.allocations, iters, "every pair was measured");
    time
}

/// Blocks a [`window_here`] loop keeps live.
const WINDOW: usize = 32;

/// `iters` 64-byte allocations on the calling thread, each freed `WINDOW` allocations later
/// (first in, first out): every free is of a block other than the latest, so a measurement
/// finds it in its address table, where [`pairs_here`]'s free finds the latest block.
fn window_here(iters: u64) -> Duration {
    let mut window = [std::ptr::null_mut::<u8>(); WINDOW];
    let began = Instant::now();
    for at in 0..iters as usize {
        let slot = &mut window[at % WINDOW];
        // SAFETY: PAIR has a non-zero size; each block is freed once, with its layout.
        unsafe {
            if !slot.is_null() {
                HIGHWATER.dealloc(*slot, PAIR);
            }
            *slot = black_box(HIGHWATER.alloc(PAIR));
        }
    }
    let elapsed = began.elapsed();
    for block in window.into_iter().filter(|block| !block.is_null()) {
        // SAFETY: as above; these are the blocks still live.
        unsafe { HIGHWATER.dealloc(block, PAIR) };
    }
    elapsed
}

/// The window loop inside `highwater::measure`, checked to have been counted.
fn window_measured(iters: u64) -> Duration {
    let (time, m) = highwater::measure(|| window_here(iters));
    assert_eq!(m.allocations, iters, "every allocation was measured");
    assert_eq!(m.frees, iters, "every free was of a block born inside");
    time
}

/// Runs `f` on this thread while another thread sits inside a measurement, so the hook's
/// "any thread measuring" check is true and this thread reads its thread-local.
fn while_another_thread_measures<R>(f: impl FnOnce() -> R) -> R {
    let started = Arc::new(Barrier::new(2));
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let measurer = {
        let (started, stop) = (started.clone(), stop.clone());
        std::thread::spawn(move || {
            highwater::measure(|| {
                started.wait();
                while !stop.load(Ordering::Relaxed) {
                    std::thread::sleep(Duration::from_millis(1));
                }
            })
        })
    };
    started.wait();
    let result = f();
    stop.store(true, Ordering::Relaxed);
    measurer.join().unwrap();
    result
}

/// The measurement rows: unmeasured, measured, and unmeasured while another thread measures.
fn measure_costs(c: &mut Criterion) {
    let mut group = c.benchmark_group("measure_64B");
    group
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2))
        .sample_size(20);
    group.bench_function("unmeasured", |b| b.iter_custom(pairs_here));
    group.bench_function("measured", |b| b.iter_custom(pairs_measured));
    group.bench_function("other_thread_measuring", |b| {
        b.iter_custom(|iters| while_another_thread_measures(|| pairs_here(iters)))
    });
    group.finish();
}

/// The ratios the issue states, in short interleaved batches (as `interleaved`): a measured
/// closure against the same loop unmeasured, and a non-measuring thread while another thread
/// measures against no measurement anywhere, plus the system allocator for scale; then the
/// same measured/unmeasured pair for a loop whose frees go through the address table
/// (`window_here`), which the 64-byte pair loop never touches. Prints the
/// median batch of each and the ratios, and writes them to `HIGHWATER_BENCH_MEASURE_OUT`
/// (default `target/highwater-bench/measure.json`).
fn measure_interleaved() {
    // `HIGHWATER_BENCH_MEASURE_ROUNDS` and `_ITERS` override the defaults: on a loaded machine
    // many short batches find more quiet moments than a few long ones.
    let setting = |name: &str, default: u64| {
        std::env::var(name)
            .ok()
            .and_then(|value| value.parse::<u64>().ok())
            .filter(|&value| value > 0)
            .unwrap_or(default)
    };
    let rounds = setting("HIGHWATER_BENCH_MEASURE_ROUNDS", 60) as usize;
    let iters = setting("HIGHWATER_BENCH_MEASURE_ITERS", 200_000);
    let system = || {
        let began = Instant::now();
        for _ in 0..iters {
            // SAFETY: as in `pairs_here`.
            unsafe {
                let block = System.alloc(PAIR);
                black_box(block);
                System.dealloc(block, PAIR);
            }
        }
        began.elapsed()
    };
    let mut samples: [Vec<f64>; 6] = Default::default();
    for round in 0..rounds {
        for turn in 0..6 {
            let index = (round + turn) % 6;
            let time = match index {
                0 => system(),
                1 => pairs_here(iters),
                2 => pairs_measured(iters),
                3 => while_another_thread_measures(|| pairs_here(iters)),
                4 => window_here(iters),
                _ => window_measured(iters),
            };
            samples[index].push(time.as_nanos() as f64 / iters as f64);
        }
    }
    let sorted: Vec<Vec<f64>> = samples
        .iter()
        .map(|batches| {
            let mut batches = batches.clone();
            batches.sort_by(f64::total_cmp);
            batches
        })
        .collect();
    let names = [
        "system",
        "unmeasured",
        "measured",
        "other_thread_measuring",
        "window_unmeasured",
        "window_measured",
    ];
    let fastest: Vec<f64> = sorted.iter().map(|batches| batches[0]).collect();
    let medians: Vec<f64> = sorted
        .iter()
        .map(|batches| batches[batches.len() / 2])
        .collect();
    for (index, name) in names.iter().enumerate() {
        println!(
            "measure interleaved {name}: fastest {:.2} ns/pair, median {:.2} ({rounds} batches \
             of {iters})",
            fastest[index], medians[index]
        );
    }
    let ratio = |of: usize, to: usize| (fastest[of] / fastest[to], medians[of] / medians[to]);
    let (measured_fastest, measured_median) = ratio(2, 1);
    let (bystander_fastest, bystander_median) = ratio(3, 1);
    let (unmeasured_fastest, unmeasured_median) = ratio(1, 0);
    let (window_fastest, window_median) = ratio(5, 4);
    println!(
        "measure interleaved ratios (fastest, median): measured/unmeasured \
         {measured_fastest:.3} {measured_median:.3}, other_thread_measuring/unmeasured \
         {bystander_fastest:.3} {bystander_median:.3}, unmeasured/system \
         {unmeasured_fastest:.3} {unmeasured_median:.3}, window_measured/window_unmeasured \
         {window_fastest:.3} {window_median:.3}"
    );
    let figures = |values: &[f64]| {
        names
            .iter()
            .zip(values)
            .map(|(name, ns)| format!("\"{name}\":{ns:.3}"))
            .collect::<Vec<_>>()
            .join(",")
    };
    let json = format!(
        "{{\"pairs_per_batch\":{iters},\"batches\":{rounds},\"fastest_ns\":{{{}}},\
         \"median_ns\":{{{}}},\"measured_over_unmeasured_median\":{measured_median:.4},\
         \"other_thread_measuring_over_unmeasured_median\":{bystander_median:.4},\
         \"window_measured_over_window_unmeasured_median\":{window_median:.4}}}\n",
        figures(&fastest),
        figures(&medians)
    );
    let out = std::env::var_os("HIGHWATER_BENCH_MEASURE_OUT").map_or_else(
        || std::path::PathBuf::from("target/highwater-bench/measure.json"),
        std::path::PathBuf::from,
    );
    if let Some(parent) = out.parent() {
        std::fs::create_dir_all(parent).expect("create the results directory");
    }
    std::fs::write(&out, json).expect("write the results");
    println!("results: {}", out.display());
}

criterion_group!(measure_benches, measure_costs);

fn main() {
    tracking_allocator::AllocationRegistry::set_global_tracker(CountingTracker::default())
        .expect("no other tracking-allocator tracker is set in this process");
    tracking_allocator::AllocationRegistry::enable_tracking();

    // `HIGHWATER_BENCH_MEASURE_ONLY=1 cargo bench --bench hot_path`: only the measurement
    // ratios (the interleaved pass below), for working on `highwater::measure`.
    if std::env::var_os("HIGHWATER_BENCH_MEASURE_ONLY").is_some() {
        measure_interleaved();
        return;
    }
    benches();
    measure_benches();
    Criterion::default().configure_from_args().final_summary();
    // Only under `cargo bench` (criterion's test mode runs each benchmark once and stops).
    if std::env::args().any(|arg| arg == "--bench") {
        interleaved();
        measure_interleaved();
    }
}
