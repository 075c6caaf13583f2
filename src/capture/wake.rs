//! The collector's doorbell: a producer whose ring fills, or a session with a request, wakes the
//! collector now instead of letting it sleep out its interval. A [`WaitWord`] underneath, so a
//! ring is never slept through and ringing is callable inside the allocator and inside a signal
//! handler.

use std::time::Duration;

use super::sync::{Ordering, WaitWord};

/// The collector's doorbell: a producer whose ring fills rings it so the collector drains now
/// instead of sleeping out its interval; the session rings it after sending a request.
static COLLECTOR_BELL: WaitWord = WaitWord::new(0);

/// The bell's current value; pass it to [`collector_sleep`] so a ring after this read is not
/// slept through.
pub(crate) fn collector_bell() -> u32 {
    COLLECTOR_BELL.word().load(Ordering::Acquire)
}

/// Rings the collector's bell. Callable from the allocator hook and from signal handlers.
pub(crate) fn ring_collector() {
    COLLECTOR_BELL.word().fetch_add(1, Ordering::Release);
    COLLECTOR_BELL.wake_all();
}

/// Sleeps the collector for at most `interval`, unless the bell rang since it read `seen`.
pub(crate) fn collector_sleep(seen: u32, interval: Duration) {
    COLLECTOR_BELL.wait(seen, Some(interval));
}
