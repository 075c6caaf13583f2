//! The moment of OOM: a thread whose allocation was refused asks for a checkpoint and waits,
//! boundedly, until the collector's writer has put one on disk that includes the refusal.
//!
//! Rust aborts the process when a global allocation returns null (`handle_alloc_error`), and a
//! training step that a device pool refuses usually ends the run too, so this is the last moment
//! a profile can be saved. The failing thread writes nothing itself: it has recorded its refusal
//! in its ring like any event, and here it only takes a ticket, rings the collector and sleeps on
//! a futex word. The collector merges what was recorded (the refusal included), builds the
//! profile and hands it to its writer, which marks the ticket done once the file is in place.
//!
//! The wait allocates nothing and takes no lock (atomics, a futex, the monotonic clock). It ends
//! when the checkpoint is written, when the collector stops serving (the session stopped, or
//! this is a forked child: [`release_waiters`]) or after [`OOM_CHECKPOINT_WAIT`], whichever
//! comes first.

use std::time::{Duration, Instant};

use super::sync::{fence, AtomicU32, Ordering};
use super::wake::{self, WaitWord};
use crate::profile::OomSource;

/// Longest a refused thread waits for its checkpoint: long enough to write a profile on a busy
/// machine, short enough that a dying process still dies promptly.
pub(crate) const OOM_CHECKPOINT_WAIT: Duration = Duration::from_secs(5);

/// Longest single sleep of a waiter: it looks at the collector again this often.
const RECHECK: Duration = Duration::from_millis(10);

/// Tickets handed out: each refusal that waits takes the next one.
static ASKED: AtomicU32 = AtomicU32::new(0);

/// The highest ticket whose checkpoint is written (or will not be); waiters sleep on it.
static WRITTEN: WaitWord = WaitWord::new(0);

/// Whether ticket `ticket` is covered once `written` is done (tickets wrap around).
fn covers(written: u32, ticket: u32) -> bool {
    written.wrapping_sub(ticket) as i32 >= 0
}

/// The heap allocator returned null for `size` bytes: records the refusal and, when it is in
/// the ring, waits for a checkpoint that includes it. Called from the allocator.
#[cold]
pub(crate) fn heap_refused(size: usize) {
    if super::record_oom(0, OomSource::Heap, size as u64, None) {
        wait_for_checkpoint(super::collector_serves);
    }
}

/// Asks for a checkpoint that includes the refusal this thread just recorded and waits for it,
/// at most [`OOM_CHECKPOINT_WAIT`]. `serving` says whether a collector will still answer.
///
/// Call it only after the refusal's event is in the thread's ring (published) and outside any
/// push, so that the collector can merge it and nothing it waits for waits on this thread.
pub(crate) fn wait_for_checkpoint(serving: impl Fn() -> bool) {
    // Ticket after the event was published: a collector that sees the ticket sees the event.
    let ticket = ASKED.fetch_add(1, Ordering::SeqCst).wrapping_add(1);
    // Take the ticket, then read `serving`: the other half of the stopper's pair (it stops
    // serving, then releases every ticket taken), so a ticket taken too late to be released
    // sees that nobody serves.
    fence(Ordering::SeqCst);
    wake::ring_collector();
    let deadline = Instant::now() + OOM_CHECKPOINT_WAIT;
    loop {
        let written = WRITTEN.word().load(Ordering::Acquire);
        if covers(written, ticket) || !serving() {
            return;
        }
        let now = Instant::now();
        if now >= deadline {
            return;
        }
        WRITTEN.wait(written, Some((deadline - now).min(RECHECK)));
    }
}

/// The newest ticket handed out, for the collector: a refusal with this ticket or an older one
/// is already in its ring.
pub(crate) fn asked() -> u32 {
    ASKED.load(Ordering::SeqCst)
}

/// Marks every ticket up to `ticket` as done and wakes their threads: their checkpoint is on
/// disk, or failed, or will not be written.
pub(crate) fn written(ticket: u32) {
    let word = WRITTEN.word();
    let mut done = word.load(Ordering::Acquire);
    // Only forward: a late writer must not take back what a release already gave.
    while !covers(done, ticket) {
        match word.compare_exchange_weak(done, ticket, Ordering::AcqRel, Ordering::Acquire) {
            Ok(_) => break,
            Err(now) => done = now,
        }
    }
    WRITTEN.wake_all();
}

/// Releases every waiter: nobody will write their checkpoint (the collector stopped).
pub(crate) fn release_waiters() {
    written(asked());
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
