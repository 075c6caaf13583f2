//! `highwater simulate`: replay a run's allocation log through a device pool.

use std::path::Path;

use highwater::alloc_log::AllocLog;
use highwater::device::{
    compare_strategies, simulate, DeviceKind, SimComparison, SimReport, Strategy,
};
use highwater::units::{format_bytes, format_duration_ns};
use highwater::Profile;
use serde_json::json;

/// What to replay, and through what.
#[derive(Debug)]
pub(crate) struct Request<'a> {
    pub(crate) input: &'a Path,
    pub(crate) device: DeviceKind,
    pub(crate) strategy: Strategy,
    pub(crate) limit: Option<u64>,
    pub(crate) stream: Option<&'a str>,
    pub(crate) json: bool,
}

/// The input cannot be replayed (no log, unknown stream).
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub(crate) struct InputError(pub(crate) String);

/// Replays the requested stream and prints the report and the strategy comparison.
pub(crate) fn run(request: &Request<'_>) -> anyhow::Result<()> {
    let (log_path, profile) = super::locate_log(request.input)?;
    let peak_device = profile.as_ref().and_then(peak_device);
    let log = AllocLog::read(&log_path)?;
    let stream_name = request
        .stream
        .map(str::to_string)
        .or(peak_device.filter(|d| log.device(d).is_some()))
        .or_else(|| log.devices.first().cloned())
        .ok_or_else(|| InputError(format!("{} records no allocations", log_path.display())))?;
    let stream = log.device(&stream_name).ok_or_else(|| {
        InputError(format!(
            "{} has no device {stream_name:?}; it has {}",
            log_path.display(),
            log.devices.join(", ")
        ))
    })?;
    let ops = log.sim_ops(stream);
    let capacity = request
        .limit
        .unwrap_or_else(|| request.device.capacity_bytes());
    let chosen = simulate(&ops, capacity, request.strategy);
    let all = compare_strategies(&ops, capacity);
    let allocations = ops
        .iter()
        .filter(|op| matches!(op.kind, highwater::device::SimOpKind::Alloc { .. }))
        .count();
    if request.json {
        return super::emit_json(&json!({
            "log": log_path.display().to_string(),
            "stream": stream_name,
            "device": request.device.name(),
            "capacity_bytes": chosen.capacity,
            "allocations": allocations,
            "frees": ops.len() - allocations,
            "report": report_json(&chosen),
            "strategies": all.iter().map(report_json).collect::<Vec<_>>(),
        }));
    }
    let span = ops.last().map_or(0, |op| op.ts_ns) - ops.first().map_or(0, |op| op.ts_ns);
    let mut text = format!(
        "replaying {stream_name} from {} ({allocations} allocations over {}) through {} ({})\n\n",
        log_path.display(),
        format_duration_ns(span),
        request.device.name(),
        format_bytes(chosen.capacity),
    );
    text.push_str(&report_text(&chosen));
    text.push_str("\nall strategies on the same stream:\n");
    text.push_str(&SimComparison::from(all).to_string());
    text.push('\n');
    super::emit(&text)
}

fn peak_device(profile: &Profile) -> Option<String> {
    Some(profile.summary.peak_device.clone()).filter(|d| !d.is_empty())
}

fn report_text(report: &SimReport) -> String {
    let mut text = format!("{}: ", report.strategy.name());
    match &report.first_failure {
        None => text.push_str(&format!(
            "fits; peak reserved {} of {}\n",
            format_bytes(report.peak_reserved),
            format_bytes(report.capacity)
        )),
        Some(failure) => text.push_str(&format!(
            "OUT OF MEMORY at {}: {} requested ({} rounded) with {} in use, {} free, largest free \
             block {} — cause: {}; {} allocations did not fit\n",
            format_duration_ns(failure.ts_ns),
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
        "  fragmentation: max {:.3}, mean {:.3}, final {:.3}; peak requested {}\n",
        report.max_fragmentation,
        report.mean_fragmentation,
        report.final_fragmentation,
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
