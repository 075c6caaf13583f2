//! The hook side of capture: per-thread state and the functions user threads call.
//!
//! The per-thread state is one `const`-initialised thread-local of a type with no destructor,
//! so reading it never allocates or registers anything, even during thread exit. It holds the
//! thread's [`ThreadState`] and the re-entry flag `in_push`, set around every push: a signal
//! handler that records while the interrupted code is inside a push would be a second producer
//! on the thread's ring, so it sees the flag and counts its events instead (`REENTRANT_DROPS`).

use std::cell::Cell;
use std::sync::atomic::{compiler_fence, AtomicU64, AtomicUsize};

use super::frames::StackBounds;
use super::gate::{self, GATE_EPOCH, RECORDING};
use super::raw::{RawEvent, RawKind};
use super::registry::REGISTRY;
use super::ring::{Pushed, Ring, WhenFull};
use super::sample;
use super::stack;
use super::sync::{AtomicBool, Ordering};
use super::{clock, lifecycle, unwind, wake};
use crate::model::CategoryScope;
use crate::model::Unwinder;

mod device;
mod heap;
mod scopes;

// The CUDA callback is the only caller of the driver-memory records.
#[cfg_attr(not(feature = "cuda"), allow(unused_imports))]
pub(crate) use device::{
    collector_serves, record_device_alloc, record_device_alloc_in_scope, record_device_free,
    record_device_memory, record_oom, record_pool_state, record_set_category,
};
pub(crate) use heap::{record_alloc, record_free, record_realloc};
pub(crate) use scopes::{
    mark_internal_thread, paused_here, record_annotation, record_op_begin, record_op_end,
    scope_category, span_enter, span_exit, with_recording_paused, SpanRestore,
};

/// Default events per ring: 64 Ki events, 2 MiB per recording thread (touched as it fills, and
/// all of it once the ring has wrapped). Lossless capture waits for the collector when a ring is
/// full, so a bigger ring buys fewer waits, not fewer losses; see `BENCHMARKS.md`.
pub(crate) const DEFAULT_RING_EVENTS: usize = 1 << 16;

/// The session's ring size, in events.
static RING_EVENTS: AtomicUsize = AtomicUsize::new(DEFAULT_RING_EVENTS);

/// Sets the capacity of rings claimed from now on (a power of two).
pub(crate) fn set_ring_capacity(events: usize) {
    RING_EVENTS.store(events, Ordering::Relaxed);
}

/// The session's ring size: what a newly claimed ring (or an empty one kept from an earlier
/// session) is given.
pub(crate) fn ring_capacity() -> u64 {
    RING_EVENTS.load(Ordering::Relaxed) as u64
}

/// Events dropped without a ring to count them in (no free ring, thread already exiting), by
/// [`RawKind`]. Rare, so a shared read-modify-write is fine here.
pub(crate) static UNATTRIBUTED_DROPS: [AtomicU64; RawKind::COUNT] =
    [const { AtomicU64::new(0) }; RawKind::COUNT];

/// Events a thread tried to record while it was already inside a push (a signal handler that
/// allocates), by [`RawKind`]. Counted, never written: the interrupted push owns the ring.
static REENTRANT_DROPS: [AtomicU64; RawKind::COUNT] = [const { AtomicU64::new(0) }; RawKind::COUNT];

/// Events dropped because every ring the session may use was owned by a live thread (also
/// counted in [`UNATTRIBUTED_DROPS`]).
static TABLE_FULL_DROPS: AtomicU64 = AtomicU64::new(0);

/// Times a producer found its ring full and waited for the collector.
static WAITS: AtomicU64 = AtomicU64::new(0);

/// Whether a full ring waits for the collector (lossless) rather than dropping. Set by the
/// session before it opens the gate.
static LOSSLESS: AtomicBool = AtomicBool::new(true);

/// Whether the collector drains rings now, so a producer waiting for room will get it. Set by
/// the session before the collector starts; cleared when the collector ends (however it ends)
/// and in a forked child.
static COLLECTOR_SERVING: AtomicBool = AtomicBool::new(false);

/// `ThreadState::ring` before the thread has claimed a ring.
const NO_RING: u16 = 0;
/// `ThreadState::ring` after the thread handed its ring back (it is exiting).
const RETIRED: u16 = u16::MAX;
/// `ThreadState::ring` while every ring is taken (see `ThreadState::full_generation`).
const TABLE_FULL: u16 = u16::MAX - 1;

/// One thread's capture state. `Copy` and destructor-free by design.
#[derive(Debug, Clone, Copy)]
struct ThreadState {
    /// `NO_RING`, `RETIRED`, `TABLE_FULL`, or the claimed ring's index + 1.
    ring: u16,
    /// Registry generation seen when the table was full; a claim is retried once it changes.
    full_generation: u32,
    /// Set while highwater itself runs on this thread: allocations pass straight through.
    paused: bool,
    /// Set on the collector thread: it never records.
    internal: bool,
    /// The innermost open span (`0`: none).
    span: u32,
    /// Its name (address and length of a `&'static str`) and label, to announce it.
    span_name: (usize, u32),
    span_label: u8,
    /// The [`GATE_EPOCH`] in which the collector learnt of the innermost span (`0`: never).
    announced: u32,
    /// Sequence number of this thread's last span.
    last_span: u32,
    /// What the open spans say about categories.
    scope: CategoryScope,
}

impl ThreadState {
    const NEW: ThreadState = ThreadState {
        ring: NO_RING,
        full_generation: 0,
        paused: false,
        internal: false,
        span: 0,
        span_name: (0, 0),
        span_label: 0,
        announced: 0,
        last_span: 0,
        scope: CategoryScope {
            named: None,
            step: None,
        },
    };
}

/// Everything capture keeps per thread.
#[derive(Debug)]
struct PerThread {
    state: Cell<ThreadState>,
    /// Set from before a push touches the ring (or claims one) until after it published: a
    /// record that finds it set interrupted that push on this same thread. A single byte,
    /// written apart from `state`, so the interrupted code never writes back a stale copy of it.
    in_push: Cell<bool>,
    /// Bytes left before the next call-site sample (see `sample`), capped at the size from
    /// which every allocation is sampled; valid in `sample_epoch`.
    sample_left: Cell<u64>,
    /// The rest of the drawn distance, beyond the cap.
    sample_beyond: Cell<u64>,
    /// The [`GATE_EPOCH`] the countdown was drawn in: a new session draws afresh, with its `R`.
    sample_epoch: Cell<u32>,
    /// The sampling generator's state (`0`: not seeded yet).
    sample_rng: Cell<u64>,
    /// This thread's stack mapping, for the stack walk.
    stack: Cell<StackBounds>,
}

thread_local! {
    static THREAD: PerThread = const {
        PerThread {
            state: Cell::new(ThreadState::NEW),
            in_push: Cell::new(false),
            sample_left: Cell::new(0),
            sample_beyond: Cell::new(0),
            sample_epoch: Cell::new(0),
            sample_rng: Cell::new(0),
            stack: Cell::new(StackBounds::UNKNOWN),
        }
    };
}

const _: () = assert!(!std::mem::needs_drop::<PerThread>());

/// Reads this thread's state; `None` only if the thread-local is unreachable.
#[inline(always)]
fn state() -> Option<ThreadState> {
    THREAD.try_with(|thread| thread.state.get()).ok()
}

#[inline(always)]
fn set_state(state: ThreadState) {
    let _ = THREAD.try_with(|thread| thread.state.set(state));
}

/// Counts events lost without a ring to charge them to.
#[cold]
fn drop_unattributed(kinds: &[RawKind]) {
    for kind in kinds {
        UNATTRIBUTED_DROPS[*kind as usize].fetch_add(1, Ordering::Relaxed);
    }
}

/// Counts events lost because every ring was owned by a live thread.
#[cold]
fn drop_table_full(kinds: &[RawKind]) {
    drop_unattributed(kinds);
    let records = kinds.iter().filter(|kind| !kind.is_head()).count();
    TABLE_FULL_DROPS.fetch_add(records as u64, Ordering::Relaxed);
}

/// Counts events recorded from inside another push on the same thread.
#[cold]
fn drop_reentrant(kinds: &[RawKind]) {
    for kind in kinds {
        REENTRANT_DROPS[*kind as usize].fetch_add(1, Ordering::Relaxed);
    }
}

/// The session's answers to a producer whose ring lacks room.
struct SessionPolicy;

impl WhenFull for SessionPolicy {
    #[inline]
    fn lossless(&self) -> bool {
        LOSSLESS.load(Ordering::Relaxed)
    }

    fn collector_serves(&self) -> bool {
        COLLECTOR_SERVING.load(Ordering::Acquire) && lifecycle::is_owner_process()
    }

    fn wake_collector(&self) {
        wake::ring_collector();
    }

    fn note_wait(&self) {
        WAITS.fetch_add(1, Ordering::Relaxed);
    }

    fn fit_storage(&self, ring: &Ring) {
        let wanted = ring_capacity();
        if ring.capacity() != wanted && ring.is_empty() {
            install_storage(ring, wanted);
        }
    }
}

/// Gives `ring` storage for `capacity` events and frees what it had. Returns `false` (and
/// keeps the old storage) when the system refuses the mapping.
fn install_storage(ring: &Ring, capacity: u64) -> bool {
    let Some(slots) = lifecycle::alloc_ring_storage(capacity) else {
        return false;
    };
    // SAFETY: the caller owns the ring and is not writing slots, and the ring is empty (checked
    // by the caller, or a claimed ring, which the collector drained before freeing it); `slots`
    // holds `capacity` zeroed slots, a power of two (the session checked the setting).
    if let Some((old, old_capacity)) = unsafe { ring.replace_storage(slots, capacity) } {
        // SAFETY: `old` came from `alloc_ring_storage(old_capacity)`, and nobody reads it any
        // more (`replace_storage`'s contract).
        unsafe { lifecycle::free_ring_storage(old, old_capacity) };
    }
    true
}

/// Writes the events built by `build` into this thread's ring, or counts them as dropped.
/// `kinds` names the events, for counting them when no ring can take them. `build` gets the
/// thread's state and a clock reading taken once the ring has room.
///
/// Every event reads the clock afresh. Cross-thread address reuse needs an allocation's stamp
/// not earlier than the allocation and a free's not later than the free, and the analysis
/// judges a free older than the live block's allocation to belong to an earlier life: a free
/// that reused an older reading could predate the allocation another thread made of the block
/// it frees, and would be ignored.
///
/// Returns whether the events are in the ring.
#[inline(always)]
fn emit<const N: usize>(
    kinds: [RawKind; N],
    build: impl FnOnce(ThreadState, u64) -> [RawEvent; N],
) -> bool {
    if !RECORDING.load(Ordering::Relaxed) {
        return false;
    }
    // Small closures, one per thread-local access, so each inlines (one closure around the
    // whole push would be compiled out of line).
    let entered = THREAD.try_with(|thread| !thread.in_push.replace(true));
    match entered {
        Ok(true) => {}
        Ok(false) => {
            drop_reentrant(&kinds);
            return false;
        }
        Err(_) => {
            drop_unattributed(&kinds);
            return false;
        }
    }
    // A handler that ran before the flag was set has finished its push; one that runs after
    // sees the flag. The fences keep the compiler from moving the flag across the ring accesses.
    compiler_fence(Ordering::SeqCst);
    let recorded = push_now(kinds, build);
    compiler_fence(Ordering::SeqCst);
    let _ = THREAD.try_with(|thread| thread.in_push.set(false));
    recorded
}

/// Finds (or claims) this thread's ring and pushes into it; runs with `in_push` set.
#[inline(always)]
fn push_now<const N: usize>(
    kinds: [RawKind; N],
    build: impl FnOnce(ThreadState, u64) -> [RawEvent; N],
) -> bool {
    let Some(mut current) = state() else {
        drop_unattributed(&kinds);
        return false;
    };
    let index = match destination(&mut current) {
        Destination::Ring(index) => index,
        Destination::Nowhere => return false,
        Destination::Unattributed => {
            drop_unattributed(&kinds);
            return false;
        }
        Destination::TableFull => {
            drop_table_full(&kinds);
            return false;
        }
    };
    let ring = &REGISTRY.slots()[index].ring;
    // SAFETY: this thread claimed ring `index` (its state says so) and has not retired it, so it
    // is the ring's only producer (`in_push` keeps a signal handler on this thread out);
    // `claim_ring` installed storage before recording the claim.
    let pushed = unsafe {
        ring.push(&RECORDING, kinds, &SessionPolicy, || {
            build(current, clock::ticks())
        })
    };
    pushed == Pushed::Recorded
}

/// Where this thread's events go now.
enum Destination {
    /// The ring of this index, which the thread owns.
    Ring(usize),
    /// Nowhere, uncounted: highwater itself runs on this thread.
    Nowhere,
    /// Nowhere: no ring can take them (the thread is exiting); count them.
    Unattributed,
    /// Nowhere: every ring the session may use is owned by a live thread; count them, and say
    /// in the profile which setting raises the limit.
    TableFull,
}

/// Finds (or claims) the ring of a thread in state `current`, and announces its innermost span
/// there if the collector has not seen it yet. Runs with `in_push` set, before the push enters.
#[inline(always)]
fn destination(current: &mut ThreadState) -> Destination {
    if current.paused || current.internal {
        return Destination::Nowhere;
    }
    let index = match current.ring {
        NO_RING | TABLE_FULL => match claim_ring(current) {
            Some(index) => index,
            None => return Destination::TableFull,
        },
        RETIRED => return Destination::Unattributed,
        claimed => usize::from(claimed - 1),
    };
    if current.span != 0 && current.announced != GATE_EPOCH.load(Ordering::Relaxed) {
        announce_span(current, index);
    }
    Destination::Ring(index)
}

/// Records an entry for the thread's innermost span, opened before this session's gate opened
/// (the collector never saw it), as a top-level span (cold path: once per such span).
#[cold]
fn announce_span(current: &mut ThreadState, index: usize) {
    current.announced = GATE_EPOCH.load(Ordering::Relaxed);
    set_state(*current);
    let (name, len) = current.span_name;
    let ring = &REGISTRY.slots()[index].ring;
    // SAFETY: as in `emit`: this thread owns ring `index`.
    let _: Pushed = unsafe {
        ring.push(&RECORDING, [RawKind::SpanEnter], &SessionPolicy, || {
            [RawEvent {
                ticks: clock::ticks(),
                kind: RawKind::SpanEnter as u8,
                flags: current.span_label,
                device: 0,
                span: 0,
                a: name as u64,
                b: u64::from(len) | (u64::from(current.span) << 32),
            }]
        })
    };
}

/// Claims a ring for this thread (cold path: once per thread). Returns its index.
#[cold]
fn claim_ring(current: &mut ThreadState) -> Option<usize> {
    if current.ring == TABLE_FULL && current.full_generation == REGISTRY.generation() {
        return None;
    }
    // Whatever the claim calls (mmap, pthread_setspecific) must not record into a ring that
    // is not ours yet.
    set_state(ThreadState {
        paused: true,
        ..*current
    });
    let generation = REGISTRY.generation();
    let claimed = claim_free_slot().and_then(|index| {
        let ring = &REGISTRY.slots()[index].ring;
        let capacity = ring_capacity();
        // A ring reused from an earlier session gets this session's size.
        if ring.capacity() != capacity && !install_storage(ring, capacity) && !ring.has_storage() {
            // Without storage the slot is useless to us, and the collector skips slots
            // without storage, so it must go back or it is lost to every thread.
            REGISTRY.abandon(index);
            return None;
        }
        ring.reset_producer();
        REGISTRY.slots()[index].set_owner_tid(lifecycle::os_thread_id());
        lifecycle::watch_thread_exit(index);
        Some(index)
    });
    match claimed {
        Some(index) => current.ring = index as u16 + 1,
        None => {
            current.ring = TABLE_FULL;
            current.full_generation = generation;
        }
    }
    set_state(*current);
    claimed
}

/// Longest single sleep of a thread waiting for a free ring: it looks at the collector again
/// this often.
const FREE_RING_RECHECK: std::time::Duration = std::time::Duration::from_millis(10);

/// Claims a free slot. With every slot taken and lossless capture, a thread waits while slots
/// of exited threads await their last drain ([`Registry::claim_or_wait`]): threads that start
/// and exit faster than the collector sleeps would otherwise find the table full and drop their
/// events. The wait ends when the collector stops serving (the session stopped, a forked child).
///
/// [`Registry::claim_or_wait`]: super::registry::Registry::claim_or_wait
fn claim_free_slot() -> Option<usize> {
    REGISTRY.claim_or_wait(
        || {
            let waits = SessionPolicy.lossless() && collector_serves();
            if waits {
                wake::ring_collector();
            }
            waits
        },
        FREE_RING_RECHECK,
    )
}

/// Makes this process the session's owner and has thread exit hand rings back and a fork
/// stop recording in the child. Called when a session starts.
pub(crate) fn install_process_handlers() {
    lifecycle::install(lifecycle::Callbacks {
        thread_exit: retire_current_thread,
        forked_child: stop_in_forked_child,
    });
}

/// A forked child never records: its collector thread did not survive the fork, so nobody may
/// wait for one either. Async-signal-safe (atomics only): it runs in an `atfork` handler.
fn stop_in_forked_child() {
    gate::close_in_forked_child();
    unwind::forget_other_threads_after_fork();
    // Only the forking thread survives, and it is not inside a push: no ring is busy, whatever
    // the parent's threads were doing.
    for slot in REGISTRY.claimed() {
        slot.ring.clear_busy_after_fork();
    }
    collector_stopped();
}

/// Called at thread exit (from the thread-exit watcher) with the ring the thread claimed.
fn retire_current_thread(index: usize) {
    if let Some(mut current) = state() {
        current.ring = RETIRED;
        set_state(current);
    }
    REGISTRY.retire(index);
}

/// Prepares capture for a session, before its collector starts and its gate opens: sets the
/// mode, marks the collector as serving, clears the session's counters and makes every
/// producer's next push re-read its ring (so a ring kept from an earlier session is resized).
pub(crate) fn begin_session(
    lossless: bool,
    sample_bytes: u64,
    max_threads: usize,
    unwinder: Option<Unwinder>,
) {
    // The unwind tables for stacks that frame pointers cannot walk, over the modules loaded
    // now (the collector brings them up to date as modules are loaded and unloaded).
    unwind::choose(unwinder);
    if sample_bytes != 0 {
        stack::prepare();
    }
    LOSSLESS.store(lossless, Ordering::Relaxed);
    REGISTRY.set_limit(max_threads);
    TABLE_FULL_DROPS.store(0, Ordering::Relaxed);
    // Countdowns are drawn afresh in the epoch the gate opens next, with this mean.
    sample::set_mean_bytes(sample_bytes);
    for counter in UNATTRIBUTED_DROPS.iter().chain(&REENTRANT_DROPS) {
        counter.store(0, Ordering::Relaxed);
    }
    WAITS.store(0, Ordering::Relaxed);
    // No producer pushes while the gate is closed, so these stores race with nobody. Slots
    // past the bound were never claimed.
    for slot in REGISTRY.claimed() {
        slot.ring.reset_producer();
    }
    COLLECTOR_SERVING.store(true, Ordering::Release);
}

/// The collector no longer drains: parked producers wake, see it and stop waiting. Called when
/// the collector ends (or never started) and in a forked child.
pub(crate) fn collector_stopped() {
    COLLECTOR_SERVING.store(false, Ordering::SeqCst);
    // Stop serving, then read `parked`: the other half of `SoundPark`'s pair.
    super::sync::fence(Ordering::SeqCst);
    for slot in REGISTRY.claimed() {
        slot.ring.release_parked();
    }
}

/// Whether producers wait for room in this session.
pub(crate) fn lossless() -> bool {
    LOSSLESS.load(Ordering::Relaxed)
}

/// Takes the session's counts of events dropped by re-entry, by [`RawKind`].
pub(crate) fn take_reentrant_drops() -> [u64; RawKind::COUNT] {
    std::array::from_fn(|kind| REENTRANT_DROPS[kind].swap(0, Ordering::Relaxed))
}

/// Takes the session's count of producer waits for room.
pub(crate) fn take_waits() -> u64 {
    WAITS.swap(0, Ordering::Relaxed)
}

/// Events dropped because every ring was owned by a live thread, since the session began.
pub(crate) fn table_full_drops() -> u64 {
    TABLE_FULL_DROPS.load(Ordering::Relaxed)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Drop mode, no collector: a full ring drops at once.
    struct Dropping;

    impl WhenFull for Dropping {
        fn lossless(&self) -> bool {
            false
        }
        fn collector_serves(&self) -> bool {
            false
        }
        fn wake_collector(&self) {}
        fn note_wait(&self) {}
        fn fit_storage(&self, _ring: &Ring) {}
    }

    fn push(ring: &Ring, ticks: u64) -> Pushed {
        let gate = AtomicBool::new(true);
        let event = RawEvent {
            ticks,
            ..RawEvent::default()
        };
        // SAFETY: this test is the ring's only producer; storage is installed.
        unsafe { ring.push(&gate, [RawKind::Alloc], &Dropping, || [event]) }
    }

    fn drain(ring: &Ring) -> Vec<u64> {
        let mut out = Vec::new();
        // SAFETY: this test is the ring's only consumer; storage is installed.
        unsafe { ring.drain(&mut out) };
        out.into_iter().map(|event| event.ticks).collect()
    }

    /// Issue 10, item 4: a ring reused with another size used to keep its old storage while the
    /// profile reported the new size. Replaced, it holds exactly the new number of events.
    #[test]
    fn a_reused_ring_holds_exactly_the_new_size() {
        let ring = Ring::new();
        assert!(install_storage(&ring, 1 << 16));
        for ticks in 0..5000 {
            assert_eq!(push(&ring, ticks), Pushed::Recorded);
        }
        assert_eq!(drain(&ring).len(), 5000);
        assert!(ring.is_empty());
        assert!(install_storage(&ring, 1024));
        assert_eq!(ring.capacity(), 1024);
        for ticks in 0..1024 {
            assert_eq!(push(&ring, ticks), Pushed::Recorded, "event {ticks}");
        }
        assert_eq!(
            push(&ring, 1024),
            Pushed::Dropped,
            "a 1024-event ring took 1025"
        );
        assert_eq!(drain(&ring), (0..1024).collect::<Vec<_>>());
        // And it grows back.
        assert!(install_storage(&ring, 1 << 12));
        for ticks in 0..4096 {
            assert_eq!(push(&ring, ticks), Pushed::Recorded, "event {ticks}");
        }
        assert_eq!(drain(&ring), (0..4096).collect::<Vec<_>>());
    }
}
