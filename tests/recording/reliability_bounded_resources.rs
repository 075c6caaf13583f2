//! Bounded resources: however long the run, the collector's memory stays O(live allocations +
//! bounded timeline) and the profile stays small.
//!
//! Four threads each keep 250 blocks live (1,000 in all) and replace one per step, so the live
//! set is constant while the event count grows. The collector thread's own heap (what it
//! allocated minus what it freed, tracked by the counting allocator; see `common`) and the whole
//! process's heap are compared between a run and one four times longer.
//!
//! `ten_million_events` is the full-size run (`#[ignore]`d: run it in release with
//! `cargo test --release --test reliability_bounded_resources -- --ignored --nocapture`);
//! the figures it prints are quoted in the reliability notes.

use std::hint::black_box;
use std::sync::atomic::Ordering;
use std::time::Instant;

use highwater::{Profile, Session, Step};
use highwater_testkit::child::isolated;

/// Threads allocating.
const THREADS: usize = 4;
/// Blocks each thread keeps live.
const LIVE_PER_THREAD: usize = 250;
/// Events each thread's ring holds. The collector's staging queues hold what it drained but
/// has not merged yet: at most about one ring's worth per thread when it falls behind, plus a
/// backlog of four rings' worth shared by all, a bound that does not depend on the run's
/// length. Small rings keep that bound small next to the rest of the collector's memory.
const RING_EVENTS: usize = 1 << 12;

/// Rings' worth of events the collector's backlog may hold beyond each ring's own room.
const BACKLOG_RINGS: usize = 4;

/// The most the staging queues may hold: a ring's worth of events per thread and the backlog,
/// twice over for the queues' capacity doubling (staged events are smaller than decoded ones).
fn staging_bound() -> i64 {
    (2 * (THREADS + BACKLOG_RINGS)
        * RING_EVENTS
        * std::mem::size_of::<highwater::profile::analysis::Event>()) as i64
}
/// The profile must stay under this, whatever the run's length.
const MAX_PROFILE_JSON: usize = 10 << 20;

/// What one run measured.
#[derive(Debug)]
struct Run {
    events: u64,
    dropped: u64,
    iterations: usize,
    spans: usize,
    profile_bytes: usize,
    collector_peak: i64,
    heap_peak: i64,
    elapsed: std::time::Duration,
}

/// `VmHWM` (peak resident set) of this process, in KiB.
fn vm_hwm_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .unwrap_or_default()
        .lines()
        .find_map(|line| line.strip_prefix("VmHWM:"))
        .and_then(|rest| rest.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0)
}

/// How a run allocates.
#[derive(Debug, Clone, Copy)]
struct Shape {
    /// `iteration` spans (each with a `forward` span inside) per thread.
    iterations: usize,
    /// Steps (replace one live block: an alloc and a free) per iteration.
    steps_per_iteration: usize,
    /// Sleep 1 ms after every this many iterations (0: never), so that a debug build's
    /// collector keeps up and the events are applied, not dropped.
    rest_every: usize,
    /// Events per thread ring.
    ring_events: usize,
}

/// One session of four threads allocating as `shape` says.
fn run(shape: Shape) -> Run {
    let first_new_row = highwater_testkit::counting::next_row();
    highwater_testkit::counting::reset_heap_peak();
    let started = Instant::now();
    let session = Session::builder()
        .ring_events(shape.ring_events)
        .write_profile(false)
        .start()
        .unwrap();
    let workers: Vec<_> = (0..THREADS)
        .map(|worker| {
            std::thread::spawn(move || {
                let mut live: Vec<Vec<u8>> = (0..LIVE_PER_THREAD)
                    .map(|i| Vec::with_capacity(64 + i))
                    .collect();
                for iteration in 0..shape.iterations {
                    let _iteration = highwater::profile!("iteration");
                    let _forward = highwater::profile!("forward", Step::Forward);
                    for step in 0..shape.steps_per_iteration {
                        let step = iteration * shape.steps_per_iteration + step;
                        let slot = step % LIVE_PER_THREAD;
                        live[slot] = Vec::with_capacity(64 + (step + worker) % 512);
                    }
                    drop(_forward);
                    drop(_iteration);
                    if shape.rest_every > 0 && iteration % shape.rest_every == 0 {
                        std::thread::sleep(std::time::Duration::from_millis(1));
                    }
                }
                black_box(&live);
            })
        })
        .collect();
    for worker in workers {
        worker.join().unwrap();
    }
    let profile: Profile = session.finish().unwrap();
    let elapsed = started.elapsed();
    let collector_peak = highwater_testkit::counting::rows()[first_new_row..]
        .iter()
        .filter(|row| row.internal.load(Ordering::SeqCst))
        .map(|row| row.held_peak.load(Ordering::SeqCst))
        .max()
        .expect("the collector thread allocated");
    Run {
        events: profile.summary.event_count,
        dropped: profile.summary.dropped_events,
        iterations: profile.iterations.len(),
        spans: profile.span_events.len(),
        profile_bytes: profile.to_json().len(),
        collector_peak,
        heap_peak: highwater_testkit::counting::heap_peak(),
        elapsed,
    }
}

fn report(label: &str, run: &Run) {
    println!(
        "FIGURES {label}: {} events applied, {} dropped, {} iterations listed, profile {} bytes, \
         collector heap peak {} KiB, process heap peak {} KiB, VmHWM {} KiB, {:.2?}",
        run.events,
        run.dropped,
        run.iterations,
        run.profile_bytes,
        run.collector_peak >> 10,
        run.heap_peak >> 10,
        vm_hwm_kib(),
        run.elapsed
    );
}

/// A run and one four times longer, both past the profile's list bounds (more span instances
/// than the span sample keeps, more than `MAX_ITERATIONS` iterations), at a pace a debug build's
/// collector keeps up with. Proves: both profiles are ≤ 10 MiB and the longer one is at most
/// 10 % and 64 KiB larger; the longer run's collector heap peak is at most 1.25 × the shorter's
/// plus the staging bound (a ring's worth of events per thread and the backlog, ×2), and so is the whole
/// process's heap peak — memory follows the live set and fixed bounds, not the event count.
#[test]
fn collector_memory_does_not_grow_with_the_number_of_events() {
    isolated(
        "collector_memory_does_not_grow_with_the_number_of_events",
        || {
            let shape = Shape {
                iterations: 3_000,
                steps_per_iteration: 1,
                rest_every: 8,
                ring_events: RING_EVENTS,
            };
            let short = run(shape);
            report("short", &short);
            let long = run(Shape {
                iterations: 4 * shape.iterations,
                ..shape
            });
            report("long", &long);
            assert!(
                long.events > 3 * short.events,
                "the long run should apply far more events: {short:?} vs {long:?}"
            );
            assert!(
                short.iterations < THREADS * shape.iterations
                    && short.spans < 2 * THREADS * shape.iterations,
                "the short run should already be past the profile's list bounds: {short:?}"
            );
            for run in [&short, &long] {
                assert!(
                    run.profile_bytes <= MAX_PROFILE_JSON,
                    "profile of {} bytes exceeds 10 MiB",
                    run.profile_bytes
                );
            }
            assert!(
                long.profile_bytes <= short.profile_bytes + short.profile_bytes / 10 + (64 << 10),
                "the profile grew with events: {} bytes, then {}",
                short.profile_bytes,
                long.profile_bytes
            );
            let bound = |short: i64| short + short / 4 + staging_bound();
            assert!(
                long.collector_peak <= bound(short.collector_peak),
                "collector heap grew with events: {} KiB after {} events, {} KiB after {}",
                short.collector_peak >> 10,
                short.events,
                long.collector_peak >> 10,
                long.events
            );
            assert!(
                long.heap_peak <= bound(short.heap_peak),
                "process heap grew with events: {} KiB, then {} KiB",
                short.heap_peak >> 10,
                long.heap_peak >> 10
            );
        },
    );
}

/// The full-size run: 4 threads × 25,000 iterations × 50 steps = 10 M alloc/free events (plus
/// 400,000 span events), flat out and then paced. Proves: the profile is ≤ 10 MiB; prints the
/// figures (events, profile bytes, collector heap peak, process heap peak, VmHWM) next to a
/// 1 M-event run's.
#[test]
#[ignore = "10 M events: run in release (see the module docs)"]
fn ten_million_events() {
    isolated("ten_million_events", || {
        let before = vm_hwm_kib();
        let shape = Shape {
            iterations: 2_500,
            steps_per_iteration: 50,
            rest_every: 0,
            ring_events: 1 << 18,
        };
        let warm = run(shape);
        report("1 M alloc/free events", &warm);
        let full = run(Shape {
            iterations: 25_000,
            ..shape
        });
        report("10 M alloc/free events, flat out", &full);
        // The same at a pace the collector keeps up with (1 ms rest every 10 iterations).
        let paced = run(Shape {
            iterations: 25_000,
            rest_every: 10,
            ..shape
        });
        report("10 M alloc/free events, paced", &paced);
        assert!(
            paced.profile_bytes <= MAX_PROFILE_JSON,
            "profile of {} bytes exceeds 10 MiB",
            paced.profile_bytes
        );
        println!("FIGURES VmHWM before the runs: {before} KiB");
        assert!(
            full.events + full.dropped >= 10_000_000,
            "fewer events than planned: {full:?}"
        );
        assert!(
            full.profile_bytes <= MAX_PROFILE_JSON,
            "profile of {} bytes exceeds 10 MiB",
            full.profile_bytes
        );
    });
}
