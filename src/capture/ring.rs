//! One thread's event ring: a single-producer, single-consumer queue of [`RawEvent`]s.
//!
//! The producer is the thread that claimed the ring in the [registry](super::registry); it
//! writes from inside the allocator hook, so a push never allocates, locks or blocks: a full
//! ring drops the event and counts it. The consumer is the collector thread.
//!
//! # The stop protocol
//!
//! A session must know, when it stops, that every event a producer decided to record is in a
//! ring. A producer marks itself `busy` *before* it reads the recording gate, and clears it
//! (Release) after publishing. The stopper closes the gate and then waits for `busy` to read
//! zero (Acquire). The two "write mine, then read theirs" steps are ordered by sequential
//! consistency ([`GateProtocol`]), so either the stopper sees the producer busy and waits for
//! its publish, or the producer sees the gate closed and records nothing.

use super::raw::{RawEvent, RawKind};
use super::sync::{AtomicBool, AtomicPtr, AtomicU64, Ordering, SlotCell};

/// How a producer announces itself before reading the gate, and how a stopper closes the gate
/// before reading producers. Both sides must be sequentially consistent.
pub(crate) trait GateProtocol {
    /// Producer: marks `busy`, then reads `gate`.
    fn enter(busy: &AtomicU64, gate: &AtomicBool) -> bool;
}

/// The protocol the hook uses.
///
/// Where the kernel offers `membarrier(MEMBARRIER_CMD_PRIVATE_EXPEDITED)` ([`ASYMMETRIC`]),
/// the producer's side is a plain store and a compiler fence, and the stopper's membarrier
/// supplies the fence on every running thread: the asymmetric form of the same
/// store-buffering argument, which moves the whole cost to the rare stop. Otherwise an SC swap
/// and an SC load (one locked instruction on x86-64, cheaper than `mfence`). Loom treats SC
/// accesses as acquire/release (it would report false races) but models SC fences exactly, so
/// under loom the order is built from relaxed accesses around `fence(SeqCst)`.
#[derive(Debug)]
pub(crate) struct Sound;

impl GateProtocol for Sound {
    #[inline(always)]
    fn enter(busy: &AtomicU64, gate: &AtomicBool) -> bool {
        #[cfg(not(loom))]
        {
            if ASYMMETRIC.load(Ordering::Relaxed) {
                // The stopper's membarrier acts as a full fence on this thread, so program
                // order (kept by the compiler fence) is all this side needs.
                busy.store(1, Ordering::Relaxed);
                std::sync::atomic::compiler_fence(Ordering::SeqCst);
                gate.load(Ordering::Relaxed)
            } else {
                busy.swap(1, Ordering::SeqCst);
                gate.load(Ordering::SeqCst)
            }
        }
        #[cfg(loom)]
        {
            busy.store(1, Ordering::Relaxed);
            super::sync::fence(Ordering::SeqCst);
            gate.load(Ordering::Relaxed)
        }
    }
}

/// Whether producers use the asymmetric protocol (see [`Sound`]). Set once, before any
/// session opens its gate, and never cleared.
#[cfg(not(loom))]
pub(crate) static ASYMMETRIC: AtomicBool = AtomicBool::new(false);

/// Registers this process for expedited private membarriers; on success producers switch to
/// the asymmetric protocol. Called before a session opens its gate.
#[cfg(not(loom))]
pub(crate) fn enable_asymmetric_barrier() {
    #[cfg(target_os = "linux")]
    {
        const MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED: libc::c_long = 1 << 4;
        // SAFETY: membarrier takes a command and flags; registering has no memory effects.
        let registered = unsafe {
            libc::syscall(
                libc::SYS_membarrier,
                MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED,
                0,
            )
        } == 0;
        if registered {
            ASYMMETRIC.store(true, Ordering::SeqCst);
        }
    }
}

/// A full memory barrier on every running thread of this process.
#[cfg(all(not(loom), target_os = "linux"))]
fn membarrier() -> bool {
    const MEMBARRIER_CMD_PRIVATE_EXPEDITED: libc::c_long = 1 << 3;
    // SAFETY: membarrier takes a command and flags; the process registered for this command
    // before `ASYMMETRIC` was set.
    unsafe { libc::syscall(libc::SYS_membarrier, MEMBARRIER_CMD_PRIVATE_EXPEDITED, 0) == 0 }
}

/// Closes `gate`; afterwards [`Ring::wait_idle`] on every ring guarantees no producer still
/// writes under the open gate.
pub(crate) fn close_gate(gate: &AtomicBool) {
    #[cfg(not(loom))]
    {
        gate.store(false, Ordering::SeqCst);
        #[cfg(target_os = "linux")]
        if ASYMMETRIC.load(Ordering::SeqCst) && !membarrier() {
            // Registered but refused now: nothing else gives the producers' side its fence,
            // so wait out any producer that could still see the gate open. Never expected.
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
    }
    #[cfg(loom)]
    {
        gate.store(false, Ordering::Relaxed);
        super::sync::fence(Ordering::SeqCst);
    }
}

/// What became of a push.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Pushed {
    /// The events are in the ring.
    Recorded,
    /// The ring was full; the events were counted as dropped.
    Dropped,
    /// The recording gate was closed; nothing was written or counted.
    GateClosed,
}

/// Fields only the producer writes, on their own cache line.
#[derive(Debug)]
#[repr(align(128))]
struct ProducerSide {
    /// Next position to write. Written by the producer (Release after the slot is filled);
    /// read by the consumer (Acquire).
    head: AtomicU64,
    /// The producer's last reading of `tail`, so a push reads the shared `tail` only when the
    /// ring looks full. Only the producer touches it.
    tail_cache: AtomicU64,
    /// Non-zero while the producer is between its gate check and its publish. Set by the
    /// producer with an SC swap, cleared with Release; read by the stopper.
    busy: AtomicU64,
    /// Events dropped because the ring was full, by [`RawKind`]. Written only by the producer
    /// (load + store, not a read-modify-write); read by the consumer.
    dropped: [AtomicU64; RawKind::COUNT],
    /// Pushes left to drop before the producer reads the consumer's `tail` again, so a full
    /// ring does not pull the consumer's cache line on every event. Producer only.
    drop_skips: AtomicU64,
}

/// Fields only the consumer writes.
#[derive(Debug)]
#[repr(align(128))]
struct ConsumerSide {
    /// Next position to read. Written by the consumer (Release after it has copied the slots);
    /// read by the producer (Acquire) before it reuses a slot.
    tail: AtomicU64,
}

/// A single-producer, single-consumer ring of events.
#[derive(Debug)]
pub(crate) struct Ring {
    /// `capacity` slots, or null before the first owner installed them. Set once, by the first
    /// producer, before the registry publishes its claim; never freed (rings are reused).
    slots: AtomicPtr<SlotCell<RawEvent>>,
    /// Number of slots, a power of two; set together with `slots`.
    capacity: AtomicU64,
    producer: ProducerSide,
    consumer: ConsumerSide,
}

impl Ring {
    /// An empty ring with no storage yet.
    #[cfg(not(loom))]
    pub(crate) const fn new() -> Ring {
        #[allow(clippy::declare_interior_mutable_const)]
        const ZERO: AtomicU64 = AtomicU64::new(0);
        Ring {
            slots: AtomicPtr::new(std::ptr::null_mut()),
            capacity: AtomicU64::new(0),
            producer: ProducerSide {
                head: AtomicU64::new(0),
                tail_cache: AtomicU64::new(0),
                busy: AtomicU64::new(0),
                dropped: [ZERO; RawKind::COUNT],
                drop_skips: AtomicU64::new(0),
            },
            consumer: ConsumerSide {
                tail: AtomicU64::new(0),
            },
        }
    }

    /// An empty ring with no storage yet.
    #[cfg(loom)]
    pub(crate) fn new() -> Ring {
        Ring {
            slots: AtomicPtr::new(std::ptr::null_mut()),
            capacity: AtomicU64::new(0),
            producer: ProducerSide {
                head: AtomicU64::new(0),
                tail_cache: AtomicU64::new(0),
                busy: AtomicU64::new(0),
                dropped: std::array::from_fn(|_| AtomicU64::new(0)),
                drop_skips: AtomicU64::new(0),
            },
            consumer: ConsumerSide {
                tail: AtomicU64::new(0),
            },
        }
    }

    /// Whether storage has been installed.
    pub(crate) fn has_storage(&self) -> bool {
        !self.slots.load(Ordering::Acquire).is_null()
    }

    /// Installs `capacity` slots at `slots`.
    ///
    /// # Safety
    ///
    /// - `slots` points to `capacity` initialised slots that stay valid for the life of the ring;
    /// - `capacity` is a non-zero power of two;
    /// - the caller owns the ring (no producer or consumer is using it) and the ring has no
    ///   storage yet.
    pub(crate) unsafe fn install(&self, slots: *mut SlotCell<RawEvent>, capacity: u64) {
        debug_assert!(capacity.is_power_of_two());
        self.capacity.store(capacity, Ordering::Relaxed);
        self.slots.store(slots, Ordering::Release);
    }

    /// Writes the events that `stamp` builds as one unit, unless the gate is closed or the
    /// ring lacks room for all of them (then they are counted as dropped under `kinds`).
    /// `stamp` runs only once the gate is open and there is room, so a clock it reads is read
    /// inside the recorded window and never for an event that is dropped.
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
        stamp: impl FnOnce() -> [RawEvent; N],
    ) -> Pushed {
        // SAFETY: forwarded under this function's contract.
        unsafe { self.push_with::<N, Sound>(gate, kinds, stamp) }
    }

    /// [`Ring::push`] with a chosen gate protocol (loom models try broken ones).
    ///
    /// # Safety
    ///
    /// As [`Ring::push`].
    #[inline(always)]
    pub(crate) unsafe fn push_with<const N: usize, P: GateProtocol>(
        &self,
        gate: &AtomicBool,
        kinds: [RawKind; N],
        stamp: impl FnOnce() -> [RawEvent; N],
    ) -> Pushed {
        let producer = &self.producer;
        if !P::enter(&producer.busy, gate) {
            producer.busy.store(0, Ordering::Release);
            return Pushed::GateClosed;
        }
        let capacity = self.capacity.load(Ordering::Relaxed);
        let head = producer.head.load(Ordering::Relaxed);
        let tail = producer.tail_cache.load(Ordering::Relaxed);
        if head.wrapping_sub(tail) + N as u64 > capacity && !self.refresh_tail(head, N as u64) {
            for kind in kinds {
                let counter = &producer.dropped[kind as usize];
                counter.store(counter.load(Ordering::Relaxed) + 1, Ordering::Relaxed);
            }
            producer.busy.store(0, Ordering::Release);
            return Pushed::Dropped;
        }
        let events = stamp();
        let slots = self.slots.load(Ordering::Relaxed);
        for (offset, event) in events.into_iter().enumerate() {
            let index = (head + offset as u64) & (capacity - 1);
            // SAFETY:
            // - `index < capacity`, and `slots` holds `capacity` slots (`install`'s contract);
            // - the consumer has read this slot: `head + offset - tail < capacity`, with `tail`
            //   loaded with Acquire after the consumer's Release store;
            // - only this thread writes slots (the caller is the only producer).
            unsafe { (*slots.add(index as usize)).with_mut(|slot| slot.write(event)) };
        }
        producer.head.store(head + N as u64, Ordering::Release);
        producer.busy.store(0, Ordering::Release);
        Pushed::Recorded
    }

    /// The ring looked full: rereads the consumer's `tail` (at most once every 64 drops) and
    /// says whether `needed` slots are free now. Producer only.
    #[cold]
    fn refresh_tail(&self, head: u64, needed: u64) -> bool {
        let producer = &self.producer;
        let skips = producer.drop_skips.load(Ordering::Relaxed);
        if skips > 0 {
            producer.drop_skips.store(skips - 1, Ordering::Relaxed);
            return false;
        }
        let tail = self.consumer.tail.load(Ordering::Acquire);
        producer.tail_cache.store(tail, Ordering::Relaxed);
        let room = head.wrapping_sub(tail) + needed <= self.capacity.load(Ordering::Relaxed);
        if !room {
            producer.drop_skips.store(63, Ordering::Relaxed);
        }
        room
    }

    /// Moves every published event into `out`, oldest first, and frees their slots.
    /// Returns how many were moved.
    ///
    /// # Safety
    ///
    /// The caller is the only consumer of this ring (the collector), and storage is installed.
    pub(crate) unsafe fn drain(&self, out: &mut impl Extend<RawEvent>) -> u64 {
        let slots = self.slots.load(Ordering::Acquire);
        let capacity = self.capacity.load(Ordering::Relaxed);
        let tail = self.consumer.tail.load(Ordering::Relaxed);
        let head = self.producer.head.load(Ordering::Acquire);
        let count = head.wrapping_sub(tail);
        out.extend((tail..head).map(|position| {
            let index = position & (capacity - 1);
            // SAFETY:
            // - `index < capacity` slots exist (`install`'s contract);
            // - the producer published this slot: `position < head`, loaded with Acquire after
            //   the producer's Release store of `head`;
            // - the producer does not reuse it until `tail` passes it, which happens below.
            unsafe { (*slots.add(index as usize)).with(|slot| *slot) }
        }));
        self.consumer.tail.store(head, Ordering::Release);
        count
    }

    /// Events dropped so far because the ring was full, by [`RawKind`].
    pub(crate) fn dropped(&self) -> [u64; RawKind::COUNT] {
        std::array::from_fn(|kind| self.producer.dropped[kind].load(Ordering::Relaxed))
    }

    /// In a forked child: the producer (a thread of the parent) did not survive the fork, so it
    /// is not between a gate check and its publish, whatever its flag said at the fork. Without
    /// this, [`Ring::wait_idle`] in the child's own session would wait for it forever. (Its
    /// unpublished event, if any, was never visible: `head` did not move.)
    #[cfg(not(loom))]
    pub(crate) fn clear_busy_after_fork(&self) {
        self.producer.busy.store(0, Ordering::Relaxed);
    }

    /// Waits until the producer is not between a gate check and its publish. After
    /// [`close_gate`], every event recorded under the open gate is then published. The
    /// producer never blocks inside, so this waits only while it is descheduled.
    pub(crate) fn wait_idle(&self) {
        #[cfg(not(loom))]
        let busy = || self.producer.busy.load(Ordering::SeqCst) != 0;
        #[cfg(loom)]
        let busy = || self.producer.busy.load(Ordering::Acquire) != 0;
        while busy() {
            #[cfg(not(loom))]
            std::thread::yield_now();
            #[cfg(loom)]
            loom::thread::yield_now();
        }
    }
}
