//! The merge: per-ring queues of events in, one time order out, up to a watermark.
//!
//! Each ring is in time order on its own (one thread writes it, stamping each event as it
//! pushes it). Across rings, an event may be stamped before another ring's older-looking event
//! is published, so an event is handed out only once it is at or before the *watermark* the
//! caller gives: the clock reading taken before the drain, minus a short lag for what the
//! memory model does not order (a clock reading taken while the producer's busy mark is still
//! in its store buffer; a thread caught between reading its clock and publishing holds the
//! watermark, below).
//!
//! A ring the caller drained only partly (the drain stopped at its bound, so events remain in
//! the ring) *holds* the watermark at the stamp of the last event taken from it: the events
//! still in the ring are at least that new, and anything newer from another ring must wait for
//! them. The hold is lifted by the next drain that empties the ring. A ring whose producer was
//! caught mid-push (between its clock reading and its publish: a thread descheduled there would
//! otherwise publish a straggler) is passed as not emptied too, and
//! holds at the last stamp ever taken from it, even when its queue is empty. A ring caught
//! mid-push before it ever gave an event holds at the highest watermark released so far: its
//! producer marked itself busy after that watermark's clock reading was taken by an earlier
//! drain that saw it idle or did not see it at all, so its event is no older (a slot reused
//! by a new thread holds lower still, at its previous owner's last stamp).
//!
//! Events at the same stamp are handed out ring by ring, lower index first; within a ring,
//! in the order they were pushed. A straggler (an event pushed after newer ones were handed
//! out) is handed out at the next release like any other.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, VecDeque};

/// An event's time, the merge's order.
pub(crate) trait Stamp<T> {
    /// When `event` happened.
    fn stamp(&self, event: &T) -> u64;
}

impl<T, F: Fn(&T) -> u64> Stamp<T> for F {
    fn stamp(&self, event: &T) -> u64 {
        self(event)
    }
}

/// One ring's staged events and hold.
#[derive(Debug)]
struct Queue<T> {
    events: VecDeque<T>,
    /// Stamp of the last event taken from a ring that was not emptied by its last drain.
    hold: Option<u64>,
    /// Stamp of the last event ever taken from the ring.
    last: Option<u64>,
}

/// Per-ring queues merged into one time order; `stamp` gives an event's time.
#[derive(Debug)]
pub(crate) struct Merge<T, S> {
    queues: Vec<Queue<T>>,
    /// One entry per non-empty queue: (front stamp, ring).
    fronts: BinaryHeap<Reverse<(u64, usize)>>,
    stamp: S,
    /// The highest watermark events were released up to.
    released: u64,
    /// One past the highest ring ever pushed: the queues after it are empty and hold nothing,
    /// so [`Merge::hold`] looks at no more than the rings in use.
    active: usize,
    /// Events staged over all queues.
    total: usize,
    /// The highest stamp handed out so far.
    highest: u64,
    /// Events handed out with a stamp below one handed out before them ([`Merge::late`]).
    late: u64,
}

impl<T: Copy, S: Stamp<T>> Merge<T, S> {
    /// A merge of `rings` empty queues.
    pub(crate) fn new(rings: usize, stamp: S) -> Merge<T, S> {
        Merge {
            queues: (0..rings)
                .map(|_| Queue {
                    events: VecDeque::new(),
                    hold: None,
                    last: None,
                })
                .collect(),
            fronts: BinaryHeap::new(),
            stamp,
            released: 0,
            active: 0,
            total: 0,
            highest: 0,
            late: 0,
        }
    }

    /// Events handed out so far with a stamp below one handed out before them: stragglers,
    /// published after the merge had gone past their stamp, or a ring's own readings going
    /// back. The holds and the lag leave none in a sound capture; one would mean a clock
    /// reading they did not account for (two cores' counters that disagree, say).
    pub(crate) fn late(&self) -> u64 {
        self.late
    }

    /// Events staged for `ring`.
    pub(crate) fn staged(&self, ring: usize) -> usize {
        self.queues[ring].events.len()
    }

    /// Events staged over all rings.
    pub(crate) fn staged_total(&self) -> usize {
        self.total
    }

    /// Slots allocated over all queues beyond `keep` each: what staging holds on to beyond a
    /// small queue per ring.
    pub(crate) fn capacity_beyond(&self, keep: usize) -> usize {
        self.queues[..self.active]
            .iter()
            .map(|queue| queue.events.capacity().saturating_sub(keep))
            .sum()
    }

    /// Gives back the memory of queues that grew past `keep` events and now hold far fewer, so
    /// a backlog that has been merged does not stay resident.
    pub(crate) fn shrink_idle(&mut self, keep: usize) {
        for queue in &mut self.queues[..self.active] {
            let wanted = queue.events.len().max(keep);
            if queue.events.capacity() > 4 * wanted {
                queue.events.shrink_to(wanted);
            }
        }
    }

    /// Adds `events`, drained from `ring` oldest first. `emptied`: the drain took everything
    /// the ring had and no push was in flight; otherwise the ring holds the watermark at the
    /// last event ever taken from it (a ring that never gave an event, at the highest
    /// watermark released so far).
    pub(crate) fn push(&mut self, ring: usize, events: impl IntoIterator<Item = T>, emptied: bool) {
        self.append_with(ring, |queue| queue.extend(events));
        let queue = &mut self.queues[ring];
        queue.hold = if emptied {
            None
        } else {
            Some(queue.last.unwrap_or(self.released))
        };
    }

    /// Adds the events `fill` appends to `ring`'s queue (drained from the ring, oldest first)
    /// and returns what `fill` returns; the ring's hold is left as it was, for a
    /// [`Merge::push`] of what else the drain found. The drain moves events straight into the
    /// queue: no copy between, which on a busy ring is a pass over memory per event.
    pub(crate) fn append_with<R>(
        &mut self,
        ring: usize,
        fill: impl FnOnce(&mut VecDeque<T>) -> R,
    ) -> R {
        self.active = self.active.max(ring + 1);
        let queue = &mut self.queues[ring];
        let was_empty = queue.events.is_empty();
        let before = queue.events.len();
        let filled = fill(&mut queue.events);
        debug_assert!(queue.events.len() >= before, "`fill` may only append");
        self.total += queue.events.len() - before;
        if queue.events.len() > before {
            if let Some(last) = queue.events.back() {
                queue.last = Some(self.stamp.stamp(last));
            }
        }
        if was_empty {
            if let Some(front) = queue.events.front() {
                self.fronts.push(Reverse((self.stamp.stamp(front), ring)));
            }
        }
        filled
    }

    /// The lowest hold of a partly drained ring, if any.
    pub(crate) fn hold(&self) -> Option<u64> {
        self.queues[..self.active]
            .iter()
            .filter_map(|queue| queue.hold)
            .min()
    }

    /// Whether `ring` holds the watermark below `watermark`: it must be drained again before
    /// everything up to `watermark` can be handed out.
    pub(crate) fn holds_below(&self, ring: usize, watermark: u64) -> bool {
        self.queues[ring].hold.is_some_and(|hold| hold < watermark)
    }

    /// Hands every staged event stamped at or before `watermark` (and at or before every
    /// hold) to `out` with its ring, in time order. The ring with the oldest front hands out
    /// its events up to the next ring's front in one run, so the heap is touched once per run,
    /// not once per event.
    #[cfg(test)]
    pub(crate) fn release(&mut self, watermark: u64, out: impl FnMut(usize, T)) {
        self.release_at_most(watermark, usize::MAX, out);
    }

    /// As [`Merge::release`], but stops after `max` events; returns how many it handed out.
    /// The next call goes on in the same order, with any events pushed in between merged in
    /// as if they had been staged before. Each call clamps `watermark` to the holds as they
    /// stand then, which a push in between may have lifted, raised or lowered (a ring found
    /// mid-push holds at its last stamp): a lower hold ends the release early.
    #[cfg(test)]
    pub(crate) fn release_at_most(
        &mut self,
        watermark: u64,
        max: usize,
        mut out: impl FnMut(usize, T),
    ) -> usize {
        self.release_with_next(watermark, max, |ring, event, _| out(ring, event))
    }

    /// As [`Merge::release_at_most`], and `out` may also take the event that would be handed
    /// out right after the one it is given ([`Next::take_if`]), so that two events known to
    /// be adjacent in the merged order can be handled as one.
    pub(crate) fn release_with_next(
        &mut self,
        watermark: u64,
        max: usize,
        mut out: impl FnMut(usize, T, &mut Next<'_, T>),
    ) -> usize {
        let watermark = self.hold().map_or(watermark, |hold| hold.min(watermark));
        self.released = self.released.max(watermark);
        let mut handed = 0;
        while let Some(&Reverse((front, ring))) = self.fronts.peek() {
            if front > watermark || handed == max {
                break;
            }
            self.fronts.pop();
            // This ring runs while its events sort before the next ring's front, by (stamp,
            // ring) as the heap orders them, and stay within the watermark. The run is found
            // first, so that handing it out needs no check per event.
            let next_front = self.fronts.peek().map(|&Reverse(front)| front);
            let queue = &mut self.queues[ring];
            let room = max - handed;
            let mut run = 1;
            let mut after = None;
            // Late: below a stamp handed out before it, from another ring or (a clock that
            // stepped back) its own.
            let mut late = u64::from(front < self.highest);
            let mut highest = self.highest.max(front);
            for event in queue.events.range(1..) {
                let stamp = self.stamp.stamp(event);
                if run == room
                    || stamp > watermark
                    || next_front.is_some_and(|front| (stamp, ring) > front)
                {
                    after = Some(stamp);
                    break;
                }
                run += 1;
                late += u64::from(stamp < highest);
                highest = highest.max(stamp);
            }
            self.late += late;
            self.highest = highest;
            let mut at = 0;
            while at < run {
                let event = queue.events[at];
                at += 1;
                let mut next = Next {
                    run: &queue.events,
                    at: &mut at,
                    end: run,
                    taken: false,
                };
                out(ring, event, &mut next);
            }
            queue.events.drain(..run);
            handed += run;
            if let Some(stamp) = after {
                self.fronts.push(Reverse((stamp, ring)));
            }
        }
        self.total -= handed;
        handed
    }
}

/// The event a release would hand out next, when it is from the same ring as the one just
/// handed out: [`Merge::release_with_next`] lets its consumer take it at once.
#[derive(Debug)]
pub(crate) struct Next<'a, T> {
    /// The queue of the ring being released.
    run: &'a VecDeque<T>,
    /// The position of the next event in `run`.
    at: &'a mut usize,
    /// Where the ring's run ends: the events before it sort before every other ring's front,
    /// are within the watermark and within the release's bound.
    end: usize,
    taken: bool,
}

impl<T: Copy> Next<'_, T> {
    /// The event `n` places after the next one in this ring's queue, whether or not this
    /// release hands it out: for hints about what is coming, never to apply.
    #[inline]
    pub(crate) fn ahead(&self, n: usize) -> Option<&T> {
        self.run.get(*self.at + n)
    }

    /// Takes the next event of the merged order if it is this ring's next one and `wanted`
    /// accepts it: nothing from another ring sorts between the two. At most once per event
    /// handed out.
    #[inline]
    pub(crate) fn take_if(&mut self, wanted: impl FnOnce(&T) -> bool) -> Option<T> {
        if self.taken || *self.at >= self.end {
            return None;
        }
        let next = self.run[*self.at];
        if !wanted(&next) {
            return None;
        }
        self.taken = true;
        *self.at += 1;
        Some(next)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Events are (stamp, name).
    type Event = (u64, &'static str);

    fn merge(rings: usize) -> Merge<Event, fn(&Event) -> u64> {
        Merge::new(rings, |event: &Event| event.0)
    }

    fn release(merge: &mut Merge<Event, fn(&Event) -> u64>, watermark: u64) -> Vec<&'static str> {
        let mut out = Vec::new();
        merge.release(watermark, |_, (_, name)| out.push(name));
        out
    }

    #[test]
    fn events_come_out_in_time_order_only_up_to_the_watermark() {
        let mut m = merge(2);
        m.push(0, [(1, "a1"), (4, "a4"), (9, "a9")], true);
        m.push(1, [(2, "b2"), (3, "b3"), (10, "b10")], true);
        assert_eq!(release(&mut m, 4), ["a1", "b2", "b3", "a4"]);
        // Nothing newer than the watermark leaves, however long it waits.
        assert_eq!(release(&mut m, 8), Vec::<&str>::new());
        assert_eq!(release(&mut m, 9), ["a9"]);
        assert_eq!(release(&mut m, u64::MAX), ["b10"]);
    }

    #[test]
    fn an_event_at_the_watermark_is_released_and_one_after_it_is_not() {
        let mut m = merge(1);
        m.push(0, [(5, "at"), (6, "after")], true);
        assert_eq!(release(&mut m, 5), ["at"]);
    }

    #[test]
    fn a_partly_drained_ring_holds_the_watermark_at_its_last_drained_stamp() {
        let mut m = merge(2);
        // Ring 0's drain stopped at its bound after the event at 3: the rest of ring 0 (not yet
        // drained) is at least as new, and may be older than ring 1's events at 4 and 6.
        m.push(0, [(1, "a1"), (3, "a3")], false);
        m.push(1, [(2, "b2"), (3, "b3"), (4, "b4"), (6, "b6")], true);
        assert_eq!(m.hold(), Some(3));
        assert!(m.holds_below(0, 10) && !m.holds_below(1, 10));
        assert_eq!(release(&mut m, 10), ["a1", "b2", "a3", "b3"]);
        // The next drain takes the rest of ring 0, including an event older than b4.
        m.push(0, [(4, "a4"), (5, "a5")], true);
        assert_eq!(m.hold(), None);
        assert_eq!(release(&mut m, 10), ["a4", "b4", "a5", "b6"]);
    }

    #[test]
    fn a_ring_not_drained_at_all_keeps_holding_at_its_last_event() {
        let mut m = merge(2);
        m.push(0, [(1, "a1"), (2, "a2")], false);
        m.push(1, [(5, "b5")], true);
        assert_eq!(release(&mut m, 10), ["a1", "a2"]);
        // Its queue was full this round: nothing drained, not emptied.
        m.push(0, [], false);
        assert_eq!(release(&mut m, 10), Vec::<&str>::new());
        m.push(0, [(7, "a7")], true);
        assert_eq!(release(&mut m, 10), ["b5", "a7"]);
    }

    /// Holds are looked for only among rings ever pushed; one pushed after the others, at the
    /// far end of the table, still holds everything behind it.
    #[test]
    fn a_hold_on_the_highest_ring_pushed_is_kept() {
        let mut m = merge(8);
        m.push(0, [(5, "a5")], true);
        m.push(7, [(3, "h3")], false);
        assert_eq!(release(&mut m, 10), ["h3"]);
        m.push(7, [], true);
        assert_eq!(release(&mut m, 10), ["a5"]);
    }

    /// A producer caught between its clock reading and its publish: its ring is passed as not
    /// emptied, and holds at its last stamp even once its queue has been merged empty, so a
    /// newer event of another ring waits for the event still in flight.
    #[test]
    fn a_ring_with_a_push_in_flight_holds_even_when_its_queue_is_empty() {
        let mut m = merge(2);
        m.push(0, [(1, "a1")], true);
        m.push(1, [(2, "b2")], true);
        assert_eq!(release(&mut m, 10), ["a1", "b2"]);
        // Ring 0's producer is mid-push; ring 1 publishes something newer.
        m.push(0, [], false);
        m.push(1, [(6, "b6")], true);
        assert_eq!(release(&mut m, 10), Vec::<&str>::new());
        // The push lands (stamped 4, before b6) and the producer is idle again.
        m.push(0, [(4, "a4")], true);
        assert_eq!(release(&mut m, 10), ["a4", "b6"]);
    }

    #[test]
    fn a_ring_caught_mid_push_before_its_first_event_holds_at_the_last_release() {
        let mut m = merge(2);
        m.push(1, [(2, "b2")], true);
        assert_eq!(release(&mut m, 5), ["b2"]);
        // Ring 0's producer is in its first push; ring 1 publishes something newer.
        m.push(0, [], false);
        m.push(1, [(8, "b8")], true);
        assert_eq!(release(&mut m, 10), Vec::<&str>::new());
        // The push lands, stamped after the last release's watermark but before b8.
        m.push(0, [(6, "a6")], true);
        assert_eq!(release(&mut m, 10), ["a6", "b8"]);
    }

    #[test]
    fn a_drain_appended_in_place_merges_like_a_push_and_holds_at_its_last_event() {
        let mut m = merge(2);
        let moved = m.append_with(0, |queue| {
            queue.extend([(1, "a1"), (2, "a2")]);
            2
        });
        assert_eq!(moved, 2);
        // A second append to a queue with events: still one place in the order.
        m.append_with(0, |queue| queue.push_back((3, "a3")));
        // The drain left events in ring 0: it holds at its last event appended.
        m.push(0, std::iter::empty(), false);
        m.push(1, [(2, "b2"), (5, "b5")], true);
        assert_eq!(m.staged_total(), 5);
        assert!(m.holds_below(0, 4));
        assert_eq!(release(&mut m, 10), ["a1", "a2", "b2", "a3"]);
        m.push(0, std::iter::empty(), true);
        assert_eq!(release(&mut m, 10), ["b5"]);
        assert_eq!(m.staged_total(), 0);
    }

    #[test]
    fn ties_go_to_the_lower_ring_then_to_push_order() {
        let mut m = merge(3);
        m.push(2, [(5, "c5"), (5, "c5'")], true);
        m.push(0, [(5, "a5")], true);
        m.push(1, [(4, "b4"), (5, "b5")], true);
        assert_eq!(release(&mut m, 5), ["b4", "a5", "b5", "c5", "c5'"]);
    }

    #[test]
    fn a_straggler_is_released_at_the_next_round_not_lost() {
        let mut m = merge(2);
        m.push(0, [(10, "a10")], true);
        assert_eq!(release(&mut m, 20), ["a10"]);
        // Published late: stamped before what was already released.
        m.push(1, [(7, "b7"), (25, "b25")], true);
        assert_eq!(release(&mut m, 20), ["b7"]);
        assert_eq!(m.staged(1), 1);
    }

    #[test]
    fn stragglers_are_counted_and_events_in_order_are_not() {
        let mut m = merge(3);
        m.push(0, [(3, "a3"), (10, "a10")], true);
        m.push(1, [(5, "b5"), (10, "b10")], true);
        // Interleaved rings and equal stamps are the merge's own order, not lateness.
        assert_eq!(release(&mut m, 10), ["a3", "b5", "a10", "b10"]);
        assert_eq!(m.late(), 0);
        // Two events of a third ring, published after the merge passed their stamps, and one
        // it has not passed.
        m.push(2, [(4, "c4"), (9, "c9"), (12, "c12")], true);
        assert_eq!(release(&mut m, 20), ["c4", "c9", "c12"]);
        assert_eq!(m.late(), 2);
        // In order again from here: the count stays.
        m.push(0, [(15, "a15")], true);
        assert_eq!(release(&mut m, 20), ["a15"]);
        assert_eq!(m.late(), 2);
        // A ring whose own readings step back (its thread moved to a core whose counter is
        // behind): the events after the step are late, until the readings pass the highest.
        m.push(
            1,
            [(30, "b30"), (26, "b26"), (29, "b29"), (31, "b31")],
            true,
        );
        assert_eq!(release(&mut m, 40), ["b30", "b26", "b29", "b31"]);
        assert_eq!(m.late(), 4);
    }

    /// Released a few at a time, with another ring's events pushed between two calls, the
    /// events come out in the order one release of everything gives.
    #[test]
    fn a_release_in_chunks_keeps_the_order_of_one_release() {
        let mut whole = merge(3);
        let mut chunked = merge(3);
        for m in [&mut whole, &mut chunked] {
            m.push(0, [(1, "a1"), (4, "a4"), (6, "a6"), (9, "a9")], true);
            m.push(1, [(2, "b2"), (3, "b3"), (7, "b7")], true);
        }
        whole.push(2, [(5, "c5"), (8, "c8")], true);
        let want = release(&mut whole, 10);
        let mut got = Vec::new();
        assert_eq!(
            chunked.release_at_most(10, 3, |_, (_, name)| got.push(name)),
            3
        );
        chunked.push(2, [(5, "c5"), (8, "c8")], true);
        while chunked.release_at_most(10, 2, |_, (_, name)| got.push(name)) > 0 {}
        assert_eq!(got, want);
        assert_eq!(chunked.staged_total(), 0);
    }

    /// A ring found mid-push between two chunks holds at its last stamp: the release stops
    /// there, and what it held back comes out once the ring is idle again.
    #[test]
    fn a_ring_found_mid_push_between_chunks_ends_the_release_early() {
        let mut m = merge(2);
        m.push(0, [(1, "a1"), (2, "a2"), (6, "a6")], true);
        m.push(1, [(3, "b3"), (7, "b7")], true);
        let mut got = Vec::new();
        assert_eq!(m.release_at_most(10, 2, |_, (_, name)| got.push(name)), 2);
        // Ring 1's producer is caught mid-push: ring 1 holds at the last stamp taken from it
        // (7), so a9, though within the watermark, waits.
        m.push(1, [], false);
        m.push(0, [(9, "a9")], true);
        while m.release_at_most(10, 2, |_, (_, name)| got.push(name)) > 0 {}
        assert_eq!(got, ["a1", "a2", "b3", "a6", "b7"]);
        m.push(1, [(8, "b8")], true);
        while m.release_at_most(10, 2, |_, (_, name)| got.push(name)) > 0 {}
        assert_eq!(got, ["a1", "a2", "b3", "a6", "b7", "b8", "a9"]);
    }

    #[test]
    fn the_staged_total_follows_pushes_and_releases_and_idle_queues_give_memory_back() {
        let mut m = merge(2);
        m.push(0, (0..1000).map(|i| (i, "a")), true);
        m.push(1, [(5, "b")], true);
        assert_eq!(m.staged_total(), 1001);
        assert_eq!(m.release_at_most(u64::MAX, 10, |_, _| {}), 10);
        assert_eq!(m.staged_total(), 991);
        release(&mut m, u64::MAX);
        assert_eq!(m.staged_total(), 0);
        assert!(m.queues[0].events.capacity() >= 1000);
        assert!(m.capacity_beyond(16) >= 1000 - 16);
        m.shrink_idle(16);
        assert!(m.queues[0].events.capacity() < 64);
        assert!(m.capacity_beyond(64) == 0);
    }

    #[test]
    fn a_reallocs_halves_leave_in_order_even_when_the_watermark_falls_between_them() {
        let mut m = merge(2);
        // The old block's half is stamped before the inner realloc, the new block's after it;
        // another thread's event falls in between.
        m.push(0, [(3, "realloc from"), (8, "realloc to")], true);
        m.push(1, [(5, "other")], true);
        assert_eq!(release(&mut m, 6), ["realloc from", "other"]);
        assert_eq!(release(&mut m, 8), ["realloc to"]);
    }

    /// Releases everything up to `watermark`, taking each event's successor whenever
    /// `take_if` allows it; returns the events as handed out, the taken ones marked.
    fn release_taking(
        merge: &mut Merge<Event, fn(&Event) -> u64>,
        watermark: u64,
        max: usize,
    ) -> (usize, Vec<String>) {
        let mut out = Vec::new();
        let handed = merge.release_with_next(watermark, max, |_, event, next| {
            out.push(event.1.to_string());
            if let Some(taken) = next.take_if(|_| true) {
                out.push(format!("+{}", taken.1));
            }
        });
        (handed, out)
    }

    #[test]
    fn the_next_event_is_taken_only_when_nothing_from_another_ring_sorts_between() {
        let mut m = merge(2);
        m.push(
            0,
            [(1, "a1"), (2, "a2"), (3, "a3"), (6, "a6"), (7, "a7")],
            true,
        );
        m.push(1, [(4, "b4"), (6, "b6")], true);
        let (handed, got) = release_taking(&mut m, u64::MAX, usize::MAX);
        // a1 takes a2; a3 is handed on its own and cannot take a6, which sorts after b4; b4
        // cannot take b6, which ties with a6 and loses the tie to the lower ring; a6 cannot
        // take a7, which sorts after b6.
        assert_eq!(got, ["a1", "+a2", "a3", "b4", "a6", "b6", "a7"]);
        assert_eq!(handed, 7);
        assert_eq!(m.staged_total(), 0);
    }

    #[test]
    fn the_next_event_that_wins_its_tie_with_another_ring_is_taken() {
        let mut m = merge(2);
        m.push(0, [(1, "a1"), (4, "a4")], true);
        m.push(1, [(4, "b4")], true);
        // a4 ties with b4 and wins it, being of the lower ring, so a1 may take it.
        let (handed, got) = release_taking(&mut m, u64::MAX, usize::MAX);
        assert_eq!(got, ["a1", "+a4", "b4"]);
        assert_eq!(handed, 3);
    }

    #[test]
    fn the_next_event_is_not_taken_past_the_watermark_the_bound_or_a_refusal() {
        let mut m = merge(1);
        m.push(0, [(1, "a1"), (5, "a5")], true);
        let (handed, got) = release_taking(&mut m, 4, usize::MAX);
        assert_eq!((handed, got), (1, vec!["a1".to_string()]));
        let (handed, got) = release_taking(&mut m, u64::MAX, usize::MAX);
        assert_eq!((handed, got), (1, vec!["a5".to_string()]));

        m.push(0, [(6, "a6"), (7, "a7"), (8, "a8")], true);
        let (handed, got) = release_taking(&mut m, u64::MAX, 1);
        assert_eq!((handed, got), (1, vec!["a6".to_string()]));
        let mut refused = Vec::new();
        m.release_with_next(u64::MAX, usize::MAX, |_, event, next| {
            refused.push(event.1);
            assert!(next.take_if(|_| false).is_none());
        });
        assert_eq!(refused, ["a7", "a8"]);
        assert_eq!(m.staged_total(), 0);
    }

    #[test]
    fn a_look_ahead_sees_the_rings_queued_events_past_the_release() {
        let mut m = merge(1);
        m.push(0, [(1, "a1"), (2, "a2"), (3, "a3"), (9, "a9")], true);
        let mut seen = Vec::new();
        // Only up to stamp 3 is released; the hint still sees what is queued after it.
        m.release_with_next(3, usize::MAX, |_, event, next| {
            seen.push((
                event.1,
                next.ahead(0).map(|e| e.1),
                next.ahead(1).map(|e| e.1),
            ));
        });
        assert_eq!(
            seen,
            [
                ("a1", Some("a2"), Some("a3")),
                ("a2", Some("a3"), Some("a9")),
                ("a3", Some("a9"), None)
            ]
        );
        assert_eq!(m.staged_total(), 1);
    }

    #[test]
    fn taking_the_next_event_keeps_the_order_of_a_plain_release() {
        // Three rings with interleaved stamps and ties, released in chunks: handing out one
        // event and its taken successor gives the plain release's order.
        let stamps: [&[u64]; 3] = [
            &[1, 2, 2, 5, 9, 9, 10],
            &[2, 3, 4, 9, 11],
            &[0, 5, 5, 6, 12],
        ];
        let names: [&[&'static str]; 3] = [
            &["a0", "a1", "a2", "a3", "a4", "a5", "a6"],
            &["b0", "b1", "b2", "b3", "b4"],
            &["c0", "c1", "c2", "c3", "c4"],
        ];
        let fill = |m: &mut Merge<Event, fn(&Event) -> u64>| {
            for (ring, ring_stamps) in stamps.iter().enumerate() {
                m.push(
                    ring,
                    ring_stamps.iter().copied().zip(names[ring].iter().copied()),
                    true,
                );
            }
        };
        let mut plain = merge(3);
        fill(&mut plain);
        let expected = release(&mut plain, u64::MAX);
        for chunk in 1..5 {
            let mut taking = merge(3);
            fill(&mut taking);
            let mut got = Vec::new();
            // Each release hands out at least one event, so this many rounds are enough.
            for _ in 0..expected.len() {
                if taking.staged_total() == 0 {
                    break;
                }
                let (_, out) = release_taking(&mut taking, u64::MAX, chunk);
                got.extend(
                    out.into_iter()
                        .map(|name| name.trim_start_matches('+').to_string()),
                );
            }
            assert_eq!(got, expected, "chunks of {chunk}");
        }
    }
}
