//! `highwater ranks`: the ranks of a multi-process run side by side, the imbalance, the missing
//! ranks, and with `--device` which rank runs out first (exit 3 when one does not fit).

use std::path::{Path, PathBuf};

use highwater_device::{fit, Allocator, DeviceKind, FitQuery};
use highwater_profile::model::Category;
use highwater_profile::ranks::{compare, CompareOptions, DeviceCheck, RankFit, RunComparison};
use highwater_profile::units::format_bytes;

use super::replay::{self, DoesNotFit};
use crate::report::{ranks_json, ranks_text};

/// What to compare and how to show it.
#[derive(Debug)]
pub(crate) struct Request<'a> {
    pub(crate) inputs: &'a [PathBuf],
    pub(crate) run: Option<&'a str>,
    pub(crate) device: Option<DeviceKind>,
    pub(crate) limit: Option<u64>,
    pub(crate) grow: &'a [Category],
    pub(crate) allocator: Allocator,
    pub(crate) html: Option<&'a Path>,
    pub(crate) json: bool,
}

/// The `CompareOptions` of a request: the run chosen, curves when a page is drawn.
pub(crate) fn options(run: Option<&str>, curves: bool) -> CompareOptions {
    let mut options = CompareOptions::new();
    if let Some(run) = run {
        options = options.run(run);
    }
    if curves {
        options = options.curves(highwater_profile::ranks::CURVE_POINTS);
    }
    options
}

/// Compares, prints (and writes the page when asked); a [`DoesNotFit`] error afterwards when a
/// rank does not fit the device.
pub(crate) fn run(request: &Request<'_>) -> anyhow::Result<()> {
    let comparison = compare(
        request.inputs,
        &options(request.run, request.html.is_some()),
    )?;
    let device = request
        .device
        .map(|kind| device_check(&comparison, kind, request))
        .transpose()?;
    if let Some(path) = request.html {
        highwater_export::html::ranks::write(&comparison, device.as_ref(), path)?;
    }
    if request.json {
        super::emit_json(&ranks_json(&comparison, device.as_ref()))?;
    } else {
        let mut text = ranks_text(&comparison, device.as_ref());
        if let Some(path) = request.html {
            text.push_str(&format!("report: {}\n", path.display()));
        }
        super::emit(&text)?;
    }
    match device {
        Some(check) if !check.not_fitting().is_empty() => Err(DoesNotFit(format!(
            "rank{} {} of run {} do{} not fit {} ({})",
            if check.not_fitting().len() == 1 {
                ""
            } else {
                "s"
            },
            crate::report::rank_list(&check.not_fitting()),
            comparison.run.label,
            if check.not_fitting().len() == 1 {
                "es"
            } else {
                ""
            },
            check.device,
            format_bytes(check.capacity_bytes)
        ))
        .into()),
        _ => Ok(()),
    }
}

/// Each rank against the device: its peak, and its allocation log replayed when it has one.
fn device_check(
    comparison: &RunComparison,
    kind: DeviceKind,
    request: &Request<'_>,
) -> anyhow::Result<DeviceCheck> {
    let capacity = request.limit.unwrap_or_else(|| kind.capacity_bytes());
    let mut check = DeviceCheck::new(kind.name(), capacity, comparison);
    let grow = if request.grow.is_empty() {
        vec![Category::Activation]
    } else {
        request.grow.to_vec()
    };
    for row in &comparison.rows {
        let Some(log) = row.alloc_log.as_deref() else {
            continue;
        };
        // A relative log is tried as written, then beside the profile (as `fit` does).
        let named = PathBuf::from(log);
        let beside = row
            .file
            .parent()
            .map(|dir| dir.join(named.file_name().unwrap_or_default()));
        let path = match beside {
            Some(beside) if !named.exists() && beside.exists() => beside,
            _ => named,
        };
        if !path.exists() {
            continue;
        }
        // One log at a time: memory stays one rank's log. Through the profile, so the stream
        // replayed is the rank's peak device (`cpu` stands in for a device as `fit` says).
        let stream = replay::load_stream(&row.file, None, 4 << 10)?;
        let query = FitQuery::new(request.allocator, capacity, grow.clone());
        let answer = fit(&stream.trace, &query);
        check.set_fit(
            row.rank,
            RankFit::new(
                path,
                request.allocator.to_string(),
                grow.iter().map(|c| c.as_str().to_string()).collect(),
                answer.fits_as_recorded,
                answer.factor.map(|f| f.as_f64()),
            ),
        );
    }
    Ok(check)
}
