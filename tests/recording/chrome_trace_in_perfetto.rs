//! The Chrome trace as Perfetto's trace processor imports it. Its JSON importer keeps a complete
//! (`X`) event only when it nests inside the open one on its thread (else the slice is dropped
//! as misnested), names a counter track after its event's name and argument, and shows a pid
//! as one process named by its `process_name` metadata. So: every event is well formed, every
//! counter track has a name and finite values, spans nest per thread, every thread and process
//! with events is named, and each device is a process of its own whose counters are its own.
//!
//! Checked on a real session (two threads of nested spans, a heap and a device) and on the
//! hand-built sample profile (three devices with pools).

use std::collections::{BTreeMap, BTreeSet, HashMap};

use highwater::ops::{self, Tensor};
use highwater::{Profile, Session, Step};
use highwater_export::chrome;
use highwater_testkit::sample::sample_profile_with_drops;
use serde_json::Value;

use highwater_testkit::child::isolated;

/// A track of slices: (pid, tid).
type Thread = (u64, u64);
/// A complete event: start and end in ns, and its name.
type Slice = (i64, i64, String);

/// Nanoseconds from a trace's microseconds, as the importer converts them.
fn ns(value: &Value) -> i64 {
    let us = value.as_f64().expect("a number");
    assert!(us.is_finite() && us >= 0.0, "time {us}");
    (us * 1000.0).round() as i64
}

/// Checks `trace` as Perfetto's JSON importer reads it; returns the device process names.
fn check(trace: &Value, profile: &Profile) -> BTreeSet<String> {
    let events = trace["traceEvents"].as_array().expect("traceEvents");
    let mut process_names: HashMap<u64, String> = HashMap::new();
    let mut thread_names: BTreeSet<(u64, u64)> = BTreeSet::new();
    let mut slices: BTreeMap<Thread, Vec<Slice>> = BTreeMap::new();
    let mut counter_keys: HashMap<(u64, String), BTreeSet<String>> = HashMap::new();
    let mut counter_pids: BTreeSet<u64> = BTreeSet::new();
    for event in events {
        let name = event["name"].as_str().expect("every event has a name");
        assert!(!name.is_empty(), "an event with an empty name: {event}");
        let pid = event["pid"].as_u64().expect("integer pid");
        let tid = event["tid"].as_u64().expect("integer tid");
        let ph = event["ph"].as_str().unwrap();
        match ph {
            "M" => {
                let value = event["args"]["name"].as_str();
                match name {
                    "process_name" => {
                        let value = value.expect("process_name has args.name").to_string();
                        assert!(
                            process_names.insert(pid, value).is_none(),
                            "pid {pid} named twice"
                        );
                    }
                    "thread_name" => {
                        assert!(value.is_some_and(|v| !v.is_empty()));
                        thread_names.insert((pid, tid));
                    }
                    "process_sort_index" => {
                        assert!(event["args"]["sort_index"].is_u64());
                    }
                    other => panic!("unexpected metadata {other}"),
                }
            }
            "X" => {
                let start = ns(&event["ts"]);
                let end = start + ns(&event["dur"]);
                slices
                    .entry((pid, tid))
                    .or_default()
                    .push((start, end, name.to_string()));
            }
            "C" => {
                ns(&event["ts"]);
                let args = event["args"].as_object().expect("counter args");
                assert!(!args.is_empty(), "a counter without values: {event}");
                for (key, value) in args {
                    let v = value.as_f64().expect("counter values are numbers");
                    assert!(v.is_finite() && v >= 0.0, "{name}.{key} = {v}");
                }
                let keys: BTreeSet<String> = args.keys().cloned().collect();
                let seen = counter_keys
                    .entry((pid, name.to_string()))
                    .or_insert_with(|| keys.clone());
                assert_eq!(*seen, keys, "counter {name} changes its series");
                counter_pids.insert(pid);
            }
            "i" => {
                ns(&event["ts"]);
                assert!(matches!(event["s"].as_str(), Some("g" | "p" | "t")));
            }
            other => panic!("phase {other} is not one highwater writes"),
        }
    }
    // Spans nest per thread: sorted by start (longest first on ties), each slice either ends
    // inside the one open around it or starts after it closed.
    for (thread, list) in &mut slices {
        assert!(
            thread_names.contains(thread),
            "thread {thread:?} has slices but no name"
        );
        list.sort_by_key(|&(start, end, _)| (start, std::cmp::Reverse(end)));
        let mut open: Vec<(i64, i64, &str)> = Vec::new();
        for (start, end, name) in list.iter() {
            while open.last().is_some_and(|&(_, e, _)| e <= *start) {
                open.pop();
            }
            if let Some(&(s, e, parent)) = open.last() {
                assert!(
                    *end <= e,
                    "{name} [{start}, {end}] is misnested in {parent} [{s}, {e}] on {thread:?}"
                );
            }
            open.push((*start, *end, name));
        }
    }
    for pid in &counter_pids {
        assert!(
            process_names.contains_key(pid),
            "pid {pid} has counters but no name"
        );
    }
    // One process per device, each named once, holding that device's counters.
    let devices: BTreeSet<&str> = profile
        .devices
        .iter()
        .map(|d| d.device.as_str())
        .chain(profile.timeline.iter().map(|p| p.device.as_str()))
        .collect();
    let device_processes: BTreeSet<String> = process_names
        .values()
        .filter(|n| n.starts_with("memory "))
        .cloned()
        .collect();
    let expected: BTreeSet<String> = devices.iter().map(|d| format!("memory {d}")).collect();
    assert_eq!(device_processes, expected);
    let pid_of: HashMap<&str, u64> = process_names
        .iter()
        .map(|(&pid, name)| (name.as_str(), pid))
        .collect();
    for device in &devices {
        let pid = pid_of[format!("memory {device}").as_str()];
        let totals = events
            .iter()
            .filter(|e| e["name"] == "live bytes total" && e["pid"] == pid)
            .count();
        let points = profile
            .timeline
            .iter()
            .filter(|p| p.device == *device)
            .count();
        assert_eq!(totals, points, "{device}: its curve is not on its process");
    }
    device_processes
}

/// Two threads of nested spans with heap allocations, and device tensors on `cuda:0`.
fn record() -> Profile {
    let session = Session::builder().write_profile(false).start().unwrap();
    let work = |steps: usize| {
        for _ in 0..steps {
            let _step = highwater::profile!("step");
            let a = {
                let _fwd = highwater::profile!("forward", Step::Forward);
                let inner = {
                    let _layer = highwater::profile!("layer");
                    vec![1u8; 64 * 1024]
                };
                vec![inner; 2]
            };
            let _bwd = highwater::profile!("backward", Step::Backward);
            drop(a);
        }
    };
    let other = std::thread::spawn(move || work(20));
    for id in 1..=10u64 {
        ops::tensor_alloc(
            &Tensor {
                id,
                shape: &[1024],
                dtype: "f32",
                device: "cuda:0",
                bytes: 4096 * id,
            },
            None,
        );
    }
    work(20);
    other.join().unwrap();
    session.finish().unwrap()
}

#[test]
fn a_real_runs_trace_imports_cleanly() {
    isolated("a_real_runs_trace_imports_cleanly", || {
        let profile = record();
        assert!(
            profile.span_events.len() >= 4 * 40,
            "{}",
            profile.span_events.len()
        );
        let trace: Value = serde_json::from_str(&chrome::render(&profile)).unwrap();
        let devices = check(&trace, &profile);
        assert!(
            devices.contains("memory cpu") && devices.contains("memory cuda:0"),
            "{devices:?}"
        );
        let threads = trace["traceEvents"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|e| e["ph"] == "X")
            .map(|e| e["tid"].as_u64().unwrap())
            .collect::<BTreeSet<_>>();
        assert!(threads.len() >= 2, "spans of both threads: {threads:?}");
    });
}

#[test]
fn the_sample_profiles_trace_imports_cleanly() {
    isolated("the_sample_profiles_trace_imports_cleanly", || {
        let profile = sample_profile_with_drops();
        let trace: Value = serde_json::from_str(&chrome::render(&profile)).unwrap();
        assert_eq!(check(&trace, &profile).len(), 3);
    });
}

#[test]
fn spans_at_microsecond_fractions_still_nest() {
    isolated("spans_at_microsecond_fractions_still_nest", || {
        // Starts and ends that are not whole microseconds: the trace must not round a child past
        // its parent's end.
        let mut profile = sample_profile_with_drops();
        for (i, span) in profile.span_events.iter_mut().enumerate() {
            span.start_ns = span.start_ns * 7 / 3 + (i as u64 % 999);
            span.duration_ns = span.duration_ns * 7 / 3;
        }
        // Re-nest by construction: every child inside its parent, with odd nanoseconds.
        profile.span_events.sort_by_key(|s| (s.thread, s.start_ns));
        let mut fixed = Vec::new();
        let mut open: Vec<highwater::profile::SpanEvent> = Vec::new();
        for mut span in profile.span_events.clone() {
            while open.last().is_some_and(|p| {
                p.start_ns + p.duration_ns <= span.start_ns || p.thread != span.thread
            }) {
                open.pop();
            }
            if let Some(parent) = open.last() {
                let end =
                    (span.start_ns + span.duration_ns).min(parent.start_ns + parent.duration_ns);
                span.duration_ns = end - span.start_ns;
            }
            open.push(span.clone());
            fixed.push(span);
        }
        profile.span_events = fixed;
        let trace: Value = serde_json::from_str(&chrome::render(&profile)).unwrap();
        check(&trace, &profile);
    });
}

#[test]
fn the_check_rejects_what_perfetto_would_drop() {
    isolated("the_check_rejects_what_perfetto_would_drop", || {
        let profile = sample_profile_with_drops();
        let good: Value = serde_json::from_str(&chrome::render(&profile)).unwrap();
        let broken = |edit: &dyn Fn(&mut Vec<Value>)| {
            let mut trace = good.clone();
            edit(trace["traceEvents"].as_array_mut().unwrap());
            std::panic::catch_unwind(|| check(&trace, &profile)).is_err()
        };
        // A slice that starts inside another and ends after it.
        assert!(broken(&|events| {
            let first = events.iter().find(|e| e["ph"] == "X").unwrap().clone();
            let mut straddling = first.clone();
            let (ts, dur) = (
                first["ts"].as_f64().unwrap(),
                first["dur"].as_f64().unwrap(),
            );
            straddling["ts"] = Value::from(ts + dur / 2.0);
            straddling["dur"] = Value::from(dur);
            events.push(straddling);
        }));
        // A counter with no name, and a device process without its name.
        assert!(broken(&|events| {
            let counter = events.iter_mut().find(|e| e["ph"] == "C").unwrap();
            counter["name"] = Value::from("");
        }));
        assert!(broken(&|events| {
            events
                .retain(|e| !(e["name"] == "process_name" && e["args"]["name"] == "memory cuda:1"));
        }));
    });
}
