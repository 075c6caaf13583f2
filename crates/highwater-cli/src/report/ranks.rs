//! `highwater ranks` as text and JSON: one row per rank, then the run's figures.

use std::fmt::Write as _;

use highwater_export::vocabulary as words;
use highwater_profile::model::Category;
use highwater_profile::ranks::{DeviceCheck, PeakWhen, RankRow, RunComparison};
use highwater_profile::units::{format_bytes, format_bytes_delta};
use serde_json::json;

use super::clean;

/// Most ranks a list in a sentence names; the rest are counted.
const LISTED: usize = 16;

/// When a rank peaked, short: `iter 7`, `iter 5-7`, `setup`, `gap 12` (between iteration 12
/// and the next, outside the iteration span), `after 199` (after the last), `-`.
pub(crate) fn when_text(when: &PeakWhen) -> String {
    match when {
        PeakWhen::Iteration { first, last, .. } if first == last => format!("iter {first}"),
        PeakWhen::Iteration { first, last, .. } => format!("iter {first}-{last}"),
        PeakWhen::BeforeIterations { .. } => "setup".to_string(),
        PeakWhen::BetweenIterations { after, .. } => format!("gap {after}"),
        PeakWhen::AfterIterations { last, .. } => format!("after {last}"),
        _ => "-".to_string(),
    }
}

/// `0, 3, 5` (at most [`LISTED`], then `and N more`).
pub(crate) fn rank_list(ranks: &[u32]) -> String {
    let mut text: Vec<String> = ranks.iter().take(LISTED).map(u32::to_string).collect();
    if ranks.len() > LISTED {
        text.push(format!("and {} more", ranks.len() - LISTED));
    }
    text.join(", ")
}

fn headroom_text(bytes: i64) -> String {
    if bytes < 0 {
        format!("-{}", format_bytes(bytes.unsigned_abs()))
    } else {
        format_bytes(bytes as u64)
    }
}

fn growth_text(row: &RankRow) -> String {
    row.growth_per_iteration
        .map_or("-".to_string(), |g| format_bytes_delta(g.round() as i64))
}

/// The comparison as a table and the run's figures.
pub(crate) fn ranks_text(run: &RunComparison, device: Option<&DeviceCheck>) -> String {
    let mut out = String::new();
    let r = &run.run;
    let _ = writeln!(
        out,
        "run {}: {}, {} rank{} read{}{}",
        clean(&r.label),
        clean(if r.program.is_empty() {
            "unnamed program"
        } else {
            &r.program
        }),
        run.rows.len(),
        if run.rows.len() == 1 { "" } else { "s" },
        r.world_size
            .map_or(String::new(), |w| format!(" of a world of {w}")),
        r.launcher
            .as_deref()
            .map_or(String::new(), |l| format!(" (launched by {})", clean(l))),
    );
    let with_device = device.is_some();
    let _ = write!(
        out,
        "{:>5}  {:>10}  {:<10} {:<9}",
        "RANK", "PEAK", "WHEN", "STEP"
    );
    for category in Category::ALL {
        let _ = write!(out, " {:>10}", category.as_str().to_uppercase());
    }
    let _ = write!(out, "  {:>11}  {:<22}", "GROWTH/ITER", "DEVICE (CAPACITY)");
    if with_device {
        let _ = write!(out, "  {:>10}  {:>7}", "HEADROOM", "FIT");
    }
    let _ = writeln!(out, "  HELD MOST AT THE PEAK");
    for row in &run.rows {
        let _ = write!(
            out,
            "{:>5}  {:>10}  {:<10} {:<9}",
            format!("{}{}", row.rank, if row.partial { "*" } else { "" }),
            format_bytes(row.peak_bytes),
            when_text(&row.peak_when),
            row.peak_step.map_or("-", |s| s.as_str()),
        );
        for category in Category::ALL {
            let bytes = row.peak_by_category.get(&category).copied().unwrap_or(0);
            let _ = write!(out, " {:>10}", format_bytes(bytes));
        }
        let device_text = match row.capacity_bytes {
            Some(capacity) => format!("{} ({})", row.peak_device, format_bytes(capacity)),
            None => row.peak_device.clone(),
        };
        let _ = write!(
            out,
            "  {:>11}  {:<22}",
            growth_text(row),
            clean(&device_text)
        );
        if let Some(check) = device {
            let headroom = check.ranks.iter().find(|h| h.rank == row.rank);
            let fit = headroom
                .and_then(|h| h.fit.as_ref())
                .map_or("-".to_string(), |f| {
                    f.factor.map_or("none".to_string(), |x| format!("×{x:.2}"))
                });
            let _ = write!(
                out,
                "  {:>10}  {:>7}",
                headroom.map_or("-".to_string(), |h| headroom_text(h.headroom_bytes)),
                fit
            );
        }
        let held = row.top_span.as_ref().map_or("-".to_string(), |s| {
            format!(
                "{} {}",
                format_bytes(s.bytes),
                if s.path.is_empty() {
                    words::OUTSIDE_SPANS
                } else {
                    &s.path
                }
            )
        });
        let _ = writeln!(out, "  {}", clean(&held));
    }
    if run
        .rows
        .iter()
        .any(|r| matches!(r.peak_when, PeakWhen::BetweenIterations { .. }))
    {
        let _ = writeln!(
            out,
            "(gap N: the peak came between iteration N and the next, outside the iteration span)"
        );
    }
    let i = &run.imbalance;
    let _ = writeln!(
        out,
        "\nimbalance: rank {} peaks highest, {} = {:.2}× the mean peak of {} (lowest: rank {}, {})",
        i.heaviest_rank,
        format_bytes(i.max_peak_bytes),
        i.max_over_mean,
        format_bytes(i.mean_peak_bytes.round() as u64),
        i.lightest_rank,
        format_bytes(i.min_peak_bytes),
    );
    if !run.missing_ranks.is_empty() {
        let _ =
            writeln!(
            out,
            "MISSING: rank{} {} of the world of {} left no profile (crashed before writing one, \
             or its file was not given)",
            if run.missing_ranks.len() == 1 { "" } else { "s" },
            rank_list(&run.missing_ranks),
            r.world_size.unwrap_or(0),
        );
    }
    if !run.partial_ranks.is_empty() {
        let _ = writeln!(
            out,
            "partial (*): rank{} {} left a checkpoint, not a final profile: still running, or \
             died; figures stop at the checkpoint",
            if run.partial_ranks.len() == 1 {
                ""
            } else {
                "s"
            },
            rank_list(&run.partial_ranks),
        );
    }
    for other in &run.other_runs {
        let _ = writeln!(out, "left out: run {}", clean(&other.to_string()));
    }
    if let Some(check) = device {
        device_text(&mut out, check);
    }
    out
}

fn device_text(out: &mut String, check: &DeviceCheck) {
    let _ = write!(
        out,
        "on {} ({}): ",
        check.device,
        format_bytes(check.capacity_bytes)
    );
    if let Some(first) = check.first_to_run_out {
        let headroom = check
            .ranks
            .iter()
            .find(|h| h.rank == first)
            .map_or(0, |h| h.headroom_bytes);
        let _ = write!(
            out,
            "rank {first} runs out first ({} headroom at its peak)",
            headroom_text(headroom)
        );
    }
    out.push('\n');
    let fits: Vec<_> = check.ranks.iter().filter_map(|h| h.fit.as_ref()).collect();
    if let Some(first) = fits.first() {
        let _ = writeln!(
            out,
            "replayed allocation logs under {}, growing {}: {} of {} ranks; the run's largest \
             factor that fits: {}",
            first.allocator,
            first.grow.join(" + "),
            fits.len(),
            check.ranks.len(),
            match check.run_fit_factor {
                None => "not known until every rank's log is replayed".to_string(),
                Some(0.0) => "none: a rank does not fit at any factor".to_string(),
                Some(f) => format!("×{f:.2} (the smallest rank's)"),
            },
        );
    }
    let failing = check.not_fitting();
    if !failing.is_empty() {
        let _ = writeln!(
            out,
            "DOES NOT FIT: rank{} {} on {} ({})",
            if failing.len() == 1 { "" } else { "s" },
            rank_list(&failing),
            check.device,
            format_bytes(check.capacity_bytes)
        );
    }
}

/// The comparison as JSON: the run, its rows and figures, and the device check when given.
pub(crate) fn ranks_json(run: &RunComparison, device: Option<&DeviceCheck>) -> serde_json::Value {
    json!({
        "run": run.run,
        "ranks": run.rows,
        "missing_ranks": run.missing_ranks,
        "partial_ranks": run.partial_ranks,
        "imbalance": run.imbalance,
        "other_runs": run.other_runs,
        "device": device,
    })
}
