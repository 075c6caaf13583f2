//! A realistic hand-built profile for tests: the outputs' unit tests, the HTML report's browser
//! tests and the command's tests all read it.
//!
//! It names only the profile crate's public types.
//!
//! It describes eight training steps of a small transformer on two GPUs with a CPU heap: four
//! categories with the classic shape (activations climb through forward and fall through
//! backward, gradients climb through backward, optimizer state appears at the first update), a
//! span tree `step → forward/backward/optimizer → layers`, live-at-peak rows with ops and
//! shapes, a slow CPU leak visible in the per-iteration residuals, and device pools. Its call
//! sites (sampled every 512 KiB) have deep stacks with inlined frames, several shares each (one
//! with a folded remainder), a site with no symbol in the middle, one that allocates a lot but
//! holds nothing at the peak, and a few MiB in sites past the listed ones.

use std::collections::BTreeMap;

use highwater_profile::model::{Category, Step};
use highwater_profile::{
    DeviceStats, IterationResidual, LiveAllocation, PeakRow, PoolPoint, Profile, ReservedPoint,
    RunMeta, SpanEvent, SpanMetrics, Summary, TimelinePoint, Warning,
};

mod call_sites;

use call_sites::call_sites;

const MIB: u64 = 1 << 20;
const GIB: u64 = 1 << 30;
const ITERATIONS: u64 = 8;
const POINTS_PER_ITERATION: u64 = 40;
const ITERATION_NS: u64 = 500_000_000;
const LAYERS: u64 = 8;
/// Bytes the CPU heap leaks per iteration.
const LEAK_PER_ITERATION: u64 = 4 * MIB;

/// Per-device sizes of each category at its highest.
struct DeviceModel {
    name: &'static str,
    parameter: u64,
    activation: u64,
    gradient: u64,
    optimizer: u64,
    other: u64,
    capacity: Option<u64>,
}

const DEVICES: [DeviceModel; 3] = [
    DeviceModel {
        name: "cpu",
        parameter: 0,
        activation: 96 * MIB,
        gradient: 0,
        optimizer: 0,
        other: 180 * MIB,
        capacity: None,
    },
    DeviceModel {
        name: "cuda:0",
        parameter: 3 * GIB / 2,
        activation: 5 * GIB / 2,
        gradient: 3 * GIB / 2,
        optimizer: 3 * GIB,
        other: 64 * MIB,
        capacity: Some(24 * GIB),
    },
    DeviceModel {
        name: "cuda:1",
        parameter: 3 * GIB / 2,
        activation: 2 * GIB,
        gradient: 3 * GIB / 2,
        optimizer: 3 * GIB,
        other: 32 * MIB,
        capacity: Some(24 * GIB),
    },
];

/// Live bytes by category on `device` at `iteration` + `frac` of it (frac in 0..=1).
fn live_at(device: &DeviceModel, iteration: u64, frac: f64) -> [u64; Category::COUNT] {
    let scale = |bytes: u64, x: f64| (bytes as f64 * x.clamp(0.0, 1.0)) as u64;
    let activation = if frac <= 0.4 {
        scale(device.activation, frac / 0.4)
    } else if frac <= 0.8 {
        scale(device.activation, 1.0 - (frac - 0.4) / 0.4)
    } else {
        0
    };
    let gradient = if frac <= 0.4 {
        0
    } else if frac <= 0.8 {
        scale(device.gradient, (frac - 0.4) / 0.4)
    } else {
        device.gradient
    };
    let optimizer_started = iteration > 0 || frac > 0.8;
    let mut optimizer = if optimizer_started {
        device.optimizer
    } else {
        0
    };
    if frac > 0.8 {
        optimizer += device.optimizer / 10;
    }
    // A little noise, and on the CPU the slow leak.
    // (zero at iteration boundaries, so the residuals show the leak alone).
    let k = (frac * POINTS_PER_ITERATION as f64).round() as u64 % POINTS_PER_ITERATION;
    let wobble = if k == 0 {
        0.0
    } else {
        ((iteration * 7 + k * 13) % 17) as f64 / 17.0
    };
    let mut other = scale(device.other, 0.85 + 0.15 * wobble);
    if device.name == "cpu" {
        other += LEAK_PER_ITERATION * iteration + scale(LEAK_PER_ITERATION, frac);
    }
    [device.parameter, activation, gradient, optimizer, other]
}

fn by_category(values: [u64; Category::COUNT]) -> BTreeMap<Category, u64> {
    Category::ALL
        .into_iter()
        .zip(values)
        .filter(|(_, v)| *v > 0)
        .collect()
}

fn span(
    spans: &mut Vec<SpanMetrics>,
    parent: Option<u32>,
    name: &str,
    step: Option<Step>,
    calls: u64,
    total_ns: u64,
    bytes: (u64, u64, u64),
) -> u32 {
    let id = spans.len() as u32;
    spans.push({
        let mut span_metrics = SpanMetrics::default();
        span_metrics.id = id;
        span_metrics.parent = parent;
        span_metrics.name = name.to_string();
        span_metrics.step = step;
        span_metrics.category = None;
        span_metrics.calls = calls;
        span_metrics.total_ns = total_ns;
        span_metrics.bytes_allocated = bytes.0;
        span_metrics.alloc_count = bytes.0 / (3 * MIB) + calls;
        span_metrics.peak_bytes = bytes.1;
        span_metrics.residual_bytes = bytes.2;
        span_metrics
    });
    id
}

/// Fine points between each pair of the curve's points in the iteration that peaked.
const FINE_STEPS: u64 = 10;

/// The peak window: the peak device's curve over the iteration that holds `peak_ts`, ten
/// points between each of the curve's (each category moving in a straight line, so no point
/// passes the curve's own), as the analysis keeps it at fine resolution.
fn peak_window(timeline: &[TimelinePoint], device: &str, peak_ts: u64) -> Vec<TimelinePoint> {
    let start = peak_ts / ITERATION_NS * ITERATION_NS;
    let coarse: Vec<&TimelinePoint> = timeline
        .iter()
        .filter(|p| p.device == device)
        .filter(|p| p.timestamp_ns >= start && p.timestamp_ns <= start + ITERATION_NS)
        .collect();
    let mut fine = Vec::new();
    for pair in coarse.windows(2) {
        let (a, b) = (pair[0], pair[1]);
        for j in 0..FINE_STEPS {
            let values: [u64; Category::COUNT] = Category::ALL.map(|category| {
                let from = a.by_category.get(&category).copied().unwrap_or(0) as f64;
                let to = b.by_category.get(&category).copied().unwrap_or(0) as f64;
                (from + (to - from) * j as f64 / FINE_STEPS as f64) as u64
            });
            fine.push({
                let mut timeline_point = TimelinePoint::default();
                timeline_point.timestamp_ns =
                    a.timestamp_ns + (b.timestamp_ns - a.timestamp_ns) * j / FINE_STEPS;
                timeline_point.device = device.to_string();
                timeline_point.live_bytes = values.iter().sum();
                timeline_point.by_category = by_category(values);
                timeline_point
            });
        }
    }
    if let Some(last) = coarse.last() {
        fine.push((*last).clone());
    }
    fine
}

/// A profile of eight training steps on `cpu`, `cuda:0` and `cuda:1` with no dropped events.
pub fn sample_profile() -> Profile {
    let duration_ns = ITERATIONS * ITERATION_NS;
    let mut timeline = Vec::new();
    let mut pool_timeline = Vec::new();
    let mut devices = Vec::new();
    let mut peak = (0u64, 0u64, String::new(), BTreeMap::new());
    let mut final_live = 0u64;
    let mut final_by_category: BTreeMap<Category, u64> = BTreeMap::new();
    for device in &DEVICES {
        let mut stats = DeviceStats::default();
        stats.device = device.name.to_string();
        stats.capacity_bytes = device.capacity;
        let mut max_reserved = 0u64;
        let mut max_fragmentation = 0f64;
        for iteration in 0..ITERATIONS {
            for k in 0..POINTS_PER_ITERATION {
                let frac = k as f64 / POINTS_PER_ITERATION as f64;
                let t = iteration * ITERATION_NS + ITERATION_NS * k / POINTS_PER_ITERATION;
                let values = live_at(device, iteration, frac);
                let live: u64 = values.iter().sum();
                if live > stats.peak_bytes {
                    stats.peak_bytes = live;
                    stats.peak_timestamp_ns = t;
                    stats.peak_by_category = by_category(values);
                }
                timeline.push({
                    let mut timeline_point = TimelinePoint::default();
                    timeline_point.timestamp_ns = t;
                    timeline_point.device = device.name.to_string();
                    timeline_point.live_bytes = live;
                    timeline_point.by_category = by_category(values);
                    timeline_point
                });
                if let Some(capacity) = device.capacity {
                    // A caching pool: reserved rounds live up to 2 MiB blocks and keeps a cache.
                    let cached = GIB / 4 + (k % 5) * 64 * MIB;
                    let reserved = (live.div_ceil(2 * MIB) * 2 * MIB + cached).min(capacity);
                    let fragmentation = 0.05 + 0.2 * frac + 0.02 * (iteration % 3) as f64;
                    let free = capacity - reserved;
                    max_reserved = max_reserved.max(reserved);
                    max_fragmentation = max_fragmentation.max(fragmentation);
                    pool_timeline.push({
                        let mut pool_point = PoolPoint::default();
                        pool_point.timestamp_ns = t;
                        pool_point.device = device.name.to_string();
                        pool_point.capacity_bytes = capacity;
                        pool_point.reserved_bytes = reserved;
                        pool_point.largest_free_bytes =
                            (free as f64 * (1.0 - fragmentation)) as u64;
                        pool_point.fragmentation = fragmentation;
                        pool_point
                    });
                }
            }
        }
        let end = live_at(device, ITERATIONS - 1, 1.0);
        stats.final_live_bytes = end.iter().sum();
        final_live += stats.final_live_bytes;
        for (category, bytes) in by_category(end) {
            *final_by_category.entry(category).or_default() += bytes;
        }
        stats.alloc_count = 40_000 + stats.peak_bytes / MIB;
        stats.free_count = stats.alloc_count - 1_200;
        if device.capacity.is_some() {
            stats.peak_reserved_bytes = Some(max_reserved);
            stats.max_fragmentation = Some(max_fragmentation);
        }
        if stats.peak_bytes > peak.0 {
            peak = (
                stats.peak_bytes,
                stats.peak_timestamp_ns,
                device.name.to_string(),
                stats.peak_by_category.clone(),
            );
        }
        devices.push(stats);
    }
    let (peak_bytes, peak_ts, peak_device, peak_by_category) = peak;
    let peak_window = peak_window(&timeline, &peak_device, peak_ts);
    // A quarter of the activations at the peak are scratch the layer frees before it returns.
    let peak_temporary_by_category: BTreeMap<Category, u64> = peak_by_category
        .iter()
        .filter(|(category, _)| **category == Category::Activation)
        .map(|(category, bytes)| (*category, bytes / 4))
        .collect();

    let mut peak_breakdown = peak_rows(&peak_by_category, &peak_device);
    let largest_at_peak = peak_breakdown
        .iter()
        .take(10)
        .map(|row| {
            let mut live_allocation = LiveAllocation::default();
            live_allocation.bytes = row.bytes / row.count.max(1);
            live_allocation.device = row.device.clone();
            live_allocation.category = row.category;
            live_allocation.span_path = row.span_path.clone();
            live_allocation.op = row.op.clone();
            live_allocation.shape = row.shape.clone();
            live_allocation.timestamp_ns = match row.category {
                Category::Parameter => ITERATION_NS / 20,
                Category::Optimizer => ITERATION_NS * 85 / 100,
                _ => peak_ts.saturating_sub(ITERATION_NS / 10),
            };
            live_allocation.thread = 1;
            live_allocation
        })
        .collect();

    let (spans, span_events) = span_tree_and_events();
    let (sites, sampling) = call_sites(&mut peak_breakdown, &spans);

    let iterations = (0..ITERATIONS)
        .map(|index| {
            let live: u64 = DEVICES
                .iter()
                .map(|d| live_at(d, index, 1.0).iter().sum::<u64>())
                .sum();
            let previous: u64 = if index == 0 {
                DEVICES.iter().map(|d| d.parameter + d.other * 6 / 10).sum()
            } else {
                DEVICES
                    .iter()
                    .map(|d| live_at(d, index - 1, 1.0).iter().sum::<u64>())
                    .sum()
            };
            {
                let mut iteration_residual = IterationResidual::default();
                iteration_residual.index = index;
                iteration_residual.span = "step".to_string();
                iteration_residual.end_timestamp_ns = (index + 1) * ITERATION_NS - 1;
                iteration_residual.live_bytes = live;
                iteration_residual.delta_bytes = live as i64 - previous as i64;
                iteration_residual
            }
        })
        .collect();

    let alloc_count: u64 = devices.iter().map(|d| d.alloc_count).sum();
    let free_count: u64 = devices.iter().map(|d| d.free_count).sum();
    let mut summary = Summary::default();
    summary.peak_bytes = peak_bytes;
    summary.peak_timestamp_ns = peak_ts;
    summary.peak_device = peak_device;
    summary.peak_by_category = peak_by_category;
    summary.peak_temporary_by_category = peak_temporary_by_category;
    summary.alloc_count = alloc_count;
    summary.free_count = free_count;
    summary.realloc_count = 3_120;
    summary.total_alloc_bytes = 171 * GIB + 300 * MIB;
    summary.autograd_retained_bytes = DEVICES[1].activation;
    summary.reorder_repairs = 2;
    summary.final_live_bytes = final_live;
    summary.final_by_category = final_by_category;
    summary.duration_ns = duration_ns;
    summary.event_count = 2 * alloc_count + 5_000;
    let mut profile = Profile::empty();
    profile.meta = RunMeta::default();
    profile.meta.program = "train_gpt".to_string();
    profile.meta.highwater_version = "0.1.0".to_string();
    profile.meta.started_unix_ms = 1_764_489_600_000;
    profile.meta.clock = "tsc".to_string();
    profile.meta.threads = 3;
    profile.meta.alloc_log = None;
    profile.meta.pid = 0;
    profile.meta.partial = false;
    profile.meta.checkpoint_unix_ms = None;
    profile.summary = summary;
    profile.timeline = timeline;
    profile.peak_window = peak_window;
    profile.peak_breakdown = peak_breakdown;
    profile.largest_at_peak = largest_at_peak;
    profile.spans = spans;
    profile.iterations = iterations;
    profile.devices = devices;
    profile.pool_timeline = pool_timeline;
    profile.warnings = vec![Warning::GrowingResidual {
        span: "step".into(),
        window: ITERATIONS - 1,
        grew: ITERATIONS - 1,
        total_bytes: ((ITERATIONS - 1) * LEAK_PER_ITERATION) as i64,
        per_iteration_bytes: LEAK_PER_ITERATION as i64,
        iterations: ITERATIONS,
        run_growth_bytes: ((ITERATIONS - 1) * LEAK_PER_ITERATION) as i64,
    }];
    profile.span_events = span_events;
    profile.sites = sites;
    profile.sampling = sampling;
    profile
}

/// [`sample_profile`] with events dropped while recording, and the warning that goes with it.
pub fn sample_profile_with_drops() -> Profile {
    let mut profile = sample_profile();
    profile.summary.dropped_events = 1_234;
    profile.summary.unknown_frees = 87;
    profile.warnings.insert(
        0,
        Warning::DroppedEvents {
            events: 1_234,
            mode: highwater_profile::CaptureMode::DropWhenFull,
        },
    );
    profile
}

/// [`sample_profile`] as if cuda:0's driver had been recorded (the `cuda` feature): its pools'
/// reserved bytes follow the live bytes 25 % higher and end at 1 GiB, and 450 MiB were in use
/// before the first allocation.
pub fn sample_profile_with_driver() -> Profile {
    let mut profile = sample_profile();
    let mut peak = 0;
    profile.reserved_timeline = profile
        .timeline
        .iter()
        .filter(|p| p.device == "cuda:0")
        .map(|p| {
            let reserved_bytes = p.live_bytes + p.live_bytes / 4;
            peak = peak.max(reserved_bytes);
            {
                let mut reserved_point = ReservedPoint::default();
                reserved_point.timestamp_ns = p.timestamp_ns;
                reserved_point.device = p.device.clone();
                reserved_point.reserved_bytes = reserved_bytes;
                reserved_point
            }
        })
        .collect();
    profile.reserved_timeline.push({
        let mut reserved_point = ReservedPoint::default();
        reserved_point.timestamp_ns = profile.summary.duration_ns;
        reserved_point.device = "cuda:0".into();
        reserved_point.reserved_bytes = GIB;
        reserved_point
    });
    let cuda0 = profile
        .devices
        .iter_mut()
        .find(|d| d.device == "cuda:0")
        .expect("the sample has cuda:0");
    cuda0.reserved_peak_bytes = Some(peak);
    cuda0.reserved_final_bytes = Some(GIB);
    cuda0.context_bytes = Some(450 * MIB);
    profile
}

/// Live-at-peak rows on `device` whose bytes add up to `by_category` exactly.
fn peak_rows(by_category: &BTreeMap<Category, u64>, device: &str) -> Vec<PeakRow> {
    let get = |c: Category| by_category.get(&c).copied().unwrap_or(0);
    let row = |path: String, op: &str, shape: &[u64], category, bytes: u64, count| {
        let mut peak_row = PeakRow::default();
        peak_row.span_path = path;
        peak_row.op = Some(op.to_string());
        peak_row.shape = Some(shape.to_vec());
        peak_row.dtype = Some("bf16".to_string());
        peak_row.category = category;
        peak_row.device = device.to_string();
        peak_row.bytes = bytes;
        peak_row.count = count;
        peak_row.top_sites = Vec::new();
        peak_row
    };
    let mut rows = Vec::new();
    // Activations: per layer, attention and MLP intermediates; later layers a little bigger.
    let activation = get(Category::Activation);
    let mut given = 0;
    let parts: [(&str, &str, &[u64], u64); 4] = [
        ("attn", "matmul", &[16, 1024, 3, 2048], 5),
        ("attn", "softmax", &[16, 16, 1024, 1024], 3),
        ("mlp", "linear", &[16, 1024, 8192], 4),
        ("mlp", "gelu", &[16, 1024, 8192], 2),
    ];
    let weight_sum: u64 = (0..LAYERS).map(|l| 10 + l).sum::<u64>() * 14;
    for layer in 0..LAYERS {
        for (block, op, shape, weight) in parts {
            let bytes = activation * (10 + layer) * weight / weight_sum;
            given += bytes;
            rows.push(row(
                format!("step/forward/layer{layer}/{block}"),
                op,
                shape,
                Category::Activation,
                bytes,
                1 + weight % 3,
            ));
        }
    }
    rows.push(row(
        "step/forward/embed".to_string(),
        "embedding",
        &[16, 1024, 2048],
        Category::Activation,
        activation - given,
        1,
    ));
    // Parameters: one row per layer plus the embedding.
    let parameter = get(Category::Parameter);
    let per_layer = parameter / (LAYERS + 2);
    for layer in 0..LAYERS {
        rows.push(row(
            format!("init/layer{layer}"),
            "randn",
            &[2048, 6144],
            Category::Parameter,
            per_layer,
            6,
        ));
    }
    rows.push(row(
        "init/embed".to_string(),
        "randn",
        &[50304, 2048],
        Category::Parameter,
        parameter - per_layer * LAYERS,
        1,
    ));
    // Optimizer state: Adam's two moments.
    let optimizer = get(Category::Optimizer);
    for (op, share) in [
        ("exp_avg", optimizer / 2),
        ("exp_avg_sq", optimizer - optimizer / 2),
    ] {
        rows.push(row(
            "step/optimizer/adam".to_string(),
            op,
            &[2048, 6144],
            Category::Optimizer,
            share,
            2 * LAYERS + 2,
        ));
    }
    let gradient = get(Category::Gradient);
    if gradient > 0 {
        rows.push(row(
            "step/backward".to_string(),
            "matmul_backward",
            &[2048, 6144],
            Category::Gradient,
            gradient,
            LAYERS + 1,
        ));
    }
    let other = get(Category::Other);
    if other > 0 {
        rows.push({
            let mut peak_row = PeakRow::default();
            peak_row.span_path = String::new();
            peak_row.op = None;
            peak_row.shape = None;
            peak_row.dtype = None;
            peak_row.category = Category::Other;
            peak_row.device = device.to_string();
            peak_row.bytes = other;
            peak_row.count = 412;
            peak_row.top_sites = Vec::new();
            peak_row
        });
    }
    rows.retain(|r| r.bytes > 0);
    rows.sort_by_key(|row| std::cmp::Reverse(row.bytes));
    rows
}

/// The span tree with metrics, and every span instance on two threads.
fn span_tree_and_events() -> (Vec<SpanMetrics>, Vec<SpanEvent>) {
    let n = ITERATIONS;
    let it = ITERATION_NS;
    let mut spans = Vec::new();
    let mut events = Vec::new();
    let act = DEVICES[1].activation + DEVICES[2].activation;
    let grad = DEVICES[1].gradient + DEVICES[2].gradient;
    let opt = DEVICES[1].optimizer + DEVICES[2].optimizer;
    let peak = 7 * GIB;
    let init = span(
        &mut spans,
        None,
        "init",
        None,
        1,
        it / 5,
        (3 * GIB, 3 * GIB, 3 * GIB),
    );
    let step = span(
        &mut spans,
        None,
        "step",
        None,
        n,
        n * it * 98 / 100,
        (
            n * (act + grad + opt / 10) + opt,
            peak,
            opt + n * LEAK_PER_ITERATION,
        ),
    );
    let fwd = span(
        &mut spans,
        Some(step),
        "forward",
        Some(Step::Forward),
        n,
        n * it * 2 / 5,
        (n * act, peak, act),
    );
    span(
        &mut spans,
        Some(fwd),
        "embed",
        None,
        n,
        n * it / 50,
        (n * 64 * MIB, 4 * GIB, 64 * MIB),
    );
    for layer in 0..LAYERS {
        let l = span(
            &mut spans,
            Some(fwd),
            &format!("layer{layer}"),
            None,
            n,
            n * it * 38 / 100 / LAYERS,
            (
                n * act / LAYERS,
                4 * GIB + layer * act / LAYERS,
                act / LAYERS,
            ),
        );
        for (block, share) in [("attn", 3), ("mlp", 2)] {
            span(
                &mut spans,
                Some(l),
                block,
                None,
                n,
                n * it * 38 / 100 / LAYERS * share / 5,
                (
                    n * act / LAYERS * share / 5,
                    4 * GIB + layer * act / LAYERS,
                    act / LAYERS * share / 5,
                ),
            );
        }
    }
    let bwd = span(
        &mut spans,
        Some(step),
        "backward",
        Some(Step::Backward),
        n,
        n * it * 2 / 5,
        (n * grad, peak - GIB / 2, grad),
    );
    for layer in (0..LAYERS).rev() {
        span(
            &mut spans,
            Some(bwd),
            &format!("layer{layer}"),
            None,
            n,
            n * it * 39 / 100 / LAYERS,
            (n * grad / LAYERS, peak - GIB, grad / LAYERS),
        );
    }
    let optim = span(
        &mut spans,
        Some(step),
        "optimizer",
        Some(Step::Optimizer),
        n,
        n * it * 18 / 100,
        (opt + n * opt / 10, 6 * GIB, opt),
    );
    span(
        &mut spans,
        Some(optim),
        "adam",
        None,
        n,
        n * it * 15 / 100,
        (opt + n * opt / 10, 6 * GIB, opt),
    );
    span(
        &mut spans,
        Some(optim),
        "zero_grad",
        None,
        n,
        n * it * 2 / 100,
        (0, 5 * GIB, 0),
    );
    span(
        &mut spans,
        None,
        "data_loader",
        None,
        n,
        n * it * 30 / 100,
        (n * 96 * MIB, 300 * MIB, n * LEAK_PER_ITERATION),
    );
    let _ = init;

    // Instances: step and its children on thread 1, data loading on thread 2.
    let mut tree = Profile::default();
    tree.spans = spans.clone();
    let ids: std::collections::HashMap<String, u32> =
        tree.span_paths().into_iter().zip(0..).collect();
    let mut push = |thread, _name: &str, path: String, start_ns, duration_ns, depth| {
        events.push({
            let mut span_event = SpanEvent::default();
            span_event.thread = thread;
            span_event.span = ids[&path];
            span_event.start_ns = start_ns;
            span_event.duration_ns = duration_ns;
            span_event.depth = depth;
            span_event
        });
    };
    for i in 0..n {
        let t0 = i * it;
        push(1, "step", "step".into(), t0 + it / 100, it * 98 / 100, 0);
        push(
            1,
            "forward",
            "step/forward".into(),
            t0 + it / 100,
            it * 39 / 100,
            1,
        );
        push(
            1,
            "embed",
            "step/forward/embed".into(),
            t0 + it / 100,
            it / 50,
            2,
        );
        let layer_ns = it * 36 / 100 / LAYERS;
        for layer in 0..LAYERS {
            let start = t0 + it * 3 / 100 + layer * layer_ns;
            let path = format!("step/forward/layer{layer}");
            push(
                1,
                &format!("layer{layer}"),
                path.clone(),
                start,
                layer_ns,
                2,
            );
            let attn = layer_ns * 3 / 5;
            push(1, "attn", format!("{path}/attn"), start, attn, 3);
            push(
                1,
                "mlp",
                format!("{path}/mlp"),
                start + attn,
                layer_ns - attn,
                3,
            );
        }
        push(
            1,
            "backward",
            "step/backward".into(),
            t0 + it * 40 / 100,
            it * 40 / 100,
            1,
        );
        for (k, layer) in (0..LAYERS).rev().enumerate() {
            let start = t0 + it * 40 / 100 + k as u64 * it * 5 / 100;
            let path = format!("step/backward/layer{layer}");
            push(1, &format!("layer{layer}"), path, start, it * 5 / 100, 2);
        }
        push(
            1,
            "optimizer",
            "step/optimizer".into(),
            t0 + it * 80 / 100,
            it * 18 / 100,
            1,
        );
        push(
            1,
            "adam",
            "step/optimizer/adam".into(),
            t0 + it * 80 / 100,
            it * 15 / 100,
            2,
        );
        push(
            1,
            "zero_grad",
            "step/optimizer/zero_grad".into(),
            t0 + it * 95 / 100,
            it * 2 / 100,
            2,
        );
        push(
            2,
            "data_loader",
            "data_loader".into(),
            t0 + it * 60 / 100,
            it * 30 / 100,
            0,
        );
    }
    (spans, events)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sample_is_coherent() {
        let p = sample_profile();
        assert_eq!(p.summary.peak_device, "cuda:0");
        let at_peak = p
            .timeline
            .iter()
            .find(|t| t.timestamp_ns == p.summary.peak_timestamp_ns && t.device == "cuda:0")
            .unwrap();
        assert_eq!(at_peak.live_bytes, p.summary.peak_bytes);
        let rows: u64 = p.peak_breakdown.iter().map(|r| r.bytes).sum();
        assert_eq!(rows, p.summary.peak_bytes);
        assert!(p.timeline.len() >= 900);
        let categories: std::collections::BTreeSet<_> = p
            .timeline
            .iter()
            .flat_map(|t| t.by_category.keys())
            .collect();
        assert_eq!(categories.len(), 5);
        assert!(p.spans.iter().all(|s| s.parent.is_none_or(|x| x < s.id)));
        // The sites and the unlisted rest account for the peak; every row names its site.
        let sites: u64 = p.sites.iter().map(|s| s.peak_bytes).sum();
        assert_eq!(sites + p.sampling.unlisted_peak_bytes, p.summary.peak_bytes);
        assert!(p.peak_breakdown.iter().all(|r| r.top_sites.len() == 1));
        assert!(p.sites.iter().enumerate().all(|(i, s)| s.id as usize == i));
        assert!(p
            .sites
            .windows(2)
            .all(|w| w[0].peak_bytes >= w[1].peak_bytes));
        for site in &p.sites {
            assert!(site.shares.len() <= highwater_profile::MAX_SITE_SHARES);
            let shares: u64 = site.shares.iter().map(|s| s.peak_bytes).sum();
            assert_eq!(shares, site.peak_bytes);
        }
        assert!(p
            .sites
            .iter()
            .any(|s| s.shares.len() == highwater_profile::MAX_SITE_SHARES));
    }
}
