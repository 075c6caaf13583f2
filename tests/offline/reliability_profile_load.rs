//! Bad input for `Profile::load` is an error, never a panic: random truncations, byte flips and
//! splices of a valid profile, random JSON values in its fields and in place of it, deep
//! nesting, huge arrays and oversized files. The same property is fuzzed by
//! `fuzz/fuzz_targets/profile_load.rs` where a nightly toolchain and cargo-fuzz exist.
//!
//! A profile that does load must serialise again into something that loads, and satisfies the
//! invariants `Profile::load` checks. Also here: the compatibility rule (unknown fields from a
//! newer writer of the same schema load, another schema is refused naming both), and reads
//! bounded by bytes read (`/dev/zero`, a FIFO nobody writes).

// Tests drive the operating system directly; the library goes through its `sys` module.
#![allow(clippy::disallowed_methods)]

use std::collections::BTreeMap;
use std::path::Path;

use highwater::profile::model::OomSource;
use highwater::profile::{
    CaptureStats, DeviceStats, IterationResidual, LiveAllocation, OomEvent, PeakRow, PoolPoint,
    ProfileError, ReservedPoint, RunMeta, SpanEvent, SpanMetrics, Summary, ThreadCapture,
    TimelinePoint, Warning,
};
use highwater::{CaptureMode, Category, Profile};
use proptest::prelude::*;
use serde_json::Value;

/// A profile with every list non-empty and every optional field set.
fn rich_profile() -> Profile {
    let categories: BTreeMap<Category, u64> = [
        (Category::Activation, 3 << 20),
        (Category::Gradient, 1 << 20),
    ]
    .into();
    let mut summary = Summary::default();
    summary.peak_bytes = 4 << 20;
    summary.peak_timestamp_ns = 1_500;
    summary.peak_device = "cpu".into();
    summary.peak_by_category = categories.clone();
    summary.peak_temporary_by_category = BTreeMap::new();
    summary.alloc_count = 10;
    summary.free_count = 8;
    summary.realloc_count = 1;
    summary.total_alloc_bytes = 5 << 20;
    summary.autograd_retained_bytes = 3 << 20;
    summary.dropped_events = 2;
    summary.unknown_frees = 1;
    summary.reorder_repairs = 0;
    summary.final_live_bytes = 1024;
    summary.final_by_category = [(Category::Activation, 1024)].into();
    summary.duration_ns = 9_000;
    summary.event_count = 25;
    summary.oom_count = 1;
    let mut profile = Profile::empty();
    profile.meta = RunMeta::default();
    profile.meta.program = "train".into();
    profile.meta.highwater_version = "0.1.0".into();
    profile.meta.started_unix_ms = 1_700_000_000_000;
    profile.meta.clock = "tsc".into();
    profile.meta.threads = 3;
    profile.meta.alloc_log = Some("run.hwlog".into());
    profile.meta.pid = 4242;
    profile.meta.partial = true;
    profile.meta.checkpoint_unix_ms = Some(1_700_000_009_000);
    profile.summary = summary;
    profile.timeline = vec![
        {
            let mut timeline_point = TimelinePoint::default();
            timeline_point.timestamp_ns = 1_500;
            timeline_point.device = "cpu".into();
            timeline_point.live_bytes = 4 << 20;
            timeline_point.by_category = categories.clone();
            timeline_point
        };
        3
    ];
    profile.peak_breakdown = vec![{
        let mut peak_row = PeakRow::default();
        peak_row.span_path = "step/forward".into();
        peak_row.op = Some("matmul".into());
        peak_row.shape = Some(vec![32, 1024]);
        peak_row.dtype = Some("f32".into());
        peak_row.category = Category::Activation;
        peak_row.device = "cuda:0".into();
        peak_row.bytes = 3 << 20;
        peak_row.count = 2;
        peak_row.top_sites = Vec::new();
        peak_row
    }];
    profile.largest_at_peak = vec![{
        let mut live_allocation = LiveAllocation::default();
        live_allocation.bytes = 2 << 20;
        live_allocation.device = "cpu".into();
        live_allocation.category = highwater::Category::Gradient;
        live_allocation.span_path = "step/backward".into();
        live_allocation.op = None;
        live_allocation.shape = Some(vec![7]);
        live_allocation.timestamp_ns = 1_200;
        live_allocation.thread = 1;
        live_allocation
    }];
    profile.spans = vec![
        {
            let mut span_metrics = SpanMetrics::default();
            span_metrics.id = 0;
            span_metrics.parent = None;
            span_metrics.name = "step".into();
            span_metrics.step = Some(highwater::Step::Forward);
            span_metrics.category = Some(highwater::Category::Parameter);
            span_metrics.calls = 2;
            span_metrics.total_ns = 4_000;
            span_metrics.bytes_allocated = 5 << 20;
            span_metrics.alloc_count = 10;
            span_metrics.peak_bytes = 4 << 20;
            span_metrics.residual_bytes = 1024;
            span_metrics
        },
        {
            let mut span_metrics = SpanMetrics::default();
            span_metrics.id = 1;
            span_metrics.parent = Some(0);
            span_metrics.name = "forward".into();
            span_metrics
        },
    ];
    profile.iterations = vec![{
        let mut iteration_residual = IterationResidual::default();
        iteration_residual.index = 0;
        iteration_residual.span = "step".into();
        iteration_residual.end_timestamp_ns = 4_000;
        iteration_residual.live_bytes = 1024;
        iteration_residual.delta_bytes = -512;
        iteration_residual
    }];
    profile.devices = vec![{
        let mut device_stats = DeviceStats::default();
        device_stats.device = "cuda:0".into();
        device_stats.capacity_bytes = Some(16 << 30);
        device_stats.peak_bytes = 3 << 20;
        device_stats.peak_timestamp_ns = 1_500;
        device_stats.peak_by_category = [(highwater::Category::Activation, 3 << 20)].into();
        device_stats.alloc_count = 2;
        device_stats.free_count = 2;
        device_stats.final_live_bytes = 0;
        device_stats.peak_reserved_bytes = Some(4 << 20);
        device_stats.max_fragmentation = Some(0.25);
        device_stats.reserved_peak_bytes = Some(6 << 20);
        device_stats.reserved_final_bytes = Some(2 << 20);
        device_stats.context_bytes = Some(500 << 20);
        device_stats
    }];
    profile.pool_timeline = vec![{
        let mut pool_point = PoolPoint::default();
        pool_point.timestamp_ns = 1_000;
        pool_point.device = "cuda:0".into();
        pool_point.capacity_bytes = 16 << 30;
        pool_point.reserved_bytes = 4 << 20;
        pool_point.largest_free_bytes = 1 << 30;
        pool_point.fragmentation = 0.5;
        pool_point
    }];
    profile.reserved_timeline = vec![{
        let mut reserved_point = ReservedPoint::default();
        reserved_point.timestamp_ns = 1_200;
        reserved_point.device = "cuda:0".into();
        reserved_point.reserved_bytes = 6 << 20;
        reserved_point
    }];
    profile.capture = CaptureStats::default();
    profile.capture.mode = CaptureMode::DropWhenFull;
    profile.capture.ring_events = 1 << 18;
    profile.capture.dropped_by_kind = [("alloc".to_string(), 2)].into();
    profile.capture.unattributed_dropped = 1;
    profile.capture.reentrant_dropped = 0;
    profile.capture.producer_waits = 0;
    profile.capture.late_events = 3;
    profile.capture.threads = vec![{
        let mut thread_capture = ThreadCapture::default();
        thread_capture.threads = 1;
        thread_capture.thread = 0;
        thread_capture.os_tid = 4242;
        thread_capture.allocs = 10;
        thread_capture.frees = 8;
        thread_capture.reallocs = 1;
        thread_capture.span_events = 4;
        thread_capture.other_events = 1;
        thread_capture.dropped_allocs = 2;
        thread_capture.dropped_frees = 0;
        thread_capture.dropped_reallocs = 0;
        thread_capture.dropped_other = 0;
        thread_capture
    }];
    profile.warnings = vec![
        Warning::DroppedEvents {
            events: 2,
            mode: highwater::CaptureMode::Lossless,
        },
        Warning::Note {
            text: "a sentence from an older profile".into(),
        },
    ];
    profile.span_events = vec![{
        let mut span_event = SpanEvent::default();
        span_event.thread = 0;
        span_event.span = 1;
        span_event.start_ns = 100;
        span_event.duration_ns = 900;
        span_event.depth = 1;
        span_event
    }];
    profile.oom_events = vec![{
        let mut oom_event = OomEvent::default();
        oom_event.timestamp_ns = 8_000;
        oom_event.source = OomSource::Heap;
        oom_event.device = "cpu".into();
        oom_event.requested_bytes = 1 << 40;
        oom_event.largest_free_bytes = None;
        oom_event.thread = 0;
        oom_event.span_path = "step/forward".into();
        oom_event.op = Some("matmul".into());
        oom_event.live_bytes = 2048;
        oom_event.live_by_category = [(Category::Activation, 2048)].into();
        oom_event.total_live_bytes = 2048;
        oom_event.pool_capacity_bytes = None;
        oom_event.pool_reserved_bytes = None;
        oom_event.live = vec![{
            let mut peak_row = PeakRow::default();
            peak_row.span_path = "step/forward".into();
            peak_row.category = Category::Activation;
            peak_row.device = "cpu".into();
            peak_row.bytes = 2048;
            peak_row.count = 2;
            peak_row
        }];
        oom_event
    }];
    profile
}

fn valid_json() -> Vec<u8> {
    rich_profile().to_json().into_bytes()
}

/// The property: parsing returns (no panic), and a profile that parsed serialises into JSON that
/// parses again.
fn parses_or_errs(bytes: &[u8]) {
    if let Ok(profile) = Profile::from_json_bytes(bytes, Path::new("input.json")) {
        let again = profile.to_json();
        assert!(
            Profile::from_json_bytes(again.as_bytes(), Path::new("again.json")).is_ok(),
            "a loaded profile did not reload: {again}"
        );
    }
}

/// Tokens spliced into the valid text: wrong types, extreme numbers, broken syntax.
const TOKENS: &[&str] = &[
    "null",
    "true",
    "-1",
    "1.5",
    "1e999",
    "-0",
    "18446744073709551616",
    "\"\"",
    "\"\\ud800\"",
    "[]",
    "{}",
    "[[[[[[[[[[[[[[[[[[[[",
    "}}}}",
    "\"schema\"",
    ",",
    ":",
    "\u{0}",
    "NaN",
];

/// Random JSON values, nested a few levels.
fn json_value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(Value::from),
        any::<u64>().prop_map(Value::from),
        any::<f64>().prop_map(Value::from),
        "[a-z_]{0,12}".prop_map(Value::String),
    ];
    leaf.prop_recursive(4, 48, 6, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
            prop::collection::btree_map("[a-z_]{1,16}", inner, 0..6)
                .prop_map(|map| Value::Object(map.into_iter().collect())),
        ]
    })
}

/// Every key path in `value`, as object keys and array indexes.
fn paths(value: &Value, prefix: &mut Vec<String>, out: &mut Vec<Vec<String>>) {
    match value {
        Value::Object(map) => {
            for (key, child) in map {
                prefix.push(key.clone());
                out.push(prefix.clone());
                paths(child, prefix, out);
                prefix.pop();
            }
        }
        Value::Array(items) => {
            for (index, child) in items.iter().enumerate() {
                prefix.push(index.to_string());
                out.push(prefix.clone());
                paths(child, prefix, out);
                prefix.pop();
            }
        }
        _ => {}
    }
}

fn at_path<'a>(value: &'a mut Value, path: &[String]) -> Option<&'a mut Value> {
    path.iter().try_fold(value, |value, key| match value {
        Value::Object(map) => map.get_mut(key),
        Value::Array(items) => items.get_mut(key.parse::<usize>().ok()?),
        _ => None,
    })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn truncated_profiles_are_errors_not_panics(cut in 0.0..1.0f64) {
        let json = valid_json();
        let end = (json.len() as f64 * cut) as usize;
        let result = Profile::from_json_bytes(&json[..end], Path::new("cut.json"));
        prop_assert!(result.is_err(), "a profile cut at {} of {} bytes loaded", end, json.len());
    }

    #[test]
    fn flipped_bytes_never_panic(flips in prop::collection::vec((0.0..1.0f64, any::<u8>()), 1..12)) {
        let mut json = valid_json();
        let len = json.len();
        for (at, byte) in flips {
            json[((len as f64 * at) as usize).min(len - 1)] = byte;
        }
        parses_or_errs(&json);
    }

    #[test]
    fn spliced_tokens_never_panic(
        at in 0.0..1.0f64,
        removed in 0usize..40,
        token in prop::sample::select(TOKENS),
    ) {
        let json = valid_json();
        let start = (json.len() as f64 * at) as usize;
        let end = (start + removed).min(json.len());
        let mut spliced = json[..start].to_vec();
        spliced.extend_from_slice(token.as_bytes());
        spliced.extend_from_slice(&json[end..]);
        parses_or_errs(&spliced);
    }

    #[test]
    fn random_values_in_any_field_never_panic(pick in any::<prop::sample::Index>(), value in json_value()) {
        let mut document: Value = serde_json::from_slice(&valid_json()).unwrap();
        let mut all = Vec::new();
        paths(&document, &mut Vec::new(), &mut all);
        let path = pick.get(&all).clone();
        *at_path(&mut document, &path).unwrap() = value;
        parses_or_errs(&serde_json::to_vec(&document).unwrap());
    }

    #[test]
    fn random_documents_never_panic(value in json_value(), schema in any::<bool>()) {
        let mut value = value;
        if let (true, Value::Object(map)) = (schema, &mut value) {
            map.insert("schema".into(), Value::from(highwater::profile::SCHEMA));
        }
        parses_or_errs(&serde_json::to_vec(&value).unwrap());
    }

    #[test]
    fn random_bytes_through_load_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..512)) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("random.json");
        std::fs::write(&path, &bytes).unwrap();
        if let Ok(profile) = Profile::load(&path) {
            prop_assert!(Profile::from_json_bytes(profile.to_json().as_bytes(), &path).is_ok());
        }
    }
}

#[test]
fn the_valid_profile_loads_and_round_trips() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("rich.json");
    rich_profile().write(&path).unwrap();
    assert_eq!(Profile::load(&path).unwrap(), rich_profile());
}

#[test]
fn deep_nesting_is_an_error_not_a_stack_overflow() {
    for (open, close) in [("[", "]"), ("{\"a\":", "}")] {
        for depth in [200, 100_000] {
            let text = format!("{}{}", open.repeat(depth), close.repeat(depth));
            let result = Profile::from_json_bytes(text.as_bytes(), Path::new("deep.json"));
            assert!(result.is_err(), "{depth}-deep {open} nesting loaded");
            let inside = format!(
                "{{\"schema\":\"{}\",\"warnings\":{}}}",
                highwater::profile::SCHEMA,
                text.replace("\"a\":", "")
            );
            let result = Profile::from_json_bytes(inside.as_bytes(), Path::new("deep.json"));
            assert!(
                result.is_err(),
                "{depth}-deep nesting inside a field loaded"
            );
        }
    }
}

#[test]
fn huge_arrays_load_or_fail_without_panicking() {
    let point = r#"{"timestamp_ns":1,"device":"cpu","live_bytes":1,"by_category":{}}"#;
    let mut document: Value = serde_json::from_slice(&valid_json()).unwrap();
    let many = format!("[{}]", vec![point; 50_000].join(","));
    document["timeline"] = serde_json::from_str(&many).unwrap();
    let huge = serde_json::to_vec(&document).unwrap();
    let profile =
        Profile::from_json_bytes(&huge, Path::new("huge.json")).expect("50,000 valid points load");
    assert_eq!(profile.timeline.len(), 50_000);
    // Unterminated, and of the wrong element type.
    let unterminated = &huge[..huge.len() / 2];
    assert!(Profile::from_json_bytes(unterminated, Path::new("cut.json")).is_err());
    let wrong = format!(
        "{{\"schema\":\"{}\",\"timeline\":[{}]}}",
        highwater::profile::SCHEMA,
        vec!["7"; 50_000].join(",")
    );
    assert!(Profile::from_json_bytes(wrong.as_bytes(), Path::new("wrong.json")).is_err());
}

#[test]
fn a_file_over_the_size_limit_is_refused_before_it_is_read() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("sparse.json");
    let file = std::fs::File::create(&path).unwrap();
    // Sparse: no disk space is used, and `load` must not read it.
    file.set_len(highwater::profile::MAX_PROFILE_BYTES + 1)
        .unwrap();
    match Profile::load(&path) {
        Err(ProfileError::TooLarge { size, .. }) => {
            assert_eq!(size, highwater::profile::MAX_PROFILE_BYTES + 1)
        }
        other => panic!("expected TooLarge, got {other:?}"),
    }
}

/// A profile breaking a rule every written profile satisfies is refused with an error that
/// names the file and the rule (categories adding up to 300 % of the peak used to be shown).
#[test]
fn inconsistent_profiles_are_refused_naming_the_rule() {
    type Break = Box<dyn Fn(&mut Profile)>;
    let cases: Vec<(&str, Break)> = vec![
        (
            "peak_by_category adds up",
            Box::new(|p| {
                p.summary
                    .peak_by_category
                    .insert(highwater::Category::Optimizer, 8 << 20);
            }),
        ),
        (
            "more than its",
            Box::new(|p| {
                let category = highwater::Category::Gradient;
                let at_peak = p.summary.peak_by_category.get(&category).copied();
                let temporary = at_peak.unwrap_or(0) + 1;
                p.summary
                    .peak_temporary_by_category
                    .insert(category, temporary);
            }),
        ),
        (
            "timeline[0].by_category",
            Box::new(|p| p.timeline[0].live_bytes = 1),
        ),
        (
            "above summary.peak_bytes",
            Box::new(|p| p.devices[0].peak_bytes = 64 << 20),
        ),
        (
            "largest_at_peak[0]",
            Box::new(|p| p.largest_at_peak[0].bytes = 64 << 20),
        ),
        ("spans[1] has id", Box::new(|p| p.spans[1].id = 7)),
        (
            "parents come before their children",
            Box::new(|p| p.spans[0].parent = Some(1)),
        ),
        (
            "span_events[0] names span",
            Box::new(|p| p.span_events[0].span = 9),
        ),
        (
            "iterations are out of order",
            Box::new(|p| {
                let again = p.iterations[0].clone();
                p.iterations.push(again);
            }),
        ),
    ];
    for (rule, break_it) in cases {
        let mut profile = rich_profile();
        break_it(&mut profile);
        let error = Profile::from_json_bytes(profile.to_json().as_bytes(), Path::new("bad.json"))
            .expect_err(rule);
        let message = error.to_string();
        assert!(
            matches!(error, ProfileError::Inconsistent { .. }),
            "{message}"
        );
        assert!(
            message.contains("bad.json") && message.contains(rule),
            "{rule}: {message}"
        );
    }
}

/// The compatibility rule: a newer writer of the same schema may add fields, and this reader
/// loads its profile, ignoring them; a profile of another schema (newer, or the old
/// `highwater/1` with full paths) is refused with an error naming both schemas.
#[test]
fn unknown_fields_load_and_other_schemas_are_refused_naming_both() {
    let mut document: Value = serde_json::from_slice(&valid_json()).unwrap();
    document["added_by_a_newer_writer"] = Value::from(42);
    document["summary"]["new_figure"] = Value::from("x");
    document["spans"][0]["new_span_field"] = Value::Bool(true);
    let loaded = Profile::from_json_bytes(
        &serde_json::to_vec(&document).unwrap(),
        Path::new("newer.json"),
    )
    .expect("extra fields of the same schema load");
    assert_eq!(loaded, rich_profile());
    for other in ["highwater/1", "highwater/3"] {
        document["schema"] = Value::from(other);
        let message = Profile::from_json_bytes(
            &serde_json::to_vec(&document).unwrap(),
            Path::new("other.json"),
        )
        .unwrap_err()
        .to_string();
        assert!(
            message.contains(other) && message.contains(highwater::profile::SCHEMA),
            "{message}"
        );
    }
}

/// Reads are bounded by the bytes read: `/dev/zero` stops at the limit instead of filling
/// memory, and a FIFO is refused instead of blocking forever on a writer that never writes.
#[test]
fn endless_and_writerless_inputs_end() {
    match Profile::load("/dev/zero") {
        Err(ProfileError::TooLarge { limit, .. }) => {
            assert_eq!(limit, highwater::profile::MAX_PROFILE_BYTES)
        }
        other => panic!("expected TooLarge, got {other:?}"),
    }
    let dir = tempfile::tempdir().unwrap();
    let fifo = dir.path().join("fifo.json");
    let name = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
    // SAFETY: a valid NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(name.as_ptr(), 0o600) }, 0);
    match Profile::load(&fifo) {
        Err(error @ ProfileError::Read { .. }) => {
            assert!(error.to_string().contains("FIFO"), "{error}")
        }
        other => panic!("expected a refusal, got {other:?}"),
    }
    assert!(highwater::profile::alloc_log::AllocLog::read(&fifo).is_err());
}
