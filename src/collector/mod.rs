//! The collector thread: drains every ring, merges threads into one time order and feeds the
//! [`Timeline`].
//!
//! Each ring is already in time order. An event is merged only once it is at or before a
//! watermark: the clock reading taken before the drain, less a short lag ([`MERGE_LAG`]; a
//! snapshot waits that long after its reading instead), and no later than any ring's hold: the last stamp drained from a ring
//! drained only partly or whose thread was caught between reading its clock and publishing (see
//! [`merge`]). A straggler that arrives later is still applied, the analysis settles what it
//! means from its timestamp, and the profile counts it ([`CaptureStats::late_events`]).

use std::collections::HashMap;
use std::path::PathBuf;
use std::thread::JoinHandle;
use std::time::Duration;

use crossbeam_channel::{Receiver, Sender, TryRecvError};

use crate::alloc_log::AllocLogWriter;
use crate::analysis::{
    At, DeviceId, Event, EventKind, NameId, Realloc, ShapeId, Timeline, TimelineConfig,
};
use crate::capture::clock::Calibration;
use crate::capture::raw::{
    Decoded, Decoder, DeviceMemoryKind, Plain, RawEvent, RawKind, ReallocRelease, Record,
    PHYSICAL_KEY,
};
use crate::capture::registry::{SlotState, REGISTRY};
use crate::capture::{self, gate, names, oom, wake, UNATTRIBUTED_DROPS};
use crate::checkpoint::{CheckpointConfig, Checkpointer};
use crate::profile::{CaptureMode, CaptureStats, Profile, ThreadCapture, Warning};

use merge::{Merge, Stamp};

mod merge;
mod vmm;

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
    /// How often rings are drained while events arrive (see [`next_sleep`] for quiet times).
    pub(crate) interval: Duration,
    /// How far behind the newest clock reading events are held before merging.
    pub(crate) lag: Duration,
    /// Analysis settings.
    pub(crate) timeline: TimelineConfig,
    /// Where to write the allocation log, if anywhere.
    pub(crate) alloc_log: Option<PathBuf>,
    /// Mean bytes between call-site samples (`0`: off), to weigh the samples.
    pub(crate) sample_bytes: u64,
    /// What every profile of the session says from the start (device memory not recorded).
    pub(crate) warnings: Vec<Warning>,
    /// Checkpoints to write while recording, if any.
    pub(crate) checkpoint: Option<CheckpointConfig>,
}

/// A thread's allocation was refused and it waits (ticket `asked` or older): merges everything
/// stamped until now, which includes every refusal with such a ticket (each was published before
/// its ticket was taken), and has the writer put that on disk, then marks the tickets done. No
/// writer (the session writes no profile): the tickets are done at once.
fn checkpoint_refusals(
    config: &CollectorConfig,
    merger: &mut Merger,
    checkpointer: Option<&mut Checkpointer>,
    asked: u32,
) {
    let Some(checkpointer) = checkpointer else {
        oom::written(asked);
        return;
    };
    let now = reading_settled(config);
    merger.catch_up(now);
    checkpointer.write_now(merger.checkpoint(now), asked);
}

/// A clock reading to merge everything up to, for a snapshot or a refusal's checkpoint, taken
/// the merge's lag ([`MERGE_LAG`]) before it is returned: what the lag covers in a round's watermark (a busy mark
/// still in a store buffer, a reading run ahead) has then passed, so the drain that follows
/// sees every ring that stamped before it as busy or published, and nothing merged up to the
/// reading can be late. These are rare, and the wait is short next to what they do.
fn reading_settled(config: &CollectorConfig) -> u64 {
    let now = config.calibration.now_ns();
    std::thread::sleep(config.lag);
    now
}

/// How far behind the clock reading taken before a drain the merge stops (the session's
/// [`CollectorConfig::lag`]).
///
/// A ring found busy holds the watermark at its last drained stamp (see [`merge`]), however
/// long its thread is descheduled between reading the clock and publishing; a ring found idle
/// reads the clock for its next event after the collector's reading. What is left is physical,
/// not ordered by the memory model: the producer's busy store may still sit in its store
/// buffer when its clock reading is taken, and the collector's `rdtsc` (not serialising) may
/// run ahead of its busy check, each well under a microsecond: the lag is more than a hundred
/// times that. Snapshots and refusal checkpoints, which merge up to their reading, wait it out
/// instead ([`reading_settled`]). Two cores' counters must agree, which the design assumes
/// throughout (holds compare raw readings, and a thread that moves between cores keeps its ring
/// in order only if they agree; the kernel checks an invariant TSC's synchronisation at boot).
/// A straggler let through would be counted ([`CaptureStats::late_events`]).
///
/// It used to be 5 ms, from before the busy holds. Events younger than the lag cannot be merged,
/// so a producer that filled its ring and the backlog with them waited for the collector's next
/// round while the collector had nothing it could merge: with a 16 Ki-event ring, syn took
/// 3.26× its unprofiled time instead of 1.65× (BENCHMARKS §6).
pub(crate) const MERGE_LAG: Duration = Duration::from_micros(100);

/// A drain that took fewer events than this from every ring was quiet.
const QUIET_DRAIN: u64 = 1024;
/// Longest sleep between drains, in collector intervals.
const MAX_QUIET_SLEEP: u32 = 8;

/// How long to sleep after a round whose drain took at most `most_drained` events from one
/// ring: the interval while events flow; after a quiet round, twice the last sleep, up to
/// [`MAX_QUIET_SLEEP`] intervals.
///
/// A wake that finds little to do still costs a futex round trip and a look at every claimed
/// ring, and on a machine whose cores all train it preempts a training thread. Sleeping longer
/// loses nothing: a producer rings the collector as soon as its ring is half full, as do
/// snapshots, refusals and the session's stop, and events are merged by their stamps whenever
/// they are drained.
fn next_sleep(last: Duration, interval: Duration, most_drained: u64) -> Duration {
    if most_drained >= QUIET_DRAIN {
        interval
    } else {
        (last * 2).min(interval * MAX_QUIET_SLEEP)
    }
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
    let mut merger = Merger::new(config.calibration, config.timeline.clone());
    merger.warnings = config.warnings.clone();
    merger
        .timeline
        .set_sampling(config.sample_bytes, capture::stack::UNWINDER);
    merger
        .timeline
        .set_resolver(Box::new(crate::symbolize::Resolver::default()));
    merger.log = config.alloc_log.as_deref().map(AllocLogWriter::create);
    // Started here, before the gate opens, for the same reason as the collector itself.
    let checkpointer = config
        .checkpoint
        .clone()
        .map(Checkpointer::start)
        .transpose()?;
    // Refusals asked about before this session are not this session's to answer. Read here,
    // before the gate opens, for the same reason: read on the collector thread, a refusal made
    // before it first ran would count as answered and its thread would wait out its deadline.
    let oom_answered = oom::asked();
    let (ready, internal) = crossbeam_channel::bounded(1);
    let handle = std::thread::Builder::new()
        .name("highwater-collector".into())
        .spawn(move || {
            capture::mark_internal_thread();
            let _ = ready.send(());
            run(config, merger, checkpointer, requests, oom_answered);
        })?;
    internal
        .recv()
        .map_err(|_| std::io::Error::other("the highwater collector thread ended as it started"))?;
    Ok((handle, control))
}

fn run(
    config: CollectorConfig,
    mut merger: Merger,
    mut checkpointer: Option<Checkpointer>,
    requests: Receiver<Control>,
    mut oom_answered: u32,
) {
    /// Tells waiting producers that nobody drains any more, however `run` ends (a panic in the
    /// analysis included), so none waits for a collector that is gone.
    struct StopServing;
    impl Drop for StopServing {
        fn drop(&mut self) {
            capture::collector_stopped();
            oom::release_waiters();
        }
    }
    let _serving = StopServing;
    let lag_ns = config.lag.as_nanos() as u64;
    let mut sleep = config.interval;
    loop {
        // Read the bell before looking for work: a producer or a request that rings it after
        // this read cuts the sleep below short.
        let bell = wake::collector_bell();
        match requests.try_recv() {
            Err(TryRecvError::Empty) => {
                // Read the clock before draining, not after: an event missing from this drain
                // was published after its ring was drained, so anything that happened after it
                // (another thread reusing a freed address) is stamped later than `now` and waits
                // for the next round too. Read after, a slow drain (more than the lag) could
                // merge the reuse before the free it depends on.
                let now = config.calibration.now_ns();
                merger.drain(0);
                let watermark = now.saturating_sub(lag_ns);
                let merged = merger.merge_round(watermark);
                let asked = oom::asked();
                if asked != oom_answered {
                    checkpoint_refusals(&config, &mut merger, checkpointer.as_mut(), asked);
                    oom_answered = asked;
                } else if let Some(checkpointer) = checkpointer.as_mut().filter(|c| c.due()) {
                    checkpointer.offer(merger.checkpoint(watermark));
                }
                // Behind and catching up: the backlog is older than the next watermark, so
                // go on at once rather than leave it waiting out a sleep.
                if merger.working_off_backlog() && merged as u64 >= QUIET_DRAIN {
                    continue;
                }
                sleep = next_sleep(sleep, config.interval, merger.most_drained);
                // Unwind tables for modules loaded (or unloaded) since: cheap when none was.
                capture::unwind::refresh();
                wake::collector_sleep(bell, sleep);
            }
            Ok(Control::Snapshot(reply)) => {
                // Everything stamped before the request, not everything drained: an event
                // stamped later may depend on one its thread publishes just after its ring was
                // drained (see above); it stays staged for the next round.
                let now = reading_settled(&config);
                merger.catch_up(now);
                let end = now.max(merger.newest_ns);
                merger.timeline.set_capture_mode(session_capture_mode());
                // With how capture went so far, as a checkpoint says it.
                let _ = reply.send(merger.checkpoint(end));
            }
            Ok(Control::Stop(reply)) => {
                // No checkpoint may land after the final profile the session writes.
                if let Some(checkpointer) = checkpointer.as_mut() {
                    checkpointer.finish();
                }
                let _ = reply.send(merger.stop(lag_ns));
                return;
            }
            Err(TryRecvError::Disconnected) => {
                if let Some(checkpointer) = checkpointer.as_mut() {
                    checkpointer.finish();
                }
                merger.stop(lag_ns);
                return;
            }
        }
    }
}

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
fn staged_backlog(ring_events: u64) -> usize {
    usize::try_from(ring_events.saturating_mul(4))
        .unwrap_or(usize::MAX)
        .min(1 << 18)
}

/// Events merged between two drains within one merge: a long merge takes in what producers
/// published meanwhile, so one whose ring filled goes on into the backlog instead of waiting
/// for the whole merge to end.
const MERGE_CHUNK: usize = 1 << 13;

/// The collector's view of one ring.
#[derive(Debug, Default)]
struct RingCursor {
    /// Profile thread number of the ring's current owner, if the ring is in use.
    thread: Option<u32>,
    /// Joins the halves of two-event records.
    decoder: Decoder,
    /// The owner retired and everything it wrote was drained: the slot is handed back to the
    /// registry once the last staged event is merged (so a new owner's events never share the
    /// queue with the old one's).
    retired: bool,
    /// Drop counters as last read, to charge new drops to the current owner.
    dropped_seen: [u64; RawKind::COUNT],
}

/// The merge's order: a raw event's clock reading. Nanoseconds never decrease with the
/// reading, so this is their order too, without a conversion per event; watermarks in
/// nanoseconds are given to the merge as the latest reading within them
/// ([`Calibration::latest_ticks_within`]).
#[derive(Debug, Clone, Copy)]
struct StampTicks;

impl Stamp<RawEvent> for StampTicks {
    #[inline]
    fn stamp(&self, event: &RawEvent) -> u64 {
        event.ticks()
    }
}

/// Merge state: per-ring cursors, the merge of raw events and the analysis.
struct Merger {
    calibration: Calibration,
    timeline: Timeline,
    cursors: Vec<RingCursor>,
    /// Raw events staged per ring, decoded only as they are merged.
    merge: Merge<RawEvent, StampTicks>,
    /// Span names by their `&'static str` address and length.
    names: HashMap<(usize, usize), NameId>,
    /// Timeline ids of the process-wide interner's names, shapes and devices.
    interned_names: HashMap<u32, NameId>,
    interned_shapes: HashMap<u32, ShapeId>,
    interned_devices: HashMap<u16, DeviceId>,
    /// Device names by the timeline's device id, for the allocation log.
    device_names: Vec<String>,
    /// The allocation log, when the session asked for one.
    log: Option<AllocLogWriter>,
    /// What every profile says from the start ([`CollectorConfig::warnings`]).
    warnings: Vec<Warning>,
    /// Virtual-memory mappings per device, which say when physical memory is freed.
    vmm: HashMap<DeviceId, vmm::VmmLedger>,
    threads: Vec<ThreadCapture>,
    /// Newest timestamp merged, for `duration_ns`.
    newest_ns: u64,
    /// The most events the latest drain took from one ring.
    most_drained: u64,
    /// Events that may be staged over all rings beyond each one's own room
    /// ([`staged_backlog`]).
    backlog: usize,
    /// Cores this process may run on.
    cores: usize,
    /// Rings the latest drain took events from.
    producing: usize,
}

impl Merger {
    fn new(calibration: Calibration, config: TimelineConfig) -> Merger {
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
    fn catch_up(&mut self, watermark_ns: u64) {
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
    fn drain(&mut self, watermark_ns: u64) -> bool {
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
    fn backlog_room(&self) -> usize {
        if self.producing < self.cores {
            self.backlog.saturating_sub(self.merge.staged_total())
        } else {
            0
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

    /// The timeline's id for the interner's name `id`.
    fn name(&mut self, id: u32) -> NameId {
        if let Some(name) = self.interned_names.get(&id) {
            return *name;
        }
        let text = names::name_of(id).unwrap_or_else(|| format!("(name {id})"));
        let name = self.timeline.intern_name(&text);
        self.interned_names.insert(id, name);
        name
    }

    /// The timeline's id for the interner's shape `id`.
    fn shape(&mut self, id: u32) -> ShapeId {
        if let Some(shape) = self.interned_shapes.get(&id) {
            return *shape;
        }
        let dims = names::shape_of(id).unwrap_or_default();
        let shape = self.timeline.intern_shape(&dims);
        self.interned_shapes.insert(id, shape);
        shape
    }

    /// The timeline's id for the interner's device `id`.
    fn device(&mut self, id: u16) -> DeviceId {
        if id == names::CPU {
            return DeviceId::CPU;
        }
        if let Some(device) = self.interned_devices.get(&id) {
            return *device;
        }
        let text = names::device_of(id).unwrap_or_else(|| format!("device:{id}"));
        let device = self.timeline.intern_device(&text);
        self.interned_devices.insert(id, device);
        let slot = usize::from(device.0);
        if self.device_names.len() <= slot {
            self.device_names.resize(slot + 1, String::new());
        }
        self.device_names[slot] = text;
        device
    }

    /// Interns a span name; names are looked up by the `&'static str`'s address and length,
    /// so each distinct name is hashed as text once.
    fn intern_static_name(&mut self, name: &'static str) -> NameId {
        let key = (name.as_ptr() as usize, name.len());
        if let Some(id) = self.names.get(&key) {
            return *id;
        }
        let id = self.timeline.intern_name(name);
        self.names.insert(key, id);
        id
    }

    /// Applies staged events in time order up to `watermark_ns` (and up to the hold of any
    /// partly drained ring), decoding each as it is applied; then hands retired rings whose
    /// last event was applied back to the registry. Draws nothing from the rings, so after a
    /// drain that left no ring holding below `watermark_ns` everything staged up to it is
    /// applied ([`Merger::catch_up`] and the stop rely on that).
    fn merge_until(&mut self, watermark_ns: u64) {
        self.merge_draining(watermark_ns, false);
    }

    /// A collector round's merge: as [`Merger::merge_until`], but after every [`MERGE_CHUNK`]
    /// events, while the backlog has room for at least [`STAGED_PER_RING`], it drains the rings
    /// again, so a producer whose ring filled meanwhile goes on into the backlog. Such a drain
    /// may find a producer mid-push and hold the watermark lower, so the round can end with
    /// events up to `watermark_ns` still staged: the next round merges them. Returns how many
    /// events it applied.
    fn merge_round(&mut self, watermark_ns: u64) -> usize {
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

    fn merge_draining(&mut self, watermark_ns: u64, drain_between: bool) -> usize {
        let watermark_ticks = self.calibration.latest_ticks_within(watermark_ns);
        let mut merged = 0;
        loop {
            let mut merge = std::mem::replace(&mut self.merge, Merge::new(0, StampTicks));
            let log = self.log.is_some();
            let applied =
                merge.release_with_next(watermark_ticks, MERGE_CHUNK, |index, raw, next| {
                    // Two events of one ring adjacent in the merged order may take a shortcut
                    // (the allocation log wants every event on its own): a short-lived block's
                    // alloc and free go to the timeline as one; a realloc's first half needs no
                    // release of its own when nothing can reuse the old address before the
                    // second.
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
    fn working_off_backlog(&self) -> bool {
        self.producing < self.cores && self.merge.staged_total() > STAGED_PER_RING
    }

    /// The profile of what is merged up to `end_ns`, for a checkpoint; recording goes on.
    fn checkpoint(&self, end_ns: u64) -> Profile {
        let profile = self.timeline.profile(end_ns.max(self.newest_ns));
        self.with_capture(profile, self.capture_stats([0; RawKind::COUNT]))
    }

    /// `profile` with how capture went: `capture`, the threads recorded, and a warning if the
    /// merge handed out any event late.
    fn with_capture(&self, mut profile: Profile, capture: CaptureStats) -> Profile {
        profile.capture = capture;
        profile.warnings.extend(self.warnings.iter().cloned());
        let events = self.merge.late();
        if events > 0 {
            profile.warnings.push(Warning::LateEvents { events });
        }
        profile.meta.threads = self.threads.len() as u32;
        profile
    }

    /// Applies one raw event of ring `index`: a realloc's first half gives its old address up
    /// at once, and the record the event completes, if any, is applied.
    fn apply(&mut self, index: usize, raw: RawEvent) {
        if let Some(release) = raw.realloc_release() {
            self.release(index, release);
        }
        self.apply_record(index, raw);
    }

    /// Decodes one raw event of ring `index` and applies the record it completes.
    fn apply_record(&mut self, index: usize, raw: RawEvent) {
        let cursor = &mut self.cursors[index];
        // Plain heap events, most of any stream, go straight to the timeline: no record or
        // `Event` is built unless a log or a sample needs one.
        if self.log.is_none() {
            if let Some(plain) = cursor.decoder.decode_plain(&raw) {
                let Some(thread) = cursor.thread else {
                    return;
                };
                let ts = self.calibration.to_ns(raw.ticks()).unwrap_or(0);
                self.newest_ns = self.newest_ns.max(ts);
                let stats = &mut self.threads[thread as usize];
                let at = At {
                    ts,
                    thread,
                    span: raw.span(),
                };
                return match plain {
                    Plain::Alloc {
                        addr,
                        size,
                        category,
                    } => {
                        stats.allocs += 1;
                        self.timeline
                            .apply_alloc(at, DeviceId::CPU, addr, size, category)
                    }
                    Plain::Free { addr } => {
                        stats.frees += 1;
                        self.timeline.apply_free(at, DeviceId::CPU, addr)
                    }
                    Plain::Realloc {
                        released,
                        old_addr,
                        new_addr,
                        new_size,
                        category,
                    } => {
                        stats.reallocs += 1;
                        // As for the event: a first half from before the session counts as
                        // its start, and it is never later than the second.
                        let released = self.calibration.to_ns(released).unwrap_or(0).min(ts);
                        let realloc = Realloc {
                            old_addr,
                            new_addr,
                            new_size,
                            category,
                            released,
                        };
                        self.timeline.apply_realloc(at, realloc)
                    }
                };
            }
        }
        let Some(Decoded {
            sampled,
            ticks,
            span,
            record,
        }) = cursor.decoder.decode(raw)
        else {
            return;
        };
        let Some(thread) = cursor.thread else {
            return;
        };
        let ts_ns = self.calibration.to_ns(ticks).unwrap_or(0);
        let stats = &mut self.threads[thread as usize];
        match record.kind() {
            RawKind::Alloc => stats.allocs += 1,
            RawKind::Free => stats.frees += 1,
            RawKind::ReallocTo => stats.reallocs += 1,
            RawKind::SpanEnter | RawKind::SpanExit => stats.span_events += 1,
            _ => stats.other_events += 1,
        }
        self.newest_ns = self.newest_ns.max(ts_ns);
        let kind = match record {
            Record::Alloc {
                addr,
                size,
                category,
            } => EventKind::Alloc {
                device: DeviceId::CPU,
                addr,
                size,
                category,
            },
            Record::Free { addr, size } => EventKind::Free {
                device: DeviceId::CPU,
                addr,
                size,
            },
            Record::Realloc {
                released,
                old_addr,
                old_size,
                new_addr,
                new_size,
                category,
            } => EventKind::Realloc {
                old_addr,
                old_size,
                new_addr,
                new_size,
                category,
                // A reading of the old half from before the clock's origin counts as the
                // session's start.
                released_ns: Some(self.calibration.to_ns(released).unwrap_or(0)),
            },
            Record::SpanEnter { name, id, label } => EventKind::SpanEnter {
                id,
                name: self.intern_static_name(name),
                label,
            },
            Record::SpanExit => EventKind::SpanExit { id: span },
            Record::OpBegin { name } => EventKind::OpBegin {
                name: self.name(name),
                output: 0,
                shape: None,
                dtype: None,
            },
            Record::OpEnd => EventKind::OpEnd,
            Record::DeviceAlloc {
                device,
                tensor,
                bytes,
                category,
            } => EventKind::Alloc {
                device: self.device(device),
                addr: tensor,
                size: bytes,
                category,
            },
            Record::DeviceFree {
                device,
                tensor,
                bytes,
            } => EventKind::Free {
                device: self.device(device),
                addr: tensor,
                size: bytes,
            },
            Record::SetCategory {
                device,
                key,
                category,
            } => EventKind::SetCategory {
                device: self.device(device),
                addr: key,
                category,
            },
            Record::Annotate {
                device,
                key,
                op,
                shape,
                dtype,
            } => EventKind::Annotate {
                device: self.device(device),
                addr: key,
                op: self.name(op),
                shape: shape.map(|id| self.shape(id)),
                dtype: dtype.map(|id| self.name(id)),
            },
            Record::PoolState { device, pool } => EventKind::PoolState {
                device: self.device(device),
                capacity: pool.capacity,
                reserved: pool.reserved,
                largest_free: pool.largest_free,
                fragmentation: pool.fragmentation,
            },
            Record::Oom {
                device,
                source,
                requested,
                largest_free,
            } => EventKind::Oom {
                device: self.device(device),
                source,
                requested,
                largest_free,
            },
            Record::DeviceMemory { kind, device, a, b } => {
                let device = self.device(device);
                return self.apply_device_memory(ts_ns, thread, span, kind, device, (a, b));
            }
        };
        let event = Event {
            ts_ns,
            thread,
            span,
            kind,
        };
        self.apply_event(&event);
        if sampled {
            self.apply_sample(index, &event);
        }
    }

    /// Applies `event` to the timeline and the allocation log.
    fn apply_event(&mut self, event: &Event) {
        self.timeline.apply(event);
        if let Some(log) = self.log.as_mut() {
            log_event(log, &self.device_names, event);
        }
    }

    /// Applies a device event with two plain words: a driver's pool figure, the device's
    /// memory before recording, or a step of a virtual-memory mapping, whose ledger says
    /// which physical allocations (keyed by handle, see [`PHYSICAL_KEY`]) it frees.
    fn apply_device_memory(
        &mut self,
        ts_ns: u64,
        thread: u32,
        span: u32,
        kind: DeviceMemoryKind,
        device: DeviceId,
        (a, b): (u64, u64),
    ) {
        let event = |kind| Event {
            ts_ns,
            thread,
            span,
            kind,
        };
        let freed = |handle: u64| {
            event(EventKind::Free {
                device,
                addr: handle | PHYSICAL_KEY,
                size: 0,
            })
        };
        let ledger = self.vmm.entry(device).or_default();
        let events = match kind {
            DeviceMemoryKind::Reserved => vec![event(EventKind::Reserved { device, bytes: a })],
            DeviceMemoryKind::Memory => vec![event(EventKind::DeviceMemory {
                device,
                in_use: a,
                total: b,
            })],
            DeviceMemoryKind::Map => {
                ledger.map(a, b);
                Vec::new()
            }
            DeviceMemoryKind::Unmap => {
                let mut ended = Vec::new();
                ledger.unmap(a, b, |handle| ended.push(freed(handle)));
                ended
            }
            DeviceMemoryKind::Release => {
                if ledger.release(a) {
                    vec![freed(a)]
                } else {
                    Vec::new()
                }
            }
        };
        for event in &events {
            self.apply_event(event);
        }
    }

    /// Applies a plain alloc of ring `index` and the free of the same block that follows it in
    /// the merged order ([`RawEvent::is_freed_by`]) with one call into the timeline.
    fn apply_pair(&mut self, index: usize, alloc: RawEvent, free: RawEvent) {
        let cursor = &mut self.cursors[index];
        let block = cursor.decoder.decode_short_lived(&alloc, &free);
        let Some(thread) = cursor.thread else {
            return;
        };
        let stats = &mut self.threads[thread as usize];
        stats.allocs += 1;
        stats.frees += 1;
        let at = |(ticks, span), calibration: &Calibration| At {
            ts: calibration.to_ns(ticks).unwrap_or(0),
            thread,
            span,
        };
        let (made, ended) = (
            at(block.made, &self.calibration),
            at(block.ended, &self.calibration),
        );
        self.newest_ns = self.newest_ns.max(made.ts).max(ended.ts);
        self.timeline
            .apply_alloc_then_free(made, ended, block.addr, block.size, block.category);
    }

    /// The first half `first` of a realloc of ring `index` whose second half is applied
    /// right after it: no release of its own, only what a lost realloc left pending ends.
    #[inline]
    fn release_adjacent(&mut self, index: usize, first: &RawEvent) {
        // Nearly always nothing is pending: then the stamp is not even converted.
        if !self.timeline.has_pending_reallocs() {
            return;
        }
        let (Some(thread), Some(release)) = (self.cursors[index].thread, first.realloc_release())
        else {
            return;
        };
        let ts = self.calibration.to_ns(release.ticks).unwrap_or(0);
        self.timeline.release_adjacent(thread, ts);
    }

    /// Applies the first half of a realloc of ring `index` as it is merged: the old address
    /// is given up now, though the realloc completes only with its second half.
    fn release(&mut self, index: usize, release: ReallocRelease) {
        let Some(thread) = self.cursors[index].thread else {
            return;
        };
        let event = Event {
            ts_ns: self.calibration.to_ns(release.ticks).unwrap_or(0),
            thread,
            span: release.span,
            kind: EventKind::ReallocRelease {
                old_addr: release.old_addr,
                old_size: release.old_size,
            },
        };
        self.timeline.apply(&event);
        if let Some(log) = self.log.as_mut() {
            log_event(log, &self.device_names, &event);
        }
    }

    /// Applies the call-site sample of the allocation `event` just applied: its stack is in
    /// ring `index`'s decoder.
    fn apply_sample(&mut self, index: usize, event: &Event) {
        let (addr, size, category) = match event.kind {
            EventKind::Alloc {
                addr,
                size,
                category,
                ..
            } => (addr, size, category),
            EventKind::Realloc {
                new_addr,
                new_size,
                category,
                ..
            } => (new_addr, new_size, category),
            _ => return,
        };
        let (pcs, walk) = self.cursors[index].decoder.stack();
        let stack = self.timeline.intern_stack(pcs, walk);
        self.timeline.apply(&Event {
            kind: EventKind::Sampled {
                addr,
                size,
                category,
                stack,
            },
            ..*event
        });
    }

    /// Closes recording, waits for writers in flight, merges everything and builds the profile.
    ///
    /// Writers in flight may be waiting for room in their ring, and a ring only gets room once
    /// its staging queue has room, so the stopper drains and merges (which frees room and wakes
    /// them) until it reads every ring idle, then drains and merges everything. While writers
    /// are still in flight it merges only events older than `lag_ns` before its clock reading,
    /// as the running collector does: a writer between its clock reading and its publish may
    /// still add an older event.
    fn stop(&mut self, lag_ns: u64) -> Profile {
        gate::close_recording();
        loop {
            let now = self.calibration.now_ns();
            let busy = REGISTRY.claimed().iter().any(|slot| slot.ring.is_busy());
            if !busy {
                break;
            }
            self.drain(0);
            self.merge_until(now.saturating_sub(lag_ns));
            std::thread::yield_now();
        }
        self.catch_up(u64::MAX);
        let end_ns = self.calibration.now_ns().max(self.newest_ns);
        let unattributed: [u64; RawKind::COUNT] = std::array::from_fn(|kind| {
            UNATTRIBUTED_DROPS[kind].swap(0, std::sync::atomic::Ordering::Relaxed)
        });
        let reentrant = capture::take_reentrant_drops();
        // Records, not events: heads of two-event records are counted by their second half
        // (see `charge_drops`).
        let records = |counts: &[u64; RawKind::COUNT]| -> u64 {
            (0..RawKind::COUNT as u8)
                .filter(|&kind| !RawKind::from_byte(kind).is_some_and(RawKind::is_head))
                .map(|kind| counts[usize::from(kind)])
                .sum()
        };
        let unattributed_total = records(&unattributed);
        let reentrant_total = records(&reentrant);
        if unattributed_total + reentrant_total > 0 {
            self.timeline
                .note_dropped(unattributed_total + reentrant_total);
        }
        self.timeline.set_capture_mode(session_capture_mode());
        let profile = self.timeline.profile(end_ns);
        // Re-entrant records have no ring to be charged to: they join the unattributed ones in
        // `dropped_by_kind` and have their own total.
        let loose = std::array::from_fn(|kind| unattributed[kind] + reentrant[kind]);
        let capture = CaptureStats {
            unattributed_dropped: unattributed_total,
            reentrant_dropped: reentrant_total,
            producer_waits: capture::take_waits(),
            ..self.capture_stats(loose)
        };
        let mut profile = self.with_capture(profile, capture);
        if let Some(Err((path, error))) = self.log.take().map(AllocLogWriter::finish) {
            profile.warnings.push(Warning::AllocLogIncomplete {
                path: path.display().to_string(),
                error: error.to_string(),
            });
        }
        profile
    }

    fn capture_stats(&self, unattributed: [u64; RawKind::COUNT]) -> CaptureStats {
        let mut stats = CaptureStats {
            mode: session_capture_mode(),
            ring_events: capture::ring_capacity(),
            unattributed_dropped: unattributed.iter().sum(),
            late_events: self.merge.late(),
            threads: self.threads.clone(),
            ..CaptureStats::default()
        };
        let sum = |field: fn(&ThreadCapture) -> u64| self.threads.iter().map(field).sum::<u64>();
        let loose = |kind: RawKind| unattributed[kind as usize];
        let loose_other = (0..RawKind::COUNT as u8)
            .filter_map(RawKind::from_byte)
            .filter(|kind| {
                !kind.is_head()
                    && !matches!(kind, RawKind::Alloc | RawKind::Free | RawKind::ReallocTo)
            })
            .map(loose)
            .sum::<u64>();
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

/// The capture mode of the running session.
fn session_capture_mode() -> CaptureMode {
    if capture::lossless() {
        CaptureMode::Lossless
    } else {
        CaptureMode::DropWhenFull
    }
}

/// Appends an applied event's allocation, free or change of category to the allocation log.
fn log_event(log: &mut AllocLogWriter, device_names: &[String], event: &Event) {
    let name = |device: DeviceId| {
        move || {
            device_names
                .get(usize::from(device.0))
                .cloned()
                .unwrap_or_else(|| format!("device:{}", device.0))
        }
    };
    let ts = event.ts_ns;
    match event.kind {
        EventKind::Alloc {
            device,
            addr,
            size,
            category,
        } => log.record(device.0, name(device), true, Some(category), ts, addr, size),
        EventKind::Free { device, addr, size } => {
            log.record(device.0, name(device), false, None, ts, addr, size)
        }
        EventKind::SetCategory {
            device,
            addr,
            category,
        } => log.set_category(device.0, name(device), category, ts, addr),
        // A realloc's old block is logged freed at its release, where the analysis gave its
        // address up; the realloc itself adds the new block.
        EventKind::ReallocRelease { old_addr, old_size } => {
            let cpu = DeviceId::CPU;
            log.record(cpu.0, name(cpu), false, None, ts, old_addr, old_size);
        }
        EventKind::Realloc {
            new_addr,
            new_size,
            category,
            ..
        } => {
            let cpu = DeviceId::CPU;
            log.record(
                cpu.0,
                name(cpu),
                true,
                Some(category),
                ts,
                new_addr,
                new_size,
            );
        }
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::alloc_log::AllocLog;
    use crate::model::Category;

    /// One thread's raw events as its ring holds them, over more than two merge chunks: in
    /// each round a short-lived block, a sampled one freed at once, a realloc's two halves, a
    /// block that lives on and one round's odd event, so pairs fall on chunk bounds too.
    fn one_threads_events() -> (Vec<RawEvent>, u64) {
        let mut events = Vec::new();
        let mut ticks = 0;
        let mut tick = || {
            ticks += 10;
            ticks
        };
        let (other, pcs) = (Category::Other, [0x4000_1000, 0x4000_2000, 0x4000_3000]);
        let rounds = MERGE_CHUNK as u64 * 2 / 9 + 3;
        for round in 0..rounds {
            let base = 0x10_0000 + round * 0x1000;
            events.push(RawEvent::alloc(tick(), 0, other, base, 48));
            events.push(RawEvent::free(tick(), 0, base, 48));
            let sampled = RawEvent::alloc(tick(), 0, other, base + 0x100, 4096);
            events.extend(RawEvent::sampled::<2, 1>(&pcs, false.into(), [sampled]));
            events.push(RawEvent::free(tick(), 0, base + 0x100, 4096));
            events.push(RawEvent::alloc(tick(), 0, other, base + 0x200, 16));
            let (released, ticks) = (tick(), tick());
            let realloc = RawEvent::realloc(
                released,
                ticks,
                0,
                other,
                (base + 0x200, 16),
                (base + 0x300, 64),
            );
            events.extend(realloc);
            if round % 2 == 1 {
                events.push(RawEvent::free(tick(), 0, base - 0x1000 + 0x300, 64));
            }
        }
        // Last, a short-lived block: the profile's duration ends with its free.
        events.push(RawEvent::alloc(tick(), 0, other, 0x8, 8));
        events.push(RawEvent::free(tick(), 0, 0x8, 8));
        (events, rounds)
    }

    /// What a merger makes of `events` on ring 0, with the allocation log at `log` if given.
    fn merged(
        events: &[RawEvent],
        log: Option<&std::path::Path>,
    ) -> (serde_json::Value, ThreadCapture) {
        let mut merger = Merger::new(Calibration::with_rate(0, 1.0), TimelineConfig::default());
        merger.timeline.set_sampling(1 << 20, "test");
        merger.log = log.map(AllocLogWriter::create);
        merger.cursors[0].thread = Some(0);
        merger.threads.push(ThreadCapture::default());
        merger.merge.push(0, events.iter().copied(), true);
        merger.merge_draining(u64::MAX, false);
        assert_eq!(merger.merge.staged_total(), 0);
        if let Some(log) = merger.log.take() {
            log.finish().unwrap();
        }
        let profile = merger.checkpoint(0);
        (
            serde_json::to_value(&profile).unwrap(),
            merger.threads[0].clone(),
        )
    }

    /// The merger's shortcuts for adjacent events change nothing it reports: the profile and
    /// the thread's counts are those of every event applied on its own (as with the allocation
    /// log, which takes no shortcut), and the log holds every allocation and free.
    #[test]
    fn the_shortcuts_report_what_every_event_on_its_own_reports() {
        let (events, rounds) = one_threads_events();
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("run.alloc");
        let (with_shortcuts, counted) = merged(&events, None);
        let (one_by_one, counted_one_by_one) = merged(&events, Some(&path));
        assert_eq!(counted, counted_one_by_one);
        // Each round's and the last block's.
        let (allocs, frees, reallocs) = (3 * rounds + 1, 2 * rounds + rounds / 2 + 1, rounds);
        assert_eq!(
            (counted.allocs, counted.frees, counted.reallocs),
            (allocs, frees, reallocs)
        );
        // Not `assert_eq!`: the two documents are long.
        assert!(with_shortcuts == one_by_one, "the profiles differ");
        let last = events.last().unwrap().ticks();
        assert_eq!(with_shortcuts["summary"]["duration_ns"], last);
        let sites = &with_shortcuts["sites"];
        assert!(
            sites.as_array().is_some_and(|sites| !sites.is_empty()),
            "{sites}"
        );

        let log = AllocLog::read(&path).unwrap();
        let logged = |alloc: bool| log.records.iter().filter(|r| r.alloc == alloc).count() as u64;
        assert_eq!(logged(true), allocs + reallocs);
        assert_eq!(logged(false), frees + reallocs);
    }

    /// A merger at 4 ticks a nanosecond with rings 0 and 1 owned by threads 0 and 1.
    fn two_ring_merger() -> Merger {
        let mut merger = Merger::new(Calibration::with_rate(0, 0.25), TimelineConfig::default());
        for ring in 0..2 {
            merger.cursors[ring].thread = Some(ring as u32);
            merger.threads.push(ThreadCapture::default());
        }
        merger
    }

    /// Two events in one nanosecond are merged in the order of their readings, whatever their
    /// rings: a free on ring 1 comes before the reuse of its address on ring 0 a few ticks
    /// later (ordered by nanoseconds, the tie went to ring 0 and the reuse was freed).
    #[test]
    fn events_in_one_nanosecond_merge_in_the_order_of_their_readings() {
        let mut merger = two_ring_merger();
        let other = Category::Other;
        merger.merge.push(
            1,
            [
                RawEvent::alloc(0, 0, other, 0x1000, 100),
                RawEvent::free(4, 0, 0x1000, 100),
            ],
            true,
        );
        merger
            .merge
            .push(0, [RawEvent::alloc(6, 0, other, 0x1000, 64)], true);
        merger.merge_draining(u64::MAX, false);
        let profile = serde_json::to_value(merger.checkpoint(0)).unwrap();
        let summary = &profile["summary"];
        assert_eq!(summary["final_live_bytes"], 64, "{summary}");
        assert_eq!(summary["reorder_repairs"], 0, "{summary}");
        assert_eq!(summary["unknown_frees"], 0, "{summary}");
    }

    /// An event merged after a newer one of another ring (its thread published it too late) is
    /// still applied, and the profile counts it and says what it may have done to a peak.
    #[test]
    fn a_straggler_is_applied_counted_and_warned_of() {
        let mut merger = two_ring_merger();
        // An allocation stamped `ticks` on `ring`, merged as far as it goes.
        let mut merge_alloc = |ring: usize, ticks: u64, addr: u64, size: u64| {
            let alloc = RawEvent::alloc(ticks, 0, Category::Other, addr, size);
            merger.merge.push(ring, [alloc], true);
            merger.merge_draining(u64::MAX, false);
            merger.checkpoint(0)
        };
        let clean = merge_alloc(0, 40, 0x1000, 64);
        assert_eq!(clean.capture.late_events, 0);
        assert!(clean.warnings.is_empty(), "{:?}", clean.warnings);
        let profile = merge_alloc(1, 8, 0x2000, 32);
        assert_eq!(profile.summary.final_live_bytes, 96);
        assert_eq!(profile.capture.late_events, 1);
        assert_eq!(profile.warnings, [Warning::LateEvents { events: 1 }]);
    }

    /// A watermark in nanoseconds releases every reading that converts to it or earlier, and
    /// none after.
    #[test]
    fn a_watermark_releases_the_readings_within_its_nanosecond_and_no_later() {
        let mut merger = two_ring_merger();
        let other = Category::Other;
        // Ticks 4 and 7 are nanosecond 1; tick 8 is nanosecond 2.
        let events = [4, 7, 8].map(|ticks| RawEvent::alloc(ticks, 0, other, 0x1000 * ticks, 8));
        merger.merge.push(0, events, true);
        assert_eq!(merger.merge_draining(1, false), 2);
        assert_eq!(merger.merge.staged_total(), 1);
        assert_eq!(merger.merge_draining(2, false), 1);
        assert_eq!(merger.merge.staged_total(), 0);
    }

    /// A backlog is four rings' worth, and a huge ring does not make it huge.
    #[test]
    fn the_backlog_is_four_rings_worth_up_to_a_bound() {
        assert_eq!(staged_backlog(1 << 12), 1 << 14);
        assert_eq!(staged_backlog(1 << 16), 1 << 18);
        assert_eq!(staged_backlog(1 << 24), 1 << 18);
        assert_eq!(staged_backlog(u64::MAX), 1 << 18);
    }

    #[test]
    fn quiet_rounds_double_the_sleep_up_to_a_bound_and_a_busy_one_resets_it() {
        let interval = Duration::from_millis(2);
        let ms = Duration::from_millis;
        let mut sleep = interval;
        let mut seen = Vec::new();
        for _ in 0..5 {
            sleep = next_sleep(sleep, interval, QUIET_DRAIN - 1);
            seen.push(sleep);
        }
        assert_eq!(seen, [ms(4), ms(8), ms(16), ms(16), ms(16)]);
        assert_eq!(next_sleep(sleep, interval, QUIET_DRAIN), interval);
    }
}
