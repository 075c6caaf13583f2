//! The merge state: per-ring cursors, the rings' staged events, the drains that fill them and
//! the merge that hands events to [`apply`](super::apply) in time order.

use std::collections::HashMap;

use super::merge::{Merge, Stamp};
use super::vmm::VmmLedger;
use super::QUIET_DRAIN;
use crate::alloc_log::AllocLogWriter;
use crate::analysis::{DeviceId, NameId, ShapeId, Timeline, TimelineConfig};
use crate::capture;
use crate::capture::clock::Calibration;
use crate::capture::raw::{Decoder, RawEvent, RawKind};
use crate::capture::registry::{SlotState, REGISTRY};
use crate::profile::{ThreadCapture, Warning, MAX_THREAD_ROWS};

/// How far ahead in a ring's queue the live map is asked for the block a free will end: far
/// enough for the line to arrive before it is read, near enough to stay cached until then.
const PREFETCH_BLOCK: usize = 6;

/// How far ahead the heap's index is asked for the lines that finding that block reads: before
/// [`PREFETCH_BLOCK`], whose lookup then finds them cached and asks for the block at once.
const PREFETCH_INDEX: usize = 14;

/// Events every ring may have staged between drain and merge, whatever the others hold: a
/// drain takes no more than the queue has room for and leaves the rest in the ring (where a
/// lossless producer waits for room rather than growing a queue). 16 Ki events are 512 KiB,
/// a quarter of a default ring. Each ring's own room is what keeps the merge moving: a ring
/// that holds the watermark can always be drained past its hold.
const STAGED_PER_RING: usize = 1 << 14;

/// Events staged over all rings beyond their own [`STAGED_PER_RING`] while the collector is
/// behind: four rings' worth, at most 256 Ki events (8 MiB with the default ring). A burst of
/// allocation shorter than this costs its producer no wait; the collector works it off
/// afterwards. Past it, producers wait for the merge as before.
///
/// Only while fewer threads produce than the process has cores (see
/// [`Merger::backlog_room`]): a producer that runs on instead of waiting then uses a core of its
/// own. With more, it would take the collector's core, and the collector is what is behind:
/// four producers on two cores ran 10–20 % slower with a backlog than without.
pub(super) fn staged_backlog(ring_events: u64) -> usize {
    usize::try_from(ring_events.saturating_mul(4))
        .unwrap_or(usize::MAX)
        .min(1 << 18)
}

/// Events merged between two drains within one merge: a long merge takes in what producers
/// published meanwhile, so one whose ring filled goes on into the backlog instead of waiting
/// for the whole merge to end.
pub(super) const MERGE_CHUNK: usize = 1 << 13;

/// The collector's view of one ring.
#[derive(Debug, Default)]
pub(super) struct RingCursor {
    /// Profile thread number of the ring's current owner, if the ring is in use.
    pub(super) thread: Option<u32>,
    /// Joins the halves of two-event records.
    pub(super) decoder: Decoder,
    /// The owner retired and everything it wrote was drained: the slot is handed back to the
    /// registry once the last staged event is merged (so a new owner's events never share the
    /// queue with the old one's).
    pub(super) retired: bool,
    /// Drop counters as last read, to charge new drops to the current owner.
    pub(super) dropped_seen: [u64; RawKind::COUNT],
}

/// The merge's order: a raw event's clock reading. Nanoseconds never decrease with the
/// reading, so this is their order too, without a conversion per event; watermarks in
/// nanoseconds are given to the merge as the latest reading within them
/// ([`Calibration::latest_ticks_within`]).
#[derive(Debug, Clone, Copy)]
pub(super) struct StampTicks;

impl Stamp<RawEvent> for StampTicks {
    #[inline]
    fn stamp(&self, event: &RawEvent) -> u64 {
        event.ticks()
    }
}

/// Merge state: per-ring cursors, the merge of raw events and the analysis.
pub(super) struct Merger {
    pub(super) calibration: Calibration,
    pub(super) timeline: Timeline,
    pub(super) cursors: Vec<RingCursor>,
    /// Raw events staged per ring, decoded only as they are merged.
    pub(super) merge: Merge<RawEvent, StampTicks>,
    /// Span names by their `&'static str` address and length.
    pub(super) names: HashMap<(usize, usize), NameId>,
    /// Timeline ids of the process-wide interner's names, shapes and devices.
    pub(super) interned_names: HashMap<u32, NameId>,
    pub(super) interned_shapes: HashMap<u32, ShapeId>,
    pub(super) interned_devices: HashMap<u16, DeviceId>,
    /// Device names by the timeline's device id, for the allocation log.
    pub(super) device_names: Vec<String>,
    /// The allocation log, when the session asked for one.
    pub(super) log: Option<AllocLogWriter>,
    /// What every profile says from the start ([`CollectorConfig::warnings`]).
    pub(super) warnings: Vec<Warning>,
    /// Virtual-memory mappings per device, which say when physical memory is freed.
    pub(super) vmm: HashMap<DeviceId, VmmLedger>,
    /// Capture rows, at most [`MAX_THREAD_ROWS`] (see [`stats_of`]).
    pub(super) threads: Vec<ThreadCapture>,
    /// Profile threads numbered so far (each ring owner gets the next number).
    pub(super) thread_count: u32,
    /// Newest timestamp merged, for `duration_ns`.
    pub(super) newest_ns: u64,
    /// The most events the latest drain took from one ring.
    pub(super) most_drained: u64,
    /// Events that may be staged over all rings beyond each one's own room
    /// ([`staged_backlog`]).
    pub(super) backlog: usize,
    /// Cores this process may run on.
    pub(super) cores: usize,
    /// Rings the latest drain took events from.
    pub(super) producing: usize,
}

impl Merger {
    pub(super) fn new(calibration: Calibration, config: TimelineConfig) -> Merger {
        let slots = REGISTRY.slots();
        Merger {
            calibration,
            timeline: Timeline::new(config),
            // Drop counters are cumulative over the process: start from what earlier sessions
            // already saw. Read before the gate opens (see `spawn`), so nothing this session
            // drops is in the baseline.
            cursors: slots
                .iter()
                .map(|slot| RingCursor {
                    dropped_seen: slot.ring.dropped(),
                    ..RingCursor::default()
                })
                .collect(),
            merge: Merge::new(slots.len(), StampTicks),
            names: HashMap::new(),
            interned_names: HashMap::new(),
            interned_shapes: HashMap::new(),
            interned_devices: HashMap::new(),
            device_names: vec!["cpu".to_string()],
            log: None,
            warnings: Vec::new(),
            vmm: HashMap::new(),
            threads: Vec::new(),
            thread_count: 0,
            newest_ns: 0,
            most_drained: 0,
            backlog: staged_backlog(capture::ring_capacity()),
            cores: std::thread::available_parallelism().map_or(1, usize::from),
            producing: 0,
        }
    }

    /// Drains, then merges up to `watermark_ns`, until no partly drained ring holds the merge
    /// below it: afterwards everything published before the call and stamped at or before
    /// `watermark_ns` has been applied. Staging stays bounded: each round merges what the
    /// last drain made mergeable before the next drain.
    pub(super) fn catch_up(&mut self, watermark_ns: u64) {
        while self.drain(watermark_ns) {
            self.merge_until(watermark_ns);
            // A ring held by a producer descheduled mid-push needs that thread to run.
            std::thread::yield_now();
        }
        self.merge_until(watermark_ns);
    }

    /// Moves published events out of the rings into the per-ring staging queues, at most as
    /// many as each queue has room for. Returns whether some ring still holds the merge below
    /// `watermark_ns` (it was left with events and its last one drained is older).
    pub(super) fn drain(&mut self, watermark_ns: u64) -> bool {
        let watermark_ticks = self.calibration.latest_ticks_within(watermark_ns);
        let mut behind = false;
        let mut producing = 0;
        self.most_drained = 0;
        for (index, slot) in REGISTRY.claimed().iter().enumerate() {
            let state = slot.state();
            if state == SlotState::Free || !slot.ring.has_storage() || self.cursors[index].retired {
                continue;
            }
            // Before the drain: a producer busy now may have read its clock but not published;
            // its event is no older than the last one drained, so the ring holds there.
            let in_flight = slot.ring.is_busy();
            let room = STAGED_PER_RING
                .saturating_sub(self.merge.staged(index))
                .max(self.backlog_room());
            // SAFETY: this thread is the only consumer of every ring (one collector runs at a
            // time: the session starts it and joins it before another can start), and storage
            // is installed (checked above).
            let moved = self.merge.append_with(index, |queue| unsafe {
                slot.ring.drain_at_most(queue, room as u64)
            });
            self.most_drained = self.most_drained.max(moved);
            let emptied = moved < room as u64;
            // A ring left with events it had no room for is producing too.
            producing += usize::from(moved > 0 || (!emptied && !slot.ring.is_empty()));
            let dropped = slot.ring.dropped();
            let thread = match self.cursors[index].thread {
                Some(thread) => thread,
                // Nothing from the current owner yet: do not name it. A thread that has just
                // claimed the ring may not have stored its tid yet (the slot would still show
                // the previous owner's, and every later event would be charged to that tid).
                None if moved == 0 && dropped == self.cursors[index].dropped_seen => {
                    // Caught mid-push, its first event may be older than the next watermark.
                    self.merge.push(index, std::iter::empty(), !in_flight);
                    behind |= self.merge.holds_below(index, watermark_ticks);
                    if state == SlotState::Retired {
                        self.cursors[index].decoder.reset();
                        REGISTRY.free(index);
                    }
                    continue;
                }
                None => {
                    // The owner stored its tid before publishing the events just drained (the
                    // drain's Acquire load of `head` makes it visible).
                    let thread = self.thread_count;
                    self.thread_count += 1;
                    if self.threads.len() < MAX_THREAD_ROWS {
                        self.threads
                            .push(ThreadCapture::new(thread, slot.owner_tid()));
                    } else if let Some(rest) = self.threads.last_mut() {
                        rest.threads += 1;
                    }
                    self.cursors[index].thread = Some(thread);
                    thread
                }
            };
            self.merge
                .push(index, std::iter::empty(), emptied && !in_flight);
            self.charge_drops(index, thread, dropped);
            // Everything a retired owner wrote before retiring is drained once it is emptied.
            self.cursors[index].retired = state == SlotState::Retired && emptied;
            behind |= self.merge.holds_below(index, watermark_ticks);
        }
        self.producing = producing;
        behind
    }

    /// How many more events the backlog may take ([`staged_backlog`]): none while as many
    /// threads produce as there are cores.
    pub(super) fn backlog_room(&self) -> usize {
        if self.producing < self.cores {
            self.backlog.saturating_sub(self.merge.staged_total())
        } else {
            0
        }
    }

    pub(super) fn charge_drops(
        &mut self,
        index: usize,
        thread: u32,
        dropped: [u64; RawKind::COUNT],
    ) {
        let cursor = &mut self.cursors[index];
        let stats = stats_of(&mut self.threads, thread);
        let mut total = 0;
        for (kind, (now, seen)) in dropped
            .iter()
            .zip(cursor.dropped_seen.iter_mut())
            .enumerate()
        {
            let new = now.saturating_sub(*seen);
            *seen = *now;
            match RawKind::from_byte(kind as u8) {
                Some(RawKind::Alloc) => stats.dropped_allocs += new,
                Some(RawKind::Free) => stats.dropped_frees += new,
                Some(RawKind::ReallocTo) => stats.dropped_reallocs += new,
                // The first half of a two-event record is counted by its second, here and in
                // the summary's total, so a dropped realloc is one dropped event.
                Some(head) if head.is_head() => continue,
                _ => stats.dropped_other += new,
            }
            total += new;
        }
        if total > 0 {
            self.timeline.note_dropped(total);
        }
    }

    /// Applies staged events in time order up to `watermark_ns` (and up to the hold of any
    /// partly drained ring), decoding each as it is applied; then hands retired rings whose
    /// last event was applied back to the registry. Draws nothing from the rings, so after a
    /// drain that left no ring holding below `watermark_ns` everything staged up to it is
    /// applied ([`Merger::catch_up`] and the stop rely on that).
    pub(super) fn merge_until(&mut self, watermark_ns: u64) {
        self.merge_draining(watermark_ns, false);
    }

    /// A collector round's merge: as [`Merger::merge_until`], but after every [`MERGE_CHUNK`]
    /// events, while the backlog has room for at least [`STAGED_PER_RING`], it drains the rings
    /// again, so a producer whose ring filled meanwhile goes on into the backlog. Such a drain
    /// may find a producer mid-push and hold the watermark lower, so the round can end with
    /// events up to `watermark_ns` still staged: the next round merges them. Returns how many
    /// events it applied.
    pub(super) fn merge_round(&mut self, watermark_ns: u64) -> usize {
        let merged = self.merge_draining(watermark_ns, true);
        // Queues give back what a backlog made them grow to once the stream has calmed, or
        // when they hold more than four backlogs' worth beyond a small queue per ring (bursts
        // that move from ring to ring would otherwise leave every queue at its largest); not
        // after every round, since regrowing them costs a page fault per 4 KiB, and two rings
        // taking turns with the backlog stay within the slack.
        if self.most_drained < QUIET_DRAIN
            || self.merge.capacity_beyond(2 * STAGED_PER_RING) > 4 * self.backlog
        {
            self.merge.shrink_idle(STAGED_PER_RING);
        }
        merged
    }

    pub(super) fn merge_draining(&mut self, watermark_ns: u64, drain_between: bool) -> usize {
        let watermark_ticks = self.calibration.latest_ticks_within(watermark_ns);
        let mut merged = 0;
        loop {
            let mut merge = std::mem::replace(&mut self.merge, Merge::new(0, StampTicks));
            let log = self.log.is_some();
            // Asking ahead costs a little per event; it pays only once the live map has
            // outgrown the caches.
            let ask_ahead = self.timeline.outgrows_caches();
            let applied =
                merge.release_with_next(watermark_ticks, MERGE_CHUNK, |index, raw, next| {
                    // Two events of one ring adjacent in the merged order may take a shortcut
                    // (the allocation log wants every event on its own): a short-lived block's
                    // alloc and free go to the timeline as one; a realloc's first half needs no
                    // release of its own when nothing can reuse the old address before the
                    // second.
                    // The block a free a few places on will end is asked for now, so that its
                    // wait for memory overlaps this event's work: a program that frees in
                    // another order than it allocated (rayon's sorts) waits on every free.
                    // The index lines that finding it reads are asked for further ahead.
                    if ask_ahead {
                        let further = next.ahead(PREFETCH_INDEX);
                        if let Some(addr) = further.and_then(RawEvent::ended_heap_address) {
                            self.timeline.prefetch_index(addr);
                        }
                        let ahead = next.ahead(PREFETCH_BLOCK);
                        if let Some(addr) = ahead.and_then(RawEvent::ended_heap_address) {
                            self.timeline.prefetch_block(DeviceId::CPU, addr);
                        }
                    }
                    let paired = |next: &RawEvent| {
                        !log && (raw.is_freed_by(next) || raw.is_completed_by(next))
                    };
                    match next.take_if(paired) {
                        Some(free) if raw.is_freed_by(&free) => self.apply_pair(index, raw, free),
                        Some(second) => {
                            self.release_adjacent(index, &raw);
                            self.apply_record(index, raw);
                            self.apply_record(index, second);
                        }
                        None => self.apply(index, raw),
                    }
                });
            self.merge = merge;
            merged += applied;
            if applied < MERGE_CHUNK {
                break;
            }
            // Only with room for a good share of a ring: a drain wakes a waiting producer, and
            // one woken for a few events parks again at once, a context switch each time.
            if !drain_between || self.backlog_room() < STAGED_PER_RING {
                continue;
            }
            let most_drained = self.most_drained;
            self.drain(0);
            self.most_drained = self.most_drained.max(most_drained);
        }
        // Only a claimed slot is ever drained, so only one of those can be retired.
        let claimed = REGISTRY.claimed().len();
        for (index, cursor) in self.cursors.iter_mut().enumerate().take(claimed) {
            if cursor.retired && self.merge.staged(index) == 0 {
                *cursor = RingCursor {
                    dropped_seen: cursor.dropped_seen,
                    ..RingCursor::default()
                };
                REGISTRY.free(index);
            }
        }
        merged
    }

    /// Whether a backlog is being worked off: more is staged than one ring's own room, left by
    /// a merge that could not keep up while producers had cores of their own.
    pub(super) fn working_off_backlog(&self) -> bool {
        self.producing < self.cores && self.merge.staged_total() > STAGED_PER_RING
    }
}

/// The capture row of profile thread `thread`: its own, or the last row, which sums every
/// thread past the first [`MAX_THREAD_ROWS`] - 1.
pub(super) fn stats_of(threads: &mut [ThreadCapture], thread: u32) -> &mut ThreadCapture {
    let row = (thread as usize).min(MAX_THREAD_ROWS - 1);
    &mut threads[row]
}
