//! Chrome Trace Event JSON, for <https://ui.perfetto.dev> and `chrome://tracing`.
//!
//! # What the trace shows
//!
//! - Process 1 is the profiled program. Each recorded thread is one of its threads, named
//!   `thread N`, and carries the span instances of [`Profile::span_events`] as complete (`X`)
//!   events, nested as they ran.
//! - Each device is a process of its own (`memory cuda:0`, …) with counter (`C`) tracks:
//!   `live bytes` with one series per category (parameter, activation, gradient, optimizer,
//!   other — `chrome://tracing` stacks them into the memory curve), `live bytes total` (Perfetto
//!   draws series side by side, so the total is its own track) and, where a pool reported,
//!   `pool reserved bytes` and `pool fragmentation %`. The global peak is an instant event on
//!   its device.
//! - Timestamps are microseconds since the session started, as the format requires.
//!
//! Spans are drawn only from recorded instances: a profile without [`Profile::span_events`]
//! (written before they existed) gets no span tracks rather than invented timings, and the
//! trace's `otherData` says so.

use std::collections::BTreeMap;
use std::path::Path;

use serde::Serialize;

use super::{write_output, ExportError, Output};
use highwater_profile::model::Category;
use highwater_profile::units::format_bytes;
use highwater_profile::Profile;
use highwater_profile::TimelinePoint;

/// Process id of the profiled program's threads.
const PROGRAM_PID: u32 = 1;
/// Process id of the first device; device `i` (in order of first appearance) is `DEVICE_PID + i`.
const DEVICE_PID: u32 = 100;

/// Live bytes by category, in [`Category::ALL`] order so the viewers stack them in that order.
#[derive(Debug, Default, Serialize)]
struct CategoryBytes {
    parameter: u64,
    activation: u64,
    gradient: u64,
    optimizer: u64,
    other: u64,
}

impl CategoryBytes {
    fn from_point(point: &TimelinePoint) -> CategoryBytes {
        let mut bytes = CategoryBytes::default();
        for (category, &value) in &point.by_category {
            let slot = match category {
                Category::Parameter => &mut bytes.parameter,
                Category::Activation => &mut bytes.activation,
                Category::Gradient => &mut bytes.gradient,
                Category::Optimizer => &mut bytes.optimizer,
                Category::Other => &mut bytes.other,
            };
            *slot = slot.saturating_add(value);
        }
        bytes
    }
}

/// The arguments of one trace event.
#[derive(Debug, Serialize)]
#[serde(untagged)]
enum Args<'a> {
    Name { name: String },
    SortIndex { sort_index: u32 },
    Categories(CategoryBytes),
    Reserved { reserved: u64 },
    Total { total: u64 },
    Fragmentation { fragmentation: f64 },
    Span { path: &'a str },
    Peak { bytes: u64, device: &'a str },
}

/// One event of the Trace Event format.
#[derive(Debug, Serialize)]
struct TraceEvent<'a> {
    name: &'a str,
    ph: &'static str,
    pid: u32,
    tid: u32,
    ts: f64,
    #[serde(skip_serializing_if = "Option::is_none")]
    dur: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    cat: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    s: Option<&'static str>,
    args: Args<'a>,
}

/// Facts about the run kept beside the events, shown by Perfetto's trace info page.
#[derive(Debug, Serialize)]
struct OtherData<'a> {
    program: &'a str,
    highwater_version: &'a str,
    peak: String,
    peak_bytes: u64,
    peak_device: &'a str,
    dropped_events: u64,
    warnings: Vec<String>,
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
struct Trace<'a> {
    trace_events: Vec<TraceEvent<'a>>,
    display_time_unit: &'static str,
    other_data: OtherData<'a>,
}

fn micros(ns: u64) -> f64 {
    ns as f64 / 1000.0
}

fn metadata<'a>(name: &'static str, pid: u32, tid: u32, args: Args<'a>) -> TraceEvent<'a> {
    TraceEvent {
        name,
        ph: "M",
        pid,
        tid,
        ts: 0.0,
        dur: None,
        cat: None,
        s: None,
        args,
    }
}

fn counter<'a>(name: &'static str, pid: u32, ns: u64, args: Args<'a>) -> TraceEvent<'a> {
    TraceEvent {
        name,
        ph: "C",
        pid,
        tid: 0,
        ts: micros(ns),
        dur: None,
        cat: Some("memory"),
        s: None,
        args,
    }
}

/// Renders `profile` as Chrome Trace Event JSON (the object form, with `traceEvents`).
///
/// # Examples
///
/// ```
/// let trace = highwater_export::chrome::render(&highwater_profile::Profile::empty());
/// assert!(trace.starts_with("{\"traceEvents\":"));
/// ```
pub fn render(profile: &Profile) -> String {
    let mut events = Vec::new();
    let program = if profile.meta.program.is_empty() {
        "program".to_string()
    } else {
        profile.meta.program.clone()
    };
    events.push(metadata(
        "process_name",
        PROGRAM_PID,
        0,
        Args::Name {
            name: format!("{program} (highwater)"),
        },
    ));
    events.push(metadata(
        "process_sort_index",
        PROGRAM_PID,
        0,
        Args::SortIndex { sort_index: 0 },
    ));

    // Spans: one complete event per recorded instance, per thread, parents before children.
    let mut spans: Vec<_> = profile.span_events.iter().collect();
    spans.sort_by(|a, b| {
        (a.thread, a.start_ns, a.depth)
            .cmp(&(b.thread, b.start_ns, b.depth))
            .then(b.duration_ns.cmp(&a.duration_ns))
    });
    let mut threads: Vec<u32> = spans.iter().map(|s| s.thread).collect();
    threads.dedup();
    for &thread in &threads {
        events.push(metadata(
            "thread_name",
            PROGRAM_PID,
            thread,
            Args::Name {
                name: format!("thread {thread}"),
            },
        ));
    }
    let paths = profile.span_paths();
    for span in spans {
        let node = span.span as usize;
        events.push(TraceEvent {
            name: profile.spans.get(node).map_or("", |s| s.name.as_str()),
            ph: "X",
            pid: PROGRAM_PID,
            tid: span.thread,
            ts: micros(span.start_ns),
            dur: Some(micros(span.duration_ns)),
            cat: Some("span"),
            s: None,
            args: Args::Span {
                path: paths.get(node).map_or("", String::as_str),
            },
        });
    }

    // Devices, in order of first appearance in the devices table, then the timeline and pools.
    let mut device_pids: BTreeMap<&str, u32> = BTreeMap::new();
    let mut order: Vec<&str> = Vec::new();
    let names = profile
        .devices
        .iter()
        .map(|d| d.device.as_str())
        .chain(profile.timeline.iter().map(|p| p.device.as_str()))
        .chain(profile.pool_timeline.iter().map(|p| p.device.as_str()))
        .chain(profile.reserved_timeline.iter().map(|p| p.device.as_str()));
    for name in names {
        if !device_pids.contains_key(name) {
            let pid = DEVICE_PID.saturating_add(order.len() as u32);
            device_pids.insert(name, pid);
            order.push(name);
        }
    }
    for (i, name) in order.iter().enumerate() {
        let pid = device_pids[name];
        events.push(metadata(
            "process_name",
            pid,
            0,
            Args::Name {
                name: format!("memory {name}"),
            },
        ));
        events.push(metadata(
            "process_sort_index",
            pid,
            0,
            Args::SortIndex {
                sort_index: 1 + i as u32,
            },
        ));
    }
    let mut points: Vec<&TimelinePoint> = profile.timeline.iter().collect();
    points.sort_by_key(|p| p.timestamp_ns);
    for point in points {
        let pid = device_pids[point.device.as_str()];
        events.push(counter(
            "live bytes",
            pid,
            point.timestamp_ns,
            Args::Categories(CategoryBytes::from_point(point)),
        ));
        // Perfetto draws each series as its own track rather than stacking them; the total
        // is the curve a reader looks for first.
        events.push(counter(
            "live bytes total",
            pid,
            point.timestamp_ns,
            Args::Total {
                total: point.live_bytes,
            },
        ));
    }
    let mut pools: Vec<_> = profile.pool_timeline.iter().collect();
    pools.sort_by_key(|p| p.timestamp_ns);
    for pool in pools {
        let pid = device_pids[pool.device.as_str()];
        events.push(counter(
            "pool reserved bytes",
            pid,
            pool.timestamp_ns,
            Args::Reserved {
                reserved: pool.reserved_bytes,
            },
        ));
        let fragmentation = if pool.fragmentation.is_finite() {
            (pool.fragmentation * 1000.0).round() / 10.0
        } else {
            0.0
        };
        events.push(counter(
            "pool fragmentation %",
            pid,
            pool.timestamp_ns,
            Args::Fragmentation { fragmentation },
        ));
    }

    let mut reserved: Vec<_> = profile.reserved_timeline.iter().collect();
    reserved.sort_by_key(|p| p.timestamp_ns);
    for point in reserved {
        let pid = device_pids[point.device.as_str()];
        events.push(counter(
            "driver pools reserved bytes",
            pid,
            point.timestamp_ns,
            Args::Reserved {
                reserved: point.reserved_bytes,
            },
        ));
    }

    let summary = &profile.summary;
    let peak_label = format!("peak {}", format_bytes(summary.peak_bytes));
    if summary.peak_bytes > 0 {
        let pid = device_pids
            .get(summary.peak_device.as_str())
            .copied()
            .unwrap_or(PROGRAM_PID);
        events.push(TraceEvent {
            name: &peak_label,
            ph: "i",
            pid,
            tid: 0,
            ts: micros(summary.peak_timestamp_ns),
            dur: None,
            cat: Some("memory"),
            s: Some("p"),
            args: Args::Peak {
                bytes: summary.peak_bytes,
                device: &summary.peak_device,
            },
        });
    }

    // The profile's warnings, each worded once by `Warning`'s `Display`, then what only the
    // trace needs to say.
    let mut warnings: Vec<String> = profile.warnings.iter().map(ToString::to_string).collect();
    if profile.span_events.is_empty() && !profile.spans.is_empty() {
        warnings.push(
            "this profile holds no span instances (written before span_events existed), \
             so the trace has no span tracks; `highwater spans` shows the aggregated tree"
                .to_string(),
        );
    }
    let trace = Trace {
        trace_events: events,
        display_time_unit: "ms",
        other_data: OtherData {
            program: &profile.meta.program,
            highwater_version: &profile.meta.highwater_version,
            peak: format!(
                "{} on {}",
                format_bytes(summary.peak_bytes),
                summary.peak_device
            ),
            peak_bytes: summary.peak_bytes,
            peak_device: &summary.peak_device,
            dropped_events: summary.dropped_events,
            warnings,
        },
    };
    // Plain data with string keys and finite numbers always serialises.
    serde_json::to_string(&trace).unwrap_or_default()
}

/// Where the trace of the profile at `profile_path` goes by default: beside it, its `.json`
/// extension replaced by `.trace.json` (`run/highwater-profile.json` → `run/highwater-profile.trace.json`).
pub fn path_beside(profile_path: &Path) -> std::path::PathBuf {
    super::beside(profile_path, ".trace.json")
}

/// Writes [`render`]`(profile)` to `path` atomically (a temporary sibling renamed into place).
///
/// # Errors
///
/// [`ExportError`] naming the file when it cannot be written; `path` keeps what it held before.
pub fn write(profile: &Profile, path: impl AsRef<Path>) -> Result<(), ExportError> {
    write_output(
        Output::ChromeTrace,
        path.as_ref(),
        render(profile).as_bytes(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use highwater_testkit::sample::{sample_profile, sample_profile_with_drops};
    use serde_json::Value;

    fn events(trace: &Value) -> &Vec<Value> {
        trace["traceEvents"].as_array().unwrap()
    }

    #[test]
    fn memory_is_a_counter_per_device_with_a_series_per_category() {
        let profile = sample_profile();
        let trace: Value = serde_json::from_str(&render(&profile)).unwrap();
        let counters: Vec<&Value> = events(&trace)
            .iter()
            .filter(|e| e["ph"] == "C" && e["name"] == "live bytes")
            .collect();
        assert_eq!(counters.len(), profile.timeline.len());
        let totals = events(&trace)
            .iter()
            .filter(|e| e["name"] == "live bytes total")
            .count();
        assert_eq!(totals, profile.timeline.len());
        let pids: std::collections::BTreeSet<u64> = counters
            .iter()
            .map(|e| e["pid"].as_u64().unwrap())
            .collect();
        assert_eq!(pids.len(), 3);
        for e in &counters {
            let args = e["args"].as_object().unwrap();
            let keys: Vec<&str> = args.keys().map(String::as_str).collect();
            assert_eq!(keys.len(), 5, "{keys:?}");
        }
        // Timestamps are microseconds: the last point is within the run's length in µs.
        let last = counters
            .iter()
            .map(|e| e["ts"].as_f64().unwrap())
            .fold(0.0, f64::max);
        assert!(last <= profile.summary.duration_ns as f64 / 1000.0);
        assert!(last > profile.summary.duration_ns as f64 / 1000.0 / 2.0);
    }

    #[test]
    fn spans_are_complete_events_on_named_threads() {
        let profile = sample_profile();
        let trace: Value = serde_json::from_str(&render(&profile)).unwrap();
        let spans = events(&trace).iter().filter(|e| e["ph"] == "X").count();
        assert_eq!(spans, profile.span_events.len());
        let names: Vec<&str> = events(&trace)
            .iter()
            .filter(|e| e["ph"] == "M")
            .map(|e| e["args"]["name"].as_str().unwrap_or(""))
            .collect();
        for want in [
            "train_gpt (highwater)",
            "thread 1",
            "thread 2",
            "memory cuda:1",
        ] {
            assert!(names.contains(&want), "{want} not in {names:?}");
        }
    }

    #[test]
    fn a_driver_s_reserved_bytes_are_a_counter_of_its_device() {
        let profile = highwater_testkit::sample::sample_profile_with_driver();
        let trace: Value = serde_json::from_str(&render(&profile)).unwrap();
        let reserved: Vec<&Value> = events(&trace)
            .iter()
            .filter(|e| e["ph"] == "C" && e["name"] == "driver pools reserved bytes")
            .collect();
        assert_eq!(reserved.len(), profile.reserved_timeline.len());
        let last = reserved.last().unwrap();
        assert_eq!(last["args"]["reserved"], 1u64 << 30);
        let cuda0 = events(&trace)
            .iter()
            .find(|e| e["ph"] == "M" && e["args"]["name"] == "memory cuda:0")
            .unwrap()["pid"]
            .clone();
        assert!(reserved.iter().all(|e| e["pid"] == cuda0));
    }

    #[test]
    fn pools_and_peak_are_in_the_trace() {
        let profile = sample_profile_with_drops();
        let trace: Value = serde_json::from_str(&render(&profile)).unwrap();
        let reserved = events(&trace)
            .iter()
            .filter(|e| e["name"] == "pool reserved bytes")
            .count();
        assert_eq!(reserved, profile.pool_timeline.len());
        assert!(events(&trace)
            .iter()
            .any(|e| e["ph"] == "i" && e["args"]["bytes"] == profile.summary.peak_bytes));
        assert_eq!(trace["otherData"]["dropped_events"], 1234);
    }

    #[test]
    fn each_warning_is_in_the_trace_once_in_its_one_wording() {
        let profile = sample_profile_with_drops();
        let trace: Value = serde_json::from_str(&render(&profile)).unwrap();
        let expected: Vec<String> = profile.warnings.iter().map(|w| w.to_string()).collect();
        assert_eq!(expected.len(), 2);
        assert_eq!(trace["otherData"]["warnings"], serde_json::json!(expected));
    }

    #[test]
    fn a_profile_without_span_instances_invents_none() {
        let mut profile = sample_profile();
        profile.span_events.clear();
        let trace: Value = serde_json::from_str(&render(&profile)).unwrap();
        assert!(!events(&trace).iter().any(|e| e["ph"] == "X"));
        let warnings = trace["otherData"]["warnings"].to_string();
        assert!(warnings.contains("no span instances"), "{warnings}");
    }

    #[test]
    fn write_is_atomic_and_readable() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("run.trace.json");
        write(&sample_profile(), &path).unwrap();
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(serde_json::from_str::<Value>(&text).is_ok());
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);
    }
}
