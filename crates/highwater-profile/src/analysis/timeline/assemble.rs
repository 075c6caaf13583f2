//! Assembling the [`Profile`] document from the timeline's state, at any moment.

use std::collections::BTreeMap;

use crate::model::{Category, SpanLabel, FRAME_POINTERS_UNWINDER};
use crate::profile::{
    IterationResidual, LiveAllocation, PeakRow, Profile, SiteSampling, SpanEvent, SpanMetrics,
    Summary, Warning, FOLDED_SPANS, MAX_SPAN_DEPTH, MAX_SPAN_NODES, SCHEMA,
};

use rustc_hash::FxHashMap;

use super::super::event::{DeviceId, NameId, ShapeId};
use super::super::iterations::IterationSeries;
use super::super::live::{self, GroupKey, NONE};
use super::super::sites::ShareKey;
use super::super::spans::FOLDED_SPAN;
use super::leak::leak_warning;
use super::{ByCategory, Timeline};

/// Says so when most samples have a stack that does not start in the hook. A walk by frame
/// pointers (where they can be trusted) or by call-frame information always starts with the
/// hook's own frames; a stack that does not is one neither could walk (a frame-pointer walk
/// in a build without them, from a highwater before the call-frame unwinder; a build without
/// unwind tables). Only where stacks are walked: where there is no unwinder (`"none"`), empty
/// stacks are expected and the advice would not help.
fn stacks_without_hook_warning(sampling: &SiteSampling) -> Option<Warning> {
    (sampling.unwinder.starts_with(FRAME_POINTERS_UNWINDER)
        && sampling.stacks_without_hook > 0
        && sampling.stacks_without_hook * 2 > sampling.samples)
        .then_some(Warning::StacksWithoutHook {
            without_hook: sampling.stacks_without_hook,
            samples: sampling.samples,
        })
}

impl Timeline {
    /// The profile as of now, with spans still open closed at `end_ns` (the timeline itself is
    /// not changed, so this can be called mid-run). `meta` is left for the session to fill.
    pub fn profile(&self, end_ns: u64) -> Profile {
        let paths = self.span_paths();
        let iterations = self.iterations();
        let mut warnings = Vec::new();
        if self.dropped > 0 {
            warnings.push(Warning::DroppedEvents {
                events: self.dropped,
                mode: self.capture_mode,
            });
        }
        warnings.extend(leak_warning(&iterations));
        if self.spans.folded_deep > 0 {
            warnings.push(Warning::SpansTooDeep {
                instances: self.spans.folded_deep,
                max_depth: MAX_SPAN_DEPTH,
            });
        }
        if self.spans.folded_nodes > 0 {
            warnings.push(Warning::SpansTooMany {
                instances: self.spans.folded_nodes,
                max_nodes: MAX_SPAN_NODES as u64,
            });
        }
        if let Some(last) = iterations
            .last()
            .filter(|l| l.index + 1 > iterations.len() as u64)
        {
            warnings.push(Warning::IterationsSampled {
                span: last.span.clone(),
                iterations: last.index + 1,
                listed: iterations.len() as u64,
            });
        }
        let oom_events = self.oom_events(&paths);
        if let Some(first) = oom_events.first() {
            warnings.push(Warning::OutOfMemory {
                refusals: self.oom_count,
                device: first.device.clone(),
                requested_bytes: first.requested_bytes,
                at_ns: first.timestamp_ns,
            });
        }
        let sites = self.sites.report(|op| self.op_parts(op).0);
        warnings.extend(stacks_without_hook_warning(&sites.sampling));
        Profile {
            schema: SCHEMA.to_string(),
            meta: Default::default(),
            summary: self.summary(end_ns),
            timeline: self.curve(),
            peak_window: self.peak_window(),
            peak_breakdown: self.breakdown(&paths, &sites.top_sites),
            largest_at_peak: self.largest(&paths),
            spans: self.span_metrics(end_ns),
            iterations,
            devices: self.device_stats(),
            pool_timeline: self.pool_timeline(),
            reserved_timeline: self.reserved_timeline(),
            span_events: self.span_events(),
            capture: Default::default(),
            warnings,
            sites: sites.sites,
            sampling: sites.sampling,
            oom_events,
        }
    }

    /// The sampled span calls, by node id, with their depths.
    pub(super) fn span_events(&self) -> Vec<SpanEvent> {
        self.span_calls
            .calls()
            .iter()
            .map(|call| SpanEvent {
                thread: call.thread,
                span: call.node,
                start_ns: call.start_ns,
                duration_ns: call.end_ns.saturating_sub(call.start_ns),
                depth: self
                    .spans
                    .nodes
                    .get(call.node as usize)
                    .map_or(0, |n| n.depth),
            })
            .collect()
    }

    /// A span node's name; the folded node's is [`FOLDED_SPANS`].
    pub(super) fn span_name(&self, name: NameId) -> String {
        if name == FOLDED_SPAN {
            FOLDED_SPANS.to_string()
        } else {
            self.names.name_str(name)
        }
    }

    pub(super) fn summary(&self, end_ns: u64) -> Summary {
        Summary {
            peak_bytes: self.peak.bytes,
            peak_timestamp_ns: self.peak.ts,
            peak_device: self
                .peak
                .device
                .map(|d| self.names.device_str(d))
                .unwrap_or_default(),
            peak_by_category: category_map(&self.peak.by_category),
            peak_temporary_by_category: category_map(self.temporaries.by_category()),
            alloc_count: self.counts.allocs,
            free_count: self.counts.frees,
            realloc_count: self.counts.reallocs,
            total_alloc_bytes: self.counts.total_alloc_bytes,
            autograd_retained_bytes: self.autograd_retained.unwrap_or(0),
            dropped_events: self.dropped,
            unknown_frees: self.counts.unknown_frees,
            reorder_repairs: self.counts.reorder_repairs,
            final_live_bytes: self.total_live(),
            final_by_category: category_map(&self.total_by_category()),
            duration_ns: end_ns,
            event_count: self.seq,
            oom_count: self.oom_count,
        }
    }

    /// Each node's path, by node id (parents come before children).
    pub(super) fn span_paths(&self) -> Vec<String> {
        let mut paths: Vec<String> = Vec::with_capacity(self.spans.nodes.len());
        for node in &self.spans.nodes {
            let name = self.span_name(node.name);
            let path = match paths.get(node.parent as usize) {
                Some(parent) => format!("{parent}/{name}"),
                None => name,
            };
            paths.push(path);
        }
        paths
    }

    pub(super) fn path_of<'a>(&self, paths: &'a [String], node: u32) -> &'a str {
        paths.get(node as usize).map_or("", String::as_str)
    }

    /// (op name, shape, dtype) of an op id.
    pub(super) fn op_parts(&self, op: u32) -> (Option<String>, Option<Vec<u64>>, Option<String>) {
        match self.op_keys.get(op as usize) {
            Some(&[name, shape, dtype]) => (
                self.name_opt(name),
                self.shape_opt(shape),
                self.name_opt(dtype),
            ),
            None => (None, None, None),
        }
    }

    pub(super) fn name_opt(&self, id: u32) -> Option<String> {
        (id != NONE).then(|| self.names.name_str(NameId(id)))
    }

    pub(super) fn shape_opt(&self, id: u32) -> Option<Vec<u64>> {
        if id == NONE {
            return None;
        }
        self.names.shape_dims(ShapeId(id))
    }

    /// The live-at-peak rows; `top_sites` names the call sites behind each heap row.
    pub(super) fn breakdown(
        &self,
        paths: &[String],
        top_sites: &FxHashMap<ShareKey, Vec<u32>>,
    ) -> Vec<PeakRow> {
        let rows = live::group_at_peak(&self.live)
            .into_iter()
            .map(|(key, bytes, count)| {
                let mut row = self.group_row(paths, &key, bytes, count);
                if key.device == DeviceId::CPU {
                    let key = ShareKey {
                        node: key.origin.node,
                        op: key.origin.op,
                        category: key.category,
                    };
                    row.top_sites = top_sites.get(&key).cloned().unwrap_or_default();
                }
                row
            })
            .collect();
        rank_and_fold(rows, self.config.max_breakdown_rows)
    }

    /// One live-block group as a row (no call sites).
    pub(super) fn group_row(
        &self,
        paths: &[String],
        key: &GroupKey,
        bytes: u64,
        count: u64,
    ) -> PeakRow {
        let (op, shape, dtype) = self.op_parts(key.origin.op);
        PeakRow {
            span_path: self.path_of(paths, key.origin.node).to_string(),
            op,
            shape,
            dtype,
            category: key.category,
            device: self.names.device_str(key.device),
            bytes,
            count,
            top_sites: Vec::new(),
        }
    }

    pub(super) fn largest(&self, paths: &[String]) -> Vec<LiveAllocation> {
        live::largest_at_peak(&self.live, self.config.top_allocations)
            .into_iter()
            .map(|(device, entry)| {
                let (op, shape, _) = self.op_parts(entry.origin.op);
                LiveAllocation {
                    bytes: entry.size,
                    device: self.names.device_str(device),
                    category: entry.category,
                    span_path: self.path_of(paths, entry.origin.node).to_string(),
                    op,
                    shape,
                    timestamp_ns: entry.ts,
                    thread: entry.thread,
                }
            })
            .collect()
    }

    pub(super) fn span_metrics(&self, end_ns: u64) -> Vec<SpanMetrics> {
        let nodes = &self.spans.nodes;
        let mut bytes: Vec<u64> = nodes.iter().map(|n| n.own_bytes).collect();
        let mut allocs: Vec<u64> = nodes.iter().map(|n| n.own_allocs).collect();
        // Children have higher ids than their parents: one reverse pass rolls everything up.
        for index in (0..nodes.len()).rev() {
            let parent = nodes[index].parent as usize;
            if parent < index {
                bytes[parent] = bytes[parent].saturating_add(bytes[index]);
                allocs[parent] = allocs[parent].saturating_add(allocs[index]);
            }
        }
        let mut metrics: Vec<SpanMetrics> = nodes
            .iter()
            .enumerate()
            .map(|(index, node)| {
                let (step, category) = match node.label {
                    SpanLabel::Plain => (None, None),
                    SpanLabel::Step(step) => (Some(step), None),
                    SpanLabel::Category(category) => (None, Some(category)),
                };
                SpanMetrics {
                    id: u32::try_from(index).unwrap_or(NONE),
                    parent: (node.parent != NONE).then_some(node.parent),
                    name: self.span_name(node.name),
                    step,
                    category,
                    calls: node.calls,
                    total_ns: node.total_ns,
                    bytes_allocated: bytes[index],
                    alloc_count: allocs[index],
                    peak_bytes: node.peak,
                    residual_bytes: node.residual,
                }
            })
            .collect();
        for (node, enter_ts, peak, residual) in self.spans.open_at_end(self.measure) {
            if let Some(m) = metrics.get_mut(node as usize) {
                m.total_ns = m.total_ns.saturating_add(end_ns.saturating_sub(enter_ts));
                m.peak_bytes = m.peak_bytes.max(peak);
                m.residual_bytes = m.residual_bytes.saturating_add(residual);
            }
        }
        metrics
    }

    /// Residuals at the exits of the top-level span entered most often (at least twice).
    pub(super) fn iterations(&self) -> Vec<IterationResidual> {
        let mut calls: Vec<(NameId, u64, usize)> = Vec::new();
        for (index, node) in self.spans.nodes.iter().enumerate() {
            if node.parent != NONE {
                continue;
            }
            match calls.iter_mut().find(|(name, _, _)| *name == node.name) {
                Some(entry) => entry.1 += node.calls,
                None => calls.push((node.name, node.calls, index)),
            }
        }
        // Most calls; on a tie, the name that appeared first.
        let chosen = calls
            .iter()
            .filter(|(_, calls, _)| *calls >= 2)
            .min_by_key(|(_, calls, first)| (std::cmp::Reverse(*calls), *first));
        let Some(&(name, _, _)) = chosen else {
            return Vec::new();
        };
        let span = self.span_name(name);
        let exits = self
            .top_level_exits
            .get(&name)
            .map(IterationSeries::exits)
            .unwrap_or_default();
        exits
            .iter()
            .map(|exit| IterationResidual {
                index: exit.index,
                span: span.clone(),
                end_timestamp_ns: exit.ts,
                live_bytes: exit.live,
                delta_bytes: exit.delta,
            })
            .collect()
    }
}

/// Live bytes by category, zero categories left out.
pub(super) fn category_map(by_category: &ByCategory) -> BTreeMap<Category, u64> {
    Category::ALL
        .into_iter()
        .filter(|c| by_category[c.index()] > 0)
        .map(|c| (c, by_category[c.index()]))
        .collect()
}

/// Rows largest first (ties in a fixed order), the ones past `max` folded into one.
pub(super) fn rank_and_fold(mut rows: Vec<PeakRow>, max: usize) -> Vec<PeakRow> {
    rows.sort_by(|a, b| {
        b.bytes
            .cmp(&a.bytes)
            .then(b.count.cmp(&a.count))
            .then_with(|| a.span_path.cmp(&b.span_path))
            .then_with(|| a.op.cmp(&b.op))
            .then_with(|| a.shape.cmp(&b.shape))
            .then_with(|| a.dtype.cmp(&b.dtype))
            .then(a.category.cmp(&b.category))
            .then_with(|| a.device.cmp(&b.device))
    });
    if rows.len() > max {
        let rest = rows.split_off(max.saturating_sub(1));
        if max > 0 {
            rows.push(fold_rows(rest));
        }
    }
    rows
}

/// One row standing for every breakdown row past the limit.
pub(super) fn fold_rows(rest: Vec<PeakRow>) -> PeakRow {
    let mut devices = rest.iter().map(|r| r.device.as_str());
    let first = devices.next().unwrap_or_default().to_string();
    let device = if devices.all(|d| d == first) {
        first
    } else {
        "(mixed)".to_string()
    };
    PeakRow {
        span_path: "(other)".to_string(),
        op: None,
        shape: None,
        dtype: None,
        category: Category::Other,
        device,
        bytes: rest.iter().fold(0u64, |sum, r| sum.saturating_add(r.bytes)),
        count: rest.iter().map(|r| r.count).sum(),
        top_sites: Vec::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::analysis::{DeviceId, Event, EventKind, TimelineConfig};
    use crate::model::FRAME_POINTERS_UNWINDER;

    /// A profile of `stacks.len()` sampled allocations, the `i`-th walked to `stacks[i]`.
    fn sampled_profile(unwinder: &str, stacks: &[&[u64]]) -> Profile {
        let mut timeline = Timeline::new(TimelineConfig::default());
        timeline.set_sampling(1, unwinder);
        for (index, pcs) in stacks.iter().enumerate() {
            let addr = 0x1000 * (index as u64 + 1);
            let stack = timeline.intern_stack(pcs, pcs.is_empty());
            for kind in [
                EventKind::Alloc {
                    device: DeviceId::CPU,
                    addr,
                    size: 64,
                    category: Category::Other,
                },
                EventKind::Sampled {
                    addr,
                    size: 64,
                    category: Category::Other,
                    stack,
                },
            ] {
                timeline.apply(&Event {
                    ts_ns: 10 * (index as u64 + 1),
                    thread: 1,
                    span: 0,
                    kind,
                });
            }
        }
        timeline.profile(10 * (stacks.len() as u64 + 1))
    }

    fn stacks_without_hook(profile: &Profile) -> Vec<&Warning> {
        profile
            .warnings
            .iter()
            .filter(|w| matches!(w, Warning::StacksWithoutHook { .. }))
            .collect()
    }

    /// Issue 12: a build without frame pointers gave sites with bytes and no stack, silently.
    #[test]
    fn samples_whose_stacks_are_all_empty_get_the_warning() {
        let profile = sampled_profile(FRAME_POINTERS_UNWINDER, &[&[], &[], &[]]);
        assert_eq!(profile.sampling.samples, 3);
        assert_eq!(profile.sampling.stacks_without_hook, 3);
        assert_eq!(
            stacks_without_hook(&profile),
            [&Warning::StacksWithoutHook {
                without_hook: 3,
                samples: 3
            }]
        );
        assert!(profile.warnings[0]
            .to_string()
            .contains("RUSTFLAGS=\"-C force-frame-pointers=yes\""));
    }

    #[test]
    fn samples_with_stacks_get_no_warning() {
        let profile = sampled_profile(FRAME_POINTERS_UNWINDER, &[&[1, 2], &[3], &[1, 2]]);
        assert_eq!(profile.sampling.stacks_without_hook, 0);
        assert!(profile.warnings.is_empty(), "{:?}", profile.warnings);
        // A stray empty stack among walked ones is not the missing-frame-pointer build.
        let profile = sampled_profile(FRAME_POINTERS_UNWINDER, &[&[1, 2], &[], &[3]]);
        assert_eq!(profile.sampling.stacks_without_hook, 1);
        assert!(
            stacks_without_hook(&profile).is_empty(),
            "{:?}",
            profile.warnings
        );
    }

    /// Without an unwinder every stack is empty by design: frame pointers would not help.
    #[test]
    fn without_an_unwinder_empty_stacks_are_expected() {
        let profile = sampled_profile("none", &[&[], &[]]);
        assert_eq!(profile.sampling.stacks_without_hook, 2);
        assert!(
            stacks_without_hook(&profile).is_empty(),
            "{:?}",
            profile.warnings
        );
    }
}
