//! The static table of rings: threads claim one on their first recorded event and hand it back
//! when they exit; the collector drains every claimed or handed-back ring.
//!
//! A slot's `state` moves `FREE → OWNED` (a producer's compare-and-swap, the only way to become
//! the producer), `OWNED → RETIRED` (its producer, at thread exit), `RETIRED → FREE` (the
//! collector, after its last drain) and `OWNED → FREE` (a claimer that could not get storage for
//! the ring, before it wrote anything). So a ring has at most one producer, and it changes hands
//! only after the collector has seen everything the previous owner wrote.

use super::ring::Ring;
use super::sync::{const_outside_loom, only_in_loom, outside_loom, WaitWord};
use super::sync::{AtomicU32, AtomicU64, Ordering};

/// The table's size: the most threads a session can be set to record at the same time
/// (`HIGHWATER_MAX_THREADS`). Slots past a session's limit are never touched.
pub(crate) const MAX_THREADS: usize = 4096;

/// The threads a session records at the same time unless set otherwise; events of further
/// threads are counted as dropped until a ring is handed back.
pub(crate) const DEFAULT_THREAD_LIMIT: usize = 1024;

const FREE: u32 = 0;
const OWNED: u32 = 1;
const RETIRED: u32 = 2;

/// Whether a slot's ring is in use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum SlotState {
    /// Nobody writes it; it may hold storage from an earlier owner.
    Free,
    /// A live thread writes it.
    Owned,
    /// Its thread has exited; the collector drains it and frees it.
    Retired,
}

/// One table entry.
#[derive(Debug)]
pub(crate) struct Slot {
    /// `FREE`, `OWNED` or `RETIRED`; transitions as described in the module docs.
    state: AtomicU32,
    /// The owner's OS thread id, written by the producer right after its claim (before its
    /// first event); read by the collector to name threads in the profile.
    owner_tid: AtomicU64,
    /// The ring. Its producer is the thread that moved `state` to `OWNED`.
    pub(crate) ring: Ring,
}

/// The table of rings. One static instance serves the process; loom models build their own.
#[derive(Debug)]
pub(crate) struct Registry<S = [Slot; MAX_THREADS]> {
    slots: S,
    /// One past the highest slot a thread has tried to claim: the collector looks at no slot
    /// from here on. Claims take the lowest free slot, so it stays at the most threads that
    /// ever recorded at once, not [`MAX_THREADS`]: scanning the whole table (and the
    /// collector's queue and cursor per slot) at every wake cost the candle example about
    /// 35 µs a wake in cache misses.
    bound: AtomicU32,
    /// Bumped whenever a ring is freed, so a thread that found the table full knows when to
    /// try again without scanning it on every event; threads waiting for a free ring sleep on
    /// it.
    generation: WaitWord,
    /// Slots retired and not yet freed: rings the collector will free once drained, which a
    /// thread that found the table full may wait for.
    retired: AtomicU32,
    /// How many slots claims consider (the session's thread limit); set while no session
    /// records.
    limit: AtomicU32,
}

impl Slot {
    const_outside_loom! {
        /// A free slot with an empty ring.
        pub(crate) fn new() -> Slot {
            Slot {
                state: AtomicU32::new(FREE),
                owner_tid: AtomicU64::new(0),
                ring: Ring::new(),
            }
        }
    }

    /// The OS thread id of the current (or last) owner.
    pub(crate) fn owner_tid(&self) -> u64 {
        self.owner_tid.load(Ordering::Acquire)
    }

    /// Records the owner's OS thread id; called by the producer after claiming.
    pub(crate) fn set_owner_tid(&self, tid: u64) {
        self.owner_tid.store(tid, Ordering::Release);
    }

    /// The slot's state.
    pub(crate) fn state(&self) -> SlotState {
        match self.state.load(Ordering::Acquire) {
            OWNED => SlotState::Owned,
            RETIRED => SlotState::Retired,
            _ => SlotState::Free,
        }
    }
}

outside_loom! {
    impl Registry {
        /// An empty table.
        pub(crate) const fn new() -> Registry {
            #[allow(clippy::declare_interior_mutable_const)]
            const SLOT: Slot = Slot::new();
            Registry {
                slots: [SLOT; MAX_THREADS],
                bound: AtomicU32::new(0),
                generation: WaitWord::new(0),
                retired: AtomicU32::new(0),
                limit: AtomicU32::new(DEFAULT_THREAD_LIMIT as u32),
            }
        }
    }
}

impl<S: AsRef<[Slot]>> Registry<S> {
    only_in_loom! {
        /// A table over the given slots (loom models use a few).
        pub(crate) fn with_slots(slots: S) -> Registry<S> {
            Registry {
                slots,
                bound: AtomicU32::new(0),
                generation: WaitWord::new(0),
                retired: AtomicU32::new(0),
                limit: AtomicU32::new(DEFAULT_THREAD_LIMIT as u32),
            }
        }
    }

    /// All slots.
    pub(crate) fn slots(&self) -> &[Slot] {
        self.slots.as_ref()
    }

    /// The slots a thread may have claimed, for the collector: every slot after them is free
    /// and was free when this was read.
    ///
    /// A claimer raises the bound (SeqCst) before its compare-and-swap, and so before its first
    /// event. A collector whose SeqCst read of the bound misses a slot thus read it before that
    /// claim, as it would have found the slot free had it looked: anything the claimer goes on
    /// to record is stamped after this read.
    pub(crate) fn claimed(&self) -> &[Slot] {
        let slots = self.slots();
        let bound = self.bound.load(Ordering::SeqCst) as usize;
        &slots[..bound.min(slots.len())]
    }

    /// The free-ring generation; see [`Registry::claim`].
    pub(crate) fn generation(&self) -> u32 {
        self.generation.word().load(Ordering::Acquire)
    }

    /// Claims a free slot like [`Registry::claim`]; when every slot is taken but some retired
    /// ring awaits its last drain (the collector frees it once drained), and `may_wait` says
    /// so, sleeps until a slot is freed and tries again, looking at `may_wait` again every
    /// `recheck`. It never waits for a live owner's slot, which could take for ever.
    ///
    /// The generation is read before each attempt: a free that lands between a failed attempt
    /// and the sleep has moved it, so the sleep returns at once instead of missing the wake.
    pub(crate) fn claim_or_wait(
        &self,
        may_wait: impl Fn() -> bool,
        recheck: std::time::Duration,
    ) -> Option<usize> {
        loop {
            let seen = self.generation();
            if let Some(index) = self.claim() {
                return Some(index);
            }
            // `free` bumps the generation before it counts the retired ring gone: seeing no
            // retired ring, this also sees the bump of the free that took the last one.
            let pending = self.retired.load(Ordering::Acquire) > 0;
            if self.generation() != seen {
                continue;
            }
            if !pending || !may_wait() {
                return None;
            }
            self.generation.wait(seen, Some(recheck));
        }
    }

    /// Makes the calling thread the producer of a free slot and returns its index, or `None`
    /// when every slot is taken. Lock-free: a `fetch_max` and a compare-and-swap per free-looking
    /// slot.
    pub(crate) fn claim(&self) -> Option<usize> {
        let limit = self.limit.load(Ordering::Relaxed) as usize;
        let slots = self.slots();
        slots[..limit.min(slots.len())]
            .iter()
            .enumerate()
            .find_map(|(index, slot)| {
                if slot.state.load(Ordering::Relaxed) != FREE {
                    return None;
                }
                // Before the claim (see `claimed`); a bound raised for a slot another thread then
                // takes first only makes the collector look at one more slot.
                self.bound.fetch_max(index as u32 + 1, Ordering::SeqCst);
                slot.state
                    .compare_exchange(FREE, OWNED, Ordering::AcqRel, Ordering::Relaxed)
                    .is_ok()
                    .then_some(index)
            })
    }

    /// Sets how many slots claims consider, at most the table's size. Call it while no session
    /// records: slots past a lower limit that are still owned stay the collector's to drain.
    pub(crate) fn set_limit(&self, threads: usize) {
        let threads = threads.clamp(1, self.slots().len());
        self.limit.store(threads as u32, Ordering::Relaxed);
    }

    /// How many slots claims consider.
    pub(crate) fn limit(&self) -> usize {
        self.limit.load(Ordering::Relaxed) as usize
    }

    /// Gives back slot `index`, which the caller claimed but could not use (no storage could
    /// be mapped for it); it never held events. The free-ring generation does not move:
    /// nothing new became free, and threads that found the table full need not retry.
    pub(crate) fn abandon(&self, index: usize) {
        if let Some(slot) = self.slots().get(index) {
            let _ = slot
                .state
                .compare_exchange(OWNED, FREE, Ordering::Release, Ordering::Relaxed);
        }
    }

    /// Hands slot `index` back for a last drain. Called by its producer, which writes nothing
    /// more to it afterwards.
    pub(crate) fn retire(&self, index: usize) {
        if let Some(slot) = self.slots().get(index) {
            // Release: the collector that sees RETIRED also sees every event published before.
            if slot
                .state
                .compare_exchange(OWNED, RETIRED, Ordering::Release, Ordering::Relaxed)
                .is_ok()
            {
                self.retired.fetch_add(1, Ordering::AcqRel);
            }
        }
    }

    /// Makes a retired slot claimable again. Called by the collector after it drained the ring
    /// with the slot seen as retired.
    pub(crate) fn free(&self, index: usize) {
        if let Some(slot) = self.slots().get(index) {
            if slot
                .state
                .compare_exchange(RETIRED, FREE, Ordering::AcqRel, Ordering::Relaxed)
                .is_ok()
            {
                // The bump before the count (see `claim_or_wait`).
                self.generation.word().fetch_add(1, Ordering::Release);
                self.generation.wake_all();
                self.retired.fetch_sub(1, Ordering::AcqRel);
            }
        }
    }
}

outside_loom! {
    /// The process's table.
    pub(crate) static REGISTRY: Registry = Registry::new();
}

outside_loom! {
    #[cfg(test)]
    mod tests;
}
