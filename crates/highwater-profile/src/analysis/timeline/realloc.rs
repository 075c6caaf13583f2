//! A realloc in two steps: the old block leaves its address when the resize starts
//! ([`EventKind::ReallocRelease`](super::super::EventKind::ReallocRelease)) and ends when
//! the resize completes ([`EventKind::Realloc`](super::super::EventKind::Realloc)).
//!
//! The allocator may hand the old address to another thread while the resize is still in
//! flight, and that thread's allocation is stamped between the two halves. Were the old block
//! still at its address then, the allocation would find it live and repair it away. So at the
//! release the block moves, unchanged and still counted, to a key of its thread's own that no
//! heap address can be, and the realloc ends it there.

use super::super::event::DeviceId;
use super::super::live::{Freed, LiveEntry, Rekeyed};
use super::Timeline;

/// The top bit, which no user-space heap address has: keys with it set are the timeline's.
const PENDING_KEY: u64 = 1 << 63;

/// Where a block given up by `thread`'s realloc in flight waits for the realloc to complete.
#[inline]
fn pending_key(thread: u32) -> u64 {
    PENDING_KEY | u64::from(thread)
}

/// A realloc whose old block was released and whose new block has not arrived yet.
#[derive(Debug, Clone, Copy)]
pub(super) struct Pending {
    old_addr: u64,
    /// What the release found at `old_addr`.
    found: Found,
}

/// What a release found at the old address.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Found {
    /// The block, now at the pending key.
    Moved,
    /// A block allocated after the release: an earlier life of the address was given up.
    Straggler,
    /// Nothing.
    Unknown,
}

impl Timeline {
    /// The first half of `thread`'s realloc from `old_addr`, stamped `ts`.
    pub(super) fn release_for_realloc(&mut self, thread: u32, old_addr: u64, ts: u64) {
        self.settle_pending(thread, ts);
        let device = DeviceId::CPU;
        let key = pending_key(thread);
        let found = match self.live.rekey(device, old_addr, key, ts) {
            Rekeyed::Moved(displaced) => {
                debug_assert!(displaced.is_none(), "a pending key outlived its realloc");
                if let Some(entry) = displaced {
                    self.end_displaced(device, key, &entry, ts);
                }
                self.sites.rekeyed(old_addr, key);
                self.temporaries.rekey(device, old_addr, key);
                Found::Moved
            }
            Rekeyed::Straggler => Found::Straggler,
            Rekeyed::Unknown => Found::Unknown,
        };
        self.pending_reallocs
            .insert(thread, Pending { old_addr, found });
    }

    /// Ends the old block of `thread`'s realloc from `old_addr`: where it was (its key now)
    /// and what ending it did. A realloc without a release is judged at its address as of
    /// `released`.
    pub(super) fn end_realloced(
        &mut self,
        thread: u32,
        old_addr: u64,
        released: u64,
    ) -> (u64, Freed) {
        let device = DeviceId::CPU;
        match self.pending_reallocs.get(&thread) {
            Some(pending) if pending.old_addr == old_addr => {
                let found = pending.found;
                self.pending_reallocs.remove(&thread);
                match found {
                    // Its time was judged at the release.
                    Found::Moved => {
                        let key = pending_key(thread);
                        (key, self.live.free(device, key, u64::MAX))
                    }
                    Found::Straggler => (old_addr, Freed::Straggler),
                    Found::Unknown => (old_addr, Freed::Unknown),
                }
            }
            Some(_) => {
                self.settle_pending(thread, released);
                (old_addr, self.live.free(device, old_addr, released))
            }
            None => (old_addr, self.live.free(device, old_addr, released)),
        }
    }

    /// The first half of `thread`'s realloc, stamped `ts`, when its second half follows at
    /// once and is applied without it: no other thread can reuse the old address in between,
    /// so nothing moves, but a release still pending on the thread (its realloc lost by a
    /// dropping stream) ends here, as the first half would have ended it.
    pub fn release_adjacent(&mut self, thread: u32, ts: u64) {
        if self.has_pending_reallocs() {
            self.settle_pending(thread, ts);
        }
    }

    /// Whether some thread's realloc was released and not completed yet: without one,
    /// [`Timeline::release_adjacent`] has nothing to do.
    #[inline]
    pub fn has_pending_reallocs(&self) -> bool {
        !self.pending_reallocs.is_empty()
    }

    /// A release whose realloc never came (the stream lost it): its block ends now, as if
    /// freed. Not counted as a free.
    fn settle_pending(&mut self, thread: u32, ts: u64) {
        let Some(pending) = self.pending_reallocs.remove(&thread) else {
            return;
        };
        if pending.found != Found::Moved {
            return;
        }
        let device = DeviceId::CPU;
        let key = pending_key(thread);
        if let Freed::Ended(entry) = self.live.free(device, key, u64::MAX) {
            self.end_displaced(device, key, &entry, ts);
        }
    }

    /// Settles a block ended outside any event's own accounting.
    fn end_displaced(&mut self, device: DeviceId, key: u64, entry: &LiveEntry, ts: u64) {
        let sample = self.sites.ended(key);
        self.split_ended(device, key, entry, sample);
        self.end(device, entry);
        self.changed(device, ts, self.seq);
    }
}
