//! What `highwater watch` shows, worked out from one profile: plain figures, no terminal, so
//! the arithmetic is tested without a screen.

use highwater_profile::model::Category;
use highwater_profile::Profile;
use highwater_profile::{IterationResidual, TimelinePoint};

/// How many spans the view lists.
pub(crate) const TOP_SPANS: usize = 6;

/// How much of the end of the run the sparkline covers.
pub(crate) const RECENT_WINDOW_NS: u64 = 60_000_000_000;

/// Where the watched run stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum RunState {
    /// No profile at the path yet.
    Waiting,
    /// A checkpoint whose writer is still alive.
    Running,
    /// The final profile: the session finished and wrote it.
    Finished,
    /// A checkpoint whose writer is gone: the run died before finishing, and this is what it
    /// left.
    Died,
    /// A checkpoint from a writer this machine cannot check (no pid recorded, or not Linux).
    Partial,
}

impl RunState {
    /// From the profile's `meta` and whether its writer still runs (`None`: cannot tell).
    pub(crate) fn of(profile: &Profile, writer_alive: Option<bool>) -> RunState {
        if !profile.meta.partial {
            return RunState::Finished;
        }
        match writer_alive {
            Some(true) => RunState::Running,
            Some(false) => RunState::Died,
            None => RunState::Partial,
        }
    }

    /// How the header words it.
    pub(crate) fn label(self) -> &'static str {
        match self {
            RunState::Waiting => "waiting for a profile",
            RunState::Running => "running",
            RunState::Finished => "finished",
            RunState::Died => "died: this is its last checkpoint",
            RunState::Partial => "checkpoint (writer cannot be checked)",
        }
    }
}

/// One category's line: live now and at the peak.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct CategoryRow {
    pub(crate) category: Category,
    /// Live bytes when the profile was written (all devices); `None` for a profile written
    /// before it recorded them by category.
    pub(crate) now: Option<u64>,
    /// Live bytes at the run's peak so far.
    pub(crate) at_peak: u64,
}

/// One span's line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct SpanRow {
    pub(crate) path: String,
    pub(crate) peak_bytes: u64,
    /// [`SpanMetrics::residual_per_call`](highwater_profile::SpanMetrics::residual_per_call).
    pub(crate) residual_per_call: u64,
    pub(crate) calls: u64,
}

/// Everything one screen shows, from one profile.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct View {
    pub(crate) state: RunState,
    pub(crate) program: String,
    pub(crate) pid: u32,
    /// Run time the profile covers.
    pub(crate) elapsed_ns: u64,
    pub(crate) checkpoint_unix_ms: Option<u64>,
    pub(crate) live_now: u64,
    pub(crate) peak_bytes: u64,
    pub(crate) peak_device: String,
    /// Categories live now or at the peak, in the model's order.
    pub(crate) categories: Vec<CategoryRow>,
    /// Live bytes (all devices) over time, in time order: `(ns since start, bytes)`.
    pub(crate) curve: Vec<(u64, u64)>,
    /// Largest span peaks first.
    pub(crate) top_spans: Vec<SpanRow>,
    /// The last iteration that ended, with its residual.
    pub(crate) iteration: Option<IterationResidual>,
    pub(crate) dropped_events: u64,
    /// Refused allocations so far.
    pub(crate) oom_count: u64,
    /// The latest refusals kept, newest last, each in a sentence, at most [`OOM_LINES`].
    pub(crate) ooms: Vec<String>,
}

/// How many refusals the view words.
pub(crate) const OOM_LINES: usize = 3;

impl View {
    /// The view of `profile`, whose run is in `state`.
    pub(crate) fn new(profile: &Profile, state: RunState) -> View {
        let summary = &profile.summary;
        let now_known = !summary.final_by_category.is_empty() || summary.final_live_bytes == 0;
        let categories = Category::ALL
            .into_iter()
            .map(|category| CategoryRow {
                category,
                now: now_known.then(|| {
                    summary
                        .final_by_category
                        .get(&category)
                        .copied()
                        .unwrap_or(0)
                }),
                at_peak: summary
                    .peak_by_category
                    .get(&category)
                    .copied()
                    .unwrap_or(0),
            })
            .filter(|row| row.now.unwrap_or(0) > 0 || row.at_peak > 0)
            .collect();
        let mut spans: Vec<SpanRow> = profile
            .spans
            .iter()
            .zip(profile.span_paths())
            .map(|(span, path)| SpanRow {
                path,
                peak_bytes: span.peak_bytes,
                residual_per_call: span.residual_per_call(),
                calls: span.calls,
            })
            .collect();
        spans.sort_by(|a, b| b.peak_bytes.cmp(&a.peak_bytes).then(a.path.cmp(&b.path)));
        spans.truncate(TOP_SPANS);
        View {
            state,
            program: profile.meta.program.clone(),
            pid: profile.meta.pid,
            elapsed_ns: summary.duration_ns,
            checkpoint_unix_ms: profile.meta.checkpoint_unix_ms,
            live_now: summary.final_live_bytes,
            peak_bytes: summary.peak_bytes,
            peak_device: summary.peak_device.clone(),
            categories,
            curve: total_curve(&profile.timeline),
            top_spans: spans,
            iteration: profile.iterations.last().cloned(),
            dropped_events: summary.dropped_events,
            oom_count: summary.oom_count,
            ooms: profile
                .oom_events
                .iter()
                .rev()
                .take(OOM_LINES)
                .rev()
                .map(crate::report::oom_line)
                .collect(),
        }
    }

    /// The sparkline's bars: the last [`RECENT_WINDOW_NS`] of the curve in `columns` equal
    /// slices, each the highest live bytes during it. Memory stays at a level until the next
    /// point, so a slice also counts the level it opened at, and a slice with no point shows
    /// that level.
    pub(crate) fn recent(&self, columns: usize) -> Vec<u64> {
        let (Some(&(first, _)), Some(&(last, _))) = (self.curve.first(), self.curve.last()) else {
            return Vec::new();
        };
        let end = last.max(self.elapsed_ns);
        let start = end.saturating_sub(RECENT_WINDOW_NS).max(first);
        let width = u128::from((end - start).max(1));
        let boundary = |column: usize| {
            let offset = width * column as u128 / columns.max(1) as u128;
            start.saturating_add(u64::try_from(offset).unwrap_or(u64::MAX))
        };
        let mut points = self.curve.iter().peekable();
        let mut level = 0;
        while let Some(&(_, bytes)) = points.next_if(|&&(ts, _)| ts <= start) {
            level = bytes;
        }
        let mut bars = Vec::with_capacity(columns);
        for column in 0..columns {
            let (opens, closes) = (boundary(column), boundary(column + 1));
            let last_column = column + 1 == columns;
            let mut high = level;
            let mut first_point = true;
            while let Some(&(ts, bytes)) = points.next_if(|&&(ts, _)| last_column || ts < closes) {
                // A change right at the opening replaces the level it opened at.
                high = if first_point && ts == opens {
                    bytes
                } else {
                    high.max(bytes)
                };
                first_point = false;
                level = bytes;
            }
            bars.push(high);
        }
        bars
    }
}

/// The timeline's per-device points merged into one curve of total live bytes: at each point,
/// the device's new level plus every other device's last level.
fn total_curve(timeline: &[TimelinePoint]) -> Vec<(u64, u64)> {
    let mut points: Vec<&TimelinePoint> = timeline.iter().collect();
    points.sort_by_key(|point| point.timestamp_ns);
    let mut levels: Vec<(&str, u64)> = Vec::new();
    let mut curve: Vec<(u64, u64)> = Vec::with_capacity(points.len());
    for point in points {
        match levels
            .iter_mut()
            .find(|(device, _)| *device == point.device)
        {
            Some(level) => level.1 = point.live_bytes,
            None => levels.push((&point.device, point.live_bytes)),
        }
        let total = levels
            .iter()
            .fold(0u64, |sum, (_, bytes)| sum.saturating_add(*bytes));
        match curve.last_mut() {
            Some(last) if last.0 == point.timestamp_ns => last.1 = total,
            _ => curve.push((point.timestamp_ns, total)),
        }
    }
    curve
}

#[cfg(test)]
mod tests {
    use super::*;
    use highwater_testkit::sample::sample_profile;

    fn point(ts: u64, device: &str, live: u64) -> TimelinePoint {
        let mut timeline_point = TimelinePoint::default();
        timeline_point.timestamp_ns = ts;
        timeline_point.device = device.to_string();
        timeline_point.live_bytes = live;
        timeline_point
    }

    #[test]
    fn state_follows_partial_and_the_writer() {
        let mut profile = sample_profile();
        assert_eq!(RunState::of(&profile, Some(false)), RunState::Finished);
        profile.meta.partial = true;
        assert_eq!(RunState::of(&profile, Some(true)), RunState::Running);
        assert_eq!(RunState::of(&profile, Some(false)), RunState::Died);
        assert_eq!(RunState::of(&profile, None), RunState::Partial);
    }

    #[test]
    fn figures_are_the_profiles() {
        let profile = sample_profile();
        let view = View::new(&profile, RunState::Finished);
        assert_eq!(view.live_now, profile.summary.final_live_bytes);
        assert_eq!(view.peak_bytes, profile.summary.peak_bytes);
        let now: u64 = view.categories.iter().filter_map(|row| row.now).sum();
        let at_peak: u64 = view.categories.iter().map(|row| row.at_peak).sum();
        assert_eq!(now, profile.summary.final_live_bytes);
        assert_eq!(at_peak, profile.summary.peak_bytes);
        assert_eq!(view.top_spans.len(), TOP_SPANS.min(profile.spans.len()));
        let highest = profile.spans.iter().map(|s| s.peak_bytes).max().unwrap();
        assert_eq!(view.top_spans[0].peak_bytes, highest);
        assert!(view
            .top_spans
            .windows(2)
            .all(|pair| pair[0].peak_bytes >= pair[1].peak_bytes));
        assert_eq!(view.iteration.as_ref(), profile.iterations.last());
    }

    #[test]
    fn an_older_profile_does_not_claim_nothing_is_live_now() {
        let mut profile = sample_profile();
        profile.summary.final_by_category.clear();
        let view = View::new(&profile, RunState::Finished);
        assert!(view.categories.iter().all(|row| row.now.is_none()));
        assert!(!view.categories.is_empty());
    }

    #[test]
    fn the_curve_adds_devices_up() {
        let timeline = [
            point(10, "cpu", 100),
            point(20, "cuda:0", 1000),
            point(30, "cpu", 50),
            point(30, "cuda:0", 2000),
        ];
        assert_eq!(
            total_curve(&timeline),
            vec![(10, 100), (20, 1100), (30, 2050)]
        );
    }

    #[test]
    fn recent_keeps_each_slices_high_and_carries_levels() {
        let mut view = View::new(&Profile::empty(), RunState::Running);
        view.curve = vec![(0, 10), (1, 40), (2, 5), (9, 70)];
        view.elapsed_ns = 10;
        // Five slices of 2 ns: [0,2) holds 10 and 40, [2,4) holds 5, then nothing until 9.
        assert_eq!(view.recent(5), vec![40, 5, 5, 5, 70]);
        assert!(view.recent(0).is_empty());
        view.curve.clear();
        assert!(view.recent(5).is_empty());
    }

    #[test]
    fn recent_covers_only_the_end_of_a_long_run() {
        let mut view = View::new(&Profile::empty(), RunState::Running);
        let minute = RECENT_WINDOW_NS;
        view.curve = vec![(0, 999), (minute, 1), (2 * minute, 2)];
        view.elapsed_ns = 2 * minute;
        // The 999 is older than the window; the level entering it is 1.
        assert_eq!(view.recent(2), vec![1, 2]);
    }
}
