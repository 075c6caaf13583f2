//! The HTML report as a person sees it: headless Chromium opens the file from disk, runs its
//! script, and the test reads what rendered (the DOM after scripts) and takes a screenshot.
//!
//! Needs `chromium` (or `chromium-browser`, `google-chrome`; or a path in `HIGHWATER_CHROMIUM`).
//! Without one the tests fail and say how to install it, unless `HIGHWATER_SKIP_BROWSER_TESTS=1`.

use std::path::{Path, PathBuf};

use highwater_testkit::browser::{browser, run_browser};

use highwater::profile::units::format_bytes;
use highwater::Profile;
use highwater_export::html;
use highwater_testkit::sample::{sample_profile, sample_profile_with_drops};

/// Writes the report of `profile`, plus `script` run after the report's own, and returns the
/// DOM after scripts ran.
fn rendered_dom(browser: &str, dir: &Path, profile: &Profile, script: &str) -> String {
    let mut page = html::render(profile);
    if !script.is_empty() {
        page = page.replace("</body>", &format!("<script>{script}</script></body>"));
    }
    let path = dir.join("report.html");
    std::fs::write(&path, page).unwrap();
    run_browser(
        browser,
        &dir.join("chromium-profile"),
        &path,
        &["--dump-dom"],
    )
}

/// The text between `start` (first occurrence) and the next `end`.
fn between<'a>(text: &'a str, start: &str, end: &str) -> &'a str {
    let from = text
        .find(start)
        .unwrap_or_else(|| panic!("{start} not in the DOM"))
        + start.len();
    let to = text[from..].find(end).map_or(text.len(), |i| from + i);
    &text[from..to]
}

/// Values of `attr="…"` in `text`, in order.
fn attribute_values<'a>(text: &'a str, attr: &str) -> Vec<&'a str> {
    let needle = format!("{attr}=\"");
    text.match_indices(&needle)
        .map(|(i, _)| {
            let rest = &text[i + needle.len()..];
            &rest[..rest.find('"').unwrap_or(rest.len())]
        })
        .collect()
}

#[test]
fn report_draws_the_curves_the_table_and_the_peak() {
    let Some(browser) = browser() else { return };
    let dir = tempfile::tempdir().unwrap();
    let profile = sample_profile();
    let dom = rendered_dom(&browser, dir.path(), &profile, "");

    assert!(
        dom.contains("data-rendered=\"yes\""),
        "the report script did not run to its end"
    );

    // One chart per device, each with drawn points.
    let timelines = between(&dom, "id=\"timelines\"", "</section>");
    let charts = timelines.matches("class=\"chart device-chart\"").count();
    assert_eq!(charts, profile.devices.len());
    let svg_points: Vec<u64> = attribute_values(timelines, "data-points")
        .iter()
        .map(|v| v.parse().unwrap())
        .collect();
    assert!(
        !svg_points.is_empty() && svg_points.iter().all(|&n| n > 0),
        "{svg_points:?}"
    );
    let drawn_paths = attribute_values(timelines, " d")
        .iter()
        .filter(|d| d.starts_with('M') && d.matches('L').count() > 100)
        .count();
    // cuda:0 and cuda:1 draw five category areas each, cpu two.
    assert!(
        drawn_paths >= 12,
        "only {drawn_paths} filled category paths"
    );
    let peak = format_bytes(profile.summary.peak_bytes);
    assert!(
        timelines.contains(&format!("peak {peak} at")),
        "peak marker label not drawn"
    );

    // The live-at-peak table has every row, and the peak value is shown.
    let table = between(&dom, "id=\"peak-table\"", "</table>");
    let rows = between(table, "<tbody>", "</tbody>").matches("<tr").count();
    assert_eq!(rows, profile.peak_breakdown.len());
    assert!(
        dom.contains(&format!("id=\"peak-value\">{peak}<")),
        "peak value not shown"
    );

    // Pools and iterations are drawn too.
    let pools = between(&dom, "id=\"pool-charts\"", "</section>");
    assert_eq!(pools.matches("class=\"chart pool-chart\"").count(), 2);
    let iterations = between(&dom, "id=\"iteration-chart\"", "</div>");
    assert_eq!(
        iterations.matches("<rect").count(),
        profile.iterations.len()
    );
    assert!(!dom.contains("dropped-warning"));
}

#[test]
fn report_shows_a_visible_warning_when_events_were_dropped() {
    let Some(browser) = browser() else { return };
    let dir = tempfile::tempdir().unwrap();
    let dom = rendered_dom(&browser, dir.path(), &sample_profile_with_drops(), "");
    let warning = between(&dom, "id=\"dropped-warning\"", "</div>");
    assert!(warning.contains("1234 events were dropped"), "{warning}");
}

#[test]
fn clicking_a_header_sorts_and_clicking_a_span_folds_its_children() {
    let Some(browser) = browser() else { return };
    let dir = tempfile::tempdir().unwrap();
    let profile = sample_profile();
    // Click "Count" (sorts descending), read the column; fold the `step` row.
    let script = r#"
        var table = document.getElementById("peak-table");
        var heads = table.tHead.rows[0].cells, col = -1;
        for (var i = 0; i < heads.length; i++) if (heads[i].textContent.trim() === "Count") col = i;
        heads[col].click();
        var counts = Array.prototype.map.call(table.tBodies[0].rows,
            function (r) { return r.cells[col].getAttribute("data-v"); });
        document.body.setAttribute("data-count-order", counts.join(","));
        var rows = document.getElementById("span-table").tBodies[0].rows, step = null;
        for (var k = 0; k < rows.length; k++) if (rows[k].cells[0].textContent.trim().endsWith("step")) step = rows[k];
        step.cells[0].click();
        var hidden = 0;
        for (k = 0; k < rows.length; k++) if (rows[k].hidden) hidden++;
        document.body.setAttribute("data-hidden-rows", String(hidden));
    "#;
    let dom = rendered_dom(&browser, dir.path(), &profile, script);
    let order: Vec<u64> = between(&dom, "data-count-order=\"", "\"")
        .split(',')
        .map(|v| v.parse().unwrap())
        .collect();
    assert_eq!(order.len(), profile.peak_breakdown.len());
    assert!(
        order.windows(2).all(|w| w[0] >= w[1]),
        "not sorted: {order:?}"
    );
    let mut expected: Vec<u64> = profile.peak_breakdown.iter().map(|r| r.count).collect();
    expected.sort_unstable_by(|a, b| b.cmp(a));
    assert_eq!(order, expected);
    let under_step = profile
        .spans
        .iter()
        .filter(|s| profile.span_path(s.id).starts_with("step/"))
        .count();
    assert_eq!(
        between(&dom, "data-hidden-rows=\"", "\""),
        under_step.to_string()
    );
}

#[test]
fn span_names_cannot_inject_script_into_the_rendered_page() {
    let Some(browser) = browser() else { return };
    let dir = tempfile::tempdir().unwrap();
    let hostile = "<script>alert(1)</script>";
    let mut profile = sample_profile();
    profile.meta.program = hostile.into();
    for span in &mut profile.spans {
        span.name = format!("{}{hostile}", span.name);
    }
    profile.peak_breakdown[0].span_path = format!("step/{hostile}");
    profile.peak_breakdown[1].op = Some("<img src=x onerror=alert(2)>".into());
    profile.devices[1].device = hostile.into();
    for point in &mut profile.timeline {
        if point.device == "cuda:0" {
            point.device = hostile.into();
        }
    }
    profile.summary.peak_device = hostile.into();
    let dom = rendered_dom(&browser, dir.path(), &profile, "");
    assert!(
        dom.contains("data-rendered=\"yes\""),
        "the report script failed"
    );
    assert_eq!(
        dom.matches("<script").count(),
        2,
        "a script element was injected"
    );
    assert!(!dom.contains("<img"), "an img element was injected");
    assert!(
        dom.contains("&lt;script&gt;alert(1)&lt;/script&gt;"),
        "names not shown as text"
    );
    // The device chart titled by the hostile name was still drawn, with the name as text.
    let timelines = between(&dom, "id=\"timelines\"", "</section>");
    assert!(timelines.contains("&lt;script&gt;alert(1)&lt;/script&gt; — peak"));
}

#[test]
fn screenshot_of_the_report_is_not_blank() {
    let Some(browser) = browser() else { return };
    let dir = tempfile::tempdir().unwrap();
    let page = dir.path().join("report.html");
    html::write(&sample_profile_with_drops(), &page).unwrap();
    let shot = dir.path().join("report.png");
    run_browser(
        &browser,
        &dir.path().join("chromium-profile"),
        &page,
        &[
            &format!("--screenshot={}", shot.display()),
            "--window-size=1400,1000",
            "--hide-scrollbars",
        ],
    );
    let png = std::fs::read(&shot).expect("screenshot written");
    assert!(png.starts_with(b"\x89PNG\r\n\x1a\n"), "not a PNG");
    // A blank 1400x1000 page compresses to a few KiB; the charts and text make it far larger.
    assert!(
        png.len() > 40_000,
        "screenshot suspiciously small: {} bytes",
        png.len()
    );
    // Kept for a person to look at.
    let keep = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("html_report.png");
    let _ = std::fs::copy(&shot, &keep);
}

#[test]
fn empty_and_extreme_profiles_still_render_to_the_end() {
    let Some(browser) = browser() else { return };
    let mut extreme = sample_profile();
    extreme.summary.peak_bytes = u64::MAX;
    extreme.summary.duration_ns = u64::MAX;
    extreme.timeline[5].live_bytes = u64::MAX;
    extreme.timeline[5].by_category = [(highwater::Category::Gradient, u64::MAX)]
        .into_iter()
        .collect();
    extreme.timeline[7].timestamp_ns = u64::MAX;
    extreme.iterations[3].delta_bytes = i64::MIN;
    extreme.pool_timeline[2].fragmentation = f64::MAX;
    extreme.spans[2].parent = Some(2);
    for (name, profile) in [("empty", Profile::empty()), ("extreme", extreme)] {
        let dir = tempfile::tempdir().unwrap();
        let dom = rendered_dom(&browser, dir.path(), &profile, "");
        assert!(
            dom.contains("data-rendered=\"yes\""),
            "{name}: the report script failed"
        );
        if name == "empty" {
            assert!(dom.contains("The profile holds no timeline points."));
            assert!(dom.contains("No spans were recorded."));
        }
    }
}
