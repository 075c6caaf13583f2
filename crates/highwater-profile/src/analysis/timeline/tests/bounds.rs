//! The timeline over long runs: exact peaks within the point bound, memory bounded by what is
//! open and live, bounded samples and kept refusals, the peak's window kept change by change.

use super::*;

#[test]
fn a_million_events_keep_the_exact_peak_within_the_point_bound() {
    let config = TimelineConfig {
        max_points_per_device: 256,
        ..TimelineConfig::default()
    };
    let mut timeline = Timeline::new(config);
    let mut peak_ts = 0;
    for i in 0..500_000u64 {
        let ts = i * 2;
        let size = if i == 333_333 { 1 << 30 } else { 64 + i % 4096 };
        if i == 333_333 {
            peak_ts = ts;
        }
        let alloc = EventKind::Alloc {
            device: DeviceId::CPU,
            addr: 0x1000 + (i % 64) * 16,
            size,
            category: Category::Activation,
        };
        let free = EventKind::Free {
            device: DeviceId::CPU,
            addr: 0x1000 + (i % 64) * 16,
            size,
        };
        for (offset, kind) in [(0, alloc), (1, free)] {
            timeline.apply(&Event {
                ts_ns: ts + offset,
                thread: 1,
                span: 0,
                kind,
            });
        }
    }
    assert_eq!(timeline.event_count(), 1_000_000);
    let profile = timeline.profile(1_000_000);
    assert!(
        profile.timeline.len() <= 256,
        "{} points",
        profile.timeline.len()
    );
    assert!(
        profile.timeline.len() >= 64,
        "{} points",
        profile.timeline.len()
    );
    assert_eq!(profile.summary.peak_timestamp_ns, peak_ts);
    assert!(profile
        .timeline
        .iter()
        .any(|p| p.timestamp_ns == peak_ts && p.live_bytes == profile.summary.peak_bytes));
    assert!(profile
        .timeline
        .windows(2)
        .all(|w| w[0].timestamp_ns <= w[1].timestamp_ns));
}

#[test]
fn memory_stays_bounded_by_open_spans_and_live_blocks() {
    // One span open for the whole run, many short spans inside it while memory declines,
    // and blocks that outlive the spans that made them.
    let mut s = Script::new();
    s.enter("train", SpanLabel::Plain);
    for i in 0..2_000u64 {
        s.alloc(0x100_0000 + i, 10, Category::Other);
    }
    for i in 0..2_000u64 {
        s.enter("step", SpanLabel::Plain);
        s.alloc(0x10 + i, 3, Category::Other);
        s.free(0x100_0000 + i);
        s.free(0x10 + i);
        s.exit();
    }
    assert!(
        s.timeline.spans.peaks.len() <= 4,
        "{}",
        s.timeline.spans.peaks.len()
    );
    // Closed spans whose blocks are all gone are forgotten.
    assert!(s.timeline.spans.instances_in_use() <= 2);
    s.exit();
    assert_eq!(s.timeline.spans.peaks.len(), 0);
    assert_eq!(s.timeline.spans.instances_in_use(), 0);
    let profile = s.finish();
    assert_eq!(span(&profile, "train/step").calls, 2_000);
    assert_eq!(span(&profile, "train/step").peak_bytes, 20_003);
}

#[test]
fn two_hundred_thousand_iterations_list_a_bounded_sample() {
    // Regression: every top-level exit was kept and listed, so a long training run's
    // profile grew without bound (about 140 bytes of JSON per iteration).
    let mut s = Script::new();
    for i in 0..200_000u64 {
        s.enter("step", SpanLabel::Plain);
        s.alloc(0x1000 + i, 16, Category::Other);
        s.exit();
    }
    let profile = s.timeline.profile(s.ts + 1);
    assert!(profile.iterations.len() <= crate::profile::MAX_ITERATIONS);
    let last = profile.iterations.last().unwrap();
    assert_eq!(last.index, 199_999);
    assert_eq!(last.delta_bytes, 16);
    assert_eq!(last.live_bytes, 3_200_000);
    assert!(profile.warnings.contains(&Warning::IterationsSampled {
        span: "step".into(),
        iterations: 200_000,
        listed: profile.iterations.len() as u64,
    }));
    assert!(profile.warnings.contains(&Warning::GrowingResidual {
        span: "step".into(),
        window: 16,
        grew: 16,
        total_bytes: 16 * 16,
        per_iteration_bytes: 16,
        iterations: 200_000,
        run_growth_bytes: 3_200_000 - profile.iterations[0].live_bytes as i64,
    }));
}

#[test]
fn a_refusal_keeps_what_was_live_on_its_device_then_and_later_frees_do_not_change_it() {
    let mut s = Script::new();
    let gpu = s.timeline.intern_device("cuda:0");
    s.enter("init", SpanLabel::Category(Category::Parameter));
    s.alloc(0x10, 3 * MIB, Category::Parameter);
    s.exit();
    s.alloc_on(gpu, 7, 5 * MIB, Category::Activation);
    s.push(EventKind::PoolState {
        device: gpu,
        capacity: 8 * MIB,
        reserved: 5 * MIB,
        largest_free: 3 * MIB,
        fragmentation: 0.0,
    });
    s.enter("step", SpanLabel::Step(Step::Forward));
    s.alloc(0x20, MIB, Category::Activation);
    let matmul = s.timeline.intern_name("matmul");
    s.push(EventKind::OpBegin {
        name: matmul,
        output: 0,
        shape: None,
        dtype: None,
    });
    s.push(EventKind::Oom {
        device: DeviceId::CPU,
        source: OomSource::Heap,
        requested: 1 << 40,
        largest_free: None,
    });
    s.push(EventKind::Oom {
        device: gpu,
        source: OomSource::Pool,
        requested: 4 * MIB,
        largest_free: Some(3 * MIB),
    });
    s.push(EventKind::OpEnd);
    s.free(0x20);
    s.exit();
    let profile = s.finish();
    assert_eq!(profile.summary.oom_count, 2);
    let [heap, pool] = &profile.oom_events[..] else {
        panic!("two refusals: {:#?}", profile.oom_events)
    };
    assert_eq!(
        (heap.source, heap.device.as_str(), heap.requested_bytes),
        (OomSource::Heap, "cpu", 1 << 40)
    );
    assert_eq!(
        (heap.span_path.as_str(), heap.op.as_deref()),
        ("step", Some("matmul"))
    );
    assert_eq!(
        (
            heap.live_bytes,
            heap.total_live_bytes,
            heap.largest_free_bytes
        ),
        (4 * MIB, 9 * MIB, None)
    );
    assert_eq!(
        heap.live_by_category,
        cats(&[(Category::Parameter, 3 * MIB), (Category::Activation, MIB)])
    );
    let rows: Vec<_> = heap
        .live
        .iter()
        .map(|r| {
            (
                r.span_path.as_str(),
                r.op.as_deref(),
                r.category,
                r.bytes,
                r.count,
            )
        })
        .collect();
    assert_eq!(
        rows,
        [
            ("init", None, Category::Parameter, 3 * MIB, 1),
            ("step", None, Category::Activation, MIB, 1)
        ]
    );
    assert_eq!(heap.pool_capacity_bytes, None);
    assert_eq!(
        (
            pool.device.as_str(),
            pool.live_bytes,
            pool.largest_free_bytes
        ),
        ("cuda:0", 5 * MIB, Some(3 * MIB))
    );
    assert_eq!(
        (pool.pool_capacity_bytes, pool.pool_reserved_bytes),
        (Some(8 * MIB), Some(5 * MIB))
    );
    assert!(profile.warnings.iter().any(|w| matches!(
        w,
        Warning::OutOfMemory { refusals: 2, requested_bytes, .. } if *requested_bytes == 1 << 40
    )));
    profile.check_invariants().unwrap();
}

#[test]
fn only_the_first_refusals_are_kept_but_all_are_counted() {
    let mut s = Script::new();
    for _ in 0..crate::profile::MAX_OOM_EVENTS + 5 {
        s.push(EventKind::Oom {
            device: DeviceId::CPU,
            source: OomSource::Heap,
            requested: 64,
            largest_free: None,
        });
    }
    let profile = s.finish();
    assert_eq!(profile.oom_events.len(), crate::profile::MAX_OOM_EVENTS);
    assert_eq!(
        profile.summary.oom_count,
        crate::profile::MAX_OOM_EVENTS as u64 + 5
    );
    // A refusal changes no byte figure.
    assert_eq!(
        (profile.summary.peak_bytes, profile.summary.alloc_count),
        (0, 0)
    );
}

/// Issue 34: the curve keeps a few points per bucket, so the iteration that peaked showed 8
/// flat steps; the peak window keeps every change of that iteration (here 300 of them, far
/// more than the curve's 16 points), from the exit of the iteration before it to its own exit.
#[test]
fn the_iteration_that_peaked_is_kept_change_by_change() {
    let mut s = Script::with(TimelineConfig {
        max_points_per_device: 16,
        ..TimelineConfig::default()
    });
    s.alloc(0x1, MIB, Category::Parameter);
    let mut exits = Vec::new();
    for step in 0..20u64 {
        s.enter("step", SpanLabel::Plain);
        // Iteration 13 rises highest: 150 blocks of 1 KiB more each, then frees them.
        let size = if step == 13 { 2048 } else { 1024 };
        for block in 0..150 {
            s.alloc(0x1000 + block * 0x1000, size, Category::Activation);
        }
        for block in 0..150 {
            s.free(0x1000 + block * 0x1000);
        }
        s.exit();
        exits.push(s.ts);
    }
    let profile = s.finish();
    assert!(
        profile.timeline.len() <= 17,
        "the coarse curve stays coarse"
    );
    let window = &profile.peak_window;
    let peak = (
        profile.summary.peak_timestamp_ns,
        profile.summary.peak_bytes,
    );
    assert_eq!(peak.1, MIB + 150 * 2048);
    assert!(window
        .iter()
        .any(|p| (p.timestamp_ns, p.live_bytes) == peak));
    // It opens at the exit before the peak's iteration with the level then, and holds every
    // change up to its own exit: 300, and nothing of another iteration.
    assert_eq!(window[0].timestamp_ns, exits[12]);
    assert_eq!(window[0].live_bytes, MIB);
    assert_eq!(window.len(), 1 + 300);
    assert!(window.iter().all(|p| p.timestamp_ns <= exits[13]));
    assert!(window
        .windows(2)
        .all(|w| w[0].timestamp_ns < w[1].timestamp_ns));
    let rises = window
        .windows(2)
        .filter(|w| w[1].live_bytes > w[0].live_bytes);
    assert_eq!(rises.count(), 150, "each allocation is a step of its own");
    assert!(window.iter().all(|p| p.device == "cpu"));
}

/// The window that held the peak stays when later ones close, and a longer window keeps each
/// bucket's extremes within the bound.
#[test]
fn the_peak_window_survives_later_iterations_and_stays_bounded() {
    let mut s = Script::new();
    let blocks = 3 * PEAK_WINDOW_BUCKETS as u64;
    s.enter("step", SpanLabel::Plain);
    for block in 0..blocks {
        s.alloc(0x1000 + block * 0x1000, 64, Category::Activation);
    }
    for block in 0..blocks {
        s.free(0x1000 + block * 0x1000);
    }
    s.exit();
    for _ in 0..5 {
        s.enter("step", SpanLabel::Plain);
        s.alloc(0x10, 4099, Category::Activation);
        s.free(0x10);
        s.exit();
    }
    let profile = s.finish();
    let window = &profile.peak_window;
    assert!(window.len() <= 2 * PEAK_WINDOW_BUCKETS, "{}", window.len());
    assert!(window.len() > PEAK_WINDOW_BUCKETS, "{}", window.len());
    assert!(window.iter().any(|p| p.live_bytes == blocks * 64));
    assert!(
        window.iter().all(|p| p.live_bytes != 4099),
        "a later, lower iteration replaced it"
    );
}
