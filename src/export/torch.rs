//! PyTorch's CUDA memory snapshot format, from an allocation log, so PyTorch users can open a
//! highwater run in the viewer they know (`pytorch.org/memory_viz`: drag the file in).
//!
//! A snapshot is a pickled dict: `device_traces` (per device, the allocator's actions in
//! order) and `segments` (the allocator's state at the end). highwater's devices map to trace
//! indices in the order the log names them. The heap has no segments, so every block is its own
//! segment (`segment_alloc`, `alloc` … `free_requested`, `free_completed`, `segment_free`).
//! Device tensors are keyed by id, not address: they get addresses of their own, laid end to end
//! and never reused. Each block carries its category (the viewer's legend) and, as its one
//! "frame", the device and category, since a log records no stacks.
//!
//! A viewer replays every event in the browser, so long runs are cut to a window of at most
//! `max_events` allocations and frees per device, ending at that device's peak: what led up to
//! it. Blocks freed in the window but allocated before it show as initially allocated.

use std::collections::HashMap;
use std::path::Path;

use super::pickle::{dumps, Value};
use super::{write_output, ExportError, Output};
use crate::alloc_log::{AllocLog, AllocRecord};

/// Default for the per-device event window.
pub const DEFAULT_MAX_EVENTS: usize = 100_000;

/// The snapshot of `log` as pickle bytes, with at most `max_events` records per device.
pub fn render(log: &AllocLog, max_events: usize) -> Vec<u8> {
    let mut traces = Vec::new();
    let mut segments = Vec::new();
    for (index, device) in log.devices.iter().enumerate() {
        let records: Vec<&AllocRecord> = log
            .records
            .iter()
            .filter(|r| usize::from(r.device) == index)
            .collect();
        let window = peak_window(&records, max_events.max(1));
        let (trace, live) = device_trace(device, index, &records[window], device == "cpu");
        traces.push(Value::List(trace));
        segments.extend(live);
    }
    dumps(&Value::Dict(vec![
        ("segments", Value::List(segments)),
        ("device_traces", Value::List(traces)),
    ]))
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

/// One device's trace, and the segments of the blocks still live at its end.
fn device_trace(
    device: &str,
    index: usize,
    records: &[&AllocRecord],
    real_addresses: bool,
) -> (Vec<Value>, Vec<Value>) {
    let mut trace = Vec::with_capacity(records.len() * 3);
    // Key → (address, bytes, category name) of blocks live in the window.
    let mut live: HashMap<u64, (u64, u64, &'static str)> = HashMap::new();
    let mut next_address = 0x1000u64;
    let mut address_of = |key: u64, bytes: u64| {
        if real_addresses {
            key
        } else {
            let address = next_address;
            // Keep a gap, and stay within the 2^53 a JavaScript number holds exactly.
            next_address = (next_address + bytes.max(1) + 0x1000) % (1 << 53);
            address
        }
    };
    for record in records {
        let time_us = Value::Int((record.ts_ns / 1000) as i64);
        if record.alloc {
            let category = record.category.map_or("unknown", |c| c.as_str());
            let address = address_of(record.key, record.bytes);
            live.insert(record.key, (address, record.bytes, category));
            for action in ["segment_alloc", "alloc"] {
                trace.push(action_entry(
                    action,
                    address,
                    record.bytes,
                    &time_us,
                    device,
                    category,
                ));
            }
        } else {
            let (address, bytes, category) = live.remove(&record.key).unwrap_or((
                address_of(record.key, record.bytes),
                record.bytes,
                "unknown",
            ));
            for action in ["free_requested", "free_completed", "segment_free"] {
                trace.push(action_entry(
                    action, address, bytes, &time_us, device, category,
                ));
            }
        }
    }
    let mut blocks: Vec<_> = live.into_values().collect();
    blocks.sort_unstable();
    let segments = blocks
        .into_iter()
        .map(|(address, bytes, category)| segment(index, address, bytes, device, category))
        .collect();
    (trace, segments)
}

fn frames(device: &str, category: &str) -> Value {
    Value::List(vec![Value::Dict(vec![
        ("filename", Value::Str(device.to_string())),
        ("line", Value::Int(0)),
        ("name", Value::Str(category.to_string())),
    ])])
}

fn action_entry(
    action: &str,
    address: u64,
    bytes: u64,
    time_us: &Value,
    device: &str,
    category: &str,
) -> Value {
    Value::Dict(vec![
        ("action", Value::Str(action.to_string())),
        ("addr", Value::Int(address as i64)),
        ("size", Value::Int(bytes as i64)),
        ("stream", Value::Int(0)),
        ("time_us", time_us.clone()),
        ("category", Value::Str(category.to_string())),
        ("frames", frames(device, category)),
    ])
}

fn segment(index: usize, address: u64, bytes: u64, device: &str, category: &str) -> Value {
    let size = Value::Int(bytes as i64);
    Value::Dict(vec![
        ("device", Value::Int(index as i64)),
        ("address", Value::Int(address as i64)),
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
                ("frames", frames(device, category)),
            ])]),
        ),
    ])
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(key: u64, bytes: u64, alloc: bool) -> AllocRecord {
        AllocRecord {
            device: 0,
            ts_ns: key * 1000,
            key,
            bytes,
            alloc,
            category: None,
        }
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

    #[test]
    fn device_tensors_get_addresses_that_do_not_overlap() {
        let records = [record(1, 1 << 30, true), record(2, 1 << 30, true)];
        let refs: Vec<&AllocRecord> = records.iter().collect();
        let (trace, segments) = device_trace("cuda:0", 0, &refs, false);
        assert_eq!(trace.len(), 4);
        assert_eq!(segments.len(), 2);
        let address = |v: &Value| match v {
            Value::Dict(entries) => entries
                .iter()
                .find(|(k, _)| *k == "address")
                .map(|(_, v)| v.clone()),
            _ => None,
        };
        let (Some(Value::Int(a)), Some(Value::Int(b))) =
            (address(&segments[0]), address(&segments[1]))
        else {
            panic!("segments have addresses");
        };
        assert!(b >= a + (1 << 30), "{a:#x} {b:#x}");
    }
}
