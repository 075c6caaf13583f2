//! Analysis and output costs over a recorded-looking 10 M-event stream (issue 7, items 3 and 5).
//!
//! **Replay.** The same deterministic stream ([`stream`]: four threads, nested
//! forward/backward/optimizer spans, 15–17 k live blocks, log-uniform sizes, frees and
//! reallocs) feeds highwater's streaming [`Timeline`] and [`candle_graph`], a re-implementation
//! of the analysis the `Timeline` replaced, kept here as the baseline. The baseline's cost grows
//! with the live set at every new peak and with the span count squared, so it runs on a prefix
//! (1 M events by default); the `Timeline` runs on that prefix
//! and on the whole stream.
//! Events per second count every event of the stream (allocations, frees, reallocs, span and
//! op events) for both, so the two rates compare directly.
//!
//! **Memory.** A counting global allocator reports the heap each analysis holds after the
//! replay (the `Timeline` before `profile`, the baseline's finished document) and the most it
//! held at once. Both sides pay the counter (a nanosecond or so per allocator call).
//!
//! **Output.** The profiles of the replays are written with `Profile::write` and read back with
//! `Profile::load` (file sizes too), and rendered as the HTML report and the Chrome trace;
//! the baseline's document is written and read as pretty JSON with serde_json the same way.
//!
//! **Live map.** One more row applies 1 M allocations that stay live and reports the heap the
//! `Timeline` holds per live block (the issue's budget is 48 bytes).
//!
//! **Before and after.** `HIGHWATER_BENCH_TIMELINE_ONLY=1` runs only the whole-stream replay
//! and the live-map row, and prints one JSON line (`timeline-only: {...}`): with
//! `scripts/compare_analysis_with_main.sh` the same bench source is built against `main` and against
//! the working tree and the two binaries run alternately, so the ratio comes from one run under
//! the same load. Replay rates are given per second of wall time and per second of the
//! replaying thread's CPU time (steadier on a shared machine).
//!
//! Not criterion: one replay of the whole stream takes seconds and the baseline tens of
//! seconds, so each case runs a fixed number of times (`HIGHWATER_BENCH_REPEAT`, default 3;
//! the baseline once) and the median is reported. Results are printed and written as JSON to
//! `HIGHWATER_BENCH_OUT` (default `target/highwater-bench/analysis.json`), which
//! `scripts/bench.py` turns into the tables of `BENCHMARKS.md`. Without `--bench` (as under
//! `cargo test --benches`) it makes a 50 k-event smoke run and writes nothing.
//!
//! ```text
//! cargo bench --bench analysis
//! HIGHWATER_BENCH_EVENTS=2000000 HIGHWATER_BENCH_PREFIX=200000 cargo bench --bench analysis
//! ```

use std::alloc::{GlobalAlloc, Layout, System};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use highwater::profile::analysis::{Timeline, TimelineConfig};
use highwater::Profile;
use serde_json::{json, Value};

mod stream;

use highwater_testkit::cpu::thread_cpu_time;

/// The stream's seed: change it and every figure changes a little, the ratios hardly.
const SEED: u64 = 0x6869_6768_7761_7465;

/// The system allocator, counting the bytes it holds and the most it held.
///
/// This bench runs on one thread, so the counters are updated with plain relaxed loads and
/// stores, no locked read-modify-write: about a nanosecond per call, which keeps the counting
/// from taxing the side that allocates more (the baseline). With several allocating threads
/// the figures would be approximate, never unsound.
struct CountingHeap;

static HELD: AtomicU64 = AtomicU64::new(0);
static MOST_HELD: AtomicU64 = AtomicU64::new(0);

fn count(added: u64, removed: u64) {
    let held = HELD
        .load(Ordering::Relaxed)
        .wrapping_add(added)
        .wrapping_sub(removed);
    HELD.store(held, Ordering::Relaxed);
    if held > MOST_HELD.load(Ordering::Relaxed) {
        MOST_HELD.store(held, Ordering::Relaxed);
    }
}

// SAFETY: every call is forwarded to `System` with the caller's arguments unchanged; the
// counters are plain atomics and never allocate.
unsafe impl GlobalAlloc for CountingHeap {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: the caller upholds `GlobalAlloc::alloc`'s contract, which we pass on.
        let block = unsafe { System.alloc(layout) };
        if !block.is_null() {
            count(layout.size() as u64, 0);
        }
        block
    }

    unsafe fn dealloc(&self, block: *mut u8, layout: Layout) {
        count(0, layout.size() as u64);
        // SAFETY: `block` came from `alloc` above with this `layout` (the caller's contract).
        unsafe { System.dealloc(block, layout) }
    }

    unsafe fn realloc(&self, block: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: the caller upholds `GlobalAlloc::realloc`'s contract, which we pass on.
        let moved = unsafe { System.realloc(block, layout, new_size) };
        if !moved.is_null() {
            count(new_size as u64, layout.size() as u64);
        }
        moved
    }
}

#[global_allocator]
static HEAP: CountingHeap = CountingHeap;

/// Heap held now, and a fresh start for the "most held" mark.
fn heap_mark() -> u64 {
    let held = HELD.load(Ordering::Relaxed);
    MOST_HELD.store(held, Ordering::Relaxed);
    held
}

fn env_usize(name: &str, default: usize) -> usize {
    match std::env::var(name) {
        Ok(value) => value
            .replace('_', "")
            .parse()
            .unwrap_or_else(|_| panic!("{name} must be a whole number, not {value:?}")),
        Err(_) => default,
    }
}

fn median(mut runs: Vec<Duration>) -> Duration {
    runs.sort();
    runs[runs.len() / 2]
}

fn secs(duration: Duration) -> f64 {
    duration.as_secs_f64()
}

/// One replay of the first `count` events through a fresh `Timeline`.
struct Replay {
    profile: Profile,
    apply: Duration,
    /// CPU time of this thread during the apply loop.
    apply_cpu: Duration,
    finish: Duration,
    /// Heap the `Timeline` held after the last event, before `profile`.
    retained: u64,
    /// Most heap held at once during the replay and `profile`.
    peak_heap: u64,
}

fn replay(stream: &stream::Stream, count: usize) -> Replay {
    let before = heap_mark();
    let mut timeline = Timeline::new(TimelineConfig::default());
    stream.prepare(&mut timeline);
    let began = Instant::now();
    let began_cpu = thread_cpu_time();
    for event in &stream.events[..count] {
        timeline.apply(event);
    }
    let apply = began.elapsed();
    let apply_cpu = thread_cpu_time().saturating_sub(began_cpu);
    let retained = HELD.load(Ordering::Relaxed).saturating_sub(before);
    let began = Instant::now();
    let profile = timeline.profile(stream.end_ns(count));
    let finish = began.elapsed();
    let peak_heap = MOST_HELD.load(Ordering::Relaxed).saturating_sub(before);
    drop(timeline);
    Replay {
        profile,
        apply,
        apply_cpu,
        finish,
        retained,
        peak_heap,
    }
}

/// Replays `count` events `repeat` times; figures of the median run by total time.
fn replay_case(stream: &stream::Stream, count: usize, repeat: usize) -> (Value, Profile) {
    let mut runs: Vec<Replay> = (0..repeat.max(1)).map(|_| replay(stream, count)).collect();
    runs.sort_by_key(|run| run.apply + run.finish);
    let all: Vec<f64> = runs
        .iter()
        .map(|run| secs(run.apply + run.finish))
        .collect();
    let mid = runs.swap_remove(runs.len() / 2);
    let total = secs(mid.apply + mid.finish);
    let (most_live, end_live) = stream.live_blocks(count);
    let value = json!({
        "name": "highwater_timeline",
        "events": count,
        "runs_s": all,
        "seconds": total,
        "apply_s": secs(mid.apply),
        "finish_s": secs(mid.finish),
        "events_per_s": count as f64 / total,
        "apply_cpu_s": secs(mid.apply_cpu),
        "apply_events_per_cpu_s": count as f64 / secs(mid.apply_cpu).max(1e-9),
        "retained_heap_bytes": mid.retained,
        "peak_heap_bytes": mid.peak_heap,
        "most_live_blocks": most_live,
        "end_live_blocks": end_live,
        "peak_bytes": mid.profile.summary.peak_bytes,
    });
    (value, mid.profile)
}

/// Heap a `Timeline` holds per live block once `blocks` allocations are live (no spans).
fn live_map_case(blocks: u64) -> Value {
    use highwater::profile::analysis::{DeviceId, Event, EventKind};
    use highwater::Category;
    let before = heap_mark();
    let mut timeline = Timeline::new(TimelineConfig::default());
    let began = Instant::now();
    for i in 0..blocks {
        timeline.apply(&Event {
            ts_ns: i,
            thread: (i % 4) as u32,
            span: 0,
            kind: EventKind::Alloc {
                device: DeviceId::CPU,
                addr: 0x7f00_0000_0000 + i * 48,
                size: 32 + i % 512,
                category: Category::from_index((i % 5) as u8),
            },
        });
    }
    let elapsed = began.elapsed();
    let retained = HELD.load(Ordering::Relaxed).saturating_sub(before);
    drop(timeline);
    json!({
        "name": "live_map",
        "live_blocks": blocks,
        "retained_heap_bytes": retained,
        "bytes_per_live_block": retained as f64 / blocks as f64,
        "seconds": secs(elapsed),
    })
}

/// Times `f` `repeat` times; the median, and the last result.
fn timed<T>(repeat: usize, mut f: impl FnMut() -> T) -> (Duration, T) {
    let mut runs = Vec::new();
    let mut last = None;
    for _ in 0..repeat.max(1) {
        let began = Instant::now();
        last = Some(f());
        runs.push(began.elapsed());
    }
    (median(runs), last.expect("ran at least once"))
}

/// Write, read and render costs of one of our profiles.
fn output_case(name: &str, events: usize, profile: &Profile, dir: &Path) -> Value {
    const REPEAT: usize = 5;
    let path = dir.join(format!("{name}.json"));
    let (write, ()) = timed(REPEAT, || profile.write(&path).expect("write the profile"));
    let json_bytes = std::fs::metadata(&path).expect("profile written").len();
    let (load, loaded) = timed(REPEAT, || Profile::load(&path).expect("load the profile"));
    assert_eq!(&loaded, profile, "a profile reads back as written");
    let (html, html_text) = timed(REPEAT, || highwater_export::html::render(profile));
    let (chrome, chrome_text) = timed(REPEAT, || highwater_export::chrome::render(profile));
    let _ = std::fs::remove_file(&path);
    json!({
        "name": name,
        "events": events,
        "write_s": secs(write),
        "load_s": secs(load),
        "json_bytes": json_bytes,
        "html_s": secs(html),
        "html_bytes": html_text.len(),
        "chrome_s": secs(chrome),
        "chrome_bytes": chrome_text.len(),
    })
}

fn output_dir() -> PathBuf {
    std::env::var_os("HIGHWATER_BENCH_OUT")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("target/highwater-bench/analysis.json"))
}

fn main() {
    // `cargo bench` passes `--bench`; `cargo test --benches` does not, and gets a smoke run
    // that checks the baseline against the Timeline in a second and writes no results.
    let measuring = std::env::args().any(|arg| arg == "--bench");
    let (events, prefix) = if measuring {
        (10_000_000, 1_000_000)
    } else {
        (50_000, 2_000)
    };
    let events = env_usize("HIGHWATER_BENCH_EVENTS", events);
    let prefix = env_usize("HIGHWATER_BENCH_PREFIX", prefix).min(events);
    let repeat = env_usize("HIGHWATER_BENCH_REPEAT", 3);
    let out = output_dir();
    let timeline_only = std::env::var_os("HIGHWATER_BENCH_TIMELINE_ONLY").is_some();

    let began = Instant::now();
    let stream = stream::generate(events, SEED);
    let generated = began.elapsed();
    let (most_live, end_live) = stream.live_blocks(events);
    println!(
        "stream: {events} events, {} training steps, at most {most_live} blocks live, \
         {end_live} at the end (generated in {:.2} s)",
        stream.iterations,
        secs(generated)
    );

    if timeline_only {
        let (full, _) = replay_case(&stream, events, repeat);
        let live_map = live_map_case(if measuring { 1_000_000 } else { 10_000 });
        println!(
            "timeline-only: {}",
            json!({ "replay": full, "live_map": live_map })
        );
        return;
    }

    // highwater's Timeline: the prefix, then the whole stream.
    let (ours_prefix, profile_prefix) = replay_case(&stream, prefix, repeat);
    println!("timeline, {prefix} events: {ours_prefix}");
    let (ours_full, profile_full) = replay_case(&stream, events, repeat);
    println!("timeline, {events} events: {ours_full}");

    // The baseline, on the prefix, once.
    let doc = candle_graph::document(&stream, prefix);
    let before = heap_mark();
    let began = Instant::now();
    let mut checkpoints = Vec::new();
    let (baseline_profile, metrics) = candle_graph::analyze(&doc, &mut checkpoints);
    let elapsed = began.elapsed();
    // The walk's second half, past the growth of the first steps: its rate in stream events
    // (memory records scaled by the stream events per record).
    let (half, (last_done, last_s)) = (
        checkpoints[checkpoints.len() / 2],
        checkpoints[checkpoints.len() - 1],
    );
    let per_record = prefix as f64 / doc.memory.len().max(1) as f64;
    let second_half_rate = (last_done - half.0) as f64 * per_record / (last_s - half.1).max(1e-9);
    let retained = HELD.load(Ordering::Relaxed).saturating_sub(before);
    let peak_heap = MOST_HELD.load(Ordering::Relaxed).saturating_sub(before);
    assert_eq!(
        baseline_profile.summary.peak_bytes, profile_prefix.summary.peak_bytes,
        "the baseline and the Timeline agree on the peak of the prefix"
    );
    let baseline = json!({
        "name": "candle_graph_baseline",
        "events": prefix,
        "runs_s": [secs(elapsed)],
        "seconds": secs(elapsed),
        "events_per_s": prefix as f64 / secs(elapsed),
        "second_half_events_per_s": second_half_rate,
        "checkpoints": checkpoints,
        "retained_heap_bytes": retained,
        "peak_heap_bytes": peak_heap,
        "memory_events": doc.memory.len(),
        "spans": doc.spans.len(),
        "timeline_points": baseline_profile.timeline.len(),
        "live_at_peak_rows": baseline_profile.peak_breakdown.len(),
        "node_metrics": metrics.len(),
        "peak_bytes": baseline_profile.summary.peak_bytes,
    });
    println!("baseline, {prefix} events: {baseline}");
    drop(metrics);

    // Output: our profiles, and the baseline's document written and read the same way.
    let dir = tempfile::tempdir().expect("a temporary directory");
    let out_prefix = output_case("highwater_prefix", prefix, &profile_prefix, dir.path());
    println!("output, {prefix} events: {out_prefix}");
    let out_full = output_case("highwater_full", events, &profile_full, dir.path());
    println!("output, {events} events: {out_full}");
    let out_baseline = candle_graph::output_case(&baseline_profile, prefix, dir.path());
    let live_map = live_map_case(if measuring { 1_000_000 } else { 10_000 });
    println!("live map: {live_map}");
    println!("output, baseline, {prefix} events: {out_baseline}");
    drop(baseline_profile);
    drop(doc);

    let results = json!({
        "stream": {
            "events": events,
            "prefix": prefix,
            "seed": SEED,
            "threads": 4,
            "training_steps": stream.iterations,
            "most_live_blocks": most_live,
            "end_live_blocks": end_live,
            "generate_s": secs(generated),
        },
        "replay": [ours_prefix, ours_full, baseline],
        "output": [out_prefix, out_full, out_baseline],
        "live_map": live_map,
    });
    if !measuring {
        println!("smoke run (no --bench): results not written");
        return;
    }
    if let Some(parent) = out.parent() {
        std::fs::create_dir_all(parent).expect("create the results directory");
    }
    std::fs::write(
        &out,
        serde_json::to_string_pretty(&results).expect("results serialise"),
    )
    .expect("write the results");
    println!("results: {}", out.display());
}

/// The baseline: the memory analysis of candle-graph, the code highwater's `Timeline`
/// replaced, re-implemented from its algorithm so its costs can be measured beside ours.
///
/// Its input is a trace document of string-keyed records (memory events, spans, ops). The
/// analysis does what the original did, in the same way:
///
/// 1. copies every memory event into an owned record and sorts them by time (ties broken by
///    the action's `Debug` text, then the tensor id);
/// 2. walks them keeping string-keyed maps per device: live bytes, a `BTreeMap` of live bytes
///    per category name (the name formatted on every event), and a map of live tensors;
/// 3. pushes a timeline point for every event, with its own clone of the device's category
///    map;
/// 4. at every new global peak, clones the whole live set into a vector and sorts it;
/// 5. for the per-node metrics, runs the analysis, walks the ops, and rolls the span tree up
///    by finding each span's children with a scan of all spans, recursively, from every span.
///
/// The stream's reallocs become a free and an alloc one nanosecond apart, as a trace of
/// tensors would show them. Kept in the bench, not the crate: it exists to be measured.
mod candle_graph {
    use std::collections::{BTreeMap, HashMap};
    use std::path::Path;
    use std::time::Instant;

    use highwater::profile::analysis::EventKind;
    use highwater::{Category, SpanLabel, Step};
    use serde::{Deserialize, Serialize};
    use serde_json::{json, Value};

    use super::stream::Stream;

    /// Alloc or free, as the trace records it.
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
    #[serde(rename_all = "snake_case")]
    pub enum Action {
        Alloc,
        Free,
    }

    /// A memory record of the trace document.
    #[derive(Debug, Clone)]
    pub struct MemoryRecord {
        pub timestamp_ns: u64,
        pub tensor_id: String,
        pub span_id: String,
        pub op_name: Option<String>,
        pub device: String,
        pub bytes: u64,
        pub action: Action,
        pub shape: Vec<usize>,
        pub dtype: String,
        pub category: Category,
    }

    /// A span record: id, parent, and the training step it marks.
    // `name` is carried, as in the original's records, but the analysis never reads it.
    #[allow(dead_code)]
    #[derive(Debug, Clone)]
    pub struct SpanRecord {
        pub id: String,
        pub parent_id: Option<String>,
        pub name: String,
        pub step: Option<Step>,
    }

    /// An op record: which span ran it and the output it made.
    // `op_name` is carried, as in the original's records, but the analysis never reads it.
    #[allow(dead_code)]
    #[derive(Debug, Clone)]
    pub struct OpRecord {
        pub span_id: String,
        pub op_name: String,
        pub shape: Vec<usize>,
        pub dtype: String,
        pub storage_bytes: Option<u64>,
    }

    /// The trace document the baseline reads.
    #[derive(Debug, Default)]
    pub struct Document {
        pub memory: Vec<MemoryRecord>,
        pub spans: Vec<SpanRecord>,
        pub ops: Vec<OpRecord>,
    }

    /// A point of the memory curve: one per memory event.
    #[derive(Debug, Clone, Serialize, Deserialize)]
    pub struct CurvePoint {
        pub timestamp_ns: u64,
        pub device: String,
        pub live_bytes: u64,
        pub heap_bytes: u64,
        pub free_bytes: u64,
        pub by_category: BTreeMap<String, u64>,
    }

    /// A tensor live at the peak.
    #[derive(Debug, Clone, Serialize, Deserialize)]
    pub struct LiveTensor {
        pub tensor_id: String,
        pub span_id: String,
        pub op_name: Option<String>,
        pub bytes: u64,
        pub shape: Vec<usize>,
        pub dtype: String,
        pub device: String,
        pub category: Category,
    }

    /// Per-device figures.
    #[derive(Debug, Clone, Serialize, Deserialize)]
    pub struct DeviceFigures {
        pub device: String,
        pub capacity_bytes: u64,
        pub peak_bytes: u64,
        pub peak_timestamp_ns: u64,
        pub alloc_count: u64,
        pub free_count: u64,
    }

    /// Headline figures.
    #[derive(Debug, Clone, Default, Serialize, Deserialize)]
    pub struct Headline {
        pub alloc_count: u64,
        pub free_count: u64,
        pub total_alloc_bytes: u64,
        pub peak_bytes: u64,
        pub peak_timestamp_ns: u64,
        pub peak_device: String,
        pub peak_by_category: BTreeMap<String, u64>,
        pub autograd_retained_bytes: u64,
    }

    /// The baseline's result document.
    #[derive(Debug, Clone, Serialize, Deserialize)]
    pub struct MemoryDocument {
        pub summary: Headline,
        pub timeline: Vec<CurvePoint>,
        pub peak_breakdown: Vec<LiveTensor>,
        pub by_device: Vec<DeviceFigures>,
    }

    /// Memory figures of one span or op node.
    // The original declares `residual_bytes` and never fills it in.
    #[allow(dead_code)]
    #[derive(Debug, Clone, Default)]
    pub struct NodeFigures {
        pub bytes: u64,
        pub peak_bytes: u64,
        pub residual_bytes: u64,
        pub storage_bytes: u64,
    }

    /// Builds the baseline's input from the first `count` events of `stream` (not timed: it
    /// stands for parsing a trace file).
    pub fn document(stream: &Stream, count: usize) -> Document {
        let mut doc = Document::default();
        // Innermost open op of each thread: (name, shape, dtype).
        let mut ops: HashMap<u32, Vec<(String, Vec<usize>, String)>> = HashMap::new();
        let shape_of = |id: Option<highwater::profile::analysis::ShapeId>| -> Vec<usize> {
            id.map(|s| {
                stream.shapes[s.0 as usize]
                    .iter()
                    .map(|&d| d as usize)
                    .collect()
            })
            .unwrap_or_default()
        };
        let span_id = |thread: u32, span: u32| -> String {
            if span == 0 {
                String::new()
            } else {
                format!("{thread}:{span}")
            }
        };
        for event in &stream.events[..count] {
            let span = span_id(event.thread, event.span);
            let op = ops
                .get(&event.thread)
                .and_then(|stack| stack.last())
                .cloned();
            let record = |ts, addr: u64, bytes, action, category| {
                let (op_name, shape, dtype) = match (&op, action) {
                    (Some((name, shape, dtype)), Action::Alloc) => {
                        (Some(name.clone()), shape.clone(), dtype.clone())
                    }
                    _ => (None, Vec::new(), String::new()),
                };
                MemoryRecord {
                    timestamp_ns: ts,
                    tensor_id: format!("{addr:#x}"),
                    span_id: span.clone(),
                    op_name,
                    device: "cpu".to_string(),
                    bytes,
                    action,
                    shape,
                    dtype,
                    category,
                }
            };
            match event.kind {
                EventKind::Alloc {
                    addr,
                    size,
                    category,
                    ..
                } => doc
                    .memory
                    .push(record(event.ts_ns, addr, size, Action::Alloc, category)),
                EventKind::Free { addr, size, .. } => doc.memory.push(record(
                    event.ts_ns,
                    addr,
                    size,
                    Action::Free,
                    Category::Other,
                )),
                EventKind::Realloc {
                    old_addr,
                    old_size,
                    new_addr,
                    new_size,
                    category,
                    ..
                } => {
                    doc.memory.push(record(
                        event.ts_ns,
                        old_addr,
                        old_size,
                        Action::Free,
                        Category::Other,
                    ));
                    doc.memory.push(record(
                        event.ts_ns + 1,
                        new_addr,
                        new_size,
                        Action::Alloc,
                        category,
                    ));
                }
                EventKind::SpanEnter { id, name, label } => doc.spans.push(SpanRecord {
                    id: span_id(event.thread, id),
                    parent_id: (event.span != 0).then(|| span.clone()),
                    name: stream.name(name).to_string(),
                    step: match label {
                        SpanLabel::Step(step) => Some(step),
                        _ => None,
                    },
                }),
                EventKind::OpBegin {
                    name, shape, dtype, ..
                } => {
                    let entry = (
                        stream.name(name).to_string(),
                        shape_of(shape),
                        dtype.map_or_else(String::new, |d| stream.name(d).to_string()),
                    );
                    doc.ops.push(OpRecord {
                        span_id: span.clone(),
                        op_name: entry.0.clone(),
                        shape: entry.1.clone(),
                        dtype: entry.2.clone(),
                        storage_bytes: None,
                    });
                    ops.entry(event.thread).or_default().push(entry);
                }
                EventKind::OpEnd => {
                    if let Some(stack) = ops.get_mut(&event.thread) {
                        stack.pop();
                    }
                }
                _ => {}
            }
        }
        doc
    }

    fn category_name(category: Category) -> String {
        format!("{category:?}").to_ascii_lowercase()
    }

    fn dtype_bytes(dtype: &str) -> Option<u64> {
        match dtype.trim().to_ascii_lowercase().as_str() {
            "u8" | "i8" | "bool" | "f8" => Some(1),
            "u16" | "i16" | "f16" | "bf16" => Some(2),
            "u32" | "i32" | "f32" => Some(4),
            "u64" | "i64" | "f64" => Some(8),
            _ => None,
        }
    }

    fn storage_bytes(shape: &[usize], dtype: &str) -> u64 {
        let elements = shape
            .iter()
            .fold(1u64, |product, &dim| product.saturating_mul(dim as u64));
        if elements == 0 {
            return 0;
        }
        dtype_bytes(dtype).map_or(0, |size| elements.saturating_mul(size))
    }

    /// The memory document: steps 1–4 above. `checkpoints` gets (records done, time since
    /// the start) every tenth of the records; it only watches.
    pub fn memory_document(doc: &Document, checkpoints: &mut Vec<(usize, f64)>) -> MemoryDocument {
        let began = Instant::now();
        let every = (doc.memory.len() / 10).max(1);
        let mut events: Vec<MemoryRecord> = doc.memory.to_vec();
        events.sort_by(|a, b| {
            a.timestamp_ns
                .cmp(&b.timestamp_ns)
                .then_with(|| format!("{:?}", a.action).cmp(&format!("{:?}", b.action)))
                .then_with(|| a.tensor_id.cmp(&b.tensor_id))
        });
        let steps: HashMap<String, Step> = doc
            .spans
            .iter()
            .filter_map(|span| span.step.map(|step| (span.id.clone(), step)))
            .collect();

        let mut live_by_device: HashMap<String, u64> = HashMap::new();
        let mut categories_by_device: HashMap<String, BTreeMap<String, u64>> = HashMap::new();
        let mut live: HashMap<String, LiveTensor> = HashMap::new();
        let mut peaks: HashMap<String, (u64, u64)> = HashMap::new();
        let capacities: HashMap<String, u64> = HashMap::new();
        let mut allocs_by_device: HashMap<String, u64> = HashMap::new();
        let mut frees_by_device: HashMap<String, u64> = HashMap::new();
        let mut timeline = Vec::new();
        let mut summary = Headline::default();
        let mut peak_breakdown: Vec<LiveTensor> = Vec::new();
        let mut backward_seen = false;

        for (done, event) in events.iter().enumerate() {
            if done % every == 0 {
                checkpoints.push((done, began.elapsed().as_secs_f64()));
            }
            let device = event.device.clone();
            let device_live = live_by_device.entry(device.clone()).or_insert(0);
            let categories = categories_by_device.entry(device.clone()).or_default();
            let key = category_name(event.category);
            match event.action {
                Action::Alloc => {
                    summary.alloc_count += 1;
                    *allocs_by_device.entry(device.clone()).or_insert(0) += 1;
                    summary.total_alloc_bytes =
                        summary.total_alloc_bytes.saturating_add(event.bytes);
                    *device_live = device_live.saturating_add(event.bytes);
                    let slot = categories.entry(key).or_insert(0);
                    *slot = slot.saturating_add(event.bytes);
                    live.insert(
                        event.tensor_id.clone(),
                        LiveTensor {
                            tensor_id: event.tensor_id.clone(),
                            span_id: event.span_id.clone(),
                            op_name: event.op_name.clone(),
                            bytes: event.bytes,
                            shape: event.shape.clone(),
                            dtype: event.dtype.clone(),
                            device: device.clone(),
                            category: event.category,
                        },
                    );
                }
                Action::Free => {
                    summary.free_count += 1;
                    *frees_by_device.entry(device.clone()).or_insert(0) += 1;
                    match live.remove(&event.tensor_id) {
                        Some(gone) => {
                            *device_live = device_live.saturating_sub(gone.bytes);
                            if let Some(slot) = categories.get_mut(&category_name(gone.category)) {
                                *slot = slot.saturating_sub(gone.bytes);
                            }
                        }
                        None => *device_live = device_live.saturating_sub(event.bytes),
                    }
                }
            }

            let now = *device_live;
            let capacity = capacities.get(&device).copied().unwrap_or(0);
            timeline.push(CurvePoint {
                timestamp_ns: event.timestamp_ns,
                device: device.clone(),
                live_bytes: now,
                heap_bytes: now,
                free_bytes: capacity.saturating_sub(now),
                by_category: categories.clone(),
            });

            let (peak, peak_ts) = peaks.entry(device.clone()).or_insert((0, 0));
            if now > *peak {
                *peak = now;
                *peak_ts = event.timestamp_ns;
            }
            if now > summary.peak_bytes {
                summary.peak_bytes = now;
                summary.peak_timestamp_ns = event.timestamp_ns;
                summary.peak_device = device.clone();
                peak_breakdown = live.values().cloned().collect();
                peak_breakdown.sort_by(|a, b| {
                    b.bytes
                        .cmp(&a.bytes)
                        .then_with(|| a.tensor_id.cmp(&b.tensor_id))
                });
                summary.peak_by_category = categories.clone();
            }
            if !backward_seen && steps.get(&event.span_id) == Some(&Step::Backward) {
                backward_seen = true;
                summary.autograd_retained_bytes = categories
                    .get(&category_name(Category::Activation))
                    .copied()
                    .unwrap_or(0);
            }
        }

        let mut by_device: Vec<DeviceFigures> = peaks
            .into_iter()
            .map(|(device, (peak_bytes, peak_timestamp_ns))| DeviceFigures {
                capacity_bytes: capacities.get(&device).copied().unwrap_or(0),
                alloc_count: allocs_by_device.get(&device).copied().unwrap_or(0),
                free_count: frees_by_device.get(&device).copied().unwrap_or(0),
                device,
                peak_bytes,
                peak_timestamp_ns,
            })
            .collect();
        by_device.sort_by(|a, b| a.device.cmp(&b.device));
        checkpoints.push((events.len(), began.elapsed().as_secs_f64()));
        MemoryDocument {
            summary,
            timeline,
            peak_breakdown,
            by_device,
        }
    }

    /// Step 5: per span and op node figures from a finished memory document.
    fn node_figures(doc: &Document, memory: &MemoryDocument) -> HashMap<String, NodeFigures> {
        // The original takes a caller's map from (span, op index) to node id; none here.
        let named_nodes: HashMap<(String, usize), String> = HashMap::new();
        let mut figures: HashMap<String, NodeFigures> = HashMap::new();
        let mut op_index: HashMap<String, usize> = HashMap::new();
        for op in &doc.ops {
            let index = *op_index.entry(op.span_id.clone()).or_insert(0);
            op_index.insert(op.span_id.clone(), index + 1);
            let bytes = op
                .storage_bytes
                .unwrap_or_else(|| storage_bytes(&op.shape, &op.dtype));
            if bytes == 0 {
                continue;
            }
            let node = named_nodes
                .get(&(op.span_id.clone(), index))
                .cloned()
                .unwrap_or_else(|| format!("{}/op/{}", op.span_id, index));
            let entry = figures.entry(node).or_default();
            entry.storage_bytes = bytes;
            entry.bytes = bytes;
            let span = figures.entry(op.span_id.clone()).or_default();
            span.bytes = span.bytes.saturating_add(bytes);
        }
        for tensor in &memory.peak_breakdown {
            if let Some(entry) = figures.get_mut(&tensor.span_id) {
                entry.peak_bytes = entry.peak_bytes.max(tensor.bytes);
            }
        }
        for span in &doc.spans {
            roll_up(&span.id, &doc.spans, &mut figures);
        }
        figures
    }

    /// A span's peak is the largest of its own bytes and its children's peaks, the children
    /// found by scanning every span.
    fn roll_up(id: &str, spans: &[SpanRecord], figures: &mut HashMap<String, NodeFigures>) {
        let children: Vec<&SpanRecord> = spans
            .iter()
            .filter(|span| span.parent_id.as_deref() == Some(id))
            .collect();
        let mut children_peak = 0;
        for child in children {
            roll_up(&child.id, spans, figures);
            if let Some(figure) = figures.get(&child.id) {
                children_peak = children_peak.max(figure.peak_bytes);
            }
        }
        let own = figures.get(id).cloned().unwrap_or_default();
        let entry = figures.entry(id.to_string()).or_default();
        entry.peak_bytes = entry.peak_bytes.max(own.bytes).max(children_peak);
    }

    /// The whole baseline analysis: the memory document and the node figures (the original
    /// computes the document inside its node-figure entry point, so both are always paid).
    pub fn analyze(
        doc: &Document,
        checkpoints: &mut Vec<(usize, f64)>,
    ) -> (MemoryDocument, HashMap<String, NodeFigures>) {
        let memory = memory_document(doc, checkpoints);
        let figures = node_figures(doc, &memory);
        (memory, figures)
    }

    /// Write (pretty JSON, synced) and read costs of the baseline's document.
    pub fn output_case(memory: &MemoryDocument, events: usize, dir: &Path) -> Value {
        use std::io::Write;
        let path = dir.join("candle_graph.json");
        let began = Instant::now();
        let text = serde_json::to_string_pretty(memory).expect("the document serialises");
        let mut file = std::fs::File::create(&path).expect("create the baseline's file");
        file.write_all(text.as_bytes())
            .expect("write the baseline's file");
        file.sync_all().expect("sync the baseline's file");
        drop(file);
        drop(text);
        let write = began.elapsed();
        let json_bytes = std::fs::metadata(&path).expect("written").len();
        let began = Instant::now();
        let bytes = std::fs::read(&path).expect("read the baseline's file");
        let loaded: MemoryDocument = serde_json::from_slice(&bytes).expect("parse it back");
        let load = began.elapsed();
        assert_eq!(loaded.timeline.len(), memory.timeline.len());
        drop(loaded);
        let _ = std::fs::remove_file(&path);
        json!({
            "name": "candle_graph_baseline",
            "events": events,
            "write_s": write.as_secs_f64(),
            "load_s": load.as_secs_f64(),
            "json_bytes": json_bytes,
        })
    }
}
