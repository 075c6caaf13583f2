//! The process-wide table of names, shapes and devices that op hooks refer to by id.
//!
//! Op hooks run on user threads but outside the allocator, so they may take this table's lock;
//! they do so with recording paused, so the table's own allocations are never recorded. Ids
//! are stable for the life of the process; the collector resolves them when it decodes events.
//!
//! The table's lock is a [`ForkSafeMutex`], held across `fork` by the session's fork handler
//! ([`hold_over_fork`]): a child forked while a parent thread was interning a name would otherwise
//! inherit it locked, and its first op would wait forever.
//!
//! The table is bounded: past [`MAX_NAMES`] names (or [`MAX_NAME_BYTES`] of them), a new name
//! gets the id of [`FOLDED_NAME`] and is counted ([`folded`]), so a program that makes a unique
//! op name per step (`format!("step{i}")`) cannot grow it without end. Devices and shapes are
//! bounded the same way ([`MAX_DEVICES`], [`MAX_SHAPES`]): a device past the limit is shown as
//! [`FOLDED_DEVICE`], a shape past it is not recorded, and both are counted.
//!
//! Device names are normalised once, here ([`device_name`]), so that what reaches the profile
//! and the allocation log is what their readers accept: no control characters, not empty, at
//! most [`MAX_DEVICE_NAME_BYTES`] bytes.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::LazyLock;

use super::hook::with_recording_paused;
use crate::fork_lock::{ForkSafeGuard, ForkSafeMutex};

/// The CPU heap's device id.
pub(crate) const CPU: u16 = 0;

/// Most devices the table keeps; further ones share [`FOLDED_DEVICE`]'s id, the last, so the
/// `u16` in an event never overflows.
pub(crate) const MAX_DEVICES: usize = 4096;

/// What devices that arrived after the table filled up are shown as.
pub(crate) const FOLDED_DEVICE: &str = "(more devices than highwater keeps)";

/// Longest device name kept, in bytes; longer names are cut at a character boundary.
pub(crate) const MAX_DEVICE_NAME_BYTES: usize = 256;

/// Most distinct shapes the table keeps; a shape past them is not recorded (counted).
pub(crate) const MAX_SHAPES: usize = 1 << 16;

/// Most dimensions kept of all shapes together.
const MAX_SHAPE_DIMS: usize = 1 << 20;

/// Most distinct op and dtype names the table keeps for the life of the process.
pub(crate) const MAX_NAMES: usize = 1 << 16;

/// Most bytes of names the table keeps.
pub(crate) const MAX_NAME_BYTES: usize = 8 << 20;

/// What a name that arrived after the table filled up is shown as (id 0).
pub(crate) const FOLDED_NAME: &str = "(more names than highwater keeps)";

/// Names that were given [`FOLDED_NAME`]'s id because the table was full.
static FOLDED: AtomicU64 = AtomicU64::new(0);

/// Devices that were given [`FOLDED_DEVICE`]'s id because the table was full.
static FOLDED_DEVICES: AtomicU64 = AtomicU64::new(0);

/// Shapes not recorded because the table was full.
static FOLDED_SHAPES: AtomicU64 = AtomicU64::new(0);

#[derive(Debug, Default)]
struct Table {
    names: Vec<Box<str>>,
    name_bytes: usize,
    name_ids: HashMap<Box<str>, u32>,
    shapes: Vec<Box<[u64]>>,
    shape_dims: usize,
    shape_ids: HashMap<Box<[u64]>, u32>,
    devices: Vec<Box<str>>,
    device_ids: HashMap<Box<str>, u16>,
}

static TABLE: LazyLock<ForkSafeMutex<Table>> = LazyLock::new(|| {
    let mut table = Table::default();
    table.names.push(FOLDED_NAME.into());
    table.devices.push("cpu".into());
    table.device_ids.insert("cpu".into(), CPU);
    ForkSafeMutex::new(table)
});

/// The table, locked by the session's fork handler until the fork is over.
#[derive(Debug)]
pub(crate) struct HeldOverFork {
    _table: ForkSafeGuard<'static, Table>,
}

/// Locks the table for a `fork` (called in the `atfork` prepare handler, so the child gets it
/// free): released when the returned value is dropped, after the fork, in parent and child.
pub(crate) fn hold_over_fork() -> HeldOverFork {
    HeldOverFork {
        _table: TABLE.lock(),
    }
}

/// The id of `name`.
pub(crate) fn name(name: &str) -> u32 {
    with_recording_paused(|| {
        let mut table = TABLE.lock();
        table.intern(name)
    })
}

/// Names folded into [`FOLDED_NAME`] since the process started.
pub(crate) fn folded() -> u64 {
    FOLDED.load(Ordering::Relaxed)
}

/// Devices folded into [`FOLDED_DEVICE`] since the process started.
pub(crate) fn folded_devices() -> u64 {
    FOLDED_DEVICES.load(Ordering::Relaxed)
}

/// Shapes not recorded since the process started (the table was full).
pub(crate) fn folded_shapes() -> u64 {
    FOLDED_SHAPES.load(Ordering::Relaxed)
}

impl Table {
    /// The id of the (normalised) device `name`, adding it if the table has room, else
    /// [`FOLDED_DEVICE`]'s (counted).
    fn intern_device(&mut self, name: &str) -> u16 {
        if let Some(id) = self.device_ids.get(name) {
            return *id;
        }
        if self.devices.len() + 1 >= MAX_DEVICES {
            FOLDED_DEVICES.fetch_add(1, Ordering::Relaxed);
            if self.devices.len() + 1 == MAX_DEVICES {
                self.devices.push(FOLDED_DEVICE.into());
            }
            return (MAX_DEVICES - 1) as u16;
        }
        let id = self.devices.len() as u16;
        self.devices.push(name.into());
        self.device_ids.insert(name.into(), id);
        id
    }

    /// The id of `dims`, adding it if the table has room, else `None` (counted).
    fn intern_shape(&mut self, dims: Box<[u64]>) -> Option<u32> {
        if let Some(id) = self.shape_ids.get(&dims) {
            return Some(*id);
        }
        if self.shapes.len() >= MAX_SHAPES || self.shape_dims + dims.len() > MAX_SHAPE_DIMS {
            FOLDED_SHAPES.fetch_add(1, Ordering::Relaxed);
            return None;
        }
        let id = self.shapes.len() as u32;
        self.shape_dims += dims.len();
        self.shapes.push(dims.clone());
        self.shape_ids.insert(dims, id);
        Some(id)
    }

    /// The id of `name`, adding it if the table has room, else [`FOLDED_NAME`]'s (counted).
    fn intern(&mut self, name: &str) -> u32 {
        if let Some(id) = self.name_ids.get(name) {
            return *id;
        }
        if self.names.len() >= MAX_NAMES || self.name_bytes + name.len() > MAX_NAME_BYTES {
            FOLDED.fetch_add(1, Ordering::Relaxed);
            return 0;
        }
        let id = self.names.len() as u32;
        self.name_bytes += name.len();
        self.names.push(name.into());
        self.name_ids.insert(name.into(), id);
        id
    }
}

/// The id of a shape; `None` (counted) once the table is full.
pub(crate) fn shape(dims: &[usize]) -> Option<u32> {
    with_recording_paused(|| {
        let dims: Box<[u64]> = dims.iter().map(|&d| d as u64).collect();
        TABLE.lock().intern_shape(dims)
    })
}

/// The id of a device name (`"cpu"` is [`CPU`]), normalised by [`device_name`]. Past
/// [`MAX_DEVICES`], new devices share [`FOLDED_DEVICE`]'s id (counted).
pub(crate) fn device(name: &str) -> u16 {
    with_recording_paused(|| {
        let name = device_name(name);
        TABLE.lock().intern_device(&name)
    })
}

/// A device name as highwater keeps it: control characters (line breaks, escapes) become `?`,
/// an empty name is `(unnamed device)`, and a name longer than [`MAX_DEVICE_NAME_BYTES`] bytes
/// is cut at the last character boundary that fits.
pub(crate) fn device_name(name: &str) -> std::borrow::Cow<'_, str> {
    if name.is_empty() {
        return "(unnamed device)".into();
    }
    let mut end = name.len().min(MAX_DEVICE_NAME_BYTES);
    while !name.is_char_boundary(end) {
        end -= 1;
    }
    let kept = &name[..end];
    if kept.chars().any(char::is_control) {
        kept.chars()
            .map(|c| if c.is_control() { '?' } else { c })
            .collect::<String>()
            .into()
    } else {
        kept.into()
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_name_table_is_bounded_and_counts_what_it_folded() {
        let mut table = Table::default();
        table.names.push(FOLDED_NAME.into());
        let before = folded();
        let kept = table.intern("matmul");
        assert_eq!(table.intern("matmul"), kept);
        for step in 0..MAX_NAMES + 100 {
            table.intern(&format!("step{step}"));
        }
        assert_eq!(table.names.len(), MAX_NAMES);
        assert_eq!(table.intern("step999999"), 0);
        assert_eq!(
            table.intern("matmul"),
            kept,
            "names kept before still resolve"
        );
        // Names 1.. fill the table, `matmul` took one slot: the rest of the steps and the last
        // lookup were folded. (Other tests may fold concurrently, hence at least.)
        let expected = (MAX_NAMES + 100 - (MAX_NAMES - 2)) as u64 + 1;
        assert!(
            folded() - before >= expected,
            "{} < {expected}",
            folded() - before
        );
        let mut big = Table::default();
        let long = "x".repeat(1 << 20);
        for i in 0..20 {
            big.intern(&format!("{long}{i}"));
        }
        assert!(big.name_bytes <= MAX_NAME_BYTES);
    }

    #[test]
    fn device_names_are_what_every_reader_accepts() {
        assert_eq!(device_name(""), "(unnamed device)");
        assert_eq!(device_name("cuda:0\n"), "cuda:0?");
        assert_eq!(device_name("tpu\u{1b}[31m:1"), "tpu?[31m:1");
        let long = "é".repeat(200);
        let kept = device_name(&long);
        assert!(kept.len() <= MAX_DEVICE_NAME_BYTES && long.starts_with(&*kept));
        assert_eq!(device_name("cuda:3"), "cuda:3");
    }

    #[test]
    fn devices_and_shapes_are_bounded_and_counted() {
        let mut table = Table::default();
        table.devices.push("cpu".into());
        let before = folded_devices();
        for i in 0..MAX_DEVICES + 10 {
            table.intern_device(&format!("tpu:{i}"));
        }
        assert_eq!(table.devices.len(), MAX_DEVICES);
        assert_eq!(&*table.devices[MAX_DEVICES - 1], FOLDED_DEVICE);
        assert_eq!(
            table.intern_device("tpu:5"),
            6,
            "kept devices still resolve"
        );
        assert_eq!(table.intern_device("tpu:99999"), (MAX_DEVICES - 1) as u16);
        assert!(folded_devices() - before >= 12);

        let shapes_before = folded_shapes();
        for i in 0..MAX_SHAPES as u64 + 5 {
            table.intern_shape(vec![i, 3].into());
        }
        assert_eq!(table.shapes.len(), MAX_SHAPES);
        assert_eq!(table.intern_shape(vec![7, 3].into()), Some(7));
        assert_eq!(table.intern_shape(vec![u64::MAX].into()), None);
        assert!(folded_shapes() - shapes_before >= 6);
    }
}
