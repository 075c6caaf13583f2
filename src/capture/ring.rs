//! One thread's event ring: a single-producer, single-consumer queue of [`RawEvent`]s.
//!
//! The producer is the thread that claimed the ring in the [registry](super::registry); it
//! writes from inside the allocator hook, so a push never allocates, locks or panics. The
//! consumer is the collector thread. A push reads the consumer's `tail` only once per half
//! ring: past half full it rings the collector (`WhenFull::wake_collector`), and when the ring
//! is full it either waits for room (lossless, the default) or drops the event and counts it.
//!
//! # The waiting protocol
//!
//! A producer that finds its ring full rings the collector, spins briefly re-reading `tail`,
//! then parks: it sets `parked`, fences, re-checks room and sleeps on `parked` for at most
//! [`PARK_TIMEOUT`] ([`SoundPark`]). After every drain the collector publishes `tail`, fences
//! and wakes a parked producer. The two fences make the pair sequentially consistent, so a
//! drain between the producer's check and its sleep is never missed; the timeout is only a
//! safety net, and after every wake the producer re-checks room and whether the collector still
//! serves it (a stopped collector releases every parked producer, which then drops).
//!
//! # The stop protocol
//!
//! A session must know, when it stops, that every event a producer decided to record is in a
//! ring. A producer marks itself `busy` *before* it reads the recording gate, and clears it
//! (Release) after publishing. The stopper closes the gate and then keeps draining every ring
//! (which wakes parked producers) until it reads every `busy` as zero (SeqCst), then drains once
//! more. The two "write mine, then read theirs" steps are ordered by sequential consistency
//! ([`GateProtocol`]), so either the stopper sees the producer busy and waits for its publish,
//! or the producer sees the gate closed and records nothing; and a producer waiting for room
//! gets it from the stopper's drains, so it finishes its push.

use std::time::Duration;

use super::gate::{GateProtocol, Sound};
use super::raw::{RawEvent, RawKind};
use super::sync::{const_outside_loom, outside_loom, zeroed_counters, WaitWord};
use super::sync::{
    fence, read_mark, AtomicBool, AtomicPtr, AtomicU64, Ordering, SlotCell, SPIN_READS,
};

/// What became of a push.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Pushed {
    /// The events are in the ring.
    Recorded,
    /// The ring was full and the producer could not wait; the events were counted as dropped.
    Dropped,
    /// The recording gate was closed; nothing was written or counted.
    GateClosed,
}

/// What a producer whose ring lacks room may do; the hook answers from the session's settings.
/// Asked only off the fast path (the ring passed its fill threshold or is full).
pub(crate) trait WhenFull {
    /// Whether the session is lossless: a full ring waits for the collector instead of dropping.
    fn lossless(&self) -> bool;
    /// Whether the collector serves this ring now, so a wait for room ends. Asked again after
    /// every wake; `false` in a forked child, and once the collector has stopped.
    fn collector_serves(&self) -> bool;
    /// Asks the collector to drain soon instead of sleeping out its interval.
    fn wake_collector(&self);
    /// Counts one wait for room (for the profile).
    fn note_wait(&self);
    /// Gives `ring` storage of the session's size if it has another size and is empty (a ring
    /// kept from an earlier session). Called by the producer before it reads `tail`.
    fn fit_storage(&self, ring: &Ring);
}

/// How a producer sleeps until the collector may have made room. The order of its steps is the
/// protocol the loom models check; [`SoundPark`] is the one the hook uses.
pub(crate) trait ParkProtocol {
    /// Sleeps on `parked` until woken or timed out, unless `ready()` (room, or a collector that
    /// stopped serving) holds once the producer is registered as parked. Returns whether it
    /// did; the caller re-checks either way.
    fn park(parked: &WaitWord, ready: &dyn Fn() -> bool) -> bool;
}

/// How long a parked producer sleeps before it re-checks room, the collector and the gate by
/// itself. A safety net: the collector wakes parked producers after every drain.
pub(crate) const PARK_TIMEOUT: Duration = Duration::from_millis(1);

/// Reads of `tail` a producer spins through before it parks.
const SPINS: u32 = SPIN_READS;

/// Registers as parked, then checks room (and whether the collector still serves), then
/// sleeps: the store-buffering pair with the collector's "publish `tail` (or stop serving),
/// then read `parked`" ([`Ring::drain`], [`Ring::release_parked`]), both ordered by SeqCst
/// fences, means either the producer sees the change or the collector sees it parked and wakes
/// it. The word's own check-then-sleep covers a wake between the check and the sleep.
#[derive(Debug)]
pub(crate) struct SoundPark;

impl ParkProtocol for SoundPark {
    fn park(parked: &WaitWord, ready: &dyn Fn() -> bool) -> bool {
        parked.word().store(1, Ordering::Relaxed);
        fence(Ordering::SeqCst);
        if ready() {
            parked.word().store(0, Ordering::Relaxed);
            return true;
        }
        parked.wait(1, Some(PARK_TIMEOUT));
        parked.word().store(0, Ordering::Relaxed);
        false
    }
}

/// Fields only the producer writes, on their own cache line.
#[derive(Debug)]
#[repr(align(128))]
struct ProducerSide {
    /// Next position to write. Written by the producer (Release after the slot is filled);
    /// read by the consumer (Acquire).
    head: AtomicU64,
    /// The position at which the producer next reads the consumer's `tail`: half a ring past
    /// the `tail` it last read (to ring the collector early), or a whole ring once it has rung
    /// (to find the ring full). So a push reads the shared `tail` only once per half ring.
    /// Only the producer touches it, except [`Ring::reset_producer`] while nobody pushes.
    refresh_at: AtomicU64,
    /// Non-zero while the producer is between its gate check and its publish, waits for room
    /// included. Set by the producer with an SC swap, cleared with Release; read by the stopper.
    busy: AtomicU64,
    /// Events dropped because the ring was full, by [`RawKind`]. Written only by the producer
    /// (load + store, not a read-modify-write); read by the consumer.
    dropped: [AtomicU64; RawKind::COUNT],
    /// Pushes left to drop before the producer reads the consumer's `tail` again, so a full
    /// ring does not pull the consumer's cache line on every event (drop mode). Producer only.
    drop_skips: AtomicU64,
}

/// Fields the consumer writes.
#[derive(Debug)]
#[repr(align(128))]
struct ConsumerSide {
    /// Next position to read. Written by the consumer (Release after it has copied the slots);
    /// read by the producer (Acquire) before it reuses a slot.
    tail: AtomicU64,
    /// `1` while the producer sleeps waiting for room (set by it, Relaxed before a SeqCst
    /// fence); the consumer resets it to `0` and wakes the producer after a drain.
    parked: WaitWord,
}

/// A single-producer, single-consumer ring of events.
#[derive(Debug)]
pub(crate) struct Ring {
    /// `capacity` slots, or null before the first owner installed them. Set by a producer that
    /// owns the ring while it is empty ([`Ring::replace_storage`]), before it publishes events
    /// in it (Release); the consumer loads it after `head` (Acquire).
    slots: AtomicPtr<SlotCell<RawEvent>>,
    /// Number of slots, a power of two; set together with `slots`.
    capacity: AtomicU64,
    producer: ProducerSide,
    consumer: ConsumerSide,
}

impl Ring {
    const_outside_loom! {
        /// An empty ring with no storage yet.
        pub(crate) fn new() -> Ring {
            Ring {
                slots: AtomicPtr::new(std::ptr::null_mut()),
                capacity: AtomicU64::new(0),
                producer: ProducerSide {
                    head: AtomicU64::new(0),
                    refresh_at: AtomicU64::new(0),
                    busy: AtomicU64::new(0),
                    dropped: zeroed_counters(),
                    drop_skips: AtomicU64::new(0),
                },
                consumer: ConsumerSide {
                    tail: AtomicU64::new(0),
                    parked: WaitWord::new(0),
                },
            }
        }
    }

    /// Whether storage has been installed.
    pub(crate) fn has_storage(&self) -> bool {
        !self.slots.load(Ordering::Acquire).is_null()
    }

    /// The installed storage's number of slots (`0`: none yet).
    pub(crate) fn capacity(&self) -> u64 {
        self.capacity.load(Ordering::Acquire)
    }

    /// Installs `capacity` slots at `slots` and returns the storage it replaces, if any, for
    /// the caller to free. Makes the next push re-read `tail`.
    ///
    /// # Safety
    ///
    /// - `slots` points to `capacity` initialised slots that stay valid until they are
    ///   replaced again;
    /// - `capacity` is a non-zero power of two;
    /// - the caller is the ring's only producer, is not writing slots, and the ring is empty:
    ///   the consumer has drained every event ever published in it (`tail == head`, read by
    ///   the producer with Acquire). The consumer then reads no slot until the next publish,
    ///   and loads `slots` after that publish's `head`, so it never reads the old storage again.
    pub(crate) unsafe fn replace_storage(
        &self,
        slots: *mut SlotCell<RawEvent>,
        capacity: u64,
    ) -> Option<(*mut SlotCell<RawEvent>, u64)> {
        debug_assert!(capacity.is_power_of_two());
        debug_assert!(self.is_empty());
        let old_capacity = self.capacity.swap(capacity, Ordering::Relaxed);
        let old = self.slots.swap(slots, Ordering::Release);
        self.reset_producer();
        (!old.is_null()).then_some((old, old_capacity))
    }

    /// Whether the consumer has drained everything published. The producer's check; the
    /// collector reads it only as a hint (whether a ring it could not drain still has events).
    pub(crate) fn is_empty(&self) -> bool {
        self.consumer.tail.load(Ordering::Acquire) == self.producer.head.load(Ordering::Relaxed)
    }

    /// Forgets the producer's cached view of the consumer, so its next push re-reads `tail`
    /// and, in drop mode, does not skip reading it. Called by a new owner after its claim, and
    /// by a session before it opens the gate (no producer pushes then).
    pub(crate) fn reset_producer(&self) {
        // `refresh_at == head`: the next push is due to read `tail`. (Positions wrap, so
        // there is no "before everything" value to park it at.)
        let head = self.producer.head.load(Ordering::Relaxed);
        self.producer.refresh_at.store(head, Ordering::Relaxed);
        self.producer.drop_skips.store(0, Ordering::Relaxed);
    }

    /// Writes the events that `stamp` builds as one unit, unless the gate is closed or the
    /// ring lacks room for all of them and `full` says not to wait (then they are counted as
    /// dropped under `kinds`). `stamp` runs only once the gate is open and there is room, so a
    /// clock it reads is read inside the recorded window and never for an event that is dropped.
    ///
    /// # Safety
    ///
    /// The caller is this ring's only producer: it claimed the ring and has not given it back,
    /// and storage is installed.
    #[inline(always)]
    pub(crate) unsafe fn push<const N: usize>(
        &self,
        gate: &AtomicBool,
        kinds: [RawKind; N],
        full: &impl WhenFull,
        stamp: impl FnOnce() -> [RawEvent; N],
    ) -> Pushed {
        // SAFETY: forwarded under this function's contract.
        unsafe { self.push_with::<N, Sound, SoundPark>(gate, kinds, full, stamp) }
    }

    /// [`Ring::push`] with chosen gate and parking protocols (loom models try broken ones).
    ///
    /// # Safety
    ///
    /// As [`Ring::push`].
    #[inline(always)]
    pub(crate) unsafe fn push_with<const N: usize, P: GateProtocol, W: ParkProtocol>(
        &self,
        gate: &AtomicBool,
        kinds: [RawKind; N],
        full: &impl WhenFull,
        stamp: impl FnOnce() -> [RawEvent; N],
    ) -> Pushed {
        if !self.enter::<P>(gate) {
            return Pushed::GateClosed;
        }
        // SAFETY: forwarded under this function's contract; `enter` marked the ring busy.
        let pushed = unsafe { self.push_entered::<N, W>(kinds, full, stamp) };
        self.leave();
        pushed
    }

    /// The first step of a push: marks the producer busy and reads the recording gate (the
    /// stop protocol's "write mine, then read theirs"). Returns whether the gate is open; if it
    /// is not, the ring is not left busy. A producer that must read its clock before it can
    /// build its events (a realloc's old half) enters first, so that its ring holds the merge
    /// from before that reading until its publish, and ends with [`Ring::leave`].
    #[inline(always)]
    pub(crate) fn enter<P: GateProtocol>(&self, gate: &AtomicBool) -> bool {
        let open = P::enter(&self.producer.busy, gate);
        if !open {
            self.leave();
        }
        open
    }

    /// The last step of a push: the producer is no longer busy.
    #[inline(always)]
    pub(crate) fn leave(&self) {
        self.producer.busy.store(0, Ordering::Release);
    }

    /// Writes the events that `stamp` builds as one unit, as [`Ring::push`] does, for a
    /// producer that has [entered](Ring::enter) the ring; it stays busy (the caller leaves).
    ///
    /// # Safety
    ///
    /// As [`Ring::push`], and the caller entered the ring and has not left it.
    #[inline(always)]
    pub(crate) unsafe fn push_entered<const N: usize, W: ParkProtocol>(
        &self,
        kinds: [RawKind; N],
        full: &impl WhenFull,
        stamp: impl FnOnce() -> [RawEvent; N],
    ) -> Pushed {
        let producer = &self.producer;
        let head = producer.head.load(Ordering::Relaxed);
        // Positions are compared as distances, so they may wrap past `u64::MAX`: the push is
        // due to read `tail` once it would pass `refresh_at` (which is never more than a ring
        // ahead of `head`).
        let ahead = producer
            .refresh_at
            .load(Ordering::Relaxed)
            .wrapping_sub(head);
        if ahead < N as u64 && !self.make_room::<W>(head, N as u64, full) {
            for kind in kinds {
                let counter = &producer.dropped[kind as usize];
                counter.store(counter.load(Ordering::Relaxed) + 1, Ordering::Relaxed);
            }
            return Pushed::Dropped;
        }
        let events = stamp();
        let capacity = self.capacity.load(Ordering::Relaxed);
        let slots = self.slots.load(Ordering::Relaxed);
        for (offset, event) in events.into_iter().enumerate() {
            let index = head.wrapping_add(offset as u64) & (capacity - 1);
            // SAFETY:
            // - `index < capacity`, and `slots` holds `capacity` slots (`replace_storage`'s
            //   contract; only this thread replaces them, so both loads see its own values);
            // - the consumer has read this slot: `head + offset - tail < capacity`, with `tail`
            //   loaded with Acquire after the consumer's Release store (`make_room`);
            // - only this thread writes slots (the caller is the only producer).
            unsafe { (*slots.add(index as usize)).with_mut(|slot| slot.write(event)) };
        }
        producer
            .head
            .store(head.wrapping_add(N as u64), Ordering::Release);
        Pushed::Recorded
    }

    /// The push reached `refresh_at`: reads the consumer's `tail` and says whether `needed`
    /// slots are free, ringing the collector once the ring is half full and, when it is full,
    /// waiting for room (lossless) or dropping (at most one `tail` read every 64 drops).
    /// Producer only.
    #[cold]
    fn make_room<W: ParkProtocol>(&self, head: u64, needed: u64, full: &impl WhenFull) -> bool {
        let producer = &self.producer;
        let lossless = full.lossless();
        let skips = producer.drop_skips.load(Ordering::Relaxed);
        if skips > 0 && !lossless {
            producer.drop_skips.store(skips - 1, Ordering::Relaxed);
            return false;
        }
        full.fit_storage(self);
        let capacity = self.capacity.load(Ordering::Relaxed);
        let tail = self.consumer.tail.load(Ordering::Acquire);
        if head.wrapping_sub(tail) + needed <= capacity {
            self.note_room(head, tail, needed, full);
            return true;
        }
        if lossless && self.wait_for_room::<W>(head, needed, full) {
            let tail = self.consumer.tail.load(Ordering::Acquire);
            self.note_room(head, tail, needed, full);
            return true;
        }
        producer.drop_skips.store(63, Ordering::Relaxed);
        false
    }

    /// There is room for the push: decides when the producer next reads `tail`, ringing the
    /// collector if the ring is more than half full.
    fn note_room(&self, head: u64, tail: u64, needed: u64, full: &impl WhenFull) {
        let capacity = self.capacity.load(Ordering::Relaxed);
        let half = capacity / 2;
        let refresh_at = if head.wrapping_sub(tail) + needed > half {
            full.wake_collector();
            tail.wrapping_add(capacity)
        } else {
            tail.wrapping_add(half)
        };
        self.producer
            .refresh_at
            .store(refresh_at, Ordering::Relaxed);
    }

    /// Waits until `needed` slots are free: spins a little re-reading `tail`, then parks until
    /// the collector drains the ring, re-checking after every wake. Gives up (returns `false`)
    /// only when the collector no longer serves the ring. The recording gate may close
    /// meanwhile: the stopper keeps draining while this producer is busy, so the wait still
    /// ends with room and the event this producer decided to record is kept.
    #[cold]
    fn wait_for_room<W: ParkProtocol>(&self, head: u64, needed: u64, full: &impl WhenFull) -> bool {
        let capacity = self.capacity.load(Ordering::Relaxed);
        let room =
            || head.wrapping_sub(self.consumer.tail.load(Ordering::Acquire)) + needed <= capacity;
        full.wake_collector();
        for _ in 0..SPINS {
            if room() {
                return true;
            }
            std::hint::spin_loop();
        }
        full.note_wait();
        let ready = || room() || !full.collector_serves();
        loop {
            if room() {
                return true;
            }
            if !full.collector_serves() {
                return false;
            }
            W::park(&self.consumer.parked, &ready);
        }
    }

    /// Moves every published event into `out`, oldest first, frees their slots, and wakes the
    /// producer if it is parked waiting for room. Returns how many were moved.
    ///
    /// # Safety
    ///
    /// The caller is the only consumer of this ring (the collector), and storage is installed.
    // The loom models and the tests drain whole rings; the collector drains in chunks.
    #[cfg(test)]
    pub(crate) unsafe fn drain(&self, out: &mut impl Extend<RawEvent>) -> u64 {
        // SAFETY: the caller's contract is this one's.
        unsafe { self.drain_at_most(out, u64::MAX) }
    }

    /// Moves the oldest published events, at most `max` of them, into `out`, oldest first,
    /// frees their slots, and wakes the producer if it is parked waiting for room. Returns how
    /// many were moved (fewer than `max`: the ring is empty).
    ///
    /// # Safety
    ///
    /// The caller is the only consumer of this ring (the collector), and storage is installed.
    pub(crate) unsafe fn drain_at_most(&self, out: &mut impl Extend<RawEvent>, max: u64) -> u64 {
        // `head` first: storage the producer installed before publishing is then visible
        // (`replace_storage`).
        let published = self.producer.head.load(Ordering::Acquire);
        let slots = self.slots.load(Ordering::Acquire);
        let capacity = self.capacity.load(Ordering::Relaxed);
        let tail = self.consumer.tail.load(Ordering::Relaxed);
        let count = published.wrapping_sub(tail).min(max);
        let head = tail.wrapping_add(count);
        out.extend((0..count).map(|offset| {
            let index = tail.wrapping_add(offset) & (capacity - 1);
            // SAFETY:
            // - `index < capacity` slots exist (`replace_storage`'s contract);
            // - the producer published this slot: `position < head`, loaded with Acquire after
            //   the producer's Release store of `head`;
            // - the producer does not reuse it until `tail` passes it, which happens below.
            unsafe { (*slots.add(index as usize)).with(|slot| *slot) }
        }));
        self.consumer.tail.store(head, Ordering::Release);
        // Publish `tail`, then read `parked`: the other half of `SoundPark`'s pair.
        fence(Ordering::SeqCst);
        self.release_parked();
        count
    }

    /// Wakes the producer if it is parked. Called after a drain, and for every ring when the
    /// collector stops serving (the producer then re-checks and gives up), each time after a
    /// SeqCst fence that follows the change the producer waits for (see [`SoundPark`]).
    pub(crate) fn release_parked(&self) {
        let parked = &self.consumer.parked;
        if parked.word().load(Ordering::Relaxed) != 0 {
            parked.word().store(0, Ordering::Relaxed);
            parked.wake_all();
        }
    }

    /// Events dropped so far because the ring was full, by [`RawKind`].
    pub(crate) fn dropped(&self) -> [u64; RawKind::COUNT] {
        std::array::from_fn(|kind| self.producer.dropped[kind].load(Ordering::Relaxed))
    }

    outside_loom! {
        /// In a forked child: the producer (a thread of the parent) did not survive the fork, so it
        /// is not between a gate check and its publish, whatever its flag said at the fork. Without
        /// this, the stopper in the child's own session would wait for it forever. (Its unpublished
        /// event, if any, was never visible: `head` did not move.)
        pub(crate) fn clear_busy_after_fork(&self) {
            self.producer.busy.store(0, Ordering::Relaxed);
        }
    }

    /// Whether the producer is between a gate check and its publish (waiting for room
    /// included). After [`close_gate`](super::gate::close_gate), a `false` means every event recorded under the open
    /// gate is published.
    pub(crate) fn is_busy(&self) -> bool {
        read_mark(&self.producer.busy)
    }
}

outside_loom! {
    #[cfg(test)]
    mod tests;
}
