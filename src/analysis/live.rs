//! The live map, and what was live at the peak without copying the live set at every new peak.
//!
//! # Live at the peak, incrementally
//!
//! Every live entry carries a sequence number: the index of the event that made it (or last
//! changed its category). When a new global peak is set at event `p`, the set of blocks live at
//! that instant is exactly the live entries with `seq <= p`. Later events can only end such
//! entries or change them, so whenever one is ended or recategorised we move a copy of it, as it
//! was, into a side list; a newer peak clears the list. At any time, live-at-peak is the live
//! entries with `seq <= p` plus the side list. Each entry enters the side list at most once per
//! peak, so the cost is O(1) amortised per event and the memory O(blocks live at the peak).

use rustc_hash::FxHashMap;

use crate::model::Category;

use super::event::DeviceId;

/// "None" for the `u32` ids kept in live entries (span nodes, instances, interned names).
pub(crate) const NONE: u32 = u32::MAX;

/// Where a block was allocated: span node and innermost op, as ids ([`NONE`]: unknown).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct Origin {
    /// Span tree node, [`NONE`] outside every (known) span.
    pub(crate) node: u32,
    /// The timeline's id of the (op name, shape, dtype) of the innermost open op, [`NONE`]
    /// when no op was open. One id instead of three keeps a live entry within a cache line.
    pub(crate) op: u32,
}

impl Origin {
    /// Outside every span and op.
    pub(crate) const NOWHERE: Origin = Origin {
        node: NONE,
        op: NONE,
    };
}

/// One live block.
#[derive(Debug, Clone, Copy)]
pub(crate) struct LiveEntry {
    /// Bytes.
    pub(crate) size: u64,
    /// Timestamp of the allocation, ns (decides whether a late free belongs to this life).
    pub(crate) ts: u64,
    /// Index of the event that allocated it or last changed its category (peak accounting).
    pub(crate) seq: u64,
    /// Thread that allocated it.
    pub(crate) thread: u32,
    /// Span instance that owns it for residual accounting, [`NONE`] outside spans.
    pub(crate) owner: u32,
    /// Span node and op it was allocated in.
    pub(crate) origin: Origin,
    /// Its category now.
    pub(crate) category: Category,
}

/// What a free did to the live map.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Freed {
    /// The block was live and is not any more.
    Ended(LiveEntry),
    /// The block is live but was allocated after the free's timestamp: the free belongs to an
    /// earlier life of the address, and the block stays live.
    Straggler,
    /// Nothing was live at that key.
    Unknown,
}

/// Live blocks keyed by (device, address), with the live-at-peak bookkeeping.
#[derive(Debug, Default)]
pub(crate) struct LiveSet {
    map: FxHashMap<(DeviceId, u64), LiveEntry>,
    /// Sequence number of the event that set the current global peak.
    peak_seq: Option<u64>,
    /// Blocks live at the peak that were ended or changed since, as they were at the peak.
    since_peak: Vec<(DeviceId, LiveEntry)>,
}

impl LiveSet {
    fn was_live_at_peak(&self, entry: &LiveEntry) -> bool {
        self.peak_seq.is_some_and(|peak| entry.seq <= peak)
    }

    fn remember(&mut self, device: DeviceId, entry: LiveEntry) {
        if self.was_live_at_peak(&entry) {
            self.since_peak.push((device, entry));
        }
    }

    /// Makes `entry` live at `(device, addr)`; returns the entry it displaced, if the key was
    /// already live (the caller ends it and counts a repair).
    pub(crate) fn insert(
        &mut self,
        device: DeviceId,
        addr: u64,
        entry: LiveEntry,
    ) -> Option<LiveEntry> {
        let old = self.map.insert((device, addr), entry)?;
        self.remember(device, old);
        Some(old)
    }

    /// Ends the block at `(device, addr)` for a free stamped `ts`.
    pub(crate) fn free(&mut self, device: DeviceId, addr: u64, ts: u64) -> Freed {
        use std::collections::hash_map::Entry;
        match self.map.entry((device, addr)) {
            Entry::Vacant(_) => Freed::Unknown,
            Entry::Occupied(live) if ts < live.get().ts => Freed::Straggler,
            Entry::Occupied(live) => {
                let entry = live.remove();
                self.remember(device, entry);
                Freed::Ended(entry)
            }
        }
    }

    /// Changes the category of a live block at event `seq`; returns `(size, old category)`
    /// when the block is live and its category changed.
    pub(crate) fn set_category(
        &mut self,
        device: DeviceId,
        addr: u64,
        category: Category,
        seq: u64,
    ) -> Option<(u64, Category)> {
        let peak = self.peak_seq;
        let entry = self.map.get_mut(&(device, addr))?;
        if entry.category == category {
            return None;
        }
        let before = *entry;
        entry.category = category;
        // From the peak's point of view the block is now a new one: keep the old one in the
        // side list and give the live one this event's sequence number.
        entry.seq = seq;
        if peak.is_some_and(|peak| before.seq <= peak) {
            self.since_peak.push((device, before));
        }
        Some((before.size, before.category))
    }

    /// Sets the op (name, shape, dtype id) of a live block; unknown blocks are ignored.
    pub(crate) fn annotate(&mut self, device: DeviceId, addr: u64, op: u32) {
        if let Some(entry) = self.map.get_mut(&(device, addr)) {
            entry.origin.op = op;
        }
    }

    /// Records that the event `seq` set a new global peak.
    pub(crate) fn mark_peak(&mut self, seq: u64) {
        self.peak_seq = Some(seq);
        self.since_peak.clear();
    }

    /// Every block that was live at the current peak, as it was then.
    pub(crate) fn at_peak(&self) -> impl Iterator<Item = (DeviceId, &LiveEntry)> + '_ {
        let still_live = self
            .map
            .iter()
            .filter(|(_, entry)| self.was_live_at_peak(entry))
            .map(|(&(device, _), entry)| (device, entry));
        still_live.chain(
            self.since_peak
                .iter()
                .map(|(device, entry)| (*device, entry)),
        )
    }

    /// Number of live blocks.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.map.len()
    }
}

/// The key live-at-peak blocks are aggregated by.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct GroupKey {
    pub(crate) origin: Origin,
    pub(crate) category: Category,
    pub(crate) device: DeviceId,
}

/// Aggregates live-at-peak blocks by [`GroupKey`]: `(key, bytes, count)`, in no order.
pub(crate) fn group_at_peak(live: &LiveSet) -> Vec<(GroupKey, u64, u64)> {
    let mut groups: FxHashMap<GroupKey, (u64, u64)> = FxHashMap::default();
    for (device, entry) in live.at_peak() {
        let key = GroupKey {
            origin: entry.origin,
            category: entry.category,
            device,
        };
        let group = groups.entry(key).or_default();
        group.0 = group.0.saturating_add(entry.size);
        group.1 += 1;
    }
    groups
        .into_iter()
        .map(|(key, (bytes, count))| (key, bytes, count))
        .collect()
}

/// The `n` largest blocks live at the peak, largest first (ties: allocated earlier first).
pub(crate) fn largest_at_peak(live: &LiveSet, n: usize) -> Vec<(DeviceId, LiveEntry)> {
    let mut all: Vec<(DeviceId, LiveEntry)> = live.at_peak().map(|(d, e)| (d, *e)).collect();
    let order = |a: &(DeviceId, LiveEntry), b: &(DeviceId, LiveEntry)| {
        b.1.size
            .cmp(&a.1.size)
            .then(a.1.seq.cmp(&b.1.seq))
            .then(a.0.cmp(&b.0))
    };
    if n == 0 {
        return Vec::new();
    }
    if all.len() > n {
        all.select_nth_unstable_by(n - 1, order);
        all.truncate(n);
    }
    all.sort_unstable_by(order);
    all
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(size: u64, ts: u64, seq: u64) -> LiveEntry {
        LiveEntry {
            size,
            ts,
            seq,
            thread: 0,
            owner: NONE,
            origin: Origin::NOWHERE,
            category: Category::Other,
        }
    }

    fn sizes_at_peak(live: &LiveSet) -> Vec<u64> {
        let mut sizes: Vec<u64> = live.at_peak().map(|(_, e)| e.size).collect();
        sizes.sort_unstable();
        sizes
    }

    #[test]
    fn blocks_freed_after_the_peak_still_count_at_the_peak() {
        let cpu = DeviceId::CPU;
        let mut live = LiveSet::default();
        live.insert(cpu, 1, entry(10, 0, 0));
        live.insert(cpu, 2, entry(20, 1, 1));
        live.mark_peak(1);
        assert!(matches!(live.free(cpu, 1, 2), Freed::Ended(_)));
        live.insert(cpu, 3, entry(5, 3, 3));
        assert_eq!(sizes_at_peak(&live), vec![10, 20]);
        // A higher peak forgets the side list.
        live.insert(cpu, 4, entry(100, 4, 4));
        live.mark_peak(4);
        assert_eq!(sizes_at_peak(&live), vec![5, 20, 100]);
    }

    #[test]
    fn a_free_older_than_the_block_is_a_straggler() {
        let mut live = LiveSet::default();
        live.insert(DeviceId::CPU, 1, entry(10, 50, 0));
        assert!(matches!(live.free(DeviceId::CPU, 1, 49), Freed::Straggler));
        assert!(matches!(live.free(DeviceId(1), 1, 60), Freed::Unknown));
        assert_eq!(live.len(), 1);
        assert!(matches!(live.free(DeviceId::CPU, 1, 50), Freed::Ended(_)));
        assert_eq!(live.len(), 0);
    }

    #[test]
    fn recategorised_blocks_count_at_the_peak_as_they_were() {
        let mut live = LiveSet::default();
        live.insert(DeviceId::CPU, 1, entry(10, 0, 0));
        live.mark_peak(0);
        let changed = live.set_category(DeviceId::CPU, 1, Category::Parameter, 1);
        assert_eq!(changed, Some((10, Category::Other)));
        let at_peak: Vec<Category> = live.at_peak().map(|(_, e)| e.category).collect();
        assert_eq!(at_peak, vec![Category::Other]);
    }

    #[test]
    fn a_live_map_slot_fits_in_a_cache_line() {
        assert!(std::mem::size_of::<((DeviceId, u64), LiveEntry)>() <= 64);
    }

    #[test]
    fn largest_keeps_the_top_n_in_order() {
        let mut live = LiveSet::default();
        for (i, size) in [5u64, 50, 7, 50, 1].into_iter().enumerate() {
            live.insert(DeviceId::CPU, i as u64, entry(size, 0, i as u64));
        }
        live.mark_peak(10);
        let top: Vec<(u64, u64)> = largest_at_peak(&live, 3)
            .iter()
            .map(|(_, e)| (e.size, e.seq))
            .collect();
        assert_eq!(top, vec![(50, 1), (50, 3), (7, 2)]);
    }
}
