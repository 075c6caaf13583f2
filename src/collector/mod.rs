//! The collector thread: drains every ring, merges threads into one time order and feeds the
//! [`Timeline`].
//!
//! Each ring is already in time order. An event is merged only once it is at or before a
//! watermark: the clock reading taken before the drain, less a short lag ([`MERGE_LAG`]; a
//! snapshot waits that long after its reading instead), and no later than any ring's hold: the last stamp drained from a ring
//! drained only partly or whose thread was caught between reading its clock and publishing (see
//! [`merge`]). A straggler that arrives later is still applied, the analysis settles what it
//! means from its timestamp, and the profile counts it ([`CaptureStats::late_events`]).

use std::path::PathBuf;
use std::thread::JoinHandle;
use std::time::Duration;

use crossbeam_channel::{Receiver, Sender, TryRecvError};

use crate::alloc_log::AllocLogWriter;
use crate::analysis::TimelineConfig;
use crate::capture::clock::Calibration;
use crate::capture::{self, oom, wake};
use crate::checkpoint::{CheckpointConfig, Checkpointer};
use crate::profile::{Profile, Warning};

mod apply;
mod finish;
mod merge;
mod merger;
mod vmm;

use finish::session_capture_mode;
use merger::Merger;

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
pub(super) const QUIET_DRAIN: u64 = 1024;
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

#[cfg(test)]
mod tests {
    use super::merger::{staged_backlog, MERGE_CHUNK};
    use super::*;
    use crate::alloc_log::AllocLog;
    use crate::capture::raw::RawEvent;
    use crate::model::Category;
    use crate::profile::ThreadCapture;

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
