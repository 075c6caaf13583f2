//! The hook side of measurement: per-thread state and what the allocator hook calls.
//!
//! A thread that measures points its thread-local at a [`Meter`] living in the frame of
//! [`measure`](super::measure); a nested measurement points at its own meter, which points at
//! the enclosing one, and every meter of the chain sees each event. A thread that does not
//! measure pays one Relaxed load of [`MEASURING`] per hook call and nothing else.
//!
//! Hot-path rules hold here as in capture: the thread-local is `const`-initialised and has no
//! destructor, the address table is mapped with `mmap`, nothing locks, nothing panics. An event
//! that arrives while this thread is already inside a meter update (a signal handler that
//! allocates) is not applied, so a meter has one writer at every instant; it is counted in
//! [`Measurement::missed_events`](super::Measurement::missed_events).

use std::cell::Cell;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use super::sites::{Sampler, UNSAMPLED};
use super::table::{AddressTable, Inserted};
use super::{Measurement, SpanFigures};

/// Threads measuring right now. The hook reads it first (Relaxed): a thread sees its own
/// increment, and a stale value elsewhere only costs that thread a thread-local read.
static MEASURING: AtomicUsize = AtomicUsize::new(0);

/// Hands out meter ids, in the order meters start (so a span knows which meters it entered).
static NEXT_METER: AtomicU64 = AtomicU64::new(1);

/// Span nodes a meter keeps; allocations in deeper or further spans go to the nearest node.
/// A power of two, so a node index is masked into range instead of bounds-checked (no panic
/// path in the hook).
const MAX_NODES: usize = 128;
const _: () = assert!(MAX_NODES.is_power_of_two() && MAX_NODES <= u16::MAX as usize + 1);
/// Open spans a meter follows; spans nested deeper count as their outermost followed one.
const MAX_DEPTH: usize = 64;
/// The node of allocations made outside every span opened inside the measurement.
const ROOT: u16 = 0;

thread_local! {
    /// The innermost meter's address (0, with [`NO_METER`], when this thread is not
    /// measuring), with [`PAUSED`] and [`BUSY`] in its low bits: one thread-local read and one
    /// test tell the hook whether to count, one write before and one after an update mark it
    /// busy.
    static STATE: Cell<usize> = const { Cell::new(NO_METER) };
    /// Events not applied because they arrived during an update, over the thread's life.
    static MISSED: Cell<u64> = const { Cell::new(0) };
}

/// Set while highwater's measurement code itself runs (building a result): not measured.
const PAUSED: usize = 1;
/// Set while a meter update runs: an event arriving then is re-entry.
const BUSY: usize = 2;
/// Set while this thread has no meter, so that one test of the flag bits tells the hook
/// whether there is anything to count.
const NO_METER: usize = 4;
/// The flag bits of [`STATE`]; a meter's address never has them set.
const FLAGS: usize = PAUSED | BUSY | NO_METER;

const _: () = assert!(!std::mem::needs_drop::<Cell<usize>>());
const _: () = assert!(std::mem::align_of::<Meter>() > FLAGS);

/// This thread's state word; [`PAUSED`] once its thread-locals are gone.
#[inline(always)]
fn state() -> usize {
    STATE.try_with(Cell::get).unwrap_or(PAUSED)
}

#[inline(always)]
fn set_state(word: usize) {
    let _ = STATE.try_with(|cell| cell.set(word));
}

/// The state word naming `meter` (null: none) as the innermost meter, with `flags`.
fn word_of(meter: *mut Meter, flags: usize) -> usize {
    if meter.is_null() {
        flags | NO_METER
    } else {
        meter as usize | (flags & !NO_METER)
    }
}

#[inline(always)]
fn meter_now() -> *mut Meter {
    (state() & !FLAGS) as *mut Meter
}

#[inline(always)]
fn flags() -> usize {
    state() & FLAGS
}

/// Sets the flag bits, keeping the meter.
#[inline(always)]
fn set_flags(flags: usize) {
    set_state(state() & !FLAGS | flags);
}

fn missed() -> u64 {
    MISSED.try_with(Cell::get).unwrap_or(0)
}

/// One allocator event, as every meter of a chain applies it.
///
/// A trait with an always-inlined method rather than a closure: LLVM kept a closure called in
/// the chain loop out of line, a call with six saved registers per event (about a fifth of
/// what a measured pair cost).
///
/// `PLAIN` is true on the inlined fast path, taken when the meter is [`Meter::plain`]: its
/// span-split figures are then known to be off and compiled out.
trait Event: Copy {
    fn apply<const PLAIN: bool>(self, meter: &mut Meter);
}

#[derive(Clone, Copy)]
struct Allocated {
    addr: usize,
    size: u64,
}

impl Event for Allocated {
    #[inline(always)]
    fn apply<const PLAIN: bool>(self, meter: &mut Meter) {
        meter.alloc::<PLAIN>(self.addr, self.size);
    }
}

#[derive(Clone, Copy)]
struct Freed {
    addr: usize,
    size: u64,
}

impl Event for Freed {
    #[inline(always)]
    fn apply<const PLAIN: bool>(self, meter: &mut Meter) {
        meter.free::<PLAIN>(self.addr, self.size);
    }
}

#[derive(Clone, Copy)]
struct Reallocated {
    old_addr: usize,
    old_size: u64,
    new_addr: usize,
    new_size: u64,
}

impl Event for Reallocated {
    #[inline(always)]
    fn apply<const PLAIN: bool>(self, meter: &mut Meter) {
        meter.realloc::<PLAIN>(self.old_addr, self.old_size, self.new_addr, self.new_size);
    }
}

/// Applies `event` to every meter of this thread's chain, innermost first, unless the thread
/// is not measuring, highwater runs on it, or this is re-entry.
#[inline(always)]
fn each_meter(event: impl Event) {
    let word = state();
    if word & FLAGS != 0 {
        if word & BUSY != 0 {
            let _ = MISSED.try_with(|cell| cell.set(cell.get() + 1));
        }
        return;
    }
    // Highwater's own work on a user thread (interning a name, starting or finishing a
    // session, building a measurement's result) runs with capture's pause set.
    if crate::capture::paused_here() {
        return;
    }
    set_state(word | BUSY);
    // SAFETY: every meter of the chain is alive: `Activation` removes a meter from the chain
    // before its frame ends, and a meter's parent outlives it (nesting is scoped). `BUSY`
    // makes this the only reference to it on this thread, and no other thread ever reaches it
    // (it is reachable only through this thread's thread-local).
    let innermost = unsafe { &mut *(word as *mut Meter) };
    if innermost.plain {
        event.apply::<true>(innermost);
    } else {
        whole_chain(innermost, event);
    }
    set_state(word);
}

/// Applies `event` to `meter` and the meters enclosing it, with span splits (out of line:
/// nested measurements, and spans opened inside one).
#[inline(never)]
fn whole_chain(mut meter: *mut Meter, event: impl Event) {
    while !meter.is_null() {
        // SAFETY: as in `each_meter`, whose `BUSY` still holds.
        let this = unsafe { &mut *meter };
        event.apply::<false>(this);
        meter = this.parent;
    }
}

/// Counts a heap allocation that the inner allocator just made.
#[inline(always)]
pub(crate) fn on_alloc(addr: usize, size: usize) {
    if MEASURING.load(Ordering::Relaxed) != 0 {
        alloc_measured(addr, size as u64);
    }
}

/// Counts a heap free that is about to happen.
#[inline(always)]
pub(crate) fn on_free(addr: usize, size: usize) {
    if MEASURING.load(Ordering::Relaxed) != 0 {
        free_measured(addr, size as u64);
    }
}

/// Counts a completed realloc of `old_addr` (`old_size` bytes) into `new_addr`.
#[inline(always)]
pub(crate) fn on_realloc(old_addr: usize, old_size: usize, new_addr: usize, new_size: usize) {
    if MEASURING.load(Ordering::Relaxed) != 0 {
        realloc_measured(old_addr, old_size as u64, new_addr, new_size as u64);
    }
}

#[inline(always)]
fn alloc_measured(addr: usize, size: u64) {
    each_meter(Allocated { addr, size });
}

#[inline(always)]
fn free_measured(addr: usize, size: u64) {
    each_meter(Freed { addr, size });
}

#[inline(always)]
fn realloc_measured(old_addr: usize, old_size: u64, new_addr: usize, new_size: u64) {
    each_meter(Reallocated {
        old_addr,
        old_size,
        new_addr,
        new_size,
    });
}

/// Which meters a span entered: those with an id up to this one (`0`: none).
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct SpanMark(u64);

/// Opens span `name` in every meter of this thread's chain.
///
/// Spans are followed whatever the flags say (they are never opened from inside the hook), so
/// every exit finds the entry it closes.
#[inline]
pub(crate) fn span_enter(name: &'static str) -> SpanMark {
    if MEASURING.load(Ordering::Relaxed) == 0 {
        return SpanMark(0);
    }
    let meter = meter_now();
    if meter.is_null() {
        return SpanMark(0);
    }
    // SAFETY: see `each_meter`; span calls are not made from inside the allocator hook.
    let innermost = unsafe { (*meter).id };
    every_meter_of_chain(meter, |meter| meter.enter(name));
    SpanMark(innermost)
}

/// Closes the span `mark` came from, in the meters it was opened in (ids up to the mark's;
/// a meter started inside the span never saw it open).
#[inline]
pub(crate) fn span_exit(mark: SpanMark) {
    if mark.0 != 0 {
        every_meter_of_chain(meter_now(), |meter| {
            if meter.id <= mark.0 {
                meter.exit();
            }
        });
    }
}

/// Applies `update` to `meter` and the meters enclosing it, unless a meter update is running
/// on this thread already (re-entry from a signal handler).
fn every_meter_of_chain(mut meter: *mut Meter, update: impl Fn(&mut Meter)) {
    if flags() & BUSY != 0 {
        return;
    }
    let before = flags();
    set_flags(before | BUSY);
    while !meter.is_null() {
        // SAFETY: as in `each_meter`.
        let this = unsafe { &mut *meter };
        update(this);
        meter = this.parent;
    }
    set_flags(before);
}

/// Bytes this thread's innermost meter has seen the thread's heap grow by, net of every free
/// (`None` when not measuring).
pub(crate) fn net_bytes_now() -> Option<i64> {
    let meter = meter_now();
    if meter.is_null() {
        return None;
    }
    // SAFETY: see `each_meter`; this runs outside the hook, on the meter's own thread.
    Some(unsafe { (*meter).net() })
}

/// A span node: one path of spans opened inside the measurement.
#[derive(Debug, Clone, Copy)]
struct Node {
    parent: u16,
    name: &'static str,
    /// Bytes of blocks born here that are live now.
    live: u64,
    allocated_bytes: u64,
    allocations: u64,
    /// `live` at the measurement's peak number `epoch` (see [`Meter::peak_epoch`]).
    at_peak: u64,
    epoch: u64,
}

impl Node {
    const fn new(parent: u16, name: &'static str, epoch: u64) -> Node {
        Node {
            parent,
            name,
            live: 0,
            allocated_bytes: 0,
            allocations: 0,
            at_peak: 0,
            epoch,
        }
    }
}

/// A live block born inside, with its size, span node and call-site tag.
#[derive(Debug, Clone, Copy)]
struct Recent {
    addr: usize,
    size: u64,
    node: u16,
    site: u16,
}

impl Recent {
    const NONE: Recent = Recent {
        addr: 0,
        size: 0,
        node: ROOT,
        site: UNSAMPLED,
    };
}

/// A table entry's value: the block's span node and its call-site tag.
fn packed(node: u16, site: u16) -> usize {
    usize::from(node) | usize::from(site) << 16
}

/// The (node, site tag) of a table entry's value.
fn unpacked(value: usize) -> (usize, u16) {
    (value & 0xFFFF, (value >> 16) as u16)
}

/// One measurement's running figures. Lives in the frame of `measure`; reached by the hook
/// only through the measuring thread's thread-local.
#[derive(Debug)]
// The fields every event touches first, together, ahead of the span tables; aligned to 8 so
// the state word's three flag bits are free on every target.
#[repr(C, align(8))]
pub(crate) struct Meter {
    /// The enclosing measurement on this thread, or null.
    parent: *mut Meter,
    /// No enclosing meter and no span split: every event takes the inlined fast path.
    plain: bool,
    /// The latest block born inside, held out of the table until the next one is born: a block
    /// freed before the thread allocates again (a scratch buffer, a formatted string) never
    /// touches the table. `addr == 0`: none.
    recent: Recent,
    /// Bytes left before the next call-site sample (see [`Sampler`]).
    sample_left: u64,
    /// Live bytes of the blocks born inside, except [`Meter::recent`]'s: the pair of an alloc
    /// and the free of the same block writes no counter, so consecutive pairs do not wait on
    /// each other's stores to it (see [`Meter::live`]).
    kept_live: u64,
    peak: u64,
    /// How many times `peak` rose. A node whose `epoch` is behind has not changed since the
    /// latest rise, so its live bytes then are its live bytes now: live-at-peak by span costs
    /// O(1) per event, with no snapshot.
    peak_epoch: u64,
    allocated_bytes: u64,
    allocations: u64,
    node_count: usize,
    /// The innermost followed span's node (`stack[depth - 1]`, or the root).
    node: u16,
    /// Blocks born inside and still live, with their span node, except [`Meter::recent`].
    table: AddressTable,
    reallocations: u64,
    untracked_frees: u64,
    /// Bytes of those frees (and reallocs' old blocks): the thread's heap shrank by them, the
    /// measurement's live bytes did not. With [`Meter::untracked_bytes`] they make
    /// [`Meter::net`] from [`Meter::live`], so the hot path keeps no net counter of its own.
    untracked_freed: u64,
    untracked_blocks: u64,
    /// Bytes of the blocks [`Meter::untrack`] left out of the figures.
    untracked_bytes: u64,
    /// Reallocs whose old block was born inside: with the blocks live at the end they make
    /// the count of frees, so the hot path keeps no free counter either.
    reallocs_of_inside: u64,
    /// Blocks born inside whose table entry a later block at the same address took (the first
    /// was freed by another thread, unseen): still live in the figures, and in `leaked_blocks`.
    overwritten: u64,
    id: u64,
    /// [`MISSED`] when the meter started.
    missed_at_start: u64,
    /// Call-site samples and their stacks.
    sampler: Sampler,
    /// Open spans' nodes; `depth` may exceed `MAX_DEPTH`, then the deepest ones are not kept.
    depth: usize,
    stack: [u16; MAX_DEPTH],
    nodes: [Node; MAX_NODES],
}

impl Meter {
    pub(crate) fn new() -> Meter {
        let (sampler, sample_left) = Sampler::new();
        Meter {
            sampler,
            sample_left,
            id: NEXT_METER.fetch_add(1, Ordering::Relaxed),
            parent: std::ptr::null_mut(),
            plain: true,
            table: AddressTable::new(),
            recent: Recent::NONE,
            overwritten: 0,
            kept_live: 0,
            peak: 0,
            peak_epoch: 0,
            allocated_bytes: 0,
            allocations: 0,
            reallocations: 0,
            untracked_frees: 0,
            untracked_freed: 0,
            untracked_bytes: 0,
            reallocs_of_inside: 0,
            untracked_blocks: 0,
            missed_at_start: missed(),
            nodes: [Node::new(ROOT, "", 0); MAX_NODES],
            node_count: 1,
            stack: [ROOT; MAX_DEPTH],
            depth: 0,
            node: ROOT,
        }
    }

    #[inline(always)]
    fn node_now(&self) -> u16 {
        self.node
    }

    /// Whether spans opened inside made nodes besides the root. Until then the root's figures
    /// are the meter's totals, so the hot path keeps no per-node figures at all (see
    /// [`Meter::root_from_totals`]).
    #[inline(always)]
    fn splits_by_span(&self) -> bool {
        self.node_count > 1
    }

    /// Whether this event keeps span-split figures: never on the fast path (`PLAIN`, taken
    /// only by a [`Meter::plain`] meter), else when the meter splits by span.
    #[inline(always)]
    fn splits<const PLAIN: bool>(&self) -> bool {
        !PLAIN && self.splits_by_span()
    }

    /// Recomputes [`Meter::plain`] after its parent or its span nodes changed.
    fn update_plain(&mut self) {
        self.plain = self.parent.is_null() && !self.splits_by_span();
    }

    /// Node `index`, masked into the table (indices are always below `MAX_NODES`).
    #[inline(always)]
    fn node_mut(&mut self, index: usize) -> &mut Node {
        &mut self.nodes[index & (MAX_NODES - 1)]
    }

    /// Moves node `index`'s live bytes up or down by `bytes`, keeping its live-at-peak figure
    /// current.
    #[inline(always)]
    fn node_live(&mut self, index: usize, grow: bool, bytes: u64) {
        let peak_epoch = self.peak_epoch;
        let node = self.node_mut(index);
        if node.epoch != peak_epoch {
            node.at_peak = node.live;
            node.epoch = peak_epoch;
        }
        node.live = if grow {
            node.live + bytes
        } else {
            node.live.saturating_sub(bytes)
        };
    }

    /// A block born inside: live, maybe a new peak; it becomes [`Meter::recent`] and the
    /// previous recent block moves into the table. The caller has counted it in its span
    /// node's live bytes when the meter splits by span.
    #[inline(always)]
    fn born(&mut self, addr: usize, size: u64, node: u16, site: u16) {
        if self.recent.addr != 0 {
            self.keep_recent();
        }
        self.recent = Recent {
            addr,
            size,
            node,
            site,
        };
        let live = self.kept_live.wrapping_add(size);
        if live > self.peak {
            self.peak = live;
            self.peak_epoch += 1;
        }
    }

    /// Live bytes of the blocks born inside.
    fn live(&self) -> u64 {
        let recent = if self.recent.addr != 0 {
            self.recent.size
        } else {
            0
        };
        self.kept_live.wrapping_add(recent)
    }

    /// Moves [`Meter::recent`] into the table. If no memory can be mapped for it, it leaves
    /// the figures (its free will not be recognised) and counts as untracked. Out of line: the
    /// common alloc + free of one block never comes here, and the inlined path stays small.
    #[inline(never)]
    fn keep_recent(&mut self) {
        let block = self.recent;
        match self
            .table
            .insert(block.addr, packed(block.node, block.site))
        {
            Inserted::New => {}
            Inserted::Replaced => self.overwritten += 1,
            Inserted::Full => return self.untrack(block),
        }
        self.kept_live = self.kept_live.wrapping_add(block.size);
    }

    #[cold]
    fn untrack(&mut self, block: Recent) {
        self.untracked_blocks += 1;
        // Never counted in `kept_live`: it leaves the figures as it leaves `recent`.
        self.untracked_bytes += block.size;
        if self.splits_by_span() {
            self.node_live(usize::from(block.node), false, block.size);
        }
        if block.site != UNSAMPLED {
            self.sampler.ended(block.site, block.size, self.peak_epoch);
        }
    }

    /// A block ends; `true` if it was born inside.
    #[inline(always)]
    fn ended<const PLAIN: bool>(&mut self, addr: usize, mut size: u64) -> bool {
        let (node, site) = if addr == self.recent.addr {
            // Not in `kept_live`: nothing to take off. The span and site figures take the size
            // the block was born with too, so they agree with the totals even if a free's
            // layout did not (an address another thread freed unseen and reused).
            self.recent.addr = 0;
            size = self.recent.size;
            (usize::from(self.recent.node), self.recent.site)
        } else {
            match self.remove_kept(addr) {
                Some(value) => {
                    // Only a block born inside ends here, with the size it was born with.
                    self.kept_live = self.kept_live.wrapping_sub(size);
                    unpacked(value)
                }
                None => {
                    self.untracked_frees += 1;
                    self.untracked_freed += size;
                    return false;
                }
            }
        };
        if site != UNSAMPLED {
            self.sampler.ended(site, size, self.peak_epoch);
        }
        if self.splits::<PLAIN>() {
            self.node_live(node, false, size);
        }
        true
    }

    /// The call-site tag of a block of `size` bytes born now, adding `growth` to its site's
    /// allocated bytes if it is sampled: the fast path is a comparison and a subtraction.
    #[inline(always)]
    fn site_of(&mut self, size: u64, growth: u64) -> u16 {
        if size < self.sample_left {
            self.sample_left -= size;
            UNSAMPLED
        } else {
            self.sampler
                .allocated(size, growth, self.peak_epoch, &mut self.sample_left)
        }
    }

    /// Takes `addr` out of the table; out of line, as [`Meter::keep_recent`].
    #[inline(never)]
    fn remove_kept(&mut self, addr: usize) -> Option<usize> {
        self.table.remove(addr)
    }

    #[inline(always)]
    fn alloc<const PLAIN: bool>(&mut self, addr: usize, size: u64) {
        self.allocations += 1;
        self.allocated_bytes += size;
        let site = self.site_of(size, size);
        // One test of the split per event: without spans the block is the root's.
        let node = if self.splits::<PLAIN>() {
            let node = self.node_now();
            let figures = self.node_mut(usize::from(node));
            figures.allocations += 1;
            figures.allocated_bytes += size;
            self.node_live(usize::from(node), true, size);
            node
        } else {
            ROOT
        };
        self.born(addr, size, node, site);
    }

    #[inline(always)]
    fn free<const PLAIN: bool>(&mut self, addr: usize, size: u64) {
        self.ended::<PLAIN>(addr, size);
    }

    /// As the profile counts it: the old block ends, the new one is born; bytes allocated grow
    /// by the growth over the old block when it was born inside, else by the new size.
    #[inline(always)]
    fn realloc<const PLAIN: bool>(
        &mut self,
        old_addr: usize,
        old_size: u64,
        new_addr: usize,
        new_size: u64,
    ) {
        let node = self.node_now();
        self.reallocations += 1;
        let growth = if self.ended::<PLAIN>(old_addr, old_size) {
            self.reallocs_of_inside += 1;
            new_size.saturating_sub(old_size)
        } else {
            new_size
        };
        self.allocated_bytes += growth;
        let site = self.site_of(new_size, growth);
        if self.splits::<PLAIN>() {
            self.node_mut(usize::from(node)).allocated_bytes += growth;
            self.node_live(usize::from(node), true, new_size);
        }
        self.born(new_addr, new_size, node, site);
    }

    /// The thread's heap change net of every free it made: what is live of the blocks born
    /// inside, plus what left the figures untracked, minus the frees of older blocks.
    fn net(&self) -> i64 {
        (self.live() as i64)
            .wrapping_add(self.untracked_bytes as i64)
            .wrapping_sub(self.untracked_freed as i64)
    }

    /// Blocks born inside and still counted live.
    fn live_blocks(&self) -> u64 {
        self.table.len() as u64 + u64::from(self.recent.addr != 0) + self.overwritten
    }

    /// The root node as it stands while no other node exists: everything is the root's, so
    /// its figures are the totals (its live bytes at the latest peak are the peak).
    fn root_from_totals(&self) -> Node {
        Node {
            parent: ROOT,
            name: "",
            live: self.live(),
            allocated_bytes: self.allocated_bytes,
            allocations: self.allocations,
            at_peak: self.peak,
            epoch: self.peak_epoch,
        }
    }

    fn enter(&mut self, name: &'static str) {
        let parent = self.node_now();
        let node = if self.depth >= MAX_DEPTH {
            parent
        } else {
            self.child(parent, name)
        };
        if self.depth < MAX_DEPTH {
            self.stack[self.depth] = node;
        }
        self.depth += 1;
        self.node = node;
    }

    fn exit(&mut self) {
        self.depth = self.depth.saturating_sub(1);
        self.node = match self.depth {
            0 => ROOT,
            depth => self.stack[depth.min(MAX_DEPTH) - 1],
        };
    }

    /// The node for span `name` under `parent`, made if new; `parent` itself when the node
    /// table is full.
    fn child(&mut self, parent: u16, name: &'static str) -> u16 {
        let found = self.nodes[1..self.node_count].iter().position(|node| {
            node.parent == parent && std::ptr::eq(node.name, name) && node.name.len() == name.len()
        });
        if let Some(index) = found {
            return index as u16 + 1;
        }
        if self.node_count == MAX_NODES {
            return parent;
        }
        if !self.splits_by_span() {
            // From now on the hot path keeps figures per node; the root's so far are the totals.
            self.nodes[usize::from(ROOT)] = self.root_from_totals();
        }
        let index = self.node_count;
        self.nodes[index] = Node::new(parent, name, self.peak_epoch);
        self.node_count += 1;
        self.update_plain();
        index as u16
    }

    /// The measurement's result. Called once the meter is out of the thread's chain, so it
    /// may allocate.
    pub(crate) fn finish(&self) -> Measurement {
        let missed = missed() - self.missed_at_start;
        let mut spans: Vec<SpanFigures> = Vec::new();
        let root = self.root_from_totals();
        for index in 0..self.node_count {
            let node = if self.splits_by_span() {
                &self.nodes[index]
            } else {
                &root
            };
            let at_peak = if node.epoch == self.peak_epoch {
                node.at_peak
            } else {
                node.live
            };
            if node.allocated_bytes == 0 && at_peak == 0 && node.live == 0 {
                continue;
            }
            let path = self.path(index);
            // Two literals with the same text are two nodes with one path: one row.
            match spans.iter_mut().find(|row| row.path == path) {
                Some(row) => {
                    row.allocations += node.allocations;
                    row.allocated_bytes += node.allocated_bytes;
                    row.live_at_peak_bytes += at_peak;
                    row.leaked_bytes += node.live;
                }
                None => spans.push(SpanFigures {
                    path,
                    allocations: node.allocations,
                    allocated_bytes: node.allocated_bytes,
                    live_at_peak_bytes: at_peak,
                    leaked_bytes: node.live,
                }),
            }
        }
        spans.sort_by(|a, b| {
            (
                b.live_at_peak_bytes,
                b.leaked_bytes,
                b.allocated_bytes,
                &a.path,
            )
                .cmp(&(
                    a.live_at_peak_bytes,
                    a.leaked_bytes,
                    a.allocated_bytes,
                    &b.path,
                ))
        });
        Measurement {
            peak_bytes: self.peak,
            allocated_bytes: self.allocated_bytes,
            allocations: self.allocations,
            leaked_bytes: self.live(),
            leaked_blocks: self.live_blocks(),
            reallocations: self.reallocations,
            // Every block born inside ended by a free, by a realloc, or is still live or was
            // untracked.
            frees: (self.allocations + self.reallocations).saturating_sub(
                self.live_blocks() + self.untracked_blocks + self.reallocs_of_inside,
            ),
            untracked_frees: self.untracked_frees,
            untracked_blocks: self.untracked_blocks,
            missed_events: missed,
            net_bytes: self.net(),
            spans,
            sites: self.sampler.finish(self.peak_epoch),
            site_sample_bytes: super::sites::SAMPLE_BYTES,
        }
    }

    /// `outer/inner` names of node `index`; the root's path is empty.
    fn path(&self, index: usize) -> String {
        let mut names = Vec::new();
        let mut at = index;
        while at != usize::from(ROOT) {
            names.push(self.nodes[at].name);
            at = usize::from(self.nodes[at].parent);
        }
        names.reverse();
        names.join("/")
    }
}

/// Puts a meter at the head of this thread's chain until dropped.
#[derive(Debug)]
pub(crate) struct Activation {
    meter: *mut Meter,
}

impl Activation {
    /// Makes `meter` this thread's innermost measurement.
    ///
    /// # Safety
    ///
    /// `meter` must stay valid, and be reached only through the hook, until the returned
    /// guard is dropped; guards must be dropped in reverse order of creation (scoping).
    pub(crate) unsafe fn start(meter: *mut Meter) -> Activation {
        // SAFETY: the caller hands us a valid meter that nothing else references yet.
        unsafe {
            (*meter).parent = meter_now();
            (*meter).update_plain();
        }
        set_state(word_of(meter, flags()));
        MEASURING.fetch_add(1, Ordering::Relaxed);
        Activation { meter }
    }
}

impl Drop for Activation {
    fn drop(&mut self) {
        // SAFETY: the meter is still valid (contract of `start`); reading its parent.
        let parent = unsafe { (*self.meter).parent };
        set_state(word_of(parent, flags()));
        MEASURING.fetch_sub(1, Ordering::Relaxed);
    }
}
