//! The hook side of capture: per-thread state and the functions user threads call.
//!
//! The per-thread state is one `const`-initialised thread-local of a type with no destructor,
//! so reading it never allocates or registers anything, even during thread exit. It holds the
//! thread's [`ThreadState`] and the re-entry flag `in_push`, set around every push: a signal
//! handler that records while the interrupted code is inside a push would be a second producer
//! on the thread's ring, so it sees the flag and counts its events instead (`REENTRANT_DROPS`).

use std::cell::Cell;
use std::sync::atomic::{compiler_fence, AtomicU64, AtomicUsize};

use super::frames::{StackBounds, Walked};
use super::gate::{self, Sound, GATE_EPOCH, RECORDING};
use super::raw::{DeviceMemoryKind, PoolReport, RawEvent, RawKind};
use super::registry::REGISTRY;
use super::ring::{Pushed, Ring, SoundPark, WhenFull};
use super::sample;
use super::stack;
use super::sync::{AtomicBool, Ordering};
use super::{clock, lifecycle, unwind, wake};
use crate::model::OomSource;
use crate::model::Unwinder;
use crate::model::{Category, CategoryScope, SpanLabel};

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

/// Whether the allocation of `size` bytes about to be recorded is a call-site sample. The fast
/// path is a subtraction and a branch (and a check that the countdown belongs to this gate
/// opening, whose epoch shares a cache line with the gate just read).
#[inline(always)]
fn sample_due(size: usize) -> bool {
    let size = size as u64;
    THREAD
        .try_with(|thread| {
            let left = thread.sample_left.get();
            if size < left && thread.sample_epoch.get() == GATE_EPOCH.load(Ordering::Relaxed) {
                thread.sample_left.set(left - size);
                false
            } else {
                sample_due_slow(thread, size)
            }
        })
        .unwrap_or(false)
}

/// The capped countdown ran out, or was drawn in an earlier gate opening (cold path; at most
/// once per `4R` bytes when nothing is sampled).
#[cold]
#[inline(never)]
fn sample_due_slow(thread: &PerThread, size: u64) -> bool {
    let mut rng = thread.sample_rng.get();
    if rng == 0 {
        rng = sample::seed(thread as *const PerThread as usize, clock::ticks());
    }
    let epoch = GATE_EPOCH.load(Ordering::Relaxed);
    let left = (thread.sample_epoch.get() == epoch).then(|| {
        thread
            .sample_left
            .get()
            .saturating_add(thread.sample_beyond.get())
    });
    thread.sample_epoch.set(epoch);
    let step = sample::step(&mut rng, sample::mean_bytes(), left, size);
    thread.sample_left.set(step.left);
    thread.sample_beyond.set(step.beyond);
    thread.sample_rng.set(rng);
    step.sampled
}

/// Walks this thread's stack for a sample; `None` where nothing would be recorded anyway
/// (highwater's own work, the collector thread).
#[cold]
#[inline(never)]
fn walk_for_sample() -> Option<Walked> {
    let current = state()?;
    if current.paused || current.internal {
        return None;
    }
    THREAD.try_with(|thread| stack::walk(&thread.stack)).ok()
}

/// Records a sampled record (`T` events built by `build`) with its stack, as one unit sized
/// for the stack: `N - T` stack parts of two addresses each.
#[inline(always)]
fn emit_sampled<const N: usize, const T: usize>(
    kinds: [RawKind; T],
    walked: &Walked,
    build: impl FnOnce(ThreadState, u64) -> [RawEvent; T],
) {
    let pcs = &walked.pcs[..walked.len];
    emit(RawEvent::sampled_kinds::<N, T>(kinds), |current, ticks| {
        RawEvent::sampled::<N, T>(pcs, walked.walk(), build(current, ticks))
    });
}

/// Records a sampled allocation in the smallest unit that holds its stack: 1, 4, 8, 16 or 32
/// stack parts (`stack::MAX_FRAMES` is 64 addresses).
#[cold]
#[inline(never)]
fn record_sampled(kinds: [RawKind; 1], build: impl FnOnce(ThreadState, u64) -> [RawEvent; 1]) {
    const _: () = assert!(super::frames::MAX_FRAMES == 64);
    let Some(walked) = walk_for_sample() else {
        emit(kinds, build);
        return;
    };
    match walked.len.div_ceil(2) {
        0..=1 => emit_sampled::<2, 1>(kinds, &walked, build),
        2..=4 => emit_sampled::<5, 1>(kinds, &walked, build),
        5..=8 => emit_sampled::<9, 1>(kinds, &walked, build),
        9..=16 => emit_sampled::<17, 1>(kinds, &walked, build),
        _ => emit_sampled::<33, 1>(kinds, &walked, build),
    }
}

/// Records a heap allocation that the inner allocator just made.
#[inline(always)]
pub(crate) fn record_alloc(addr: usize, size: usize) {
    if !RECORDING.load(Ordering::Relaxed) {
        return;
    }
    let build = |current: ThreadState, ticks| {
        [RawEvent::alloc(
            ticks,
            current.span,
            current.scope.category(),
            addr as u64,
            size as u64,
        )]
    };
    if sample_due(size) {
        return record_sampled([RawKind::Alloc], build);
    }
    emit([RawKind::Alloc], build);
}

/// Records a heap free that is about to happen.
#[inline(always)]
pub(crate) fn record_free(addr: usize, size: usize) {
    emit([RawKind::Free], |current, ticks| {
        [RawEvent::free(
            ticks,
            current.span,
            addr as u64,
            size as u64,
        )]
    });
}

/// Runs `realloc`, the inner allocator's realloc of the `old_size`-byte block at `old_addr` to
/// `new_size` bytes, and records it as one unit if it succeeds. Returns what `realloc` returned.
///
/// The old half is stamped before the inner call frees the old block, so it sorts before any
/// reuse of that address by another thread; the new half is stamped as the call returns
/// (before any wait for room, which would sort it after such a reuse). Both readings are taken
/// with the thread's ring already marked busy, and it stays busy through the inner call until
/// the unit is published: the collector holds the merge at this ring's last stamp meanwhile, so
/// however long the thread takes (descheduled, or waiting for room) the reuse cannot be merged
/// first. `in_push` is set for the same span, so a signal handler that records meanwhile is
/// counted as re-entrant rather than writing events stamped after this unit's ahead of it.
/// The new block counts down the sampling distance with its whole size, like an allocation.
#[inline(always)]
pub(crate) fn record_realloc(
    old_addr: usize,
    old_size: usize,
    new_size: usize,
    realloc: impl FnOnce() -> *mut u8,
) -> *mut u8 {
    if !RECORDING.load(Ordering::Relaxed) {
        return realloc();
    }
    if sample_due(new_size) {
        return record_sampled_realloc(old_addr, old_size, new_size, realloc);
    }
    realloc_as_unit(
        REALLOC,
        |events| events,
        (old_addr, old_size),
        new_size,
        realloc,
    )
}

/// The kinds of a realloc's two halves.
const REALLOC: [RawKind; 2] = [RawKind::ReallocFrom, RawKind::ReallocTo];

/// A sampled realloc: its stack is walked before the inner call (the stack is the same
/// after it), then recorded as [`record_sampled`] records an allocation.
#[cold]
#[inline(never)]
fn record_sampled_realloc(
    old_addr: usize,
    old_size: usize,
    new_size: usize,
    realloc: impl FnOnce() -> *mut u8,
) -> *mut u8 {
    let old = (old_addr, old_size);
    let Some(walked) = walk_for_sample() else {
        return realloc_as_unit(REALLOC, |events| events, old, new_size, realloc);
    };
    /// The realloc's unit with `N - 2` stack parts.
    #[inline(always)]
    fn sampled<const N: usize>(
        walked: &Walked,
        old: (usize, usize),
        new_size: usize,
        realloc: impl FnOnce() -> *mut u8,
    ) -> *mut u8 {
        let pcs = &walked.pcs[..walked.len];
        let kinds = RawEvent::sampled_kinds::<N, 2>(REALLOC);
        let wrap = |events| RawEvent::sampled::<N, 2>(pcs, walked.walk(), events);
        realloc_as_unit(kinds, wrap, old, new_size, realloc)
    }
    match walked.len.div_ceil(2) {
        0..=1 => sampled::<3>(&walked, old, new_size, realloc),
        2..=4 => sampled::<6>(&walked, old, new_size, realloc),
        5..=8 => sampled::<10>(&walked, old, new_size, realloc),
        9..=16 => sampled::<18>(&walked, old, new_size, realloc),
        _ => sampled::<34>(&walked, old, new_size, realloc),
    }
}

/// Runs `realloc` inside this thread's ring (busy, and `in_push` set) and records it as the
/// unit `kinds`: the realloc's two halves, which `wrap` places in the unit.
#[inline(always)]
fn realloc_as_unit<const N: usize>(
    kinds: [RawKind; N],
    wrap: impl FnOnce([RawEvent; 2]) -> [RawEvent; N],
    (old_addr, old_size): (usize, usize),
    new_size: usize,
    realloc: impl FnOnce() -> *mut u8,
) -> *mut u8 {
    /// Counts the unit as `drop` says if the realloc happened.
    fn counted<const N: usize>(
        moved: *mut u8,
        kinds: &[RawKind; N],
        drop: fn(&[RawKind]),
    ) -> *mut u8 {
        if !moved.is_null() {
            drop(kinds);
        }
        moved
    }
    let entered = THREAD.try_with(|thread| !thread.in_push.replace(true));
    match entered {
        Ok(true) => {}
        Ok(false) => return counted(realloc(), &kinds, drop_reentrant),
        Err(_) => return counted(realloc(), &kinds, drop_unattributed),
    }
    /// Clears `in_push` however the realloc ends.
    struct LeavePush;
    impl Drop for LeavePush {
        #[inline(always)]
        fn drop(&mut self) {
            compiler_fence(Ordering::SeqCst);
            let _ = THREAD.try_with(|thread| thread.in_push.set(false));
        }
    }
    let _in_push = LeavePush;
    compiler_fence(Ordering::SeqCst);
    let Some(mut current) = state() else {
        return counted(realloc(), &kinds, drop_unattributed);
    };
    let index = match destination(&mut current) {
        Destination::Ring(index) => index,
        Destination::Nowhere => return realloc(),
        Destination::Unattributed => return counted(realloc(), &kinds, drop_unattributed),
        Destination::TableFull => return counted(realloc(), &kinds, drop_table_full),
    };
    let ring = &REGISTRY.slots()[index].ring;
    if !ring.enter::<Sound>(&RECORDING) {
        return realloc();
    }
    /// Leaves the ring however the realloc ends (failed, dropped, recorded).
    struct Leave<'a>(&'a Ring);
    impl Drop for Leave<'_> {
        #[inline(always)]
        fn drop(&mut self) {
            self.0.leave();
        }
    }
    let _busy = Leave(ring);
    let released = clock::ticks();
    let moved = realloc();
    if moved.is_null() {
        return moved;
    }
    let returned = clock::ticks();
    // SAFETY: as in `push_now` (this thread owns ring `index`, storage installed), and this
    // thread entered the ring above; `_busy` leaves it after the push.
    let _: Pushed = unsafe {
        ring.push_entered::<N, SoundPark>(kinds, &SessionPolicy, || {
            wrap(RawEvent::realloc(
                released,
                returned,
                current.span,
                current.scope.category(),
                (old_addr as u64, old_size as u64),
                (moved as usize as u64, new_size as u64),
            ))
        })
    };
    moved
}

/// Opens a span on this thread: updates the thread's span state (always, so spans opened before
/// a session still name what runs inside them) and records the entry. Returns what to restore.
pub(crate) fn span_enter(name: &'static str, label: SpanLabel) -> SpanRestore {
    let Some(mut current) = state() else {
        return SpanRestore::default();
    };
    let restore = SpanRestore {
        span: current.span,
        scope: current.scope,
        id: current.last_span.wrapping_add(1).max(1),
        name: current.span_name,
        label: current.span_label,
        announced: current.announced,
    };
    current.last_span = restore.id;
    current.span = restore.id;
    current.scope = current.scope.enter(label);
    current.span_name = (name.as_ptr() as usize, name.len() as u32);
    current.span_label = label.to_byte();
    // The entry below announces this span, when recording (it was never announced otherwise).
    current.announced = if RECORDING.load(Ordering::Relaxed) {
        GATE_EPOCH.load(Ordering::Relaxed)
    } else {
        0
    };
    set_state(current);
    emit([RawKind::SpanEnter], |_, ticks| {
        [RawEvent::span_enter(
            ticks,
            restore.span,
            name,
            restore.id,
            label,
        )]
    });
    restore
}

/// Closes the span that [`span_enter`] opened and restores the thread's state to what it was.
pub(crate) fn span_exit(restore: SpanRestore) {
    if restore.id == 0 {
        return;
    }
    emit([RawKind::SpanExit], |_, ticks| {
        [RawEvent::span_exit(ticks, restore.id)]
    });
    if let Some(mut current) = state() {
        current.span = restore.span;
        current.scope = restore.scope;
        current.span_name = restore.name;
        current.span_label = restore.label;
        current.announced = restore.announced;
        set_state(current);
    }
}

/// What a span guard puts back when it closes.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct SpanRestore {
    span: u32,
    scope: CategoryScope,
    /// The span this guard opened (`0`: none, the thread-local was unreachable).
    id: u32,
    /// The enclosing span's name, label and announcement, to put back.
    name: (usize, u32),
    label: u8,
    announced: u32,
}

/// Marks the calling thread as highwater's own: nothing it allocates is recorded.
pub(crate) fn mark_internal_thread() {
    if let Some(mut current) = state() {
        current.internal = true;
        set_state(current);
    }
}

/// Runs `f` with recording paused on this thread, for highwater code that allocates on a user
/// thread (interning a name, starting or finishing a session). A measurement running on the
/// thread does not count those allocations either: they are not the user's.
pub(crate) fn with_recording_paused<R>(f: impl FnOnce() -> R) -> R {
    /// Puts the thread's `paused` flag back, even if `f` unwinds.
    struct Resume(bool);
    impl Drop for Resume {
        fn drop(&mut self) {
            if let Some(now) = state() {
                set_state(ThreadState {
                    paused: self.0,
                    ..now
                });
            }
        }
    }
    let _resume = state().map(|current| {
        set_state(ThreadState {
            paused: true,
            ..current
        });
        Resume(current.paused)
    });
    f()
}

/// Whether highwater's own work runs on this thread now ([`with_recording_paused`]), or its
/// thread-locals are gone: what it allocates is not the program's, for recording and for
/// measurement alike.
#[inline(always)]
pub(crate) fn paused_here() -> bool {
    state().is_none_or(|current| current.paused)
}

/// The category the thread's open spans give a new block.
pub(crate) fn scope_category() -> crate::model::Category {
    state().map_or(crate::model::Category::Other, |current| {
        current.scope.category()
    })
}

/// Records the start of an op named by interned `name`.
pub(crate) fn record_op_begin(name: u32) {
    emit([RawKind::OpBegin], |current, ticks| {
        [RawEvent::op_begin(ticks, current.span, name)]
    });
}

/// Records the end of the innermost op.
pub(crate) fn record_op_end() {
    emit([RawKind::OpEnd], |current, ticks| {
        [RawEvent::op_end(ticks, current.span)]
    });
}

/// Records a device tensor becoming live.
pub(crate) fn record_device_alloc(device: u16, tensor: u64, bytes: u64, category: u8) {
    let category = Category::from_index(category);
    emit([RawKind::DeviceAlloc], |current, ticks| {
        [RawEvent::device_alloc(
            ticks,
            current.span,
            device,
            category,
            tensor,
            bytes,
        )]
    });
}

/// Records a device block of `bytes` at `key` becoming live, in the category the thread's
/// open spans give it (as a heap allocation's): what a device driver's allocation is.
/// Remembered as the thread's latest device allocation (see [`super::recent`]).
// The CUDA callback is its only caller.
#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
pub(crate) fn record_device_alloc_in_scope(device: u16, key: u64, bytes: u64) {
    let recorded = emit([RawKind::DeviceAlloc], |current, ticks| {
        [RawEvent::device_alloc(
            ticks,
            current.span,
            device,
            current.scope.category(),
            key,
            bytes,
        )]
    });
    if recorded {
        super::recent::note(device, key, bytes);
    }
}

/// Records a device event with two plain words (see [`DeviceMemoryKind`]).
#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
pub(crate) fn record_device_memory(kind: DeviceMemoryKind, device: u16, a: u64, b: u64) {
    emit([kind.raw_kind()], |current, ticks| {
        [RawEvent::device_memory(
            kind,
            ticks,
            current.span,
            device,
            a,
            b,
        )]
    });
}

/// Records a device tensor dying.
pub(crate) fn record_device_free(device: u16, tensor: u64, bytes: u64) {
    emit([RawKind::DeviceFree], |current, ticks| {
        [RawEvent::device_free(
            ticks,
            current.span,
            device,
            tensor,
            bytes,
        )]
    });
}

/// Records that the live block `key` on `device` has category `category` from now on.
pub(crate) fn record_set_category(device: u16, key: u64, category: u8) {
    let category = Category::from_index(category);
    emit([RawKind::SetCategory], |current, ticks| {
        [RawEvent::set_category(
            ticks,
            current.span,
            device,
            key,
            category,
        )]
    });
}

/// Records what made the live block `key` on `device`: op name, shape and dtype ids.
pub(crate) fn record_annotation(
    device: u16,
    key: u64,
    op: u32,
    shape: Option<u32>,
    dtype: Option<u32>,
) {
    emit(
        [RawKind::AnnotateHead, RawKind::AnnotateTail],
        |current, ticks| RawEvent::annotation(ticks, current.span, device, key, op, shape, dtype),
    );
}

/// Whether a collector drains this process's rings now (it has not stopped, and this is not a
/// forked child): what a thread waiting on it checks each time it wakes.
pub(crate) fn collector_serves() -> bool {
    SessionPolicy.collector_serves()
}

/// Records that `source` refused `requested` bytes on interned `device` (cold: a refusal).
/// Returns whether the event is in the ring, so that waiting for a checkpoint that includes it
/// can succeed.
#[cold]
pub(crate) fn record_oom(
    device: u16,
    source: OomSource,
    requested: u64,
    largest_free: Option<u64>,
) -> bool {
    emit([RawKind::Oom], |current, ticks| {
        [RawEvent::oom(
            ticks,
            current.span,
            device,
            source,
            requested,
            largest_free,
        )]
    })
}

/// Records a device pool's state.
pub(crate) fn record_pool_state(
    device: u16,
    capacity: u64,
    reserved: u64,
    largest_free: u64,
    fragmentation: f64,
) {
    let pool = PoolReport {
        capacity,
        reserved,
        largest_free,
        fragmentation,
    };
    emit([RawKind::PoolHead, RawKind::PoolTail], |current, ticks| {
        RawEvent::pool_state(ticks, current.span, device, pool)
    });
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
