use std::cell::Cell;

use super::*;

impl Ring {
    /// Moves an empty ring's positions to `position`, as if `position` events had passed
    /// through it: lets a test reach the `u64` wrap without pushing 2^64 events.
    fn start_at(&self, position: u64) {
        assert!(self.is_empty(), "only an empty ring can be moved");
        self.producer.head.store(position, Ordering::Relaxed);
        self.consumer.tail.store(position, Ordering::Relaxed);
        self.reset_producer();
    }
}

/// Drop mode with no collector: a full ring drops at once. Counts the collector's wake-ups.
#[derive(Default)]
struct Dropping {
    wakes: Cell<u32>,
}

impl WhenFull for Dropping {
    fn lossless(&self) -> bool {
        false
    }
    fn collector_serves(&self) -> bool {
        false
    }
    fn wake_collector(&self) {
        self.wakes.set(self.wakes.get() + 1);
    }
    fn note_wait(&self) {}
    fn fit_storage(&self, _ring: &Ring) {}
}

/// A ring with `capacity` slots on the heap (plain `Vec` storage, so Miri can check it).
struct Fixture {
    ring: Ring,
    policy: Dropping,
    _storage: Vec<SlotCell<RawEvent>>,
}

impl Fixture {
    fn new(capacity: u64) -> Fixture {
        let mut storage: Vec<SlotCell<RawEvent>> =
            (0..capacity).map(|_| SlotCell::default()).collect();
        let ring = Ring::new();
        // SAFETY: `storage` holds `capacity` initialised slots and lives as long as the
        // ring (both are in the fixture, and its heap buffer never moves); the ring is new,
        // so empty, and nobody else produces into it.
        let old = unsafe { ring.replace_storage(storage.as_mut_ptr(), capacity) };
        assert!(old.is_none());
        Fixture {
            ring,
            policy: Dropping::default(),
            _storage: storage,
        }
    }

    /// Pushes one allocation stamped `ticks`.
    fn push(&self, ticks: u64) -> Pushed {
        self.push_unit([ticks])
    }

    /// Pushes `ticks.len()` events as one unit (like a realloc's two halves).
    fn push_unit<const N: usize>(&self, ticks: [u64; N]) -> Pushed {
        let gate = AtomicBool::new(true);
        let events = ticks.map(|ticks| RawEvent {
            ticks,
            ..RawEvent::default()
        });
        // SAFETY: this test is the ring's only producer; storage is installed.
        unsafe {
            self.ring
                .push(&gate, [RawKind::Alloc; N], &self.policy, || events)
        }
    }

    /// Drains at most `max` events and returns their stamps.
    fn drain_at_most(&self, max: u64) -> Vec<u64> {
        let mut out = Vec::new();
        // SAFETY: this test is the ring's only consumer; storage is installed.
        let moved = unsafe { self.ring.drain_at_most(&mut out, max) };
        assert_eq!(moved, out.len() as u64);
        out.into_iter().map(|event| event.ticks).collect()
    }

    fn drain(&self) -> Vec<u64> {
        self.drain_at_most(u64::MAX)
    }

    fn dropped(&self) -> u64 {
        self.ring.dropped()[RawKind::Alloc as usize]
    }
}

#[test]
fn events_come_out_in_order_after_wrapping_past_capacity_many_times() {
    let ring = Fixture::new(8);
    let mut next = 0u64;
    let mut expected = 0u64;
    // Batch sizes that do not divide the capacity, so batches straddle the slot wrap at
    // every offset; 240 batches are 1080 events, 135 trips around 8 slots.
    for batch in [1u64, 3, 5, 7, 8, 2, 6, 4].iter().cycle().take(240) {
        for _ in 0..*batch {
            assert_eq!(ring.push(next), Pushed::Recorded, "event {next}");
            next += 1;
        }
        let drained = ring.drain();
        assert_eq!(drained, (expected..next).collect::<Vec<_>>());
        expected = next;
    }
    assert_eq!(next, 1080, "135 trips around 8 slots");
    assert_eq!(ring.dropped(), 0);
    assert!(ring.ring.is_empty());
}

#[test]
fn positions_carry_on_past_the_u64_wrap() {
    let ring = Fixture::new(8);
    ring.ring.start_at(u64::MAX - 2);
    // Eight events fill the ring from position 2^64 - 3 to 4 (wrapped).
    for ticks in 0..8 {
        assert_eq!(ring.push(ticks), Pushed::Recorded, "event {ticks}");
    }
    assert_eq!(
        ring.push(8),
        Pushed::Dropped,
        "an 8-slot ring took a ninth event"
    );
    assert_eq!(ring.dropped(), 1);
    assert_eq!(ring.drain_at_most(5), vec![0, 1, 2, 3, 4]);
    // After a drop the producer skips re-reading `tail` for a while (drop mode); a fresh
    // view lets it see the room the drain made.
    ring.ring.reset_producer();
    for ticks in 8..13 {
        assert_eq!(ring.push(ticks), Pushed::Recorded, "event {ticks}");
    }
    assert_eq!(ring.push(13), Pushed::Dropped);
    assert_eq!(ring.drain(), (5..13).collect::<Vec<_>>());
    assert!(ring.ring.is_empty());
    assert_eq!(ring.ring.producer.head.load(Ordering::Relaxed), 10);
}

#[test]
fn partial_drains_hand_out_the_oldest_events_and_free_exactly_their_slots() {
    let ring = Fixture::new(16);
    ring.ring.start_at(u64::MAX - 20);
    let mut next = 0u64;
    let mut expected = 0u64;
    for round in 0..100u64 {
        // Fill what is free, then drain a varying part of it.
        while ring.push(next) == Pushed::Recorded {
            next += 1;
        }
        assert_eq!(
            next - expected,
            16,
            "round {round}: the ring holds its capacity"
        );
        ring.ring.reset_producer();
        let take = round % 16 + 1;
        let drained = ring.drain_at_most(take);
        assert_eq!(drained, (expected..expected + take).collect::<Vec<_>>());
        expected += take;
        // Exactly `take` slots came free.
        for _ in 0..take {
            assert_eq!(ring.push(next), Pushed::Recorded, "event {next}");
            next += 1;
        }
        assert_eq!(ring.push(next), Pushed::Dropped);
        ring.ring.reset_producer();
    }
    assert_eq!(ring.drain(), (expected..next).collect::<Vec<_>>());
    assert_eq!(ring.dropped(), 200);
}

#[test]
fn a_unit_straddling_the_slot_wrap_comes_out_whole_and_in_order() {
    let ring = Fixture::new(8);
    // Seven single events leave the unit's halves in slots 7 and 0.
    for ticks in 0..7 {
        assert_eq!(ring.push(ticks), Pushed::Recorded);
    }
    assert_eq!(ring.drain(), (0..7).collect::<Vec<_>>());
    for ticks in 7..13 {
        assert_eq!(ring.push(ticks), Pushed::Recorded);
    }
    assert_eq!(ring.push_unit([100, 101]), Pushed::Recorded);
    assert_eq!(ring.drain(), vec![7, 8, 9, 10, 11, 12, 100, 101]);
}

#[test]
fn a_unit_straddling_the_u64_wrap_comes_out_whole_and_in_order() {
    let ring = Fixture::new(8);
    ring.ring.start_at(u64::MAX);
    assert_eq!(ring.push_unit([100, 101]), Pushed::Recorded);
    assert_eq!(ring.ring.producer.head.load(Ordering::Relaxed), 1);
    assert_eq!(ring.drain(), vec![100, 101]);
}

#[test]
fn a_unit_that_does_not_fit_is_dropped_whole_never_half_written() {
    let ring = Fixture::new(8);
    ring.ring.start_at(u64::MAX - 3);
    for ticks in 0..7 {
        assert_eq!(ring.push(ticks), Pushed::Recorded);
    }
    // One slot is free: a two-event unit does not fit, and both its events are counted.
    assert_eq!(ring.push_unit([100, 101]), Pushed::Dropped);
    assert_eq!(ring.dropped(), 2);
    assert_eq!(ring.drain(), (0..7).collect::<Vec<_>>());
    ring.ring.reset_producer();
    assert_eq!(ring.push_unit([102, 103]), Pushed::Recorded);
    assert_eq!(ring.drain(), vec![102, 103]);
}

#[test]
fn the_collector_is_rung_once_the_ring_passes_half_full_even_across_the_wrap() {
    let ring = Fixture::new(8);
    ring.ring.start_at(u64::MAX - 1);
    for ticks in 0..4 {
        assert_eq!(ring.push(ticks), Pushed::Recorded);
    }
    assert_eq!(ring.policy.wakes.get(), 0, "rung at or below half full");
    assert_eq!(ring.push(4), Pushed::Recorded);
    assert_eq!(ring.policy.wakes.get(), 1, "not rung past half full");
    ring.drain();
}

#[test]
fn a_closed_gate_writes_and_counts_nothing() {
    let ring = Fixture::new(8);
    let gate = AtomicBool::new(false);
    // SAFETY: this test is the ring's only producer; storage is installed.
    let pushed = unsafe {
        ring.ring.push(
            &gate,
            [RawKind::Alloc],
            &ring.policy,
            || -> [RawEvent; 1] { panic!("stamped behind a closed gate") },
        )
    };
    assert_eq!(pushed, Pushed::GateClosed);
    assert_eq!(ring.dropped(), 0);
    assert!(ring.drain().is_empty());
    assert!(!ring.ring.is_busy());
}
