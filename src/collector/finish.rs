//! The profiles a merger builds: checkpoints and snapshots as of now, and the last one at stop,
//! with how capture went.

use super::merger::Merger;
use crate::alloc_log::AllocLogWriter;
use crate::capture::raw::RawKind;
use crate::capture::registry::REGISTRY;
use crate::capture::{self, gate, UNATTRIBUTED_DROPS};
use crate::profile::{CaptureMode, CaptureStats, Profile, ThreadCapture, Warning};

impl Merger {
    /// The profile of what is merged up to `end_ns`, for a checkpoint; recording goes on.
    pub(super) fn checkpoint(&self, end_ns: u64) -> Profile {
        let profile = self.timeline.profile(end_ns.max(self.newest_ns));
        self.with_capture(profile, self.capture_stats([0; RawKind::COUNT]))
    }

    /// `profile` with how capture went: `capture`, the threads recorded, and a warning if the
    /// merge handed out any event late.
    pub(super) fn with_capture(&self, mut profile: Profile, capture: CaptureStats) -> Profile {
        profile.capture = capture;
        profile.warnings.extend(self.warnings.iter().cloned());
        let events = self.merge.late();
        if events > 0 {
            profile.warnings.push(Warning::LateEvents { events });
        }
        profile.meta.threads = self.thread_count;
        profile
    }

    /// Closes recording, waits for writers in flight, merges everything and builds the profile.
    ///
    /// Writers in flight may be waiting for room in their ring, and a ring only gets room once
    /// its staging queue has room, so the stopper drains and merges (which frees room and wakes
    /// them) until it reads every ring idle, then drains and merges everything. While writers
    /// are still in flight it merges only events older than `lag_ns` before its clock reading,
    /// as the running collector does: a writer between its clock reading and its publish may
    /// still add an older event.
    pub(super) fn stop(&mut self, lag_ns: u64) -> Profile {
        gate::close_recording();
        loop {
            let now = self.calibration.now_ns();
            let busy = REGISTRY.claimed().iter().any(|slot| slot.ring.is_busy());
            if !busy {
                break;
            }
            self.drain(0);
            self.merge_until(now.saturating_sub(lag_ns));
            std::thread::yield_now();
        }
        self.catch_up(u64::MAX);
        let end_ns = self.calibration.now_ns().max(self.newest_ns);
        let unattributed: [u64; RawKind::COUNT] = std::array::from_fn(|kind| {
            UNATTRIBUTED_DROPS[kind].swap(0, std::sync::atomic::Ordering::Relaxed)
        });
        let reentrant = capture::take_reentrant_drops();
        // Records, not events: heads of two-event records are counted by their second half
        // (see `charge_drops`).
        let records = |counts: &[u64; RawKind::COUNT]| -> u64 {
            (0..RawKind::COUNT as u8)
                .filter(|&kind| !RawKind::from_byte(kind).is_some_and(RawKind::is_head))
                .map(|kind| counts[usize::from(kind)])
                .sum()
        };
        let unattributed_total = records(&unattributed);
        let reentrant_total = records(&reentrant);
        if unattributed_total + reentrant_total > 0 {
            self.timeline
                .note_dropped(unattributed_total + reentrant_total);
        }
        self.timeline.set_capture_mode(session_capture_mode());
        let profile = self.timeline.profile(end_ns);
        // Re-entrant records have no ring to be charged to: they join the unattributed ones in
        // `dropped_by_kind` and have their own total.
        let loose = std::array::from_fn(|kind| unattributed[kind] + reentrant[kind]);
        let mut capture = self.capture_stats(loose);
        capture.unattributed_dropped = unattributed_total;
        capture.reentrant_dropped = reentrant_total;
        capture.producer_waits = capture::take_waits();
        let mut profile = self.with_capture(profile, capture);
        let events = capture::table_full_drops();
        if events > 0 {
            profile.warnings.push(Warning::ThreadLimit {
                events,
                limit: REGISTRY.limit() as u64,
            });
        }
        if let Some(Err((path, error))) = self.log.take().map(AllocLogWriter::finish) {
            profile.warnings.push(Warning::AllocLogIncomplete {
                path: path.display().to_string(),
                error: error.to_string(),
            });
        }
        profile
    }

    pub(super) fn capture_stats(&self, unattributed: [u64; RawKind::COUNT]) -> CaptureStats {
        let mut stats = CaptureStats::default();
        stats.mode = session_capture_mode();
        stats.ring_events = capture::ring_capacity();
        stats.unattributed_dropped = unattributed.iter().sum();
        stats.late_events = self.merge.late();
        stats.threads = self.threads.clone();
        let sum = |field: fn(&ThreadCapture) -> u64| self.threads.iter().map(field).sum::<u64>();
        let loose = |kind: RawKind| unattributed[kind as usize];
        let loose_other = (0..RawKind::COUNT as u8)
            .filter_map(RawKind::from_byte)
            .filter(|kind| {
                !kind.is_head()
                    && !matches!(kind, RawKind::Alloc | RawKind::Free | RawKind::ReallocTo)
            })
            .map(loose)
            .sum::<u64>();
        for (kind, total) in [
            ("alloc", sum(|t| t.dropped_allocs) + loose(RawKind::Alloc)),
            ("free", sum(|t| t.dropped_frees) + loose(RawKind::Free)),
            (
                "realloc",
                sum(|t| t.dropped_reallocs) + loose(RawKind::ReallocTo),
            ),
            ("other", sum(|t| t.dropped_other) + loose_other),
        ] {
            stats.dropped_by_kind.insert(kind.to_string(), total);
        }
        stats
    }
}

/// The capture mode of the running session.
pub(super) fn session_capture_mode() -> CaptureMode {
    if capture::lossless() {
        CaptureMode::Lossless
    } else {
        CaptureMode::DropWhenFull
    }
}
