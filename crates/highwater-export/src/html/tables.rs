//! The report's tables, written as escaped HTML so they read without a script: live at the
//! peak, the largest live allocations, the span tree, the iterations and the devices.
//!
//! Each table has at most [`MAX_TABLE_ROWS`] rows; a note under it counts the rest. A table
//! shows at most [`SHOWN_ROWS`] of them (one screen) and folds rows that hold nothing at the
//! peak; a button under it shows them all (without a script every row shows). Numeric cells
//! carry their raw value in `data-v`, which the script sorts by.

use std::fmt::Write as _;

use super::{escape_html, words, MAX_TABLE_ROWS};
use highwater_profile::span_tree;
use highwater_profile::units::{
    format_bytes, format_bytes_delta, format_count, format_duration_ns, format_shape,
};
use highwater_profile::Profile;

/// Rows a table shows before its "Show all" button: about one screen.
pub const SHOWN_ROWS: usize = 12;

/// Rows the call-site table shows before its "Show all" button: its rows are several lines
/// tall (a stack each).
pub const SHOWN_SITE_ROWS: usize = 6;

/// Opens row `index` of a limited table: rows past [`SHOWN_ROWS`] and `zero` rows (nothing at
/// the peak) start folded; `id` is the row's anchor, if any.
pub(super) fn row_start(out: &mut String, index: usize, zero: bool, id: Option<&str>) {
    row_start_of(out, index, SHOWN_ROWS, zero, id);
}

/// [`row_start`] for a table that shows `shown` rows.
pub(super) fn row_start_of(
    out: &mut String,
    index: usize,
    shown: usize,
    zero: bool,
    id: Option<&str>,
) {
    let mut classes = Vec::new();
    if zero {
        classes.push("zero");
    }
    if zero || index >= shown {
        classes.push("more");
    }
    out.push_str("<tr");
    if let Some(id) = id {
        let _ = write!(out, " id=\"{id}\"");
    }
    if !classes.is_empty() {
        let _ = write!(out, " class=\"{}\"", classes.join(" "));
    }
    out.push('>');
}

/// The opening tag of a table whose rows [`row_start`] limits.
pub(super) fn limited_table(id: &str, classes: &str) -> String {
    limited_table_of(id, classes, SHOWN_ROWS)
}

/// [`limited_table`] showing `shown` rows.
pub(super) fn limited_table_of(id: &str, classes: &str, shown: usize) -> String {
    format!("<table id=\"{id}\" class=\"limited {classes}\" data-shown=\"{shown}\">")
}

/// The button under a limited table of `rows` rows, `zero` of them holding nothing at the
/// peak; nothing when every row shows anyway.
pub(super) fn show_all(out: &mut String, table: &str, rows: usize, zero: usize) {
    show_all_of(out, table, rows, SHOWN_ROWS, zero);
}

/// [`show_all`] for a table that shows `shown` rows.
pub(super) fn show_all_of(out: &mut String, table: &str, rows: usize, shown: usize, zero: usize) {
    let rows = rows.min(MAX_TABLE_ROWS);
    let zero = zero.min(rows);
    let hidden = (rows - zero).saturating_sub(shown) + zero;
    if hidden == 0 {
        return;
    }
    let why = if zero > 0 {
        format!(
            ", {} of them holding nothing at the peak",
            format_count(zero as u64)
        )
    } else {
        String::new()
    };
    let _ = write!(
        out,
        "<p class=\"more-rows\"><button type=\"button\" class=\"show-all\" data-table=\"{table}\">\
         Show all {rows} rows</button> <span class=\"note\">{} folded{why}</span></p>",
        format_count(hidden as u64),
        rows = format_count(rows as u64),
    );
}

/// `text` escaped, with a break opportunity after each `/` and `::` (span paths and function
/// paths wrap between their parts, never inside a name).
pub(super) fn breakable(text: &str) -> String {
    escape_html(text)
        .replace('/', "/<wbr>")
        .replace("::", "::<wbr>")
        .replace(" as ", " as <wbr>")
}

/// `text` with its first letter upper-case (`residual/call` as a column head).
pub(super) fn capitalised(text: &str) -> String {
    let mut chars = text.chars();
    chars.next().map_or_else(String::new, |first| {
        first.to_uppercase().chain(chars).collect()
    })
}

/// `part` as a percentage of `whole` (0 when `whole` is 0).
pub(super) fn share(part: u64, whole: u64) -> f64 {
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
            format_count((total - MAX_TABLE_ROWS) as u64)
        );
    }
}

fn span_path_cell(out: &mut String, path: &str) {
    let path = if path.is_empty() {
        words::OUTSIDE_SPANS
    } else {
        path
    };
    let _ = write!(out, "<td class=\"path\">{}</td>", breakable(path));
}

fn category_cell(out: &mut String, category: highwater_profile::model::Category) {
    let _ = write!(
        out,
        "<td class=\"cat\"><i class=\"dot c{}\"></i>{category}</td>",
        category.index()
    );
}

/// The column heads shared by the two live-at-peak tables, up to the bytes.
fn live_heads() -> String {
    format!(
        "<th data-type=\"text\">Span path</th>\
         <th data-type=\"text\" title=\"{}\">{}</th>\
         <th data-type=\"text\">Shape</th><th data-type=\"text\">Category</th>\
         <th data-type=\"text\">Device</th>\
         <th data-type=\"num\" class=\"num\" aria-sort=\"descending\">Bytes</th>",
        words::OP_OUTPUT_EXPLAINED,
        words::OP_OUTPUT_HEAD
    )
}

pub(super) fn peak_table(out: &mut String, profile: &Profile) {
    let peak = profile.summary.peak_bytes;
    let with_sites = !profile.sites.is_empty();
    let _ = write!(
        out,
        "<section id=\"peak\"><h2>Live at the peak</h2>\
         <p class=\"note\">What held memory when it peaked, grouped by span path, op, category \
         and device. {} Click a header to sort.</p>\
         <div class=\"scroll\">{}<thead><tr>{}\
         <th data-type=\"num\" class=\"num\">Share</th><th data-type=\"num\" class=\"num\">Count</th>{}\
         </tr></thead><tbody>",
        words::OP_OUTPUT_EXPLAINED,
        limited_table("peak-table", "sortable"),
        live_heads(),
        if with_sites {
            "<th data-type=\"text\" title=\"The call sites behind the row, largest first\">Sites</th>"
        } else {
            ""
        }
    );
    let mut rows: Vec<_> = profile.peak_breakdown.iter().collect();
    rows.sort_by_key(|row| std::cmp::Reverse(row.bytes));
    for (index, row) in rows.iter().take(MAX_TABLE_ROWS).enumerate() {
        row_start(out, index, false, None);
        span_path_cell(out, &row.span_path);
        text_cell(out, row.op.as_deref().unwrap_or("-"));
        let mut shape = format_shape(row.shape.as_deref());
        if let Some(dtype) = &row.dtype {
            shape = format!("{shape} {dtype}");
        }
        text_cell(out, &shape);
        category_cell(out, row.category);
        text_cell(out, &row.device);
        num_cell(out, row.bytes, &format_bytes(row.bytes));
        let pct = share(row.bytes, peak);
        num_cell(out, format!("{pct:.4}"), &format!("{pct:.1}%"));
        num_cell(out, row.count, &format_count(row.count));
        if with_sites {
            site_links(out, &row.top_sites);
        }
        out.push_str("</tr>");
    }
    out.push_str("</tbody></table></div>");
    show_all(out, "peak-table", rows.len(), 0);
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
    let _ = write!(
        out,
        "<h3>Largest single allocations live at the peak</h3>\
         <div class=\"scroll\">{}<thead><tr>{}\
         <th data-type=\"num\" class=\"num\">Allocated at</th><th data-type=\"num\" class=\"num\">Thread</th>\
         </tr></thead><tbody>",
        limited_table("largest-table", "sortable"),
        live_heads()
    );
    let mut rows: Vec<_> = profile.largest_at_peak.iter().collect();
    rows.sort_by_key(|row| std::cmp::Reverse(row.bytes));
    for (index, row) in rows.iter().take(MAX_TABLE_ROWS).enumerate() {
        row_start(out, index, false, None);
        span_path_cell(out, &row.span_path);
        text_cell(out, row.op.as_deref().unwrap_or("-"));
        text_cell(out, &format_shape(row.shape.as_deref()));
        category_cell(out, row.category);
        text_cell(out, &row.device);
        num_cell(out, row.bytes, &format_bytes(row.bytes));
        num_cell(out, row.timestamp_ns, &format_duration_ns(row.timestamp_ns));
        num_cell(out, row.thread, &row.thread.to_string());
        out.push_str("</tr>");
    }
    out.push_str("</tbody></table></div>");
    show_all(out, "largest-table", rows.len(), 0);
    more_rows_note(out, rows.len());
}

pub(super) fn span_section(out: &mut String, profile: &Profile) {
    let _ = write!(
        out,
        "<section id=\"spans\"><h2>Spans</h2>\
         <p class=\"note\">Every path of the span tree; time and bytes allocated are all calls \
         added up. {} {} Click a row marked ▾ to fold its children.</p>\
         <div class=\"scroll\">{}<thead><tr><th>Span</th><th>Step</th>\
         <th class=\"num\">Calls</th><th class=\"num\">Time</th><th class=\"num\">Allocated</th>\
         <th class=\"num\" title=\"{}\">Peak</th><th class=\"num\" title=\"{}\">{}</th></tr></thead><tbody>",
        words::SPAN_PEAK_EXPLAINED,
        words::RESIDUAL_EXPLAINED,
        limited_table("span-table", "tree"),
        words::SPAN_PEAK_EXPLAINED,
        words::RESIDUAL_EXPLAINED,
        capitalised(words::RESIDUAL_HEAD),
    );
    let tree = span_tree(&profile.spans);
    let peak = profile.summary.peak_bytes;
    for (k, row) in tree.iter().take(MAX_TABLE_ROWS).enumerate() {
        let span = &profile.spans[row.index];
        let has_children = tree.get(k + 1).is_some_and(|next| next.depth > row.depth);
        let depth = row.depth.min(40);
        let mut classes: Vec<&str> = Vec::new();
        if has_children {
            classes.push("parent");
        }
        if k >= SHOWN_ROWS {
            classes.push("more");
        }
        let _ = write!(
            out,
            "<tr data-depth=\"{depth}\"{}><td class=\"name\" style=\"padding-left:{:.1}em\">{}{}</td>",
            if classes.is_empty() {
                String::new()
            } else {
                format!(" class=\"{}\"", classes.join(" "))
            },
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
        num_cell(out, span.calls, &format_count(span.calls));
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
        let residual = span.residual_per_call();
        num_cell(out, residual, &format_bytes(residual));
        out.push_str("</tr>");
    }
    out.push_str("</tbody></table></div>");
    show_all(out, "span-table", tree.len(), 0);
    more_rows_note(out, tree.len());
    if profile.spans.is_empty() {
        out.push_str("<p class=\"note\">No spans were recorded.</p>");
    }
    out.push_str("</section>");
}

pub(super) fn iterations_section(out: &mut String, profile: &Profile) {
    out.push_str(
        "<section id=\"iterations\"><h2>Per iteration</h2>\
         <p class=\"note\">How live bytes changed from one iteration's end to the next \
         (orange: grew, green: shrank). Growth in every iteration is the signature of a leak; \
         the spans' residual/call says which span kept it.</p>\
         <div class=\"chart\" id=\"iteration-chart\"></div>",
    );
    if profile.iterations.is_empty() {
        out.push_str("<p class=\"note\">No iterations were recorded.</p></section>");
        return;
    }
    // The chart says it at a glance; the table is there for exact values, folded away.
    let _ = write!(
        out,
        "<details id=\"iteration-details\"><summary>Table of the {} iterations</summary>\
         <div class=\"scroll\">{}<thead><tr>\
         <th data-type=\"num\" class=\"num\">#</th><th data-type=\"text\">Span</th>\
         <th data-type=\"num\" class=\"num\">Ended at</th>\
         <th data-type=\"num\" class=\"num\">Live bytes</th>\
         <th data-type=\"num\" class=\"num\">Change</th></tr></thead><tbody>",
        format_count(profile.iterations.len() as u64),
        limited_table("iteration-table", "sortable"),
    );
    for (index, it) in profile.iterations.iter().take(MAX_TABLE_ROWS).enumerate() {
        row_start(out, index, false, None);
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
    out.push_str("</tbody></table></div>");
    show_all(out, "iteration-table", profile.iterations.len(), 0);
    more_rows_note(out, profile.iterations.len());
    out.push_str("</details></section>");
}

pub(super) fn devices_section(out: &mut String, profile: &Profile) {
    out.push_str(
        "<section id=\"devices\"><h2>Devices and pools</h2>\
         <div class=\"scroll\"><table id=\"device-table\" class=\"sortable\"><thead><tr>\
         <th data-type=\"text\">Device</th><th data-type=\"num\" class=\"num\">Peak</th>\
         <th data-type=\"num\" class=\"num\">At</th><th data-type=\"num\" class=\"num\">Capacity</th>\
         <th data-type=\"num\" class=\"num\">Live at end</th>\
         <th data-type=\"num\" class=\"num\">Pool reserved (max)</th>\
         <th data-type=\"num\" class=\"num\">Fragmentation (max)</th>\
         <th data-type=\"num\" class=\"num\">Driver pools (max)</th>\
         <th data-type=\"num\" class=\"num\">Context</th>\
         <th data-type=\"num\" class=\"num\">Allocations</th></tr></thead><tbody>",
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
        num_cell(
            out,
            d.reserved_peak_bytes.unwrap_or(0),
            &optional(d.reserved_peak_bytes),
        );
        num_cell(
            out,
            d.context_bytes.unwrap_or(0),
            &optional(d.context_bytes),
        );
        num_cell(out, d.alloc_count, &format_count(d.alloc_count));
        out.push_str("</tr>");
    }
    out.push_str("</tbody></table></div>");
    more_rows_note(out, profile.devices.len());
    out.push_str("<div id=\"pool-charts\"></div></section>");
}

/// The refused allocations, each with what was live on its device then, when the run had any.
pub(super) fn oom_section(out: &mut String, profile: &Profile) {
    if profile.oom_events.is_empty() {
        return;
    }
    let _ = write!(
        out,
        "<section id=\"oom\"><h2>Out of memory</h2>\
         <p class=\"note\">{} allocation(s) were refused; the first {} are listed, each with \
         what was live on its device at that moment. They are marked on the charts below.</p>\
         <div class=\"scroll\"><table id=\"oom-table\"><thead><tr>\
         <th class=\"num\">When</th><th>Refused by</th><th>Device</th>\
         <th class=\"num\">Requested</th><th>Span path</th><th>Op</th>\
         <th class=\"num\">Live on device</th><th class=\"num\">Live on all devices</th>\
         <th class=\"num\">Pool reserved</th><th class=\"num\">Largest free block</th>\
         </tr></thead><tbody>",
        format_count(profile.summary.oom_count),
        profile.oom_events.len()
    );
    let optional = |bytes: Option<u64>| bytes.map_or("-".to_string(), format_bytes);
    for oom in &profile.oom_events {
        out.push_str("<tr>");
        num_cell(out, oom.timestamp_ns, &format_duration_ns(oom.timestamp_ns));
        text_cell(
            out,
            match oom.source {
                highwater_profile::model::OomSource::Heap => "heap allocator",
                highwater_profile::model::OomSource::Pool => "device pool",
                highwater_profile::model::OomSource::Driver => "device driver",
            },
        );
        text_cell(out, &oom.device);
        num_cell(out, oom.requested_bytes, &format_bytes(oom.requested_bytes));
        span_path_cell(out, &oom.span_path);
        text_cell(out, oom.op.as_deref().unwrap_or("-"));
        num_cell(out, oom.live_bytes, &format_bytes(oom.live_bytes));
        num_cell(
            out,
            oom.total_live_bytes,
            &format_bytes(oom.total_live_bytes),
        );
        let reserved = oom.pool_reserved_bytes.unwrap_or(0);
        num_cell(out, reserved, &optional(oom.pool_reserved_bytes));
        let largest = oom.largest_free_bytes.unwrap_or(0);
        num_cell(out, largest, &optional(oom.largest_free_bytes));
        out.push_str("</tr>");
    }
    out.push_str("</tbody></table></div>");
    for (index, oom) in profile.oom_events.iter().enumerate() {
        let _ = write!(
            out,
            "<details{}><summary>Live on {} at {} ({})</summary>\
             <div class=\"scroll\"><table class=\"oom-live sortable\"><thead><tr>{}\
             <th data-type=\"num\" class=\"num\">Share</th>\
             <th data-type=\"num\" class=\"num\">Count</th></tr></thead><tbody>",
            if index == 0 { " open" } else { "" },
            escape_html(&oom.device),
            format_duration_ns(oom.timestamp_ns),
            format_bytes(oom.live_bytes),
            live_heads()
        );
        for row in &oom.live {
            out.push_str("<tr>");
            span_path_cell(out, &row.span_path);
            text_cell(out, row.op.as_deref().unwrap_or("-"));
            text_cell(out, &format_shape(row.shape.as_deref()));
            category_cell(out, row.category);
            text_cell(out, &row.device);
            num_cell(out, row.bytes, &format_bytes(row.bytes));
            let pct = share(row.bytes, oom.live_bytes);
            num_cell(out, format!("{pct:.4}"), &format!("{pct:.1}%"));
            num_cell(out, row.count, &format_count(row.count));
            out.push_str("</tr>");
        }
        out.push_str("</tbody></table></div></details>");
    }
    out.push_str("</section>");
}

/// The anchor of site `id` in the report (`#site-3`), which the live-at-peak rows link to.
pub(super) fn site_anchor(id: u32) -> String {
    format!("site-{id}")
}

/// Links to a row's sites, `-` when it has none.
pub(super) fn site_links(out: &mut String, sites: &[u32]) {
    out.push_str("<td class=\"sites\">");
    if sites.is_empty() {
        out.push('-');
    }
    for (k, id) in sites.iter().enumerate() {
        if k > 0 {
            out.push(' ');
        }
        let _ = write!(out, "<a href=\"#{}\">#{id}</a>", site_anchor(*id));
    }
    out.push_str("</td>");
}
