//! Model checks of the ring, the waiting protocol, the stop protocol, the registry and the
//! out-of-memory tickets (`RUSTFLAGS="--cfg highwater_loom"`).
//!
//! Each model runs the real code under every interleaving loom explores; each protocol has a
//! deliberately broken variant that loom must catch (`#[should_panic]`), so a model that stops
//! exploring would be noticed. Under loom a producer's timed park is an untimed one (see
//! `wake`), so the waiting models prove that no wait needs its timeout to end.

use loom::sync::Arc;
use loom::thread;

use super::gate::{close_gate, GateProtocol, Sound};
use super::oom::{Collector, SoundTicket, TicketProtocol, Tickets, Waited, OOM_CHECKPOINT_WAIT};
use super::raw::{RawEvent, RawKind};
use super::registry::{Registry, Slot, SlotState};
use super::ring::{ParkProtocol, Pushed, Ring, SoundPark, WhenFull};
use super::sync::WaitWord;
use super::sync::{fence, AtomicBool, AtomicU32, AtomicU64, Ordering, SlotCell};
use loom::sync::atomic::AtomicUsize;

/// The session's answers to a producer with a full ring, as a model sets them, and the
/// collector's doorbell.
struct Policy {
    lossless: bool,
    serving: AtomicBool,
    bell: WaitWord,
}

impl Policy {
    fn new(lossless: bool) -> Policy {
        Policy {
            lossless,
            serving: AtomicBool::new(true),
            bell: WaitWord::new(0),
        }
    }

    fn ring_bell(&self) {
        self.bell.word().fetch_add(1, Ordering::Release);
        self.bell.wake_all();
    }
}

impl WhenFull for Policy {
    fn lossless(&self) -> bool {
        self.lossless
    }
    fn collector_serves(&self) -> bool {
        self.serving.load(Ordering::Acquire)
    }
    fn wake_collector(&self) {
        self.ring_bell();
    }
    fn note_wait(&self) {}
    fn fit_storage(&self, _ring: &Ring) {}
}

/// Drop mode: the models that do not wait.
fn dropping() -> Policy {
    Policy::new(false)
}

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
        unsafe { ring.replace_storage(storage.as_mut_ptr(), capacity) };
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
                    unsafe {
                        fixture
                            .ring
                            .push(&gate, [RawKind::Alloc], &dropping(), || event(ticks))
                    };
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
                fixture.ring.push_with::<1, P, SoundPark>(
                    &gate,
                    [RawKind::Alloc],
                    &dropping(),
                    || event(1),
                )
            })
        };
        close_gate(&gate);
        while fixture.ring.is_busy() {
            thread::yield_now();
        }
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
    stop_model::<Sound>();
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
                    unsafe {
                        fixture
                            .ring
                            .push(&gate, [RawKind::Alloc], &dropping(), || event(ticks))
                    };
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

/// A thread has exited (its ring retired) and the next one finds the one-slot table full: it
/// waits for the collector to free the retired ring, and gets it, however the free and the
/// claim interleave; nobody sleeps for ever (loom's futex is untimed, so a missed wake would
/// be a deadlock).
#[test]
fn a_thread_that_finds_the_table_full_waits_for_a_retired_ring() {
    loom::model(|| {
        let table = Arc::new(registry(1));
        let first = table.claim().expect("an empty table has a slot");
        table.retire(first);
        let next = {
            let table = table.clone();
            thread::spawn(move || table.claim_or_wait(|| true, std::time::Duration::from_millis(1)))
        };
        // The collector: drains (nothing here) and frees the retired ring.
        table.free(first);
        assert_eq!(next.join().unwrap(), Some(0));
    });
}

/// With every slot owned by a live thread there is nothing to wait for: the claim fails at once
/// (the events are counted as dropped) instead of waiting for a thread that may never exit.
#[test]
fn a_table_full_of_live_threads_is_not_waited_for() {
    loom::model(|| {
        let table = Arc::new(registry(1));
        let _live = table.claim().expect("an empty table has a slot");
        let next = {
            let table = table.clone();
            thread::spawn(move || table.claim_or_wait(|| true, std::time::Duration::from_millis(1)))
        };
        assert_eq!(next.join().unwrap(), None);
    });
}

/// Runs `model` under loom with at most three preemptions per execution: the waiting models
/// have two sleeping threads and a mutex-modelled futex each, and unbounded they do not finish.
/// Loom's documentation recommends a small bound; the bugs it must find (a missed wake) need
/// one or two preemptions.
fn bounded(model: impl Fn() + Sync + Send + 'static) {
    let mut builder = loom::model::Builder::new();
    builder.preemption_bound = Some(3);
    builder.check(model);
}

/// A lossless producer pushes two events through a one-slot ring while the collector drains,
/// then sleeps on its bell until a producer rings it (the last ring stands for its interval
/// timer). Every event arrives, in order, none is dropped, and nobody sleeps for ever: with a
/// park that can miss the collector's wake, loom finds the deadlock.
fn waiting_model<W: ParkProtocol + 'static>() {
    bounded(|| {
        // Leaked, not shared by `Arc`: when loom reports the broken variant's deadlock it
        // unwinds, and dropping loom objects during that unwind aborts the process.
        let fixture: &'static Fixture = Box::leak(Box::new(Fixture::new(1)));
        let gate: &'static AtomicBool = Box::leak(Box::new(AtomicBool::new(true)));
        let policy: &'static Policy = Box::leak(Box::new(Policy::new(true)));
        let producer = {
            thread::spawn(move || {
                for ticks in 1..=2 {
                    // SAFETY: this thread is the ring's only producer.
                    let pushed = unsafe {
                        fixture.ring.push_with::<1, Sound, W>(
                            &gate,
                            [RawKind::Alloc],
                            &*policy,
                            || event(ticks),
                        )
                    };
                    assert_eq!(pushed, Pushed::Recorded);
                }
            })
        };
        let collector = {
            thread::spawn(move || {
                let mut seen = Vec::new();
                loop {
                    let bell = policy.bell.word().load(Ordering::Acquire);
                    seen.extend(drain(&fixture.ring));
                    if seen.len() == 2 {
                        return seen;
                    }
                    policy.bell.wait(bell, None);
                }
            })
        };
        producer.join().unwrap();
        policy.ring_bell();
        let seen = collector.join().unwrap();
        let ticks: Vec<u64> = seen.iter().map(|e| e.ticks).collect();
        assert_eq!(ticks, [1, 2]);
        assert_eq!(fixture.ring.dropped()[RawKind::Alloc as usize], 0);
    });
}

#[test]
fn a_waiting_producer_is_woken_by_the_drain() {
    waiting_model::<SoundPark>();
}

/// Checks for room *before* registering as parked, then sleeps with no timeout: a drain between
/// the check and the registration sees nobody parked and wakes nobody.
struct CheckThenRegister;

impl ParkProtocol for CheckThenRegister {
    fn park(parked: &WaitWord, ready: &dyn Fn() -> bool) -> bool {
        if ready() {
            return true;
        }
        parked.word().store(1, Ordering::Relaxed);
        parked.wait(1, None);
        parked.word().store(0, Ordering::Relaxed);
        false
    }
}

#[test]
#[should_panic(expected = "deadlock")]
fn a_park_that_checks_before_registering_can_sleep_for_ever() {
    waiting_model::<CheckThenRegister>();
}

/// The session stops while a lossless producer waits for room in a full ring: the stopper
/// closes the gate and keeps draining while the producer is busy, so the producer finishes its
/// push and the final drain has its event. (The ring holds one slot, already taken.)
#[test]
fn stop_releases_a_waiting_producer_and_keeps_its_event() {
    loom::model(|| {
        let fixture = Arc::new(Fixture::new(1));
        let gate = Arc::new(AtomicBool::new(true));
        let policy = Arc::new(Policy::new(true));
        // SAFETY: nothing else uses the ring yet.
        let first = unsafe {
            fixture
                .ring
                .push(&gate, [RawKind::Alloc], &dropping(), || event(1))
        };
        assert_eq!(first, Pushed::Recorded);
        let producer = {
            let (fixture, gate, policy) = (fixture.clone(), gate.clone(), policy.clone());
            // SAFETY: this thread is the ring's only producer from now on.
            thread::spawn(move || unsafe {
                fixture
                    .ring
                    .push(&gate, [RawKind::Alloc], &*policy, || event(2))
            })
        };
        close_gate(&gate);
        let mut seen = Vec::new();
        loop {
            let busy = fixture.ring.is_busy();
            seen.extend(drain(&fixture.ring));
            if !busy {
                break;
            }
            thread::yield_now();
        }
        let outcome = producer.join().unwrap();
        assert_ne!(
            outcome,
            Pushed::Dropped,
            "a lossless producer dropped at stop"
        );
        let expected = if outcome == Pushed::Recorded { 2 } else { 1 };
        assert_eq!(seen.len(), expected, "the stop lost a recorded event");
    });
}

/// The collector goes away (it ended, or this is a forked child) while a producer waits for
/// room: it stops serving and releases parked producers, which give up and count the event.
#[test]
fn a_collector_that_stops_serving_releases_waiters() {
    loom::model(|| {
        let fixture = Arc::new(Fixture::new(1));
        let gate = Arc::new(AtomicBool::new(true));
        let policy = Arc::new(Policy::new(true));
        // SAFETY: nothing else uses the ring yet.
        unsafe {
            fixture
                .ring
                .push(&gate, [RawKind::Alloc], &dropping(), || event(1))
        };
        let producer = {
            let (fixture, gate, policy) = (fixture.clone(), gate.clone(), policy.clone());
            // SAFETY: this thread is the ring's only producer from now on.
            thread::spawn(move || unsafe {
                fixture
                    .ring
                    .push(&gate, [RawKind::Alloc], &*policy, || event(2))
            })
        };
        policy.serving.store(false, Ordering::Relaxed);
        super::sync::fence(Ordering::SeqCst);
        fixture.ring.release_parked();
        assert_eq!(producer.join().unwrap(), Pushed::Dropped);
        assert_eq!(fixture.ring.dropped()[RawKind::Alloc as usize], 1);
    });
}

impl Collector for Policy {
    fn serves(&self) -> bool {
        self.serving.load(Ordering::Acquire)
    }
    fn ring(&self) {
        self.ring_bell();
    }
}

/// A refused thread records its refusal (an OOM event in its ring) and waits for its
/// checkpoint while the collector sleeps on its bell; the collector answers the first ticket it
/// sees with a checkpoint of everything it drains then. The thread is answered, and the
/// checkpoint that answered it holds its refusal; nobody sleeps for ever (the collector's
/// interval timer is left out, so a ticket it could miss would deadlock). The tickets start at
/// `u32::MAX`, so the ticket taken wraps to 0.
fn refusal_model<P: TicketProtocol + 'static>() {
    bounded(|| {
        const START: u32 = u32::MAX;
        // Leaked, as in `waiting_model`.
        let fixture: &'static Fixture = Box::leak(Box::new(Fixture::new(2)));
        let gate: &'static AtomicBool = Box::leak(Box::new(AtomicBool::new(true)));
        let policy: &'static Policy = Box::leak(Box::new(Policy::new(true)));
        let tickets: &'static Tickets = Box::leak(Box::new(Tickets::starting_at(START)));
        // Refusals in the checkpoint on disk (`usize::MAX`: none written yet).
        let on_disk: &'static AtomicUsize = Box::leak(Box::new(AtomicUsize::new(usize::MAX)));
        let refused = thread::spawn(move || {
            let waited = tickets.wait_after::<P>(
                || {
                    // SAFETY: this thread is the ring's only producer.
                    let pushed = unsafe {
                        fixture
                            .ring
                            .push(&gate, [RawKind::Oom], &dropping(), || oom_event())
                    };
                    pushed == Pushed::Recorded
                },
                policy,
                OOM_CHECKPOINT_WAIT,
            );
            (waited, on_disk.load(Ordering::Acquire))
        });
        let collector = thread::spawn(move || {
            // Read before the gate opened in the real collector: earlier tickets are not its.
            let mut answered = START;
            loop {
                let bell = policy.bell.word().load(Ordering::Acquire);
                let asked = tickets.asked();
                if asked != answered {
                    // The checkpoint: everything published by now, merged and "written".
                    let refusals = drain(&fixture.ring)
                        .iter()
                        .filter(|e| e.kind == RawKind::Oom as u8)
                        .count();
                    on_disk.store(refusals, Ordering::Release);
                    tickets.written(asked);
                    answered = asked;
                }
                if answered != START {
                    return;
                }
                policy.bell.wait(bell, None);
            }
        });
        let (waited, checkpointed) = refused.join().unwrap();
        collector.join().unwrap();
        assert_eq!(waited, Waited::Answered);
        assert_eq!(
            checkpointed, 1,
            "the checkpoint that answered the refusal does not hold it"
        );
    });
}

fn oom_event() -> [RawEvent; 1] {
    [RawEvent {
        ticks: 1,
        kind: RawKind::Oom as u8,
        ..RawEvent::default()
    }]
}

#[test]
fn a_refusal_is_answered_by_a_checkpoint_that_holds_it() {
    refusal_model::<SoundTicket>();
}

/// Takes the ticket before the refusal is published: a collector that sees the ticket can
/// drain before the event is there and answer with a checkpoint that lacks it.
struct TicketBeforeRecord;

impl TicketProtocol for TicketBeforeRecord {
    fn take(asked: &AtomicU32, record: impl FnOnce() -> bool) -> Option<u32> {
        let ticket = asked.fetch_add(1, Ordering::SeqCst).wrapping_add(1);
        fence(Ordering::SeqCst);
        record().then_some(ticket)
    }
}

#[test]
#[should_panic(expected = "does not hold it")]
fn a_ticket_taken_before_the_refusal_is_answered_without_it() {
    refusal_model::<TicketBeforeRecord>();
}

/// The collector stops serving (the session stopped; `collector_stopped`, then the collector's
/// `release_waiters`) while a refused thread waits for its checkpoint, which nobody will write.
/// The thread's wait ends without its timeout: released, or it saw that nobody serves. With
/// `release` false the stopper forgets the release.
fn refused_stop_model<P: TicketProtocol + 'static>(release: bool) {
    bounded(move || {
        // Leaked, as in `waiting_model`.
        let policy: &'static Policy = Box::leak(Box::new(Policy::new(true)));
        let tickets: &'static Tickets = Box::leak(Box::new(Tickets::starting_at(0)));
        let refused =
            thread::spawn(move || tickets.wait_after::<P>(|| true, policy, OOM_CHECKPOINT_WAIT));
        policy.serving.store(false, Ordering::SeqCst);
        fence(Ordering::SeqCst);
        if release {
            tickets.release_waiters();
        }
        let waited = refused.join().unwrap();
        assert!(
            matches!(waited, Waited::Answered | Waited::Unserved),
            "{waited:?}"
        );
    });
}

#[test]
fn a_stop_releases_a_refused_thread() {
    refused_stop_model::<SoundTicket>(true);
}

#[test]
#[should_panic(expected = "deadlock")]
fn a_stop_that_does_not_release_can_leave_a_refused_thread_asleep() {
    refused_stop_model::<SoundTicket>(false);
}

/// Takes the ticket and reads whether the collector serves without a fence between (loom, like
/// the C++ model, does not order an SC access before a later acquire load of another atomic):
/// the store-buffering outcome lets the thread read "serving" while the stopper reads no
/// ticket, and the release covers nothing.
struct TicketWithoutFence;

impl TicketProtocol for TicketWithoutFence {
    fn take(asked: &AtomicU32, record: impl FnOnce() -> bool) -> Option<u32> {
        if !record() {
            return None;
        }
        Some(asked.fetch_add(1, Ordering::SeqCst).wrapping_add(1))
    }
}

#[test]
#[should_panic(expected = "deadlock")]
fn a_ticket_without_a_fence_can_miss_the_stop() {
    refused_stop_model::<TicketWithoutFence>(true);
}

/// Two threads are refused at once, each recording into its own ring; the collector (this
/// thread) answers whatever tickets it sees with a checkpoint of everything drained so far,
/// until both are answered. Each thread is answered by a checkpoint that holds its own refusal,
/// whether one checkpoint answers both or a later one answers the second ticket.
#[test]
fn two_refusals_are_each_answered_by_a_checkpoint_that_holds_them() {
    bounded(|| {
        // Leaked, as in `waiting_model`.
        let rings: &'static [Fixture; 2] = Box::leak(Box::new([Fixture::new(1), Fixture::new(1)]));
        let gate: &'static AtomicBool = Box::leak(Box::new(AtomicBool::new(true)));
        let policy: &'static Policy = Box::leak(Box::new(Policy::new(true)));
        let tickets: &'static Tickets = Box::leak(Box::new(Tickets::starting_at(0)));
        // Bit `i` set: the checkpoint on disk holds thread `i`'s refusal.
        let on_disk: &'static AtomicUsize = Box::leak(Box::new(AtomicUsize::new(0)));
        let refused: Vec<_> = (0..2)
            .map(|i| {
                thread::spawn(move || {
                    let waited = tickets.wait_after::<SoundTicket>(
                        || {
                            // SAFETY: this thread is ring `i`'s only producer.
                            let pushed = unsafe {
                                rings[i]
                                    .ring
                                    .push(&gate, [RawKind::Oom], &dropping(), || oom_event())
                            };
                            pushed == Pushed::Recorded
                        },
                        policy,
                        OOM_CHECKPOINT_WAIT,
                    );
                    (waited, on_disk.load(Ordering::Acquire) & (1 << i) != 0)
                })
            })
            .collect();
        let mut answered = 0;
        let mut held = 0;
        while answered != 2 {
            let bell = policy.bell.word().load(Ordering::Acquire);
            let asked = tickets.asked();
            if asked != answered {
                for (i, fixture) in rings.iter().enumerate() {
                    if !drain(&fixture.ring).is_empty() {
                        held |= 1 << i;
                    }
                }
                on_disk.store(held, Ordering::Release);
                tickets.written(asked);
                answered = asked;
                continue;
            }
            policy.bell.wait(bell, None);
        }
        for thread in refused {
            let (waited, holds_mine) = thread.join().unwrap();
            assert_eq!(waited, Waited::Answered);
            assert!(holds_mine, "a thread was answered without its refusal");
        }
    });
}
