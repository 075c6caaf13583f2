//! A self-contained HTML report: one file, inline CSS, script and SVG, that opens from disk
//! with no network access.
//!
//! # How the page is built
//!
//! Everything a reader must see without a script — the summary, the warnings, the live-at-peak
//! table, the span tree, the iterations and the devices — is written as escaped HTML
//! ([`tables`](self) and the page skeleton). The curves are drawn in the browser by the inline
//! script (`report.js`) from a JSON data island (`<script type="application/json">`, built by
//! the chart-data module), because SVG paths for thousands of points are smaller as data than
//! as markup. The script draws every curve as steps (a value holds until the next point),
//! lets the reader drag across a chart to zoom into a time range (and reset), opens with a
//! second chart of the iteration that holds the peak with its spans as bands, sorts tables when
//! a header is clicked, folds the span tree and shows values under the pointer.
//!
//! Every string in a profile is user data (span names, ops, devices, warnings): HTML text is
//! escaped with [`escape_html`], and the JSON island escapes `<`, `>` and `&` so no `</script>`
//! can end it early. The script only ever puts profile strings into the page as text.
//!
//! # Size and cost
//!
//! The page is as bounded as the profile: at most [`MAX_CHART_POINTS`] points per curve (the
//! highest and lowest point of each bucket and the peak are kept), [`MAX_DEVICE_CHARTS`]
//! device and pool charts, and [`MAX_TABLE_ROWS`] rows per table, of which one screen shows
//! until "Show all". The chart of the step that peaked draws the profile's fine
//! [`peak_window`](highwater_profile::Profile::peak_window) there. Making it is linear in the profile: points are
//! grouped by device in one pass, whatever the number of devices.

#[cfg(not(highwater_loom))]
pub mod ranks;

use std::path::Path;

use super::{write_output, ExportError, Output};
use crate::vocabulary as words;
use highwater_profile::Profile;

mod chart_data;
mod flame;
mod page;
mod tables;

/// Most points drawn per curve; longer curves keep each bucket's highest point.
pub const MAX_CHART_POINTS: usize = 4_000;
/// Most rows written per table; the rest are counted in a note under the table.
pub const MAX_TABLE_ROWS: usize = 2_000;
/// Most devices (and pools) drawn as charts, the device that peaked first; the devices table
/// lists them all (up to [`MAX_TABLE_ROWS`]).
pub const MAX_DEVICE_CHARTS: usize = 16;
/// Most span instances drawn as bands over the chart of the step that peaked.
pub const MAX_PEAK_STEP_SPANS: usize = 400;
pub use flame::{MAX_FLAME_NODES, MIN_NODE_SHARE};

/// Escapes `text` for HTML text and attribute values.
///
/// # Examples
///
/// ```
/// use highwater_export::html::escape_html;
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

/// Renders `profile` as one self-contained HTML page.
///
/// # Examples
///
/// ```
/// let page = highwater_export::html::render(&highwater_profile::Profile::empty());
/// assert!(page.starts_with("<!DOCTYPE html>"));
/// ```
pub fn render(profile: &Profile) -> String {
    render_with(profile, "")
}

/// [`render`] with `extra` (trusted markup, such as the `highwater fit` command's section) added after the last
/// section.
pub fn render_with(profile: &Profile, extra: &str) -> String {
    page::render(profile, extra)
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
    use highwater_profile::model::Category;
    use highwater_profile::units::format_bytes;
    use highwater_profile::{CaptureMode, PeakRow, PoolPoint, TimelinePoint, Warning};
    use highwater_testkit::sample::{sample_profile, sample_profile_with_drops};

    const HOSTILE: &str = "<script>alert(1)</script>";

    #[test]
    fn user_strings_cannot_inject_markup_or_end_the_data_island() {
        let mut profile = sample_profile();
        profile.meta.program = HOSTILE.into();
        profile.spans[1].name = HOSTILE.into();
        profile.peak_breakdown[0].span_path = format!("a/{HOSTILE}");
        profile.peak_breakdown[0].op = Some("</script><img src=x onerror=alert(1)>".into());
        profile.timeline[0].device = HOSTILE.into();
        let event_span = profile.span_events[0].span as usize;
        profile.spans[event_span].name = HOSTILE.into();
        profile.warnings.push(Warning::Note {
            text: HOSTILE.into(),
        });
        // Call sites: a frame's function and file in the icicle's data and the sites' table.
        profile.sites[0].frames[2].function = Some(HOSTILE.into());
        profile.sites[0].frames[2].file = Some(HOSTILE.into());
        let page = render(&profile);
        assert!(!page.contains(HOSTILE), "raw hostile string in page");
        assert!(!page.contains("<img"));
        assert_eq!(page.matches("<script").count(), 2, "only our two scripts");
        assert_eq!(page.matches("</script>").count(), 2);
        assert!(page.contains("&lt;script&gt;alert(1)&lt;/script&gt;"));
    }

    #[test]
    fn a_refusal_gets_its_table_its_live_rows_and_a_chart_mark() {
        let mut profile = sample_profile();
        assert!(!render(&profile).contains("id=\"oom\""));
        let device = profile.summary.peak_device.clone();
        profile.summary.oom_count = 1;
        profile.oom_events.push({
            let mut oom_event = highwater_profile::OomEvent::default();
            oom_event.timestamp_ns = 1_500_000_000;
            oom_event.source = highwater_profile::model::OomSource::Heap;
            oom_event.device = device.clone();
            oom_event.requested_bytes = 3 << 30;
            oom_event.span_path = "step/<forward>".into();
            oom_event.live_bytes = 4 << 20;
            oom_event.total_live_bytes = 5 << 20;
            oom_event.live = vec![{
                let mut peak_row = PeakRow::default();
                peak_row.span_path = "init".into();
                peak_row.category = Category::Parameter;
                peak_row.device = device.clone();
                peak_row.bytes = 3 << 20;
                peak_row.count = 1;
                peak_row
            }];
            oom_event
        });
        let page = render(&profile);
        let section = &page[page.find("<section id=\"oom\">").unwrap()..];
        let section = &section[..section.find("</section>").unwrap()];
        assert!(section.contains("<td>heap allocator</td>"), "{section}");
        assert!(section.contains(">3.0 GiB</td>"), "{section}");
        assert!(
            section.contains("step/<wbr>&lt;forward&gt;"),
            "escaped: {section}"
        );
        assert!(section.contains("<summary>Live on"), "{section}");
        assert!(
            section.contains(">init</td>") && section.contains(">75.0%</td>"),
            "{section}"
        );
        assert!(
            page.contains(&format!(
                "\"ooms\":[{{\"device\":\"{device}\",\"t\":1500000000,\"label\":\"OOM: 3.0 GiB refused\"}}]"
            )),
            "the chart data marks it"
        );
    }

    #[test]
    fn a_driver_s_reserved_bytes_are_drawn_over_its_device_and_tabled() {
        let profile = highwater_testkit::sample::sample_profile_with_driver();
        let page = render(&profile);
        // The data island carries cuda:0's reserved line, ending at its last reading.
        let data = chart_data::chart_data(&profile);
        let cuda0 = data.devices.iter().find(|d| d.device == "cuda:0").unwrap();
        let line = cuda0.reserved.as_ref().expect("a reserved line");
        assert_eq!(line.bytes.last(), Some(&(1 << 30)));
        assert!(line.t.len() <= MAX_CHART_POINTS + 1);
        assert!(data
            .devices
            .iter()
            .filter(|d| d.device != "cuda:0")
            .all(|d| d.reserved.is_none()));
        assert!(page.contains("Driver pools (max)") && page.contains("450.0 MiB"));
        let plain = chart_data::chart_data(&sample_profile());
        assert!(plain.devices.iter().all(|d| d.reserved.is_none()));
    }

    #[test]
    fn page_is_self_contained() {
        // The SVG namespace is a name, not a fetch.
        let page = render(&sample_profile()).replace("\"http://www.w3.org/2000/svg\"", "");
        for needle in ["http://", "https://", "src=\"", "@import", "url("] {
            assert!(!page.contains(needle), "page refers out: {needle}");
        }
        // Links stay inside the page (the live-at-peak rows point at their call sites).
        assert!(page.contains("href=\"#site-"));
        assert_eq!(
            page.matches("href=\"").count(),
            page.matches("href=\"#").count()
        );
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
        let notice = escape_html(
            &Warning::DroppedEvents {
                events: 1_234,
                mode: CaptureMode::DropWhenFull,
            }
            .to_string(),
        );
        assert_eq!(page.matches(&notice).count(), 1);
        assert_eq!(page.matches("data-code=\"growing_residual\"").count(), 1);
        assert_eq!(page.matches("data-code=\"dropped_events\"").count(), 0);
    }

    #[test]
    fn long_curves_keep_the_page_small() {
        let mut profile = sample_profile();
        profile.timeline = (0..50_000u64)
            .map(|i| {
                let mut timeline_point = TimelinePoint::default();
                timeline_point.timestamp_ns = i;
                timeline_point.device = "cpu".into();
                timeline_point.live_bytes = i % 1000;
                timeline_point.by_category = [(Category::Other, i % 1000)].into_iter().collect();
                timeline_point
            })
            .collect();
        let small = render(&sample_profile()).len();
        let big = render(&profile).len();
        assert!(big < small + 400_000, "{small} -> {big}");
    }

    #[test]
    fn a_hundred_thousand_devices_are_grouped_in_one_pass_and_charted_within_bounds() {
        // Quadratic grouping took over two minutes here (issue 11 item 7).
        let devices = 100_000u64;
        let mut profile = sample_profile();
        profile.timeline = (0..devices)
            .map(|i| {
                let mut timeline_point = TimelinePoint::default();
                timeline_point.timestamp_ns = i;
                timeline_point.device = format!("dev:{i}");
                timeline_point.live_bytes = i;
                timeline_point.by_category = [(Category::Other, i)].into_iter().collect();
                timeline_point
            })
            .collect();
        profile.pool_timeline = (0..devices)
            .map(|i| {
                let mut pool_point = PoolPoint::default();
                pool_point.timestamp_ns = i;
                pool_point.device = format!("pool:{i}");
                pool_point.capacity_bytes = 1 << 30;
                pool_point.reserved_bytes = i;
                pool_point.largest_free_bytes = 0;
                pool_point.fragmentation = 0.0;
                pool_point
            })
            .collect();
        profile.summary.peak_device = "dev:99999".into();
        let page = render(&profile);
        let data = page.split("id=\"hw-data\">").nth(1).unwrap();
        assert!(
            data.contains("{\"device\":\"dev:99999\""),
            "the peak device is charted"
        );
        let data = chart_data::chart_data(&profile);
        assert_eq!(data.devices.len(), MAX_DEVICE_CHARTS);
        assert_eq!(
            data.devices_not_charted,
            devices as usize - MAX_DEVICE_CHARTS
        );
        assert!(page.len() < 4 << 20, "{} bytes", page.len());
    }

    #[test]
    fn the_category_legend_splits_state_and_temporary() {
        let profile = sample_profile();
        let page = render(&profile);
        let activation = profile.summary.peak_by_category[&Category::Activation];
        let temporary = profile.summary.peak_temporary_by_category[&Category::Activation];
        let split = format!(
            ": {} state, {} temporary</span>",
            format_bytes(activation - temporary),
            format_bytes(temporary)
        );
        assert!(page.contains(&split), "no {split:?} in the legend");
        let hatched = format!("class=\"c{} tmp\"", Category::Activation.index());
        assert_eq!(page.matches(&hatched).count(), 1, "one hatched bar part");
        // Nothing temporary: no split, no key.
        let mut plain = profile.clone();
        plain.summary.peak_temporary_by_category.clear();
        let page = render(&plain);
        assert!(!page.contains("class=\"split") && !page.contains(" tmp\""));
    }

    #[test]
    fn the_op_column_says_it_names_the_output() {
        let page = render(&sample_profile());
        assert!(page.contains(words::OP_OUTPUT_HEAD));
        assert!(page.contains(&escape_html(words::RESIDUAL_EXPLAINED)));
    }

    #[test]
    fn unix_milliseconds_read_as_a_utc_date() {
        use page::format_unix_ms;
        assert_eq!(format_unix_ms(0), "1970-01-01 00:00:00 UTC");
        assert_eq!(format_unix_ms(1_764_489_600_000), "2025-11-30 08:00:00 UTC");
        assert_eq!(format_unix_ms(951_782_400_000), "2000-02-29 00:00:00 UTC");
        assert!(format_unix_ms(u64::MAX).ends_with("UTC"));
    }
}
