//! Unit tests of the timeline, event stream in, profile out.

use std::collections::BTreeMap;

use super::*;
use crate::analysis::{Event, EventKind, SpanSeq};
use crate::model::OomSource;
use crate::model::{SpanLabel, Step};
use crate::profile::{CaptureMode, Profile, SpanMetrics, Warning, SCHEMA};

const MIB: u64 = 1 << 20;

/// Writes events for one thread with increasing timestamps and a span stack.
struct Script {
    timeline: Timeline,
    ts: u64,
    thread: u32,
    stack: Vec<SpanSeq>,
    next_id: SpanSeq,
}

impl Script {
    fn new() -> Script {
        Script::with(TimelineConfig::default())
    }

    fn with(config: TimelineConfig) -> Script {
        Script {
            timeline: Timeline::new(config),
            ts: 0,
            thread: 1,
            stack: Vec::new(),
            next_id: 1,
        }
    }

    fn push(&mut self, kind: EventKind) {
        self.ts += 10;
        let span = self.stack.last().copied().unwrap_or(0);
        self.at(self.ts, span, kind);
    }

    fn at(&mut self, ts: u64, span: SpanSeq, kind: EventKind) {
        let event = Event {
            ts_ns: ts,
            thread: self.thread,
            span,
            kind,
        };
        self.timeline.apply(&event);
    }

    fn enter(&mut self, name: &str, label: SpanLabel) {
        let name = self.timeline.intern_name(name);
        let id = self.next_id;
        self.next_id += 1;
        self.push(EventKind::SpanEnter { id, name, label });
        self.stack.push(id);
    }

    fn exit(&mut self) {
        if let Some(id) = self.stack.pop() {
            self.ts += 10;
            self.at(self.ts, id, EventKind::SpanExit { id });
        }
    }

    fn alloc_on(&mut self, device: DeviceId, addr: u64, size: u64, category: Category) {
        self.push(EventKind::Alloc {
            device,
            addr,
            size,
            category,
        });
    }

    fn alloc(&mut self, addr: u64, size: u64, category: Category) {
        self.alloc_on(DeviceId::CPU, addr, size, category);
    }

    fn free(&mut self, addr: u64) {
        self.push(EventKind::Free {
            device: DeviceId::CPU,
            addr,
            size: 0,
        });
    }

    fn finish(&mut self) -> Profile {
        self.timeline.profile(self.ts + 10)
    }
}

fn span<'a>(profile: &'a Profile, path: &str) -> &'a SpanMetrics {
    profile
        .spans
        .iter()
        .find(|s| profile.span_path(s.id) == path)
        .unwrap_or_else(|| panic!("no span {path} in {:#?}", profile.spans))
}

fn cats(pairs: &[(Category, u64)]) -> BTreeMap<Category, u64> {
    pairs.iter().copied().collect()
}

#[test]
fn forward_then_backward_peaks_at_twelve_mib_with_categories_and_span_rows() {
    let mut s = Script::new();
    s.enter("step", SpanLabel::Plain);
    s.enter("forward", SpanLabel::Step(Step::Forward));
    s.alloc(0x10, 6 * MIB, Category::Activation);
    s.alloc(0x20, MIB, Category::Activation);
    s.push(EventKind::Realloc {
        old_addr: 0x20,
        old_size: MIB,
        new_addr: 0x30,
        new_size: 2 * MIB,
        category: Category::Activation,
        released_ns: None,
    });
    s.exit();
    s.enter("backward", SpanLabel::Step(Step::Backward));
    s.alloc(0x40, 4 * MIB, Category::Gradient);
    let peak_ts = s.ts;
    s.free(0x40);
    s.exit();
    s.free(0x10);
    s.free(0x30);
    s.exit();
    let profile = s.finish();

    let summary = &profile.summary;
    assert_eq!(profile.schema, SCHEMA);
    assert_eq!(summary.peak_bytes, 12 * MIB);
    assert_eq!(summary.peak_timestamp_ns, peak_ts);
    assert_eq!(summary.peak_device, "cpu");
    let expected = cats(&[
        (Category::Activation, 8 * MIB),
        (Category::Gradient, 4 * MIB),
    ]);
    assert_eq!(summary.peak_by_category, expected);
    assert_eq!(summary.autograd_retained_bytes, 8 * MIB);
    assert_eq!(
        (
            summary.alloc_count,
            summary.free_count,
            summary.realloc_count
        ),
        (3, 3, 1)
    );
    assert_eq!(summary.total_alloc_bytes, 12 * MIB);
    assert_eq!(summary.final_live_bytes, 0);
    assert_eq!(summary.event_count, 13);

    let rows: Vec<(&str, Category, u64, u64)> = profile
        .peak_breakdown
        .iter()
        .map(|r| (r.span_path.as_str(), r.category, r.bytes, r.count))
        .collect();
    assert_eq!(
        rows,
        vec![
            ("step/forward", Category::Activation, 8 * MIB, 2),
            ("step/backward", Category::Gradient, 4 * MIB, 1),
        ]
    );
    let largest: Vec<(u64, &str)> = profile
        .largest_at_peak
        .iter()
        .map(|a| (a.bytes, a.span_path.as_str()))
        .collect();
    assert_eq!(
        largest,
        vec![
            (6 * MIB, "step/forward"),
            (4 * MIB, "step/backward"),
            (2 * MIB, "step/forward")
        ]
    );
    let forward = span(&profile, "step/forward");
    assert_eq!(forward.step, Some(Step::Forward));
    assert_eq!((forward.bytes_allocated, forward.alloc_count), (8 * MIB, 2));
    assert_eq!(forward.residual_bytes, 8 * MIB);
    assert_eq!(span(&profile, "step/backward").peak_bytes, 12 * MIB);
    assert_eq!(span(&profile, "step").bytes_allocated, 12 * MIB);

    let cpu = &profile.devices[0];
    assert_eq!((cpu.device.as_str(), cpu.peak_bytes), ("cpu", 12 * MIB));
    assert_eq!(cpu.peak_by_category, expected);
    assert_eq!((cpu.alloc_count, cpu.free_count), (3, 3));
    let peak_point = profile
        .timeline
        .iter()
        .find(|p| p.timestamp_ns == peak_ts)
        .expect("the peak is a point of the curve");
    assert_eq!(peak_point.live_bytes, 12 * MIB);
    assert_eq!(peak_point.by_category, expected);
    assert!(profile.warnings.is_empty(), "{:?}", profile.warnings);
}

#[test]
fn unknown_frees_duplicate_allocs_and_straggler_frees_are_counted_and_tolerated() {
    let mut s = Script::new();
    s.free(0x99); // never allocated
    s.alloc(0x10, 100, Category::Other);
    s.alloc(0x10, 40, Category::Other); // the free of the first life was lost
    let born = s.ts;
    s.at(
        born - 5,
        0,
        EventKind::Free {
            device: DeviceId::CPU,
            addr: 0x10,
            size: 100,
        },
    ); // the lost free, arriving late: older than the live block
    s.push(EventKind::Realloc {
        old_addr: 0x77,
        old_size: 8,
        new_addr: 0x80,
        new_size: 16,
        category: Category::Other,
        released_ns: None,
    }); // realloc of an unknown block
    s.push(EventKind::SpanExit { id: 42 });
    s.push(EventKind::OpEnd);
    s.push(EventKind::SetCategory {
        device: DeviceId(9),
        addr: 1,
        category: Category::Gradient,
    });
    let profile = s.finish();
    let summary = &profile.summary;
    assert_eq!(summary.unknown_frees, 2);
    assert_eq!(summary.reorder_repairs, 2);
    assert_eq!(summary.free_count, 0);
    assert_eq!(summary.alloc_count, 2);
    assert_eq!(summary.total_alloc_bytes, 156);
    assert_eq!(s.timeline.live_bytes(DeviceId::CPU), 56);
    assert_eq!(summary.final_live_bytes, 56);
    assert_eq!(summary.peak_bytes, 100);
}

#[test]
fn another_threads_reuse_of_an_address_between_a_reallocs_halves_is_a_new_block() {
    let mut s = Script::new();
    s.enter("step", SpanLabel::Plain);
    s.alloc(0x10, 100, Category::Activation);
    let resizer = s.thread;
    // The resize starts: the old block gives up 0x10 but stays counted...
    s.push(EventKind::ReallocRelease {
        old_addr: 0x10,
        old_size: 100,
    });
    assert_eq!(s.timeline.live_bytes(DeviceId::CPU), 100);
    // ...another thread is handed 0x10 before the resize completes...
    s.thread = resizer + 1;
    s.alloc(0x10, 30, Category::Other);
    assert_eq!(s.timeline.live_bytes(DeviceId::CPU), 130);
    // ...and the resize completes at 0x20.
    s.thread = resizer;
    let released = s.ts - 10;
    s.push(EventKind::Realloc {
        old_addr: 0x10,
        old_size: 100,
        new_addr: 0x20,
        new_size: 250,
        category: Category::Activation,
        released_ns: Some(released),
    });
    s.free(0x10);
    s.free(0x20);
    s.exit();
    let summary = s.finish().summary;
    assert_eq!(summary.reorder_repairs, 0);
    assert_eq!(summary.unknown_frees, 0);
    assert_eq!(
        (
            summary.alloc_count,
            summary.realloc_count,
            summary.free_count
        ),
        (2, 1, 2)
    );
    // The resize's growth is 150 over the old block, which it continued.
    assert_eq!(summary.total_alloc_bytes, 100 + 30 + 150);
    assert_eq!(summary.peak_bytes, 280);
    assert_eq!(summary.final_live_bytes, 0);
    // The release is half of the realloc, not an event of its own.
    assert_eq!(summary.event_count, 7);
}

#[test]
fn a_release_whose_realloc_never_came_ends_its_block_at_the_threads_next_release() {
    let mut s = Script::new();
    s.alloc(0x10, 100, Category::Other);
    s.alloc(0x30, 40, Category::Other);
    s.push(EventKind::ReallocRelease {
        old_addr: 0x10,
        old_size: 100,
    });
    // Its realloc was lost; the next release settles it.
    s.push(EventKind::ReallocRelease {
        old_addr: 0x30,
        old_size: 40,
    });
    assert_eq!(s.timeline.live_bytes(DeviceId::CPU), 40);
    s.push(EventKind::Realloc {
        old_addr: 0x30,
        old_size: 40,
        new_addr: 0x30,
        new_size: 60,
        category: Category::Other,
        released_ns: None,
    });
    let summary = s.finish().summary;
    assert_eq!(summary.reorder_repairs, 0);
    assert_eq!(summary.final_live_bytes, 60);
    assert_eq!(summary.peak_bytes, 140);
}

#[test]
fn allocations_inside_an_op_name_the_op_shape_and_dtype_in_peak_rows() {
    let mut s = Script::new();
    let matmul = s.timeline.intern_name("matmul");
    let f32 = s.timeline.intern_name("f32");
    let shape = s.timeline.intern_shape(&[128, 64]);
    s.enter("forward", SpanLabel::Step(Step::Forward));
    s.push(EventKind::OpBegin {
        name: matmul,
        output: 7,
        shape: Some(shape),
        dtype: Some(f32),
    });
    s.alloc(0x10, 32 * 1024, Category::Activation);
    s.push(EventKind::OpEnd);
    s.alloc(0x20, 16, Category::Activation);
    let profile = s.finish();
    let row = &profile.peak_breakdown[0];
    assert_eq!(row.op.as_deref(), Some("matmul"));
    assert_eq!(row.shape, Some(vec![128, 64]));
    assert_eq!(row.dtype.as_deref(), Some("f32"));
    assert_eq!((row.span_path.as_str(), row.bytes), ("forward", 32 * 1024));
    let plain = &profile.peak_breakdown[1];
    assert_eq!((plain.op.as_ref(), plain.bytes), (None, 16));
    assert_eq!(profile.largest_at_peak[0].op.as_deref(), Some("matmul"));
}

#[test]
fn residual_and_roll_up_follow_the_span_tree() {
    let mut s = Script::new();
    s.enter("step", SpanLabel::Plain);
    s.alloc(0x1, 1, Category::Other);
    s.enter("fwd", SpanLabel::Step(Step::Forward));
    s.alloc(0x10, 100, Category::Activation);
    s.alloc(0x20, 50, Category::Activation);
    s.free(0x20);
    s.exit();
    s.enter("bwd", SpanLabel::Step(Step::Backward));
    s.alloc(0x30, 30, Category::Gradient);
    s.free(0x10);
    s.exit();
    s.exit();
    s.alloc(0x40, 1000, Category::Other); // outside every span
    let profile = s.finish();
    let step = span(&profile, "step");
    let fwd = span(&profile, "step/fwd");
    let bwd = span(&profile, "step/bwd");
    assert_eq!((fwd.bytes_allocated, fwd.alloc_count), (150, 2));
    assert_eq!((bwd.bytes_allocated, bwd.alloc_count), (30, 1));
    assert_eq!((step.bytes_allocated, step.alloc_count), (181, 4));
    assert_eq!(fwd.residual_bytes, 100);
    assert_eq!(bwd.residual_bytes, 30);
    assert_eq!(step.residual_bytes, 31);
    assert_eq!(fwd.peak_bytes, 151);
    assert_eq!(bwd.peak_bytes, 131);
    assert_eq!(step.peak_bytes, 151);
    assert_eq!(fwd.parent, Some(step.id));
    assert_eq!(step.parent, None);
    assert_eq!((step.calls, step.total_ns), (1, 110));
    // Spans come parents first.
    assert!(profile
        .spans
        .iter()
        .all(|m| m.parent.is_none_or(|p| p < m.id)));
}

#[test]
fn spans_open_at_finish_are_closed_at_end_and_a_snapshot_changes_nothing() {
    let mut s = Script::new();
    s.enter("train", SpanLabel::Plain);
    s.enter("inner", SpanLabel::Plain);
    s.alloc(0x10, 64, Category::Other);
    let mid = s.timeline.profile(1_000);
    let train = span(&mid, "train");
    assert_eq!((train.calls, train.total_ns), (1, 990));
    assert_eq!((train.residual_bytes, train.peak_bytes), (64, 64));
    assert_eq!(span(&mid, "train/inner").residual_bytes, 64);
    assert!(mid.iterations.is_empty());
    // The snapshot left the timeline as it was.
    s.free(0x10);
    s.exit();
    s.exit();
    let end = s.finish();
    assert_eq!(span(&end, "train").residual_bytes, 0);
    assert_eq!(span(&end, "train").calls, 1);
}

#[test]
fn out_of_order_exits_are_tolerated_and_forget_their_instances() {
    let mut s = Script::new();
    s.enter("outer", SpanLabel::Plain);
    s.enter("inner", SpanLabel::Plain);
    s.alloc(0x10, 8, Category::Other);
    let (outer, inner) = (s.stack[0], s.stack[1]);
    s.at(s.ts + 1, inner, EventKind::SpanExit { id: outer });
    s.at(s.ts + 2, inner, EventKind::SpanExit { id: outer }); // twice
    s.at(s.ts + 3, 0, EventKind::SpanExit { id: 777 }); // never entered
    s.ts += 10;
    s.alloc(0x20, 4, Category::Other); // still inside `inner`
    s.at(s.ts + 1, inner, EventKind::SpanExit { id: inner });
    s.stack.clear();
    s.free(0x10);
    s.free(0x20);
    assert_eq!(s.timeline.spans.instances_in_use(), 0);
    let profile = s.finish();
    assert_eq!(span(&profile, "outer").calls, 1);
    assert_eq!(span(&profile, "outer/inner").calls, 1);
    assert_eq!(span(&profile, "outer/inner").residual_bytes, 12);
    assert_eq!(span(&profile, "outer").bytes_allocated, 12);
    assert_eq!(profile.summary.final_live_bytes, 0);
}

#[test]
fn set_category_moves_live_bytes_between_categories() {
    let mut s = Script::new();
    s.alloc(0x10, 100, Category::Other);
    s.push(EventKind::SetCategory {
        device: DeviceId::CPU,
        addr: 0x10,
        category: Category::Parameter,
    });
    s.alloc(0x20, 10, Category::Other);
    let profile = s.finish();
    assert_eq!(
        profile.summary.peak_by_category,
        cats(&[(Category::Parameter, 100), (Category::Other, 10)])
    );
    let last = profile.timeline.last().expect("points");
    assert_eq!(
        last.by_category,
        cats(&[(Category::Parameter, 100), (Category::Other, 10)])
    );
}

#[test]
fn peak_is_the_highest_single_device_and_rows_cover_every_device() {
    let mut s = Script::new();
    let gpu = s.timeline.intern_device("cuda:0");
    s.alloc(0x10, 300, Category::Other);
    s.alloc_on(gpu, 1, 500, Category::Parameter);
    s.alloc_on(gpu, 2, 100, Category::Activation);
    s.push(EventKind::Free {
        device: gpu,
        addr: 2,
        size: 100,
    });
    s.alloc(0x20, 400, Category::Other); // cpu reaches 700, above the gpu's 600
    let profile = s.finish();
    assert_eq!(profile.summary.peak_bytes, 700);
    assert_eq!(profile.summary.peak_device, "cpu");
    assert_eq!(
        profile.summary.peak_by_category,
        cats(&[(Category::Other, 700)])
    );
    let rows: u64 = profile.peak_breakdown.iter().map(|r| r.bytes).sum();
    assert_eq!(rows, 1200, "cpu 700 and the gpu's 500 live at that instant");
    let gpu_stats = &profile.devices[1];
    assert_eq!(
        (gpu_stats.peak_bytes, gpu_stats.final_live_bytes),
        (600, 500)
    );
    assert_eq!(s.timeline.live_bytes(gpu), 500);
}

#[test]
fn breakdown_folds_rows_beyond_the_limit_into_other() {
    let mut s = Script::with(TimelineConfig {
        max_breakdown_rows: 3,
        top_allocations: 2,
        ..TimelineConfig::default()
    });
    for i in 0..6u64 {
        s.enter(&format!("s{i}"), SpanLabel::Plain);
        s.alloc(0x10 * (i + 1), 100 * (i + 1), Category::Other);
        s.exit();
    }
    let profile = s.finish();
    let rows: Vec<(&str, u64, u64)> = profile
        .peak_breakdown
        .iter()
        .map(|r| (r.span_path.as_str(), r.bytes, r.count))
        .collect();
    assert_eq!(
        rows,
        vec![("s5", 600, 1), ("s4", 500, 1), ("(other)", 1000, 4)]
    );
    assert_eq!(profile.largest_at_peak.len(), 2);
}

#[test]
fn pool_reports_fill_device_stats_even_without_allocations() {
    let mut s = Script::new();
    let tpu = s.timeline.intern_device("tpu:0");
    for (reserved, frag) in [(100u64, 0.1f64), (700, 0.5), (300, 0.2)] {
        s.push(EventKind::PoolState {
            device: tpu,
            capacity: 1000,
            reserved,
            largest_free: 1000 - reserved,
            fragmentation: frag,
        });
    }
    let profile = s.finish();
    let stats = profile
        .devices
        .iter()
        .find(|d| d.device == "tpu:0")
        .expect("pool device row");
    assert_eq!(stats.capacity_bytes, Some(1000));
    assert_eq!(stats.peak_reserved_bytes, Some(700));
    assert_eq!(stats.max_fragmentation, Some(0.5));
    assert_eq!(stats.alloc_count, 0);
    assert!(profile
        .pool_timeline
        .iter()
        .any(|p| p.reserved_bytes == 700));
    assert!(profile.pool_timeline.iter().all(|p| p.device == "tpu:0"));
    assert!(profile.timeline.is_empty());
}

/// Hardening III, row 12: a pool curve kept each bucket's highest report only, so a pool
/// emptied at the end still showed its last bucket's maximum. Curves end at their last report.
#[test]
fn pool_and_reserved_curves_end_at_their_last_report() {
    let mut s = Script::with(TimelineConfig {
        max_points_per_device: 5,
        ..TimelineConfig::default()
    });
    let tpu = s.timeline.intern_device("tpu:0");
    let gpu = s.timeline.intern_device("cuda:0");
    for step in 0..1000u64 {
        let reserved = if step == 999 { 0 } else { 151_552 + step % 7 };
        s.push(EventKind::PoolState {
            device: tpu,
            capacity: 1 << 20,
            reserved,
            largest_free: (1 << 20) - reserved,
            fragmentation: 0.0,
        });
        s.push(EventKind::Reserved {
            device: gpu,
            bytes: reserved * 2,
        });
    }
    let profile = s.finish();
    let last = profile.pool_timeline.last().unwrap();
    assert_eq!((last.device.as_str(), last.reserved_bytes), ("tpu:0", 0));
    assert!(profile.pool_timeline.len() <= 6);
    let last = profile.reserved_timeline.last().unwrap();
    assert_eq!((last.device.as_str(), last.reserved_bytes), ("cuda:0", 0));
    let gpu = profile
        .devices
        .iter()
        .find(|d| d.device == "cuda:0")
        .unwrap();
    assert_eq!(gpu.reserved_final_bytes, Some(0));
    assert_eq!(gpu.reserved_peak_bytes, Some((151_552 + 6) * 2));
}

/// What a device held before recording is taken once: the first report.
#[test]
fn a_device_s_memory_before_recording_is_its_first_report() {
    let mut s = Script::new();
    let gpu = s.timeline.intern_device("cuda:0");
    for (in_use, total) in [(500u64, 80_000u64), (900, 80_000)] {
        s.push(EventKind::DeviceMemory {
            device: gpu,
            in_use,
            total,
        });
    }
    let profile = s.finish();
    let gpu = profile
        .devices
        .iter()
        .find(|d| d.device == "cuda:0")
        .unwrap();
    assert_eq!(
        (gpu.context_bytes, gpu.capacity_bytes),
        (Some(500), Some(80_000))
    );
}

#[test]
fn a_timeline_can_move_to_the_collector_thread() {
    fn assert_send<T: Send + 'static>() {}
    assert_send::<Timeline>();
}

#[test]
fn dropped_events_are_reported_with_a_warning() {
    let mut s = Script::new();
    s.timeline.note_dropped(5);
    s.timeline.note_dropped(2);
    let profile = s.finish();
    assert_eq!(profile.summary.dropped_events, 7);
    assert_eq!(
        profile.warnings,
        [Warning::DroppedEvents {
            events: 7,
            mode: CaptureMode::before_modes()
        }]
    );
    s.timeline.set_capture_mode(CaptureMode::Lossless);
    let profile = s.finish();
    assert_eq!(
        profile.warnings,
        [Warning::DroppedEvents {
            events: 7,
            mode: CaptureMode::Lossless
        }]
    );
}

#[test]
fn iterations_track_residual_and_warn_when_it_grows_steadily() {
    let mut leaking = Script::new();
    let mut steady = Script::new();
    for i in 0..10u64 {
        for (s, keep) in [(&mut leaking, true), (&mut steady, false)] {
            s.enter("step", SpanLabel::Plain);
            s.alloc(0x1000 + i, 1024, Category::Other);
            s.alloc(0x9000, 4096, Category::Activation);
            s.free(0x9000);
            if !keep {
                s.free(0x1000 + i);
            }
            s.exit();
            // A one-off top-level span does not mark iterations.
            if i == 3 {
                s.enter("eval", SpanLabel::Plain);
                s.exit();
            }
        }
    }
    let leak = leaking.finish();
    assert_eq!(leak.iterations.len(), 10);
    assert_eq!(leak.iterations[0].delta_bytes, 0);
    assert!(leak
        .iterations
        .iter()
        .skip(1)
        .all(|i| i.delta_bytes == 1024));
    assert_eq!(leak.iterations[9].live_bytes, 10 * 1024);
    assert_eq!(leak.iterations[9].span, "step");
    assert_eq!(
        leak.warnings,
        [Warning::GrowingResidual {
            span: "step".into(),
            window: 9,
            grew: 9,
            total_bytes: 9 * 1024,
            per_iteration_bytes: 1024,
            iterations: 10,
            run_growth_bytes: 9 * 1024,
        }]
    );
    let fine = steady.finish();
    assert_eq!(fine.iterations.len(), 10);
    assert!(fine.warnings.is_empty(), "{:?}", fine.warnings);
}

mod bounds;
