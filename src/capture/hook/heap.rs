//! Heap events: the allocator's allocations, frees and reallocations, and the countdown that
//! picks which of them carry a call site.

use std::sync::atomic::compiler_fence;

use super::{
    destination, drop_reentrant, drop_table_full, drop_unattributed, emit, state, Destination,
    PerThread, SessionPolicy, ThreadState, THREAD,
};
use crate::capture::frames::Walked;
use crate::capture::gate::{Sound, GATE_EPOCH, RECORDING};
use crate::capture::raw::{RawEvent, RawKind};
use crate::capture::registry::REGISTRY;
use crate::capture::ring::{Pushed, Ring, SoundPark};
use crate::capture::sync::Ordering;
use crate::capture::{clock, sample, stack};

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
    const _: () = assert!(crate::capture::frames::MAX_FRAMES == 64);
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
