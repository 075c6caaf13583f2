//! The HTML report of real runs as a person sees it, at 1,400 and 1,000 px: a normal run of 200
//! training steps, the same run leaking one buffer per step, and an empty profile. Headless
//! Chromium lays each page out and takes a screenshot; a script run after the report's own
//! measures the layout (no two cards, sections or axis labels overlap; no value spills out of
//! its card), brushes across a timeline chart (the visible range must change, and reset must
//! restore it) and checks the chart of the step that peaked. The hand-built sample profile's
//! call sites check the icicle: labels inside their frames, a tooltip on hover, zoom in and out
//! by clicking, and the live-at-peak rows' links to their sites. The test reads all of that back,
//! and the screenshot's size from its PNG header.
//!
//! Screenshots are written to a temporary directory; set `HIGHWATER_SCREENSHOT_DIR` to keep
//! them. Needs Chromium (see `highwater_testkit::browser`).

use std::path::Path;
use std::sync::OnceLock;

use highwater::{Alloc, Category, Profile, Session, Step};
use highwater_export::html;

use highwater_testkit::browser::{browser, run_browser};

#[global_allocator]
static ALLOC: Alloc = Alloc::system();

const STEPS: usize = 200;
const KIB: usize = 1024;

/// A pretend training run: weights, then `STEPS` steps of forward, backward and optimizer
/// spans; with `leak`, each step keeps one 256 KiB activation.
fn train(leak: bool) -> Profile {
    let session = Session::builder().write_profile(false).start().unwrap();
    let weights: Vec<Vec<u8>> = {
        let _load = highwater::profile!("load_weights", Category::Parameter);
        (0..4).map(|_| vec![1u8; 512 * KIB]).collect()
    };
    let mut moments: Vec<Vec<u8>> = Vec::new();
    let mut kept = Vec::new();
    for _ in 0..STEPS {
        let _step = highwater::profile!("train_step");
        let activations: Vec<Vec<u8>> = {
            let _fwd = highwater::profile!("forward", Step::Forward);
            weights.iter().map(|w| vec![2u8; w.len() / 2]).collect()
        };
        let gradients: Vec<Vec<u8>> = {
            let _bwd = highwater::profile!("backward", Step::Backward);
            weights.iter().map(|w| vec![3u8; w.len()]).collect()
        };
        {
            let _opt = highwater::profile!("optimizer", Step::Optimizer);
            if moments.is_empty() {
                moments = weights.iter().map(|w| vec![0u8; w.len() * 2]).collect();
            }
        }
        let mut activations = activations;
        if leak {
            kept.push(activations.swap_remove(0));
        }
        drop((activations, gradients));
    }
    let profile = session.finish().unwrap();
    drop((weights, moments, kept));
    profile
}

/// The two runs, recorded once, one session at a time.
fn runs() -> &'static (Profile, Profile) {
    static RUNS: OnceLock<(Profile, Profile)> = OnceLock::new();
    RUNS.get_or_init(|| (train(false), train(true)))
}

/// Measures the laid-out page and exercises the zoom; leaves its findings as JSON in
/// `<pre id="hw-layout">`.
const MEASURE: &str = r##"
(function () {
  var out = { overlaps: [], spills: [], sections: [] };
  function box(e) { var r = e.getBoundingClientRect(); return { l: r.left, r: r.right, t: r.top, b: r.bottom }; }
  function hit(a, b) { return a.l < b.r - 0.5 && b.l < a.r - 0.5 && a.t < b.b - 0.5 && b.t < a.b - 0.5; }
  function name(e) { return (e.id || e.className.baseVal || e.className || e.tagName) + ":" + (e.textContent || "").slice(0, 40); }
  function pairwise(list, what) {
    for (var i = 0; i < list.length; i++) for (var j = i + 1; j < list.length; j++) {
      if (hit(box(list[i]), box(list[j]))) out.overlaps.push(what + ": " + name(list[i]) + " / " + name(list[j]));
    }
  }
  pairwise(Array.prototype.slice.call(document.querySelectorAll(".card")), "cards");
  pairwise(Array.prototype.slice.call(document.querySelectorAll("main > section, main > .alert, main > .warnings")), "sections");
  Array.prototype.forEach.call(document.querySelectorAll("svg"), function (svg) {
    pairwise(Array.prototype.slice.call(svg.querySelectorAll("text.xlabel")), "x labels");
    pairwise(Array.prototype.slice.call(svg.querySelectorAll("text.ylabel")), "y labels");
  });
  Array.prototype.forEach.call(document.querySelectorAll(".card .value, .card .sub, .card .label"), function (e) {
    var card = box(e.closest(".card")), b = box(e);
    if (b.r > card.r + 0.5 || b.l < card.l - 0.5 || e.scrollWidth > e.clientWidth + 1) out.spills.push(name(e));
  });
  Array.prototype.forEach.call(document.querySelectorAll("main > section"), function (s) {
    out.sections.push({ id: s.id, height: Math.round(box(s).b - box(s).t) });
  });
  out.page_height = Math.round(document.documentElement.scrollHeight);
  out.page_width = Math.round(document.documentElement.scrollWidth);
  out.viewport = window.innerWidth;

  // Zoom: drag across the middle fifth of the first timeline chart, then reset.
  var svg = document.querySelector("#timelines svg");
  if (svg) {
    var range = function () { return [+svg.getAttribute("data-t0"), +svg.getAttribute("data-t1")]; };
    out.range_before = range();
    var r = svg.getBoundingClientRect(), y = r.top + r.height / 2;
    var at = function (f) { return r.left + r.width * f; };
    svg.dispatchEvent(new MouseEvent("mousedown", { clientX: at(0.4), clientY: y, bubbles: true }));
    window.dispatchEvent(new MouseEvent("mousemove", { clientX: at(0.6), clientY: y, bubbles: true }));
    window.dispatchEvent(new MouseEvent("mouseup", { clientX: at(0.6), clientY: y, bubbles: true }));
    svg = document.querySelector("#timelines svg");
    out.range_zoomed = range();
    out.all_follow = Array.prototype.every.call(document.querySelectorAll("#timelines svg, #pool-charts svg"),
      function (s) { return s.getAttribute("data-t0") === svg.getAttribute("data-t0"); });
    out.reset_enabled = !document.getElementById("zoom-reset").disabled;
    document.getElementById("zoom-reset").click();
    out.range_reset = range();
  }
  var step = document.querySelector("#peak-step-chart svg");
  out.peak_step = step ? {
    t0: +step.getAttribute("data-t0"), t1: +step.getAttribute("data-t1"),
    bands: step.querySelectorAll("rect.band").length,
    peak_marked: step.querySelectorAll(".peakline").length,
    title: document.querySelector("#peak-step-chart h3").textContent
  } : null;
  // The icicle of call sites: labels inside their frames, hover, zoom in and out, row links.
  var flame = document.querySelector("#flame-chart svg");
  if (flame) {
    var f = { frames: flame.querySelectorAll("g.frame").length, spills: [] };
    Array.prototype.forEach.call(flame.querySelectorAll("g.frame"), function (g) {
      var t = g.querySelector("text"), r = g.querySelector("rect");
      if (t && t.getBBox().x + t.getBBox().width > +r.getAttribute("x") + +r.getAttribute("width") + 1) f.spills.push(t.textContent);
    });
    var frameOf = function (name) {
      return Array.prototype.filter.call(flame.querySelectorAll("g.frame"), function (g) {
        var t = g.querySelector("text");
        return t && (t.textContent === name || t.textContent.slice(-name.length - 2) === "::" + name);
      })[0];
    };
    var centre = function (g) { var r = g.querySelector("rect").getBoundingClientRect(); return { x: r.left + r.width / 2, y: r.top + r.height / 2 }; };
    var leaf = frameOf("Tensor::zeros_like") || flame.querySelector("g.frame:last-child");
    var at = centre(leaf);
    leaf.querySelector("rect").dispatchEvent(new MouseEvent("mousemove", { clientX: at.x, clientY: at.y, bubbles: true }));
    f.tip = document.getElementById("tip").hidden ? null : document.getElementById("tip").textContent;
    var target = frameOf("train_gpt::model::Gpt::forward");
    f.target = target ? +target.getAttribute("data-i") : null;
    if (target) {
      var c = centre(target);
      target.querySelector("rect").dispatchEvent(new MouseEvent("click", { clientX: c.x, clientY: c.y, bubbles: true }));
      flame = document.querySelector("#flame-chart svg");
      f.focus_after_click = +flame.getAttribute("data-focus");
      var focused = flame.querySelector("g.frame[data-i=\"" + f.target + "\"] rect");
      f.focused_width = +focused.getAttribute("width");
      f.width = flame.viewBox.baseVal.width;
      f.detail = document.getElementById("flame-detail").textContent;
      f.frames_zoomed = flame.querySelectorAll("g.frame").length;
      c = centre(flame.querySelector("g.frame[data-i=\"" + f.target + "\"]"));
      focused.dispatchEvent(new MouseEvent("click", { clientX: c.x, clientY: c.y, bubbles: true }));
      f.focus_after_second_click = +document.querySelector("#flame-chart svg").getAttribute("data-focus");
    }
    f.links = 0; f.broken_links = [];
    Array.prototype.forEach.call(document.querySelectorAll("#peak-table a[href^='#']"), function (a) {
      f.links++;
      if (!document.getElementById(a.getAttribute("href").slice(1))) f.broken_links.push(a.getAttribute("href"));
    });
    out.flame = f;
  }
  // Fit (issue 34): everything inside its section, tables without sideways scrolling, text of
  // at least 10 px as drawn (an SVG's text scaled by its drawing), span paths broken only
  // between their parts, swatches on their label's line, no label cut to a stub.
  var fit = { outside: [], scrolls: [], small: [], broken: [], swatches: [], stubs: [] };
  function shown(e) { return e.getClientRects().length > 0; }
  Array.prototype.forEach.call(document.querySelectorAll("main > section"), function (s) {
    var sb = box(s);
    Array.prototype.forEach.call(s.querySelectorAll("*"), function (e) {
      if (!shown(e)) return;
      var b = box(e);
      if (b.r > sb.r + 1 || b.l < sb.l - 1) fit.outside.push(s.id + ": " + name(e));
    });
  });
  Array.prototype.forEach.call(document.querySelectorAll(".scroll"), function (e) {
    if (shown(e) && e.scrollWidth > e.clientWidth + 1) fit.scrolls.push(name(e.firstElementChild || e));
  });
  var walker = document.createTreeWalker(document.body, NodeFilter.SHOW_TEXT);
  for (var node = walker.nextNode(); node; node = walker.nextNode()) {
    var e = node.parentElement;
    if (!node.textContent.trim() || !e || !shown(e) || e.closest("#tip, #hw-layout, script, style, title")) continue;
    var size = parseFloat(getComputedStyle(e).fontSize), svg = e.closest("svg");
    if (svg && svg.viewBox && svg.viewBox.baseVal && svg.viewBox.baseVal.width) {
      size *= svg.getBoundingClientRect().width / svg.viewBox.baseVal.width;
    }
    if (size < 10 - 0.01) fit.small.push(size.toFixed(1) + "px " + name(e));
  }
  Array.prototype.forEach.call(document.querySelectorAll("td.path"), function (td) {
    if (!shown(td)) return;
    var text = td.textContent, at = 0;
    text.split("/").forEach(function (part) {
      var range = document.createRange(), start = text.indexOf(part, at);
      at = start + part.length;
      if (!part) return;
      // Text offsets across the <wbr> elements: walk the cell's text nodes.
      var nodes = [], w = document.createTreeWalker(td, NodeFilter.SHOW_TEXT), n, pos = 0, a = null, b = null;
      for (n = w.nextNode(); n; n = w.nextNode()) {
        var len = n.textContent.length;
        if (a === null && start < pos + len) a = [n, start - pos];
        if (b === null && at <= pos + len) b = [n, at - pos];
        pos += len;
      }
      if (!a || !b) return;
      range.setStart(a[0], a[1]); range.setEnd(b[0], b[1]);
      var tops = {};
      Array.prototype.forEach.call(range.getClientRects(), function (r) { if (r.width > 0) tops[Math.round(r.top)] = 1; });
      if (Object.keys(tops).length > 1) fit.broken.push(text);
    });
  });
  Array.prototype.forEach.call(document.querySelectorAll(".legend li, td.cat"), function (e) {
    var swatch = e.querySelector("i");
    if (!swatch || !shown(e)) return;
    var range = document.createRange();
    range.selectNodeContents(e);
    var first = Array.prototype.filter.call(range.getClientRects(), function (r) { return r.width > 0; })[0];
    var sw = swatch.getBoundingClientRect();
    if (first && (sw.bottom < first.top || sw.top > first.bottom)) fit.swatches.push(name(e));
  });
  Array.prototype.forEach.call(document.querySelectorAll("#flame-chart text"), function (t) {
    var s = t.textContent;
    if (s.slice(-1) === "…" && s.length < 6) fit.stubs.push(s);
  });
  fit.envelope = Array.prototype.map.call(document.querySelectorAll("#timelines svg"), function (s) { return s.getAttribute("data-envelope"); });
  var stepSvg = document.querySelector("#peak-step-chart svg");
  fit.peak_step_points = stepSvg ? +stepSvg.getAttribute("data-points") : 0;
  out.fit = fit;
  out.formats = [0, 1023, 1024, 1536, 1048575, 10485760, 5905580032, 1099511627776].map(window.highwaterFormat.bytes)
    .concat([999, 12500, 3200000, 999960, 999999999, 1250000000].map(window.highwaterFormat.time));
  var pre = document.createElement("pre");
  pre.id = "hw-layout";
  pre.textContent = JSON.stringify(out);
  document.body.appendChild(pre);
})();
"##;

struct Seen {
    layout: serde_json::Value,
    png_size: (u32, u32),
}

/// Lays `profile`'s report out at `width` px: the measurements, and a screenshot read back.
fn look(browser: &str, dir: &Path, name: &str, profile: &Profile, width: u32) -> Seen {
    let page = dir.join(format!("{name}-{width}.html"));
    let report = html::render(profile);
    std::fs::write(&page, &report).unwrap();
    let measured = dir.join(format!("{name}-{width}-measured.html"));
    std::fs::write(
        &measured,
        report.replace("</body>", &format!("<script>{MEASURE}</script></body>")),
    )
    .unwrap();
    let size = format!("--window-size={width},1200");
    let dom = run_browser(
        browser,
        &dir.join("chromium-profile"),
        &measured,
        &["--dump-dom", &size],
    );
    let json = dom
        .split("<pre id=\"hw-layout\">")
        .nth(1)
        .and_then(|rest| rest.split("</pre>").next())
        .unwrap_or_else(|| panic!("{name} at {width}: the measuring script did not finish"))
        .replace("&quot;", "\"")
        .replace("&lt;", "<")
        .replace("&gt;", ">")
        .replace("&amp;", "&");
    let layout: serde_json::Value = serde_json::from_str(&json).unwrap();

    let shot_dir = std::env::var_os("HIGHWATER_SCREENSHOT_DIR")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| dir.to_path_buf());
    std::fs::create_dir_all(&shot_dir).unwrap();
    let shot = shot_dir.join(format!("{name}-{width}.png"));
    let height = layout["page_height"].as_u64().unwrap().clamp(600, 8000) as u32;
    run_browser(
        browser,
        &dir.join("chromium-profile"),
        &page,
        &[
            &format!("--screenshot={}", shot.display()),
            &format!("--window-size={width},{height}"),
            "--hide-scrollbars",
        ],
    );
    let png = std::fs::read(&shot).expect("screenshot written");
    assert!(png.starts_with(b"\x89PNG\r\n\x1a\n"), "not a PNG");
    // IHDR: width and height, big-endian, right after the chunk header.
    let dimension = |at: usize| u32::from_be_bytes(png[at..at + 4].try_into().unwrap());
    // A blank page compresses to a few KiB; charts and text make it far larger.
    assert!(
        png.len() > 30_000,
        "{name} at {width}: screenshot nearly blank"
    );
    Seen {
        layout,
        png_size: (dimension(16), dimension(20)),
    }
}

fn assert_laid_out(name: &str, width: u32, seen: &Seen) {
    let layout = &seen.layout;
    assert_eq!(seen.png_size.0, width, "{name}: screenshot width");
    assert_eq!(
        layout["overlaps"].as_array().unwrap().len(),
        0,
        "{name} at {width}: overlapping boxes {}",
        layout["overlaps"]
    );
    assert_eq!(
        layout["spills"].as_array().unwrap().len(),
        0,
        "{name} at {width}: text spills out of its card {}",
        layout["spills"]
    );
    assert!(
        layout["page_width"].as_u64().unwrap() <= u64::from(width),
        "{name} at {width}: the page scrolls sideways ({})",
        layout["page_width"]
    );
}

fn assert_zooms(name: &str, layout: &serde_json::Value) {
    let range = |key: &str| -> (u64, u64) {
        let r = layout[key].as_array().unwrap();
        (r[0].as_u64().unwrap(), r[1].as_u64().unwrap())
    };
    let before = range("range_before");
    let zoomed = range("range_zoomed");
    assert!(
        zoomed.0 > before.0
            && zoomed.1 < before.1
            && zoomed.1 - zoomed.0 < (before.1 - before.0) / 3,
        "{name}: brushing did not zoom: {before:?} -> {zoomed:?}"
    );
    assert_eq!(
        layout["all_follow"], true,
        "{name}: charts disagree on the range"
    );
    assert_eq!(layout["reset_enabled"], true);
    assert_eq!(
        range("range_reset"),
        before,
        "{name}: reset did not restore"
    );
}

fn assert_peak_step(name: &str, profile: &Profile, layout: &serde_json::Value) {
    let step = &layout["peak_step"];
    assert!(step.is_object(), "{name}: no chart of the step that peaked");
    let (t0, t1) = (step["t0"].as_u64().unwrap(), step["t1"].as_u64().unwrap());
    let peak = profile.summary.peak_timestamp_ns;
    assert!(
        t0 <= peak && peak <= t1,
        "{name}: {t0}..{t1} misses the peak at {peak}"
    );
    // Zoomed to the one `train_step` instance that holds the peak, however long that step took
    // (a loaded machine can stall any step): the range is that instance's, not the run's.
    let step_span = profile
        .spans
        .iter()
        .position(|node| node.name == "train_step")
        .expect("a train_step span") as u32;
    let holding = profile
        .span_events
        .iter()
        .filter(|event| event.span == step_span)
        .map(|event| (event.start_ns, event.start_ns + event.duration_ns))
        .filter(|&(start, end)| start <= peak && peak <= end)
        .min()
        .expect("a train_step instance holds the peak");
    assert_eq!(
        (t0, t1),
        holding,
        "{name}: the step chart is not zoomed to the step that peaked"
    );
    assert!(
        t1 - t0 < profile.summary.duration_ns,
        "{name}: the step chart shows the whole run"
    );
    // The step itself and its forward, backward and optimizer spans.
    assert!(step["bands"].as_u64().unwrap() >= 4, "{name}: {step}");
    assert_eq!(step["peak_marked"], 1, "{name}: the peak is not marked");
    assert!(step["title"].as_str().unwrap().contains("train_step"));
}

#[test]
fn normal_and_leaking_runs_lay_out_zoom_and_show_the_step_that_peaked() {
    let Some(browser) = browser() else { return };
    let dir = tempfile::tempdir().unwrap();
    let (normal, leak) = runs();
    assert_eq!(normal.iterations.len(), STEPS);
    for (name, profile) in [("normal", normal), ("leak", leak)] {
        for width in [1400, 1000] {
            let seen = look(&browser, dir.path(), name, profile, width);
            assert_laid_out(name, width, &seen);
            assert_zooms(name, &seen.layout);
            assert_peak_step(name, profile, &seen.layout);
            // 200 iterations: a chart and a folded table, not a 9,000 px page.
            let iterations = seen.layout["sections"]
                .as_array()
                .unwrap()
                .iter()
                .find(|s| s["id"] == "iterations")
                .unwrap()["height"]
                .as_u64()
                .unwrap();
            assert!(
                iterations < 600,
                "{name}: iterations section {iterations} px"
            );
        }
    }
}

#[test]
fn the_call_sites_icicle_lays_out_hovers_zooms_and_the_rows_link_to_their_sites() {
    let Some(browser) = browser() else { return };
    let dir = tempfile::tempdir().unwrap();
    let profile = highwater_testkit::sample::sample_profile();
    for width in [1400, 1000] {
        let seen = look(&browser, dir.path(), "sites", &profile, width);
        assert_laid_out("sites", width, &seen);
        let flame = &seen.layout["flame"];
        assert!(flame.is_object(), "no icicle drawn");
        assert!(flame["frames"].as_u64().unwrap() >= 20, "{flame}");
        assert_eq!(flame["spills"].as_array().unwrap().len(), 0, "{flame}");
        // Hovering a frame shows its bytes ± error and where it is.
        let tip = flame["tip"].as_str().expect("a tooltip on hover");
        let site = profile
            .sites
            .iter()
            .find(|s| s.frames.iter().any(|f| f.line == Some(380)))
            .unwrap();
        assert!(
            tip.contains("candle_core::tensor::Tensor::zeros_like"),
            "{tip}"
        );
        assert!(
            tip.contains("candle-core-0.11.0/src/tensor.rs:380"),
            "{tip}"
        );
        assert!(tip.contains(" ± "), "{tip}");
        assert!(tip.contains(&format!("#{}", site.id)), "{tip}");
        // Clicking a frame zooms into it (full width, fewer frames); clicking it again zooms out.
        let target = flame["target"].as_u64().expect("Gpt::forward is drawn");
        assert_eq!(flame["focus_after_click"].as_u64(), Some(target));
        assert!(
            flame["focused_width"].as_f64().unwrap() > flame["width"].as_f64().unwrap() - 10.0,
            "{flame}"
        );
        assert!(
            flame["frames_zoomed"].as_u64() < flame["frames"].as_u64(),
            "{flame}"
        );
        assert!(
            flame["detail"]
                .as_str()
                .unwrap()
                .contains("train_gpt::model::Gpt::forward"),
            "{flame}"
        );
        assert_ne!(flame["focus_after_second_click"].as_u64(), Some(target));
        // Every live-at-peak row links to a site row that exists.
        assert_eq!(
            flame["links"].as_u64().unwrap() as usize,
            profile.peak_breakdown.len(),
            "{flame}"
        );
        assert_eq!(
            flame["broken_links"].as_array().unwrap().len(),
            0,
            "{flame}"
        );
    }
}

#[test]
fn an_empty_profile_lays_out_cleanly() {
    let Some(browser) = browser() else { return };
    let dir = tempfile::tempdir().unwrap();
    for width in [1400, 1000] {
        let seen = look(&browser, dir.path(), "empty", &Profile::empty(), width);
        assert_laid_out("empty", width, &seen);
        assert!(seen.layout["peak_step"].is_null());
    }
}

#[test]
fn the_script_formats_units_exactly_as_the_text_reports_do() {
    use highwater::profile::units::{format_bytes, format_duration_ns};
    let Some(browser) = browser() else { return };
    let dir = tempfile::tempdir().unwrap();
    let seen = look(&browser, dir.path(), "formats", &Profile::empty(), 1000);
    let mut want: Vec<String> = [
        0u64,
        1023,
        1024,
        1536,
        1048575,
        10485760,
        5905580032,
        1 << 40,
    ]
    .into_iter()
    .map(format_bytes)
    .collect();
    want.extend(
        [999u64, 12500, 3200000, 999960, 999999999, 1250000000]
            .into_iter()
            .map(format_duration_ns),
    );
    let got: Vec<String> = seen.layout["formats"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap().to_string())
        .collect();
    assert_eq!(got, want);
}

/// The fit checks the measuring script collected, for `name` at `width`.
fn assert_fits(name: &str, width: u32, layout: &serde_json::Value, max_height: u64) {
    let fit = &layout["fit"];
    eprintln!(
        "{name} at {width}: {} px tall, fit {fit}",
        layout["page_height"]
    );
    for (key, what) in [
        ("outside", "boxes past their section's edge"),
        ("scrolls", "tables wider than their card"),
        ("small", "text under 10 px as drawn"),
        ("broken", "span paths broken inside a name"),
        ("swatches", "swatches on another line than their label"),
        ("stubs", "icicle labels cut to a stub"),
    ] {
        let found = fit[key].as_array().unwrap();
        assert!(
            found.is_empty(),
            "{name} at {width}: {what}: {}",
            serde_json::to_string(&found[..found.len().min(12)]).unwrap()
        );
    }
    let height = layout["page_height"].as_u64().unwrap();
    assert!(
        height <= max_height,
        "{name} at {width}: the page is {height} px tall (at most {max_height})"
    );
}

/// The hand-built profile with a hundred more call sites that hold nothing at the peak, as the
/// candle MLP's profile has (125 sites, most of them 0 B at the peak).
fn many_sites() -> Profile {
    let mut profile = highwater_testkit::sample::sample_profile();
    let template = profile.sites[0].clone();
    for i in 0..100u32 {
        let mut site = template.clone();
        site.id = 1_000 + i;
        site.peak_bytes = 0;
        site.peak_bytes_error = 0;
        for share in &mut site.shares {
            share.peak_bytes = 0;
            share.peak_count = 0;
            share.peak_temporary_bytes = 0;
            share.category = Category::Gradient;
        }
        site.frames[0].line = Some(1_000 + i);
        profile.sites.push(site);
    }
    profile
}

/// Issue 34: the report fits a phone-sized window and a wide screen. At 800 and 1,920 px every
/// box stays inside its section, no table scrolls sideways, all text is at least 10 px as
/// drawn (the charts are drawn at their width, not scaled down), span paths wrap between
/// their parts, swatches sit with their labels, and the page stays a few screens tall (one
/// screen of rows per table, zero-byte sites folded). The zoomed-out timeline of a long run
/// draws its envelope, and the step that peaked is drawn from the fine window.
#[test]
fn the_report_fits_800_and_1920_px_with_bounded_height() {
    let Some(browser) = browser() else { return };
    let dir = tempfile::tempdir().unwrap();
    let (normal, _) = runs();
    let sites = many_sites();
    for width in [800, 1920] {
        let seen = look(&browser, dir.path(), "fit-sites", &sites, width);
        assert_laid_out("fit-sites", width, &seen);
        let max = if width == 800 { 8_000 } else { 6_500 };
        assert_fits("fit-sites", width, &seen.layout, max);

        let seen = look(&browser, dir.path(), "fit-run", normal, width);
        assert_laid_out("fit-run", width, &seen);
        assert_fits("fit-run", width, &seen.layout, 7_000);
        let fit = &seen.layout["fit"];
        assert_eq!(
            fit["envelope"][0], "yes",
            "fit-run at {width}: 200 steps zoomed out draw an envelope: {fit}"
        );
        let step = &seen.layout["peak_step"];
        let (t0, t1) = (step["t0"].as_u64().unwrap(), step["t1"].as_u64().unwrap());
        let fine = normal
            .peak_window
            .iter()
            .filter(|p| p.timestamp_ns >= t0 && p.timestamp_ns <= t1)
            .count() as u64;
        let coarse = normal
            .timeline
            .iter()
            .filter(|p| p.timestamp_ns >= t0 && p.timestamp_ns <= t1)
            .count() as u64;
        assert!(fine > coarse, "the window is finer: {fine} vs {coarse}");
        // Every category's path draws each point of the window.
        assert!(
            fit["peak_step_points"].as_u64().unwrap() >= fine,
            "fit-run at {width}: {fit}"
        );
    }
}
