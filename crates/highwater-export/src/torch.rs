//! PyTorch's CUDA memory snapshot format, from an allocation log, so PyTorch users can open a
//! highwater run in the viewer they know (`pytorch.org/memory_viz`: drag the file in).
//!
//! A snapshot is a pickled dict: `device_traces` (per device, the allocator's actions in
//! order) and `segments` (the allocator's state when the snapshot was taken, that is at the end
//! of the traces; the viewer replays the traces backwards from it). highwater's devices map to
//! trace indices in the order the log names them. The heap has no segments, so every block is
//! its own segment (`segment_alloc`, `alloc` … `free_requested`, `free_completed`,
//! `segment_free`). Device tensors are keyed by id, not address: they get addresses of their
//! own, laid end to end and never reused. Each event carries its block's category (the
//! viewer's legend and colours) and, as its one "frame", the device and category, since a log
//! records no stacks.
//!
//! # Windows
//!
//! A viewer replays every event in the browser, so long runs are cut to a window of at most
//! `max_events` allocations and frees per device, ending at that device's peak: what led up to
//! it. The window starts from the true live state at its start: every block live then and
//! still live at the window's end is in `segments` (with no allocation in the trace, which the
//! viewer reads as "allocated before the trace"), and every block live then and freed inside
//! the window appears by its free alone (read the same way). The viewer therefore shows the
//! device's real peak. It cannot colour blocks allocated before the window by category (its
//! segments carry none): they are drawn as `unknown`, and their frame still names the
//! category.
//!
//! The viewer names the category `unknown` itself whenever others are present; its
//! `annotate_snapshot` fails (a typo, `categores`) when no event has it. So when no event
//! would, the first device trace starts with one `snapshot` action (which the viewer lists and
//! otherwise ignores) marking the window's start with the category `unknown`.
//!
//! # Cost
//!
//! Linear in the log: records are grouped by device in one pass, and each device's window is
//! found and replayed with hash maps.

use std::collections::HashMap;
use std::path::Path;

use super::pickle::{dumps, Value};
use super::{write_output, ExportError, Output};
use highwater_profile::alloc_log::{AllocLog, AllocRecord};

/// Default for the per-device event window.
pub const DEFAULT_MAX_EVENTS: usize = 100_000;

/// The category name of blocks whose category is not known, as the viewer spells it.
const UNKNOWN: &str = "unknown";

/// The snapshot of `log` as pickle bytes, with at most `max_events` records per device.
pub fn render(log: &AllocLog, max_events: usize) -> Vec<u8> {
    dumps(&snapshot(log, max_events))
}

/// Writes the snapshot of `log` to `path` atomically.
///
/// # Errors
///
/// [`ExportError`] naming the file when it cannot be written; nothing partial is left.
pub fn write(log: &AllocLog, max_events: usize, path: impl AsRef<Path>) -> Result<(), ExportError> {
    write_output(
        Output::TorchSnapshot,
        path.as_ref(),
        &render(log, max_events),
    )
}

/// The snapshot of `log` as the value to pickle.
fn snapshot(log: &AllocLog, max_events: usize) -> Value {
    let mut per_device: Vec<Vec<&AllocRecord>> = vec![Vec::new(); log.devices.len()];
    for record in &log.records {
        // The reader rejects a record of a device not named before it; skip one defensively.
        if let Some(records) = per_device.get_mut(usize::from(record.device)) {
            records.push(record);
        }
    }
    let mut traces = Vec::with_capacity(log.devices.len());
    let mut segments = Vec::new();
    for (index, (device, records)) in log.devices.iter().zip(&per_device).enumerate() {
        let window = peak_window(records, max_events.max(1));
        let replay = DeviceReplay::new(device, index, device == "cpu");
        let (trace, live) = replay.run(&records[..window.start], &records[window]);
        traces.push(trace);
        segments.extend(live);
    }
    let has_unknown = traces
        .iter()
        .flatten()
        .any(|event| event.category == UNKNOWN);
    let mut traces: Vec<Value> = traces
        .into_iter()
        .map(|trace| Value::List(trace.into_iter().map(TraceEvent::into_value).collect()))
        .collect();
    if !has_unknown {
        if let Some(Value::List(first)) = traces
            .iter_mut()
            .find(|t| matches!(t, Value::List(events) if !events.is_empty()))
        {
            let time_us = first.first().and_then(time_of).unwrap_or(0);
            first.insert(0, window_start_marker(time_us));
        }
    }
    Value::Dict(vec![
        ("segments", Value::List(segments)),
        ("device_traces", Value::List(traces)),
    ])
}

/// The range of at most `max` records that ends at the records' peak of live bytes.
fn peak_window(records: &[&AllocRecord], max: usize) -> std::ops::Range<usize> {
    if records.len() <= max {
        return 0..records.len();
    }
    let mut live: HashMap<u64, u64> = HashMap::new();
    let (mut bytes, mut peak, mut peak_at) = (0u64, 0u64, 0usize);
    for (i, record) in records.iter().enumerate() {
        if record.alloc {
            if let Some(old) = live.insert(record.key, record.bytes) {
                bytes = bytes.saturating_sub(old);
            }
            bytes = bytes.saturating_add(record.bytes);
        } else if let Some(old) = live.remove(&record.key) {
            bytes = bytes.saturating_sub(old);
        }
        if bytes > peak {
            (peak, peak_at) = (bytes, i);
        }
    }
    let end = (peak_at + 1).max(max.min(records.len()));
    end - max..end
}

/// A block live in the replay.
#[derive(Debug, Clone, Copy)]
struct Block {
    address: u64,
    bytes: u64,
    category: &'static str,
    /// When it became live, for a stable order of the segments.
    order: usize,
}

/// One action of a device trace, before it is pickled.
struct TraceEvent<'a> {
    action: &'static str,
    address: u64,
    bytes: u64,
    time_us: i64,
    device: &'a str,
    category: &'static str,
}

impl TraceEvent<'_> {
    fn into_value(self) -> Value {
        Value::Dict(vec![
            ("action", Value::Str(self.action.to_string())),
            ("addr", int(self.address)),
            ("size", int(self.bytes)),
            ("stream", Value::Int(0)),
            ("time_us", Value::Int(self.time_us)),
            ("category", Value::Str(self.category.to_string())),
            ("frames", frames(self.device, self.category)),
        ])
    }
}

/// Replays one device's records: the ones before the window only to know what is live at its
/// start, the window's into trace events.
struct DeviceReplay<'a> {
    device: &'a str,
    index: usize,
    /// Heap blocks keep their real addresses; device tensors (keyed by id) get laid-out ones.
    real_addresses: bool,
    next_address: u64,
    live: HashMap<u64, Block>,
    order: usize,
}

impl<'a> DeviceReplay<'a> {
    fn new(device: &'a str, index: usize, real_addresses: bool) -> DeviceReplay<'a> {
        DeviceReplay {
            device,
            index,
            real_addresses,
            next_address: 0x1000,
            live: HashMap::new(),
            order: 0,
        }
    }

    fn address_for(&mut self, key: u64, bytes: u64) -> u64 {
        if self.real_addresses {
            return key;
        }
        let address = self.next_address;
        // Keep a gap, and stay within the 2^53 a JavaScript number holds exactly.
        self.next_address = (self.next_address + bytes.max(1) + 0x1000) % (1 << 53);
        address
    }

    /// Applies `record`; returns the blocks it ended and the block it started.
    fn apply(&mut self, record: &AllocRecord) -> (Option<Block>, Option<Block>) {
        if !record.alloc {
            // A free of a block never seen live (an unknown free) changes nothing.
            return (self.live.remove(&record.key), None);
        }
        // An allocation over a key still live: its free was not recorded; end the old block
        // first so addresses stay unique among live blocks, as the viewer needs.
        let ended = self.live.remove(&record.key);
        let block = Block {
            address: self.address_for(record.key, record.bytes),
            bytes: record.bytes,
            category: record.category.map_or(UNKNOWN, |c| c.as_str()),
            order: self.order,
        };
        self.order += 1;
        self.live.insert(record.key, block);
        (ended, Some(block))
    }

    /// The window's trace events, and the segments of every block live at its end.
    fn run(
        mut self,
        before: &[&AllocRecord],
        window: &[&AllocRecord],
    ) -> (Vec<TraceEvent<'a>>, Vec<Value>) {
        for record in before {
            self.apply(record);
        }
        let mut trace = Vec::with_capacity(window.len() * 3);
        for record in window {
            let time_us = i64::try_from(record.ts_ns / 1000).unwrap_or(i64::MAX);
            let (ended, started) = self.apply(record);
            let event = |action, block: Block| TraceEvent {
                action,
                address: block.address,
                bytes: block.bytes,
                time_us,
                device: self.device,
                category: block.category,
            };
            if let Some(block) = ended {
                for action in ["free_requested", "free_completed", "segment_free"] {
                    trace.push(event(action, block));
                }
            }
            if let Some(block) = started {
                for action in ["segment_alloc", "alloc"] {
                    trace.push(event(action, block));
                }
            }
        }
        let mut blocks: Vec<Block> = self.live.values().copied().collect();
        blocks.sort_unstable_by_key(|b| (b.address, b.order));
        let segments = blocks
            .into_iter()
            .map(|block| segment(self.index, block, self.device))
            .collect();
        (trace, segments)
    }
}

/// A pickled integer; the log's sizes and addresses fit an `i64` (the reader rejects larger).
fn int(n: u64) -> Value {
    Value::Int(i64::try_from(n).unwrap_or(i64::MAX))
}

fn time_of(event: &Value) -> Option<i64> {
    match event {
        Value::Dict(entries) => entries.iter().find_map(|(k, v)| match (k, v) {
            (&"time_us", Value::Int(t)) => Some(*t),
            _ => None,
        }),
        _ => None,
    }
}

/// The `snapshot` action that names the category `unknown` for the viewer (see the module
/// docs) and marks where the window starts.
fn window_start_marker(time_us: i64) -> Value {
    Value::Dict(vec![
        ("action", Value::Str("snapshot".to_string())),
        ("addr", Value::Int(0)),
        ("size", Value::Int(0)),
        ("stream", Value::Int(0)),
        ("time_us", Value::Int(time_us)),
        ("category", Value::Str(UNKNOWN.to_string())),
        ("frames", Value::List(Vec::new())),
    ])
}

fn frames(device: &str, category: &str) -> Value {
    Value::List(vec![Value::Dict(vec![
        ("filename", Value::Str(device.to_string())),
        ("line", Value::Int(0)),
        ("name", Value::Str(category.to_string())),
    ])])
}

fn segment(index: usize, block: Block, device: &str) -> Value {
    let size = int(block.bytes);
    Value::Dict(vec![
        ("device", Value::Int(index as i64)),
        ("address", int(block.address)),
        ("total_size", size.clone()),
        ("allocated_size", size.clone()),
        ("active_size", size.clone()),
        ("requested_size", size.clone()),
        ("stream", Value::Int(0)),
        ("segment_type", Value::Str("large".to_string())),
        (
            "blocks",
            Value::List(vec![Value::Dict(vec![
                ("size", size.clone()),
                ("requested_size", size),
                ("state", Value::Str("active_allocated".to_string())),
                ("frames", frames(device, block.category)),
            ])]),
        ),
    ])
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(key: u64, bytes: u64, alloc: bool) -> AllocRecord {
        AllocRecord::new(0, key * 1000, key, bytes, alloc, None)
    }

    #[test]
    fn the_window_ends_at_the_peak() {
        let records = [
            record(1, 10, true),
            record(2, 10, true),
            record(3, 10, true),
            record(1, 10, false),
            record(2, 10, false),
            record(3, 10, false),
        ];
        let refs: Vec<&AllocRecord> = records.iter().collect();
        assert_eq!(peak_window(&refs, 10), 0..6);
        assert_eq!(
            peak_window(&refs, 2),
            1..3,
            "the two records up to the third alloc"
        );
    }

    fn field<'v>(value: &'v Value, key: &str) -> &'v Value {
        match value {
            Value::Dict(entries) => &entries.iter().find(|(k, _)| *k == key).unwrap().1,
            _ => panic!("not a dict"),
        }
    }

    fn list(value: &Value) -> &[Value] {
        match value {
            Value::List(items) => items,
            _ => panic!("not a list"),
        }
    }

    #[test]
    fn device_tensors_get_addresses_that_do_not_overlap() {
        let records = [record(1, 1 << 30, true), record(2, 1 << 30, true)];
        let refs: Vec<&AllocRecord> = records.iter().collect();
        let (trace, segments) = DeviceReplay::new("cuda:0", 0, false).run(&[], &refs);
        assert_eq!(trace.len(), 4);
        assert_eq!(segments.len(), 2);
        let (Value::Int(a), Value::Int(b)) = (
            field(&segments[0], "address"),
            field(&segments[1], "address"),
        ) else {
            panic!("segments have addresses");
        };
        assert!(*b >= a + (1 << 30), "{a:#x} {b:#x}");
    }

    #[test]
    fn blocks_live_before_the_window_are_segments_and_unknown_frees_are_dropped() {
        // Block 1 lives through the whole window, block 2 dies inside it, 9 was never seen.
        let before = [record(1, 100, true), record(2, 10, true)];
        let window = [
            record(2, 10, false),
            record(9, 5, false),
            record(3, 7, true),
        ];
        let before: Vec<&AllocRecord> = before.iter().collect();
        let window: Vec<&AllocRecord> = window.iter().collect();
        let (trace, segments) = DeviceReplay::new("cpu", 0, true).run(&before, &window);
        let actions: Vec<&str> = trace.iter().map(|e| e.action).collect();
        assert_eq!(
            actions,
            [
                "free_requested",
                "free_completed",
                "segment_free",
                "segment_alloc",
                "alloc"
            ]
        );
        let addresses: Vec<&Value> = segments.iter().map(|s| field(s, "address")).collect();
        assert_eq!(addresses, [&Value::Int(1), &Value::Int(3)]);
    }

    #[test]
    fn the_viewer_always_finds_the_unknown_category() {
        let mut log = AllocLog {
            devices: vec!["cpu".into()],
            records: vec![record(1, 8, true)],
        };
        log.records[0].category = Some(highwater_profile::model::Category::Parameter);
        let pickled = snapshot(&log, 10);
        let trace = &list(field(&pickled, "device_traces"))[0];
        let first = &list(trace)[0];
        assert_eq!(field(first, "action"), &Value::Str("snapshot".into()));
        assert_eq!(field(first, "category"), &Value::Str(UNKNOWN.into()));
        // With an unknown block already there, no marker is added.
        log.records[0].category = None;
        let pickled = snapshot(&log, 10);
        let trace = &list(field(&pickled, "device_traces"))[0];
        assert_eq!(list(trace).len(), 2);
    }

    #[test]
    fn grouping_by_device_is_one_pass() {
        // 65,535 devices with one allocation each: quadratic grouping would visit 4e9 records.
        let devices = u16::MAX as usize;
        let log = AllocLog {
            devices: (0..devices).map(|i| format!("dev:{i}")).collect(),
            records: (0..devices)
                .map(|i| {
                    let mut alloc_record = record(i as u64, 64, true);
                    alloc_record.device = i as u16;
                    alloc_record
                })
                .collect(),
        };
        let snapshot = snapshot(&log, 10);
        assert_eq!(list(field(&snapshot, "device_traces")).len(), devices);
        assert_eq!(list(field(&snapshot, "segments")).len(), devices);
    }
}
