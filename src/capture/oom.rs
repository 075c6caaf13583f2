//! The moment of OOM: a thread whose allocation was refused asks for a checkpoint and waits,
//! boundedly, until the collector's writer has put one on disk that includes the refusal.
//!
//! Rust aborts the process when a global allocation returns null (`handle_alloc_error`), and a
//! training step that a device pool refuses usually ends the run too, so this is the last moment
//! a profile can be saved. The failing thread writes nothing itself: it records its refusal in
//! its ring like any event, and here it only takes a ticket, rings the collector and sleeps on
//! a futex word. The collector merges what was recorded (the refusal included), builds the
//! profile and hands it to its writer, which marks the ticket done once the file is in place.
//!
//! The wait allocates nothing and takes no lock (atomics, a futex, the monotonic clock). It ends
//! when the checkpoint is written, when the collector stops serving (the session stopped, or
//! this is a forked child: [`release_waiters`]) or after the session's bound (by default
//! [`OOM_CHECKPOINT_WAIT`], see [`set_wait`]), whichever comes first.
//!
//! The protocol is [`Tickets`], generic over the std-or-loom primitives of `sync` so that the
//! loom models in `loom_models` check this code unchanged; the process's one set of tickets and
//! the entry points the allocator, the device pools and the collector call are at the bottom.

use std::time::{Duration, Instant};

use super::sync::{const_outside_loom, outside_loom, WaitWord};
use super::sync::{fence, AtomicU32, Ordering};

/// Longest a refused thread waits for its checkpoint unless the session says otherwise
/// (`SessionBuilder::oom_wait`): long enough to write a profile on a busy machine, short enough
/// that a dying process still dies promptly.
pub(crate) const OOM_CHECKPOINT_WAIT: Duration = Duration::from_secs(5);

/// After a refused thread started waiting for its checkpoint, refusals of the same source
/// (heap, pool, driver) within this long are recorded without a wait (the next checkpoint, or
/// the final profile, holds them): a program that recovers from refusals (`Vec::try_reserve`, a
/// refused pool admission it handles) is not stalled on every one, and at most one refusal
/// checkpoint per source is in flight. Sources are apart so that a refusal of one kind the
/// program handled does not take the checkpoint from the next kind's, which may end the run.
pub(crate) const OOM_CHECKPOINT_EVERY: Duration = Duration::from_secs(1);

/// Longest single sleep of a waiter: it looks at the collector again this often.
const RECHECK: Duration = Duration::from_millis(10);

/// What a refused thread needs from the collector while it waits.
pub(crate) trait Collector {
    /// Whether a collector will still answer tickets: `false` once it stopped, and in a forked
    /// child. Asked after the ticket is taken and after every wake.
    fn serves(&self) -> bool;
    /// Asks the collector to look at the tickets now instead of sleeping out its interval.
    fn ring(&self);
}

/// How a refused thread records its refusal and takes its ticket. The order of the steps is
/// the protocol the loom models check; [`SoundTicket`] is the one the hooks use.
pub(crate) trait TicketProtocol {
    /// Runs `record` (which returns whether the refusal is now published in the thread's ring)
    /// and, if it recorded, takes the next ticket from `asked` and returns it.
    fn take(asked: &AtomicU32, record: impl FnOnce() -> bool) -> Option<u32>;
}

/// Publishes the refusal, then takes the ticket, then fences before the waiter reads whether
/// the collector serves:
/// - a collector that reads the ticket (SeqCst, so acquiring it) also sees the event it was
///   taken after, so the checkpoint it then merges holds the refusal;
/// - the fence pairs with the stopper's "stop serving, fence, release every ticket taken"
///   (a store-buffering pair): either the stopper's release covers this ticket, or this thread
///   sees that nobody serves. Without it the waiter can miss both and sleep until its deadline.
#[derive(Debug)]
pub(crate) struct SoundTicket;

impl TicketProtocol for SoundTicket {
    fn take(asked: &AtomicU32, record: impl FnOnce() -> bool) -> Option<u32> {
        if !record() {
            return None;
        }
        let ticket = asked.fetch_add(1, Ordering::SeqCst).wrapping_add(1);
        fence(Ordering::SeqCst);
        Some(ticket)
    }
}

/// How a refused thread's wait ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Waited {
    /// The refusal is not in a ring (no ring, the gate closed): no checkpoint can hold it, so
    /// the thread did not wait.
    NotRecorded,
    /// Its ticket was marked done: the checkpoint holding the refusal is on disk, or its write
    /// failed, or none will be written (released at stop).
    Answered,
    /// The collector stopped serving before the ticket was marked done.
    Unserved,
    /// The bound passed first.
    TimedOut,
}

/// The tickets of refused threads and the word they sleep on.
#[derive(Debug)]
pub(crate) struct Tickets {
    /// The newest ticket handed out. Incremented by refused threads (SeqCst, after their refusal
    /// is published, see [`SoundTicket`]); read by the collector and by the stopper.
    asked: AtomicU32,
    /// The newest ticket marked done (every older one is done too; tickets wrap around). Only
    /// moves forward: the writer and the stopper advance it (AcqRel) and then wake its
    /// sleepers; refused threads read it (Acquire) and sleep on it.
    written: WaitWord,
}

/// Whether ticket `ticket` is covered once `written` is done (tickets wrap around).
fn covers(written: u32, ticket: u32) -> bool {
    written.wrapping_sub(ticket) as i32 >= 0
}

impl Tickets {
    const_outside_loom! {
        /// No waiter, and every ticket up to `ticket` done: the next ticket is `ticket + 1`.
        pub(crate) fn starting_at(ticket: u32) -> Tickets {
            Tickets {
                asked: AtomicU32::new(ticket),
                written: WaitWord::new(ticket),
            }
        }
    }

    /// Records a refusal with `record` (which returns whether it is now in the thread's ring)
    /// and, if it is, asks `collector` for a checkpoint that includes it and waits for it, at
    /// most `bound`.
    ///
    /// Call it outside any push (the thread's ring not busy), so that nothing the collector
    /// waits for while it merges waits on this thread.
    pub(crate) fn wait_after<P: TicketProtocol>(
        &self,
        record: impl FnOnce() -> bool,
        collector: &impl Collector,
        bound: Duration,
    ) -> Waited {
        let Some(ticket) = P::take(&self.asked, record) else {
            return Waited::NotRecorded;
        };
        collector.ring();
        let deadline = Instant::now() + bound;
        loop {
            let written = self.written.word().load(Ordering::Acquire);
            if covers(written, ticket) {
                return Waited::Answered;
            }
            if !collector.serves() {
                return Waited::Unserved;
            }
            let now = Instant::now();
            if now >= deadline {
                return Waited::TimedOut;
            }
            // The word's check-then-sleep: a `written` after the load above is not slept
            // through. (Under loom the sleep is untimed, so the models prove no wait needs
            // its bound to end.)
            self.written
                .wait(written, Some((deadline - now).min(RECHECK)));
        }
    }

    /// The newest ticket handed out, for the collector: a refusal with this ticket or an older
    /// one is already in its ring.
    pub(crate) fn asked(&self) -> u32 {
        self.asked.load(Ordering::SeqCst)
    }

    /// Marks every ticket up to `ticket` as done and wakes their threads: their checkpoint is
    /// on disk, or failed, or will not be written.
    pub(crate) fn written(&self, ticket: u32) {
        let word = self.written.word();
        let mut done = word.load(Ordering::Acquire);
        // Only forward: a late writer must not take back what a release already gave.
        while !covers(done, ticket) {
            match word.compare_exchange_weak(done, ticket, Ordering::AcqRel, Ordering::Acquire) {
                Ok(_) => break,
                Err(now) => done = now,
            }
        }
        self.written.wake_all();
    }

    /// Releases every waiter: nobody will write their checkpoint. Call it after the collector
    /// stopped serving and a SeqCst fence (the other half of [`SoundTicket`]'s pair), so a
    /// ticket taken too late to be released here sees that nobody serves.
    pub(crate) fn release_waiters(&self) {
        self.written(self.asked());
    }
}

outside_loom! {
    mod process;
    pub(crate) use process::*;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tickets_are_covered_across_the_wrap() {
        assert!(covers(5, 5));
        assert!(covers(6, 5));
        assert!(!covers(4, 5));
        assert!(covers(2, u32::MAX));
        assert!(!covers(u32::MAX, 2));
    }
}
