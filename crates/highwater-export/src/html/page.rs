//! The page around the tables and charts: head, header, warnings, the summary cards, the
//! chart sections the script fills, and the data island and script at the end.

use std::fmt::Write as _;

use super::chart_data::chart_data;
use super::tables::{self, share};
use super::{escape_html, words, MAX_TABLE_ROWS};
use highwater_profile::model::Category;
use highwater_profile::units::{format_bytes, format_count, format_duration_ns};
use highwater_profile::Profile;
use highwater_profile::Warning;

const STYLE: &str = include_str!("report.css");
const SCRIPT: &str = include_str!("report.js");
/// Draws the icicle of call sites; runs after [`SCRIPT`], in the same element.
const FLAME_SCRIPT: &str = include_str!("flame.js");

/// Serialises `value` as JSON safe inside a `<script>` element: `<`, `>` and `&` and the two
/// line separators JavaScript treats as newlines are written as `\u` escapes.
pub(super) fn json_for_script<T: serde::Serialize>(value: &T) -> String {
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

/// `ms` since the Unix epoch as `YYYY-MM-DD HH:MM:SS UTC` (proleptic Gregorian calendar).
pub(super) fn format_unix_ms(ms: u64) -> String {
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

/// One summary card; `label`, `value` and `sub` are already escaped.
fn card(out: &mut String, id: &str, label: &str, value: &str, sub: &str, title: &str) {
    let _ = write!(
        out,
        "<div class=\"card\" id=\"card-{id}\" title=\"{title}\"><div class=\"label\">{label}</div>\
         <div class=\"value\">{value}</div>"
    );
    if !sub.is_empty() {
        let _ = write!(out, "<div class=\"sub\">{sub}</div>");
    }
    out.push_str("</div>");
}

fn summary_section(out: &mut String, profile: &Profile) {
    let s = &profile.summary;
    out.push_str("<section id=\"summary\"><h2>Summary</h2><div class=\"cards\">");
    let _ = write!(
        out,
        "<div class=\"card peak\" id=\"card-peak\"><div class=\"label\">Peak</div>\
         <div class=\"value\" id=\"peak-value\">{}</div>\
         <div class=\"sub\">on <b>{}</b> at {} of {}</div></div>",
        format_bytes(s.peak_bytes),
        escape_html(&s.peak_device),
        format_duration_ns(s.peak_timestamp_ns),
        format_duration_ns(s.duration_ns)
    );
    card(
        out,
        "final",
        "Live at end",
        &format_bytes(s.final_live_bytes),
        "",
        "",
    );
    card(
        out,
        "allocated",
        "Allocated in total",
        &format_bytes(s.total_alloc_bytes),
        "",
        "",
    );
    card(
        out,
        "backward",
        words::KEPT_FOR_BACKWARD,
        &format_bytes(s.autograd_retained_bytes),
        "",
        words::KEPT_FOR_BACKWARD_EXPLAINED,
    );
    card(
        out,
        "allocs",
        "Allocations",
        &format_count(s.alloc_count),
        &format!("{} frees", format_count(s.free_count)),
        "",
    );
    card(
        out,
        "dropped",
        "Events dropped",
        &format_count(s.dropped_events),
        &format!("of {} recorded", format_count(s.event_count)),
        "",
    );
    out.push_str("</div>");
    // Peak by category: one stacked bar and a legend with values; each category's temporary
    // part is its hatched end.
    let mut categories: Vec<(usize, u64, u64)> = s
        .peak_by_category
        .iter()
        .map(|(category, &bytes)| {
            let temporary = s.peak_temporary_by_category.get(category).copied();
            (category.index(), bytes, temporary.unwrap_or(0).min(bytes))
        })
        .collect();
    categories.sort_by_key(|c| c.0);
    out.push_str("<h3>At the peak, by category</h3><div class=\"catbar\">");
    for &(slot, bytes, temporary) in &categories {
        let _ = write!(
            out,
            "<span class=\"c{slot}\" style=\"width:{:.3}%\"></span>",
            share(bytes - temporary, s.peak_bytes)
        );
        if temporary > 0 {
            let _ = write!(
                out,
                "<span class=\"c{slot} tmp\" style=\"width:{:.3}%\"></span>",
                share(temporary, s.peak_bytes)
            );
        }
    }
    out.push_str("</div><ul class=\"legend\">");
    for &(slot, bytes, temporary) in &categories {
        let _ = write!(
            out,
            "<li><i class=\"c{slot}\"></i>{} <b>{}</b> ({:.1}%)",
            Category::from_index(slot as u8),
            format_bytes(bytes),
            share(bytes, s.peak_bytes)
        );
        if temporary > 0 {
            let _ = write!(
                out,
                "<span class=\"split\" title=\"{}\">: {} {}, {} {}</span>",
                words::STATE_VS_TEMPORARY_EXPLAINED,
                format_bytes(bytes - temporary),
                words::STATE.to_lowercase(),
                format_bytes(temporary),
                words::TEMPORARY.to_lowercase()
            );
        }
        out.push_str("</li>");
    }
    if categories.iter().any(|c| c.2 > 0) {
        let _ = write!(
            out,
            "<li class=\"split-key\" title=\"{}\"><i class=\"tmp\"></i>{}: freed before its span \
             exited</li>",
            words::STATE_VS_TEMPORARY_EXPLAINED,
            words::TEMPORARY
        );
    }
    out.push_str("</ul></section>");
}

/// Renders `profile` as one self-contained HTML page, with `extra` (trusted markup) after the
/// last section.
pub(super) fn render(profile: &Profile, extra: &str) -> String {
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
         <title>highwater: {}</title><style>{STYLE}</style>\
         <noscript><style>table.limited tr.more {{ display:table-row; }} .more-rows {{ display:none; }}</style></noscript>\
         </head><body>\
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
    tables::oom_section(&mut out, profile);
    out.push_str(
        "<section id=\"peak-step\"><h2>Inside the step that peaked</h2>\
         <p class=\"note\">The iteration that holds the peak, zoomed: live bytes on the peak's \
         device stacked by category, the spans open at each moment as bands above (outermost \
         first), and the peak marked. Drag across the chart to zoom further.</p>\
         <div id=\"peak-step-chart\"></div></section>\
         <section id=\"timeline\"><h2>Memory over time</h2>\
         <p class=\"note\">Live bytes per device, stacked by category. The red line marks the \
         peak. Drag across a chart to zoom into that time range (every device chart follows); \
         hover for values.</p>\
         <div class=\"toolbar\"><button type=\"button\" id=\"zoom-reset\" disabled>Reset zoom</button>\
         <span id=\"zoom-range\" class=\"note\"></span></div><div id=\"timelines\"></div>\
         <noscript><p class=\"alert\">The charts need JavaScript; the tables below do not.</p></noscript>\
         </section>",
    );
    tables::peak_table(&mut out, profile);
    super::flame::section(&mut out, profile);
    tables::span_section(&mut out, profile);
    tables::iterations_section(&mut out, profile);
    tables::devices_section(&mut out, profile);
    out.push_str(extra);
    let _ = writeln!(
        out,
        "</main><footer>Written by highwater from the profile alone: this file loads nothing \
         from the network.</footer><div id=\"tip\" hidden></div>\
         <script type=\"application/json\" id=\"hw-data\">{}</script>\
         <script>{SCRIPT}\n{FLAME_SCRIPT}</script></body></html>",
        json_for_script(&chart_data(profile))
    );
    out
}
