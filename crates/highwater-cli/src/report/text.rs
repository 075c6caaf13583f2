//! Plain-text and JSON views of a profile for a terminal: the `highwater` commands' output.

use std::borrow::Cow;
use std::fmt::Write as _;

use serde::Serialize;

use super::diff::{Delta, ProfileDiff};
use highwater_export::vocabulary as words;
use highwater_profile::model::Category;
use highwater_profile::model::OomSource;
use highwater_profile::span_tree;
use highwater_profile::units::{
    format_bytes, format_bytes_delta, format_count, format_duration_ns, format_shape,
};
use highwater_profile::Profile;
use highwater_profile::{DeviceStats, OomEvent, PeakRow, RunMeta, SpanMetrics, Summary, Warning};

/// Replaces control characters (newlines, escape sequences) in profile strings, which are user
/// data, so they cannot move the cursor or forge lines in a terminal, and spells out the
/// characters that reorder text (right-to-left overrides and isolates), which could make a
/// name read as something it is not.
pub fn clean(text: &str) -> Cow<'_, str> {
    if text.chars().any(|c| c.is_control() || is_bidi_control(c)) {
        let mut out = String::with_capacity(text.len());
        for c in text.chars() {
            if is_bidi_control(c) {
                out.push_str(&format!("<U+{:04X}>", c as u32));
            } else if c.is_control() {
                out.push('\u{FFFD}');
            } else {
                out.push(c);
            }
        }
        Cow::Owned(out)
    } else {
        Cow::Borrowed(text)
    }
}

/// Whether `c` changes the direction text is shown in: the embeddings, overrides and isolates
/// of Unicode's bidirectional algorithm, and its marks.
pub fn is_bidi_control(c: char) -> bool {
    matches!(
        c,
        '\u{061C}' | '\u{200E}' | '\u{200F}' | '\u{202A}'..='\u{202E}' | '\u{2066}'..='\u{2069}'
    )
}

/// `part` as a percentage of `whole`, one decimal (`0.0%` when `whole` is zero).
pub(super) fn percent(part: u64, whole: u64) -> String {
    if whole == 0 {
        return "0.0%".to_string();
    }
    format!("{:.1}%", part as f64 * 100.0 / whole as f64)
}

/// A text table with a header row; columns listed in `right` are right-aligned.
pub(super) struct Table {
    header: Vec<&'static str>,
    right: Vec<bool>,
    rows: Vec<Vec<String>>,
}

impl Table {
    pub(super) fn new(columns: &[(&'static str, bool)]) -> Table {
        Table {
            header: columns.iter().map(|c| c.0).collect(),
            right: columns.iter().map(|c| c.1).collect(),
            rows: Vec::new(),
        }
    }

    pub(super) fn push(&mut self, row: Vec<String>) {
        self.rows.push(row);
    }

    pub(super) fn render(&self, out: &mut String, indent: &str) {
        self.render_rows(out, indent, true);
    }

    /// The rows without the header line (columns still aligned).
    pub(super) fn render_body(&self, out: &mut String, indent: &str) {
        self.render_rows(out, indent, false);
    }

    fn render_rows(&self, out: &mut String, indent: &str, with_header: bool) {
        let mut widths: Vec<usize> = self
            .header
            .iter()
            .map(|h| if with_header { h.chars().count() } else { 0 })
            .collect();
        for row in &self.rows {
            for (width, cell) in widths.iter_mut().zip(row) {
                *width = (*width).max(cell.chars().count());
            }
        }
        let header: Vec<String> = self.header.iter().map(|h| h.to_string()).collect();
        let header = with_header.then_some(&header);
        for row in header.into_iter().chain(&self.rows) {
            let mut line = String::from(indent);
            let last = row.len().saturating_sub(1);
            for (i, cell) in row.iter().enumerate() {
                let pad = widths[i].saturating_sub(cell.chars().count());
                if self.right[i] {
                    line.push_str(&" ".repeat(pad));
                    line.push_str(cell);
                } else {
                    line.push_str(cell);
                    if i != last {
                        line.push_str(&" ".repeat(pad));
                    }
                }
                if i != last {
                    line.push_str("  ");
                }
            }
            out.push_str(line.trim_end());
            out.push('\n');
        }
    }
}

/// The `summary` view: peak (when, where, by category), counts, devices and warnings.
pub fn summary_text(profile: &Profile) -> String {
    let s = &profile.summary;
    let m = &profile.meta;
    let mut out = String::new();
    let program = if m.program.is_empty() {
        "(unnamed program)"
    } else {
        &m.program
    };
    let _ = writeln!(
        out,
        "highwater profile of {} (highwater {}, {} threads, {} clock)",
        clean(program),
        clean(&m.highwater_version),
        m.threads,
        clean(&m.clock)
    );
    // Lost events put every figure in doubt: that notice comes first, the others last.
    let (dropped, others): (Vec<&Warning>, Vec<&Warning>) = profile
        .warnings
        .iter()
        .partition(|w| matches!(w, Warning::DroppedEvents { .. }));
    for warning in dropped {
        let _ = writeln!(out, "WARNING: {}", clean(&warning.to_string()));
    }
    let _ = writeln!(
        out,
        "peak:        {} on {} at {} (run lasted {})",
        format_bytes(s.peak_bytes),
        clean(&s.peak_device),
        format_duration_ns(s.peak_timestamp_ns),
        format_duration_ns(s.duration_ns)
    );
    let mut categories: Vec<(&Category, &u64)> = s.peak_by_category.iter().collect();
    categories.sort_by(|a, b| b.1.cmp(a.1).then_with(|| a.0.as_str().cmp(b.0.as_str())));
    let mut table = Table::new(&[
        ("CATEGORY", false),
        ("AT PEAK", true),
        ("SHARE", true),
        ("STATE", true),
        ("TEMPORARY", true),
    ]);
    for (name, bytes) in categories {
        let temporary = s
            .peak_temporary_by_category
            .get(name)
            .copied()
            .unwrap_or(0)
            .min(*bytes);
        table.push(vec![
            name.to_string(),
            format_bytes(*bytes),
            percent(*bytes, s.peak_bytes),
            format_bytes(bytes - temporary),
            format_bytes(temporary),
        ]);
    }
    table.render(&mut out, "  ");
    let _ = writeln!(out, "  ({})", words::STATE_VS_TEMPORARY_EXPLAINED);
    let _ = writeln!(
        out,
        "allocations: {} allocs, {} frees, {} reallocs, {} allocated in total",
        format_count(s.alloc_count),
        format_count(s.free_count),
        format_count(s.realloc_count),
        format_bytes(s.total_alloc_bytes)
    );
    let _ = writeln!(
        out,
        "live at end: {}   {}: {} ({})",
        format_bytes(s.final_live_bytes),
        words::KEPT_FOR_BACKWARD.to_lowercase(),
        format_bytes(s.autograd_retained_bytes),
        words::KEPT_FOR_BACKWARD_EXPLAINED
    );
    let _ = writeln!(
        out,
        "events:      {} applied, {} dropped, {} unknown frees, {} reorder repairs",
        format_count(s.event_count),
        format_count(s.dropped_events),
        format_count(s.unknown_frees),
        format_count(s.reorder_repairs)
    );
    if let Some(site) = profile
        .sites
        .iter()
        .max_by_key(|site| (site.peak_bytes, std::cmp::Reverse(site.id)))
    {
        let frame = highwater_export::stacks::interesting(&site.frames)
            .frames
            .first()
            .map(|frame| {
                let at = highwater_export::stacks::source_location(frame)
                    .map(|at| format!(" ({at})"))
                    .unwrap_or_default();
                format!(" in {}{at}", highwater_export::stacks::function_name(frame))
            })
            .unwrap_or_default();
        let _ = writeln!(
            out,
            "call sites:  {} listed; the largest at the peak is #{}, {}{} (highwater sites)",
            format_count(profile.sites.len() as u64),
            site.id,
            highwater_export::stacks::estimate(site.peak_bytes, site.peak_bytes_error),
            clean(&frame)
        );
    }
    if !profile.devices.is_empty() {
        out.push_str("devices:\n");
        devices_table(&profile.devices).render(&mut out, "  ");
        driver_view(&profile.devices, &mut out);
    }
    oom_text(profile, &mut out);
    if !others.is_empty() {
        out.push_str("warnings:\n");
        for warning in others {
            let _ = writeln!(out, "  - {}", clean(&warning.to_string()));
        }
    }
    out
}

/// How many of an OOM event's live rows the summary lists.
const OOM_ROWS_SHOWN: usize = 5;

/// The summary's out-of-memory section: each refusal kept, when and where, what was live then,
/// and the largest live groups of the first one.
fn oom_text(profile: &Profile, out: &mut String) {
    let Some(first) = profile.oom_events.first() else {
        return;
    };
    let _ = writeln!(
        out,
        "out of memory: {} allocation{} refused (first {} listed)",
        format_count(profile.summary.oom_count),
        if profile.summary.oom_count == 1 {
            ""
        } else {
            "s"
        },
        profile.oom_events.len()
    );
    for oom in &profile.oom_events {
        let _ = writeln!(out, "  - {}", oom_line(oom));
    }
    let _ = writeln!(
        out,
        "  live on {} at the first refusal ({}):",
        clean(&first.device),
        format_duration_ns(first.timestamp_ns)
    );
    let mut table = Table::new(&[
        ("SPAN", false),
        ("OP", false),
        ("CATEGORY", false),
        ("BYTES", true),
        ("SHARE", true),
    ]);
    for row in first.live.iter().take(OOM_ROWS_SHOWN) {
        table.push(vec![
            clean(outside_spans_if_empty(&row.span_path)).into_owned(),
            clean(row.op.as_deref().unwrap_or("-")).into_owned(),
            row.category.to_string(),
            format_bytes(row.bytes),
            percent(row.bytes, first.live_bytes),
        ]);
    }
    table.render(out, "    ");
}

/// One refusal in a sentence: when, who refused what, where, and what was live.
pub(crate) fn oom_line(oom: &OomEvent) -> String {
    let source = match oom.source {
        OomSource::Heap => "the heap allocator",
        OomSource::Pool => "the device pool",
        OomSource::Driver => "the device driver",
    };
    let mut line = format!(
        "at {}: {} refused {} on {}",
        format_duration_ns(oom.timestamp_ns),
        source,
        format_bytes(oom.requested_bytes),
        clean(&oom.device)
    );
    if !oom.span_path.is_empty() {
        let _ = write!(line, " in {}", clean(&oom.span_path));
    }
    if let Some(op) = &oom.op {
        let _ = write!(line, " (op {})", clean(op));
    }
    let _ = write!(
        line,
        "; live then: {} on {}, {} on all devices",
        format_bytes(oom.live_bytes),
        clean(&oom.device),
        format_bytes(oom.total_live_bytes)
    );
    if let (Some(reserved), Some(capacity)) = (oom.pool_reserved_bytes, oom.pool_capacity_bytes) {
        let _ = write!(
            line,
            "; pool {} of {} reserved",
            format_bytes(reserved),
            format_bytes(capacity)
        );
    }
    if let Some(largest) = oom.largest_free_bytes {
        let _ = write!(line, ", largest free block {}", format_bytes(largest));
    }
    line
}

fn outside_spans_if_empty(path: &str) -> &str {
    if path.is_empty() {
        words::OUTSIDE_SPANS
    } else {
        path
    }
}

/// For each device whose driver was recorded: allocated beside what the driver's pools reserved
/// and the context's overhead, the figures `nvidia-smi` adds up.
fn driver_view(devices: &[DeviceStats], out: &mut String) {
    for d in devices {
        if d.reserved_peak_bytes.is_none() && d.context_bytes.is_none() {
            continue;
        }
        let _ = write!(
            out,
            "  {}, as its driver saw it: allocated peak {}",
            clean(&d.device),
            format_bytes(d.peak_bytes)
        );
        if let (Some(peak), Some(last)) = (d.reserved_peak_bytes, d.reserved_final_bytes) {
            let _ = write!(
                out,
                "; driver pools reserved up to {} ({} at the end)",
                format_bytes(peak),
                format_bytes(last)
            );
        }
        if let Some(context) = d.context_bytes {
            let _ = write!(
                out,
                "; {} in use before the first allocation (the context, and any other process)",
                format_bytes(context)
            );
        }
        if let Some(total) = d.capacity_bytes {
            let _ = write!(out, "; {} in all", format_bytes(total));
        }
        out.push('\n');
    }
}

fn devices_table(devices: &[DeviceStats]) -> Table {
    let mut table = Table::new(&[
        ("DEVICE", false),
        ("PEAK", true),
        ("AT", true),
        ("CAPACITY", true),
        ("FINAL", true),
        ("POOL PEAK", true),
        ("MAX FRAG", true),
    ]);
    let optional = |v: Option<u64>| v.map(format_bytes).unwrap_or_else(|| "-".into());
    for d in devices {
        table.push(vec![
            clean(&d.device).into_owned(),
            format_bytes(d.peak_bytes),
            format_duration_ns(d.peak_timestamp_ns),
            optional(d.capacity_bytes),
            format_bytes(d.final_live_bytes),
            optional(d.peak_reserved_bytes),
            d.max_fragmentation
                .map(|f| format!("{:.1}%", f * 100.0))
                .unwrap_or_else(|| "-".into()),
        ]);
    }
    table
}

/// The live-at-peak rows, largest first, at most `limit` of them.
pub fn top_rows(profile: &Profile, limit: usize) -> Vec<&PeakRow> {
    let mut rows: Vec<&PeakRow> = profile.peak_breakdown.iter().collect();
    rows.sort_by_key(|row| std::cmp::Reverse(row.bytes));
    rows.truncate(limit);
    rows
}

/// The `top` view: the largest live-at-peak groups.
pub fn top_text(profile: &Profile, limit: usize) -> String {
    let rows = top_rows(profile, limit);
    let mut out = String::new();
    let _ = writeln!(
        out,
        "live at the peak ({} on {}): {} of {} groups",
        format_bytes(profile.summary.peak_bytes),
        clean(&profile.summary.peak_device),
        rows.len(),
        profile.peak_breakdown.len()
    );
    // With call sites, each row names the largest of its sites (`highwater sites` lists them).
    let with_sites = !profile.sites.is_empty();
    let mut columns = vec![
        ("BYTES", true),
        ("SHARE", true),
        ("COUNT", true),
        ("CATEGORY", false),
        ("DEVICE", false),
        ("OUTPUT OF OP", false),
        ("SHAPE", false),
    ];
    if with_sites {
        columns.push(("SITES", false));
    }
    columns.push(("SPAN PATH", false));
    let mut table = Table::new(&columns);
    for row in rows {
        let path = if row.span_path.is_empty() {
            words::OUTSIDE_SPANS
        } else {
            &row.span_path
        };
        let mut cells = vec![
            format_bytes(row.bytes),
            percent(row.bytes, profile.summary.peak_bytes),
            format_count(row.count),
            row.category.to_string(),
            clean(&row.device).into_owned(),
            clean(row.op.as_deref().unwrap_or("-")).into_owned(),
            format_shape(row.shape.as_deref()),
        ];
        if with_sites {
            cells.push(site_refs(&row.top_sites));
        }
        cells.push(clean(path).into_owned());
        table.push(cells);
    }
    table.render(&mut out, "");
    if with_sites {
        out.push_str(
            "SITES: the call sites behind each row, largest first (estimated from sampled \
             stacks; the bytes are exact); \
             `highwater sites PROFILE --site N` shows site #N's stack\n",
        );
    }
    out
}

/// `#3 #7` for a row's sites, `-` for none.
fn site_refs(sites: &[u32]) -> String {
    if sites.is_empty() {
        return "-".to_string();
    }
    let refs: Vec<String> = sites.iter().map(|id| format!("#{id}")).collect();
    refs.join(" ")
}

/// One span tree node with its depth, as `spans --json` prints it.
#[derive(Debug, Serialize)]
pub struct SpanRow<'a> {
    /// Distance from the root.
    pub depth: usize,
    /// Names from the outermost span, joined with `/` (the profile stores the tree by id).
    pub path: String,
    /// The node's metrics.
    #[serde(flatten)]
    pub span: &'a SpanMetrics,
}

/// The span tree in display order (parents before children) with depths.
pub fn span_rows(profile: &Profile) -> Vec<SpanRow<'_>> {
    let mut paths = profile.span_paths();
    span_tree(&profile.spans)
        .into_iter()
        .map(|row| SpanRow {
            depth: row.depth,
            path: std::mem::take(&mut paths[row.index]),
            span: &profile.spans[row.index],
        })
        .collect()
}

/// Deepest indentation the text tree draws; deeper nodes are drawn at this depth.
const MAX_TEXT_INDENT: usize = 32;

/// The `spans` view: the span tree with calls, time and memory metrics.
pub fn spans_text(profile: &Profile) -> String {
    let mut table = Table::new(&[
        ("SPAN", false),
        ("CALLS", true),
        ("TIME", true),
        ("ALLOCATED", true),
        ("PEAK", true),
        ("RESIDUAL/CALL", true),
    ]);
    for row in span_rows(profile) {
        let span = row.span;
        table.push(vec![
            format!(
                "{}{}",
                "  ".repeat(row.depth.min(MAX_TEXT_INDENT)),
                clean(&span.name)
            ),
            format_count(span.calls),
            format_duration_ns(span.total_ns),
            format_bytes(span.bytes_allocated),
            format_bytes(span.peak_bytes),
            format_bytes(span.residual_per_call()),
        ]);
    }
    let mut out = String::new();
    if profile.spans.is_empty() {
        out.push_str("no spans were recorded\n");
    } else {
        table.render(&mut out, "");
        let _ = writeln!(
            out,
            "\n{}\n{}",
            words::SPAN_PEAK_EXPLAINED,
            words::RESIDUAL_EXPLAINED
        );
    }
    out
}

fn delta_cells(delta: &Delta) -> [String; 3] {
    [
        format_bytes(delta.before),
        format_bytes(delta.after),
        format_bytes_delta(delta.delta),
    ]
}

/// The `diff` view: peak, categories and the spans that changed most, at most `limit` spans.
pub fn diff_text(diff: &ProfileDiff, limit: usize) -> String {
    let mut out = String::new();
    let [before, after, delta] = delta_cells(&diff.peak_bytes);
    let _ = writeln!(
        out,
        "peak:        {before} ({}) -> {after} ({})   {delta}",
        clean(&diff.peak_device_before),
        clean(&diff.peak_device_after)
    );
    let [before, after, delta] = delta_cells(&diff.final_live_bytes);
    let _ = writeln!(out, "final live:  {before} -> {after}   {delta}");
    let [before, after, delta] = delta_cells(&diff.total_alloc_bytes);
    let _ = writeln!(out, "allocated:   {before} -> {after}   {delta}");
    out.push_str("categories at the peak:\n");
    let mut table = Table::new(&[
        ("CATEGORY", false),
        ("BEFORE", true),
        ("AFTER", true),
        ("CHANGE", true),
    ]);
    for c in &diff.categories {
        let [before, after, delta] = delta_cells(&c.bytes);
        table.push(vec![c.category.to_string(), before, after, delta]);
    }
    table.render(&mut out, "  ");
    if diff.spans.is_empty() {
        out.push_str("spans: no changes\n");
        return out;
    }
    let _ = writeln!(
        out,
        "spans that changed (largest first, {} of {}):",
        diff.spans.len().min(limit),
        diff.spans.len()
    );
    let mut table = Table::new(&[
        ("PEAK", true),
        ("RESIDUAL/CALL", true),
        ("ALLOCATED", true),
        ("SPAN PATH", false),
    ]);
    for span in diff.spans.iter().take(limit) {
        let note = match (span.in_before, span.in_after) {
            (false, true) => " (new)",
            (true, false) => " (gone)",
            _ => "",
        };
        table.push(vec![
            format_bytes_delta(span.peak_bytes.delta),
            format_bytes_delta(span.residual_per_call.delta),
            format_bytes_delta(span.bytes_allocated.delta),
            format!("{}{note}", clean(&span.path)),
        ]);
    }
    table.render(&mut out, "  ");
    out
}

/// What `summary --json` prints: the run, the headline figures, devices and warnings.
#[derive(Debug, Serialize)]
pub struct SummaryJson<'a> {
    /// About the run.
    pub meta: &'a RunMeta,
    /// The headline figures.
    pub summary: &'a Summary,
    /// Per-device figures.
    pub devices: &'a [DeviceStats],
    /// The refused allocations, with what was live at each.
    pub oom_events: &'a [OomEvent],
    /// The profile's warnings, each with its code, its figures and its sentence.
    pub warnings: Vec<WarningJson<'a>>,
}

/// One warning in `summary --json`: as the profile stores it (`code` and figures) plus the
/// sentence every view shows.
#[derive(Debug, Serialize)]
pub struct WarningJson<'a> {
    /// The warning as stored.
    #[serde(flatten)]
    pub warning: &'a Warning,
    /// Its sentence.
    pub message: String,
}

/// The `summary --json` document of `profile`.
pub fn summary_json(profile: &Profile) -> SummaryJson<'_> {
    SummaryJson {
        meta: &profile.meta,
        summary: &profile.summary,
        devices: &profile.devices,
        oom_events: &profile.oom_events,
        warnings: profile
            .warnings
            .iter()
            .map(|warning| WarningJson {
                warning,
                message: warning.to_string(),
            })
            .collect(),
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use highwater_testkit::sample::{sample_profile, sample_profile_with_drops};

    #[test]
    fn summary_names_peak_device_and_categories() {
        let p = sample_profile();
        let text = summary_text(&p);
        assert!(text.contains(&format_bytes(p.summary.peak_bytes)), "{text}");
        assert!(text.contains("cuda:0"), "{text}");
        assert!(text.contains("activation"), "{text}");
        assert!(!text.contains("WARNING"), "{text}");
        assert!(!text.contains(" GB") && !text.contains(" MB"), "{text}");
    }

    /// The sample profile with one refused pool admission on `tpu:0` at 2 s.
    pub(crate) fn with_a_refusal() -> Profile {
        let mut profile = sample_profile();
        profile.summary.oom_count = 3;
        profile.oom_events.push({
            let mut oom_event = OomEvent::default();
            oom_event.timestamp_ns = 2_000_000_000;
            oom_event.source = OomSource::Pool;
            oom_event.device = "tpu:0".into();
            oom_event.requested_bytes = 20 << 30;
            oom_event.largest_free_bytes = Some(16 << 30);
            oom_event.thread = 1;
            oom_event.span_path = "step/forward".into();
            oom_event.op = Some("matmul".into());
            oom_event.live_bytes = 6 << 30;
            oom_event.live_by_category = [
                (Category::Parameter, 4 << 30),
                (Category::Activation, 2 << 30),
            ]
            .into_iter()
            .collect();
            oom_event.total_live_bytes = 7 << 30;
            oom_event.pool_capacity_bytes = Some(32 << 30);
            oom_event.pool_reserved_bytes = Some(8 << 30);
            oom_event.live = vec![{
                let mut peak_row = PeakRow::default();
                peak_row.span_path = "init".into();
                peak_row.category = Category::Parameter;
                peak_row.device = "tpu:0".into();
                peak_row.bytes = 4 << 30;
                peak_row.count = 2;
                peak_row
            }];
            oom_event
        });
        profile
    }

    #[test]
    fn summary_shows_what_the_driver_saw_beside_what_was_allocated() {
        let plain = summary_text(&sample_profile());
        assert!(!plain.contains("as its driver saw it"), "{plain}");
        let text = summary_text(&highwater_testkit::sample::sample_profile_with_driver());
        let line = text
            .lines()
            .find(|l| l.contains("as its driver saw it"))
            .unwrap_or_else(|| panic!("{text}"));
        assert!(line.trim_start().starts_with("cuda:0"), "{line}");
        assert!(line.contains("driver pools reserved up to"), "{line}");
        assert!(line.contains("(1.0 GiB at the end)"), "{line}");
        assert!(
            line.contains("450.0 MiB in use before the first allocation"),
            "{line}"
        );
    }

    #[test]
    fn summary_lists_each_refusal_with_what_was_live() {
        let text = summary_text(&with_a_refusal());
        assert!(
            text.contains("out of memory: 3 allocations refused (first 1 listed)\n"),
            "{text}"
        );
        assert!(
            text.contains(
                "  - at 2.00 s: the device pool refused 20.0 GiB on tpu:0 in step/forward (op \
                 matmul); live then: 6.0 GiB on tpu:0, 7.0 GiB on all devices; pool 8.0 GiB of \
                 32.0 GiB reserved, largest free block 16.0 GiB\n"
            ),
            "{text}"
        );
        assert!(
            text.contains("live on tpu:0 at the first refusal (2.00 s):"),
            "{text}"
        );
        let row = text
            .lines()
            .find(|l| l.trim_start().starts_with("init"))
            .unwrap();
        assert!(
            row.contains("parameter") && row.contains("4.0 GiB") && row.contains("66.7%"),
            "{row}"
        );
        // Without refusals there is no such section.
        assert!(!summary_text(&sample_profile()).contains("out of memory"));
    }

    #[test]
    fn summary_splits_each_category_into_state_and_temporary() {
        let p = sample_profile();
        let text = summary_text(&p);
        let activation = p.summary.peak_by_category[&Category::Activation];
        let temporary = p.summary.peak_temporary_by_category[&Category::Activation];
        assert!(temporary > 0 && temporary < activation);
        let row = text
            .lines()
            .find(|line| line.trim_start().starts_with("activation"))
            .unwrap_or_else(|| panic!("no activation row: {text}"));
        let cells: Vec<&str> = row
            .split("  ")
            .map(str::trim)
            .filter(|c| !c.is_empty())
            .collect();
        assert_eq!(
            cells[3..],
            [
                format_bytes(activation - temporary),
                format_bytes(temporary)
            ],
            "{text}"
        );
        assert!(
            text.contains("STATE") && text.contains("TEMPORARY"),
            "{text}"
        );
        assert!(text.contains(words::STATE_VS_TEMPORARY_EXPLAINED), "{text}");
        // A category with nothing temporary is all state.
        let parameter = p.summary.peak_by_category[&Category::Parameter];
        let row = text
            .lines()
            .find(|line| line.trim_start().starts_with("parameter"))
            .unwrap_or_else(|| panic!("no parameter row: {text}"));
        let cells: Vec<&str> = row
            .split("  ")
            .map(str::trim)
            .filter(|c| !c.is_empty())
            .collect();
        assert_eq!(
            cells[3..],
            [format_bytes(parameter), format_bytes(0)],
            "{text}"
        );
    }

    #[test]
    fn summary_warns_when_events_were_dropped() {
        let profile = sample_profile_with_drops();
        let text = summary_text(&profile);
        let notice = Warning::DroppedEvents {
            events: 1_234,
            mode: highwater_profile::CaptureMode::DropWhenFull,
        }
        .to_string();
        assert!(text.starts_with("highwater profile of"), "{text}");
        assert_eq!(
            text.lines().nth(1),
            Some(format!("WARNING: {notice}").as_str())
        );
        // Shown once: not repeated in the list of other warnings.
        assert_eq!(text.matches(&notice).count(), 1, "{text}");
        assert!(text.contains("warnings:\n  - live memory grows"), "{text}");
    }

    #[test]
    fn control_characters_in_names_are_neutralised() {
        let mut p = sample_profile();
        p.spans[0].name = "evil\x1b[2J\nname".into();
        let text = spans_text(&p);
        assert!(!text.contains('\x1b'));
        // The header, one line per span, then the explanations after a blank line.
        let table = text.lines().take_while(|line| !line.is_empty()).count();
        assert_eq!(table, p.spans.len() + 1);
        assert!(text.contains(words::RESIDUAL_EXPLAINED));
    }

    /// Hardening III, row 19: a right-to-left override printed raw makes a name read as
    /// another (`evil`, U+202E, `gnp.exe` shows as `evilexe.png`).
    #[test]
    fn text_reordering_characters_are_spelled_out() {
        assert_eq!(clean("evil\u{202E}gnp.exe"), "evil<U+202E>gnp.exe");
        assert_eq!(clean("a\u{2066}b\u{2069}"), "a<U+2066>b<U+2069>");
        assert_eq!(clean("plain"), "plain");
        let mut p = sample_profile();
        p.spans[0].name = "step\u{202E}drawrof".into();
        assert!(!spans_text(&p).contains('\u{202E}'));
    }

    /// Issue 34: residual means one thing everywhere, a call's; the spans view showed the
    /// total over all calls (`backward 791.2 MiB`) while the example showed it per call.
    #[test]
    fn spans_show_the_residual_of_one_call() {
        let mut p = sample_profile();
        p.spans[0].calls = 200;
        p.spans[0].residual_bytes = 800 << 20;
        let text = spans_text(&p);
        let row = text.lines().nth(1).unwrap();
        assert!(text.lines().next().unwrap().contains("RESIDUAL/CALL"));
        assert!(row.trim_end().ends_with("4.0 MiB"), "{row}");
        assert!(!row.contains("800.0 MiB"), "{row}");
    }

    #[test]
    fn top_is_sorted_and_limited() {
        let p = sample_profile();
        let rows = top_rows(&p, 5);
        assert_eq!(rows.len(), 5);
        assert!(rows.windows(2).all(|w| w[0].bytes >= w[1].bytes));
        let text = top_text(&p, 5);
        // The title, the header, five rows and the line explaining SITES.
        assert_eq!(text.lines().count(), 8, "{text}");
        let site = rows[0].top_sites[0];
        assert!(
            text.lines().nth(2).unwrap().contains(&format!(" #{site} ")),
            "{text}"
        );
        assert!(text.contains("--site N"), "{text}");
        let mut without = p.clone();
        without.sites.clear();
        assert!(!top_text(&without, 5).contains("SITES"));
    }
}
