//! Offline packing: every block's size and lifetime known in advance, placed once for the whole
//! run by decreasing size with best fit over the blocks whose lifetimes overlap — the greedy
//! XLA's heap simulator uses (`GlobalDecreasingSizeBestFitHeap`). The height of the packing is
//! the memory a planner with perfect foresight would need; an online allocator's excess over it
//! is what not knowing the future costs.
//!
//! Blocks are packed at their requested sizes (no alignment), so the packing's height is at
//! least the lower bound (the most bytes live at once) and usually within a few percent of it.
//! The greedy is not optimal (the problem is NP-hard), so, as XLA's heap simulator does
//! (`ChooseBestHeapAlgorithm`), the planner tries three orders and keeps the lowest packing:
//! decreasing size (spatial), decreasing lifetime (temporal), and arrival order, which is
//! best fit as an online allocator would do it at exact sizes with unlimited room — so the
//! offline figure is never worse than that simplest online policy.

use super::trace::Trace;

/// Placed blocks indexed by lifetime, for "which placed blocks overlap `[start, end)`".
///
/// A segment tree over event indices: a block is stored at the O(log n) nodes that cover its
/// interval exactly; a query collects the blocks of every node that intersects the query's
/// interval, skipping empty subtrees.
struct IntervalIndex {
    /// Leaves are event indices `0..width`; node `1` is the root.
    width: usize,
    stored: Vec<Vec<u32>>,
    /// Blocks stored in each node's subtree (to skip empty ones).
    count: Vec<u32>,
}

impl IntervalIndex {
    fn new(events: usize) -> Self {
        let width = events.max(1).next_power_of_two();
        Self {
            width,
            stored: vec![Vec::new(); 2 * width],
            count: vec![0; 2 * width],
        }
    }

    fn insert(&mut self, block: u32, start: usize, end: usize) {
        self.insert_at(1, 0, self.width, start, end, block);
    }

    fn insert_at(&mut self, node: usize, lo: usize, hi: usize, s: usize, e: usize, block: u32) {
        if e <= lo || hi <= s {
            return;
        }
        self.count[node] += 1;
        if s <= lo && hi <= e {
            self.stored[node].push(block);
            return;
        }
        let mid = (lo + hi) / 2;
        self.insert_at(2 * node, lo, mid, s, e, block);
        self.insert_at(2 * node + 1, mid, hi, s, e, block);
    }

    /// Every stored block whose interval meets `[s, e)`; a block may be reported once per
    /// node it is stored at, so callers de-duplicate.
    fn overlapping(&self, s: usize, e: usize, out: &mut Vec<u32>) {
        let mut stack = vec![(1usize, 0usize, self.width)];
        while let Some((node, lo, hi)) = stack.pop() {
            if e <= lo || hi <= s || self.count[node] == 0 {
                continue;
            }
            out.extend_from_slice(&self.stored[node]);
            if hi - lo > 1 {
                let mid = (lo + hi) / 2;
                stack.push((2 * node, lo, mid));
                stack.push((2 * node + 1, mid, hi));
            }
        }
    }
}

/// The order blocks are placed in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Order {
    /// Largest first; among equals the longer-lived, then the earlier (XLA's spatial order).
    Spatial,
    /// Longest-lived first; among equals the larger, then the earlier.
    Temporal,
    /// As the blocks were allocated.
    Arrival,
}

/// The offline packing of `trace`: (height, offsets by block in [`Trace::lifetimes`] order),
/// the lowest of the three orders.
pub(crate) fn pack(trace: &Trace) -> (u64, Vec<u64>) {
    [Order::Spatial, Order::Temporal, Order::Arrival]
        .into_iter()
        .map(|order| pack_in(trace, order))
        .min_by_key(|(height, _)| *height)
        .unwrap_or_default()
}

/// Packs `trace`'s blocks one by one in `order`, each at the best-fitting gap among the placed
/// blocks whose lifetimes overlap its own.
pub(crate) fn pack_in(trace: &Trace, order: Order) -> (u64, Vec<u64>) {
    use std::cmp::Reverse;
    let blocks = trace.lifetimes();
    let mut sequence: Vec<u32> = (0..blocks.len() as u32).collect();
    match order {
        Order::Spatial => sequence.sort_by_key(|&b| {
            let (size, start, end) = blocks[b as usize];
            (Reverse(size), Reverse(end - start), start)
        }),
        Order::Temporal => sequence.sort_by_key(|&b| {
            let (size, start, end) = blocks[b as usize];
            (Reverse(end - start), Reverse(size), start)
        }),
        Order::Arrival => {}
    }
    let order = sequence;
    let mut index = IntervalIndex::new(trace.len());
    let mut offsets = vec![0u64; blocks.len()];
    let mut height = 0u64;
    let mut near: Vec<u32> = Vec::new();
    let mut placed: Vec<(u64, u64)> = Vec::new();
    for &b in &order {
        let (size, start, end) = blocks[b as usize];
        let (start, end) = (start as usize, end as usize);
        near.clear();
        index.overlapping(start, end, &mut near);
        placed.clear();
        placed.extend(near.iter().map(|&o| {
            let offset = offsets[o as usize];
            (offset, offset + blocks[o as usize].0)
        }));
        placed.sort_unstable();
        placed.dedup();
        // Best fit among the gaps between the overlapping blocks; above them all if none fits.
        let mut best: Option<(u64, u64)> = None; // (gap size, offset)
        let mut at = 0u64;
        for &(lo, hi) in &placed {
            if lo > at {
                let gap = lo - at;
                if gap >= size && best.is_none_or(|(g, _)| gap < g) {
                    best = Some((gap, at));
                }
            }
            at = at.max(hi);
        }
        let offset = best.map_or(at, |(_, offset)| offset);
        offsets[b as usize] = offset;
        height = height.max(offset.saturating_add(size));
        index.insert(b, start, end);
    }
    (height, offsets)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::SimOp;

    /// No two blocks whose lifetimes overlap may overlap in memory.
    fn assert_valid(trace: &Trace, offsets: &[u64], height: u64) {
        let blocks = trace.lifetimes();
        for (i, a) in blocks.iter().enumerate() {
            assert!(offsets[i] + a.0 <= height);
            for (j, b) in blocks.iter().enumerate().skip(i + 1) {
                let in_time = a.1 < b.2 && b.1 < a.2;
                let in_space = offsets[i] < offsets[j] + b.0 && offsets[j] < offsets[i] + a.0;
                assert!(!(in_time && in_space), "blocks {i} and {j} collide");
            }
        }
    }

    #[test]
    fn packs_a_hand_worked_sequence_with_blocks_sharing_offsets() {
        // A(100) and B(50) live together; A dies; C(100) and D(60) live together after.
        // The 100-byte blocks share offset 0 and the 50/60-byte blocks sit above: 160.
        let ops = [
            SimOp::alloc(0, 1, 100),
            SimOp::alloc(1, 2, 50),
            SimOp::free(2, 1),
            SimOp::alloc(3, 3, 100),
            SimOp::free(4, 2),
            SimOp::alloc(5, 4, 60),
        ];
        let trace = Trace::new(&ops);
        let (height, offsets) = pack_in(&trace, Order::Spatial);
        assert_eq!(height, 160);
        assert_eq!(offsets, [0, 100, 0, 100]);
        assert_eq!(pack(&trace).0, 160);
        assert_valid(&trace, &offsets, height);
        assert_eq!(trace.lower_bound(), 160);
    }

    #[test]
    fn best_fit_picks_the_smallest_gap_that_holds_the_block() {
        // Long-lived 100, 30, 100 blocks leave gaps once the 30-byte short blocks go.
        let ops = [
            SimOp::alloc(0, 1, 1000), // lives throughout
            SimOp::alloc(1, 2, 40),
            SimOp::alloc(2, 3, 20),
            SimOp::free(3, 2),
            SimOp::free(4, 3),
            SimOp::alloc(5, 4, 20),
        ];
        let trace = Trace::new(&ops);
        let (height, offsets) = pack_in(&trace, Order::Spatial);
        assert_valid(&trace, &offsets, height);
        // 1000 at 0, 40 at 1000, 20 (overlapping the 40) at 1040, and the late 20 overlaps only
        // the 1000: it takes the lowest gap above it, offset 1000.
        assert_eq!(offsets, [0, 1000, 1040, 1000]);
        assert_eq!(height, 1060);
    }

    #[test]
    fn random_packings_are_valid_and_never_below_the_lower_bound() {
        let mut state = 7u64;
        let mut next = move || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state
        };
        for _ in 0..20 {
            let mut ops = Vec::new();
            let mut live: Vec<u64> = Vec::new();
            for id in 0..200u64 {
                if next() % 3 == 0 && !live.is_empty() {
                    let gone = live.swap_remove((next() % live.len() as u64) as usize);
                    ops.push(SimOp::free(id, gone));
                }
                ops.push(SimOp::alloc(id, id, 1 + next() % 5000));
                live.push(id);
            }
            let trace = Trace::new(&ops);
            for order in [Order::Spatial, Order::Temporal, Order::Arrival] {
                let (height, offsets) = pack_in(&trace, order);
                assert_valid(&trace, &offsets, height);
                assert!(height >= trace.lower_bound());
                assert!(pack(&trace).0 <= height);
            }
        }
    }
}
