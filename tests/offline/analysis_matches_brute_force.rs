//! A brute-force model of the analysis, and property tests that hold [`Timeline`] to it.
//!
//! The model does everything the slow, obvious way: a vector of live blocks scanned linearly, a
//! full copy of the live set at every new peak, every open span updated after every event, and
//! ancestors walked for every allocation and at every exit. It is a test of the crate from
//! outside: it sees only the public event and profile types, so it cannot share code with the
//! streaming analysis.

use std::collections::BTreeMap;

use proptest::prelude::*;

use highwater::profile::analysis::{DeviceId, Event, EventKind, NameId, ShapeId, SpanSeq};
use highwater::profile::analysis::{Timeline, TimelineConfig};
use highwater::{Category, Profile, SpanLabel, Step};

#[derive(Debug, Clone)]
struct Block {
    device: u16,
    addr: u64,
    size: u64,
    ts: u64,
    category: Category,
    /// Instance it was allocated in (index into `Model::instances`).
    instance: Option<usize>,
    op: Option<u32>,
    /// The allocation it is: a realloc's block continues the one it resized.
    lineage: usize,
    /// The thread whose realloc released it: it is off its address until the realloc ends it.
    released_by: Option<u32>,
}

/// What a realloc's release found at the old address.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Release {
    /// The block, now released.
    Moved,
    /// A block allocated after the release.
    Straggler,
    /// Nothing.
    Unknown,
}

#[derive(Debug, Clone)]
struct Instance {
    thread: u32,
    id: SpanSeq,
    parent: Option<usize>,
    chain: Vec<(u32, u8)>,
    open: bool,
    enter_ts: u64,
    max_measure: u64,
    /// The event that closed it (`None`: still open when the stream ended).
    closed_at: Option<u64>,
}

/// Figures of one span node, keyed by its chain of (name, packed label) from the top.
#[derive(Debug, Clone, Default, PartialEq)]
struct NodeFigures {
    calls: u64,
    total_ns: u64,
    bytes_allocated: u64,
    alloc_count: u64,
    peak_bytes: u64,
    residual_bytes: u64,
}

/// A span node as the profile shows it: (name, step, category) from the top.
type NamedChain = Vec<(String, Option<Step>, Option<Category>)>;

/// The naive replay.
#[derive(Debug, Default)]
struct Model {
    names: Vec<String>,
    devices: Vec<String>,
    live: Vec<Block>,
    instances: Vec<Instance>,
    ops: BTreeMap<u32, Vec<u32>>,
    device_live: BTreeMap<u16, u64>,
    device_peak: BTreeMap<u16, (u64, u64)>,
    peak: (u64, u64, Option<u16>),
    peak_snapshot: Vec<Block>,
    nodes: BTreeMap<Vec<(u32, u8)>, NodeFigures>,
    counts: [u64; 6],
    autograd: Option<u64>,
    top_exits: BTreeMap<u32, Vec<(u64, u64)>>,
    events: u64,
    lineages: usize,
    /// The event that ended each allocation for good (a free, or an alloc over its key).
    lineage_end: BTreeMap<usize, u64>,
    /// Reallocs released and not completed, by thread: the old address and what was found.
    releases: BTreeMap<u32, (u64, Release)>,
}

impl Model {
    fn new(names: &[&str], devices: &[&str]) -> Model {
        Model {
            names: names.iter().map(|s| s.to_string()).collect(),
            devices: devices.iter().map(|s| s.to_string()).collect(),
            ..Model::default()
        }
    }

    fn find(&self, device: u16, addr: u64) -> Option<usize> {
        self.live
            .iter()
            .position(|b| b.device == device && b.addr == addr && b.released_by.is_none())
    }

    /// The block `thread`'s realloc released.
    fn released(&self, thread: u32) -> Option<usize> {
        self.live.iter().position(|b| b.released_by == Some(thread))
    }

    /// The first half of `thread`'s realloc: the block at `old_addr` gives its address up.
    fn release(&mut self, thread: u32, old_addr: u64, ts: u64) {
        self.settle(thread);
        let found = match self.find(0, old_addr) {
            None => Release::Unknown,
            Some(i) if ts < self.live[i].ts => Release::Straggler,
            Some(i) => {
                self.live[i].released_by = Some(thread);
                Release::Moved
            }
        };
        self.releases.insert(thread, (old_addr, found));
    }

    /// A release whose realloc never came: its block ends, uncounted.
    fn settle(&mut self, thread: u32) {
        self.releases.remove(&thread);
        if let Some(i) = self.released(thread) {
            self.free_block(i);
        }
    }

    fn open_instance(&self, thread: u32, id: SpanSeq) -> Option<usize> {
        if id == 0 {
            return None;
        }
        self.instances
            .iter()
            .position(|i| i.open && i.thread == thread && i.id == id)
    }

    fn ancestors(&self, start: Option<usize>) -> Vec<usize> {
        let mut out = Vec::new();
        let mut at = start;
        while let Some(i) = at {
            out.push(i);
            at = self.instances[i].parent;
        }
        out
    }

    fn measure(&self) -> u64 {
        self.device_live.values().copied().max().unwrap_or(0)
    }

    fn end_block(&mut self, index: usize) -> Block {
        let block = self.live.remove(index);
        let live = self.device_live.entry(block.device).or_default();
        *live -= block.size;
        block
    }

    /// The allocation at `index` ends for good now.
    fn free_block(&mut self, index: usize) {
        let block = self.end_block(index);
        self.lineage_end.insert(block.lineage, self.events);
    }

    #[allow(clippy::too_many_arguments)]
    fn add_block(
        &mut self,
        event: &Event,
        device: u16,
        addr: u64,
        size: u64,
        counted: u64,
        category: Category,
        lineage: Option<usize>,
    ) {
        let is_alloc = lineage.is_none();
        if let Some(index) = self.find(device, addr) {
            self.counts[5] += 1;
            self.free_block(index);
        }
        let lineage = lineage.unwrap_or_else(|| {
            self.lineages += 1;
            self.lineages
        });
        let instance = self.open_instance(event.thread, event.span);
        for i in self.ancestors(instance) {
            let chain = self.instances[i].chain.clone();
            let node = self.nodes.entry(chain).or_default();
            node.bytes_allocated += counted;
            node.alloc_count += u64::from(is_alloc);
        }
        let op = self.ops.get(&event.thread).and_then(|s| s.last().copied());
        self.live.push(Block {
            device,
            addr,
            size,
            ts: event.ts_ns,
            category,
            instance,
            op,
            lineage,
            released_by: None,
        });
        *self.device_live.entry(device).or_default() += size;
    }

    fn close(&mut self, index: usize, ts: u64) {
        let residual: u64 = self
            .live
            .iter()
            .filter(|b| self.ancestors(b.instance).contains(&index))
            .map(|b| b.size)
            .sum();
        let inst = &mut self.instances[index];
        inst.open = false;
        let chain = inst.chain.clone();
        let (enter_ts, max_measure, top) = (inst.enter_ts, inst.max_measure, inst.parent.is_none());
        let node = self.nodes.entry(chain.clone()).or_default();
        node.total_ns += ts.saturating_sub(enter_ts);
        node.peak_bytes = node.peak_bytes.max(max_measure);
        node.residual_bytes += residual;
        if top {
            let live: u64 = self.device_live.values().sum();
            self.top_exits
                .entry(chain[0].0)
                .or_default()
                .push((ts, live));
        }
    }

    fn apply(&mut self, event: &Event) {
        let ts = event.ts_ns;
        if let EventKind::ReallocRelease { old_addr, .. } = event.kind {
            // Half of the realloc after it; it changes no byte figure.
            self.release(event.thread, old_addr, ts);
            return;
        }
        self.events += 1;
        match event.kind {
            EventKind::Alloc {
                device,
                addr,
                size,
                category,
            } => {
                self.counts[0] += 1;
                self.counts[3] += size;
                self.add_block(event, device.0, addr, size, size, category, None);
            }
            EventKind::Free { device, addr, .. } => match self.find(device.0, addr) {
                None => self.counts[4] += 1,
                Some(i) if ts < self.live[i].ts => self.counts[5] += 1,
                Some(i) => {
                    self.counts[1] += 1;
                    self.free_block(i);
                }
            },
            EventKind::Realloc {
                old_addr,
                new_addr,
                new_size,
                category,
                released_ns,
                ..
            } => {
                self.counts[2] += 1;
                let released = released_ns.map_or(ts, |at| at.min(ts));
                let found = match self.releases.get(&event.thread) {
                    Some(&(addr, found)) if addr == old_addr => {
                        self.releases.remove(&event.thread);
                        match found {
                            Release::Moved => self.released(event.thread).map(Ok),
                            Release::Straggler => Some(Err(())),
                            Release::Unknown => None,
                        }
                    }
                    other => {
                        if other.is_some() {
                            self.settle(event.thread);
                        }
                        match self.find(0, old_addr) {
                            Some(i) if released < self.live[i].ts => Some(Err(())),
                            found => found.map(Ok),
                        }
                    }
                };
                // A resize continues the allocation; a new lineage when nothing was resized.
                let (growth, lineage) = match found {
                    None => {
                        self.counts[4] += 1;
                        (new_size, 0)
                    }
                    Some(Err(())) => {
                        self.counts[5] += 1;
                        (new_size, 0)
                    }
                    Some(Ok(i)) => {
                        let old = self.end_block(i);
                        (new_size.saturating_sub(old.size), old.lineage)
                    }
                };
                let lineage = if lineage == 0 {
                    self.lineages += 1;
                    self.lineages
                } else {
                    lineage
                };
                self.counts[3] += growth;
                self.add_block(
                    event,
                    0,
                    new_addr,
                    new_size,
                    growth,
                    category,
                    Some(lineage),
                );
            }
            EventKind::SetCategory {
                device,
                addr,
                category,
            } => {
                if let Some(i) = self.find(device.0, addr) {
                    self.live[i].category = category;
                }
            }
            EventKind::SpanEnter { id, name, label } => {
                if label == SpanLabel::Step(Step::Backward) && self.autograd.is_none() {
                    self.autograd = Some(
                        self.live
                            .iter()
                            .filter(|b| b.category == Category::Activation)
                            .map(|b| b.size)
                            .sum(),
                    );
                }
                if let Some(old) = self.open_instance(event.thread, id) {
                    self.close(old, ts);
                    self.instances[old].closed_at = Some(self.events);
                }
                let parent = self.open_instance(event.thread, event.span);
                let mut chain = parent.map_or(Vec::new(), |p| self.instances[p].chain.clone());
                chain.push((name.0, label_key(label)));
                self.nodes.entry(chain.clone()).or_default().calls += 1;
                let measure = self.measure();
                self.instances.push(Instance {
                    thread: event.thread,
                    id,
                    parent,
                    chain,
                    open: true,
                    enter_ts: ts,
                    max_measure: measure,
                    closed_at: None,
                });
            }
            EventKind::SpanExit { id } => {
                if let Some(i) = self.open_instance(event.thread, id) {
                    self.close(i, ts);
                    self.instances[i].closed_at = Some(self.events);
                }
            }
            EventKind::OpBegin { name, .. } => {
                self.ops.entry(event.thread).or_default().push(name.0)
            }
            EventKind::OpEnd => {
                if let Some(stack) = self.ops.get_mut(&event.thread) {
                    stack.pop();
                }
            }
            EventKind::Annotate {
                device, addr, op, ..
            } => {
                if let Some(block) = self
                    .live
                    .iter_mut()
                    .find(|b| b.device == device.0 && b.addr == addr && b.released_by.is_none())
                {
                    block.op = Some(op.0);
                }
            }
            EventKind::PoolState { .. }
            | EventKind::Sampled { .. }
            | EventKind::ReallocRelease { .. } => {}
            // A refusal changes no byte figure, nor does what a driver's pool holds or what a
            // device held before recording; their own figures are unit-tested in the timeline.
            EventKind::Oom { .. } | EventKind::Reserved { .. } | EventKind::DeviceMemory { .. } => {
            }
        }
        // Peaks and the span measure, after the event.
        for (&device, &live) in &self.device_live {
            let peak = self.device_peak.entry(device).or_default();
            if live > peak.0 {
                *peak = (live, ts);
            }
            if live > self.peak.0 {
                self.peak = (live, ts, Some(device));
                self.peak_snapshot = self.live.clone();
            }
        }
        let measure = self.measure();
        for inst in self.instances.iter_mut().filter(|i| i.open) {
            inst.max_measure = inst.max_measure.max(measure);
        }
    }

    /// Closes open spans innermost first, as the timeline's `finish` reports them.
    fn finish(&mut self, end_ns: u64) {
        let mut open: Vec<usize> = (0..self.instances.len())
            .filter(|&i| self.instances[i].open)
            .collect();
        open.reverse();
        for i in open {
            // Not an iteration: only spans that exit mark iterations.
            let top = self.instances[i].parent.is_none();
            let saved = self.top_exits.clone();
            self.close(i, end_ns);
            if top {
                self.top_exits = saved;
            }
        }
    }

    fn path(&self, chain: &[(u32, u8)]) -> String {
        chain
            .iter()
            .map(|(n, _)| self.names[*n as usize].as_str())
            .collect::<Vec<_>>()
            .join("/")
    }

    /// Compares everything the model computes with `profile`; panics naming the difference.
    fn check(&self, profile: &Profile, top_allocations: usize) {
        let s = &profile.summary;
        assert_eq!(s.peak_bytes, self.peak.0, "peak bytes");
        assert_eq!(s.peak_timestamp_ns, self.peak.1, "peak ts");
        let device = self
            .peak
            .2
            .map(|d| self.devices[d as usize].clone())
            .unwrap_or_default();
        assert_eq!(s.peak_device, device, "peak device");
        let mut by_cat: BTreeMap<Category, u64> = BTreeMap::new();
        for b in self
            .peak_snapshot
            .iter()
            .filter(|b| Some(b.device) == self.peak.2)
        {
            *by_cat.entry(b.category).or_default() += b.size;
        }
        by_cat.retain(|_, v| *v > 0);
        assert_eq!(s.peak_by_category, by_cat, "peak by category");
        // Temporary: the allocation ended for good while the span that owned the block at the
        // peak was open (a span open at the end never closed).
        let mut temporary: BTreeMap<Category, u64> = BTreeMap::new();
        for b in self
            .peak_snapshot
            .iter()
            .filter(|b| Some(b.device) == self.peak.2)
        {
            let (Some(owner), Some(&ended)) = (b.instance, self.lineage_end.get(&b.lineage)) else {
                continue;
            };
            if self.instances[owner]
                .closed_at
                .is_none_or(|closed| closed > ended)
            {
                *temporary.entry(b.category).or_default() += b.size;
            }
        }
        temporary.retain(|_, v| *v > 0);
        assert_eq!(
            s.peak_temporary_by_category, temporary,
            "temporary at the peak by category"
        );
        let counts = [
            s.alloc_count,
            s.free_count,
            s.realloc_count,
            s.total_alloc_bytes,
            s.unknown_frees,
            s.reorder_repairs,
        ];
        assert_eq!(
            counts, self.counts,
            "alloc, free, realloc, bytes, unknown, repairs"
        );
        assert_eq!(
            s.final_live_bytes,
            self.device_live.values().sum::<u64>(),
            "final live"
        );
        assert_eq!(
            s.autograd_retained_bytes,
            self.autograd.unwrap_or(0),
            "autograd retained"
        );
        assert_eq!(s.event_count, self.events, "event count");

        // Live at peak, aggregated by category and by span path.
        let mut want_cat: BTreeMap<(String, Category), (u64, u64)> = BTreeMap::new();
        let mut want_path: BTreeMap<(String, Option<String>), (u64, u64)> = BTreeMap::new();
        for b in &self.peak_snapshot {
            let path = b
                .instance
                .map_or(String::new(), |i| self.path(&self.instances[i].chain));
            let op = b.op.map(|o| self.names[o as usize].clone());
            let dev = self.devices[b.device as usize].clone();
            let e = want_cat.entry((dev, b.category)).or_default();
            e.0 += b.size;
            e.1 += 1;
            let e = want_path.entry((path, op)).or_default();
            e.0 += b.size;
            e.1 += 1;
        }
        let mut got_cat: BTreeMap<(String, Category), (u64, u64)> = BTreeMap::new();
        let mut got_path: BTreeMap<(String, Option<String>), (u64, u64)> = BTreeMap::new();
        for row in &profile.peak_breakdown {
            let e = got_cat
                .entry((row.device.clone(), row.category))
                .or_default();
            e.0 += row.bytes;
            e.1 += row.count;
            let e = got_path
                .entry((row.span_path.clone(), row.op.clone()))
                .or_default();
            e.0 += row.bytes;
            e.1 += row.count;
        }
        assert_eq!(got_cat, want_cat, "live at peak by device and category");
        assert_eq!(got_path, want_path, "live at peak by span path and op");
        let mut sizes: Vec<u64> = self.peak_snapshot.iter().map(|b| b.size).collect();
        sizes.sort_unstable_by(|a, b| b.cmp(a));
        sizes.truncate(top_allocations);
        let got: Vec<u64> = profile.largest_at_peak.iter().map(|a| a.bytes).collect();
        assert_eq!(got, sizes, "largest at peak");

        // Per-device peaks.
        for d in &profile.devices {
            let id = self
                .devices
                .iter()
                .position(|n| *n == d.device)
                .expect("known device") as u16;
            let (bytes, ts) = self.device_peak.get(&id).copied().unwrap_or_default();
            assert_eq!(
                (d.peak_bytes, d.peak_timestamp_ns),
                (bytes, ts),
                "peak of {}",
                d.device
            );
            assert_eq!(
                d.final_live_bytes,
                self.device_live.get(&id).copied().unwrap_or(0)
            );
        }

        // Span tree.
        let mut got_nodes: BTreeMap<NamedChain, NodeFigures> = BTreeMap::new();
        let mut chains: Vec<NamedChain> = Vec::new();
        for m in &profile.spans {
            let mut chain = m.parent.map_or(Vec::new(), |p| chains[p as usize].clone());
            chain.push((m.name.clone(), m.step, m.category));
            chains.push(chain.clone());
            let figures = NodeFigures {
                calls: m.calls,
                total_ns: m.total_ns,
                bytes_allocated: m.bytes_allocated,
                alloc_count: m.alloc_count,
                peak_bytes: m.peak_bytes,
                residual_bytes: m.residual_bytes,
            };
            assert!(
                got_nodes.insert(chain, figures).is_none(),
                "duplicate span node"
            );
        }
        let want_nodes: BTreeMap<_, _> = self
            .nodes
            .iter()
            .map(|(chain, f)| {
                let key = chain
                    .iter()
                    .map(|(n, label)| {
                        let (step, cat) = match label_of(*label) {
                            SpanLabel::Plain => (None, None),
                            SpanLabel::Step(s) => (Some(s), None),
                            SpanLabel::Category(c) => (None, Some(c)),
                        };
                        (self.names[*n as usize].clone(), step, cat)
                    })
                    .collect::<Vec<_>>();
                (key, f.clone())
            })
            .collect();
        for (chain, want) in &want_nodes {
            assert_eq!(
                got_nodes.get(chain),
                Some(want),
                "span metrics of {chain:?}"
            );
        }
        assert_eq!(got_nodes.len(), want_nodes.len(), "span nodes");

        // Iterations: the top-level name entered most often (ties: first seen).
        let mut calls: Vec<(u32, u64)> = Vec::new();
        for (chain, f) in &self.nodes {
            if chain.len() == 1 {
                match calls.iter_mut().find(|(n, _)| *n == chain[0].0) {
                    Some(c) => c.1 += f.calls,
                    None => calls.push((chain[0].0, f.calls)),
                }
            }
        }
        let first_seen = |name: u32| {
            self.instances
                .iter()
                .position(|i| i.parent.is_none() && i.chain[0].0 == name)
                .unwrap_or(usize::MAX)
        };
        let chosen = calls
            .iter()
            .filter(|(_, c)| *c >= 2)
            .min_by_key(|(n, c)| (std::cmp::Reverse(*c), first_seen(*n)));
        let want_iterations: Vec<(u64, u64)> = chosen
            .and_then(|(n, _)| self.top_exits.get(n).cloned())
            .unwrap_or_default();
        let got_iterations: Vec<(u64, u64)> = profile
            .iterations
            .iter()
            .map(|i| (i.end_timestamp_ns, i.live_bytes))
            .collect();
        assert_eq!(got_iterations, want_iterations, "iterations");
    }
}

/// Names and devices the generated streams use, interned in this order.
const NAMES: [&str; 6] = ["step", "forward", "backward", "layer", "matmul", "f32"];
const DEVICES: [&str; 3] = ["cpu", "cuda:0", "cuda:1"];
const LABELS: [SpanLabel; 5] = [
    SpanLabel::Plain,
    SpanLabel::Step(Step::Forward),
    SpanLabel::Step(Step::Backward),
    SpanLabel::Category(Category::Parameter),
    SpanLabel::Plain,
];

/// Turns random tuples into a plausible multi-threaded stream: nested spans per thread, ops,
/// allocations, frees, reallocs, plus unknown frees, duplicate addresses, straggler frees and
/// allocations in spans whose enter was lost.
fn build_stream(steps: &[(u8, u8, u64, u64)]) -> Vec<Event> {
    let mut events = Vec::new();
    let mut ts = 1u64;
    let mut next_addr = 0x1000u64;
    let mut stacks: [Vec<SpanSeq>; 3] = Default::default();
    let mut next_id: [SpanSeq; 3] = [1; 3];
    // Live blocks as the driver believes: (device, addr) -> alloc ts.
    let mut live: BTreeMap<(u16, u64), u64> = BTreeMap::new();
    for &(thread, action, a, b) in steps {
        let t = usize::from(thread % 3);
        ts += b % 3;
        let mut span = stacks[t].last().copied().unwrap_or(0);
        if b % 17 == 0 {
            span = 999; // an enter we never saw
        }
        let kind = match action % 16 {
            0..=3 => {
                let device = DeviceId((a % 3) as u16);
                let addr = if a % 7 == 0 && !live.is_empty() {
                    let keys: Vec<_> = live.keys().filter(|k| k.0 == device.0).copied().collect();
                    keys.get((b as usize) % keys.len().max(1))
                        .map_or(next_addr, |k| k.1)
                } else {
                    next_addr += 16;
                    next_addr
                };
                live.insert((device.0, addr), ts);
                let mut size = 1 + b % 4096;
                if b % 11 == 0 {
                    size *= 1000;
                }
                EventKind::Alloc {
                    device,
                    addr,
                    size,
                    category: Category::from_index((a >> 8) as u8 % 5),
                }
            }
            4..=6 if !live.is_empty() => {
                let key = *live
                    .keys()
                    .nth((a as usize) % live.len())
                    .unwrap_or(&(0, 0));
                live.remove(&key);
                EventKind::Free {
                    device: DeviceId(key.0),
                    addr: key.1,
                    size: 0,
                }
            }
            7 => EventKind::Free {
                device: DeviceId((a % 3) as u16),
                addr: (1 << 40) + (a % 64) * 16,
                size: 8,
            },
            8 if !live.is_empty() => {
                let (&key, &born) = live
                    .iter()
                    .nth((a as usize) % live.len())
                    .unwrap_or((&(0, 0), &0));
                events.push(Event {
                    ts_ns: born.saturating_sub(1),
                    thread: u32::from(thread % 3),
                    span,
                    kind: EventKind::Free {
                        device: DeviceId(key.0),
                        addr: key.1,
                        size: 0,
                    },
                });
                continue;
            }
            9 => {
                let cpu: Vec<u64> = live.keys().filter(|k| k.0 == 0).map(|k| k.1).collect();
                let old_addr = if a % 5 == 0 || cpu.is_empty() {
                    (1 << 41) + a % 64 * 16
                } else {
                    cpu[(a as usize) % cpu.len()]
                };
                live.remove(&(0, old_addr));
                // Half the time the realloc comes in two halves, as the collector gives it,
                // and a third of those another thread reuses the old address in between.
                let halves = a % 4 < 2;
                let reused = halves && b % 3 == 0;
                let mut released_ns = (a % 3 == 0).then(|| ts.saturating_sub(b % 50));
                if halves {
                    let thread = u32::from(thread % 3);
                    released_ns = Some(ts);
                    events.push(Event {
                        ts_ns: ts,
                        thread,
                        span,
                        kind: EventKind::ReallocRelease {
                            old_addr,
                            old_size: 0,
                        },
                    });
                    if reused {
                        ts += 1;
                        live.insert((0, old_addr), ts);
                        events.push(Event {
                            ts_ns: ts,
                            thread: (thread + 1) % 3,
                            span: 0,
                            kind: EventKind::Alloc {
                                device: DeviceId::CPU,
                                addr: old_addr,
                                size: 1 + b % 700,
                                category: Category::Other,
                            },
                        });
                    }
                    ts += b % 2;
                }
                let new_addr = if b % 2 == 0 && !reused {
                    old_addr
                } else {
                    next_addr += 16;
                    next_addr
                };
                live.insert((0, new_addr), ts);
                EventKind::Realloc {
                    old_addr,
                    old_size: 0,
                    new_addr,
                    new_size: 1 + b % 8192,
                    category: Category::from_index((a >> 8) as u8 % 5),
                    released_ns,
                }
            }
            10 | 11 => {
                let id = next_id[t];
                next_id[t] += 1;
                let depth = stacks[t].len();
                let name = if depth == 0 {
                    (a % 2) as u32
                } else {
                    1 + (a % 3) as u32
                };
                stacks[t].push(id);
                EventKind::SpanEnter {
                    id,
                    name: NameId(name),
                    label: LABELS[(b % 5) as usize],
                }
            }
            12 | 13 => match stacks[t].pop() {
                Some(id) => {
                    span = id;
                    EventKind::SpanExit { id }
                }
                None => EventKind::SpanExit { id: 12345 },
            },
            14 => {
                if a % 2 == 0 {
                    EventKind::OpBegin {
                        name: NameId(4),
                        output: 0,
                        shape: Some(ShapeId(0)),
                        dtype: Some(NameId(5)),
                    }
                } else {
                    EventKind::OpEnd
                }
            }
            _ => {
                let key = live
                    .keys()
                    .nth((a as usize) % live.len().max(1))
                    .copied()
                    .unwrap_or((0, 7));
                EventKind::SetCategory {
                    device: DeviceId(key.0),
                    addr: key.1,
                    category: Category::from_index((b % 5) as u8),
                }
            }
        };
        events.push(Event {
            ts_ns: ts,
            thread: u32::from(thread % 3),
            span,
            kind,
        });
    }
    events
}

/// A span label as part of an ordered node key (the model's own numbering).
fn label_key(label: SpanLabel) -> u8 {
    match label {
        SpanLabel::Plain => 0,
        SpanLabel::Step(Step::Forward) => 1,
        SpanLabel::Step(Step::Backward) => 2,
        SpanLabel::Step(Step::Optimizer) => 3,
        SpanLabel::Category(category) => 10 + category.index() as u8,
    }
}

/// Inverse of [`label_key`].
fn label_of(key: u8) -> SpanLabel {
    match key {
        0 => SpanLabel::Plain,
        1 => SpanLabel::Step(Step::Forward),
        2 => SpanLabel::Step(Step::Backward),
        3 => SpanLabel::Step(Step::Optimizer),
        _ => SpanLabel::Category(Category::from_index(key - 10)),
    }
}

/// A timeline with the generated streams' names interned.
fn timeline(config: TimelineConfig) -> Timeline {
    let mut timeline = Timeline::new(config);
    for name in NAMES {
        timeline.intern_name(name);
    }
    for device in DEVICES {
        timeline.intern_device(device);
    }
    timeline.intern_shape(&[2, 3]);
    timeline
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn timeline_matches_the_brute_force_model(
        steps in prop::collection::vec((0u8..3, 0u8..16, any::<u64>(), any::<u64>()), 1..300),
    ) {
        let config = TimelineConfig { max_breakdown_rows: usize::MAX, top_allocations: 5, max_points_per_device: 64 };
        let mut streaming = timeline(config);
        let mut model = Model::new(&NAMES, &DEVICES);
        let events = build_stream(&steps);
        for event in &events {
            streaming.apply(event);
            model.apply(event);
        }
        let end = events.iter().map(|e| e.ts_ns).max().unwrap_or(0) + 10;
        let profile = streaming.profile(end);
        model.finish(end);
        model.check(&profile, 5);
        for point in &profile.timeline {
            prop_assert!(point.live_bytes <= profile.summary.peak_bytes);
        }
        if profile.summary.peak_bytes > 0 {
            let s = &profile.summary;
            prop_assert!(profile.timeline.iter().any(|p| p.device == s.peak_device
                && p.timestamp_ns == s.peak_timestamp_ns
                && p.live_bytes == s.peak_bytes
                && p.by_category == s.peak_by_category));
        }
        prop_assert!(profile.timeline.iter().filter(|p| p.device == profile.summary.peak_device).count() <= 64);
    }

    #[test]
    fn arbitrary_events_never_panic(
        raw in prop::collection::vec((any::<u64>(), 0u32..4, 0u32..6, 0u8..9, any::<u64>(), any::<u64>(), any::<u64>()), 0..200),
    ) {
        let mut timeline = Timeline::new(TimelineConfig { max_points_per_device: 3, top_allocations: 2, max_breakdown_rows: 2 });
        let mut counted = 0u64;
        for &(ts, thread, span, kind, a, b, c) in &raw {
            let device = DeviceId((a % 4) as u16);
            let kind = match kind {
                0 => EventKind::Alloc { device, addr: b % 8, size: c, category: Category::from_index((a % 7) as u8) },
                1 => EventKind::Free { device, addr: b % 8, size: c },
                2 if c % 2 == 0 => EventKind::Realloc { old_addr: a % 8, old_size: b, new_addr: b % 8, new_size: c, category: Category::Other, released_ns: Some(c) },
                2 => EventKind::ReallocRelease { old_addr: a % 8, old_size: b },
                3 => EventKind::SpanEnter { id: (b % 6) as u32, name: NameId((c % 9) as u32), label: SpanLabel::Step(Step::Backward) },
                4 => EventKind::SpanExit { id: (b % 6) as u32 },
                5 => EventKind::OpBegin { name: NameId((b % 3) as u32), output: c, shape: Some(ShapeId(7)), dtype: None },
                6 => EventKind::OpEnd,
                7 => EventKind::SetCategory { device, addr: b % 8, category: Category::Gradient },
                _ => EventKind::PoolState { device, capacity: a, reserved: b, largest_free: c, fragmentation: f64::NAN },
            };
            // A realloc's release is half of the realloc, not an event of its own.
            counted += u64::from(!matches!(kind, EventKind::ReallocRelease { .. }));
            timeline.apply(&Event { ts_ns: ts, thread, span, kind });
        }
        timeline.note_dropped(3);
        let profile = timeline.profile(u64::MAX);
        prop_assert!(profile.peak_breakdown.len() <= 2);
        prop_assert!(profile.largest_at_peak.len() <= 2);
        prop_assert_eq!(profile.summary.event_count, counted);
        let live: u64 = (0..4).map(|d| timeline.live_bytes(DeviceId(d))).fold(0u64, u64::saturating_add);
        prop_assert_eq!(profile.summary.final_live_bytes, live);
    }
}
