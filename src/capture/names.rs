//! The process-wide table of names, shapes and devices that op hooks refer to by id.
//!
//! Op hooks run on user threads but outside the allocator, so they may take this table's lock;
//! they do so with recording paused, so the table's own allocations are never recorded. Ids
//! are stable for the life of the process; the collector resolves them when it decodes events.

use std::collections::HashMap;
use std::sync::LazyLock;

use parking_lot::Mutex;

use super::hook::with_recording_paused;

/// The CPU heap's device id.
pub(crate) const CPU: u16 = 0;

/// Device ids past this are folded into one, so the `u16` in an event never overflows.
const MAX_DEVICES: usize = 4096;

#[derive(Debug, Default)]
struct Table {
    names: Vec<Box<str>>,
    name_ids: HashMap<Box<str>, u32>,
    shapes: Vec<Box<[u64]>>,
    shape_ids: HashMap<Box<[u64]>, u32>,
    devices: Vec<Box<str>>,
    device_ids: HashMap<Box<str>, u16>,
}

static TABLE: LazyLock<Mutex<Table>> = LazyLock::new(|| {
    let mut table = Table::default();
    table.devices.push("cpu".into());
    table.device_ids.insert("cpu".into(), CPU);
    Mutex::new(table)
});

/// The id of `name`.
pub(crate) fn name(name: &str) -> u32 {
    with_recording_paused(|| {
        let mut table = TABLE.lock();
        if let Some(id) = table.name_ids.get(name) {
            return *id;
        }
        let id = table.names.len() as u32;
        table.names.push(name.into());
        table.name_ids.insert(name.into(), id);
        id
    })
}

/// The id of a shape.
pub(crate) fn shape(dims: &[usize]) -> u32 {
    with_recording_paused(|| {
        let dims: Box<[u64]> = dims.iter().map(|&d| d as u64).collect();
        let mut table = TABLE.lock();
        if let Some(id) = table.shape_ids.get(&dims) {
            return *id;
        }
        let id = table.shapes.len() as u32;
        table.shapes.push(dims.clone());
        table.shape_ids.insert(dims, id);
        id
    })
}

/// The id of a device name (`"cpu"` is [`CPU`]). Past 4096 devices, new names share the last id.
pub(crate) fn device(name: &str) -> u16 {
    with_recording_paused(|| {
        let mut table = TABLE.lock();
        if let Some(id) = table.device_ids.get(name) {
            return *id;
        }
        if table.devices.len() >= MAX_DEVICES {
            return (MAX_DEVICES - 1) as u16;
        }
        let id = table.devices.len() as u16;
        table.devices.push(name.into());
        table.device_ids.insert(name.into(), id);
        id
    })
}

/// The name with id `id`, if any (collector side).
pub(crate) fn name_of(id: u32) -> Option<String> {
    TABLE.lock().names.get(id as usize).map(|n| n.to_string())
}

/// The shape with id `id`, if any (collector side).
pub(crate) fn shape_of(id: u32) -> Option<Vec<u64>> {
    TABLE.lock().shapes.get(id as usize).map(|s| s.to_vec())
}

/// The device name with id `id`, if any (collector side).
pub(crate) fn device_of(id: u16) -> Option<String> {
    TABLE
        .lock()
        .devices
        .get(usize::from(id))
        .map(|d| d.to_string())
}
