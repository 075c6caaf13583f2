//! Refused allocations: what was live on their device at the moment one was refused.
//!
//! A refusal is rare and often the last thing a run does, so the timeline takes a full picture
//! then (one pass over the device's live blocks) for the first [`MAX_OOM_EVENTS`] of them, and
//! only counts the rest: the work and the profile stay bounded however often a program probes
//! with `try_reserve`.

use crate::model::OomSource;
use crate::profile::{OomEvent, PeakRow, MAX_OOM_EVENTS, MAX_OOM_ROWS};

use super::super::event::{DeviceId, Event};
use super::super::live::{self, GroupKey, Origin};
use super::assemble::{category_map, rank_and_fold};
use super::{ByCategory, Timeline};

/// A refused allocation as the timeline saw it, names still as ids.
#[derive(Debug, Clone)]
pub(super) struct OomRecord {
    ts: u64,
    thread: u32,
    device: DeviceId,
    source: OomSource,
    requested: u64,
    largest_free: Option<u64>,
    /// The asking thread's span node and innermost op.
    origin: Origin,
    live: u64,
    by_category: ByCategory,
    total_live: u64,
    /// The device pool's (capacity, reserved bytes) at its last report, if it has a pool.
    pool: Option<(u64, u64)>,
    /// The device's live blocks by group: `(key, bytes, count)`.
    groups: Vec<(GroupKey, u64, u64)>,
}

impl Timeline {
    /// Counts a refused allocation and, for the first ones, keeps what was live then.
    pub(super) fn refused(
        &mut self,
        event: &Event,
        device: DeviceId,
        source: OomSource,
        requested: u64,
        largest_free: Option<u64>,
    ) {
        self.oom_count += 1;
        if self.ooms.len() >= MAX_OOM_EVENTS {
            return;
        }
        let (origin, _) = self.origin(event.thread, event.span);
        let state = self.device(device);
        let (live, by_category) = (state.live, state.by_category);
        // A driver's refusal reports the device's total and what its pools held instead.
        let pool = state
            .pool
            .as_ref()
            .map(|pool| (pool.capacity, pool.reserved))
            .or_else(|| {
                let total = state.memory.map(|m| m.total)?;
                Some((total, state.reserved.as_ref().map_or(0, |r| r.last.bytes)))
            });
        let record = OomRecord {
            ts: event.ts_ns,
            thread: event.thread,
            device,
            source,
            requested,
            largest_free,
            origin,
            live,
            by_category,
            total_live: self.total_live(),
            pool,
            groups: live::group_live_now(&self.live, device),
        };
        self.ooms.push(record);
    }

    /// The kept refusals as profile rows, in time order.
    pub(super) fn oom_events(&self, paths: &[String]) -> Vec<OomEvent> {
        let mut events: Vec<OomEvent> = self
            .ooms
            .iter()
            .map(|record| OomEvent {
                timestamp_ns: record.ts,
                source: record.source,
                device: self.names.device_str(record.device),
                requested_bytes: record.requested,
                largest_free_bytes: record.largest_free,
                thread: record.thread,
                span_path: self.path_of(paths, record.origin.node).to_string(),
                op: self.op_parts(record.origin.op).0,
                live_bytes: record.live,
                live_by_category: category_map(&record.by_category),
                total_live_bytes: record.total_live,
                pool_capacity_bytes: record.pool.map(|(capacity, _)| capacity),
                pool_reserved_bytes: record.pool.map(|(_, reserved)| reserved),
                live: self.live_rows(paths, &record.groups),
            })
            .collect();
        events.sort_by_key(|event| event.timestamp_ns);
        events
    }

    /// Groups as rows, largest first, folded past [`MAX_OOM_ROWS`].
    fn live_rows(&self, paths: &[String], groups: &[(GroupKey, u64, u64)]) -> Vec<PeakRow> {
        let rows = groups
            .iter()
            .map(|(key, bytes, count)| self.group_row(paths, key, *bytes, *count))
            .collect();
        rank_and_fold(rows, MAX_OOM_ROWS)
    }
}
