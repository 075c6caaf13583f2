//! The collector thread: drains every ring, merges threads into one time order and feeds the
//! [`Timeline`].
//!
//! Each ring is already in time order. An event is merged only once it is older than a lag
//! window behind the newest clock reading, because a thread may have read its clock but not yet
//! published. A straggler that arrives later is still applied; the analysis settles what it
//! means from its timestamp.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap, VecDeque};
use std::thread::JoinHandle;
use std::time::Duration;

use crossbeam_channel::{Receiver, RecvTimeoutError, Sender};

use crate::analysis::{DeviceId, Event, EventKind, NameId, Timeline, TimelineConfig};
use crate::capture::clock::Calibration;
use crate::capture::raw::{RawEvent, RawKind};
use crate::capture::registry::{SlotState, REGISTRY};
use crate::capture::ring::close_gate;
use crate::capture::{self, RECORDING, UNATTRIBUTED_DROPS};
use crate::model::{Category, SpanLabel};
use crate::profile::{CaptureStats, Profile, ThreadCapture};

/// What the session asks of the collector.
#[derive(Debug)]
pub(crate) enum Control {
    /// Merge everything recorded so far and reply with the profile as of now; keep recording.
    Snapshot(Sender<Profile>),
    /// Close recording, merge everything, and reply with the profile.
    Stop(Sender<Profile>),
}

/// How the collector runs.
#[derive(Debug, Clone)]
pub(crate) struct CollectorConfig {
    /// Converts ring timestamps to nanoseconds.
    pub(crate) calibration: Calibration,
    /// How often rings are drained.
    pub(crate) interval: Duration,
    /// How far behind the newest clock reading events are held before merging.
    pub(crate) lag: Duration,
    /// Analysis settings.
    pub(crate) timeline: TimelineConfig,
}

/// Starts the collector thread.
///
/// Call it before the recording gate opens: the rings' drop counters are read here, on the
/// caller's thread, as the baseline the session's drops are counted from. (Read on the collector
/// thread, which may first run long after the gate opened, they would swallow every drop made
/// before it ran.)
///
/// Returns once the thread has marked itself internal: std allocates on a new thread before
/// the closure runs, and with the gate already open that would be recorded as a user thread's.
pub(crate) fn spawn(config: CollectorConfig) -> std::io::Result<(JoinHandle<()>, Sender<Control>)> {
    let (control, requests) = crossbeam_channel::unbounded();
    let merger = Merger::new(config.calibration, config.timeline.clone());
    let (ready, internal) = crossbeam_channel::bounded(1);
    let handle = std::thread::Builder::new()
        .name("highwater-collector".into())
        .spawn(move || {
            capture::mark_internal_thread();
            let _ = ready.send(());
            run(config, merger, requests);
        })?;
    internal
        .recv()
        .map_err(|_| std::io::Error::other("the highwater collector thread ended as it started"))?;
    Ok((handle, control))
}

fn run(config: CollectorConfig, mut merger: Merger, requests: Receiver<Control>) {
    let lag_ns = config.lag.as_nanos() as u64;
    loop {
        match requests.recv_timeout(config.interval) {
            Err(RecvTimeoutError::Timeout) => {
                // Read the clock before draining, not after: an event missing from this drain
                // was published after its ring was drained, so anything that happened after it
                // (another thread reusing a freed address) is stamped later than `now` and waits
                // for the next round too. Read after, a slow drain (more than the lag) could
                // merge the reuse before the free it depends on.
                let now = config.calibration.now_ns();
                merger.drain();
                merger.merge_until(now.saturating_sub(lag_ns));
            }
            Ok(Control::Snapshot(reply)) => {
                // Everything stamped before the request, not everything drained: an event
                // stamped later may depend on one its thread publishes just after its ring was
                // drained (see above); it stays staged for the next round.
                let now = config.calibration.now_ns();
                merger.drain();
                merger.merge_until(now);
                let end = now.max(merger.newest_ns);
                let _ = reply.send(merger.timeline.finish(end));
            }
            Ok(Control::Stop(reply)) => {
                let _ = reply.send(merger.stop());
                return;
            }
            Err(RecvTimeoutError::Disconnected) => {
                merger.stop();
                return;
            }
        }
    }
}

/// The collector's view of one ring.
#[derive(Debug, Default)]
struct RingCursor {
    /// Profile thread number of the ring's current owner, if the ring is in use.
    thread: Option<u32>,
    /// Decoded events not yet merged, oldest first.
    staged: VecDeque<Event>,
    /// The first half of a realloc, waiting for its second.
    realloc_from: Option<RawEvent>,
    /// Drop counters as last read, to charge new drops to the current owner.
    dropped_seen: [u64; RawKind::COUNT],
}

/// Merge state: per-ring staging, the merge heap and the analysis.
struct Merger {
    calibration: Calibration,
    timeline: Timeline,
    cursors: Vec<RingCursor>,
    /// One entry per ring with staged events: (front timestamp, ring index).
    heap: BinaryHeap<Reverse<(u64, usize)>>,
    /// Span names by their `&'static str` address and length.
    names: HashMap<(u64, u64), NameId>,
    threads: Vec<ThreadCapture>,
    scratch: Vec<RawEvent>,
    /// Newest timestamp merged, for `duration_ns`.
    newest_ns: u64,
}

impl Merger {
    fn new(calibration: Calibration, config: TimelineConfig) -> Merger {
        Merger {
            calibration,
            timeline: Timeline::new(config),
            // Drop counters are cumulative over the process: start from what earlier sessions
            // already saw. Read before the gate opens (see `spawn`), so nothing this session
            // drops is in the baseline.
            cursors: REGISTRY
                .slots()
                .iter()
                .map(|slot| RingCursor {
                    dropped_seen: slot.ring.dropped(),
                    ..RingCursor::default()
                })
                .collect(),
            heap: BinaryHeap::new(),
            names: HashMap::new(),
            threads: Vec::new(),
            scratch: Vec::new(),
            newest_ns: 0,
        }
    }

    /// Moves every published event out of the rings into the per-ring staging queues.
    fn drain(&mut self) {
        for (index, slot) in REGISTRY.slots().iter().enumerate() {
            let state = slot.state();
            if state == SlotState::Free || !slot.ring.has_storage() {
                continue;
            }
            self.scratch.clear();
            // SAFETY: this thread is the only consumer of every ring (one collector runs at a
            // time: the session starts it and joins it before another can start), and storage
            // is installed (checked above).
            unsafe { slot.ring.drain(&mut self.scratch) };
            let dropped = slot.ring.dropped();
            let thread = match self.cursors[index].thread {
                Some(thread) => thread,
                // Nothing from the current owner yet: do not name it. A thread that has just
                // claimed the ring may not have stored its tid yet (the slot would still show
                // the previous owner's, and every later event would be charged to that tid).
                None if self.scratch.is_empty() && dropped == self.cursors[index].dropped_seen => {
                    if state == SlotState::Retired {
                        self.cursors[index].realloc_from = None;
                        REGISTRY.free(index);
                    }
                    continue;
                }
                None => {
                    // The owner stored its tid before publishing the events just drained (the
                    // drain's Acquire load of `head` makes it visible).
                    let thread = self.threads.len() as u32;
                    self.threads.push(ThreadCapture {
                        thread,
                        os_tid: slot.owner_tid(),
                        ..ThreadCapture::default()
                    });
                    self.cursors[index].thread = Some(thread);
                    thread
                }
            };
            let was_empty = self.cursors[index].staged.is_empty();
            let mut scratch = std::mem::take(&mut self.scratch);
            for raw in scratch.drain(..) {
                self.decode(index, thread, raw);
            }
            self.scratch = scratch;
            self.charge_drops(index, thread, dropped);
            if was_empty {
                if let Some(front) = self.cursors[index].staged.front() {
                    self.heap.push(Reverse((front.ts_ns, index)));
                }
            }
            if state == SlotState::Retired {
                // Everything it wrote before retiring was drained above.
                self.cursors[index].thread = None;
                self.cursors[index].realloc_from = None;
                REGISTRY.free(index);
            }
        }
    }

    fn charge_drops(&mut self, index: usize, thread: u32, dropped: [u64; RawKind::COUNT]) {
        let cursor = &mut self.cursors[index];
        let stats = &mut self.threads[thread as usize];
        let mut total = 0;
        for (kind, (now, seen)) in dropped
            .iter()
            .zip(cursor.dropped_seen.iter_mut())
            .enumerate()
        {
            let new = now.saturating_sub(*seen);
            *seen = *now;
            total += new;
            match RawKind::from_byte(kind as u8) {
                Some(RawKind::Alloc) => stats.dropped_allocs += new,
                Some(RawKind::Free) => stats.dropped_frees += new,
                Some(RawKind::ReallocTo) => stats.dropped_reallocs += new,
                // The first half of a dropped realloc is counted by its second.
                Some(RawKind::ReallocFrom) => {}
                _ => stats.dropped_other += new,
            }
        }
        if total > 0 {
            self.timeline.note_dropped(total);
        }
    }

    /// Turns one raw event into an analysis event on ring `index`'s queue.
    fn decode(&mut self, index: usize, thread: u32, raw: RawEvent) {
        let Some(ts_ns) = self.calibration.to_ns(raw.ticks) else {
            return; // from before this session started
        };
        let stats = &mut self.threads[thread as usize];
        let kind = match RawKind::from_byte(raw.kind) {
            Some(RawKind::Alloc) => {
                stats.allocs += 1;
                EventKind::Alloc {
                    device: DeviceId(raw.device),
                    addr: raw.a,
                    size: raw.b,
                    category: Category::from_index(raw.flags),
                }
            }
            Some(RawKind::Free) => {
                stats.frees += 1;
                EventKind::Free {
                    device: DeviceId(raw.device),
                    addr: raw.a,
                    size: raw.b,
                }
            }
            Some(RawKind::ReallocFrom) => {
                self.cursors[index].realloc_from = Some(raw);
                return;
            }
            Some(RawKind::ReallocTo) => {
                stats.reallocs += 1;
                let from = self.cursors[index].realloc_from.take().unwrap_or_default();
                EventKind::Realloc {
                    old_addr: from.a,
                    old_size: from.b,
                    new_addr: raw.a,
                    new_size: raw.b,
                    category: Category::from_index(raw.flags),
                }
            }
            Some(RawKind::SpanEnter) => {
                stats.span_events += 1;
                let name = self.intern_static_name(raw.a, raw.b & 0xFFFF_FFFF);
                EventKind::SpanEnter {
                    id: (raw.b >> 32) as u32,
                    name,
                    label: SpanLabel::from_byte(raw.flags),
                }
            }
            Some(RawKind::SpanExit) => {
                stats.span_events += 1;
                EventKind::SpanExit { id: raw.span }
            }
            Some(RawKind::Other) | None => return,
        };
        self.cursors[index].staged.push_back(Event {
            ts_ns,
            thread,
            span: raw.span,
            kind,
        });
    }

    /// Interns a span name recorded as a `&'static str`'s address and length.
    fn intern_static_name(&mut self, address: u64, len: u64) -> NameId {
        if let Some(id) = self.names.get(&(address, len)) {
            return *id;
        }
        // SAFETY: `address` and `len` were taken by `span_enter` from a `&'static str`, which is
        // valid UTF-8 and lives for the rest of the process.
        let name = unsafe {
            std::str::from_utf8_unchecked(std::slice::from_raw_parts(
                address as usize as *const u8,
                len as usize,
            ))
        };
        let id = self.timeline.intern_name(name);
        self.names.insert((address, len), id);
        id
    }

    /// Applies staged events in time order up to `watermark_ns`.
    fn merge_until(&mut self, watermark_ns: u64) {
        while let Some(&Reverse((ts, index))) = self.heap.peek() {
            if ts > watermark_ns {
                break;
            }
            self.heap.pop();
            let queue = &mut self.cursors[index].staged;
            if let Some(event) = queue.pop_front() {
                self.newest_ns = self.newest_ns.max(event.ts_ns);
                self.timeline.apply(&event);
            }
            if let Some(front) = self.cursors[index].staged.front() {
                self.heap.push(Reverse((front.ts_ns, index)));
            }
        }
    }

    /// Closes recording, waits for writers in flight, merges everything and builds the profile.
    fn stop(&mut self) -> Profile {
        close_gate(&RECORDING);
        for slot in REGISTRY.slots() {
            slot.ring.wait_idle();
        }
        self.drain();
        self.merge_until(u64::MAX);
        let end_ns = self.calibration.now_ns().max(self.newest_ns);
        let unattributed: [u64; RawKind::COUNT] = std::array::from_fn(|kind| {
            UNATTRIBUTED_DROPS[kind].swap(0, std::sync::atomic::Ordering::Relaxed)
        });
        let unattributed_total: u64 = unattributed.iter().sum();
        if unattributed_total > 0 {
            self.timeline.note_dropped(unattributed_total);
        }
        let mut profile = self.timeline.finish(end_ns);
        profile.capture = self.capture_stats(unattributed);
        profile.meta.threads = self.threads.len() as u32;
        profile
    }

    fn capture_stats(&self, unattributed: [u64; RawKind::COUNT]) -> CaptureStats {
        let mut stats = CaptureStats {
            ring_events: crate::capture::lifecycle::ring_capacity(),
            unattributed_dropped: unattributed.iter().sum(),
            threads: self.threads.clone(),
            ..CaptureStats::default()
        };
        let sum = |field: fn(&ThreadCapture) -> u64| self.threads.iter().map(field).sum::<u64>();
        let loose = |kind: RawKind| unattributed[kind as usize];
        let loose_other =
            loose(RawKind::SpanEnter) + loose(RawKind::SpanExit) + loose(RawKind::Other);
        for (kind, total) in [
            ("alloc", sum(|t| t.dropped_allocs) + loose(RawKind::Alloc)),
            ("free", sum(|t| t.dropped_frees) + loose(RawKind::Free)),
            (
                "realloc",
                sum(|t| t.dropped_reallocs) + loose(RawKind::ReallocTo),
            ),
            ("other", sum(|t| t.dropped_other) + loose_other),
        ] {
            stats.dropped_by_kind.insert(kind.to_string(), total);
        }
        stats
    }
}
