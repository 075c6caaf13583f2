//! The ranks page: a multi-process run's ranks side by side, in one self-contained file.
//!
//! Everything a reader needs without a script is escaped HTML: the run's figures (the heaviest
//! rank, the imbalance, missing and unfinished ranks, the device check) and the per-rank table
//! (`highwater ranks`'s). The curves are drawn by the inline script (`ranks.js`) from a JSON
//! data island: every rank's live bytes on its peak device by iteration, overlaid with the
//! heaviest rank marked (hover a curve for its rank), and as small multiples on one scale.
//!
//! # Size and cost
//!
//! Each curve holds at most [`CURVE_POINTS`](highwater_profile::ranks::CURVE_POINTS) points
//! (fewer when there are many ranks: the page carries at most [`MAX_PAGE_POINTS`] in all), the
//! overlay draws one path per rank, and at most [`MAX_SMALL_MULTIPLES`] small charts are drawn
//! (the ranks that peak highest), so the page stays quick to open with hundreds of ranks.

use std::fmt::Write as _;
use std::path::Path;

use serde::Serialize;

use super::page::{format_unix_ms, json_for_script};
use super::{escape_html, write_output, ExportError, Output};
use crate::vocabulary as words;
use highwater_profile::model::Category;
use highwater_profile::ranks::{DeviceCheck, PeakWhen, RankCurve, RankRow, RunComparison};
use highwater_profile::units::{format_bytes, format_bytes_delta};

const STYLE: &str = include_str!("report.css");
const RANKS_STYLE: &str = include_str!("ranks.css");
const SCRIPT: &str = include_str!("ranks.js");

/// Most small charts drawn, one per rank: the ranks that peak highest, in rank order.
pub const MAX_SMALL_MULTIPLES: usize = 64;
/// Most curve points the page carries over all ranks; each curve is thinned to its share.
pub const MAX_PAGE_POINTS: usize = 250_000;

/// The data island the script draws from.
#[derive(Serialize)]
struct Data<'a> {
    /// `true`: x is iterations; `false`: the fraction of each rank's run.
    by_iteration: bool,
    /// What x counts, for the axis.
    x_label: String,
    heaviest: u32,
    capacity: Option<u64>,
    device: Option<&'a str>,
    /// Ranks drawn as small multiples.
    small: Vec<u32>,
    ranks: Vec<Curve>,
}

#[derive(Serialize)]
struct Curve {
    rank: u32,
    peak: u64,
    partial: bool,
    x: Vec<f32>,
    y: Vec<u64>,
}

/// Renders the ranks page of `run`, with `device`'s check when given.
///
/// # Examples
///
/// ```no_run
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// use highwater_profile::ranks::{compare, CompareOptions};
/// let run = compare(&["runs/job".into()], &CompareOptions::new().curves(400))?;
/// let page = highwater_export::html::ranks::render(&run, None);
/// assert!(page.starts_with("<!DOCTYPE html>"));
/// # Ok(()) }
/// ```
pub fn render(run: &RunComparison, device: Option<&DeviceCheck>) -> String {
    let mut out = String::with_capacity(64 * 1024 + run.rows.len() * 2048);
    let label = &run.run.label;
    let program = if run.run.program.is_empty() {
        "a run"
    } else {
        &run.run.program
    };
    let hosts = {
        let mut hosts: Vec<&str> = run.rows.iter().map(|r| r.host.as_str()).collect();
        hosts.sort_unstable();
        hosts.dedup();
        hosts.len()
    };
    let _ = write!(
        out,
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\
         <meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\
         <meta http-equiv=\"Content-Security-Policy\" content=\"default-src 'none'; \
         style-src 'unsafe-inline'; script-src 'unsafe-inline'; img-src data:\">\
         <title>highwater: ranks of {}</title><style>{STYLE}\n{RANKS_STYLE}</style></head><body>\
         <header><h1>highwater <span>ranks of <b>{}</b>, run <b>{}</b></span></h1>\
         <p class=\"meta\">{} of {} ranks · {} host{} · launched by {} · started {}</p></header><main>",
        escape_html(program),
        escape_html(program),
        escape_html(label),
        run.rows.len(),
        run.run
            .world_size
            .map_or("?".to_string(), |w| w.to_string()),
        hosts,
        if hosts == 1 { "" } else { "s" },
        escape_html(run.run.launcher.as_deref().unwrap_or("an unknown launcher")),
        format_unix_ms(run.run.started_unix_ms),
    );
    notices(&mut out, run, device);
    summary(&mut out, run, device);
    out.push_str(
        "<section id=\"overlay\"><h2>Memory by iteration, every rank</h2>\
         <p class=\"note\" id=\"overlay-note\">Live bytes on each rank's peak device, on an axis \
         the ranks share: iteration <i>i</i> spans <i>i</i> to <i>i</i>+1 on every rank, \
         whatever its clock said (before 0: setup). The heaviest rank is red; hover a curve for \
         its rank, click it (or a table row) to pick one out, drag across the chart to zoom into \
         a few iterations. <span id=\"overlay-mode\"></span></p>\
         <div class=\"toolbar\"><button type=\"button\" id=\"zoom-reset\" disabled>Reset zoom\
         </button><span id=\"zoom-range\" class=\"note\"></span></div>\
         <div class=\"chart\" id=\"overlay-chart\"></div>\
         <noscript><p class=\"alert\">The charts need JavaScript; the table below does not.</p>\
         </noscript></section>\
         <section id=\"multiples\"><h2>Each rank</h2><p class=\"note\" id=\"multiples-note\"></p>\
         <div class=\"multiples\" id=\"multiples-grid\"></div></section>",
    );
    table(&mut out, run, device);
    let _ = writeln!(
        out,
        "</main><footer>Written by highwater from the rank profiles alone: this file loads \
         nothing from the network.</footer><div id=\"tip\" hidden></div>\
         <script type=\"application/json\" id=\"hw-ranks\">{}</script>\
         <script>{SCRIPT}</script></body></html>",
        json_for_script(&data(run, device))
    );
    out
}

/// Writes [`render`] to `path` atomically (a temporary sibling renamed into place).
///
/// # Errors
///
/// [`ExportError`] naming the file when it cannot be written; `path` keeps what it held before.
pub fn write(
    run: &RunComparison,
    device: Option<&DeviceCheck>,
    path: impl AsRef<Path>,
) -> Result<(), ExportError> {
    write_output(
        Output::HtmlReport,
        path.as_ref(),
        render(run, device).as_bytes(),
    )
}

/// The alerts above everything: missing ranks, ranks that do not fit.
fn notices(out: &mut String, run: &RunComparison, device: Option<&DeviceCheck>) {
    if !run.missing_ranks.is_empty() {
        let _ = write!(
            out,
            "<div class=\"alert\" id=\"missing\" role=\"alert\">⚠ {} of {} ranks left no \
             profile: rank{} {} (crashed before writing one, or the file was not given)</div>",
            run.missing_ranks.len(),
            run.run.world_size.unwrap_or(0),
            if run.missing_ranks.len() == 1 {
                ""
            } else {
                "s"
            },
            rank_list(&run.missing_ranks)
        );
    }
    if let Some(check) = device {
        let failing = check.not_fitting();
        if !failing.is_empty() {
            let _ = write!(
                out,
                "<div class=\"alert\" id=\"does-not-fit\" role=\"alert\">⚠ rank{} {} do{} not \
                 fit {} ({})</div>",
                if failing.len() == 1 { "" } else { "s" },
                rank_list(&failing),
                if failing.len() == 1 { "es" } else { "" },
                escape_html(&check.device),
                format_bytes(check.capacity_bytes)
            );
        }
    }
    if !run.partial_ranks.is_empty() || !run.other_runs.is_empty() {
        out.push_str("<ul class=\"warnings\" id=\"warnings\">");
        if !run.partial_ranks.is_empty() {
            let _ = write!(
                out,
                "<li>rank{} {} left a checkpoint, not a final profile (still running, or \
                 died): {} figures stop at the checkpoint</li>",
                if run.partial_ranks.len() == 1 {
                    ""
                } else {
                    "s"
                },
                rank_list(&run.partial_ranks),
                if run.partial_ranks.len() == 1 {
                    "its"
                } else {
                    "their"
                }
            );
        }
        for other in &run.other_runs {
            let _ = write!(
                out,
                "<li>left out: run {}</li>",
                escape_html(&other.to_string())
            );
        }
        out.push_str("</ul>");
    }
}

fn rank_list(ranks: &[u32]) -> String {
    const LISTED: usize = 32;
    let mut text: Vec<String> = ranks.iter().take(LISTED).map(u32::to_string).collect();
    if ranks.len() > LISTED {
        text.push(format!("and {} more", ranks.len() - LISTED));
    }
    text.join(", ")
}

fn card(out: &mut String, id: &str, label: &str, value: &str, sub: &str) {
    let _ = write!(
        out,
        "<div class=\"card\" id=\"card-{id}\"><div class=\"label\">{label}</div>\
         <div class=\"value\">{value}</div>"
    );
    if !sub.is_empty() {
        let _ = write!(out, "<div class=\"sub\">{sub}</div>");
    }
    out.push_str("</div>");
}

fn summary(out: &mut String, run: &RunComparison, device: Option<&DeviceCheck>) {
    let i = &run.imbalance;
    let heaviest = run.rows.iter().find(|r| r.rank == i.heaviest_rank);
    out.push_str("<section id=\"summary\"><h2>Summary</h2><div class=\"cards\">");
    let _ = write!(
        out,
        "<div class=\"card peak\" id=\"card-heaviest\"><div class=\"label\">Heaviest rank</div>\
         <div class=\"value\" id=\"heaviest-value\">rank {} · {}</div>\
         <div class=\"sub\">{:.2}× the mean peak{}</div></div>",
        i.heaviest_rank,
        format_bytes(i.max_peak_bytes),
        i.max_over_mean,
        heaviest.map_or(String::new(), |r| format!(
            " · on {} · {}",
            escape_html(&r.peak_device),
            escape_html(&when_text(&r.peak_when))
        )),
    );
    card(
        out,
        "imbalance",
        "Imbalance (max / mean)",
        &format!("{:.2}×", i.max_over_mean),
        &format!(
            "mean peak {}",
            format_bytes(i.mean_peak_bytes.round() as u64)
        ),
    );
    card(
        out,
        "lightest",
        "Lightest rank",
        &format!("rank {}", i.lightest_rank),
        &format_bytes(i.min_peak_bytes),
    );
    card(
        out,
        "read",
        "Ranks read",
        &run.rows.len().to_string(),
        &match run.run.world_size {
            Some(w) => format!("of a world of {w}; {} missing", run.missing_ranks.len()),
            None => "world size unknown".to_string(),
        },
    );
    if let Some(check) = device {
        let first = check.first_to_run_out.map_or("-".to_string(), |r| {
            let headroom = check
                .ranks
                .iter()
                .find(|h| h.rank == r)
                .map_or(0, |h| h.headroom_bytes);
            format!("rank {r}: {} headroom", headroom_text(headroom))
        });
        card(
            out,
            "device",
            &format!(
                "On {} ({})",
                escape_html(&check.device),
                format_bytes(check.capacity_bytes)
            ),
            "runs out first",
            &escape_html(&first),
        );
        if let Some(factor) = check.run_fit_factor {
            card(
                out,
                "fit",
                "The run's largest factor that fits",
                &format!("×{factor:.2}"),
                "the smallest rank's, from the allocation logs",
            );
        }
    }
    out.push_str("</div></section>");
}

fn headroom_text(bytes: i64) -> String {
    if bytes < 0 {
        format!("-{}", format_bytes(bytes.unsigned_abs()))
    } else {
        format_bytes(bytes as u64)
    }
}

/// `iteration 7`, `iterations 5–7`, `setup`, `after iteration 199`.
fn when_text(when: &PeakWhen) -> String {
    match when {
        PeakWhen::Iteration { first, last, .. } if first == last => format!("iteration {first}"),
        PeakWhen::Iteration { first, last, .. } => format!("iterations {first}–{last}"),
        PeakWhen::BeforeIterations { .. } => "setup".to_string(),
        PeakWhen::BetweenIterations { after, .. } => format!("between iterations, after {after}"),
        PeakWhen::AfterIterations { last, .. } => format!("after iteration {last}"),
        _ => "-".to_string(),
    }
}

fn num(out: &mut String, value: impl std::fmt::Display, shown: &str) {
    let _ = write!(out, "<td class=\"num\" data-v=\"{value}\">{shown}</td>");
}

fn table(out: &mut String, run: &RunComparison, device: Option<&DeviceCheck>) {
    out.push_str(
        "<section id=\"ranks\"><h2>Ranks</h2><p class=\"note\">One row per rank, as its own \
         profile says: the peak and when, each category at the peak, the span that held the \
         most there, and the growth of live bytes per iteration after the first (the leak \
         signal). Click a header to sort, a row to pick its curve out.</p>\
         <div class=\"scroll\"><table class=\"sortable\" id=\"rank-table\"><thead><tr>\
         <th class=\"num\" data-type=\"num\">Rank</th><th>Host</th>\
         <th class=\"num\" data-type=\"num\">Peak</th><th class=\"num\" data-type=\"num\">When</th><th>Step</th>",
    );
    for category in Category::ALL {
        let _ = write!(
            out,
            "<th class=\"num\" data-type=\"num\">{}</th>",
            escape_html(&category.to_string())
        );
    }
    out.push_str(
        "<th>Held most at the peak</th><th class=\"num\" data-type=\"num\">Growth / iteration</th>\
         <th>Device (capacity)</th>",
    );
    if device.is_some() {
        out.push_str(
            "<th class=\"num\" data-type=\"num\">Headroom</th>\
             <th class=\"num\" data-type=\"num\">Fit factor</th>",
        );
    }
    out.push_str("<th>File</th></tr></thead><tbody>");
    let mut missing = run.missing_ranks.iter().peekable();
    for row in &run.rows {
        while let Some(&&rank) = missing.peek() {
            if rank > row.rank {
                break;
            }
            missing_row(out, rank, device.is_some());
            missing.next();
        }
        rank_row(out, row, run.imbalance.heaviest_rank, device);
    }
    for &rank in missing {
        missing_row(out, rank, device.is_some());
    }
    out.push_str("</tbody></table></div></section>");
}

fn missing_row(out: &mut String, rank: u32, with_device: bool) {
    let columns = 9 + Category::COUNT + if with_device { 2 } else { 0 };
    let _ = write!(
        out,
        "<tr class=\"missing\" data-rank=\"{rank}\"><td class=\"num\" data-v=\"{rank}\">{rank}\
         </td><td colspan=\"{}\">no profile: the rank crashed before writing one, or its file \
         was not given</td></tr>",
        columns - 1
    );
}

fn rank_row(out: &mut String, row: &RankRow, heaviest: u32, device: Option<&DeviceCheck>) {
    let mut classes = Vec::new();
    if row.rank == heaviest {
        classes.push("heavy");
    }
    if row.partial {
        classes.push("partial");
    }
    let _ = write!(
        out,
        "<tr class=\"{}\" data-rank=\"{}\">",
        classes.join(" "),
        row.rank
    );
    num(
        out,
        row.rank,
        &format!(
            "{}{}",
            row.rank,
            if row.partial {
                " <span class=\"badge\" title=\"a checkpoint: the rank had not finished\">partial</span>"
            } else {
                ""
            }
        ),
    );
    let _ = write!(out, "<td>{}</td>", escape_html(&row.host));
    num(out, row.peak_bytes, &format_bytes(row.peak_bytes));
    let order = match &row.peak_when {
        PeakWhen::Iteration { first, .. } => *first as f64,
        PeakWhen::BeforeIterations { .. } => -1.0,
        PeakWhen::BetweenIterations { after, .. } => *after as f64 + 0.5,
        PeakWhen::AfterIterations { last, .. } => *last as f64 + 1.0,
        _ => -2.0,
    };
    num(out, order, &escape_html(&when_text(&row.peak_when)));
    let _ = write!(
        out,
        "<td>{}</td>",
        row.peak_step.map_or("-", |s| s.as_str())
    );
    for category in Category::ALL {
        let bytes = row.peak_by_category.get(&category).copied().unwrap_or(0);
        num(out, bytes, &format_bytes(bytes));
    }
    let _ = write!(
        out,
        "<td class=\"path\">{}</td>",
        row.top_span.as_ref().map_or("-".to_string(), |s| {
            format!(
                "{} <b>{}</b>",
                escape_html(if s.path.is_empty() {
                    words::OUTSIDE_SPANS
                } else {
                    &s.path
                }),
                format_bytes(s.bytes)
            )
        })
    );
    match row.growth_per_iteration {
        Some(growth) => {
            let rounded = growth.round() as i64;
            let class = match rounded {
                g if g > 0 => " up",
                g if g < 0 => " down",
                _ => "",
            };
            let _ = write!(
                out,
                "<td class=\"num{class}\" data-v=\"{growth}\">{}</td>",
                format_bytes_delta(rounded)
            );
        }
        None => num(out, 0, "-"),
    }
    let _ = write!(
        out,
        "<td>{}{}</td>",
        escape_html(&row.peak_device),
        row.capacity_bytes
            .map_or(String::new(), |c| format!(" ({})", format_bytes(c)))
    );
    if let Some(check) = device {
        let headroom = check.ranks.iter().find(|h| h.rank == row.rank);
        match headroom {
            Some(h) => {
                let class = if h.fits { "" } else { " up" };
                let _ = write!(
                    out,
                    "<td class=\"num{class}\" data-v=\"{}\">{}</td>",
                    h.headroom_bytes,
                    headroom_text(h.headroom_bytes)
                );
                match h.fit.as_ref().and_then(|f| f.factor) {
                    Some(factor) => num(out, factor, &format!("×{factor:.2}")),
                    None => num(out, -1, if h.fit.is_some() { "none" } else { "-" }),
                }
            }
            None => {
                num(out, 0, "-");
                num(out, -1, "-");
            }
        }
    }
    let name = row
        .file
        .file_name()
        .map_or_else(|| row.file.to_string_lossy(), |n| n.to_string_lossy());
    let _ = write!(
        out,
        "<td class=\"path\" title=\"{}\">{}</td></tr>",
        escape_html(&row.file.to_string_lossy()),
        escape_html(&name)
    );
}

fn data<'a>(run: &RunComparison, device: Option<&'a DeviceCheck>) -> Data<'a> {
    let by_iteration = !run.curves.is_empty() && run.curves.iter().all(|c| c.by_iteration);
    let span = run.rows.iter().find_map(|r| match &r.peak_when {
        PeakWhen::Iteration { span, .. }
        | PeakWhen::BeforeIterations { span }
        | PeakWhen::BetweenIterations { span, .. }
        | PeakWhen::AfterIterations { span, .. } => Some(span.clone()),
        _ => None,
    });
    let x_label = match (by_iteration, span) {
        (true, Some(span)) => format!("iterations of {span}"),
        (true, None) => "iterations".to_string(),
        (false, _) => "fraction of each rank's run".to_string(),
    };
    let per_curve = (MAX_PAGE_POINTS / run.curves.len().max(1)).max(16);
    let peak_of = |rank: u32| {
        run.rows
            .iter()
            .find(|r| r.rank == rank)
            .map_or((0, false), |r| (r.peak_bytes, r.partial))
    };
    let ranks = run
        .curves
        .iter()
        .filter(|c| c.by_iteration == by_iteration)
        .map(|c| {
            let (peak, partial) = peak_of(c.rank);
            let (x, y) = thin(c, per_curve);
            Curve {
                rank: c.rank,
                peak,
                partial,
                x,
                y,
            }
        })
        .collect();
    let mut small: Vec<&RankRow> = run.rows.iter().collect();
    small.sort_by_key(|r| (std::cmp::Reverse(r.peak_bytes), r.rank));
    small.truncate(MAX_SMALL_MULTIPLES);
    let mut small: Vec<u32> = small.into_iter().map(|r| r.rank).collect();
    small.sort_unstable();
    Data {
        by_iteration,
        x_label,
        heaviest: run.imbalance.heaviest_rank,
        capacity: device.map(|d| d.capacity_bytes),
        device: device.map(|d| d.device.as_str()),
        small,
        ranks,
    }
}

/// At most `max` of a curve's points: each bucket's highest (the curve's own peak among them).
fn thin(curve: &RankCurve, max: usize) -> (Vec<f32>, Vec<u64>) {
    let n = curve.x.len();
    if n <= max {
        return (curve.x.clone(), curve.bytes.clone());
    }
    let mut x = Vec::with_capacity(max);
    let mut y = Vec::with_capacity(max);
    for b in 0..max {
        let lo = b * n / max;
        let hi = ((b + 1) * n / max).max(lo + 1);
        let i = (lo..hi).max_by_key(|&i| curve.bytes[i]).unwrap_or(lo);
        x.push(curve.x[i]);
        y.push(curve.bytes[i]);
    }
    (x, y)
}

#[cfg(test)]
mod tests {
    use super::*;
    use highwater_profile::ranks::{compare, CompareOptions};
    use highwater_testkit::ranks::as_rank;
    use highwater_testkit::sample::sample_profile;

    fn run_of(ranks: u32, dir: &Path) -> RunComparison {
        for rank in 0..ranks {
            as_rank(
                sample_profile(),
                rank,
                ranks + 1,
                "job",
                u64::from(rank % 5) << 28,
            )
            .write(dir.join(format!("p.rank{rank}.json")))
            .unwrap();
        }
        compare(&[dir.to_path_buf()], &CompareOptions::new().curves(400)).unwrap()
    }

    #[test]
    fn the_page_is_self_contained_escaped_and_names_every_rank() {
        let dir = tempfile::tempdir().unwrap();
        let mut run = run_of(6, dir.path());
        run.rows[2].host = "<script>alert(1)</script>".into();
        run.rows[3].peak_device = "</script><img src=x>".into();
        let page = render(&run, None);
        assert!(!page.contains("<script>alert") && !page.contains("<img"));
        assert_eq!(
            page.matches("<script").count(),
            2,
            "the island and the script"
        );
        // The SVG namespace is a name, and `url(#id)` (the chart's clip path) a reference
        // inside the page: neither is a fetch.
        let stripped = page
            .replace("\"http://www.w3.org/2000/svg\"", "")
            .replace("url(#", "");
        for needle in ["http://", "https://", "src=\"", "@import", "url("] {
            assert!(!stripped.contains(needle), "page refers out: {needle}");
        }
        for rank in 0..6 {
            assert!(
                page.contains(&format!("data-rank=\"{rank}\"")),
                "rank {rank}"
            );
        }
        // Rank 6 of the world of 7 wrote nothing: said above everything, and its row says so.
        assert!(page.contains("id=\"missing\"") && page.contains("rank 6 (crashed"));
        assert!(page.contains("<tr class=\"missing\" data-rank=\"6\">"));
        // Ranks 4 (extra 4 × 256 MiB) is the heaviest.
        assert_eq!(run.imbalance.heaviest_rank, 4);
        assert!(page.contains("<tr class=\"heavy\" data-rank=\"4\">"));
        assert!(page.contains("id=\"heaviest-value\">rank 4 · "));
    }

    #[test]
    fn many_ranks_keep_the_page_bounded() {
        let dir = tempfile::tempdir().unwrap();
        let run = run_of(100, dir.path());
        let data = data(&run, None);
        assert_eq!(data.small.len(), MAX_SMALL_MULTIPLES);
        let points: usize = data.ranks.iter().map(|c| c.x.len()).sum();
        assert!(points <= MAX_PAGE_POINTS, "{points}");
        // The heaviest ranks get the small charts.
        let heaviest = run.imbalance.heaviest_rank;
        assert!(data.small.contains(&heaviest));
        let page = render(&run, None);
        assert!(page.len() < 8 << 20, "{} bytes", page.len());
    }

    #[test]
    fn a_device_check_marks_the_ranks_that_do_not_fit() {
        let dir = tempfile::tempdir().unwrap();
        let run = run_of(3, dir.path());
        let capacity = run.rows[1].peak_bytes;
        let check = DeviceCheck::new("l4", capacity, &run);
        let page = render(&run, Some(&check));
        assert!(page.contains("id=\"does-not-fit\"") && page.contains("rank 2 does not fit"));
        assert!(page.contains("runs out first"));
        assert!(page.contains(&format!("\"capacity\":{capacity}")));
    }
}
