//! The ranks page (issue 33) as a person uses it: headless Chromium opens it from disk with 63
//! ranks of a world of 64, and a script played after the page's own hovers the heaviest curve,
//! drags a zoom across the chart, picks a rank from the table and sorts by peak; the test reads
//! the DOM that results.
//!
//! Needs `chromium` (see `highwater_testkit::browser`).

use highwater_testkit::browser::{browser, run_browser};

use highwater::profile::ranks::{compare, CompareOptions, DeviceCheck, CURVE_POINTS};
use highwater::profile::units::format_bytes;
use highwater_export::html::ranks;
use highwater_testkit::ranks::as_rank;
use highwater_testkit::sample::sample_profile;

/// What the played script found, as `name=value;` pairs in `data-checks`.
const PLAY: &str = r##"
(function () {
  var out = [];
  function put(name, value) { out.push(name + "=" + String(value).replace(/[;"<>&]/g, "_")); }
  var overlay = document.getElementById("overlay-chart");
  put("paths", overlay.querySelectorAll("path.rank").length);
  var heavy = overlay.querySelectorAll("path.rank.heavy");
  put("heavy_paths", heavy.length);
  put("heavy_rank", heavy.length ? heavy[0].getAttribute("data-rank") : "none");
  put("minis", document.querySelectorAll(".mini").length);
  var heavyMini = document.querySelector(".mini.heavy");
  put("heavy_mini", heavyMini ? heavyMini.getAttribute("data-rank") : "none");
  put("capacity_line", overlay.querySelectorAll("line.capline").length);
  put("draw_ms", overlay.getAttribute("data-draw-ms"));
  // Hover the heaviest rank's peak: the tip names it.
  var marker = overlay.querySelector("circle").getBoundingClientRect();
  var svg = overlay.querySelector("svg");
  svg.dispatchEvent(new MouseEvent("mousemove", { bubbles: true,
    clientX: marker.left + marker.width / 2, clientY: marker.top + marker.height / 2 }));
  put("tip", document.getElementById("tip").textContent);
  put("hovered", overlay.querySelectorAll("path.rank.hover").length);
  // Drag across a tenth of the chart: zoomed, and Reset takes it back.
  var box = svg.getBoundingClientRect(), y = box.top + box.height / 2;
  svg.dispatchEvent(new MouseEvent("mousedown", { bubbles: true, clientX: box.left + box.width * 0.4, clientY: y }));
  svg.dispatchEvent(new MouseEvent("mousemove", { bubbles: true, clientX: box.left + box.width * 0.5, clientY: y }));
  svg.dispatchEvent(new MouseEvent("mouseup", { bubbles: true, clientX: box.left + box.width * 0.5, clientY: y }));
  var reset = document.getElementById("zoom-reset");
  put("zoomed", !reset.disabled);
  put("zoom_range", document.getElementById("zoom-range").textContent);
  reset.click();
  put("reset", reset.disabled);
  // Pick rank 3 from the table: its curve, its small chart and its row light up.
  document.querySelector("#rank-table tr[data-rank='3'] td").click();
  put("picked_path", overlay.querySelectorAll("path.rank.picked[data-rank='3']").length);
  put("picked_mini", document.querySelectorAll(".mini.picked[data-rank='3']").length);
  put("picked_row", document.querySelectorAll("#rank-table tr.picked[data-rank='3']").length);
  // Sort by peak (descending): the heaviest rank first, the missing rank last.
  var heads = document.querySelectorAll("#rank-table th");
  for (var i = 0; i < heads.length; i++) if (heads[i].textContent === "Peak") heads[i].click();
  var rows = document.querySelectorAll("#rank-table tbody tr");
  put("first_row", rows[0].getAttribute("data-rank"));
  put("last_row", rows[rows.length - 1].getAttribute("data-rank"));
  // The script's units are highwater's.
  var f = window.highwaterRanksFormat.bytes;
  put("units", [1000, 1536, 1048575, 3221225472, 1.5e12].map(f).join("|"));
  document.body.setAttribute("data-checks", out.join(";"));
})();
"##;

fn check<'a>(dom: &'a str, name: &str) -> &'a str {
    let all = dom
        .split("data-checks=\"")
        .nth(1)
        .expect("the played script ran to its end");
    let all = &all[..all.find('"').unwrap()];
    all.split(';')
        .find_map(|pair| pair.strip_prefix(&format!("{name}=")))
        .unwrap_or_else(|| panic!("no {name} in {all}"))
}

#[test]
fn sixty_three_ranks_draw_hover_zoom_pick_and_sort() {
    let Some(browser) = browser() else { return };
    let dir = tempfile::tempdir().unwrap();
    let profiles = dir.path().join("run");
    std::fs::create_dir(&profiles).unwrap();
    for rank in (0..64u32).filter(|&r| r != 7) {
        let extra = if rank == 41 {
            3 << 30
        } else {
            u64::from(rank % 9) << 26
        };
        as_rank(sample_profile(), rank, 64, "torchrun:page", extra)
            .write(profiles.join(format!("p.rank{rank}.json")))
            .unwrap();
    }
    let run = compare(&[profiles], &CompareOptions::new().curves(CURVE_POINTS)).unwrap();
    assert_eq!(run.imbalance.heaviest_rank, 41);
    let check_device = DeviceCheck::new("l4", run.imbalance.max_peak_bytes + (1 << 30), &run);
    let page = ranks::render(&run, Some(&check_device))
        .replace("</body>", &format!("<script>{PLAY}</script></body>"));
    let path = dir.path().join("ranks.html");
    std::fs::write(&path, page).unwrap();
    let dom = run_browser(
        &browser,
        &dir.path().join("chromium"),
        &path,
        &["--dump-dom"],
    );

    assert_eq!(check(&dom, "paths"), "63");
    assert_eq!(check(&dom, "heavy_paths"), "1");
    assert_eq!(check(&dom, "heavy_rank"), "41");
    assert_eq!(check(&dom, "minis"), "63");
    assert_eq!(check(&dom, "heavy_mini"), "41");
    assert_eq!(check(&dom, "capacity_line"), "1");
    let tip = check(&dom, "tip");
    assert!(tip.starts_with("rank 41 (heaviest)"), "{tip}");
    assert!(
        tip.contains(&format!(
            "peak {}",
            format_bytes(run.imbalance.max_peak_bytes)
        )),
        "{tip}"
    );
    assert_eq!(check(&dom, "hovered"), "1");
    assert_eq!(check(&dom, "zoomed"), "true");
    assert!(check(&dom, "zoom_range").starts_with("showing iteration "));
    assert_eq!(check(&dom, "reset"), "true");
    assert_eq!(check(&dom, "picked_path"), "1");
    assert_eq!(check(&dom, "picked_mini"), "1");
    assert_eq!(check(&dom, "picked_row"), "1");
    assert_eq!(check(&dom, "first_row"), "41");
    assert_eq!(check(&dom, "last_row"), "7", "the missing rank sorts last");
    let units: Vec<String> = [1000u64, 1536, 1_048_575, 3 << 30, 1_500_000_000_000]
        .map(format_bytes)
        .to_vec();
    assert_eq!(check(&dom, "units"), units.join("|"));
    eprintln!(
        "ranks page: 63 ranks drawn in {} ms (first draw, headless)",
        check(&dom, "draw_ms")
    );
}
