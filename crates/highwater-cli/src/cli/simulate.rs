//! `highwater simulate`: replay a run's allocation log through a device pool, next to the
//! three what-if figures (lower bound, offline packing, the allocators people run).

use std::path::Path;

use highwater_device::{
    compare_strategies, figures, simulate, Allocator, DeviceKind, SimComparison, SimOpKind,
    SimReport, Strategy,
};
use highwater_profile::units::{format_bytes, format_count, format_duration_ns};
use serde_json::json;

use super::replay::{self, DoesNotFit};

/// What to replay, and through what.
#[derive(Debug)]
pub(crate) struct Request<'a> {
    pub(crate) input: &'a Path,
    pub(crate) device: Option<DeviceKind>,
    pub(crate) strategy: Strategy,
    pub(crate) limit: Option<u64>,
    pub(crate) stream: Option<&'a str>,
    pub(crate) min_block: u64,
    pub(crate) json: bool,
}

/// Replays the requested stream and prints the report, the strategy comparison and the what-if
/// figures; a [`DoesNotFit`] error afterwards when the chosen strategy runs out.
pub(crate) fn run(request: &Request<'_>) -> anyhow::Result<()> {
    let stream = replay::load_stream(request.input, request.stream, request.min_block)?;
    let ops = &stream.ops;
    let target = replay::Target::resolve(request.device, request.limit, &stream)?;
    let capacity = target.capacity;
    let chosen = simulate(ops, capacity, request.strategy);
    let all = compare_strategies(ops, capacity);
    let whatif = figures(&stream.trace, chosen.capacity, &Allocator::standard());
    let allocations = ops
        .iter()
        .filter(|op| matches!(op.kind, SimOpKind::Alloc { .. }))
        .count();
    if request.json {
        super::emit_json(&json!({
            "log": stream.log_path.display().to_string(),
            "stream": stream.name,
            "device": target.name,
            "capacity_bytes": chosen.capacity,
            "allocations": allocations,
            "frees": ops.len() - allocations,
            "report": report_json(&chosen),
            "strategies": all.iter().map(report_json).collect::<Vec<_>>(),
            "cpu_proxy_min_block_bytes": stream.proxy,
            "figures": replay::figures_json(&whatif),
        }))?;
    } else {
        let first = ops.iter().map(|op| op.ts_ns).min().unwrap_or(0);
        let last = ops.iter().map(|op| op.ts_ns).max().unwrap_or(0);
        let mut text = short_answer(&chosen, &target, &whatif);
        text.push_str(&format!(
            "\ndetail: replaying {} from {} ({} allocations over {}) through {} ({})\n\n",
            stream.name,
            stream.log_path.display(),
            format_count(allocations as u64),
            format_duration_ns(last - first),
            target.name,
            format_bytes(chosen.capacity),
        ));
        text.push_str(&report_text(&chosen, first));
        text.push_str("\nall strategies on the same stream:\n");
        text.push_str(&SimComparison::from(all).to_string());
        text.push_str("\n\nwhat it takes (lower bound, offline packing, online allocators):\n");
        if let Some(min_block) = stream.proxy {
            text.push_str(&replay::proxy_note(min_block));
        }
        text.push_str(&replay::figures_text(&stream.name, &whatif));
        super::emit(&text)?;
    }
    if chosen.fits {
        Ok(())
    } else {
        Err(DoesNotFit(format!(
            "{} does not fit {} ({}) under {}: {} allocations refused",
            stream.name,
            target.name,
            format_bytes(chosen.capacity),
            chosen.strategy.name(),
            chosen.failures
        ))
        .into())
    }
}

/// The answer in a few lines, before the detail: whether the run fits under the chosen
/// strategy and by how much, and which emulated allocator needs the most (the one that decides
/// whether a real framework's run fits).
fn short_answer(
    chosen: &SimReport,
    target: &replay::Target,
    whatif: &highwater_device::Figures,
) -> String {
    let capacity = chosen.capacity;
    let mut text = if chosen.fits {
        format!(
            "answer: fits {} ({}) under {}, with {} to spare (it reserves {} at most)\n",
            target.name,
            format_bytes(capacity),
            chosen.strategy.name(),
            format_bytes(capacity.saturating_sub(chosen.peak_reserved)),
            format_bytes(chosen.peak_reserved)
        )
    } else if whatif.lower_bound > capacity {
        format!(
            "answer: does not fit {} ({}): {} is live at once, {} more than the device has\n",
            target.name,
            format_bytes(capacity),
            format_bytes(whatif.lower_bound),
            format_bytes(whatif.lower_bound - capacity)
        )
    } else {
        format!(
            "answer: does not fit {} ({}) under {}: {} allocations refused, though the {} live at \
             once would fit; the free memory is split into blocks too small\n",
            target.name,
            format_bytes(capacity),
            chosen.strategy.name(),
            chosen.failures,
            format_bytes(whatif.lower_bound)
        )
    };
    if let Some(worst) = whatif.allocators.iter().max_by_key(|a| a.peak_bytes) {
        text.push_str(&format!(
            "  the allocator that decides: {} needs the most, {} ({} over the {} live at once){}\n",
            worst.allocator,
            format_bytes(worst.peak_bytes),
            format_bytes(worst.tax_bytes),
            format_bytes(whatif.lower_bound),
            if worst.fits {
                ", and still fits"
            } else {
                ", and does not fit"
            }
        ));
    }
    text
}

fn report_text(report: &SimReport, start_ns: u64) -> String {
    let mut text = format!("{}: ", report.strategy.name());
    match &report.first_failure {
        None => text.push_str(&format!(
            "fits; peak reserved {} of {}\n",
            format_bytes(report.peak_reserved),
            format_bytes(report.capacity)
        )),
        Some(failure) => text.push_str(&format!(
            "OUT OF MEMORY {} into the log: {} requested ({} rounded) with {} in use, {} free, \
             largest free block {} — cause: {}; {} allocations did not fit\n",
            format_duration_ns(failure.ts_ns.saturating_sub(start_ns)),
            format_bytes(failure.request),
            format_bytes(failure.rounded),
            format_bytes(failure.in_use),
            format_bytes(failure.free),
            format_bytes(failure.largest_free),
            failure.cause,
            report.failures,
        )),
    }
    text.push_str(&format!(
        "  free memory outside the largest free block: max {:.1} %, mean {:.1} %, at the end \
         {:.1} %; peak requested {}\n",
        report.max_fragmentation * 100.0,
        report.mean_fragmentation * 100.0,
        report.final_fragmentation * 100.0,
        format_bytes(report.peak_requested)
    ));
    text
}

fn report_json(report: &SimReport) -> serde_json::Value {
    json!({
        "strategy": report.strategy.name(),
        "capacity_bytes": report.capacity,
        "fits": report.fits,
        "failures": report.failures,
        "first_failure": report.first_failure.map(|f| json!({
            "timestamp_ns": f.ts_ns,
            "request_bytes": f.request,
            "rounded_bytes": f.rounded,
            "in_use_bytes": f.in_use,
            "free_bytes": f.free,
            "largest_free_bytes": f.largest_free,
            "cause": f.cause.to_string(),
        })),
        "peak_reserved_bytes": report.peak_reserved,
        "peak_requested_bytes": report.peak_requested,
        "max_fragmentation": report.max_fragmentation,
        "mean_fragmentation": report.mean_fragmentation,
        "final_fragmentation": report.final_fragmentation,
        "fragmentation_samples": report.fragmentation_samples,
        "unknown_frees": report.unknown_frees,
    })
}
