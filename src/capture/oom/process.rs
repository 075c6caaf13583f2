//! The process's refusal tickets and the rate limit of refusal checkpoints (not built in the
//! loom models, which make tickets of their own).

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use super::{Collector, SoundTicket, Tickets, OOM_CHECKPOINT_EVERY, OOM_CHECKPOINT_WAIT};
use crate::capture::wake;
use crate::model::OomSource;

/// The process's tickets.
static TICKETS: Tickets = Tickets::starting_at(0);

/// When the latest wait for a refusal checkpoint began, per [`OomSource`], monotonic ns
/// (`0`: never).
static LAST_WAIT: [AtomicU64; 3] = [const { AtomicU64::new(0) }; 3];

/// Longest a refused thread waits, in milliseconds: the running session's bound.
static WAIT_MS: AtomicU64 = AtomicU64::new(OOM_CHECKPOINT_WAIT.as_millis() as u64);

/// Sets how long a refused thread waits for its checkpoint; the session calls it as it
/// starts.
pub(crate) fn set_wait(bound: Duration) {
    let ms = u64::try_from(bound.as_millis()).unwrap_or(u64::MAX);
    WAIT_MS.store(ms, Ordering::Relaxed);
}

/// This process's collector, as the hook sees it.
struct SessionCollector;

impl Collector for SessionCollector {
    fn serves(&self) -> bool {
        crate::capture::collector_serves()
    }
    fn ring(&self) {
        wake::ring_collector();
    }
}

/// The heap allocator returned null for `size` bytes: records the refusal and, when it is
/// in the ring, waits for a checkpoint that includes it. Called from the allocator.
#[cold]
pub(crate) fn heap_refused(size: usize) {
    refused(OomSource::Heap, || {
        crate::capture::record_oom(0, OomSource::Heap, size as u64, None)
    });
}

/// Records a refusal from `source` with `record` (which returns whether it is in this
/// thread's ring) and, if it is, waits for a checkpoint that includes it, at most the bound
/// [`set_wait`] set — unless another refusal from `source` began such a wait less than
/// [`OOM_CHECKPOINT_EVERY`] ago: then it is only recorded. Call it outside any push.
#[cold]
pub(crate) fn refused(source: OomSource, record: impl FnOnce() -> bool) {
    let last_wait = &LAST_WAIT[match source {
        OomSource::Heap => 0,
        OomSource::Pool => 1,
        OomSource::Driver => 2,
    }];
    let now = crate::sys::clock::monotonic_ns();
    let last = last_wait.load(Ordering::Acquire);
    let recent = last != 0 && now.saturating_sub(last) < OOM_CHECKPOINT_EVERY.as_nanos() as u64;
    // One thread per window waits: the others lose the race and only record.
    if recent
        || last_wait
            .compare_exchange(last, now.max(1), Ordering::AcqRel, Ordering::Acquire)
            .is_err()
    {
        record();
        return;
    }
    let bound = Duration::from_millis(WAIT_MS.load(Ordering::Relaxed));
    TICKETS.wait_after::<SoundTicket>(record, &SessionCollector, bound);
}

/// A new session: its first refusal waits for its checkpoint whatever came before.
pub(crate) fn new_session() {
    for last_wait in &LAST_WAIT {
        last_wait.store(0, Ordering::Release);
    }
}

/// See [`Tickets::asked`].
pub(crate) fn asked() -> u32 {
    TICKETS.asked()
}

/// See [`Tickets::written`].
pub(crate) fn written(ticket: u32) {
    TICKETS.written(ticket);
}

/// See [`Tickets::release_waiters`]: the collector calls it once it stopped serving.
pub(crate) fn release_waiters() {
    TICKETS.release_waiters();
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Hardening III, row 10: every refusal a program recovered from waited for a checkpoint of
    /// its own. Within a second of a wait, refusals are recorded only: one ticket for many.
    #[test]
    fn refusals_within_a_second_of_a_wait_only_record() {
        new_session();
        let before = asked();
        let mut recorded = 0;
        for _ in 0..100 {
            refused(OomSource::Heap, || {
                recorded += 1;
                true
            });
        }
        assert_eq!(recorded, 100, "every refusal is recorded");
        assert_eq!(asked().wrapping_sub(before), 1, "one ticket, one wait");
        refused(OomSource::Pool, || true);
        assert_eq!(
            asked().wrapping_sub(before),
            2,
            "a refusal from another source waits for its own checkpoint"
        );
        new_session();
        refused(OomSource::Heap, || true);
        assert_eq!(asked().wrapping_sub(before), 3, "a new session waits again");
    }
}
