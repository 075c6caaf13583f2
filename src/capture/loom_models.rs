//! Model checks of the ring, the stop protocol and the registry (`RUSTFLAGS="--cfg loom"`).
//!
//! Each model runs the real code under every interleaving loom explores; each protocol has a
//! deliberately broken variant that loom must catch (`#[should_panic]`), so a model that stops
//! exploring would be noticed.

use loom::sync::Arc;
use loom::thread;

use super::raw::{RawEvent, RawKind};
use super::registry::{Registry, Slot, SlotState};
use super::ring::{close_gate, GateProtocol, Pushed, Ring};
use super::sync::{AtomicBool, AtomicU64, Ordering, SlotCell};

/// A ring with `capacity` slots and the storage that backs it.
struct Fixture {
    ring: Ring,
    _storage: Vec<SlotCell<RawEvent>>,
}

impl Fixture {
    fn new(capacity: u64) -> Fixture {
        let mut storage: Vec<SlotCell<RawEvent>> = (0..capacity)
            .map(|_| SlotCell::new(RawEvent::default()))
            .collect();
        let ring = Ring::new();
        // SAFETY: `storage` holds `capacity` slots and lives as long as the fixture (it is
        // never resized); nobody uses the ring yet.
        unsafe { ring.install(storage.as_mut_ptr(), capacity) };
        Fixture {
            ring,
            _storage: storage,
        }
    }
}

fn event(ticks: u64) -> [RawEvent; 1] {
    [RawEvent {
        ticks,
        kind: RawKind::Alloc as u8,
        ..RawEvent::default()
    }]
}

fn drain(ring: &Ring) -> Vec<RawEvent> {
    let mut out = Vec::new();
    // SAFETY: each model has one consumer thread at a time.
    unsafe { ring.drain(&mut out) };
    out
}

#[test]
fn ring_delivers_events_in_order_or_counts_them() {
    loom::model(|| {
        let fixture = Arc::new(Fixture::new(2));
        let gate = Arc::new(AtomicBool::new(true));
        let producer = {
            let (fixture, gate) = (fixture.clone(), gate.clone());
            thread::spawn(move || {
                for ticks in 1..=3 {
                    // SAFETY: this thread is the ring's only producer.
                    unsafe { fixture.ring.push(&gate, [RawKind::Alloc], || event(ticks)) };
                }
            })
        };
        let mut seen = drain(&fixture.ring);
        producer.join().unwrap();
        seen.extend(drain(&fixture.ring));
        let ticks: Vec<u64> = seen.iter().map(|e| e.ticks).collect();
        assert!(
            ticks.windows(2).all(|w| w[0] < w[1]),
            "out of order: {ticks:?}"
        );
        let dropped = fixture.ring.dropped()[RawKind::Alloc as usize];
        assert_eq!(seen.len() as u64 + dropped, 3);
    });
}

/// Runs a producer against a stopper and checks that an event the producer recorded is seen by
/// the stopper's final drain.
fn stop_model<P: GateProtocol>() {
    loom::model(|| {
        let fixture = Arc::new(Fixture::new(4));
        let gate = Arc::new(AtomicBool::new(true));
        let producer = {
            let (fixture, gate) = (fixture.clone(), gate.clone());
            // SAFETY: this thread is the ring's only producer.
            thread::spawn(move || unsafe {
                fixture
                    .ring
                    .push_with::<1, P>(&gate, [RawKind::Alloc], || event(1))
            })
        };
        close_gate(&gate);
        fixture.ring.wait_idle();
        let seen_at_stop = drain(&fixture.ring).len();
        let outcome = producer.join().unwrap();
        if outcome == Pushed::Recorded {
            assert_eq!(
                seen_at_stop, 1,
                "a recorded event was missed by the final drain"
            );
        }
    });
}

#[test]
fn stop_sees_every_recorded_event() {
    stop_model::<super::ring::Sound>();
}

/// Marks busy and reads the gate without ordering the two: the store-buffering outcome lets
/// the producer read an open gate while the stopper reads it idle.
struct NoFence;

impl GateProtocol for NoFence {
    fn enter(busy: &AtomicU64, gate: &AtomicBool) -> bool {
        busy.store(1, Ordering::Relaxed);
        gate.load(Ordering::Relaxed)
    }
}

#[test]
#[should_panic(expected = "missed by the final drain")]
fn stop_without_fence_misses_events() {
    stop_model::<NoFence>();
}

fn registry(slots: usize) -> Registry<Vec<Slot>> {
    Registry::with_slots((0..slots).map(|_| Slot::new()).collect())
}

#[test]
fn claim_gives_each_slot_one_owner() {
    loom::model(|| {
        let table = Arc::new(registry(1));
        let other = {
            let table = table.clone();
            thread::spawn(move || table.claim())
        };
        let mine = table.claim();
        let theirs = other.join().unwrap();
        assert!(mine.is_some() != theirs.is_some(), "{mine:?} {theirs:?}");
    });
}

#[test]
fn an_abandoned_claim_can_be_claimed_again() {
    loom::model(|| {
        let table = Arc::new(registry(1));
        let other = {
            let table = table.clone();
            thread::spawn(move || {
                if let Some(index) = table.claim() {
                    table.abandon(index);
                }
            })
        };
        other.join().unwrap();
        assert_eq!(
            table.claim(),
            Some(0),
            "an abandoned slot must be free again"
        );
    });
}

/// A thread claims a ring, records and exits (its ring is retired); the collector then drains
/// and frees it while the next thread tries to claim a ring and record. Whatever the collector
/// drains as the retired thread's must be its events (ticks 1), never the next owner's
/// (ticks 2). `drain_before_free` chooses the collector's order.
fn handover_model(drain_before_free: bool) {
    loom::model(move || {
        let table = Arc::new(registry(1));
        let fixture = Arc::new(Fixture::new(4));
        let gate = Arc::new(AtomicBool::new(true));
        let owner = |ticks: u64, retire: bool| {
            let (table, fixture, gate) = (table.clone(), fixture.clone(), gate.clone());
            thread::spawn(move || {
                if let Some(index) = table.claim() {
                    // SAFETY: this thread owns the ring (it claimed slot `index`).
                    unsafe { fixture.ring.push(&gate, [RawKind::Alloc], || event(ticks)) };
                    if retire {
                        table.retire(index);
                    }
                }
            })
        };
        owner(1, true).join().unwrap();
        let next = owner(2, false);
        assert_eq!(table.slots()[0].state(), SlotState::Retired);
        // The yield between the collector's two steps lets loom interleave the next owner
        // there; without it loom's search does not preempt between them.
        let seen = if drain_before_free {
            let seen = drain(&fixture.ring);
            thread::yield_now();
            table.free(0);
            seen
        } else {
            table.free(0);
            thread::yield_now();
            drain(&fixture.ring)
        };
        assert!(
            seen.iter().all(|e| e.ticks == 1),
            "the next owner's events were charged to the retired thread"
        );
        next.join().unwrap();
    });
}

#[test]
fn retired_ring_is_drained_before_reuse() {
    handover_model(true);
}

#[test]
#[should_panic(expected = "charged to the retired thread")]
fn freeing_before_draining_loses_events() {
    handover_model(false);
}
