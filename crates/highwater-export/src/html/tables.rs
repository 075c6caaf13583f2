//! The report's tables, written as escaped HTML so they read without a script: live at the
//! peak, the largest live allocations, the span tree, the iterations and the devices.
//!
//! Each table has at most [`MAX_TABLE_ROWS`] rows; a note under it counts the rest. Numeric
//! cells carry their raw value in `data-v`, which the script sorts by.

use std::fmt::Write as _;

use super::{escape_html, words, MAX_TABLE_ROWS};
use highwater_profile::span_tree;
use highwater_profile::units::{
    format_bytes, format_bytes_delta, format_count, format_duration_ns, format_shape,
};
use highwater_profile::Profile;

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
    let _ = write!(out, "<td class=\"path\">{}</td>", escape_html(path));
}

fn category_cell(out: &mut String, category: highwater_profile::model::Category) {
    let _ = write!(
        out,
        "<td><i class=\"dot c{}\"></i>{category}</td>",
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
         <div class=\"scroll\"><table id=\"peak-table\" class=\"sortable\"><thead><tr>{}\
         <th data-type=\"num\" class=\"num\">Share</th><th data-type=\"num\" class=\"num\">Count</th>{}\
         </tr></thead><tbody>",
        words::OP_OUTPUT_EXPLAINED,
        live_heads(),
        if with_sites {
            "<th data-type=\"text\" title=\"The call sites behind the row, largest first\">Sites</th>"
        } else {
            ""
        }
    );
    let mut rows: Vec<_> = profile.peak_breakdown.iter().collect();
    rows.sort_by_key(|row| std::cmp::Reverse(row.bytes));
    for row in rows.iter().take(MAX_TABLE_ROWS) {
        out.push_str("<tr>");
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
            super::flame::site_links(out, &row.top_sites);
        }
        out.push_str("</tr>");
    }
    out.push_str("</tbody></table></div>");
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
         <div class=\"scroll\"><table id=\"largest-table\" class=\"sortable\"><thead><tr>{}\
         <th data-type=\"num\" class=\"num\">Allocated at</th><th data-type=\"num\" class=\"num\">Thread</th>\
         </tr></thead><tbody>",
        live_heads()
    );
    let mut rows: Vec<_> = profile.largest_at_peak.iter().collect();
    rows.sort_by_key(|row| std::cmp::Reverse(row.bytes));
    for row in rows.iter().take(MAX_TABLE_ROWS) {
        out.push_str("<tr>");
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
    more_rows_note(out, rows.len());
}

pub(super) fn span_section(out: &mut String, profile: &Profile) {
    let _ = write!(
        out,
        "<section id=\"spans\"><h2>Spans</h2>\
         <p class=\"note\">Every path of the span tree, all calls added up. {} {} Click a row \
         marked ▾ to fold its children.</p>\
         <div class=\"scroll\"><table id=\"span-table\" class=\"tree\"><thead><tr><th>Span</th><th>Step</th>\
         <th class=\"num\">Calls</th><th class=\"num\">Time</th><th class=\"num\">Allocated</th>\
         <th class=\"num\" title=\"{}\">Peak</th><th class=\"num\" title=\"{}\">Residual</th></tr></thead><tbody>",
        words::SPAN_PEAK_EXPLAINED,
        words::RESIDUAL_EXPLAINED,
        words::SPAN_PEAK_EXPLAINED,
        words::RESIDUAL_EXPLAINED,
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
        num_cell(out, span.residual_bytes, &format_bytes(span.residual_bytes));
        out.push_str("</tr>");
    }
    out.push_str("</tbody></table></div>");
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
         (orange: grew, green: shrank). Growth in every iteration is the signature of a leak.</p>\
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
         <div class=\"scroll\"><table id=\"iteration-table\" class=\"sortable\"><thead><tr>\
         <th data-type=\"num\" class=\"num\">#</th><th data-type=\"text\">Span</th>\
         <th data-type=\"num\" class=\"num\">Ended at</th>\
         <th data-type=\"num\" class=\"num\">Live bytes</th>\
         <th data-type=\"num\" class=\"num\">Change</th></tr></thead><tbody>",
        format_count(profile.iterations.len() as u64)
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
    out.push_str("</tbody></table></div>");
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
