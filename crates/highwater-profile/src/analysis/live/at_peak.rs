//! What was live at the peak: the side rows that keep the blocks live at the latest peak that
//! ended or changed since, and the views of live-at-peak (and live now) the profile is built
//! from.

use rustc_hash::FxHashMap;

use super::super::event::DeviceId;
use super::map::Block;
use super::{LiveEntry, LiveSet, Origin};
use crate::model::Category;

/// Bytes and blocks per context id, for the blocks live at the peak that ended since: a
/// table indexed by the id (ids are dense), and the ids that have a row, to list and clear
/// them. On a growing program about half the frees land here, and an index costs less than a
/// hash.
#[derive(Debug, Default)]
pub(super) struct SideRows {
    /// `(bytes, blocks)` by context id; `blocks == 0`: no row.
    pub(super) by_context: Vec<(u64, u64)>,
    /// The ids with a row.
    pub(super) used: Vec<u32>,
}

impl SideRows {
    /// Adds a block of `size` bytes to `context`'s row; true when that made the row.
    #[inline]
    pub(super) fn add(&mut self, context: u32, size: u64) -> bool {
        let at = context as usize;
        if at >= self.by_context.len() {
            self.by_context.resize(at + 1, (0, 0));
        }
        let row = &mut self.by_context[at];
        row.0 = row.0.saturating_add(size);
        row.1 += 1;
        let made = row.1 == 1;
        if made {
            self.used.push(context);
        }
        made
    }

    pub(super) fn is_empty(&self) -> bool {
        self.used.is_empty()
    }

    /// The rows: `(context, (bytes, blocks))`.
    pub(super) fn rows(&self) -> impl Iterator<Item = (u32, (u64, u64))> + '_ {
        self.used
            .iter()
            .map(|&context| (context, self.by_context[context as usize]))
    }

    /// Clears every row, calling `cleared` with the id of each.
    pub(super) fn clear(&mut self, mut cleared: impl FnMut(u32)) {
        for context in self.used.drain(..) {
            self.by_context[context as usize] = (0, 0);
            cleared(context);
        }
    }

    #[cfg(test)]
    pub(super) fn heap_bytes(&self) -> usize {
        self.by_context.capacity() * std::mem::size_of::<(u64, u64)>() + self.used.capacity() * 4
    }
}

/// A block in the list of the largest at the peak.
#[derive(Debug, Clone, Copy)]
pub(super) struct Ranked {
    pub(super) device: DeviceId,
    pub(super) addr: u64,
    pub(super) block: Block,
}

/// The largest first, then allocated earlier, then by key.
pub(super) fn rank_order(a: &Ranked, b: &Ranked) -> std::cmp::Ordering {
    b.block
        .size
        .cmp(&a.block.size)
        .then(a.block.ts.cmp(&b.block.ts))
        .then(a.device.cmp(&b.device))
        .then(a.addr.cmp(&b.addr))
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
    let mut by_context: FxHashMap<u32, (u64, u64)> = live.since_peak.rows().collect();
    for (_, block) in live.still_live_at_peak() {
        let row = by_context.entry(block.context).or_default();
        row.0 = row.0.saturating_add(block.size);
        row.1 += 1;
    }
    let mut groups: FxHashMap<GroupKey, (u64, u64)> = FxHashMap::default();
    for (context, (bytes, count)) in by_context {
        let context = live.contexts.get(context);
        let key = GroupKey {
            origin: context.origin,
            category: context.category,
            device: context.device,
        };
        let group = groups.entry(key).or_default();
        group.0 = group.0.saturating_add(bytes);
        group.1 += count;
    }
    groups
        .into_iter()
        .map(|(key, (bytes, count))| (key, bytes, count))
        .collect()
}

/// Aggregates the blocks live now on `device` by [`GroupKey`]: `(key, bytes, count)`, in no
/// order. O(live blocks on the device): for rare moments (a refused allocation), not per event.
pub(crate) fn group_live_now(live: &LiveSet, device: DeviceId) -> Vec<(GroupKey, u64, u64)> {
    let mut groups: FxHashMap<GroupKey, (u64, u64)> = FxHashMap::default();
    for block in live.blocks_on(device) {
        let context = live.contexts.get(block.context);
        let key = GroupKey {
            origin: context.origin,
            category: context.category,
            device: context.device,
        };
        let group = groups.entry(key).or_default();
        group.0 = group.0.saturating_add(block.size);
        group.1 += 1;
    }
    groups
        .into_iter()
        .map(|(key, (bytes, count))| (key, bytes, count))
        .collect()
}

/// The `n` largest blocks live at the peak, largest first (ties: allocated earlier first,
/// then by device and address). Keeps `n` candidates at a time (a heap whose top is the worst
/// kept), never a copy of every live block: a checkpoint of a run with tens of millions of live
/// blocks must not double its memory.
pub(crate) fn largest_at_peak(live: &LiveSet, n: usize) -> Vec<(DeviceId, LiveEntry)> {
    /// Orders a heap so that its top is the worst-ranked block kept.
    struct Kept(Ranked);
    impl PartialEq for Kept {
        fn eq(&self, other: &Kept) -> bool {
            rank_order(&self.0, &other.0).is_eq()
        }
    }
    impl Eq for Kept {}
    impl PartialOrd for Kept {
        fn partial_cmp(&self, other: &Kept) -> Option<std::cmp::Ordering> {
            Some(self.cmp(other))
        }
    }
    impl Ord for Kept {
        fn cmp(&self, other: &Kept) -> std::cmp::Ordering {
            rank_order(&self.0, &other.0)
        }
    }
    if n == 0 {
        return Vec::new();
    }
    let mut kept: std::collections::BinaryHeap<Kept> = std::collections::BinaryHeap::new();
    let candidates = live
        .still_live_at_peak()
        .map(|(device, block)| Ranked {
            device,
            addr: block.addr,
            block: *block,
        })
        .chain(live.since_peak_top.iter().copied());
    for ranked in candidates {
        if kept.len() < n {
            kept.push(Kept(ranked));
        } else if kept
            .peek()
            .is_some_and(|worst| rank_order(&ranked, &worst.0).is_lt())
        {
            kept.pop();
            kept.push(Kept(ranked));
        }
    }
    let mut all: Vec<Ranked> = kept.into_iter().map(|kept| kept.0).collect();
    all.sort_unstable_by(rank_order);
    all.into_iter()
        .map(|ranked| (ranked.device, live.entry(&ranked.block)))
        .collect()
}
