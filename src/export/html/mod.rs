//! A self-contained HTML report: one file, inline CSS, script and SVG, that opens from disk
//! with no network access.
//!
//! # How the page is built
//!
//! Everything a reader must see without a script — the summary, the warnings, the live-at-peak
//! table, the span tree, the iterations and the devices — is written here as escaped HTML. The
//! curves are drawn in the browser by the inline script (`report.js`) from a JSON data island
//! (`<script type="application/json">`), because SVG paths for thousands of points are smaller
//! as data than as markup. The script also sorts tables when a header is clicked, folds the span
//! tree and shows values under the pointer.
//!
//! Every string in a profile is user data (span names, ops, devices, warnings): HTML text is
//! escaped with [`escape_html`], and the JSON island escapes `<`, `>` and `&` so no `</script>`
//! can end it early. The script only ever puts profile strings into the page as text.
//!
//! # Size
//!
//! The page is as bounded as the profile: at most [`MAX_CHART_POINTS`] points per curve (the
//! highest point of each bucket and the peak are kept) and [`MAX_TABLE_ROWS`] rows per table.

pub mod fit;

use std::fmt::Write as _;
use std::path::Path;

use serde::Serialize;

use super::{write_output, ExportError, Output};
use crate::profile::span_tree;
use crate::profile::{TimelinePoint, Warning};
use crate::units::{
    format_bytes, format_bytes_delta, format_count, format_duration_ns, format_shape,
};
use crate::{Category, Profile};

/// Most points drawn per curve; longer curves keep each bucket's highest point.
pub const MAX_CHART_POINTS: usize = 4_000;
/// Most rows written per table; the rest are counted in a note under the table.
pub const MAX_TABLE_ROWS: usize = 2_000;

const STYLE: &str = include_str!("report.css");
const SCRIPT: &str = include_str!("report.js");

/// Escapes `text` for HTML text and attribute values.
///
/// # Examples
///
/// ```
/// use highwater::export::html::escape_html;
/// assert_eq!(escape_html("<b a=\"1\">&'"), "&lt;b a=&quot;1&quot;&gt;&amp;&#39;");
/// ```
pub fn escape_html(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '&' => out.push_str("&amp;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

/// Serialises `value` as JSON safe inside a `<script>` element: `<`, `>` and `&` and the two
/// line separators JavaScript treats as newlines are written as `\u` escapes.
fn json_for_script<T: Serialize>(value: &T) -> String {
    let json = serde_json::to_string(value).unwrap_or_else(|_| "null".to_string());
    let mut out = String::with_capacity(json.len());
    for c in json.chars() {
        match c {
            '<' => out.push_str("\\u003c"),
            '>' => out.push_str("\\u003e"),
            '&' => out.push_str("\\u0026"),
            '\u{2028}' => out.push_str("\\u2028"),
            '\u{2029}' => out.push_str("\\u2029"),
            c => out.push(c),
        }
    }
    out
}

/// One device's memory curve, column-wise: `series[c][i]` is category `c`'s bytes at `t[i]`.
#[derive(Debug, Serialize)]
struct DeviceCurve {
    device: String,
    capacity: Option<u64>,
    peak_bytes: u64,
    peak_ns: u64,
    t: Vec<u64>,
    series: Vec<Vec<u64>>,
}

/// One device pool's state over time.
#[derive(Debug, Serialize)]
struct PoolCurve {
    device: String,
    capacity: u64,
    t: Vec<u64>,
    reserved: Vec<u64>,
    fragmentation: Vec<f64>,
}

/// What the script draws.
#[derive(Debug, Serialize)]
struct ChartData {
    categories: Vec<&'static str>,
    duration_ns: u64,
    peak_bytes: u64,
    peak_ns: u64,
    peak_device: String,
    devices: Vec<DeviceCurve>,
    pools: Vec<PoolCurve>,
    iterations: Vec<(u64, u64, i64)>,
}

/// Indices of at most `max` items of `values` keeping each bucket's highest and `must`.
fn downsample(values: &[u64], max: usize, must: Option<usize>) -> Vec<usize> {
    if values.len() <= max || max < 2 {
        return (0..values.len()).collect();
    }
    let bucket = values.len().div_ceil(max - 1);
    let mut keep: Vec<usize> = (0..values.len())
        .step_by(bucket)
        .map(|start| {
            let end = (start + bucket).min(values.len());
            (start..end).max_by_key(|&i| values[i]).unwrap_or(start)
        })
        .collect();
    if let Some(i) = must {
        if keep.binary_search(&i).is_err() {
            keep.push(i);
            keep.sort_unstable();
        }
    }
    keep
}

/// Device names in order: the devices table first, then any only the curves mention.
fn device_order(profile: &Profile) -> Vec<String> {
    let mut names: Vec<String> = Vec::new();
    let all = profile
        .devices
        .iter()
        .map(|d| &d.device)
        .chain(profile.timeline.iter().map(|p| &p.device))
        .chain(profile.pool_timeline.iter().map(|p| &p.device));
    for name in all {
        if !names.contains(name) {
            names.push(name.clone());
        }
    }
    names
}

fn chart_data(profile: &Profile) -> ChartData {
    let summary = &profile.summary;
    let mut devices = Vec::new();
    let mut pools = Vec::new();
    let mut order = device_order(profile);
    // The device that peaked comes first: its chart is the one a reader came for.
    if let Some(i) = order.iter().position(|d| *d == summary.peak_device) {
        let peak = order.remove(i);
        order.insert(0, peak);
    }
    for name in order {
        let stats = profile.devices.iter().find(|d| d.device == name);
        let mut points: Vec<&TimelinePoint> = profile
            .timeline
            .iter()
            .filter(|p| p.device == name)
            .collect();
        points.sort_by_key(|p| p.timestamp_ns);
        if !points.is_empty() {
            let live: Vec<u64> = points.iter().map(|p| p.live_bytes).collect();
            let peak_index = (0..live.len()).max_by_key(|&i| (live[i], usize::MAX - i));
            let keep = downsample(&live, MAX_CHART_POINTS, peak_index);
            let mut series: Vec<Vec<u64>> = (0..Category::COUNT)
                .map(|_| Vec::with_capacity(keep.len()))
                .collect();
            for &i in &keep {
                let mut slots = [0u64; Category::COUNT];
                for (category, &bytes) in &points[i].by_category {
                    let slot = &mut slots[category.index()];
                    *slot = slot.saturating_add(bytes);
                }
                for (column, value) in series.iter_mut().zip(slots) {
                    column.push(value);
                }
            }
            devices.push(DeviceCurve {
                device: name.clone(),
                capacity: stats.and_then(|s| s.capacity_bytes),
                peak_bytes: stats.map_or(0, |s| s.peak_bytes),
                peak_ns: stats.map_or(0, |s| s.peak_timestamp_ns),
                t: keep.iter().map(|&i| points[i].timestamp_ns).collect(),
                series,
            });
        }
        let mut pool: Vec<_> = profile
            .pool_timeline
            .iter()
            .filter(|p| p.device == name)
            .collect();
        pool.sort_by_key(|p| p.timestamp_ns);
        if !pool.is_empty() {
            let reserved: Vec<u64> = pool.iter().map(|p| p.reserved_bytes).collect();
            let keep = downsample(&reserved, MAX_CHART_POINTS, None);
            pools.push(PoolCurve {
                device: name.clone(),
                capacity: pool.iter().map(|p| p.capacity_bytes).max().unwrap_or(0),
                t: keep.iter().map(|&i| pool[i].timestamp_ns).collect(),
                reserved: keep.iter().map(|&i| reserved[i]).collect(),
                fragmentation: keep
                    .iter()
                    .map(|&i| {
                        let f = pool[i].fragmentation;
                        if f.is_finite() {
                            f.clamp(0.0, 1.0)
                        } else {
                            0.0
                        }
                    })
                    .collect(),
            });
        }
    }
    ChartData {
        categories: Category::ALL.iter().map(|c| c.as_str()).collect(),
        duration_ns: summary.duration_ns,
        peak_bytes: summary.peak_bytes,
        peak_ns: summary.peak_timestamp_ns,
        peak_device: summary.peak_device.clone(),
        devices,
        pools,
        iterations: profile
            .iterations
            .iter()
            .take(MAX_CHART_POINTS)
            .map(|i| (i.index, i.live_bytes, i.delta_bytes))
            .collect(),
    }
}

fn share(part: u64, whole: u64) -> f64 {
    if whole == 0 {
        0.0
    } else {
        part as f64 * 100.0 / whole as f64
    }
}

/// Writes a `<td>` whose sort key is `key` and whose text is `text` (already escaped).
fn num_cell(out: &mut String, key: impl std::fmt::Display, text: &str) {
    let _ = write!(out, "<td class=\"num\" data-v=\"{key}\">{text}</td>");
}

fn text_cell(out: &mut String, text: &str) {
    let _ = write!(out, "<td>{}</td>", escape_html(text));
}

fn more_rows_note(out: &mut String, total: usize) {
    if total > MAX_TABLE_ROWS {
        let _ = write!(
            out,
            "<p class=\"note\">{} more rows are in the profile JSON.</p>",
            total - MAX_TABLE_ROWS
        );
    }
}

fn summary_section(out: &mut String, profile: &Profile) {
    let s = &profile.summary;
    out.push_str("<section id=\"summary\"><h2>Summary</h2><div class=\"cards\">");
    let _ = write!(
        out,
        "<div class=\"card peak\"><div class=\"label\">Peak</div>\
         <div class=\"value\" id=\"peak-value\">{}</div>\
         <div class=\"sub\">on <b>{}</b> at {} of {}</div></div>",
        format_bytes(s.peak_bytes),
        escape_html(&s.peak_device),
        format_duration_ns(s.peak_timestamp_ns),
        format_duration_ns(s.duration_ns)
    );
    let cards = [
        ("Live at end", format_bytes(s.final_live_bytes)),
        ("Allocated in total", format_bytes(s.total_alloc_bytes)),
        ("Kept for backward", format_bytes(s.autograd_retained_bytes)),
        (
            "Allocations / frees",
            format!(
                "{} / {}",
                format_count(s.alloc_count),
                format_count(s.free_count)
            ),
        ),
        (
            "Events dropped",
            format!(
                "{} of {}",
                format_count(s.dropped_events),
                format_count(s.event_count)
            ),
        ),
    ];
    for (label, value) in cards {
        let _ = write!(
            out,
            "<div class=\"card\"><div class=\"label\">{label}</div><div class=\"value\">{value}</div></div>"
        );
    }
    out.push_str("</div>");
    // Peak by category: one stacked bar and a legend with values.
    let mut categories: Vec<(usize, u64)> = s
        .peak_by_category
        .iter()
        .map(|(category, &bytes)| (category.index(), bytes))
        .collect();
    categories.sort_by_key(|c| c.0);
    out.push_str("<h3>At the peak, by category</h3><div class=\"catbar\">");
    for &(slot, bytes) in &categories {
        let _ = write!(
            out,
            "<span class=\"c{slot}\" style=\"width:{:.3}%\"></span>",
            share(bytes, s.peak_bytes)
        );
    }
    out.push_str("</div><ul class=\"legend\">");
    for &(slot, bytes) in &categories {
        let _ = write!(
            out,
            "<li><i class=\"c{slot}\"></i>{} <b>{}</b> ({:.1}%)</li>",
            Category::from_index(slot as u8),
            format_bytes(bytes),
            share(bytes, s.peak_bytes)
        );
    }
    out.push_str("</ul></section>");
}

fn peak_table(out: &mut String, profile: &Profile) {
    let peak = profile.summary.peak_bytes;
    out.push_str(
        "<section id=\"peak\"><h2>Live at the peak</h2>\
         <p class=\"note\">What held memory when it peaked, grouped by span path, op, category \
         and device. Click a header to sort.</p>\
         <table id=\"peak-table\" class=\"sortable\"><thead><tr>\
         <th data-type=\"text\">Span path</th><th data-type=\"text\">Op</th>\
         <th data-type=\"text\">Shape</th><th data-type=\"text\">Category</th>\
         <th data-type=\"text\">Device</th><th data-type=\"num\" class=\"num\" aria-sort=\"descending\">Bytes</th>\
         <th data-type=\"num\" class=\"num\">Share</th><th data-type=\"num\" class=\"num\">Count</th>\
         </tr></thead><tbody>",
    );
    let mut rows: Vec<_> = profile.peak_breakdown.iter().collect();
    rows.sort_by_key(|row| std::cmp::Reverse(row.bytes));
    for row in rows.iter().take(MAX_TABLE_ROWS) {
        out.push_str("<tr>");
        let path = if row.span_path.is_empty() {
            "(outside spans)"
        } else {
            &row.span_path
        };
        let _ = write!(out, "<td class=\"path\">{}</td>", escape_html(path));
        text_cell(out, row.op.as_deref().unwrap_or("-"));
        let mut shape = format_shape(row.shape.as_deref());
        if let Some(dtype) = &row.dtype {
            shape = format!("{shape} {dtype}");
        }
        text_cell(out, &shape);
        let slot = row.category.index();
        let _ = write!(
            out,
            "<td><i class=\"dot c{slot}\"></i>{}</td>",
            row.category
        );
        text_cell(out, &row.device);
        num_cell(out, row.bytes, &format_bytes(row.bytes));
        let pct = share(row.bytes, peak);
        num_cell(out, format!("{pct:.4}"), &format!("{pct:.1}%"));
        num_cell(out, row.count, &row.count.to_string());
        out.push_str("</tr>");
    }
    out.push_str("</tbody></table>");
    more_rows_note(out, rows.len());
    if profile.peak_breakdown.is_empty() {
        out.push_str("<p class=\"note\">No allocations were live at the peak.</p>");
    }
    largest_table(out, profile);
    out.push_str("</section>");
}

fn largest_table(out: &mut String, profile: &Profile) {
    if profile.largest_at_peak.is_empty() {
        return;
    }
    out.push_str(
        "<h3>Largest single allocations live at the peak</h3>\
         <table id=\"largest-table\" class=\"sortable\"><thead><tr>\
         <th data-type=\"text\">Span path</th><th data-type=\"text\">Op</th>\
         <th data-type=\"text\">Shape</th><th data-type=\"text\">Category</th>\
         <th data-type=\"text\">Device</th><th data-type=\"num\" class=\"num\" aria-sort=\"descending\">Bytes</th>\
         <th data-type=\"num\" class=\"num\">Allocated at</th><th data-type=\"num\" class=\"num\">Thread</th>\
         </tr></thead><tbody>",
    );
    let mut rows: Vec<_> = profile.largest_at_peak.iter().collect();
    rows.sort_by_key(|row| std::cmp::Reverse(row.bytes));
    for row in rows.iter().take(MAX_TABLE_ROWS) {
        let path = if row.span_path.is_empty() {
            "(outside spans)"
        } else {
            &row.span_path
        };
        let _ = write!(out, "<tr><td class=\"path\">{}</td>", escape_html(path));
        text_cell(out, row.op.as_deref().unwrap_or("-"));
        text_cell(out, &format_shape(row.shape.as_deref()));
        let _ = write!(
            out,
            "<td><i class=\"dot c{}\"></i>{}</td>",
            row.category.index(),
            row.category
        );
        text_cell(out, &row.device);
        num_cell(out, row.bytes, &format_bytes(row.bytes));
        num_cell(out, row.timestamp_ns, &format_duration_ns(row.timestamp_ns));
        num_cell(out, row.thread, &row.thread.to_string());
        out.push_str("</tr>");
    }
    out.push_str("</tbody></table>");
    more_rows_note(out, rows.len());
}

fn span_section(out: &mut String, profile: &Profile) {
    out.push_str(
        "<section id=\"spans\"><h2>Spans</h2>\
         <p class=\"note\">Every path of the span tree, all calls added up. Peak is the highest \
         live bytes while the span was open; residual is what it allocated and left live at \
         exit. Click a row marked ▾ to fold its children.</p>\
         <table id=\"span-table\" class=\"tree\"><thead><tr><th>Span</th><th>Step</th>\
         <th class=\"num\">Calls</th><th class=\"num\">Time</th><th class=\"num\">Allocated</th>\
         <th class=\"num\">Peak</th><th class=\"num\">Residual</th></tr></thead><tbody>",
    );
    let tree = span_tree(&profile.spans);
    let peak = profile.summary.peak_bytes;
    for (k, row) in tree.iter().take(MAX_TABLE_ROWS).enumerate() {
        let span = &profile.spans[row.index];
        let has_children = tree.get(k + 1).is_some_and(|next| next.depth > row.depth);
        let depth = row.depth.min(40);
        let _ = write!(
            out,
            "<tr data-depth=\"{depth}\"{}><td class=\"name\" style=\"padding-left:{:.1}em\">{}{}</td>",
            if has_children { " class=\"parent\"" } else { "" },
            0.4 + depth as f64 * 1.2,
            if has_children { "<span class=\"fold\">▾</span> " } else { "" },
            escape_html(&span.name)
        );
        let step = span
            .step
            .map(|s| s.as_str().to_string())
            .or_else(|| span.category.map(|c| format!("({c})")))
            .unwrap_or_default();
        text_cell(out, &step);
        num_cell(out, span.calls, &span.calls.to_string());
        num_cell(out, span.total_ns, &format_duration_ns(span.total_ns));
        num_cell(
            out,
            span.bytes_allocated,
            &format_bytes(span.bytes_allocated),
        );
        let _ = write!(
            out,
            "<td class=\"num\" data-v=\"{}\"><span class=\"bar\" style=\"width:{:.1}px\"></span>{}</td>",
            span.peak_bytes,
            share(span.peak_bytes, peak).min(100.0) * 0.6,
            format_bytes(span.peak_bytes)
        );
        num_cell(out, span.residual_bytes, &format_bytes(span.residual_bytes));
        out.push_str("</tr>");
    }
    out.push_str("</tbody></table>");
    more_rows_note(out, tree.len());
    if profile.spans.is_empty() {
        out.push_str("<p class=\"note\">No spans were recorded.</p>");
    }
    out.push_str("</section>");
}

fn iterations_section(out: &mut String, profile: &Profile) {
    out.push_str(
        "<section id=\"iterations\"><h2>Per iteration</h2>\
         <p class=\"note\">How live bytes changed from one iteration's end to the next \
         (orange: grew). Growth in every iteration is the signature of a leak.</p><div class=\"chart\" id=\"iteration-chart\"></div>",
    );
    if profile.iterations.is_empty() {
        out.push_str("<p class=\"note\">No iterations were recorded.</p></section>");
        return;
    }
    out.push_str(
        "<table id=\"iteration-table\" class=\"sortable\"><thead><tr>\
         <th data-type=\"num\" class=\"num\">#</th><th data-type=\"text\">Span</th>\
         <th data-type=\"num\" class=\"num\">Ended at</th>\
         <th data-type=\"num\" class=\"num\">Live bytes</th>\
         <th data-type=\"num\" class=\"num\">Change</th></tr></thead><tbody>",
    );
    for it in profile.iterations.iter().take(MAX_TABLE_ROWS) {
        out.push_str("<tr>");
        num_cell(out, it.index, &it.index.to_string());
        text_cell(out, &it.span);
        num_cell(
            out,
            it.end_timestamp_ns,
            &format_duration_ns(it.end_timestamp_ns),
        );
        num_cell(out, it.live_bytes, &format_bytes(it.live_bytes));
        let class = if it.delta_bytes > 0 { "up" } else { "down" };
        let _ = write!(
            out,
            "<td class=\"num {class}\" data-v=\"{}\">{}</td>",
            it.delta_bytes,
            format_bytes_delta(it.delta_bytes)
        );
        out.push_str("</tr>");
    }
    out.push_str("</tbody></table>");
    more_rows_note(out, profile.iterations.len());
    out.push_str("</section>");
}

fn devices_section(out: &mut String, profile: &Profile) {
    out.push_str(
        "<section id=\"devices\"><h2>Devices and pools</h2>\
         <table id=\"device-table\" class=\"sortable\"><thead><tr>\
         <th data-type=\"text\">Device</th><th data-type=\"num\" class=\"num\">Peak</th>\
         <th data-type=\"num\" class=\"num\">At</th><th data-type=\"num\" class=\"num\">Capacity</th>\
         <th data-type=\"num\" class=\"num\">Live at end</th>\
         <th data-type=\"num\" class=\"num\">Pool reserved (max)</th>\
         <th data-type=\"num\" class=\"num\">Fragmentation (max)</th>\
         <th data-type=\"num\" class=\"num\">Allocs</th></tr></thead><tbody>",
    );
    for d in profile.devices.iter().take(MAX_TABLE_ROWS) {
        out.push_str("<tr>");
        text_cell(out, &d.device);
        num_cell(out, d.peak_bytes, &format_bytes(d.peak_bytes));
        num_cell(
            out,
            d.peak_timestamp_ns,
            &format_duration_ns(d.peak_timestamp_ns),
        );
        let optional = |v: Option<u64>| v.map(format_bytes).unwrap_or_else(|| "-".into());
        num_cell(
            out,
            d.capacity_bytes.unwrap_or(0),
            &optional(d.capacity_bytes),
        );
        num_cell(out, d.final_live_bytes, &format_bytes(d.final_live_bytes));
        num_cell(
            out,
            d.peak_reserved_bytes.unwrap_or(0),
            &optional(d.peak_reserved_bytes),
        );
        let fragmentation = d.max_fragmentation.filter(|f| f.is_finite());
        num_cell(
            out,
            fragmentation.unwrap_or(0.0),
            &fragmentation.map_or("-".into(), |f| format!("{:.1}%", f * 100.0)),
        );
        num_cell(out, d.alloc_count, &format_count(d.alloc_count));
        out.push_str("</tr>");
    }
    out.push_str("</tbody></table><div id=\"pool-charts\"></div></section>");
}

/// `ms` since the Unix epoch as `YYYY-MM-DD HH:MM:SS UTC` (proleptic Gregorian calendar).
fn format_unix_ms(ms: u64) -> String {
    let secs = ms / 1000;
    let days = (secs / 86_400) as i64;
    let rem = secs % 86_400;
    // Days to civil date, after Howard Hinnant's `civil_from_days`.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02} {:02}:{:02}:{:02} UTC",
        rem / 3600,
        rem / 60 % 60,
        rem % 60
    )
}

/// Renders `profile` as one self-contained HTML page.
///
/// # Examples
///
/// ```
/// let page = highwater::export::html::render(&highwater::Profile::empty());
/// assert!(page.starts_with("<!DOCTYPE html>"));
/// ```
pub fn render(profile: &Profile) -> String {
    render_with(profile, "")
}

/// [`render`] with `extra` (trusted markup, such as [`fit::section`]) added after the last
/// section.
pub fn render_with(profile: &Profile, extra: &str) -> String {
    let meta = &profile.meta;
    let program = if meta.program.is_empty() {
        "a run"
    } else {
        &meta.program
    };
    let mut out = String::with_capacity(256 * 1024);
    let _ = write!(
        out,
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\
         <meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\
         <meta http-equiv=\"Content-Security-Policy\" content=\"default-src 'none'; \
         style-src 'unsafe-inline'; script-src 'unsafe-inline'; img-src data:\">\
         <title>highwater: {}</title><style>{STYLE}</style></head><body>\
         <header><h1>highwater <span>memory profile of <b>{}</b></span></h1>\
         <p class=\"meta\">highwater {} · {} threads · {} clock · started {}</p></header><main>",
        escape_html(program),
        escape_html(program),
        escape_html(&meta.highwater_version),
        meta.threads,
        escape_html(&meta.clock),
        format_unix_ms(meta.started_unix_ms)
    );
    // Lost events put every figure in doubt: that notice stands out above the rest.
    let (dropped, others): (Vec<&Warning>, Vec<&Warning>) = profile
        .warnings
        .iter()
        .partition(|w| matches!(w, Warning::DroppedEvents { .. }));
    for warning in dropped {
        let _ = write!(
            out,
            "<div class=\"alert\" id=\"dropped-warning\" role=\"alert\">⚠ {}</div>",
            escape_html(&warning.to_string())
        );
    }
    if !others.is_empty() {
        out.push_str("<ul class=\"warnings\" id=\"warnings\">");
        for warning in others.into_iter().take(MAX_TABLE_ROWS) {
            let _ = write!(
                out,
                "<li data-code=\"{}\">{}</li>",
                warning.code(),
                escape_html(&warning.to_string())
            );
        }
        out.push_str("</ul>");
    }
    summary_section(&mut out, profile);
    out.push_str(
        "<section id=\"timeline\"><h2>Memory over time</h2>\
         <p class=\"note\">Live bytes per device, stacked by category. The red line marks the \
         peak. Hover for values.</p><div id=\"timelines\"></div>\
         <noscript><p class=\"alert\">The charts need JavaScript; the tables below do not.</p></noscript>\
         </section>",
    );
    peak_table(&mut out, profile);
    span_section(&mut out, profile);
    iterations_section(&mut out, profile);
    devices_section(&mut out, profile);
    out.push_str(extra);
    let _ = writeln!(
        out,
        "</main><footer>Written by highwater from the profile alone: this file loads nothing \
         from the network.</footer><div id=\"tip\" hidden></div>\
         <script type=\"application/json\" id=\"hw-data\">{}</script>\
         <script>{SCRIPT}</script></body></html>",
        json_for_script(&chart_data(profile))
    );
    out
}

/// Where the report of the profile at `profile_path` goes by default: beside it, its `.json`
/// extension replaced by `.html` (`run/highwater-profile.json` → `run/highwater-profile.html`).
pub fn path_beside(profile_path: &Path) -> std::path::PathBuf {
    super::beside(profile_path, ".html")
}

/// Writes [`render`]`(profile)` to `path` atomically (a temporary sibling renamed into place).
///
/// # Errors
///
/// [`ExportError`] naming the file when it cannot be written; `path` keeps what it held before.
pub fn write(profile: &Profile, path: impl AsRef<Path>) -> Result<(), ExportError> {
    write_output(
        Output::HtmlReport,
        path.as_ref(),
        render(profile).as_bytes(),
    )
}

/// Writes [`render_with`]`(profile, extra)` to `path` atomically.
///
/// # Errors
///
/// [`ExportError`] naming the file when it cannot be written; `path` keeps what it held before.
pub fn write_with(
    profile: &Profile,
    extra: &str,
    path: impl AsRef<Path>,
) -> Result<(), ExportError> {
    write_output(
        Output::HtmlReport,
        path.as_ref(),
        render_with(profile, extra).as_bytes(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::export::sample::{sample_profile, sample_profile_with_drops};

    const HOSTILE: &str = "<script>alert(1)</script>";

    #[test]
    fn user_strings_cannot_inject_markup_or_end_the_data_island() {
        let mut profile = sample_profile();
        profile.meta.program = HOSTILE.into();
        profile.spans[1].name = HOSTILE.into();
        profile.peak_breakdown[0].span_path = format!("a/{HOSTILE}");
        profile.peak_breakdown[0].op = Some("</script><img src=x onerror=alert(1)>".into());
        profile.timeline[0].device = HOSTILE.into();
        profile.warnings.push(Warning::Note {
            text: HOSTILE.into(),
        });
        let page = render(&profile);
        assert!(!page.contains(HOSTILE), "raw hostile string in page");
        assert!(!page.contains("<img"));
        assert_eq!(page.matches("<script").count(), 2, "only our two scripts");
        assert_eq!(page.matches("</script>").count(), 2);
        assert!(page.contains("&lt;script&gt;alert(1)&lt;/script&gt;"));
    }

    #[test]
    fn page_is_self_contained() {
        // The SVG namespace is a name, not a fetch.
        let page = render(&sample_profile()).replace("\"http://www.w3.org/2000/svg\"", "");
        for needle in [
            "http://", "https://", "src=\"", "href=\"", "@import", "url(",
        ] {
            assert!(!page.contains(needle), "page refers out: {needle}");
        }
    }

    #[test]
    fn summary_shows_peak_and_a_warning_only_when_events_dropped() {
        let profile = sample_profile();
        let page = render(&profile);
        assert!(page.contains(&format!(
            "id=\"peak-value\">{}<",
            format_bytes(profile.summary.peak_bytes)
        )));
        assert!(!page.contains("dropped-warning"));
        let page = render(&sample_profile_with_drops());
        assert!(page.contains("id=\"dropped-warning\""));
        // Each notice once, in its one wording: the drop notice as the alert, the rest listed.
        let notice = escape_html(&Warning::DroppedEvents { events: 1_234 }.to_string());
        assert_eq!(page.matches(&notice).count(), 1);
        assert_eq!(page.matches("data-code=\"growing_residual\"").count(), 1);
        assert_eq!(page.matches("data-code=\"dropped_events\"").count(), 0);
    }

    #[test]
    fn long_curves_are_bounded_and_keep_the_peak() {
        let mut profile = sample_profile();
        let n = 50_000u64;
        profile.timeline = (0..n)
            .map(|i| TimelinePoint {
                timestamp_ns: i,
                device: "cpu".into(),
                live_bytes: if i == 31_337 { 1 << 40 } else { i % 1000 },
                by_category: [(Category::Other, i % 1000)].into_iter().collect(),
            })
            .collect();
        let data = chart_data(&profile);
        let cpu = &data.devices[0];
        assert!(cpu.t.len() <= MAX_CHART_POINTS + 1);
        assert!(cpu.t.contains(&31_337));
        let small = render(&sample_profile()).len();
        let big = render(&profile).len();
        assert!(big < small + 400_000, "{small} -> {big}");
    }

    #[test]
    fn unix_milliseconds_read_as_a_utc_date() {
        assert_eq!(format_unix_ms(0), "1970-01-01 00:00:00 UTC");
        assert_eq!(format_unix_ms(1_764_489_600_000), "2025-11-30 08:00:00 UTC");
        assert_eq!(format_unix_ms(951_782_400_000), "2000-02-29 00:00:00 UTC");
        assert!(format_unix_ms(u64::MAX).ends_with("UTC"));
    }

    #[test]
    fn downsample_keeps_each_buckets_highest() {
        let values = [1, 9, 2, 3, 8, 1, 0, 7];
        assert_eq!(downsample(&values, 100, None), (0..8).collect::<Vec<_>>());
        let kept = downsample(&values, 3, Some(6));
        assert!(
            kept.contains(&1) && kept.contains(&4) && kept.contains(&6),
            "{kept:?}"
        );
    }
}
