//! Span instances, the span tree and their memory metrics.
//!
//! # Instances and nodes
//!
//! A span *instance* is one call: it opens with `SpanEnter` and closes with `SpanExit`, keyed by
//! (thread, id). A *node* of the span tree is every instance with the same path: (parent node,
//! name, label). Metrics are kept per node; roll-ups from children to parents happen once, at
//! the end, over the nodes (children always have higher node ids than their parents, so one
//! reverse pass suffices).
//!
//! # Bounded whatever the nesting
//!
//! Nodes nest at most [`MAX_SPAN_DEPTH`] deep: a span deeper than that (10,000 nested spans, a
//! guard leaked with `mem::forget` in a loop) is counted in one [`FOLDED_SPAN`] node under the
//! deepest kept one, and everything below it too. Past [`MAX_SPAN_NODES`] distinct nodes, new
//! ones are counted in one top-level [`FOLDED_SPAN`] node. Both are counted
//! ([`Spans::folded_deep`], [`Spans::folded_nodes`]) so the profile can say so.
//!
//! # Residual bytes without walking ancestors
//!
//! Each live block remembers the instance it was allocated in (its *owner*). An instance keeps a
//! `net`: bytes allocated inside it, children included, still live. An allocation adds to its
//! owner's net; when a child closes, its net is added to its nearest open ancestor's, and the
//! child from then on *forwards* there: a block whose owner is closed is subtracted from the
//! nearest open ancestor of its owner. The forwarding pointer is shortened the first time it is
//! followed (path compression), so frees of many blocks of one closed instance stay O(1) each.
//! At exit an instance's net is exactly its residual. Closed instances are kept only while a
//! live block or a child still refers to them (reference counts), so memory stays
//! O(live blocks + open spans).
//!
//! # Peak inside a span without touching open spans
//!
//! The measure is the highest live bytes of any one device. [`PeakStack`] keeps the suffix
//! maxima of that measure since the oldest open span entered, as `(event seq, value)` pairs with
//! increasing seq and strictly decreasing value. The highest value since seq `s` is the value of
//! the first pair at or after `s`: a binary search at exit. Pushing pops every smaller or equal
//! value first (O(1) amortised); pairs older than the oldest open span are pruned.

use std::cmp::Reverse;
use std::collections::VecDeque;

use rustc_hash::FxHashMap;

use crate::model::SpanLabel;
pub(crate) use crate::profile::{MAX_SPAN_DEPTH, MAX_SPAN_NODES};

use super::event::{NameId, SpanSeq};
use super::live::NONE;

/// The name of a node that stands for folded spans (never a real interned id).
pub(crate) const FOLDED_SPAN: NameId = NameId(u32::MAX - 1);

/// One node of the span tree and its per-node figures (not yet rolled up).
#[derive(Debug, Clone)]
pub(crate) struct Node {
    /// Parent node, [`NONE`] for top-level spans.
    pub(crate) parent: u32,
    /// Distance from the top (0 for a top-level span), at most [`MAX_SPAN_DEPTH`].
    pub(crate) depth: u32,
    pub(crate) name: NameId,
    pub(crate) label: SpanLabel,
    pub(crate) calls: u64,
    /// Time inside closed instances, ns.
    pub(crate) total_ns: u64,
    /// Bytes allocated directly in instances of this node (children not included).
    pub(crate) own_bytes: u64,
    /// Allocations made directly in instances of this node.
    pub(crate) own_allocs: u64,
    /// Highest measure while a closed instance was open.
    pub(crate) peak: u64,
    /// Residual of closed instances, summed.
    pub(crate) residual: u64,
}

/// One call of a span.
#[derive(Debug, Clone)]
struct Instance {
    node: u32,
    /// The enclosing instance while open; after close, where frees forward to.
    parent: u32,
    enter_seq: u64,
    enter_ts: u64,
    open: bool,
    /// Bytes allocated inside (children included once they close) still live.
    net: i64,
    /// Live blocks owned, children pointing here, and one for being open.
    refs: u32,
}

/// What a `SpanEnter` event says, with where it sits in the stream.
#[derive(Debug, Clone, Copy)]
pub(crate) struct SpanStart {
    pub(crate) thread: u32,
    /// The enclosing instance on the same thread (`0`: none).
    pub(crate) parent_id: SpanSeq,
    pub(crate) id: SpanSeq,
    pub(crate) name: NameId,
    pub(crate) label: SpanLabel,
    pub(crate) ts: u64,
    /// Sequence number of the event.
    pub(crate) seq: u64,
}

/// What closing an instance reports back to the timeline.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Closed {
    pub(crate) node: u32,
    /// When the instance was entered.
    pub(crate) enter_ts: u64,
}

/// Suffix maxima of the peak measure, kept only where an open span needs them.
///
/// Pairs are `(event seq, value, anchors)` with increasing seq and strictly decreasing value.
/// An open span's *answer* is the first pair at or after its enter seq; `anchors` counts the
/// open spans whose answer a pair is. A pair no open span answers with can never become an
/// answer later (a bigger later value pops it together with everything after it), so pushes
/// drop trailing unanchored pairs, and the stack holds little more than one pair per open span.
#[derive(Debug, Default)]
pub(crate) struct PeakStack {
    pairs: VecDeque<(u64, u64, u32)>,
}

impl PeakStack {
    /// The measure became `value` at event `seq` (seqs never decrease); `anchor` when a span
    /// entered at this event.
    pub(crate) fn record(&mut self, seq: u64, value: u64, anchor: bool) {
        let mut anchors = u32::from(anchor);
        while let Some(&(_, v, a)) = self.pairs.back() {
            if v <= value {
                anchors = anchors.saturating_add(a);
            } else if a != 0 {
                break;
            }
            self.pairs.pop_back();
        }
        self.pairs.push_back((seq, value, anchors));
    }

    fn answer(&self, seq: u64) -> usize {
        self.pairs.partition_point(|&(s, _, _)| s < seq)
    }

    /// Highest value recorded at or after `seq`, and at least `current`.
    pub(crate) fn max_since(&self, seq: u64, current: u64) -> u64 {
        self.pairs
            .get(self.answer(seq))
            .map_or(current, |&(_, v, _)| v.max(current))
    }

    /// The span that entered at `seq` closed: its answer loses an anchor.
    fn release(&mut self, seq: u64) {
        let at = self.answer(seq);
        if let Some(pair) = self.pairs.get_mut(at) {
            pair.2 = pair.2.saturating_sub(1);
        }
        while self.pairs.front().is_some_and(|&(_, _, a)| a == 0) {
            self.pairs.pop_front();
        }
    }

    fn clear(&mut self) {
        self.pairs.clear();
    }

    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.pairs.len()
    }
}

/// Every span instance and node of a timeline.
#[derive(Debug, Default)]
pub(crate) struct Spans {
    pub(crate) nodes: Vec<Node>,
    node_ids: FxHashMap<(u32, NameId, SpanLabel), u32>,
    instances: Vec<Instance>,
    free_slots: Vec<u32>,
    /// Open instances by (thread, id).
    open: FxHashMap<(u32, SpanSeq), u32>,
    pub(crate) peaks: PeakStack,
    /// Span instances counted in a [`FOLDED_SPAN`] node because they nested too deep.
    pub(crate) folded_deep: u64,
    /// Span instances counted in the top-level [`FOLDED_SPAN`] node because the tree was full.
    pub(crate) folded_nodes: u64,
    /// The top-level node for spans past [`MAX_SPAN_NODES`], once needed.
    overflow: Option<u32>,
}

impl Spans {
    /// Whether any span is open (the peak measure needs recording only then).
    pub(crate) fn any_open(&self) -> bool {
        !self.open.is_empty()
    }

    /// The measure changed to `value` at event `seq`.
    #[inline]
    pub(crate) fn record_measure(&mut self, seq: u64, value: u64) {
        if self.any_open() {
            self.peaks.record(seq, value, false);
        }
    }

    /// The open instance `id` on `thread`, if any.
    pub(crate) fn lookup(&self, thread: u32, id: SpanSeq) -> Option<u32> {
        if id == 0 {
            return None;
        }
        self.open.get(&(thread, id)).copied()
    }

    /// When `instance` entered (its event seq), if it is open now. The seq tells a reopened
    /// slot from the instance that held it before.
    pub(crate) fn open_since(&self, instance: u32) -> Option<u64> {
        self.instances
            .get(instance as usize)
            .filter(|inst| inst.open)
            .map(|inst| inst.enter_seq)
    }

    /// Node of an instance.
    pub(crate) fn node_of(&self, instance: u32) -> u32 {
        self.instances
            .get(instance as usize)
            .map_or(NONE, |inst| inst.node)
    }

    fn node_for(&mut self, parent: u32, name: NameId, label: SpanLabel) -> u32 {
        let parent_node = self.nodes.get(parent as usize);
        if parent_node.is_some_and(|p| p.name == FOLDED_SPAN) {
            // Everything below a folded node is counted in it.
            self.folded_deep += 1;
            return parent;
        }
        let depth = parent_node.map_or(0, |p| p.depth + 1);
        let (name, label) = if depth >= MAX_SPAN_DEPTH {
            self.folded_deep += 1;
            (FOLDED_SPAN, SpanLabel::Plain)
        } else {
            (name, label)
        };
        if let Some(&node) = self.node_ids.get(&(parent, name, label)) {
            return node;
        }
        if self.nodes.len() >= MAX_SPAN_NODES {
            self.folded_nodes += 1;
            return match self.overflow {
                Some(node) => node,
                None => {
                    let node = self.push_node(NONE, 0, FOLDED_SPAN, SpanLabel::Plain);
                    self.overflow = Some(node);
                    node
                }
            };
        }
        let node = self.push_node(parent, depth, name, label);
        self.node_ids.insert((parent, name, label), node);
        node
    }

    fn push_node(&mut self, parent: u32, depth: u32, name: NameId, label: SpanLabel) -> u32 {
        let node = u32::try_from(self.nodes.len()).unwrap_or(NONE);
        self.nodes.push(Node {
            parent,
            depth,
            name,
            label,
            calls: 0,
            total_ns: 0,
            own_bytes: 0,
            own_allocs: 0,
            peak: 0,
            residual: 0,
        });
        node
    }

    /// Opens an instance under the instance the event names as its parent, with the measure
    /// at that moment. Reopening an id that is still open closes the old instance first.
    pub(crate) fn enter(&mut self, start: SpanStart, measure: u64) -> Option<Closed> {
        let SpanStart {
            thread,
            parent_id,
            id,
            name,
            label,
            ts,
            seq,
        } = start;
        let reopened = self.exit(thread, id, ts, measure);
        let parent = self.lookup(thread, parent_id).unwrap_or(NONE);
        let parent_node = self.node_of(parent);
        let node = self.node_for(parent_node, name, label);
        if let Some(n) = self.nodes.get_mut(node as usize) {
            n.calls += 1;
        }
        if parent != NONE {
            self.instances[parent as usize].refs += 1;
        }
        let instance = Instance {
            node,
            parent,
            enter_seq: seq,
            enter_ts: ts,
            open: true,
            net: 0,
            refs: 1,
        };
        let index = match self.free_slots.pop() {
            Some(slot) => {
                self.instances[slot as usize] = instance;
                slot
            }
            None => {
                self.instances.push(instance);
                u32::try_from(self.instances.len() - 1).unwrap_or(NONE)
            }
        };
        self.open.insert((thread, id), index);
        self.peaks.record(seq, measure, true);
        reopened
    }

    /// Closes the open instance `id` on `thread` at `ts`; `None` when no such instance is open.
    pub(crate) fn exit(
        &mut self,
        thread: u32,
        id: SpanSeq,
        ts: u64,
        measure: u64,
    ) -> Option<Closed> {
        let index = self.open.remove(&(thread, id))?;
        let inst = &mut self.instances[index as usize];
        inst.open = false;
        let (node, enter_seq, enter_ts, net, parent) = (
            inst.node,
            inst.enter_seq,
            inst.enter_ts,
            inst.net,
            inst.parent,
        );
        let peak = self.peaks.max_since(enter_seq, measure);
        if let Some(n) = self.nodes.get_mut(node as usize) {
            n.total_ns = n.total_ns.saturating_add(ts.saturating_sub(enter_ts));
            n.peak = n.peak.max(peak);
            n.residual = n.residual.saturating_add(u64::try_from(net).unwrap_or(0));
        }
        let target = self.nearest_open(parent);
        if target != NONE {
            let t = &mut self.instances[target as usize];
            t.net = t.net.saturating_add(net);
        }
        self.repoint(index, target);
        self.release(index);
        self.forget_enter(enter_seq);
        Some(Closed { node, enter_ts })
    }

    fn forget_enter(&mut self, enter_seq: u64) {
        if self.open.is_empty() {
            self.peaks.clear();
        } else {
            self.peaks.release(enter_seq);
        }
    }

    /// `start` if open, else its nearest open ancestor; [`NONE`] when there is none.
    fn nearest_open(&self, start: u32) -> u32 {
        let mut at = start;
        // Parents are older than their children and outlive them, so chains are acyclic; the
        // bound only guards against a bookkeeping bug turning into a hang.
        for _ in 0..=self.instances.len() {
            match self.instances.get(at as usize) {
                Some(inst) if inst.open => return at,
                Some(inst) => at = inst.parent,
                None => return NONE,
            }
        }
        NONE
    }

    /// Points the closed instance `index` straight at `target`, moving the reference.
    fn repoint(&mut self, index: u32, target: u32) {
        let old = self.instances[index as usize].parent;
        if old == target {
            return;
        }
        if target != NONE {
            self.instances[target as usize].refs += 1;
        }
        self.instances[index as usize].parent = target;
        if old != NONE {
            self.release(old);
        }
    }

    /// Drops one reference to `index`, freeing it (and, in turn, its parent's reference) when
    /// none is left.
    fn release(&mut self, index: u32) {
        let mut at = index;
        while let Some(inst) = self.instances.get_mut(at as usize) {
            inst.refs = inst.refs.saturating_sub(1);
            if inst.refs > 0 {
                return;
            }
            let parent = inst.parent;
            self.free_slots.push(at);
            at = parent;
        }
    }

    /// A block of `size` bytes became live, owned by `owner` (an open instance or [`NONE`]).
    /// `counted` is what the node's bytes-allocated grows by (a realloc's growth).
    pub(crate) fn on_alloc(&mut self, owner: u32, size: u64, counted: u64, is_alloc: bool) {
        let Some(inst) = self.instances.get_mut(owner as usize) else {
            return;
        };
        inst.refs += 1;
        inst.net = inst
            .net
            .saturating_add(i64::try_from(size).unwrap_or(i64::MAX));
        let node = inst.node;
        if let Some(n) = self.nodes.get_mut(node as usize) {
            n.own_bytes = n.own_bytes.saturating_add(counted);
            n.own_allocs += u64::from(is_alloc);
        }
    }

    /// A block of `size` bytes owned by `owner` stopped being live.
    #[inline]
    pub(crate) fn on_end(&mut self, owner: u32, size: u64) {
        // Most blocks of most streams belong to no span: no call for them.
        if owner != NONE {
            self.end_owned(owner, size);
        }
    }

    fn end_owned(&mut self, owner: u32, size: u64) {
        if self.instances.get(owner as usize).is_none() {
            return;
        }
        let target = self.nearest_open(owner);
        if target != NONE {
            let t = &mut self.instances[target as usize];
            t.net = t
                .net
                .saturating_sub(i64::try_from(size).unwrap_or(i64::MAX));
        }
        if target != owner {
            // Shorten the forwarding chain for the owner's other blocks.
            self.repoint(owner, target);
        }
        self.release(owner);
    }

    /// Open instances as `(node, enter_ts, peak so far, residual if closed now)`, closing
    /// innermost first as [`Spans::exit`] would (children forward their net to the parent).
    pub(crate) fn open_at_end(&self, measure: u64) -> Vec<(u32, u64, u64, u64)> {
        let mut open: Vec<u32> = self.open.values().copied().collect();
        open.sort_unstable_by_key(|&i| Reverse(self.instances[i as usize].enter_seq));
        let mut extra: FxHashMap<u32, i64> = FxHashMap::default();
        let mut out = Vec::with_capacity(open.len());
        for index in open {
            let inst = &self.instances[index as usize];
            let net = inst
                .net
                .saturating_add(extra.get(&index).copied().unwrap_or(0));
            let peak = self.peaks.max_since(inst.enter_seq, measure);
            out.push((
                inst.node,
                inst.enter_ts,
                peak,
                u64::try_from(net).unwrap_or(0),
            ));
            let target = self.nearest_open(inst.parent);
            if target != NONE {
                let slot = extra.entry(target).or_insert(0);
                *slot = slot.saturating_add(net);
            }
        }
        out
    }

    /// Instance records currently allocated (open, or closed but still referred to).
    #[cfg(test)]
    pub(crate) fn instances_in_use(&self) -> usize {
        self.instances.len() - self.free_slots.len()
    }
}

#[cfg(test)]
mod bound_tests {
    use super::*;

    fn start(id: u32, parent: u32, name: u32, seq: u64) -> SpanStart {
        SpanStart {
            thread: 0,
            parent_id: parent,
            id,
            name: NameId(name),
            label: SpanLabel::Plain,
            ts: seq,
            seq,
        }
    }

    #[test]
    fn ten_thousand_nested_spans_keep_a_bounded_tree() {
        let mut spans = Spans::default();
        for id in 1..=10_000u32 {
            spans.enter(start(id, id - 1, 7, u64::from(id)), 0);
        }
        assert_eq!(spans.nodes.len(), MAX_SPAN_DEPTH as usize + 1);
        assert!(spans.nodes.iter().all(|n| n.depth <= MAX_SPAN_DEPTH));
        let folded = spans.nodes.last().unwrap();
        assert_eq!(folded.name, FOLDED_SPAN);
        assert_eq!(spans.folded_deep, 10_000 - u64::from(MAX_SPAN_DEPTH));
        for id in (1..=10_000u32).rev() {
            spans.exit(0, id, 20_000, 0);
        }
        assert!(!spans.any_open());
    }

    #[test]
    fn distinct_nodes_past_the_cap_fold_into_one() {
        let mut spans = Spans::default();
        let total = MAX_SPAN_NODES as u32 + 50;
        for id in 1..=total {
            spans.enter(start(id, 0, id, u64::from(id)), 0);
            spans.exit(0, id, u64::from(id), 0);
        }
        assert_eq!(spans.nodes.len(), MAX_SPAN_NODES + 1);
        assert_eq!(spans.folded_nodes, 50);
        assert_eq!(spans.nodes[MAX_SPAN_NODES].name, FOLDED_SPAN);
        assert_eq!(spans.nodes[MAX_SPAN_NODES].calls, 50);
    }
}
