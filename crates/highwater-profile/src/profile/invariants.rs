//! The rules every profile satisfies, checked on load: a hand-edited or corrupt file is
//! refused naming the broken rule, never trusted into a panic later.

use std::collections::BTreeMap;

use super::*;
use crate::model::Category;

impl Profile {
    /// Checks what every profile highwater writes satisfies, so a damaged or hand-edited one is
    /// refused instead of shown (a category at 300 % of the peak).
    ///
    /// # Errors
    ///
    /// A sentence naming the first broken rule.
    pub fn check_invariants(&self) -> Result<(), String> {
        let peak = self.summary.peak_bytes;
        let sum = |map: &BTreeMap<Category, u64>| {
            map.values()
                .fold(0u128, |total, bytes| total + u128::from(*bytes))
        };
        if sum(&self.summary.peak_by_category) > u128::from(peak) {
            return Err(format!(
                "summary.peak_by_category adds up to {} bytes, more than peak_bytes {peak}",
                sum(&self.summary.peak_by_category)
            ));
        }
        for (category, temporary) in &self.summary.peak_temporary_by_category {
            let at_peak = self.summary.peak_by_category.get(category).copied();
            if at_peak.unwrap_or(0) < *temporary {
                return Err(format!(
                    "summary.peak_temporary_by_category has {temporary} bytes of {category}, \
                     more than its {} bytes at the peak",
                    at_peak.unwrap_or(0)
                ));
            }
        }
        for (index, point) in self.timeline.iter().enumerate() {
            if sum(&point.by_category) > u128::from(point.live_bytes) {
                return Err(format!(
                    "timeline[{index}].by_category adds up to more than its live_bytes {}",
                    point.live_bytes
                ));
            }
        }
        for (index, point) in self.peak_window.iter().enumerate() {
            if sum(&point.by_category) > u128::from(point.live_bytes) || point.live_bytes > peak {
                return Err(format!(
                    "peak_window[{index}] holds {} bytes, more than its categories allow or \
                     above summary.peak_bytes {peak}",
                    point.live_bytes
                ));
            }
        }
        for (index, device) in self.devices.iter().enumerate() {
            if device.peak_bytes > peak {
                return Err(format!(
                    "devices[{index}] ({}) peaks at {} bytes, above summary.peak_bytes {peak}",
                    device.device, device.peak_bytes
                ));
            }
            if sum(&device.peak_by_category) > u128::from(device.peak_bytes) {
                return Err(format!(
                    "devices[{index}].peak_by_category adds up to more than its peak_bytes {}",
                    device.peak_bytes
                ));
            }
        }
        if let Some((index, live)) = self
            .largest_at_peak
            .iter()
            .enumerate()
            .find(|(_, live)| live.bytes > peak)
        {
            return Err(format!(
                "largest_at_peak[{index}] is {} bytes, above summary.peak_bytes {peak}",
                live.bytes
            ));
        }
        if self.oom_events.len() as u64 > self.summary.oom_count {
            return Err(format!(
                "oom_events lists {} refusals, more than summary.oom_count {}",
                self.oom_events.len(),
                self.summary.oom_count
            ));
        }
        for (index, oom) in self.oom_events.iter().enumerate() {
            if sum(&oom.live_by_category) > u128::from(oom.live_bytes) {
                return Err(format!(
                    "oom_events[{index}].live_by_category adds up to more than its live_bytes {}",
                    oom.live_bytes
                ));
            }
            if oom.live_bytes > peak {
                return Err(format!(
                    "oom_events[{index}] has {} bytes live, above summary.peak_bytes {peak}",
                    oom.live_bytes
                ));
            }
        }
        // Folding keeps the tree within these bounds; a deeper or wider one was not written by
        // highwater, and every view that spells paths would pay for its depth on each node.
        let max_nodes = 2 * MAX_SPAN_NODES + 1;
        if self.spans.len() > max_nodes {
            return Err(format!(
                "spans has {} nodes; a profile holds at most {max_nodes}",
                self.spans.len()
            ));
        }
        let mut depths: Vec<u32> = Vec::with_capacity(self.spans.len());
        for (index, span) in self.spans.iter().enumerate() {
            if span.id as usize != index {
                return Err(format!("spans[{index}] has id {}", span.id));
            }
            if span.parent.is_some_and(|parent| parent >= span.id) {
                return Err(format!(
                    "spans[{index}] names parent {:?}: parents come before their children",
                    span.parent
                ));
            }
            let depth = span.parent.map_or(0, |parent| depths[parent as usize] + 1);
            if depth > MAX_SPAN_DEPTH {
                return Err(format!(
                    "spans[{index}] is nested {depth} deep; a profile keeps at most \
                     {MAX_SPAN_DEPTH} levels below the top"
                ));
            }
            depths.push(depth);
        }
        if let Some((index, event)) = self
            .span_events
            .iter()
            .enumerate()
            .find(|(_, event)| event.span as usize >= self.spans.len())
        {
            return Err(format!(
                "span_events[{index}] names span {}, but there are {} spans",
                event.span,
                self.spans.len()
            ));
        }
        if let Some(pair) = self
            .iterations
            .windows(2)
            .find(|pair| pair[1].index <= pair[0].index)
        {
            return Err(format!(
                "iterations are out of order ({} then {})",
                pair[0].index, pair[1].index
            ));
        }
        Ok(())
    }
}
