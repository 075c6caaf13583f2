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
//! op name per step (`format!("step{i}")`) cannot grow it without end.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::LazyLock;

use super::hook::with_recording_paused;
use crate::fork_lock::{ForkSafeGuard, ForkSafeMutex};

/// The CPU heap's device id.
pub(crate) const CPU: u16 = 0;

/// Device ids past this are folded into one, so the `u16` in an event never overflows.
const MAX_DEVICES: usize = 4096;

/// Most distinct op and dtype names the table keeps for the life of the process.
pub(crate) const MAX_NAMES: usize = 1 << 16;

/// Most bytes of names the table keeps.
pub(crate) const MAX_NAME_BYTES: usize = 8 << 20;

/// What a name that arrived after the table filled up is shown as (id 0).
pub(crate) const FOLDED_NAME: &str = "(more names than highwater keeps)";

/// Names that were given [`FOLDED_NAME`]'s id because the table was full.
static FOLDED: AtomicU64 = AtomicU64::new(0);

#[derive(Debug, Default)]
struct Table {
    names: Vec<Box<str>>,
    name_bytes: usize,
    name_ids: HashMap<Box<str>, u32>,
    shapes: Vec<Box<[u64]>>,
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

impl Table {
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
}
